"""Adapters for diffusers' ``MiniMaxH3Transformer3DModel``: sequence packing and model configs.

The transformer consumes one packed sequence ``[text | audio | video]`` plus the structural tensors
that describe it (``position_ids`` (t, h, w), ``token_tags`` 0 video / 1 text / 2 audio,
``timestep_indices``, and the three index tensors). ``pack_h3_sequence`` builds them with the same
conventions as diffusers' modular pipeline (``MiniMaxH3PrepareLayoutStep.build_packed_sequence``):

- text rows sit on the time axis at their row index (h = w = 0);
- audio rows are channel-major (all latents of channel 0, then channel 1, ...), time continues from
  the text, h = 0, w pinned to the first / last coordinate of the video width grid;
- video rows are frame-major then row-major, with H3's aspect-normalised spatial grid (x32).

By default the video time axis uses H3's non-uniform latent spacing 5/3 * (1, 4, 4, 4, 4); models
that pack pixel frames (the embedded h3-nano) pass ``video_time_step`` so that one rotary time unit
is one audio row on both modalities (an aligned clock helps a tiny model learn audio-video sync).

The generated rows are audio and video, so the attention ``SegmentLayout`` is
(text, conditioning=0, audio, video): the FP8 Sol "prefix" is text + audio.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np
import torch

from workbench.layout import SegmentLayout

VIDEO_TAG, TEXT_TAG, AUDIO_TAG = 0, 1, 2


@dataclass(frozen=True)
class PackedLayout:
    """Structural (timestep-independent) tensors of one packed ``[text | audio | video]`` sequence.

    Shapes: position_ids [S, 3] float64 (t, h, w); token_tags [S] long; *_indices [n] long.
    """

    position_ids: torch.Tensor
    token_tags: torch.Tensor
    text_indices: torch.Tensor
    audio_indices: torch.Tensor
    video_indices: torch.Tensor
    segments: SegmentLayout

    @property
    def seq_len(self) -> int:
        return int(self.position_ids.shape[0])

    def to(self, device) -> PackedLayout:
        # position_ids stay float64 on CPU/CUDA (the rope casts to float32 itself); MPS lacks f64.
        return PackedLayout(
            *(t.to(device) for t in (self.position_ids, self.token_tags, self.text_indices,
                                     self.audio_indices, self.video_indices)),
            segments=self.segments,
        )


def _spatial_grid(latent_dim: int, patch: int, sqrt_area: float) -> torch.Tensor:
    """H3's aspect-normalised axis: latent_dim // patch coordinates centred on [0, 1), scaled by
    32 (float64). sqrt_area is that of the unpatched latent, and the grid is numpy's
    ``linspace(endpoint=False)`` as diffusers builds it (bit for bit)."""
    ratio = latent_dim / sqrt_area
    left = (1.0 - ratio) / 2.0
    grid = np.linspace(left, left + ratio, latent_dim // patch, endpoint=False) * 32.0
    return torch.from_numpy(grid).to(torch.float64)


def _h3_temporal_grid(num_latent_frames: int, origin: float) -> torch.Tensor:
    spans = torch.tensor(
        [5.0 / 3.0 * (1, 4, 4, 4, 4)[i % 5] for i in range(num_latent_frames)], dtype=torch.float64
    )
    return origin + torch.cat([torch.zeros(1, dtype=torch.float64), spans[:-1].cumsum(0)])


def build_packed_layout(
    *,
    num_text: int,
    num_audio_latents: int,
    audio_channels: int,
    video_grid: tuple[int, int, int],
    video_time_step: float | None = None,
    patch_hw: tuple[int, int] = (2, 2),
) -> PackedLayout:
    """Build the packed ``[text | audio | video]`` layout.

    num_text: text rows. num_audio_latents x audio_channels: audio rows (channel-major).
    video_grid: (frames, rows, cols) of video patches, i.e. latent (T/pt, H/ph, W/pw).
    patch_hw: the patch's (ph, pw): the spatial axes are normalised by the unpatched latent's
    area, so a non-square patch changes the coordinates (H3's 2 x 2 patch: the default).
    video_time_step: rotary time between consecutive video patch frames; None = H3's
    non-uniform 5/3 * (1, 4, 4, 4, 4) spacing. The positions equal those of diffusers' modular
    pipeline (``MiniMaxH3PrepareLayoutStep.build_packed_sequence``) bit for bit.
    """
    nt, nh, nw = video_grid
    n_audio = num_audio_latents * audio_channels
    rows_per_frame = nh * nw
    n_video = nt * rows_per_frame
    seq = num_text + n_audio + n_video
    a0, v0 = num_text, num_text + n_audio

    pos = torch.zeros(seq, 3, dtype=torch.float64)
    pos[:num_text, 0] = torch.arange(num_text, dtype=torch.float64)
    ph, pw = patch_hw
    sqrt_area = float(np.sqrt((nh * ph) * (nw * pw)))
    hgrid, wgrid = _spatial_grid(nh * ph, ph, sqrt_area), _spatial_grid(nw * pw, pw, sqrt_area)
    hh, ww = torch.meshgrid(hgrid, wgrid, indexing="ij")
    frame_grid = torch.stack([hh.reshape(-1), ww.reshape(-1)], dim=-1)  # [rows_per_frame, 2]

    audio_time = float(num_text) + torch.arange(num_audio_latents, dtype=torch.float64)
    pos[a0:v0, 0] = audio_time.repeat(audio_channels)
    pos[a0:v0, 2] = torch.cat(
        [
            torch.full((num_audio_latents,), float(wgrid[0]), dtype=torch.float64),
            torch.full((n_audio - num_audio_latents,), float(wgrid[-1]), dtype=torch.float64),
        ]
    )
    if video_time_step is None:
        vt = _h3_temporal_grid(nt, float(num_text))
    else:
        vt = float(num_text) + video_time_step * torch.arange(nt, dtype=torch.float64)
    vpos = torch.empty(nt, rows_per_frame, 3, dtype=torch.float64)
    vpos[:, :, 0] = vt[:, None]
    vpos[:, :, 1:] = frame_grid[None]
    pos[v0:] = vpos.reshape(-1, 3)

    text_idx = torch.arange(num_text)
    audio_idx = torch.arange(a0, v0)
    video_idx = torch.arange(v0, seq)
    tags = torch.empty(seq, dtype=torch.long)
    tags[text_idx], tags[audio_idx], tags[video_idx] = TEXT_TAG, AUDIO_TAG, VIDEO_TAG
    return PackedLayout(
        position_ids=pos,
        token_tags=tags,
        text_indices=text_idx,
        audio_indices=audio_idx,
        video_indices=video_idx,
        segments=SegmentLayout(text=num_text, conditioning=0, audio=n_audio, video=n_video),
    )


def row_timesteps(
    layout: PackedLayout, video_t: float | torch.Tensor, audio_t: float | torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """(timestep [n_distinct] float32 sorted, timestep_indices [S] long), H3's per-row plan.

    Timesteps follow H3's convention t = 1 - sigma in [0, 1] (1 = clean). Text rows inherit the
    video timestep (they never reach an output head).
    """
    device = layout.token_tags.device
    rows = torch.full((layout.seq_len,), float(video_t), dtype=torch.float32, device=device)
    rows[layout.audio_indices] = float(audio_t)
    ts, idx = torch.unique(rows, sorted=True, return_inverse=True)
    return ts, idx


def patchify_video(x: torch.Tensor, patch: tuple[int, int, int]) -> torch.Tensor:
    """[B, C, T, H, W] -> rows [B, (T/pt)(H/ph)(W/pw), C*pt*ph*pw], frame-major then row-major.

    Same element order as diffusers' ``patchify_video_latents`` (channel-major inside a patch).
    """
    pt, ph, pw = patch
    B, C, T, H, W = x.shape
    if T % pt or H % ph or W % pw:
        raise ValueError(f"video {tuple(x.shape)} is not divisible by the patch {patch}")
    x = x.reshape(B, C, T // pt, pt, H // ph, ph, W // pw, pw).permute(0, 2, 4, 6, 1, 3, 5, 7)
    return x.reshape(B, (T // pt) * (H // ph) * (W // pw), C * pt * ph * pw)


def unpatchify_video(
    rows: torch.Tensor, patch: tuple[int, int, int], shape: tuple[int, int, int, int]
) -> torch.Tensor:
    """Inverse of ``patchify_video``: rows [B, N, C*pt*ph*pw] -> [B, C, T, H, W] with shape
    (C,T,H,W)."""
    pt, ph, pw = patch
    C, T, H, W = shape
    B = rows.shape[0]
    x = rows.reshape(B, T // pt, H // ph, W // pw, C, pt, ph, pw).permute(0, 4, 1, 5, 2, 6, 3, 7)
    return x.reshape(B, C, T, H, W)


def pack_h3_sequence(
    video_rows: torch.Tensor,
    audio_rows: torch.Tensor,
    text_embeds: torch.Tensor,
    layout: PackedLayout,
    *,
    video_t: float | torch.Tensor,
    audio_t: float | torch.Tensor | None = None,
) -> tuple[dict, SegmentLayout]:
    """The forward kwargs of ``MiniMaxH3Transformer3DModel`` for one packed step, and its layout.

    video_rows [B, Nv, C*prod(patch)], audio_rows [B, Na, audio_in_channels],
    text_embeds [B, Nt, text_dim]; timesteps in H3's convention (1 = clean).
    """
    seg = layout.segments
    if video_rows.shape[1] != seg.video or audio_rows.shape[1] != seg.audio:
        raise ValueError(
            f"rows do not match the layout: video {video_rows.shape[1]} vs {seg.video}, "
            f"audio {audio_rows.shape[1]} vs {seg.audio}"
        )
    if text_embeds.shape[1] != seg.text:
        raise ValueError(f"text rows {text_embeds.shape[1]} do not match the layout's {seg.text}")
    ts, tidx = row_timesteps(layout, video_t, video_t if audio_t is None else audio_t)
    kwargs = {
        "hidden_states": video_rows,
        "audio_hidden_states": audio_rows,
        "encoder_hidden_states": text_embeds,
        "timestep": ts,
        "timestep_indices": tidx,
        "token_tags": layout.token_tags,
        "position_ids": layout.position_ids,
        "video_indices": layout.video_indices,
        "audio_indices": layout.audio_indices,
        "text_indices": layout.text_indices,
    }
    return kwargs, seg


@dataclass(frozen=True)
class ClipSpec:
    """Geometry of the media an embedded model generates (pixel / waveform space, no VAE).

    Video: frames x height x width RGB in [-1, 1], packed with `patch`. Audio: mono waveform at
    `sample_rate`, cut into blocks of `audio_block` samples and coded by an orthonormal DCT-II per
    block (``workbench.models.codec``); one block = one audio row of `audio_block` channels.
    """

    frames: int = 16
    height: int = 16
    width: int = 16
    fps: int = 8
    sample_rate: int = 4096
    audio_block: int = 256
    patch: tuple[int, int, int] = (2, 4, 4)
    num_text: int = 4
    text_dim: int = 32

    @property
    def video_grid(self) -> tuple[int, int, int]:
        pt, ph, pw = self.patch
        return (self.frames // pt, self.height // ph, self.width // pw)

    @property
    def audio_samples(self) -> int:
        return self.frames * self.sample_rate // self.fps

    @property
    def audio_rows(self) -> int:
        return self.audio_samples // self.audio_block

    @property
    def video_time_step(self) -> float:
        """Rotary time per video patch frame, in audio-row units (an aligned clock)."""
        return self.audio_rows / self.video_grid[0]

    def layout(self) -> PackedLayout:
        return build_packed_layout(
            num_text=self.num_text,
            num_audio_latents=self.audio_rows,
            audio_channels=1,
            video_grid=self.video_grid,
            video_time_step=self.video_time_step,
            patch_hw=tuple(self.patch[1:]),
        )

    def to_dict(self) -> dict:
        d = asdict(self)
        d["patch"] = list(self.patch)
        return d

    @classmethod
    def from_dict(cls, d: dict) -> ClipSpec:
        d = dict(d)
        d["patch"] = tuple(d.get("patch", (2, 4, 4)))
        return cls(**d)


@dataclass(frozen=True)
class H3Config:
    """A named ``MiniMaxH3Transformer3DModel`` config plus the media geometry and sampler defaults.

    `transformer` holds the diffusers config kwargs. head_dim stays 128 and rope_freq_dim 16 in
    every embedded config, so RoPE rotates channels 0..95 and passes 96..127 through, as in H3.
    """

    name: str
    transformer: dict
    clip: ClipSpec = field(default_factory=ClipSpec)
    video_shift: float = 12.0  # H3's video schedule
    audio_shift: float = 3.0  # H3's audio schedule
    default_steps: int = 50  # sigma grid points, terminal 0 included (49 model evaluations)
    classes: tuple[str, ...] = ("red", "green", "blue", "yellow")
    seed: int = 0

    def to_dict(self) -> dict:
        return {
            "name": self.name,
            "transformer": dict(self.transformer),
            "clip": self.clip.to_dict(),
            "video_shift": self.video_shift,
            "audio_shift": self.audio_shift,
            "default_steps": self.default_steps,
            "classes": list(self.classes),
            "seed": self.seed,
        }

    @classmethod
    def from_dict(cls, d: dict) -> H3Config:
        return cls(
            name=d["name"],
            transformer=dict(d["transformer"]),
            clip=ClipSpec.from_dict(d["clip"]),
            video_shift=float(d.get("video_shift", 12.0)),
            audio_shift=float(d.get("audio_shift", 3.0)),
            default_steps=int(d.get("default_steps", 50)),
            classes=tuple(d.get("classes", ("red", "green", "blue", "yellow"))),
            seed=int(d.get("seed", 0)),
        )


def transformer_kwargs(
    clip: ClipSpec, *, layers: int, heads: int, hidden: int, ffn: int, refiner_layers: int = 1
) -> dict:
    """diffusers config kwargs for an embedded model over `clip` (head_dim 128, rope_freq_dim
    16)."""
    return {
        "num_attention_heads": heads,
        "attention_head_dim": 128,
        "hidden_size": hidden,
        "num_layers": layers,
        "num_refiner_layers": refiner_layers,
        "ffn_dim": ffn,
        "in_channels": 3,
        "audio_in_channels": clip.audio_block,
        "patch_size": list(clip.patch),
        "text_dim": clip.text_dim,
        "freq_dim": 64,
        "time_embed_hidden_dim": 256,
        "time_embed_dim": 128,
        "rope_freq_dim": 16,
        "rope_theta": 10000.0,
    }


_CLIP = ClipSpec()

# Random weights (seeded): for capture / interception plumbing, builds in well under a second.
H3_TINY = H3Config(
    name="h3-tiny",
    transformer=transformer_kwargs(_CLIP, layers=2, heads=2, hidden=128, ffn=256),
    clip=_CLIP,
)

# The embedded trained model (weights in workbench/models/weights/h3_nano.safetensors).
H3_NANO = H3Config(
    name="h3-nano",
    transformer=transformer_kwargs(_CLIP, layers=4, heads=2, hidden=192, ffn=512),
    clip=_CLIP,
)

CONFIGS: dict[str, H3Config] = {c.name: c for c in (H3_TINY, H3_NANO)}

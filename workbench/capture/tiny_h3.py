"""Fallback tiny MiniMax-H3 model and packed inputs for capture tests, the CLI and the demo store.

Used until ``workbench.models`` (the embedded H3 model) provides ``load_model("h3-tiny")`` and its
sampling loop; ``workbench capture --model h3-tiny`` prefers that when it exists. Random weights:
the activations have H3's shapes, QK-norm and RoPE structure, not a trained model's statistics.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from workbench.attention import SegmentLayout

# Diffusers MiniMaxH3Transformer3DModel config at toy width; head_dim 128 and rope_freq_dim 16 as in
# H3, so 96 rotated + 32 pass-through channels per head.
TINY_H3_CONFIG = dict(
    num_attention_heads=4, attention_head_dim=128, hidden_size=128, num_layers=4,
    num_refiner_layers=1, ffn_dim=256, in_channels=4, audio_in_channels=8, patch_size=(1, 2, 2),
    text_dim=32, freq_dim=32, time_embed_hidden_dim=64, time_embed_dim=32,
)


def build_tiny_h3(seed: int = 0, dtype: torch.dtype = torch.float32, **overrides):
    from diffusers import MiniMaxH3Transformer3DModel

    torch.manual_seed(seed)
    cfg = dict(TINY_H3_CONFIG, **overrides)
    model = MiniMaxH3Transformer3DModel(**cfg).eval()
    # Diffusers inits some projections to zero (AdaLN gates): give every weight a small random
    # value so attention sees non-trivial inputs in every block.
    g = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 1 and float(p.abs().max()) == 0.0:
                p.copy_(torch.randn(p.shape, generator=g) * 0.02)
    # Mirror H3's mixed-precision checkpoint: the modules diffusers keeps in fp32 stay fp32.
    keep = type(model)._keep_in_fp32_modules
    with torch.no_grad():
        for name, p in model.named_parameters():
            if not any(k in name for k in keep):
                p.data = p.data.to(dtype)
    return model


@dataclass
class PackedInputs:
    """Packed H3 forward inputs for one clip; ``layout`` is the [text | cond | audio | video]
    split."""

    video: torch.Tensor  # [B, Nv, C * 4] patchified latents
    audio: torch.Tensor  # [B, Na, Ca]
    text: torch.Tensor  # [B, Nt, text_dim]
    token_tags: torch.Tensor  # [S]
    position_ids: torch.Tensor  # [S, 3]
    video_indices: torch.Tensor
    audio_indices: torch.Tensor
    text_indices: torch.Tensor
    layout: SegmentLayout

    def forward_kwargs(self, sigma: float) -> dict:
        S = self.layout.total
        return dict(
            hidden_states=self.video, audio_hidden_states=self.audio,
            encoder_hidden_states=self.text,
            timestep=torch.tensor([sigma], dtype=torch.float32),
            timestep_indices=torch.zeros(S, dtype=torch.long),
            token_tags=self.token_tags, position_ids=self.position_ids,
            video_indices=self.video_indices, audio_indices=self.audio_indices,
            text_indices=self.text_indices,
        )


def tiny_h3_inputs(model, *, frames: int = 2, height: int = 8, width: int = 8, audio_rows: int = 8,
                   text_rows: int = 6, batch: int = 1, seed: int = 0) -> PackedInputs:
    """Random packed inputs: ``frames x (height/2) x (width/2)`` video rows after the 1x2x2
    patch."""
    cfg = model.config
    g = torch.Generator().manual_seed(seed)
    hp, wp = height // 2, width // 2
    n_video = frames * hp * wp
    S = text_rows + audio_rows + n_video
    layout = SegmentLayout(text=text_rows, conditioning=0, audio=audio_rows, video=n_video)
    patch_dim = cfg.in_channels * 4
    video = torch.randn(batch, n_video, patch_dim, generator=g)
    audio = torch.randn(batch, audio_rows, cfg.audio_in_channels, generator=g)
    text = torch.randn(batch, text_rows, cfg.text_dim, generator=g)
    text_idx = torch.arange(0, text_rows)
    audio_idx = torch.arange(text_rows, text_rows + audio_rows)
    video_idx = torch.arange(text_rows + audio_rows, S)
    tags = torch.empty(S, dtype=torch.long)
    tags[text_idx], tags[audio_idx], tags[video_idx] = 1, 2, 0
    pos = torch.zeros(S, 3, dtype=torch.long)
    pos[text_idx, 0] = torch.arange(text_rows)
    pos[audio_idx, 0] = torch.arange(audio_rows)
    t, h, w = torch.meshgrid(torch.arange(frames), torch.arange(hp), torch.arange(wp),
                             indexing="ij")
    pos[video_idx] = torch.stack([t.flatten(), h.flatten(), w.flatten()], dim=1)
    return PackedInputs(video, audio, text, tags, pos, video_idx, audio_idx, text_idx, layout)


def flow_sigmas(num_steps: int, shift: float = 12.0) -> list[float]:
    """Rectified-flow sampling points from 1 to 0 with H3's timestep shift."""
    s = torch.linspace(1.0, 0.0, num_steps + 1, dtype=torch.float64)
    s = shift * s / (1 + (shift - 1) * s)
    return [float(x) for x in s]


@torch.no_grad()
def sample(model, inputs: PackedInputs, num_steps: int, on_step=None, shift: float = 12.0):
    """Euler rectified-flow loop on video and audio latents; ``on_step(i, sigma)`` before each
    forward (a capture sets its step there). Returns the final (video, audio) latents."""
    sigmas = flow_sigmas(num_steps, shift)
    video, audio = inputs.video.clone(), inputs.audio.clone()
    dtype = next(model.parameters()).dtype
    for i in range(num_steps):
        if on_step is not None:
            on_step(i, sigmas[i])
        kw = inputs.forward_kwargs(sigmas[i])
        kw.update(hidden_states=video.to(dtype), audio_hidden_states=audio.to(dtype),
                  encoder_hidden_states=inputs.text.to(dtype))
        out = model(**kw)
        dt = sigmas[i + 1] - sigmas[i]
        video = video + dt * out.sample.float()
        audio = audio + dt * out.audio_sample.float()
    return video, audio

"""Seeded synthetic H3-like Q/K/V for tests and demos. Never present its numbers as H3 numbers.

What it imitates (MiniMax-H3 at 1344x768, 107 frames; docs/h3.md):
- the live shape (1, 32626, 56, 128) and segments: 14 text, 356 audio, 32 x 24 x 42 video rows;
- Q and K after per-head RMSNorm (rows of RMS ~1 times a per-channel gain) and after rotate-half
  RoPE on the first 96 channels with (t, h, w) positions (16 frequencies per axis, duplicated);
- per-channel K and V biases shared across tokens, heavier on the pass-through channels 96..127
  (RoPE spins the rotated channels' bias around, so the token mean mostly survives where it is
  not rotated, as in real DiTs);
- locality: Q and K share a smooth "content" field along the sequence, so nearby rows attend;
- an optional slow drift of the mean along the sequence.

Heads are generated independently from (seed, head), so asking for heads 0-3 gives the same
values as slicing heads 0-3 out of all 56, at a fraction of the cost.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from workbench.layout import H3_LIVE_LAYOUT, SegmentLayout


@dataclass(frozen=True)
class SyntheticH3Config:
    """Parameters of the generator (all magnitudes relative to unit-variance noise)."""

    layout: SegmentLayout = field(default=H3_LIVE_LAYOUT)
    batch: int = 1
    heads: int = 56  # query heads
    kv_heads: int | None = None  # None: same as heads; fewer for GQA
    head_dim: int = 128
    rotated: int = 96  # channels rotated by RoPE; the rest pass through
    # (t, h, w) of the video rows (their product = the layout's video rows); None: a raster of
    # 16 x 16 frames
    video_grid: tuple[int, int, int] | None = (32, 24, 42)
    seed: int = 0
    q_bias: float = 0.3  # per-channel Q bias
    k_bias: float = 0.8  # per-channel K bias, rotated channels
    k_bias_passthrough: float = 2.5  # per-channel K bias, pass-through channels
    v_bias: float = 0.6
    v_bias_passthrough: float = 1.2
    v_channel_spread: float = 0.5  # log-normal spread of V's per-channel scale
    shared: float = 1.2  # strength of the smooth content shared by Q and K (locality)
    smooth_window: int = 48  # rows over which the shared content varies
    drift: float = 0.0  # amplitude of a slow sinusoidal drift of the K/V mean along the sequence
    text_gain: float = 1.5  # text rows carry larger V (sink-like prefix)
    dtype: torch.dtype = torch.bfloat16

    def __post_init__(self) -> None:
        # H3's RoPE spreads rotated / 6 frequencies over each of t, h, w (rotate-half pairs): a
        # count that is not a multiple of 6 would be rounded down without a word
        if self.rotated < 0 or self.rotated % 6 or self.rotated > self.head_dim:
            raise ValueError(f"rotated: {self.rotated}; give a multiple of 6 from 0 to head_dim "
                             f"{self.head_dim} (H3's RoPE: rotated / 6 frequencies on each of "
                             "t, h, w)")
        if self.video_grid is not None and math.prod(self.video_grid) != self.layout.video:
            raise ValueError(f"video_grid: {tuple(self.video_grid)} holds "
                             f"{math.prod(self.video_grid)} rows, the layout {self.layout.video} "
                             "video rows; give a grid of that many or None")

    @property
    def seq_len(self) -> int:
        return self.layout.total


H3_SYNTHETIC = SyntheticH3Config()


def small_config(seq_len: int = 512, heads: int = 4, **kw) -> SyntheticH3Config:
    """A small synthetic layout with the same proportions: text, audio, then video rows."""
    text = max(1, seq_len // 64)
    audio = max(1, seq_len // 16)
    layout = SegmentLayout(text=text, audio=audio, video=seq_len - text - audio)
    return SyntheticH3Config(layout=layout, heads=heads, video_grid=None, **kw)


def h3_positions(layout: SegmentLayout, video_grid) -> torch.Tensor:
    """(t, h, w) RoPE positions per row [S, 3]: text at 0, audio along t, video on its grid."""
    pos = torch.zeros(layout.total, 3)
    a0 = layout.text + layout.conditioning
    pos[a0 : a0 + layout.audio, 0] = torch.arange(layout.audio, dtype=torch.float32)
    v0 = layout.prefix_len
    n = layout.video
    if video_grid is not None and math.prod(video_grid) == n:
        t, h, w = video_grid
        grid = torch.stack(
            torch.meshgrid(torch.arange(t), torch.arange(h), torch.arange(w), indexing="ij"), -1
        )
        pos[v0:] = grid.reshape(-1, 3).float()
    else:
        width = 16
        i = torch.arange(n)
        pos[v0:, 0] = (i // (width * width)).float()
        pos[v0:, 1] = ((i // width) % width).float()
        pos[v0:, 2] = (i % width).float()
    return pos


def rope_cos_sin(pos: torch.Tensor, rotated: int, theta: float = 10000.0):
    """H3's 3-axis rotate-half RoPE tables [S, rotated] (rotated/6 frequencies per axis)."""
    nf = rotated // 6
    inv = 1.0 / theta ** (torch.arange(0, 2 * nf, 2, dtype=torch.float32) / (2 * nf))
    f = pos[:, :, None] * inv[None, None, :]  # [S, 3, nf]
    f = torch.cat([f[:, 0], f[:, 1], f[:, 2]], -1)
    f = torch.cat([f, f], -1)
    return f.cos(), f.sin()


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half (NeoX) on the first cos.shape[-1] channels of x [S, D]; the rest pass."""
    r = cos.shape[-1]
    xr, xp = x[:, :r], x[:, r:]
    x1, x2 = xr.chunk(2, -1)
    return torch.cat([xr * cos + torch.cat([-x2, x1], -1) * sin, xp], -1)


def _smooth_noise(g: torch.Generator, S: int, D: int, window: int) -> torch.Tensor:
    """Unit-variance noise low-passed along the sequence by a moving average of `window` rows."""
    w = max(1, window)
    z = torch.randn(S + w, D, generator=g)
    c = torch.cat([torch.zeros(1, D), z.cumsum(0)], 0)
    return (c[w:] - c[:-w])[:S] / math.sqrt(w)


def _rms_norm(x: torch.Tensor, gain: torch.Tensor) -> torch.Tensor:
    return x / x.pow(2).mean(-1, keepdim=True).add(1e-6).sqrt() * gain


def _gen(cfg: SyntheticH3Config, head: int, stream: int) -> torch.Generator:
    return torch.Generator().manual_seed(cfg.seed * 1_000_003 + head * 7919 + stream)


def _bias(g: torch.Generator, D: int, r: int, rot_mag: float, pass_mag: float) -> torch.Tensor:
    b = torch.randn(D, generator=g)
    b[:r] *= rot_mag
    b[r:] *= pass_mag
    return b


def _shared(cfg: SyntheticH3Config, kv_head: int) -> torch.Tensor:
    """Smooth content shared by K/V head `kv_head` and the query heads that read it."""
    g = _gen(cfg, kv_head, 0)
    return _smooth_noise(g, cfg.seq_len, cfg.head_dim, cfg.smooth_window) * cfg.shared


def _q_head(cfg: SyntheticH3Config, head: int, shared, cos, sin) -> torch.Tensor:
    g = _gen(cfg, head, 1)
    S, D, r = cfg.seq_len, cfg.head_dim, cfg.rotated
    gain = 0.75 + 0.5 * torch.rand(D, generator=g)
    q = _bias(g, D, r, cfg.q_bias, cfg.q_bias) + shared + torch.randn(S, D, generator=g)
    return apply_rope(_rms_norm(q, gain), cos, sin)


def _kv_head(cfg: SyntheticH3Config, kv_head: int, shared, cos, sin):
    g = _gen(cfg, kv_head, 2)
    S, D, r = cfg.seq_len, cfg.head_dim, cfg.rotated
    t = torch.linspace(0, 1, S)[:, None]
    drift = cfg.drift * torch.sin(2 * math.pi * t) * torch.randn(1, D, generator=g)
    gain = 0.75 + 0.5 * torch.rand(D, generator=g)
    k = _bias(g, D, r, cfg.k_bias, cfg.k_bias_passthrough) + shared + drift
    k = apply_rope(_rms_norm(k + torch.randn(S, D, generator=g), gain), cos, sin)
    v_scale = torch.exp(cfg.v_channel_spread * torch.randn(D, generator=g))
    v = _bias(g, D, r, cfg.v_bias, cfg.v_bias_passthrough) + drift
    v = v + torch.randn(S, D, generator=g) * v_scale
    v[: cfg.layout.text] *= cfg.text_gain
    return k, v


def synthetic_qkv(
    cfg: SyntheticH3Config = H3_SYNTHETIC, heads=None, device=None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Return q [B, S, len(heads), D] and k, v [B, S, Hkv', D] in cfg.dtype.

    heads: query head ids (default all). Under GQA (kv_heads < heads) the K/V heads returned are
    those the selected query heads read, one per selected query head.
    """
    heads = list(range(cfg.heads)) if heads is None else list(heads)
    bad = [h for h in heads if not 0 <= h < cfg.heads]
    if bad:
        raise ValueError(f"heads: {bad} out of range for {cfg.heads} synthetic heads")
    kvh = cfg.kv_heads or cfg.heads
    if cfg.heads % kvh:
        raise ValueError(f"kv_heads: {kvh} does not divide heads {cfg.heads}")
    group = cfg.heads // kvh
    pos = h3_positions(cfg.layout, cfg.video_grid)
    cos, sin = rope_cos_sin(pos, cfg.rotated)
    qs, ks, vs = [], [], []
    for b in range(cfg.batch):
        c = cfg if b == 0 else _replace_seed(cfg, cfg.seed + 7 * b)
        qb, kb, vb, cache = [], [], [], {}
        for h in heads:
            kvh_id = h // group
            if kvh_id not in cache:
                shared = _shared(c, kvh_id)
                cache[kvh_id] = (shared, *_kv_head(c, kvh_id, shared, cos, sin))
            shared, k, v = cache[kvh_id]
            qb.append(_q_head(c, h, shared, cos, sin))
            kb.append(k)
            vb.append(v)
        qs.append(torch.stack(qb, 1))
        ks.append(torch.stack(kb, 1))
        vs.append(torch.stack(vb, 1))
    q, k, v = (torch.stack(t, 0).to(dtype=cfg.dtype, device=device) for t in (qs, ks, vs))
    return q, k, v


def _replace_seed(cfg: SyntheticH3Config, seed: int) -> SyntheticH3Config:
    from dataclasses import replace

    return replace(cfg, seed=seed)

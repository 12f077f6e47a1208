"""The embedded models' media codec: pixels as they are, audio as block DCT coefficients.

No learned autoencoder: video rows are RGB pixels in [-1, 1]; audio is cut into blocks of
`block` samples and each block is coded by an orthonormal DCT-II (exactly invertible, energy
preserving). A pure tone whose phase restarts at each block start maps to the same few
coefficients in every block, which a small model can learn; `AUDIO_SCALE` brings the coefficients
of the procedural clips to about unit variance, like a diffusion latent.
"""

from __future__ import annotations

import math
from functools import lru_cache

import torch

AUDIO_SCALE = 2.5


@lru_cache(maxsize=8)
def dct_matrix(n: int) -> torch.Tensor:
    """Orthonormal DCT-II matrix M [n, n] (float64): coeffs = M @ x, x = M.T @ coeffs."""
    k = torch.arange(n, dtype=torch.float64)[:, None]
    i = torch.arange(n, dtype=torch.float64)[None, :]
    m = torch.cos(math.pi / n * (i + 0.5) * k) * math.sqrt(2.0 / n)
    m[0] /= math.sqrt(2.0)
    return m


def encode_audio(wave: torch.Tensor, block: int) -> torch.Tensor:
    """wave [B, N] (N a multiple of block) -> audio rows [B, N/block, block] float32."""
    B, N = wave.shape
    if N % block:
        raise ValueError(f"audio length {N} is not a multiple of the block {block}")
    m = dct_matrix(block).to(device=wave.device, dtype=torch.float32)
    return (wave.reshape(B, N // block, block).float() @ m.T) * AUDIO_SCALE


def decode_audio(rows: torch.Tensor) -> torch.Tensor:
    """audio rows [B, R, block] -> wave [B, R*block] float32 (not clipped)."""
    B, R, n = rows.shape
    m = dct_matrix(n).to(device=rows.device, dtype=torch.float32)
    return ((rows.float() / AUDIO_SCALE) @ m).reshape(B, R * n)


def encode_video(frames: torch.Tensor) -> torch.Tensor:
    """frames [B, T, 3, H, W] in [0, 1] -> [B, 3, T, H, W] in [-1, 1]."""
    return frames.permute(0, 2, 1, 3, 4).float() * 2.0 - 1.0


def decode_video(x: torch.Tensor) -> torch.Tensor:
    """[B, 3, T, H, W] in about [-1, 1] -> frames [B, T, 3, H, W] in [0, 1] (clipped)."""
    return ((x.float() + 1.0) / 2.0).clamp(0.0, 1.0).permute(0, 2, 1, 3, 4)

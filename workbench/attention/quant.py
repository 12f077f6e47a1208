"""Quantizer emulation in plain torch: E4M3, INT8, scales per block / token / tensor / channel.

Every function works on float32 tensors laid out [B, S, H, D] (tokens on dim 1) and returns float32
values that lie exactly on the target grid, so that the reference path is a faithful,
device-agnostic
emulation of the kernels.

E4M3 (``torch.float8_e4m3fn``): 4 exponent bits (bias 7), 3 mantissa bits, max 448, no infinities,
subnormal spacing 2^-9, round to nearest even. ``round_to_e4m3_explicit`` does that rounding with
explicit arithmetic; it is bit-identical to ``x.clamp(-448, 448).to(torch.float8_e4m3fn)``
(tested) and is the
formula the Triton kernels use too, because Triton's interpreter mis-rounds ``x.to(tl.float8e4nv)``.
"""

from __future__ import annotations

import math

import torch

E4M3_MAX = 448.0
E4M3_MIN_NORMAL_EXP = -6  # smallest normal is 2^-6; below it the spacing stays 2^-9
E4M3_MANTISSA_BITS = 3
INT8_MAX = 127.0

FORMAT_MAX = {"fp8_e4m3": E4M3_MAX, "int8": INT8_MAX}


def round_to_e4m3(x: torch.Tensor) -> torch.Tensor:
    """Round onto the E4M3 grid (saturating at +-448, round half to even); float32 result.

    Uses torch's float8_e4m3fn cast after a clamp (fast); ``round_to_e4m3_explicit`` is the same
    rounding in plain arithmetic, and the two are tested bit-identical.
    """
    return x.float().clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).float()


def round_to_e4m3_explicit(x: torch.Tensor) -> torch.Tensor:
    """round_to_e4m3 with explicit arithmetic: the formula the Triton kernels implement.

    Works for any shape. NaN stays NaN. The result is float32 and casts to float8_e4m3fn exactly.
    """
    x = x.float()
    ax = x.abs().clamp(max=E4M3_MAX)
    # Exponent of the leading bit, clamped to the subnormal range (spacing 2^-9 below 2^-6).
    _, exp = torch.frexp(ax)  # ax = m * 2^exp with m in [0.5, 1)
    e = (exp - 1).clamp(min=E4M3_MIN_NORMAL_EXP)
    step = torch.ldexp(torch.ones_like(ax), e - E4M3_MANTISSA_BITS)
    r = torch.round(ax / step) * step  # torch.round is round-half-even; ax/step is exact
    return torch.copysign(r.clamp(max=E4M3_MAX), x)


def round_to_mantissa(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Round float32 values to `bits` explicit mantissa bits (nearest even), no exponent limit.

    Emulates a reduced-precision accumulator (e.g. Hopper's FP8 tensor-core accumulator).
    """
    if bits >= 23:
        return x.float()
    x = x.float()
    m, e = torch.frexp(x)  # x = m * 2^e, |m| in [0.5, 1)
    scale = float(2 ** (bits + 1))
    return torch.ldexp(torch.round(m * scale) / scale, e)


def truncate_to_mantissa(x: torch.Tensor, bits: int) -> torch.Tensor:
    """Cut values toward zero to `bits` explicit mantissa bits below their leading bit."""
    m, e = torch.frexp(x)  # x = m * 2^e, |m| in [0.5, 1)
    scale = float(2 ** (bits + 1))
    return torch.ldexp(torch.trunc(m * scale) / scale, e)


def mma_step_truncating(acc: torch.Tensor, p: torch.Tensor, v: torch.Tensor, bits: int,
                        max_elements: int = 1 << 24) -> torch.Tensor:
    """One FP8 MMA step of Hopper's reduced-precision accumulator, as measured on the H200.

    acc [.., n, D], p [.., n, k] (k <= 32, one wgmma K step), v [.., k, D] (or [k, D]) ->
    acc + p @ v as the tensor cores form it: for each output the accumulator and the k products
    are aligned to the leading bit of the largest magnitude among them and cut toward zero to
    `bits` bits below it (products under that unit vanish), added exactly, and the sum is cut
    toward zero to `bits` bits below its own leading bit. With bits = 13 this reproduced every
    sum of a probe of the H200's FP8 wgmma bit for bit (``scripts/gpu_accumulator_probe.py``,
    docs/numerics.md). Works on row chunks of at most `max_elements` products.
    """
    lead = p.shape[:-2]
    n, k, d = p.shape[-2], p.shape[-1], v.shape[-1]
    per_row = max(1, math.prod(lead) * k * d)
    step = max(1, max_elements // per_row)
    out = torch.empty_like(acc)
    vv = v[..., None, :, :]  # [.., 1, k, D]
    for r0 in range(0, n, step):
        a = acc[..., r0 : r0 + step, :]
        prod = p[..., r0 : r0 + step, :, None] * vv  # [.., rows, k, D]
        big = torch.maximum(prod.abs().amax(-2), a.abs())
        _, e = torch.frexp(big)
        unit = torch.ldexp(torch.ones_like(big), e - 1 - bits)  # 2^(leading bit - bits)
        cut = torch.trunc(a / unit) * unit
        cut = cut + (torch.trunc(prod / unit[..., None, :]) * unit[..., None, :]).sum(-2)
        out[..., r0 : r0 + step, :] = truncate_to_mantissa(cut, bits)
    return out


def mma_sum_truncating(p: torch.Tensor, v: torch.Tensor, bits: int, **kw) -> torch.Tensor:
    """p [.., n, K] @ v [.., K, D] (or [K, D]) as one unflushed tensor-core chain from zero: K
    in 32-key ``mma_step_truncating`` steps. Returns the FP32 sums [.., n, D]."""
    acc = torch.zeros(*p.shape[:-1], v.shape[-1], dtype=torch.float32, device=p.device)
    for s in range(0, p.shape[-1], 32):
        acc = mma_step_truncating(acc, p[..., s : s + 32], v[..., s : s + 32, :], bits, **kw)
    return acc


def round_to_int8(x: torch.Tensor) -> torch.Tensor:
    """Round to integers in [-127, 127] (symmetric INT8, round half to even)."""
    return torch.round(x.float()).clamp(-INT8_MAX, INT8_MAX)


def round_to_bf16(x: torch.Tensor) -> torch.Tensor:
    return x.to(torch.bfloat16).float()


def absmax_scale(amax: torch.Tensor, fmt: str) -> torch.Tensor:
    """Scale = absmax / format max; an all-zero tile gets scale 1 (its values quantize to 0)."""
    qmax = FORMAT_MAX[fmt]
    return torch.where(amax > 0, amax / qmax, torch.ones_like(amax))


def round_to_format(fmt: str, x: torch.Tensor) -> torch.Tensor:
    """Round scaled values onto the grid of `fmt` ("fp8_e4m3" or "int8")."""
    if fmt == "fp8_e4m3":
        return round_to_e4m3(x)
    if fmt == "int8":
        return round_to_int8(x)
    raise ValueError(f"unknown quantization format {fmt!r}")


def token_scales(x: torch.Tensor, fmt: str, granularity: str, block: int = 64) -> torch.Tensor:
    """Scales for a Q or K operand.

    x: [B, S, H, D]. Returns a scale tensor broadcastable to x after `expand_token_scales`:
      "block":  [B, ceil(S/block), H]  one scale per (batch, block tokens, head)  (FP8 Sol)
      "token":  [B, S, H]              one scale per (batch, token, head)
      "tensor": [B, 1, 1]              one scale for each batch item
    """
    B, S, H, _ = x.shape
    ax = x.abs().float()
    if granularity == "block":
        nb = math.ceil(S / block)
        pad = nb * block - S
        per_tok = ax.amax(dim=3)  # [B, S, H]
        if pad:
            per_tok = torch.nn.functional.pad(per_tok, (0, 0, 0, pad))
        amax = per_tok.view(B, nb, block, H).amax(dim=2)
    elif granularity == "token":
        amax = ax.amax(dim=3)
    elif granularity == "tensor":
        amax = ax.amax(dim=(1, 2, 3)).view(B, 1, 1)
    else:
        raise ValueError(f"unknown granularity {granularity!r}")
    return absmax_scale(amax, fmt)


def expand_token_scales(scale: torch.Tensor, S: int, granularity: str, block: int = 64):
    """Broadcast the output of `token_scales` to [B, S, H, 1]."""
    if granularity == "block":
        return scale.repeat_interleave(block, dim=1)[:, :S, :, None]
    if granularity == "token":
        return scale[..., None]
    return scale[:, :, :, None]


def quantize_tokens(x: torch.Tensor, fmt: str, granularity: str, block: int = 64):
    """Fake-quantize a Q/K operand. x: [B, S, H, D] -> (dequantized [B, S, H, D] fp32, scales)."""
    scale = token_scales(x, fmt, granularity, block)
    s = expand_token_scales(scale, x.shape[1], granularity, block)
    q = round_to_format(fmt, x.float() / s)
    return q * s, scale


def channel_scales(x: torch.Tensor, fmt: str, granularity: str = "channel") -> torch.Tensor:
    """Scales for the V operand. x: [B, S, H, D] -> [B, H, D] ("channel") or [B, 1, 1]
    ("tensor")."""
    ax = x.abs().float()
    if granularity == "channel":
        amax = ax.amax(dim=1)
    elif granularity == "tensor":
        amax = ax.amax(dim=(1, 2, 3)).view(-1, 1, 1)
    else:
        raise ValueError(f"unknown V granularity {granularity!r}")
    return absmax_scale(amax, fmt)


def quantize_channels(x: torch.Tensor, fmt: str, granularity: str = "channel"):
    """Fake-quantize V with one scale per (batch, head, channel). Returns (dequantized, scales)."""
    scale = channel_scales(x, fmt, granularity)
    s = scale[:, None, :, :]
    return round_to_format(fmt, x.float() / s) * s, scale


def hadamard_matrix(n: int, dtype=torch.float32, device=None) -> torch.Tensor:
    """Orthonormal Sylvester Hadamard matrix [n, n] (n a power of two): H @ H.T = I."""
    if n < 1 or n & (n - 1):
        raise ValueError(f"Hadamard rotation needs a power-of-two head_dim, got {n}")
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return (h / math.sqrt(n)).to(dtype=dtype, device=device)

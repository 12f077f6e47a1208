"""Explicit rounding onto the E4M3 (and BF16) grids inside Triton kernels.

Torch twin: ``workbench.attention.quant.round_to_e4m3`` (frexp/ldexp form). Here the same rounding
is done with bit arithmetic so that ONE code path is right both on the GPU and in Triton's CPU
interpreter, whose ``x.to(tl.float8e4nv)`` mis-rounds ~3% of values (a dropped carry, overflow to
256, flushed subnormals). Values already on the grid convert exactly on both, so kernels call
``round_to_e4m3`` and then cast.

- normal range (|x| >= 2^-6): round the float32 mantissa to 3 bits, half to even, by adding
  0x7FFFF + lsb to the bit pattern and clearing the low 20 bits (a carry moves into the exponent,
  which is the right result);
- subnormal range (|x| < 2^-6, spacing 2^-9): ``(|x| + 2^14) - 2^14`` rounds to a multiple of 2^-9
  half to even, because float32 spacing at 2^14 is exactly 2^-9;
- saturate at 448 first (values <= 448 never round above 448), then restore the sign.
"""

from __future__ import annotations

import os

import triton
import triton.language as tl

E4M3_MAX = 448.0


def interpreting() -> bool:
    """True when Triton runs kernels in its CPU interpreter (TRITON_INTERPRET=1)."""
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@triton.jit
def round_to_e4m3(x):
    """float32 tensor -> float32 tensor on the E4M3 grid (saturating at +-448, RNE)."""
    ax = tl.minimum(tl.abs(x), 448.0)
    bits = ax.to(tl.uint32, bitcast=True)
    lsb = (bits >> 20) & 1
    normal = ((bits + 0x7FFFF + lsb) & 0xFFF00000).to(tl.float32, bitcast=True)
    sub = (ax + 16384.0) - 16384.0
    r = tl.where(ax < 0.015625, sub, normal)
    return tl.where(x < 0, -r, r)


@triton.jit
def round_p_to_e4m3(p):
    """Same rounding for softmax P, known to lie in [0, 448] (unit or scaled P, see
    ``attention_fp8``): no clamp and no sign (values up to 464 round to at most 448)."""
    bits = p.to(tl.uint32, bitcast=True)
    lsb = (bits >> 20) & 1
    normal = ((bits + 0x7FFFF + lsb) & 0xFFF00000).to(tl.float32, bitcast=True)
    sub = (p + 16384.0) - 16384.0
    return tl.where(p < 0.015625, sub, normal)


@triton.jit
def round_to_bf16(x):
    """float32 -> float32 on the BF16 grid, round half to even (twin: ``quant.round_to_bf16``).

    Needed for the same reason: triton 3.6's interpreter TRUNCATES in ``x.to(tl.bfloat16)``
    (measured: about half of random values land one BF16 ulp low), while the GPU rounds to nearest
    even. Finite inputs only (attention outputs); the cast that follows is then exact on both.
    """
    bits = x.to(tl.uint32, bitcast=True)
    r = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return r.to(tl.float32, bitcast=True)

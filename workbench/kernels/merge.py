"""Merged output pass: BF16 dense-prefix rows and V-bias-corrected FP8 rows written in one pass.

Torch twin (``workbench.attention.reference.recipe_attention``, dense-prefix replacement)::

    out = torch.cat([prefix_bf16, (out_f32[:, P:] + v_corr[:, None]).to(torch.bfloat16)], dim=1)

bitwise (one FP32 add, one round-to-nearest-even BF16 cast per element, the same on GPU and in the
interpreter). ``out_f32`` is the FP32 attention output without the correction
(``attention_fp8.fp8_attention_fwd(..., out_f32=True)``). The fast path of the dispatch fuses the
same add + cast into the attention epilogue (identical bits) and only copies the prefix rows; this
kernel is the separate pass for callers that keep the FP32 output (e.g. for error studies).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .e4m3 import round_to_bf16

MERGE_ROWS = 32


@triton.jit
def _merge_kernel(
    OF, PRE, CORR, OUT, S, P, H, GROUP,
    so_b, so_s, so_h, sp_b, sp_s, sp_h, su_b, su_s, su_h,
    HEAD_D: tl.constexpr, ROWS: tl.constexpr,
):
    blk = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    t = blk * ROWS + tl.arange(0, ROWS)
    d = tl.arange(0, HEAD_D)
    in_seq = (t < S)[:, None]
    is_pre = (t < P)[:, None]
    corr = tl.load(CORR + (b * (H // GROUP) + h // GROUP) * HEAD_D + d)
    o = tl.load(OF + b * so_b + h * so_h + t[:, None] * so_s + d[None, :],
                mask=in_seq & (~is_pre), other=0.0)
    pre = tl.load(PRE + b * sp_b + h * sp_h + t[:, None] * sp_s + d[None, :],
                  mask=is_pre, other=0.0)
    y = tl.where(is_pre, pre, round_to_bf16(o + corr[None, :]).to(tl.bfloat16))
    tl.store(OUT + b * su_b + h * su_h + t[:, None] * su_s + d[None, :], y, mask=in_seq)


def merge_output(out_f32: torch.Tensor, v_corr: torch.Tensor, prefix: torch.Tensor | None):
    """out_f32 [B, S, H, D] fp32, v_corr [B, Hkv, D], prefix [B, P, H, D] bf16 (or None)
    -> [B, S, H, D] bf16."""
    B, S, H, D = out_f32.shape
    Hkv = v_corr.shape[1]
    if prefix is None:
        prefix = out_f32.new_empty((B, 0, H, D), dtype=torch.bfloat16)
    P = prefix.shape[1]
    out = torch.empty((B, S, H, D), dtype=torch.bfloat16, device=out_f32.device)
    pre_strides = prefix.stride() if P else (0, 0, 0, 1)
    _merge_kernel[(triton.cdiv(S, MERGE_ROWS), B * H)](
        out_f32, prefix if P else out, v_corr, out, S, P, H, H // Hkv,
        out_f32.stride(0), out_f32.stride(1), out_f32.stride(2),
        pre_strides[0], pre_strides[1], pre_strides[2],
        out.stride(0), out.stride(1), out.stride(2),
        HEAD_D=D, ROWS=MERGE_ROWS, num_warps=4,
    )
    return out

"""Sol's summary route as its own pass, walking every key block (the "walk" summary schedule).

Torch twin: the summary route of ``workbench.attention.reference._attend`` for the ``fp8_sol_*``
recipes (the not-exact key blocks j of a query block contribute weight 2^(q . kc_j * c - m) on
vc_j to the numerator and that weight times the block length to the denominator, in the same
online softmax as the exact tiles), as ``attention_fp8._summary_step`` computes it. That pass
("gathered", ``SparseConfig.summary_schedule``) runs one 64-row query block per program over
its compacted list of not-exact blocks, so every program gathers its own rows of kc and vc.
This one runs QUERY_BLOCKS query blocks per program over all key blocks in order, CHUNK at a
time, with each row's exact blocks masked out: the kc / vc chunk is loaded once for all the
program's rows, contiguous, at the cost of also multiplying the masked (exact) blocks.

The arithmetic per chunk is ``_summary_step``'s (the same operand rounding, FP32 accumulation,
``_row_bias``); the chunks hold other blocks, so the running max at which each weight is rounded
to the operand precision differs and the state differs from the gathered pass's by that
rounding (not bit for bit).

Output: the state the exact-tile pass merges (``INIT_SUMMARY``): acc [B * H, S_pad, D] FP32
(unnormalized, V's channel scale still to apply), and [2, B * H, S_pad] FP32 = (row max in log2
units, row sum). Shapes: Q8 [B, H, S_pad, D] E4M3 codes, SQ [B, H, S_pad / 64] Q's block scales,
KC / VCS [B, Hkv, N_KB, D] (block means of the smoothed K; block sums of the smoothed V over V's
channel scale), LENS [N_KB] block lengths, EXACT [B, H, N_QB, N_KB] uint8 (1 = exact).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from .attention_fp8 import LOG2E, P_LOG2_SCALES, _row_bias, _summary_operand
from .e4m3 import interpreting


@triton.jit
def _walk_chunk(c0, acc, l_i, m_i, qsum, qs, kc_rows, vc_rows, LENS, ex_rows, row_ok, d,
                N_KB, HEAD_D: tl.constexpr, CHUNK: tl.constexpr, P_LOG2_SCALE: tl.constexpr,
                SUM_PREC: tl.constexpr, INTERPRET: tl.constexpr):
    """Key blocks c0 .. c0 + CHUNK - 1 of every row (the row's exact blocks masked)."""
    j = c0 + tl.arange(0, CHUNK)
    jok = j < N_KB
    kc = _summary_operand(tl.load(kc_rows + j[:, None] * HEAD_D + d[None, :],
                                  mask=jok[:, None], other=0.0), SUM_PREC, INTERPRET)
    prec: tl.constexpr = "ieee" if SUM_PREC == "ieee" else "tf32"  # (unused for bf16 operands)
    t = tl.dot(qsum, tl.trans(kc), input_precision=prec)
    ex = tl.load(ex_rows[:, None] + j[None, :], mask=row_ok[:, None] & jok[None, :], other=1)
    t = tl.where((ex == 0) & jok[None, :], t, float("-inf"))
    m_cand = tl.maximum(m_i, tl.max(t, axis=1))
    # a row with no summary block yet keeps m = -inf; its bias is taken at 0 so that its
    # weights are 2^-inf = 0 instead of 2^(-inf + inf)
    mq, alpha = _row_bias(m_i, tl.where(m_cand == float("-inf"), 0.0, m_cand), qs,
                          P_LOG2_SCALE)
    w = tl.math.exp2(tl.fma(t, qs[:, None], -mq[:, None]))
    lens = tl.load(LENS + j, mask=jok, other=0.0)
    l_i = l_i * alpha + tl.sum(w * lens[None, :], axis=1)
    vcs = _summary_operand(tl.load(vc_rows + j[:, None] * HEAD_D + d[None, :],
                                   mask=jok[:, None], other=0.0), SUM_PREC, INTERPRET)
    pv = tl.dot(_summary_operand(w, SUM_PREC, INTERPRET), vcs, input_precision=prec)
    acc = acc * alpha[:, None] + pv
    return acc, l_i, m_cand


@triton.jit
def _summary_walk_kernel(
    Q8, SQ, KC, VCS, LENS, EXACT, SUM_O, SUM_ML,
    S_pad, H, GROUP, N_QB, N_KB, N_BH, qk_scale_log2,
    HEAD_D: tl.constexpr, QUERY_BLOCKS: tl.constexpr, CHUNK: tl.constexpr,
    P_LOG2_SCALE: tl.constexpr, SUM_PREC: tl.constexpr, INTERPRET: tl.constexpr,
):
    """Grid (cdiv(N_QB, QUERY_BLOCKS), B * H): rows pid * 64 * QUERY_BLOCKS onwards of head bh."""
    BLOCK_M: tl.constexpr = 64 * QUERY_BLOCKS
    pid = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    bhk = b * (H // GROUP) + h // GROUP
    offs_m = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    qblk = offs_m // 64
    row_ok = qblk < N_QB
    d = tl.arange(0, HEAD_D)
    q = tl.load(Q8 + (bh * S_pad + offs_m).to(tl.int64)[:, None] * HEAD_D + d[None, :],
                mask=row_ok[:, None], other=0.0)
    qs = tl.load(SQ + bh * (S_pad // 64) + qblk, mask=row_ok, other=1.0) * qk_scale_log2
    qsum = _summary_operand(q, SUM_PREC, INTERPRET)
    kc_rows = KC + (bhk * N_KB).to(tl.int64) * HEAD_D
    vc_rows = VCS + (bhk * N_KB).to(tl.int64) * HEAD_D
    ex_rows = EXACT + (bh * N_QB + qblk).to(tl.int64) * N_KB
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_D], tl.float32)
    if INTERPRET:  # the interpreter takes no run-time range bound (numpy >= 2.4)
        c0 = 0
        while c0 < N_KB:
            acc, l_i, m_i = _walk_chunk(c0, acc, l_i, m_i, qsum, qs, kc_rows, vc_rows, LENS,
                                        ex_rows, row_ok, d, N_KB, HEAD_D, CHUNK, P_LOG2_SCALE,
                                        SUM_PREC, INTERPRET)
            c0 += CHUNK
    else:
        for c0 in tl.range(0, N_KB, CHUNK):
            acc, l_i, m_i = _walk_chunk(c0, acc, l_i, m_i, qsum, qs, kc_rows, vc_rows, LENS,
                                        ex_rows, row_ok, d, N_KB, HEAD_D, CHUNK, P_LOG2_SCALE,
                                        SUM_PREC, INTERPRET)
    srow = (bh * S_pad + offs_m).to(tl.int64)
    tl.store(SUM_O + srow[:, None] * HEAD_D + d[None, :], acc, mask=row_ok[:, None])
    tl.store(SUM_ML + srow, m_i * qs, mask=row_ok)
    tl.store(SUM_ML + N_BH * S_pad + srow, l_i, mask=row_ok)


def summary_walk(qkv, routing, kc, vcs, lens, sum_o, sum_ml, *, scale: float, p_scaling: str,
                 summary_precision: str, chunk: int, query_blocks: int, num_warps: int) -> None:
    """Fill Sol's summary state sum_o [B * H, S_pad, D] / sum_ml [2, B * H, S_pad] (rows of the
    query blocks; see the module docstring) from qkv's Q codes and scales and the routing's
    exact map; kc / vcs [B, Hkv, nk, D] and lens [nk] as the exact-tile launch prepares them."""
    B, H, S_pad, D = qkv.q8.shape
    Hkv = qkv.k8.shape[1]
    nq, nk = routing.exact.shape[-2:]
    if query_blocks not in (1, 2, 4):
        raise ValueError(f"summary query_blocks: {query_blocks}; choose 1, 2 or 4")
    exact = routing.exact.contiguous().view(torch.uint8)
    _summary_walk_kernel[(triton.cdiv(nq, query_blocks), B * H)](
        qkv.q8, qkv.q_scale, kc, vcs, lens, exact, sum_o, sum_ml,
        S_pad, H, H // Hkv, nq, nk, B * H, scale * LOG2E,
        HEAD_D=D, QUERY_BLOCKS=query_blocks, CHUNK=chunk,
        P_LOG2_SCALE=P_LOG2_SCALES[p_scaling], SUM_PREC=summary_precision,
        INTERPRET=interpreting(), num_warps=num_warps,
    )

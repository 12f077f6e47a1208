"""Fused, deterministic K/V statistics: mu_K, mu_V and V's centred channel absmax, K and V read
once.

Torch twin (``workbench.attention.reference.recipe_attention``)::

    mu_k = k.float().mean(dim=1)                       # [B, Hkv, D]
    mu_v = v.float().mean(dim=1)
    v_amax = (v.float() - mu_v[:, None]).abs().amax(dim=1)   # what channel_scales needs

Two launches with a FIXED reduction order, so the same input gives bitwise the same output run to
run (no atomics; the seed saw the diffusion output move when the FP32 summation order changed):
1. ``_kv_partial_kernel``, grid (B*Hkv, token chunks): each program sums a chunk of tokens of K and
   V per channel and keeps V's per-channel max and min, into partial buffers [B*Hkv, n_chunks, D].
2. ``_kv_finalize_kernel``, grid (B*Hkv,): adds the partials in chunk order and divides by S.

V's centred absmax needs mu_V, which is not known during the pass; it comes from the max and min:
fl(v - mu) is monotone in v, so max_t |fl(v_t - mu)| = max(|fl(vmax - mu)|, |fl(vmin - mu)|)
exactly. So one read of V gives mu_V and the V channel scales.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from .config import DEFAULT, StatsConfig
from .e4m3 import interpreting
from .quantize import head_and_block_ids

# Tiling: config.StatsConfig. Small per-thread accumulators (no spills) and many independent
# loads in flight: 16-token sub-tiles, 64 per program as 4 loop steps of 16 unrolled, heads-first
# grid = 0.263 ms at the H3 shape (84% of copy, 1.3 s to compile); 8 x 128 fully unrolled 77-80%
# but ~40 s to compile per specialization; a plain loop 63-73% (H200, 2026-11-30). A "wide"
# program spanning several heads was slower in every config (26-52%; code at e5e0039).


@dataclass(frozen=True)
class KVStats:
    """[B, Hkv, D] float32 each. mu_k / mu_v are zeros when that operand is not smoothed."""

    mu_k: torch.Tensor
    mu_v: torch.Tensor
    v_amax: torch.Tensor  # max over tokens of |V - mu_V| per (batch, head, channel)


@triton.jit
def _kv_partial_step(K, V, ksum, vsum, vmax, vmin, t, S, b, h, d,
                     stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
                     SUM_K: tl.constexpr, SUM_V: tl.constexpr):
    ok = (t < S)[:, None]
    if SUM_K:
        kp = K + b * stride_kb + h * stride_kh + t[:, None] * stride_ks + d[None, :]
        ksum += tl.load(kp, mask=ok, other=0.0).to(tl.float32)
    vp = V + b * stride_vb + h * stride_vh + t[:, None] * stride_vs + d[None, :]
    x = tl.load(vp, mask=ok, other=0.0).to(tl.float32)
    if SUM_V:
        vsum += x
    vmax = tl.maximum(vmax, tl.where(ok, x, float("-inf")))
    vmin = tl.minimum(vmin, tl.where(ok, x, float("inf")))
    return ksum, vsum, vmax, vmin


@triton.jit
def _kv_partial_kernel(
    K, V, PK, PV, PVMAX, PVMIN,
    S, HKV, n_chunks,
    stride_kb, stride_ks, stride_kh,
    stride_vb, stride_vs, stride_vh,
    HEAD_D: tl.constexpr, ROWS: tl.constexpr, N_SUB: tl.constexpr,
    SUM_K: tl.constexpr, SUM_V: tl.constexpr, HEADS_FIRST: tl.constexpr, UNROLL: tl.constexpr,
    STAGES: tl.constexpr,
):
    bh, c = head_and_block_ids(HEADS_FIRST)
    b = bh // HKV
    h = bh % HKV
    d = tl.arange(0, HEAD_D)
    ksum = tl.zeros([ROWS, HEAD_D], tl.float32)
    vsum = tl.zeros([ROWS, HEAD_D], tl.float32)
    vmax = tl.full([ROWS, HEAD_D], float("-inf"), tl.float32)
    vmin = tl.full([ROWS, HEAD_D], float("inf"), tl.float32)
    t0 = c * (ROWS * N_SUB) + tl.arange(0, ROWS)
    # N_SUB sub-tiles as N_SUB / UNROLL loop steps of UNROLL unrolled sub-tiles: the unrolled
    # loads are in flight together; the outer loop keeps the compile time flat (fully unrolled,
    # 128 sub-tiles compiled for ~40 s per specialization). Same order of additions for any UNROLL.
    for g in tl.range(0, N_SUB // UNROLL, num_stages=STAGES):
        for i in tl.static_range(UNROLL):
            ksum, vsum, vmax, vmin = _kv_partial_step(
                K, V, ksum, vsum, vmax, vmin, t0 + (g * UNROLL + i) * ROWS, S, b, h, d,
                stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh, SUM_K, SUM_V)
    o = (bh * n_chunks + c) * HEAD_D + d
    if SUM_K:
        tl.store(PK + o, tl.sum(ksum, axis=0))
    if SUM_V:
        tl.store(PV + o, tl.sum(vsum, axis=0))
    tl.store(PVMAX + o, tl.max(vmax, axis=0))
    tl.store(PVMIN + o, tl.min(vmin, axis=0))


@triton.jit
def _finalize_step(PK, PV, PVMAX, PVMIN, base, c0, n_chunks, ksum, vsum, vmax, vmin,
                   HEAD_D: tl.constexpr, CB: tl.constexpr, SUM_K: tl.constexpr,
                   SUM_V: tl.constexpr):
    cc = c0 + tl.arange(0, CB)
    ok = (cc < n_chunks)[:, None]
    off = base + cc[:, None] * HEAD_D + tl.arange(0, HEAD_D)[None, :]
    if SUM_K:
        ksum += tl.load(PK + off, mask=ok, other=0.0)
    if SUM_V:
        vsum += tl.load(PV + off, mask=ok, other=0.0)
    vmax = tl.maximum(vmax, tl.load(PVMAX + off, mask=ok, other=float("-inf")))
    vmin = tl.minimum(vmin, tl.load(PVMIN + off, mask=ok, other=float("inf")))
    return ksum, vsum, vmax, vmin


@triton.jit
def _kv_finalize_kernel(
    PK, PV, PVMAX, PVMIN, MU_K, MU_V, V_AMAX,
    n_chunks, s_len,
    HEAD_D: tl.constexpr, CB: tl.constexpr, SUM_K: tl.constexpr, SUM_V: tl.constexpr,
    INTERPRET: tl.constexpr,
):
    bh = tl.program_id(0)
    base = bh * n_chunks * HEAD_D
    ksum = tl.zeros([CB, HEAD_D], tl.float32)
    vsum = tl.zeros([CB, HEAD_D], tl.float32)
    vmax = tl.full([CB, HEAD_D], float("-inf"), tl.float32)
    vmin = tl.full([CB, HEAD_D], float("inf"), tl.float32)
    n_steps = tl.cdiv(n_chunks, CB)
    # triton 3.6's interpreter with numpy >= 2.4 fails on `for` loops with a run-time bound; a
    # `while` loop runs there. Compiled code keeps the `for` (software-pipelined). Same order.
    if INTERPRET:
        i = 0
        while i < n_steps:
            ksum, vsum, vmax, vmin = _finalize_step(
                PK, PV, PVMAX, PVMIN, base, i * CB, n_chunks, ksum, vsum, vmax, vmin,
                HEAD_D, CB, SUM_K, SUM_V)
            i += 1
    else:
        for i in range(n_steps):
            ksum, vsum, vmax, vmin = _finalize_step(
                PK, PV, PVMAX, PVMIN, base, i * CB, n_chunks, ksum, vsum, vmax, vmin,
                HEAD_D, CB, SUM_K, SUM_V)
    d = tl.arange(0, HEAD_D)
    n_tok = tl.full([HEAD_D], s_len, tl.float32)  # IEEE division below (plain `/` is approximate)
    mu_v = tl.zeros([HEAD_D], tl.float32)
    if SUM_K:
        tl.store(MU_K + bh * HEAD_D + d, tl.math.div_rn(tl.sum(ksum, axis=0), n_tok))
    if SUM_V:
        mu_v = tl.math.div_rn(tl.sum(vsum, axis=0), n_tok)
        tl.store(MU_V + bh * HEAD_D + d, mu_v)
    hi = tl.abs(tl.max(vmax, axis=0) - mu_v)
    lo = tl.abs(tl.min(vmin, axis=0) - mu_v)
    tl.store(V_AMAX + bh * HEAD_D + d, tl.maximum(hi, lo))


def kv_stats(k: torch.Tensor, v: torch.Tensor, *, smooth_k: bool, smooth_v: bool,
             config: StatsConfig = DEFAULT.stats) -> KVStats:
    """Statistics of k, v [B, S, Hkv, D] (bf16/fp16/fp32, last dim contiguous) in one K/V read.

    mu = (fixed-order FP32 sum) / S: it can differ from torch's mean in the last bits (another
    summation order), which the tests allow for; it is bitwise stable run to run.
    """
    B, S, Hkv, D = k.shape
    assert v.shape == k.shape and k.stride(-1) == 1 and v.stride(-1) == 1
    c = config
    unroll = math.gcd(c.unroll, c.sub)
    n_chunks = triton.cdiv(S, c.rows * c.sub)
    f32 = {"dtype": torch.float32, "device": k.device}
    parts = torch.empty((4, B * Hkv, n_chunks, D), **f32)
    hf = c.heads_first
    _kv_partial_kernel[(B * Hkv, n_chunks) if hf else (n_chunks, B * Hkv)](
        k, v, parts[0], parts[1], parts[2], parts[3],
        S, Hkv, n_chunks,
        k.stride(0), k.stride(1), k.stride(2),
        v.stride(0), v.stride(1), v.stride(2),
        HEAD_D=D, ROWS=c.rows, N_SUB=c.sub, SUM_K=smooth_k, SUM_V=smooth_v,
        HEADS_FIRST=hf, UNROLL=unroll, STAGES=c.stages, num_warps=c.warps,
    )
    out = torch.zeros((3, B, Hkv, D), **f32)
    _kv_finalize_kernel[(B * Hkv,)](
        parts[0], parts[1], parts[2], parts[3], out[0], out[1], out[2],
        n_chunks, float(S),
        HEAD_D=D, CB=c.final_chunks, SUM_K=smooth_k, SUM_V=smooth_v, INTERPRET=interpreting(),
        num_warps=4,
    )
    return KVStats(mu_k=out[0], mu_v=out[1], v_amax=out[2])

"""Warp-specialized FP8 attention forward for Hopper (Gluon): one TMA producer warp and three
consumer warpgroups of 64 query rows that share every K/V tile.

Torch twin: ``workbench.attention.reference._attend`` with the fp8_dense* recipes, exactly as the
Triton kernel ``attention_fp8._fp8_attn_fwd_kernel`` (its dense specialization), whose numerics
this kernel repeats operation for operation: the same scores, the same per-half K-scale fold, the
same P = 2^(s - m + c) rounded to E4M3 by the hardware cast, the same per-tile flush (Q K^T one
head-dim chain from zero, P @ V into a fresh accumulator added by ``acc * alpha + pv``), the same
epilogue. With the recipe's ``row_sum="p_operand"`` (the twin: the row sum of the E4M3 P with
P @ V's accumulation) the row sum is P @ ones on the tensor cores: an n = 8 product from the same
E4M3 registers as P @ V into a fresh [64, 8] accumulator, its ones tile built from the byte 0x38
(a tile of FP32 1.0 converted to E4M3 was written wrongly to shared memory by triton 3.6,
``scripts/gpu_small_n_mma_probe.py``); the Triton kernel adds the rounded P in FP32 instead, so
the two differ by the MMA's truncation (LSEs 1.1e-4 apart at most in the GPU test). With the
recipe's ``p_exp="log_linear"`` P's E4M3 codes come from one FMA, a max and byte permutes per
element (``_ll_codes``; the twin ``attention_fp8._ll_p``), no exponential. What differs is the
schedule:
- a CTA holds N_CONS = 3 x 64 query rows of one head; one producer warp loads each K / V tile once
  by TMA into a ring of STAGES shared-memory slots (mbarriers "ready" / "empty"), so the consumers
  issue no TMA loads, address arithmetic or barrier bookkeeping of their own beyond two waits and
  one arrive per tile (and the tile's two K-scale loads), and the L2 -> SM traffic is 1 / N_CONS
  of the 64-row programs';
- registers are re-allocated per partition (``setmaxnreg``): 16 warps x 128 at launch, 24 for
  the producer, 160 / 160 / 168 for the consumers. Two consumers of 240 registers
  (FlashAttention-3's split) measured 37.2 ms against 33.4 for three (the programs kernel: 37.5)
  on the H200: removed, code at 2e14427. Two-CTA clusters that multicast each K / V tile to both
  CTAs (each loads half of it; inline PTX) measured 34.7-35.3 ms against 32.8-33.0 (the two
  rings wait for each other): removed, code at da855ae.

Gluon kernels do not run in Triton's interpreter: the CPU tests compile this kernel for sm_90a
(no GPU needed) and check the compiled form (no spills, the setmaxnreg split, the loop's
instruction mix); its values are tested on the GPU against the Triton kernel and float64.

Shapes: as ``attention_fp8``: Q8 [B, H, S_pad, D], K8 [B, Hkv, S_pad, D], V8t [B, Hkv, D, S_pad]
(V^T's tokens in P's register order, ``QuantConfig.v_perm``); head dim 128; non-causal.
"""

from __future__ import annotations

import torch
import triton
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

from .attention_fp8 import LL_LOG2_MEAN_RATIO

LOG2E = 1.4426950408889634


@gluon.jit
def _producer(args, cid: gl.constexpr, P_LOG2_SCALE: gl.constexpr, PERM_P: gl.constexpr,
              WRITE_LSE: gl.constexpr, OUT_F32: gl.constexpr, ROW_SUM_MMA: gl.constexpr,
              P_LL: gl.constexpr):
    """One warp: Q tiles of the CTA's consumers, then every K / V tile into the ring (the
    consumers' signature: warp_specialize's worker partitions share one; only args is read)."""
    (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, ready, empty,
     SQ, SK, VS, VC, OUT, LSE, S, S_pad, n_scale, bh, bhk, b, h, m0, qk_scale_log2,
     stride_ob, stride_os, stride_oh, row_start) = args[:28]
    N_CONS: gl.constexpr = q_smem.shape[0]
    STAGES: gl.constexpr = k_smem.shape[0]
    BLOCK_N: gl.constexpr = k_smem.shape[1]
    HEAD_D: gl.constexpr = k_smem.shape[2]
    mbarrier.expect(q_bar, N_CONS * q_desc.block_type.nbytes)
    for c in gl.static_range(N_CONS):
        tma.async_copy_global_to_shared(q_desc, [bh * S_pad + m0 + c * 64, 0], q_bar,
                                        q_smem.index(c))
    kbase = bhk * S_pad
    vbase = bhk * HEAD_D
    n_tiles = gl.cdiv(S, BLOCK_N)
    for j in range(n_tiles):
        st = j % STAGES
        ph = (j // STAGES) & 1
        # the ring slot is free once every consumer has arrived on it (phase ph ^ 1: the first
        # round passes, mbarriers start in the completed phase 1)
        mbarrier.wait(empty.index(st), ph ^ 1)
        mbarrier.expect(ready.index(st), k_desc.block_type.nbytes + v_desc.block_type.nbytes)
        tma.async_copy_global_to_shared(k_desc, [kbase + j * BLOCK_N, 0], ready.index(st),
                                        k_smem.index(st))
        tma.async_copy_global_to_shared(v_desc, [vbase, j * BLOCK_N], ready.index(st),
                                        v_smem.index(st))


@gluon.jit
def _row_bias(m_i, m_cand, qs, P_LOG2_SCALE: gl.constexpr):
    """As ``attention_fp8._row_bias``: (exponent row bias, rescale of the previous state)."""
    if P_LOG2_SCALE == 0.0:
        mq = m_cand * qs
        alpha = gl.exp2(m_i * qs - mq)
    else:
        mq = gl.fma(m_cand, qs, -P_LOG2_SCALE)
        alpha = gl.exp2(gl.fma(m_i, qs, -P_LOG2_SCALE) - mq)
    return mq, alpha


@gluon.jit
def _ll_row_bias(m_i, m_cand, qs, P_LOG2_SCALE: gl.constexpr):
    """``attention_fp8._ll_row_bias`` (the recipe's p_exp "log_linear"): (the integer-valued
    FP32 bias 2^23 + 56 + 8 c - ceil(8 m qs), the rescale 2^((g_old - g) / 8))."""
    g = gl.ceil(8.0 * (m_cand * qs))
    alpha = gl.exp2((gl.ceil(8.0 * (m_i * qs)) - g) * 0.125)
    return (8388608.0 + 56.0 + 8.0 * P_LOG2_SCALE) - g, alpha


@gluon.jit
def _ll_codes(x, fb, bb, a_layout: gl.constexpr, PERM_P: gl.constexpr):
    """P's E4M3 operand of P @ V for p_exp "log_linear" (``attention_fp8._ll_p``), no
    exponential: t = x * fb + bb (the raw scores, 8 f and the row bias ``_ll_row_bias``, as
    tensors of x's shape) rounds 8 (s - m' + c) + 56 to an integer in FP32's
    [2^23, 2^24), the clamp at 2^23 sends the P below E4M3's range (and masked keys) to code 0,
    and t's low byte is the code. Four elements per inline-PTX block (one FMA and one max each,
    three byte permutes for the four): the keys are first put in the A operand's register order
    (``_perm_keys``), so each block's four bytes are one operand register (packed in the
    accumulator's order, ptxas spent 16 more PRMT per tile reordering them; the same steps in
    Triton's own ops spilled 8 instructions per tile in two consumers)."""
    if PERM_P:
        x = _perm_keys(x)
        fb = _perm_keys(fb)
        bb = _perm_keys(bb)
    codes = gl.inline_asm_elementwise(
        """{
        .reg .f32 t<4>;
        .reg .b32 u<2>;
        fma.rn.f32 t0, $1, $5, $9;
        fma.rn.f32 t1, $2, $6, $10;
        fma.rn.f32 t2, $3, $7, $11;
        fma.rn.f32 t3, $4, $8, $12;
        max.f32 t0, t0, 0f4B000000;
        max.f32 t1, t1, 0f4B000000;
        max.f32 t2, t2, 0f4B000000;
        max.f32 t3, t3, 0f4B000000;
        prmt.b32 u0, t0, t1, 0x0040;
        prmt.b32 u1, t2, t3, 0x0040;
        prmt.b32 $0, u0, u1, 0x5410;
        }""",
        "=r,f,f,f,f,f,f,f,f,f,f,f,f", [x, fb, bb], dtype=gl.int8, is_pure=True, pack=4)
    p8 = codes.to(gl.float8e4nv, bitcast=True)
    if PERM_P:
        return gl.convert_layout(p8, a_layout, assert_trivial=True)
    else:
        return gl.convert_layout(p8, a_layout)


@gluon.jit
def _ll_row_max(m_i, qs):
    """The row max a p_exp "log_linear" state (acc, l) is relative to, in log2 units: its grid
    max ceil(8 m qs) / 8 less log2 of the codes' mean bias (recipe.LL_MEAN_RATIO), so that the
    LSE and a merge with FP32 weights take l as unbiased (acc / l is the same)."""
    return gl.ceil(8.0 * (m_i * qs)) * 0.125 - LL_LOG2_MEAN_RATIO


@gluon.jit
def _p_operand(p8, a_layout: gl.constexpr, PERM_P: gl.constexpr):
    """P [64, BLOCK_N] (E4M3, accumulator layout) -> the register A operand of P @ V. PERM_P:
    the keys within every 32-key group reordered as k -> (k4, k1, k3, k2, k0) bits, the order in
    which a thread's accumulator registers hold them (V^T is stored in that order), so the
    conversion moves no data (``assert_trivial``)."""
    if PERM_P:
        return gl.convert_layout(_perm_keys(p8), a_layout, assert_trivial=True)
    else:
        return gl.convert_layout(p8, a_layout)


@gluon.jit
def _perm_keys(x):
    """x [64, BLOCK_N] in the accumulator layout with the keys of every 32-key group in the
    order (k4, k1, k3, k2, k0) (``_p_operand``): the same registers, listed as the A operand's."""
    bm: gl.constexpr = x.shape[0]
    bn: gl.constexpr = x.shape[1]
    x5 = gl.reshape(x, [bm, bn // 32, 2, 2, 2, 2, 2])
    return gl.reshape(gl.permute(x5, (0, 1, 2, 4, 5, 3, 6)), [bm, bn])


@gluon.jit
def _ones_tile(N: gl.constexpr):
    """P @ ones' B operand in shared memory: [8, N] E4M3 ones (read as [N, 8] through
    ``.permute((1, 0))``), written from the byte 0x38 reinterpreted as E4M3. The same tile built
    as FP32 1.0 converted to E4M3 read back wrong on the H200 with triton 3.6
    (scripts/gpu_small_n_mma_probe.py); a tile of one repeated byte reads the same under every
    swizzle. Allocated in the kernel's main body, before the partitions start (allocated inside
    each consumer partition, the probe's form spilled)."""
    fill: gl.constexpr = gl.BlockedLayout([1, N // 32], [1, 32], [4, 1], [1, 0])
    layout: gl.constexpr = gl.NVMMASharedLayout.get_default_for([8, N], gl.float8e4nv)
    ones_bytes = gl.full([8, N], 0x38, gl.uint8, fill)
    ones = gl.allocate_shared_memory(gl.float8e4nv, [8, N], layout,
                                     ones_bytes.to(gl.float8e4nv, bitcast=True))
    fence_async_shared()
    return ones


@gluon.jit
def _ones_row_sums():
    """The [64, 8] FP32 row sums of P @ ones (every column the row sum), zero, in the layout of
    that product's accumulator."""
    mma8: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                   instr_shape=[16, 8, 32])
    return gl.zeros([64, 8], gl.float32, mma8)


@gluon.jit
def _ones_product(p8, ones, ls=None):
    """Issue P @ ones (async) for the E4M3 P in P @ V's A-operand registers: into a fresh
    [64, 8] accumulator (ls None) or chained onto ls (the list kernel's second 64-key half)."""
    mma8: gl.constexpr = _ones_row_sums().type.layout
    a8: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma8, k_width=4)
    a = gl.convert_layout(p8, a8, assert_trivial=True)
    if ls is None:
        ls = warpgroup_mma(a, ones, gl.zeros([64, 8], gl.float32, mma8), use_acc=False,
                           is_async=True)
    else:
        ls = warpgroup_mma(a, ones, ls, is_async=True)
    return ls


@gluon.jit
def _rescaled_row_sums(l_i, alpha, ls):
    """The online softmax's l = l * alpha + this tile's sum, on [64, 8] row sums."""
    return l_i * gl.convert_layout(alpha, gl.SliceLayout(1, l_i.type.layout),
                                   assert_trivial=True)[:, None] + ls


@gluon.jit
def _tile(j, acc, l_i, m_i, q, qs, k_smem, v_smem, ready, empty, SK, skbase, S,
          offs_n, mma: gl.constexpr, a_layout: gl.constexpr, MASK_KEYS: gl.constexpr,
          P_LOG2_SCALE: gl.constexpr, PERM_P: gl.constexpr, ones=None, P_LL: gl.constexpr = False):
    """One key tile of one consumer: wait for the slot, Q K^T, the online softmax with the
    per-half K scales folded into the row max and the exponent's factor, P @ V into a fresh
    accumulator, release the slot, flush by one FMA per element. ones (row_sum "p_operand"):
    the [BLOCK_N, 8] E4M3 ones tile; l_i is then [64, 8], P @ ones on the tensor cores. P_LL:
    P's codes by ``_ll_codes`` (needs ones: the row sum takes the same codes)."""
    STAGES: gl.constexpr = k_smem.shape[0]
    BLOCK_N: gl.constexpr = k_smem.shape[1]
    HEAD_D: gl.constexpr = k_smem.shape[2]
    st = j % STAGES
    ph = (j // STAGES) & 1
    mbarrier.wait(ready.index(st), ph)
    zs = gl.zeros([64, BLOCK_N], gl.float32, mma)
    raw = warpgroup_mma(q, k_smem.index(st).permute((1, 0)), zs, use_acc=False, is_async=True)
    s0 = gl.load(SK + skbase + 2 * j)
    s1 = gl.load(SK + skbase + 2 * j + 1)
    raw = warpgroup_mma_wait(0, deps=(raw,))
    if MASK_KEYS:
        raw = gl.where((j * BLOCK_N + offs_n < S)[None, :], raw, float("-inf"))
    half0 = (offs_n < 64)[None, :]
    mx0 = gl.max(gl.where(half0, raw, float("-inf")), axis=1)
    mx1 = gl.max(gl.where(half0, float("-inf"), raw), axis=1)
    m_cand = gl.maximum(m_i, gl.maximum(mx0 * s0, mx1 * s1))
    if P_LL:
        bias, alpha = _ll_row_bias(m_i, m_cand, qs, P_LOG2_SCALE)
        f8 = gl.where(half0, 8.0 * (qs * s0), 8.0 * (qs * s1))
        p8 = _ll_codes(raw, gl.broadcast(f8, raw)[0], gl.broadcast(bias[:, None], raw)[0],
                       a_layout, PERM_P)
    else:
        f = gl.where(half0, qs * s0, qs * s1)
        mq, alpha = _row_bias(m_i, m_cand, qs, P_LOG2_SCALE)
        p = gl.exp2(gl.fma(raw, gl.broadcast(f, raw)[0], -gl.broadcast(mq[:, None], raw)[0]))
        if ones is None:
            l_i = l_i * alpha + gl.sum(p, axis=1)
        p8 = _p_operand(p.to(gl.float8e4nv), a_layout, PERM_P)
    zo = gl.zeros([64, HEAD_D], gl.float32, mma)
    pv = warpgroup_mma(p8, v_smem.index(st).permute((1, 0)), zo, use_acc=False, is_async=True)
    if ones is None:
        pv = warpgroup_mma_wait(0, deps=(pv,))
    else:
        # the row sum of the E4M3 P that P @ V takes, from the same registers: P @ ones, a
        # 128-term chain into a fresh [64, 8] accumulator (every column the row sum), flushed
        # like P @ V; replaces 64 FADD and the row reduction's shuffles per tile
        pv, ls = warpgroup_mma_wait(0, deps=(pv, _ones_product(p8, ones)))
        l_i = _rescaled_row_sums(l_i, alpha, ls)
    mbarrier.arrive(empty.index(st), count=1)
    acc = acc * alpha[:, None] + pv
    return acc, l_i, m_cand


@gluon.jit
def _consumer(args, cid: gl.constexpr, P_LOG2_SCALE: gl.constexpr, PERM_P: gl.constexpr,
              WRITE_LSE: gl.constexpr, OUT_F32: gl.constexpr, ROW_SUM_MMA: gl.constexpr,
              P_LL: gl.constexpr):
    """Consumer warpgroup ``cid``: rows m0 + 64 cid .. + 63 over every key tile, then the
    epilogue of ``attention_fp8._epilogue`` (V channel scale, 1 / l, + v_corr)."""
    (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, ready, empty,
     SQ, SK, VS, VC, OUT, LSE, S, S_pad, n_scale, bh, bhk, b, h, m0, qk_scale_log2,
     stride_ob, stride_os, stride_oh, row_start) = args[:28]
    BLOCK_N: gl.constexpr = k_smem.shape[1]
    HEAD_D: gl.constexpr = k_smem.shape[2]
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                  instr_shape=[16, BLOCK_N, 32])
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=4)
    row_l: gl.constexpr = gl.SliceLayout(1, mma)
    col_l: gl.constexpr = gl.SliceLayout(0, mma)
    r0 = m0 + cid * 64
    # one 64-token Q scale per consumer (rows past the padded length clamp to the last block:
    # their outputs are never stored)
    qs = gl.load(SQ + bh * n_scale + gl.minimum(r0 // 64, n_scale - 1)) * qk_scale_log2
    m_i = gl.full([64], float("-inf"), gl.float32, row_l)
    if ROW_SUM_MMA:  # l_i [64, 8] in P @ ones' accumulator layout (see _tile)
        l_i = _ones_row_sums()
        ones = args[28].permute((1, 0))
    else:
        l_i = gl.zeros([64], gl.float32, row_l)
        ones = None
    acc = gl.zeros([64, HEAD_D], gl.float32, mma)
    offs_n = gl.arange(0, BLOCK_N, layout=col_l)
    skbase = bhk * n_scale
    mbarrier.wait(q_bar, 0)
    q = q_smem.index(cid)
    n_full = S // BLOCK_N
    for j in range(n_full):
        acc, l_i, m_i = _tile(j, acc, l_i, m_i, q, qs, k_smem, v_smem, ready, empty, SK, skbase,
                              S, offs_n, mma, a_layout, False, P_LOG2_SCALE, PERM_P, ones, P_LL)
    if n_full * BLOCK_N < S:
        acc, l_i, m_i = _tile(n_full, acc, l_i, m_i, q, qs, k_smem, v_smem, ready, empty, SK,
                              skbase, S, offs_n, mma, a_layout, True, P_LOG2_SCALE, PERM_P, ones,
                              P_LL)
    if ROW_SUM_MMA:  # every column holds the row sum
        l_i = gl.convert_layout(gl.max(l_i, axis=1), row_l, assert_trivial=True)
    # the LSE's row max: the grid max the log-linear codes are relative to (acc / l is the same)
    mlog = _ll_row_max(m_i, qs) if P_LL else m_i * qs
    _store_rows(acc, l_i, mlog, r0, args, mma, P_LOG2_SCALE, WRITE_LSE, OUT_F32)


@gluon.jit
def _store_rows(acc, l_i, mlog, r0, args, mma: gl.constexpr, P_LOG2_SCALE: gl.constexpr,
                WRITE_LSE: gl.constexpr, OUT_F32: gl.constexpr):
    """The epilogue of ``attention_fp8._epilogue`` for rows r0 .. r0 + 63: V channel scale,
    1 / l, + v_corr (add.rn), BF16 (or FP32 without v_corr: OUT_F32), rows < row_start left
    alone; the LSE from the row max in log2 units (mlog)."""
    (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, ready, empty,
     SQ, SK, VS, VC, OUT, LSE, S, S_pad, n_scale, bh, bhk, b, h, m0, qk_scale_log2,
     stride_ob, stride_os, stride_oh, row_start) = args[:28]
    HEAD_D: gl.constexpr = acc.shape[1]
    d = gl.arange(0, HEAD_D, layout=gl.SliceLayout(0, mma))
    offs_m = r0 + gl.arange(0, 64, layout=gl.SliceLayout(1, mma))
    vs = gl.load(VS + bhk * HEAD_D + d)
    o = acc * (vs[None, :] / l_i[:, None])
    row_ok = (offs_m < S) & (offs_m >= row_start)
    optr = OUT + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_os + d[None, :]
    mask = row_ok[:, None] & (d < HEAD_D)[None, :]
    if OUT_F32:
        gl.store(optr, o, mask=mask)
    else:
        vc = gl.load(VC + bhk * HEAD_D + d)
        # add.rn: never contracted into an FMA, the same bits as the Triton kernel's epilogue
        y = gl.inline_asm_elementwise("add.rn.f32 $0, $1, $2;", "=f,f,f",
                                      [o, gl.broadcast(vc[None, :], o)[0]],
                                      dtype=gl.float32, is_pure=True, pack=1)
        gl.store(optr, y.to(OUT.dtype.element_ty), mask=mask)
    if WRITE_LSE:
        lse = (mlog + gl.log2(l_i) - P_LOG2_SCALE) * 0.6931471805599453
        gl.store(LSE + bh * S + offs_m, lse, mask=offs_m < S)


@gluon.jit
def _fp8_attn_ws_kernel(
    q_desc, k_desc, v_desc, SQ, SK, VS, VC, OUT, LSE,
    S, S_pad, H, GROUP, row_start, qk_scale_log2, stride_ob, stride_os, stride_oh,
    N_CONS: gl.constexpr, STAGES: gl.constexpr, CONS_REGS: gl.constexpr,
    P_LOG2_SCALE: gl.constexpr, PERM_P: gl.constexpr, WRITE_LSE: gl.constexpr,
    OUT_F32: gl.constexpr, ROW_SUM_MMA: gl.constexpr = False, P_LL: gl.constexpr = False,
):
    """Grid (cdiv(S, 64 * N_CONS), B * H); num_warps = 4 (the default partition = consumer 0)."""
    BLOCK_N: gl.constexpr = k_desc.block_type.shape[0]
    HEAD_D: gl.constexpr = k_desc.block_type.shape[1]
    pid_m = gl.program_id(0)
    if not WRITE_LSE:
        if (pid_m + 1) * (64 * N_CONS) <= row_start:
            return  # rows the caller overwrites (the dense-prefix rows): nothing is stored
    bh = gl.program_id(1)
    b = bh // H
    h = bh % H
    bhk = b * (H // GROUP) + h // GROUP
    m0 = pid_m * (64 * N_CONS)
    n_scale = S_pad // 64
    q_smem = gl.allocate_shared_memory(q_desc.dtype, [N_CONS, 64, HEAD_D], q_desc.layout)
    k_smem = gl.allocate_shared_memory(k_desc.dtype, [STAGES, BLOCK_N, HEAD_D], k_desc.layout)
    v_smem = gl.allocate_shared_memory(v_desc.dtype, [STAGES, HEAD_D, BLOCK_N], v_desc.layout)
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    ready = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=N_CONS)
    if ROW_SUM_MMA:
        ones = _ones_tile(BLOCK_N)  # P @ ones' B tile
    else:
        ones = q_bar  # unused
    fence_async_shared()
    args = (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, ready, empty,
            SQ, SK, VS, VC, OUT, LSE, S, S_pad, n_scale, bh, bhk, b, h, m0, qk_scale_log2,
            stride_ob, stride_os, stride_oh, row_start, ones)
    # one consumer function for the three consumers (their index a constexpr argument); every
    # partition takes the same arguments, the flags written out (a tuple variable would not keep
    # them compile-time constants)
    gl.static_assert(N_CONS == 3)
    gl.warp_specialize([
        (_consumer, (args, 0, P_LOG2_SCALE, PERM_P, WRITE_LSE, OUT_F32, ROW_SUM_MMA, P_LL)),
        (_consumer, (args, 1, P_LOG2_SCALE, PERM_P, WRITE_LSE, OUT_F32, ROW_SUM_MMA, P_LL)),
        (_consumer, (args, 2, P_LOG2_SCALE, PERM_P, WRITE_LSE, OUT_F32, ROW_SUM_MMA, P_LL)),
        (_producer, (args, 0, P_LOG2_SCALE, PERM_P, WRITE_LSE, OUT_F32, ROW_SUM_MMA, P_LL)),
    ], [4, 4, 1], [CONS_REGS, CONS_REGS, 24])


def descriptors(qkv, block_n: int = 128):
    """TMA descriptors of Q8 (64-row boxes), K8 (block_n-row boxes) and V8^T (block_n-token
    boxes), with the NVMMA shared layouts the kernel's wgmmas read."""
    B, H, S_pad, D = qkv.q8.shape
    Hkv = qkv.k8.shape[1]
    f8 = gl.float8e4nv

    def desc(t, box):
        return TensorDescriptor.from_tensor(t, box, gl.NVMMASharedLayout.get_default_for(box, f8))

    qd = desc(qkv.q8.view(B * H * S_pad, D), [64, D])
    kd = desc(qkv.k8.view(B * Hkv * S_pad, D), [block_n, D])
    vd = desc(qkv.v8t.view(B * Hkv * D, S_pad), [D, block_n])
    return qd, kd, vd


# 16 warps x 128 registers at launch = 168 (the default partition, consumer 0) + 2 x 160 + 24
CONSUMERS = 3
MAXNREG = 128
CONSUMER_REGS = 160


def fp8_attention_fwd_ws(qkv, *, num_heads: int, scale: float, out=None,
                         out_dtype=torch.bfloat16, row_start: int = 0, return_lse: bool = False,
                         out_f32: bool = False, p_scaling: str = "unit", stages: int = 2,
                         row_end: int | None = None, row_sum: str = "p_fp32",
                         p_exp: str = "exp2"):
    """The dense FP8 attention of ``attention_fp8.fp8_attention_fwd`` on the warp-specialized
    schedule (same arguments; ``stages`` K/V slots). row_end: only rows < row_end, a multiple of
    a CTA's 192 rows (the block-sparse launch's query blocks routed to every key block).
    row_sum: "p_fp32" (FP32 adds of the FP32 P) or "p_operand" (P @ ones on the tensor cores).
    p_exp: "exp2" or "log_linear" (``_ll_codes``; with p_scaling "exp2_offset8" and row_sum
    "p_operand" only)."""
    from .attention_fp8 import P_LOG2_SCALES, check_p_form

    if p_scaling not in P_LOG2_SCALES:
        raise ValueError(f"p_scaling: {p_scaling!r}; the kernel implements {list(P_LOG2_SCALES)}")
    check_p_form(P_LOG2_SCALES[p_scaling], row_sum, p_exp)
    B, H, S_pad, D = qkv.q8.shape
    Hkv = qkv.k8.shape[1]
    S = qkv.seq_len
    if S_pad % 128:  # the tiles' two K scales (and TMA boxes) never pass the padded length
        raise ValueError(f"padded length {S_pad} is not a multiple of the 128-key tile")
    if D != 128 or qkv.q8.dtype != torch.float8_e4m3fn:
        raise ValueError(f"the warp-specialized kernel takes E4M3 operands with head dim 128 "
                         f"(got {qkv.q8.dtype}, head dim {D})")
    if out is None:
        out = torch.empty((B, S, H, D), dtype=torch.float32 if out_f32 else out_dtype,
                          device=qkv.q8.device)
    lse = torch.empty((B, H, S), dtype=torch.float32, device=out.device) if return_lse else None
    qd, kd, vd = descriptors(qkv)
    rows = S
    if row_end is not None:
        if row_end <= 0 or row_end % (64 * CONSUMERS):
            raise ValueError(f"row_end {row_end}: a positive multiple of {64 * CONSUMERS} rows")
        rows = min(S, row_end)
    grid = (triton.cdiv(rows, 64 * CONSUMERS), B * H)
    _fp8_attn_ws_kernel[grid](
        qd, kd, vd, qkv.q_scale, qkv.k_scale, qkv.v_scale, qkv.v_corr, out,
        lse if lse is not None else out,
        S, S_pad, H, H // Hkv, row_start, scale * LOG2E,
        out.stride(0), out.stride(1), out.stride(2),
        N_CONS=CONSUMERS, STAGES=stages, CONS_REGS=CONSUMER_REGS,
        P_LOG2_SCALE=P_LOG2_SCALES[p_scaling], PERM_P=bool(qkv.v_perm), WRITE_LSE=return_lse,
        OUT_F32=out_f32, ROW_SUM_MMA=row_sum == "p_operand", P_LL=p_exp == "log_linear",
        num_warps=4, maxnreg=MAXNREG,
    )
    return out, lse

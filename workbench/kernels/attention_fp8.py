"""FP8 (E4M3) attention forward for Hopper: block-scaled Q/K, channel-scaled V, P in E4M3.

Torch twin: ``workbench.attention.reference._attend`` (called by ``recipe_attention``) with the
fp8_dense* recipes. Differences that are by design (compare error statistics, not bits):
- online softmax: P = 2^(s - m_running) is rounded to E4M3 against the running row max (the twin
  uses the final row max); the row sum l accumulates the FP32 P, PV uses the E4M3 P (as the twin);
  with the recipe's ``row_sum="p_operand"`` l adds the E4M3 P in FP32 (``_softmax_pv``; the
  warp-specialized kernels take P @ ones on the tensor cores), rounded by bit arithmetic on the
  GPU too: a second E4M3 copy of P beside P @ V's operand gave wrong rows on the H200 (ffc8249);
- the V channel scale is applied once to the FP32 accumulator in the epilogue (the twin multiplies
  the dequantized V), then out = acc * s_v / l + v_corr, rounded to BF16.

Numerics:
- scores s = (q8 . k8) * (s_q * softmax_scale * log2 e) * s_k, exp2 with the scale folded in; with
  128-key tiles the two K scales of a tile are folded into per-half row maxes and the exponent's
  per-row factor (no multiply per score);
- P scaling (the recipe's ``p_scaling``): P = 2^(s - m + c) with a constant c folded into the
  exponent's bias, c = 0 ("unit"), 8 ("exp2_offset8": P in [0, 256], small probabilities stay
  out of E4M3's subnormal range) or log2(448) ("rowmax448": the row max maps to 448). The row sum
  l and P @ V both take the scaled P, so the scale cancels in acc / l: no epilogue work, and the
  LSE subtracts c once. With c != 0 the running-max bias m*qs - c is one FMA instead of one FMUL,
  so the loop has the same instruction count;
- P from its exponent (the recipe's ``p_exp``): "exp2", or "log_linear" (``_ll_p``): no
  exponential; one FMA per element puts 8 (s - m' + c) + 56 into the low bits of an FP32 number
  near 2^23, whose rounding is the E4M3 code's (m' = the running max on the 1/8 grid,
  ``_ll_row_bias``); the state is rescaled to the exact max after the exact tiles
  (``_ll_to_row_max``);
- accumulation: every FP8 product chain reaches the FP32 accumulator after at most 128 terms
  (Hopper's FP8 wgmma accumulator keeps fewer than 23 mantissa bits); see
  ``config.AttentionConfig.flush``;
- P rounding: on the GPU the hardware cast (cvt.rn.satfinite) rounds to nearest even; the
  interpreter's fp8 cast mis-rounds, so there P is first rounded onto the E4M3 grid with explicit
  bit arithmetic (``e4m3.round_p_to_e4m3``), which gives the same values.

Shapes: Q8 [B, H, S_pad, D], K8 [B, Hkv, S_pad, D], V8t [B, Hkv, D, S_pad] (``quantize.py``);
head dim 64 or 128; non-causal; any S: the full key tiles run in the main loop without masks, the
partial last tile (S % BLOCK_N keys) is peeled and runs once with the key mask.

Block-sparse attention (``routing=``, a ``routing.BlockRouting``; torch twin: ``recipe_attention``
with the ``fp8_sol_*`` recipes or an FP8 recipe with ``sparsity="vsa"``) is a compile-time
specialization (SPARSE) of the same kernel, so the dense specialization compiles exactly as
before (scripts/sass_stats.py: 512 SASS instructions per key tile, 168 registers, both forms):
- each 64-row program walks its query block's list of exact key blocks (ascending) in tiles of
  two 64-key blocks (``_list_tile``): with TMA one box per block, each feeding its own Q K^T and
  P @ V from shared memory in one online-softmax step (``_list_tile_halves``), or gathered loads
  into one 128-key tile; each half keeps its own K scale (the two-scale fold of ``_softmax_pv``);
  V^T's token permutation stays within 32-token groups, so 64-key halves keep it. The unmasked
  tiles come first; an odd last entry and the partial last key block of the sequence form one
  masked tile, as the dense peeled tile. With every block exact the tiles, their order and their
  masks are the dense kernel's: the same bits with gathered loads, the last bit of l (so of the
  BF16 output) with TMA boxes, whose row sums add per 64-key half;
- Sol's summary route (``_summary_step``, after the exact tiles) adds the other blocks to the same
  online softmax: w = 2^(q . kc_j * c - m) on vc_j and w * len_j on l, with kc_j in the exact
  scores' K units and vc_j / s_v in acc's V units, products in BF16 / TF32 / FP32
  (``SparseConfig.summary_precision``; the twin: FP32) with FP32 accumulation;
- load balance (``config.SparseConfig``): a work list of query blocks, longest list first, and
  / or KV splits (contiguous parts of each list, one program each, merged by ``_combine_kernel``
  with the same epilogue).
Like the dense kernel, each part rounds P against its own running max: KV splits change the FP8
rounding of P, not the precision.
BF16 operands (``quantize.bf16_operands``: the same layouts, unit scales, no correction) run the
same kernel with BF16 Q K^T and P @ V and P rounded to BF16: the sparse recipes' BF16 baselines
(twin: ``recipe_attention`` with ``vsa_bf16`` or ``bf16:sparsity=sol``). Their 64-key boxes are
twice the bytes, so one program fits an SM (147.5 KB of shared memory with two stages).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from ..attention.layout import check_scale
from ..recipes.recipe import LL_MEAN_RATIO
from ..recipes.recipe import P_EXPS, ROW_SUMS  # every recipe row sum and P_EXP has a kernel form
from .config import DEFAULT, AttentionConfig, SparseConfig
from .e4m3 import interpreting, round_p_to_e4m3, round_to_bf16

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453
# The recipe's p_scaling -> c in P = 2^(s - m + c) (see the module docstring)
P_LOG2_SCALES = {"unit": 0.0, "exp2_offset8": 8.0, "rowmax448": math.log2(448.0)}
# The recipe's p_exp "log_linear" (``_ll_p``): the codes' mean bias (recipe.LL_MEAN_RATIO), which
# this kernel's state drops after the exact tiles, as a factor; in log2 units it is what the Gluon
# kernels' LSE takes out (their state keeps the bias: ``attention_fp8_ws._ll_row_max``)
LL_INV_MEAN_RATIO = tl.constexpr(1.0 / LL_MEAN_RATIO)
LL_LOG2_MEAN_RATIO = tl.constexpr(math.log2(LL_MEAN_RATIO))


@triton.jit
def _key_tile(n0, acc, l_i, m_i, q, qs, tiles, S, S_pad, offs_n, d,
              HEAD_D: tl.constexpr, BLOCK_N: tl.constexpr, SCALE_BLOCK: tl.constexpr,
              MASK_KEYS: tl.constexpr, ROUND_P: tl.constexpr, IMP_QK: tl.constexpr,
              IMP_PV: tl.constexpr, PV_FMA: tl.constexpr, PERM_P: tl.constexpr,
              USE_TMA: tl.constexpr, P_LOG2_SCALE: tl.constexpr, ROW_SUM_P: tl.constexpr = False,
              P_LL: tl.constexpr = False):
    """Load the key tile at n0 and run one step of the online softmax on it. ``tiles`` = (K8,
    V8T, kd, vd, SK, kbase, vbase, skbase): the operands and this program's offsets into them.
    Returns the updated (acc, l_i, m_i)."""
    K8, V8T, kd, vd, SK, kbase, vbase, skbase = tiles
    # K tile [BLOCK_N, D] (D contiguous) and V tile [BLOCK_N, D] read from V^T (tokens contiguous)
    if USE_TMA:
        k = kd.load([kbase + n0, 0])
        v = tl.trans(vd.load([vbase, n0]))
    else:
        k = tl.load(K8 + (kbase + n0 + offs_n)[:, None] * HEAD_D + d[None, :])
        v = tl.load(V8T + (vbase + d)[None, :] * S_pad + (n0 + offs_n)[:, None])
    raw = _dot_fp8(q, tl.trans(k), None, IMP_QK, ROUND_P == 2)
    s0 = tl.load(SK + skbase + n0 // SCALE_BLOCK)
    s1 = s0
    if BLOCK_N != SCALE_BLOCK:
        s1 = tl.load(SK + skbase + n0 // SCALE_BLOCK + 1)
    return _softmax_pv(acc, l_i, m_i, raw, qs, v, s0, s1, n0 + offs_n < S, offs_n, BLOCK_N,
                       SCALE_BLOCK, MASK_KEYS, ROUND_P, IMP_PV, PV_FMA, PERM_P, P_LOG2_SCALE,
                       ROW_SUM_P, P_LL)


@triton.jit
def _list_tile(e, lst, cnt, acc, l_i, m_i, q, qs, tiles, S, S_pad, offs_n, d,
               HEAD_D: tl.constexpr, BLOCK_N: tl.constexpr, SCALE_BLOCK: tl.constexpr,
               MASK_KEYS: tl.constexpr, ROUND_P: tl.constexpr, IMP_QK: tl.constexpr,
               IMP_PV: tl.constexpr, PV_FMA: tl.constexpr, PERM_P: tl.constexpr,
               USE_TMA: tl.constexpr, P_LOG2_SCALE: tl.constexpr, ROW_SUM_P: tl.constexpr,
               P_LL: tl.constexpr = False):
    """The sparse form of ``_key_tile``: the key tile made of the key blocks at entries e (and
    e + 1 with 128-key tiles) of this query block's list ``lst`` (``cnt`` entries). Each 64-key
    half keeps its own K scale (the two-scale fold of ``_softmax_pv``); V^T's token order is
    permuted within 32-token groups only, so 64-key halves keep it. MASK_KEYS: the last tile of
    the list, whose second half may be absent (odd count) and whose keys may pass S (the
    partial last block)."""
    TWO_BOXES: tl.constexpr = USE_TMA and BLOCK_N != SCALE_BLOCK
    if TWO_BOXES:  # 128-key tiles from two unjoined 64-key TMA boxes
        acc, l_i, m_i = _list_tile_halves(e, lst, cnt, acc, l_i, m_i, q, qs, tiles, S, HEAD_D,
                                          SCALE_BLOCK, MASK_KEYS, ROUND_P, IMP_QK, IMP_PV,
                                          PV_FMA, PERM_P, P_LOG2_SCALE, ROW_SUM_P, P_LL)
    else:
        K8, V8T, kd, vd, SK, kbase, vbase, skbase = tiles
        j0 = tl.load(lst + e)
        j1 = j0
        if BLOCK_N != SCALE_BLOCK:
            if MASK_KEYS:
                j1 = tl.load(lst + tl.minimum(e + 1, cnt - 1))  # j0 again when absent: masked
            else:
                j1 = tl.load(lst + e + 1)
        half0 = offs_n < SCALE_BLOCK
        tok = tl.where(half0, j0 * SCALE_BLOCK + offs_n,
                       j1 * SCALE_BLOCK + offs_n - SCALE_BLOCK)
        if USE_TMA:  # 64-key tiles: one TMA box (descriptors with 64-row boxes)
            k = kd.load([kbase + j0 * SCALE_BLOCK, 0])
            v = tl.trans(vd.load([vbase, j0 * SCALE_BLOCK]))
        else:  # gathered rows: the tile's token index per key
            k = tl.load(K8 + (kbase + tok)[:, None] * HEAD_D + d[None, :])
            v = tl.load(V8T + (vbase + d)[None, :] * S_pad + tok[:, None])
        raw = _dot_fp8(q, tl.trans(k), None, IMP_QK, ROUND_P == 2)
        s0 = tl.load(SK + skbase + j0)
        s1 = tl.load(SK + skbase + j1)
        key_ok = tok < S
        if BLOCK_N != SCALE_BLOCK:
            key_ok = key_ok & (half0 | (e + 1 < cnt))
        acc, l_i, m_i = _softmax_pv(acc, l_i, m_i, raw, qs, v, s0, s1, key_ok, offs_n, BLOCK_N,
                                    SCALE_BLOCK, MASK_KEYS, ROUND_P, IMP_PV, PV_FMA, PERM_P,
                                    P_LOG2_SCALE, ROW_SUM_P, P_LL)
    return acc, l_i, m_i


@triton.jit
def _list_tile_halves(e, lst, cnt, acc, l_i, m_i, q, qs, tiles, S,
                      HEAD_D: tl.constexpr, SCALE_BLOCK: tl.constexpr, MASK_KEYS: tl.constexpr,
                      ROUND_P: tl.constexpr, IMP_QK: tl.constexpr, IMP_PV: tl.constexpr,
                      PV_FMA: tl.constexpr, PERM_P: tl.constexpr, P_LOG2_SCALE: tl.constexpr,
                      ROW_SUM_P: tl.constexpr, P_LL: tl.constexpr = False):
    """``_list_tile`` for 128-key tiles from TMA boxes without joining them: the two 64-key
    blocks at entries e, e + 1 each get their own Q K^T (m64n64) and P @ V (k = 64) straight from
    their shared-memory boxes, in one online-softmax step (one rescale of acc per 128 keys).
    Joining the boxes into one [128, D] tile first took them through registers and back to
    shared memory with proxy fences: 13.98 vs 11.96 ms at density 0.149 on the H200 (code at
    9fe55b3). P @ V is one 128-term FP8 chain as in the dense tile (with flush "fma" into a
    fresh accumulator, flushed by one FMA); the row sum adds the halves' sums, so l may differ
    from the dense tile's 128-wide sum in the last bit."""
    K8, V8T, kd, vd, SK, kbase, vbase, skbase = tiles
    j0 = tl.load(lst + e)
    if MASK_KEYS:
        j1 = tl.load(lst + tl.minimum(e + 1, cnt - 1))  # a repeat of j0 when absent: masked
    else:
        j1 = tl.load(lst + e + 1)
    k0 = kd.load([kbase + j0 * SCALE_BLOCK, 0])
    k1 = kd.load([kbase + j1 * SCALE_BLOCK, 0])
    raw0 = _dot_fp8(q, tl.trans(k0), None, IMP_QK, ROUND_P == 2)
    raw1 = _dot_fp8(q, tl.trans(k1), None, IMP_QK, ROUND_P == 2)
    s0 = tl.load(SK + skbase + j0)
    s1 = tl.load(SK + skbase + j1)
    if MASK_KEYS:
        offs = tl.arange(0, SCALE_BLOCK)
        raw0 = tl.where((j0 * SCALE_BLOCK + offs < S)[None, :], raw0, float("-inf"))
        ok1 = (j1 * SCALE_BLOCK + offs < S) & (e + 1 < cnt)
        raw1 = tl.where(ok1[None, :], raw1, float("-inf"))
    m_cand = tl.maximum(m_i, tl.maximum(tl.max(raw0, axis=1) * s0, tl.max(raw1, axis=1) * s1))
    if P_LL:
        bias, alpha = _ll_row_bias(m_i, m_cand, qs, P_LOG2_SCALE)
        p0 = _ll_p(raw0, (8.0 * (qs * s0))[:, None], bias)
        p1 = _ll_p(raw1, (8.0 * (qs * s1))[:, None], bias)
    else:
        mq, alpha = _row_bias(m_i, m_cand, qs, P_LOG2_SCALE)
        p0 = tl.math.exp2(tl.fma(raw0, (qs * s0)[:, None], -mq[:, None]))
        p1 = tl.math.exp2(tl.fma(raw1, (qs * s1)[:, None], -mq[:, None]))
    if not ROW_SUM_P:
        l_i = l_i * alpha + (tl.sum(p0, axis=1) + tl.sum(p1, axis=1))
    p0 = _round_p(p0, ROUND_P)
    p1 = _round_p(p1, ROUND_P)
    if ROW_SUM_P:
        l_i = l_i * alpha + (tl.sum(_p_on_grid(p0, ROUND_P), axis=1)
                             + tl.sum(_p_on_grid(p1, ROUND_P), axis=1))
    v0 = tl.trans(vd.load([vbase, j0 * SCALE_BLOCK]))
    v1 = tl.trans(vd.load([vbase, j1 * SCALE_BLOCK]))
    if PV_FMA:
        pv = _dot_fp8(_p_operand(p0, SCALE_BLOCK, PERM_P).to(v0.dtype), v0, None, -1,
                      ROUND_P == 2)
        pv = _dot_fp8(_p_operand(p1, SCALE_BLOCK, PERM_P).to(v1.dtype), v1, pv, -1,
                      ROUND_P == 2)
        acc = acc * alpha[:, None] + pv
    else:
        acc = _dot_fp8(_p_operand(p0, SCALE_BLOCK, PERM_P).to(v0.dtype), v0,
                       acc * alpha[:, None], IMP_PV, ROUND_P == 2)
        acc = _dot_fp8(_p_operand(p1, SCALE_BLOCK, PERM_P).to(v1.dtype), v1, acc, IMP_PV,
                       ROUND_P == 2)
    return acc, l_i, m_cand


@triton.jit
def _summary_operand(x, SUM_PREC: tl.constexpr, INTERPRET: tl.constexpr):
    """An operand of the summary products: FP32 ("tf32" / "ieee": the dot's input precision) or
    BF16 ("bf16"; Q's E4M3 codes are exact in BF16). The interpreter's BF16 dot is wrong, so
    there the values are rounded onto the BF16 grid and multiplied in FP32: the same products."""
    if SUM_PREC == "bf16":
        if INTERPRET:
            return round_to_bf16(x.to(tl.float32))
        else:
            return x.to(tl.bfloat16)
    else:
        return x.to(tl.float32)


@triton.jit
def _summary_step(c0, acc, l_i, m_i, qsum, qs, lst, cnt, n_sum, KC, VCS, LENS, kcbase, d,
                  HEAD_D: tl.constexpr, CHUNK: tl.constexpr, P_LOG2_SCALE: tl.constexpr,
                  SUM_PREC: tl.constexpr, INTERPRET: tl.constexpr):
    """Sol's summary route for the not-exact key blocks at entries cnt + c0 .. cnt + c0 + CHUNK
    of the list (gathered rows of kc and vc / s_v; walking every block with the exact ones
    masked, contiguous loads, was slower: 11.96 vs 11.58 ms at density 0.149 on the H200, code
    at 9fe55b3; so was a walk with one kc / vc chunk shared by two query blocks' rows, its own
    pass: 5.04 vs 1.56 ms, code at c276073; and 3 or 4 pipeline stages or 8 warps for the
    pass: 11.15-12.09 vs 10.98 ms for the call, code at 0553840): weight
    w = 2^(q . kc_j * c - m) on vc_j in the numerator and w * len_j in the denominator, in the
    same online softmax as the exact tiles.
    kc_j in the K units of the exact scores (so t = q8 . kc_j is in the row max's units);
    VCS = vc_j / s_v (V's channel scale is applied to acc in the epilogue). qsum: Q's codes as
    ``_summary_operand``."""
    c = c0 + tl.arange(0, CHUNK)
    ok = c < n_sum
    js = tl.load(lst + cnt + c, mask=ok, other=0)
    rows = (kcbase + js)[:, None] * HEAD_D + d[None, :]
    kc = _summary_operand(tl.load(KC + rows, mask=ok[:, None], other=0.0), SUM_PREC, INTERPRET)
    prec: tl.constexpr = "ieee" if SUM_PREC == "ieee" else "tf32"  # (unused for bf16 operands)
    t = tl.dot(qsum, tl.trans(kc), input_precision=prec)
    t = tl.where(ok[None, :], t, float("-inf"))
    m_cand = tl.maximum(m_i, tl.max(t, axis=1))
    mq, alpha = _row_bias(m_i, m_cand, qs, P_LOG2_SCALE)
    w = tl.math.exp2(tl.fma(t, qs[:, None], -mq[:, None]))
    lens = tl.load(LENS + js, mask=ok, other=0.0)
    l_i = l_i * alpha + tl.sum(w * lens[None, :], axis=1)
    vcs = _summary_operand(tl.load(VCS + rows, mask=ok[:, None], other=0.0), SUM_PREC, INTERPRET)
    pv = tl.dot(_summary_operand(w, SUM_PREC, INTERPRET), vcs, input_precision=prec)
    acc = acc * alpha[:, None] + pv
    return acc, l_i, m_cand


@triton.jit
def _row_bias(m_i, m_cand, qs, P_LOG2_SCALE: tl.constexpr):
    """(mq, alpha) of one online-softmax step: the exponent's row bias m_cand * qs - c and the
    rescale 2^(m_i * qs - m_cand * qs) of the previous state (row maxes in K units, qs the Q row
    factor). With c != 0 (P = 2^(s - m + c)) the bias is one FMA per row, as m*qs was one FMUL;
    alpha is the ratio of two biases with the same c, so it does not change."""
    if P_LOG2_SCALE == 0.0:
        mq = m_cand * qs
        alpha = tl.math.exp2(m_i * qs - mq)
    else:
        mq = tl.fma(m_cand, qs, -P_LOG2_SCALE)
        alpha = tl.math.exp2(tl.fma(m_i, qs, -P_LOG2_SCALE) - mq)
    return mq, alpha


@triton.jit
def _ll_row_bias(m_i, m_cand, qs, P_LOG2_SCALE: tl.constexpr):
    """(bias, alpha) of one online-softmax step with P's code linear in the exponent (the
    recipe's p_exp "log_linear"): the row max in log2 units on the 1/8 grid, g = ceil(8 m qs),
    so that bias = 2^23 + 56 + 8 c - g is an integer-valued FP32 (exact: FP32's spacing at 2^23
    is 1), and alpha = 2^((g_old - g) / 8), the rescale of the previous state (relative to its
    own grid max). -inf maxima give alpha 0, as in ``_row_bias``."""
    g = tl.math.ceil(8.0 * (m_cand * qs))
    alpha = tl.math.exp2((tl.math.ceil(8.0 * (m_i * qs)) - g) * 0.125)
    return (8388608.0 + 56.0 + 8.0 * P_LOG2_SCALE) - g, alpha


@triton.jit
def _ll_p(x, f8, bias):
    """P of the recipe's p_exp "log_linear" as FP32 values on the E4M3 grid: t = x * 8 f + bias
    lies in [2^23, 2^24) for the codes that exist, where FP32's spacing is 1, so the add rounds
    8 (s - m' + c) + 56 to the nearest integer (half to even) and t's bits minus those of 2^23
    are the E4M3 code; t < 2^23 (P below E4M3's range, masked keys) clamps to code 0. The
    warp-specialized kernels take the code's byte as the operand itself; here it is decoded
    (codes >= 8: exponent and mantissa bits moved into FP32's; below: the subnormals c 2^-9)."""
    t = tl.maximum(tl.fma(x, f8, bias[:, None]), 8388608.0)
    code = t.to(tl.int32, bitcast=True) - 0x4B000000
    normal = ((code << 20) + 0x3C000000).to(tl.float32, bitcast=True)
    return tl.where(code >= 8, normal, code.to(tl.float32) * 0.001953125)


@triton.jit
def _ll_to_row_max(acc, l_i, m_i, qs):
    """After the exact tiles of a p_exp "log_linear" run: the state (acc, l) is relative to the
    grid max ceil(8 m qs) / 8 and its codes' mean bias; rescale it to m qs and divide the bias
    (recipe.LL_MEAN_RATIO) out, for everything after it (the summary route, the split parts,
    the LSE). acc / l is unchanged."""
    mq = m_i * qs
    # a part without tiles (KV splits) keeps m = -inf: exp2 of 0 there, not of -inf + inf
    mq0 = tl.where(mq > float("-inf"), mq, 0.0)
    g = tl.math.exp2(tl.math.ceil(8.0 * mq0) * 0.125 - mq0) * LL_INV_MEAN_RATIO
    return acc * g[:, None], l_i * g


@triton.jit
def _softmax_pv(acc, l_i, m_i, raw, qs, v, s0, s1, key_ok, offs_n,
                BLOCK_N: tl.constexpr, SCALE_BLOCK: tl.constexpr, MASK_KEYS: tl.constexpr,
                ROUND_P: tl.constexpr, IMP_PV: tl.constexpr, PV_FMA: tl.constexpr,
                PERM_P: tl.constexpr, P_LOG2_SCALE: tl.constexpr, ROW_SUM_P: tl.constexpr = False,
                P_LL: tl.constexpr = False):
    """Online softmax of one tile's raw scores [BLOCK_M, BLOCK_N] and its P @ V. s0 (s1): the K
    scale of the tile's first (second) 64-key half; key_ok [BLOCK_N]: keys that exist (read only
    with MASK_KEYS). ROW_SUM_P: the row sum takes the rounded P (the recipe's row_sum
    "p_operand"), in FP32 adds here (the warp-specialized kernel: on the tensor cores)."""
    # The row max m is kept in "t units" (raw score * K scale); the Q-row factor qs (Q scale *
    # softmax scale * log2 e, > 0) enters through one FMA per element: p = 2^(x*f - m*qs).
    if BLOCK_N == SCALE_BLOCK:
        # One K scale for the whole tile: fold it into the per-row factor (f = qs * s_k) and into
        # the row max (s_k > 0 commutes with max), so the tile needs no per-element multiply.
        x = raw
        if MASK_KEYS:
            x = tl.where(key_ok[None, :], x, float("-inf"))
        m_cand = tl.maximum(m_i, tl.max(x, axis=1) * s0)
        f = (qs * s0)[:, None]
    else:
        # Two K scales per tile (BLOCK_N = 2 * SCALE_BLOCK), folded like the one-scale case:
        # per-half row maxes (the column test is constant per register after layout lowering, so
        # the selects fold away) and a per-half row factor in the exponent's FMA. The exponent's
        # argument rounds as x * fl(qs * s_k), not fl(x * s_k) * qs: last-bit differences only.
        half0 = (offs_n < SCALE_BLOCK)[None, :]
        x = raw
        if MASK_KEYS:
            x = tl.where(key_ok[None, :], x, float("-inf"))
        mx0 = tl.max(tl.where(half0, x, float("-inf")), axis=1)
        mx1 = tl.max(tl.where(half0, float("-inf"), x), axis=1)
        m_cand = tl.maximum(m_i, tl.maximum(mx0 * s0, mx1 * s1))
        f = tl.where(half0, (qs * s0)[:, None], (qs * s1)[:, None])
    if P_LL:  # the recipe's p_exp "log_linear": P's E4M3 code by one FMA (``_ll_p``)
        bias, alpha = _ll_row_bias(m_i, m_cand, qs, P_LOG2_SCALE)
        p = _ll_p(x, 8.0 * f, bias)
    else:
        mq, alpha = _row_bias(m_i, m_cand, qs, P_LOG2_SCALE)
        p = tl.math.exp2(tl.fma(x, f, -mq[:, None]))
    if not ROW_SUM_P:
        l_i = l_i * alpha + tl.sum(p, axis=1)
    if not PV_FMA:
        acc = acc * alpha[:, None]
    m_i = m_cand
    p = _round_p(p, ROUND_P)
    if ROW_SUM_P:
        l_i = l_i * alpha + tl.sum(_p_on_grid(p, ROUND_P), axis=1)
    if PV_FMA:
        # This tile's P @ V (one BLOCK_N-long FP8 chain) lands in a fresh accumulator and is
        # flushed into the FP32 output accumulator by one FMA with the rescale: the per-tile flush
        # that max_num_imprecise_acc = BLOCK_N asks for, written so that no non-wgmma
        # instruction reads a wgmma accumulator mid-pipeline (with triton's bound, ptxas 12.x/13
        # serializes every wgmma of the kernel: C7514, "non wgmma instructions reading
        # accumulator registers").
        pv = _dot_fp8(_p_operand(p, BLOCK_N, PERM_P).to(v.dtype), v, None, -1, ROUND_P == 2)
        acc = acc * alpha[:, None] + pv
    else:
        acc = _dot_fp8(_p_operand(p, BLOCK_N, PERM_P).to(v.dtype), v, acc, IMP_PV, ROUND_P == 2)
    return acc, l_i, m_i


@triton.jit
def _round_p(p, ROUND_P: tl.constexpr):
    """The interpreter's casts mis-round (fp8) or truncate (bf16): ROUND_P = 1 rounds P onto the
    E4M3 grid, 2 onto the BF16 grid first, with explicit bit arithmetic; 0 (GPU): the hardware
    cast rounds to nearest even by itself."""
    if ROUND_P == 1:
        p = round_p_to_e4m3(p)
    elif ROUND_P == 2:
        p = round_to_bf16(p)
    return p


@triton.jit
def _p_on_grid(p, ROUND_P: tl.constexpr):
    """The FP32 values of the E4M3 P that P @ V takes (the row sum "p_operand"), from
    ``_round_p``'s output: the interpreter's P is on the grid already. On the GPU the rounding is
    bit arithmetic on the FP32 P, not p.to(e4m3).to(fp32): with that second E4M3 copy of P
    beside P @ V's operand the kernel's outputs were wrong on the H200 (rel-L2 1.02 against the
    warp-specialized kernel, whole rows zero; 2026-12-02, ffc8249)."""
    if ROUND_P == 0:
        p = round_p_to_e4m3(p)
    return p


@triton.jit
def _p_operand(p, BLOCK_N: tl.constexpr, PERM_P: tl.constexpr):
    """P [BLOCK_M, BLOCK_N] float32 -> the A operand of P @ V before its cast to V's type (E4M3,
    or BF16 for the BF16 operands). PERM_P: reorder the keys within every 32-key group as
    k -> (k4, k1, k3, k2, k0) bits, the order in which a thread's wgmma accumulator registers
    already hold the operand's keys; V^T is stored in the same order (``QuantConfig.v_perm``),
    so the product is unchanged and the registers need not move."""
    if PERM_P:
        bm: tl.constexpr = p.shape[0]
        p5 = tl.reshape(p, [bm, BLOCK_N // 32, 2, 2, 2, 2, 2])
        p = tl.reshape(tl.permute(p5, (0, 1, 2, 4, 5, 3, 6)), [bm, BLOCK_N])
    return p


@triton.jit
def _dot_fp8(a, b, acc, IMP: tl.constexpr, F32: tl.constexpr = False):
    """FP8 (or BF16) wgmma with FP32 output. IMP >= 0: triton's max_num_imprecise_acc bound; -1:
    triton's sm_90 default (no bound: the whole chain stays in the tensor core's accumulator).
    F32: BF16 operands in the interpreter, whose BF16 dot is wrong: widened to FP32 (exact) and
    multiplied with IEEE FP32 products, as the tensor cores' BF16 products are exact."""
    if F32:
        a = a.to(tl.float32)
        b = b.to(tl.float32)
        if acc is None:
            return tl.dot(a, b, input_precision="ieee")
        else:
            return tl.dot(a, b, acc, input_precision="ieee")
    if IMP < 0:
        if acc is None:
            return tl.dot(a, b)
        else:
            return tl.dot(a, b, acc)
    else:
        return tl.dot(a, b, acc, max_num_imprecise_acc=IMP)


@triton.jit
def _epilogue(acc, l_i, mlog, bh, b, h, bhk, offs_m, d, VS, VC, OUT, LSE, S, row_start,
              stride_ob, stride_os, stride_oh, HEAD_D: tl.constexpr, WRITE_LSE: tl.constexpr,
              OUT_F32: tl.constexpr, P_LOG2_SCALE: tl.constexpr, INTERPRET: tl.constexpr):
    """V channel scale, 1/l, then + v_corr (mu_V or the corrected vector) in FP32; the LSE from
    the row max in log2 units (mlog = m * qs)."""
    vs = tl.load(VS + bhk * HEAD_D + d)
    o = acc * (vs[None, :] / l_i[:, None])
    row_ok = (offs_m < S) & (offs_m >= row_start)
    optr = OUT + b * stride_ob + h * stride_oh + offs_m[:, None] * stride_os + d[None, :]
    if OUT_F32:  # the FP32 attention output for the separate merged pass (no correction)
        tl.store(optr, o, mask=row_ok[:, None])
    else:
        vc = tl.load(VC + bhk * HEAD_D + d)
        if INTERPRET:
            y = o + vc[None, :]
        else:
            # add.rn: PTX adds with an explicit rounding mode are never contracted, so ptxas
            # cannot fuse acc * (s_v / l) + vc into one FMA; the output is then bitwise
            # bf16(fp32(o) + vc), the same as the OUT_F32 + merge pass (H200, 2026-11-30: a
            # plain add was fused and the two differed in the last bit).
            y = tl.inline_asm_elementwise("add.rn.f32 $0, $1, $2;", "=f,f,f",
                                          [o, tl.broadcast_to(vc[None, :], o.shape)],
                                          dtype=tl.float32, is_pure=True, pack=1)
        if OUT.dtype.element_ty == tl.bfloat16:
            y = round_to_bf16(y)  # explicit RNE: the interpreter's bf16 cast truncates
        tl.store(optr, y.to(OUT.dtype.element_ty), mask=row_ok[:, None])
    if WRITE_LSE:
        # l holds the scaled P (sum of 2^(s - m + c)): subtract c once
        lse = (mlog + tl.math.log2(l_i) - P_LOG2_SCALE) * 0.6931471805599453
        tl.store(LSE + bh * S + offs_m, lse, mask=offs_m < S)


@triton.jit
def _list_rows(acc, l_i, m_i, q, qs, tiles, row, sid, S, S_pad, offs_n, d,
               BLOCKS, COUNTS, KC, VCS, LENS, kcbase, N_KB,
               HEAD_D: tl.constexpr, BLOCK_N: tl.constexpr, SCALE_BLOCK: tl.constexpr,
               ROUND_P: tl.constexpr, IMP_QK: tl.constexpr, IMP_PV: tl.constexpr,
               PV_FMA: tl.constexpr, PERM_P: tl.constexpr, USE_TMA: tl.constexpr,
               P_LOG2_SCALE: tl.constexpr, SUMMARY: tl.constexpr, KV_SPLITS: tl.constexpr,
               SUM_CHUNK: tl.constexpr, SUM_PREC: tl.constexpr, INTERPRET: tl.constexpr,
               SUMMARY_ONLY: tl.constexpr = False, ROW_SUM_P: tl.constexpr = False,
               P_LL: tl.constexpr = False):
    """The sparse main loop of one query block (list row ``row``), part ``sid`` of KV_SPLITS:
    the exact key blocks of the list two by two (one by one with 64-key tiles) without masks,
    then the last part's masked tile (an odd last entry and / or the partial last key block of
    the sequence), then Sol's summary route in the last part (SUMMARY). SUMMARY_ONLY: the
    summary route alone (the separate summary pass)."""
    cnt = tl.load(COUNTS + row)
    lst = BLOCKS + row * N_KB
    if not SUMMARY_ONLY:
        acc, l_i, m_i = _exact_rows(acc, l_i, m_i, q, qs, tiles, lst, cnt, sid, S, S_pad, offs_n,
                                    d, HEAD_D, BLOCK_N, SCALE_BLOCK, ROUND_P, IMP_QK, IMP_PV,
                                    PV_FMA, PERM_P, USE_TMA, P_LOG2_SCALE, KV_SPLITS, INTERPRET,
                                    ROW_SUM_P, P_LL)
    if SUMMARY:
        n_sum = N_KB - cnt
        if sid == KV_SPLITS - 1:
            qsum = _summary_operand(q, SUM_PREC, INTERPRET)
            if INTERPRET:
                c0 = 0
                while c0 < n_sum:
                    acc, l_i, m_i = _summary_step(c0, acc, l_i, m_i, qsum, qs, lst, cnt, n_sum,
                                                  KC, VCS, LENS, kcbase, d, HEAD_D, SUM_CHUNK,
                                                  P_LOG2_SCALE, SUM_PREC, INTERPRET)
                    c0 += SUM_CHUNK
            else:
                for c0 in tl.range(0, n_sum, SUM_CHUNK):
                    acc, l_i, m_i = _summary_step(c0, acc, l_i, m_i, qsum, qs, lst, cnt, n_sum,
                                                  KC, VCS, LENS, kcbase, d, HEAD_D, SUM_CHUNK,
                                                  P_LOG2_SCALE, SUM_PREC, INTERPRET)
    return acc, l_i, m_i


@triton.jit
def _exact_rows(acc, l_i, m_i, q, qs, tiles, lst, cnt, sid, S, S_pad, offs_n, d,
                HEAD_D: tl.constexpr, BLOCK_N: tl.constexpr, SCALE_BLOCK: tl.constexpr,
                ROUND_P: tl.constexpr, IMP_QK: tl.constexpr, IMP_PV: tl.constexpr,
                PV_FMA: tl.constexpr, PERM_P: tl.constexpr, USE_TMA: tl.constexpr,
                P_LOG2_SCALE: tl.constexpr, KV_SPLITS: tl.constexpr, INTERPRET: tl.constexpr,
                ROW_SUM_P: tl.constexpr, P_LL: tl.constexpr = False):
    """The exact key blocks of one list (``cnt`` entries at ``lst``), part ``sid``."""
    BPT: tl.constexpr = BLOCK_N // SCALE_BLOCK  # key blocks per tile
    last = tl.load(lst + cnt - 1)  # lists ascend: the partial last block comes last
    partial = ((last + 1) * SCALE_BLOCK > S).to(tl.int32)
    n_tiles = (cnt - partial) // BPT
    per = tl.cdiv(n_tiles, KV_SPLITS)
    t0 = sid * per
    t1 = tl.minimum(n_tiles, t0 + per)
    if INTERPRET:
        t = t0
        while t < t1:
            acc, l_i, m_i = _list_tile(t * BPT, lst, cnt, acc, l_i, m_i, q, qs, tiles, S, S_pad,
                                       offs_n, d, HEAD_D, BLOCK_N, SCALE_BLOCK, False, ROUND_P,
                                       IMP_QK, IMP_PV, PV_FMA, PERM_P, USE_TMA, P_LOG2_SCALE,
                                       ROW_SUM_P, P_LL)
            t += 1
    else:
        for t in tl.range(t0, t1):
            acc, l_i, m_i = _list_tile(t * BPT, lst, cnt, acc, l_i, m_i, q, qs, tiles, S, S_pad,
                                       offs_n, d, HEAD_D, BLOCK_N, SCALE_BLOCK, False, ROUND_P,
                                       IMP_QK, IMP_PV, PV_FMA, PERM_P, USE_TMA, P_LOG2_SCALE,
                                       ROW_SUM_P, P_LL)
    if sid == KV_SPLITS - 1:
        if n_tiles * BPT < cnt:
            acc, l_i, m_i = _list_tile(n_tiles * BPT, lst, cnt, acc, l_i, m_i, q, qs, tiles, S,
                                       S_pad, offs_n, d, HEAD_D, BLOCK_N, SCALE_BLOCK, True,
                                       ROUND_P, IMP_QK, IMP_PV, PV_FMA, PERM_P, USE_TMA,
                                       P_LOG2_SCALE, ROW_SUM_P, P_LL)
    if P_LL:
        acc, l_i = _ll_to_row_max(acc, l_i, m_i, qs)
    return acc, l_i, m_i


@triton.jit
def _fp8_attn_fwd_kernel(
    Q8, SQ, K8, SK, V8T, VS, VC, OUT, LSE,
    qd, kd, vd,
    S, S_pad, H, GROUP, row_start, qk_scale_log2,
    stride_ob, stride_os, stride_oh,
    BLOCKS, COUNTS, ORDER, KC, VCS, LENS, PART_O, PART_ML, N_QB, N_KB, N_BH, SUM_O, SUM_ML,
    HEAD_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    SCALE_BLOCK: tl.constexpr, ROUND_P: tl.constexpr, IMP_QK: tl.constexpr,
    IMP_PV: tl.constexpr, WRITE_LSE: tl.constexpr, OUT_F32: tl.constexpr, USE_TMA: tl.constexpr,
    PV_FMA: tl.constexpr, PERM_P: tl.constexpr, P_LOG2_SCALE: tl.constexpr,
    INTERPRET: tl.constexpr, SPARSE: tl.constexpr = False, SUMMARY: tl.constexpr = False,
    WORK_LIST: tl.constexpr = False, KV_SPLITS: tl.constexpr = 1,
    SUM_CHUNK: tl.constexpr = 64, SUM_PREC: tl.constexpr = "tf32",
    SUMMARY_ONLY: tl.constexpr = False, INIT_SUMMARY: tl.constexpr = False,
    ROW_SUM_P: tl.constexpr = False, P_LL: tl.constexpr = False,
):
    """Dense: grid (S / BLOCK_M, B * H), every key tile. SPARSE (BLOCK_M = the 64-row routing
    block): the key blocks of the query block's list (``_list_rows``); grid (n_qblocks, B * H,
    KV_SPLITS), or (B * H * n_qblocks, 1, KV_SPLITS) over the work list ORDER (list rows, longest
    lists first) with WORK_LIST. KV_SPLITS > 1 writes the unnormalized parts (acc, m * qs, l) to
    PART_O / PART_ML for ``_combine_kernel``."""
    if WORK_LIST:
        item = tl.load(ORDER + tl.program_id(0))
        pid_m = item % N_QB
        bh = item // N_QB
    else:
        pid_m = tl.program_id(0)
        bh = tl.program_id(1)
    if not WRITE_LSE:
        if (pid_m + 1) * BLOCK_M <= row_start:
            return  # rows the caller overwrites (the dense-prefix rows): nothing is stored
    b = bh // H
    h = bh % H
    bhk = b * (H // GROUP) + h // GROUP
    m0 = pid_m * BLOCK_M
    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    d = tl.arange(0, HEAD_D)
    n_scale = S_pad // SCALE_BLOCK

    if USE_TMA:
        q = qd.load([bh * S_pad + m0, 0])
    else:
        q = tl.load(Q8 + (bh * S_pad + offs_m)[:, None] * HEAD_D + d[None, :])
    qs = tl.load(SQ + bh * n_scale + offs_m // SCALE_BLOCK) * qk_scale_log2

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_D], tl.float32)
    tiles = (K8, V8T, kd, vd, SK, bhk * S_pad, bhk * HEAD_D, bhk * n_scale)
    srow = (bh * S_pad + offs_m).to(tl.int64)  # rows of the summary pass's state

    if SPARSE:
        sid = tl.program_id(2)
        acc, l_i, m_i = _list_rows(acc, l_i, m_i, q, qs, tiles, bh * N_QB + pid_m, sid, S,
                                   S_pad, offs_n, d, BLOCKS, COUNTS, KC, VCS, LENS, bhk * N_KB,
                                   N_KB, HEAD_D, BLOCK_N, SCALE_BLOCK, ROUND_P, IMP_QK, IMP_PV,
                                   PV_FMA, PERM_P, USE_TMA, P_LOG2_SCALE, SUMMARY, KV_SPLITS,
                                   SUM_CHUNK, SUM_PREC, INTERPRET, SUMMARY_ONLY, ROW_SUM_P,
                                   P_LL)
        if INIT_SUMMARY:
            if sid == 0:
                # merge the summary pass's state after the exact tiles (loading it before the
                # loop kept it live there: spills in the loop); row maxes in log2 units
                mq = m_i * qs
                ms = tl.load(SUM_ML + srow)
                mm = tl.maximum(mq, ms)
                a_x = tl.math.exp2(mq - mm)
                a_s = tl.math.exp2(ms - mm)
                acc = acc * a_x[:, None] + tl.load(SUM_O + srow[:, None] * HEAD_D + d[None, :]) \
                    * a_s[:, None]
                l_i = l_i * a_x + tl.load(SUM_ML + N_BH * S_pad + srow) * a_s
                m_i = mm / qs  # back in K units (qs > 0)
    else:
        n_full = S // BLOCK_N
        # Main loop over full key tiles: no masks (pad keys exist only in the peeled tile). The
        # tile is one function; only the loop statement differs: triton 3.6's interpreter with
        # numpy >= 2.4 cannot take a run-time `range` bound, so it runs a `while`; compiled code
        # keeps the `for`, which triton software-pipelines over num_stages.
        if INTERPRET:
            j = 0
            while j < n_full:
                acc, l_i, m_i = _key_tile(j * BLOCK_N, acc, l_i, m_i, q, qs, tiles, S, S_pad,
                                          offs_n, d, HEAD_D, BLOCK_N, SCALE_BLOCK, False,
                                          ROUND_P, IMP_QK, IMP_PV, PV_FMA, PERM_P, USE_TMA,
                                          P_LOG2_SCALE, ROW_SUM_P, P_LL)
                j += 1
        else:
            for j in tl.range(0, n_full):
                acc, l_i, m_i = _key_tile(j * BLOCK_N, acc, l_i, m_i, q, qs, tiles, S, S_pad,
                                          offs_n, d, HEAD_D, BLOCK_N, SCALE_BLOCK, False,
                                          ROUND_P, IMP_QK, IMP_PV, PV_FMA, PERM_P, USE_TMA,
                                          P_LOG2_SCALE, ROW_SUM_P, P_LL)
        # Peeled partial tile (S % BLOCK_N keys; its pad keys are zeros in memory, masked).
        if n_full * BLOCK_N < S:
            acc, l_i, m_i = _key_tile(n_full * BLOCK_N, acc, l_i, m_i, q, qs, tiles, S, S_pad,
                                      offs_n, d, HEAD_D, BLOCK_N, SCALE_BLOCK, True, ROUND_P,
                                      IMP_QK, IMP_PV, PV_FMA, PERM_P, USE_TMA, P_LOG2_SCALE,
                                      ROW_SUM_P, P_LL)
        if P_LL:
            acc, l_i = _ll_to_row_max(acc, l_i, m_i, qs)

    if SUMMARY_ONLY:  # the summary route's unnormalized state, for the exact-tile pass
        tl.store(SUM_O + srow[:, None] * HEAD_D + d[None, :], acc)
        tl.store(SUM_ML + srow, m_i * qs)
        tl.store(SUM_ML + N_BH * S_pad + srow, l_i)
    elif KV_SPLITS > 1:  # this part's unnormalized state, for the combine pass
        prow = ((tl.program_id(2) * N_BH + bh) * S_pad + offs_m).to(tl.int64)
        tl.store(PART_O + prow[:, None] * HEAD_D + d[None, :], acc)
        tl.store(PART_ML + prow, m_i * qs)
        tl.store(PART_ML + KV_SPLITS * N_BH * S_pad + prow, l_i)
    else:
        _epilogue(acc, l_i, m_i * qs, bh, b, h, bhk, offs_m, d, VS, VC, OUT, LSE, S, row_start,
                  stride_ob, stride_os, stride_oh, HEAD_D, WRITE_LSE, OUT_F32, P_LOG2_SCALE,
                  INTERPRET)


@triton.jit
def _combine_kernel(PART_O, PART_ML, VS, VC, OUT, LSE, S, S_pad, H, GROUP, row_start, N_BH,
                    stride_ob, stride_os, stride_oh,
                    HEAD_D: tl.constexpr, BLOCK_M: tl.constexpr, KV_SPLITS: tl.constexpr,
                    WRITE_LSE: tl.constexpr, OUT_F32: tl.constexpr, P_LOG2_SCALE: tl.constexpr,
                    INTERPRET: tl.constexpr):
    """Merge the KV_SPLITS parts of every row: M = max of the parts' row maxes (log2 units),
    acc = sum 2^(m_s - M) acc_s, l = sum 2^(m_s - M) l_s, then the epilogue of the one-part
    kernel. Grid (S / BLOCK_M, B * H). Blocks of dense-prefix rows that the parts skipped
    (no LSE asked) are skipped here too: their parts were never written."""
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    if not WRITE_LSE:
        if (pid_m + 1) * BLOCK_M <= row_start:
            return
    b = bh // H
    h = bh % H
    bhk = b * (H // GROUP) + h // GROUP
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    d = tl.arange(0, HEAD_D)
    mlog = tl.full([BLOCK_M], float("-inf"), tl.float32)
    for s in tl.static_range(KV_SPLITS):
        mlog = tl.maximum(mlog, tl.load(PART_ML + (s * N_BH + bh) * S_pad + offs_m))
    acc = tl.zeros([BLOCK_M, HEAD_D], tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    for s in tl.static_range(KV_SPLITS):
        prow = ((s * N_BH + bh) * S_pad + offs_m).to(tl.int64)
        w = tl.math.exp2(tl.load(PART_ML + prow) - mlog)  # 0 for a part without keys
        l_i += w * tl.load(PART_ML + KV_SPLITS * N_BH * S_pad + prow)
        acc += w[:, None] * tl.load(PART_O + prow[:, None] * HEAD_D + d[None, :])
    _epilogue(acc, l_i, mlog, bh, b, h, bhk, offs_m, d, VS, VC, OUT, LSE, S, row_start,
              stride_ob, stride_os, stride_oh, HEAD_D, WRITE_LSE, OUT_F32, P_LOG2_SCALE,
              INTERPRET)


def check_p_form(p_log2_scale: float, row_sum: str, p_exp: str) -> None:
    """The recipe's row sum and P from its exponent as a launch takes them (every kernel
    launcher; ``recipe.validate`` refuses the same combinations): p_exp "log_linear" writes codes
    of the scaled P (p_log2_scale 8, p_scaling "exp2_offset8") that the row sum must take."""
    if row_sum not in ROW_SUMS:
        raise ValueError(f"row_sum: {row_sum!r}; the kernel implements {list(ROW_SUMS)}")
    if p_exp not in P_EXPS:
        raise ValueError(f"p_exp: {p_exp!r}; the kernel implements {list(P_EXPS)}")
    if p_exp == "log_linear" and (p_log2_scale, row_sum) != (
            P_LOG2_SCALES["exp2_offset8"], "p_operand"):
        raise ValueError(f"p_exp='log_linear' needs p_scaling='exp2_offset8' and "
                         f"row_sum='p_operand' (got P scaled by 2^{p_log2_scale:g}, row_sum "
                         f"{row_sum!r}): its codes are of the scaled P, and the row sum must "
                         "take them")


def _check_launch(qkv, num_heads: int, scale, out, row_start: int, out_f32: bool) -> None:
    """What the kernels take on trust (they write through raw pointers): the head count, a finite
    positive scale, rows 0 <= row_start <= S, and an ``out`` of [B, S, H, D] on q's device, unit
    stride along D, of a dtype the kernels store (FP32 with out_f32, else BF16 / FP16). A wrong
    buffer would be written past its end or read back uninitialised."""
    B, H, _, D = qkv.q8.shape
    S = qkv.seq_len
    if num_heads != H:
        raise ValueError(f"num_heads: {num_heads}; the quantized q has {H} heads")
    check_scale(scale)
    if isinstance(row_start, bool) or not isinstance(row_start, int) or not 0 <= row_start <= S:
        raise ValueError(f"row_start: {row_start!r}; rows 0..{S} of a {S}-row sequence")
    if out is None:
        return
    want = (torch.float32,) if out_f32 else (torch.bfloat16, torch.float16)
    if tuple(out.shape) != (B, S, H, D) or out.device != qkv.q8.device or out.dtype not in want \
            or out.stride(-1) != 1:
        raise ValueError(f"out: {tuple(out.shape)} {out.dtype} on {out.device} (stride along D "
                         f"{out.stride(-1)}); the kernels write [B, S, H, D] = {(B, S, H, D)} of "
                         f"{' or '.join(str(d) for d in want)} on {qkv.q8.device}, unit stride "
                         "along D")


def fp8_attention_fwd(
    qkv,
    *,
    num_heads: int,
    scale: float,
    out: torch.Tensor | None = None,
    out_dtype: torch.dtype = torch.bfloat16,
    row_start: int = 0,
    return_lse: bool = False,
    out_f32: bool = False,
    p_scaling: str = "unit",
    row_sum: str = "p_fp32",
    config: AttentionConfig = DEFAULT.attention,
    p_exp: str = "exp2",
    routing=None,
    sparse: SparseConfig = DEFAULT.sparse,
):
    """Attention on a ``quantize.QuantizedQKV``. Returns (out [B, S, H, D], lse [B, H, S] or None).

    out: optional preallocated [B, S, H, D] (rows < row_start are left untouched: the dense-prefix
    rows that the merged pass fills). out_f32: write FP32 o = acc * s_v / l WITHOUT v_corr.
    p_scaling: the recipe's P scaling ("unit", "exp2_offset8", "rowmax448"; module docstring).
    row_sum: the recipe's row sum: "p_fp32" (the FP32 P) or "p_operand" (the E4M3 P of P @ V:
    on the tensor cores as P @ ones in the warp-specialized kernels, FP32 adds of the rounded P
    in the programs kernel; Sol's summary route keeps its FP32 row sum, as the emulation).
    p_exp: the recipe's P from its exponent: "exp2" (the SFU's exp2, rounded to E4M3) or
    "log_linear" (the E4M3 code linear in the exponent, one FMA per element; needs
    p_scaling "exp2_offset8" and row_sum "p_operand", as the recipe does).
    config: tiling and launch (``config.AttentionConfig``; default = the measured H200 values).
    routing: a ``routing.BlockRouting`` (64-token blocks, computed with the same mu_K / mu_V as
    the quantizer): only the key blocks of each query block's exact list run, and Sol's summary
    route adds the other blocks (when ``routing.kc`` is set); needs config.block_m = 64. sparse:
    its schedule, KV splits and summary route (``config.SparseConfig``).
    """
    if p_scaling not in P_LOG2_SCALES:
        raise ValueError(f"p_scaling: {p_scaling!r}; the kernel implements {list(P_LOG2_SCALES)}")
    check_p_form(P_LOG2_SCALES[p_scaling], row_sum, p_exp)
    B, H, S_pad, D = qkv.q8.shape
    Hkv = qkv.k8.shape[1]
    S = qkv.seq_len
    c = config
    _check_launch(qkv, num_heads, scale, out, row_start, out_f32)
    if c.flush == "fma" and D > c.max_imprecise:
        raise ValueError(f"flush='fma' flushes after head_dim={D} FP8 terms, more than "
                         f"max_imprecise={c.max_imprecise}; use flush='triton'")
    interp = interpreting()
    if (c.dense_schedule == "warp_specialized" and routing is None and not interp
            and qkv.q8.dtype == torch.float8_e4m3fn and D == 128):
        # the Gluon kernel (dense E4M3, head dim 128, compiled): the programs kernel's values on
        # another schedule (config.AttentionConfig.schedule)
        from .attention_fp8_ws import fp8_attention_fwd_ws

        return fp8_attention_fwd_ws(qkv, num_heads=num_heads, scale=scale, out=out,
                                    out_dtype=out_dtype, row_start=row_start,
                                    return_lse=return_lse, out_f32=out_f32, p_scaling=p_scaling,
                                    row_sum=row_sum, stages=c.num_stages, p_exp=p_exp)
    bf16_ops = qkv.q8.dtype == torch.bfloat16  # quantize.bf16_operands: the BF16 baselines
    if bf16_ops and p_exp != "exp2":
        raise ValueError(f"p_exp={p_exp!r} with BF16 operands: the BF16 baselines take the "
                         "FP32 exp2")
    if bf16_ops and row_sum != "p_fp32":
        raise ValueError(f"row_sum={row_sum!r} with BF16 operands: the BF16 baselines sum the "
                         "FP32 P (the kernels round the row sum's P to E4M3)")
    if bf16_ops and c.flush != "fma":
        raise ValueError("BF16 operands: flush='triton' bounds FP8 product chains only; use "
                         "flush='fma'")
    num_stages = 1 if interp else c.num_stages
    assert S_pad % c.block_m == 0 and S_pad % c.block_n == 0
    if out is None:
        dt = torch.float32 if out_f32 else out_dtype
        out = torch.empty((B, S, H, D), dtype=dt, device=qkv.q8.device)
    lse = torch.empty((B, H, S), dtype=torch.float32, device=out.device) if return_lse else None
    use_tma = bool(c.use_tma) if routing is None else bool(sparse.tma)
    box_n = c.block_n if routing is None else 64  # sparse: one TMA box per key block
    qd = kd = vd = None
    if use_tma:
        from triton.tools.tensor_descriptor import TensorDescriptor

        qd = TensorDescriptor.from_tensor(qkv.q8.view(B * H * S_pad, D), [c.block_m, D])
        kd = TensorDescriptor.from_tensor(qkv.k8.view(B * Hkv * S_pad, D), [box_n, D])
        vd = TensorDescriptor.from_tensor(qkv.v8t.view(B * Hkv * D, S_pad), [D, box_n])
    cap = c.maxnreg if routing is None else sparse.maxnreg
    pv_fma = c.flush == "fma"
    grid = (triton.cdiv(S, c.block_m), B * H)
    sp = (_SparseLaunch.build(qkv, routing, sparse, c, grid, p_scaling)
          if routing is not None else None)

    def launch(launch_grid, args, constexprs, maxnreg):
        extra = {"maxnreg": maxnreg} if maxnreg else {}
        _fp8_attn_fwd_kernel[launch_grid](
            qkv.q8, qkv.q_scale, qkv.k8, qkv.k_scale, qkv.v8t, qkv.v_scale, qkv.v_corr, out,
            lse if lse is not None else out,
            qd, kd, vd,
            S, S_pad, H, H // Hkv, row_start, scale * LOG2E,
            out.stride(0), out.stride(1), out.stride(2),
            *args,
            HEAD_D=D, BLOCK_M=c.block_m, BLOCK_N=c.block_n, SCALE_BLOCK=64,
            ROUND_P=(2 if bf16_ops else 1) if interp else 0,  # _round_p
            IMP_QK=-1 if pv_fma else min(c.max_imprecise, D),
            IMP_PV=min(c.max_imprecise, c.block_n), WRITE_LSE=return_lse, OUT_F32=out_f32,
            USE_TMA=use_tma, PV_FMA=pv_fma, PERM_P=bool(qkv.v_perm),
            P_LOG2_SCALE=P_LOG2_SCALES[p_scaling], INTERPRET=interp,
            ROW_SUM_P=row_sum == "p_operand", P_LL=p_exp == "log_linear",
            num_warps=c.num_warps, num_stages=num_stages, **constexprs, **extra,
        )

    if sp is None:
        launch(grid, (None,) * 8 + (0, 0, B * H, None, None), {}, cap)
    else:
        if sp.summary_constexprs is not None:  # Sol's summary route as its own pass; the
            # state it hands to the exact-tiles: acc [B*H, S_pad, D], (m * qs, l) [2, B*H, S_pad]
            sp.sum_o = torch.empty((B * H, S_pad, D), dtype=torch.float32, device=out.device)
            sp.sum_ml = torch.empty((2, B * H, S_pad), dtype=torch.float32, device=out.device)
            from . import summary_gluon

            if summary_gluon.applies(qkv, sparse, interp):
                summary_gluon.summary_pass(qkv, *sp.args[:2], *sp.args[3:5], sp.sum_o, sp.sum_ml,
                                           scale=scale, row_start=row_start,
                                           p_log2_scale=P_LOG2_SCALES[p_scaling],
                                           chunk=sparse.summary_chunk,
                                           skip_prefix=not return_lse)
            else:
                sum_args = sp.args[:6] + (None, None) + sp.args[8:] + (B * H, sp.sum_o,
                                                                       sp.sum_ml)
                launch(grid + (1,), sum_args, dict(sp.summary_constexprs, SUMMARY_ONLY=True),
                       None)
        if sp.ws:  # the exact tiles, warp-specialized
            from . import attention_fp8_ws_lists as ws_lists

            # whole CTAs of query blocks routed to every key block (prefix_blocks_exact): the
            # dense kernel's rows (its three consumers share each K / V tile) on a side stream
            dense_end = (routing.dense_rows // 3) * 192 if sparse.dense_rows_kernel else 0
            side = None
            if dense_end > row_start and not return_lse:
                from . import streams
                from .attention_fp8_ws import fp8_attention_fwd_ws

                side = streams.side_stream(streams.device_index(out))
                main = torch.cuda.current_stream(out.device)
                side.wait_stream(main)
                with torch.cuda.stream(side):
                    fp8_attention_fwd_ws(qkv, num_heads=num_heads, scale=scale, out=out,
                                         row_start=row_start, out_f32=out_f32,
                                         p_scaling=p_scaling, row_sum=row_sum,
                                         stages=c.num_stages, row_end=dense_end, p_exp=p_exp)
            try:  # the summary tiles' operands after the fork: the dense rows do not need them
                tiles = None
                if sp.tiles:  # made by the routing's front where it could (the same values)
                    tiles = routing.tiles
                    if tiles is None or not tiles.fits(qkv):
                        tiles = ws_lists.summary_tiles(qkv, routing)
                ws_lists.fp8_attention_ws_lists(
                    qkv, routing, out=out, lse=lse, scale=scale,
                    row_start=dense_end if side is not None else row_start,
                    out_f32=out_f32, p_log2_scale=P_LOG2_SCALES[p_scaling], sum_o=sp.sum_o,
                    sum_ml=sp.sum_ml, stages=c.num_stages, grouping=sparse.ws_grouping,
                    summary=tiles, row_sum=row_sum, p_exp=p_exp)
            finally:
                if side is not None:
                    main.wait_stream(side)
        else:
            launch(sp.grid, sp.args + (B * H, sp.sum_o, sp.sum_ml), sp.constexprs, cap)
    if sp and sp.splits > 1:
        _combine_kernel[grid](
            sp.part_o, sp.part_ml, qkv.v_scale, qkv.v_corr, out,
            lse if lse is not None else out, S, S_pad, H, H // Hkv, row_start, B * H,
            out.stride(0), out.stride(1), out.stride(2),
            HEAD_D=D, BLOCK_M=c.block_m, KV_SPLITS=sp.splits, WRITE_LSE=return_lse,
            OUT_F32=out_f32, P_LOG2_SCALE=P_LOG2_SCALES[p_scaling], INTERPRET=interp,
            num_warps=4,
        )
    return out, lse


@dataclass
class _SparseLaunch:
    """The sparse kernel's grid, its extra run-time arguments (BLOCKS, COUNTS, ORDER, KC, VCS,
    LENS, PART_O, PART_ML, N_QB, N_KB) and compile-time flags, and the KV-split buffers."""

    grid: tuple
    args: tuple
    constexprs: dict
    splits: int
    part_o: torch.Tensor | None
    part_ml: torch.Tensor | None
    # the summary pass (Sol): its flags and the state it hands to the exact-tile pass,
    # acc [B*H, S_pad, D] and (m * qs, l) [2, B*H, S_pad] (allocated where the pass runs)
    summary_constexprs: dict | None = None
    sum_o: torch.Tensor | None = None
    sum_ml: torch.Tensor | None = None
    ws: bool = False  # the exact tiles in the warp-specialized kernel (attention_fp8_ws_lists)
    tiles: bool = False  # Sol's summary route as E4M3 tiles of that kernel (no pass)

    @classmethod
    def build(cls, qkv, routing, sparse: SparseConfig, c: AttentionConfig, grid,
              p_scaling: str = "unit"):
        B, H, S_pad, D = qkv.q8.shape
        nq, nk = routing.exact.shape[-2:]
        if routing.block != 64 or c.block_m != 64:
            raise ValueError(f"sparse attention: the routing block ({routing.block}) and "
                             f"AttentionConfig.block_m ({c.block_m}) must both be 64")
        if routing.blocks.shape != (B, H, grid[0], grid[0]):
            raise ValueError(f"routing: lists {tuple(routing.blocks.shape)} do not fit q8 "
                             f"{tuple(qkv.q8.shape)} (expected [{B}, {H}, {grid[0]}, "
                             f"{grid[0]}])")
        dev = qkv.q8.device
        n_sms = (torch.cuda.get_device_properties(dev).multi_processor_count
                 if dev.type == "cuda" else 132)
        splits = sparse.splits_for(B * H * nq, n_sms)
        from . import attention_fp8_ws_lists as ws_lists

        ws = ws_lists.applies(qkv, sparse, splits, c)
        # Sol's summary route as E4M3 tiles of the warp-specialized kernel, or its own pass
        tiles = ws and routing.kc is not None and sparse.summary_kernel == "fp8_tiles"
        cst = dict(SPARSE=True)
        kc = vcs = lens = order = part_o = part_ml = None
        sum_cst = None
        if routing.kc is not None and not tiles:  # Sol's summary route as its own pass
            kc = routing.kc.contiguous()
            vcs = (routing.vc / qkv.v_scale[:, :, None, :]).contiguous()  # s_v: the epilogue's
            if sparse.summary_precision == "bf16":  # the kernel's rounding, done once here
                kc, vcs = kc.to(torch.bfloat16), vcs.to(torch.bfloat16)
            lens = routing.lens.to(torch.float32).contiguous()
            # its own pass (config.SparseConfig says why); the exact-tile pass merges its state
            sum_cst = dict(SPARSE=True, SUMMARY=True, SUM_CHUNK=sparse.summary_chunk,
                           SUM_PREC=sparse.summary_precision)
            cst["INIT_SUMMARY"] = True
        if sparse.schedule == "heavy_first":
            # list rows bh * nq + i, the longest exact list first (stable: ties in grid order)
            order = torch.argsort(routing.counts.reshape(-1), descending=True, stable=True)
            order = order.to(torch.int32)
            cst["WORK_LIST"] = True
            launch = (B * H * nq, 1, splits)
        else:
            launch = (grid[0], grid[1], splits)
        if splits > 1:
            cst["KV_SPLITS"] = splits
            part_o = torch.empty((splits, B * H, S_pad, D), dtype=torch.float32, device=dev)
            part_ml = torch.empty((2, splits, B * H, S_pad), dtype=torch.float32, device=dev)
        args = (routing.blocks.contiguous(), routing.counts.contiguous(), order, kc, vcs, lens,
                part_o, part_ml, nq, nk)
        return cls(launch, args, cst, splits, part_o, part_ml, sum_cst, ws=ws, tiles=tiles)


def default_scale(d: int) -> float:
    return 1.0 / math.sqrt(d)

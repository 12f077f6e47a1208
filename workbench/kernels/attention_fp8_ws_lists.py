"""The block-sparse exact tiles on the warp-specialized schedule (Gluon): one TMA producer warp
and three consumer warpgroups, each walking its own query block's list of exact key blocks.

Torch twin: ``workbench.attention.reference._attend`` with the ``fp8_sol_*`` recipes or an FP8
recipe with ``sparsity="vsa"`` (``recipe_attention``), exactly as the Triton kernel's sparse
specialization (``attention_fp8._list_rows`` with TMA boxes, ``_list_tile_halves``), whose
numerics this kernel repeats operation for operation: each tile is two 64-key blocks of the list
(two TMA boxes, each with its own P @ V, one online-softmax step per tile; the boxes lie one
after the other in shared memory, so Q K^T is one 128-key product with the same values, which
measured 5.545 against 5.637 ms for two 64-key products at the H3 anchor, commit 77d15e8), the last
tile masked (an odd last entry, the partial last block of the sequence), then the merge of Sol's
summary-pass state (``INIT_SUMMARY``) and the dense kernel's epilogue. What differs is the
schedule, as in ``attention_fp8_ws``: a CTA takes three query blocks of one head, three
consecutive entries of the head's ORDER (``SparseConfig.ws_grouping``: the query blocks in
sequence order, or sorted by list length, longest first, so that a CTA's three lists are about
as long: its consumers finish together instead of two of them waiting for the longest list);
the producer warp reads their lists and loads every consumer's boxes into that consumer's own
ring of STAGES slots (the lists differ, so nothing is shared), so the consumers issue no TMA
loads or bookkeeping (only their next tile's two block indices and K scales, a tile ahead);
registers 24 / 160 / 160 / 168 (``setmaxnreg``). The CTAs holding query blocks routed to every
key block (``BlockRouting.dense_rows``, the recipe's ``prefix_blocks_exact``) start before all
others (``heavy_groups``): started head by head their long lists ran past the last head's CTAs.

Taken for one KV part (``SparseConfig.kv_splits`` 1), E4M3 operands, head dim 128, TMA boxes
(``SparseConfig.schedule="warp_specialized"``) and the attention tiling it implements (128 keys
per tile, flush "fma" after <= 128 terms, two slots: three rings of three slots would need 312 KB
of shared memory); otherwise the programs kernel runs.

Sol's summary route (``SparseConfig.summary_kernel``): by default ("fp8_tiles", ``SUM_TILES``)
each consumer runs it after its exact tiles as E4M3 tiles through the same ring: every key block
of the head in tiles of 128 (``summary_tiles``: the block means kc / skc, one scale per head, as
the K boxes; the block sums vc / (256 s_v) as the V^T boxes, so P = 2^(s - m + 8) in E4M3 keeps
the weights out of E4M3's subnormals), a consumer's exact blocks masked by a score bias of -inf
that the producer writes into shared memory from ``routing.exact``; the row sum adds each
weight times 64 rows in FP32 (the sequence's last block of n rows: its weight carries n / 64
through its score bias and its vc8 column is its sum times 64 / n, so no tile is special).
With ``row_sum="p_operand"`` the exact tiles' row sum is P @ ones on the tensor cores, one n = 8
product per 64-key half (``_pv_flush``, as the dense kernel's); the summary tiles keep their FP32
sum of the weights, as the twin's summary route does, except with ``p_exp="log_linear"``, where
their weights are P's codes as well and their row sum P @ ones (``_sum_tile``; offline for sm_90a
their loop 505-509 SASS instructions against 542-549 with the exponentials, the exact tiles' spills
4 per tile in consumers 1 and 2 against 10; on the H200 the full calls 0.3-1.9% faster in nine of
ten pairs over two runs at five Sol densities (one 0.2% slower), mostly within the rounds' spread,
errors within 0.02%: BENCHMARKS.md, 2026-12-03). With a scaled P (``exp2_offset8``: the exact
tiles' P is 2^(s - m + 8)) the first summary tile divides the state (acc, l) by that factor with
its rescale, exactly (a power of two), and the summary tiles and the epilogue run as for the unit P
(the same acc / l; the LSE is not offset again). Offline, as the H3 launch compiles: multiplying
each summary product by 2^8 in the flush instead cost 64 instructions per summary tile (592 against
528), and dividing the state after the exact loop made ptxas spill 8-20 instructions per exact
tile.
Where this kernel does not run, the route is its own pass
(``summary_gluon`` or the Triton kernel's), whose state this kernel merges (``INIT_SUMMARY``).
The twin's route is FP32; E4M3 operands moved the H3 anchor's error against float64 from
6.493e-3 (the BF16 pass) to 6.499e-3 (twin 6.501e-3), and on the CPU twin the weights without
the 2^8 factor gave 6.860e-3 (BENCHMARKS.md). A BF16 route inside the
consumers (commit 1e33a5d: Q in BF16 and gathered kc / vc chunks in the ring) measured slower
than its own pass.

Gluon does not run in the interpreter: the CPU tests compile it for sm_90a, the GPU tests
compare it with the Triton kernel and float64.

Shapes: Q8 [B, H, S_pad, D], K8 [B, Hkv, S_pad, D], V8t [B, Hkv, D, S_pad]; lists BLOCKS
[B * H * N_QB, N_KB] (ascending exact key blocks, ``COUNTS`` entries each, at least one); ORDER
[B * H, N_QB] int32 (row stride ORDER_STRIDE, 0 for one order shared by the heads): per head a
permutation of its query blocks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl
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

from .attention_fp8_ws import (
    CONSUMER_REGS,
    CONSUMERS,
    LOG2E,
    MAXNREG,
    _ones_product,
    _ones_row_sums,
    _ll_codes,
    _ll_row_bias,
    _ll_row_max,
    _ones_tile,
    _p_operand,
    _rescaled_row_sums,
    _row_bias,
    _store_rows,
    descriptors,
)
from .e4m3 import interpreting
from .quantize import _v_src_token, over_448, summary_tile_rows, v_token_order


@gluon.jit
def _list_shape(lst, cnt, S):
    """(unmasked tiles, all tiles) of a list of cnt >= 1 ascending 64-key blocks: pairs of
    blocks; the last tile (masked) takes an odd last entry and / or the partial last block."""
    last = gl.load(lst + gl.maximum(cnt - 1, 0))
    partial = ((last + 1) * 64 > S).to(gl.int32)
    n_full = (cnt - partial) // 2
    n_all = n_full + (2 * n_full < cnt).to(gl.int32)
    return n_full, gl.where(cnt > 0, n_all, 0)


@gluon.jit
def _pair(lst, cnt, n_all, i):
    """The key blocks of tile i: entries 2i and 2i + 1 of the list (the first again when the
    second is absent; a tile past the list reads its first entry, never used)."""
    e = gl.where(i < n_all, 2 * i, 0)
    j0 = gl.load(lst + e)
    j1 = gl.load(lst + gl.maximum(gl.minimum(e + 1, cnt - 1), 0))
    return j0, j1


@gluon.jit
def _load_slot(k_desc, v_desc, k_rows, v_cols, vbase, rb, k_smem, v_smem, slot):
    """Two K boxes (rows k_rows) and two V^T boxes (columns v_cols of rows from vbase) into the
    slot's two halves, their bytes completing on barrier rb."""
    tma.async_copy_global_to_shared(k_desc, [k_rows[0], 0], rb, k_smem.index(2 * slot))
    tma.async_copy_global_to_shared(k_desc, [k_rows[1], 0], rb, k_smem.index(2 * slot + 1))
    tma.async_copy_global_to_shared(v_desc, [vbase, v_cols[0]], rb, v_smem.index(2 * slot))
    tma.async_copy_global_to_shared(v_desc, [vbase, v_cols[1]], rb, v_smem.index(2 * slot + 1))


@gluon.jit
def _produce(c: gl.constexpr, i, pair, lists, k_desc, v_desc, k_smem, v_smem, ready, empty,
             kbase, vbase):
    """Tile i of consumer c (its blocks in `pair`); returns the blocks of tile i + 1, whose
    loads are issued first so that they fly while the producer waits for the slot."""
    STAGES: gl.constexpr = ready.shape[0] // 3
    lst, cnt, n_all, n_full, _, _ = lists[c]
    nxt = _pair(lst, cnt, n_all, i + 1)
    if i < n_all:
        j0, j1 = pair
        slot = c * STAGES + i % STAGES
        mbarrier.wait(empty.index(slot), ((i // STAGES) & 1) ^ 1)
        mbarrier.expect(ready.index(slot), 2 * (k_desc.block_type.nbytes
                                                + v_desc.block_type.nbytes))
        _load_slot(k_desc, v_desc, (kbase + j0 * 64, kbase + j1 * 64), (j0 * 64, j1 * 64),
                   vbase, ready.index(slot), k_smem, v_smem, slot)
    return nxt


@gluon.jit
def _produce_sum(c: gl.constexpr, i, pair, lists, k_desc, v_desc, k_smem, v_smem, ready,
                 empty, kbase, vbase, ks_desc, vs_desc, ksbase, n_sum, N_KB, bias_smem, exrow,
                 last_bias):
    """``_produce`` with Sol's summary tiles (``SUM_TILES``): running tile i of consumer c is
    its exact tile i (blocks in `pair`) for i < n_all, then summary tile i - n_all: the kc8
    rows and vc8^T columns of 128 key blocks, and the tile's score bias (-inf for a block of
    the consumer's exact list and past the sequence: its flags in ``routing.exact``, row
    `exrow`; `last_bias` for the sequence's last block, ``_last_bias``; else 0) stored into
    shared memory before the arrive that completes the slot."""
    STAGES: gl.constexpr = ready.shape[0] // 3
    lst, cnt, n_all, n_full, runs, _ = lists[c]
    tot = gl.where(runs, n_sum + n_all, 0)
    nxt = pair
    if i < tot:
        slot = c * STAGES + i % STAGES
        mbarrier.wait(empty.index(slot), ((i // STAGES) & 1) ^ 1)
        nbytes: gl.constexpr = 2 * (k_desc.block_type.nbytes + v_desc.block_type.nbytes)
        rb = ready.index(slot)
        if i >= n_all:
            u = i - n_all
            bl: gl.constexpr = gl.BlockedLayout([4], [32], [1], [0])
            jb = u * 128 + gl.arange(0, 128, layout=bl)
            ex = gl.load(exrow + jb, mask=jb < N_KB, other=1)
            bias = gl.where(jb == N_KB - 1, last_bias, 0.0)
            bias_smem.index(slot).store(gl.where(ex != 0, float("-inf"), bias))
            mbarrier.expect(rb, nbytes)
            _load_slot(ks_desc, vs_desc, (ksbase + u * 128, ksbase + u * 128 + 64),
                       (u * 128, u * 128 + 64), vbase, rb, k_smem, v_smem, slot)
        else:
            mbarrier.expect(rb, nbytes)
            nxt = _pair(lst, cnt, n_all, i + 1)
            j0, j1 = pair
            _load_slot(k_desc, v_desc, (kbase + j0 * 64, kbase + j1 * 64), (j0 * 64, j1 * 64),
                       vbase, rb, k_smem, v_smem, slot)
    return nxt


@gluon.jit
def _query_block(c: gl.constexpr, args):
    """Consumer c's query block: entry pid_q0 + c of its head's ORDER (the last entry again for
    a consumer past the end, whose list is then empty)."""
    bh, N_QB, pid_q0, ORDER, ORDER_STRIDE = args[18], args[30], args[36], args[37], args[38]
    return gl.load(ORDER + bh * ORDER_STRIDE + gl.minimum(pid_q0 + c, N_QB - 1))


@gluon.jit
def _row_list(c: gl.constexpr, args, WRITE_LSE: gl.constexpr):
    """(list pointer, entries, tiles, unmasked tiles, whether it runs, the query block) of
    consumer c: it does not run past the last block, nor for a block of rows < row_start (the
    dense-prefix rows the caller overwrites) unless their LSE is written; no tiles then."""
    (S, bh, pid_q0, BLOCKS, COUNTS, N_QB, N_KB, row_start) = (
        args[15], args[18], args[36], args[28], args[29], args[30], args[31], args[27])
    qb = _query_block(c, args)
    row = bh * N_QB + qb
    lst = BLOCKS + row.to(gl.int64) * N_KB
    runs = pid_q0 + c < N_QB
    if not WRITE_LSE:
        runs = runs & ((qb + 1) * 64 > row_start)
    cnt = gl.where(runs, gl.load(COUNTS + row), 0)
    n_full, n_all = _list_shape(lst, cnt, S)
    return lst, cnt, n_all, n_full, runs, qb


@gluon.jit
def _last_bias(c: gl.constexpr, args):
    """The score bias of the sequence's last key block in consumer c's summary tiles, in the
    units of the raw E4M3 products: log2(n / 64) / (qs skc) for its n rows (``LAST_LOG2`` =
    log2(n / 64), 0 for a full block), so that its weight 2^(s - m + 8) carries the factor
    n / 64 and the row sum's 64 rows per block count n for it (``summary_tiles`` stores that
    block's sum times 64 / n, its numerator unchanged). qs skc is clamped at 2^-120 (1 / that
    stays finite): below it every score of the tile is under 2^-95 in magnitude, and the block
    weighs between n / 64 and 1 of a full block instead of n / 64."""
    SQ, bh, n_scale, qk_scale_log2, bhk = args[9], args[18], args[17], args[23], args[19]
    SKC, LAST_LOG2 = args[41], args[44]
    qs = gl.load(SQ + bh * n_scale + _query_block(c, args)) * qk_scale_log2
    return LAST_LOG2 / gl.maximum(qs * gl.load(SKC + bhk), 2.0**-120)


@gluon.jit
def _producer(args, cid: gl.constexpr, P_LOG2_SCALE: gl.constexpr, PERM_P: gl.constexpr,
              WRITE_LSE: gl.constexpr, OUT_F32: gl.constexpr, INIT_SUMMARY: gl.constexpr,
              SUM_TILES: gl.constexpr, ROW_SUM_MMA: gl.constexpr, P_LL: gl.constexpr):
    """The producer warp (the consumers' signature: warp_specialize's worker partitions share
    one; only args is read)."""
    (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, ready, empty,
     SQ, SK, VS, VC, OUT, LSE, S, S_pad, n_scale, bh, bhk, b, h, m0, qk_scale_log2,
     stride_ob, stride_os, stride_oh, row_start) = args[:28]
    HEAD_D: gl.constexpr = k_smem.shape[2]
    mbarrier.expect(q_bar, 3 * q_desc.block_type.nbytes)
    for c in gl.static_range(3):
        tma.async_copy_global_to_shared(q_desc, [bh * S_pad + _query_block(c, args) * 64, 0],
                                        q_bar, q_smem.index(c))
    lists = (_row_list(0, args, WRITE_LSE), _row_list(1, args, WRITE_LSE),
             _row_list(2, args, WRITE_LSE))
    kbase = bhk * S_pad
    vbase = bhk * HEAD_D
    # round robin over the consumers, each a tile at a time: their rings fill together; each
    # consumer's next block indices are loaded one tile ahead
    p0 = _pair(lists[0][0], lists[0][1], lists[0][2], 0)
    p1 = _pair(lists[1][0], lists[1][1], lists[1][2], 0)
    p2 = _pair(lists[2][0], lists[2][1], lists[2][2], 0)
    if SUM_TILES:
        # after a consumer's exact tiles its ring takes Sol's summary tiles, n_sum each
        N_QB, N_KB, ks_desc, vs_desc, EXACT, bias_smem = (args[30], args[31], args[39],
                                                          args[40], args[42], args[43])
        n_sum = gl.cdiv(N_KB, 128)
        ksbase = bhk * n_sum * 128
        t0 = gl.where(lists[0][4], n_sum + lists[0][2], 0)
        t1 = gl.where(lists[1][4], n_sum + lists[1][2], 0)
        t2 = gl.where(lists[2][4], n_sum + lists[2][2], 0)
        x0 = EXACT + (bh * N_QB + lists[0][5]).to(gl.int64) * N_KB
        x1 = EXACT + (bh * N_QB + lists[1][5]).to(gl.int64) * N_KB
        x2 = EXACT + (bh * N_QB + lists[2][5]).to(gl.int64) * N_KB
        b0 = _last_bias(0, args)
        b1 = _last_bias(1, args)
        b2 = _last_bias(2, args)
        for i in range(gl.maximum(t0, gl.maximum(t1, t2))):
            p0 = _produce_sum(0, i, p0, lists, k_desc, v_desc, k_smem, v_smem, ready, empty,
                              kbase, vbase, ks_desc, vs_desc, ksbase, n_sum, N_KB, bias_smem, x0,
                              b0)
            p1 = _produce_sum(1, i, p1, lists, k_desc, v_desc, k_smem, v_smem, ready, empty,
                              kbase, vbase, ks_desc, vs_desc, ksbase, n_sum, N_KB, bias_smem, x1,
                              b1)
            p2 = _produce_sum(2, i, p2, lists, k_desc, v_desc, k_smem, v_smem, ready, empty,
                              kbase, vbase, ks_desc, vs_desc, ksbase, n_sum, N_KB, bias_smem, x2,
                              b2)
    else:
        for i in range(gl.maximum(lists[0][2], gl.maximum(lists[1][2], lists[2][2]))):
            p0 = _produce(0, i, p0, lists, k_desc, v_desc, k_smem, v_smem, ready, empty, kbase,
                          vbase)
            p1 = _produce(1, i, p1, lists, k_desc, v_desc, k_smem, v_smem, ready, empty, kbase,
                          vbase)
            p2 = _produce(2, i, p2, lists, k_desc, v_desc, k_smem, v_smem, ready, empty, kbase,
                          vbase)
    # the Q boxes have landed before the CTA ends, also when no consumer ran (three blocks of
    # dense-prefix rows) and so none waited for them
    mbarrier.wait(q_bar, 0)


@gluon.jit
def _qk_scores(t, q, c: gl.constexpr, args, mma: gl.constexpr):
    """(Q K^T [64, 128] FP32, the ring slot) of consumer c's running tile t: wait for the slot,
    then one 128-key product of the slot's two K boxes (adjacent in shared memory)."""
    k_smem, ready = args[4], args[7]
    STAGES: gl.constexpr = ready.shape[0] // 3
    HEAD_D: gl.constexpr = k_smem.shape[2]
    slot = c * STAGES + t % STAGES
    k_pairs = k_smem._reinterpret(k_smem.dtype, [k_smem.shape[0] // 2, 128, HEAD_D],
                                  k_smem.layout)
    mbarrier.wait(ready.index(slot), (t // STAGES) & 1)
    z = gl.zeros([64, 128], gl.float32, mma)
    raw = warpgroup_mma(q, k_pairs.index(slot).permute((1, 0)), z, use_acc=False,
                        is_async=True)
    return warpgroup_mma_wait(0, deps=(raw,)), slot


@gluon.jit
def _pv_flush(p, alpha, acc, l_i, slot, args, mma: gl.constexpr, PERM_P: gl.constexpr,
              ones=None, ops=None):
    """The tile's P [64, 128] (FP32, rounded here to E4M3) @ V: two products of 64 keys (the
    slot's two V^T boxes) into a fresh accumulator, the slot released, then the flush
    acc * alpha + pv. Returns (acc, l_i). ones (row_sum "p_operand"): the [64, 8] E4M3 ones
    tile; l_i [64, 8] then takes P @ ones from the same registers as P @ V (the dense kernel's
    ``attention_fp8_ws._tile``), else l_i comes back as it was given. ops: the two halves'
    E4M3 A operands made by the caller (p_exp "log_linear"; p unused)."""
    v_smem, empty = args[5], args[8]
    HEAD_D: gl.constexpr = v_smem.shape[1]
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=4)
    if ops is None:
        p0, p1 = _halves(p.to(gl.float8e4nv))
        p0 = _p_operand(p0, a_layout, PERM_P)
        p1 = _p_operand(p1, a_layout, PERM_P)
    else:
        p0, p1 = ops
    zo = gl.zeros([64, HEAD_D], gl.float32, mma)
    pv = warpgroup_mma(p0, v_smem.index(2 * slot).permute((1, 0)), zo, use_acc=False,
                       is_async=True)
    pv = warpgroup_mma(p1, v_smem.index(2 * slot + 1).permute((1, 0)), pv, is_async=True)
    if ones is None:
        pv = warpgroup_mma_wait(0, deps=(pv,))
    else:
        # one 128-term chain into a fresh [64, 8] accumulator (every column the row sum),
        # flushed like P @ V; replaces 64 FADD and the row reduction's shuffles per tile
        ls = _ones_product(p1, ones, _ones_product(p0, ones))
        pv, ls = warpgroup_mma_wait(0, deps=(pv, ls))
        l_i = _rescaled_row_sums(l_i, alpha, ls)
    mbarrier.arrive(empty.index(slot), count=1)
    return acc * alpha[:, None] + pv, l_i


@gluon.jit
def _halves(x):
    """x [64, 128] -> its two 64-key halves [64, 64] (the same registers)."""
    return gl.split(gl.permute(gl.reshape(x, [64, 2, 64]), (0, 2, 1)))


@gluon.jit
def _ll_operands(raw, bias, f0, f1, mma: gl.constexpr, PERM_P: gl.constexpr):
    """P @ V's two E4M3 A operands (64 keys each) of a tile's raw scores raw [64, 128] for
    p_exp "log_linear": ``_ll_codes`` of each half with its factor f0 / f1 (8 qs times the
    half's K scale) and the row bias [64] of ``_ll_row_bias``."""
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=4)
    r0, r1 = _halves(raw)
    b0, b1 = _halves(gl.broadcast(bias[:, None], raw)[0])
    return (_ll_codes(r0, gl.full([64, 64], f0, gl.float32, r0.type.layout), b0, a_layout,
                      PERM_P),
            _ll_codes(r1, gl.full([64, 64], f1, gl.float32, r1.type.layout), b1, a_layout,
                      PERM_P))


@gluon.jit
def _tile_halves(i, MASK_KEYS: gl.constexpr, acc, l_i, m_i, q, qs, blocks, cnt,
                 c: gl.constexpr, args, mma: gl.constexpr, P_LOG2_SCALE: gl.constexpr,
                 PERM_P: gl.constexpr, ones=None, P_LL: gl.constexpr = False):
    """One tile of two 64-key blocks (``attention_fp8._list_tile_halves``, op for op);
    blocks = (j0, j1, their K scales s0, s1), loaded a tile ahead by the caller. The slot's two
    K boxes lie one after the other in shared memory, so Q K^T is one 128-key product (the same
    values as two 64-key ones: each score is its own dot product); the per-half maxima and row
    sums keep the Triton kernel's order. ones: P @ ones for the row sum (``_pv_flush``).
    P_LL: P's codes by ``attention_fp8_ws._ll_codes`` per half (needs ones)."""
    S = args[15]
    j0, j1, s0, s1 = blocks
    e = 2 * i
    raw, slot = _qk_scores(i, q, c, args, mma)
    offs = gl.arange(0, 128, layout=gl.SliceLayout(0, mma))
    half0 = (offs < 64)[None, :]
    if MASK_KEYS:
        ok = gl.where(offs < 64, j0 * 64 + offs < S, (j1 * 64 + offs - 64 < S) & (e + 1 < cnt))
        raw = gl.where(ok[None, :], raw, float("-inf"))
    mx0 = gl.max(gl.where(half0, raw, float("-inf")), axis=1)
    mx1 = gl.max(gl.where(half0, float("-inf"), raw), axis=1)
    m_cand = gl.maximum(m_i, gl.maximum(mx0 * s0, mx1 * s1))
    if P_LL:
        bias, alpha = _ll_row_bias(m_i, m_cand, qs, P_LOG2_SCALE)
        ops = _ll_operands(raw, bias, 8.0 * (qs * s0), 8.0 * (qs * s1), mma, PERM_P)
        acc, l_i = _pv_flush(None, alpha, acc, l_i, slot, args, mma, PERM_P, ones, ops)
    else:
        mq, alpha = _row_bias(m_i, m_cand, qs, P_LOG2_SCALE)
        f = gl.where(half0, qs * s0, qs * s1)
        p = gl.exp2(gl.fma(raw, gl.broadcast(f, raw)[0], -gl.broadcast(mq[:, None], raw)[0]))
        if ones is None:
            ls = gl.sum(gl.where(half0, p, 0.0), axis=1) + gl.sum(gl.where(half0, 0.0, p),
                                                                  axis=1)
            l_i = l_i * alpha + ls
        acc, l_i = _pv_flush(p, alpha, acc, l_i, slot, args, mma, PERM_P, ones)
    return acc, l_i, m_cand


@gluon.jit
def _sum_tile(u, t, acc, l_i, m_i, q, qs, skc, c: gl.constexpr, args, mma: gl.constexpr,
              PERM_P: gl.constexpr, P_LOG2_SCALE: gl.constexpr, P_LL: gl.constexpr = False,
              ones=None):
    """Summary tile u (running tile t) of consumer c: key blocks 128 u .. 128 u + 127 by their
    E4M3 mean keys kc8 (one scale per head) and value sums vc8 = vc / (256 s_v); the
    producer put the tile's score bias in shared memory (-inf for an exact block and past the
    sequence, log2(n / 64) / (qs skc) for the sequence's last block of n rows, else 0). P =
    2^(s - m + 8) = 256 w in E4M3 for the product with vc8; the row sum adds w times 64 rows
    per block in FP32 (the last block's n / 64 is in its w, its vc8 holds its sum times 64 / n:
    no tile of the loop is special; a peeled last tile that scaled its block's share of the row
    sum took ~2,400 more cycles per consumer, H200 2026-12-02). P_LOG2_SCALE: the exact tiles'
    P scaling; the first summary tile divides the state by it with its rescale (the module
    note). P_LL (p_exp "log_linear"): the summary weights are P's codes as in the exact tiles
    (``_ll_codes``: no exponential, relative to the grid max ceil(8 m qs) / 8) and their row
    sum is P @ ones (ones: the exact tiles' tile; l_i [64, 8], kept 4x, so that each block's
    64 rows / 256 need no multiply per tile: the consumer scales l_i by 4 before the first
    summary tile and back after the last), so both routes carry the codes' mean bias
    (recipe.LL_MEAN_RATIO) and their grid max: the rescale from tile to tile is the exact
    tiles' and the LSE takes the grid max less the bias (``_ll_row_max``)."""
    bias_smem = args[43]
    cols: gl.constexpr = gl.SliceLayout(0, mma)
    raw, slot = _qk_scores(t, q, c, args, mma)
    # read after the product's wait: read while it ran, the bias kept 32 more registers live,
    # the consumers spilled again and the list kernel ran 4-6% slower (H200, 2026-12-02)
    raw = raw + bias_smem.index(slot).load(cols)[None, :]
    m_cand = gl.maximum(m_i, gl.max(raw, axis=1) * skc)
    if P_LL:
        # the codes' P = 2^(s - m' + 8) = 256 w is what vc8 = vc / (256 s_v) and the 64 / 256
        # of the row sum expect: P_LOG2_SCALE is 8 here (the launcher refuses any other)
        gl.static_assert(P_LOG2_SCALE == 8.0)
        bias, alpha = _ll_row_bias(m_i, m_cand, qs, P_LOG2_SCALE)
        alpha = alpha * gl.where(u == 0, 2.0**-P_LOG2_SCALE, 1.0)
        f = 8.0 * (qs * skc)
        ops = _ll_operands(raw, bias, f, f, mma, PERM_P)
        acc, l_i = _pv_flush(None, alpha, acc, l_i, slot, args, mma, PERM_P, ones, ops)
    else:
        mq, alpha = _row_bias(m_i, m_cand, qs, 0.0)
        if P_LOG2_SCALE != 0.0:
            alpha = alpha * gl.where(u == 0, 2.0**-P_LOG2_SCALE, 1.0)
        p = gl.exp2(gl.fma(raw, gl.full([64, 128], qs * skc, gl.float32, mma),
                           -gl.broadcast((mq - 8.0)[:, None], raw)[0]))
        ls = gl.sum(p, axis=1)
        l_i = l_i * alpha + ls * 0.25  # 64 rows per block / 256
        acc, l_i = _pv_flush(p, alpha, acc, l_i, slot, args, mma, PERM_P)
    return acc, l_i, m_cand


@gluon.jit
def _blocks(lst, cnt, n_all, i, args):
    """(j0, j1, s0, s1): tile i's key blocks (``_pair``) and their K scales."""
    SK, skbase = args[10], args[32]
    j0, j1 = _pair(lst, cnt, n_all, i)
    return j0, j1, gl.load(SK + skbase + j0), gl.load(SK + skbase + j1)


@gluon.jit
def _consumer(args, c: gl.constexpr, P_LOG2_SCALE: gl.constexpr, PERM_P: gl.constexpr,
              WRITE_LSE: gl.constexpr, OUT_F32: gl.constexpr, INIT_SUMMARY: gl.constexpr,
              SUM_TILES: gl.constexpr, ROW_SUM_MMA: gl.constexpr, P_LL: gl.constexpr):
    """Consumer c: the query block of entry pid_q0 + c of the head's ORDER (nothing past the
    last entry, nor for a block of dense-prefix rows: ``_row_list``). ROW_SUM_MMA: the exact
    tiles' row sum as P @ ones (l_i [64, 8] until the last exact tile; Sol's summary tiles and
    the summary-pass merge keep FP32 sums, as the emulation's summary route, except the summary
    tiles with P_LL, whose codes are summed as P @ ones too: l_i [64, 8] until the last of
    them, ``_sum_tile``)."""
    (q_smem, q_bar, SQ, S_pad, n_scale, bh, qk_scale_log2, N_BH, SUM_O, SUM_ML) = (
        args[3], args[6], args[9], args[16], args[17], args[18], args[23], args[33], args[34],
        args[35])
    HEAD_D: gl.constexpr = q_smem.shape[2]
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                  instr_shape=[16, HEAD_D, 32])
    rows: gl.constexpr = gl.SliceLayout(1, mma)
    lst, cnt, n_all, n_full, runs, qb = _row_list(c, args, WRITE_LSE)
    if runs:
        qs = gl.load(SQ + bh * n_scale + qb) * qk_scale_log2
        m_i = gl.full([64], float("-inf"), gl.float32, rows)
        if ROW_SUM_MMA:
            l_i = _ones_row_sums()
            if SUM_TILES:  # the ones tile follows the lists' arguments (the kernel's comment)
                ones = args[45].permute((1, 0))
            else:
                ones = args[39].permute((1, 0))
        else:
            l_i = gl.zeros([64], gl.float32, rows)
            ones = None
        acc = gl.zeros([64, HEAD_D], gl.float32, mma)
        mbarrier.wait(q_bar, 0)
        q = q_smem.index(c)
        blocks = _blocks(lst, cnt, n_all, 0, args)
        for i in range(n_full):
            nxt = _blocks(lst, cnt, n_all, i + 1, args)  # a tile ahead: off the critical path
            acc, l_i, m_i = _tile_halves(i, False, acc, l_i, m_i, q, qs, blocks, cnt, c, args,
                                         mma, P_LOG2_SCALE, PERM_P, ones, P_LL)
            blocks = nxt
        if n_full < n_all:
            acc, l_i, m_i = _tile_halves(n_full, True, acc, l_i, m_i, q, qs, blocks, cnt, c,
                                         args, mma, P_LOG2_SCALE, PERM_P, ones, P_LL)
        SUM_LL: gl.constexpr = SUM_TILES and P_LL  # the summary tiles' codes (``_sum_tile``)
        if ROW_SUM_MMA and not SUM_LL:  # every column holds the row sum
            l_i = gl.convert_layout(gl.max(l_i, axis=1), rows, assert_trivial=True)
        P_EPILOGUE: gl.constexpr = 0.0 if SUM_TILES else P_LOG2_SCALE
        if SUM_TILES:  # Sol's summary tiles after the exact ones (m_i is finite by then)
            n_sum = gl.cdiv(args[31], 128)
            skc = gl.load(args[41] + args[19])
            if SUM_LL:
                l_i = l_i * 4.0  # each block's P @ ones counts 64 rows / 256 (``_sum_tile``)
            for u in range(n_sum):
                acc, l_i, m_i = _sum_tile(u, n_all + u, acc, l_i, m_i, q, qs, skc, c, args, mma,
                                          PERM_P, P_LOG2_SCALE, P_LL, ones)
            if SUM_LL:
                l_i = gl.convert_layout(gl.max(l_i, axis=1), rows, assert_trivial=True) * 0.25
        r0 = qb * 64
        if INIT_SUMMARY:
            # Sol's summary-pass state, merged after the exact tiles (row maxes in log2 units),
            # as the Triton kernel does
            d = gl.arange(0, HEAD_D, layout=gl.SliceLayout(0, mma))
            srow = (bh * S_pad + r0 + gl.arange(0, 64, layout=rows)).to(gl.int64)
            # the exact tiles' reference: their grid max with p_exp "log_linear"
            mq = _ll_row_max(m_i, qs) if P_LL else m_i * qs
            ms = gl.load(SUM_ML + srow)
            mm = gl.maximum(mq, ms)
            a_x = gl.exp2(mq - mm)
            a_s = gl.exp2(ms - mm)
            acc = acc * a_x[:, None] + gl.load(SUM_O + srow[:, None] * HEAD_D + d[None, :]) \
                * a_s[:, None]
            l_i = l_i * a_x + gl.load(SUM_ML + N_BH * S_pad + srow) * a_s
            m_i = mm / qs
        if P_LL and not INIT_SUMMARY:  # VSA and Sol's summary tiles: the grid max (acc / l
            mlog = _ll_row_max(m_i, qs)  # is the same; the LSE takes the codes' reference)
        else:
            mlog = m_i * qs
        _store_rows(acc, l_i, mlog, r0, args, mma, P_EPILOGUE, WRITE_LSE, OUT_F32)


# GROUP stays a run-time int: at an MHA launch (GROUP = 1) triton made it a constant, and the
# kernel then compiled with 20 spill loads and stores per exact tile in consumers 1 and 2
# (scripts/sass_stats.py, which compiles as the launch specializes; GROUP > 1: none) and ran
# 4-6% slower with Sol's summary tiles (H200, 2026-12-02; VSA unchanged)
@gluon.jit(do_not_specialize=["GROUP"])
def _fp8_attn_ws_lists_kernel(
    q_desc, k_desc, v_desc, SQ, SK, VS, VC, OUT, LSE,
    S, S_pad, H, GROUP, row_start, qk_scale_log2, stride_ob, stride_os, stride_oh,
    BLOCKS, COUNTS, N_QB, N_KB, N_BH, SUM_O, SUM_ML, ORDER, ORDER_STRIDE, HEAVY,
    ks_desc, vs_desc, SKC, EXACT, LAST_LOG2,
    STAGES: gl.constexpr, CONS_REGS: gl.constexpr, P_LOG2_SCALE: gl.constexpr,
    PERM_P: gl.constexpr, WRITE_LSE: gl.constexpr, OUT_F32: gl.constexpr,
    INIT_SUMMARY: gl.constexpr, SUM_TILES: gl.constexpr = False,
    ROW_SUM_MMA: gl.constexpr = False, P_LL: gl.constexpr = False,
):
    """Grid (cdiv(N_QB, 3), B * H); num_warps = 4 (the default partition = consumer 0).
    HEAVY: the first HEAVY CTAs of every head (their ORDER entries: query blocks routed to every
    key block) run before all others, head after head, then the rest head by head; 0 = the
    grid order (the launch order is the linear CTA index, x fastest)."""
    HEAD_D: gl.constexpr = k_desc.block_type.shape[1]
    n_groups = gl.num_programs(0)
    n_bh = gl.num_programs(1)
    lin = gl.program_id(1) * n_groups + gl.program_id(0)
    if lin < HEAVY * n_bh:
        # the long lists first, on every SM at once: started head by head among the others
        # they ran past the last head's short CTAs (a tail of about their own length)
        bh = lin % n_bh
        grp = lin // n_bh
    else:
        rest = lin - HEAVY * n_bh
        bh = rest // (n_groups - HEAVY)
        grp = HEAVY + rest % (n_groups - HEAVY)
    pid_q0 = grp * 3  # the CTA's first ORDER entry (not a query block)
    b = bh // H
    h = bh % H
    bhk = b * (H // GROUP) + h // GROUP
    m0 = pid_q0 * 64  # unused here (args[22] keeps the dense kernel's layout): rows are qb * 64
    n_scale = S_pad // 64
    q_smem = gl.allocate_shared_memory(q_desc.dtype, [3, 64, HEAD_D], q_desc.layout)
    # per consumer STAGES slots of two K boxes and two V boxes: [(c * STAGES + slot) * 2 + half]
    k_smem = gl.allocate_shared_memory(k_desc.dtype, [6 * STAGES, 64, HEAD_D], k_desc.layout)
    v_smem = gl.allocate_shared_memory(v_desc.dtype, [6 * STAGES, HEAD_D, 64], v_desc.layout)
    if SUM_TILES:  # each slot's summary-tile score bias (``_produce_sum``)
        bias_smem = gl.allocate_shared_memory(gl.float32, [3 * STAGES, 128],
                                              gl.SwizzledSharedLayout(1, 1, 1, order=[0]))
    q_bar = gl.allocate_shared_memory(gl.int64, [1], mbarrier.MBarrierLayout())
    ready = gl.allocate_shared_memory(gl.int64, [3 * STAGES, 1], mbarrier.MBarrierLayout())
    empty = gl.allocate_shared_memory(gl.int64, [3 * STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(q_bar, count=1)
    for i in gl.static_range(3 * STAGES):
        mbarrier.init(ready.index(i), count=1)
        mbarrier.init(empty.index(i), count=1)
    fence_async_shared()
    # the dense kernel's 28 arguments first (its epilogue helper reads them), then the lists':
    # 28 BLOCKS, 29 COUNTS, 30 N_QB, 31 N_KB, 32 the K scales' offset, 33 N_BH, 34 SUM_O,
    # 35 SUM_ML, 36 the CTA's first ORDER entry, 37 ORDER, 38 ORDER_STRIDE; Sol's summary
    # tiles: 39 / 40 the kc8 / vc8^T descriptors, 41 SKC, 42 EXACT, 43 the bias slots,
    # 44 LAST_LOG2 (``_last_bias``); then with ROW_SUM_MMA the [8, 64] E4M3 ones tile
    args = (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, ready, empty,
            SQ, SK, VS, VC, OUT, LSE, S, S_pad, n_scale, bh, bhk, b, h, m0, qk_scale_log2,
            stride_ob, stride_os, stride_oh, row_start,
            BLOCKS, COUNTS, N_QB, N_KB, bhk * n_scale, N_BH, SUM_O, SUM_ML, pid_q0, ORDER,
            ORDER_STRIDE)
    if SUM_TILES:
        args = args + (ks_desc, vs_desc, SKC, EXACT, bias_smem, LAST_LOG2)
    if ROW_SUM_MMA:  # P @ ones' B tile (row_sum "p_operand"), one per 64-key half
        args = args + (_ones_tile(64),)
    # one consumer function, its index a constexpr argument (as in attention_fp8_ws)
    gl.warp_specialize([
        (_consumer, (args, 0, P_LOG2_SCALE, PERM_P, WRITE_LSE, OUT_F32, INIT_SUMMARY,
                     SUM_TILES, ROW_SUM_MMA, P_LL)),
        (_consumer, (args, 1, P_LOG2_SCALE, PERM_P, WRITE_LSE, OUT_F32, INIT_SUMMARY,
                     SUM_TILES, ROW_SUM_MMA, P_LL)),
        (_consumer, (args, 2, P_LOG2_SCALE, PERM_P, WRITE_LSE, OUT_F32, INIT_SUMMARY,
                     SUM_TILES, ROW_SUM_MMA, P_LL)),
        (_producer, (args, 0, P_LOG2_SCALE, PERM_P, WRITE_LSE, OUT_F32, INIT_SUMMARY,
                     SUM_TILES, ROW_SUM_MMA, P_LL)),
    ], [4, 4, 1], [CONS_REGS, CONS_REGS, 24])


def query_order(counts: torch.Tensor, grouping: str) -> torch.Tensor:
    """ORDER of the kernel from the list lengths counts [B, H, nq]: [1, nq] int32 (the query
    blocks in sequence order, shared by the heads) for "consecutive"; [B * H, nq] for
    "by_length" (per head the query blocks by list length, longest first; ties in sequence
    order)."""
    nq = counts.shape[-1]
    if grouping == "consecutive":
        return torch.arange(nq, dtype=torch.int32, device=counts.device)[None]
    if grouping == "by_length":
        # one launch (torch's stable argsort took six, 27 us of a 5.6 ms call at the H3 shape,
        # H200); its twin: torch.argsort(counts, dim=-1, descending=True, stable=True)
        rows = counts.reshape(-1, nq).contiguous()
        order = torch.empty_like(rows, dtype=torch.int32)
        chunk = 32  # query blocks per program; each compares them with NQ_P blocks per step
        _by_length_kernel[(rows.shape[0], triton.cdiv(nq, chunk))](
            rows, order, nq, NQ_P=min(triton.next_power_of_2(nq), 512), CHUNK=chunk,
            num_warps=4)
        return order
    raise ValueError(f"grouping: {grouping!r}; choose 'consecutive' or 'by_length'")


@triton.jit
def _by_length_kernel(COUNTS, ORDER, NQ, NQ_P: tl.constexpr, CHUNK: tl.constexpr):
    """Program (r, c) = query blocks i in [c * CHUNK, (c + 1) * CHUNK) of list row r of COUNTS
    [R, NQ] int32: ORDER[r, rank(i)] = i, rank(i) = the query blocks with a longer list, or as
    long and earlier (a stable descending sort; each program compares its blocks with all, NQ_P
    at a time)."""
    r = tl.program_id(0)
    i = tl.program_id(1) * CHUNK + tl.arange(0, CHUNK)
    ci = tl.load(COUNTS + r * NQ + i, mask=i < NQ, other=0)
    rank = tl.zeros([CHUNK], tl.int32)
    j0 = 0
    while j0 < NQ:  # `while`: run-time `for` bounds fail in triton 3.6's interpreter
        j = j0 + tl.arange(0, NQ_P)
        cj = tl.load(COUNTS + r * NQ + j, mask=j < NQ, other=-1)  # padding ranks after all
        before = (cj[None, :] > ci[:, None]) | ((cj[None, :] == ci[:, None])
                                                & (j[None, :] < i[:, None]))
        rank += tl.sum(before.to(tl.int32), axis=1)
        j0 += NQ_P
    tl.store(ORDER + r * NQ + rank, i, mask=i < NQ)


@dataclass(frozen=True)
class SummaryTiles:
    """Sol's summary route as E4M3 tiles of the exact-tile kernel (``summary_tiles``).

    kc8 [B, Hkv, nk_pad, D]: kc / skc, skc [B * Hkv] = max |kc| / 448 (one scale per head);
    vc8t [B, Hkv, D, nk_pad]: (vc / (256 s_v))^T, V's channel scales s_v (|vc| <= 64 x 448 s_v,
    so the codes stay below 112), the sequence's last block's sum times 64 / n for its n rows
    (64 times its mean, as every other block: its n / 64 rides in its score bias, the kernel's
    ``_last_bias``), its columns in P's register order when ``qkv.v_perm``; nk_pad = the key
    blocks rounded up to 128 (zeros past them); last_log2 = log2(n / 64), the kernel's bias
    factor for that block (held here beside the vc8 column it matches)."""

    kc8: torch.Tensor
    vc8t: torch.Tensor
    skc: torch.Tensor
    last_log2: float
    v_scale: torch.Tensor | None = None  # the V scales vc8t was made with
    v_perm: bool = True  # vc8t's columns in P's register order

    def fits(self, qkv) -> bool:
        """Made for these operands: the same V scales (the same tensor) and column order."""
        return self.v_scale is qkv.v_scale and self.v_perm == bool(qkv.v_perm)


def last_block_rows(seq_len: int) -> int:
    """Rows of the sequence's last 64-key block (1 .. 64)."""
    return seq_len - 64 * ((seq_len - 1) // 64)


def summary_tiles(qkv, routing) -> SummaryTiles:
    """The E4M3 summary operands of a Sol routing (kc, vc: FP32 [B, Hkv, nk, D], centred with
    the quantizer's means) for ``fp8_attention_ws_lists(summary=...)``: one launch of
    ``_summary_operands_kernel`` (a program per head); ``summary_tiles_torch`` is its twin (the
    same values)."""
    B, Hkv, nk, D = routing.kc.shape
    nk_pad = -(-nk // 128) * 128
    f8 = torch.float8_e4m3fn
    dev = routing.kc.device
    kc8 = torch.empty((B, Hkv, nk_pad, D), dtype=f8, device=dev)
    vc8t = torch.empty((B, Hkv, D, nk_pad), dtype=f8, device=dev)
    skc = torch.empty((B * Hkv,), dtype=torch.float32, device=dev)
    n_last = last_block_rows(qkv.seq_len)
    interp = interpreting()
    _summary_operands_kernel[(B * Hkv,)](
        routing.kc.contiguous(), routing.vc.contiguous(), qkv.v_scale.contiguous(), kc8, vc8t,
        skc, nk, nk_pad, 64.0 / n_last, HEAD_D=D, ROWS=32, PERM=bool(qkv.v_perm),
        SCALE_RECIP=not interp, HW_ROUND=not interp, num_warps=4,
    )
    return SummaryTiles(kc8, vc8t, skc, math.log2(n_last / 64), qkv.v_scale, bool(qkv.v_perm))


def summary_tiles_torch(qkv, routing) -> SummaryTiles:
    """``summary_tiles`` in torch (about a dozen launches; the kernel's twin in the tests)."""
    B, Hkv, nk, D = routing.kc.shape
    nk_pad = -(-nk // 128) * 128
    f8 = torch.float8_e4m3fn
    dev = routing.kc.device
    skc = (routing.kc.abs().amax(dim=(-2, -1)) / 448.0).clamp_min(1e-30)
    kc8 = torch.zeros((B, Hkv, nk_pad, D), dtype=f8, device=dev)
    kc8[:, :, :nk] = (routing.kc / skc[..., None, None]).to(f8)
    n_last = last_block_rows(qkv.seq_len)
    vc = routing.vc.clone()
    vc[:, :, nk - 1] *= 64.0 / n_last  # in FP32, as the kernel
    vc8t = torch.zeros((B, Hkv, D, nk_pad), dtype=f8, device=dev)
    vc8t[..., :nk] = (vc / (256.0 * qkv.v_scale[:, :, None, :])).transpose(-1, -2).to(f8)
    if qkv.v_perm:
        vc8t = vc8t[..., v_token_order(nk_pad, True).to(dev)].contiguous()
    return SummaryTiles(kc8, vc8t, skc.reshape(-1).contiguous(), math.log2(n_last / 64),
                        qkv.v_scale, bool(qkv.v_perm))


@triton.jit
def _summary_operands_kernel(KC, VC, VS, KC8, VC8T, SKC, NK, NK_PAD, LAST_SCALE,
                             HEAD_D: tl.constexpr, ROWS: tl.constexpr, PERM: tl.constexpr,
                             SCALE_RECIP: tl.constexpr, HW_ROUND: tl.constexpr):
    """Program bh = one (batch, kv head): skc = max(max |kc| / 448, 1e-30), then per ROWS key
    blocks kc8 = E4M3(kc / skc) and vc8^T's columns E4M3(vc / (256 s_v)) (the last block's vc
    times LAST_SCALE = 64 / its rows first), column j holding block ``_v_src_token(j, PERM)``,
    zeros past NK. KC, VC [B * Hkv, NK, D] FP32; VS [B * Hkv, D];
    KC8 [B * Hkv, NK_PAD, D], VC8T [B * Hkv, D, NK_PAD] E4M3; SKC [B * Hkv] FP32. The divisions
    round as torch's do on the same device (``quantize.block_quant`` says how)."""
    bh = tl.program_id(0)
    d = tl.arange(0, HEAD_D)
    r = tl.arange(0, ROWS)
    # `while`, not `for`: run-time `for` bounds fail in triton 3.6's interpreter
    amax = tl.zeros([ROWS, HEAD_D], tl.float32)
    r0 = 0
    while r0 < NK:
        j = r0 + r
        x = tl.load(KC + (bh * NK + j)[:, None] * HEAD_D + d[None, :], mask=(j < NK)[:, None],
                    other=0.0)
        amax = tl.maximum(amax, tl.abs(x))
        r0 += ROWS
    amax = tl.max(tl.max(amax, axis=1), axis=0)
    skc = tl.maximum(over_448(amax, SCALE_RECIP), 1e-30)
    tl.store(SKC + bh, skc)
    sv = 256.0 * tl.load(VS + bh * HEAD_D + d)
    r0 = 0
    while r0 < NK_PAD:
        j = r0 + r
        x = tl.load(KC + (bh * NK + j)[:, None] * HEAD_D + d[None, :], mask=(j < NK)[:, None],
                    other=0.0)
        src = _v_src_token(j, PERM)
        y = tl.load(VC + (bh * NK + src)[:, None] * HEAD_D + d[None, :],
                    mask=(src < NK)[:, None], other=0.0)
        summary_tile_rows(KC8, VC8T, bh, j, d, x, y, src, NK, NK_PAD, skc, sv, LAST_SCALE,
                          HEAD_D, HW_ROUND)
        r0 += ROWS


def fp8_attention_ws_lists(qkv, routing, *, out, lse, scale: float, row_start: int,
                           out_f32: bool, p_log2_scale: float, sum_o=None, sum_ml=None,
                           stages: int = 2, grouping: str = "by_length",
                           summary: SummaryTiles | None = None, row_sum: str = "p_fp32",
                           p_exp: str = "exp2"):
    """The exact tiles of block-sparse attention on the warp-specialized schedule, into `out`
    (and `lse` when given); ``sum_o`` / ``sum_ml``: Sol's summary-pass state to merge, or
    ``summary``: Sol's summary route as E4M3 tiles after each consumer's exact tiles
    (``SparseConfig.summary_kernel="fp8_tiles"``); grouping: which query blocks share a
    CTA (``query_order``); row_sum: "p_fp32" or "p_operand" (the exact tiles' row sum as
    P @ ones on the tensor cores); p_exp: "exp2" or "log_linear" (with p_log2_scale 8 and
    row_sum "p_operand": ``attention_fp8_ws._ll_codes``)."""
    from .attention_fp8 import check_p_form

    check_p_form(p_log2_scale, row_sum, p_exp)
    B, H, S_pad, D = qkv.q8.shape
    Hkv = qkv.k8.shape[1]
    nq, nk = routing.exact.shape[-2:]
    order = query_order(routing.counts, grouping)
    qd, kd, vd = descriptors(qkv, block_n=64)  # one 64-token box per key block
    grid = (triton.cdiv(nq, CONSUMERS), B * H)
    tiles = (None,) * 4 + (0.0,)
    if summary is not None:
        if sum_o is not None:
            raise ValueError("summary tiles: no summary-pass state to merge as well")
        f8 = gl.float8e4nv
        nk_pad = summary.kc8.shape[2]
        ks = TensorDescriptor.from_tensor(summary.kc8.view(-1, D), [64, D],
                                          gl.NVMMASharedLayout.get_default_for([64, D], f8))
        vs = TensorDescriptor.from_tensor(summary.vc8t.view(-1, nk_pad), [D, 64],
                                          gl.NVMMASharedLayout.get_default_for([D, 64], f8))
        tiles = (ks, vs, summary.skc, routing.exact.contiguous().view(torch.uint8),
                 summary.last_log2)
    _fp8_attn_ws_lists_kernel[grid](
        qd, kd, vd, qkv.q_scale, qkv.k_scale, qkv.v_scale, qkv.v_corr, out,
        lse if lse is not None else out,
        qkv.seq_len, S_pad, H, H // Hkv, row_start, scale * LOG2E,
        out.stride(0), out.stride(1), out.stride(2),
        routing.blocks.contiguous(), routing.counts.contiguous(), nq, nk, B * H,
        sum_o, sum_ml, order, order.stride(0) if order.shape[0] > 1 else 0,
        heavy_groups(routing.dense_rows, grid[0]), *tiles,
        STAGES=stages, CONS_REGS=CONSUMER_REGS, P_LOG2_SCALE=p_log2_scale,
        PERM_P=bool(qkv.v_perm), WRITE_LSE=lse is not None, OUT_F32=out_f32,
        INIT_SUMMARY=sum_o is not None, SUM_TILES=summary is not None,
        ROW_SUM_MMA=row_sum == "p_operand", P_LL=p_exp == "log_linear", num_warps=4,
        maxnreg=MAXNREG,
    )
    return out, lse


def heavy_groups(dense_rows: int, n_groups: int) -> int:
    """CTAs per head that hold the query blocks routed to every key block (the first entries of
    either ``query_order``: the longest lists, or the first blocks in sequence order), started
    before all other CTAs: 0 when there are none or when they are every CTA of the head."""
    heavy = -(-dense_rows // CONSUMERS)
    return heavy if 0 < heavy < n_groups else 0


def may_apply(sparse, attention, head_dim: int, fp8: bool) -> bool:
    """What ``applies`` knows before the operands are quantized (the KV split count is chosen at
    launch): the schedule, TMA boxes, the attention tiling, E4M3 operands at head dim 128, a
    compiled launch. A Sol call makes the summary tiles with its routing only where this holds
    (``dispatch``)."""
    from .e4m3 import interpreting

    tiling = (attention.block_n, attention.flush, attention.num_stages) == (128, "fma", 2) \
        and attention.max_imprecise >= 128
    return (sparse.schedule == "warp_specialized" and sparse.tma and tiling and fp8
            and head_dim == 128 and not interpreting())


def applies(qkv, sparse, splits: int, attention) -> bool:
    """Whether a sparse launch takes this kernel (see the module docstring); ``attention``: the
    call's ``AttentionConfig``."""
    return splits == 1 and may_apply(sparse, attention, qkv.q8.shape[-1],
                                     qkv.q8.dtype == torch.float8_e4m3fn)

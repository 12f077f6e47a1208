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
registers 24 / 160 / 160 / 168 (``setmaxnreg``).

Taken for one KV part (``SparseConfig.kv_splits`` 1), E4M3 operands, head dim 128, TMA boxes
(``SparseConfig.schedule="warp_specialized"``) and the attention tiling it implements (128 keys
per tile, flush "fma" after <= 128 terms, two slots: three rings of three slots would need 312 KB
of shared memory); otherwise the programs kernel runs. Sol's summary route stays its own pass
(``summary_gluon`` or the Triton kernel's; in this kernel, after each consumer's exact tiles, it
measured slower: commit 1e33a5d, ``config.SparseConfig``). Gluon does not run in the
interpreter: the CPU tests compile it for sm_90a, the GPU tests compare it with the Triton
kernel.

Shapes: Q8 [B, H, S_pad, D], K8 [B, Hkv, S_pad, D], V8t [B, Hkv, D, S_pad]; lists BLOCKS
[B * H * N_QB, N_KB] (ascending exact key blocks, ``COUNTS`` entries each, at least one); ORDER
[B * H, N_QB] int32 (row stride ORDER_STRIDE, 0 for one order shared by the heads): per head a
permutation of its query blocks.
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

from .attention_fp8_ws import (
    CONSUMER_REGS,
    CONSUMERS,
    LOG2E,
    MAXNREG,
    _p_operand,
    _row_bias,
    _store_rows,
    descriptors,
)


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
        rb = ready.index(slot)
        tma.async_copy_global_to_shared(k_desc, [kbase + j0 * 64, 0], rb, k_smem.index(2 * slot))
        tma.async_copy_global_to_shared(k_desc, [kbase + j1 * 64, 0], rb,
                                        k_smem.index(2 * slot + 1))
        tma.async_copy_global_to_shared(v_desc, [vbase, j0 * 64], rb, v_smem.index(2 * slot))
        tma.async_copy_global_to_shared(v_desc, [vbase, j1 * 64], rb, v_smem.index(2 * slot + 1))
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
def _producer(args, cid: gl.constexpr, P_LOG2_SCALE: gl.constexpr, PERM_P: gl.constexpr,
              WRITE_LSE: gl.constexpr, OUT_F32: gl.constexpr, INIT_SUMMARY: gl.constexpr):
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
    n_max = gl.maximum(lists[0][2], gl.maximum(lists[1][2], lists[2][2]))
    kbase = bhk * S_pad
    vbase = bhk * HEAD_D
    # round robin over the consumers, each a tile at a time: their rings fill together; each
    # consumer's next block indices are loaded one tile ahead
    p0 = _pair(lists[0][0], lists[0][1], lists[0][2], 0)
    p1 = _pair(lists[1][0], lists[1][1], lists[1][2], 0)
    p2 = _pair(lists[2][0], lists[2][1], lists[2][2], 0)
    for i in range(n_max):
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
def _tile_halves(i, MASK_KEYS: gl.constexpr, acc, l_i, m_i, q, qs, blocks, cnt,
                 c: gl.constexpr, args, mma: gl.constexpr, P_LOG2_SCALE: gl.constexpr,
                 PERM_P: gl.constexpr):
    """One tile of two 64-key blocks (``attention_fp8._list_tile_halves``, op for op);
    blocks = (j0, j1, their K scales s0, s1), loaded a tile ahead by the caller. The slot's two
    K boxes lie one after the other in shared memory, so Q K^T is one 128-key product (the same
    values as two 64-key ones: each score is its own dot product); the per-half maxima and row
    sums keep the Triton kernel's order."""
    k_smem, v_smem, ready, empty, S = args[4], args[5], args[7], args[8], args[15]
    j0, j1, s0, s1 = blocks
    STAGES: gl.constexpr = ready.shape[0] // 3
    HEAD_D: gl.constexpr = k_smem.shape[2]
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=4)
    slot = c * STAGES + i % STAGES
    e = 2 * i
    k_pairs = k_smem._reinterpret(k_smem.dtype, [k_smem.shape[0] // 2, 128, HEAD_D],
                                  k_smem.layout)
    mbarrier.wait(ready.index(slot), (i // STAGES) & 1)
    z = gl.zeros([64, 128], gl.float32, mma)
    raw = warpgroup_mma(q, k_pairs.index(slot).permute((1, 0)), z, use_acc=False,
                        is_async=True)
    raw = warpgroup_mma_wait(0, deps=(raw,))
    offs = gl.arange(0, 128, layout=gl.SliceLayout(0, mma))
    half0 = (offs < 64)[None, :]
    if MASK_KEYS:
        ok = gl.where(offs < 64, j0 * 64 + offs < S, (j1 * 64 + offs - 64 < S) & (e + 1 < cnt))
        raw = gl.where(ok[None, :], raw, float("-inf"))
    mx0 = gl.max(gl.where(half0, raw, float("-inf")), axis=1)
    mx1 = gl.max(gl.where(half0, float("-inf"), raw), axis=1)
    m_cand = gl.maximum(m_i, gl.maximum(mx0 * s0, mx1 * s1))
    mq, alpha = _row_bias(m_i, m_cand, qs, P_LOG2_SCALE)
    f = gl.where(half0, qs * s0, qs * s1)
    p = gl.exp2(gl.fma(raw, gl.broadcast(f, raw)[0], -gl.broadcast(mq[:, None], raw)[0]))
    ls = gl.sum(gl.where(half0, p, 0.0), axis=1) + gl.sum(gl.where(half0, 0.0, p), axis=1)
    l_i = l_i * alpha + ls
    p0, p1 = gl.split(gl.permute(gl.reshape(p.to(gl.float8e4nv), [64, 2, 64]), (0, 2, 1)))
    p0 = _p_operand(p0, a_layout, PERM_P)
    p1 = _p_operand(p1, a_layout, PERM_P)
    zo = gl.zeros([64, HEAD_D], gl.float32, mma)
    pv = warpgroup_mma(p0, v_smem.index(2 * slot).permute((1, 0)), zo, use_acc=False,
                       is_async=True)
    pv = warpgroup_mma(p1, v_smem.index(2 * slot + 1).permute((1, 0)), pv, is_async=True)
    pv = warpgroup_mma_wait(0, deps=(pv,))
    mbarrier.arrive(empty.index(slot), count=1)
    acc = acc * alpha[:, None] + pv
    return acc, l_i, m_cand


@gluon.jit
def _blocks(lst, cnt, n_all, i, args):
    """(j0, j1, s0, s1): tile i's key blocks (``_pair``) and their K scales."""
    SK, skbase = args[10], args[32]
    j0, j1 = _pair(lst, cnt, n_all, i)
    return j0, j1, gl.load(SK + skbase + j0), gl.load(SK + skbase + j1)


@gluon.jit
def _consumer(args, c: gl.constexpr, P_LOG2_SCALE: gl.constexpr, PERM_P: gl.constexpr,
              WRITE_LSE: gl.constexpr, OUT_F32: gl.constexpr, INIT_SUMMARY: gl.constexpr):
    """Consumer c: the query block of entry pid_q0 + c of the head's ORDER (nothing past the
    last entry, nor for a block of dense-prefix rows: ``_row_list``)."""
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
        l_i = gl.zeros([64], gl.float32, rows)
        acc = gl.zeros([64, HEAD_D], gl.float32, mma)
        mbarrier.wait(q_bar, 0)
        q = q_smem.index(c)
        blocks = _blocks(lst, cnt, n_all, 0, args)
        for i in range(n_full):
            nxt = _blocks(lst, cnt, n_all, i + 1, args)  # a tile ahead: off the critical path
            acc, l_i, m_i = _tile_halves(i, False, acc, l_i, m_i, q, qs, blocks, cnt, c, args,
                                         mma, P_LOG2_SCALE, PERM_P)
            blocks = nxt
        if n_full < n_all:
            acc, l_i, m_i = _tile_halves(n_full, True, acc, l_i, m_i, q, qs, blocks, cnt, c,
                                         args, mma, P_LOG2_SCALE, PERM_P)
        r0 = qb * 64
        if INIT_SUMMARY:
            # Sol's summary-pass state, merged after the exact tiles (row maxes in log2 units),
            # as the Triton kernel does
            d = gl.arange(0, HEAD_D, layout=gl.SliceLayout(0, mma))
            srow = (bh * S_pad + r0 + gl.arange(0, 64, layout=rows)).to(gl.int64)
            mq = m_i * qs
            ms = gl.load(SUM_ML + srow)
            mm = gl.maximum(mq, ms)
            a_x = gl.exp2(mq - mm)
            a_s = gl.exp2(ms - mm)
            acc = acc * a_x[:, None] + gl.load(SUM_O + srow[:, None] * HEAD_D + d[None, :]) \
                * a_s[:, None]
            l_i = l_i * a_x + gl.load(SUM_ML + N_BH * S_pad + srow) * a_s
            m_i = mm / qs
        _store_rows(acc, l_i, m_i * qs, r0, args, mma, P_LOG2_SCALE, WRITE_LSE, OUT_F32)


@gluon.jit
def _fp8_attn_ws_lists_kernel(
    q_desc, k_desc, v_desc, SQ, SK, VS, VC, OUT, LSE,
    S, S_pad, H, GROUP, row_start, qk_scale_log2, stride_ob, stride_os, stride_oh,
    BLOCKS, COUNTS, N_QB, N_KB, N_BH, SUM_O, SUM_ML, ORDER, ORDER_STRIDE,
    STAGES: gl.constexpr, CONS_REGS: gl.constexpr, P_LOG2_SCALE: gl.constexpr,
    PERM_P: gl.constexpr, WRITE_LSE: gl.constexpr, OUT_F32: gl.constexpr,
    INIT_SUMMARY: gl.constexpr,
):
    """Grid (cdiv(N_QB, 3), B * H); num_warps = 4 (the default partition = consumer 0)."""
    HEAD_D: gl.constexpr = k_desc.block_type.shape[1]
    pid_q0 = gl.program_id(0) * 3  # the CTA's first ORDER entry (not a query block)
    bh = gl.program_id(1)
    b = bh // H
    h = bh % H
    bhk = b * (H // GROUP) + h // GROUP
    m0 = pid_q0 * 64  # unused here (args[22] keeps the dense kernel's layout): rows are qb * 64
    n_scale = S_pad // 64
    q_smem = gl.allocate_shared_memory(q_desc.dtype, [3, 64, HEAD_D], q_desc.layout)
    # per consumer STAGES slots of two K boxes and two V boxes: [(c * STAGES + slot) * 2 + half]
    k_smem = gl.allocate_shared_memory(k_desc.dtype, [6 * STAGES, 64, HEAD_D], k_desc.layout)
    v_smem = gl.allocate_shared_memory(v_desc.dtype, [6 * STAGES, HEAD_D, 64], v_desc.layout)
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
    # 35 SUM_ML, 36 the CTA's first ORDER entry, 37 ORDER, 38 ORDER_STRIDE
    args = (q_desc, k_desc, v_desc, q_smem, k_smem, v_smem, q_bar, ready, empty,
            SQ, SK, VS, VC, OUT, LSE, S, S_pad, n_scale, bh, bhk, b, h, m0, qk_scale_log2,
            stride_ob, stride_os, stride_oh, row_start,
            BLOCKS, COUNTS, N_QB, N_KB, bhk * n_scale, N_BH, SUM_O, SUM_ML, pid_q0, ORDER,
            ORDER_STRIDE)
    # one consumer function, its index a constexpr argument (as in attention_fp8_ws)
    gl.warp_specialize([
        (_consumer, (args, 0, P_LOG2_SCALE, PERM_P, WRITE_LSE, OUT_F32, INIT_SUMMARY)),
        (_consumer, (args, 1, P_LOG2_SCALE, PERM_P, WRITE_LSE, OUT_F32, INIT_SUMMARY)),
        (_consumer, (args, 2, P_LOG2_SCALE, PERM_P, WRITE_LSE, OUT_F32, INIT_SUMMARY)),
        (_producer, (args, 0, P_LOG2_SCALE, PERM_P, WRITE_LSE, OUT_F32, INIT_SUMMARY)),
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
        return torch.argsort(counts.reshape(-1, nq), dim=1, descending=True,
                             stable=True).to(torch.int32)
    raise ValueError(f"grouping: {grouping!r}; choose 'consecutive' or 'by_length'")


def fp8_attention_ws_lists(qkv, routing, *, out, lse, scale: float, row_start: int,
                           out_f32: bool, p_log2_scale: float, sum_o=None, sum_ml=None,
                           stages: int = 2, grouping: str = "by_length"):
    """The exact tiles of block-sparse attention on the warp-specialized schedule, into `out`
    (and `lse` when given); ``sum_o`` / ``sum_ml``: Sol's summary-pass state to merge;
    grouping: which query blocks share a CTA (``query_order``)."""
    B, H, S_pad, D = qkv.q8.shape
    Hkv = qkv.k8.shape[1]
    nq, nk = routing.exact.shape[-2:]
    order = query_order(routing.counts, grouping)
    qd, kd, vd = descriptors(qkv, block_n=64)  # one 64-token box per key block
    grid = (triton.cdiv(nq, CONSUMERS), B * H)
    _fp8_attn_ws_lists_kernel[grid](
        qd, kd, vd, qkv.q_scale, qkv.k_scale, qkv.v_scale, qkv.v_corr, out,
        lse if lse is not None else out,
        qkv.seq_len, S_pad, H, H // Hkv, row_start, scale * LOG2E,
        out.stride(0), out.stride(1), out.stride(2),
        routing.blocks.contiguous(), routing.counts.contiguous(), nq, nk, B * H,
        sum_o, sum_ml, order, order.stride(0) if order.shape[0] > 1 else 0,
        STAGES=stages, CONS_REGS=CONSUMER_REGS, P_LOG2_SCALE=p_log2_scale,
        PERM_P=bool(qkv.v_perm), WRITE_LSE=lse is not None, OUT_F32=out_f32,
        INIT_SUMMARY=sum_o is not None, num_warps=4, maxnreg=MAXNREG,
    )
    return out, lse


def applies(qkv, sparse, splits: int, attention) -> bool:
    """Whether a sparse launch takes this kernel (see the module docstring); ``attention``: the
    call's ``AttentionConfig``."""
    from .e4m3 import interpreting

    tiling = (attention.block_n, attention.flush, attention.num_stages) == (128, "fma", 2) \
        and attention.max_imprecise >= 128
    return (sparse.schedule == "warp_specialized" and splits == 1 and sparse.tma and tiling
            and qkv.q8.dtype == torch.float8_e4m3fn and qkv.q8.shape[-1] == 128
            and not interpreting())

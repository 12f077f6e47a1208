"""Sol's summary pass in Gluon (Hopper): one warpgroup per 64-row query block, four per SM.

Torch twin: the summary route of ``workbench.attention.reference._attend`` with the ``fp8_sol_*``
recipes (``recipe_attention``), as the Triton summary pass (``attention_fp8._summary_step`` with
``SUMMARY_ONLY`` and BF16 operands) computes it: for the query block's not-exact key blocks j
(``blocks[cnt:]``, ascending), in chunks of CHUNK, t = q . kc_j (Q's E4M3 codes in BF16, exact;
kc_j BF16), the online softmax's row max, w = 2^(t * qs - m), l += w * len_j (len_j =
min(64, S - 64 j), the block's rows) and
acc += w @ (vc_j / s_v) with w in BF16; the unnormalized state (acc, m * qs, l) goes to the
exact-tile launch, which merges it (``INIT_SUMMARY``). What differs from the Triton pass is where
the operands live and so how many query blocks share an SM: Q's codes in BF16 in shared memory
(not 32 registers of the A operand), the kc / vc rows of two chunks in shared memory (gathered by
cp.async, the next chunk's while this one is multiplied), and the products added into the
rescaled accumulator itself (BF16 products keep FP32 sums; the fresh accumulator of the exact
tiles serves FP8's truncated accumulation), so a program fits 128 registers and 48 KB: four per
SM where the Triton pass (168 registers) fits three. The sums are the Triton pass's up to FP32
rounding (the order of acc * alpha and the chunk's products; the GPU tests found the same bits).
A schedule sharing each chunk among a CTA's three query blocks (every key block in order, the
exact ones masked, one TMA producer warp: 2.6x less kc / vc traffic at Sol tau 1) measured
slower, 1.56-2.20 ms against 1.49 at the H3 anchor (commit c2419c8): the pass is not bound by
that traffic.

Gluon does not run in Triton's interpreter: the CPU tests compile it for sm_90a; the GPU tests
compare its state with the Triton pass's and the whole call with float64.

Shapes: Q8 [B, H, S_pad, D] E4M3, SQ [B, H, S_pad / 64]; BLOCKS [B * H * N_QB, N_KB] int32
(exact blocks first), COUNTS [B * H * N_QB]; KC, VCS [B, Hkv, N_KB, D] BF16;
SUM_O [B * H, S_pad, D] FP32, SUM_ML [2, B * H, S_pad] FP32 (m * qs, l). Head dim 128.
"""

from __future__ import annotations

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.ampere import async_copy
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    warpgroup_mma,
    warpgroup_mma_wait,
)

from .attention_fp8_ws import LOG2E, _row_bias

MAXNREG = 128  # four 128-thread programs per SM


# the gather's layout: a chunk's [CHUNK, HEAD_D] rows, 8 consecutive elements per thread
_GATHER = gl.constexpr(gl.BlockedLayout(size_per_thread=[1, 8], threads_per_warp=[2, 16],
                                        warps_per_cta=[4, 1], order=[1, 0]))


@gluon.jit
def _chunk_index(k, CHUNK: gl.constexpr):
    """The list positions of chunk k past the exact entries (k * CHUNK ..), one per row of the
    gather's layout."""
    return k * CHUNK + gl.arange(0, CHUNK, layout=gl.SliceLayout(1, _GATHER))


@gluon.jit
def _chunk_entries(k, lst, cnt, n_sum, CHUNK: gl.constexpr):
    """Chunk k's list entries (cnt + k * CHUNK ..; 0 past the list) in the gather's layout."""
    ci = _chunk_index(k, CHUNK)
    return gl.load(lst + cnt + ci, mask=ci < n_sum, other=0)


@gluon.jit
def _gather_chunk(k, js, bufs, jbuf, lst, cnt, n_sum, KC, VCS, kvbase, CHUNK: gl.constexpr,
                  HEAD_D: gl.constexpr):
    """Chunk k's kc and vc / s_v rows (its list entries js, loaded a chunk earlier by
    ``_chunk_entries``) into buffers k % 2 and 2 + k % 2, and the entries themselves into jbuf
    k % 2, by cp.async, one commit group; rows past the list are zeros. The entries in shared
    memory give the chunk's block lengths without the two dependent global loads (entry, then
    its length) the loop had: the pass 1.433 / 1.458 against 1.505 / 1.521 ms at the H3 anchor
    (commit 77d15e8 + the next). The entries for the addresses come a chunk ahead, so that no
    global load's latency stands between one chunk and the next: 1.323 / 1.171 / 1.425 against
    1.441 / 1.277 / 1.574 ms at Sol tau 1 / 0.36 / 1.25 (H3 shape, H200, 2026-12-01)."""
    ok = _chunk_index(k, CHUNK) < n_sum
    rows = (kvbase + js)[:, None] * HEAD_D \
        + gl.arange(0, HEAD_D, layout=gl.SliceLayout(0, _GATHER))[None, :]
    async_copy.async_copy_global_to_shared(bufs.index(k % 2), KC + rows, mask=ok[:, None])
    async_copy.async_copy_global_to_shared(bufs.index(2 + k % 2), VCS + rows, mask=ok[:, None])
    lj: gl.constexpr = gl.BlockedLayout(size_per_thread=[1], threads_per_warp=[32],
                                        warps_per_cta=[4], order=[0])
    cj = k * CHUNK + gl.arange(0, CHUNK, layout=lj)
    async_copy.async_copy_global_to_shared(jbuf.index(k % 2), lst + cnt + cj, mask=cj < n_sum)
    async_copy.commit_group()


@gluon.jit
def _summary_kernel(Q8, SQ, BLOCKS, COUNTS, KC, VCS, SUM_O, SUM_ML,
                    S_pad, H, GROUP, N_QB, N_KB, N_BH, row_start, qk_scale_log2, S_len,
                    HEAD_D: gl.constexpr, CHUNK: gl.constexpr, P_LOG2_SCALE: gl.constexpr,
                    SKIP_PREFIX: gl.constexpr):
    """Grid (N_QB, B * H), 4 warps. SKIP_PREFIX: query blocks of rows < row_start only (the
    dense-prefix rows, overwritten by the caller) write nothing."""
    pid_m = gl.program_id(0)
    bh = gl.program_id(1)
    if SKIP_PREFIX:
        if (pid_m + 1) * 64 <= row_start:
            return
    b = bh // H
    h = bh % H
    bhk = b * (H // GROUP) + h // GROUP
    row = bh * N_QB + pid_m
    cnt = gl.load(COUNTS + row)
    lst = BLOCKS + row.to(gl.int64) * N_KB
    n_sum = N_KB - cnt
    n_chunks = gl.cdiv(n_sum, CHUNK)
    qs = gl.load(SQ + bh * (S_pad // 64) + pid_m) * qk_scale_log2

    q16: gl.constexpr = gl.NVMMASharedLayout.get_default_for([64, HEAD_D], gl.bfloat16)
    rows16: gl.constexpr = gl.NVMMASharedLayout.get_default_for([CHUNK, HEAD_D], gl.bfloat16)
    q_bf = gl.allocate_shared_memory(gl.bfloat16, [64, HEAD_D], q16)
    bufs = gl.allocate_shared_memory(gl.bfloat16, [4, CHUNK, HEAD_D], rows16)  # kc 0/1, vc 2/3
    jbuf = gl.allocate_shared_memory(gl.int32, [2, CHUNK],
                                     gl.SwizzledSharedLayout(1, 1, 1, order=[0]))

    _gather_chunk(0, _chunk_entries(0, lst, cnt, n_sum, CHUNK), bufs, jbuf, lst, cnt, n_sum,
                  KC, VCS, bhk * N_KB, CHUNK, HEAD_D)
    js_next = _chunk_entries(1, lst, cnt, n_sum, CHUNK)
    # Q's E4M3 codes in BF16 (exact), once
    ldq: gl.constexpr = gl.BlockedLayout(size_per_thread=[1, 16], threads_per_warp=[4, 8],
                                         warps_per_cta=[4, 1], order=[1, 0])
    rq = (bh * S_pad + pid_m * 64 + gl.arange(0, 64, layout=gl.SliceLayout(1, ldq))).to(gl.int64)
    dq = gl.arange(0, HEAD_D, layout=gl.SliceLayout(0, ldq))
    q_bf.store(gl.load(Q8 + rq[:, None] * HEAD_D + dq[None, :]).to(gl.bfloat16))

    mma_t: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                    instr_shape=[16, CHUNK, 16])
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                  instr_shape=[16, HEAD_D, 16])
    w_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=2)
    rows: gl.constexpr = gl.SliceLayout(1, mma)
    cols_t: gl.constexpr = gl.SliceLayout(0, mma_t)
    m_i = gl.full([64], float("-inf"), gl.float32, rows)
    l_i = gl.zeros([64], gl.float32, rows)
    acc = gl.zeros([64, HEAD_D], gl.float32, mma)
    zt = gl.zeros([64, CHUNK], gl.float32, mma_t)
    for k in range(n_chunks):
        # the next chunk's rows fly during this chunk's products (past the list: zeros), and
        # the entries of the one after it during the next chunk's
        _gather_chunk(k + 1, js_next, bufs, jbuf, lst, cnt, n_sum, KC, VCS, bhk * N_KB, CHUNK,
                      HEAD_D)
        js_next = _chunk_entries(k + 2, lst, cnt, n_sum, CHUNK)
        async_copy.wait_group(1)
        fence_async_shared()
        t = warpgroup_mma(q_bf, bufs.index(k % 2).permute((1, 0)), zt, use_acc=False,
                          is_async=True)
        ci = k * CHUNK + gl.arange(0, CHUNK, layout=cols_t)
        ok = ci < n_sum
        js = jbuf.index(k % 2).load(cols_t)
        lens = gl.where(ok, gl.minimum(S_len - js * 64, 64), 0).to(gl.float32)
        t = warpgroup_mma_wait(0, deps=(t,))
        t = gl.where(ok[None, :], t, float("-inf"))
        m_cand = gl.maximum(m_i, gl.convert_layout(gl.max(t, axis=1), rows,
                                                   assert_trivial=True))
        mq, alpha = _row_bias(m_i, m_cand, qs, P_LOG2_SCALE)
        mq_t = gl.convert_layout(mq, gl.SliceLayout(1, mma_t), assert_trivial=True)
        w = gl.exp2(gl.fma(t, gl.full([64, CHUNK], qs, gl.float32, mma_t),
                           -gl.broadcast(mq_t[:, None], t)[0]))
        ls = gl.sum(w * lens[None, :], axis=1)
        l_i = l_i * alpha + gl.convert_layout(ls, rows, assert_trivial=True)
        w16 = gl.convert_layout(w.to(gl.bfloat16), w_layout)
        acc = warpgroup_mma(w16, bufs.index(2 + k % 2), acc * alpha[:, None], is_async=True)
        acc = warpgroup_mma_wait(0, deps=(acc,))
        m_i = m_cand
    async_copy.wait_group(0)  # the last (empty) gather; chunk 0's when there was no loop

    srow = (bh * S_pad + pid_m * 64 + gl.arange(0, 64, layout=rows)).to(gl.int64)
    d = gl.arange(0, HEAD_D, layout=gl.SliceLayout(0, mma))
    gl.store(SUM_O + srow[:, None] * HEAD_D + d[None, :], acc)
    gl.store(SUM_ML + srow, m_i * qs)
    gl.store(SUM_ML + N_BH * S_pad + srow, l_i)


def takes(sparse) -> bool:
    """Whether a ``SparseConfig`` asks for this kernel: ``summary_kernel="gluon"`` (or
    "fp8_tiles" where the exact-tile kernel cannot take the route) with BF16
    summary operands in chunks of 16 or 32 blocks (the part of ``applies`` that needs no
    operands; scripts/sass_stats.py compiles by it)."""
    return (sparse.summary_kernel in ("gluon", "fp8_tiles") and sparse.summary_precision == "bf16"
            and sparse.summary_chunk in (16, 32))


def applies(qkv, sparse, interp: bool) -> bool:
    """Whether Sol's summary pass takes this kernel (``SparseConfig.summary_kernel``): compiled,
    E4M3 Q, head dim 128, and what ``takes`` asks of the config."""
    return (takes(sparse) and not interp and qkv.q8.dtype == torch.float8_e4m3fn
            and qkv.q8.shape[-1] == 128)


def summary_pass(qkv, blocks, counts, kc, vcs, sum_o, sum_ml, *, scale: float,
                 row_start: int, p_log2_scale: float, chunk: int, skip_prefix: bool):
    """Fill sum_o / sum_ml (see the module docstring) from the lists blocks [B, H, nq, nk]
    int32 / counts [B, H, nq] int32 (contiguous) and the BF16 summary operands kc, vcs
    [B, Hkv, nk, D] (64-token blocks; the last one's length from qkv.seq_len)."""
    B, H, S_pad, D = qkv.q8.shape
    Hkv = qkv.k8.shape[1]
    nq, nk = blocks.shape[-2:]
    if kc.dtype != torch.bfloat16 or vcs.dtype != torch.bfloat16:
        raise ValueError(f"summary operands: kc {kc.dtype}, vc {vcs.dtype}; expected bfloat16")
    _summary_kernel[(nq, B * H)](
        qkv.q8, qkv.q_scale, blocks, counts, kc, vcs, sum_o, sum_ml,
        S_pad, H, H // Hkv, nq, nk, B * H, row_start, scale * LOG2E, qkv.seq_len,
        HEAD_D=D, CHUNK=chunk, P_LOG2_SCALE=p_log2_scale, SKIP_PREFIX=skip_prefix,
        num_warps=4, maxnreg=MAXNREG,
    )

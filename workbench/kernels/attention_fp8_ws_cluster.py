"""The dense warp-specialized FP8 kernel on 2-CTA clusters with TMA multicast (Gluon + PTX).

Torch twin: as ``attention_fp8_ws`` (the same tile function, operation for operation: the GPU run
found the same bits at the H3 shape). What differs is where each K / V tile comes from: the two CTAs
of a cluster (consecutive 192-row blocks of one head) each load one half of every tile from L2,
rank 0 the K box and rank 1 the V^T box, and multicast it into the same ring slot of both CTAs;
a slot's empty barrier counts the consumers of both CTAs (3 local arrivals + 3 remote ones), its
ready barrier the 32 KB both multicasts deliver. So each tile is read from L2 once per two SMs.

Triton 3.6's Gluon has no multicast copy, no cluster barrier and no shared-memory addresses, so
those are inline PTX (``cp.async.bulk.tensor ... .multicast::cluster``, ``mapa`` + remote
``mbarrier.arrive``, ``barrier.cluster`` after ``fence.mbarrier_init``), the shared offsets of the
two allocations are read from the kernel's own PTX (``smem_offsets``: compile, read, compile again
with them as constants, check), the tensor maps live in device memory (the multicast takes a
global address), and the launch is made a cluster launch by setting the compiled kernel's
``num_ctas`` (the launcher then doubles grid x). Every partition waits on the cluster barrier
first (so no multicast or remote arrive reaches a CTA before its barriers exist); the producer
partition is four warps (no idle warp misses that barrier); each producer waits, last, for the
release of the final tiles by all six consumers, so nothing of its CTA is in flight when it exits.

Measured (H200, 2026-12-01, H3 shape, kernel alone, medians of interleaved rounds): bitwise equal
to ``attention_fp8_ws``; 37.86 ms with two slots, 34.68-35.32 with three, 38.61 with four, against
32.80-33.02 for the one-CTA kernel; the same one-CTA kernel launched as 2-CTA clusters (no
multicast) 32.99. The clock at the 690 W board limit rose by 15-60 MHz (less L2 traffic), but each
slot now waits for the slower of two CTAs' consumers, and the inline PTX made ptxas spill (81
stores / 73 loads, two loads per tile in the loop). It loses: removed in the next commit.
"""

from __future__ import annotations

import ctypes
import re

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

from .attention_fp8_ws import LOG2E, _p_operand, _row_bias, _store_rows, descriptors



@gluon.jit
def _i32(x):
    L: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    return x + gl.zeros([128], gl.int32, L)


@gluon.jit
def _i64(x):
    L: gl.constexpr = gl.BlockedLayout([1], [32], [4], [0])
    return x + gl.zeros([128], gl.int64, L)


@gluon.jit
def _cluster_sync():
    gl.inline_asm_elementwise(
        "barrier.cluster.arrive.release;\n barrier.cluster.wait.acquire;\n mov.u32 $0, 0;",
        "=r,r", [_i32(0)], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _fence_barrier_init():
    gl.inline_asm_elementwise("fence.mbarrier_init.release.cluster;\n mov.u32 $0, 0;",
                              "=r,r", [_i32(0)], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _multicast(dst, tmap, c0, c1, bar):
    """One thread of the partition: the 2-D box at (c0, c1) of tensor map `tmap` (a global
    address) into shared offset dst (from the dynamic shared memory's start) of both CTAs,
    completing its bytes on the barrier at shared offset bar of each."""
    gl.inline_asm_elementwise(
        "{ .reg .pred p; .reg .b32 t, d, b; .reg .b16 m;\n"
        " mov.u32 t, %tid.x; and.b32 t, t, 127; setp.eq.u32 p, t, 0; mov.b16 m, 3;\n"
        " mov.u32 d, global_smem; add.u32 b, d, $5; add.u32 d, d, $1;\n"
        " @p cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes"
        ".multicast::cluster [d], [$2, {$3, $4}], [b], m;\n mov.u32 $0, 0; }",
        "=r,r,l,r,r,r",
        [_i32(dst), _i64(tmap), _i32(c0), _i32(c1), _i32(bar)],
        dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _remote_arrive(off):
    """One thread of the warpgroup: arrive on the barrier at shared offset off of the other CTA
    of the cluster (as CUTLASS's ClusterBarrier::arrive(cta_id): no cluster-scope fence)."""
    gl.inline_asm_elementwise(
        "{ .reg .pred p; .reg .b32 t, a, r;\n"
        " mov.u32 t, %tid.x; and.b32 t, t, 127; setp.eq.u32 p, t, 0;\n"
        " mov.u32 a, global_smem; add.u32 a, a, $1;\n"
        " mov.u32 r, %cluster_ctarank; xor.b32 r, r, 1;\n"
        " mapa.shared::cluster.u32 a, a, r;\n"
        " @p mbarrier.arrive.shared::cluster.b64 _, [a];\n mov.u32 $0, 0; }",
        "=r,r", [_i32(off)], dtype=gl.int32, is_pure=False, pack=1)


@gluon.jit
def _producer(args, cid: gl.constexpr, P_LOG2_SCALE: gl.constexpr, PERM_P: gl.constexpr,
              WRITE_LSE: gl.constexpr, OUT_F32: gl.constexpr, OFF_KV: gl.constexpr,
              OFF_BAR: gl.constexpr):
    (q_desc, kv_smem, bars, KMAP, VMAP, rank,
     SQ, SK, VS, VC, OUT, LSE, S, S_pad, n_scale, bh, bhk, b, h, m0, qk_scale_log2,
     stride_ob, stride_os, stride_oh, row_start) = args
    _cluster_sync()
    STAGES: gl.constexpr = (kv_smem.shape[0] - 2) // 2
    BLOCK_N: gl.constexpr = kv_smem.shape[1]
    HEAD_D: gl.constexpr = kv_smem.shape[2]
    q_smem = kv_smem._reinterpret(kv_smem.dtype, [2 * kv_smem.shape[0], 64, HEAD_D],
                                  q_desc.layout)
    q_bar = bars.index(0)
    mbarrier.expect(q_bar, 3 * q_desc.block_type.nbytes)
    for c in gl.static_range(3):
        tma.async_copy_global_to_shared(q_desc, [bh * S_pad + m0 + c * 64, 0], q_bar,
                                        q_smem.index(c))
    kbase = bhk * S_pad
    vbase = bhk * HEAD_D
    n_tiles = gl.cdiv(S, BLOCK_N)
    TILE: gl.constexpr = BLOCK_N * HEAD_D  # bytes of one box (E4M3)
    for j in range(n_tiles):
        st = j % STAGES
        ph = (j // STAGES) & 1
        mbarrier.wait(bars.index(1 + STAGES + st), ph ^ 1)
        mbarrier.expect(bars.index(1 + st), 2 * TILE)
        bar = OFF_BAR + 8 * (1 + st)
        if rank == 0:
            _multicast(OFF_KV + (2 + st) * TILE, KMAP, 0, kbase + j * BLOCK_N, bar)
        else:
            _multicast(OFF_KV + (2 + STAGES + st) * TILE, VMAP, j * BLOCK_N, vbase, bar)
    # tail: every consumer of both CTAs has released the last tiles, so no multicast or remote
    # arrive of either CTA is still in flight when this CTA exits
    for j in range(n_tiles, n_tiles + STAGES):
        mbarrier.wait(bars.index(1 + STAGES + j % STAGES), ((j // STAGES) & 1) ^ 1)


@gluon.jit
def _tile(j, acc, l_i, m_i, q, qs, kv_smem, bars, SK, skbase, S, offs_n,
          mma: gl.constexpr, a_layout: gl.constexpr, MASK_KEYS: gl.constexpr,
          P_LOG2_SCALE: gl.constexpr, PERM_P: gl.constexpr, OFF_BAR: gl.constexpr):
    STAGES: gl.constexpr = (kv_smem.shape[0] - 2) // 2
    BLOCK_N: gl.constexpr = kv_smem.shape[1]
    HEAD_D: gl.constexpr = kv_smem.shape[2]
    st = j % STAGES
    ph = (j // STAGES) & 1
    mbarrier.wait(bars.index(1 + st), ph)
    zs = gl.zeros([64, BLOCK_N], gl.float32, mma)
    raw = warpgroup_mma(q, kv_smem.index(2 + st).permute((1, 0)), zs, use_acc=False,
                        is_async=True)
    s0 = gl.load(SK + skbase + 2 * j)
    s1 = gl.load(SK + skbase + 2 * j + 1)
    raw = warpgroup_mma_wait(0, deps=(raw,))
    if MASK_KEYS:
        raw = gl.where((j * BLOCK_N + offs_n < S)[None, :], raw, float("-inf"))
    half0 = (offs_n < 64)[None, :]
    mx0 = gl.max(gl.where(half0, raw, float("-inf")), axis=1)
    mx1 = gl.max(gl.where(half0, float("-inf"), raw), axis=1)
    m_cand = gl.maximum(m_i, gl.maximum(mx0 * s0, mx1 * s1))
    f = gl.where(half0, qs * s0, qs * s1)
    mq, alpha = _row_bias(m_i, m_cand, qs, P_LOG2_SCALE)
    p = gl.exp2(gl.fma(raw, gl.broadcast(f, raw)[0], -gl.broadcast(mq[:, None], raw)[0]))
    l_i = l_i * alpha + gl.sum(p, axis=1)
    p8 = _p_operand(p.to(gl.float8e4nv), a_layout, PERM_P)
    zo = gl.zeros([64, HEAD_D], gl.float32, mma)
    pv = warpgroup_mma(p8, kv_smem.index(2 + STAGES + st).permute((1, 0)), zo, use_acc=False,
                       is_async=True)
    pv = warpgroup_mma_wait(0, deps=(pv,))
    mbarrier.arrive(bars.index(1 + STAGES + st), count=1)
    _remote_arrive(OFF_BAR + 8 * (1 + STAGES + st))
    acc = acc * alpha[:, None] + pv
    return acc, l_i, m_cand


@gluon.jit
def _consumer(args, cid: gl.constexpr, P_LOG2_SCALE: gl.constexpr, PERM_P: gl.constexpr,
              WRITE_LSE: gl.constexpr, OUT_F32: gl.constexpr, OFF_KV: gl.constexpr,
              OFF_BAR: gl.constexpr):
    (q_desc, kv_smem, bars, KMAP, VMAP, rank,
     SQ, SK, VS, VC, OUT, LSE, S, S_pad, n_scale, bh, bhk, b, h, m0, qk_scale_log2,
     stride_ob, stride_os, stride_oh, row_start) = args
    _cluster_sync()
    BLOCK_N: gl.constexpr = kv_smem.shape[1]
    HEAD_D: gl.constexpr = kv_smem.shape[2]
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                  instr_shape=[16, BLOCK_N, 32])
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=4)
    row_l: gl.constexpr = gl.SliceLayout(1, mma)
    col_l: gl.constexpr = gl.SliceLayout(0, mma)
    q_smem = kv_smem._reinterpret(kv_smem.dtype, [2 * kv_smem.shape[0], 64, HEAD_D],
                                  q_desc.layout)
    r0 = m0 + cid * 64
    qs = gl.load(SQ + bh * n_scale + gl.minimum(r0 // 64, n_scale - 1)) * qk_scale_log2
    m_i = gl.full([64], float("-inf"), gl.float32, row_l)
    l_i = gl.zeros([64], gl.float32, row_l)
    acc = gl.zeros([64, HEAD_D], gl.float32, mma)
    offs_n = gl.arange(0, BLOCK_N, layout=col_l)
    skbase = bhk * n_scale
    mbarrier.wait(bars.index(0), 0)
    q = q_smem.index(cid)
    n_full = S // BLOCK_N
    for j in range(n_full):
        acc, l_i, m_i = _tile(j, acc, l_i, m_i, q, qs, kv_smem, bars, SK, skbase, S, offs_n,
                              mma, a_layout, False, P_LOG2_SCALE, PERM_P, OFF_BAR)
    if n_full * BLOCK_N < S:
        acc, l_i, m_i = _tile(n_full, acc, l_i, m_i, q, qs, kv_smem, bars, SK, skbase, S,
                              offs_n, mma, a_layout, True, P_LOG2_SCALE, PERM_P,
                              OFF_BAR)
    # the dense kernel's epilogue helper reads its 28-tuple layout
    args28 = (q_desc, None, None, None, None, None, None, None, None,
              SQ, SK, VS, VC, OUT, LSE, S, S_pad, n_scale, bh, bhk, b, h, m0, qk_scale_log2,
              stride_ob, stride_os, stride_oh, row_start)
    _store_rows(acc, l_i, m_i * qs, r0, args28, mma, P_LOG2_SCALE, WRITE_LSE, OUT_F32)


@gluon.jit
def _fp8_attn_mc_kernel(
    q_desc, KMAP, VMAP, SQ, SK, VS, VC, OUT, LSE,
    S, S_pad, H, GROUP, row_start, first_block, qk_scale_log2, stride_ob, stride_os, stride_oh,
    STAGES: gl.constexpr, CONS_REGS: gl.constexpr,
    P_LOG2_SCALE: gl.constexpr, PERM_P: gl.constexpr, WRITE_LSE: gl.constexpr,
    OUT_F32: gl.constexpr, OFF_KV: gl.constexpr, OFF_BAR: gl.constexpr,
):
    """Grid (n_pairs, B * H) launched as 2-CTA clusters along x (gridDim.x = 2 n_pairs)."""
    HEAD_D: gl.constexpr = q_desc.block_type.shape[1]
    BLOCK_N: gl.constexpr = 128
    pid = gl.program_id(0)
    rank = pid % 2
    bh = gl.program_id(1)
    b = bh // H
    h = bh % H
    bhk = b * (H // GROUP) + h // GROUP
    m0 = (first_block + pid) * 192
    n_scale = S_pad // 64
    lay: gl.constexpr = gl.NVMMASharedLayout.get_default_for([BLOCK_N, HEAD_D], gl.float8e4nv)
    # boxes 0-1: the Q rows (3 x 64 of 4), 2 .. 2+STAGES-1: K slots, then V^T slots
    kv_smem = gl.allocate_shared_memory(gl.float8e4nv, [2 + 2 * STAGES, BLOCK_N, HEAD_D], lay)
    bars = gl.allocate_shared_memory(gl.int64, [1 + 2 * STAGES, 1], mbarrier.MBarrierLayout())
    mbarrier.init(bars.index(0), count=1)
    for i in gl.static_range(STAGES):
        mbarrier.init(bars.index(1 + i), count=1)
        mbarrier.init(bars.index(1 + STAGES + i), count=6)
    fence_async_shared()
    _fence_barrier_init()
    args = (q_desc, kv_smem, bars, KMAP, VMAP, rank,
            SQ, SK, VS, VC, OUT, LSE, S, S_pad, n_scale, bh, bhk, b, h, m0, qk_scale_log2,
            stride_ob, stride_os, stride_oh, row_start)
    gl.warp_specialize([
        (_consumer, (args, 0, P_LOG2_SCALE, PERM_P, WRITE_LSE, OUT_F32, OFF_KV, OFF_BAR)),
        (_consumer, (args, 1, P_LOG2_SCALE, PERM_P, WRITE_LSE, OUT_F32, OFF_KV, OFF_BAR)),
        (_consumer, (args, 2, P_LOG2_SCALE, PERM_P, WRITE_LSE, OUT_F32, OFF_KV, OFF_BAR)),
        (_producer, (args, 0, P_LOG2_SCALE, PERM_P, WRITE_LSE, OUT_F32, OFF_KV, OFF_BAR)),
    ], [4, 4, 4], [CONS_REGS, CONS_REGS, 24])


def _tensor_map(desc) -> torch.Tensor:
    """The 128-byte CUtensorMap of a host TensorDescriptor (E4M3, 128-byte swizzle), in device
    memory (the multicast instruction takes its global address)."""
    from triton.backends.nvidia.driver import make_tensordesc_arg

    meta = {"swizzle": 3, "elem_size": 1, "elem_type": 0, "block_size": list(desc.block_shape),
            "fp4_padded": False}
    obj = make_tensordesc_arg(desc, meta)[0]
    raw = ctypes.string_at(id(obj) + 128, 128)  # PyObject_HEAD, then the map aligned to 128
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8).to("cuda")


def _values(ptx: str) -> dict:
    val = {}
    for line in ptx.splitlines():
        s = line.strip().rstrip(";")
        m = re.match(r"mov\.(?:b32|u32)\s+(%r\d+),\s*global_smem$", s)
        if m:
            val[m.group(1)] = 0
            continue
        m = re.match(r"add\.(?:s32|u32)\s+(%r\d+),\s*(%r\d+),\s*(-?\d+)$", s)
        if m and m.group(2) in val:
            val[m.group(1)] = val[m.group(2)] + int(m.group(3))
            continue
        m = re.match(r"mov\.(?:b32|u32)\s+(%r\d+),\s*(%r\d+)$", s)
        if m and m.group(2) in val:
            val[m.group(1)] = val[m.group(2)]
    return val


def _addr(tok: str, val: dict):
    tok = tok.strip()
    m = re.match(r"global_smem(?:\+(\d+))?$", tok)
    if m:
        return int(m.group(1) or 0)
    return val.get(tok)


def smem_offsets(ptx: str) -> tuple[int, int]:
    """(OFF_KV, OFF_BAR): the Q boxes' TMA destinations (the first is OFF_KV) and the first
    mbarrier.init (bars[0], count 1)."""
    val = _values(ptx)
    inits = [(_addr(a, val), int(c)) for a, c in
             re.findall(r"mbarrier\.init\.shared(?:::cta)?\.b64\s+\[([^\]]+)\],\s*(\d+)", ptx)]
    qdst = [(_addr(d, val), _addr(b, val)) for d, b in re.findall(
        r"cp\.async\.bulk\.tensor\.2d\.shared::cluster\.global\.mbarrier::complete_tx::bytes"
        r"\s+\[([^\]]+)\],\s*\[[^\]]+\],\s*\[([^\]]+)\]", ptx)]
    off_bar = inits[0][0]
    assert inits[0][1] == 1 and off_bar is not None, inits
    assert [a for a, _ in inits] == [off_bar + 8 * i for i in (0, 1, 3, 2, 4)] or \
        sorted(a for a, _ in inits) == [off_bar + 8 * i for i in range(len(inits))], inits
    qd = sorted(d for d, b in qdst if d is not None)
    assert len(qd) == 3 and qd[1] - qd[0] == 8192 and qd[2] - qd[1] == 8192, qdst
    assert all(b == off_bar for _, b in qdst), qdst
    return qd[0], off_bar


_COMPILED = {}


def fp8_attention_fwd_cluster(qkv, *, num_heads: int, scale: float, out=None,
                              out_dtype=torch.bfloat16, row_start: int = 0,
                              return_lse: bool = False, out_f32: bool = False,
                              p_scaling: str = "unit", stages: int = 2):
    """``attention_fp8_ws.fp8_attention_fwd_ws`` on 2-CTA clusters (same arguments; ``stages``
    ring slots). GPU only (the tensor maps are made by the CUDA driver)."""
    from .attention_fp8 import P_LOG2_SCALES

    B, H, S_pad, D = qkv.q8.shape
    Hkv = qkv.k8.shape[1]
    S = qkv.seq_len
    if out is None:
        out = torch.empty((B, S, H, D), dtype=out_dtype, device=qkv.q8.device)
    lse = torch.empty((B, H, S), dtype=torch.float32, device=out.device) if return_lse else None
    qd, kd, vd = descriptors(qkv)
    key = (qkv.k8.data_ptr(), qkv.v8t.data_ptr(), tuple(qkv.k8.shape))
    if key not in _COMPILED:
        _COMPILED.clear()
        _COMPILED[key] = (_tensor_map(kd), _tensor_map(vd))
    kmap, vmap = _COMPILED[key]
    first = 0 if return_lse else row_start // 192
    n_blocks = triton.cdiv(S, 192) - first
    grid = (triton.cdiv(n_blocks, 2), B * H)
    args = (qd, kmap.data_ptr(), vmap.data_ptr(), qkv.q_scale, qkv.k_scale, qkv.v_scale,
            qkv.v_corr, out, lse if lse is not None else out,
            S, S_pad, H, H // Hkv, row_start, first, scale * LOG2E,
            out.stride(0), out.stride(1), out.stride(2))
    kw = dict(STAGES=stages, CONS_REGS=160, P_LOG2_SCALE=P_LOG2_SCALES[p_scaling],
              PERM_P=bool(qkv.v_perm), WRITE_LSE=return_lse, OUT_F32=out_f32, num_warps=4,
              maxnreg=128)
    ck = ("offs", first == 1, return_lse, out_f32, p_scaling, stages)
    if ck not in _COMPILED:
        k0 = _fp8_attn_mc_kernel.warmup(*args, grid=grid, OFF_KV=0, OFF_BAR=0, **kw)
        offs = smem_offsets(k0.asm["ptx"])
        k1 = _fp8_attn_mc_kernel.warmup(*args, grid=grid, OFF_KV=offs[0], OFF_BAR=offs[1], **kw)
        assert smem_offsets(k1.asm["ptx"]) == offs, (offs, smem_offsets(k1.asm["ptx"]))
        k1.packed_metadata = (k1.metadata.num_warps, 2, k1.metadata.shared)  # 2-CTA clusters
        _COMPILED[ck] = offs
    offs = _COMPILED[ck]
    _fp8_attn_mc_kernel[grid](*args, OFF_KV=offs[0], OFF_BAR=offs[1], **kw)
    return out, lse

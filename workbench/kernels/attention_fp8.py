"""FP8 (E4M3) attention forward for Hopper: block-scaled Q/K, channel-scaled V, P in E4M3.

Torch twin: ``workbench.attention.reference._attend`` (called by ``recipe_attention``) with the
fp8_dense* recipes. Differences that are by design (compare error statistics, not bits):
- online softmax: P = 2^(s - m_running) is rounded to E4M3 against the running row max (the twin
  uses the final row max); the row sum l accumulates the FP32 P, PV uses the E4M3 P (as the twin);
- the V channel scale is applied once to the FP32 accumulator in the epilogue (the twin multiplies
  the dequantized V), then out = acc * s_v / l + v_corr, rounded to BF16.

Numerics:
- scores s = (q8 . k8) * (s_q * softmax_scale * log2 e) * s_k, exp2 with the scale folded in;
- accumulation: every FP8 product chain reaches the FP32 accumulator after at most 128 terms
  (Hopper's FP8 wgmma accumulator keeps fewer than 23 mantissa bits). flush="fma" (default): Q K^T
  is one head-dim-long chain from zero, and each tile's P @ V lands in a fresh accumulator that is
  added with acc * alpha + pv. flush="triton": ``max_num_imprecise_acc`` = max_imprecise on both
  dots (128 = the same flush per tile; 0 = after every 32-wide MMA step, 4-6x slower), which makes
  ptxas serialize every wgmma of the kernel (C7514, see scripts/sass_stats.py); 2-4% slower.
- P rounding: ``ROUND_P`` = True rounds P onto the E4M3 grid with explicit bit arithmetic before the
  cast (``e4m3.round_unit_to_e4m3``), the one form that is right in the interpreter; on the GPU the
  hardware cast (cvt.rn.satfinite) rounds the same way and ``ROUND_P`` = False skips the extra ALU
  work; the benchmark measures both and the dispatch picks the faster (identical values).

Shapes: Q8 [B, H, S_pad, D], K8 [B, Hkv, S_pad, D], V8t [B, Hkv, D, S_pad] (``quantize.py``);
head dim 64 or 128; non-causal; any S: the full key tiles run in the main loop without masks, the
partial last tile (S % BLOCK_N keys) is peeled and runs once with the key mask.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

from .e4m3 import interpreting, round_to_bf16, round_unit_to_e4m3

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453

@triton.jit
def _load_kv(K8, V8T, kd, vd, kbase, vbase, n0, S_pad, offs_n, d,
             HEAD_D: tl.constexpr, BLOCK_N: tl.constexpr, USE_TMA: tl.constexpr):
    """K tile [BLOCK_N, D] (D contiguous) and V tile [BLOCK_N, D] read from V^T (tokens
    contiguous)."""
    if USE_TMA != 0:  # 1: host-built descriptors, 2: descriptors built in the kernel
        k = kd.load([kbase + n0, 0])
        v = tl.trans(vd.load([vbase, n0]))
    else:
        k = tl.load(K8 + (kbase + n0 + offs_n)[:, None] * HEAD_D + d[None, :])
        v = tl.load(V8T + (vbase + d)[None, :] * S_pad + (n0 + offs_n)[:, None])
    return k, v


@triton.jit
def _attn_tile(acc, l_i, m_i, q, qs, k, v, SK, skbase, n0, S, offs_n,
               BLOCK_N: tl.constexpr, SCALE_BLOCK: tl.constexpr, MASK_KEYS: tl.constexpr,
               ROUND_P: tl.constexpr, IMP_QK: tl.constexpr, IMP_PV: tl.constexpr,
               LAZY_TAU: tl.constexpr, PV_FMA: tl.constexpr, SK_FOLD: tl.constexpr,
               PERM_P: tl.constexpr):
    """One key tile of the online softmax. Returns the updated (acc, l_i, m_i)."""
    raw = _dot_fp8(q, tl.trans(k), None, IMP_QK)
    return _softmax_pv(acc, l_i, m_i, raw, qs, v, SK, skbase, n0, S, offs_n, BLOCK_N,
                       SCALE_BLOCK, MASK_KEYS, ROUND_P, IMP_PV, LAZY_TAU, PV_FMA, SK_FOLD,
                       PERM_P)


@triton.jit
def _softmax_pv(acc, l_i, m_i, raw, qs, v, SK, skbase, n0, S, offs_n,
                BLOCK_N: tl.constexpr, SCALE_BLOCK: tl.constexpr, MASK_KEYS: tl.constexpr,
                ROUND_P: tl.constexpr, IMP_PV: tl.constexpr, LAZY_TAU: tl.constexpr,
                PV_FMA: tl.constexpr, SK_FOLD: tl.constexpr, PERM_P: tl.constexpr):
    """Online softmax of one tile's raw scores [BLOCK_M, BLOCK_N] and its P @ V."""
    # The row max m is kept in "t units" (raw score * K scale); the Q-row factor qs (Q scale *
    # softmax scale * log2 e, > 0) enters through one FMA per element: p = 2^(x*f - m*qs).
    if BLOCK_N == SCALE_BLOCK:
        # One K scale for the whole tile: fold it into the per-row factor (f = qs * s_k) and into
        # the row max (s_k > 0 commutes with max), so the tile needs no per-element multiply.
        skv = tl.load(SK + skbase + n0 // SCALE_BLOCK)
        x = raw
        if MASK_KEYS:
            x = tl.where((n0 + offs_n < S)[None, :], x, float("-inf"))
        m_cand = tl.maximum(m_i, tl.max(x, axis=1) * skv)
        f = (qs * skv)[:, None]
    elif SK_FOLD and BLOCK_N == 2 * SCALE_BLOCK:
        # Two K scales per tile, folded like the one-scale case: per-half row maxes (the column
        # test is constant per register after layout lowering, so the selects fold away) and a
        # per-half row factor in the exponent's FMA: no per-element multiply by s_k.
        s0 = tl.load(SK + skbase + n0 // SCALE_BLOCK)
        s1 = tl.load(SK + skbase + n0 // SCALE_BLOCK + 1)
        half0 = (offs_n < SCALE_BLOCK)[None, :]
        x = raw
        if MASK_KEYS:
            x = tl.where((n0 + offs_n < S)[None, :], x, float("-inf"))
        mx0 = tl.max(tl.where(half0, x, float("-inf")), axis=1)
        mx1 = tl.max(tl.where(half0, float("-inf"), x), axis=1)
        m_cand = tl.maximum(m_i, tl.maximum(mx0 * s0, mx1 * s1))
        f = tl.where(half0, (qs * s0)[:, None], (qs * s1)[:, None])
    else:
        if BLOCK_N == 2 * SCALE_BLOCK:  # two scalar loads instead of a per-column gather
            s0 = tl.load(SK + skbase + n0 // SCALE_BLOCK)
            s1 = tl.load(SK + skbase + n0 // SCALE_BLOCK + 1)
            sk = tl.where(offs_n < SCALE_BLOCK, s0, s1)
        else:
            sk = tl.load(SK + skbase + (n0 + offs_n) // SCALE_BLOCK)
        x = raw * sk[None, :]
        if MASK_KEYS:
            x = tl.where((n0 + offs_n < S)[None, :], x, float("-inf"))
        m_cand = tl.maximum(m_i, tl.max(x, axis=1))
        f = qs[:, None]
    if LAZY_TAU > 0:
        # Lazy rescaling (FA4): keep the stale max m_i (so skip acc *= alpha, a BLOCK_M x D
        # multiply) unless some row's max grew by more than LAZY_TAU in log2 units. Exact in
        # math: acc and l share the same reference max and the epilogue divides acc by l. P is
        # then <= 2^LAZY_TAU (256 for 8, below E4M3's 448), and E4M3 keeps its 3-bit relative
        # precision there; the first tile always rescales (m_i = -inf).
        grow = tl.max((m_cand - m_i) * qs, axis=0)
        if grow > LAZY_TAU:
            alpha = tl.math.exp2(m_i * qs - m_cand * qs)
            acc = acc * alpha[:, None]
            l_i = l_i * alpha
            m_i = m_cand
        p = tl.math.exp2(tl.fma(x, f, -(m_i * qs)[:, None]))
        l_i = l_i + tl.sum(p, axis=1)
    else:
        mq = m_cand * qs
        alpha = tl.math.exp2(m_i * qs - mq)
        p = tl.math.exp2(tl.fma(x, f, -mq[:, None]))
        l_i = l_i * alpha + tl.sum(p, axis=1)
        if not PV_FMA:
            acc = acc * alpha[:, None]
        m_i = m_cand
    if ROUND_P:
        p = round_unit_to_e4m3(p)
    if PV_FMA:
        # This tile's P @ V (one BLOCK_N-long FP8 chain) lands in a fresh accumulator and is
        # flushed into the FP32 output accumulator by one FMA with the rescale: the per-tile flush
        # that max_num_imprecise_acc = BLOCK_N asks for, written so that no non-wgmma
        # instruction reads a wgmma accumulator mid-pipeline (with triton's bound, ptxas 12.x/13
        # serializes every wgmma of the kernel: C7514, "non wgmma instructions reading
        # accumulator registers").
        pv = _dot_fp8(_p_operand(p, BLOCK_N, PERM_P), v, None, -1)
        if LAZY_TAU > 0:
            acc = acc + pv
        else:
            acc = acc * alpha[:, None] + pv
    else:
        acc = _dot_fp8(_p_operand(p, BLOCK_N, PERM_P), v, acc, IMP_PV)
    return acc, l_i, m_i


@triton.jit
def _p_operand(p, BLOCK_N: tl.constexpr, PERM_P: tl.constexpr):
    """P [BLOCK_M, BLOCK_N] float32 -> the E4M3 A operand of P @ V. PERM_P: reorder the keys
    within every 32-key group as k -> (k4, k1, k3, k2, k0) bits, the order in which a thread's
    wgmma accumulator registers already hold the operand's keys; V^T is stored in the same order
    (quantize.V_PERM), so the product is unchanged and the registers need not move."""
    if PERM_P:
        bm: tl.constexpr = p.shape[0]
        p5 = tl.reshape(p, [bm, BLOCK_N // 32, 2, 2, 2, 2, 2])
        p = tl.reshape(tl.permute(p5, (0, 1, 2, 4, 5, 3, 6)), [bm, BLOCK_N])
    return p.to(tl.float8e4nv)


@triton.jit
def _dot_fp8(a, b, acc, IMP: tl.constexpr):
    """FP8 wgmma with FP32 output. IMP >= 0: triton's max_num_imprecise_acc bound; -1: triton's
    sm_90 default (no bound: the whole chain stays in the tensor core's accumulator)."""
    if IMP < 0:
        if acc is None:
            return tl.dot(a, b)
        else:
            return tl.dot(a, b, acc)
    else:
        return tl.dot(a, b, acc, max_num_imprecise_acc=IMP)


@triton.jit
def _fp8_attn_fwd_kernel(
    Q8, SQ, K8, SK, V8T, VS, VC, OUT, LSE,
    qd, kd, vd,
    S, S_pad, H, GROUP, row_start, qk_scale_log2, n_kv_rows,
    stride_ob, stride_os, stride_oh,
    HEAD_D: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
    SCALE_BLOCK: tl.constexpr, ROUND_P: tl.constexpr, IMP_QK: tl.constexpr,
    IMP_PV: tl.constexpr,
    WRITE_LSE: tl.constexpr, OUT_F32: tl.constexpr, USE_TMA: tl.constexpr,
    LAZY_TAU: tl.constexpr, WARP_SPEC: tl.constexpr, PV_FMA: tl.constexpr,
    SK_FOLD: tl.constexpr, PERM_P: tl.constexpr, INTERPRET: tl.constexpr,
):
    pid_m = tl.program_id(0)
    bh = tl.program_id(1)
    b = bh // H
    h = bh % H
    bhk = b * (H // GROUP) + h // GROUP
    m0 = pid_m * BLOCK_M
    offs_m = m0 + tl.arange(0, BLOCK_M)
    offs_n = tl.arange(0, BLOCK_N)
    d = tl.arange(0, HEAD_D)
    n_scale = S_pad // SCALE_BLOCK

    if USE_TMA == 2:  # device-side descriptors (what triton's Hopper warp specialization needs)
        qd = tl.make_tensor_descriptor(Q8, shape=[n_kv_rows * GROUP, HEAD_D], strides=[HEAD_D, 1],
                                       block_shape=[BLOCK_M, HEAD_D])
        kd = tl.make_tensor_descriptor(K8, shape=[n_kv_rows, HEAD_D], strides=[HEAD_D, 1],
                                       block_shape=[BLOCK_N, HEAD_D])
        vd = tl.make_tensor_descriptor(V8T, shape=[n_kv_rows // S_pad * HEAD_D, S_pad],
                                       strides=[S_pad, 1], block_shape=[HEAD_D, BLOCK_N])
    if USE_TMA != 0:
        q = qd.load([bh * S_pad + m0, 0])
    else:
        q = tl.load(Q8 + (bh * S_pad + offs_m)[:, None] * HEAD_D + d[None, :])
    qs = tl.load(SQ + bh * n_scale + offs_m // SCALE_BLOCK) * qk_scale_log2

    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_D], tl.float32)
    kbase = bhk * S_pad
    vbase = bhk * HEAD_D
    skbase = bhk * n_scale
    n_full = S // BLOCK_N

    # Main loop over full key tiles: no masks (pad keys exist only in the peeled tile).
    # triton 3.6's interpreter with numpy >= 2.4 fails on `for` loops with a run-time bound, so the
    # interpreter runs the same tile function in a `while` loop; compiled code keeps the `for`
    # (software-pipelined by num_stages, optionally warp-specialized).
    if INTERPRET:
        j = 0
        while j < n_full:
            k, v = _load_kv(K8, V8T, kd, vd, kbase, vbase, j * BLOCK_N, S_pad, offs_n, d,
                            HEAD_D, BLOCK_N, USE_TMA)
            acc, l_i, m_i = _attn_tile(acc, l_i, m_i, q, qs, k, v, SK, skbase, j * BLOCK_N, S,
                                       offs_n, BLOCK_N, SCALE_BLOCK, False, ROUND_P,
                                       IMP_QK, IMP_PV, LAZY_TAU, PV_FMA, SK_FOLD, PERM_P)
            j += 1
    else:
        for j in tl.range(0, n_full, warp_specialize=WARP_SPEC):
            k, v = _load_kv(K8, V8T, kd, vd, kbase, vbase, j * BLOCK_N, S_pad, offs_n, d,
                            HEAD_D, BLOCK_N, USE_TMA)
            acc, l_i, m_i = _attn_tile(acc, l_i, m_i, q, qs, k, v, SK, skbase, j * BLOCK_N, S,
                                       offs_n, BLOCK_N, SCALE_BLOCK, False, ROUND_P,
                                       IMP_QK, IMP_PV, LAZY_TAU, PV_FMA, SK_FOLD, PERM_P)
    # Peeled partial tile (S % BLOCK_N keys; its pad keys are zeros in memory, masked to -inf).
    if n_full * BLOCK_N < S:
        n0 = n_full * BLOCK_N
        k, v = _load_kv(K8, V8T, kd, vd, kbase, vbase, n0, S_pad, offs_n, d,
                        HEAD_D, BLOCK_N, USE_TMA)
        acc, l_i, m_i = _attn_tile(acc, l_i, m_i, q, qs, k, v, SK, skbase, n0, S, offs_n,
                                   BLOCK_N, SCALE_BLOCK, True, ROUND_P, IMP_QK, IMP_PV,
                                   LAZY_TAU, PV_FMA, SK_FOLD, PERM_P)

    # Epilogue: V channel scale, 1/l, then + v_corr (mu_V or the corrected vector) in FP32.
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
        lse = (m_i * qs + tl.math.log2(l_i)) * 0.6931471805599453
        tl.store(LSE + bh * S + offs_m, lse, mask=offs_m < S)


_ALLOCATOR_SET = False


def _ensure_allocator():
    """Device-side descriptors need a global scratch allocator (triton.set_allocator), once."""
    global _ALLOCATOR_SET
    if not _ALLOCATOR_SET:
        triton.set_allocator(
            lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))
        _ALLOCATOR_SET = True


TMA_MODES = {False: 0, None: 0, "none": 0, True: 1, "host": 1, "device": 2}


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
    block_m: int = 128,
    block_n: int = 128,
    num_warps: int = 8,
    num_stages: int = 3,
    max_imprecise: int = 128,
    round_p: bool | None = None,
    use_tma: bool | str = False,
    lazy_tau: float = 0.0,
    warp_specialize: bool = False,
    maxnreg: int | None = None,
    flush: str = "triton",
    sk_fold: bool = False,
):
    """Attention on a ``quantize.QuantizedQKV``. Returns (out [B, S, H, D], lse [B, H, S] or None).

    out: optional preallocated [B, S, H, D] (rows < row_start are left untouched: the dense-prefix
    rows that the merged pass fills). out_f32: write FP32 o = acc * s_v / l WITHOUT v_corr.
    use_tma: False (pointer loads), True/"host" (host-built TMA descriptors), "device" (built in
    the kernel). lazy_tau: lazy-rescale threshold in log2 units (0 = rescale every tile).
    (exp2 already compiles to ex2.approx.ftz.f32, one MUFU op.) warp_specialize: triton's automatic
    warp specialization
    of the key loop (experimental on Hopper in triton 3.6; needs device descriptors).
    flush: how each tile's FP8 products reach the FP32 accumulator (both flush once per tile of
    <= 128 reduction elements, so both have the same precision): "triton" = max_num_imprecise_acc
    (max_imprecise) on both dots; "fma" = Q K^T as one unbounded chain (it starts from zero) and
    P @ V into a fresh accumulator added with acc * alpha + pv, which keeps ptxas from
    serializing the wgmmas. max_imprecise = 0 (flush every 32-wide step) needs "triton".
    sk_fold: with block_n = 128 (two K scales per tile), take the row max per 64-key half and
    put s_k into the exponent's per-row factor (qs * s_k per half) instead of multiplying every
    score by s_k: the same row max, one FP32 multiply per score fewer; the exponent's argument
    rounds differently in the last bit (x * fl(qs * s_k) vs fl(x * s_k) * qs).
    """
    B, H, S_pad, D = qkv.q8.shape
    Hkv = qkv.k8.shape[1]
    S = qkv.seq_len
    interp = interpreting()
    if round_p is None:
        round_p = False  # GPU: the hardware cast rounds identically (tested) and is 22% faster
    tma = TMA_MODES[use_tma]
    if interp:
        round_p = True  # the interpreter's fp8 cast mis-rounds: explicit rounding is required
        num_stages = 1
        warp_specialize = False
        tma = min(tma, 1)
    assert S_pad % block_m == 0 and S_pad % block_n == 0
    if flush not in ("triton", "fma"):
        raise ValueError(f"flush must be 'triton' or 'fma', got {flush!r}")
    pv_fma = flush == "fma"
    if pv_fma and max(D, block_n) > max_imprecise:
        raise ValueError(f"flush='fma' flushes after head_dim={D} / block_n={block_n} FP8 terms, "
                         f"more than max_imprecise={max_imprecise}; use flush='triton'")
    if lazy_tau > 8:
        raise ValueError("lazy_tau > 8 lets P exceed 256 (E4M3 saturates at 448)")
    if out is None:
        dt = torch.float32 if out_f32 else out_dtype
        out = torch.empty((B, S, H, D), dtype=dt, device=qkv.q8.device)
    lse = torch.empty((B, H, S), dtype=torch.float32, device=out.device) if return_lse else None
    qd = kd = vd = None
    if tma == 1:
        from triton.tools.tensor_descriptor import TensorDescriptor

        qd = TensorDescriptor.from_tensor(qkv.q8.view(B * H * S_pad, D), [block_m, D])
        kd = TensorDescriptor.from_tensor(qkv.k8.view(B * Hkv * S_pad, D), [block_n, D])
        vd = TensorDescriptor.from_tensor(qkv.v8t.view(B * Hkv * D, S_pad), [D, block_n])
    elif tma == 2:
        _ensure_allocator()
    extra = {"maxnreg": maxnreg} if maxnreg else {}
    grid = (triton.cdiv(S, block_m), B * H)
    _fp8_attn_fwd_kernel[grid](
        qkv.q8, qkv.q_scale, qkv.k8, qkv.k_scale, qkv.v8t, qkv.v_scale, qkv.v_corr, out,
        lse if lse is not None else out,
        qd, kd, vd,
        S, S_pad, H, H // Hkv, row_start, scale * LOG2E, B * Hkv * S_pad,
        out.stride(0), out.stride(1), out.stride(2),
        HEAD_D=D, BLOCK_M=block_m, BLOCK_N=block_n, SCALE_BLOCK=64, ROUND_P=round_p,
        IMP_QK=-1 if pv_fma else min(max_imprecise, D), IMP_PV=min(max_imprecise, block_n),
        WRITE_LSE=return_lse, OUT_F32=out_f32, USE_TMA=tma, LAZY_TAU=float(lazy_tau),
        WARP_SPEC=bool(warp_specialize), PV_FMA=pv_fma, SK_FOLD=bool(sk_fold),
        PERM_P=bool(qkv.v_perm),
        INTERPRET=interp, num_warps=num_warps, num_stages=num_stages, **extra,
    )
    return out, lse


def default_scale(d: int) -> float:
    return 1.0 / math.sqrt(d)

"""Fused centering + E4M3 quantization of Q, K and V, and the V-bias correction vector.

Torch twin (``workbench.attention.reference.recipe_attention`` with ``quant.token_scales``,
``quant.quantize_channels``)::

    kc = k.float() - mu_k[:, None]                      # mu_k = 0 when K is not smoothed
    s_k = token_scales(kc, "fp8_e4m3", "block", 64)     # [B, ceil(S/64), H] = absmax/448
    k8 = round_to_e4m3(kc / s_k)                        # same for Q without centering
    vc = v.float() - mu_v[:, None]
    s_v = channel_scales(vc)                            # [B, H, D]
    v8 = round_to_e4m3(vc / s_v)
    v_corr = mu_v - mean_t(v8 * s_v)                    # V-bias correction (or mu_v, or 0)

Rounding: on the GPU the hardware cast (cvt.rn.satfinite.e4m3x2.f32: round to nearest even,
saturating at 448); H200, 2026-11-30: the same values as the explicit rounding for all 700M Q/K/V
codes at the H3 shape (only the sign of 2,783 zeros differs, which dequantize alike). The
interpreter's cast mis-rounds, so there ``e4m3.round_to_e4m3`` (explicit bit arithmetic) rounds
first and the cast is then exact. Tiling: ``config.QuantConfig``.

Output layouts, chosen for the attention kernel (``attention_fp8``):
- Q8, K8: [B, H, S_pad, D] float8_e4m3fn, head-major so one head's tokens are contiguous rows of
  D bytes (a plain 2-D [B*H*S_pad, D] view for loads or a TMA descriptor); scales [B, H, S_pad/64].
- V8t: [B, Hkv, D, S_pad], V TRANSPOSED: Hopper's FP8 wgmma needs both operands K-major, and for
  P @ V the reduction runs over tokens, so tokens must be contiguous. With ``QuantConfig.v_perm``
  the tokens of each 32-token group are stored in the order in which the attention kernel's P
  registers hold them (``v_token_order``; ``v8t_in_token_order`` undoes it), so P @ V needs no
  shuffles.
- S_pad = S rounded up to ``SEQ_PAD`` (256); pad tokens are written as exact zeros (scale 1) by the
  same kernels, so the attention kernel's main loop needs no masks on loads.

The correction needs mean_t of dequant(V') = s_v * mean_t(codes). ``_v_corr_kernel`` sums the
stored codes of V^T (token-contiguous rows, FP8: a quarter of V's bf16 bytes) in a fixed order
(deterministic). Summing inside the V pass instead made triton compute every V tile twice (once in
the load layout for the sum, once in the store layout): twice the divisions of the pass.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
import triton
import triton.language as tl

from triton.language.extra.cuda import libdevice

from .config import DEFAULT, QuantConfig
from .e4m3 import interpreting, round_to_e4m3

SEQ_PAD = 256
QK_BLOCK = 64  # tokens per Q/K scale (the recipe's qk_block)
# fl32(1/448) = what torch's CUDA `amax / 448.0` multiplies by (see block_quant)
INV_448: tl.constexpr = tl.constexpr(float(np.float32(1.0) / np.float32(448.0)))
# divisors from which ``div_exact`` is used (1 / d would overflow past 2^-128); below it Q/K
# tiles divide with div_rn, V channels scale numerator and divisor by DIV_RESCALE (exact)
DIV_EXACT_MIN: tl.constexpr = tl.constexpr(2.0**-64)
DIV_RESCALE: tl.constexpr = tl.constexpr(2.0**100)


@dataclass(frozen=True)
class QuantizedQKV:
    """The FP8 operands and their scales (see the module docstring for layouts)."""

    q8: torch.Tensor  # [B, H, S_pad, D] float8_e4m3fn
    q_scale: torch.Tensor  # [B, H, S_pad // 64] float32
    k8: torch.Tensor  # [B, Hkv, S_pad, D]
    k_scale: torch.Tensor  # [B, Hkv, S_pad // 64]
    v8t: torch.Tensor  # [B, Hkv, D, S_pad]
    v_scale: torch.Tensor  # [B, Hkv, D]
    v_corr: torch.Tensor  # [B, Hkv, D] float32, added to the FP32 output of the quantized rows
    seq_len: int
    v_perm: bool = False  # v8t's tokens in the P-operand order of each 32-token group


def padded_len(s: int) -> int:
    return triton.cdiv(s, SEQ_PAD) * SEQ_PAD


@triton.jit
def head_and_block_ids(HEADS_FIRST: tl.constexpr):
    """(batch * head, token block) of this program. HEADS_FIRST: grid (B * H, blocks), so the
    programs launched together take the heads of one token block; else grid (blocks, B * H)."""
    if HEADS_FIRST:
        return tl.program_id(0), tl.program_id(1)
    else:
        return tl.program_id(1), tl.program_id(0)


@triton.jit
def _quant_tokens_kernel(
    X, MU, OUT8, SCALE, XSUM,
    S, S_pad, H, HMU_GROUP, NB,
    stride_xb, stride_xs, stride_xh,
    HEAD_D: tl.constexpr, BLOCK: tl.constexpr, CENTER: tl.constexpr, SCALE_RECIP: tl.constexpr,
    HW_ROUND: tl.constexpr, HEADS_FIRST: tl.constexpr, SUMS: tl.constexpr,
):
    """One program = one (batch, head, 64-token block): center, absmax, scale, round, store.
    SUMS: also the block's FP32 channel sums of the raw x, at row bh * NB + blk of XSUM [B * H,
    NB, HEAD_D] (blocks past NB, all padding, store none): a sparse call's Q block sums from the
    read that quantizes Q (``routing.block_sums(..., q_codes=...)``)."""
    bh, blk = head_and_block_ids(HEADS_FIRST)
    b = bh // H
    h = bh % H
    t = blk * BLOCK + tl.arange(0, BLOCK)
    d = tl.arange(0, HEAD_D)
    ok = (t < S)[:, None]
    x = tl.load(X + b * stride_xb + h * stride_xh + t[:, None] * stride_xs + d[None, :],
                mask=ok, other=0.0).to(tl.float32)
    if SUMS:
        tl.store(XSUM + (bh * NB + blk) * HEAD_D + d, tl.sum(x, axis=0),
                 mask=(blk < NB) & (d < HEAD_D))
    if CENTER:
        mu = tl.load(MU + (b * (H // HMU_GROUP) + h // HMU_GROUP) * HEAD_D + d)
        x = tl.where(ok, x - mu[None, :], 0.0)
    q8, scale = block_quant(x, SCALE_RECIP, HW_ROUND)
    tl.store(OUT8 + (bh * S_pad + t[:, None]) * HEAD_D + d[None, :], q8)
    tl.store(SCALE + bh * (S_pad // BLOCK) + blk, scale)


@triton.jit
def block_quant(x, SCALE_RECIP: tl.constexpr, HW_ROUND: tl.constexpr):
    """One scale for the whole float32 tile x: (E4M3 codes of x / scale, scale = absmax / 448).

    The scale is computed exactly as the twin's torch ``amax / 448.0`` is on the same device:
    torch's CUDA division by a Python scalar multiplies by the FP32 reciprocal (fl(1/448), not a
    division: up to 1 ulp different, and then every dequantized value of the block differs), while
    torch on the CPU divides. SCALE_RECIP = True on the GPU, False in the interpreter (whose twin
    runs on the CPU). x / scale is an IEEE division (div_rn) on both, as torch's tensor-by-tensor
    division; Triton's plain fp32 `/` would be approximate on the GPU. On the GPU (HW_ROUND) the
    quotient is ``div_exact`` of one reciprocal per tile (scale >= 2^-64): the same bits,
    fewer instructions."""
    amax = tl.max(tl.max(tl.abs(x), axis=1), axis=0)
    scale = tl.where(amax > 0, over_448(amax, SCALE_RECIP), 1.0)
    if HW_ROUND:
        if scale >= DIV_EXACT_MIN:
            rcp = libdevice.div_rn(tl.full(scale.shape, 1.0, tl.float32), scale)
            y = div_exact(x, tl.broadcast_to(scale, x.shape), tl.broadcast_to(rcp, x.shape))
        else:
            y = tl.math.div_rn(x, tl.broadcast_to(scale, x.shape))
    else:
        y = tl.math.div_rn(x, tl.broadcast_to(scale, x.shape))
    _, q8 = _to_e4m3(y, HW_ROUND)
    return q8, scale


@triton.jit
def over_448(amax, SCALE_RECIP: tl.constexpr):
    """amax / 448 rounded as torch's ``amax / 448.0`` on the same device (``block_quant`` says
    why): times fl(1/448) with SCALE_RECIP (the GPU), an IEEE division without (the CPU)."""
    if SCALE_RECIP:
        return amax * INV_448
    else:
        return tl.math.div_rn(amax, tl.full(amax.shape, 448.0, tl.float32))


@triton.jit
def summary_tile_rows(KC8, VC8T, bh, j, d, kc, vc_src, src, NK, NK_PAD, skc, sv, LAST_SCALE,
                      HEAD_D: tl.constexpr, HW_ROUND: tl.constexpr):
    """Rows j [ROWS] of Sol's summary tiles for K/V head bh: kc8 rows E4M3(kc / skc) and vc8^T
    columns E4M3(vc / sv) of blocks src (``_v_src_token(j)``; the last block's vc, NK - 1,
    times LAST_SCALE first); kc, vc_src [ROWS, HEAD_D] FP32 (zeros past NK), sv [HEAD_D] = 256
    s_v. Stores at j < NK_PAD of KC8 [.., NK_PAD, D] and VC8T [.., D, NK_PAD]."""
    ok = (j < NK_PAD)[:, None]
    _, k8 = _to_e4m3(tl.math.div_rn(kc, tl.broadcast_to(skc, kc.shape)), HW_ROUND)
    tl.store(KC8 + (bh * NK_PAD + j)[:, None] * HEAD_D + d[None, :], k8, mask=ok)
    y = tl.where((src == NK - 1)[:, None], vc_src * LAST_SCALE, vc_src)
    _, v8 = _to_e4m3(tl.math.div_rn(y, tl.broadcast_to(sv[None, :], y.shape)), HW_ROUND)
    tl.store(VC8T + (bh * HEAD_D + d[None, :]) * NK_PAD + j[:, None], v8, mask=ok)


@triton.jit
def div_exact(x, d, rcp):
    """x / d rounded to nearest, bitwise div_rn's, given rcp = RN(1 / d) (GPU only; d >=
    ``DIV_EXACT_MIN``, the callers fall back to div_rn below it). q0 = RN(x rcp) is within about
    1.5 ulp of x / d; one correction q1 = RN(q0 + (x - q0 d) rcp) brings it within an ulp
    (faithful), so r1 = x - q1 d is exact by FMA and RN(q1 + r1 rcp) is the correctly rounded
    quotient (Markstein's theorem: rcp within half an ulp of 1 / d and q1 faithful). Range: the
    quantizer's |x / d| <= 448 cannot overflow; with d >= 2^-64 a remainder could only lose
    bits (underflow) for quotients below 2^-34, far under E4M3's smallest step (2^-9), which
    round to the same code 0. Five FP32 operations per value instead of div_rn's reciprocal
    approximation, Newton steps and range check with its slow-path branch (BENCHMARKS.md,
    Quantization)."""
    q0 = libdevice.mul_rn(x, rcp)
    q1 = libdevice.fma_rn(libdevice.fma_rn(-q0, d, x), rcp, q0)
    return libdevice.fma_rn(libdevice.fma_rn(-q1, d, x), rcp, q1)


@triton.jit
def _to_e4m3(y, HW_ROUND: tl.constexpr):
    """float32 -> (float32 on the E4M3 grid, float8e4nv codes). HW_ROUND: the hardware cast
    (cvt.rn.satfinite: RNE with saturation, GPU only); else explicit rounding, then the cast."""
    if HW_ROUND:
        q8 = y.to(tl.float8e4nv)
        return q8.to(tl.float32), q8
    else:
        q = round_to_e4m3(y)
        return q, q.to(tl.float8e4nv)


@triton.jit
def _quant_v_kernel(
    V, MU, VSCALE, VRCP, OUT8T,
    S, S_pad, HKV,
    stride_vb, stride_vs, stride_vh,
    HEAD_D: tl.constexpr, ROWS: tl.constexpr, CENTER: tl.constexpr, HW_ROUND: tl.constexpr,
    HEADS_FIRST: tl.constexpr, PERM: tl.constexpr,
):
    """One program = one (batch, head, ROWS-token tile): center, round with channel scales,
    store transposed (PERM: column j holds token _v_src_token(j)). The loaded 16-bit tile is
    transposed (2-byte granules through shared memory, not the 1-byte codes) and quantized in the
    [D, ROWS] layout of the store. No per-channel sum here: with one, triton computes the whole
    tile twice, once per layout; the correction sums the stored codes instead (_v_corr_kernel).
    VRCP: RN(1 / scale) per channel (torch's reciprocal; of scale * DIV_RESCALE for a scale
    below DIV_EXACT_MIN), for ``div_exact`` on the GPU."""
    bh, c = head_and_block_ids(HEADS_FIRST)
    b = bh // HKV
    h = bh % HKV
    d = tl.arange(0, HEAD_D)
    s = tl.load(VSCALE + bh * HEAD_D + d)
    mu = tl.zeros([HEAD_D], tl.float32)
    if CENTER:
        mu = tl.load(MU + bh * HEAD_D + d)
    t = c * ROWS + tl.arange(0, ROWS)
    src = _v_src_token(t, PERM)  # rows are loaded in the stored order: the store stays dense
    ok = (src < S)[None, :]
    xr = tl.load(V + b * stride_vb + h * stride_vh + src[:, None] * stride_vs + d[None, :],
                 mask=(src < S)[:, None], other=0.0)
    x = tl.where(ok, tl.trans(xr).to(tl.float32) - mu[:, None], 0.0)
    if HW_ROUND:
        # a channel scale below DIV_EXACT_MIN: numerator and divisor times DIV_RESCALE (exact),
        # the same quotient from a divisor div_exact takes (VRCP is that divisor's reciprocal)
        f = tl.where(s < DIV_EXACT_MIN, DIV_RESCALE, 1.0)
        rcp = tl.load(VRCP + bh * HEAD_D + d)
        y = div_exact(x * tl.broadcast_to(f[:, None], x.shape),
                      tl.broadcast_to((s * f)[:, None], x.shape),
                      tl.broadcast_to(rcp[:, None], x.shape))
    else:
        y = tl.math.div_rn(x, tl.broadcast_to(s[:, None], x.shape))
    _, q8 = _to_e4m3(y, HW_ROUND)
    tl.store(OUT8T + (bh * HEAD_D + d[:, None]) * S_pad + t[None, :], q8)


@triton.jit
def _v_src_token(t, PERM: tl.constexpr):
    """The token stored at column t of V^T. PERM: within each 32-token group, column bits
    (k4, k3, k2, k1, k0) hold the token with bits (k4, k1, k3, k2, k0): the key order in which
    a thread's wgmma accumulator registers hold the FP8 A operand of P @ V (see
    attention_fp8._p_operand), so P needs no register shuffles."""
    if PERM:
        k = t & 31
        return ((t - k) + (k & 16) + ((k & 2) << 2) + ((k & 8) >> 1) + ((k & 4) >> 1)
                + (k & 1))
    else:
        return t


@triton.jit
def _code_sum_step(rows, t0, acc):
    return acc + tl.load(rows + t0).to(tl.float32)


@triton.jit
def _v_corr_kernel(
    V8T, MU, VSCALE, CORR, S_pad, s_len,
    HEAD_D: tl.constexpr, ROWS_D: tl.constexpr, BLOCK_T: tl.constexpr, MODE: tl.constexpr,
    INTERPRET: tl.constexpr,
):
    """MODE 0: corr = 0; 1: corr = mu_v; 2: corr = mu_v - s_v * mean_t(q_v), the mean taken over
    the stored codes of V8T (pad tokens are zeros), in a fixed order (deterministic).
    Grid (B * Hkv, HEAD_D // ROWS_D): each program sums ROWS_D token-contiguous rows of V^T."""
    bh = tl.program_id(0)
    d = tl.program_id(1) * ROWS_D + tl.arange(0, ROWS_D)
    corr = tl.zeros([ROWS_D], tl.float32)
    if MODE >= 1:
        corr = tl.load(MU + bh * HEAD_D + d)
    if MODE == 2:
        acc = tl.zeros([ROWS_D, BLOCK_T], tl.float32)
        rows = V8T + (bh * HEAD_D + d)[:, None] * S_pad + tl.arange(0, BLOCK_T)[None, :]
        n_steps = S_pad // BLOCK_T
        if INTERPRET:  # see kv_stats: run-time `for` bounds fail in the 3.6 interpreter
            i = 0
            while i < n_steps:
                acc = _code_sum_step(rows, i * BLOCK_T, acc)
                i += 1
        else:
            for i in range(n_steps):
                acc = _code_sum_step(rows, i * BLOCK_T, acc)
        s = tl.load(VSCALE + bh * HEAD_D + d)
        corr = corr - s * tl.math.div_rn(tl.sum(acc, axis=1), tl.full([ROWS_D], s_len, tl.float32))
    tl.store(CORR + bh * HEAD_D + d, corr)


def quantize_qkv(q, k, v, mu_k, mu_v, v_amax, *, smooth_k: bool, smooth_v: bool,
                 v_bias_correction: bool, config: QuantConfig = DEFAULT.quant,
                 q_codes: tuple[torch.Tensor, torch.Tensor] | None = None,
                 v_scales: tuple[torch.Tensor, torch.Tensor] | None = None) -> QuantizedQKV:
    """q [B, S, H, D], k/v [B, S, Hkv, D]; mu_k/mu_v/v_amax [B, Hkv, D] from ``kv_stats``.
    q_codes: Q's (codes, scales) already made by ``quantize_tokens`` (a sparse call's block-sum
    pass makes them in the read that sums Q's blocks): Q is not read again. v_scales: V's
    channel scales and reciprocals already made from v_amax (a Sol call's routing front)."""
    if q_codes is not None:
        q8, q_scale = q_codes
        B, S, H, D = q.shape
        want = (B, H, padded_len(S), D)
        want_s = (B, H, padded_len(S) // QK_BLOCK)
        if tuple(q8.shape) != want or q8.dtype != torch.float8_e4m3fn \
                or tuple(q_scale.shape) != want_s or q_scale.dtype != torch.float32:
            raise ValueError(f"q_codes: codes {tuple(q8.shape)} {q8.dtype} / scales "
                             f"{tuple(q_scale.shape)} {q_scale.dtype} do not fit q "
                             f"{tuple(q.shape)} (want {want} float8_e4m3fn / {want_s} "
                             "float32)")
    else:
        q8, q_scale = quantize_tokens(q, config=config)
    k8, k_scale = quantize_tokens(k, mu_k if smooth_k else None, config=config)
    v8t, v_scale = quantize_v(v, mu_v if smooth_v else None, v_amax, config=config,
                              scales=v_scales)
    mode = 2 if v_bias_correction else (1 if smooth_v else 0)
    v_corr = v_correction(v8t, v_scale, mu_v, q.shape[1], mode, config=config)
    return QuantizedQKV(q8, q_scale, k8, k_scale, v8t, v_scale, v_corr, q.shape[1],
                        config.v_perm)


def bf16_operands(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> QuantizedQKV:
    """The BF16 operands of the sparse recipes' BF16 baselines (``vsa_bf16``,
    ``bf16:sparsity=sol``) in the FP8 operands' layouts, unquantized: q / k [B, H(kv), S_pad, D]
    and V^T [B, Hkv, D, S_pad] in token order, zeros past S; unit scales and no correction, so
    the attention kernel's scale folds and epilogue leave the values alone. q, k, v [B, S, H(kv),
    D] bfloat16. One torch copy of each operand (no statistics pass, no quantizer)."""
    B, S, H, D = q.shape
    Hkv = k.shape[2]
    S_pad = padded_len(S)
    dev = q.device

    def padded(x):
        out = torch.zeros((B, x.shape[2], S_pad, D), dtype=torch.bfloat16, device=dev)
        out[:, :, :S] = x.transpose(1, 2)
        return out

    vt = torch.zeros((B, Hkv, D, S_pad), dtype=torch.bfloat16, device=dev)
    vt[..., :S] = v.permute(0, 2, 3, 1)
    ones = torch.ones((B, H, S_pad // QK_BLOCK), dtype=torch.float32, device=dev)
    return QuantizedQKV(padded(q), ones, padded(k), ones[:, :Hkv].contiguous(), vt,
                        torch.ones((B, Hkv, D), dtype=torch.float32, device=dev),
                        torch.zeros((B, Hkv, D), dtype=torch.float32, device=dev), S, False)


def v_token_order(s_pad: int, perm: bool) -> torch.Tensor:
    """[s_pad] int64: the token held by each column of V^T (``_v_src_token`` in torch)."""
    t = torch.arange(s_pad)
    if not perm:
        return t
    k = t & 31
    return (t - k) + (k & 16) + ((k & 2) << 2) + ((k & 8) >> 1) + ((k & 4) >> 1) + (k & 1)


def v8t_in_token_order(qkv: QuantizedQKV) -> torch.Tensor:
    """qkv.v8t [B, Hkv, D, S_pad] with its columns put back in token order (a copy)."""
    order = v_token_order(qkv.v8t.shape[-1], qkv.v_perm).to(qkv.v8t.device)
    out = torch.empty_like(qkv.v8t)
    out[..., order] = qkv.v8t
    return out


def quantize_tokens(x: torch.Tensor, mu: torch.Tensor | None = None, *,
                    config: QuantConfig = DEFAULT.quant, sums: torch.Tensor | None = None):
    """x [B, S, H, D] (centred by mu [B, H, D] when given) -> (codes [B, H, S_pad, D] E4M3,
    scales [B, H, S_pad / 64] float32), one scale per 64-token block and head. sums: a
    [B, H, ceil(S / 64), D] float32 tensor that receives the raw x's 64-token block sums (the
    same read)."""
    B, S, H, D = x.shape
    S_pad = padded_len(S)
    nb = S_pad // QK_BLOCK
    n_real = triton.cdiv(S, QK_BLOCK)
    if sums is not None and (tuple(sums.shape) != (B, H, n_real, D)
                             or sums.dtype != torch.float32 or not sums.is_contiguous()):
        raise ValueError(f"sums: {tuple(sums.shape)} {sums.dtype} (contiguous "
                         f"{sums.is_contiguous()}); want contiguous ({B}, {H}, {n_real}, {D}) "
                         "float32")
    interp = interpreting()
    x8 = torch.empty((B, H, S_pad, D), dtype=torch.float8_e4m3fn, device=x.device)
    scale = torch.empty((B, H, nb), dtype=torch.float32, device=x.device)
    hf = config.heads_first
    _quant_tokens_kernel[(B * H, nb) if hf else (nb, B * H)](
        x, x if mu is None else mu, x8, scale, scale if sums is None else sums, S, S_pad, H, 1,
        n_real, x.stride(0), x.stride(1), x.stride(2),
        HEAD_D=D, BLOCK=QK_BLOCK, CENTER=mu is not None, SCALE_RECIP=not interp,
        HW_ROUND=not interp, HEADS_FIRST=hf, SUMS=sums is not None,
        num_warps=config.qk_warps if sums is None else config.q_sums_warps,
    )
    return x8, scale


def v_channel_scales(v_amax: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(scales, reciprocals) [B, Hkv, D] of V's channels from their absmax: absmax / 448 (1
    where 0) and RN(1 / s) (torch's CUDA reciprocal divides exactly), of s * DIV_RESCALE where
    s < DIV_EXACT_MIN: what ``_quant_v_kernel``'s div_exact divides by. Eight small launches;
    a sparse Sol call has its routing front make them (``routing.sol_front``)."""
    v_scale = torch.where(v_amax > 0, v_amax / 448.0, torch.ones_like(v_amax))
    small = v_scale < DIV_EXACT_MIN.value
    return v_scale, torch.reciprocal(torch.where(small, v_scale * DIV_RESCALE.value, v_scale))


def quantize_v(v: torch.Tensor, mu_v: torch.Tensor | None, v_amax: torch.Tensor, *,
               config: QuantConfig = DEFAULT.quant,
               scales: tuple[torch.Tensor, torch.Tensor] | None = None):
    """v [B, S, Hkv, D] (centred by mu_v when given; v_amax = max_t |v - mu_v|, [B, Hkv, D]) ->
    (codes V^T [B, Hkv, D, S_pad] E4M3, channel scales [B, Hkv, D] float32). scales: the
    channel scales and reciprocals already made from v_amax (``v_channel_scales``' values)."""
    B, S, Hkv, D = v.shape
    S_pad = padded_len(S)
    interp = interpreting()
    v8t = torch.empty((B, Hkv, D, S_pad), dtype=torch.float8_e4m3fn, device=v.device)
    if scales is not None:
        for name, t in zip(("scales", "reciprocals"), scales):
            if t.shape != v_amax.shape or t.dtype != torch.float32 or not t.is_contiguous():
                raise ValueError(f"scales: the {name} are {tuple(t.shape)} {t.dtype}; want "
                                 f"contiguous {tuple(v_amax.shape)} float32")
        v_scale, v_rcp = scales
    else:
        v_scale, v_rcp = v_channel_scales(v_amax)
    n_tiles = S_pad // config.v_rows  # v_rows divides SEQ_PAD (QuantConfig checks)
    hf = config.heads_first
    _quant_v_kernel[(B * Hkv, n_tiles) if hf else (n_tiles, B * Hkv)](
        v, v_scale if mu_v is None else mu_v, v_scale, v_rcp, v8t, S, S_pad, Hkv,
        v.stride(0), v.stride(1), v.stride(2),
        HEAD_D=D, ROWS=config.v_rows, CENTER=mu_v is not None, HW_ROUND=not interp,
        HEADS_FIRST=hf, PERM=config.v_perm, num_warps=config.v_warps,
    )
    return v8t, v_scale


def v_correction(v8t, v_scale, mu_v, seq_len: int, mode: int, *,
                 config: QuantConfig = DEFAULT.quant) -> torch.Tensor:
    """The vector added to the quantized rows' FP32 output, [B, Hkv, D] float32: mode 0 = zeros,
    1 = mu_v (smoothing only), 2 = mu_v - s_v * mean_t(codes) (the V-bias correction)."""
    B, Hkv, D, S_pad = v8t.shape
    v_corr = torch.empty((B, Hkv, D), dtype=torch.float32, device=v8t.device)
    rows_d = min(config.corr_rows, D)
    block_t = math.gcd(config.corr_block_t, S_pad)  # a divisor of S_pad (a multiple of SEQ_PAD)
    _v_corr_kernel[(B * Hkv, D // rows_d)](
        v8t, mu_v, v_scale, v_corr, S_pad, float(seq_len),
        HEAD_D=D, ROWS_D=rows_d, BLOCK_T=block_t, MODE=mode, INTERPRET=interpreting(),
        num_warps=4,
    )
    return v_corr

"""Block routing for the sparse recipes on the GPU: Sol (exact / summary routes) and VSA (top-k).

Torch twins: ``workbench.attention.sparsity.sol_block_map`` and ``vsa_block_map`` (what
``recipe_attention`` routes with). The decisions are the twin's up to float rounding: a pair whose
coarse score lies within rounding of its threshold (Sol's theta_i, VSA's k-th largest score) may be
decided the other way, because the block sums are added in another order.

Which part runs where:
- Triton (``_block_sums_kernel``, memory-bound, one read of Q, K and V): per (batch, head,
  ``block``-token block) the FP32 sums of Q, K and V, and optionally V's per-block channel max and
  min; a program takes one block of a group of heads of one operand, whole channels per thread,
  so nothing is reduced across threads (a program per head and block, reducing across its
  threads: 0.505 against 0.363 ms at the H3 shape on the H200, code at b82b463). Fixed
  summation order, no atomics: bitwise the same output run to run.
- torch (small dense parts): block means, K/V centring of the block sums, the coarse scores
  [B, H, nq, nk] (nq = nk = 510 at the H3 shape) and Sol's thresholds theta [B, H, nq] (the
  twin's own ``sol_scores``, so the decisions are the twin's given the same sums). A sparse Sol
  call (``RoutingConfig.sol_front="triton"``, the default: ``sol_routing_fused``) makes all of
  it but the scores' matmul in two launches (``_sol_stats_kernel``: the statistics once per
  K/V head and channel group; ``_sol_rows_kernel``: the rows, with V's channel scales and the
  summary tiles' E4M3 operands, which the quantizer and the list kernel then take) and has the
  list pass take the exact threshold
  from each row of scores (their mean + tau x their standard deviation, which
  ``sol_threshold``'s covariance form equals): the same decisions up to rounding ties.
- Triton (``_lists_kernel``, one pass, ``RoutingConfig.list_rows`` list rows (b, h, i) per
  program):
  Sol's decisions (score > theta, the diagonal band, the sink: bitwise ``sol_exact``) or VSA's
  top-k (the keep-th largest score of the row by a bitwise descent over its order-preserving
  integer keys: ``vsa_select`` up to ties at that score), and their compaction into the
  per-query-block lists (one cumsum over the power-of-two padded row and a scattered store:
  bitwise ``compact_blocks``, the torch twin kept for tests). At the H3 shape on an H200 the
  torch part took 1.13 ms for Sol and 1.59 ms for VSA (torch.topk and a dozen ops over
  [B, H, nq, nk]); with the list pass Sol's takes 0.48 ms and VSA's 0.39 ms (2026-12-01).

K centring costs no second read: mean_t(K - mu_K) over a block = mean_t(K) - mu_K, and the block
sums of V - mu_V are sum_t(V) - len * mu_V. mu_K and mu_V themselves (and V's centred absmax) follow
from the same sums and per-block max/min (``BlockSums.kv_moments``), so a sparse call can skip the
separate statistics pass.

Output layout (``BlockRouting``), read by an attention kernel without a second pass:
- ``blocks`` [B, H, nq, nk] int32: per query block a permutation of the key blocks, the exact ones
  first in ascending order, then the summary (not exact) ones in ascending order;
- ``counts`` [B, H, nq] int32: how many of them are exact (the list length);
- Sol's summary route: ``kc`` [B, Hkv, nk, D] FP32 block means of the (smoothed) K, ``vc``
  [B, Hkv, nk, D] FP32 block sums of the (smoothed) V, ``lens`` [nk] block lengths, and ``exact``
  [B, H, nq, nk] bool (the complement list is ``blocks[..., counts:]``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from workbench.attention.layout import InputError, SegmentLayout, check_qkv
from workbench.attention.sparsity import (
    LOG2E,
    prefix_query_blocks,
    sol_exact,
    sol_scores,
    sol_threshold,
    vsa_keep_count,
)
from workbench.recipes import AttentionRecipe, get_recipe

from .config import DEFAULT, QuantConfig, RoutingConfig
from .e4m3 import interpreting
from .quantize import (
    DIV_EXACT_MIN,
    DIV_RESCALE,
    QK_BLOCK,
    _v_src_token,
    over_448,
    quantize_tokens,
    summary_tile_rows,
)




@triton.jit
def _head_group_sums(X, OUT, OMAX, OMIN, base, stride_s, stride_h, n_heads, g, blk, S, n_blocks,
                     out_head0, HEAD_D: tl.constexpr, BLOCK: tl.constexpr, HG: tl.constexpr,
                     ROWS: tl.constexpr, MINMAX: tl.constexpr):
    """Sums (and max / min) over one BLOCK-token block of heads g * HG .. g * HG + HG - 1 of X,
    per channel: [ROWS, HG * HEAD_D] sub-tiles (the heads' channels side by side, one column
    per channel), laid out with whole columns in a thread, so each thread adds its own channels
    over the rows (no reduction across threads, no barrier). Stored at rows
    (out_head0 + head) * n_blocks + blk of OUT [.., n_blocks, HEAD_D]."""
    r = tl.arange(0, ROWS)
    c = tl.arange(0, HG * HEAD_D)
    hh = g * HG + c // HEAD_D
    d = c % HEAD_D
    c_ok = hh < n_heads
    col = hh * stride_h + d
    acc = tl.zeros([HG * HEAD_D], tl.float32)
    hi = tl.full([HG * HEAD_D], float("-inf"), tl.float32)
    lo = tl.full([HG * HEAD_D], float("inf"), tl.float32)
    for i in tl.static_range(BLOCK // ROWS):
        t = blk * BLOCK + i * ROWS + r
        ok = (t < S)[:, None] & c_ok[None, :]
        x = tl.load(X + base + t[:, None] * stride_s + col[None, :], mask=ok, other=0.0)
        x = x.to(tl.float32)
        acc += tl.sum(x, axis=0)
        if MINMAX:
            hi = tl.maximum(hi, tl.max(tl.where(ok, x, float("-inf")), axis=0))
            lo = tl.minimum(lo, tl.min(tl.where(ok, x, float("inf")), axis=0))
    o = ((out_head0 + hh) * n_blocks + blk) * HEAD_D + d
    tl.store(OUT + o, acc, mask=c_ok)
    if MINMAX:
        tl.store(OMAX + o, hi, mask=c_ok)
        tl.store(OMIN + o, lo, mask=c_ok)


@triton.jit
def _block_sums_kernel(
    Q, K, V, QS, KS, VS, VMAX, VMIN, LENS,
    S, H, HKV, n_blocks, n_groups_q, n_groups_kv, w0,
    stride_qb, stride_qs, stride_qh,
    stride_kb, stride_ks, stride_kh,
    stride_vb, stride_vs, stride_vh,
    HEAD_D: tl.constexpr, BLOCK: tl.constexpr, HG: tl.constexpr, ROWS: tl.constexpr,
    MINMAX: tl.constexpr,
):
    """Grid (n_blocks, B * max(n_groups_q, n_groups_kv), 3 - w0): program (blk, b * G + g,
    w - w0) sums block blk of head group g of Q (w = 0), K (1) or V (2, with the extremes);
    w0 = 1 leaves Q out (its sums made where it is quantized). Program (blk, 0, 0) also stores
    the block's length LENS[blk] (FP32)."""
    blk = tl.program_id(0)
    bg = tl.program_id(1)
    if (bg == 0) & (tl.program_id(2) == 0):
        tl.store(LENS + blk, tl.minimum(S - blk * BLOCK, BLOCK).to(tl.float32))
    w = tl.program_id(2) + w0
    n_g = tl.maximum(n_groups_q, n_groups_kv)
    b = bg // n_g
    g = bg % n_g
    if w == 0:
        if g < n_groups_q:
            _head_group_sums(Q, QS, QS, QS, b * stride_qb, stride_qs, stride_qh, H, g, blk, S,
                             n_blocks, b * H, HEAD_D, BLOCK, HG, ROWS, False)
    elif w == 1:
        if g < n_groups_kv:
            _head_group_sums(K, KS, KS, KS, b * stride_kb, stride_ks, stride_kh, HKV, g, blk,
                             S, n_blocks, b * HKV, HEAD_D, BLOCK, HG, ROWS, False)
    else:
        if g < n_groups_kv:
            _head_group_sums(V, VS, VMAX, VMIN, b * stride_vb, stride_vs, stride_vh, HKV, g,
                             blk, S, n_blocks, b * HKV, HEAD_D, BLOCK, HG, ROWS, MINMAX)


@dataclass(frozen=True)
class BlockSums:
    """FP32 per-block sums of one Q/K/V read. nb = ceil(S / block); the last block may be partial.

    qsum [B, H, nb, D]; ksum, vsum [B, Hkv, nb, D] of the raw (unsmoothed) operands; vmax, vmin
    [B, Hkv, nb, D] per-block channel extremes of V (None unless asked); lens [nb] FP32 rows per
    block.
    """

    qsum: torch.Tensor
    ksum: torch.Tensor
    vsum: torch.Tensor
    vmax: torch.Tensor | None
    vmin: torch.Tensor | None
    lens: torch.Tensor
    seq_len: int
    block: int
    q8: torch.Tensor | None = None  # Q's E4M3 codes and scales when made in the same read
    q_scale: torch.Tensor | None = None  # (``block_sums(..., q_codes=...)``)

    @property
    def qbar(self) -> torch.Tensor:
        """[B, H, nb, D] block means of Q (as the twin's ``block_reduce``: sum / length)."""
        return self.qsum / self.lens[:, None]

    def kv_moments(self, *, smooth_k: bool = True, smooth_v: bool = True):
        """(mu_k, mu_v, v_amax), [B, Hkv, D] FP32 each, from the block sums: mu = (sum of block
        sums in block order) / S, v_amax = max_t |V - mu_V| (exact given mu: fl(v - mu) is
        monotone in v, so the block extremes suffice). mu is zeros where not smoothed, as in
        ``kv_stats``. Needs ``block_sums(..., minmax=True)``."""
        if self.vmax is None or self.vmin is None:
            raise ValueError("kv_moments: the block sums were taken without minmax=True")
        n = float(self.seq_len)
        zeros = torch.zeros_like(self.ksum[:, :, 0])
        mu_k = self.ksum.sum(dim=2) / n if smooth_k else zeros
        mu_v = self.vsum.sum(dim=2) / n if smooth_v else zeros
        hi = (self.vmax.amax(dim=2) - mu_v).abs()
        lo = (self.vmin.amin(dim=2) - mu_v).abs()
        return mu_k, mu_v, torch.maximum(hi, lo)


def _check_operands(q, k, v) -> tuple[int, int, int, int, int]:
    B, S, H, Hkv, D = check_qkv(q, k, v, allow_nonfinite=True)
    if k.shape[1] != S:
        raise InputError(f"k: sequence length {k.shape[1]} does not match q's {S} "
                         "(routing is for self-attention)")
    if D & (D - 1) or not 16 <= D <= 256:
        raise InputError(f"q: head dim {D} is not a power of two in [16, 256]")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if t.stride(-1) != 1:
            raise InputError(f"{name}: the last (head) dim must be contiguous")
        if t.device.type != "cuda" and not interpreting():
            raise InputError(f"{name}: on {t.device.type}; the routing kernel needs CUDA (or "
                             "TRITON_INTERPRET=1 on the CPU)")
    return B, S, H, Hkv, D


def block_sums(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, block: int = 64,
               minmax: bool = False, config: RoutingConfig = DEFAULT.routing,
               q_codes: QuantConfig | None = None) -> BlockSums:
    """One read of q [B, S, H, D], k / v [B, S, Hkv, D] -> ``BlockSums`` (see there).
    q_codes: also Q's E4M3 codes and block scales (``quantize.quantize_tokens`` with this
    config, which then sums Q's blocks in the same read: one read of Q per sparse FP8 call
    instead of two; needs block = 64, the codes' scale block)."""
    B, S, H, Hkv, D = _check_operands(q, k, v)
    if block < 1 or block & (block - 1):
        raise ValueError(f"block: {block} is not a power of two")
    if q_codes is not None and block != QK_BLOCK:
        raise ValueError(f"block: {block}; Q's codes in the same read need the {QK_BLOCK}-token "
                         "blocks of their scales")
    rows, warps = min(config.block_rows, block), config.block_warps
    nb = triton.cdiv(S, block)
    f32 = {"dtype": torch.float32, "device": q.device}
    qsum = torch.empty((B, H, nb, D), **f32)
    kv = torch.empty((4 if minmax else 2, B, Hkv, nb, D), **f32)
    lens = torch.empty((nb,), **f32)
    q8 = q_scale = None
    if q_codes is not None:
        q8, q_scale = quantize_tokens(q, config=q_codes, sums=qsum)
    # without minmax the extremes' pointers are the sums' (never written: MINMAX is constexpr)
    strides = (q.stride(0), q.stride(1), q.stride(2), k.stride(0), k.stride(1), k.stride(2),
               v.stride(0), v.stride(1), v.stride(2))
    hg = config.group_heads
    gq, gkv = triton.cdiv(H, hg), triton.cdiv(Hkv, hg)
    w0 = 0 if q_codes is None else 1
    _block_sums_kernel[(nb, B * max(gq, gkv), 3 - w0)](
        q, k, v, qsum, kv[0], kv[1], kv[-2], kv[-1], lens, S, H, Hkv, nb, gq, gkv, w0,
        *strides, HEAD_D=D, BLOCK=block, HG=hg, ROWS=rows, MINMAX=minmax, num_warps=warps,
    )
    vmax, vmin = (kv[2], kv[3]) if minmax else (None, None)
    return BlockSums(qsum, kv[0], kv[1], vmax, vmin, lens, S, block, q8, q_scale)


# -- Sol's routing front: the statistics, then the rows (RoutingConfig.sol_front="triton") --
@triton.jit
def _front_rows(base, r0, r, d, NB, LENS, HEAD_D: tl.constexpr):
    """Rows r0 + r of a [NB, HEAD_D] block-sum matrix at `base` (columns d): (block indices, row
    mask [ROWS, 1], element offsets [ROWS, len(d)], block lengths [ROWS, 1])."""
    j = r0 + r
    off = base + j[:, None] * HEAD_D + d[None, :]
    return j, (j < NB)[:, None], off, tl.load(LENS + j, mask=j < NB, other=1.0)[:, None]


@triton.jit
def _sol_stats_kernel(KS, VS, VMAX, VMIN, LENS, MU_K, MU_V, V_AMAX, KBAR, DVAR, KC_AMAX,
                      V_SCALE, V_RCP, n_seq, NB,
                      HEAD_D: tl.constexpr, CH: tl.constexpr, ROWS: tl.constexpr,
                      SMOOTH_K: tl.constexpr, SMOOTH_V: tl.constexpr, DIAG: tl.constexpr,
                      SCALE_RECIP: tl.constexpr):
    """Program (bh, part) = CH channels of one (batch, kv head) over all NB block rows: mu_K,
    mu_V, V's centred absmax and its channel scales with their reciprocals (``quantize_v``'s:
    absmax / 448 or 1, RN(1 / scale), of scale * DIV_RESCALE below DIV_EXACT_MIN), the mean kbar
    of the centred block means kc = ksum / len - mu_K, max |kc| per channel (from the extremes of
    ksum / len: fl(x - mu) is monotone in x, so these are max |kc| bitwise) and, with DIAG, the
    variance of kc over the blocks. KS, VS, VMAX, VMIN [B * Hkv, NB, D]; outputs [B * Hkv, D]."""
    bh = tl.program_id(0)
    d = tl.program_id(1) * CH + tl.arange(0, CH)
    r = tl.arange(0, ROWS)
    base = bh * NB * HEAD_D
    ks = tl.zeros([CH], tl.float32)
    vs = tl.zeros([CH], tl.float32)
    ka = tl.zeros([CH], tl.float32)  # sum of the block means of K
    khi = tl.full([CH], float("-inf"), tl.float32)
    klo = tl.full([CH], float("inf"), tl.float32)
    hi = tl.full([CH], float("-inf"), tl.float32)
    lo = tl.full([CH], float("inf"), tl.float32)
    r0 = 0
    while r0 < NB:  # `while`: run-time `for` bounds fail in triton 3.6's interpreter
        j, m, off, ln = _front_rows(base, r0, r, d, NB, LENS, HEAD_D)
        kx = tl.load(KS + off, mask=m, other=0.0)
        kb = kx / ln
        ks += tl.sum(kx, axis=0)
        ka += tl.sum(kb, axis=0)
        khi = tl.maximum(khi, tl.max(tl.where(m, kb, float("-inf")), axis=0))
        klo = tl.minimum(klo, tl.min(tl.where(m, kb, float("inf")), axis=0))
        vs += tl.sum(tl.load(VS + off, mask=m, other=0.0), axis=0)
        hi = tl.maximum(hi, tl.max(tl.load(VMAX + off, mask=m, other=float("-inf")), axis=0))
        lo = tl.minimum(lo, tl.min(tl.load(VMIN + off, mask=m, other=float("inf")), axis=0))
        r0 += ROWS
    mu_k = tl.zeros([CH], tl.float32)
    mu_v = tl.zeros([CH], tl.float32)
    if SMOOTH_K:
        mu_k = ks / n_seq
    if SMOOTH_V:
        mu_v = vs / n_seq
    o = bh * HEAD_D + d
    tl.store(MU_K + o, mu_k)
    tl.store(MU_V + o, mu_v)
    v_amax = tl.maximum(tl.abs(hi - mu_v), tl.abs(lo - mu_v))
    tl.store(V_AMAX + o, v_amax)
    v_scale = tl.where(v_amax > 0, over_448(v_amax, SCALE_RECIP), 1.0)
    tl.store(V_SCALE + o, v_scale)
    tl.store(V_RCP + o, tl.math.div_rn(tl.full([CH], 1.0, tl.float32),
                                       tl.where(v_scale < DIV_EXACT_MIN, v_scale * DIV_RESCALE,
                                                v_scale)))
    kbar = ka / NB - mu_k
    tl.store(KBAR + o, kbar)
    tl.store(KC_AMAX + o, tl.maximum(tl.abs(khi - mu_k), tl.abs(klo - mu_k)))
    if DIAG:  # per channel variance of kc over the blocks (a second read of K's sums)
        dvar = tl.zeros([CH], tl.float32)
        r0 = 0
        while r0 < NB:
            j, m, off, ln = _front_rows(base, r0, r, d, NB, LENS, HEAD_D)
            dev = tl.where(m, tl.load(KS + off, mask=m, other=0.0) / ln - mu_k[None, :]
                           - kbar[None, :], 0.0)
            dvar += tl.sum(dev * dev, axis=0)
            r0 += ROWS
        tl.store(DVAR + o, dvar / NB)


@triton.jit
def _sol_rows_kernel(QS, KS, VS, LENS, MU_K, MU_V, KBAR, DVAR, KC_AMAX, V_SCALE, KC, VC, QBAR,
                     THETA, KC8, VC8T, SKC, NB, NB_PAD, GROUP, CHUNK, tau, c, LAST_SCALE,
                     HEAD_D: tl.constexpr, ROWS: tl.constexpr, DIAG: tl.constexpr,
                     TILES: tl.constexpr, PERM: tl.constexpr, SCALE_RECIP: tl.constexpr,
                     HW_ROUND: tl.constexpr):
    """Program (bh, part) = block rows [part * CHUNK, (part + 1) * CHUNK) of one (batch, kv
    head), given ``_sol_stats_kernel``'s vectors: kc = ksum / len - mu_K and vc = vsum - len *
    mu_V [NB, D]; for the GROUP query heads of bh qbar = qsum / len and, with DIAG, Sol's
    diagonal theta [NB] = (qbar . kbar + tau * sqrt(sum_d qbar_d^2 var_d(kc))) * c. TILES: also
    the summary route's E4M3 operands (what ``attention_fp8_ws_lists.summary_tiles`` makes from
    kc / vc, bitwise): skc = max(max |kc| / 448, 1e-30) (stored by part 0), kc8 rows
    E4M3(kc / skc) and vc8^T columns E4M3(vc / (256 s_v)), the last block's vc times
    LAST_SCALE, column j holding block ``_v_src_token(j, PERM)``, zeros from NB to NB_PAD (the
    last part)."""
    bh = tl.program_id(0)
    part = tl.program_id(1)
    d = tl.arange(0, HEAD_D)
    r = tl.arange(0, ROWS)
    base = bh * NB * HEAD_D
    mu_k = tl.load(MU_K + bh * HEAD_D + d)
    mu_v = tl.load(MU_V + bh * HEAD_D + d)
    end = tl.minimum(NB, (part + 1) * CHUNK)
    r0 = part * CHUNK
    stop = end
    if TILES:
        amax = tl.max(tl.load(KC_AMAX + bh * HEAD_D + d), axis=0)
        skc = tl.maximum(over_448(amax, SCALE_RECIP), 1e-30)
        if part == 0:
            tl.store(SKC + bh, skc)
        sv = 256.0 * tl.load(V_SCALE + bh * HEAD_D + d)
        stop = tl.where(end == NB, NB_PAD, end)  # the last part also writes the tiles' padding
    while r0 < stop:  # this part's rows of kc and vc (and of the tiles)
        j, m, off, ln = _front_rows(base, r0, r, d, end, LENS, HEAD_D)
        kc = tl.where(m, tl.load(KS + off, mask=m, other=0.0) / ln - mu_k[None, :], 0.0)
        tl.store(KC + off, kc, mask=m)
        tl.store(VC + off, tl.load(VS + off, mask=m, other=0.0) - ln * mu_v[None, :], mask=m)
        if TILES:
            src = _v_src_token(j, PERM)  # the block whose vc column j of vc8^T holds
            sm = (src < NB)[:, None]
            sln = tl.load(LENS + src, mask=src < NB, other=1.0)[:, None]
            y = tl.load(VS + base + src[:, None] * HEAD_D + d[None, :], mask=sm, other=0.0)
            y = tl.where(sm, y - sln * mu_v[None, :], 0.0)  # vc's expression: the same bits
            # the stores are masked at NB_PAD: with ROWS > 128 the last step passes it
            summary_tile_rows(KC8, VC8T, bh, j, d, kc, y, src, NB, NB_PAD, skc, sv,
                              LAST_SCALE, HEAD_D, HW_ROUND)
        r0 += ROWS
    if DIAG:
        kbar = tl.load(KBAR + bh * HEAD_D + d)
        dvar = tl.load(DVAR + bh * HEAD_D + d)
    g = 0
    while g < GROUP:
        hq = bh * GROUP + g  # the query heads of (batch b, kv head h) are b * H + h * GROUP + g
        qbase = hq * NB * HEAD_D
        r0 = part * CHUNK
        while r0 < end:
            j, m, off, ln = _front_rows(qbase, r0, r, d, end, LENS, HEAD_D)
            qb = tl.load(QS + off, mask=m, other=0.0) / ln
            tl.store(QBAR + off, qb, mask=m)
            if DIAG:
                mu = tl.sum(qb * kbar[None, :], axis=1) * c
                var = tl.sum(qb * qb * dvar[None, :], axis=1)
                theta = mu + tau * (tl.sqrt(tl.maximum(var, 0.0)) * c)
                tl.store(THETA + hq * NB + j, theta, mask=j < end)
            r0 += ROWS
        g += 1


@dataclass(frozen=True)
class SolFront:
    """What Sol's routing front makes from the block sums (``sol_front``). mu_k, mu_v, v_amax
    [B, Hkv, D]; kc, vc [B, Hkv, nb, D]; qbar [B, H, nb, D]; theta [B, H, nb] or None (the exact
    threshold's, which the list pass takes from the scores' rows); v_scale, v_rcp [B, Hkv, D]:
    V's channel scales and their reciprocals as ``quantize.quantize_v`` makes them (which then
    takes them); tiles: the summary route's E4M3 operands (``attention_fp8_ws_lists.
    SummaryTiles``) when asked."""

    mu_k: torch.Tensor
    mu_v: torch.Tensor
    v_amax: torch.Tensor
    kc: torch.Tensor
    vc: torch.Tensor
    qbar: torch.Tensor
    theta: torch.Tensor | None
    v_scale: torch.Tensor
    v_rcp: torch.Tensor
    tiles: object | None = None

    def twin_values(self) -> tuple:
        """(mu_k, mu_v, v_amax, kc, vc, qbar, theta): what the torch ops compute."""
        return (self.mu_k, self.mu_v, self.v_amax, self.kc, self.vc, self.qbar, self.theta)


def sol_front(sums: BlockSums, recipe: AttentionRecipe, scale: float, *,
              rows: int = DEFAULT.routing.front_rows, parts: int = DEFAULT.routing.front_parts,
              tiles: bool = False, v_perm: bool = True,
              channels: int = DEFAULT.routing.front_channels) -> SolFront:
    """Two launches for what ``kv_moments``, ``sol_centred``, ``BlockSums.qbar``, (diagonal
    threshold only) ``sol_threshold``, V's channel scales (``quantize_v``) and, with tiles,
    ``attention_fp8_ws_lists.summary_tiles`` (V^T's columns in P's register order when v_perm,
    as ``QuantConfig.v_perm``) compute from the block sums (those torch ops are its twin; the
    same values up to the order of FP32 additions; the tiles and scales bitwise): a program per
    (K/V head, `channels` channels) for the statistics, then `parts` programs per K/V head for
    the rows.
    theta: the diagonal threshold's; tau infinite: filled with tau; the exact threshold's: None
    (``sol_lists`` takes it from the scores' rows, ``sol_routing_fused``). Needs
    ``block_sums(..., minmax=True)``."""
    if sums.vmax is None or sums.vmin is None:
        raise ValueError("sol_front: the block sums were taken without minmax=True")
    B, H, nb, D = sums.qsum.shape
    Hkv = sums.ksum.shape[1]
    f32 = {"dtype": torch.float32, "device": sums.qsum.device}
    vec = torch.empty((7, B, Hkv, D), **f32)
    mu_k, mu_v, v_amax, kbar, dvar, kc_amax, v_scale = vec.unbind(0)
    v_rcp = torch.empty((B, Hkv, D), **f32)
    kc, vc = torch.empty_like(sums.ksum), torch.empty_like(sums.vsum)
    qbar = torch.empty_like(sums.qsum)
    tau_inf = not math.isfinite(recipe.sol_tau)
    diag = recipe.sol_threshold == "diag" and not tau_inf
    theta = None
    if tau_inf:
        theta = torch.full((B, H, nb), recipe.sol_tau, **f32)
    elif diag:
        theta = torch.empty((B, H, nb), **f32)
    interp = interpreting()
    ch = min(channels, D)
    _sol_stats_kernel[(B * Hkv, D // ch)](
        sums.ksum, sums.vsum, sums.vmax, sums.vmin, sums.lens, mu_k, mu_v, v_amax, kbar, dvar,
        kc_amax, v_scale, v_rcp, float(sums.seq_len), nb,
        HEAD_D=D, CH=ch, ROWS=rows, SMOOTH_K=recipe.smooth_k, SMOOTH_V=recipe.smooth_v,
        DIAG=diag, SCALE_RECIP=not interp,
    )
    summary, last_scale = None, 1.0
    if tiles:
        from .attention_fp8_ws_lists import SummaryTiles, last_block_rows

        nb_pad = triton.cdiv(nb, 128) * 128
        f8 = torch.float8_e4m3fn
        n_last = last_block_rows(sums.seq_len)
        last_scale = 64.0 / n_last
        summary = SummaryTiles(torch.empty((B, Hkv, nb_pad, D), dtype=f8, device=kc.device),
                               torch.empty((B, Hkv, D, nb_pad), dtype=f8, device=kc.device),
                               torch.empty((B * Hkv,), **f32), math.log2(n_last / 64),
                               v_scale, v_perm)
    # parts: programs per K/V head, each a share of the rows (RoutingConfig.front_parts)
    chunk = triton.cdiv(triton.cdiv(nb, parts), rows) * rows
    t8 = (summary.kc8, summary.vc8t, summary.skc) if tiles else (kc, kc, kc)
    _sol_rows_kernel[(B * Hkv, triton.cdiv(nb, chunk))](
        sums.qsum, sums.ksum, sums.vsum, sums.lens, mu_k, mu_v, kbar, dvar, kc_amax, v_scale,
        kc, vc, qbar, theta if diag else qbar, *t8, nb,
        summary.kc8.shape[2] if tiles else nb, H // Hkv, chunk,
        recipe.sol_tau if diag else 0.0, scale * LOG2E,
        last_scale,
        HEAD_D=D, ROWS=rows, DIAG=diag, TILES=tiles, PERM=v_perm, SCALE_RECIP=not interp,
        HW_ROUND=not interp,
    )
    return SolFront(mu_k, mu_v, v_amax, kc, vc, qbar, theta, v_scale, v_rcp, summary)


@dataclass(frozen=True)
class BlockRouting:
    """Per-query-block key-block lists (see the module docstring for the layout).

    blocks [B, H, nq, nk] int32 (exact blocks first, ascending, then the rest ascending);
    counts [B, H, nq] int32; exact [B, H, nq, nk] bool; block: rows per block.
    Sol only: kc [B, Hkv, nk, D] FP32 block means of the smoothed K; vc [B, Hkv, nk, D] FP32 block
    sums of the smoothed V; lens [nk] FP32 block lengths (VSA: kc = vc = None). dense_rows: the
    leading query blocks of every head routed to every key block (``prefix_blocks_exact``), known
    on the host so that the kernel can start their long lists first without reading counts.
    From Sol's front (``sol_routing_fused``): tiles, the summary route's E4M3 operands
    (``attention_fp8_ws_lists.SummaryTiles``) when asked; v_scales, V's channel scales and
    their reciprocals [B, Hkv, D] (``quantize.quantize_v``'s, which then takes them).
    """

    blocks: torch.Tensor
    counts: torch.Tensor
    exact: torch.Tensor
    block: int
    lens: torch.Tensor
    kc: torch.Tensor | None = None
    vc: torch.Tensor | None = None
    dense_rows: int = 0
    tiles: object | None = None
    v_scales: tuple[torch.Tensor, torch.Tensor] | None = None

    def __post_init__(self) -> None:
        if not 0 <= self.dense_rows <= self.exact.shape[-2]:
            raise ValueError(f"BlockRouting.dense_rows: {self.dense_rows} not in [0, "
                             f"{self.exact.shape[-2]}] (query blocks)")

    @property
    def density(self) -> float:
        """Fraction of (query block, key block) pairs computed exactly."""
        return float(self.counts.sum(dtype=torch.float64)) / self.exact.numel()

    @property
    def density_per_head(self) -> torch.Tensor:
        """[H] float64 exact fraction per query head (mean over batch and query blocks)."""
        nk = self.exact.shape[-1]
        return self.counts.double().mean(dim=(0, 2)) / nk

    def exact_lists(self) -> torch.Tensor:
        """[B, H, nq, nk_max] int32 view of the exact lists (entries past ``counts`` belong to the
        summary list)."""
        return self.blocks[..., : int(self.counts.max())]


def compact_blocks(exact: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """exact [..., nk] bool -> (blocks [..., nk] int32: the exact key blocks ascending, then the
    other blocks ascending; counts [...] int32 = number of exact blocks). One cumsum and one
    scatter, no sort."""
    nk = exact.shape[-1]
    cs = exact.cumsum(-1, dtype=torch.int32)  # exact blocks among 0..j
    counts = cs[..., -1]
    j = torch.arange(nk, device=exact.device, dtype=torch.int32)
    pos = torch.where(exact, cs - 1, counts[..., None] + j - cs)
    blocks = torch.empty_like(cs).scatter_(-1, pos.long(), j.expand_as(cs))
    return blocks, counts




@triton.jit
def _lists_kernel(
    SCORES, THETA, MASK, BLOCKS, COUNTS, EXACT,
    R, nq, nk, band, sink_blocks, exact_rows, keep, stride_s, stride_m, tau,
    NK_PAD: tl.constexpr, ROWS: tl.constexpr, MODE: tl.constexpr, EXEMPT: tl.constexpr,
    THETA_ROW: tl.constexpr = False,
):
    """ROWS list rows r = (b * H + h) * nq + i per program. MODE "sol": decide exact = score >
    theta | |i - j| <= band | j < sink_blocks (``sol_exact``); "topk": VSA's ``keep`` largest
    scores (``vsa_select``: with EXEMPT the sink blocks are kept besides and do not compete),
    every score at least the keep-th largest (ties at that value are all kept: torch's top-k
    keeps only some of them); both store the decisions; "mask": read them. THETA_ROW (Sol):
    theta = the row's mean score + tau x their standard deviation instead of THETA (what the
    exact threshold is: mean_j qbar . kc_j and qbar^T cov(kc) qbar, ``sol_threshold``).
    Both decision modes then make every block exact in the first ``exact_rows`` query blocks
    of each head (i = r % nq; the recipe's ``prefix_blocks_exact``). Then the compaction of
    ``compact_blocks``: exact blocks to cs - 1, the others to count + j - cs."""
    r = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    j = tl.arange(0, NK_PAD)
    row_ok = r < R
    ok = row_ok[:, None] & (j < nk)[None, :]
    r64 = r.to(tl.int64)  # R * nk may pass 2^31 at long sequences
    if MODE == "sol":
        s = tl.load(SCORES + r64[:, None] * stride_s + j[None, :], mask=ok, other=0.0)
        if THETA_ROW:
            mean = tl.sum(s, axis=1) / nk
            dev = tl.where(ok, s - mean[:, None], 0.0)
            theta = mean + tau * tl.sqrt(tl.sum(dev * dev, axis=1) / nk)
        else:
            theta = tl.load(THETA + r, mask=row_ok, other=0.0)
        i = r % nq
        exact = ((s > theta[:, None]) | (tl.abs(i[:, None] - j[None, :]) <= band)
                 | (j < sink_blocks)[None, :])
    elif MODE == "topk":
        compete = ok
        if EXEMPT:
            compete = compete & (j >= sink_blocks)[None, :]
        s = tl.load(SCORES + r64[:, None] * stride_s + j[None, :], mask=compete,
                    other=float("-inf"))
        # the keep-th largest score by a bitwise descent on order-preserving uint32 keys (32
        # counts per row; with a bitonic sort of the row, tl.sort, VSA's routing took 1.18 ms
        # against 0.39 at the H3 shape on the H200, code at 104f24d)
        bits = tl.where(compete, s, float("-inf")).to(tl.uint32, bitcast=True)
        flip = tl.where((bits >> 31) != 0, 0xFFFFFFFF, 0x80000000).to(tl.uint32)
        key = bits ^ flip
        kth = tl.zeros([ROWS], tl.uint32)
        for b in tl.static_range(31, -1, -1):
            cand = kth | (1 << b)
            n_ge = tl.sum((key >= cand[:, None]).to(tl.int32), axis=1)
            kth = tl.where(n_ge >= keep, cand, kth)
        exact = compete & (key >= kth[:, None])
        if EXEMPT:
            exact = exact | (j < sink_blocks)[None, :]
    else:
        exact = tl.load(MASK + r64[:, None] * stride_m + j[None, :], mask=ok, other=0) != 0
    if MODE != "mask":
        exact = exact | ((r % nq) < exact_rows)[:, None]
    exact = exact & ok  # padding columns are not exact: their pos lands past nk, masked
    e = exact.to(tl.int32)
    cs = tl.cumsum(e, axis=1)  # exact blocks among 0..j
    count = tl.sum(e, axis=1)
    pos = tl.where(exact, cs - 1, count[:, None] + j[None, :] - cs)
    row = r64[:, None] * nk
    tl.store(BLOCKS + row + pos, tl.broadcast_to(j[None, :], [ROWS, NK_PAD]), mask=ok)
    tl.store(COUNTS + r, count, mask=row_ok)
    if MODE != "mask":
        tl.store(EXACT + row + j[None, :], exact.to(tl.uint8), mask=ok)


def _rows(x: torch.Tensor) -> torch.Tensor:
    """x [..., n] as [R, n] rows with unit stride along n (a view when it already has it)."""
    x2 = x.reshape(-1, x.shape[-1])
    return x2 if x2.stride(-1) == 1 else x2.contiguous()


def _launch_lists(R, nq, nk, device, config, *, scores=None, theta=None, band=0,
                  sink_blocks=0, mask=None, keep=None, exempt=False, tau=None, exact_rows=0):
    """R list rows of nk key blocks: Sol from scores [R, nk] / theta [R] (or, given tau, theta
    = the row's mean + tau x its standard deviation: Sol's exact threshold), VSA's top ``keep``
    of scores [R, nk], or from the bool mask [R, nk] (unit stride along nk) -> (blocks [R, nk]
    int32, counts [R] int32, exact)."""
    mode = "mask" if mask is not None else ("topk" if keep is not None else "sol")
    blocks = torch.empty((R, nk), dtype=torch.int32, device=device)
    counts = torch.empty((R,), dtype=torch.int32, device=device)
    exact = mask if mode == "mask" else torch.empty((R, nk), dtype=torch.bool, device=device)
    if R == 0:
        return blocks, counts, exact
    rows = config.list_rows
    if rows < 1 or rows & (rows - 1):
        raise ValueError(f"RoutingConfig.list_rows: {rows} is not a power of two")
    # an unused operand's pointer is another tensor of the call (MODE is constexpr: never read)
    src = mask.view(torch.uint8) if mode == "mask" else scores
    row_theta = mode == "sol" and tau is not None
    _lists_kernel[(triton.cdiv(R, rows),)](
        src, theta if mode == "sol" and not row_theta else counts, src, blocks, counts,
        exact.view(torch.uint8), R, nq, nk, band, sink_blocks, exact_rows, keep or 0,
        src.stride(0), src.stride(0), float(tau) if row_theta else 0.0,
        NK_PAD=triton.next_power_of_2(nk), ROWS=rows, MODE=mode, EXEMPT=bool(exempt),
        THETA_ROW=row_theta, num_warps=config.list_warps,
    )
    return blocks, counts, exact


def sol_lists(scores: torch.Tensor, theta: torch.Tensor | None, band: int, sink_blocks: int, *,
              tau: float | None = None, exact_rows: int = 0,
              config: RoutingConfig = DEFAULT.routing
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sol's decisions and lists in one pass. scores [..., nq, nk] FP32, theta [..., nq] FP32 (as
    ``sol_scores``), or theta None and a finite tau: each row's mean score + tau x their
    standard deviation (the exact threshold, ``sol_routing_fused``); band: the diagonal
    half-width, sink_blocks: leading key blocks that are always exact, exact_rows: leading
    query blocks whose every block is exact (``prefix_blocks_exact``) -> (blocks [..., nq, nk]
    int32, counts [..., nq] int32, exact [..., nq, nk] bool), equal to
    ``compact_blocks(sol_exact(...))``."""
    *lead, nq, nk = scores.shape
    if (theta is None) == (tau is None):
        raise ValueError("sol_lists: give theta or tau, not both")
    theta1 = None
    if theta is not None:
        if tuple(theta.shape) != (*lead, nq):
            raise ValueError(f"theta: shape {tuple(theta.shape)}, expected {(*lead, nq)}")
        theta1 = theta.reshape(-1).contiguous()
    scores2 = _rows(scores)
    if scores2.dtype != torch.float32 or (theta1 is not None and theta1.dtype != torch.float32):
        raise ValueError(f"sol_lists: scores / theta are {scores.dtype} / "
                         f"{None if theta is None else theta.dtype}, expected float32")
    blocks, counts, exact = _launch_lists(scores2.shape[0], nq, nk, scores.device, config,
                                          scores=scores2, theta=theta1, band=int(band),
                                          sink_blocks=int(sink_blocks), tau=tau,
                                          exact_rows=int(exact_rows))
    return blocks.view(scores.shape), counts.view(*lead, nq), exact.view(scores.shape)


def mask_lists(exact: torch.Tensor, *, config: RoutingConfig = DEFAULT.routing
               ) -> tuple[torch.Tensor, torch.Tensor]:
    """``compact_blocks`` in one pass: exact [..., nk] bool -> (blocks [..., nk] int32, counts
    [...] int32)."""
    if exact.dtype != torch.bool:
        raise ValueError(f"mask_lists: exact is {exact.dtype}, expected bool")
    mask = _rows(exact)
    blocks, counts, _ = _launch_lists(mask.shape[0], 1, mask.shape[1], exact.device, config,
                                      mask=mask)
    return blocks.view(exact.shape), counts.view(exact.shape[:-1])


def vsa_lists(scores: torch.Tensor, keep: int, sink_blocks: int, exempt: bool, *,
              exact_rows: int = 0, config: RoutingConfig = DEFAULT.routing
              ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """VSA's selection and lists in one pass: scores [..., nk] FP32 (coarse scores of tile
    means), the top ``keep`` per row; exempt: the first ``sink_blocks`` tiles are kept besides
    and do not compete ("exempt" prefix), else all tiles compete; exact_rows: leading query
    tiles (scores [..., nq, nk]) that keep every tile -> (blocks [..., nk] int32,
    counts [...] int32, exact [..., nk] bool), equal to ``compact_blocks(vsa_select(...))`` up
    to ties at the keep-th score (all tied tiles are kept)."""
    nk = scores.shape[-1]
    competing = nk - (sink_blocks if exempt else 0)
    if not 1 <= keep <= competing:
        raise ValueError(f"vsa_lists: keep {keep} not in [1, {competing}] (competing tiles)")
    if scores.dtype != torch.float32:
        raise ValueError(f"vsa_lists: scores are {scores.dtype}, expected float32")
    if exact_rows and scores.dim() < 2:
        raise ValueError("vsa_lists: exact_rows needs scores [..., nq, nk]")
    scores2 = _rows(scores)
    nq = scores.shape[-2] if exact_rows else 1
    blocks, counts, exact = _launch_lists(scores2.shape[0], nq, nk, scores.device, config,
                                          scores=scores2, keep=int(keep),
                                          sink_blocks=int(sink_blocks), exempt=exempt,
                                          exact_rows=int(exact_rows))
    return blocks.view(scores.shape), counts.view(scores.shape[:-1]), exact.view(scores.shape)


def sink_blocks(prefix_len: int, block: int) -> int:
    """Key blocks holding prefix rows (j * block < prefix_len), as ``sol_exact``'s sink."""
    return max(0, -(-prefix_len // block))


def _layout_for(layout: SegmentLayout | None, S: int) -> SegmentLayout:
    layout = layout or SegmentLayout.all_video(S)
    if layout.total != S:
        raise ValueError(f"layout: segments sum to {layout.total} rows but the sequence has {S}")
    return layout


def _recipe_for(recipe, sparsity: str) -> AttentionRecipe:
    recipe = get_recipe(recipe)
    if recipe.sparsity != sparsity:
        raise ValueError(f"recipe {recipe.to_string()!r}: sparsity is {recipe.sparsity!r}, "
                         f"expected {sparsity!r}")
    return recipe


def _expand(t: torch.Tensor, group: int) -> torch.Tensor:
    """[B, Hkv, ...] -> [B, H, ...]: query head h reads K/V head h // group."""
    return t if group == 1 else t.repeat_interleave(group, dim=1)


def sol_centred(sums: BlockSums, mu_k: torch.Tensor, mu_v: torch.Tensor):
    """(kc [B, Hkv, nb, D] block means of K - mu_K, vc [B, Hkv, nb, D] block sums of V - mu_V)
    from the raw block sums; mu [B, Hkv, D] (zeros for an unsmoothed operand)."""
    kc = sums.ksum / sums.lens[:, None] - mu_k[:, :, None]
    vc = sums.vsum - sums.lens[:, None] * mu_v[:, :, None]
    return kc, vc


def _sol_inputs(q, k, v, recipe, scale, sums, mu_k, mu_v, config=DEFAULT.routing):
    """Shared front of Sol routing: (sums, qbar [B, H, nq, D], kc [B, H, nk, D], vc, c, group)."""
    B, S, H, Hkv, D = _check_operands(q, k, v)
    if sums is None:
        sums = block_sums(q, k, v, block=recipe.sol_block, minmax=False, config=config)
    elif sums.block != recipe.sol_block or sums.seq_len != S:
        raise ValueError(f"sums: block {sums.block} / length {sums.seq_len} do not match the "
                         f"recipe's sol_block {recipe.sol_block} / S = {S}")
    # each torch op here costs a launch at these small sizes: the means only where smoothed,
    # the zeros only where not
    if not (recipe.smooth_k and recipe.smooth_v):
        zeros = torch.zeros_like(sums.ksum[:, :, 0])
    if not recipe.smooth_k:
        mu_k = zeros
    elif mu_k is None:
        mu_k = sums.ksum.sum(dim=2) / float(S)
    if not recipe.smooth_v:
        mu_v = zeros
    elif mu_v is None:
        mu_v = sums.vsum.sum(dim=2) / float(S)
    kc, vc = sol_centred(sums, mu_k, mu_v)
    scale = scale if scale is not None else 1.0 / math.sqrt(D)
    return sums, sums.qbar, kc, vc, scale * LOG2E, H // Hkv


def sol_routing(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                recipe: AttentionRecipe | str, *, layout: SegmentLayout | None = None,
                scale: float | None = None, sums: BlockSums | None = None,
                mu_k: torch.Tensor | None = None, mu_v: torch.Tensor | None = None,
                config: RoutingConfig = DEFAULT.routing) -> BlockRouting:
    """Sol routing of q [B, S, H, D] against k, v [B, S, Hkv, D] (raw, unsmoothed operands).

    recipe: a ``sparsity="sol"`` recipe (tau, exact/diag threshold, band, block; its smoothing
    says whether kc / vc are centred). mu_k / mu_v [B, Hkv, D]: the means the quantizer centres
    with (default: from the block sums), so the summary route and the exact blocks agree.
    sums: reuse a ``block_sums`` result (e.g. while sweeping tau). config: the passes' launch
    shapes.
    """
    recipe = _recipe_for(recipe, "sol")
    layout = _layout_for(layout, q.shape[1])
    sums, qbar, kc, vc, c, group = _sol_inputs(q, k, v, recipe, scale, sums, mu_k, mu_v,
                                               config)
    scores, theta = sol_scores(qbar, _expand(kc, group), recipe, c)
    dense_rows = prefix_query_blocks(recipe, layout.prefix_len, recipe.sol_block,
                                     scores.shape[-2])
    blocks, counts, exact = sol_lists(scores, theta, recipe.sol_band,
                                      sink_blocks(layout.prefix_len, recipe.sol_block),
                                      exact_rows=dense_rows, config=config)
    return BlockRouting(blocks, counts, exact, recipe.sol_block, sums.lens, kc, vc, dense_rows)


def sol_routing_fused(sums: BlockSums, recipe: AttentionRecipe | str, *,
                      layout: SegmentLayout | None = None, scale: float | None = None,
                      config: RoutingConfig = DEFAULT.routing, tiles: bool = False,
                      v_perm: bool = True):
    """``sol_routing`` from block sums taken with ``minmax=True``, its front in two launches
    (``sol_front``; ``RoutingConfig.sol_front="triton"``): (mu_k, mu_v, v_amax [B, Hkv, D],
    BlockRouting with V's channel scales and, with tiles, the summary route's E4M3 operands,
    V^T's columns in P's register order when v_perm). The scores and lists as in
    ``sol_routing``."""
    recipe = _recipe_for(recipe, "sol")
    if sums.block != recipe.sol_block:
        raise ValueError(f"sums: block {sums.block} does not match the recipe's sol_block "
                         f"{recipe.sol_block}")
    layout = _layout_for(layout, sums.seq_len)
    D = sums.qsum.shape[-1]
    scale = scale if scale is not None else 1.0 / math.sqrt(D)
    f = sol_front(sums, recipe, scale, rows=config.front_rows, parts=config.front_parts,
                  tiles=tiles, v_perm=v_perm, channels=config.front_channels)
    theta = f.theta
    scores = coarse_scores(f.qbar, f.kc, scale * LOG2E)
    dense_rows = prefix_query_blocks(recipe, layout.prefix_len, recipe.sol_block,
                                     scores.shape[-2])
    blocks, counts, exact = sol_lists(scores, theta, recipe.sol_band,
                                      sink_blocks(layout.prefix_len, recipe.sol_block),
                                      tau=recipe.sol_tau if theta is None else None,
                                      exact_rows=dense_rows, config=config)
    return f.mu_k, f.mu_v, f.v_amax, BlockRouting(
        blocks, counts, exact, recipe.sol_block, sums.lens, f.kc, f.vc, dense_rows,
        tiles=f.tiles, v_scales=(f.v_scale, f.v_rcp))


def coarse_scores(qbar: torch.Tensor, kc: torch.Tensor, c: float) -> torch.Tensor:
    """``sol_scores``' scores qbar . kc_j * c: qbar [B, H, nq, D], kc [B, Hkv, nk, D] FP32 ->
    [B, H, nq, nk]. One batched FP32 GEMM with c as its alpha (not a GEMM and a scaling launch:
    28 us of a 5.6 ms call at the H3 shape, H200); a K/V head's query heads are consecutive
    rows of one product, so kc is not copied per query head."""
    B, H, nq, D = qbar.shape
    Hkv, nk = kc.shape[1], kc.shape[2]
    scores = torch.empty((B, H, nq, nk), dtype=torch.float32, device=qbar.device)
    scores.view(B * Hkv, H // Hkv * nq, nk).baddbmm_(
        qbar.reshape(B * Hkv, H // Hkv * nq, D), kc.reshape(B * Hkv, nk, D).transpose(1, 2),
        beta=0.0, alpha=c)
    return scores


def vsa_routing(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                recipe: AttentionRecipe | str, *, layout: SegmentLayout | None = None,
                scale: float | None = None, sums: BlockSums | None = None,
                config: RoutingConfig = DEFAULT.routing) -> BlockRouting:
    """VSA tile selection of q [B, S, H, D] against k [B, S, Hkv, D] (raw K, as the twin): coarse
    scores of tile means, top ceil(keep * n) key tiles per query tile, prefix exempt / compete.
    Tiles are contiguous rows: permute the video rows into cube order first
    (``sparsity.tile_order``) for 3-D tiles."""
    recipe = _recipe_for(recipe, "vsa")
    B, S, H, Hkv, D = _check_operands(q, k, v)
    layout = _layout_for(layout, S)
    if sums is None:
        sums = block_sums(q, k, v, block=recipe.vsa_tile, config=config)
    elif sums.block != recipe.vsa_tile or sums.seq_len != S:
        raise ValueError(f"sums: block {sums.block} / length {sums.seq_len} do not match the "
                         f"recipe's vsa_tile {recipe.vsa_tile} / S = {S}")
    scale = scale if scale is not None else 1.0 / math.sqrt(D)
    kbar = _expand(sums.ksum / sums.lens[:, None], H // Hkv)
    scores = (sums.qbar @ kbar.transpose(-1, -2)) * scale
    nk = scores.shape[-1]
    n_sink = min(nk, sink_blocks(layout.prefix_len, recipe.vsa_tile))
    exempt = recipe.vsa_prefix == "exempt" and n_sink > 0
    keep = vsa_keep_count(recipe, nk, n_sink)
    dense_rows = prefix_query_blocks(recipe, layout.prefix_len, recipe.vsa_tile,
                                     scores.shape[-2])
    if exempt and n_sink == nk:  # every tile is prefix: all kept (vsa_select's mask |= prefix)
        exact = torch.ones_like(scores, dtype=torch.bool)
        blocks, counts = mask_lists(exact, config=config)
    else:
        blocks, counts, exact = vsa_lists(scores, keep, n_sink, exempt, exact_rows=dense_rows,
                                          config=config)
    return BlockRouting(blocks, counts, exact, recipe.vsa_tile, sums.lens,
                        dense_rows=dense_rows)


def route(q, k, v, recipe, *, layout=None, scale=None, **kw) -> BlockRouting:
    """``sol_routing`` or ``vsa_routing`` by the recipe's sparsity."""
    recipe = get_recipe(recipe)
    if recipe.sparsity == "sol":
        return sol_routing(q, k, v, recipe, layout=layout, scale=scale, **kw)
    if recipe.sparsity == "vsa":
        return vsa_routing(q, k, v, recipe, layout=layout, scale=scale, **kw)
    raise ValueError(f"recipe {recipe.to_string()!r}: dense recipes have no block routing")


def sol_tau_for_density(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                        recipe: AttentionRecipe | str, target: float, *,
                        layout: SegmentLayout | None = None, scale: float | None = None,
                        sums: BlockSums | None = None, iters: int = 40) -> float:
    """The Sol tau whose exact density (all query heads) is closest to `target` in [0, 1].

    Bisection on tau with the scores and the threshold's mu and sigma computed once; returns -inf
    for target >= 1 and +inf when the band and sink alone exceed the target."""
    recipe = _recipe_for(recipe, "sol")
    if not 0.0 <= target <= 1.0:
        raise ValueError(f"target: density {target} is not in [0, 1]")
    if target >= 1.0:
        return -math.inf
    layout = _layout_for(layout, q.shape[1])
    _, qbar, kc, _, c, group = _sol_inputs(q, k, v, recipe, scale, sums, None, None)
    kc_h = _expand(kc, group)
    scores = (qbar @ kc_h.transpose(-1, -2)) * c
    mu = sol_threshold(qbar, kc_h, 0.0, recipe.sol_threshold, c)
    sigma = sol_threshold(qbar, kc_h, 1.0, recipe.sol_threshold, c) - mu
    floor = sol_exact(torch.full_like(scores, -math.inf), mu, recipe, layout.prefix_len)

    def density(tau: float) -> float:
        return float(((scores > (mu + tau * sigma)[..., None]) | floor).float().mean())

    if density(math.inf) >= target:
        return math.inf
    lo, hi = -1.0, 1.0
    while density(lo) < target and lo > -1e6:
        lo *= 2
    while density(hi) > target and hi < 1e6:
        hi *= 2
    for _ in range(iters):  # density is non-increasing in tau
        mid = 0.5 * (lo + hi)
        if density(mid) > target:
            lo = mid
        else:
            hi = mid
    return lo if abs(density(lo) - target) <= abs(density(hi) - target) else hi

"""Reference path: any AttentionRecipe in plain torch (CPU or CUDA). The ground truth for kernels.

``recipe_attention(q, k, v, recipe, query_index=..., layout=...)`` computes the recipe's output for
the chosen query rows against the full K/V context and returns every boundary tensor. Keys are
processed in chunks, so memory is O(n_queries * key_chunk) and never S x S.

Emulation choices (the kernels' torch twin; say so in any comparison):
- Q and K are quantized with one scale per (batch, ``qk_block`` tokens, head); V with one scale per
  (batch, head, channel); values land exactly on the E4M3 / INT8 grid (``quant.py``).
- K smoothing subtracts mu_K = FP32 token mean of K per (batch, head, channel) before quantizing;
  V smoothing subtracts mu_V; the output adds mu_V back, or ``v_corr = mu_V - mean_t(dq(V - mu_V))``
  with the V-bias correction, which makes the effective V's token mean exact.
- P = 2^(s - m) uses the row's final max m (computed in a first pass), so the result does not depend
  on the key-tile order (``p_exp="log_linear"``: P's E4M3 code linear in s - m', m' = m on the 1/8
  grid, ``_log_linear_p``); the row sum l accumulates the FP32 P while PV uses the quantized P
  (as SageAttention and FA3 do). A kernel's online softmax quantizes 2^(s - m_running) instead: the
  same error statistics, not the same bits.
- Sol routing is decided from FP32 Q block means and (smoothed) FP32 K block means; the summary
  route also uses FP32 block means of K and block sums of V, in FP32.
- The output is rounded to BF16 after the epilogue add, as the kernels write BF16.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from workbench.recipes import PRESETS, AttentionRecipe, get_recipe
from workbench.recipes.recipe import LL_MEAN_RATIO

from .layout import InputError, SegmentLayout, check_qkv, check_query_index, check_scale
from .quant import (
    FORMAT_MAX,
    expand_token_scales,
    hadamard_matrix,
    mma_step_truncating,
    quantize_channels,
    round_to_bf16,
    round_to_e4m3,
    round_to_format,
    round_to_mantissa,
    token_scales,
)
from .sparsity import sol_block_map, vsa_block_map

LOG2E = 1.4426950408889634
LN2 = 0.6931471805599453


@dataclass
class AttentionResult:
    """Every boundary tensor of one recipe run. Shapes: n = len(query_index), Hkv = K/V heads."""

    recipe: AttentionRecipe
    query_index: torch.Tensor  # [n]
    q_dq: torch.Tensor  # [B, n, H, D] dequantized Q rows, original coordinates
    k_dq: torch.Tensor  # [B, S, Hkv, D] dequantized K (+ mu_K), original coordinates
    v_dq: torch.Tensor  # [B, S, Hkv, D] effective dequantized V (+ mu_V or + v_corr)
    mu_k: torch.Tensor  # [B, Hkv, D] FP32 token mean of K (zeros when K is not smoothed)
    mu_v: torch.Tensor  # [B, Hkv, D]
    v_corr: torch.Tensor  # [B, Hkv, D] vector added to the FP32 output of the quantized rows
    out: torch.Tensor  # [B, n, H, D] float32 (float64 for float64 inputs) holding BF16 values
    # [B, n, H] natural-log sum of exp of the scores the recipe computes: with K smoothed, of
    # scale * q.(k - mu_K), i.e. the log-sum-exp of scale * q.k minus scale * q.mu_K (a constant
    # of each row, which the softmax cancels; add it back to merge one row's LSEs across
    # different key ranges). The dense-prefix rows (BF16, unsmoothed) hold the unshifted one.
    lse: torch.Tensor
    prefix_rows: torch.Tensor  # [n] bool: rows recomputed in BF16 (dense-prefix replacement)
    exact_fraction: float = 1.0  # fraction of (query block, key block) pairs computed exactly,
    # over every query block of the sequence (not only the sampled rows')
    exact_fraction_per_head: torch.Tensor | None = None  # [H]
    block_map: torch.Tensor | None = None  # [B, H, n_qblocks, n_kblocks] bool, sparse recipes
    extras: dict = field(default_factory=dict)


def _expand_kv(t: torch.Tensor, group: int) -> torch.Tensor:
    """[B, S, Hkv, D] -> [B, S, Hkv*group, D] (GQA: query head h reads K/V head h // group)."""
    return t if group == 1 else t.repeat_interleave(group, dim=2)


def _round_operand(x: torch.Tensor, fmt: str) -> torch.Tensor:
    """Unquantized operand formats: bf16 rounds, exact keeps the compute precision."""
    return x if fmt == "exact" else round_to_bf16(x)


def _quantize_p(p: torch.Tensor, recipe: AttentionRecipe) -> torch.Tensor:
    """P [.., n, c] in [0, 1] (relative to the row max) -> the P operand of PV, scaled back.

    The kernel computes the scaled P directly (2^(s - m + c)) and lets the scale cancel in acc / l;
    here P * scale is rounded and divided back, which is the same up to FP32 rounding of the
    exponent (exactly the same for the power-of-two scale of "exp2_offset8")."""
    if recipe.p_format == "exact":
        return p
    if recipe.p_format == "bf16":
        return round_to_bf16(p)
    if recipe.p_scaling == "rowmax448":
        return round_to_e4m3(p * 448.0) / 448.0
    if recipe.p_scaling == "exp2_offset8":
        return round_to_e4m3(p * 256.0) / 256.0
    return round_to_e4m3(p)


def _log_linear_p(s: torch.Tensor, m: torch.Tensor) -> torch.Tensor:
    """P of ``p_exp="log_linear"`` (recipe.py), scaled back by 2^-c like ``_quantize_p``, relative
    to the grid max m' = ceil(8 m) / 8 (``_attend`` rescales the state to m afterwards).

    s: [.., n, c] scores in log2 units (-inf where masked), m: [.., n] the row max. The E4M3 code
    is round(8 s - 8 m' + 8 c) + 56 (round half to even, as the kernels' FP32 add rounds), codes
    <= 0 give P = 0; the code's E4M3 value is exactly what the kernels' byte holds."""
    c = 8.0  # the only P scaling log_linear takes (validate): exp2_offset8
    code = torch.round(8 * s - torch.ceil(8 * m)[..., None] + (8 * c + 56))
    code = code.clamp(min=0, max=126).nan_to_num(0.0)  # -inf scores: code 0, P = 0
    return code.to(torch.uint8).view(torch.float8_e4m3fn).to(s.dtype) / 2.0**c


def _pv(p: torch.Tensor, v: torch.Tensor, recipe: AttentionRecipe, state: dict) -> torch.Tensor:
    """P [.., n, c] @ V [.., c, D] with the recipe's accumulator. Returns the fp32 partial sum.

    "reduced": the inner accumulator keeps accum_mantissa_bits bits after every 32-key MMA step
    (the FP8 wgmma K width), dropping bits as ``accum_rounding`` says ("truncate": Hopper's FP8
    wgmma as measured, ``quant.mma_step_truncating``; "nearest": the step sum rounded to nearest),
    and is flushed into FP32 every accum_flush_keys keys. V here carries its channel scale; the
    tensor cores cut products of the codes, so with a scale that is no power of two the cut
    points move (the drift's statistics do not: FA3 FP8 emulated 0.352 vs 0.339 measured).
    """
    if recipe.accumulation == "fp32":
        return p @ v
    bits, flush = recipe.accum_mantissa_bits, recipe.accum_flush_keys
    inner = state.get("inner")
    if inner is None:
        inner = torch.zeros(*p.shape[:-1], v.shape[-1], dtype=torch.float32, device=p.device)
    outer = torch.zeros_like(inner)
    count = state.get("count", 0)
    for s in range(0, p.shape[-1], 32):
        ps, vs = p[..., s : s + 32], v[..., s : s + 32, :]
        if recipe.accum_rounding == "truncate":
            inner = mma_step_truncating(inner, ps, vs, bits)
        else:
            inner = round_to_mantissa(inner + ps @ vs, bits)
        count += min(32, p.shape[-1] - s)
        if count >= flush:
            outer += inner
            inner = torch.zeros_like(inner)
            count = 0
    state["inner"], state["count"] = inner, count
    return outer


def _attend(
    qs: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    recipe: AttentionRecipe,
    scale: float,
    key_chunk: int,
    exact_keys: torch.Tensor | None = None,
    summary: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None,
    causal_rows: torch.Tensor | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Two-pass softmax attention over key chunks.

    qs: [B, H, n, D] fp32 (already on the operand grid), k, v: [B, H, S, D] fp32.
    exact_keys: [B, H, n, nkb] bool per key block (None: all exact), block size = recipe.sol_block.
    summary: (kc [B, H, nkb, D], vc [B, H, nkb, D], blen [nkb]) for the summary route.
    causal_rows: [n] sequence positions of the query rows: key j is masked for row i when j > i
    (every row keeps its own key, so the row max of pass 1 is finite and pass 2 has no NaN).
    Returns (out [B, H, n, D] fp32, lse [B, H, n] natural log).
    """
    B, H, n, D = qs.shape
    S = k.shape[2]
    c = scale * LOG2E
    blk = recipe.sol_block if recipe.sparsity == "sol" else recipe.vsa_tile
    # Chunk boundaries must not move results: whole key blocks for the sparse masks, and whole
    # 32-key MMA steps for a reduced accumulator (its steps restart at each chunk).
    align = blk if exact_keys is not None else 1
    if recipe.accumulation == "reduced":
        align = math.lcm(align, 32)
    key_chunk = max(align, key_chunk // align * align)

    def scores(s0: int, s1: int) -> torch.Tensor:
        """Masked scores in the log2 domain for keys [s0, s1): [B, H, n, s1 - s0]."""
        s = (qs @ k[:, :, s0:s1].transpose(-1, -2)) * c
        if causal_rows is not None:
            future = torch.arange(s0, s1, device=qs.device)[None, :] > causal_rows[:, None]
            s = s.masked_fill(future, -math.inf)
        if exact_keys is None:
            return s
        if (s1 - s0) % blk == 0:  # block view: mask whole key blocks without a gather
            nb = (s1 - s0) // blk
            keep = exact_keys[..., s0 // blk : s0 // blk + nb, None]
            return s.view(B, H, n, nb, blk).masked_fill(~keep, -math.inf).view(B, H, n, -1)
        kb = torch.arange(s0, s1, device=qs.device) // blk
        return s.masked_fill(~exact_keys[..., kb], -math.inf)

    # Scores are kept between the passes when they fit a modest budget (64 sampled rows against
    # the live context: ~33 MB per head), else recomputed.
    cache_ok = n * S * H * B <= 32 * 2**20
    cache: dict[int, torch.Tensor] = {}

    # Pass 1: the row max over exact keys and summary scores.
    dt = qs.dtype
    m = torch.full((B, H, n), -math.inf, device=qs.device, dtype=dt)
    for s0 in range(0, S, key_chunk):
        s = scores(s0, min(S, s0 + key_chunk))
        if cache_ok:
            cache[s0] = s
        m = torch.maximum(m, s.amax(-1))
    if summary is not None:
        kc, vc, blen = summary
        ss = (qs @ kc.transpose(-1, -2)) * c  # [B, H, n, nkb]
        ss = ss.masked_fill(exact_keys, -math.inf)
        m = torch.maximum(m, ss.amax(-1))

    # Pass 2: P = 2^(s - m); PV uses the quantized P; the row sum takes the FP32 P
    # (row_sum "p_fp32") or PV's operand with PV's accumulation ("p_operand": P @ ones).
    row_sum = torch.zeros((B, H, n), device=qs.device, dtype=dt)
    acc = torch.zeros((B, H, n, D), device=qs.device, dtype=dt)
    state: dict = {}
    state_l: dict = {}
    for s0 in range(0, S, key_chunk):
        s1 = min(S, s0 + key_chunk)
        s = cache.pop(s0) if cache_ok else scores(s0, s1)
        if recipe.p_exp == "log_linear":  # (its row sum is the codes': no FP32 P needed)
            p = None
            pq = _log_linear_p(s, m).to(dt)
        else:
            p = torch.exp2(s - m[..., None])
            pq = _quantize_p(p, recipe).to(dt)
        if recipe.row_sum == "p_operand":
            ones = torch.ones((s1 - s0, 1), device=qs.device, dtype=dt)
            row_sum += _pv(pq, ones, recipe, state_l)[..., 0]
        else:
            row_sum += p.sum(-1)
        acc += _pv(pq, v[:, :, s0:s1], recipe, state)
    if state.get("inner") is not None:
        acc += state["inner"]
    if state_l.get("inner") is not None:
        row_sum += state_l["inner"][..., 0]
    if recipe.p_exp == "log_linear":
        # the codes are relative to the row max on the 1/8 grid, m' = ceil(8 m) / 8, and
        # LL_MEAN_RATIO times 2^x on average: rescale the state to m and divide the bias out
        # once, as the kernels do after their exact tiles (the summary route's weights are
        # relative to m and unbiased)
        grid = torch.exp2(torch.ceil(8 * m) / 8 - m) / LL_MEAN_RATIO
        acc = acc * grid[..., None]
        row_sum = row_sum * grid
    if summary is not None:
        w = torch.exp2(ss - m[..., None])  # zero where the block is exact
        acc += w @ vc
        row_sum += w @ blen.to(w.dtype)
    out = acc / row_sum[..., None]
    lse = (m + torch.log2(row_sum)) * LN2
    return out, lse


def recipe_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    recipe: AttentionRecipe | str | None = None,
    *,
    query_index=None,
    layout: SegmentLayout | None = None,
    step: int | None = None,
    layer: int | None = None,
    scale: float | None = None,
    key_chunk: int = 4096,
    query_chunk: int = 1024,
    return_block_map: bool = False,
    causal: bool = False,
    _checked: bool = False,
) -> AttentionResult:
    """Run `recipe` on q [B, S, H, D], k/v [B, S, Hkv, D] for the rows in `query_index`.

    causal: row i attends to keys 0..i only (decoder self-attention); dense recipes only (Sol's
    and VSA's block routing know no mask). Smoothing stays exact: q . mu_K is constant along a
    row, masked or not, and each row's weights still sum to 1.
    layout: segment layout (its prefix rows: Sol's sink, the dense-prefix rows); default one
    `tokens` segment without a prefix.
    step / layer: apply the recipe's dense policy (BF16 dense where it says so).
    scale: softmax scale, default 1/sqrt(D).
    """
    recipe = get_recipe(recipe).at(step, layer)
    _check_chunks(key_chunk=key_chunk, query_chunk=query_chunk)
    check_scale(scale)
    if causal and recipe.sparsity != "dense":
        raise ValueError(f"causal: the reference path masks dense recipes only; recipe "
                         f"{recipe.name!r} has sparsity={recipe.sparsity!r} (choose a dense one, "
                         f"e.g. fp8_dense_kv_corrected, or replay non-causally)")
    if _checked:
        B, S, H, D = q.shape
        Hkv = k.shape[2]
    else:
        B, S, H, Hkv, D = check_qkv(q, k, v)
    if k.shape[1] != S:
        raise ValueError(f"k: sequence length {k.shape[1]} does not match q's {S} (self-attention)")
    layout = layout or SegmentLayout.tokens(S)
    if layout.total != S:
        raise ValueError(f"layout: segments sum to {layout.total} rows but the sequence has {S}")
    idx = check_query_index(query_index, S, device=q.device)
    scale = scale if scale is not None else 1.0 / math.sqrt(D)
    group = H // Hkv
    dev = q.device

    # float64 inputs are computed in float64 (identities); everything else in float32.
    cdt = torch.float64 if q.dtype == torch.float64 else torch.float32
    qf, kf, vf = q.to(cdt), k.to(cdt), v.to(cdt)
    rot = hadamard_matrix(D, dtype=cdt, device=dev) if recipe.hadamard else None
    if rot is not None:
        qf, kf = qf @ rot, kf @ rot

    zeros = torch.zeros(B, Hkv, D, device=dev, dtype=cdt)
    mu_k = kf.mean(dim=1) if recipe.smooth_k else zeros
    mu_v = vf.mean(dim=1) if recipe.smooth_v else zeros
    kc = kf - mu_k[:, None]
    vc = vf - mu_v[:, None]

    # Quantize the operands (Q only on the sampled rows; scales still see their whole block).
    _check_scale_range(([("q", qf, recipe.qk_format), ("k", kc, recipe.qk_format)]
                        if recipe.quantizes_qk else [])
                       + ([("v", vc, recipe.v_format)] if recipe.quantizes_v else []))
    if recipe.quantizes_qk:
        qs_scale = token_scales(qf, recipe.qk_format, recipe.qk_granularity, recipe.qk_block)
        k_op = _quantize_rows(kc, recipe, None)[0].to(cdt)
        q_rows = _quantize_rows(qf, recipe, idx, qs_scale)[0].to(cdt)
    else:
        k_op = _round_operand(kc, recipe.qk_format)
        q_rows = _round_operand(qf[:, idx], recipe.qk_format)
    if recipe.quantizes_v:
        v_op = quantize_channels(vc, recipe.v_format, recipe.v_granularity)[0].to(cdt)
    else:
        v_op = _round_operand(vc, recipe.v_format)
    v_mean_dq = v_op.mean(dim=1)
    v_corr = (mu_v - v_mean_dq) if recipe.v_bias_correction else mu_v

    # Sparse routing (block decisions from FP32 operands).
    block_map = exact = summary = None
    exact_frac, exact_per_head = 1.0, None
    qblk = recipe.sol_block if recipe.sparsity == "sol" else recipe.vsa_tile
    if recipe.sparsity == "sol":
        block_map, kcent, vsum, blen = sol_block_map(qf, kc, vc, recipe, layout, scale, group)
    elif recipe.sparsity == "vsa":
        block_map = vsa_block_map(qf, kf, recipe, layout, scale, group)
    if block_map is not None:
        qb = idx // qblk
        exact = block_map[:, :, qb]  # [B, H, n, nkb]
        # the whole map (every query block, not the sampled rows' blocks weighted by how many
        # rows fall in each): the share of pairs the call computes exactly, its density
        exact_per_head = block_map.float().mean(dim=(0, 2, 3)).cpu()
        exact_frac = float(block_map.float().mean())
        if recipe.sparsity == "sol":
            summary = (_expand_heads(kcent, group), _expand_heads(vsum, group), blen)

    k_att = _expand_kv(k_op, group).transpose(1, 2)  # [B, H, S, D]
    v_att = _expand_kv(v_op, group).transpose(1, 2)
    qs = q_rows.transpose(1, 2)  # [B, H, n, D]
    outs, lses = [], []
    for a in range(0, idx.numel(), query_chunk):
        b = min(idx.numel(), a + query_chunk)
        ex = exact[:, :, a:b] if exact is not None else None
        o, lse = _attend(qs[:, :, a:b], k_att, v_att, recipe, scale, key_chunk, ex, summary,
                         idx[a:b] if causal else None)
        outs.append(o)
        lses.append(lse)
    out = torch.cat(outs, 2).transpose(1, 2)  # [B, n, H, D]
    lse = torch.cat(lses, 2).transpose(1, 2)
    out = out + _expand_heads(v_corr, group)[:, None]
    if recipe.out_format == "bf16":
        out = round_to_bf16(out).to(cdt)

    prefix_rows = torch.zeros(idx.numel(), dtype=torch.bool, device=dev)
    if recipe.dense_prefix and layout.prefix_len:
        prefix_rows = idx < layout.prefix_len
        if bool(prefix_rows.any()):
            pre = recipe_attention(
                q, k, v, PRESETS["bf16"], query_index=idx[prefix_rows], layout=layout,
                scale=scale, key_chunk=key_chunk, query_chunk=query_chunk, causal=causal,
                _checked=True,
            )
            out[:, prefix_rows] = pre.out.to(out.dtype)
            lse[:, prefix_rows] = pre.lse.to(lse.dtype)

    raise_on_overflow(out, q, k, v, scale)
    if rot is not None:  # report Q and K boundaries in the caller's coordinates
        q_rows, k_op = q_rows @ rot.T, k_op @ rot.T
        mu_k_orig = mu_k @ rot.T
    else:
        mu_k_orig = mu_k
    return AttentionResult(
        recipe=recipe,
        query_index=idx,
        q_dq=q_rows,
        k_dq=k_op + mu_k_orig[:, None],
        v_dq=v_op + v_corr[:, None],
        mu_k=mu_k_orig,
        mu_v=mu_v,
        v_corr=v_corr,
        out=out,
        lse=lse,
        prefix_rows=prefix_rows,
        exact_fraction=exact_frac,
        exact_fraction_per_head=exact_per_head,
        block_map=block_map if return_block_map else None,
    )


def _check_chunks(**chunks) -> None:
    """Chunk sizes are positive ints (a memory setting; a bad one is named, not run)."""
    for name, n in chunks.items():
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ValueError(f"{name}: {n!r}; give a positive number of rows per chunk")


def _check_scale_range(operands) -> None:
    """A quantized operand's scales are FP32 (as on the GPU): amax / format max must be a normal
    FP32 number. Below that (|x| < ~5e-36 for E4M3) every code would round to zero or the scale
    to 0 (NaN codes); above FP32's max (float64 inputs) the scale is Inf. Checked on the whole
    operand, so one near-zero block of an ordinary tensor is not refused; an operand that is
    not finite (smoothing overflowed) is left to ``raise_on_overflow``.

    operands: [(name, x [B, S, H, D] as quantized (centred when smoothed), format)]."""
    f32 = torch.finfo(torch.float32)
    bad = []
    for name, x, fmt in operands:
        amax = float(x.detach().abs().amax())
        lo = FORMAT_MAX[fmt] * f32.tiny
        if math.isfinite(amax) and (0 < amax < lo or amax > f32.max):
            bad.append(f"{name} ({fmt}): largest |value| {amax:.3g}, representable "
                       f"{lo:.2g} to {f32.max:.3g}")
    if bad:
        raise InputError(f"{'; '.join(bad)}: outside what float32 scales can represent (the "
                         "scales are float32, as on the GPU); rescale the input")


def _expand_heads(t: torch.Tensor, group: int) -> torch.Tensor:
    """[B, Hkv, ...] -> [B, H, ...] for GQA."""
    return t if group == 1 else t.repeat_interleave(group, dim=1)


def _quantize_rows(x, recipe: AttentionRecipe, rows, scale=None):
    """Fake-quantize a Q/K operand [B, S, H, D]; only `rows` when given (scales from all rows)."""
    fmt, gran, blk = recipe.qk_format, recipe.qk_granularity, recipe.qk_block
    if scale is None:
        scale = token_scales(x, fmt, gran, blk)
    S = x.shape[1]
    s = expand_token_scales(scale, S, gran, blk)
    if rows is not None:
        x = x[:, rows]
        s = s[:, rows] if s.shape[1] == S else s
    return round_to_format(fmt, x / s) * s, scale


def dense_attention_f64(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    *,
    query_index=None,
    scale: float | None = None,
    key_chunk: int = 8192,
    causal: bool = False,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Float64 dense attention of the rows `query_index` against the full context.

    q [B, S, H, D], k/v [B, S, Hkv, D] -> (out [B, n, H, D] float64, lse [B, n, H] float64).
    causal: row i attends to keys 0..i only. Chunks run from key 0, so each row's running max
    is finite after the first chunk and masked keys contribute exp(-inf) = 0.
    """
    _check_chunks(key_chunk=key_chunk)
    check_scale(scale)
    B, S, H, Hkv, D = check_qkv(q, k, v)
    idx = check_query_index(query_index, S, device=q.device)
    scale = scale if scale is not None else 1.0 / math.sqrt(D)
    group = H // Hkv
    qs = q[:, idx].double().transpose(1, 2)
    kk = _expand_kv(k, group).transpose(1, 2)
    vv = _expand_kv(v, group).transpose(1, 2)
    n = idx.numel()
    m = torch.full((B, H, n), -math.inf, dtype=torch.float64, device=q.device)
    row_sum = torch.zeros((B, H, n), dtype=torch.float64, device=q.device)
    acc = torch.zeros((B, H, n, D), dtype=torch.float64, device=q.device)
    last = int(idx.max()) + 1 if causal and n else kk.shape[2]
    for s0 in range(0, last, key_chunk):
        s = (qs @ kk[:, :, s0 : s0 + key_chunk].double().transpose(-1, -2)) * scale
        if causal:
            keys = torch.arange(s0, min(s0 + key_chunk, kk.shape[2]), device=q.device)
            s = s.masked_fill(keys[None, :] > idx[:, None], -math.inf)
        m_new = torch.maximum(m, s.amax(-1))
        alpha = torch.exp(m - m_new)
        p = torch.exp(s - m_new[..., None])
        row_sum = row_sum * alpha + p.sum(-1)
        acc = acc * alpha[..., None] + p @ vv[:, :, s0 : s0 + key_chunk].double()
        m = m_new
    out = (acc / row_sum[..., None]).transpose(1, 2)
    raise_on_overflow(out, q, k, v, scale)
    return out, (m + torch.log(row_sum)).transpose(1, 2)


def raise_on_overflow(out: torch.Tensor, q, k, v, scale: float) -> None:
    """Finite inputs can still overflow the computation (scores |q.k| * scale, or sums of V over
    the keys, beyond the compute dtype's max) and come out as NaN/Inf. One reduction checks the
    output; only when it is not finite are the inputs' magnitudes measured to name the tensor.

    out: [B, n, H, D] in the compute dtype; q [B, S, H, D], k/v [B, S, Hkv, D] as given.
    """
    if bool(torch.isfinite(out).all()):
        return
    fmax = torch.finfo(out.dtype).max
    amax = {n: float(t.detach().abs().amax()) for n, t in (("q", q), ("k", k), ("v", v))}
    S, D = k.shape[1], q.shape[-1]
    # |s| <= scale * D * max|q| * max|k|: a tensor past sqrt(fmax / (scale * D)) can overflow the
    # scores on its own; V overflows the softmax-weighted sums past fmax / S.
    score_lim = math.sqrt(fmax / (scale * D))
    names = [n for n in ("q", "k") if amax[n] > score_lim]
    if amax["v"] * S > fmax:
        names.append("v")
    if not names:
        names = [max(amax, key=amax.get)]
    raise InputError(
        f"{' and '.join(names)}: finite values up to {max(amax[n] for n in names):.3g} overflow "
        f"the attention computation (scores q.k * scale, operand formats or sums over {S} keys "
        f"past the {str(out.dtype).removeprefix('torch.')} range {fmax:.3g}); the output would be "
        f"NaN/Inf: rescale the input"
    )

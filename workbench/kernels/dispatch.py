"""The full FP8 recipe call on the kernels, and ``try_kernel`` / ``kernel_unavailable`` for the
recipe runner.

Torch twin: ``workbench.attention.recipe_attention`` (all rows) for the dense FP8 recipes
``fp8_dense``, ``fp8_dense_k``, ``fp8_dense_kv_corrected`` and variants of them with the
dense-prefix replacement or a scaled P (``p_scaling``), and for the block-sparse FP8 recipes
(``fp8_sol_*``, and FP8 recipes with ``sparsity="vsa"``; 64-token blocks), and their BF16
baselines on the same sparse loop (``vsa_bf16``, ``bf16:sparsity=sol``: BF16 operands and P, no
quantizer, ``quantize.bf16_operands``). One dense call =
statistics (``kv_stats``) -> centering + quantization (``quantize``) -> attention with the fused
epilogue (``attention_fp8``) -> BF16 prefix rows (SDPA on the unquantized operands) copied into
the same output. A sparse call takes its statistics from the routing's block sums instead (one
read of Q, K and V gives mu_K, mu_V, V's range and the routing, ``routing``), then quantizes and
runs the attention on the routing's lists. Extra memory beyond inputs and output: the FP8 copies
of Q/K/V (padded to 256 tokens) plus O(B*H*(D + S/64)) scales, vectors and partial sums; sparse:
plus the lists, O(B*H*(S/64)^2) int32, and the block sums O(B*H*S/64*D).

Shapes compile once per class: S, B and H are run-time arguments of every kernel; only the head dim,
the dtype and the recipe's flags are compile-time constants, and there is no autotuning sweep:
the tiling is ``config.KernelConfig`` (default = the measured H200 values).
"""

from __future__ import annotations

import dataclasses
import math
import warnings

import torch

from workbench.attention.layout import SegmentLayout, check_qkv, check_scale
from workbench.recipes import AttentionRecipe, get_recipe

from . import routing, streams
from .attention_fp8 import P_LOG2_SCALES, fp8_attention_fwd
from .config import DEFAULT, KernelConfig, QuantConfig, RoutingConfig
from .e4m3 import interpreting
from .kv_stats import kv_stats
from .quantize import bf16_operands, quantize_qkv

SUPPORTED_HEAD_DIMS = (64, 128)


def __getattr__(name: str):
    # The TUNING dict was replaced by config.KernelConfig (frozen, passed explicitly).
    if name == "TUNING":
        warnings.warn("dispatch.TUNING is deprecated and read-only: pass "
                      "config=workbench.kernels.config.KernelConfig(...) instead",
                      DeprecationWarning, stacklevel=2)
        return dataclasses.asdict(DEFAULT.attention)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def is_bf16_sparse(recipe: AttentionRecipe) -> bool:
    """A BF16 block-sparse recipe (``vsa_bf16``, ``bf16:sparsity=sol``): Q, K, V and P in BF16
    without smoothing, the baseline the FP8 sparse recipes are compared with."""
    r = recipe
    return (r.sparsity in ("sol", "vsa") and r.qk_format == "bf16" and r.v_format == "bf16"
            and r.p_format == "bf16")


def unsupported_reason(q, k, v, recipe: AttentionRecipe) -> str | None:
    """None when the kernels implement `recipe` on these operands, else why not (one line)."""
    r = recipe
    if is_bf16_sparse(r):
        if r.smoothing != "none" or r.v_bias_correction:
            return "BF16 sparse recipes run unsmoothed (smoothing serves the FP8 quantization)"
        if q.dtype != torch.bfloat16:
            return "BF16 sparse recipes need bf16 operands"
    elif r.qk_format != "fp8_e4m3" or r.qk_granularity != "block" or r.qk_block != 64:
        return "Q/K must be fp8_e4m3 with 64-token block scales (or the BF16 sparse recipes)"
    elif r.v_format != "fp8_e4m3" or r.v_granularity != "channel":
        return "V must be fp8_e4m3 with channel scales"
    elif r.p_format != "fp8_e4m3" or r.p_scaling not in P_LOG2_SCALES:
        return f"P must be fp8_e4m3 with p_scaling one of {tuple(P_LOG2_SCALES)}"
    if r.hadamard:
        return "no Hadamard kernel"
    if r.sparsity == "sol" and r.sol_block != 64:
        return "Sol needs sol_block = 64 (one routing block per K scale block)"
    if r.sparsity == "vsa" and r.vsa_tile != 64:
        return "VSA needs vsa_tile = 64 (one routing block per K scale block)"
    if r.accumulation != "fp32":
        return "only the fp32 accumulation recipe (kernel flushes the FP8 accumulator per tile)"
    if r.row_sum != "p_fp32" and is_bf16_sparse(r):
        return f"row_sum {r.row_sum!r}: the FP8 kernels only (BF16 sparse loops sum FP32 P)"
    if q.dim() != 4 or k.shape != v.shape or k.shape[1] != q.shape[1] or k.dim() != 4 \
            or k.shape[0] != q.shape[0]:
        return "self-attention [B, S, H, D] operands with matching K/V (same batch and length)"
    if q.shape[-1] not in SUPPORTED_HEAD_DIMS or k.shape[-1] != q.shape[-1]:
        return f"head dim must be one of {SUPPORTED_HEAD_DIMS}"
    if q.shape[2] % k.shape[2]:
        return "query heads must be a multiple of K/V heads"
    if q.dtype not in (torch.bfloat16, torch.float16) or k.dtype != q.dtype or v.dtype != q.dtype:
        return "operands must be bf16 or fp16 of one dtype"
    if any(t.stride(-1) != 1 for t in (q, k, v)):
        return "last dim must be contiguous"
    return None


def fp8_recipe_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    recipe: AttentionRecipe | str,
    *,
    layout: SegmentLayout | None = None,
    scale: float | None = None,
    return_lse: bool = False,
    config: KernelConfig = DEFAULT,
    **legacy_tuning,
):
    """The recipe on every row: q [B, S, H, D], k/v [B, S, Hkv, D] -> out [B, S, H, D] in q's dtype
    (and lse [B, H, S] float32, natural log, when asked; prefix rows hold the FP8 rows' LSE;
    with K smoothed, the LSE of the centred scores, as ``AttentionResult.lse``: the log-sum-exp
    of scale * q.k minus scale * q.mu_K per row).

    config: the three kernels' tiling (``config.KernelConfig``; default = measured H200 values).
    Raises ValueError when the recipe or shape is unsupported (see ``unsupported_reason``).
    """
    if legacy_tuning:  # block_m=..., num_warps=... keywords of the former TUNING dict
        warnings.warn("fp8_recipe_attention(**tuning) is deprecated: pass "
                      "config=KernelConfig(...).with_attention(...)", DeprecationWarning,
                      stacklevel=2)
        config = config.with_attention(**legacy_tuning)
    recipe = get_recipe(recipe)
    why = unsupported_reason(q, k, v, recipe)
    if why:
        raise ValueError(f"fp8 kernels: {why} (recipe {recipe.to_string()!r})")
    check_scale(scale)
    if layout is not None and layout.total != q.shape[1]:
        raise ValueError(f"layout: segments sum to {layout.total} rows but the sequence has "
                         f"{q.shape[1]}")
    if interpreting():
        # Triton's interpreter casts NaN to a finite E4M3 code (the GPU keeps it NaN): the CPU
        # path checks its inputs as the reference path does (a pass the GPU call does not pay)
        check_qkv(q, k, v)
    scale = scale if scale is not None else 1.0 / math.sqrt(q.shape[3])
    prefix = layout.prefix_len if (recipe.dense_prefix and layout is not None) else 0
    side = prefix_rows = None
    if prefix and config.attention.prefix_stream and q.is_cuda:
        # the BF16 prefix rows depend on the inputs only: start them on a side stream so that
        # they fill the SMs the memory-bound passes and the kernels' tails leave free
        side = streams.side_stream(streams.device_index(q))
        side.wait_stream(torch.cuda.current_stream(q.device))
        with torch.cuda.stream(side):
            prefix_rows = dense_prefix_rows(q, k, v, prefix, scale)
    try:
        out, lse = _fp8_rows(q, k, v, recipe, layout, scale, prefix, return_lse, config)
    finally:  # join the side stream even when a pass raises: it still reads q, k, v
        if side is not None:
            main = torch.cuda.current_stream(q.device)
            main.wait_stream(side)
            prefix_rows.record_stream(main)  # made on the side stream, read on this one
    if side is not None:
        out[:, :prefix] = prefix_rows
    elif prefix:
        out[:, :prefix] = dense_prefix_rows(q, k, v, prefix, scale)
    if out.dtype != q.dtype:  # a BF16 output of FP16 operands (the recipe's out_format)
        out = out.to(q.dtype)
    return (out, lse) if return_lse else out


def _fp8_rows(q, k, v, recipe: AttentionRecipe, layout, scale: float, prefix: int,
              return_lse: bool, config: KernelConfig):
    """Statistics or routing, the quantizer and the FP8 attention of rows >= prefix:
    (out [B, S, H, D] with rows < prefix unwritten, lse or None)."""
    route = q_codes = v_scales = None
    if recipe.sparsity == "dense":
        st = kv_stats(k, v, smooth_k=recipe.smooth_k, smooth_v=recipe.smooth_v,
                      config=config.stats)
        mu_k, mu_v, v_amax = st.mu_k, st.mu_v, st.v_amax
    else:
        # FP8: Q's codes come from the read that sums Q's blocks (Q is read once, not twice;
        # H200, H3 shape, 2026-12-03: 0.227 + 0.247 ms for Q's codes and sums, then K / V's
        # sums, against 0.353 + 0.192 for the three operands' sums and Q's codes; whole Sol
        # calls 5.917 vs 6.003 ms at density 0.1, level at 0.2-0.5; the option to sum Q with K
        # and V in FP8 calls is at ed0c231, RoutingConfig.q_codes)
        fp8 = not is_bf16_sparse(recipe)
        sums = sparse_block_sums(q, k, v, config.routing, q_codes=config.quant if fp8 else None)
        # FP8 Sol: the front also makes V's channel scales and, where the list kernel will
        # take them (its launch rule, less the split count chosen at launch), the summary tiles
        from .attention_fp8_ws_lists import may_apply

        tiles = (fp8 and q.is_cuda and config.sparse.summary_kernel == "fp8_tiles"
                 and may_apply(config.sparse, config.attention, q.shape[-1], fp8))
        mu_k, mu_v, v_amax, route = routing_given_sums(
            q, k, v, recipe, layout, scale, sums, config.routing, tiles=tiles,
            v_perm=config.quant.v_perm)
        if fp8:
            q_codes, v_scales = (sums.q8, sums.q_scale), route.v_scales
    if is_bf16_sparse(recipe):
        qkv = bf16_operands(q, k, v)
    else:
        qkv = quantize_qkv(q, k, v, mu_k, mu_v, v_amax, smooth_k=recipe.smooth_k,
                           smooth_v=recipe.smooth_v, v_bias_correction=recipe.v_bias_correction,
                           config=config.quant, q_codes=q_codes, v_scales=v_scales)
    # out_format "bf16": the kernels round the output to BF16 whatever the operands' dtype (FP16
    # operands get it back in FP16, as the reference path returns it); "fp32" / "exact": q's dtype
    out = torch.empty_like(q, dtype=torch.bfloat16 if recipe.out_format == "bf16" else q.dtype)
    return fp8_attention_fwd(qkv, num_heads=q.shape[2], scale=scale, out=out, row_start=prefix,
                             return_lse=return_lse, p_scaling=recipe.p_scaling,
                             row_sum=recipe.row_sum, config=config.attention, routing=route,
                             sparse=config.sparse, p_exp=recipe.p_exp)


def sparse_routing(q, k, v, recipe: AttentionRecipe, layout: SegmentLayout | None,
                   scale: float, config: RoutingConfig = DEFAULT.routing):
    """(mu_k, mu_v, v_amax [B, Hkv, D], BlockRouting) of a sparse recipe from one read of Q, K,
    V: the block sums give the statistics the quantizer centres with (zeros where not smoothed)
    and the routing, whose Sol summary blocks are centred with the same means. config: the
    routing passes' launch shapes."""
    return routing_given_sums(q, k, v, recipe, layout, scale,
                              sparse_block_sums(q, k, v, config), config)


def sparse_block_sums(q, k, v, config: RoutingConfig = DEFAULT.routing, *,
                      q_codes: QuantConfig | None = None):
    """The first step of ``sparse_routing``: the block sums of one Q/K/V read, with V's
    per-block extremes (what the statistics need); q_codes: with Q's E4M3 codes from the same
    read (``routing.block_sums``)."""
    return routing.block_sums(q, k, v, block=64, minmax=True, config=config, q_codes=q_codes)


def routing_given_sums(q, k, v, recipe: AttentionRecipe, layout: SegmentLayout | None,
                       scale: float, sums, config: RoutingConfig = DEFAULT.routing, *,
                       tiles: bool = False, v_perm: bool = True):
    """The second step of ``sparse_routing``: (mu_k, mu_v, v_amax [B, Hkv, D], BlockRouting)
    from the block sums; Sol's front in two launches (``RoutingConfig.sol_front="triton"``:
    ``routing.sol_routing_fused``, which also makes V's channel scales and, with tiles, the
    summary tiles' operands, V^T in P's order when v_perm), else the statistics in torch and
    ``route_from_sums`` (BlockRouting.v_scales None)."""
    if recipe.sparsity == "sol" and config.sol_front == "triton":
        return routing.sol_routing_fused(sums, recipe, layout=layout, scale=scale,
                                         config=config, tiles=tiles, v_perm=v_perm)
    mu_k, mu_v, v_amax = sums.kv_moments(smooth_k=recipe.smooth_k, smooth_v=recipe.smooth_v)
    return mu_k, mu_v, v_amax, route_from_sums(q, k, v, recipe, layout, scale, sums, mu_k, mu_v,
                                               config)


def sparse_statistics(q, k, v, recipe: AttentionRecipe, config: RoutingConfig = DEFAULT.routing):
    """(block sums with V's per-block extremes, mu_k, mu_v, v_amax [B, Hkv, D] from them in
    torch): what a sparse call computes before routing when its front is not fused."""
    sums = sparse_block_sums(q, k, v, config)
    return (sums, *sums.kv_moments(smooth_k=recipe.smooth_k, smooth_v=recipe.smooth_v))


def route_from_sums(q, k, v, recipe: AttentionRecipe, layout: SegmentLayout | None,
                    scale: float, sums, mu_k, mu_v,
                    config: RoutingConfig = DEFAULT.routing):
    """The recipe's ``BlockRouting`` given the block sums and the statistics in torch (Sol's
    summary blocks centred with the quantizer's means mu_k / mu_v)."""
    if recipe.sparsity == "sol":
        return routing.sol_routing(q, k, v, recipe, layout=layout, scale=scale, sums=sums,
                                   mu_k=mu_k, mu_v=mu_v, config=config)
    return routing.vsa_routing(q, k, v, recipe, layout=layout, scale=scale, sums=sums,
                               config=config)


def dense_prefix_rows(q, k, v, prefix: int, scale: float) -> torch.Tensor:
    """BF16 dense attention of the first `prefix` query rows on the unquantized operands (SDPA)."""
    qp = q[:, :prefix].transpose(1, 2)
    kt, vt = k.transpose(1, 2), v.transpose(1, 2)
    o = torch.nn.functional.scaled_dot_product_attention(
        qp, kt, vt, scale=scale, enable_gqa=q.shape[2] != k.shape[2]
    )
    return o.transpose(1, 2)


def kernel_unavailable(q, k, v, recipe) -> str | None:
    """Why the kernels cannot run this call here (device, GPU generation, recipe or shape: one
    line), or None."""
    if q.device.type != "cuda":
        return "the kernels run on CUDA (Hopper) only"
    if torch.cuda.get_device_capability(q.device)[0] < 9:
        return "FP8 tensor cores need a Hopper (sm_90) or newer GPU"
    return unsupported_reason(q, k, v, get_recipe(recipe))


def try_kernel(q, k, v, recipe, *, layout: SegmentLayout | None = None, scale=None,
               config: KernelConfig = DEFAULT):
    """Full-sequence output [B, S, H, D] (q's dtype) from the kernels, or None when the recipe,
    shape or device is unsupported (``kernel_unavailable`` says why)."""
    if kernel_unavailable(q, k, v, recipe):
        return None
    return fp8_recipe_attention(q, k, v, recipe, layout=layout, scale=scale, config=config)

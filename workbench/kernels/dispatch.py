"""The full FP8 recipe call on the kernels, and ``try_kernel`` for the recipe runner.

Torch twin: ``workbench.attention.recipe_attention`` (all rows) for the dense FP8 recipes
``fp8_dense``, ``fp8_dense_k``, ``fp8_dense_kv_corrected`` and variants of them with the
dense-prefix
replacement. One call = statistics (``kv_stats``) -> centering + quantization (``quantize``) ->
attention with the fused epilogue (``attention_fp8``) -> BF16 prefix rows (SDPA on the unquantized
operands) copied into the same output. Extra memory beyond inputs and output: the FP8 copies of
Q/K/V (padded to 256 tokens) plus O(B*H*(D + S/64)) scales, vectors and partial sums.

Shapes compile once per class: S, B and H are run-time arguments of every kernel; only the head dim,
the dtype and the recipe's flags are compile-time constants, and there is no autotuning sweep.
"""

from __future__ import annotations

import math

import torch

from workbench.attention.layout import SegmentLayout
from workbench.recipes import AttentionRecipe, get_recipe

from .attention_fp8 import fp8_attention_fwd
from .kv_stats import kv_stats
from .quantize import quantize_qkv

# Chosen from scripts/gpu_kernels.py's sweeps on an H200 (see BENCHMARKS.md); any is correct.
# round_p None = explicit P rounding only in the interpreter (hardware cast on the GPU).
# 2026-11-30 second sweep at (1, 32626, 56, 128): 64x128 tiles, 4 warps, 2 stages, host TMA,
# register cap 168 (3 programs per SM instead of 2) = 40.9 / 41.9 ms; the previous default
# (3 stages, no cap) 43.4 / 44.7 ms in the same run. Lazy rescaling, 64-key tiles, 128-row tiles
# and triton's Hopper warp specialization were all slower (first sweep).
# Second session (third sweep, same shape): flush="fma" (the per-tile FP32 flush written so ptxas
# does not serialize the wgmmas) 39.6 / 40.1 ms vs 40.3 / 41.8 ms for triton's bound.
# Third session: sk_fold (the two K scales of a 128-key tile folded into per-half row maxes and
# the exponent's FMA): the main loop drops from 609 to 563 SASS instructions per tile (no
# per-element multiply by s_k; scripts/sass_stats.py).
TUNING = {"block_m": 64, "block_n": 128, "num_warps": 4, "num_stages": 2, "max_imprecise": 128,
          "round_p": None, "use_tma": True, "lazy_tau": 0.0, "maxnreg": 168, "flush": "fma",
          "sk_fold": True}

SUPPORTED_HEAD_DIMS = (64, 128)


def unsupported_reason(q, k, v, recipe: AttentionRecipe) -> str | None:
    """None when the kernels implement `recipe` on these operands, else why not (one line)."""
    r = recipe
    if r.qk_format != "fp8_e4m3" or r.qk_granularity != "block" or r.qk_block != 64:
        return "Q/K must be fp8_e4m3 with 64-token block scales"
    if r.v_format != "fp8_e4m3" or r.v_granularity != "channel":
        return "V must be fp8_e4m3 with channel scales"
    if r.p_format != "fp8_e4m3" or r.p_scaling != "unit":
        return "P must be fp8_e4m3 with unit scaling"
    if r.hadamard:
        return "no Hadamard kernel"
    if r.sparsity != "dense":
        return f"no {r.sparsity} sparse kernel (dense only)"
    if r.accumulation != "fp32":
        return "only the fp32 accumulation recipe (kernel flushes the FP8 accumulator per tile)"
    if q.dim() != 4 or k.shape != v.shape or k.shape[1] != q.shape[1]:
        return "self-attention [B, S, H, D] operands with matching K/V"
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
    **tuning,
):
    """The recipe on every row: q [B, S, H, D], k/v [B, S, Hkv, D] -> out [B, S, H, D] in q's dtype
    (and lse [B, H, S] float32, natural log, when asked; prefix rows hold the FP8 rows' LSE).

    Raises ValueError when the recipe or shape is unsupported (see ``unsupported_reason``).
    """
    recipe = get_recipe(recipe)
    why = unsupported_reason(q, k, v, recipe)
    if why:
        raise ValueError(f"fp8 kernels: {why} (recipe {recipe.to_string()!r})")
    H, D = q.shape[2], q.shape[3]
    scale = scale if scale is not None else 1.0 / math.sqrt(D)
    stats = kv_stats(k, v, smooth_k=recipe.smooth_k, smooth_v=recipe.smooth_v)
    qkv = quantize_qkv(q, k, v, stats.mu_k, stats.mu_v, stats.v_amax, smooth_k=recipe.smooth_k,
                       smooth_v=recipe.smooth_v, v_bias_correction=recipe.v_bias_correction)
    prefix = layout.prefix_len if (recipe.dense_prefix and layout is not None) else 0
    out = torch.empty_like(q)
    opts = {**TUNING, **tuning}
    out, lse = fp8_attention_fwd(qkv, num_heads=H, scale=scale, out=out, row_start=prefix,
                                 return_lse=return_lse, **opts)
    if prefix:
        out[:, :prefix] = dense_prefix_rows(q, k, v, prefix, scale)
    return (out, lse) if return_lse else out


def dense_prefix_rows(q, k, v, prefix: int, scale: float) -> torch.Tensor:
    """BF16 dense attention of the first `prefix` query rows on the unquantized operands (SDPA)."""
    qp = q[:, :prefix].transpose(1, 2)
    kt, vt = k.transpose(1, 2), v.transpose(1, 2)
    o = torch.nn.functional.scaled_dot_product_attention(
        qp, kt, vt, scale=scale, enable_gqa=q.shape[2] != k.shape[2]
    )
    return o.transpose(1, 2)


def try_kernel(q, k, v, recipe, *, layout: SegmentLayout | None = None, scale=None):
    """Full-sequence output [B, S, H, D] (q's dtype) from the kernels, or None when the recipe,
    shape or device is unsupported (the runner then uses the reference path)."""
    if q.device.type != "cuda" or torch.cuda.get_device_capability(q.device)[0] < 9:
        return None  # FP8 tensor cores: Hopper (sm_90) or newer
    recipe = get_recipe(recipe)
    if unsupported_reason(q, k, v, recipe):
        return None
    return fp8_recipe_attention(q, k, v, recipe, layout=layout, scale=scale)

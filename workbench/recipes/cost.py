"""Expected attention cost of a recipe, relative to dense BF16 attention (SDPA cuDNN = 1.0).

One table, ``DENSE_CALL_COST``: the time of a full dense attention call (statistics, quantization,
attention, epilogue) at H3's live shape (1, 32626, 56, 128) divided by SDPA cuDNN BF16's, from the
project's H200 measurements of 2026-11-30, commit ce8ba81 (BENCHMARKS.md, "Kernels: FP8 attention
on the H200", side by side): SDPA cuDNN 52.974 ms, fp8_dense 37.486 ms, fp8_dense_k 37.920 ms,
fp8_dense_kv_corrected 38.156 ms. Rows marked "assumed" have no measured kernel in this project.

Sparse recipes: a straight line in the exact density the evaluation measured at the entry
(``exact_fraction``), fitted to the full calls of the block-sparse kernels (routing, summary
route, BF16 prefix rows included) at densities 0.1 / 0.2 / 0.35 / 0.5 / 1 on the H200,
2026-12-01, commit 6625ea3 (BENCHMARKS.md, "Block-sparse attention"), relative to SDPA cuDNN in
the same run (53.862 ms): Sol 11.884 / 17.064 / 25.028 / 32.984 / 58.429 ms, VSA 9.829 / 15.002 /
23.308 / 31.635 / 59.465 ms. The fits assume the smoothed FP8 recipe they were measured with.
"""

from __future__ import annotations

from dataclasses import dataclass

from .recipe import AttentionRecipe

_SDPA_CUDNN_MS = 52.974  # the BF16 baseline of the measured ratios below


@dataclass(frozen=True)
class DenseCost:
    """Relative time of a dense call with these operand formats and smoothing, and its source."""

    relative: float
    source: str


DENSE_CALL_COST: dict[tuple[str, str, str], DenseCost] = {
    # (qk_format, v_format, smoothing)
    ("bf16", "bf16", "none"): DenseCost(1.0, "SDPA cuDNN BF16, 52.974 ms (H200, ce8ba81)"),
    ("fp8_e4m3", "fp8_e4m3", "none"): DenseCost(
        37.486 / _SDPA_CUDNN_MS, "fp8_dense full call 37.486 ms (H200, ce8ba81)"),
    ("fp8_e4m3", "fp8_e4m3", "k"): DenseCost(
        37.920 / _SDPA_CUDNN_MS, "fp8_dense_k full call 37.920 ms (H200, ce8ba81)"),
    ("fp8_e4m3", "fp8_e4m3", "kv"): DenseCost(
        38.156 / _SDPA_CUDNN_MS, "fp8_dense_kv_corrected full call 38.156 ms (H200, ce8ba81)"),
    # INT8 QK^T runs at the FP8 rate on Hopper's tensor cores; no INT8 kernel in this project.
    ("int8", "fp8_e4m3", "k"): DenseCost(
        37.920 / _SDPA_CUDNN_MS, "assumed equal to fp8_dense_k (no INT8 kernel measured)"),
    # FP32 / FP64 math: identities and ceilings, never deployed.
    ("exact", "exact", "none"): DenseCost(4.0, "assumed: FP32 math, not a deployable format"),
}


# (intercept, slope) of the measured full-call time against exact density, x SDPA cuDNN
SPARSE_CALL_FIT: dict[str, tuple[float, float]] = {"sol": (0.1268, 0.9605),
                                                    "vsa": (0.0756, 1.0270)}


def dense_call_cost(recipe: AttentionRecipe) -> DenseCost:
    """The dense-call cost row for this recipe's operand formats and smoothing.

    Combinations without a row fall back to the FP8 row of the same smoothing when any operand
    is quantized (else BF16), marked "assumed". Hadamard rotation adds one 128 x 128 product on
    Q and K, a memory-bound pass; it is charged nothing extra (assumed, not measured).
    """
    key = (recipe.qk_format, recipe.v_format, recipe.smoothing)
    if key in DENSE_CALL_COST:
        return DENSE_CALL_COST[key]
    if recipe.quantizes_qk or recipe.quantizes_v:
        row = DENSE_CALL_COST[("fp8_e4m3", "fp8_e4m3", recipe.smoothing)]
        return DenseCost(row.relative, f"assumed as FP8 with smoothing {recipe.smoothing!r}")
    return DenseCost(1.0, "assumed as BF16")


def cost_source(recipe: AttentionRecipe) -> str:
    """Where ``relative_cost`` takes this recipe's cost from (a plan records it)."""
    if recipe.sparsity in SPARSE_CALL_FIT:
        a, b = SPARSE_CALL_FIT[recipe.sparsity]
        return (f"{recipe.sparsity} full calls against exact density, {a} + {b} x density "
                "(H200, 6625ea3)")
    return dense_call_cost(recipe).source


def relative_cost(recipe: AttentionRecipe, *, density: float = 1.0,
                  prefix_fraction: float = 0.0) -> float:
    """Expected time of one attention call under `recipe`, relative to dense BF16 (= 1.0).

    density: fraction of (query block, key block) pairs computed exactly at this entry (1.0 for
    dense recipes). prefix_fraction: share of query rows before the video rows, which run in
    BF16 when the recipe has ``dense_prefix``.
    """
    if recipe.sparsity in SPARSE_CALL_FIT:
        # measured full calls: the prefix rows and the routing are in the fit already
        a, b = SPARSE_CALL_FIT[recipe.sparsity]
        return a + b * density
    body = dense_call_cost(recipe).relative
    if recipe.dense_prefix:
        return prefix_fraction * 1.0 + (1.0 - prefix_fraction) * body
    return body

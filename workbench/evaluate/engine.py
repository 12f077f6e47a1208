"""The evaluation engine: one entry's q/k/v + recipes in, one ``Comparison`` out.

``evaluate`` runs two or more recipes on the same sampled query rows against one float64 dense
reference and returns, per recipe, every boundary metric (overall and per head), the per-row
output error (for the paired bootstrap interval of a benefit), the output error along the
sequence, the per-channel token-mean drift of K and V and the routing map. The accuracy table,
the PR report, the smoothing explorer and the notebooks all format this one result, so what a
notebook shows is what a PR export writes.
"""

from __future__ import annotations

import dataclasses
import json
import numbers
import time
import zlib
from dataclasses import dataclass, field

import numpy as np
import torch

from workbench.attention import (
    SegmentLayout,
    dense_attention_f64,
    evenly_spaced_rows,
    recipe_attention,
)
from workbench.attention.layout import check_query_index
from workbench.metrics import (
    benefit_pct,
    bootstrap_benefit,
    boundary_metrics,
    channel_groups,
    drift_summary,
    error_along_tokens,
    error_by_segment,
    token_mean_drift,
)
from workbench.recipes import AttentionRecipe, get_recipe

# The rows of the seed PR's accuracy table, in its order.
TABLE_ROWS = ("quanted_k", "dequanted_v", "v_mean", "attention_output")


@dataclass
class RecipeEval:
    """One recipe on one entry: every number the table, report and explorer show."""

    name: str
    recipe: AttentionRecipe  # the recipe that ran (after the dense policy, when applied)
    overall: dict  # {boundary: {metric: value}}
    heads: dict  # {boundary: {metric: [value per selected head]}}
    along: dict  # workbench.metrics.error_along_tokens(...)
    segments: dict  # workbench.metrics.error_by_segment(along): {segment: {"rows", "mse"}}
    drift_k: np.ndarray  # [D] |mean_t(K_dq) - mean_t(K)| averaged over batch and heads
    drift_v: np.ndarray  # [D]
    # {"k_rot", "k_pass", "v_rot", "v_pass"}: mean drift per channel group (metrics.channel_groups:
    # an empty group has no key; "k_all", "v_all" when the RoPE split is unknown)
    drift_summary: dict
    exact_fraction: float
    block_map: np.ndarray | None  # [nq, nk] fraction of selected heads routing the pair exactly
    block: int
    row_sq_err: torch.Tensor  # [n] output squared error per sampled row (mean over B, H, D)
    seconds: float
    # [n, H] the same per selected head (mean over B, D): per-head bootstrap intervals (scan)
    row_sq_err_heads: torch.Tensor | None = None
    # how many [nq, nk] maps block_map averages (batch x selected heads; 0: no map)
    block_maps: int = 0


@dataclass
class Comparison:
    """Recipes evaluated on the same rows of one entry against one float64 reference."""

    evals: dict[str, RecipeEval]
    query_rows: list[int]
    heads: list[int]
    layout: SegmentLayout
    rotated: int | None  # RoPE channels per head (None: not known)
    seq_len: int
    seconds: float
    ref_seconds: float
    head_dim: int = 128
    causal: bool = False  # rows attended to keys 0..row only (decoder self-attention)
    scale: float | None = None  # softmax scale (None: 1/sqrt(D))
    extras: dict = field(default_factory=dict)

    def channel_groups(self, tensor: str = "K") -> list[tuple[str, str, int, int]]:
        """[(key, label, start, stop)] of the non-empty channel groups (rotated, pass-through;
        V's labelled as K's spans)."""
        return channel_groups(self.rotated, self.head_dim, tensor)

    def benefit(self, a: str, b: str, boundary: str = "attention_output",
                metric: str = "mse") -> float:
        """How much smaller B's error is than A's at `boundary`, percent of A's."""
        return benefit_pct(self.evals[a].overall[boundary][metric],
                           self.evals[b].overall[boundary][metric])

    def benefit_ci(self, a: str, b: str, level: float = 0.95) -> tuple[float, float]:
        """Paired bootstrap interval over the sampled rows of the output-MSE benefit of B."""
        return bootstrap_benefit(self.evals[a].row_sq_err, self.evals[b].row_sq_err,
                                 level=level)

    def readout(self) -> dict[str, dict[str, float]]:
        """{recipe: {short key: value}} for numeric readouts."""
        out = {}
        for name, e in self.evals.items():
            o = e.overall
            out[name] = {
                "output_mse": o["attention_output"]["mse"],
                "output_rel_l2": o["attention_output"]["rel_l2"],
                "output_cosine": o["attention_output"]["cosine"],
                "output_sqnr_db": o["attention_output"]["sqnr_db"],
                "k_mse": o["quanted_k"]["mse"],
                "v_mse": o["dequanted_v"]["mse"],
                "v_mean_mse": o["v_mean"]["mse"],
                "exact_fraction": e.exact_fraction,
                **{f"drift_{k}": v for k, v in e.drift_summary.items()},
            }
        return out


def per_query_head(values, n_heads: int) -> np.ndarray:
    """A boundary's per-head values as one per query head: a K / V boundary under GQA has one
    per K/V head, each query head taking its group's (select_heads keeps groups in order)."""
    vals = np.asarray(values, dtype=float)
    return vals if vals.shape[0] == n_heads else np.repeat(vals, n_heads // vals.shape[0])


def _tensor_key(t: torch.Tensor) -> tuple | None:
    """What a cached result of tensor t depends on: its identity, version counter, memory and
    view, and a fingerprint of its values. The version counter misses writes through ``.data``
    or ``.numpy()``, so the values are part of the key: a pass over the tensor per call, cache
    hits included (CPU: CRC-32 at ~2.2 GB/s, 45 ms for q, k, v of 2 heads of the live shape in
    float32; CUDA:
    sums of the bit patterns on the device, no copy to the host). None for an inference tensor
    (it has no version counter): not cached."""
    if t.is_inference():
        return None
    return (id(t), t._version, t.data_ptr(), tuple(t.shape), tuple(t.stride()), t.dtype,
            _fingerprint(t))


_INT_OF_SIZE = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _fingerprint(t: torch.Tensor) -> int | tuple[int, int]:
    """A fingerprint of the tensor's values in logical order: CRC-32 of the bytes on the CPU;
    on CUDA the int64 sums of the bit patterns, all and every 7th (a swap of two values changes
    the second), computed on the device."""
    flat = t.detach().contiguous().reshape(-1)
    if flat.device.type == "cpu":
        return zlib.crc32(flat.view(torch.uint8).numpy())
    bits = flat.view(_INT_OF_SIZE[flat.element_size()])
    sums = torch.stack([bits.sum(dtype=torch.int64), bits[::7].sum(dtype=torch.int64)])
    return tuple(int(x) for x in sums.cpu())


class _ReferenceCache:
    """float64 dense references by (tensor identity and version, rows); holds the tensors so
    ids stay valid."""

    def __init__(self, size: int = 8):
        self.size = size
        self._store: dict = {}

    def get(self, q, k, v, idx, causal=False, scale=None, tkeys=None) -> torch.Tensor:
        """tkeys: the three ``_tensor_key``s when the caller has them (each is a pass over
        its tensor)."""
        tkeys = tkeys if tkeys is not None else tuple(map(_tensor_key, (q, k, v)))
        if None in tkeys:  # inference tensors: computed each time
            return dense_attention_f64(q, k, v, query_index=idx, causal=causal, scale=scale)[0]
        key = (*tkeys, tuple(idx.tolist()), causal, scale)
        if key not in self._store:
            if len(self._store) >= self.size:
                self._store.pop(next(iter(self._store)))
            ref = dense_attention_f64(q, k, v, query_index=idx, causal=causal, scale=scale)[0]
            self._store[key] = (ref, (q, k, v))
        return self._store[key][0]


_REFERENCES = _ReferenceCache()


def evaluate(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    recipes: dict[str, AttentionRecipe | str],
    *,
    layout: SegmentLayout | None = None,
    n_queries: int = 64,
    query_index=None,
    heads: list[int] | None = None,
    rotated: int | None = None,
    step: int | None = None,
    layer: int | None = None,
    progress=None,
    cache: dict | None = None,
    causal: bool = False,
    scale: float | None = None,
) -> Comparison:
    """Run every recipe on the same rows of q [B, S, H, D], k/v [B, S, Hkv, D].

    causal: each row attends to keys 0..row only, in the recipes and in the reference (decoder
    models; dense recipes only). scale: the model's softmax scale (None: 1/sqrt(D)).
    recipes: {label: recipe spec}; labels key the result (e.g. "A"/"B" or the recipe strings).
    heads: labels of q's heads (default 0..H-1). rotated: RoPE channels per head, 0..D (None:
    not known; drift is then reported over all channels). step/layer apply the recipes' dense
    policy only when given. progress(i, n, message) is called before each stage (reference,
    then recipes).
    cache: a dict the caller keeps; a recipe already evaluated on the same tensors, rows and
    (step, layer) is taken from it (the explorer: changing B does not recompute A).
    """
    t0 = time.perf_counter()
    S = q.shape[1]
    layout = layout or SegmentLayout.tokens(S)
    channel_groups(rotated, q.shape[-1])  # a count the head dim cannot hold: say so before work
    if query_index is None:
        if isinstance(n_queries, bool) or not isinstance(n_queries, numbers.Integral) \
                or n_queries < 1:
            raise ValueError(f"n_queries: {n_queries!r}; give a positive number of query rows")
        idx = evenly_spaced_rows(S, int(n_queries))
    else:
        idx = query_index
    idx = check_query_index(idx, S, device=q.device)
    n = len(recipes) + 1
    if progress:
        progress(0, n, "float64 dense reference")
    tkeys = tuple(map(_tensor_key, (q, k, v)))  # None in it: inference tensors, not cached
    ref = _REFERENCES.get(q, k, v, idx, causal, scale, tkeys)
    ref_s = time.perf_counter() - t0
    evals = {}
    layout_key = json.dumps(layout.to_dict(), sort_keys=True)
    for i, (name, r) in enumerate(recipes.items(), start=1):
        if progress:
            progress(i, n, f"recipe {name}")
        r = get_recipe(r)
        key = None if None in tkeys else (*tkeys, r.to_json(), tuple(idx.tolist()), step, layer,
                                          rotated, causal, scale, layout_key)
        if cache is not None and key is not None and key in cache:
            evals[name] = dataclasses.replace(cache[key][0], name=name)
            continue
        evals[name] = _evaluate_one(name, r, q, k, v, ref, idx, layout, rotated, step, layer,
                                    causal, scale)
        if cache is not None and key is not None:
            if len(cache) > 256:
                cache.clear()
            # Holding q/k/v keeps their ids from being reused by other tensors while cached.
            cache[key] = (evals[name], (q, k, v))
    if progress:
        progress(n, n, "done")
    return Comparison(evals=evals, query_rows=[int(i) for i in idx.cpu().tolist()],
                      heads=list(heads) if heads is not None else list(range(q.shape[2])),
                      layout=layout, rotated=rotated, seq_len=S, head_dim=q.shape[-1],
                      causal=causal, scale=scale, seconds=time.perf_counter() - t0,
                      ref_seconds=ref_s)


def _evaluate_one(name, r, q, k, v, ref, idx, layout, rotated, step, layer, causal,
                  scale) -> RecipeEval:
    t1 = time.perf_counter()
    res = recipe_attention(q, k, v, r, query_index=idx, layout=layout, step=step, layer=layer,
                           return_block_map=True, causal=causal, scale=scale)
    bm = boundary_metrics(res, q, k, v, ref)
    dk = token_mean_drift(res.k_dq, k, rotated or 0)["per_channel"]
    dv = token_mean_drift(res.v_dq, v, rotated or 0)["per_channel"]
    block_map, block_maps = None, 0
    if res.block_map is not None:
        block_map = res.block_map.float().mean(dim=(0, 1)).cpu().numpy()
        block_maps = res.block_map.shape[0] * res.block_map.shape[1]
    block = res.recipe.sol_block if res.recipe.sparsity == "sol" else res.recipe.vsa_tile
    along = error_along_tokens(res, ref, layout)
    return RecipeEval(
        name=name, recipe=res.recipe, overall=bm.overall, heads=bm.heads,
        along=along, segments=error_by_segment(along),
        drift_k=dk.mean(dim=(0, 1)).cpu().numpy(),
        drift_v=dv.mean(dim=(0, 1)).cpu().numpy(),
        drift_summary={**{f"k_{g}": x for g, x in drift_summary(dk, rotated).items()},
                       **{f"v_{g}": x for g, x in drift_summary(dv, rotated).items()}},
        exact_fraction=res.exact_fraction, block_map=block_map, block=block,
        row_sq_err=bm.row_sq_err.cpu(), seconds=time.perf_counter() - t1,
        row_sq_err_heads=(res.out.double() - ref.double()).pow(2).mean(dim=(0, 3)).cpu(),
        block_maps=block_maps,
    )


def evaluate_entry(source, step, layer, recipes: dict[str, AttentionRecipe | str], *,
                   heads: list[int] | None = None, n_queries: int = 64,
                   dense_policy: bool = False, progress=None,
                   cache: dict | None = None) -> Comparison:
    """``evaluate`` on one (step, layer) entry of a ``ReplaySource`` (heads: captured head ids,
    default all). dense_policy: apply the recipes' dense steps / layers at this entry. A plan
    runs the recipe it plans at (step, layer) (``entry_recipe``)."""
    from workbench.recipes.plan import entry_recipe

    heads = list(heads) if heads is not None else list(source.heads)
    recipes = {name: entry_recipe(r, step, layer)[0] for name, r in recipes.items()}
    q, k, v = source.qkv(step, layer, heads)
    if hasattr(source, "call_at"):  # the entry's own causal flag and scale
        causal, scale = source.call_at(step, layer)
    else:
        causal, scale = getattr(source, "causal", False), getattr(source, "scale", None)
    return evaluate(q, k, v, recipes, layout=source.layout, n_queries=n_queries, heads=heads,
                    rotated=source.rotated, step=step if dense_policy else None,
                    layer=layer if dense_policy else None, progress=progress, cache=cache,
                    causal=causal, scale=scale)


def layer_head_grid(
    source,
    step,
    recipe: AttentionRecipe | str,
    *,
    boundary: str = "attention_output",
    metrics=("mse",),
    heads: list[int] | None = None,
    n_queries: int = 64,
    dense_policy: bool = False,
    cache: dict | None = None,
) -> dict[str, np.ndarray]:
    """{metric: [n_layers, n_heads]} of one recipe at one step, every layer of the source.

    recipe: a recipe, or a plan (``RecipePlan``, its JSON or file): then each layer runs the
    recipe the plan gives (step, layer), as ``generate`` would, not one recipe everywhere. A
    layer the source holds no entry of at `step` is NaN (a gap in the heatmap). A K / V boundary
    (``quanted_k``, ``dequanted_v``, ``v_mean``) under GQA has one value per K/V head: each query
    head's column shows its group's."""
    from workbench.recipes.plan import RecipePlan, entry_recipe

    heads = heads if heads is not None else source.heads
    plan = get_recipe(recipe)
    out = {m: np.zeros((len(source.layers), len(heads))) for m in metrics}
    for i, layer in enumerate(source.layers):
        if hasattr(source, "has") and not source.has(step, layer):
            for m in metrics:
                out[m][i] = np.nan
            continue
        r = entry_recipe(plan, step, layer)[0] if isinstance(plan, RecipePlan) else plan
        c = evaluate_entry(source, step, layer, {"r": r}, heads=heads, n_queries=n_queries,
                           dense_policy=dense_policy, cache=cache)
        for m in metrics:
            out[m][i] = per_query_head(c.evals["r"].heads[boundary][m], len(heads))
    return out


# The name this function had before the evaluation stage existed.
evaluate_recipes = evaluate

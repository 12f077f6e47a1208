"""The numbers behind the figures: replay a store entry through recipes on the reference path.

``ReplaySource`` wraps a capture store (or in-memory q/k/v) with a small cache of decoded entries;
``evaluate_recipes`` runs two or more recipes on the same sampled query rows against one float64
dense reference and returns, per recipe, every boundary metric (overall and per head), the output
error along the sequence, the per-channel token-mean drift of K and V and the routing map. The
widgets and the report both call these, so what a notebook shows is what a PR export writes.
"""

from __future__ import annotations

import dataclasses
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from workbench.attention import (
    SegmentLayout,
    dense_attention_f64,
    evenly_spaced_rows,
    recipe_attention,
)
from workbench.metrics import boundary_metrics, error_along_tokens, token_mean_drift
from workbench.recipes import AttentionRecipe, get_recipe

REPO_ROOT = Path(__file__).resolve().parents[2]
CAPTURES_DIR = REPO_ROOT / "captures"


def default_device() -> str:
    """The reference path runs on CUDA when present, else on the CPU."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def shipped_stores(root: Path | str = CAPTURES_DIR) -> list[Path]:
    """Capture stores (directories holding a zarr.json) under captures/, sorted by name."""
    root = Path(root)
    if not root.is_dir():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and (p / "zarr.json").exists())


def find_store(store: str | Path | None = None) -> Path:
    """`store` if given, else the first store shipped under captures/ (FileNotFoundError if
    none)."""
    if store:
        p = Path(store)
        if not (p / "zarr.json").exists():
            raise FileNotFoundError(f"{p}: no capture store here (no zarr.json)")
        return p
    found = shipped_stores()
    if not found:
        raise FileNotFoundError(
            f"no capture store under {CAPTURES_DIR}; make one with `workbench capture --model "
            "h3-tiny --out captures/h3_tiny.zarr`")
    return found[0]


class ReplaySource:
    """Entries of a capture store (or one in-memory q/k/v) as float32 tensors, cached.

    q [B, S, H, D], k/v [B, S, Hkv, D]. ``heads`` are the captured query head ids.
    """

    def __init__(self, store: str | Path | None = None, *, tensors=None,
                 layout: SegmentLayout | None = None, rotated: int = 96, name: str = "tensors",
                 device: str | None = None, cache_size: int = 16):
        self.device = device or default_device()
        self._cache: dict = {}
        self._cache_size = cache_size
        if tensors is not None:
            q, k, v = tensors
            self.path = None
            self.name = name
            self.steps, self.layers = [0], [0]
            self.heads = list(range(q.shape[2]))
            self.layout = layout or SegmentLayout.all_video(q.shape[1])
            self.rotated = rotated
            self._cache[(0, 0)] = tuple(t.float().to(self.device) for t in (q, k, v))
            self.cap = None
            return
        from workbench.capture import open_capture

        self.path = find_store(store)
        self.name = self.path.name
        self.cap = open_capture(self.path)
        self.steps = self.cap.steps or [None]
        self.layers = self.cap.layers
        if not self.layers:
            raise FileNotFoundError(f"{self.path}: no complete (step, layer) entries")
        e = self.cap.find(self.steps[0], self.layers[0])
        meta = self.cap.root[e.path].attrs
        self.heads = [int(h) for h in meta["q_heads"]]
        self.layout = self.cap.layout
        self.rotated = int(self.cap.rotated_channels or rotated)

    def describe(self) -> str:
        seq = self.layout.total
        return (f"{self.name}: steps {self.steps}, layers {self.layers}, heads {self.heads}, "
                f"{seq:,} rows {self.layout.to_dict()}, rotated channels {self.rotated}")

    def qkv(self, step, layer, heads=None):
        """(q, k, v) float32 on the source's device; heads = captured query head ids (None: all)."""
        key = (step, layer)
        if key not in self._cache:
            if self.cap is None:
                raise KeyError(f"in-memory source has only (step, layer) = (0, 0), not {key}")
            q, k, v = self.cap.qkv(step, layer)
            if len(self._cache) >= self._cache_size:
                self._cache.pop(next(iter(self._cache)))
            self._cache[key] = tuple(t.float().to(self.device) for t in (q, k, v))
        q, k, v = self._cache[key]
        if heads is None or list(heads) == self.heads:
            return q, k, v
        from workbench.attention import select_heads

        return select_heads(q, k, v, [self.heads.index(h) for h in heads])


@dataclass
class RecipeEval:
    """One recipe on one entry: every number the explorer and the report show."""

    name: str
    recipe: AttentionRecipe
    overall: dict  # {boundary: {metric: value}}
    heads: dict  # {boundary: {metric: [value per selected head]}}
    along: dict  # workbench.metrics.error_along_tokens(...)
    drift_k: np.ndarray  # [D] |mean_t(K_dq) - mean_t(K)| averaged over batch and heads
    drift_v: np.ndarray  # [D]
    drift_summary: dict  # {"k_rot", "k_pass", "v_rot", "v_pass"}
    exact_fraction: float
    block_map: np.ndarray | None  # [nq, nk] fraction of selected heads routing the pair exactly
    block: int
    row_sq_err: torch.Tensor
    seconds: float


@dataclass
class Comparison:
    evals: dict[str, RecipeEval]
    query_rows: list[int]
    heads: list[int]
    layout: SegmentLayout
    rotated: int
    seconds: float
    ref_seconds: float
    extras: dict = field(default_factory=dict)

    def readout(self) -> dict[str, dict[str, float]]:
        """{recipe: {short key: value}} for the numeric readout."""
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
            }
        return out


_REF_CACHE: dict = {}


def _reference(q, k, v, idx):
    """float64 dense reference for the sampled rows; cached on tensor identity + rows."""
    key = (id(q), id(k), id(v), tuple(idx.tolist()), q.shape)
    if key not in _REF_CACHE:
        if len(_REF_CACHE) > 8:
            _REF_CACHE.clear()
        _REF_CACHE[key] = (dense_attention_f64(q, k, v, query_index=idx)[0], (q, k, v))
    return _REF_CACHE[key][0]


def evaluate_recipes(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    recipes: dict[str, AttentionRecipe | str],
    *,
    layout: SegmentLayout | None = None,
    n_queries: int = 64,
    query_index=None,
    heads: list[int] | None = None,
    rotated: int = 96,
    step: int | None = None,
    layer: int | None = None,
    progress=None,
    cache: dict | None = None,
) -> Comparison:
    """Run every recipe on the same rows of q [B, S, H, D], k/v [B, S, Hkv, D].

    heads: labels of q's heads (default 0..H-1). step/layer apply the recipes' dense policy only
    when given. progress(i, n, message) is called before each stage (reference, then recipes).
    cache: a dict the caller keeps; a recipe already evaluated on the same tensors, rows and
    (step, layer) is taken from it (the widget: changing B does not recompute A).
    """
    t0 = time.perf_counter()
    S = q.shape[1]
    layout = layout or SegmentLayout.all_video(S)
    idx = evenly_spaced_rows(S, n_queries) if query_index is None else torch.as_tensor(query_index)
    idx = idx.to(q.device)
    n = len(recipes) + 1
    if progress:
        progress(0, n, "float64 dense reference")
    ref = _reference(q, k, v, idx)
    ref_s = time.perf_counter() - t0
    evals = {}
    for i, (name, r) in enumerate(recipes.items(), start=1):
        if progress:
            progress(i, n, f"recipe {name}")
        t1 = time.perf_counter()
        r = get_recipe(r)
        key = (id(q), id(k), id(v), r.to_json(), tuple(idx.tolist()), step, layer, rotated)
        if cache is not None and key in cache:
            evals[name] = dataclasses.replace(cache[key][0], name=name)
            continue
        res = recipe_attention(q, k, v, r, query_index=idx, layout=layout, step=step, layer=layer,
                               return_block_map=True)
        bm = boundary_metrics(res, q, k, v, ref)
        dk = token_mean_drift(res.k_dq, k, rotated)
        dv = token_mean_drift(res.v_dq, v, rotated)
        block_map = None
        if res.block_map is not None:
            block_map = res.block_map.float().mean(dim=(0, 1)).cpu().numpy()
        block = res.recipe.sol_block if res.recipe.sparsity == "sol" else res.recipe.vsa_tile
        evals[name] = RecipeEval(
            name=name, recipe=res.recipe, overall=bm.overall, heads=bm.heads,
            along=error_along_tokens(res, ref, layout),
            drift_k=dk["per_channel"].mean(dim=(0, 1)).cpu().numpy(),
            drift_v=dv["per_channel"].mean(dim=(0, 1)).cpu().numpy(),
            drift_summary={"k_rot": dk["rotated"], "k_pass": dk["passthrough"],
                           "v_rot": dv["rotated"], "v_pass": dv["passthrough"]},
            exact_fraction=res.exact_fraction, block_map=block_map, block=block,
            row_sq_err=bm.row_sq_err.cpu(), seconds=time.perf_counter() - t1,
        )
        if cache is not None:
            if len(cache) > 256:
                cache.clear()
            # Holding q/k/v keeps their ids from being reused by other tensors while cached.
            cache[key] = (evals[name], (q, k, v))
    if progress:
        progress(n, n, "done")
    return Comparison(evals=evals, query_rows=[int(i) for i in idx.cpu().tolist()],
                      heads=list(heads) if heads is not None else list(range(q.shape[2])),
                      layout=layout, rotated=rotated, seconds=time.perf_counter() - t0,
                      ref_seconds=ref_s)


def layer_head_grid(
    source: ReplaySource,
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
    """{metric: [n_layers, n_heads]} of one recipe at one step, every layer of the source."""
    heads = heads if heads is not None else source.heads
    out = {m: np.zeros((len(source.layers), len(heads))) for m in metrics}
    for i, layer in enumerate(source.layers):
        q, k, v = source.qkv(step, layer, heads)
        c = evaluate_recipes(q, k, v, {"r": recipe}, layout=source.layout, n_queries=n_queries,
                             heads=heads, rotated=source.rotated,
                             step=step if dense_policy else None,
                             layer=layer if dense_policy else None, cache=cache)
        for m in metrics:
            out[m][i] = c.evals["r"].heads[boundary][m]
    return out

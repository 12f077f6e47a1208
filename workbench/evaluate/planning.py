"""A per-(step, layer) recipe plan from a scan, under one stated rule.

Rules (``PlanRule``):

- ``min_sqnr``: at each entry, the cheapest recipe whose output SQNR (against float64 dense
  attention, over the scan's sampled rows) is >= ``budget`` dB; the fallback recipe (dense BF16 by
  default) where none is. Equal costs go to the higher SQNR.
- ``max_cost``: at each entry, the most accurate recipe (highest output SQNR) whose expected cost
  is <= ``budget`` x dense BF16; the cheapest recipe where none is. Equal SQNRs go to the cheaper.

``reduce="worst_head"`` judges a recipe by its worst head's SQNR instead of the entry's.
``v_centring_guard``: a recipe that centres V (smoothing "kv") is not a candidate at an entry where
its K-only twin in the scan (the same recipe with smoothing "k", no V-bias correction) has a
significantly smaller output error there (the 95% paired-bootstrap interval of the kv recipe's
benefit over the twin lies below 0): K-only smoothing runs where V centring hurts.

Costs come from ``workbench.recipes.cost.relative_cost`` with the density measured at the entry.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

import numpy as np

from workbench.recipes import PRESETS, AttentionRecipe, PlanEntry, RecipePlan
from workbench.recipes.cost import cost_source, relative_cost

from .scan_store import ScanError

RULES = ("min_sqnr", "max_cost")
REDUCTIONS = ("entry", "worst_head")
SQNR = "attention_output_sqnr_db"


@dataclass(frozen=True)
class PlanRule:
    """How a plan picks the recipe of each entry (see the module docstring)."""

    rule: str = "min_sqnr"
    budget: float = 30.0  # dB for min_sqnr; relative cost (dense BF16 = 1) for max_cost
    reduce: str = "entry"
    v_centring_guard: bool = True
    fallback: str = "bf16"  # recipe spec where no recipe qualifies (min_sqnr)

    def __post_init__(self):
        if self.rule not in RULES:
            raise ScanError(f"--rule: unknown rule {self.rule!r}; choose one of {RULES}")
        if self.reduce not in REDUCTIONS:
            raise ScanError(f"--reduce: unknown {self.reduce!r}; choose one of {REDUCTIONS}")
        if not np.isfinite(self.budget):
            raise ScanError(f"--budget: must be a finite number, got {self.budget}")
        if self.rule == "max_cost" and self.budget <= 0:
            raise ScanError(f"--budget: a cost budget must be > 0 (x dense BF16), got "
                            f"{self.budget}")

    def describe(self) -> str:
        what = "the entry's" if self.reduce == "entry" else "the worst head's"
        if self.rule == "min_sqnr":
            text = (f"cheapest recipe with {what} output SQNR >= {self.budget:g} dB, else "
                    f"{self.fallback}")
        else:
            text = (f"highest {what} output SQNR at cost <= {self.budget:g} x dense BF16, else "
                    "the cheapest recipe")
        if self.v_centring_guard:
            text += "; K-only smoothing where V centring significantly hurts"
        return text


def scan_recipe_at(ds, label: str, step: int, layer: int, *,
                   dense_policy: bool | None = None) -> AttentionRecipe:
    """The AttentionRecipe the scan measured for `label` at (step, layer): a plan's recipe of
    the entry, or the recipe; its dense policy applied when the scan applied it, else removed
    (its own numerics at every entry). dense_policy: override the scan's choice (False: the
    recipe's own numerics, e.g. to tell which recipes are twins)."""
    from workbench.recipes.plan import entry_recipe

    r = entry_recipe(str(ds.recipe_spec.sel(recipe=label).values), step, layer)[0]
    if dense_policy is None:
        dense_policy = bool(ds.attrs["params"]["dense_policy"])
    if dense_policy:
        return r.at(step, layer)
    return r.with_(dense_steps=0, dense_layers=0)


def twin_k_only(recipe: AttentionRecipe) -> AttentionRecipe | None:
    """The same recipe with K-only smoothing (None unless it centres V)."""
    if recipe.smoothing != "kv":
        return None
    return recipe.with_(smoothing="k", v_bias_correction=False)


def _same_numerics(a: AttentionRecipe, b: AttentionRecipe) -> bool:
    return a.numerics_key() == b.numerics_key()


def v_centring_hurts(ds) -> dict[str, np.ndarray]:
    """{kv recipe label: bool [step, layer]} where its K-only twin in the scan is significantly
    better (CI of the kv recipe's benefit over the twin entirely below 0)."""
    from .scan import pair_benefit

    labels = [str(x) for x in ds.recipe.values]
    s0, l0 = int(ds.step.values[0]), int(ds.layer.values[0])
    # twins by their own numerics (a dense policy makes every recipe BF16 at some entries)
    at = {lab: scan_recipe_at(ds, lab, s0, l0, dense_policy=False) for lab in labels}
    out = {}
    for lab in labels:
        twin = twin_k_only(at[lab])
        if twin is None:
            continue
        match = [t for t in labels if t != lab and _same_numerics(at[t], twin)]
        if match:
            ben = pair_benefit(ds, match[0], lab)
            out[lab] = (ben.sel(stat="ci_hi") < 0).values
    return out


def _prefix_fraction(ds) -> float:
    from workbench.layout import SegmentLayout

    d = json.loads(ds.attrs["params"].get("segment_layout") or "{}")
    if not d:
        return 0.0
    layout = SegmentLayout.from_dict(d)  # H3's row counts or named segments
    return layout.prefix_len / layout.total if layout.total else 0.0


def _capture_grid(store: str, store_id: str | None = None) -> dict:
    """{"grid_points": N} of the scanned capture's sampling schedule when its store records it
    (a plan's step indices mean those grid points; ``generate`` notes a run on another grid),
    else {} (a capture of another model, a store no longer at its path, or another store there
    now: its fingerprint is not the scan's store_id)."""
    from workbench.capture import open_capture

    try:
        cap = open_capture(store)
        attrs = cap.attrs
        if store_id is not None:
            from .scan_store import store_fingerprint

            if store_fingerprint(cap) != store_id:
                return {}
    except Exception:  # noqa: BLE001 - no readable capture there: the grid is unknown
        return {}
    n = attrs.get("sampling_grid_points")
    return {"grid_points": n} if isinstance(n, int) and not isinstance(n, bool) else {}


def derive_plan(ds, rule: PlanRule, *, name: str = "plan", default: str | None = None
                ) -> RecipePlan:
    """The plan of `rule` over every done entry of the scan `ds` (``open_scan``)."""
    if not bool(ds.done.all()):
        missing = int((~ds.done).sum())
        raise ScanError(f"{ds.attrs.get('path', 'scan')}: {missing} (entry, recipe) tasks are "
                        "not done; finish the scan (run it again: it resumes) before planning")
    labels = [str(x) for x in ds.recipe.values]
    from workbench.recipes.plan import single_recipe

    fallback = single_recipe(rule.fallback, "--fallback")
    if not ds.attrs["params"]["dense_policy"]:  # as the scanned recipes: their own numerics
        fallback = fallback.with_(dense_steps=0, dense_layers=0)
    # the default (entries the scan did not cover) is the fallback as the plan runs it, one
    # recipe under one label (it kept the dense policy the fallback had dropped: BF16 there)
    default_recipe = single_recipe(default, "--default") if default else fallback
    hurts = v_centring_hurts(ds) if rule.v_centring_guard else {}
    pf = _prefix_fraction(ds)
    if rule.reduce == "entry":
        sqnr = ds.entry_metrics.sel(metric=SQNR).transpose("step", "layer", "recipe").values
    else:
        sqnr = ds.head_metrics.sel(metric=SQNR).min("head").transpose(
            "step", "layer", "recipe").values
    density = ds.entry_metrics.sel(metric="exact_fraction").transpose(
        "step", "layer", "recipe").values
    recipes: dict[str, AttentionRecipe] = {}

    def label_of(r: AttentionRecipe, scan_label: str) -> str:
        for lab, have in recipes.items():
            if _same_numerics(have, r):
                return lab
        lab = scan_label if scan_label not in recipes else f"{scan_label}#{len(recipes)}"
        for preset in ("bf16",):
            if _same_numerics(PRESETS[preset], r) and preset not in recipes:
                lab = preset
        recipes[lab] = r
        return lab

    entries = []
    for si, step in enumerate(int(x) for x in ds.step.values):
        for li, layer in enumerate(int(x) for x in ds.layer.values):
            cands = []
            for ri, lab in enumerate(labels):
                r = scan_recipe_at(ds, lab, step, layer)
                cost = relative_cost(r, density=float(density[si, li, ri]), prefix_fraction=pf)
                excluded = lab in hurts and bool(hurts[lab][si, li])
                cands.append((lab, r, cost, float(sqnr[si, li, ri]), excluded))
            entries.append(_choose(step, layer, cands, rule, fallback, label_of, pf))
    default_label = label_of(default_recipe, "default")
    costs = [e.cost for e in entries]
    uniform = {lab: float(np.mean([c[2] for c in _uniform_costs(ds, lab, density, pf)]))
               for lab in labels}
    return RecipePlan(
        recipes=recipes, entries=tuple(entries), default=default_label, name=name,
        rule={**asdict(rule), "text": rule.describe()},
        source={"scan": ds.attrs.get("path"), "store": ds.attrs["params"]["store"],
                "store_id": ds.attrs["params"]["store_id"],
                "n_queries": ds.attrs["params"]["n_queries"],
                "heads": ds.attrs["params"]["heads"],
                "dense_policy": ds.attrs["params"]["dense_policy"],
                **_capture_grid(ds.attrs["params"]["store"], ds.attrs["params"]["store_id"])},
        expected_cost={
            "relative_to_bf16": float(np.mean(costs)),
            "entries": len(entries),
            "uniform_recipes": uniform,
            "basis": "mean over the planned entries of workbench.recipes.cost.relative_cost "
                     "(dense BF16 = 1; every entry is one attention call of the same shape)",
            "cost_sources": {lab: cost_source(r) for lab, r in recipes.items()},
        },
    )


def _uniform_costs(ds, lab, density, pf):
    ri = [str(x) for x in ds.recipe.values].index(lab)
    for si, step in enumerate(int(x) for x in ds.step.values):
        for li, layer in enumerate(int(x) for x in ds.layer.values):
            r = scan_recipe_at(ds, lab, step, layer)
            yield (step, layer, relative_cost(r, density=float(density[si, li, ri]),
                                              prefix_fraction=pf))


def _choose(step, layer, cands, rule: PlanRule, fallback, label_of,
            prefix_fraction: float = 0.0) -> PlanEntry:
    """cands: [(label, recipe, cost, sqnr, excluded)] -> the PlanEntry the rule picks. The
    fallback, when the scan measured its numerics here, is that candidate (its label and its
    cost at the measured density)."""
    fb = next((c for c in cands if _same_numerics(c[1], fallback)), None)
    # a fallback the scan did not run is costed with the scan's prefix rows too (a sparse one
    # at density 1: no density was measured for it)
    fb_recipe, fb_cost = (fb[1], fb[2]) if fb else (
        fallback, relative_cost(fallback, prefix_fraction=prefix_fraction))
    ok = [c for c in cands if not c[4] and np.isfinite(c[2]) and not np.isnan(c[3])]
    guard = [c[0] for c in cands if c[4]]
    why_guard = f"; V centring hurts here, not a candidate: {', '.join(guard)}" if guard else ""
    if rule.rule == "min_sqnr":
        good = [c for c in ok if c[3] >= rule.budget]
        if good:
            lab, r, cost, q, _ = min(good, key=lambda c: (c[2], -c[3]))
            note = f"SQNR {q:.2f} dB >= {rule.budget:g}; cheapest qualifying{why_guard}"
            return PlanEntry(step, layer, label_of(r, lab), cost, note)
        best = max(ok, key=lambda c: c[3]) if ok else None
        best_txt = f" (best: {best[0]} at {best[3]:.2f} dB)" if best else ""
        note = f"no recipe reaches {rule.budget:g} dB{best_txt}: {rule.fallback}{why_guard}"
        return PlanEntry(step, layer, label_of(fb_recipe, rule.fallback), fb_cost, note)
    within = [c for c in ok if c[2] <= rule.budget]
    if not ok:
        return PlanEntry(step, layer, label_of(fb_recipe, rule.fallback), fb_cost,
                         f"no candidate: {rule.fallback}{why_guard}")
    if within:
        lab, r, cost, q, _ = max(within, key=lambda c: (c[3], -c[2]))
        note = f"cost {cost:.3f} <= {rule.budget:g}; highest SQNR ({q:.2f} dB){why_guard}"
    else:
        lab, r, cost, q, _ = min(ok, key=lambda c: (c[2], -c[3]))
        note = f"no recipe within cost {rule.budget:g}: cheapest ({cost:.3f}){why_guard}"
    return PlanEntry(step, layer, label_of(r, lab), cost, note)

"""Figures of a scan (``workbench.evaluate.open_scan``) and of a plan: pure builders.

- ``metric_grid``: step x layer heatmap of one metric of one recipe (e.g. output SQNR);
- ``benefit_grid``: a benefit with its 95% paired-bootstrap interval on any 2-D grid (step x
  layer, or layer x head): the cell text gives the benefit and the interval, and an "x" marks the
  cells whose interval crosses 0 (not significant on the sampled rows);
- ``smoothing_effect``: where smoothing helps, hurts or is unclear, per entry, for every
  (less smoothing, more smoothing) pair of recipes in the scan;
- ``plan_grid``: the plan as a step x layer grid of discrete colours with a legend.
``scan_figures`` returns the set a report writes: {name: (figure, caption)}.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from .figures import RECIPE_COLORS, _finite_or_none, _np, _tpl, per_head_heatmap

SQNR = "attention_output_sqnr_db"
EFFECT_COLORS = {"helps": "#4C72B0", "unclear": "#DDDDDD", "hurts": "#C44E52"}


def _labels(values) -> list[str]:
    return [str(v) for v in values]


def metric_grid(values, *, steps: Sequence[int], layers: Sequence[int], metric: str = SQNR,
                recipe: str = "") -> go.Figure:
    """Step (x) x layer (y) heatmap of values [n_steps, n_layers]; exact values in the cells."""
    z = _np(values)
    if z.shape != (len(steps), len(layers)):
        raise ValueError(f"metric_grid: values shape {z.shape} != (steps {len(steps)}, layers "
                         f"{len(layers)})")
    fig = go.Figure(go.Heatmap(
        z=[_finite_or_none(r) for r in z.T], x=_labels(steps), y=_labels(layers),
        colorscale="Viridis", xgap=1, ygap=1, colorbar=dict(title=metric),
        text=[[f"{v:.3g}" for v in r] for r in z.T] if z.size <= 400 else None,
        texttemplate="%{text}" if z.size <= 400 else None,
        hovertemplate="step %{x}, layer %{y}<br>" + metric + " = %{z:.6g}<extra></extra>",
        name=recipe or metric))
    fig.update_layout(template=_tpl(), title=f"{metric} per step and layer" +
                      (f" ({recipe})" if recipe else ""), xaxis_title="step",
                      yaxis_title="layer", xaxis_type="category", yaxis_type="category")
    return fig


def benefit_grid(benefit, ci_lo, ci_hi, *, x: Sequence, y: Sequence, x_title: str = "step",
                 y_title: str = "layer", title: str = "benefit") -> go.Figure:
    """Diverging heatmap of a benefit (%) on a [len(x), len(y)] grid with its interval visible.

    Blue = positive (the candidate's error is smaller). Cell text: benefit and [lo, hi]; an "x"
    marks every cell whose interval contains 0.
    """
    b, lo, hi = (_np(a) for a in (benefit, ci_lo, ci_hi))
    if not (b.shape == lo.shape == hi.shape == (len(x), len(y))):
        raise ValueError(f"benefit_grid: shapes {b.shape}, {lo.shape}, {hi.shape} != "
                         f"({len(x)}, {len(y)})")
    fin = np.abs(b[np.isfinite(b)])
    lim = float(np.percentile(fin, 95)) if fin.size else 1.0
    lim = lim if lim > 0 else 1.0
    text = [[f"{b[i, j]:.1f}%<br>[{lo[i, j]:.1f}, {hi[i, j]:.1f}]"
             if math.isfinite(b[i, j]) else "" for i in range(len(x))] for j in range(len(y))]
    small = b.size <= 120
    fig = go.Figure(go.Heatmap(
        z=[_finite_or_none(r) for r in np.clip(b, -lim, lim).T], x=_labels(x), y=_labels(y),
        customdata=np.stack([b.T, lo.T, hi.T], axis=-1).tolist(),
        colorscale="RdBu", zmid=0, zmin=-lim, zmax=lim, xgap=1, ygap=1,
        colorbar=dict(title="benefit %"), text=text if small else None,
        texttemplate="%{text}" if small else None, textfont=dict(size=9),
        hovertemplate=(f"{x_title} %{{x}}, {y_title} %{{y}}<br>benefit %{{customdata[0]:.2f}}%"
                       "<br>95% CI [%{customdata[1]:.2f}, %{customdata[2]:.2f}]<extra></extra>"),
        name="benefit"))
    cross = [(i, j) for i in range(len(x)) for j in range(len(y))
             if math.isfinite(lo[i, j]) and lo[i, j] <= 0 <= hi[i, j]]
    fig.add_trace(go.Scatter(
        x=[str(x[i]) for i, _ in cross], y=[str(y[j]) for _, j in cross], mode="markers",
        marker=dict(symbol="x-thin-open", size=22, color="rgba(60,60,60,0.55)",
                    line=dict(width=1.5)),
        name="95% CI crosses 0", hoverinfo="skip", showlegend=True))
    fig.update_layout(template=_tpl(), title=title, xaxis_title=x_title, yaxis_title=y_title,
                      xaxis_type="category", yaxis_type="category",
                      legend=dict(orientation="h", y=-0.15))
    return fig


def smoothing_pairs(ds) -> list[tuple[str, str]]:
    """(less smoothing, more smoothing) recipe pairs of the scan: none -> k and k -> kv twins
    (same recipe otherwise)."""
    from workbench.evaluate.planning import _same_numerics, scan_recipe_at

    labels = _labels(ds.recipe.values)
    s0, l0 = int(ds.step.values[0]), int(ds.layer.values[0])
    # pairs by their own numerics (a dense policy makes every recipe BF16 at some entries)
    at = {lab: scan_recipe_at(ds, lab, s0, l0, dense_policy=False) for lab in labels}
    pairs = []
    for more in labels:
        r = at[more]
        if r.smoothing == "k":
            less = r.with_(smoothing="none")
        elif r.smoothing == "kv":
            less = r.with_(smoothing="k", v_bias_correction=False)
        else:
            continue
        pairs += [(lab, more) for lab in labels if lab != more and _same_numerics(at[lab], less)]
    return pairs


def smoothing_effect(effects: dict, *, steps: Sequence[int], layers: Sequence[int]) -> go.Figure:
    """Where smoothing helps / hurts / is unclear. effects: {"A -> B": [n_steps, n_layers, 3]
    (benefit %, ci_lo, ci_hi) of B over A}; one panel per pair, discrete colours."""
    names = list(effects)
    if not names:
        fig = go.Figure()
        fig.update_layout(template=_tpl(), title="no (less, more smoothing) recipe pair in the "
                          "scan: add e.g. fp8_dense, fp8_dense_k and fp8_dense_kv_corrected")
        return fig
    fig = make_subplots(rows=1, cols=len(names), subplot_titles=names, shared_yaxes=True,
                        horizontal_spacing=0.04)
    scale = [[0.0, EFFECT_COLORS["hurts"]], [0.333, EFFECT_COLORS["hurts"]],
             [0.333, EFFECT_COLORS["unclear"]], [0.667, EFFECT_COLORS["unclear"]],
             [0.667, EFFECT_COLORS["helps"]], [1.0, EFFECT_COLORS["helps"]]]
    for c, name in enumerate(names, start=1):
        e = _np(effects[name])
        cls = np.where(e[..., 1] > 0, 1.0, np.where(e[..., 2] < 0, -1.0, 0.0))
        missing = ~np.isfinite(e).all(-1)  # an entry the scan has no value of: a gap, not
        # "unclear"
        cls = np.where(missing, np.nan, cls)
        text = [["" if missing[i, j] else f"{e[i, j, 0]:.0f}%" for i in range(len(steps))]
                for j in range(len(layers))]
        fig.add_trace(go.Heatmap(
            z=[[None if not np.isfinite(x) else float(x) for x in r] for r in cls.T],
            x=_labels(steps), y=_labels(layers), zmin=-1, zmax=1,
            colorscale=scale, showscale=False, xgap=1, ygap=1, text=text,
            texttemplate="%{text}", textfont=dict(size=9),
            customdata=np.stack([e[..., 0].T, e[..., 1].T, e[..., 2].T], -1).tolist(),
            hovertemplate=("step %{x}, layer %{y}<br>benefit %{customdata[0]:.2f}%<br>95% CI "
                           "[%{customdata[1]:.2f}, %{customdata[2]:.2f}]<extra>" + name +
                           "</extra>")), row=1, col=c)
        fig.update_xaxes(title_text="step", type="category", row=1, col=c)
    for label, color in EFFECT_COLORS.items():
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=f"smoothing {label}",
                                 marker=dict(size=12, symbol="square", color=color)))
    fig.update_yaxes(title_text="layer", type="category", row=1, col=1)
    fig.update_layout(template=_tpl(), title="where smoothing helps or hurts (output-MSE benefit "
                      "of the more smoothed recipe, 95% paired-bootstrap interval)",
                      legend=dict(orientation="h", y=-0.2))
    return fig


def plan_grid(plan, *, steps: Sequence[int], layers: Sequence[int]) -> go.Figure:
    """The plan's recipe per (step, layer) as discrete colours, one legend entry per recipe."""
    labels = list(plan.recipes)
    index = {lab: i for i, lab in enumerate(labels)}
    z = np.array([[index[plan.label_at(s, la)] for s in steps] for la in layers], dtype=float)
    n = len(labels)
    scale = []
    for i, _ in enumerate(labels):
        color = RECIPE_COLORS[i % len(RECIPE_COLORS)]
        scale += [[i / n, color], [(i + 1) / n, color]]
    costs = {(e.step, e.layer): e.cost for e in plan.entries if e.cost is not None}
    text = [[f"{costs[(s, la)]:.2f}" if (s, la) in costs else "" for s in steps]
            for la in layers]
    fig = go.Figure(go.Heatmap(
        z=z.tolist(), x=_labels(steps), y=_labels(layers), zmin=-0.5, zmax=n - 0.5,
        colorscale=scale,
        showscale=False, xgap=1, ygap=1, text=text, texttemplate="%{text}",
        textfont=dict(size=9),
        customdata=[[plan.label_at(s, la) for s in steps] for la in layers],
        hovertemplate="step %{x}, layer %{y}<br>%{customdata}<br>cost %{text}<extra></extra>"))
    for i, lab in enumerate(labels):
        fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=lab,
                                 marker=dict(size=12, symbol="square",
                                             color=RECIPE_COLORS[i % len(RECIPE_COLORS)])))
    cost = plan.expected_cost.get("relative_to_bf16")
    sub = f"; expected attention cost {cost:.3f} x dense BF16" if cost is not None else ""
    fig.update_layout(template=_tpl(), title=f"plan {plan.name}: recipe per step and layer"
                      f"{sub}", xaxis_title="step", yaxis_title="layer", xaxis_type="category",
                      yaxis_type="category", legend=dict(orientation="h", y=-0.15))
    return fig


def scan_figures(ds, *, recipe: str | None = None, step: int | None = None,
                 plan=None) -> dict[str, tuple[go.Figure, str]]:
    """The figures of a scan report: {name: (figure, caption)}.

    recipe: the candidate drawn in the error / benefit heatmaps (default: the last recipe);
    the benefit is over the scan's baseline. step: the step of the layer x head heatmaps
    (default: the last). plan: a RecipePlan to draw as a grid.
    """
    from workbench.evaluate.scan import pair_benefit

    steps, layers = [int(s) for s in ds.step.values], [int(x) for x in ds.layer.values]
    heads = [int(h) for h in ds["head"].values]
    recipe = recipe or str(ds.recipe.values[-1])
    if recipe not in ds.recipe.values:
        raise ValueError(f"--recipe: {recipe!r} is not in the scan ({_labels(ds.recipe.values)})")
    base = ds.attrs["params"]["baseline"]
    step = steps[-1] if step is None else int(step)
    if step not in steps:
        raise ValueError(f"--step: {step} is not in the scan (steps {steps})")
    figs = {}
    sq = ds.entry_metrics.sel(recipe=recipe, metric=SQNR).transpose("step", "layer").values
    figs["sqnr_step_layer"] = (metric_grid(sq, steps=steps, layers=layers, recipe=recipe),
                               f"output SQNR (dB) of {recipe} per step and layer")
    hm = ds.head_metrics.sel(recipe=recipe, step=step, metric=SQNR).transpose(
        "layer", "head").values
    figs["sqnr_layer_head"] = (per_head_heatmap(
        hm, layers=layers, heads=heads, metric="sqnr_db", recipe=recipe,
        boundary=f"attention output, step {step}"),
        f"output SQNR (dB) of {recipe} per layer and head at step {step}")
    if recipe != base:
        b = ds.benefit.sel(recipe=recipe).transpose("step", "layer", "stat").values
        figs["benefit_step_layer"] = (benefit_grid(
            b[..., 0], b[..., 1], b[..., 2], x=steps, y=layers,
            title=f"output-MSE benefit of {recipe} over {base} (95% CI; x: crosses 0)"),
            f"benefit of {recipe} over {base} per step and layer, with its 95% interval")
        hb = ds.head_benefit.sel(recipe=recipe, step=step).transpose(
            "head", "layer", "stat").values
        figs["benefit_layer_head"] = (benefit_grid(
            hb[..., 0], hb[..., 1], hb[..., 2], x=heads, y=layers, x_title="head",
            title=f"output-MSE benefit of {recipe} over {base} per head, step {step}"),
            f"benefit of {recipe} over {base} per layer and head at step {step}")
    effects = {f"{a} -> {b}": pair_benefit(ds, a, b).transpose("step", "layer", "stat").values
               for a, b in smoothing_pairs(ds)}
    figs["smoothing_effect"] = (smoothing_effect(effects, steps=steps, layers=layers),
                                "where smoothing helps, hurts or is unclear (95% interval)")
    if plan is not None:
        figs["plan_grid"] = (plan_grid(plan, steps=steps, layers=layers),
                             f"the plan's recipe per step and layer ({plan.rule.get('text', '')})")
    return figs

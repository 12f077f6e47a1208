"""Figure builders: pure functions from data (metric dicts, tensors, bench JSON) to plotly figures.

No Jupyter here: every builder returns a ``go.Figure`` whose trace values are the numbers it was
given (the unit tests read them back), with hover templates that show exact values. Widgets wrap
these figures in ``go.FigureWidget`` and update their traces in place.

Colour code used throughout: recipe A (baseline) grey-blue, recipe B (candidate) orange; segments
text / conditioning / audio / video shaded with fixed colours (segments of other models take the
palette in sequence order); rotated vs pass-through channels marked with a shaded pass-through
region. Numbers use one format per quantity (``workbench.metrics.NUMBER_FORMATS``) in hovers,
cell text and titles, as in the tables.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Mapping, Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from workbench.layout import channel_group_part
from workbench.metrics import NUMBER_FORMATS, channel_groups

RECIPE_COLORS = ["#4C72B0", "#DD8452", "#55A868", "#C44E52", "#8172B3", "#937860"]
SEGMENT_COLORS = {
    "text": "rgba(76,114,176,0.13)",
    "conditioning": "rgba(129,114,179,0.13)",
    "audio": "rgba(85,168,104,0.15)",
    "video": "rgba(221,132,82,0.08)",
}
# Segments of layouts other than H3's, in sequence order.
SEGMENT_PALETTE = ["rgba(76,114,176,0.13)", "rgba(85,168,104,0.15)", "rgba(221,132,82,0.10)",
                   "rgba(129,114,179,0.13)", "rgba(196,78,82,0.12)", "rgba(147,120,96,0.13)"]
METRIC_LABELS = {
    "mse": "MSE",
    "rel_l2": "relative L2",
    "cosine": "cosine",
    "sqnr_db": "SQNR (dB)",
    "max_abs": "max abs error",
}
TEMPLATE = "plotly_white"
_TEMPLATE_OVERRIDE: list[str] = []


@contextlib.contextmanager
def template_override(name: str = "none"):
    """Build figures with another template (widgets use "none": their FigureWidget already holds
    the real template, and validating a full template costs ~20 ms per figure)."""
    _TEMPLATE_OVERRIDE.append(name)
    try:
        yield
    finally:
        _TEMPLATE_OVERRIDE.pop()


def _tpl() -> str:
    return _TEMPLATE_OVERRIDE[-1] if _TEMPLATE_OVERRIDE else TEMPLATE


def _np(x) -> np.ndarray:
    """Tensor / list / array -> float64 numpy (CPU)."""
    if hasattr(x, "detach"):
        x = x.detach().cpu().double().numpy()
    return np.asarray(x, dtype=np.float64)


def _finite_or_none(a: np.ndarray) -> list:
    """JSON-safe list: inf / nan become None (plotly draws a gap), everything else exact."""
    return [float(v) if math.isfinite(v) else None for v in np.asarray(a, dtype=float).ravel()]


def _color(i: int) -> str:
    return RECIPE_COLORS[i % len(RECIPE_COLORS)]


def _nf(kind: str) -> str:
    """d3 format of a quantity ("mse", "benefit", ...; unknown kinds: 3 significant digits)."""
    return NUMBER_FORMATS.get(kind, ".3g")


def segment_color(name: str, index: int) -> str:
    """H3's segments keep their colours; other segments take the palette by position."""
    return SEGMENT_COLORS.get(name) or SEGMENT_PALETTE[index % len(SEGMENT_PALETTE)]


def band_label_rows(bands: Sequence[tuple[str, int, int]], x_lo: float, x_hi: float, *,
                    plot_px: float = 820.0, char_px: float = 7.5) -> list[int]:
    """Row (0 = top) for each band's label so that no two labels overlap.

    A label starts at its band's left edge and is about len(name) * char_px pixels wide on a plot
    `plot_px` wide spanning x_lo..x_hi; a short segment next to a long one (H3's 356 audio rows
    beside 32,256 video rows) would print its name over its neighbour's, so it moves down a row.
    """
    span = max(x_hi - x_lo, 1e-9)
    ends: list[float] = []  # right end of the last label in each row
    rows = []
    for name, a, _ in bands:
        x0 = (a - 0.5 - x_lo) / span * plot_px
        x1 = x0 + (len(name) + 1) * char_px
        r = next((i for i, end in enumerate(ends) if x0 >= end), len(ends))
        if r == len(ends):
            ends.append(x1)
        else:
            ends[r] = x1
        rows.append(r)
    return rows


# -- per-head error heatmap ---------------------------------------------------------------------
def per_head_heatmap(
    values,
    *,
    layers: Sequence[int],
    heads: Sequence[int],
    metric: str = "mse",
    boundary: str = "attention_output",
    recipe: str = "",
    log_color: bool | None = None,
    value_range: tuple[float, float] | None = None,
) -> go.Figure:
    """Layer x head heatmap of one metric at one boundary.

    values: [n_layers, n_heads] (array, tensor or nested lists), values[i][j] for layers[i],
    heads[j]. The colour is log10 of the value for error metrics spanning decades (log_color=None
    decides: positive values over more than 2 decades); the hover always shows the exact value.
    value_range: (lo, hi) of the values the colour scale spans (the same for heatmaps that are
    read side by side, e.g. recipe A and recipe B); default: this grid's own range.
    """
    z = _np(values)
    if z.shape != (len(layers), len(heads)):
        raise ValueError(f"per_head_heatmap: values shape {z.shape} != (layers {len(layers)}, "
                         f"heads {len(heads)})")
    fin = z[np.isfinite(z)]
    span = np.asarray(value_range, dtype=float) if value_range is not None else fin
    kind = "benefit" if metric.startswith("benefit") else metric
    if log_color is None:  # errors spanning decades; never a signed benefit or a dB value
        log_color = bool(kind != "benefit" and "db" not in metric.lower() and span.size
                         and (span > 0).all() and span.max() / span.min() > 100)
    color = np.log10(np.where(z > 0, z, np.nan)) if log_color else z
    zmin = zmax = None
    if value_range is not None:
        lo, hi = (float(x) for x in value_range)
        zmin, zmax = (math.log10(lo), math.log10(hi)) if log_color and lo > 0 else (lo, hi)
    label = METRIC_LABELS.get(metric, metric)
    # Signed values (a benefit) get a diverging scale centred on 0: blue = B better, also when
    # every cell has one sign (else the colours would not say which side of 0 they lie)
    signed = bool(not log_color and fin.size and (kind == "benefit"
                                                  or fin.min() < 0 < fin.max()))
    fig = go.Figure(go.Heatmap(
        z=[_finite_or_none(r) for r in color],
        x=[str(h) for h in heads],
        y=[str(lay) for lay in layers],
        customdata=[_finite_or_none(r) for r in z],
        colorscale="RdBu" if signed else "Viridis",
        zmid=0 if signed else None, zmin=zmin, zmax=zmax,
        # Small grids print the exact value in each cell (PNG exports have no hover).
        text=[[format(x, _nf(kind)) for x in r] for r in z] if z.size <= 200 else None,
        texttemplate="%{text}" if z.size <= 200 else None,
        xgap=1, ygap=1,
        colorbar=dict(title=("log10 " if log_color else "") + label),
        hovertemplate="layer %{y}, head %{x}<br>" + label + " = %{customdata:" + _nf(kind)
                      + "}<extra></extra>",
        name=recipe or metric,
    ))
    fig.update_layout(
        template=_tpl(),
        title=f"{label} per head at {boundary}" + (f" ({recipe})" if recipe else ""),
        xaxis_title="head", yaxis_title="layer", xaxis_type="category", yaxis_type="category",
    )
    return fig


def shared_range(*grids) -> tuple[float, float] | None:
    """(min, max) of the finite values of several grids: one colour scale for all of them."""
    vals = np.concatenate([_np(g).ravel() for g in grids]) if grids else np.zeros(0)
    vals = vals[np.isfinite(vals)]
    return (float(vals.min()), float(vals.max())) if vals.size else None


# -- boundary bars --------------------------------------------------------------------------------
def boundary_bars(
    results: Mapping[str, Mapping[str, float]],
    *,
    boundaries: Sequence[str] | None = None,
    labels: Mapping[str, str] | None = None,
    metric: str = "mse",
    log_y: bool = True,
) -> go.Figure:
    """Grouped bars: one group per boundary, one bar per recipe (the seed table as a figure).

    results: {recipe name: {boundary: value}} for two or more recipes.
    """
    if len(results) < 1:
        raise ValueError("boundary_bars: give at least one recipe")
    names = list(results)
    bds = list(boundaries or next(iter(results.values())).keys())
    labels = labels or {}
    fig = go.Figure()
    for i, name in enumerate(names):
        y = [results[name].get(b, float("nan")) for b in bds]
        fig.add_bar(
            name=name, x=[labels.get(b, b) for b in bds], y=_finite_or_none(np.array(y)),
            marker_color=_color(i),
            hovertemplate="%{x}<br>" + name + ": %{y:" + _nf(metric) + "}<extra></extra>",
        )
    fig.update_layout(
        template=_tpl(), barmode="group", title=f"{METRIC_LABELS.get(metric, metric)} per boundary",
        yaxis_title=METRIC_LABELS.get(metric, metric), legend_title="recipe",
    )
    if log_y:
        fig.update_yaxes(type="log", exponentformat="e")
    return fig


# -- token-mean drift per channel -----------------------------------------------------------------
def drift_per_channel(
    drift: Mapping[str, object],
    *,
    rotated: int | None = 96,
    tensor: str = "K",
    log_y: bool = True,
) -> go.Figure:
    """|mean_t(dequant(x)) - mean_t(x)| per channel, one line per recipe.

    drift: {recipe name: per-channel drift [D]} (e.g. token_mean_drift(...)["per_channel"] averaged
    over batch and heads). Rotated channels 0..rotated-1 and pass-through channels rotated..D-1 are
    separate traces (solid vs dotted) over a shaded pass-through region, because RoPE rotates only
    the first `rotated` channels and their statistics differ. A group without channels (rotated 0
    or D) has no trace and no label; rotated None (not known): one trace over every channel.
    """
    fig = go.Figure()
    D = max((_np(d).size for d in drift.values()), default=0)
    groups = channel_groups(rotated, D, tensor) if D else []
    dashes = {"rot": "solid", "pass": "dot", "all": "solid"}
    for i, (name, d) in enumerate(drift.items()):
        d = _np(d).reshape(-1)
        ch = np.arange(d.size)
        for key, label, a, b in groups:
            part = channel_group_part(key, tensor)
            fig.add_scatter(
                x=ch[a:b].tolist(), y=_finite_or_none(d[a:b]), mode="lines+markers",
                marker_size=3, line=dict(color=_color(i), dash=dashes[key]),
                name=f"{name}, {part}", legendgroup=name,
                hovertemplate="channel %{x}<br>drift %{y:" + _nf("drift") + "}<extra>" + name
                              + f" ({part})</extra>",
            )
    if rotated is not None and 0 < rotated < D:
        fig.add_vrect(x0=rotated - 0.5, x1=D - 0.5, fillcolor="rgba(120,120,120,0.12)",
                      line_width=0, annotation_text=groups[-1][1],
                      annotation_position="top left")
    fig.update_layout(
        template=_tpl(), title=f"{tensor} token-mean drift per channel ("
                               + " | ".join(g[1] for g in groups) + ")",
        xaxis_title="channel", yaxis_title="|mean(dequant) - mean| (abs)",
    )
    if log_y:
        fig.update_yaxes(type="log", exponentformat="e")
    return fig


# -- error along the token axis -------------------------------------------------------------------
def error_along_tokens(
    curves: Mapping[str, Mapping[str, list]],
    *,
    bands: Sequence[tuple[str, int, int]] | None = None,
    metric: str = "mse",
    log_y: bool = True,
) -> go.Figure:
    """Output error per sampled query row, one line per recipe, with the segments shaded.

    curves: {recipe name: workbench.metrics.error_along_tokens(...) dict} (keys "row", metric,
    "segment", "bands"). bands: [(segment, start, stop)]; default: the first curve's bands.
    """
    fig = go.Figure()
    xs: list[int] = []
    for i, (name, c) in enumerate(curves.items()):
        seg = c.get("segment") or [""] * len(c["row"])
        xs += list(c["row"])
        fig.add_scatter(
            x=list(c["row"]), y=_finite_or_none(np.array(c[metric])), mode="lines+markers",
            marker_size=4, line_color=_color(i), name=name, customdata=list(seg),
            hovertemplate="row %{x} (%{customdata})<br>" + METRIC_LABELS.get(metric, metric)
                          + " %{y:" + _nf(metric) + "}<extra>" + name + "</extra>",
        )
    if bands is None and curves:
        bands = next(iter(curves.values())).get("bands")
    bands = list(bands or [])
    for i, (seg, a, b) in enumerate(bands):
        fig.add_vrect(x0=a - 0.5, x1=b - 0.5, fillcolor=segment_color(seg, i), line_width=0,
                      layer="below")
    if bands:
        lo = min([bands[0][1] - 0.5] + xs)
        hi = max([bands[-1][2] - 0.5] + xs)
        for (seg, a, _), r in zip(bands, band_label_rows(bands, lo, hi)):
            fig.add_annotation(x=a - 0.5, xref="x", xanchor="left", y=1 - 0.07 * r, yref="paper",
                               yanchor="top", text=seg, showarrow=False, font_size=12)
    fig.update_layout(
        template=_tpl(), title=f"Attention output {METRIC_LABELS.get(metric, metric)} along "
                                 "the sequence",
        xaxis_title="query row (packed sequence position)",
        yaxis_title=METRIC_LABELS.get(metric, metric),
    )
    if log_y:
        fig.update_yaxes(type="log", exponentformat="e")
    return fig


def band_shapes(bands: Sequence[tuple[str, int, int]]) -> list[dict]:
    """Layout shapes for segment bands (used by widgets to replace the shading in place)."""
    return [dict(type="rect", xref="x", yref="paper", x0=a - 0.5, x1=b - 0.5, y0=0, y1=1,
                 fillcolor=segment_color(s, i), line_width=0, layer="below")
            for i, (s, a, b) in enumerate(bands)]


# -- Sol routing map ------------------------------------------------------------------------------
def routing_levels(m: np.ndarray, n_heads: int | None) -> np.ndarray:
    """The distinct values a routing map can hold: k / n_heads for k = 0..n_heads when the map is
    a mean over n_heads heads, else the map's own distinct values (always with 0 and 1)."""
    if n_heads:
        return np.arange(n_heads + 1) / n_heads
    return np.unique(np.concatenate([np.round(m.ravel(), 9), [0.0, 1.0]]))


def routing_map(
    block_map,
    *,
    block: int = 64,
    exact_fraction: float | None = None,
    title: str = "Sol routing",
    bands: Sequence[tuple[str, int, int]] | None = None,
    prefix: int | None = None,
    generated: str = "generated",
    n_heads: int | None = None,
    zero_label: str = "summary",
) -> go.Figure:
    """Query block x key block map of the routes: 1 = exact, 0 = summary (Sol) / skipped (VSA).

    block_map: [nq, nk] bool (one batch, one head; or pre-averaged over `n_heads` heads, then values
    are the fraction of heads routing the pair exactly). Colours are discrete, one per value the
    map can hold (k of n_heads heads exact), so a reader sees counts, not a gradient; the hover
    gives the fraction. exact_fraction defaults to the map's mean. prefix: rows of the sink (the
    layout's prefix_len); a dotted line separates its key blocks from the `generated` ones.
    bands (older form): the prefix ends where the last non-video band ends.
    """
    m = _np(block_map)
    if m.ndim != 2:
        raise ValueError(f"routing_map: expected [n_qblocks, n_kblocks], got shape {m.shape}")
    frac = float(m.mean()) if exact_fraction is None else float(exact_fraction)
    levels = routing_levels(m, n_heads)
    idx = np.abs(m[..., None] - levels).argmin(-1)  # [nq, nk] index of each cell's level
    n = len(levels)
    lo_rgb, hi_rgb = np.array([241, 241, 241]), np.array([221, 132, 82])
    scale = []
    for i in range(n):  # hard steps: each level owns 1/n of the colour axis
        c = lo_rgb + (hi_rgb - lo_rgb) * (i / (n - 1) if n > 1 else 1.0)
        col = "rgb({},{},{})".format(*(int(round(x)) for x in c))
        scale += [[i / n, col], [(i + 1) / n, col]]

    def tick(v: float) -> str:
        if v == 0:
            return zero_label
        if v == 1:
            return "exact"
        k = round(v * n_heads) if n_heads else None
        return f"{k}/{n_heads} heads exact" if k is not None else f"{v:{_nf('fraction')}} exact"

    fig = go.Figure(go.Heatmap(
        z=idx.tolist(), customdata=m.tolist(), zmin=-0.5, zmax=n - 0.5,
        xgap=1 if m.size <= 4096 else 0, ygap=1 if m.size <= 4096 else 0,
        colorscale=scale,
        colorbar=dict(title="route", tickvals=list(range(n)),
                      ticktext=[tick(float(v)) for v in levels]),
        hovertemplate="query block %{y}, key block %{x}<br>exact %{customdata:"
                      + _nf("fraction") + "}<extra></extra>",
    ))
    if prefix is None:
        prefix = max((b for seg, _, b in bands or [] if seg != "video"), default=0)
    if prefix:  # the sink: key blocks holding prefix rows are always exact
        fig.add_vline(x=prefix / block - 0.5, line_dash="dot", line_color="#555",
                      annotation_text=f"prefix | {generated}", annotation_position="top right")
    fig.update_layout(
        template=_tpl(), title=f"{title}: exact-route fraction {frac:{_nf('fraction')}}",
        xaxis_title=f"key block ({block} rows)", yaxis_title=f"query block ({block} rows)",
    )
    nq, nk = m.shape
    fig.update_xaxes(range=[-0.5, nk - 0.5], constrain="domain", dtick=max(1, nk // 16))
    fig.update_yaxes(range=[nq - 0.5, -0.5], scaleanchor="x", constrain="domain",
                     dtick=max(1, nq // 16))
    return fig


# -- the figure set of one comparison ------------------------------------------------------------
def comparison_figures(
    comparison,
    a: str,
    b: str,
    *,
    labels: Mapping[str, str] | None = None,
    grids: Mapping[str, object] | None = None,
    layers: Sequence[int] | None = None,
    step=None,
    layer=None,
    grid_labels: Mapping[str, str] | None = None,
) -> dict[str, tuple[go.Figure, str]]:
    """Every figure of recipe A against recipe B on one entry: {name: (figure, caption)}.

    comparison: a ``workbench.evaluate.Comparison`` holding evaluations keyed `a` and `b`.
    labels: display name per key (default: the key). grids: {"a" | "b": [n_layers, n_heads]
    output MSE} over `layers` (``workbench.evaluate.layer_head_grid``) for the per-head heatmaps
    (both on one colour scale) and, when both are given, the benefit heatmap. grid_labels:
    {"a" | "b": name} for a grid that is not the entry's recipe at every layer (a plan's). The
    report writes all of them; the explorer shows the ones it has room for.
    """
    from workbench.evaluate import TABLE_ROWS
    from workbench.metrics import BOUNDARY_LABELS, benefit_pct

    labels = dict(labels or {})
    ea, eb = comparison.evals[a], comparison.evals[b]
    na, nb = labels.get(a, a), labels.get(b, b)
    where = ", ".join(x for x in (f"step {step}" if step is not None else "",
                                  f"layer {layer}" if layer is not None else "") if x)
    at = f" ({where})" if where else ""
    figs = {
        "boundary_bars": (boundary_bars(
            {n: {bd: e.overall[bd]["mse"] for bd in TABLE_ROWS} for n, e in ((na, ea), (nb, eb))},
            labels=BOUNDARY_LABELS), f"MSE at each boundary of the seed table{at}"),
        "error_along_tokens": (error_along_tokens({na: ea.along, nb: eb.along}),
                               f"attention output MSE per sampled query row{at}"),
        "drift_k": (drift_per_channel({na: ea.drift_k, nb: eb.drift_k},
                                      rotated=comparison.rotated, tensor="K"),
                    "K token-mean drift per channel"),
        "drift_v": (drift_per_channel({na: ea.drift_v, nb: eb.drift_v},
                                      rotated=comparison.rotated, tensor="V"),
                    "V token-mean drift per channel"),
    }
    grids = {t: _np(g) for t, g in (grids or {}).items() if g is not None}
    heads = comparison.heads
    rng = shared_range(*grids.values())
    at_step = f", step {step}" if step is not None else ""
    grid_names = {"a": na, "b": nb} | dict(grid_labels or {})
    for t, name in grid_names.items():
        if t in grids:
            figs[f"heatmap_output_mse_{t}"] = (per_head_heatmap(
                grids[t], layers=layers, heads=heads, recipe=name,
                boundary=f"attention output{at_step}", value_range=rng),
                f"output MSE per layer and head, {name}{at_step}")
    if "a" in grids and "b" in grids:
        ben = np.vectorize(benefit_pct)(grids["a"], grids["b"])
        figs["heatmap_benefit"] = (per_head_heatmap(
            ben, layers=layers, heads=heads, metric="benefit %", log_color=False,
            recipe=f"{grid_names['b']} over {grid_names['a']}",
            boundary=f"attention output{at_step}"),
            f"output-MSE benefit of {grid_names['b']} over {grid_names['a']} per layer and head "
            "(%)")
    for name, e in ((nb, eb), (na, ea)):
        if e.block_map is not None:
            lay = comparison.layout
            figs["routing_map"] = (routing_map(
                e.block_map, block=e.block, exact_fraction=e.exact_fraction,
                title=f"{name} {e.recipe.sparsity} routing{at} (mean over heads)",
                prefix=lay.prefix_len, generated=lay.generated or "generated",
                n_heads=e.block_maps or len(comparison.heads),  # batch x heads maps averaged
                zero_label="skipped" if e.recipe.sparsity == "vsa" else "summary"),
                f"{name} block routing{at}")
            break
    return figs


# -- frames ---------------------------------------------------------------------------------------
def _frame_img(x) -> np.ndarray:
    """[3, H, W] float in [0, 1] -> [H, W, 3] uint8."""
    a = _np(x)
    return (np.clip(a, 0, 1).transpose(1, 2, 0) * 255 + 0.5).astype(np.uint8)


def frame_grid(
    video_a,
    video_b,
    *,
    frames: Sequence[int] | None = None,
    names: tuple[str, str] = ("A", "B"),
    max_frames: int = 4,
) -> go.Figure:
    """Rows = frames; columns = variant A, variant B, |A - B| (mean over RGB) heatmap.

    video_a, video_b: [T, 3, H, W] float in [0, 1], same shape.
    """
    a, b = _np(video_a), _np(video_b)
    if a.shape != b.shape:
        raise ValueError(f"frame_grid: shapes differ {a.shape} vs {b.shape}")
    T = a.shape[0]
    if frames is None:
        frames = sorted({int(round(x)) for x in np.linspace(0, T - 1, min(max_frames, T))})
    diff_all = np.abs(a - b).mean(axis=1)  # [T, H, W]
    zmax = float(diff_all[list(frames)].max()) or 1e-12
    titles = []
    for f in frames:
        titles += [f"{names[0]} frame {f}", f"{names[1]} frame {f}", f"|diff| frame {f}"]
    fig = make_subplots(rows=len(frames), cols=3, subplot_titles=titles,
                        horizontal_spacing=0.03, vertical_spacing=0.06)
    for r, f in enumerate(frames, start=1):
        fig.add_trace(go.Image(z=_frame_img(a[f]), hoverinfo="skip"), row=r, col=1)
        fig.add_trace(go.Image(z=_frame_img(b[f]), hoverinfo="skip"), row=r, col=2)
        fig.add_trace(go.Heatmap(
            z=diff_all[f].tolist(), zmin=0, zmax=zmax, colorscale="Magma", showscale=(r == 1),
            colorbar=dict(title="|diff|", len=0.5, y=1, yanchor="top"),
            hovertemplate="x %{x}, y %{y}<br>|diff| %{z:" + _nf("diff") + "}<extra></extra>",
        ), row=r, col=3)
        fig.update_yaxes(autorange="reversed", scaleanchor=f"x{3 * (r - 1) + 3}", row=r, col=3)
    fig.update_xaxes(showticklabels=False)
    fig.update_yaxes(showticklabels=False)
    fig.update_layout(template=_tpl(), title=f"Frames: {names[0]} vs {names[1]}",
                      height=260 * len(frames) + 80, margin=dict(l=20, r=20, t=80, b=20))
    return fig


def frame_metric_curves(curves: Mapping[str, Mapping[str, Sequence[float]]]) -> go.Figure:
    """Per-frame PSNR (dB), SSIM and cosine, one line per variant (all against the reference).

    curves: {variant: {"psnr_db": [...], "ssim": [...], "cosine": [...]}}
    (``workbench.metrics.media.compare_media(...)["curves"]``).
    """
    keys = [("psnr_db", "PSNR (dB)"), ("ssim", "SSIM"), ("cosine", "cosine")]
    kinds = {"psnr_db": "psnr_db", "ssim": "ssim", "cosine": "frame_cosine"}
    fig = make_subplots(rows=3, cols=1, shared_xaxes=True, vertical_spacing=0.06,
                        subplot_titles=[k[1] for k in keys])
    for i, (name, c) in enumerate(curves.items()):
        for r, (k, label) in enumerate(keys, start=1):
            y = _np(c[k])
            fig.add_scatter(x=list(range(y.size)), y=_finite_or_none(y), mode="lines+markers",
                            name=name, legendgroup=name, showlegend=(r == 1),
                            line_color=_color(i), marker_size=4, row=r, col=1,
                            hovertemplate="frame %{x}<br>" + label + " %{y:" + _nf(kinds[k])
                                          + "}<extra>" + name + "</extra>")
    fig.update_xaxes(title_text="frame", row=3, col=1)
    fig.update_layout(template=_tpl(), title="Per-frame metrics against the reference",
                      height=620)
    return fig


def log_power_spectrogram(wave, n_fft: int = 256) -> np.ndarray:
    """10 log10(|STFT|^2 + 1e-10) [freq, frames], Hann window, hop n_fft / 4 (like the LSD)."""
    import torch

    w = torch.as_tensor(_np(wave)).reshape(-1)
    spec = torch.stft(w, n_fft=n_fft, hop_length=n_fft // 4, window=torch.hann_window(
        n_fft, dtype=w.dtype), return_complex=True)
    return (10 * torch.log10(spec.abs() ** 2 + 1e-10)).numpy()


def audio_comparison(
    wave_a,
    wave_b,
    *,
    sample_rate: int,
    names: tuple[str, str] = ("A", "B"),
    n_fft: int = 256,
) -> go.Figure:
    """Top: both waveforms over time. Bottom: log-power spectrogram difference B - A (dB)."""
    a, b = _np(wave_a).reshape(-1), _np(wave_b).reshape(-1)
    if a.size != b.size:  # cutting the longer would show its missing tail as "no difference"
        raise ValueError(f"audio_comparison: {names[0]} has {a.size} samples, {names[1]} "
                         f"{b.size}; compare waveforms of one length")
    n = a.size
    t = np.arange(n) / sample_rate
    sa, sb = log_power_spectrogram(a, n_fft), log_power_spectrogram(b, n_fft)
    d = sb - sa
    lim = float(np.abs(d).max()) or 1.0
    freqs = np.arange(sa.shape[0]) * sample_rate / n_fft
    times = np.arange(sa.shape[1]) * (n_fft // 4) / sample_rate
    fig = make_subplots(rows=2, cols=1, vertical_spacing=0.12,
                        subplot_titles=["waveforms", f"spectrogram difference {names[1]} - "
                                                     f"{names[0]} (dB)"])
    for i, (name, w) in enumerate(((names[0], a), (names[1], b))):
        fig.add_scatter(x=t.tolist(), y=w.tolist(), mode="lines", name=name, line_color=_color(i),
                        line_width=1, opacity=0.8, row=1, col=1)
    fig.add_trace(go.Heatmap(z=d.tolist(), x=times.tolist(), y=freqs.tolist(), zmid=0,
                             zmin=-lim, zmax=lim, colorscale="RdBu_r",
                             colorbar=dict(title="dB", len=0.45, y=0, yanchor="bottom"),
                             hovertemplate="t %{x:.3f} s, f %{y:.0f} Hz<br>%{z:.2f} dB"
                                           "<extra></extra>"), row=2, col=1)
    fig.update_xaxes(title_text="time (s)", row=1, col=1)
    fig.update_xaxes(title_text="time (s)", row=2, col=1)
    fig.update_yaxes(title_text="amplitude", row=1, col=1)
    fig.update_yaxes(title_text="frequency (Hz)", row=2, col=1)
    fig.update_layout(template=_tpl(), title=f"Audio: {names[0]} vs {names[1]}", height=620)
    return fig


# -- kernel benchmark -----------------------------------------------------------------------------
def kernel_bench(
    report: Mapping,
    *,
    modes: Sequence[str] = ("full", "kernel"),
    y: str = "tflops",
    ceilings: bool = True,
) -> go.Figure:
    """TFLOP/s (or ms) against sequence length, one line per (variant, mode), from bench JSON.

    report: ``workbench bench --json`` output ({"env", "ceilings", "rows": [{"S", "variant",
    "mode", "ms", "tflops", ...}]}). Ceilings (bf16 / fp8 matmul rate) are drawn as dashed lines.
    """
    rows = [dict(r) for r in report.get("rows", []) if r.get("mode") in modes]
    for r in rows:  # rows that carry only a time: TFLOP/s from the dense count 4*B*H*S^2*D
        if r.get("tflops") is None and r.get("ms") and r.get("shape"):
            B, S, H, D = (int(x) for x in str(r["shape"]).strip("()").split(","))
            r["tflops"] = 4.0 * B * H * S * S * D / (r["ms"] * 1e-3) / 1e12
    groups: dict[tuple[str, str], list[dict]] = {}
    for r in rows:
        groups.setdefault((r["variant"], r["mode"]), []).append(r)
    fig = go.Figure()
    for i, ((variant, mode), rs) in enumerate(groups.items()):
        rs = sorted(rs, key=lambda r: r["S"])
        fig.add_scatter(
            x=[r["S"] for r in rs], y=[r[y] for r in rs], mode="lines+markers",
            name=f"{variant} ({mode})", line=dict(color=_color(i),
                                                   dash="solid" if mode == "full" else "dash"),
            customdata=[[r["ms"], r.get("rel_l2", float("nan"))] for r in rs],
            hovertemplate="S %{x}<br>%{y:.1f} " + ("TFLOP/s" if y == "tflops" else y)
                          + "<br>%{customdata[0]:.3f} ms, rel-L2 %{customdata[1]:.3e}<extra>"
                          + f"{variant} ({mode})</extra>",
        )
    c = report.get("ceilings") or {}
    if ceilings and y == "tflops":
        for key, label in (("bf16_mm_tflops", "bf16 matmul"), ("fp8_mm_tflops", "fp8 matmul")):
            if key in c:
                fig.add_hline(y=c[key], line_dash="dot", line_color="#888",
                              annotation_text=f"{label} {c[key]:.0f}", annotation_position="right")
    env = report.get("env") or {}
    sub = ", ".join(str(env[k]) for k in ("device", "torch", "date") if env.get(k))
    fig.update_layout(
        template=_tpl(), title="Attention forward: " + ("TFLOP/s" if y == "tflops" else y)
                                 + " against sequence length" + (f"<br><sub>{sub}</sub>" if sub
                                                                  else ""),
        xaxis_title="sequence length S", yaxis_title="TFLOP/s (4·B·H·S²·D / time)"
        if y == "tflops" else y,
    )
    fig.update_xaxes(type="log")
    return fig


def accuracy_vs_length(report: Mapping, *, modes: Sequence[str] = ("full",)) -> go.Figure:
    """Relative L2 error against float64 over sequence length, one line per variant, from bench
    JSON (``workbench bench --json``: rows with "S", "variant", "mode", "rel_l2" and, where the
    bench emulated the variant's numerics, "emu_rel_l2"): measured solid, emulated dotted in the
    same color, both axes logarithmic. For the FP8 peers the emulated line is their numerics on
    the reference path (``bench.peers.PEER_EMULATIONS``)."""
    def finite(r, key):
        return r.get(key) is not None and bool(np.isfinite(r[key]))

    rows = [r for r in report.get("rows", []) if r.get("mode") in modes
            and (finite(r, "rel_l2") or finite(r, "emu_rel_l2"))]
    groups: dict[str, list[dict]] = {}
    for r in rows:
        groups.setdefault(r["variant"], []).append(r)
    fig = go.Figure()
    for i, (variant, rs) in enumerate(groups.items()):
        rs = sorted(rs, key=lambda r: r["S"])
        meas = [r for r in rs if finite(r, "rel_l2")]
        if meas:
            fig.add_scatter(x=[r["S"] for r in meas], y=[r["rel_l2"] for r in meas],
                            mode="lines+markers", name=f"{variant} (measured)",
                            line=dict(color=_color(i)),
                            hovertemplate="S %{x}<br>rel-L2 %{y:.3e}<extra>" + variant
                                          + "</extra>")
        emu = [r for r in rs if finite(r, "emu_rel_l2")]
        if emu:
            fig.add_scatter(x=[r["S"] for r in emu], y=[r["emu_rel_l2"] for r in emu],
                            mode="lines+markers", name=f"{variant} (emulated)",
                            line=dict(color=_color(i), dash="dot"), marker=dict(symbol="x"),
                            hovertemplate="S %{x}<br>emulated rel-L2 %{y:.3e}<extra>" + variant
                                          + "</extra>")
    env = report.get("env") or {}
    sub = ", ".join(str(env[k]) for k in ("device", "torch", "date") if env.get(k))
    fig.update_layout(template=_tpl(),
                      title="Error against float64 over sequence length"
                            + (f"<br><sub>{sub}</sub>" if sub else ""),
                      xaxis_title="sequence length S (keys summed per row)",
                      yaxis_title="relative L2 error vs float64")
    fig.update_xaxes(type="log")
    fig.update_yaxes(type="log")
    return fig

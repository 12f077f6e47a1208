"""Smoothing explorer: a thin ipywidgets 8 layer over ``workbench.evaluate`` and ``figures``.

Recipe A and recipe B start as the recipes given (a preset, a preset with overrides such as
``fp8_dense:p_scaling=rowmax448``, or a full recipe): nothing the caller set is dropped. The
controls edit B: a control the user changes overrides its field, every other field stays the
given recipe's. Every control change recomputes both on the reference path (CPU by default, CUDA
when present) against one float64 dense reference, and updates the ``go.FigureWidget`` traces in
place inside ``fig.batch_update()``. Sliders fire on release (``continuous_update=False``): that
is the debounce; untick "auto" to batch several changes and press "Run". A progress bar and a
status line say what is running; the readout table holds the numbers, the bootstrap interval of
the output benefit and the token-mean drift per channel group (each cell carries
``data-key="A.output_mse"`` etc., which the browser test reads).
"""

from __future__ import annotations

import html
import time
import traceback

import ipywidgets as W
import plotly.graph_objects as go

from workbench.evaluate import ReplaySource, evaluate_entry, layer_head_grid, shipped_stores
from workbench.metrics import benefit_pct, fmt, fmt_benefit
from workbench.recipes import PRESETS
from workbench.recipes.plan import single_recipe
from workbench.recipes.recipe import OUT_FORMATS, P_SCALINGS

from . import figures as F

# (readout key, label, number format kind: workbench.metrics.NUMBER_FORMATS)
READOUT_ROWS = [
    ("output_mse", "output MSE", "mse"),
    ("output_rel_l2", "output relative L2", "rel_l2"),
    ("output_cosine", "output cosine", "cosine"),
    ("output_sqnr_db", "output SQNR (dB)", "sqnr_db"),
    ("k_mse", "quanted K MSE", "mse"),
    ("v_mse", "dequanted V MSE", "mse"),
    ("v_mean_mse", "dequanted V's mean MSE", "mse"),
    ("exact_fraction", "exact-route fraction", "fraction"),
]
LOWER_IS_BETTER = {"output_mse", "output_rel_l2", "k_mse", "v_mse", "v_mean_mse"}
# Fields of recipe B the controls edit, in the order they are read.
CONTROLLED = ("smoothing", "v_bias_correction", "qk_granularity", "sparsity", "sol_tau",
              "vsa_keep", "p_scaling", "out_format")


def _update_in_place(fw: go.FigureWidget, new: go.Figure) -> None:
    """Copy a freshly built figure into an existing FigureWidget without replacing the widget."""
    same = len(fw.data) == len(new.data) and all(
        a.type == b.type for a, b in zip(fw.data, new.data))
    if not same:  # trace structure changed (e.g. a sparse recipe became dense): swap the traces
        fw.data = []
        fw.add_traces(list(new.data))
    with fw.batch_update():
        if same:
            for t, n in zip(fw.data, new.data):
                d = n.to_plotly_json()
                d.pop("type", None)
                # a property the new trace leaves unset (a large grid's cell text) must not
                # keep the old figure's value
                for k in t.to_plotly_json():
                    if k not in d and k not in ("type", "uid"):
                        d[k] = None
                t.update(d, overwrite=True)
        lay = new.layout.to_plotly_json()
        # The template is set once when the widget is made: re-validating its hundreds of
        # properties on every update cost seconds per figure.
        lay.pop("template", None)
        fw.layout.shapes = lay.pop("shapes", ())
        fw.layout.annotations = lay.pop("annotations", ())
        # what the new figure leaves unset (a placeholder's axes) must not keep the old
        # figure's titles, log scale or reversed range: unset keys reset, the rest replaced
        for k in set(fw.layout.to_plotly_json()) - set(lay) - {"template", "shapes",
                                                                "annotations"}:
            lay[k] = None
        fw.layout.update(lay, overwrite=True)


class SmoothingExplorer:
    """Recipe A against recipe B (the given recipe, edited by the controls) on a store entry.

    explorer = SmoothingExplorer("captures/h3_tiny.zarr"); display(explorer.widget)
    recipe_a / recipe_b: anything ``get_recipe`` reads; the dropdowns offer them (by their
    override string) beside the presets.
    """

    def __init__(
        self,
        store=None,
        *,
        source: ReplaySource | None = None,
        recipe_a: str = "fp8_sol_unsmoothed",
        recipe_b: str = "fp8_sol_kv_corrected",
        n_queries: int = 64,
        step=None,
        layer=None,
        device: str | None = None,
        auto: bool = True,
        heatmap: bool = True,
    ):
        self.source = source or ReplaySource(store, device=device)
        self.comparison = None
        self.grid = None
        self.last_seconds = float("nan")
        self.error: str | None = None
        self.show_heatmap = heatmap
        # Evaluations already computed on this source (q/k/v tensors are cached by the source, so
        # their ids are stable): changing B does not recompute A, nor the grid's other layers.
        self._cache: dict = {}
        src = self.source
        given_a = single_recipe(recipe_a, "recipe_a")
        given_b = single_recipe(recipe_b, "recipe_b")
        for name, value, have in (("step", step, src.steps), ("layer", layer, src.layers)):
            if value is not None and value not in have:
                raise ValueError(f"{name}: {value!r} is not in {src.name}'s {name}s {have}")
        if not (8 <= n_queries <= 1024 and n_queries % 8 == 0):
            raise ValueError(f"n_queries: {n_queries}; the explorer's query rows go from 8 to "
                             "1024 in steps of 8")
        # Dropdown label -> recipe: the given recipes under their override strings (two
        # different recipes of one label, e.g. two "custom" ones, kept apart), then presets.
        la, lb = given_a.label(), given_b.label()
        if la == lb and given_a != given_b:
            la, lb = f"{la} [A]", f"{lb} [B]"
        self._choices = {la: given_a, lb: given_b}
        self._choices.update({n: r for n, r in PRESETS.items() if n not in self._choices})
        # an in-memory source cannot be reopened by its name: kept to switch back to (a store
        # is reopened instead, so that its cached tensors are freed when left)
        self._sources = {src.name: src} if src.path is None else {}
        self._loaded: dict = {}  # control values as loaded from B's base recipe

        st = W.Layout(width="auto")
        stores = [str(p) for p in shipped_stores()]
        cur = str(src.path) if src.path else src.name
        self.w_store = W.Dropdown(options=sorted(set(stores + [cur])), value=cur,
                                  description="store", layout=W.Layout(width="420px"))
        self.w_step = W.Dropdown(options=src.steps, value=step if step in src.steps else
                                 src.steps[0], description="step", layout=W.Layout(width="150px"))
        self.w_layer = W.Dropdown(options=src.layers, value=layer if layer in src.layers else
                                  src.layers[-1], description="layer",
                                  layout=W.Layout(width="150px"))
        self.w_head = W.Dropdown(options=[("all", -1)] + [(str(h), h) for h in src.heads],
                                 value=-1, description="head", layout=W.Layout(width="150px"))
        self.w_queries = W.IntSlider(value=n_queries, min=8, max=1024, step=8,
                                     description="query rows", continuous_update=False)
        labels = list(self._choices)
        self.w_a = W.Dropdown(options=labels, value=la, description="recipe A",
                              layout=W.Layout(width="360px"))
        self.w_b = W.Dropdown(options=labels, value=lb, description="recipe B",
                              layout=W.Layout(width="360px"))
        self.w_smooth = W.ToggleButtons(options=["none", "k", "kv"], description="smoothing",
                                        style={"button_width": "56px"})
        self.w_smooth.add_class("wb-smoothing")
        self.w_corr = W.Checkbox(description="V-bias correction", indent=False, layout=st)
        self.w_gran = W.Dropdown(options=["block", "token", "tensor"], description="QK scales",
                                 layout=W.Layout(width="200px"))
        self.w_sparse = W.ToggleButtons(options=["dense", "sol", "vsa"], description="sparsity",
                                        style={"button_width": "60px"})
        self.w_sparse.add_class("wb-sparsity")
        self.w_tau = W.FloatSlider(min=-1.0, max=3.0, step=0.05, description="Sol tau",
                                   continuous_update=False)
        self.w_keep = W.FloatSlider(min=0.05, max=1.0, step=0.05, description="VSA keep",
                                    continuous_update=False)
        self.w_pscale = W.ToggleButtons(options=list(P_SCALINGS), description="P scaling",
                                        style={"button_width": "96px"})
        self.w_pscale.add_class("wb-pscaling")
        self.w_out = W.ToggleButtons(options=list(OUT_FORMATS), description="output",
                                     style={"button_width": "56px"})
        self.w_out.add_class("wb-outformat")
        self._controls = {"smoothing": self.w_smooth, "v_bias_correction": self.w_corr,
                          "qk_granularity": self.w_gran, "sparsity": self.w_sparse,
                          "sol_tau": self.w_tau, "vsa_keep": self.w_keep,
                          "p_scaling": self.w_pscale, "out_format": self.w_out}
        self._load_controls(given_b)
        self.w_policy = W.Checkbox(value=False, description="apply dense policy (step/layer)",
                                   indent=False, layout=st)
        self.w_auto = W.Checkbox(value=auto, description="auto", indent=False, layout=st)
        self.w_run = W.Button(description="Run", button_style="primary", icon="play")
        self.w_progress = W.IntProgress(value=0, min=0, max=3, layout=W.Layout(width="200px"))
        self.w_status = W.HTML(value="")
        self.w_status.add_class("wb-status")
        self.w_readout = W.HTML(value="")
        self.w_readout.add_class("wb-readout")

        self.fig_bars = go.FigureWidget(layout=dict(template=F.TEMPLATE, height=360))
        self.fig_along = go.FigureWidget(layout=dict(template=F.TEMPLATE, height=360))
        self.fig_drift_k = go.FigureWidget(layout=dict(template=F.TEMPLATE, height=330))
        self.fig_drift_v = go.FigureWidget(layout=dict(template=F.TEMPLATE, height=330))
        self.fig_heat = go.FigureWidget(layout=dict(template=F.TEMPLATE, height=330))
        self.fig_route = go.FigureWidget(layout=dict(template=F.TEMPLATE, height=420, width=480))

        controls = W.VBox([
            W.HBox([self.w_store, self.w_step, self.w_layer, self.w_head]),
            W.HBox([self.w_a, self.w_b, self.w_queries]),
            W.HBox([self.w_smooth, self.w_corr, self.w_gran]),
            W.HBox([self.w_sparse, self.w_tau, self.w_keep]),
            W.HBox([self.w_pscale, self.w_out]),
            W.HBox([self.w_policy, self.w_auto, self.w_run, self.w_progress, self.w_status]),
        ])
        self.widget = W.VBox([
            controls,
            self.w_readout,
            W.HBox([self.fig_bars, self.fig_along]),
            W.HBox([self.fig_drift_k, self.fig_drift_v]),
            W.HBox([self.fig_heat, self.fig_route]),
        ])
        self.widget.add_class("wb-explorer")

        self.w_store.observe(self._on_store, names="value")
        self.w_b.observe(self._on_base_b, names="value")
        for w in (self.w_step, self.w_layer, self.w_head, self.w_queries, self.w_a, self.w_policy,
                  *self._controls.values()):
            w.observe(self._on_change, names="value")
        self.w_run.on_click(lambda _: self.recompute())
        self._sync_enabled()
        self.recompute()

    # -- recipe B from the controls -------------------------------------------------------------
    def base_b(self):
        """The recipe B starts from: the one chosen in the B dropdown, with all its fields."""
        return self._choices[self.w_b.value]

    def _load_controls(self, base) -> None:
        """Show `base`'s values in the controls and remember them: only what the user changes
        afterwards overrides `base` (a slider may not hold `base`'s exact value)."""
        for f, w in self._controls.items():
            w.value = getattr(base, f)
        self._loaded = {f: w.value for f, w in self._controls.items()}

    def recipe_b(self):
        """The base recipe B with the fields whose control the user changed."""
        base = self.base_b()
        over = {f: w.value for f, w in self._controls.items() if w.value != self._loaded[f]}
        if "sol_tau" in over or "vsa_keep" in over:
            over = {k: float(v) if k in ("sol_tau", "vsa_keep") else v for k, v in over.items()}
        smooth = over.get("smoothing", base.smoothing)
        # The correction exists only on smoothed, quantized V: untick it where it cannot apply.
        corr = bool(self.w_corr.value) and smooth == "kv" and base.quantizes_v
        if corr != base.v_bias_correction:
            over["v_bias_correction"] = corr
        else:
            over.pop("v_bias_correction", None)
        if not base.quantizes_qk:
            over.pop("qk_granularity", None)
        if base.p_format != "fp8_e4m3":
            over.pop("p_scaling", None)
        return base.with_(**over) if over else base

    def recipe_a(self):
        return self._choices[self.w_a.value]

    def _sync_enabled(self) -> None:
        base = self.base_b()
        self.w_corr.disabled = self.w_smooth.value != "kv" or not base.quantizes_v
        self.w_gran.disabled = not base.quantizes_qk
        self.w_tau.disabled = self.w_sparse.value != "sol"
        self.w_keep.disabled = self.w_sparse.value != "vsa"
        self.w_pscale.disabled = base.p_format != "fp8_e4m3"

    # -- events ---------------------------------------------------------------------------------
    def _on_change(self, _change=None) -> None:
        self._sync_enabled()
        if self.w_auto.value:
            self.recompute()

    def _on_base_b(self, change) -> None:
        # Load the recipe's settings into the controls without one recompute per control.
        auto, self.w_auto.value = self.w_auto.value, False
        self._load_controls(self._choices[change["new"]])
        self.w_auto.value = auto
        self._on_change()

    def _on_store(self, change) -> None:
        src = self._sources.get(change["new"])  # the sources shown so far, in-memory ones too
        if src is None:
            try:
                src = ReplaySource(change["new"], device=self.source.device)
            except Exception as exc:  # noqa: BLE001 - show it, keep the old store
                self._set_status(f"cannot open {change['new']}: {exc}", error=True)
                # the dropdown names the store the figures show
                self.w_store.unobserve(self._on_store, names="value")
                self.w_store.value = change["old"]
                self.w_store.observe(self._on_store, names="value")
                return
        self.source = src
        self._cache = {}
        auto, self.w_auto.value = self.w_auto.value, False
        self.w_step.options, self.w_step.value = src.steps, src.steps[0]
        self.w_layer.options, self.w_layer.value = src.layers, src.layers[-1]
        self.w_head.options = [("all", -1)] + [(str(h), h) for h in src.heads]
        self.w_head.value = -1
        self.w_auto.value = auto
        self._on_change()

    def _set_status(self, text: str, error: bool = False) -> None:
        color = "#b00020" if error else "#555"
        cls = "wb-error" if error else "wb-ok"
        self.w_status.value = (f'<span class="{cls}" style="color:{color}">'
                               f"{html.escape(text)}</span>")

    def _progress(self, i: int, n: int, message: str) -> None:
        self.w_progress.max = n
        self.w_progress.value = i
        self._set_status(message + " ...")

    # -- compute and draw -----------------------------------------------------------------------
    def selected_heads(self) -> list[int]:
        h = self.w_head.value
        return list(self.source.heads) if h == -1 else [h]

    def recompute(self) -> float:
        """Recompute A and B on the current entry and redraw. Returns the seconds it took."""
        t0 = time.perf_counter()
        try:
            a, b = self.recipe_a(), self.recipe_b()
        except ValueError as exc:  # an invalid combination: say which field; the figures of
            # the previous settings are cleared, not left to be read as these settings'
            self.error = str(exc)
            self._set_status(str(exc), error=True)
            self._clear(str(exc))
            return float("nan")
        try:
            src = self.source
            step, layer, heads = self.w_step.value, self.w_layer.value, self.selected_heads()
            policy = self.w_policy.value
            self.comparison = evaluate_entry(
                src, step, layer, {"A": a, "B": b}, heads=heads, n_queries=self.w_queries.value,
                dense_policy=policy, progress=self._progress, cache=self._cache,
            )
            if self.show_heatmap:
                self._set_status("per-head grid over layers ...")
                self.grid = layer_head_grid(src, step, b, heads=heads,
                                            n_queries=self.w_queries.value, dense_policy=policy,
                                            cache=self._cache)
            self.error = None  # names() reads the recipes that ran from this comparison
            self._draw()
        except Exception as exc:  # noqa: BLE001 - the widget must say what failed, not die
            self.error = f"{type(exc).__name__}: {exc}"
            self._set_status(self.error, error=True)
            traceback.print_exc()
            # the previous settings' numbers must not stay on screen (or in .comparison) under
            # these settings' names
            self._clear(self.error)
            return float("nan")
        self.error = None
        self.last_seconds = time.perf_counter() - t0
        dev = self.source.device
        self._set_status(f"updated in {self.last_seconds:.2f} s on {dev} "
                         f"({len(self.comparison.query_rows)} query rows, heads {heads})")
        return self.last_seconds

    def names(self) -> dict[str, str]:
        """{"A": "A <recipe>", "B": ...}: the recipes that ran in the shown comparison (with the
        dense policy applied, "...@dense_policy"), else the ones the controls give (an invalid
        combination: its error)."""
        if self.comparison is not None and self.error is None:
            return {t: f"{t} {self.comparison.evals[t].recipe.label()}" for t in ("A", "B")}
        out = {}
        for t, get in (("A", self.recipe_a), ("B", self.recipe_b)):
            try:
                out[t] = f"{t} {get().label()}"
            except ValueError as exc:
                out[t] = f"{t} (invalid: {exc})"
        return out

    def _grid_labels(self, step) -> dict[str, str] | None:
        """The heatmap's recipe when the dense policy makes it differ by layer (the entry's
        recipe names only this layer's)."""
        b = self.recipe_b()
        if not self.w_policy.value or not (b.dense_steps or b.dense_layers):
            return None
        if b.is_dense_at(step, None):
            return {"b": f"{b.label()} with its dense policy: BF16 at every layer of step {step}"}
        if b.dense_layers:
            return {"b": f"{b.label()} with its dense policy: BF16 at layers < {b.dense_layers}, "
                         "the recipe at the others"}
        return None

    def _clear(self, why: str) -> None:
        """Empty every figure and the readout, saying why (an invalid combination of controls)."""
        self.comparison = self.grid = None
        self.w_readout.value = (f'<p class="wb-stale">not computed: {html.escape(why)}</p>')
        for fw in (self.fig_bars, self.fig_along, self.fig_drift_k, self.fig_drift_v,
                   self.fig_heat, self.fig_route):
            # empty, with the previous figure's bands, labels and axes gone too
            _update_in_place(fw, go.Figure(layout=dict(title=f"not computed: {why[:90]}")))

    def _draw(self) -> None:
        with F.template_override("none"):
            self._draw_figures()

    def _draw_figures(self) -> None:
        c = self.comparison
        nm = self.names()
        step, layer = self.w_step.value, self.w_layer.value
        self.w_readout.value = readout_html(c.readout(), nm, step=step, layer=layer,
                                            comparison=c)
        grids = {"b": self.grid["mse"]} if self.grid is not None else None
        figs = F.comparison_figures(c, "A", "B", labels=nm, grids=grids,
                                    layers=self.source.layers, step=step, layer=layer,
                                    grid_labels=self._grid_labels(step))
        for fw, name in ((self.fig_bars, "boundary_bars"), (self.fig_along, "error_along_tokens"),
                         (self.fig_drift_k, "drift_k"), (self.fig_drift_v, "drift_v"),
                         (self.fig_heat, "heatmap_output_mse_b")):
            if name in figs:
                _update_in_place(fw, figs[name][0])
        if "heatmap_output_mse_b" not in figs:  # the per-head grid is off (heatmap=False)
            _update_in_place(self.fig_heat, go.Figure(layout=dict(title="per-head grid off")))
        route = figs.get("routing_map", (None,))[0]
        if route is None:
            route = go.Figure(layout=dict(title="dense recipes: every block exact"))
        _update_in_place(self.fig_route, route)


def readout_html(values: dict, names: dict, *, step=None, layer=None, comparison=None) -> str:
    """The numeric readout: one row per metric, columns A | B | benefit of B over A.

    With the ``Comparison`` it also gives the 95% paired bootstrap interval of the output-MSE
    benefit over the sampled rows (``data-key="benefit_ci"``), the output MSE per segment of the
    layout (when it has more than one) and the token-mean drift of K and V per channel group
    (rotated / pass-through, from the rotated count; an empty group has no row).
    """
    rows = []

    def row(label, key, a, b, kind, ben=""):
        rows.append(
            f"<tr><td>{html.escape(label)}</td>"
            f'<td class="wb-val" data-key="A.{key}">{fmt(a, kind)}</td>'
            f'<td class="wb-val" data-key="B.{key}">{fmt(b, kind)}</td>'
            f"<td>{ben}</td></tr>")

    for key, label, kind in READOUT_ROWS:
        a, b = values["A"][key], values["B"][key]
        ben = fmt_benefit(benefit_pct(a, b)) if key in LOWER_IS_BETTER else ""
        if key == "output_mse" and comparison is not None:
            lo, hi = comparison.benefit_ci("A", "B")
            ben += (f' <span class="wb-ci" data-key="benefit_ci">(95% CI {fmt_benefit(lo)} to '
                    f"{fmt_benefit(hi)})</span>")
        row(label, key, a, b, kind, ben)
    if comparison is not None:
        ea, eb = comparison.evals["A"], comparison.evals["B"]
        if len(ea.segments) > 1:
            for name, sa in ea.segments.items():
                a, b = sa["mse"], eb.segments[name]["mse"]
                row(f"output MSE, {name} ({sa['rows']} rows)", f"segment_{name}_mse", a, b, "mse",
                    fmt_benefit(benefit_pct(a, b)))
        for t in ("k", "v"):
            for g, label, _, _ in comparison.channel_groups(t.upper()):
                key = f"drift_{t}_{g}"
                a, b = values["A"][key], values["B"][key]
                row(f"{t.upper()} token-mean drift, {label}", key, a, b, "drift",
                    fmt_benefit(benefit_pct(a, b)))
    head = (f"<tr><th>step {step}, layer {layer}</th><th>{html.escape(names['A'])}</th>"
            f"<th>{html.escape(names['B'])}</th><th>benefit</th></tr>")
    return ('<table class="wb-table" style="border-collapse:collapse;font-family:monospace;'
            'font-size:12px">' + head + "".join(rows) + "</table>")

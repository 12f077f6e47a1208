"""PR figure export: ``workbench report STORE --a RECIPE --b RECIPE --out DIR``.

Writes, for one store entry (step, layer) and two recipes:

- ``figures/<name>.png`` and ``.svg`` through kaleido, which drives the system Chromium
  (``BROWSER_PATH``, default ``/usr/bin/chromium``; nothing here ever downloads a browser);
- ``figures/<name>.html``: one self-contained page per figure (plotly.js inlined, works offline);
- ``report.md``: the seed PR's tables (``AccuracyTable.to_markdown``) with the figures linked;
- ``report.json``: the table and the figure inputs' headline numbers.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import numpy as np

from workbench.metrics import BOUNDARY_LABELS, benefit_pct
from workbench.recipes import get_recipe
from workbench.report.accuracy_table import TABLE_ROWS

DEFAULT_BROWSER = "/usr/bin/chromium"
FIG_WIDTH, FIG_HEIGHT = 1000, 560


def browser_path() -> str | None:
    """The Chromium kaleido should drive: $BROWSER_PATH, else Debian's, else None (no export)."""
    p = os.environ.get("BROWSER_PATH") or DEFAULT_BROWSER
    if Path(p).exists():
        return p
    return shutil.which("chromium")


def report_figures(source, recipe_a, recipe_b, *, step, layer, heads=None, n_queries=64):
    """({name: (figure, caption)}, Comparison, layer-head grids) for one entry of `source`."""
    from workbench.viz import figures as F
    from workbench.viz.compute import evaluate_recipes, layer_head_grid

    a, b = get_recipe(recipe_a), get_recipe(recipe_b)
    heads = heads if heads is not None else source.heads
    q, k, v = source.qkv(step, layer, heads)
    c = evaluate_recipes(q, k, v, {a.name: a, b.name: b}, layout=source.layout,
                         n_queries=n_queries, heads=heads, rotated=source.rotated)
    ea, eb = c.evals[a.name], c.evals[b.name]
    grids = {t: layer_head_grid(source, step, r, heads=heads, n_queries=n_queries,
                                metrics=("mse",))["mse"] for t, r in (("a", a), ("b", b))}
    where = f"step {step}, layer {layer}"
    figs = {}
    figs["boundary_bars"] = (F.boundary_bars(
        {e.name: {bd: e.overall[bd]["mse"] for bd in TABLE_ROWS} for e in (ea, eb)},
        labels=BOUNDARY_LABELS), f"MSE at each boundary of the seed table ({where})")
    figs["error_along_tokens"] = (F.error_along_tokens({e.name: e.along for e in (ea, eb)}),
                                  f"attention output MSE per sampled query row ({where})")
    figs["drift_k"] = (F.drift_per_channel({e.name: e.drift_k for e in (ea, eb)},
                                           rotated=source.rotated, tensor="K"),
                       "K token-mean drift per channel")
    figs["drift_v"] = (F.drift_per_channel({e.name: e.drift_v for e in (ea, eb)},
                                           rotated=source.rotated, tensor="V"),
                       "V token-mean drift per channel")
    for t, e in (("a", ea), ("b", eb)):
        figs[f"heatmap_output_mse_{t}"] = (F.per_head_heatmap(
            grids[t], layers=source.layers, heads=heads, recipe=e.name,
            boundary=f"attention output, step {step}"),
            f"output MSE per layer and head, {e.name} (step {step})")
    ben = np.vectorize(benefit_pct)(grids["a"], grids["b"])
    figs["heatmap_benefit"] = (F.per_head_heatmap(
        ben, layers=source.layers, heads=heads, metric="benefit %", log_color=False,
        recipe=f"{b.name} over {a.name}", boundary=f"attention output, step {step}"),
        f"output-MSE benefit of {b.name} over {a.name} per layer and head (%)")
    for e in (eb, ea):
        if e.block_map is not None:
            figs["routing_map"] = (F.routing_map(
                e.block_map, block=e.block, exact_fraction=e.exact_fraction,
                title=f"{e.name} {e.recipe.sparsity} routing ({where}, mean over heads)",
                bands=source.layout.bands()), f"{e.name} block routing ({where})")
            break
    return figs, c, grids


def write_figures(figs: dict, out: Path, *, formats=("png", "svg", "html"),
                  width: int = FIG_WIDTH, height: int = FIG_HEIGHT) -> dict[str, dict[str, Path]]:
    """Write every figure in every format. Returns {name: {format: path}}."""
    import plotly.io as pio

    out.mkdir(parents=True, exist_ok=True)
    written: dict[str, dict[str, Path]] = {name: {} for name in figs}
    if "html" in formats:
        for name, (fig, _) in figs.items():
            p = out / f"{name}.html"
            fig.write_html(p, include_plotlyjs=True, full_html=True)
            written[name]["html"] = p
    static = [f for f in ("png", "svg") if f in formats]
    if static:
        exe = browser_path()
        if exe is None:
            raise FileNotFoundError(
                "static export needs Chromium: /usr/bin/chromium is missing (run `bash "
                "scripts/ensure_chromium.sh` as root, or set BROWSER_PATH); nothing is downloaded")
        os.environ.setdefault("BROWSER_PATH", exe)
        items, paths = [], []
        for name, (fig, _) in figs.items():
            for fmt in static:
                items.append(fig)
                paths.append(out / f"{name}.{fmt}")
                written[name][fmt] = paths[-1]
        # One browser for the whole batch (one launch per figure costs ~2 s each).
        pio.write_images(items, paths, width=width, height=height, scale=1)
    return written


def write_report(store, recipe_a, recipe_b, out, *, step=None, layer=None, heads=None,
                 n_queries: int = 64, formats=("png", "svg", "html"), device: str = "cpu",
                 log=print) -> Path:
    """Export figures, tables and markdown for one store entry. Returns the markdown path."""
    from workbench.report.accuracy_table import accuracy_table
    from workbench.viz.compute import ReplaySource

    t0 = time.perf_counter()
    out = Path(out)
    src = ReplaySource(store, device=device)
    step = src.steps[-1] if step is None else step
    layer = src.layers[-1] if layer is None else layer
    heads = list(heads) if heads is not None else src.heads[:4]
    a, b = get_recipe(recipe_a), get_recipe(recipe_b)
    q, k, v = src.qkv(step, layer, heads)
    table = accuracy_table(q, k, v, a, b, layout=src.layout, head_labels=heads,
                           n_queries=n_queries, rotated=src.rotated,
                           source=f"capture store `{src.name}`, step {step}, layer {layer}")
    figs, comp, grids = report_figures(src, a, b, step=step, layer=layer, heads=heads,
                                       n_queries=n_queries)
    fig_dir = out / "figures"
    written = write_figures(figs, fig_dir, formats=formats)

    lines = [
        f"## Attention accuracy report: `{a.name}` vs `{b.name}`",
        "",
        f"Store `{src.path}` ({src.describe()}). Entry: step {step}, layer {layer}. Reference "
        "path (torch emulation of each recipe) against float64 dense attention; the recipes' "
        "dense policy (dense steps / layers) is not applied, so the entry runs each recipe's "
        "own numerics.",
        "",
        table.to_markdown(),
        "### Figures",
        "",
    ]
    for name, (_, caption) in figs.items():
        w = written[name]
        links = " | ".join(f"[{fmt}]({w[fmt].relative_to(out).as_posix()})"
                           for fmt in ("svg", "html") if fmt in w)
        if "png" in w:
            lines.append(f"![{caption}]({w['png'].relative_to(out).as_posix()})")
        lines += [f"*{caption}.* {links}", ""]
    md = out / "report.md"
    md.write_text("\n".join(lines))
    data = {
        "store": str(src.path), "step": step, "layer": layer, "heads": heads,
        "table": json.loads(table.to_json()),
        "readout": comp.readout(),
        "layer_head_output_mse": {t: g.tolist() for t, g in grids.items()},
        "layers": src.layers,
        "figures": {n: {f: p.relative_to(out).as_posix() for f, p in w.items()}
                    for n, w in written.items()},
        "seconds": time.perf_counter() - t0,
    }
    (out / "report.json").write_text(json.dumps(data, indent=1, default=str))
    log(f"[report] {len(figs)} figures x {len(formats)} formats -> {fig_dir}; markdown -> {md} "
        f"({time.perf_counter() - t0:.1f} s)")
    return md

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


from workbench.recipes import get_recipe

DEFAULT_BROWSER = "/usr/bin/chromium"
FIG_WIDTH, FIG_HEIGHT = 1000, 560


def browser_path() -> str | None:
    """The Chromium kaleido should drive: $BROWSER_PATH, else Debian's, else None (no export)."""
    p = os.environ.get("BROWSER_PATH") or DEFAULT_BROWSER
    if Path(p).exists():
        return p
    return shutil.which("chromium")


def report_figures(source, recipe_a, recipe_b, *, step, layer, heads=None, n_queries=64):
    """({name: (figure, caption)}, Comparison, layer-head grids) for one entry of `source`.

    The comparison is keyed by the recipes' strings (``AttentionRecipe.to_string``); the grids
    are the output MSE of A and B per layer and head at `step`.
    """
    from workbench.evaluate import evaluate_entry, layer_head_grid
    from workbench.viz.figures import comparison_figures

    a, b = get_recipe(recipe_a), get_recipe(recipe_b)
    ka, kb = a.to_string(), b.to_string()
    if ka == kb:
        raise ValueError(f"report: recipes A and B are the same ({ka!r}); give two recipes")
    heads = list(heads) if heads is not None else list(source.heads)
    c = evaluate_entry(source, step, layer, {ka: a, kb: b}, heads=heads, n_queries=n_queries)
    grids = {t: layer_head_grid(source, step, r, heads=heads, n_queries=n_queries,
                                metrics=("mse",))["mse"] for t, r in (("a", a), ("b", b))}
    figs = comparison_figures(c, ka, kb, grids=grids, layers=source.layers, step=step,
                              layer=layer)
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


def figures_markdown(figs: dict, written: dict, out: Path) -> list[str]:
    """Markdown lines for written figures: the PNG inline, SVG / HTML linked, paths relative to
    `out`."""
    lines = []
    for name, (_, caption) in figs.items():
        w = written[name]
        links = " | ".join(f"[{fmt}]({w[fmt].relative_to(out).as_posix()})"
                           for fmt in ("svg", "html") if fmt in w)
        if "png" in w:
            lines.append(f"![{caption}]({w['png'].relative_to(out).as_posix()})")
        lines += [f"*{caption}.* {links}", ""]
    return lines


def write_report(store, recipe_a, recipe_b, out, *, step=None, layer=None, heads=None,
                 n_queries: int = 64, formats=("png", "svg", "html"), device: str = "cpu",
                 log=print) -> Path:
    """Export figures, tables and markdown for one store entry. Returns the markdown path."""
    from workbench.evaluate import ReplaySource
    from workbench.report.accuracy_table import table_from_comparison

    t0 = time.perf_counter()
    out = Path(out)
    src = ReplaySource(store, device=device)
    step = src.steps[-1] if step is None else step
    layer = src.layers[-1] if layer is None else layer
    heads = list(heads) if heads is not None else src.heads[:4]
    a, b = get_recipe(recipe_a), get_recipe(recipe_b)
    figs, comp, grids = report_figures(src, a, b, step=step, layer=layer, heads=heads,
                                       n_queries=n_queries)
    table = table_from_comparison(comp, a.to_string(), b.to_string(),
                                  source=f"capture store `{src.name}`, step {step}, layer {layer}")
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
    lines += figures_markdown(figs, written, out)
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

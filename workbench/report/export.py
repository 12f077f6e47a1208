"""PR figure export: ``workbench report STORE --a RECIPE --b RECIPE --out DIR``.

Writes, for one store entry (step, layer) and two recipes:

- ``figures/<name>.png`` (at twice the layout's pixel size, sharp on high-density screens and in
  PR pages) and ``.svg`` through kaleido, which drives the system Chromium (``BROWSER_PATH``,
  default ``/usr/bin/chromium``; nothing here ever downloads a browser);
- ``figures/<name>.html``: one page per figure, all loading one ``plotly-<version>.min.js`` next
  to them (works offline; ~10 kB per page instead of 4.8 MB), or self-contained pages with
  plotly.js inlined (``html_inline=True``, ``workbench report --html-inline``);
- ``report.md``: the seed PR's tables (``AccuracyTable.to_markdown``) with the figures linked, every
  path relative to the report, so the folder can be moved or committed as it is;
- ``report.json``: the table and the figure inputs' headline numbers.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path


from workbench.recipes import get_recipe
from workbench.recipes.plan import entry_recipe

DEFAULT_BROWSER = "/usr/bin/chromium"
FIG_WIDTH, FIG_HEIGHT = 1000, 560  # layout size in CSS pixels
PNG_SCALE = 2  # PNGs are FIG_WIDTH * 2 x FIG_HEIGHT * 2 pixels
# What write_report (and write_scan_report) put in --out, and the report.json keys that tell an
# earlier report from a user's files there (cli_args.check_no_clobber).
REPORT_FILES = ("report.md", "report.json", "figures")
REPORT_MARKER = ("report.json", ("store", "step", "layer", "table", "readout", "figures"))


def plotlyjs_name() -> str:
    """File name of the shared plotly.js bundle, versioned so an older copy is never reused."""
    from plotly.offline import get_plotlyjs_version

    return f"plotly-{get_plotlyjs_version()}.min.js"


def browser_path() -> str | None:
    """The Chromium kaleido should drive: $BROWSER_PATH, else Debian's, else None (no export)."""
    p = os.environ.get("BROWSER_PATH") or DEFAULT_BROWSER
    if Path(p).exists():
        return p
    return shutil.which("chromium")


def report_figures(source, recipe_a, recipe_b, *, step, layer, heads=None, n_queries=64):
    """({name: (figure, caption)}, Comparison, layer-head grids) for one entry of `source`.

    recipe_a / recipe_b: recipes or plans. The comparison runs the recipe each gives at (step,
    layer) (``entry_recipe``), keyed by its string (``AttentionRecipe.to_string``); the grids are
    the output MSE of A and B per layer and head at `step`, a plan's with the recipe it plans at
    each layer (``layer_head_grid``), so a plan's heatmap is the plan, not one of its recipes.
    """
    from workbench.evaluate import evaluate_entry, layer_head_grid
    from workbench.recipes.plan import RecipePlan
    from workbench.viz.figures import comparison_figures

    specs = [get_recipe(r) for r in (recipe_a, recipe_b)]
    a, b = (entry_recipe(r, step, layer)[0] for r in specs)
    ka, kb = a.to_string(), b.to_string()
    if ka == kb:
        raise ValueError(f"report: recipes A and B are the same at step {step}, layer {layer} "
                         f"({ka!r}); give two recipes")
    heads = list(heads) if heads is not None else list(source.heads)
    c = evaluate_entry(source, step, layer, {ka: a, kb: b}, heads=heads, n_queries=n_queries)
    grids = {t: layer_head_grid(source, step, r, heads=heads, n_queries=n_queries,
                                metrics=("mse",))["mse"] for t, r in zip("ab", specs)}
    grid_labels = {t: f"plan {r.name!r} (each layer its planned recipe)"
                   for t, r in zip("ab", specs) if isinstance(r, RecipePlan)}
    figs = comparison_figures(c, ka, kb, grids=grids, layers=source.layers, step=step,
                              layer=layer, grid_labels=grid_labels)
    return figs, c, grids


def write_figures(figs: dict, out: Path, *, formats=("png", "svg", "html"),
                  width: int = FIG_WIDTH, height: int = FIG_HEIGHT, scale: int = PNG_SCALE,
                  html_inline: bool = False) -> dict[str, dict[str, Path]]:
    """Write every figure in every format. Returns {name: {format: path}}.

    PNGs are `scale` times the layout's pixel size (SVG is vector). HTML pages share one plotly.js
    file written next to them, or inline it each (`html_inline`: a page that travels alone).
    """
    import plotly.io as pio

    out.mkdir(parents=True, exist_ok=True)
    written: dict[str, dict[str, Path]] = {name: {} for name in figs}
    if "html" in formats:
        include: str | bool = True
        if not html_inline:
            from plotly.offline import get_plotlyjs

            include = plotlyjs_name()
            bundle = out / include
            js = get_plotlyjs()
            if not bundle.exists() or bundle.stat().st_size != len(js.encode()):
                bundle.write_text(js, encoding="utf-8")
        for name, (fig, _) in figs.items():
            p = out / f"{name}.html"
            fig.write_html(p, include_plotlyjs=include, full_html=True)
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
        pio.write_images(items, paths, width=width, height=height, scale=scale)
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


def _grid_name(spec, step, layer) -> str:
    """What a heatmap's layer ran: a plan's label there (with the recipe), else the recipe's."""
    from workbench.recipes.plan import RecipePlan

    r = get_recipe(spec)
    if isinstance(r, RecipePlan):
        lab, name = r.label_at(step, layer), r.at(step, layer).label()
        return lab if lab == name else f"{lab} ({name})"
    return entry_recipe(r, step, layer)[0].label()


def write_report(store, recipe_a, recipe_b, out, *, step=None, layer=None, heads=None,
                 n_queries: int = 64, formats=("png", "svg", "html"), device: str = "cpu",
                 html_inline: bool = False, causal: bool | None = None, log=print) -> Path:
    """Export figures, tables and markdown for one store entry. Returns the markdown path.

    heads: captured query head ids, "all", or None (the first four captured).
    html_inline: self-contained HTML pages (plotly.js in each) instead of one shared bundle.
    causal: mask keys after each row (None: as the store records)."""
    from workbench.evaluate import ReplaySource
    from workbench.report.accuracy_table import table_from_comparison

    t0 = time.perf_counter()
    out = Path(out)
    src = ReplaySource(store, device=device, causal=causal)
    step = src.steps[-1] if step is None else step
    layer = src.layers[-1] if layer is None else layer
    heads = (list(src.heads) if isinstance(heads, str) and heads == "all"
             else list(heads) if heads is not None else src.heads[:4])
    # read once (a plan file is not read again per layer); a plan runs its recipe of this
    # entry (its own numerics, as every recipe here)
    recipe_a, recipe_b = get_recipe(recipe_a), get_recipe(recipe_b)
    (a, note_a), (b, note_b) = (entry_recipe(r, step, layer) for r in (recipe_a, recipe_b))
    for flag, note in (("A", note_a), ("B", note_b)):
        if note:
            log(f"{flag}: {note}")
    figs, comp, grids = report_figures(src, recipe_a, recipe_b, step=step, layer=layer,
                                       heads=heads, n_queries=n_queries)
    table = table_from_comparison(comp, a.to_string(), b.to_string(),
                                  source=f"capture store `{src.name}`, step {step}, layer {layer}")
    # the recipe each grid ran per layer (a plan's differ by layer)
    # a plan's own label per layer (two custom recipes of one name have one label(): the
    # plan's labels tell them apart), else the recipe's label
    grid_recipes = {t: [_grid_name(r, step, la) for la in src.layers]
                    for t, r in (("a", recipe_a), ("b", recipe_b))}
    plan_lines = [f"{t.upper()}'s per-layer heatmap at step {step} runs the plan's recipe of each "
                  "layer: " + ", ".join(f"layer {la} `{n}`" for la, n in zip(src.layers, names))
                  + "." for t, names in grid_recipes.items() if len(set(names)) > 1]
    fig_dir = out / "figures"
    written = write_figures(figs, fig_dir, formats=formats, html_inline=html_inline)
    store_rel = Path(os.path.relpath(Path(src.path).resolve(), out.resolve())).as_posix()

    lines = [
        f"## Attention accuracy report: `{a.label()}` vs `{b.label()}`",
        "",
        f"Store `{store_rel}` ({src.describe()}). Entry: step {step}, layer {layer}. Reference "
        "path (torch emulation of each recipe) against float64 dense attention; the recipes' "
        "dense policy (dense steps / layers) is not applied, so the entry runs each recipe's "
        "own numerics." + "".join(f" {flag}: {note}." for flag, note in (("A", note_a),
                                                                        ("B", note_b)) if note),
        "",
        table.to_markdown(),
        *[x for line in plan_lines for x in (line, "")],
        "### Figures",
        "",
    ]
    lines += figures_markdown(figs, written, out)
    md = out / "report.md"
    md.write_text("\n".join(lines))
    data = {
        "store": store_rel, "step": step, "layer": layer, "heads": heads,
        "table": json.loads(table.to_json()),
        "readout": comp.readout(),
        "layer_head_output_mse": {t: g.tolist() for t, g in grids.items()},
        "layer_head_recipes": grid_recipes,
        "layers": src.layers,
        "figures": {n: {f: p.relative_to(out).as_posix() for f, p in w.items()}
                    for n, w in written.items()},
        "png_scale": PNG_SCALE,
        "html": "inline" if html_inline else f"figures/{plotlyjs_name()}",
        "seconds": time.perf_counter() - t0,
    }
    (out / "report.json").write_text(json.dumps(data, indent=1, default=str))
    log(f"[report] {len(figs)} figures x {len(formats)} formats -> {fig_dir}; markdown -> {md} "
        f"({time.perf_counter() - t0:.1f} s)")
    return md

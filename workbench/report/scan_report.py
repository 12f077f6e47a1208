"""Scan report export: ``workbench scan-report SCAN --out DIR [--plan plan.json]``.

Writes ``figures/<name>.{png,svg,html}`` (``workbench.report.export.write_figures``: kaleido with
the system Chromium; HTML pages sharing one plotly.js beside them), ``report.md`` (the scan's
parameters, a per-recipe summary, the plan and the figures) and ``report.json`` (the scan's
path and parameters, the figure files and the plan; the summary numbers are in report.md and in
the scan store itself).
"""

from __future__ import annotations

import json
import time
from pathlib import Path

SCAN_REPORT_MARKER = ("report.json", ("scan", "params", "figures", "plan"))  # see REPORT_MARKER


def write_scan_report(scan, out, *, plan=None, formats=("png", "svg", "html"),
                      recipe: str | None = None, step: int | None = None, log=print) -> Path:
    """Export a scan's figures and markdown. Returns the markdown path."""
    from workbench.evaluate.cli import plan_grid_text, summary_table
    from workbench.evaluate.scan_store import open_scan
    from workbench.recipes import RecipePlan, get_recipe
    from workbench.viz.scan_figures import scan_figures

    from .export import figures_markdown, write_figures

    t0 = time.perf_counter()
    out = Path(out)
    ds = open_scan(scan)
    if not bool(ds.done.all()):  # its medians and benefits would be of a part of the scan
        missing = int((~ds.done).sum())
        raise ValueError(f"{scan}: {missing} of {ds.done.size} (entry, recipe) tasks are not "
                         "done; finish the scan (run it again: it resumes) before reporting it")
    if plan is not None and not isinstance(plan, RecipePlan):
        try:
            plan = get_recipe(plan)
        except (ValueError, FileNotFoundError) as exc:
            raise ValueError(f"--plan {plan}: {exc}") from None
        if not isinstance(plan, RecipePlan):
            raise ValueError("--plan: not a plan JSON (no 'workbench_plan' key)")
    src_id = (plan.source or {}).get("store_id") if plan is not None else None
    if src_id is not None and src_id != ds.attrs["params"]["store_id"]:
        raise ValueError(f"--plan {plan.name!r}: planned from another capture (store_id "
                         f"{src_id}, scan {(plan.source or {}).get('scan')}), not the one this "
                         f"scan read ({ds.attrs['params']['store_id']}); draw it with its own scan")
    figs = scan_figures(ds, recipe=recipe, step=step, plan=plan)
    written = write_figures(figs, out / "figures", formats=formats)
    p = ds.attrs["params"]
    steps, layers = [int(s) for s in ds.step.values], [int(x) for x in ds.layer.values]
    lines = [
        f"## Sensitivity scan of `{Path(p['store']).name}`",
        "",
        f"Scan `{ds.attrs['path']}`: steps {steps}, layers {layers}, heads {p['heads']}, "
        f"{len(p['query_rows'])} evenly spaced query rows of {p['seq_len']:,}, float64 dense "
        f"reference; recipes' dense policy {'applied' if p['dense_policy'] else 'not applied'}"
        f". Benefit = output-MSE reduction against `{p['baseline']}`, with the paired-bootstrap "
        "95% interval over the sampled rows.",
        "",
        summary_table(ds),
        "",
    ]
    if plan is not None:
        cost = plan.expected_cost
        lines += [f"### Plan `{plan.name}`", "", f"Rule: {plan.rule.get('text', '')}.", "",
                  "```", plan_grid_text(plan, steps, layers), "```", "",
                  f"Expected attention cost: plan {cost.get('relative_to_bf16', float('nan')):.3f}"
                  " x dense BF16; uniform: " + ", ".join(
                      f"{k} {v:.3f}" for k, v in cost.get("uniform_recipes", {}).items()), ""]
    lines += ["### Figures", ""]
    lines += figures_markdown(figs, written, out)
    md = out / "report.md"
    md.write_text("\n".join(lines))
    data = {"scan": ds.attrs["path"], "params": p,
            "figures": {n: {f: q.relative_to(out).as_posix() for f, q in w.items()}
                        for n, w in written.items()},
            "plan": None if plan is None else plan.to_dict(),
            "seconds": time.perf_counter() - t0}
    (out / "report.json").write_text(json.dumps(data, indent=1, default=str))
    log(f"[scan-report] {len(figs)} figures x {len(formats)} formats -> {out / 'figures'}; "
        f"markdown -> {md} ({time.perf_counter() - t0:.1f} s)")
    return md

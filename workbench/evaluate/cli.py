"""``workbench scan`` and ``workbench plan`` (``workbench scan-report`` is in workbench.report).

    workbench scan captures/demo_h3_nano.zarr --recipes bf16,fp8_dense,fp8_dense_k
    workbench plan captures/demo_h3_nano.scan.zarr --rule min_sqnr --budget 30 --out plan.json
    workbench scan-report captures/demo_h3_nano.scan.zarr --plan plan.json --out reports/scan
    workbench compare --recipes bf16,plan.json --model h3-nano --steps 10
"""

from __future__ import annotations

import os
from pathlib import Path

from workbench.cli_args import parse_int_list


def _ints(text: str | None, name: str) -> list[int] | None:
    """The CLI's one integer-list grammar (workbench.cli_args): 0,5,9 / 0-3 / all (None)."""
    return parse_int_list(text or None, f"--{name}")


def summary_table(ds) -> str:
    """Per recipe: output SQNR over the entries and how often the benefit is significant."""
    from .planning import SQNR

    sq = ds.entry_metrics.sel(metric=SQNR)
    ben = ds.benefit
    base = ds.attrs["params"]["baseline"]
    lines = [f"| recipe | median SQNR (dB) | worst entry SQNR (dB) | entries better / worse "
             f"than {base} (95% CI) |", "|---|---:|---:|---|"]
    for r in ds.recipe.values:
        s = sq.sel(recipe=r)
        lo, hi = ben.sel(recipe=r, stat="ci_lo"), ben.sel(recipe=r, stat="ci_hi")
        better, worse = int((lo > 0).sum()), int((hi < 0).sum())
        cmp = "(baseline)" if r == base else f"{better} / {worse} of {s.size}"
        lines.append(f"| {r} | {float(s.median()):.2f} | {float(s.min()):.2f} | {cmp} |")
    return "\n".join(lines)


def cmd_scan(args) -> int:
    from .scan import run_scan
    from .scan_store import ScanParams

    ds, run = run_scan(
        args.store, args.recipes, out=args.out, steps=_ints(args.steps, "steps"),
        layers=_ints(args.layers, "layers"), heads=_ints(args.heads, "heads"),
        n_queries=args.queries, dense_policy=args.dense_policy, baseline=args.baseline,
        scheduler=args.scheduler, workers=args.workers, overwrite=args.overwrite,
        progress=not args.quiet, device=args.device)
    print(summary_table(ds))
    print(f"\nscan: {run.path} ({ds.sizes['step']} steps x {ds.sizes['layer']} layers x "
          f"{ds.sizes['recipe']} recipes, heads {ds.attrs['params']['heads']}, "
          f"{ds.sizes['row']} query rows)")
    if run.tasks_run:
        print(f"throughput: {run.tasks_per_second:.2f} entries x recipes per second "
              f"({run.tasks_run} tasks in {run.seconds:.2f} s on {run.workers} worker(s), "
              f"{run.scheduler}, {ScanParams.from_dict(ds.attrs['params']).device})")
    return 0


def plan_grid_text(plan, steps, layers) -> str:
    """The plan as a step x layer text grid of recipe labels."""
    width = max(len(lab) for lab in plan.recipes)
    head = "step \\ layer".ljust(13) + " ".join(str(la).ljust(width) for la in layers)
    rows = [head]
    for s in steps:
        rows.append(str(s).ljust(13) + " ".join(plan.label_at(s, la).ljust(width)
                                                for la in layers))
    return "\n".join(rows)


def is_plan_file(path: Path) -> bool:
    """A file holding a plan JSON (the ``workbench_plan`` key), as ``workbench plan`` writes."""
    from workbench.cli_args import json_has_keys
    from workbench.recipes.plan import PLAN_MARKER

    return json_has_keys(path, (PLAN_MARKER,))


def check_plan_out(out: Path, force: bool) -> None:
    """Refuse a plan --out inside a zarr store, and an existing path unless --force and it is a
    plan file (--force replaces a plan, never another file)."""
    from workbench.capture.storefs import check_not_inside_store

    from .scan_store import ScanError

    check_not_inside_store(out, "--out")
    if not (out.exists() or out.is_symlink()):
        if not out.parent.is_dir():
            raise ScanError(f"--out: {out}: the folder {out.parent} does not exist")
        return
    if not force:
        raise ScanError(f"--out: {out} exists; pass --force to replace it")
    if out.is_symlink():
        raise ScanError(f"--out: {out} is a symbolic link; --force replaces only a plan file: "
                        "give its real path")
    if not is_plan_file(out):
        raise ScanError(f"--out: {out} is not a plan written by workbench plan (no "
                        "'workbench_plan' JSON); --force replaces only a plan: choose another path")


def write_plan(out: Path, text: str) -> None:
    """Write beside, then rename over `out`: an interrupted write leaves the old file whole."""
    from workbench.capture.storefs import sibling

    tmp = sibling(out, "tmp")
    try:
        tmp.write_text(text)
        os.replace(tmp, out)
    finally:
        if tmp.exists():
            tmp.unlink()


def cmd_plan(args) -> int:
    from .planning import PlanRule, derive_plan
    from .scan_store import named_path, open_scan

    scan = named_path(args.scan)  # "." has no name to derive the default --out from
    out = Path(args.out) if args.out else scan.with_name(
        scan.name.removesuffix(".zarr") + ".plan.json")
    ds = open_scan(args.scan)
    check_plan_out(out, args.force)  # before the plan is derived: a refused --out costs nothing
    rule = PlanRule(rule=args.rule, budget=args.budget, reduce=args.reduce,
                    v_centring_guard=not args.no_v_guard, fallback=args.fallback)
    plan = derive_plan(ds, rule, name=args.name, default=args.default)
    write_plan(out, plan.to_json(indent=1) + "\n")
    cost = plan.expected_cost
    print(f"rule: {rule.describe()}")
    print(plan_grid_text(plan, [int(s) for s in ds.step.values],
                         [int(x) for x in ds.layer.values]))
    print(f"\nexpected attention cost: plan {cost['relative_to_bf16']:.3f} x dense BF16; "
          "uniform recipes: " + ", ".join(f"{lab} {c:.3f}" for lab, c in
                                          cost["uniform_recipes"].items()))
    print(f"wrote {out}  (use: workbench generate --recipe {out} / compare --recipes "
          f"bf16,{out})")
    return 0


def register(sub) -> None:
    p = sub.add_parser("scan", help="every capture entry x recipe into a scan store (dask)")
    p.add_argument("store", help="capture store (zarr directory)")
    p.add_argument("--recipes", required=True,
                   help="comma list of recipes (presets, 'preset:field=value', JSON, plan.json)")
    p.add_argument("--steps", default=None, help="steps, e.g. 0-8 or 0,4,8 (default all)")
    p.add_argument("--layers", default=None, help="layers (default all)")
    p.add_argument("--heads", default=None, help="captured query heads (default all)")
    p.add_argument("--queries", type=int, default=64, help="evenly spaced query rows (64)")
    p.add_argument("--baseline", default=None,
                   help="recipe the benefit is measured against (default: the first)")
    p.add_argument("--dense-policy", action="store_true",
                   help="apply each recipe's dense steps / layers (default: its own numerics "
                        "at every entry)")
    p.add_argument("--out", default=None, help="scan store (default STORE.scan.zarr)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an existing scan store (built beside it, swapped in when "
                        "complete; refused if the folder holds other files)")
    p.add_argument("--scheduler", default=None,
                   help="ADDRESS of a running dask scheduler, or 'synchronous' (in-process); "
                        "default: a new LocalCluster")
    p.add_argument("--workers", type=int, default=None,
                   help="LocalCluster worker processes (default: one per GPU for a CUDA scan, "
                        "one per core for a CPU scan)")
    p.add_argument("--device", default="auto", choices=("auto", "cpu", "cuda"),
                   help="where the recipes and the float64 reference run (auto: CUDA when "
                        "this machine's torch sees it, also for --scheduler ADDRESS); small "
                        "captures such as h3-nano scan faster on the CPU")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_scan)

    p = sub.add_parser("plan", help="a recipe per (step, layer) from a scan, as plan JSON")
    p.add_argument("scan", help="scan store (from `workbench scan`)")
    p.add_argument("--rule", default="min_sqnr", help="min_sqnr (default) or max_cost")
    p.add_argument("--budget", type=float, default=30.0,
                   help="min_sqnr: output SQNR floor in dB (30); max_cost: cost ceiling x "
                        "dense BF16")
    p.add_argument("--reduce", default="entry",
                   help="judge SQNR per entry (default) or by the worst head (worst_head)")
    p.add_argument("--no-v-guard", action="store_true",
                   help="keep V-centring recipes where their K-only twin is significantly better")
    p.add_argument("--fallback", default="bf16", help="recipe where none qualifies (bf16)")
    p.add_argument("--default", default=None,
                   help="recipe for entries the scan did not cover (default: the fallback)")
    p.add_argument("--name", default="plan", help="plan name")
    p.add_argument("--out", default=None, help="plan JSON (default SCAN.plan.json)")
    p.add_argument("--force", action="store_true",
                   help="replace an existing plan file (only a plan JSON, never another file)")
    p.set_defaults(func=cmd_plan)

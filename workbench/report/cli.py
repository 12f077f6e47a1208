"""`workbench table`, `workbench report`, `workbench scan-report` and `workbench demo`."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

from workbench.cli_args import (
    check_device,
    check_no_clobber,
    check_out_dir,
    check_out_file,
    parse_int_list,
    positive_int,
    writing_mark,
)
from workbench.recipes.plan import entry_recipe


def check_out_folder(path, flag: str = "--out") -> Path:
    """check_out_dir, and neither a zarr store nor inside one: files written there would change
    that store (a capture store with foreign files is no longer replaceable or verifiable)."""
    from workbench.capture.storefs import check_outside_stores

    p = check_out_dir(path, flag)
    check_outside_stores(p, flag)
    return p


def check_table_files(json_path, md_path) -> None:
    """--json / --md: outside any zarr store, and replacing only an earlier table of that kind
    (re-running a table into its own file works; another file there is refused, naming it)."""
    from workbench.capture.storefs import check_not_inside_store
    from workbench.report.accuracy_table import is_table_json, is_table_markdown

    for flag, path, own, kind in (("--json", json_path, is_table_json, "table JSON"),
                                  ("--md", md_path, is_table_markdown, "markdown table")):
        if path:
            check_not_inside_store(path, flag)
            check_out_file(path, flag, own=own, kind=f"{kind} (workbench table {flag})")
    if json_path and md_path and Path(json_path).resolve() == Path(md_path).resolve():
        raise ValueError(f"--md {md_path}: the same file as --json; give two paths")


def load_table_input(args) -> dict:
    """q, k, v, layout, source string and head labels from --synthetic or --store.

    --heads: a list / ranges (``0-13``), or ``all`` (every captured head; every head of the
    synthetic input)."""
    heads = parse_int_list(args.heads, "--heads") if args.heads else [0, 1, 2, 3]
    if args.store:
        from workbench.capture import open_capture

        if args.step is None or args.layer is None:
            raise ValueError("--store needs --step and --layer (see `workbench inspect STORE`)")
        cap = open_capture(args.store)
        entry = cap.find(args.step, args.layer)
        captured = [int(h) for h in cap.entry_metadata(entry)[0]["q_heads"]]
        if not args.heads:  # default: the seed's heads 0-3, or as many as were captured
            heads = captured[:4]
        elif heads is None:  # all
            heads = captured
        missing = [h for h in heads if h not in captured]
        if missing:
            raise ValueError(f"--heads: {missing} not captured in {args.store} entry "
                             f"{entry.path}; captured query heads: {captured}")
        if cap.query_rows(args.step, args.layer) is not None:
            raise ValueError(
                f"{args.store}: entry step={args.step} layer={args.layer} kept only some query "
                "rows; the table needs every Q row (Q scales are per 64-row block): capture "
                "this layer with query_rows=None"
            )
        q, k, v = cap.qkv(args.step, args.layer, heads=heads, device=args.device)
        call = cap.attention_call()
        causal = call["causal"] if args.causal is None else args.causal
        if call["causal"] and not causal:
            print(f"note: {args.store} records a causal model; this replay is non-causal "
                  "(--no-causal)", file=sys.stderr)
        return dict(q=q, k=k, v=v, layout=cap.layout, heads=None, head_labels=heads,
                    entry=(entry.step, entry.layer),
                    rotated=cap.rotated_channels, causal=causal, scale=call["scale"],
                    source=f"capture store `{args.store}`, step {args.step}, layer {args.layer}"
                           + ("" if causal else ", non-causal replay"))
    from workbench.synthetic import H3_SYNTHETIC, small_config, synthetic_qkv
    from dataclasses import replace

    if args.synthetic == "h3":
        cfg = H3_SYNTHETIC
    elif args.synthetic == "small":
        cfg = small_config(seq_len=2048, heads=max(heads) + 1 if heads else 4)
    else:
        raise ValueError(f"--synthetic: unknown input {args.synthetic!r}; choose h3 or small")
    cfg = replace(cfg, seed=args.seed, drift=args.drift)
    heads = list(range(cfg.heads)) if heads is None else heads
    bad = [h for h in heads if h >= cfg.heads]
    if bad:
        raise ValueError(f"--heads: {bad} out of range for --synthetic {args.synthetic}, which "
                         f"has {cfg.heads} heads (0-{cfg.heads - 1})")
    q, k, v = synthetic_qkv(cfg, heads=heads, device=args.device)
    shape = (cfg.batch, cfg.seq_len, cfg.heads, cfg.head_dim)
    return dict(q=q, k=k, v=v, layout=cfg.layout, heads=None, head_labels=heads,
                rotated=cfg.rotated, causal=bool(args.causal), scale=None,
                source=f"synthetic H3-like input `--synthetic {args.synthetic}` (seed {args.seed}, "
                       f"shape {shape}, drift {args.drift}; not H3 activations)")


def cmd_table(args) -> int:
    from workbench.report.accuracy_table import accuracy_table, write_table

    t0 = time.perf_counter()
    # Outputs and device are checked before any input is read or computed.
    check_table_files(args.json, args.md)
    check_device(args.device)
    inp = load_table_input(args)
    # a plan runs its recipe of the entry read (--store --step --layer; else its default)
    step, layer = inp.get("entry", (None, None))
    recipes = []
    for flag, spec in (("--a", args.a), ("--b", args.b)):
        r, note = entry_recipe(spec, step, layer)
        if note:
            print(f"{flag}: {note}", file=sys.stderr)
        recipes.append(r)
    table = accuracy_table(
        inp["q"], inp["k"], inp["v"], *recipes,
        layout=inp["layout"], heads=inp["heads"], head_labels=inp["head_labels"],
        n_queries=args.queries, rotated=inp["rotated"], source=inp["source"],
        causal=inp["causal"], scale=inp["scale"],
    )
    table.extras["wall_seconds_including_input"] = time.perf_counter() - t0
    print(table.to_markdown())
    write_table(table, Path(args.md) if args.md else None, Path(args.json) if args.json else None)
    if args.json:
        print(f"wrote {args.json}", file=sys.stderr)
    return 0


def cmd_demo(args) -> int:
    """The main job on the embedded default: writes everything under --out."""
    from workbench.report.demo import run_demo

    return run_demo(check_out_folder(args.out), quick=args.quick, overwrite=args.overwrite)


def _check_heads(store, heads: list[int] | None, step, layer) -> None:
    """The heads asked for must be captured in the entry the report reads (default: the last)."""
    if heads is None:
        return
    from workbench.capture import open_capture

    cap = open_capture(store)
    if not cap.steps or not cap.layers:
        return  # the report itself says the store has no complete entries
    e = cap.find(cap.steps[-1] if step is None else step,
                 cap.layers[-1] if layer is None else layer)
    captured = list(cap.entry_metadata(e)[0]["q_heads"])
    bad = [h for h in heads if h not in captured]
    if bad:
        raise ValueError(f"--heads: {bad} not captured in {store} entry {e.path}; captured query "
                         f"heads: {captured}")


def cmd_report(args) -> int:
    from workbench.report.export import REPORT_FILES, REPORT_MARKER, write_report

    heads = parse_int_list(args.heads, "--heads")
    if heads is None and args.heads is not None:
        heads = "all"  # every captured head (parse_int_list's None for "all")
    out = check_out_folder(args.out)
    check_device(args.device)
    _check_heads(args.store, None if heads == "all" else heads, args.step, args.layer)
    formats = tuple(f.strip() for f in args.formats.split(",") if f.strip())
    bad = sorted(set(formats) - {"png", "svg", "html"})
    if bad:
        raise ValueError(f"--formats: unknown format(s) {bad}; choose from png, svg, html")
    check_no_clobber(out, REPORT_FILES, overwrite=args.overwrite, marker=REPORT_MARKER,
                     command="report")
    with writing_mark(out, "report"):
        md = write_report(args.store, args.a, args.b, out, step=args.step, layer=args.layer,
                          heads=heads, n_queries=args.queries, formats=formats,
                          device=args.device, html_inline=args.html_inline, causal=args.causal)
    print(md)
    return 0


def cmd_scan_report(args) -> int:
    from workbench.report.export import REPORT_FILES
    from workbench.report.scan_report import SCAN_REPORT_MARKER, write_scan_report

    formats = tuple(f.strip() for f in args.formats.split(",") if f.strip())
    bad = sorted(set(formats) - {"png", "svg", "html"})
    if bad:
        raise ValueError(f"--formats: unknown format(s) {bad}; choose from png, svg, html")
    out = check_out_folder(args.out)
    check_no_clobber(out, REPORT_FILES, overwrite=args.overwrite, marker=SCAN_REPORT_MARKER,
                     command="scan-report")
    with writing_mark(out, "scan-report"):
        md = write_scan_report(args.scan, out, plan=args.plan, formats=formats,
                               recipe=args.recipe, step=args.step)
    print(md)
    return 0


def _add_input_args(p: argparse.ArgumentParser) -> None:
    src = p.add_mutually_exclusive_group()
    src.add_argument("--synthetic", default=None, help="synthetic input: h3 (live shape) or small")
    src.add_argument("--store", default=None, help="capture store (zarr) to read an entry from")
    p.add_argument("--step", type=int, default=None, help="step index of the store entry")
    p.add_argument("--layer", type=int, default=None, help="layer index of the store entry")
    p.add_argument("--heads", default=None,
                   help="query heads: 0,5,9, ranges 0-13, or all (default 0-3, or the first four "
                        "captured)")
    p.add_argument("--causal", action=argparse.BooleanOptionalAction, default=None,
                   help="mask keys after each row, in the recipes and the reference (default: "
                        "as the store records, e.g. a transformers decoder)")
    p.add_argument("--queries", type=positive_int, default=64,
                   help="evenly spaced query rows (default 64)")
    p.add_argument("--seed", type=int, default=0, help="synthetic seed (default 0)")
    p.add_argument("--drift", type=float, default=0.0, help="synthetic mean drift amplitude")
    p.add_argument("--device", default="cpu", help="torch device (default cpu)")


def register(sub) -> None:
    p = sub.add_parser("table", help="the seed's kernel-accuracy table for two recipes")
    _add_input_args(p)
    p.add_argument("--a", default="fp8_sol_unsmoothed", help="recipe A (baseline)")
    p.add_argument("--b", default="fp8_sol_kv_corrected", help="recipe B (candidate)")
    p.add_argument("--json", default=None,
                   help="write the table as JSON here (replaces only an earlier table JSON)")
    p.add_argument("--md", default=None,
                   help="write the markdown table here (replaces only an earlier table)")
    p.set_defaults(func=_table_entry)

    p = sub.add_parser("demo", help="run the main job on the embedded default into reports/demo")
    p.add_argument("--out", default="reports/demo", help="output folder (default reports/demo)")
    p.add_argument("--quick", action="store_true", help="smaller synthetic input (for tests)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace files under --out that an earlier demo did not write (the "
                        "demo's own earlier results are replaced without it)")
    p.set_defaults(func=cmd_demo)

    p = sub.add_parser("report", help="export PR figures (png/svg/html) and markdown tables")
    p.add_argument("store", help="capture store (zarr directory)")
    p.add_argument("--a", default="fp8_sol_unsmoothed", help="recipe A (baseline)")
    p.add_argument("--b", default="fp8_sol_kv_corrected", help="recipe B (candidate)")
    p.add_argument("--out", required=True, help="output folder (report.md, figures/)")
    p.add_argument("--step", type=int, default=None, help="entry step (default: the last)")
    p.add_argument("--layer", type=int, default=None, help="entry layer (default: the last)")
    p.add_argument("--heads", default=None,
                   help="query heads, e.g. 0-3, or all (default: the first 4 captured)")
    p.add_argument("--queries", type=positive_int, default=64, help="evenly spaced query rows")
    p.add_argument("--formats", default="png,svg,html", help="comma list of png, svg, html")
    p.add_argument("--html-inline", action="store_true",
                   help="self-contained HTML pages (plotly.js in each, ~4.8 MB) instead of pages "
                        "sharing one plotly.js file next to them")
    p.add_argument("--causal", action=argparse.BooleanOptionalAction, default=None,
                   help="mask keys after each row (default: as the store records)")
    p.add_argument("--device", default="cpu", help="torch device (default cpu)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an earlier report in --out (its report.md, report.json and "
                        "figure files only)")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("scan-report", help="a scan's figures (png/svg/html) and markdown")
    p.add_argument("scan", help="scan store")
    p.add_argument("--out", required=True, help="output folder (report.md, figures/)")
    p.add_argument("--plan", default=None, help="plan JSON to draw as a grid")
    p.add_argument("--recipe", default=None,
                   help="recipe for the error / benefit heatmaps (default: the last one)")
    p.add_argument("--step", type=int, default=None,
                   help="step of the layer x head heatmaps (default: the last)")
    p.add_argument("--formats", default="png,svg,html", help="comma list of png, svg, html")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an earlier report in --out (its report.md, report.json and "
                        "figure files only)")
    p.set_defaults(func=cmd_scan_report)


def _table_entry(args) -> int:
    if not args.store and not args.synthetic:
        args.synthetic = "h3"
    return cmd_table(args)

"""``workbench report``: PR figures (PNG, SVG, self-contained HTML) and markdown tables."""

from __future__ import annotations

import argparse

from workbench.cli_args import check_device, check_out_dir, parse_int_list, positive_int


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
    from workbench.report.export import write_report

    heads = parse_int_list(args.heads, "--heads")
    check_out_dir(args.out)
    check_device(args.device)
    _check_heads(args.store, heads, args.step, args.layer)
    formats = tuple(f.strip() for f in args.formats.split(",") if f.strip())
    bad = sorted(set(formats) - {"png", "svg", "html"})
    if bad:
        raise ValueError(f"--formats: unknown format(s) {bad}; choose from png, svg, html")
    md = write_report(args.store, args.a, args.b, args.out, step=args.step, layer=args.layer,
                      heads=heads, n_queries=args.queries, formats=formats,
                      device=args.device, html_inline=args.html_inline, causal=args.causal)
    print(md)
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("report", help="export PR figures (png/svg/html) and markdown tables")
    p.add_argument("store", help="capture store (zarr directory)")
    p.add_argument("--a", default="fp8_sol_unsmoothed", help="recipe A (baseline)")
    p.add_argument("--b", default="fp8_sol_kv_corrected", help="recipe B (candidate)")
    p.add_argument("--out", required=True, help="output folder (report.md, figures/)")
    p.add_argument("--step", type=int, default=None, help="entry step (default: the last)")
    p.add_argument("--layer", type=int, default=None, help="entry layer (default: the last)")
    p.add_argument("--heads", default=None, help="query heads, e.g. 0-3 (default: first 4)")
    p.add_argument("--queries", type=positive_int, default=64, help="evenly spaced query rows")
    p.add_argument("--formats", default="png,svg,html", help="comma list of png, svg, html")
    p.add_argument("--html-inline", action="store_true",
                   help="self-contained HTML pages (plotly.js in each, ~4.8 MB) instead of pages "
                        "sharing one plotly.js file next to them")
    p.add_argument("--causal", action=argparse.BooleanOptionalAction, default=None,
                   help="mask keys after each row (default: as the store records)")
    p.add_argument("--device", default="cpu", help="torch device (default cpu)")
    p.set_defaults(func=cmd_report)

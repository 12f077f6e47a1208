"""`make demo`: the main job on the embedded default, headless, written under reports/demo/.

Steps (each writes its own files; a step whose stage is not installed is reported and skipped):
1. the seed's accuracy table on the synthetic H3 input (full live shape, heads 0-3, 64 rows).
2. the PR report for the shipped capture (``workbench report captures/<store> --a
   fp8_sol_unsmoothed --b fp8_sol_kv_corrected --out <out>/report``): PNG + SVG (kaleido with the
   system Chromium; HTML only when Chromium is absent), HTML pages sharing one plotly.js beside
   them, markdown.
3. the seed's end-to-end experiment on the embedded model: ``workbench compare --recipes
   bf16,fp8_sol_unsmoothed,fp8_sol_kv_corrected --model h3-nano --out <out>/compare`` (clips,
   side-by-side mp4, metrics table in the seed PR's layout).

Run again into the same folder (a second `make demo`), it replaces its own earlier results,
recognised by their content; a user's file under a name it writes is refused, naming it, unless
``overwrite`` (``workbench demo --overwrite``).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

from workbench.cli_args import writing_mark


def _earlier_demo_parts(quick: bool) -> dict:
    """{name under --out: predicate that recognises the demo's own earlier result there}."""
    from workbench.cli_args import COMPARE_RECIPES_MARKER, interrupted_here, json_has_keys
    from workbench.report.accuracy_table import is_table_json, is_table_markdown
    from workbench.report.export import REPORT_MARKER

    parts = {
        "accuracy_table.md": is_table_markdown,
        "accuracy_table.json": is_table_json,
        # a folder the demo was interrupted writing is its own too (its mark, with every file
        # there written after it: interrupted_here)
        "report": lambda p: (json_has_keys(p / REPORT_MARKER[0], REPORT_MARKER[1])
                             or interrupted_here(p, ("demo",))),
    }
    if not quick:
        name, keys = COMPARE_RECIPES_MARKER
        parts["compare"] = lambda p: (json_has_keys(p / name, keys)
                                      or interrupted_here(p, ("demo",)))
    return parts


def check_demo_out(out: Path, *, quick: bool = False, overwrite: bool = False) -> None:
    """Refuse an --out where a name the demo writes holds something the demo did not write, and
    (--overwrite too) one whose report / compare folder is a zarr store or lies inside one."""
    from workbench.capture.storefs import check_outside_stores

    for name in ("report", "compare"):
        check_outside_stores(out / name, "--out")
    if overwrite or not out.is_dir():
        return
    for name, is_own in _earlier_demo_parts(quick).items():
        p = out / name
        # a folder in a file's place (or a file in a folder's) is left alone: the write fails,
        # naming it, and replaces nothing; an empty file or folder holds nothing to lose
        if name.endswith((".md", ".json")):
            held = p.is_file() and p.stat().st_size > 0
        else:
            held = p.is_dir() and any(p.iterdir())
        if held and not is_own(p):
            raise ValueError(f"--out {out}: {p} was not written by an earlier `workbench demo`; "
                             "choose a new folder or pass --overwrite to replace it")


def run_demo(out: Path, quick: bool = False, overwrite: bool = False) -> int:
    from workbench.report.accuracy_table import accuracy_table, write_table
    from workbench.synthetic import H3_SYNTHETIC, small_config, synthetic_qkv

    check_demo_out(out, quick=quick, overwrite=overwrite)
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    cfg = small_config(seq_len=2048, heads=4) if quick else H3_SYNTHETIC
    heads = [0, 1, 2, 3]
    q, k, v = synthetic_qkv(cfg, heads=heads)
    table = accuracy_table(
        q, k, v, "fp8_sol_unsmoothed", "fp8_sol_kv_corrected", layout=cfg.layout,
        head_labels=heads, rotated=cfg.rotated,
        source=f"synthetic H3-like input (seed {cfg.seed}, {cfg.seq_len:,} rows; "
               "not H3 activations)",
    )
    write_table(table, out / "accuracy_table.md", out / "accuracy_table.json")
    print(table.to_markdown())
    print(f"[demo] accuracy table -> {out / 'accuracy_table.md'} "
          f"({time.perf_counter() - t0:.1f} s)", file=sys.stderr)
    rc = demo_report(out / "report")
    if quick:
        return rc
    return rc or demo_compare(out / "compare")


def demo_compare(out: Path) -> int:
    """Step 3: generate one clip per recipe with h3-nano and compare them against BF16."""
    from workbench.generate.cli import DEFAULT_PROMPT
    from workbench.generate.compare import compare_recipes
    from workbench.models import load_model

    t0 = time.perf_counter()
    recipes = ["bf16", "fp8_sol_unsmoothed", "fp8_sol_kv_corrected"]
    h3 = load_model("h3-nano")
    with writing_mark(out, "demo"):
        _, table = compare_recipes(h3, recipes, prompt=DEFAULT_PROMPT, seed=0, out=out,
                                   progress=False)
    print(f"model {h3.name}, prompt {DEFAULT_PROMPT!r}, seed 0, steps {h3.config.default_steps}, "
          f"device cpu; against {recipes[0]}:\n")
    print(table)
    print(f"[demo] end-to-end compare -> {out} ({time.perf_counter() - t0:.1f} s)",
          file=sys.stderr)
    return 0


def demo_report(out: Path) -> int:
    """Step 2: the PR figures and tables for the shipped capture store."""
    try:
        from workbench.report.export import browser_path, write_report
        from workbench.evaluate import find_store
    except ImportError as exc:  # the viz extra is not installed: say so, keep step 1's output
        print(f"[demo] report skipped: {exc}", file=sys.stderr)
        return 0
    try:
        store = find_store()
    except FileNotFoundError as exc:
        print(f"[demo] report skipped: {exc}", file=sys.stderr)
        return 0
    formats = ("png", "svg", "html")
    if browser_path() is None:
        print("[demo] /usr/bin/chromium missing (and no BROWSER_PATH): the report's figures are "
              "HTML only, no PNG/SVG; kaleido needs Chromium for those: run `bash "
              "scripts/ensure_chromium.sh` as root (Debian's chromium package)", file=sys.stderr)
        formats = ("html",)
    with writing_mark(out, "demo"):
        md = write_report(store, "fp8_sol_unsmoothed", "fp8_sol_kv_corrected", out,
                          formats=formats, log=lambda m: print("[demo] " + m, file=sys.stderr))
    print(f"[demo] report -> {md}", file=sys.stderr)
    return 0

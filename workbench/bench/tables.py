"""Markdown and short text tables of a bench report (pure functions: report dict in, text out).

A report is what ``cli.run`` returns and ``workbench bench --json`` writes:
``{"env": {...}, "ceilings": {...}, "skipped": {peer: reason}, "rows": [row, ...]}`` with rows as
``attention.side_by_side`` makes them (shape, S, variant, mode, precision, ms, tflops, peak_gib,
rel_l2, cosine, and emu_rel_l2 / read_tbs / note where they apply).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

TIMED = ("full", "kernel")

ACCURACY_NOTE = (
    "rel-L2 = ||out - ref|| / ||ref|| on {rows} evenly spaced query rows against float64 "
    "attention of the same bf16 inputs over the full context; 'torch emu' = the same recipe in "
    "the project's torch emulation (a kernel passes at <= 1.25x it), for the FP8 peers their "
    "numerics as a recipe (bench.peers.PEER_EMULATIONS). BF16 peers sit at the BF16 "
    "output-rounding floor (~1.7e-3). The FP8 peers with per-tensor or per-head scales "
    "(cudnn_fp8, fa3_fp8) lose accuracy as S grows: Hopper's FP8 tensor-core accumulator cuts "
    "every product toward zero to 13 bits below the running sum's leading bit (docs/numerics.md), "
    "and these kernels add each P @ V product into it over the whole key range instead of "
    "flushing it to an FP32 buffer every tile (the fix FlashAttention calls two-level "
    "accumulation), so the output shrinks as the number of keys summed grows (the project's "
    "emulation of those numerics, accumulation=reduced without a flush, gives the same errors). "
    "SageAttention2 "
    "(fp32+fp32: flushed to FP32, K smoothed) and ours (every FP8 chain flushed to FP32 after "
    "<= 128 terms, K/V smoothing) stay near the BF16 floor."
)
BOARD_NOTE = (
    "SM MHz / board W: medians of nvidia-smi samples (every 100 ms) over a few seconds of the "
    "row's calls run back to back after its timing (--board-s); a row near the board's power "
    "limit (700 W on an H200) runs below the maximum SM clock, so its time is set by the energy "
    "it spends as much as by its instruction schedule."
)


def _precision(row: dict) -> str:
    if "precision" in row:
        return row["precision"]
    return "bf16" if row["variant"].startswith(("sdpa", "fa3_bf16")) else "fp8"


def shapes(report: dict) -> list[str]:
    out = []
    for r in report["rows"]:
        if r["shape"] not in out:
            out.append(r["shape"])
    return out


def fastest_bf16(rows: list[dict]) -> dict | None:
    """The fastest BF16 peer's "full" row among `rows` (one shape), or None."""
    bf16 = [r for r in rows if _precision(r) == "bf16" and r["mode"] == "full"]
    return min(bf16, key=lambda r: r["ms"]) if bf16 else None


def _fmt(x, spec: str) -> str:
    return format(x, spec) if isinstance(x, (int, float)) and x == x else ""


BOARD_HEADER = " SM MHz / board W |"  # the column of the rows' clock / power samples
BOARD_S_MAX = 60.0


def board_cell(row: dict) -> str:
    """The row's " MHz / W |" cell (empty halves where it has no samples)."""
    return f" {_fmt(row.get('sm_mhz'), '.0f')} / {_fmt(row.get('power_w'), '.0f')} |"


def board_text(row: dict) -> str:
    """"  1800 MHz 690 W" for a log or text line, "" where the row has no samples."""
    return f"  {row['sm_mhz']:.0f} MHz {row['power_w']:.0f} W" if "sm_mhz" in row else ""


def add_board_argument(p, default: float) -> None:
    """--board-s of the benches that sample the board (``harness.board_under_load``)."""
    p.add_argument("--board-s", type=float, default=default,
                   help="seconds of back-to-back calls per row while SM clock and board power "
                        "are sampled (nvidia-smi; 0: not sampled)")


def check_board_s(board_s: float) -> None:
    if not 0 <= board_s <= BOARD_S_MAX:
        raise ValueError(f"--board-s: {board_s} (seconds per row, 0 to {BOARD_S_MAX:g})")


def markdown(report: dict, *, rows: int = 64) -> str:
    """One table per shape: time, TFLOP/s, ratio vs the run's fastest BF16 peer, peak memory,
    accuracy; under each table which peer the ratio is against and what the accuracy means."""
    env = report.get("env") or {}
    lines = [f"Device {env.get('device')}, torch {env.get('torch')}, triton {env.get('triton')}, "
             f"CUDA {env.get('cuda')}, cuDNN {env.get('cudnn')}, cudnn-frontend "
             f"{env.get('cudnn_frontend', 'absent')}, {env.get('date')}"
             + (f", commit {env['commit']}" if env.get("commit") else "") + "."]
    c = report.get("ceilings") or {}
    if c:
        lines.append("Ceilings (same run): " + ", ".join(f"{k} {v:.1f}" for k, v in c.items()))
    for name, why in (report.get("skipped") or {}).items():
        lines.append(f"Skipped {name}: {why}")
    for shape in shapes(report):
        rs = [r for r in report["rows"] if r["shape"] == shape]
        base = fastest_bf16(rs)
        bname = base["variant"] if base else "none"
        board = any("sm_mhz" in r for r in rs)  # older reports have no clock / power samples
        lines += ["", f"Shape {shape}, bf16 inputs with per-channel K/V bias, non-causal:", "",
                  f"| variant | mode | ms | TFLOP/s | x {bname} | peak extra GiB | rel-L2 vs f64 "
                  "| torch emu rel-L2 |" + (BOARD_HEADER if board else "") + " note |",
                  "|---|---|---|---|---|---|---|---|" + ("---|" if board else "") + "---|"]
        for r in (r for r in rs if r["mode"] in TIMED):
            ratio = f"{base['ms'] / r['ms']:.2f}" if base else ""
            clock = board_cell(r) if board else ""
            lines.append(
                f"| {r['variant']} | {r['mode']} | {r['ms']:.3f} | {_fmt(r['tflops'], '.0f')} | "
                f"{ratio} | {r['peak_gib']:.2f} | {_fmt(r['rel_l2'], '.3e')} | "
                f"{_fmt(r.get('emu_rel_l2'), '.3e')} |{clock} {r.get('note', '')} |")
        parts = [f"{r['variant']} {r['mode']} {r['ms']:.3f} ms"
                 + (f" ({r['read_tbs']:.2f} TB/s read)" if "read_tbs" in r else "")
                 for r in rs if r["mode"] not in TIMED]
        ref = (f"x = time of {bname} ({base['ms']:.2f} ms, the fastest BF16 peer in this run) / "
               "time of the row." if base else "No BF16 peer ran: no ratio.")
        lines += ["", ref + " " + ACCURACY_NOTE.format(rows=rows)
                  + (" " + BOARD_NOTE if board else "")]
        if parts:
            lines += ["", "Passes of the full call (prep = statistics + quantization): "
                      + "; ".join(parts) + "."]
    return "\n".join(lines) + "\n"


def summary(report: dict) -> str:
    """A short text table: per shape, each full / kernel row's ms, ratio and rel-L2 (and its SM
    clock and board power where sampled)."""
    out = []
    for shape in shapes(report):
        rs = [r for r in report["rows"] if r["shape"] == shape]
        base = fastest_bf16(rs)
        bname = base["variant"] if base else "-"
        out.append(f"{shape}  (x = vs {bname})")
        for r in rs:
            if r["mode"] in TIMED:
                ratio = f"x{base['ms'] / r['ms']:.3f}" if base else ""
                out.append(f"  {r['variant'][:44]:44s} {r['mode']:6s} {r['ms']:9.3f} ms "
                           f"{ratio:>7s} relL2 {_fmt(r['rel_l2'], '.3e')}{board_text(r)}")
    return "\n".join(out)


def sweep_markdown(rows: list[dict]) -> str:
    """Table of ``sweep.sweep`` rows: one line per (config, part)."""
    lines = ["| config | part | ms (each repeat) | rate | rel-L2 vs f64 | same values as first |",
             "|---|---|---|---|---|---|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['label']} | {r['part']} | failed: {r['error'][:80]} | | | |")
            continue
        ms = " / ".join(f"{x:.3f}" for x in r["ms_runs"])
        rate = (f"{r['tflops']:.0f} TFLOP/s" if "tflops" in r
                else f"{r['tbs']:.2f} TB/s" if "tbs" in r else "")
        same = r.get("same_values", "")
        if "equal_frac" in r:  # attention: bitwise-equal fraction, largest difference
            same = f"{r['equal_frac']:.4f} equal, max diff {r['max_diff']:.2e}"
        lines.append(f"| {r['label']} | {r['part']} | {ms} | {rate} | "
                     f"{_fmt(r.get('rel_l2'), '.4e')} | {same} |")
    return "\n".join(lines) + "\n"


# A bench's own files carry a mark, so that a re-run replaces its earlier output and nothing
# else: the JSON a "workbench_bench" key, the markdown a last line with the SHA-256 of the lines
# above it (an HTML comment: invisible where the table is rendered). A user's file, or a table
# with notes added or edited, lacks the mark or fails its digest and is refused.
BENCH_JSON_KEY = "workbench_bench"
_MD_MARK = re.compile(r"^<!-- workbench bench table sha256:([0-9a-f]{16}) -->$")


def _md_digest(body: str) -> str:
    return hashlib.sha256(body.encode("utf-8")).hexdigest()[:16]


def marked_markdown(md: str) -> str:
    """The table text as a bench writes it to --markdown: md, then its mark line."""
    body = md if md.endswith("\n") else md + "\n"
    return body + f"<!-- workbench bench table sha256:{_md_digest(body)} -->\n"


def _is_bench_json(path) -> bool:
    """An earlier bench report: a JSON object a bench wrote (its mark key and its rows)."""
    from workbench.cli_args import json_has_keys

    return json_has_keys(path, (BENCH_JSON_KEY, "rows"))


def _is_bench_markdown(path) -> bool:
    """An earlier bench table, unchanged: its last line is the mark of the text above it."""
    try:
        p = Path(path)
        if p.stat().st_size > 16 * 2**20:
            return False
        text = p.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return False
    body, _, last = text.rstrip("\n").rpartition("\n")
    m = _MD_MARK.match(last)
    return bool(m) and _md_digest(body + "\n") == m.group(1)


def write_bench_files(report: dict, md: str, json_path, md_path, *, kind: str,
                      markdown_appends: bool = False) -> None:
    """Write --json (the report with its mark key) and --markdown (the marked table; appended
    to the file when ``markdown_appends``), making missing parent folders."""
    if json_path:
        Path(json_path).parent.mkdir(parents=True, exist_ok=True)
        with open(json_path, "w") as f:
            json.dump({BENCH_JSON_KEY: kind, **report}, f, indent=1, default=str)
    if md_path:
        Path(md_path).parent.mkdir(parents=True, exist_ok=True)
        if markdown_appends:
            with open(md_path, "a") as f:
                f.write("\n" + md)
        else:
            Path(md_path).write_text(marked_markdown(md), encoding="utf-8")


def check_report_files(args, *, markdown_appends: bool = False) -> None:
    """Refuse --json / --markdown paths before any GPU work: never inside a zarr store; an
    existing --json replaced only when it is an earlier bench report, an existing --markdown
    replaced only when it is an earlier bench table (appended to when ``markdown_appends``:
    then any markdown file, e.g. BENCHMARKS.md, but no other kind of file)."""
    from workbench.capture.storefs import check_not_inside_store
    from workbench.cli_args import check_out_file

    if getattr(args, "json", None):
        check_not_inside_store(args.json, "--json")
        check_out_file(args.json, "--json", own=_is_bench_json, kind="bench report")
    md = getattr(args, "markdown", None)
    if md:
        check_not_inside_store(md, "--markdown")
        if markdown_appends:
            if os.path.isfile(md) and os.path.getsize(md) and not str(md).endswith(".md"):
                raise ValueError(f"--markdown {md}: exists and is not a markdown (.md) file; "
                                 "the tables are appended to one: choose another path")
            check_out_file(md, "--markdown", own=lambda p: True, kind="markdown file")
        else:
            check_out_file(md, "--markdown", own=_is_bench_markdown, kind="bench table")
    js = getattr(args, "json", None)
    if js and md and Path(js).resolve() == Path(md).resolve():
        raise ValueError(f"--markdown {md}: the same file as --json; give two paths")

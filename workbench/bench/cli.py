"""``workbench bench``: side-by-side attention timings on the GPU, JSON + a markdown table.

    workbench bench --shapes 1,32626,56,128 1,8192,56,128 --json out.json --markdown out.md
    workbench bench sparse --json sparse.json --markdown sparse.md   # Sol / VSA (bench.sparse)
    workbench bench dit --blocks 4                                    # H3 DiT step (bench.dit)

Peers (``--peers``, each skipped with its reason when it does not run here): SDPA cuDNN,
FlashAttention-3 BF16 / FP8, cuDNN FP8, SageAttention2 SM90; then the FP8 recipes (``--recipes``,
any ``preset:field=value`` form, e.g. ``fp8_dense_kv_corrected:p_scaling=exp2_offset8``).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
from pathlib import Path

from .peers import ALL_PEERS, DEFAULT_PEERS
from .tables import (
    add_board_argument,
    check_board_s,
    check_report_files,
    markdown,
    write_bench_files,
)

DEFAULT_SHAPES = ["1,32626,56,128", "1,8192,56,128", "1,16384,56,128", "1,65536,56,128"]
__all__ = ["DEFAULT_SHAPES", "main", "markdown", "parse_shape", "register", "run"]


def register(subparsers) -> None:
    from . import dit, sparse

    p = subparsers.add_parser(
        "bench", help="time FP8 attention kernels against peers (GPU)",
        description="Dense FP8 recipes against their peers (the options below); "
                    "`workbench bench sparse` for block-sparse Sol / VSA at the H3 shape, "
                    "`workbench bench dit` for the full-width H3 DiT step.")
    add_arguments(p)
    # The dense bench's options are stored apart (TOP + dest, absent unless given): the
    # subcommands have options of the same names (--json, --rows, ...), and argparse would
    # silently let the subcommand's defaults replace values given before `sparse` / `dit`.
    defaults = {}
    for a in p._actions:
        if a.option_strings and a.dest != "help":
            defaults[a.dest] = a.default
            if a.nargs != 0 and a.metavar is None:  # the help keeps the option's own name
                a.metavar = a.dest.upper()
            a.dest, a.default = TOP + a.dest, argparse.SUPPRESS
    p.set_defaults(func=main, bench_defaults=defaults)
    kinds = p.add_subparsers(dest="bench_kind", metavar="{sparse,dit}")
    sp = kinds.add_parser("sparse", help="block-sparse Sol / VSA against dense FP8, SDPA cuDNN "
                                         "and NVIDIA's sol_attn at the H3 shape (GPU)")
    sparse.add_arguments(sp)
    sp.set_defaults(func=_subcommand(sparse.run_args, "sparse"))
    dt = kinds.add_parser("dit", help="the full-width H3 DiT step per attention variant (GPU)")
    dit.add_arguments(dt)
    dt.set_defaults(func=_subcommand(dit.run_args, "dit"))


TOP = "bench_top_"


def _given_top(args) -> list[str]:
    return [k[len(TOP):] for k in vars(args) if k.startswith(TOP)]


def _subcommand(run_fn, kind: str):
    """A subcommand's runner: refuses options of `workbench bench` given before its name."""
    def run_sub(args) -> int:
        given = _given_top(args)
        if given:
            flags = ", ".join("--" + g.replace("_", "-") for g in given)
            raise ValueError(f"{flags}: given before '{kind}', where they are `workbench bench`'s "
                             f"own options; put them after '{kind}' (see `workbench bench {kind} "
                             "--help`)")
        return run_fn(args)
    run_sub.runs = run_fn  # what it runs (tests, introspection)
    return run_sub


def _top_args(args) -> argparse.Namespace:
    """`workbench bench`'s own options (defaults where not given) as plain names."""
    defaults = getattr(args, "bench_defaults", None)
    if defaults is None:  # a parser made by add_arguments alone (scripts/gpu_bench.py)
        return args
    vals = {**defaults, **{g: getattr(args, TOP + g) for g in _given_top(args)}}
    rest = {k: v for k, v in vars(args).items() if not k.startswith(TOP) and k not in vals}
    return argparse.Namespace(**rest, **vals)


def add_arguments(p) -> None:
    """The options of ``workbench bench`` (shared with scripts/gpu_bench.py)."""
    p.add_argument("--shapes", nargs="+", default=DEFAULT_SHAPES, help="B,S,H,D per shape")
    p.add_argument("--recipes", nargs="+", default=None, help="recipes to time (default 3 FP8)")
    p.add_argument("--peers", nargs="*", default=list(DEFAULT_PEERS),
                   help=f"peers to run, of {', '.join(ALL_PEERS)} (none: only ours)")
    p.add_argument("--rows", type=int, default=64, help="query rows for accuracy vs float64")
    p.add_argument("--sets", type=int, default=2, help="rotating input sets")
    p.add_argument("--rep-ms", type=int, default=500, help="do_bench repetition budget per row")
    p.add_argument("--no-emulate", action="store_true", help="skip the torch-emulation accuracy")
    p.add_argument("--no-ceilings", action="store_true", help="skip copy/matmul ceilings")
    add_board_argument(p, 2.0)
    p.add_argument("--json", default=None, help="write all rows and the environment here")
    p.add_argument("--markdown", default=None, help="append the markdown tables to this file")


def parse_shape(text: str) -> tuple[int, int, int, int]:
    try:
        parts = [int(x) for x in text.replace("x", ",").split(",")]
    except ValueError:
        parts = []
    if len(parts) != 4 or min(parts) < 1:
        hint = (f" ('{text}' is a subcommand: its options go after it, `workbench bench {text} "
                "...`)" if text in ("sparse", "dit") else "")
        raise ValueError(f"--shapes: expected B,S,H,D (positive integers), got {text!r}{hint}")
    return tuple(parts)  # type: ignore[return-value]


def check_args(args) -> None:
    """Refuse bad options before any GPU work (ValueError naming the option)."""
    import torch

    from workbench.kernels.dispatch import unsupported_reason
    from workbench.recipes import get_recipe

    shapes = [parse_shape(s) for s in args.shapes]
    for r in args.recipes or []:
        try:
            rec = get_recipe(r)
        except ValueError as e:
            raise ValueError(f"--recipes: {e}") from None
        if rec.sparsity != "dense":
            raise ValueError(f"--recipes: {r!r} is a {rec.sparsity} recipe; this bench times the "
                             "dense kernel (sparse recipes: `workbench bench sparse`)")
        for B, S, H, D in shapes:
            # what the kernels would refuse after the peers ran: said now (bf16 operands)
            probe = torch.empty((1, 1, H, D), dtype=torch.bfloat16)
            why = unsupported_reason(probe, probe, probe, rec)
            if why:
                raise ValueError(f"--recipes: the FP8 kernels do not run {r!r} at head dim {D}: "
                                 f"{why}")
    bad = [p for p in args.peers if p not in ALL_PEERS]
    if bad:
        raise ValueError(f"--peers: unknown {bad}; choose from {list(ALL_PEERS)}")
    for name in ("rows", "sets", "rep_ms"):
        if getattr(args, name) < 1:
            raise ValueError(f"--{name.replace('_', '-')}: must be >= 1")
    check_board_s(getattr(args, "board_s", 0.0))
    check_report_files(args, markdown_appends=True)


def git_commit() -> str | None:
    """The measured commit: $WORKBENCH_COMMIT when set (a copy of the tree whose git metadata
    is not the measured commit's), else git's HEAD."""
    if os.environ.get("WORKBENCH_COMMIT"):
        return os.environ["WORKBENCH_COMMIT"]
    try:
        root = Path(__file__).resolve().parents[2]
        p = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=root,
                           capture_output=True, text=True, timeout=10)
        return p.stdout.strip() or None
    except Exception:  # noqa: BLE001 - no git here: the report just has no commit
        return None


def run(shapes, *, recipes=None, peers=DEFAULT_PEERS, rows=64, sets=2, rep_ms=500,
        emulate=True, ceilings=True, board_s=2.0, log=print) -> dict:
    import torch

    from .attention import RECIPES, side_by_side
    from .harness import copy_bandwidth_tbs, env_info, matmul_tflops

    if not torch.cuda.is_available():
        raise ValueError("bench needs a CUDA GPU")
    report = {"env": {**env_info(), "commit": git_commit()}, "ceilings": {}, "skipped": {},
              "rows": []}
    log(json.dumps(report["env"]))
    if ceilings:
        c = report["ceilings"]
        c["copy_tbs"] = copy_bandwidth_tbs()
        c["bf16_mm_tflops"] = matmul_tflops("bf16")
        try:
            c["fp8_mm_tflops"] = matmul_tflops("fp8")
        except Exception as exc:  # noqa: BLE001
            log(f"fp8 matmul ceiling skipped: {exc}")
        log("ceilings: " + ", ".join(f"{k}={v:.1f}" for k, v in c.items()))
    for shape in shapes:
        B, S, H, D = parse_shape(shape) if isinstance(shape, str) else shape
        log(f"shape ({B}, {S}, {H}, {D})")
        report["rows"] += side_by_side(B, S, H, D, n_sets=sets, recipes=recipes or RECIPES,
                                       peers=peers, rows=rows, emulate=emulate, rep_ms=rep_ms,
                                       skipped=report["skipped"], board_s=board_s, log=log)
        torch.cuda.empty_cache()
    return report


def main(args) -> int:
    args = _top_args(args)
    check_args(args)
    report = run(args.shapes, recipes=args.recipes, peers=args.peers, rows=args.rows,
                 sets=args.sets, rep_ms=args.rep_ms, emulate=not args.no_emulate,
                 ceilings=not args.no_ceilings, board_s=args.board_s)
    md = markdown(report, rows=args.rows)
    print(md)
    write_bench_files(report, md, args.json, args.markdown, kind="dense", markdown_appends=True)
    return 0

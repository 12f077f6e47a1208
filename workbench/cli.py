"""The ``workbench`` command. Each subcommand lives next to its stage and registers itself here.

A subcommand module defines ``register(subparsers)`` that adds one parser (with a one-line
``help``) and sets ``func`` to a callable taking the parsed args and returning an exit code.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys

# One module per subcommand group, in the order `workbench --help` lists them.
SUBCOMMAND_MODULES = [
    "workbench.recipes.cli",  # recipes
    "workbench.report.cli",  # table, report, scan-report, demo
    "workbench.capture.cli",  # capture, import, inspect, archive
    "workbench.bench.cli",  # bench (GPU side-by-side timings)
    "workbench.generate.cli",  # generate, compare
    "workbench.evaluate.cli",  # scan, plan
]

# Commands that compute on the CPU take --threads. One torch thread is the default: on 2 cores,
# `workbench demo` took 37 s with 1 thread against 75 s with 2 on a lightly loaded machine, and
# 126 s against 443 s with another CPU-bound process per core (BENCHMARKS.md, CPU threads).
THREADED_COMMANDS = ("table", "demo", "report", "capture", "import", "inspect", "generate",
                     "compare")
DEFAULT_THREADS = 1


def _thread_count(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = -1
    if n < 0:
        raise argparse.ArgumentTypeError(f"expected a number of threads (0: torch's own "
                                         f"default), got {text!r}")
    return n


THREADS_HELP = (f"torch CPU threads (default: $OMP_NUM_THREADS, else {DEFAULT_THREADS}; 0: "
                "torch's own default)")


def threads_to_use(requested: int | None) -> int:
    """--threads if given (0: leave torch's default), else OMP_NUM_THREADS if it is a positive
    integer (torch already follows it), else DEFAULT_THREADS."""
    if requested is not None:
        return requested
    env = os.environ.get("OMP_NUM_THREADS", "").strip()
    return int(env) if env.isdigit() and int(env) > 0 else DEFAULT_THREADS


class OneLineParser(argparse.ArgumentParser):
    """argparse with its usage errors on one line, in the same form as every other bad input."""

    def error(self, message: str):
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def os_error_line(exc: OSError) -> str:
    """'PATH: Permission denied' (the path first, as every other error names its input)."""
    names = [n for n in (exc.filename, getattr(exc, "filename2", None)) if n is not None]
    what = exc.strerror or str(exc)
    return f"{' -> '.join(str(n) for n in names)}: {what}" if names else what


def build_parser() -> argparse.ArgumentParser:
    parser = OneLineParser(
        prog="workbench",
        description="Attention research workbench: FP8 and sparse attention on MiniMax-H3.",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for mod in SUBCOMMAND_MODULES:
        importlib.import_module(mod).register(sub)
    for name in THREADED_COMMANDS:
        p = sub.choices.get(name)
        if p is None:
            continue
        if "--threads" in p._option_string_actions:  # a command that declares it itself
            p.set_defaults(threads=None)
            p._option_string_actions["--threads"].help = THREADS_HELP
        else:
            p.add_argument("--threads", type=_thread_count, default=None, help=THREADS_HELP)
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    n_threads = threads_to_use(getattr(args, "threads", None))
    if args.command in THREADED_COMMANDS and n_threads > 0:
        import torch

        torch.set_num_threads(n_threads)
    # the command as typed: "bench sparse" where a subcommand ran
    cmd = " ".join(x for x in (args.command, getattr(args, "bench_kind", None)) if x)
    try:
        return int(args.func(args) or 0)
    except (ValueError, KeyError) as exc:
        # Bad input: one clear line naming the problem, no traceback.
        msg = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        print(f"workbench {cmd}: error: {msg}", file=sys.stderr)
        return 2
    except OSError as exc:
        # A path that cannot be read or written (missing, read-only, a file where a folder
        # should be, disk full): name it.
        print(f"workbench {cmd}: error: {os_error_line(exc)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())

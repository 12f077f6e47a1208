"""The ``workbench`` command. Each subcommand lives next to its stage and registers itself here.

A subcommand module defines ``register(subparsers)`` that adds one parser (with a one-line
``help``) and sets ``func`` to a callable taking the parsed args and returning an exit code.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# One module per subcommand group, in the order `workbench --help` lists them.
SUBCOMMAND_MODULES = [
    "workbench.recipes.cli",  # recipes
    "workbench.report.cli",  # table, report, scan-report, demo
    "workbench.capture.cli",  # capture, inspect, archive
    "workbench.bench.cli",  # bench (GPU side-by-side timings)
    "workbench.generate.cli",  # generate, compare
    "workbench.evaluate.cli",  # scan, plan
]


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
    return parser


def main(argv: list[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return 0
    try:
        return int(args.func(args) or 0)
    except (ValueError, KeyError) as exc:
        # Bad input: one clear line naming the problem, no traceback.
        msg = exc.args[0] if isinstance(exc, KeyError) and exc.args else exc
        print(f"workbench {args.command}: error: {msg}", file=sys.stderr)
        return 2
    except OSError as exc:
        # A path that cannot be read or written (missing, read-only, a file where a folder
        # should be, disk full): name it.
        print(f"workbench {args.command}: error: {os_error_line(exc)}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    raise SystemExit(main())

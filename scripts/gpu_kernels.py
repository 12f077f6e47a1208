"""Sweep named kernel configs on the GPU (argument parsing over ``workbench.bench.sweep``).

    python scripts/gpu_kernels.py --configs '[["128 rows, 8 warps",
        {"attention": {"block_m": 128, "num_warps": 8}}]]' --parts attention --json $OUT/sweep.json

Each config is a label and overrides of ``KernelConfig.h200()`` by section (attention, quant,
stats); the default config is always timed first, in the same run. Prints the markdown table
(config, part, ms of each repeat, rate, rel-L2 vs float64, same values as the first config).
The side-by-side benchmark with peers is ``scripts/gpu_bench.py`` / ``workbench bench``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from workbench.bench.cli import parse_shape  # noqa: E402
from workbench.bench.sweep import PARTS, parse_points, sweep  # noqa: E402
from workbench.bench.tables import sweep_markdown  # noqa: E402


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--configs", default="[]",
                   help="JSON [[label, {section: {field: value}}], ...] (or @file.json)")
    p.add_argument("--shape", default="1,32626,56,128", help="B,S,H,D")
    p.add_argument("--recipe", default="fp8_dense_kv_corrected")
    p.add_argument("--parts", nargs="+", default=list(PARTS), choices=PARTS)
    p.add_argument("--rep-ms", type=int, default=250)
    p.add_argument("--repeats", type=int, default=2, help="do_bench medians per config")
    p.add_argument("--json", default=None, help="write the rows here")
    args = p.parse_args(argv)
    text = args.configs
    if text.startswith("@"):
        with open(text[1:]) as f:
            text = f.read()
    try:
        args.points = parse_points(text)
        args.shape = parse_shape(args.shape)
    except ValueError as exc:
        p.error(str(exc))
    return args


def main(argv=None) -> int:
    args = parse_args(argv)
    t0 = time.time()

    def log(*a):
        print(f"[{time.time() - t0:6.1f}s]", *a, flush=True)

    rows = sweep(args.points, shape=args.shape, recipe=args.recipe, parts=args.parts,
                 rep_ms=args.rep_ms, repeats=args.repeats, log=log)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"shape": args.shape, "recipe": args.recipe, "rows": rows}, f, indent=1)
    print(sweep_markdown(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())

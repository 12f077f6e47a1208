"""Widget recompute time: how long one control change takes in the smoothing explorer.

Measures ``SmoothingExplorer`` (no browser: the Python side, which is where the time goes) on a
store: every control change recomputes recipes A and B on the reference path, the float64
reference (cached per entry and row set), the per-head grid over all layers, and updates the
FigureWidgets in place. Prints the median and spread over repeated smoothing toggles.

    python scripts/bench_widget.py                      # shipped store, 64 query rows, CPU
    python scripts/bench_widget.py --queries 256 --repeats 10
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time

import torch


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--store", default=None, help="capture store (default: the shipped one)")
    p.add_argument("--queries", type=int, default=64, help="query sample size (default 64)")
    p.add_argument("--repeats", type=int, default=6, help="smoothing toggles to time")
    p.add_argument("--device", default=None, help="cpu | cuda (default: cuda if present)")
    p.add_argument("--json", default=None, help="write the timings here")
    args = p.parse_args()

    from workbench.viz.widgets import SmoothingExplorer

    t0 = time.perf_counter()
    ex = SmoothingExplorer(args.store, n_queries=args.queries, device=args.device)
    first = time.perf_counter() - t0
    times = {"toggle_smoothing": [], "step_change": [], "tau_change": []}
    states = ["none", "k", "kv"]
    for i in range(args.repeats):
        ex.w_smooth.value = states[i % 3]
        times["toggle_smoothing"].append(ex.last_seconds)
    for s in ex.source.steps[1:args.repeats + 1]:  # a new entry: new reference, new q/k/v read
        ex.w_step.value = s
        times["step_change"].append(ex.last_seconds)
    for tau in (0.5, 1.5, 1.0):
        ex.w_tau.value = tau
        times["tau_change"].append(ex.last_seconds)
    src = ex.source
    res = {
        "store": str(src.path), "seq_len": src.layout.total, "heads": src.heads,
        "layers": src.layers, "queries": args.queries, "device": src.device,
        "threads": torch.get_num_threads(), "python": platform.python_version(),
        "torch": torch.__version__, "first_render_s": first,
        "median_s": {k: statistics.median(v) for k, v in times.items() if v},
        "max_s": {k: max(v) for k, v in times.items() if v},
    }
    print(json.dumps(res, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({**res, "all_s": times}, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

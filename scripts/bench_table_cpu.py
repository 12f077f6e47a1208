"""CPU cost of `workbench table --synthetic h3` at the full synthetic shape.

4 heads x 64 query rows x 32,626 keys, including generating and quantizing those heads' full K and
V (the whole command, interpreter start included). Target: <= 10 s wall on a 2-core machine.

    python scripts/bench_table_cpu.py --repeats 3 [--record]

--record appends the result to BENCHMARKS.md. The load average before each run is printed: other
work on the machine inflates the time, so compare runs made on a quiet machine.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CMD = ["-m", "workbench", "table", "--synthetic", "h3", "--a", "fp8_sol_unsmoothed",
       "--b", "fp8_sol_kv_corrected"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--record", action="store_true", help="append the result to BENCHMARKS.md")
    args = ap.parse_args()
    if args.repeats < 1:
        ap.error(f"--repeats: {args.repeats}; at least one run")
    import torch

    sys.path.insert(0, str(ROOT))
    from workbench.cli import threads_to_use

    threads = threads_to_use(None)  # what the timed command sets (not this script's torch)

    times, loads = [], []
    with tempfile.TemporaryDirectory() as tmp:
        for i in range(args.repeats):
            loads.append(os.getloadavg()[0])
            t0 = time.perf_counter()
            subprocess.run([sys.executable, *CMD, "--json", f"{tmp}/t{i}.json"], cwd=ROOT,
                           check=True, stdout=subprocess.DEVNULL)
            times.append(time.perf_counter() - t0)
            print(f"run {i}: {times[-1]:.2f} s wall (load average before: {loads[-1]:.2f})")
    med = statistics.median(times)
    verdict = "meets" if med <= 10.0 else "misses"
    line = (
        f"| {datetime.date.today()} | {platform.processor() or platform.machine()}, "
        f"{os.cpu_count()} cores | torch {torch.__version__}, threads {threads} "
        f"| {med:.2f} s (runs: {', '.join(f'{t:.2f}' for t in times)}; load avg before "
        f"{', '.join(f'{x:.1f}' for x in loads)}) | {verdict} the 10 s target |"
    )
    print(line)
    if args.record:
        bench = ROOT / "BENCHMARKS.md"
        text = bench.read_text() if bench.exists() else "# Benchmarks\n"
        marker = "<!-- table-cpu rows -->"
        if marker not in text:
            text += (
                "\n## CPU cost of `workbench table --synthetic h3`\n\n"
                "Command: `python scripts/bench_table_cpu.py --repeats 3 --record` (runs "
                f"`python {' '.join(CMD)} --json ...`: 4 heads x 64 queries x 32,626 keys, "
                "synthetic input generated and the heads' full K and V quantized, two recipes, "
                "float64 reference, metrics). Target <= 10 s wall on 2 cores.\n\n"
                "| date | machine | versions | median wall | verdict |\n|---|---|---|---|---|\n"
                f"{marker}\n"
            )
        text = text.replace(marker, line + "\n" + marker)
        bench.write_text(text)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

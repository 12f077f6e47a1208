"""Throughput of ``workbench scan`` (entries x recipes per second) on 1, 2 and all cores.

Two inputs: the shipped capture (h3-nano: 164 rows x 2 heads, tasks of a few ms, so the
per-task overhead of the engine dominates) and a larger store written here (2048 rows x 4 heads x
128 channels, H3's packed layout scaled down: tasks of a few hundred ms, compute-bound). Each run
is a fresh scan store; cluster start-up is timed separately and not in the rate.

    python scripts/bench_scan.py                 # markdown table on stdout
    python scripts/bench_scan.py --workers 1,2 --only shipped
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

RECIPES = "fp8_dense,fp8_dense_k,fp8_dense_kv_corrected,fp8_sol_kv_corrected"


def make_large_store(path: Path, seq: int = 2048, heads: int = 4, steps: int = 2,
                     layers: int = 4) -> Path:
    """A capture store of random bf16 q/k/v with per-channel K/V means (seeded)."""
    import torch

    from workbench.attention import SegmentLayout
    from workbench.capture import capture

    g = torch.Generator().manual_seed(0)
    video = seq - 16 - 240
    layout = SegmentLayout(text=16, conditioning=0, audio=240, video=video)
    with capture(None, path, layout=layout, rotated_channels=96, progress=False) as cap:
        for s in range(steps):
            cap.step(s)
            for la in range(layers):
                q, k, v = (torch.randn(1, seq, heads, 128, generator=g) for _ in range(3))
                k = k + 2.0 * torch.randn(1, 1, heads, 128, generator=g)
                v = v + 0.5 * torch.randn(1, 1, heads, 128, generator=g)
                cap.record(f"transformer_blocks.{la}", q.bfloat16(), k.bfloat16(),
                           v.bfloat16(), step=s, layer=la)
    return path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workers", default=f"1,2,{os.cpu_count()}",
                    help="LocalCluster sizes (default 1, 2 and all cores)")
    ap.add_argument("--only", default="shipped,large", help="shipped and/or large")
    ap.add_argument("--queries", type=int, default=64)
    ap.add_argument("--device", default="cpu", choices=("cpu", "cuda"),
                    help="where the tasks run (cpu: worker counts are cores)")
    args = ap.parse_args()
    from workbench.evaluate.scan import run_scan, start_cluster

    tmp = Path(tempfile.mkdtemp(prefix="bench_scan_"))
    stores = {}
    if "shipped" in args.only:
        stores["shipped h3-nano (36 entries x 164 rows x 2 heads)"] = (
            ROOT / "captures" / "demo_h3_nano.zarr")
    if "large" in args.only:
        stores["written (8 entries x 2048 rows x 4 heads)"] = make_large_store(tmp / "large.zarr")
    sizes = sorted({int(w) for w in args.workers.split(",")})
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
                            capture_output=True, text=True).stdout.strip()
    print(f"{time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, commit {commit}, "
          f"{os.cpu_count()} cores, load average before {os.getloadavg()[0]:.2f}, "
          f"recipes {RECIPES}, {args.queries} query rows, device {args.device}\n")
    print("| store | scheduler | workers | tasks | seconds | entries x recipes / s | "
          "cluster start (s) |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for i, (name, store) in enumerate(stores.items()):
        ds, run = run_scan(store, RECIPES, out=tmp / f"s{i}_sync.zarr", scheduler="synchronous",
                           n_queries=args.queries, progress=False, log=lambda m: None,
                           device=args.device)
        print(f"| {name} | synchronous (in-process) | 1 | {run.tasks_run} | {run.seconds:.2f} "
              f"| {run.tasks_per_second:.1f} | 0 |", flush=True)
        for n in sizes:
            t0 = time.perf_counter()
            cl, client = start_cluster(n, args.device)
            start = time.perf_counter() - t0
            try:
                ds, run = run_scan(store, RECIPES, out=tmp / f"s{i}_w{n}.zarr", client=client,
                                   n_queries=args.queries, progress=False, log=lambda m: None,
                                   device=args.device)
            finally:
                client.close()
                cl.close()
            print(f"| {name} | LocalCluster | {n} | {run.tasks_run} | {run.seconds:.2f} | "
                  f"{run.tasks_per_second:.1f} | {start:.1f} |", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""CPU throughput benchmark of the capture writer against a raw sequential write of the same bytes.

Writes ``--entries`` entries of bf16 q/k/v [1, S, H, D] (H3 width by default: 56 heads x 128)
through ``capture(None, ...).record(...)`` and measures, in the same run and on the same
filesystem (``--dir``):

- writer: bytes / writer busy time (from an entry's dequeue to its completion marker), the figure
  the GPU scale check reports, and end to end (first record() to close());
- the same with the previous path (``direct_writes=False``: one thread, zarr's array write with
  temp file + rename per chunk), unless ``--no-zarr-path``;
- raw sequential write: the same bytes, one file per tensor, ``f.write`` in 32 MiB pieces, one
  thread (the ceiling the target refers to); and raw parallel write with as many threads as the
  writer uses (for context, not the target).

Measurements are interleaved (raw, writer, zarr path, raw parallel) ``--repeats`` times, each after
``os.sync()`` and each store/folder deleted right after it is measured, so dirty page-cache pages
do not pile up; medians are reported. Usage:
    python scripts/bench_capture_writer.py --seq 8192 --entries 4 --repeats 3 [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from workbench.bench.disk import raw_write  # noqa: E402
from workbench.capture import capture, open_capture  # noqa: E402
from workbench.capture.writer import DEFAULT_WRITER_THREADS  # noqa: E402

def capture_write(sources, n_entries, store: Path, **kw) -> dict:
    t0 = time.perf_counter()
    with capture(None, store, progress=False, **kw) as cap:
        for i in range(n_entries):
            q, k, v = sources[i % len(sources)]
            cap.record(f"blocks.{i}", q, k, v, step=0, layer=i)
    end_to_end = time.perf_counter() - t0
    st = cap.stats
    return {"bytes": st.bytes, "busy_s": st.write_seconds, "mib_s": st.mb_per_s,
            "end_to_end_s": end_to_end, "end_to_end_mib_s": st.bytes / 2**20 / end_to_end,
            "threads": st.threads, "direct": st.direct, "chunks": st.chunks,
            "budget_waits": cap.writer.budget.waits}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seq", type=int, default=16384)
    ap.add_argument("--heads", type=int, default=56)
    ap.add_argument("--dim", type=int, default=128)
    ap.add_argument("--entries", type=int, default=4)
    ap.add_argument("--threads", type=int, default=None)
    ap.add_argument("--budget-gb", type=float, default=2.0)
    ap.add_argument("--dir", default=None)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--no-zarr-path", action="store_true")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    threads = args.threads or DEFAULT_WRITER_THREADS
    g = torch.Generator().manual_seed(0)
    shape = (1, args.seq, args.heads, args.dim)
    # Two distinct source entries, reused (record() clones them, as it would live activations).
    sources = [tuple(torch.randn(shape, generator=g).to(torch.bfloat16) for _ in range(3))
               for _ in range(min(2, args.entries))]
    tensors = [t for i in range(args.entries) for t in sources[i % len(sources)]]
    scratch = Path(args.dir or tempfile.mkdtemp(prefix="capbench_"))
    scratch.mkdir(parents=True, exist_ok=True)
    res = {"shape": list(shape), "entries": args.entries, "dtype": "bfloat16",
           "total_gib": sum(t.numel() * 2 for t in tensors) / 2**30, "cpu_count": os.cpu_count(),
           "torch": torch.__version__}

    def measured_raw(tag, n_threads):
        os.sync()  # start from a clean page cache state (not timed)
        b, s = raw_write(tensors, scratch / tag, threads=n_threads)
        shutil.rmtree(scratch / tag)
        return {"bytes": b, "s": s, "mib_s": b / 2**20 / s}

    def measured_writer(tag, **extra):
        os.sync()
        kw = dict(budget_bytes=int(args.budget_gb * 2**30), queue_size=16)
        out = capture_write(sources, args.entries, scratch / tag, **kw, **extra)
        if "round_trip_bit_exact" not in res:  # bit-exact round trip of the last entry, once
            r = open_capture(scratch / tag)
            last = args.entries - 1
            res["round_trip_bit_exact"] = all(
                torch.equal(a.view(torch.int16), b.view(torch.int16))
                for a, b in zip(r.qkv(0, last), sources[last % len(sources)]))
            res["verify_problems"] = r.verify()
        shutil.rmtree(scratch / tag)
        return out

    # Interleaved repeats: the machine is shared, so raw and writer see the same conditions.
    runs = {"raw_sequential": [], "writer": [], f"raw_parallel_{threads}": []}
    if not args.no_zarr_path:
        runs["writer_zarr_path"] = []
    for _ in range(args.repeats):
        runs["raw_sequential"].append(measured_raw("raw1", 1))
        runs["writer"].append(measured_writer("new.zarr", writer_threads=threads))
        if "writer_zarr_path" in runs:
            runs["writer_zarr_path"].append(measured_writer("old.zarr", direct_writes=False))
        runs[f"raw_parallel_{threads}"].append(measured_raw("rawp", threads))
    res["runs"] = runs
    med = {k: statistics.median(r["mib_s"] for r in v) for k, v in runs.items()}
    res["median_mib_s"] = med
    res["writer_vs_raw_sequential"] = med["writer"] / med["raw_sequential"]
    res["writer_vs_raw_sequential_per_repeat"] = [
        w["mib_s"] / r["mib_s"] for w, r in zip(runs["writer"], runs["raw_sequential"])]
    if "writer_zarr_path" in med:
        res["zarr_path_vs_raw_sequential"] = med["writer_zarr_path"] / med["raw_sequential"]
    if args.dir is None:
        shutil.rmtree(scratch, ignore_errors=True)
    print(json.dumps(res, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2))
    return 0 if res["round_trip_bit_exact"] and not res["verify_problems"] else 1


if __name__ == "__main__":
    raise SystemExit(main())

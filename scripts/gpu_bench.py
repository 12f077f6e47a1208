"""One GPU run: the GPU tests, then ``workbench bench`` with every peer at the four H3-width shapes.

    set -o pipefail; PYTHONUNBUFFERED=1 python scripts/gpu_bench.py --out $OUT | tee $OUT/log.txt

1. ``pytest -m gpu`` on the test files that carry GPU tests -> OUT/pytest.txt (time-limited);
2. the side-by-side benchmark (``workbench.bench``): SDPA cuDNN, FlashAttention-3 BF16 / FP8,
   cuDNN FP8, SageAttention2 SM90 (each skipped with its reason when it does not import here),
   and the FP8 recipes fp8_dense, fp8_dense_k, fp8_dense_kv_corrected and
   fp8_dense_kv_corrected with the scaled P (p_scaling=exp2_offset8) and the row sum on the
   tensor cores (row_sum=p_operand), with P's codes from exp2 and without an exponential
   (p_exp=log_linear), at (1, S, 56, 128) for S in
   8192, 16384, 32626, 65536 -> OUT/bench.json, OUT/bench.md;
3. a short table last (per shape: ms, ratio to the fastest BF16 peer, rel-L2 vs float64).
Every line is time-stamped; OUT/gpu_bench.log keeps them. ``--dry-run`` prints the plan and the
time estimate without touching the GPU.

Imports only torch, triton and the project's bench / kernels / attention / recipes modules (the
GPU machine has no zarr, plotly, xarray or Jupyter). SageAttention is looked up on
``--sage-path`` (default: $SAGE_PATH, else .peer/sage when it exists), built there beforehand.
"""

from __future__ import annotations

import argparse
import datetime
import glob
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from workbench.bench import cli as bench_cli  # noqa: E402
from workbench.bench import tables  # noqa: E402

SHAPES = ["1,8192,56,128", "1,16384,56,128", "1,32626,56,128", "1,65536,56,128"]
RECIPES = ["fp8_dense", "fp8_dense_k", "fp8_dense_kv_corrected",
           "fp8_dense_kv_corrected:p_scaling=exp2_offset8,row_sum=p_operand",
           "fp8_dense_kv_corrected:p_scaling=exp2_offset8,row_sum=p_operand,p_exp=log_linear"]
PEER_ROWS = {"sdpa_cudnn": 1, "sdpa_flash": 1, "fa3_bf16": 1, "fa3_fp8": 2, "cudnn_fp8": 2,
             "sage2_sm90": 1}
COMPILE_S = 60  # first calls of the project's kernels (4 recipes) and of the peers
FIXED_S = 25  # imports, ceilings, inputs and float64 references


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    bench_cli.add_arguments(p)
    # no clock / power samples by default: 2 s per row would push the plan past six minutes
    p.set_defaults(shapes=SHAPES, recipes=RECIPES, rep_ms=200, board_s=0.0)
    p.add_argument("--out", default=os.environ.get("OUT", "/tmp/gpu_bench_out"),
                   help="output folder (default $OUT)")
    p.add_argument("--test-timeout", type=int, default=200, help="seconds for the GPU tests")
    p.add_argument("--skip-tests", action="store_true")
    p.add_argument("--sage-path", default=os.environ.get("SAGE_PATH", ".peer/sage"),
                   help="folder holding the built sageattention package")
    p.add_argument("--dry-run", action="store_true", help="print the plan and estimate only")
    args = p.parse_args(argv)
    try:
        bench_cli.check_args(args)
    except ValueError as exc:
        p.error(str(exc))
    if args.test_timeout < 1:
        p.error("--test-timeout: must be >= 1")
    return args


def estimate_seconds(shapes, recipes, peers, rep_ms: int, test_timeout: int | None,
                     board_s: float = 0.0) -> dict:
    """Rough wall time: each timed row costs do_bench's 5 estimate calls, its warm-up (100 ms) and
    repetitions (rep_ms), at least one call each, plus a call for the output and one for peak
    memory; a call takes the dense FLOPs at ~700 TFLOP/s."""
    rows_per_shape = sum(PEER_ROWS.get(p, 1) for p in peers) + 4 * len(recipes)
    bench = COMPILE_S + FIXED_S
    for s in shapes:
        B, S, H, D = bench_cli.parse_shape(s)
        call_ms = 4.0 * B * S * S * H * D / 700e12 * 1e3
        calls = 5 + max(1, 100 / call_ms) + max(1, rep_ms / call_ms) + 2
        bench += rows_per_shape * (calls * call_ms / 1e3 + board_s)
    tests = test_timeout or 0
    return {"bench_s": round(bench), "tests_max_s": tests, "total_max_s": round(bench + tests)}


class Log:
    """print with a time stamp (seconds since start and UTC clock), also into OUT/gpu_bench.log."""

    def __init__(self, path: str):
        self.t0 = time.time()
        self.f = open(path, "a")  # noqa: SIM115 - kept open for the whole run

    def __call__(self, *parts) -> None:
        now = datetime.datetime.now(datetime.timezone.utc).strftime("%H:%M:%S")
        line = f"[{time.time() - self.t0:7.1f}s {now}] " + " ".join(str(p) for p in parts)
        print(line, flush=True)
        self.f.write(line + "\n")
        self.f.flush()


# GPU tests that another GPU script runs in its own call (scripts/gpu_sparse.py: the sparse
# routing and kernels), kept out of this call's time plan
OTHER_CALLS = ("tests/test_kernels_routing.py", "tests/test_kernels_sparse.py",
               "tests/test_graphed.py")  # scripts/gpu_sparse.py runs these


def gpu_test_files() -> list[str]:
    """The test files that carry GPU tests (the others may import packages this machine lacks)."""
    out = []
    for path in sorted(glob.glob(os.path.join(ROOT, "tests", "test_*.py"))):
        rel = os.path.relpath(path, ROOT)
        with open(path) as f:
            if "pytest.mark.gpu" in f.read() and rel not in OTHER_CALLS:
                out.append(rel)
    return out


def run_tests(out_dir: str, timeout: int, log) -> str:
    """pytest -m gpu -> OUT/pytest.txt; returns pytest's last line (or the timeout)."""
    files = gpu_test_files()
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "gpu", *files]
    log("tests:", " ".join(cmd[1:]))
    try:
        p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=timeout)
        text = p.stdout + p.stderr
    except subprocess.TimeoutExpired as exc:
        partial = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
        text = f"{partial}\nTIMEOUT after {timeout} s"
    with open(os.path.join(out_dir, "pytest.txt"), "w") as f:
        f.write(text)
    tail = [ln for ln in text.strip().splitlines() if ln.strip()]
    log("tests:\n" + "\n".join(tail[-15:]))
    return tail[-1] if tail else "no output"


def main(argv=None) -> int:
    args = parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    log = Log(os.path.join(args.out, "gpu_bench.log"))
    est = estimate_seconds(args.shapes, args.recipes, args.peers, args.rep_ms,
                           None if args.skip_tests else args.test_timeout, args.board_s)
    log(f"plan: shapes {args.shapes}; recipes {args.recipes}; peers {args.peers}; rep_ms "
        f"{args.rep_ms}, rows {args.rows}, sets {args.sets}; estimate {json.dumps(est)}")
    if args.dry_run:
        return 0
    if os.path.isdir(args.sage_path):
        sys.path.insert(0, os.path.abspath(args.sage_path))
    import torch

    log("device", torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none",
        "torch", torch.__version__)
    tests = "skipped" if args.skip_tests else run_tests(args.out, args.test_timeout, log)
    report = bench_cli.run(args.shapes, recipes=args.recipes, peers=args.peers, rows=args.rows,
                           sets=args.sets, rep_ms=args.rep_ms, emulate=not args.no_emulate,
                           ceilings=not args.no_ceilings, board_s=args.board_s, log=log)
    report["tests"] = tests
    with open(os.path.join(args.out, "bench.json"), "w") as f:
        json.dump(report, f, indent=1)
    md = tables.markdown(report, rows=args.rows)
    with open(os.path.join(args.out, "bench.md"), "w") as f:
        f.write(md)
    if args.json:  # extra copies where --json / --markdown ask
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    if args.markdown:
        with open(args.markdown, "a") as f:
            f.write("\n" + md)
    log(f"wrote {args.out}/bench.json, bench.md, pytest.txt")
    print("\n== summary ==")
    print("tests:", tests)
    for name, why in report["skipped"].items():
        print(f"skipped {name}: {why}")
    print(tables.summary(report))
    log("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""ONE GPU call for the block-sparse work: GPU tests, the sparse attention bench, the DiT step.

    set -o pipefail; PYTHONUNBUFFERED=1 python scripts/gpu_sparse.py 2>&1 | tee $OUT/log.txt

1. ``pytest -m gpu tests/test_kernels_routing.py tests/test_graphed.py
   tests/test_kernels_sparse*.py``
   -> $OUT/pytest.txt (prints the rounding-disagreement counts of the routing at the H3 shape)
2. ``python -m workbench.bench.sparse`` (synthetic H3 input (1, 32626, 56, 128); Sol / VSA at the
   target densities, dense FP8, SDPA cuDNN, NVIDIA ``sol_attn`` when importable)
   -> $OUT/sparse.json, sparse.md, sparse.log
3. ``python -m workbench.bench.dit`` (full-width H3 DiT, 4 blocks, S = 32,626)
   -> $OUT/dit.json, dit.md, dit.log
Prints a short table last. Each stage is a subprocess with its own time limit, and the limits
shrink so that the whole call stays under --total-s (default 420 s). Expected on one H200 (not yet
run): tests 2-3 min with their compiles, sparse bench 2-3 min, DiT about 1 min; a bench stops
starting new rows at 70% of its limit, so a slow stage loses its last rows, not the call.
``--sweep`` adds the sparse kernel's option sweep to the bench (2-3 minutes more; e.g.
``--skip tests dit --sweep``).

NVIDIA's ``sol_attn`` is optional: put its package (and its CuTe DSL wheels) on PYTHONPATH, with
CUTE_DSL_ARCH=sm_90a; without it the sparse bench says why in one line.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STAGES = ("tests", "sparse", "dit")
STAGE_LIMIT_S = {"tests": 180, "sparse": 200, "dit": 120}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=os.environ.get("OUT", "/tmp/gpu_sparse_out"),
                   help="folder for logs and JSON (default $OUT)")
    p.add_argument("--skip", nargs="*", default=[], choices=STAGES, help="stages to leave out")
    p.add_argument("--densities", type=float, nargs="+", default=None,
                   help="target exact densities (default the bench's 0.1 0.2 0.35 0.5 1)")
    p.add_argument("--heads", type=int, default=56, help="heads of the sparse bench input")
    p.add_argument("--blocks", type=int, default=4, help="DiT transformer blocks")
    p.add_argument("--sweep", action="store_true",
                   help="also time the sparse kernel's options (about 2-3 minutes more: run it "
                        "with --skip tests dit)")
    p.add_argument("--total-s", type=float, default=420.0, help="time limit of the whole call")
    args = p.parse_args(argv)
    if args.densities is not None and any(not 0.0 < d <= 1.0 for d in args.densities):
        p.error(f"--densities: {args.densities} must lie in (0, 1]")
    if args.total_s <= 0:
        p.error("--total-s must be > 0")
    return args


def stage_command(name: str, args: argparse.Namespace, limit_s: float) -> list[str]:
    """argv of one stage; a bench stage starts no new variant after 70% of its time limit."""
    py, out = sys.executable, args.out
    dens = ["--densities", *map(str, args.densities)] if args.densities else []
    budget = ["--budget-s", str(int(0.7 * limit_s))]
    if name == "tests":
        return [py, "-m", "pytest", "-q", "-s", "-p", "no:cacheprovider", "-m", "gpu",
                "tests/test_kernels_routing.py", "tests/test_graphed.py",
                *sorted(glob.glob(os.path.join(ROOT, "tests", "test_kernels_sparse*.py")))]
    if name == "sparse":
        return [py, "-m", "workbench.bench.sparse", "--heads", str(args.heads), *dens, *budget,
                *([] if args.sweep else ["--no-sweep"]), "--json", os.path.join(out, "sparse.json"),
                "--markdown", os.path.join(out, "sparse.md")]
    if name == "dit":
        return [py, "-m", "workbench.bench.dit", "--blocks", str(args.blocks), *dens, *budget,
                "--json", os.path.join(out, "dit.json"),
                "--markdown", os.path.join(out, "dit.md")]
    raise ValueError(f"stage: unknown {name!r}; stages are {STAGES}")


def run_stage(name: str, cmd: list[str], log_path: str, limit_s: float) -> str:
    """Run one stage with its output in log_path; returns a one-line status."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [ROOT] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    t0 = time.time()
    with open(log_path, "w") as f:
        try:
            rc = subprocess.run(cmd, cwd=ROOT, env=env, stdout=f, stderr=subprocess.STDOUT,
                                timeout=limit_s).returncode
            status = f"rc {rc}"
        except subprocess.TimeoutExpired:
            status = f"TIMEOUT after {limit_s:.0f} s"
    return f"{name}: {status} in {time.time() - t0:.0f} s"


def tail(path: str, n: int = 12) -> list[str]:
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [ln.rstrip() for ln in f if ln.strip()][-n:]


def summary(out: str, statuses: list[str]) -> str:
    """The short table printed last: stage statuses, pytest's last lines, the headline rows."""
    lines = ["== summary ==", *statuses]
    lines += [f"pytest: {ln}" for ln in tail(os.path.join(out, "pytest.txt"), 3)]
    lines += [f"routing: {ln}" for ln in _grep(os.path.join(out, "pytest.txt"), "H3 ")]
    sp = _load(os.path.join(out, "sparse.json"))
    if sp:
        base = next((r.get("ms") for r in sp["rows"] if r["variant"] == "sdpa_cudnn_bf16"), None)
        lines.append(f"{'variant':34s} {'density':>8s} {'ms':>8s} {'xSDPA':>6s} {'relL2':>9s}")
        for r in sp["rows"]:
            ms = r.get("ms")
            if ms is None:
                lines.append(f"{r['variant']:34s} {r['density']:8.4f} skipped: "
                             f"{r.get('skipped', '')[:60]}")
                continue
            x = f"{base / ms:6.2f}" if base else ""
            lines.append(f"{r['variant']:34s} {r['density']:8.4f} {ms:8.3f} {x:>6s} "
                         f"{r['rel_l2']:9.2e}")
        for r in sp["routing"]:
            pct = r.get("pct_of_dense_fp8")
            lines.append(f"  {r['what']:52s} {r['ms']:8.3f} ms"
                         + (f" {pct:5.2f}% of dense FP8" if pct is not None else ""))
        if sp.get("peer"):
            lines.append(f"NVIDIA sol_attn: {sp['peer']}")
        for r in sp.get("stages", []):
            lines.append(f"  stage {r['recipe'][:28]:28s} {r['what']:32s} {r['ms']:8.3f} ms")
    dit = _load(os.path.join(out, "dit.json"))
    if dit:
        if dit.get("skipped"):
            lines.append(f"DiT: skipped: {dit['skipped']}")
        for r in dit.get("rows", []):
            ms = f"{r['ms']:8.1f} ms" if "ms" in r else f"skipped: {r.get('skipped', '')[:60]}"
            dens = f" density {r['density']:.3f}" if "density" in r else ""
            lines.append(f"DiT {r['variant']:30s}{dens} {ms}"
                         + (f" x{r['x_cudnn']:.2f}" if "x_cudnn" in r else ""))
    return "\n".join(lines)


def _load(path: str):
    if not os.path.exists(path):
        return None
    with open(path) as f:
        return json.load(f)


def _grep(path: str, needle: str) -> list[str]:
    """Lines holding needle, from needle on (pytest's progress marks may precede a print)."""
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return [ln[ln.index(needle):].rstrip() for ln in f if needle in ln]


def main(argv=None) -> int:
    args = parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    t0 = time.time()
    statuses = []
    for name in (s for s in STAGES if s not in args.skip):
        left = args.total_s - (time.time() - t0)
        if left < 20:
            statuses.append(f"{name}: not run (total time limit)")
            continue
        limit = min(STAGE_LIMIT_S[name], left)
        log_name = "pytest.txt" if name == "tests" else f"{name}.log"
        status = run_stage(name, stage_command(name, args, limit),
                           os.path.join(args.out, log_name), limit)
        statuses.append(status)
        print(status, flush=True)
        for ln in tail(os.path.join(args.out, log_name), 6):
            print("   ", ln, flush=True)
    print(summary(args.out, statuses), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

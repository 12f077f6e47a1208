"""Eager kernel calls against their CUDA-graph replays (``GraphedAttention``), by sequence length
(GPU).

For each length and recipe: the eager call (``run_attention(..., backend="kernel")``, a
``do_bench`` median: where the host is the bottleneck, its time to issue the call), the graph's
replay with the inputs copied in (``att(q, k, v)``) and in place (``att()``), interleaved
rounds; the host's time to issue one eager call while the GPU is busy
with earlier work; and whether the replay's output equals the eager one bit for bit. Synthetic
H3 proportions (``small_config`` below the live length, the live H3 layout at 32,626).

    python3 scripts/gpu_graphed.py [--lengths 8192 16384 32626] [--heads 56] [--rounds 5]
        [--recipes fp8_sol_kv_corrected fp8_dense_kv_corrected ...] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from workbench.attention.graphed import GraphedAttention  # noqa: E402
from workbench.attention.runner import run_attention  # noqa: E402
from workbench.bench.harness import env_info, interleaved_ms  # noqa: E402
from workbench.synthetic import H3_SYNTHETIC, small_config, synthetic_qkv  # noqa: E402

RECIPES = ("fp8_sol_kv_corrected", "fp8_sol_kv_corrected:sparsity=vsa,vsa_keep=0.15",
           "fp8_dense_kv_corrected")


def host_issue_ms(fn, n: int = 9) -> float:
    """Median host time to issue fn while the GPU is still busy (a ~30 ms sleep kernel first),
    so that no launch waits for the GPU."""
    ts = []
    for _ in range(n):
        torch.cuda.synchronize()
        torch.cuda._sleep(60_000_000)
        t0 = time.perf_counter()
        fn()
        ts.append(1e3 * (time.perf_counter() - t0))
    torch.cuda.synchronize()
    return statistics.median(ts)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--lengths", type=int, nargs="+", default=[8192, 16384, 32626])
    p.add_argument("--heads", type=int, default=56)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--rep-ms", type=int, default=150)
    p.add_argument("--recipes", nargs="+", default=list(RECIPES))
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        p.error("needs a CUDA GPU")
    rows = []
    for S in args.lengths:
        syn = (replace(H3_SYNTHETIC, heads=args.heads) if S == H3_SYNTHETIC.layout.total
               else small_config(S, heads=args.heads))
        q, k, v = (t.contiguous() for t in synthetic_qkv(syn, device="cuda"))
        for name in args.recipes:
            def eager(name=name):
                return run_attention(q, k, v, name, layout=syn.layout, backend="kernel")

            att = GraphedAttention(q, k, v, name, layout=syn.layout)
            same = bool(torch.equal(att(q, k, v), eager()))
            times = interleaved_ms({"eager": eager, "copied": lambda: att(q, k, v),
                                    "in place": att}, rounds=args.rounds, rep_ms=args.rep_ms)
            med = {key: statistics.median(t) for key, t in times.items()}
            row = dict(S=S, recipe=name, **{f"{key} ms": m for key, m in med.items()},
                       host_issue_ms=host_issue_ms(eager), bitwise=same)
            rows.append(row)
            print(json.dumps(row), flush=True)
            att = None  # its graph's memory back before the next capture
            torch.cuda.empty_cache()
    env = env_info()
    lines = [f"{env.get('device', '')}, torch {env['torch']}, triton {env.get('triton')}, "
             f"{env['date']}; medians of {args.rounds} interleaved do_bench rounds", "",
             "| S | recipe | eager ms | graph, inputs copied ms | graph, in place ms | "
             "host issue of the eager call ms | replay = eager bitwise |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['S']} | {r['recipe']} | {r['eager ms']:.3f} | {r['copied ms']:.3f} "
                     f"| {r['in place ms']:.3f} | {r['host_issue_ms']:.3f} | {r['bitwise']} |")
    md = "\n".join(lines)
    print(md)
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        Path(args.out, "graphed.md").write_text(md + "\n")
        Path(args.out, "graphed.json").write_text(json.dumps({"env": env, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Every kernel of one full call in launch order, with the idle time before each (GPU).

    python3 scripts/gpu_timeline.py [--recipe R] [--taus 1.247 ...] [--graph] [--out DIR]

For each tau: the kernels of one eager call of ``R:sol_tau=T`` at the synthetic H3 shape
(``harness.kernel_timeline``: start, duration and the gap since the previous kernel ended), and
with --graph the same call replayed from a CUDA graph (``GraphedAttention``), then totals:
kernels, their summed time, summed gaps and the span. Why: a call's span exceeded the sum of
its longest kernels by 0.4-0.5 ms, which a per-kernel profile cannot place.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from workbench.attention.graphed import GraphedAttention  # noqa: E402
from workbench.bench.harness import env_info, kernel_timeline  # noqa: E402
from workbench.kernels.dispatch import fp8_recipe_attention  # noqa: E402
from workbench.recipes import get_recipe  # noqa: E402
from workbench.synthetic import H3_SYNTHETIC, synthetic_qkv  # noqa: E402

DEFAULT_RECIPE = "fp8_sol_kv_loglinear:dense_prefix=false,prefix_blocks_exact=false"


def print_timeline(label: str, rows: list[dict]) -> dict:
    print(f"\n| {label}: kernel | start us | us | gap before us |\n|---|---|---|---|")
    for r in rows:
        print(f"| {r['kernel'][:70]} | {r['start_us']:.1f} | {r['us']:.1f} | "
              f"{r['gap_us']:.1f} |")
    tot = {"kernels": len(rows), "kernel_us": sum(r["us"] for r in rows),
           "gap_us": sum(max(r["gap_us"], 0.0) for r in rows[1:]),
           "span_us": max((r["start_us"] + r["us"] for r in rows), default=0.0)}
    print(f"| total: {tot['kernels']} kernels | | {tot['kernel_us']:.1f} | "
          f"{tot['gap_us']:.1f} (span {tot['span_us']:.1f}) |")
    return tot


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--recipe", default=DEFAULT_RECIPE)
    p.add_argument("--taus", nargs="+", type=float, default=[1.247])
    p.add_argument("--graph", action="store_true")
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    base = get_recipe(a.recipe)
    syn = H3_SYNTHETIC
    q, k, v = (t.contiguous() for t in synthetic_qkv(syn, device="cuda"))
    env = env_info()
    print(f"{env.get('device', 'no GPU')}, torch {env['torch']}, triton {env.get('triton')}, "
          f"CUDA {env.get('cuda')}, {env['date']}; S = {q.shape[1]}, {q.shape[2]} heads")
    result = {"env": env, "runs": []}
    for tau in a.taus:
        r = base.with_(sol_tau=tau) if base.sparsity == "sol" else base
        rows = kernel_timeline(lambda r=r: fp8_recipe_attention(q, k, v, r, layout=syn.layout))
        tot = print_timeline(f"{r.to_string()} eager", rows)
        result["runs"].append({"recipe": r.to_string(), "mode": "eager", "rows": rows, **tot})
        if a.graph:
            att = GraphedAttention(q, k, v, r, layout=syn.layout)
            rows = kernel_timeline(att)
            tot = print_timeline(f"{r.to_string()} graph", rows)
            result["runs"].append({"recipe": r.to_string(), "mode": "graph", "rows": rows,
                                   **tot})
    if a.out:
        Path(a.out).mkdir(parents=True, exist_ok=True)
        Path(a.out, "timeline.json").write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Accuracy of the P scalings (unit, exp2_offset8, rowmax448) on the reference path (CPU).

    python scripts/cpu_p_scaling.py [--store captures/demo_h3_nano.zarr] [--seq 2048]

For fp8_dense, fp8_dense_k and fp8_dense_kv_corrected with each ``p_scaling``: relative L2 of the
torch emulation against float64 attention, on
- "biased": randn with per-channel K/V biases (the benchmark inputs), 4 heads x 128;
- "sink": rows dominated by sink keys, most mass in P values near 2^-10.5 (``bench.inputs``);
- "synthetic H3": the seeded H3-like generator (``workbench.synthetic``), 4 heads;
- the capture store: every entry, rel-L2 over all its rows (mean and max over entries).
Prints one markdown table. The kernels implement the same scalings (``attention_fp8``) and are
tested against this emulation (tests/test_kernels_*.py).
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from workbench.attention import dense_attention_f64, evenly_spaced_rows, recipe_attention  # noqa: E402
from workbench.bench.inputs import make_inputs, sink_inputs  # noqa: E402

RECIPES = ("fp8_dense", "fp8_dense_k", "fp8_dense_kv_corrected")
SCALINGS = ("unit", "exp2_offset8", "rowmax448")


def rel_errors(q, k, v, rows: int) -> dict:
    """{(recipe, scaling): rel-L2 vs float64} on `rows` evenly spaced query rows."""
    idx = evenly_spaced_rows(q.shape[1], min(rows, q.shape[1]))
    ref, _ = dense_attention_f64(q, k, v, query_index=idx)
    out = {}
    for r in RECIPES:
        for s in SCALINGS:
            o = recipe_attention(q, k, v, f"{r}:p_scaling={s}", query_index=idx).out
            out[r, s] = float((o.double() - ref).norm() / ref.norm())
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--store", default="captures/demo_h3_nano.zarr")
    p.add_argument("--seq", type=int, default=2048, help="tokens of the synthetic inputs")
    p.add_argument("--rows", type=int, default=256, help="query rows of the synthetic inputs")
    args = p.parse_args(argv)
    torch.manual_seed(0)
    results = {}
    S = args.seq
    results["biased (1, %d, 4, 128)" % S] = rel_errors(
        *make_inputs(1, S, 4, 128, n_sets=1, seed=3, device="cpu")[0], args.rows)
    results["sink (1, %d, 4, 128)" % S] = rel_errors(*sink_inputs(1, S, 4, 128), args.rows)
    from workbench.synthetic import small_config, synthetic_qkv

    results["synthetic H3 (1, %d, 4, 128)" % S] = rel_errors(
        *synthetic_qkv(small_config(seq_len=S, heads=4)), args.rows)
    if args.store and os.path.exists(args.store):
        from workbench.capture import open_capture

        cap = open_capture(args.store)
        per = [rel_errors(*cap.qkv(e.step, e.layer), 10**9) for e in cap.entries()
               if e.status == "complete"]
        name = f"{os.path.basename(args.store)} ({len(per)} entries, all rows)"
        results[name + ", mean"] = {key: sum(d[key] for d in per) / len(per) for key in per[0]}
        results[name + ", max"] = {key: max(d[key] for d in per) for key in per[0]}
    head = " | ".join(f"{r} {s}" for r in RECIPES for s in SCALINGS)
    print(f"| inputs | {head} |")
    print("|---" * (1 + len(RECIPES) * len(SCALINGS)) + "|")
    for name, errs in results.items():
        print(f"| {name} | " + " | ".join(f"{errs[r, s]:.3e}" for r in RECIPES
                                          for s in SCALINGS) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""One call on an idle GPU against the same call back to back, per kernel (GPU).

    python3 scripts/gpu_sustained.py [--taus 1.247 -0.002272] [--dense D] [--recipe R]
        [--load-s 2] [--q-scales 0.25 4] [--out FILE.json]

For the dense recipe and the Sol recipe at each tau: (a) the call's kernels when it starts on an
idle GPU (``harness.kernel_timeline``: its launches queued behind a sleep); (b) the same call
run back to back for --load-s seconds (``harness.board_under_load``: SM clock and board power),
then 8 more calls profiled (``harness.kernel_profile``): each kernel's time per call and
their sum; (c) ``do_bench``'s median with the L2 flushed before each call, as the
A/B and the benchmark tables time it. Why: the A/B times a Sol call at density 0.1 about
0.48 ms (9%) above its idle timeline's span while the dense call's two agree within 0.4%;
this says whether the list kernel itself runs slower under load, and at what clock.
--q-scales adds the dense call on Q times each factor (a flatter or a peakier softmax: the same
instructions on other data), to see whether the board's clock under load depends on the data.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from workbench.bench.harness import (  # noqa: E402
    board_under_load,
    env_info,
    kernel_profile,
    kernel_timeline,
    median_ms,
)
from workbench.kernels.dispatch import fp8_recipe_attention  # noqa: E402
from workbench.recipes import get_recipe  # noqa: E402
from workbench.synthetic import H3_SYNTHETIC, synthetic_qkv  # noqa: E402

DEFAULT_RECIPE = "fp8_sol_kv_loglinear:prefix_blocks_exact=false"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--recipe", default=DEFAULT_RECIPE)
    p.add_argument("--dense", default="fp8_dense_kv_loglinear")
    p.add_argument("--taus", nargs="+", type=float, default=[1.247, -0.002272])
    p.add_argument("--load-s", type=float, default=2.0)
    p.add_argument("--q-scales", nargs="*", type=float, default=[])
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    base = get_recipe(a.recipe)
    if base.sparsity != "sol":
        raise SystemExit(f"--recipe: {a.recipe!r} is not a Sol recipe")
    syn = H3_SYNTHETIC
    q, k, v = (t.contiguous() for t in synthetic_qkv(syn, device="cuda"))
    env = env_info()
    print(f"{env.get('device', 'no GPU')}, torch {env['torch']}, triton {env.get('triton')}, "
          f"{env['date']}; S = {q.shape[1]}, {q.shape[2]} heads")
    recs = {"dense": get_recipe(a.dense)}
    recs.update({f"tau {t:g}": base.with_(sol_tau=t) for t in a.taus})
    calls = [(name, r, q) for name, r in recs.items()]
    calls += [(f"dense, Q x {s:g}", recs["dense"], (q * s).contiguous()) for s in a.q_scales]
    runs = []
    for name, r, qs in calls:
        def fn(r=r, qs=qs):
            return fp8_recipe_attention(qs, k, v, r, layout=syn.layout)

        idle = kernel_timeline(fn)
        idle_us = {}
        for row in idle:
            idle_us[row["kernel"]] = idle_us.get(row["kernel"], 0.0) + row["us"]
        span = max((row["start_us"] + row["us"] for row in idle), default=0.0)
        board = board_under_load(fn, seconds=a.load_s)
        loaded_us = {row["kernel"]: row["ms_per_call"] * 1e3 for row in kernel_profile(fn, n=8)
                     if not row["kernel"].startswith("(span")}
        bench = median_ms(fn, rep_ms=300)
        main_kernel = max(idle_us, key=idle_us.get)
        run = {"variant": name, "recipe": r.to_string(), "idle_span_us": span,
               "idle_kernel_us": sum(idle_us.values()), "idle_kernels_us": idle_us,
               "loaded_kernel_us_per_call": sum(loaded_us.values()),
               "loaded_kernels_us": loaded_us, "do_bench_ms": bench, "board": board,
               "main_kernel": main_kernel}
        runs.append(run)
        print(f"{name}: idle span {span / 1e3:.3f} ms (kernels {run['idle_kernel_us'] / 1e3:.3f}),"
              f" loaded kernels {run['loaded_kernel_us_per_call'] / 1e3:.3f} ms/call, do_bench "
              f"{bench:.3f} ms; {main_kernel} idle {idle_us[main_kernel] / 1e3:.3f} / loaded "
              f"{loaded_us.get(main_kernel, float('nan')) / 1e3:.3f} ms; board "
              f"{board}", flush=True)
    print("\n| variant | idle span ms | loaded kernels ms/call | do_bench ms | main kernel idle / "
          "loaded ms | SM MHz | W |\n|---|---|---|---|---|---|---|")
    for r in runs:
        mk = r["main_kernel"]
        print(f"| {r['variant']} | {r['idle_span_us'] / 1e3:.3f} | "
              f"{r['loaded_kernel_us_per_call'] / 1e3:.3f} | {r['do_bench_ms']:.3f} | "
              f"{r['idle_kernels_us'][mk] / 1e3:.3f} / "
              f"{r['loaded_kernels_us'].get(mk, float('nan')) / 1e3:.3f} | "
              f"{r['board'].get('sm_mhz', '')} | {r['board'].get('power_w', '')} |")
    if a.out:
        Path(a.out).write_text(json.dumps({"env": env, "runs": runs}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

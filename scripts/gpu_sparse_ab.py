"""Interleaved A/B timing of the sparse kernel's options at the Sol anchor (GPU).

The option sweep of ``workbench bench sparse`` times each option once, in sequence; between two
sweeps of unchanged code its rows moved by up to 0.5 ms (H200, 2026-12-01), more than the options
it compares. This script times the options in ROUNDS interleaved rounds (each a do_bench median)
and reports the median over rounds and the spread, then one torch-profiler view of a default call
(GPU busy time per kernel and the call's span).

    python3 scripts/gpu_sparse_ab.py [--rounds 7] [--rep-ms 150] [--heads 56] [--out DIR]
        [--labels LABEL ...] [--recipe RECIPE] [--recipes RECIPE ...]

``--labels`` times the options of ``--recipe`` (default ``fp8_sol_kv_corrected:sol_tau=1``).

``--recipes``: the options are recipes (default kernel config) instead of config labels, each
also with its exact density and its rel-L2 against float64 on 64 evenly spaced rows; dense
recipes may sit beside the sparse ones.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import replace
from pathlib import Path


sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from workbench.attention import dense_attention_f64, evenly_spaced_rows  # noqa: E402
from workbench.bench.harness import interleaved_ms, kernel_profile  # noqa: E402
from workbench.bench.sparse import sweep_configs  # noqa: E402
from workbench.kernels.config import DEFAULT  # noqa: E402
from workbench.kernels.dispatch import fp8_recipe_attention  # noqa: E402
from workbench.recipes import get_recipe  # noqa: E402
from workbench.synthetic import H3_SYNTHETIC, synthetic_qkv  # noqa: E402

LABELS = ("default", "CTAs of consecutive query blocks", "prefix rows after the FP8 passes")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--rep-ms", type=int, default=150)
    p.add_argument("--heads", type=int, default=56)
    p.add_argument("--out", default=None)
    p.add_argument("--labels", nargs="+", default=list(LABELS),
                   help="option labels of workbench.bench.sparse.sweep_configs")
    p.add_argument("--recipe", default="fp8_sol_kv_corrected:sol_tau=1",
                   help="the recipe whose options --labels compares")
    p.add_argument("--recipes", nargs="+", default=None,
                   help="compare these recipes (default config) instead of config labels")
    a = p.parse_args(argv)
    syn = replace(H3_SYNTHETIC, heads=a.heads)
    q, k, v = (t.contiguous() for t in synthetic_qkv(syn, device="cuda"))
    if a.recipes:
        return compare_recipes(a, syn, q, k, v)
    try:
        rec = get_recipe(a.recipe)
    except ValueError as exc:
        raise SystemExit(f"--recipe: {exc}")
    cfgs = dict(sweep_configs(DEFAULT))
    unknown = [lab for lab in a.labels if lab not in cfgs]
    if unknown:
        p.error(f"--labels: unknown {unknown}; choose from {list(cfgs)}")
    cfgs = {lab: cfgs[lab] for lab in a.labels}
    fns = {lab: (lambda cfg=cfg: fp8_recipe_attention(q, k, v, rec, layout=syn.layout,
                                                      config=cfg)) for lab, cfg in cfgs.items()}
    for fn in fns.values():  # compile + warm
        fn()
    times = interleaved_ms(fns, rounds=a.rounds, rep_ms=a.rep_ms)
    rows = [{"option": lab, "median_ms": statistics.median(t), "min_ms": min(t),
             "max_ms": max(t)} for lab, t in times.items()]
    profs = {lab: kernel_profile(fn) for lab, fn in fns.items()}
    prof = profs[a.labels[0]]
    print("| option | median of rounds ms | min | max | profiler: span of a call |\n"
          "|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['option']} | {r['median_ms']:.3f} | {r['min_ms']:.3f} | {r['max_ms']:.3f} "
              f"| {profs[r['option']][-1]['ms_per_call']:.3f} |")
    print(f"\n| kernel ({a.labels[0]} call, torch profiler) | ms per call |\n|---|---|")
    for r in prof[:8] + prof[-1:]:
        print(f"| {r['kernel']} | {r['ms_per_call']:.3f} |")
    if a.out:
        Path(a.out).mkdir(parents=True, exist_ok=True)
        Path(a.out, "ab.json").write_text(json.dumps({"rows": rows, "rounds": times,
                                                      "profiles": profs}, indent=1))
    return 0


def compare_recipes(a, syn, q, k, v) -> int:
    """Interleaved full-call times of recipes, with exact density and rel-L2 vs float64."""
    from workbench.kernels.dispatch import sparse_routing, unsupported_reason

    recs = {}
    for name in a.recipes:
        try:
            recs[name] = get_recipe(name)
        except ValueError as exc:
            raise SystemExit(f"--recipes: {exc}")
        why = unsupported_reason(q, k, v, recs[name])
        if why:
            raise SystemExit(f"--recipes: {name!r} takes the reference path here: {why}")
    idx = evenly_spaced_rows(q.shape[1], 64).cuda()
    ref, _ = dense_attention_f64(q, k, v, query_index=idx)
    fns = {name: (lambda r=r: fp8_recipe_attention(q, k, v, r, layout=syn.layout))
           for name, r in recs.items()}
    acc = {}
    for name, fn in fns.items():  # compile + warm + accuracy
        out = fn()[:, idx].double()
        acc[name] = float((out - ref).norm() / ref.norm())
    dens = {}
    for name, r in recs.items():
        if r.sparsity != "dense":
            dens[name] = sparse_routing(q, k, v, r, syn.layout, q.shape[-1] ** -0.5)[3].density
    times = interleaved_ms(fns, rounds=a.rounds, rep_ms=a.rep_ms)
    rows = [{"recipe": n, "median_ms": statistics.median(t), "min_ms": min(t), "max_ms": max(t),
             "rel_l2_f64": acc[n], "exact_density": dens.get(n, 1.0)} for n, t in times.items()]
    print("| recipe | median of rounds ms | min | max | exact density | rel-L2 vs f64 |\n"
          "|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['recipe']} | {r['median_ms']:.3f} | {r['min_ms']:.3f} | {r['max_ms']:.3f} "
              f"| {r['exact_density']:.4f} | {r['rel_l2_f64']:.3e} |")
    if a.out:
        Path(a.out).mkdir(parents=True, exist_ok=True)
        Path(a.out, "ab_recipes.json").write_text(json.dumps({"rows": rows, "rounds": times},
                                                             indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

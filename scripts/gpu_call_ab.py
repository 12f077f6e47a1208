"""Whole-call times of a Sol recipe over tau and its dense form, from one checkout (GPU); run
it on two checkouts in alternating processes for an A/B across revisions.

    python3 scripts/gpu_call_ab.py [--tree DIR] [--label NAME] [--recipe R] [--dense D]
        [--taus 1.247 0.8009 ...] [--also R ...] [--rounds 3] [--rep-ms 150] [--config JSON]
        [--out FILE.jsonl]
    python3 scripts/gpu_call_ab.py --combine FILE.jsonl

--tree: the checkout whose ``workbench`` package is timed (default: this one; the script's own
code is this one's); --also: further recipes of any sparsity timed in the same rounds (e.g. a
VSA call at Sol's least density, which has no summary route); --config:
``KernelConfig.from_overrides`` JSON for the calls. Each run appends one JSON line (label, env,
commit, per-variant medians of `rounds` interleaved ``do_bench`` rounds, rel-L2 against float64
on 64 evenly spaced rows, exact density) to --out; --combine prints, per label and variant, the
median over the runs' medians and the near-linear bound 1.15 x density x dense + 1.5 ms with
the dense call of the same label. Why processes: two revisions of the package cannot share one;
alternating them (A B A B) spreads the GPU's drifts over both.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parents[1]
DEFAULT_RECIPE = "fp8_sol_kv_loglinear:prefix_blocks_exact=false"
DEFAULT_TAUS = [1.247, 0.8009, 1.0, 0.3617, -0.002272]


def combine(path: str) -> int:
    runs = [json.loads(line) for line in Path(path).read_text().splitlines() if line.strip()]
    if not runs:
        raise SystemExit(f"--combine: {path} holds no runs")
    by = {}
    for r in runs:
        for v in r["rows"]:
            by.setdefault(r["label"], {}).setdefault(v["variant"], []).append(v)
    print(f"{runs[0]['env'].get('device')}, torch {runs[0]['env']['torch']}, triton "
          f"{runs[0]['env'].get('triton')}, {runs[0]['env']['date']}; "
          f"{len(runs)} processes, medians of their medians")
    print("\n| label | variant | exact density | ms | per-process medians | near-linear bound |"
          " rel-L2 vs f64 |\n|---|---|---|---|---|---|---|")
    for label, variants in by.items():
        dense = statistics.median(v["median_ms"] for v in variants.get("dense", [{"median_ms":
                                                                                 float("nan")}]))
        for name, vs in variants.items():
            ms = statistics.median(v["median_ms"] for v in vs)
            dens = vs[0]["exact_density"]
            bound = "" if name == "dense" else f"{1.15 * dens * dense + 1.5:.3f}"
            each = " / ".join(f"{v['median_ms']:.3f}" for v in vs)
            print(f"| {label} | {name} | {dens:.4f} | {ms:.3f} | {each} | {bound} | "
                  f"{vs[0]['rel_l2_f64']:.4e} |")
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tree", default=str(HERE))
    p.add_argument("--label", default=None)
    p.add_argument("--recipe", default=DEFAULT_RECIPE)
    p.add_argument("--dense", default="fp8_dense_kv_loglinear")
    p.add_argument("--taus", nargs="+", type=float, default=DEFAULT_TAUS)
    p.add_argument("--also", nargs="*", default=[])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--rep-ms", type=int, default=150)
    p.add_argument("--config", default="{}", help="KernelConfig overrides as JSON")
    p.add_argument("--out", default=None)
    p.add_argument("--combine", default=None)
    a = p.parse_args(argv)
    if a.combine:
        return combine(a.combine)
    tree = Path(a.tree).resolve()
    if not (tree / "workbench" / "__init__.py").is_file():
        raise SystemExit(f"--tree: {tree} holds no workbench package")
    sys.path.insert(0, str(tree))
    from workbench.attention import dense_attention_f64, evenly_spaced_rows
    from workbench.bench.harness import env_info, interleaved_ms
    from workbench.kernels.config import KernelConfig
    from workbench.kernels.dispatch import fp8_recipe_attention, sparse_routing
    from workbench.recipes import get_recipe
    from workbench.synthetic import H3_SYNTHETIC, synthetic_qkv

    import workbench

    if Path(workbench.__file__).resolve().parents[1] != tree:
        raise SystemExit(f"--tree: imported workbench from {workbench.__file__}, not {tree}")
    commit = ""
    if (tree / ".git").exists():  # an exported tree has none (then: the label names it)
        try:
            commit = subprocess.run(["git", "-C", str(tree), "rev-parse", "--short", "HEAD"],
                                    capture_output=True, text=True, timeout=10).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            pass
    if not commit and tree == HERE:
        commit = os.environ.get("WORKBENCH_COMMIT", "")
    cfg = KernelConfig.from_overrides(json.loads(a.config))
    base = get_recipe(a.recipe)
    if base.sparsity != "sol":
        raise SystemExit(f"--recipe: {a.recipe!r} is not a Sol recipe")
    recs = {"dense": get_recipe(a.dense)}
    recs.update({f"tau {t:g}": base.with_(sol_tau=t) for t in a.taus})
    recs.update({name: get_recipe(name) for name in a.also})
    syn = H3_SYNTHETIC
    q, k, v = (t.contiguous() for t in synthetic_qkv(syn, device="cuda"))
    idx = evenly_spaced_rows(q.shape[1], 64).cuda()
    ref, _ = dense_attention_f64(q, k, v, query_index=idx)
    fns, acc, dens = {}, {}, {}
    for name, r in recs.items():
        def fn(r=r):
            return fp8_recipe_attention(q, k, v, r, layout=syn.layout, config=cfg)

        out = fn()[:, idx].double()  # compile + warm + accuracy
        acc[name] = float((out - ref).norm() / ref.norm())
        fns[name] = fn
        dens[name] = (1.0 if r.sparsity == "dense" else
                      sparse_routing(q, k, v, r, syn.layout, q.shape[-1] ** -0.5,
                                     cfg.routing)[3].density)
    times = interleaved_ms(fns, rounds=a.rounds, rep_ms=a.rep_ms)
    rows = [{"variant": n, "median_ms": statistics.median(t), "min_ms": min(t), "max_ms": max(t),
             "rel_l2_f64": acc[n], "exact_density": dens[n]} for n, t in times.items()]
    run = {"label": a.label or commit or "?", "commit": commit or "?", "tree": str(tree),
           "env": env_info(), "recipe": base.to_string(), "config": json.loads(a.config),
           "rounds": a.rounds, "rows": rows}
    for r in rows:
        print(f"{run['label']} | {r['variant']} | {r['exact_density']:.4f} | "
              f"{r['median_ms']:.3f} | {r['rel_l2_f64']:.4e}", flush=True)
    if a.out:
        with open(a.out, "a") as f:
            f.write(json.dumps(run) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

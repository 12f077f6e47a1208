"""Same-run A/B of the list kernel against another version of its module (GPU).

    git show REV:workbench/kernels/attention_fp8_ws_lists.py > /tmp/lists_rev.py
    python3 scripts/gpu_lists_ab.py --other /tmp/lists_rev.py [--taus 1.247 0.8009 ...]
        [--recipe "fp8_sol_kv_corrected:p_scaling=exp2_offset8,row_sum=p_operand,\
p_exp=log_linear,dense_prefix=false"]
        [--rounds 5] [--rep-ms 150] [--out DIR]

Full calls of ``RECIPE:sol_tau=T`` for each tau with the tree's list kernel ("tree") and the
other module's ("other", loaded as ``workbench.kernels._lists_other``, so its relative imports
take the tree's modules: its own kernel with the tree's shared Gluon functions), and the dense
form of the recipe's P (``fp8_dense_kv_corrected`` with the recipe's p_scaling / row_sum /
p_exp) in the same interleaved rounds; rel-L2 against float64 on 64 evenly spaced rows; then a
torch-profiler view per tau with the tree's kernel (GPU time per call over 5 calls). Both
versions must take the launcher's current arguments (``fp8_attention_ws_lists``).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import workbench.kernels.attention_fp8_ws_lists as TREE  # noqa: E402
from workbench.attention import dense_attention_f64, evenly_spaced_rows  # noqa: E402
from workbench.bench.harness import env_info, interleaved_ms, kernel_profile  # noqa: E402
from workbench.kernels.dispatch import fp8_recipe_attention, sparse_routing  # noqa: E402
from workbench.recipes import get_recipe  # noqa: E402
from workbench.synthetic import H3_SYNTHETIC, synthetic_qkv  # noqa: E402

DEFAULT_RECIPE = ("fp8_sol_kv_corrected:p_scaling=exp2_offset8,row_sum=p_operand,"
                  "p_exp=log_linear,dense_prefix=false")


def load_other(path: str):
    """The other version of the list kernel module, as ``workbench.kernels._lists_other``."""
    if not Path(path).is_file():
        raise SystemExit(f"--other: {path} is not a file")
    spec = importlib.util.spec_from_file_location("workbench.kernels._lists_other", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--other", required=True, help="a copy of attention_fp8_ws_lists.py")
    p.add_argument("--taus", nargs="+", type=float, default=[1.247, 0.8009, 1.0, 0.3617,
                                                             -0.002272])
    p.add_argument("--recipe", default=DEFAULT_RECIPE, help="a Sol recipe (tau overridden)")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--rep-ms", type=int, default=150)
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    other = load_other(a.other)
    tree_fn = TREE.fp8_attention_ws_lists

    def use(version: str) -> None:  # the launcher looks the function up on the module per call
        TREE.fp8_attention_ws_lists = tree_fn if version == "tree" else other.fp8_attention_ws_lists

    base = get_recipe(a.recipe)
    if base.sparsity != "sol":
        raise SystemExit(f"--recipe: {a.recipe!r} is not a Sol recipe")
    recs = {"dense": get_recipe(f"fp8_dense_kv_corrected:p_scaling={base.p_scaling},"
                                f"row_sum={base.row_sum},p_exp={base.p_exp}")}
    for t in a.taus:
        recs[f"tau {t:g}"] = base.with_(sol_tau=t)
    syn = H3_SYNTHETIC
    q, k, v = (t.contiguous() for t in synthetic_qkv(syn, device="cuda"))
    idx = evenly_spaced_rows(q.shape[1], 64).cuda()
    ref, _ = dense_attention_f64(q, k, v, query_index=idx)
    fns, acc, dens = {}, {}, {}
    for name, r in recs.items():
        for version in (("tree",) if name == "dense" else ("tree", "other")):
            label = f"{name} / {version}"

            def fn(r=r, version=version):
                use(version)
                return fp8_recipe_attention(q, k, v, r, layout=syn.layout)

            out = fn()[:, idx].double()  # compile + warm + accuracy
            acc[label] = float((out - ref).norm() / ref.norm())
            fns[label] = fn
        if r.sparsity != "dense":
            dens[name] = sparse_routing(q, k, v, r, syn.layout, q.shape[-1] ** -0.5)[3].density
    times = interleaved_ms(fns, rounds=a.rounds, rep_ms=a.rep_ms)
    rows = [{"variant": lab, "median_ms": statistics.median(t), "min_ms": min(t),
             "max_ms": max(t), "rel_l2_f64": acc[lab],
             "exact_density": dens.get(lab.split(" / ")[0], 1.0)} for lab, t in times.items()]
    profs = {lab: kernel_profile(fn, n=5) for lab, fn in fns.items()
             if lab.endswith("/ tree") and not lab.startswith("dense")}
    use("tree")
    env = env_info()
    print(f"{env.get('device', 'no GPU')}, torch {env['torch']}, triton {env.get('triton')}, "
          f"CUDA {env.get('cuda')}, {env['date']}; S = {q.shape[1]}, {q.shape[2]} heads; "
          f"medians of {a.rounds} interleaved do_bench rounds")
    for lab, prof in profs.items():
        print(f"\n| kernel ({lab}, torch profiler) | ms per call |\n|---|---|")
        for r in prof[:12] + prof[-1:]:
            print(f"| {r['kernel'][:80]} | {r['ms_per_call']:.3f} |")
    print("\n| variant | exact density | median of rounds ms | min | max | rel-L2 vs f64 |\n"
          "|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['variant']} | {r['exact_density']:.4f} | {r['median_ms']:.3f} | "
              f"{r['min_ms']:.3f} | {r['max_ms']:.3f} | {r['rel_l2_f64']:.4e} |")
    if a.out:
        Path(a.out).mkdir(parents=True, exist_ok=True)
        Path(a.out, "lists_ab.json").write_text(json.dumps(
            {"env": env, "rows": rows, "rounds": times, "profiles": profs}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

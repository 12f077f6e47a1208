"""FP8 calls in groups of heads (``AttentionConfig.head_groups``) against one group (GPU): do the
memory-bound passes (statistics or routing, quantizer) of head group g + 1 hide beside the
attention of group g?

Per recipe: every (groups, priority) configuration timed in interleaved rounds (``do_bench``
medians), its output compared bit for bit with the one-group call, and the rel-L2 against
float64 on the sparse bench's 64 evenly spaced rows; NVIDIA's ``sol_attn`` (when it imports) at
the Sol recipes' tau as the anchor of the ratio column. Synthetic H3 input at the live shape.

    python3 scripts/gpu_head_groups.py [--groups 1 2 4 8] [--priorities same attention prep]
        [--recipes fp8_dense_kv_corrected ...] [--rounds 5] [--out DIR]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from workbench.attention import dense_attention_f64, evenly_spaced_rows  # noqa: E402
from workbench.bench.harness import env_info, interleaved_ms, kernel_profile  # noqa: E402
from workbench.bench.sparse import _rel_l2 as rel_l2  # noqa: E402
from workbench.bench.sparse import SparseBenchConfig, load_sol_attn  # noqa: E402
from workbench.bench.sparse import _inputs as sparse_inputs  # noqa: E402
from workbench.kernels import dispatch  # noqa: E402
from workbench.kernels.config import DEFAULT, HEAD_GROUP_PRIORITIES  # noqa: E402
from workbench.recipes import get_recipe  # noqa: E402

SOL_EXACT_PREFIX = ("fp8_sol_kv_corrected:dense_prefix=false,prefix_blocks_exact=true,"
                    "p_scaling=exp2_offset8,row_sum=p_operand")
RECIPES = ["fp8_dense_kv_corrected:row_sum=p_operand", SOL_EXACT_PREFIX,
           "fp8_sol_kv_corrected:dense_prefix=false,p_scaling=exp2_offset8,row_sum=p_operand",
           "fp8_sol_kv_corrected"]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--groups", type=int, nargs="+", default=[1, 2, 4, 8])
    p.add_argument("--priorities", nargs="+", default=list(HEAD_GROUP_PRIORITIES),
                   choices=HEAD_GROUP_PRIORITIES)
    p.add_argument("--recipes", nargs="+", default=RECIPES)
    p.add_argument("--heads", type=int, default=56)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--rep-ms", type=int, default=200)
    p.add_argument("--profile", action="store_true",
                   help="also print each recipe's fastest grouped call's kernels (torch profiler)")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    if 1 not in args.groups:
        p.error("--groups must include 1 (the reference of the bitwise check and the ratio)")
    recipes = [get_recipe(r) for r in args.recipes]
    if not torch.cuda.is_available():
        p.error("needs a CUDA GPU")
    q, k, v, layout = sparse_inputs(SparseBenchConfig(heads=args.heads))
    S, prefix = q.shape[1], layout.prefix_len
    idx = evenly_spaced_rows(S, 64).to(q.device)
    ref64, _ = dense_attention_f64(q, k, v, query_index=idx)
    sol_attn, why = load_sol_attn()
    print(f"NVIDIA sol_attn: {why or 'loaded'}", flush=True)
    rows = []
    for name, recipe in zip(args.recipes, recipes):
        configs = {"1 group": DEFAULT}
        for g in sorted(set(args.groups) - {1}):
            for prio in args.priorities:
                configs[f"{g} groups, {prio}"] = DEFAULT.with_attention(
                    head_groups=g, head_group_priority=prio)
        calls = {label: (lambda c=c: dispatch.fp8_recipe_attention(q, k, v, recipe,
                                                                  layout=layout, config=c))
                 for label, c in configs.items()}
        if sol_attn is not None and recipe.sparsity == "sol":
            calls["NVIDIA sol_attn (CuTe, BF16)"] = lambda tau=recipe.sol_tau: sol_attn(
                q, k, v, tau=tau, thresh_type="exact", sink_start=0, sink_tokens=prefix,
                kv_splits=1)
        base = calls["1 group"]()
        checks = {}
        for label, fn in calls.items():
            out = fn()
            checks[label] = (torch.equal(out, base) if label in configs else None,
                             rel_l2(out[:, idx], ref64))
            del out
        del base
        times = interleaved_ms(calls, rounds=args.rounds, rep_ms=args.rep_ms)
        for label, t in times.items():
            row = dict(recipe=name, variant=label, ms=statistics.median(t), lo=min(t),
                       hi=max(t), bitwise=checks[label][0], rel_l2_64=checks[label][1])
            rows.append(row)
            print(json.dumps(row), flush=True)
        if args.profile:
            best = min((r for r in rows if r["recipe"] == name and r["variant"] in configs
                        and r["variant"] != "1 group"), key=lambda r: r["ms"])
            for label in ("1 group", best["variant"]):
                print(f"profile [{name}] {label}:", flush=True)
                for kr in kernel_profile(calls[label]):
                    print(f"  {kr['ms_per_call']:.3f} ms  {kr['kernel'][:90]}", flush=True)
        torch.cuda.empty_cache()
    env = env_info()
    lines = [f"{env.get('device')}, torch {env['torch']}, triton {env.get('triton')}, "
             f"{env['date']}; S = {S}, {args.heads} heads; medians of {args.rounds} interleaved "
             "do_bench rounds", "",
             "| recipe | variant | ms (range) | x 1 group | x NVIDIA | bitwise = 1 group "
             "| rel-L2 vs f64, 64 rows |", "|---|---|---|---|---|---|---|"]
    for r in rows:
        one = next(x["ms"] for x in rows if x["recipe"] == r["recipe"]
                   and x["variant"] == "1 group")
        nv = [x["ms"] for x in rows if x["recipe"] == r["recipe"]
              and x["variant"].startswith("NVIDIA")]
        lines.append(f"| `{r['recipe']}` | {r['variant']} | {r['ms']:.3f} ({r['lo']:.3f}-"
                     f"{r['hi']:.3f}) | {one / r['ms']:.3f} | "
                     f"{nv[0] / r['ms']:.2f} |" if nv else
                     f"| `{r['recipe']}` | {r['variant']} | {r['ms']:.3f} ({r['lo']:.3f}-"
                     f"{r['hi']:.3f}) | {one / r['ms']:.3f} | |")
        lines[-1] += f" {'' if r['bitwise'] is None else r['bitwise']} | {r['rel_l2_64']:.3e} |"
    md = "\n".join(lines)
    print(md)
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        Path(args.out, "head_groups.md").write_text(md + "\n")
        Path(args.out, "head_groups.json").write_text(json.dumps({"env": env, "rows": rows},
                                                                indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""FP8 Sol with and without its dense BF16 prefix rows, beside NVIDIA's ``sol_attn`` (GPU): what
the prefix rows cost and what they buy.

``fp8_sol_kv_corrected`` recomputes the prefix query rows (text, audio) densely in BF16
(``dense_prefix=True``); NVIDIA's kernel takes the sink as key blocks that every query attends
exactly and routes the sink's own query rows like the others, which is this recipe with
``dense_prefix=false``. A third form keeps the prefix rows exact without the BF16 pass: the
query blocks holding them take every key block on the FP8 loop (``prefix_blocks_exact=true``).
Per tau: the calls timed in interleaved rounds (``do_bench`` medians), and their rel-L2 against
float64 on the 64 evenly spaced rows of the sparse bench and on every prefix row. Synthetic H3
input at the live shape (or the sparse bench's small layout at ``--seq-len``).

    python3 scripts/gpu_sol_prefix.py [--taus 1 1.247 0.3617] [--rounds 5] [--seq-len N]
        [--recipes fp8_sol_kv_corrected fp8_sol_kv_corrected:row_sum=p_operand] [--out DIR]

``--recipes``: the base recipes whose three prefix forms are timed (default the preset); the
all-in-the-list-kernel form is timed for the first only.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from workbench.attention import dense_attention_f64, evenly_spaced_rows  # noqa: E402
from workbench.attention.runner import run_attention  # noqa: E402
from workbench.bench.harness import env_info, interleaved_ms  # noqa: E402
from workbench.bench.sparse import _rel_l2 as rel_l2  # noqa: E402
from workbench.bench.sparse import SparseBenchConfig, load_sol_attn  # noqa: E402
from workbench.bench.sparse import _inputs as sparse_inputs  # noqa: E402
from workbench.kernels import dispatch  # noqa: E402
from workbench.kernels.config import DEFAULT  # noqa: E402
from workbench.recipes import get_recipe  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--taus", type=float, nargs="+", default=[1.0, 1.247, 0.3617])
    p.add_argument("--heads", type=int, default=56)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--rep-ms", type=int, default=200)
    p.add_argument("--seq-len", type=int, default=None,
                   help="the sparse bench's small synthetic layout at this length (default: H3)")
    p.add_argument("--recipes", nargs="+", default=["fp8_sol_kv_corrected"],
                   help="base Sol recipes (each with dense_prefix=true, as the preset)")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    for name in args.recipes:
        r = get_recipe(name)
        if r.sparsity != "sol" or not r.dense_prefix:
            p.error(f"--recipes {name!r}: a Sol recipe with dense_prefix=true (got sparsity="
                    f"{r.sparsity!r}, dense_prefix={r.dense_prefix})")
    if not torch.cuda.is_available():
        p.error("needs a CUDA GPU")
    q, k, v, layout = sparse_inputs(SparseBenchConfig(heads=args.heads, seq_len=args.seq_len))
    S, prefix, D = q.shape[1], layout.prefix_len, q.shape[-1]
    idx = evenly_spaced_rows(S, 64).to(q.device)
    pidx = torch.arange(prefix, device=q.device)
    ref64, _ = dense_attention_f64(q, k, v, query_index=idx)
    refp, _ = dense_attention_f64(q, k, v, query_index=pidx)
    sol_attn, why = load_sol_attn()
    print(f"prefix rows {prefix}; 64 sampled rows of which {int((idx < prefix).sum())} prefix; "
          f"NVIDIA sol_attn: {why or 'loaded'}", flush=True)
    rows = []
    for tau in args.taus:
        bases = [get_recipe(name).with_(sol_tau=tau) for name in args.recipes]
        fns = {}
        for name, base in zip(args.recipes, bases):
            tag = "" if len(bases) == 1 else f" [{name}]"
            fns[f"ours, dense BF16 prefix rows{tag}"] = base
            fns[f"ours, prefix rows routed (dense_prefix=false){tag}"] = base.with_(
                dense_prefix=False)
            fns[f"ours, prefix blocks exact in FP8 (prefix_blocks_exact=true){tag}"] = \
                base.with_(dense_prefix=False, prefix_blocks_exact=True)
        calls = {label: (lambda r=r: run_attention(q, k, v, r, layout=layout, backend="kernel"))
                 for label, r in fns.items()}
        # the same rows all in the list kernel (SparseConfig.dense_rows_kernel=False), first
        # recipe only
        lists_only = replace(DEFAULT, sparse=replace(DEFAULT.sparse, dense_rows_kernel=False))
        tag = "" if len(bases) == 1 else f" [{args.recipes[0]}]"
        calls[f"ours, prefix blocks exact, list kernel only{tag}"] = (
            lambda r=bases[0].with_(dense_prefix=False, prefix_blocks_exact=True):
            dispatch.fp8_recipe_attention(q, k, v, r, layout=layout, config=lists_only))
        if sol_attn is not None:
            calls["NVIDIA sol_attn (CuTe, BF16)"] = lambda tau=tau: sol_attn(
                q, k, v, tau=tau, thresh_type="exact", sink_start=0, sink_tokens=prefix,
                kv_splits=1)
        density = dispatch.sparse_routing(q, k, v, bases[0], layout, D ** -0.5)[3].density
        errs = {}
        for label, fn in calls.items():
            out = fn()
            errs[label] = (rel_l2(out[:, idx], ref64), rel_l2(out[:, :prefix], refp))
            del out
        times = interleaved_ms(calls, rounds=args.rounds, rep_ms=args.rep_ms)
        for label, t in times.items():
            row = dict(tau=tau, density=density, variant=label, ms=statistics.median(t),
                       lo=min(t), hi=max(t), rel_l2_64=errs[label][0],
                       rel_l2_prefix=errs[label][1])
            rows.append(row)
            print(json.dumps(row), flush=True)
        torch.cuda.empty_cache()
    env = env_info()
    nv = {r["tau"]: r["ms"] for r in rows if r["variant"].startswith("NVIDIA")}
    lines = [f"{env.get('device')}, torch {env['torch']}, triton {env.get('triton')}, "
             f"{env['date']}; S = {S}, {args.heads} heads; medians of {args.rounds} interleaved "
             "do_bench rounds", "",
             "| Sol tau (exact density) | variant | ms (range) | x NVIDIA | rel-L2 vs f64, 64 rows "
             f"| rel-L2 vs f64, the {prefix} prefix rows |", "|---|---|---|---|---|---|"]
    for r in rows:
        x = f"{nv[r['tau']] / r['ms']:.2f}" if r["tau"] in nv else ""
        lines.append(f"| {r['tau']:.4g} ({r['density']:.4f}) | {r['variant']} | {r['ms']:.3f} "
                     f"({r['lo']:.3f}-{r['hi']:.3f}) | {x} | {r['rel_l2_64']:.3e} "
                     f"| {r['rel_l2_prefix']:.3e} |")
    md = "\n".join(lines)
    print(md)
    if args.out:
        Path(args.out).mkdir(parents=True, exist_ok=True)
        tag = f"_{S}" if args.seq_len else ""
        Path(args.out, f"sol_prefix{tag}.md").write_text(md + "\n")
        Path(args.out, f"sol_prefix{tag}.json").write_text(json.dumps({"env": env, "rows": rows},
                                                                      indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())

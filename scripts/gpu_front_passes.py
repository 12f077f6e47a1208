"""Launch shapes of a sparse Sol call's front passes at the synthetic H3 shape (GPU): Q's codes
with and without its block sums by warps, the block sums with and without Q, Sol's front (its
statistics and row launches) by channels / rows / parts, and the list kernel's query order.

    python3 scripts/gpu_front_passes.py [--rep-ms 200] [--out DIR]

Every time is a ``harness.median_ms`` (``do_bench`` median, L2 flushed between calls).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402

from workbench.bench.harness import env_info, median_ms  # noqa: E402
from workbench.kernels import routing  # noqa: E402
from workbench.kernels.attention_fp8_ws_lists import query_order  # noqa: E402
from workbench.kernels.config import QuantConfig, RoutingConfig  # noqa: E402
from workbench.kernels.quantize import quantize_tokens  # noqa: E402
from workbench.recipes import get_recipe  # noqa: E402
from workbench.synthetic import H3_SYNTHETIC, synthetic_qkv  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rep-ms", type=int, default=200)
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    syn = H3_SYNTHETIC
    q, k, v = (t.contiguous() for t in synthetic_qkv(syn, device="cuda"))
    B, S, H, D = q.shape
    nb = -(-S // 64)
    rows = []

    def t(what, fn):
        fn()
        torch.cuda.synchronize()
        rows.append({"what": what, "ms": median_ms(fn, rep_ms=a.rep_ms)})
        print(f"| {what} | {rows[-1]['ms']:.4f} |", flush=True)

    print("| pass | ms |\n|---|---|")
    t("Q codes (qk_warps 8)", lambda: quantize_tokens(q))
    qsum = torch.empty((B, H, nb, D), dtype=torch.float32, device="cuda")
    for w in (2, 4, 8, 16):
        cfg = QuantConfig(q_sums_warps=w)
        t(f"Q codes + block sums, {w} warps", lambda c=cfg: quantize_tokens(q, config=c,
                                                                           sums=qsum))
    t("block sums Q, K, V (+ V extremes)", lambda: routing.block_sums(q, k, v, minmax=True))
    t("block sums K, V + Q codes with Q's sums",
      lambda: routing.block_sums(q, k, v, minmax=True, q_codes=QuantConfig()))
    sums = routing.block_sums(q, k, v, minmax=True)
    rec = get_recipe("fp8_sol_kv_loglinear").with_(sol_tau=1.247)
    scale = D**-0.5
    for ch, r, parts in ((32, 32, 4), (16, 32, 4), (8, 32, 4), (64, 32, 4), (16, 64, 4),
                         (8, 64, 4), (16, 16, 4), (16, 32, 2), (16, 32, 8)):
        t(f"Sol front: {ch} channels, {r} rows, {parts} parts, with tiles",
          lambda ch=ch, r=r, parts=parts: routing.sol_front(sums, rec, scale, rows=r,
                                                            parts=parts, channels=ch,
                                                            tiles=True))
    route = routing.sol_routing_fused(sums, rec, layout=syn.layout,
                                      config=RoutingConfig(), tiles=True)[3]
    t("query order by length", lambda: query_order(route.counts, "by_length"))
    t("query order, torch stable argsort",
      lambda: torch.argsort(route.counts.reshape(-1, nb), dim=1, descending=True,
                            stable=True).to(torch.int32))
    assert torch.equal(query_order(route.counts, "by_length").long(),
                       torch.argsort(route.counts.reshape(-1, nb), dim=1, descending=True,
                                     stable=True))
    env = env_info()
    print(f"\n{env.get('device')}, torch {env['torch']}, triton {env.get('triton')}, "
          f"{env['date']}; S = {S}, {H} heads; do_bench medians")
    if a.out:
        Path(a.out).mkdir(parents=True, exist_ok=True)
        Path(a.out, "front_passes.json").write_text(json.dumps({"env": env, "rows": rows},
                                                               indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Launch shapes of a sparse Sol call's front passes at the synthetic H3 shape (GPU): Q's codes
with and without its block sums by warps, the block sums with and without Q, Sol's front (its
statistics and row launches) by channels / rows / parts, the list kernel's query order, and the
byte floor of the passes: a plain read of one BF16 operand, its conversion to E4M3 without
scales, a read of its E4M3 codes (the most any pass over that many bytes could reach here).

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
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from workbench.bench.harness import env_info, median_ms  # noqa: E402
from workbench.kernels import routing  # noqa: E402
from workbench.kernels.attention_fp8_ws_lists import query_order  # noqa: E402
from workbench.kernels.config import QuantConfig, RoutingConfig  # noqa: E402
from workbench.kernels.quantize import quantize_tokens  # noqa: E402
from workbench.recipes import get_recipe  # noqa: E402
from workbench.synthetic import H3_SYNTHETIC, synthetic_qkv  # noqa: E402


@triton.jit
def _read_kernel(X, OUT, N, BLOCK: tl.constexpr, STEPS: tl.constexpr):
    """Sum of STEPS x BLOCK consecutive elements per program: a read with nothing else to do."""
    base = tl.program_id(0) * (BLOCK * STEPS)
    acc = tl.zeros([BLOCK], tl.float32)
    for i in range(STEPS):
        o = base + i * BLOCK + tl.arange(0, BLOCK)
        acc += tl.load(X + o, mask=o < N, other=0.0).to(tl.float32)
    tl.store(OUT + tl.program_id(0), tl.sum(acc))


@triton.jit
def _convert_kernel(X, Y, N, BLOCK: tl.constexpr):
    """Y = E4M3(X) elementwise, no scale: the bytes of a quantizer pass and nothing else."""
    o = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    x = tl.load(X + o, mask=o < N, other=0.0)
    tl.store(Y + o, x.to(tl.float32).to(tl.float8e4nv), mask=o < N)


def byte_floor(x: torch.Tensor, t) -> dict:
    """The best of a few launch shapes for a read of x (BF16), its E4M3 conversion and a read
    of the E4M3 codes; t(what, fn) times one and returns its ms -> {kind: best ms}."""
    n = x.numel()
    x8 = torch.empty(x.shape, dtype=torch.float8_e4m3fn, device=x.device)
    ms = {"BF16 read": [], "E4M3 read": [], "conversion": []}
    for kind, src in (("BF16 read", x), ("E4M3 read", x8)):
        for block, steps in ((2048, 8), (4096, 8), (8192, 4)):
            part = torch.empty(triton.cdiv(n, block * steps), dtype=torch.float32,
                               device=x.device)
            ms[kind].append(t(
                f"byte floor: {kind} of {n * src.element_size() / 1e6:.0f} MB, {block} x {steps}",
                lambda src=src, part=part, b=block, st=steps: _read_kernel[(part.numel(),)](
                    src, part, n, BLOCK=b, STEPS=st, num_warps=8)))
    for block in (2048, 4096, 8192):
        ms["conversion"].append(t(
            f"byte floor: BF16 -> E4M3 conversion, {block} per program",
            lambda b=block: _convert_kernel[(triton.cdiv(n, b),)](x, x8, n, BLOCK=b,
                                                                   num_warps=8)))
    ms["conversion"].append(t("byte floor: BF16 -> E4M3 conversion, torch",
                              lambda: x8.copy_(x)))
    return {kind: min(v) for kind, v in ms.items()}


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
        return rows[-1]["ms"]

    print("| pass | ms |\n|---|---|")
    floor = byte_floor(q, t)
    # what an FP8 call's passes must move at least: Q, K, V each converted once, K and V read
    # once more before (their means and V's extremes precede their centred codes), V's codes
    # read once for the correction
    need = 3 * floor["conversion"] + 2 * floor["BF16 read"] + floor["E4M3 read"]
    rows.append({"what": "byte floor of an FP8 call's passes", "ms": need})
    print(f"| byte floor of an FP8 call's passes (3 conversions + 2 BF16 reads + 1 E4M3 read) | "
          f"{need:.4f} |", flush=True)
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

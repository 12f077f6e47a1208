"""How much of a scan number is rounding noise: each entry evaluated as captured and with every
K / V value moved by one FP32 ulp (up or down at random, seeded), metric by metric.

Two scans of the same capture on different devices (CPU, CUDA) are not bitwise equal: their FP32
reductions and matmuls round differently, so the smoothing means, the scores and Sol's block
scores differ in their last bits. (The CPU's thread count does not change the recipes' outputs,
only the float64 metrics in their last bits.) A one-ulp nudge of K and V is a change of that
size, so the relative changes it causes say which numbers two such scans can disagree on: the
near-zero ones (the V-mean error of V-bias-corrected recipes is rounding noise by construction)
and Sol's (a key block whose score sits at the threshold flips between exact and summary, and
its query block's rows change by far more than an ulp). The nudge overstates one thing: BF16
values of an unsmoothed operand often land exactly halfway between two E4M3 codes, and a nudge
breaks those ties, which two devices would round alike (that operand's scale is an exact max).

    python scripts/scan_noise.py                          # shipped h3-nano, three entries
    python scripts/scan_noise.py STORE --entries 8:2,7:1 --recipes fp8_sol_kv_corrected --top 20

Prints, per (entry, recipe), the largest relative change of a row's squared error, then the
metrics that moved most over all entries (markdown).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from workbench.capture import open_capture  # noqa: E402
from workbench.evaluate.scan import scan_task  # noqa: E402
from workbench.evaluate.scan_store import METRIC_NAMES, store_fingerprint  # noqa: E402

STORE = ROOT / "captures" / "demo_h3_nano.zarr"


def nudged(t: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """t as FP32 with every value moved one ulp up or down (seeded coin per value)."""
    t = t.float()
    up = torch.rand(t.shape, generator=gen) < 0.5
    return torch.nextafter(t, torch.where(up, torch.tensor(np.inf), torch.tensor(-np.inf)))


def entry_inputs(cap, step: int, layer: int, gen: torch.Generator):
    """(q, k, v as captured, q with k, v nudged) of one entry, FP32 numpy: one nudge per entry,
    shared by its recipes."""
    q, k, v = cap.qkv(step, layer)  # every captured head
    base = tuple(t.float().numpy() for t in (q, k, v))
    return base, (base[0], nudged(k, gen).numpy(), nudged(v, gen).numpy())


def entry_records(cap, step: int, layer: int, spec: str, n_queries: int, inputs, tag: str):
    """(scan record as captured, scan record nudged) of one entry and recipe; inputs from
    ``entry_inputs``; tag: names this capture and nudge in the scan task's tensor cache."""
    heads = [int(h) for h in cap.root[cap.find(step, layer).path].attrs["q_heads"]]
    call = cap.attention_call()  # how the capture's model attends, as the scan uses it
    common = dict(step=step, layer=layer, captured_heads=heads, heads=heads, spec=spec,
                  layout=cap.layout.to_dict(), rotated=cap.rotated_channels,
                  n_queries=n_queries, dense_policy=False, causal=bool(call["causal"]),
                  scale=call["scale"], device="cpu")
    # scan_task caches an entry's tensors by (store id, step, layer, ...): the two inputs need
    # ids of their own, and another capture or seed other ids again
    return (scan_task(inputs[0], store_id=f"{tag}-captured", **common),
            scan_task(inputs[1], store_id=f"{tag}-nudged", **common))


def noise(store, entries, recipes, *, n_queries: int = 32, seed: int = 0):
    """(rows, worst): rows = [(step, layer, recipe, largest relative change of a row's squared
    error, that row's error, the median row's)], worst = {(recipe, metric): (largest relative
    change over the entries, captured value, nudged value, step, layer)}."""
    cap = open_capture(store)
    tag = f"{store_fingerprint(cap)}-seed{seed}"
    gen = torch.Generator().manual_seed(seed)
    rows, worst = [], {}
    for step, layer in entries:
        inputs = entry_inputs(cap, step, layer, gen)
        for spec in recipes:
            r0, r1 = entry_records(cap, step, layer, spec, n_queries, inputs, tag)
            e0, e1 = r0["entry"], r1["entry"]
            for i, m in enumerate(METRIC_NAMES):
                if m == "seconds" or not np.isfinite(e0[i]):
                    continue
                rel = abs(e1[i] - e0[i]) / max(abs(e0[i]), 1e-300)
                if rel >= worst.get((spec, m), (-1.0,))[0]:
                    worst[(spec, m)] = (rel, e0[i], e1[i], step, layer)
            err0, err1 = r0["row"], r1["row"]
            rr = np.abs(err1 - err0) / np.maximum(err0, 1e-300)
            j = int(np.argmax(rr))
            rows.append((step, layer, spec, float(rr[j]), float(err0[j]),
                         float(np.median(err0))))
    return rows, worst


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("store", nargs="?", default=str(STORE), help="capture store (h3-nano's)")
    p.add_argument("--entries", default="8:2,7:1,3:0", help="step:layer list (8:2,7:1,3:0)")
    p.add_argument("--recipes", default="fp8_sol_unsmoothed,fp8_sol_kv_corrected,fp8_dense_k")
    p.add_argument("--queries", type=int, default=32, help="evenly spaced query rows (32)")
    p.add_argument("--top", type=int, default=12, help="metrics listed (12)")
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    try:
        entries = [tuple(int(x) for x in e.split(":")) for e in a.entries.split(",")]
        if any(len(e) != 2 for e in entries):
            raise ValueError
    except ValueError:
        p.error(f"--entries: {a.entries!r} is not a step:layer list such as 8:2,7:1")
    rows, worst = noise(a.store, entries, a.recipes.split(","), n_queries=a.queries,
                        seed=a.seed)
    print("| entry | recipe | largest row change (rel) | that row's squared error | median row's |")
    print("|---|---|---:|---:|---:|")
    for step, layer, spec, rel, err, med in rows:
        print(f"| ({step}, {layer}) | {spec} | {rel:.2e} | {err:.2e} | {med:.2e} |")
    print("\n| recipe | metric | largest change (rel) | captured | nudged | entry |")
    print("|---|---|---:|---:|---:|---|")
    for (spec, m), (rel, x0, x1, st, la) in sorted(worst.items(), key=lambda x: -x[1][0])[:a.top]:
        print(f"| {spec} | {m} | {rel:.2e} | {x0:.4e} | {x1:.4e} | ({st}, {la}) |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

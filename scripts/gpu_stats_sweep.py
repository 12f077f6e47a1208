"""ONE GPU call: sweep the K/V statistics kernel's layouts at the H3 shape, then run the GPU
kernel tests with the fastest deterministic, correct config installed as the default.

    set -o pipefail; PYTHONUNBUFFERED=1 python scripts/gpu_stats_sweep.py 2>&1 | tee $OUT/log.txt

Bandwidth = bytes of K and V read once / time, against the device-to-device copy rate (bytes read
+ written) measured in the same run. Writes $OUT/stats_sweep.json; prints a short table last.
"""

from __future__ import annotations

import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
OUT = os.environ.get("OUT", "/tmp/gpu_stats_out")
os.makedirs(OUT, exist_ok=True)

import torch  # noqa: E402

from workbench.bench.harness import copy_bandwidth_tbs, env_info, median_ms  # noqa: E402
from workbench.kernels import kv_stats as ks  # noqa: E402

CONFIGS = [  # (layout, rows, sub, cols, warps); "head" ignores cols and uses STATS_* names
    ("head", 16, 32, 0, 4),
    ("wide", 8, 64, 512, 4),
    ("wide", 16, 32, 512, 8),
    ("wide", 8, 32, 1024, 8),
    ("wide", 16, 16, 256, 4),
    ("wide", 32, 16, 256, 8),
    ("wide", 4, 128, 512, 4),
    ("wide", 16, 64, 512, 8),
    ("wide", 8, 64, 1024, 8),
]


def install(cfg):
    layout, rows, sub, cols, warps = cfg
    ks.STATS_LAYOUT = layout
    if layout == "head":
        ks.STATS_ROWS, ks.STATS_SUB, ks.STATS_WARPS = rows, sub, warps
    else:
        ks.WIDE_ROWS, ks.WIDE_SUB, ks.WIDE_COLS, ks.WIDE_WARPS = rows, sub, cols, warps


def main() -> int:
    t0 = time.time()
    B, S, H, D = 1, 32626, 56, 128
    g = torch.Generator(device="cuda").manual_seed(0)
    bias = torch.randn(H, D, device="cuda", generator=g)
    k = (torch.randn(B, S, H, D, device="cuda", generator=g) + 3 * bias).bfloat16()
    v = (torch.randn(B, S, H, D, device="cuda", generator=g) + 2 * bias).bfloat16()
    nbytes = 2 * k.numel() * k.element_size()
    mu_k_ref = k.double().mean(1)
    mu_v_ref = v.double().mean(1)
    copy = copy_bandwidth_tbs()
    print(f"[{time.time() - t0:5.1f}s] copy {copy:.2f} TB/s", flush=True)
    rows = []
    for cfg in CONFIGS:
        install(cfg)
        try:
            runs = [ks.kv_stats(k, v, smooth_k=True, smooth_v=True) for _ in range(3)]
            det = all(torch.equal(r.mu_k, runs[0].mu_k) and torch.equal(r.mu_v, runs[0].mu_v)
                      and torch.equal(r.v_amax, runs[0].v_amax) for r in runs[1:])
            err = max(float((runs[0].mu_k - mu_k_ref).abs().max()),
                      float((runs[0].mu_v - mu_v_ref).abs().max()))
            amax_ok = torch.equal(runs[0].v_amax,
                                  (v.float() - runs[0].mu_v[:, None]).abs().amax(1))
            ms = [median_ms(lambda: ks.kv_stats(k, v, smooth_k=True, smooth_v=True), rep_ms=200)
                  for _ in range(2)]
            tbs = nbytes / (min(ms) * 1e-3) / 1e12
            row = dict(cfg=list(cfg), ms=ms, tbs=tbs, pct_copy=tbs / copy, deterministic=det,
                       max_mu_err=err, v_amax_exact=amax_ok)
        except Exception as exc:  # noqa: BLE001
            row = dict(cfg=list(cfg), error=f"{type(exc).__name__}: {str(exc)[:200]}")
        rows.append(row)
        print(f"[{time.time() - t0:5.1f}s] {row}", flush=True)
    good = [r for r in rows if "tbs" in r and r["deterministic"] and r["v_amax_exact"]
            and r["max_mu_err"] < 1e-4]
    best = max(good, key=lambda r: r["tbs"])
    install(tuple(best["cfg"]))
    print(f"[{time.time() - t0:5.1f}s] best {best['cfg']}: running GPU kernel tests with it",
          flush=True)
    import pytest

    rc = pytest.main(["-q", "-p", "no:cacheprovider", os.path.join(ROOT, "tests",
                                                                   "test_kernels_gpu.py")])
    result = dict(env=env_info(), copy_tbs=copy, rows=rows, best=best["cfg"], pytest_rc=int(rc),
                  shape=[B, S, H, D])
    with open(os.path.join(OUT, "stats_sweep.json"), "w") as f:
        json.dump(result, f, indent=1)
    print("\n| layout | rows | sub | cols | warps | ms (2 runs) | TB/s read | % of copy | det |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        c = r["cfg"]
        if "tbs" in r:
            print(f"| {c[0]} | {c[1]} | {c[2]} | {c[3]} | {c[4]} | {r['ms'][0]:.3f} / "
                  f"{r['ms'][1]:.3f} | {r['tbs']:.2f} | {100 * r['pct_copy']:.0f}% | "
                  f"{r['deterministic']} |")
        else:
            print(f"| {c[0]} | {c[1]} | {c[2]} | {c[3]} | {c[4]} | failed: {r['error'][:60]} |")
    print(f"copy {copy:.2f} TB/s; best {best['cfg']}; GPU tests rc {int(rc)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

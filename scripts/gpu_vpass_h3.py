"""ONE short GPU call: V-pass tile shapes of the quantizer, then the full call at the H3 shape.

    set -o pipefail; PYTHONUNBUFFERED=1 python scripts/gpu_vpass_h3.py 2>&1 | tee $OUT/log.txt

Why: at (1, 32626, 56, 128) the V pass takes ~0.83 ms of the 1.26 ms quantizer while the Q pass
moves the same bytes in 0.21 ms; every measured config with 2+ sub-tiles per program was slower
the more sub-tiles it had, and ptxas spills the 128x2 default (255 registers + 1 KB). This times
one-sub-tile programs (no spills: 89-241 registers), checks every config's codes against explicit
rounding on the same data (values must be equal), keeps the fastest for the side-by-side rows of
SDPA-cuDNN and fp8_dense_kv_corrected at the H3 shape, and prints a short table last.
"""

from __future__ import annotations

import json
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
OUT = os.environ.get("OUT", "/tmp/gpu_vpass_out")
os.makedirs(OUT, exist_ok=True)

import torch  # noqa: E402

T0 = time.time()

# (V_TRANS_STORE, V_ROWS, V_SUB, V_WARPS); the first is the committed default
V_CFGS = [(1, 128, 2, 8), (1, 128, 1, 8), (1, 64, 1, 4), (1, 64, 1, 8), (1, 128, 1, 16),
          (2, 64, 1, 4), (2, 128, 1, 8)]


def log(*a):
    print(f"[{time.time() - T0:6.1f}s]", *a, flush=True)


def main():
    from workbench.bench.attention import make_inputs, side_by_side
    from workbench.bench.harness import env_info, median_ms
    from workbench.kernels import quantize as qz
    from workbench.kernels.kv_stats import kv_stats

    log("device", torch.cuda.get_device_name(0), "torch", torch.__version__)
    B, S, H, D = 1, 32626, 56, 128
    q, k, v = make_inputs(B, S, H, D, n_sets=1, seed=1)[0]
    st = kv_stats(k, v, smooth_k=True, smooth_v=True)
    data = {"args": (q, k, v, st.mu_k, st.mu_v, st.v_amax)}
    del q, k, v, st

    def quant():
        return qz.quantize_qkv(*data["args"], smooth_k=True, smooth_v=True,
                               v_bias_correction=True)

    default = (qz.V_TRANS_STORE, qz.V_ROWS, qz.V_SUB, qz.V_WARPS, qz.HW_ROUND)
    qz.HW_ROUND = False  # the explicit rounding is the reference for the codes
    ref = quant()
    qz.HW_ROUND = default[4]
    rows, best = [], None
    for cfg in V_CFGS:
        qz.V_TRANS_STORE, qz.V_ROWS, qz.V_SUB, qz.V_WARPS = cfg
        try:
            a = quant()
            n_val = sum(int((getattr(a, n).float() != getattr(ref, n).float()).sum())
                        for n in ("q8", "k8", "v8t"))
            n_val += int((~torch.isclose(a.v_corr, ref.v_corr, rtol=1e-6, atol=1e-7)).sum())
            ms = [median_ms(quant, rep_ms=100) for _ in range(2)]
            rows.append(dict(cfg=cfg, ms=ms, value_mismatch=n_val))
            log(f"quant V trans{cfg[0]} rows{cfg[1]} sub{cfg[2]} w{cfg[3]}: {ms[0]:.3f} "
                f"{ms[1]:.3f} ms, values differing from explicit rounding: {n_val}")
            if n_val == 0 and (best is None or min(ms) < best[0]):
                best = (min(ms), cfg)
        except Exception as exc:  # noqa: BLE001 - a config may not compile: report, go on
            rows.append(dict(cfg=cfg, error=f"{type(exc).__name__}: {exc}"[:300]))
            log(f"quant V {cfg} FAILED {type(exc).__name__}: {str(exc)[:200]}")
    qz.V_TRANS_STORE, qz.V_ROWS, qz.V_SUB, qz.V_WARPS = best[1] if best else default[:4]
    log(f"V pass for the side by side: {qz.V_TRANS_STORE, qz.V_ROWS, qz.V_SUB, qz.V_WARPS}")
    data.clear()
    del ref
    torch.cuda.empty_cache()
    res = side_by_side(B, S, H, D, recipes=["fp8_dense_kv_corrected"], emulate=False, rep_ms=400,
                       log=log)
    with open(os.path.join(OUT, "vpass.json"), "w") as f:
        json.dump({"env": env_info(), "quant": rows, "chosen": best, "rows": res}, f, indent=1,
                  default=str)
    print("\n== summary ==")
    for r in rows:
        print("  quant", r)
    base = next(r["ms"] for r in res if r["variant"] == "sdpa_cudnn")
    for r in res:
        print(f"  {r['variant']:24s} {r['mode']:6s} {r['ms']:8.3f} ms x{base / r['ms']:.3f} "
              f"relL2 {r['rel_l2']:.3e}")
    log("done")


if __name__ == "__main__":
    main()

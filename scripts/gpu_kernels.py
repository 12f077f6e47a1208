"""ONE GPU call that checks and times the FP8 attention kernels (issue 6).

    set -o pipefail; PYTHONUNBUFFERED=1 python scripts/gpu_kernels.py 2>&1 | tee $OUT/log.txt

1. GPU tests (tests/test_kernels_gpu.py) -> $OUT/pytest.txt
2. attention-kernel config sweep at the H3 shape (1, 32626, 56, 128), fp8_dense_kv_corrected:
   tile shape, warps, stages, max_num_imprecise_acc (128 vs 0 = full precision), explicit P rounding
   vs the hardware cast, TMA descriptors; each with its accuracy vs float64 on 64 rows; the fastest
   128-imprecise config with the same accuracy becomes dispatch.TUNING for step 3
3. side by side (workbench bench): ceilings, SDPA cuDNN/flash, cuDNN FP8, ours at 4 shapes
   -> $OUT/bench.json, $OUT/bench.md
Prints a short table last. Env: SHAPES="1,8192,56,128 ..." overrides the shapes; SKIP_TESTS=1.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
OUT = os.environ.get("OUT", "/tmp/gpu_kernels_out")
os.makedirs(OUT, exist_ok=True)

import torch  # noqa: E402

T0 = time.time()


def log(*a):
    print(f"[{time.time() - T0:6.1f}s]", *a, flush=True)


def run_tests():
    if os.environ.get("SKIP_TESTS"):
        return "skipped"
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
           "tests/test_kernels_gpu.py"]
    try:
        p = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=240)
        text = p.stdout + p.stderr
    except subprocess.TimeoutExpired as exc:
        text = f"TIMEOUT\n{exc.stdout or ''}"
    with open(os.path.join(OUT, "pytest.txt"), "w") as f:
        f.write(text)
    tail = [ln for ln in text.strip().splitlines() if ln.strip()][-12:]
    log("pytest:\n" + "\n".join(tail))
    return tail[-1] if tail else "?"


def sweep():
    from workbench.attention import dense_attention_f64, evenly_spaced_rows
    from workbench.bench.attention import make_inputs
    from workbench.bench.harness import median_ms
    from workbench.kernels import dispatch
    from workbench.kernels.attention_fp8 import fp8_attention_fwd
    from workbench.kernels.kv_stats import kv_stats
    from workbench.kernels.quantize import quantize_qkv

    B, S, H, D = 1, 32626, 56, 128
    sets = make_inputs(B, S, H, D, n_sets=2, seed=1)
    qkvs = []
    for q, k, v in sets:
        st = kv_stats(k, v, smooth_k=True, smooth_v=True)
        qkvs.append(quantize_qkv(q, k, v, st.mu_k, st.mu_v, st.v_amax, smooth_k=True,
                                 smooth_v=True, v_bias_correction=True))
    idx = evenly_spaced_rows(S, 64).cuda()
    ref, _ = dense_attention_f64(*sets[0], query_index=idx)
    base = dict(dispatch.TUNING)
    configs = [
        ("base 128x128 w8 s3 imp128 hwP", {}),
        ("explicit P rounding", {"round_p": True}),
        ("stages 4", {"num_stages": 4}),
        ("TMA", {"use_tma": True}),
        ("TMA stages 4", {"use_tma": True, "num_stages": 4}),
        ("BLOCK_M 64 w4", {"block_m": 64, "num_warps": 4}),
        ("BLOCK_M 64 w4 TMA", {"block_m": 64, "num_warps": 4, "use_tma": True}),
        ("BLOCK_M 128 w4", {"num_warps": 4}),
        ("imp0 (full precision)", {"max_imprecise": 0}),
    ]
    rows = []
    flops = 4.0 * B * H * S * S * D
    out = torch.empty_like(sets[0][0])
    for label, over in configs:
        cfg = {**base, **over}
        try:
            o, _ = fp8_attention_fwd(qkvs[0], num_heads=H, scale=D**-0.5, out=out, **cfg)
            torch.cuda.synchronize()
            rel = float((o[:, idx].double() - ref).norm() / ref.norm())
            i = [0]

            def fn(cfg=cfg):
                i[0] += 1
                fp8_attention_fwd(qkvs[i[0] % 2], num_heads=H, scale=D**-0.5, out=out, **cfg)

            ms = median_ms(fn, rep_ms=300 if over.get("max_imprecise") != 0 else 150)
            rows.append(dict(label=label, cfg=cfg, ms=ms, tflops=flops / ms / 1e9, rel_l2=rel))
            log(f"sweep {label:32s} {ms:8.3f} ms {flops / ms / 1e9:7.1f} TFLOP/s relL2 {rel:.4e}")
        except Exception as exc:  # noqa: BLE001 - a config may not compile: report and go on
            rows.append(dict(label=label, cfg=cfg, error=f"{type(exc).__name__}: {exc}"[:300]))
            log(f"sweep {label:32s} FAILED {type(exc).__name__}: {str(exc)[:200]}")
    ok = [r for r in rows if "ms" in r and r["cfg"]["max_imprecise"] == 128]
    base_rel = rows[0].get("rel_l2", 1.0)
    ok = [r for r in ok if r["rel_l2"] <= 1.05 * base_rel]
    best = min(ok, key=lambda r: r["ms"]) if ok else None
    if best:
        dispatch.TUNING.update(best["cfg"])
        log(f"chosen TUNING: {best['label']} {dispatch.TUNING}")
    qkvs = sets = None  # noqa: F841 - free the sweep buffers
    torch.cuda.empty_cache()
    return rows, best


def main():
    log("device", torch.cuda.get_device_name(0), "torch", torch.__version__)
    summary = {"tests": run_tests()}
    rows, best = sweep()
    summary["sweep"] = rows
    summary["chosen"] = best
    from workbench.bench.cli import DEFAULT_SHAPES, markdown, run

    shapes = os.environ.get("SHAPES", " ".join(DEFAULT_SHAPES)).split()
    report = run(shapes, log=log, rep_ms=400)
    report["sweep"] = rows
    report["chosen_tuning"] = best["cfg"] if best else None
    with open(os.path.join(OUT, "bench.json"), "w") as f:
        json.dump(report, f, indent=1)
    md = markdown(report)
    with open(os.path.join(OUT, "bench.md"), "w") as f:
        f.write(md)
    print(md)
    # Short table last: the headline ratios.
    print("\n== summary ==")
    print("tests:", summary["tests"])
    print("ceilings:", {k: round(v, 1) for k, v in report["ceilings"].items()})
    for shape in dict.fromkeys(r["shape"] for r in report["rows"]):
        rr = [r for r in report["rows"] if r["shape"] == shape]
        base = next((r["ms"] for r in rr if r["variant"] == "sdpa_cudnn"), float("nan"))
        print(f"{shape}: sdpa_cudnn {base:.2f} ms")
        for r in rr:
            if r["mode"] in ("full", "kernel"):
                print(f"  {r['variant']:24s} {r['mode']:6s} {r['ms']:8.2f} ms {r['tflops']:6.0f} TF "
                      f"x{base / r['ms']:.2f} relL2 {r['rel_l2']:.3e}")
            elif r["mode"] == "stats":
                print(f"  {r['variant']:24s} stats  {r['ms']:8.3f} ms {r['read_tbs']:.2f} TB/s")
            else:
                print(f"  {r['variant']:24s} prep   {r['ms']:8.3f} ms")
    log("done")


if __name__ == "__main__":
    main()

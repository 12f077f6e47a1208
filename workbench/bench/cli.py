"""``workbench bench``: side-by-side attention timings on the GPU, JSON + a markdown table.

    workbench bench --shapes 1,32626,56,128 1,8192,56,128 --json out.json --markdown BENCHMARKS.md
"""

from __future__ import annotations

import json

DEFAULT_SHAPES = ["1,32626,56,128", "1,8192,56,128", "1,16384,56,128", "1,65536,56,128"]


def register(subparsers) -> None:
    p = subparsers.add_parser("bench", help="time FP8 attention kernels against SDPA/cuDNN (GPU)")
    p.add_argument("--shapes", nargs="+", default=DEFAULT_SHAPES, help="B,S,H,D per shape")
    p.add_argument("--recipes", nargs="+", default=None, help="recipes to time (default 3 FP8)")
    p.add_argument("--rows", type=int, default=64, help="query rows for accuracy vs float64")
    p.add_argument("--sets", type=int, default=2, help="rotating input sets")
    p.add_argument("--rep-ms", type=int, default=500, help="do_bench repetition budget per row")
    p.add_argument("--no-emulate", action="store_true", help="skip the torch-emulation accuracy")
    p.add_argument("--no-ceilings", action="store_true", help="skip copy/matmul ceilings")
    p.add_argument("--json", default=None, help="write all rows and the environment here")
    p.add_argument("--markdown", default=None, help="append the markdown table to this file")
    p.set_defaults(func=main)


def parse_shape(text: str) -> tuple[int, int, int, int]:
    parts = [int(x) for x in text.replace("x", ",").split(",")]
    if len(parts) != 4:
        raise ValueError(f"--shapes: expected B,S,H,D, got {text!r}")
    return tuple(parts)  # type: ignore[return-value]


def run(shapes, *, recipes=None, rows=64, sets=2, rep_ms=500, emulate=True, ceilings=True,
        log=print) -> dict:
    import torch

    from .attention import RECIPES, side_by_side
    from .harness import copy_bandwidth_tbs, env_info, matmul_tflops

    if not torch.cuda.is_available():
        raise ValueError("bench needs a CUDA GPU")
    report = {"env": env_info(), "ceilings": {}, "rows": []}
    log(json.dumps(report["env"]))
    if ceilings:
        c = report["ceilings"]
        c["copy_tbs"] = copy_bandwidth_tbs()
        c["bf16_mm_tflops"] = matmul_tflops("bf16")
        try:
            c["fp8_mm_tflops"] = matmul_tflops("fp8")
        except Exception as exc:  # noqa: BLE001
            log(f"fp8 matmul ceiling skipped: {exc}")
        log("ceilings: " + ", ".join(f"{k}={v:.1f}" for k, v in c.items()))
    for shape in shapes:
        B, S, H, D = parse_shape(shape) if isinstance(shape, str) else shape
        log(f"shape ({B}, {S}, {H}, {D})")
        report["rows"] += side_by_side(B, S, H, D, n_sets=sets, recipes=recipes or RECIPES,
                                       rows=rows, emulate=emulate, rep_ms=rep_ms, log=log)
        torch.cuda.empty_cache()
    return report


def markdown(report: dict) -> str:
    """One table per shape: time, TFLOP/s, ratio vs SDPA-cuDNN, peak memory, accuracy."""
    env = report["env"]
    lines = [f"Device {env.get('device')}, torch {env.get('torch')}, triton {env.get('triton')}, "
             f"CUDA {env.get('cuda')}, cuDNN {env.get('cudnn')}, cudnn-frontend "
             f"{env.get('cudnn_frontend', 'absent')}, {env.get('date')}."]
    c = report.get("ceilings") or {}
    if c:
        lines.append("Ceilings (same run): " + ", ".join(f"{k} {v:.1f}" for k, v in c.items()))
    shapes = []
    for r in report["rows"]:
        if r["shape"] not in shapes:
            shapes.append(r["shape"])
    for shape in shapes:
        rows = [r for r in report["rows"] if r["shape"] == shape]
        base = next((r["ms"] for r in rows if r["variant"] == "sdpa_cudnn"), None)
        lines += ["", f"Shape {shape} bf16 inputs, non-causal:", "",
                  "| variant | mode | ms | TFLOP/s | x SDPA-cuDNN | peak extra GiB | rel-L2 vs f64 "
                  "| torch emu rel-L2 | cosine |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for r in rows:
            ratio = f"{base / r['ms']:.2f}" if base and r["mode"] in ("full", "kernel") else ""
            tf = f"{r['tflops']:.0f}" if r["mode"] in ("full", "kernel") else ""
            rel = f"{r['rel_l2']:.3e}" if r["rel_l2"] == r["rel_l2"] else ""
            emu = r.get("emu_rel_l2", float("nan"))
            emu = f"{emu:.3e}" if emu == emu else ""
            cos = f"{r['cosine']:.6f}" if r["cosine"] == r["cosine"] else ""
            note = f" ({r['read_tbs']:.2f} TB/s read)" if "read_tbs" in r else ""
            lines.append(f"| {r['variant']} | {r['mode']}{note} | {r['ms']:.3f} | {tf} | {ratio} "
                         f"| {r['peak_gib']:.2f} | {rel} | {emu} | {cos} |")
    return "\n".join(lines) + "\n"


def main(args) -> int:
    report = run(args.shapes, recipes=args.recipes, rows=args.rows, sets=args.sets,
                 rep_ms=args.rep_ms, emulate=not args.no_emulate, ceilings=not args.no_ceilings)
    md = markdown(report)
    print(md)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    if args.markdown:
        with open(args.markdown, "a") as f:
            f.write("\n" + md)
    return 0

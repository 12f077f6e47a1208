"""One DiT step at full H3 width: diffusers' ``MiniMaxH3Transformer3DModel`` forward time with SDPA
cuDNN, with the dense FP8 kernel and with FP8 Sol at target densities (GPU).

    workbench bench dit --blocks 4 --json dit.json
    python -m workbench.bench.dit ...   (the same)

Model: diffusers' defaults are H3's width (56 heads x 128, hidden 5376, FFN 14336, 2 refiner
blocks); ``blocks`` transformer blocks with seeded random weights in bf16, H3's float32 modules
kept float32. Input: one packed sequence of the live layout (14 text | 356 audio | 32 x 24 x 42
video rows = 32,626; ``workbench.models.h3.build_packed_layout`` / ``pack_h3_sequence``), random
rows, video t = 0.9.

Attention replacement: ``AttentionInterceptor`` (workbench.capture) routes every transformer
block's attention through ``run_attention(q, k, v, recipe, layout=..., backend="kernel")``; the
token refiner keeps diffusers' own attention. Sol's tau per block and density comes from an
untimed calibration forward (``routing.sol_tau_for_density`` on each block's own q, k, v), so
each block routes the target density; the table reports the densities reached.

Timing: median wall time of ``repeats`` CUDA-synchronized forwards after one warm-up forward.
Accuracy: relative L2 of the video output against the SDPA cuDNN forward.
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from dataclasses import asdict, dataclass, field

import torch

from .sparse import (
    DENSE_RECIPE,
    DENSITIES,
    SOL_RECIPE,
    check_cuda,
    parse_checked,
    run_main,
    sync,
    write_report,
)
from .tables import check_report_files

# the live layout: text rows, audio rows, video patch grid (frames, rows, columns)
H3_TEXT, H3_AUDIO, H3_VIDEO_GRID = 14, 356, (32, 24, 42)


@dataclass(frozen=True)
class DitBenchConfig:
    blocks: int = 4
    densities: tuple[float, ...] = DENSITIES
    repeats: int = 5
    seed: int = 0
    video_grid: tuple[int, int, int] = H3_VIDEO_GRID
    text: int = H3_TEXT
    audio: int = H3_AUDIO
    sol_recipe: str = SOL_RECIPE
    dense_recipe: str = DENSE_RECIPE
    budget_s: float = 240.0  # no new variant starts after this many seconds
    device: str = "cuda"  # "cpu": a smoke run of the plumbing with a small `model`
    model: dict = field(default_factory=dict)  # diffusers kwargs over the full-width defaults


def interceptor_class():
    """``workbench.capture.AttentionInterceptor`` (torch only: the capture package loads its
    zarr store on first use, so a machine that only times the model needs no zarr)."""
    from workbench.capture import AttentionInterceptor

    return AttentionInterceptor


def build_model(cfg: DitBenchConfig):
    """H3 transformer (full width unless cfg.model says otherwise) with cfg.blocks blocks on
    cfg.device, bf16 except H3's fp32 modules."""
    from diffusers import MiniMaxH3Transformer3DModel

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        with torch.device(cfg.device):
            model = MiniMaxH3Transformer3DModel(**{**cfg.model, "num_layers": cfg.blocks}).eval()
    keep = model._keep_in_fp32_modules
    for name, p in model.named_parameters():
        if not any(k in name for k in keep):
            p.data = p.data.to(torch.bfloat16)
    return model


def packed_inputs(model, cfg: DitBenchConfig):
    """(forward kwargs, attention SegmentLayout) for one packed step of random rows."""
    from workbench.models.h3 import build_packed_layout, pack_h3_sequence

    c = model.config
    layout = build_packed_layout(num_text=cfg.text, num_audio_latents=cfg.audio,
                                 audio_channels=1, video_grid=cfg.video_grid).to(cfg.device)
    dev = {"device": cfg.device}
    g = torch.Generator(**dev).manual_seed(cfg.seed)
    patch = c.in_channels * c.patch_size[0] * c.patch_size[1] * c.patch_size[2]
    video = torch.randn(1, layout.segments.video, patch, generator=g, **dev)
    audio = torch.randn(1, layout.segments.audio, c.audio_in_channels, generator=g, **dev)
    text = torch.randn(1, cfg.text, c.text_dim, generator=g, **dev).bfloat16()
    return pack_h3_sequence(video, audio, text, layout, video_t=0.9)


def run(cfg: DitBenchConfig = DitBenchConfig(), log=print) -> dict:
    """Forward times of the variants (see the module docstring). Returns {config, rows, ...}."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from workbench.attention.runner import run_attention
    from workbench.kernels import routing
    from workbench.recipes import get_recipe

    report = {"config": asdict(cfg), "rows": []}
    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise ValueError("DiT bench: device 'cuda' but no CUDA GPU")
    try:
        import diffusers  # noqa: F401
    except ImportError as exc:
        report["skipped"] = f"diffusers does not import ({exc})"
        log(f"DiT bench skipped: {report['skipped']}")
        return report
    t0 = time.time()
    Interceptor = interceptor_class()
    model = build_model(cfg)
    kwargs, seg = packed_inputs(model, cfg)
    report["seq_len"] = seg.total
    log(f"model: {cfg.blocks} blocks, S = {seg.total}, built in {time.time() - t0:.1f} s")

    def forward():
        with torch.no_grad():
            return model(**kwargs, return_dict=False)[0]

    def timed(label, ctx, ref=None, **extra):
        row = dict(variant=label, **extra)
        report["rows"].append(row)
        if time.time() - t0 > cfg.budget_s:
            row["skipped"] = f"time budget {cfg.budget_s:.0f} s reached"
            return row, None
        try:
            with ctx():
                out = forward()
                sync(cfg.device)
                times = []
                for _ in range(cfg.repeats):
                    t = time.perf_counter()
                    forward()
                    sync(cfg.device)
                    times.append(time.perf_counter() - t)
        except Exception as exc:  # noqa: BLE001 - one variant failing must not stop the table
            row["skipped"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
            log(f"  {label}: skipped ({row['skipped']})")
            return row, None
        row["ms"] = 1e3 * statistics.median(times)
        if ref is not None:
            row["out_rel_l2_vs_cudnn"] = float((out.float() - ref).norm() / ref.norm())
        log(f"  {label:30s} {row['ms']:9.1f} ms" + (
            f"  out rel-L2 vs cuDNN {row['out_rel_l2_vs_cudnn']:.2e}" if ref is not None else ""))
        return row, out

    base_row, base = timed("sdpa_cudnn", lambda: sdpa_kernel(SDPBackend.CUDNN_ATTENTION))
    ref = base.float() if base is not None else None
    del base

    def replacing(recipe_of):
        """Interceptor context whose handler runs `recipe_of(call)` on the kernels."""
        def handler(call):
            return run_attention(call.q, call.k, call.v, recipe_of(call), layout=seg,
                                 backend="kernel")
        return lambda: Interceptor(model, handler)

    dense = get_recipe(cfg.dense_recipe)
    timed(f"ours {dense.name}", replacing(lambda call: dense), ref)

    # calibration: each block's tau for each target density, from its own q, k, v (the block's
    # own attention output is kept: the handler returns None)
    sol = get_recipe(cfg.sol_recipe)
    taus: dict[int, dict[float, float]] = {}
    reached: dict[float, list[float]] = {d: [] for d in cfg.densities}

    def calibrate(call):
        sums = routing.block_sums(call.q, call.k, call.v)
        taus[call.layer] = {}
        for d in cfg.densities:
            tau = routing.sol_tau_for_density(call.q, call.k, call.v, sol, d, layout=seg,
                                              sums=sums)
            taus[call.layer][d] = tau
            r = routing.sol_routing(call.q, call.k, call.v, sol.with_(sol_tau=tau), layout=seg,
                                    sums=sums)
            reached[d].append(r.density)
        return None

    with Interceptor(model, calibrate):
        forward()
    for d in cfg.densities:
        density = sum(reached[d]) / max(1, len(reached[d]))
        timed(f"ours FP8 Sol {sol.sol_threshold}",
              replacing(lambda call, d=d: sol.with_(sol_tau=taus[call.layer][d])), ref,
              target=d, density=density, taus=[taus[b][d] for b in sorted(taus)])
    if base_row.get("ms"):
        for r in report["rows"]:
            if r.get("ms"):
                r["x_cudnn"] = base_row["ms"] / r["ms"]
    report["total_s"] = time.time() - t0
    return report


def markdown(report: dict) -> str:
    c = report["config"]
    head = (f"MiniMax-H3 transformer, full width, {c['blocks']} blocks, random weights, bf16, "
            f"S = {report.get('seq_len', '?')}; median of {c['repeats']} forwards.")
    if report.get("skipped"):
        return head + f"\n\nskipped: {report['skipped']}\n"
    lines = [head, "",
             "| variant | exact density | ms | x SDPA cuDNN | out rel-L2 vs cuDNN | note |",
             "|---|---|---|---|---|---|"]
    for r in report["rows"]:
        dens = f"{r['density']:.4f}" if "density" in r else "1"
        ms = f"{r['ms']:.1f}" if "ms" in r else ""
        x = f"{r['x_cudnn']:.2f}" if "x_cudnn" in r else ""
        err = f"{r['out_rel_l2_vs_cudnn']:.2e}" if "out_rel_l2_vs_cudnn" in r else ""
        note = f"skipped: {r['skipped']}" if "skipped" in r else (
            f"target {r['target']:.2f}" if "target" in r else "")
        lines.append(f"| {r['variant']} | {dens} | {ms} | {x} | {err} | {note} |")
    return "\n".join(lines) + "\n"


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``python -m workbench.bench.dit`` and ``workbench bench dit``."""
    p.add_argument("--blocks", type=int, default=4)
    p.add_argument("--densities", type=float, nargs="+", default=list(DENSITIES))
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--budget-s", type=float, default=240.0)
    p.add_argument("--json", default=None)
    p.add_argument("--markdown", default=None)


def check_args(args: argparse.Namespace) -> None:
    """Refuse bad options before any GPU work (ValueError naming the option)."""
    if args.blocks < 1 or args.repeats < 1:
        raise ValueError("--blocks and --repeats must be >= 1")
    if not (math.isfinite(args.budget_s) and args.budget_s > 0):
        raise ValueError(f"--budget-s: {args.budget_s} (seconds for the rows, > 0)")
    bad = [d for d in args.densities if not 0.0 < d <= 1.0]
    if bad:
        raise ValueError(f"--densities: {bad} not in (0, 1]")
    check_report_files(args)


def parse_args(argv=None) -> argparse.Namespace:
    return parse_checked(argv, "python -m workbench.bench.dit",
                         "H3 DiT forward time per attention variant (GPU)", add_arguments,
                         check_args)


def main(argv=None) -> int:
    return run_main(parse_args(argv), run_args, "python -m workbench.bench.dit")


def run_args(args: argparse.Namespace) -> int:
    """Run from parsed options (``workbench bench dit``)."""
    check_args(args)
    check_cuda("cuda", what="the DiT bench runs on a GPU")
    cfg = DitBenchConfig(blocks=args.blocks, densities=tuple(args.densities),
                         repeats=args.repeats, budget_s=args.budget_s)
    report = run(cfg)
    write_report(report, markdown(report), args.json, args.markdown, kind="dit")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

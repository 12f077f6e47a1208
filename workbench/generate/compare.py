"""Compare clips frame by frame and sample by sample (the seed PR's end-to-end table).

``compare_dirs(A, B, out)``: every metric of B against A (``workbench.metrics.media``), written as
``metrics.json``, ``table.md``, ``curves.csv`` + ``curves.svg`` (per-frame PSNR / SSIM / cosine)
and ``side_by_side.mp4`` (A | B | |A - B| x 4).
``compare_recipes(model, recipes, ...)``: generate the same clip (same seed) with each recipe and
compare every one against the first.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

import torch

from workbench.metrics import json_safe
from workbench.metrics.media import compare_media, media_table

from .run import _to_uint8_frames, generate, read_clip, write_clip, write_mp4

DIFF_GAIN = 4.0


def _svg_curves(curves: dict[str, list[float]], title: str) -> str:
    """A small self-contained SVG line chart, one panel per curve (no plotting dependency)."""
    w, h, pad = 360, 160, 34
    panels = []
    for n, (name, ys) in enumerate(curves.items()):
        finite = [y for y in ys if math.isfinite(y)]
        lo, hi = (min(finite), max(finite)) if finite else (0.0, 1.0)
        if hi - lo < 1e-12:
            lo, hi = lo - 0.5, hi + 0.5
        x0 = n * (w + 10)
        pts = []
        for i, y in enumerate(ys):
            yy = hi if not math.isfinite(y) else y
            px = x0 + pad + (w - 2 * pad) * (i / max(len(ys) - 1, 1))
            py = h - pad - (h - 2 * pad) * (yy - lo) / (hi - lo)
            pts.append(f"{px:.1f},{py:.1f}")
        panels.append(
            f'<g><text x="{x0 + pad}" y="16" font-size="12">{name} per frame</text>'
            f'<text x="{x0 + 2}" y="{pad}" font-size="9">{hi:.4g}</text>'
            f'<text x="{x0 + 2}" y="{h - pad}" font-size="9">{lo:.4g}</text>'
            f'<rect x="{x0 + pad}" y="{pad}" width="{w - 2 * pad}" height="{h - 2 * pad}" '
            f'fill="none" stroke="#ccc"/>'
            f'<polyline fill="none" stroke="#1f77b4" stroke-width="1.5" points="{" ".join(pts)}"/>'
            f'<text x="{x0 + pad}" y="{h - 8}" font-size="9">frame 0..{len(ys) - 1}</text></g>'
        )
    total_w = len(curves) * (w + 10)
    return (f'<svg xmlns="http://www.w3.org/2000/svg" width="{total_w}" height="{h + 20}">'
            f'<title>{title}</title>{"".join(panels)}</svg>\n')


def compare_clips(a, b, out: str | Path | None = None, name_a: str = "A",
                  name_b: str = "B") -> dict:
    """Metrics of clip b against clip a; writes the artifacts into `out` when given."""
    m = compare_media(a.video, b.video, a.audio, b.audio)
    if out is None:
        return m
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    curves = m.get("curves", {})
    (out / "metrics.json").write_text(json.dumps(json_safe(
        {"reference": name_a, "test": name_b, **m}), indent=1))
    (out / "table.md").write_text(media_table({name_b: m}, name_a) + "\n")
    if curves:
        keys = list(curves)
        rows = ["frame," + ",".join(keys)]
        for i in range(len(curves[keys[0]])):
            rows.append(f"{i}," + ",".join(f"{curves[k][i]:.6g}" for k in keys))
        (out / "curves.csv").write_text("\n".join(rows) + "\n")
        (out / "curves.svg").write_text(_svg_curves(curves, f"{name_b} vs {name_a}"))
        diff = ((b.video - a.video).abs() * DIFF_GAIN).clamp(0, 1)
        panel = torch.cat([a.video, b.video, diff], dim=-1)  # [T, 3, H, 3W]
        frames = _to_uint8_frames(panel)
        write_mp4(out / "side_by_side.mp4", frames, a.fps)
    return m


def compare_dirs(dir_a: str | Path, dir_b: str | Path, out: str | Path | None = None) -> dict:
    """Compare the clip folder `dir_b` against `dir_a` (written by ``write_clip``)."""
    a, b = read_clip(dir_a), read_clip(dir_b)
    return compare_clips(a, b, out, Path(dir_a).name, Path(dir_b).name)


def _folder_name(spec: str) -> str:
    """A clip folder name for a recipe spec: a plan / recipe file gives its stem (an absolute
    path must not escape the output folder), a spec its text with ':' replaced."""
    if spec.strip().endswith(".json") and not spec.strip().startswith("{"):
        return Path(spec.strip()).stem
    return spec.replace(":", "_").replace("/", "_")


def compare_recipes(
    model,
    recipes: list[str],
    *,
    prompt=None,
    seed: int = 0,
    steps: int | None = None,
    out: str | Path | None = None,
    dense_steps: int | None = None,
    dense_layers: int | None = None,
    backend: str | None = None,
    progress: bool = True,
) -> tuple[dict[str, dict], str]:
    """Generate the same clip with every recipe; metrics of each against the first recipe.

    model: an ``H3Model``. Returns ({recipe: metrics}, markdown table).
    """
    if len(recipes) < 2:
        raise ValueError("recipes: give at least two (the first is the reference)")
    clips = {}
    for r in recipes:
        t0 = time.perf_counter()
        clips[r] = generate(model, prompt, seed=seed, steps=steps, recipe=r,
                            dense_steps=dense_steps, dense_layers=dense_layers, backend=backend,
                            progress=progress)
        clips[r].config["seconds"] = round(time.perf_counter() - t0, 3)
        if out is not None:
            write_clip(clips[r], Path(out) / _folder_name(r))
    ref = recipes[0]
    rows = {}
    for r in recipes:
        sub = None if out is None or r == ref else Path(out) / f"compare_{_folder_name(r)}"
        rows[r] = compare_clips(clips[ref], clips[r], sub, ref, r)
    table = media_table(rows, ref)
    if out is not None:
        out = Path(out)
        summary = {"model": model.name, "prompt": prompt, "seed": seed,
                   "steps": steps or model.config.default_steps, "reference": ref,
                   "seconds": {r: clips[r].config["seconds"] for r in recipes},
                   "metrics": {r: {k: v for k, v in m.items() if k != "curves"}
                               for r, m in rows.items()}}
        (out / "compare.json").write_text(json.dumps(json_safe(summary), indent=1))
        (out / "table.md").write_text(table + "\n")
    return rows, table

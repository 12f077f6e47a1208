"""Compare clips frame by frame and sample by sample (the seed PR's end-to-end table).

``compare_dirs(A, B, out)``: every metric of B against A (``workbench.metrics.media``), written as
``metrics.json``, ``table.md``, ``curves.csv`` + ``curves.svg`` (per-frame PSNR / SSIM / cosine)
and ``side_by_side.mp4``: three labelled panels, A | B | |B - A| amplified by a gain chosen from
the difference itself (printed on the panel and in ``table.md`` / ``metrics.json``), because
the FP8 differences worth seeing are a few thousandths of full scale.
``compare_recipes(model, recipes, ...)``: generate the same clip (same seed) with each recipe and
compare every one against the first.
"""

from __future__ import annotations

import dataclasses
import json
import math
import sys
import time
from pathlib import Path

import torch

from workbench.metrics import json_safe
from workbench.metrics.media import compare_media, media_table

from .run import VIEW_MIN_SIDE, generate, read_clip, write_clip, write_mp4

# The difference panel's gain: the largest power of two that keeps the DIFF_QUANTILE quantile of
# |B - A| at or below full scale, within 1..MAX_DIFF_GAIN.
DIFF_QUANTILE = 0.995
MAX_DIFF_GAIN = 1024
PANEL_MIN_SIDE = max(VIEW_MIN_SIDE, 160)  # wide enough for a label
LABEL_PX = 18  # height of the label strip above each panel


def diff_gain(a: torch.Tensor, b: torch.Tensor) -> float:
    """Power-of-two gain for |b - a| (values in [0, 1]) so that the difference is visible."""
    d = (b - a).abs().flatten().float()
    if d.numel() > 1_000_000:  # quantile of a strided sample: same answer, bounded cost
        d = d[:: d.numel() // 1_000_000 + 1]
    top = float(torch.quantile(d, DIFF_QUANTILE)) if d.numel() else 0.0
    if top <= 0:
        return 1.0
    return float(min(MAX_DIFF_GAIN, max(1, 2 ** math.floor(math.log2(1.0 / top)))))


def side_by_side_frames(a: torch.Tensor, b: torch.Tensor, name_a: str, name_b: str,
                        gain: float | None = None) -> tuple[list, float]:
    """Frames [H', W', 3] uint8 of three labelled panels: A | B | |B - A| x gain.

    a, b: [T, 3, H, W] in [0, 1]. Small frames are enlarged (nearest, integer factor) to at
    least PANEL_MIN_SIDE so the labels fit. Returns (frames, gain).
    """
    import numpy as np
    from PIL import Image, ImageDraw, ImageFont

    gain = diff_gain(a, b) if gain is None else float(gain)
    diff = ((b - a).abs() * gain).clamp(0, 1)
    f = max(1, -(-PANEL_MIN_SIDE // min(a.shape[-2:])))
    labels = [f"A: {name_a}", f"B: {name_b}", f"|B - A| x {gain:g}"]
    panels = []
    for v in (a, b, diff):
        v = v.repeat_interleave(f, -2).repeat_interleave(f, -1)
        panels.append((v.clamp(0, 1) * 255.0 + 0.5).to(torch.uint8).permute(0, 2, 3, 1).numpy())
    T, H, W, _ = panels[0].shape
    font = ImageFont.load_default(size=12)
    strip = Image.new("RGB", (3 * W, LABEL_PX), (32, 32, 32))
    draw = ImageDraw.Draw(strip)
    for i, text in enumerate(labels):
        while len(text) > 4 and draw.textlength(text, font=font) > W - 8:
            text = text[:-2] + "…"  # drop one character (and keep the ellipsis)
        draw.text((i * W + 4, 3), text, fill=(240, 240, 240), font=font)
    head = np.asarray(strip)
    # H.264 with 4:2:0 chroma needs even sides: pad one black row / column where odd.
    pad_h, pad_w = (LABEL_PX + H) % 2, (3 * W) % 2
    frames = []
    for t in range(T):
        fr = np.concatenate([head, np.concatenate([p[t] for p in panels], axis=1)], axis=0)
        frames.append(np.ascontiguousarray(np.pad(fr, ((0, pad_h), (0, pad_w), (0, 0)))))
    return frames, gain


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
    """Metrics of clip b against clip a; writes the artifacts into `out` when given. The clips
    must share their frame rate and (with audio) sample rate: the metrics compare sample i with
    sample i, which would silently mean different times."""
    if a.fps != b.fps:
        raise ValueError(f"{name_a} and {name_b}: frame rates differ ({a.fps} vs {b.fps} fps)")
    if a.audio.numel() and b.audio.numel() and a.sample_rate != b.sample_rate:
        raise ValueError(f"{name_a} and {name_b}: audio sample rates differ ({a.sample_rate} vs "
                         f"{b.sample_rate} Hz)")
    m = compare_media(a.video, b.video, a.audio, b.audio)
    if out is None:
        return m
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    curves = m.get("curves", {})
    frames, gain = side_by_side_frames(a.video, b.video, name_a, name_b)
    write_mp4(out / "side_by_side.mp4", frames, a.fps)
    m["side_by_side"] = {"file": "side_by_side.mp4", "panels": ["A", "B", "|B - A| x gain"],
                         "gain": gain}
    (out / "metrics.json").write_text(json.dumps(json_safe(
        {"reference": name_a, "test": name_b, **m}), indent=1))
    (out / "table.md").write_text(media_table({name_b: m}, name_a) + "\n\n"
                                  + side_by_side_line(m, name_a, name_b) + "\n")
    if curves:
        keys = list(curves)
        rows = ["frame," + ",".join(keys)]
        for i in range(len(curves[keys[0]])):
            rows.append(f"{i}," + ",".join(f"{curves[k][i]:.6g}" for k in keys))
        (out / "curves.csv").write_text("\n".join(rows) + "\n")
        (out / "curves.svg").write_text(_svg_curves(curves, f"{name_b} vs {name_a}"))
    return m


def side_by_side_line(m: dict, name_a: str, name_b: str, folder: str = "") -> str:
    """The sentence that says what the side-by-side video shows and its difference gain."""
    s = m["side_by_side"]
    return (f"Side-by-side video `{folder}{s['file']}`: A `{name_a}` | B `{name_b}` | "
            f"|B - A| amplified x{s['gain']:g}.")


def compare_dirs(dir_a: str | Path, dir_b: str | Path, out: str | Path | None = None) -> dict:
    """Compare the clip folder `dir_b` against `dir_a` (written by ``write_clip``)."""
    a, b = read_clip(dir_a), read_clip(dir_b)
    va, vb = a.video, b.video
    if Path(dir_a).resolve() == Path(dir_b).resolve():
        print(f"note: {dir_a} is compared with itself (identical: inf / 1.0 throughout)",
              file=sys.stderr)
    if va.shape != vb.shape:
        # a folder with only video.mp4 is read at its viewing size (frames enlarged by an integer
        # factor, write_clip): bring it back to the other's size by averaging each f x f block.
        # Two exact clips of other sizes are two clips, not one at two sizes: refused.
        small, big = (va, vb) if va.shape[-1] < vb.shape[-1] else (vb, va)
        if (Path(dir_a if big is va else dir_b) / "clip.safetensors").exists():
            raise ValueError(f"{dir_a} and {dir_b}: video shapes {tuple(va.shape)} and "
                             f"{tuple(vb.shape)} differ (the larger is an exact clip, not a "
                             "viewing-size mp4)")
        f = big.shape[-1] // small.shape[-1]
        if big.shape[:2] != small.shape[:2] or f < 1 or \
                tuple(big.shape[-2:]) != (small.shape[-2] * f, small.shape[-1] * f):
            raise ValueError(f"{dir_a} and {dir_b}: video shapes {tuple(va.shape)} and "
                             f"{tuple(vb.shape)} differ (not one clip at two sizes)")
        down = torch.nn.functional.avg_pool2d(big, f)
        a, b = ((dataclasses.replace(a, video=down), b) if big is va
                else (a, dataclasses.replace(b, video=down)))
    return compare_clips(a, b, out, Path(dir_a).name, Path(dir_b).name)


MAX_FOLDER_NAME = 96  # well under a file system's 255 bytes, with room for compare_ and -N


def _folder_name(spec: str) -> str:
    """A clip folder name for a recipe spec: a plan / recipe file gives its stem (an absolute
    path must not escape the output folder), a spec its text with ':' replaced; a recipe's JSON
    text its name; a name too long for a folder its start and a hash of the whole."""
    import hashlib

    text = spec.strip()
    if text.endswith(".json") and not text.startswith("{"):
        name = Path(text).stem
    elif text.startswith("{"):
        try:
            name = f"{json.loads(text).get('name', 'recipe')}-json"
        except (ValueError, AttributeError):
            name = "recipe-json"
    else:
        name = spec
    name = name.replace(":", "_").replace("/", "_")
    if len(name) > MAX_FOLDER_NAME or text.startswith("{"):
        digest = hashlib.sha1(spec.encode()).hexdigest()[:8]
        name = f"{name[:MAX_FOLDER_NAME - 9]}-{digest}"
    return name


def clip_folder_names(recipes: list[str]) -> dict[str, str]:
    """{recipe: clip folder name}, distinct: two specs that give one name (``pa/plan.json`` and
    ``pb/plan.json`` are both ``plan``) get -2, -3, ... after the first, so that no clip or
    comparison is written over another's. A name is also kept apart from every ``compare_NAME``
    folder and from the summary files beside them."""
    taken = {"compare.json", "table.md"}
    names = {}
    for r in recipes:
        base = name = _folder_name(r)
        k = 1
        while name in taken or f"compare_{name}" in taken:
            k += 1
            name = f"{base}-{k}"
        taken.update((name, f"compare_{name}"))
        names[r] = name
    return names


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
    twice = next((r for i, r in enumerate(recipes) if r in recipes[:i]), None)
    if twice is not None:  # results are keyed by the spec: a second one would replace the first
        raise ValueError(f"recipes: {twice!r} is given twice; give each recipe once")
    from .run import resolve_recipe

    for r in recipes:  # every spec read before the first clip is generated
        try:
            resolve_recipe(r, dense_steps, dense_layers)
        except ValueError as exc:
            raise ValueError(f"recipes: {r!r}: {exc}") from None
    folders = clip_folder_names(recipes)
    clips = {}
    for r in recipes:
        t0 = time.perf_counter()
        clips[r] = generate(model, prompt, seed=seed, steps=steps, recipe=r,
                            dense_steps=dense_steps, dense_layers=dense_layers, backend=backend,
                            progress=progress)
        clips[r].config["seconds"] = round(time.perf_counter() - t0, 3)
        if out is not None:
            write_clip(clips[r], Path(out) / folders[r])
    ref = recipes[0]
    rows = {}
    for r in recipes:
        sub = None if out is None or r == ref else Path(out) / f"compare_{folders[r]}"
        rows[r] = compare_clips(clips[ref], clips[r], sub, ref, r)
    table = media_table(rows, ref)
    ran = {r: clips[r].config.get("recipe_string") for r in recipes}
    if dense_steps is not None or dense_layers is not None:  # the specs are not what ran
        table += ("\n\nDense policy set for every recipe (--dense-steps / --dense-layers); what "
                  "ran: " + "; ".join(f"{r} -> `{ran[r]}`" for r in recipes) + ".")
    if out is not None:
        table += "\n\n" + "\n".join(
            side_by_side_line(m, ref, r, f"compare_{folders[r]}/")
            for r, m in rows.items() if "side_by_side" in m)
        out = Path(out)
        summary = {"model": model.name, "prompt": prompt, "seed": seed,
                   "steps": steps or model.config.default_steps, "reference": ref,
                   "seconds": {r: clips[r].config["seconds"] for r in recipes},
                   "folders": {r: folders[r] for r in recipes},
                   "ran": ran, "dense_steps": dense_steps, "dense_layers": dense_layers,
                   "metrics": {r: {k: v for k, v in m.items()
                                   if k not in ("curves", "side_by_side")}
                               for r, m in rows.items()},
                   "side_by_side": {r: m["side_by_side"] for r, m in rows.items()
                                    if "side_by_side" in m}}
        (out / "compare.json").write_text(json.dumps(json_safe(summary), indent=1))
        (out / "table.md").write_text(table + "\n")
    return rows, table

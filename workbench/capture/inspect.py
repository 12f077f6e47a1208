"""``workbench inspect STORE``: entries, shapes, sizes, completeness, per-layer K/V norms."""

from __future__ import annotations

import json

import torch

from .lock import describe_holder, holder_is_stale, read_holder
from .replay import CaptureReader, open_capture
from .schema import CaptureStoreError

MAX_STAT_ROWS = 4096  # norms use at most this many evenly spaced token rows per entry


def channel_norms(x: torch.Tensor, rotated: int) -> tuple[float, float]:
    """Mean L2 norm per (batch, token, head) vector over channels [0, rotated) and [rotated, D).

    x: [B, S, H, D]. Returns (rotated, pass-through); NaN for an empty channel range.
    """
    xf = x.float()
    rot = xf[..., :rotated].norm(dim=-1).mean().item() if rotated > 0 else float("nan")
    rest = xf[..., rotated:].norm(dim=-1).mean().item() if rotated < x.shape[-1] else float("nan")
    return rot, rest


def layer_norm_stats(reader: CaptureReader, damaged: list[str] | None = None) -> list[dict]:
    """Per layer (averaged over its complete steps): K/V mean norms, rotated vs pass-through.

    damaged: when given, entries that fail to read are listed there (one line each) and left out;
    otherwise the first failure raises.
    """
    rotated = reader.rotated_channels or 0
    per_layer: dict = {}
    for e in reader.entries(include_incomplete=False):
        try:
            _, k, v = reader.qkv(e.step, e.layer if e.layer is not None else e.name)
        except CaptureStoreError as exc:
            if damaged is None:
                raise
            damaged.append(str(exc))
            continue
        S = k.shape[1]
        if S > MAX_STAT_ROWS:
            rows = torch.linspace(0, S - 1, MAX_STAT_ROWS).round().long()
            k, v = k[:, rows], v[:, rows]
        key = e.layer if e.layer is not None else e.name
        acc = per_layer.setdefault(key, {"name": e.name, "n": 0, "k": [0.0, 0.0], "v": [0.0, 0.0]})
        for t in ("k", "v"):
            r, p = channel_norms(k if t == "k" else v, rotated)
            acc[t][0] += r
            acc[t][1] += p
        acc["n"] += 1
    out = []
    for key, acc in per_layer.items():
        n = acc["n"]
        out.append({
            "layer": key, "name": acc["name"], "steps": n, "rotated_channels": rotated,
            "k_rot": acc["k"][0] / n, "k_pass": acc["k"][1] / n,
            "v_rot": acc["v"][0] / n, "v_pass": acc["v"][1] / n,
        })
    return out


def _recipe_name(spec) -> str | None:
    try:
        return json.loads(spec).get("name") if spec not in (None, "native") else spec
    except (ValueError, AttributeError, TypeError):
        return f"{spec!r} (not a recipe spec)"


def _fmt(x: float) -> str:
    return "-" if x != x else f"{x:.4g}"


def inspect_store(path, stats: bool = True, strict: bool = True) -> str:
    """The inspect view; ``strict=False`` shows a store whose root attributes are damaged (the
    problems are listed by ``verify``)."""
    r = open_capture(path, strict=strict)
    a = r.attrs
    lines = [
        f"store: {path}",
        f"schema: {a.get('schema')} v{a.get('schema_version')}",
        f"model: {a.get('model_class')}",
        f"capture point: {a.get('capture_point')}",
        f"segment layout: {json.dumps(a.get('segment_layout'))}",
        f"rotated channels: {a.get('rotated_channels')}",
        f"seed: {a.get('seed')}  prompt: {a.get('prompt')!r}",
        f"recipe: {_recipe_name(a.get('recipe'))}",
    ]
    holder = read_holder(path)
    if holder:
        lines.append(("writer lock: left by a writer that is gone (stale), " if holder_is_stale(
            holder) else "writer lock: held by ") + describe_holder(holder))
    entries = r.entries()
    done = [e for e in entries if e.complete]
    total = sum(e.nbytes for e in done)
    lines.append(f"entries: {len(entries)} ({len(done)} complete, {len(entries) - len(done)} "
                 f"incomplete), {total / 2**20:.2f} MiB of q/k/v")
    lines.append("")
    lines.append(f"{'step':>5} {'layer':>5}  {'name':<28} {'status':<10} {'dtype':<14} "
                 f"{'q shape':<20} {'k/v shape':<20} {'MiB':>8}")
    for e in entries:
        lines.append(
            f"{'-' if e.step is None else e.step:>5} {'-' if e.layer is None else e.layer:>5}  "
            f"{e.name:<28} {e.status:<10} {e.torch_dtype or '?':<14} "
            f"{str(list(e.shape_q or [])):<20} {str(list(e.shape_kv or [])):<20} "
            f"{e.nbytes / 2**20:>8.3f}"
        )
    if entries and len(done) < len(entries):
        lines.append("")
        lines.append("INCOMPLETE (started, never finished; resume the capture to rewrite): " +
                     ", ".join(e.path for e in entries if not e.complete))
    if stats and done:
        rot = r.rotated_channels or 0
        D = done[0].shape_kv[-1]
        lines.append("")
        lines.append(f"per-layer mean L2 norm per (token, head) vector, averaged over steps; "
                     f"rotated = channels 0-{rot - 1}, pass-through = {rot}-{D - 1}"
                     if rot else "per-layer mean L2 norm per (token, head) vector (no rotated "
                     "channels recorded: all channels are pass-through)")
        lines.append(f"{'layer':>6}  {'name':<28} {'steps':>5} {'K rot':>10} {'K pass':>10} "
                     f"{'V rot':>10} {'V pass':>10}")
        damaged: list[str] = []
        for s in layer_norm_stats(r, damaged):
            lines.append(f"{s['layer']!s:>6}  {s['name']:<28} {s['steps']:>5} "
                         f"{_fmt(s['k_rot']):>10} {_fmt(s['k_pass']):>10} "
                         f"{_fmt(s['v_rot']):>10} {_fmt(s['v_pass']):>10}")
        if damaged:
            lines.append(f"norms leave out {len(damaged)} damaged entr"
                         f"{'y' if len(damaged) == 1 else 'ies'} (--verify lists every problem):")
            lines.extend("  " + d for d in damaged)
    return "\n".join(lines)

"""``workbench inspect STORE``: entries, shapes, sizes, completeness, per-layer K/V norms."""

from __future__ import annotations

import json

import torch

from workbench.layout import SegmentLayout, channel_groups

from .lock import describe_holder, holder_is_stale, read_holder
from .replay import CaptureReader, open_capture
from .schema import CaptureStoreError
from .storefs import replaced_leftovers

MAX_STAT_ROWS = 4096  # norms use at most this many evenly spaced token rows per entry


def channel_norms(x: torch.Tensor, rotated: int | None) -> dict[str, float]:
    """Mean L2 norm per (batch, token, head) vector over each non-empty channel group
    (``workbench.layout.channel_groups``: "rot", "pass", or "all" when the split is unknown).

    x: [B, S, H, D]. Returns {group key: norm}.
    """
    xf = x.float()
    return {key: xf[..., a:b].norm(dim=-1).mean().item()
            for key, _, a, b in channel_groups(rotated, x.shape[-1])}


def safe_rotated(reader: CaptureReader) -> tuple[int | None, str | None]:
    """(the store's RoPE channel count or None, the problem when its attribute is damaged)."""
    from .schema import MetadataError

    try:
        return reader.rotated_channels, None
    except MetadataError as exc:
        return None, str(exc)


def layer_norm_stats(reader: CaptureReader, damaged: list[str] | None = None) -> list[dict]:
    """Per layer (averaged over its complete steps): K/V mean norms per channel group.

    damaged: when given, entries that fail to read are listed there (one line each) and left out;
    otherwise the first failure raises.
    """
    rotated = safe_rotated(reader)[0]
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
        acc = per_layer.setdefault(key, {"name": e.name, "n": 0, "sums": {}})
        for t, x in (("k", k), ("v", v)):
            for g, norm in channel_norms(x, rotated).items():
                acc["sums"][f"{t}_{g}"] = acc["sums"].get(f"{t}_{g}", 0.0) + norm
        acc["n"] += 1
    out = []
    for key, acc in per_layer.items():
        n = acc["n"]
        out.append({"layer": key, "name": acc["name"], "steps": n, "rotated_channels": rotated,
                    **{g: total / n for g, total in acc["sums"].items()}})
    return out


def _recipe_name(spec) -> str | None:
    """The recorded recipe as its string (preset name and any overrides, e.g.
    ``fp8_dense:smoothing=k``), not just its name."""
    if spec in (None, "native"):
        return spec
    try:
        from workbench.recipes import get_recipe

        return get_recipe(spec).to_string()
    except Exception:  # noqa: BLE001 - an older or hand-edited spec: its name, else say so
        try:
            return json.loads(spec).get("name")
        except (ValueError, AttributeError, TypeError):
            return f"{spec!r} (not a recipe spec)"


def _fmt(x: float) -> str:
    return "-" if x != x else f"{x:.4g}"


def _layout_line(r) -> str:
    d = r.attrs.get("segment_layout")
    if not d:
        return "not recorded (read as one segment `tokens`)"
    try:
        return SegmentLayout.from_dict(d).describe()
    except ValueError:
        return f"{json.dumps(d)} (not a layout: --verify says why)"


def _rotated_line(rot) -> str:
    if rot is None:
        return "not recorded (drift and norms over all channels)"
    return f"{rot}" + (" (no RoPE: every channel passes through)" if rot == 0 else "")


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
        f"segment layout: {_layout_line(r)}",
        f"rotated channels: {_rotated_line(a.get('rotated_channels'))}",
        f"seed: {a.get('seed')}  prompt: {a.get('prompt')!r}",
        f"recipe: {_recipe_name(a.get('recipe'))}",
    ]
    for old in replaced_leftovers(path):
        lines.append(f"replaced store kept: {old} (an --overwrite of this store was interrupted "
                     "before it finished; that folder holds the store it replaced)")
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
    writing = [e.path for e in entries if not e.complete and e.problem is None]
    damaged = [e for e in entries if not e.complete and e.problem is not None]
    if writing:
        lines.append("")
        lines.append("INCOMPLETE (started, never finished; resume the capture to rewrite): " +
                     ", ".join(writing))
    if damaged:  # unreadable or invalid metadata: not a capture that stopped midway
        lines.append("")
        lines.append("DAMAGED METADATA (inspect --verify lists every problem): " +
                     "; ".join(e.problem for e in damaged[:3]) +
                     (f" (+{len(damaged) - 3} more)" if len(damaged) > 3 else ""))
    if stats and done:
        D = done[0].shape_kv[-1]
        rotated, bad = safe_rotated(r)
        if bad:  # inspect describes a damaged store: the norms over all channels, and why
            lines.append(f"\n{bad}; the norms below do not split the channels")
        groups = channel_groups(rotated, D)
        lines.append("")
        lines.append("per-layer mean L2 norm per (token, head) vector, averaged over steps, over "
                     + " and ".join(label for _, label, _, _ in groups))
        short = {"rot": "rot", "pass": "pass", "all": "all"}
        cols = [(f"{t}_{g}", f"{t.upper()} {short[g]}") for t in "kv" for g, *_ in groups]
        lines.append(f"{'layer':>6}  {'name':<28} {'steps':>5} "
                     + " ".join(f"{c:>10}" for _, c in cols))
        damaged: list[str] = []
        for s in layer_norm_stats(r, damaged):
            lines.append(f"{s['layer']!s:>6}  {s['name']:<28} {s['steps']:>5} "
                         + " ".join(f"{_fmt(s[key]):>10}" for key, _ in cols))
        if damaged:
            lines.append(f"norms leave out {len(damaged)} damaged entr"
                         f"{'y' if len(damaged) == 1 else 'ies'} (--verify lists every problem):")
            lines.extend("  " + d for d in damaged)
    return "\n".join(lines)

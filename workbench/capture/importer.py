"""Bring your own tensors: ``workbench import SRC... --out STORE``.

Reads q/k/v of any model from ``.pt`` / ``.safetensors`` / ``.npy`` / ``.npz`` files (or folders
of them) and writes a capture store that every later stage reads like a live capture.

What a source holds: tensors named ``q``, ``k``, ``v`` (also ``query`` / ``key`` / ``value``),
alone (one entry) or after a prefix naming the entry (``layers.3.q``, ``step2.layer5.k``; nested
dicts in a ``.pt`` file flatten to the same dotted names; a folder's files are named by their path
without the suffix, so ``layer0/q.npy`` is ``layer0.q``). q is ``[S, H, D]`` or ``[B, S, H, D]``,
k and v ``[S, Hkv, D]`` or ``[B, S, Hkv, D]`` (grouped K/V heads: H a multiple of Hkv).

Step and layer of an entry come from its prefix (``step<N>`` / ``s<N>``; ``layer<N>`` /
``layers.<N>`` / ``blocks.<N>`` / ``l<N>`` / a bare number); an entry without a layer number takes
its position among the prefixes in natural order, without a step number step 0.
"""

from __future__ import annotations

import math
import re
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

from .schema import entry_path

SUFFIXES = (".pt", ".pth", ".safetensors", ".npy", ".npz")
ROLES = {"q": "q", "k": "k", "v": "v", "query": "q", "key": "k", "value": "v"}
FLOAT_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


class ImportDataError(ValueError):
    """A source that cannot become a store: the message names the file, key and shapes."""


@dataclass
class ImportedEntry:
    name: str
    step: int
    layer: int
    q: torch.Tensor  # [B, S, H, D]
    k: torch.Tensor  # [B, S, Hkv, D]
    v: torch.Tensor


def _flatten(obj, prefix: str, out: dict, where: str) -> None:
    if isinstance(obj, torch.Tensor):
        out[prefix] = (obj, where)
    elif isinstance(obj, dict):
        for key, val in obj.items():
            _flatten(val, f"{prefix}.{key}" if prefix else str(key), out, where)
    elif isinstance(obj, (list, tuple)):
        for i, val in enumerate(obj):
            _flatten(val, f"{prefix}.{i}" if prefix else str(i), out, where)
    else:
        import numpy as np

        if isinstance(obj, np.ndarray):
            out[prefix] = (_from_numpy(obj, f"{where}: {prefix}"), where)
        else:
            raise ImportDataError(f"{where}: {prefix or 'the file'} holds a {type(obj).__name__}, "
                               "not tensors")


def _from_numpy(a, what: str) -> torch.Tensor:
    if a.dtype.kind != "f":
        raise ImportDataError(f"{what}: dtype {a.dtype} is not floating point")
    return torch.from_numpy(a.copy())


def read_tensors(paths) -> dict[str, tuple[torch.Tensor, str]]:
    """{dotted name: (tensor, file it came from)} of every source (files or folders)."""
    import numpy as np

    out: dict[str, tuple[torch.Tensor, str]] = {}
    for src in paths:
        src = Path(src)
        if not src.exists():
            raise FileNotFoundError(f"{src}: no such file or folder")
        if src.is_dir():
            files = sorted(p for p in src.rglob("*") if p.suffix in SUFFIXES)
            if not files:
                raise ImportDataError(f"{src}: no {'/'.join(SUFFIXES)} files in this folder")
            items = [(p, ".".join(p.relative_to(src).with_suffix("").parts)) for p in files]
        elif src.suffix in SUFFIXES:
            items = [(src, src.stem if src.suffix == ".npy" else "")]
        else:
            raise ImportDataError(f"{src}: unknown file type {src.suffix!r}; expected one of "
                               f"{', '.join(SUFFIXES)}")
        for p, prefix in items:
            part: dict = {}
            try:
                if p.suffix in (".pt", ".pth"):
                    _flatten(torch.load(p, map_location="cpu", weights_only=True), "", part,
                             str(p))
                elif p.suffix == ".safetensors":
                    from safetensors.torch import load_file

                    _flatten(load_file(str(p)), "", part, str(p))
                elif p.suffix == ".npy":
                    part[""] = (_from_numpy(np.load(p, allow_pickle=False), str(p)), str(p))
                else:
                    with np.load(p, allow_pickle=False) as z:
                        for key in z.files:
                            part[key] = (_from_numpy(z[key], f"{p}: {key}"), str(p))
            except ImportDataError:
                raise
            except Exception as exc:  # noqa: BLE001 - any reader's error (an UnpicklingError, a
                # SafetensorError: neither is an OSError / ValueError) names the file
                import pickle

                if isinstance(exc, pickle.UnpicklingError):  # torch's text advises unsafe loads
                    why = ("not a torch.save file of tensors (dicts / lists / tuples of them), "
                           "which is all this reader loads (torch.load weights_only=True)")
                else:
                    why = (str(exc).splitlines() or [""])[0]
                raise ImportDataError(f"{p}: cannot read it ({type(exc).__name__}: {why})"
                                      ) from None
            for key, val in part.items():
                name = ".".join(x for x in (prefix, key) if x)
                if name in out:
                    raise ImportDataError(f"{p}: tensor {name!r} also comes from {out[name][1]}")
                out[name] = val
    return out


def _natural(s: str):
    return [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", s)]


def _numbers(prefix: str) -> tuple[int | None, int | None]:
    """(step, layer) named in an entry prefix, None where it names none."""
    step = layer = None
    parts = prefix.split(".") if prefix else []
    for i, part in enumerate(parts):
        m = re.fullmatch(r"(?:step|s)_?(\d+)", part)
        if m:
            step = int(m.group(1))
            continue
        m = re.fullmatch(r"(?:layer|l|block)_?(\d+)", part)
        if m:
            layer = int(m.group(1))
            continue
        if part.isdigit() and layer is None:
            layer = int(part)
    return step, layer


def group_entries(tensors: dict[str, tuple[torch.Tensor, str]]) -> list[ImportedEntry]:
    """Group dotted names into (q, k, v) entries, check their shapes, number steps and layers."""
    groups: dict[str, dict[str, tuple[torch.Tensor, str]]] = {}
    unknown = []
    for name, val in tensors.items():
        prefix, _, leaf = name.rpartition(".")
        role = ROLES.get(leaf.lower())
        if role is None:
            unknown.append(f"{name} ({val[1]})")
            continue
        groups.setdefault(prefix, {})[role] = val
    if unknown:
        raise ImportDataError(f"tensors not named q, k or v: {', '.join(unknown[:6])}"
                           + (" ..." if len(unknown) > 6 else "")
                           + "; name them <entry>.q / .k / .v")
    if not groups:
        raise ImportDataError("no tensors found")
    entries = []
    prefixes = sorted(groups, key=_natural)
    seen: dict[tuple[int, int], str] = {}
    paths: dict[str, str] = {}
    for i, prefix in enumerate(prefixes):
        g = groups[prefix]
        label = prefix or "the source"
        missing = [r for r in "qkv" if r not in g]
        if missing:
            raise ImportDataError(f"{label}: has {', '.join(sorted(g))} but no "
                               f"{', '.join(missing)} ({next(iter(g.values()))[1]})")
        q, k, v = (_batched(g[r][0], f"{label}: {r}", g[r][1]) for r in "qkv")
        _check_shapes(q, k, v, label, g["q"][1])
        step, layer = _numbers(prefix)
        step = 0 if step is None else step
        layer = i if layer is None else layer
        if (step, layer) in seen:
            other = seen[(step, layer)]
            raise ImportDataError(f"{label}: step {step} layer {layer} is also {other!r}; name "
                                  "entries with distinct step<N> / layer<N>")
        seen[(step, layer)] = label
        name = prefix or "attention"
        path = entry_path(step, name)  # names differing only in unsafe characters share one
        if path in paths:
            raise ImportDataError(f"{label}: stored as {path}, as {paths[path]!r} is (names "
                                  "keep only letters, digits, '.', '_', '-'); rename one of them")
        paths[path] = label
        entries.append(ImportedEntry(name, step, layer, q, k, v))
    return entries


def _batched(t: torch.Tensor, what: str, where: str) -> torch.Tensor:
    if t.dtype not in FLOAT_DTYPES:
        raise ImportDataError(f"{what} ({where}): dtype {t.dtype} is not one of float16, bfloat16, "
                           "float32, float64")
    if t.dim() == 3:
        return t.unsqueeze(0)
    if t.dim() == 4:
        return t
    raise ImportDataError(f"{what} ({where}): shape {list(t.shape)}; expected [S, heads, head_dim] "
                       "or [B, S, heads, head_dim]")


def _check_shapes(q, k, v, label: str, where: str) -> None:
    want = "q [S, H, D], k and v [S, Hkv, D] (or with a leading batch dim)"
    sq, sk, sv = (list(t.shape) for t in (q, k, v))
    if k.shape != v.shape:
        raise ImportDataError(f"{label} ({where}): k {sk} and v {sv} differ; expected {want}")
    if q.shape[0] != k.shape[0]:
        raise ImportDataError(f"{label} ({where}): batch {q.shape[0]} of q and {k.shape[0]} of k "
                           "differ")
    if q.shape[-1] != k.shape[-1]:
        raise ImportDataError(f"{label} ({where}): head dim {q.shape[-1]} of q and "
                              f"{k.shape[-1]} of k differ (q {sq}, k {sk}); expected {want}")
    if q.shape[1] != k.shape[1]:
        # [H, S, D] read as [S, H, D]: q's "heads" dim holds the rows of the other tensor
        hint = "; heads first ([H, S, D])? transpose to [S, H, D]" \
            if q.shape[2] in (k.shape[1], k.shape[2]) else ""
        raise ImportDataError(f"{label} ({where}): q has {q.shape[1]} rows and k {k.shape[1]} "
                           f"(q {sq}, k {sk}); expected {want}{hint}")
    if k.shape[2] == 0 or q.shape[2] % k.shape[2]:
        raise ImportDataError(f"{label} ({where}): {q.shape[2]} query heads are not a multiple of "
                           f"{k.shape[2]} K/V heads (q {sq}, k {sk})")
    empty = [(n, list(t.shape)) for n, t in (("q", q), ("k", k), ("v", v)) if 0 in t.shape]
    if empty:
        raise ImportDataError(f"{label} ({where}): {empty[0][0]} {empty[0][1]} has a zero-length "
                              "dimension; nothing to store")
    if q.shape[1] < q.shape[2] and q.shape[2] == k.shape[2]:
        # [H, S, D] with H == Hkv passes every shape check as [S, H, D]; rows fewer than heads
        # is what that usually looks like (H3: 56 heads, 32,626 rows)
        warnings.warn(f"{label} ({where}): q {sq} is read as [S={q.shape[1]} rows, H={q.shape[2]} "
                      "heads, D]: fewer rows than heads; if the tensors are heads first "
                      "([H, S, D] or SDPA's [B, H, S, D]), transpose them to [.., S, H, D]",
                      stacklevel=3)
    if not q.dtype == k.dtype == v.dtype:
        # one store entry holds one dtype (its metadata records q's): cast them to one first
        raise ImportDataError(f"{label} ({where}): q is {q.dtype}, k {k.dtype}, v {v.dtype}; "
                              "give the three in one dtype (e.g. .to(torch.bfloat16))")


def import_tensors(sources, out, *, layout=None, rotated: int | None = None,
                   scale: float | None = None, causal: bool = False, progress: bool = False,
                   **capture_kw):
    """Write the q/k/v of `sources` into a new capture store `out`. Returns (Capture, entries).

    layout: a ``SegmentLayout`` or its CLI text (``prompt:200,answer:56``); default one segment
    ``tokens``. rotated: RoPE channels per head (0..D; None: not known). scale: the model's
    softmax scale when it is not 1/sqrt(D). causal: the model attends causally (replays mask).
    """
    from workbench.layout import SegmentLayout

    from .recorder import capture

    if scale is not None and not (math.isfinite(scale) and scale > 0):
        raise ImportDataError(f"--scale: the softmax scale must be finite and positive, got "
                              f"{scale}")
    entries = group_entries(read_tensors(sources))
    S, D = entries[0].q.shape[1], entries[0].q.shape[-1]
    for e in entries[1:]:
        if e.q.shape[1] != S or e.q.shape[-1] != D:
            raise ImportDataError(f"{e.name}: {e.q.shape[1]} rows x head dim {e.q.shape[-1]}, but "
                               f"{entries[0].name} has {S} x {D}; one store holds one sequence "
                               "shape")
    if isinstance(layout, str):
        layout = SegmentLayout.parse(layout)
    layout = layout or SegmentLayout.tokens(S)
    if layout.total != S:
        raise ImportDataError(f"--layout: segments sum to {layout.total} rows but the tensors have "
                           f"{S} ({layout.describe()})")
    if rotated is not None and not 0 <= rotated <= D:
        raise ImportDataError(f"--rotated: {rotated} channels do not fit head dim {D} (0..{D})")
    attrs = {"source": "import", "imported_from": [str(s) for s in sources], "causal": causal}
    if scale is not None:
        attrs["softmax_scale"] = float(scale)
    attrs.update(capture_kw.pop("extra_attrs", {}) or {})
    with capture(None, out, layout=layout, rotated_channels=rotated, extra_attrs=attrs,
                 progress=progress, **capture_kw) as cap:
        for e in entries:
            cap.record(e.name, e.q, e.k, e.v, step=e.step, layer=e.layer)
    return cap, entries

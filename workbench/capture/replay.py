"""Replay a capture store offline: ``open_capture(path)``.

``cap.qkv(step, layer, heads=..., device=...)`` -> (q, k, v) torch tensors [B, S, H, D] in the dtype
they were captured in (bf16 / fp8 come back bit-exact from their uint16 / uint8 views).
``cap.to_xarray()`` -> a lazy (dask-backed) xarray Dataset over (step, layer, batch, token, head,
channel); nothing is read until values are asked for.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import zarr

from workbench.layout import SegmentLayout

from .schema import (
    CHUNK_RECORD,
    STATUS_COMPLETE,
    CaptureStoreError,
    ChecksumError,
    IncompleteEntryError,
    MetadataError,
    MissingChunkError,
    check_schema,
    from_numpy_bits,
    torch_dtype,
)
from .validate import (
    BLOCK_NAME,
    array_names,
    attributes_of,
    array_problems,
    chunk_keys,
    entry_problems,
    group_problems,
    load_json,
    root_problems,
)

UNREADABLE, INVALID = "unreadable", "invalid"  # statuses of entries whose metadata is damaged


@dataclass(frozen=True)
class EntryInfo:
    """One (step, name) entry of a store, as listed (data not read)."""

    path: str
    name: str
    layer: int | None
    step: int | None
    status: str  # "complete" | "writing" (started, never finished) | "unreadable" | "invalid"
    torch_dtype: str | None
    shape_q: tuple[int, ...] | None
    shape_kv: tuple[int, ...] | None
    nbytes: int
    timestep: float | None = None
    problem: str | None = None  # why the entry's metadata is unreadable / invalid

    @property
    def complete(self) -> bool:
        return self.status == STATUS_COMPLETE


def _is_checksum_error(exc: BaseException) -> bool:
    return "checksum" in str(exc).lower()


def bits_to_float32(a: np.ndarray, dtype_name: str) -> np.ndarray:
    """Stored values -> float32 numpy (bf16 / fp8 bit views decoded). Used by the lazy view."""
    dt = torch_dtype(dtype_name)
    return from_numpy_bits(a, dt).float().numpy()


class CaptureReader:
    """A capture store opened for reading. Safe to open while a writer is still filling it."""

    def __init__(self, path: str | os.PathLike, strict: bool = True):
        """strict=False opens a store whose root attributes break the schema (``verify`` lists
        the problems); by default such a store is refused, naming the file and field."""
        self.path = Path(path)
        root_file = self.path / "zarr.json"
        if not root_file.exists():
            raise FileNotFoundError(f"{self.path}: no capture store here (no zarr.json)")
        meta = load_json(root_file, str(root_file))
        check_schema(attributes_of(meta), str(self.path))
        self.root_problems = root_problems(meta, str(root_file))
        if strict and self.root_problems:
            raise MetadataError(self.root_problems[0] + "; see workbench inspect --verify")
        try:
            self.root = zarr.open_group(str(self.path), mode="r")
        except Exception as exc:  # noqa: BLE001 - say which store, keep the cause
            raise CaptureStoreError(f"{self.path}: cannot open store: {exc}") from exc
        self.attrs: dict[str, Any] = dict(self.root.attrs)
        self._entries: list[EntryInfo] | None = None
        self._meta: dict[str, tuple[dict, dict]] = {}  # entry path -> (attrs, {array: metadata})
        self._crc_checked: set = set()  # (entry path, array) whose recorded crc32c tails match

    # listing --------------------------------------------------------------------------------------
    def refresh(self) -> None:
        """Re-list entries (a writer may have completed more since the last listing)."""
        self._entries = None
        self._crc_checked = set()
        self._meta = {}
        self.attrs = dict(zarr.open_group(str(self.path), mode="r").attrs)

    def entries(self, include_incomplete: bool = True) -> list[EntryInfo]:
        """Every entry, sorted by (step, layer, name); incomplete ones have status != complete."""
        if self._entries is None:
            self._entries = self._scan()
        return [e for e in self._entries if include_incomplete or e.complete]

    def _scan(self) -> list[EntryInfo]:
        out = []
        base = self.path / "entries"
        if not base.is_dir():
            return out
        # Walk the directory rather than trusting any listing metadata: a concurrent writer adds
        # groups at any time, and a killed one can leave a group without its arrays.
        for step_dir in sorted(p for p in base.iterdir() if p.is_dir()):
            for entry_dir in sorted(p for p in step_dir.iterdir() if p.is_dir()):
                rel = f"entries/{step_dir.name}/{entry_dir.name}"
                try:
                    a = load_json(entry_dir / "zarr.json", f"{self.path}/{rel}/zarr.json")
                    a = attributes_of(a)
                except MetadataError as exc:
                    step, layer = _folder_step_layer(step_dir.name, entry_dir.name)
                    out.append(EntryInfo(rel, entry_dir.name, layer, step, UNREADABLE, None,
                                         None, None, 0, problem=str(exc)))
                    continue
                problems = entry_problems(a, f"{self.path}/{rel}/zarr.json", rel)
                if problems:
                    step, layer = _folder_step_layer(step_dir.name, entry_dir.name)
                    out.append(EntryInfo(rel, entry_dir.name, layer, step, INVALID, None, None,
                                         None, 0, problem="; ".join(problems)))
                    continue
                sq, skv = a["shape_q"], a["shape_kv"]
                isz = torch.empty((), dtype=torch_dtype(a["torch_dtype"])).element_size()
                nbytes = (int(np.prod(sq)) + 2 * int(np.prod(skv))) * isz
                out.append(EntryInfo(
                    path=rel, name=a["name"], layer=a.get("layer"), step=a.get("step"),
                    status=a["status"], torch_dtype=a["torch_dtype"], shape_q=tuple(sq),
                    shape_kv=tuple(skv), nbytes=nbytes, timestep=a.get("timestep"),
                ))
        out.sort(key=lambda e: (e.step if e.step is not None else -1,
                                e.layer if e.layer is not None else -1, e.name))
        return out

    @property
    def steps(self) -> list[int]:
        return sorted({e.step for e in self.entries(False) if e.step is not None})

    @property
    def layers(self) -> list[int]:
        return sorted({e.layer for e in self.entries(False) if e.layer is not None})

    @property
    def incomplete(self) -> list[EntryInfo]:
        return [e for e in self.entries() if not e.complete]

    # metadata -------------------------------------------------------------------------------------
    @property
    def layout(self) -> SegmentLayout:
        """Segment layout of the packed sequence; one segment ``tokens`` over the captured length
        when the store does not record one."""
        d = self.attrs.get("segment_layout")
        done = self.entries(False)
        if d:
            where = f"{self.path / 'zarr.json'}: attribute 'segment_layout'"
            try:
                layout = SegmentLayout.from_dict(d)
            except (TypeError, ValueError, AttributeError) as exc:
                raise MetadataError(f"{where}: {exc}") from None
            if done and layout.total != done[0].shape_kv[1]:
                raise MetadataError(f"{where}: its segments sum to {layout.total} rows, but the "
                                    f"entries hold {done[0].shape_kv[1]} tokens")
            return layout
        if not done:
            raise CaptureStoreError(f"{self.path}: no complete entries and no segment layout")
        return SegmentLayout.tokens(done[0].shape_kv[1])

    @property
    def rotated_channels(self) -> int | None:
        r = _int_or_none(self.attrs.get("rotated_channels"))
        done = self.entries(False)
        if r is not None and done and not 0 <= r <= done[0].shape_q[-1]:
            raise MetadataError(f"{self.path / 'zarr.json'}: attribute 'rotated_channels' is {r}, "
                                f"not a channel count of the entries' head dim "
                                f"{done[0].shape_q[-1]} (0..{done[0].shape_q[-1]})")
        return r

    def _absent_requested(self) -> list[str]:
        """A note naming the (step, layer) entries the capture asked for (root attributes
        ``steps_requested`` x ``layers_requested``) that the store does not hold: a removed entry
        folder leaves no other trace. A note, not a problem: a run with fewer steps than were
        asked for leaves the same gap."""
        steps, layers = self.attrs.get("steps_requested"), self.attrs.get("layers_requested")
        if not all(isinstance(x, list) and x and all(type(v) is int for v in x)
                   for x in (steps, layers)):
            return []  # "every step / layer" (None) or a store without a request: nothing to miss
        have = {(e.step, e.layer) for e in self.entries()}
        absent = [(s, b) for s in steps for b in layers if (s, b) not in have]
        if not absent:
            return []
        s0, l0 = absent[0]
        verb = "entry is" if len(absent) == 1 else "entries are"
        return [f"{len(absent)} requested (step, layer) {verb} "
                f"not in the store (steps_requested x layers_requested in {self.path}/zarr.json); "
                f"first: step {s0}, layer {l0}: a run with fewer steps, or an entry folder "
                "removed"]

    def _root_attr_problems(self) -> list[str]:
        """The segment layout and RoPE channel count checked against the entries (``verify``)."""
        problems = []
        for name in ("layout", "rotated_channels"):
            try:
                getattr(self, name)
            except MetadataError as exc:
                problems.append(str(exc))
            except CaptureStoreError:
                pass  # no entries and no layout: nothing to check against
        return problems

    def attention_call(self, step: int | None = None, layer: int | str | None = None) -> dict:
        """How the model attended: {"causal", "scale", "mask_shape"}. The store's own attributes
        (``causal``, ``softmax_scale``, written by ``workbench import``) win; else the SDPA
        arguments recorded with the entry at (step, layer) (default: the first complete one; an
        encoder-decoder's entries differ: the decoder passes ``is_causal=True``); else
        non-causal, scale 1/sqrt(D) (None)."""
        sdpa, mask = {}, None
        done = self.entries(False)
        if layer is not None:
            done = [self.find(step, layer)]
        if done:
            attrs, _ = self.entry_metadata(done[0])
            sdpa, mask = dict(attrs.get("sdpa_kwargs") or {}), attrs.get("attn_mask_shape")
        causal = self.attrs.get("causal")
        scale = self.attrs.get("softmax_scale")
        return {"causal": bool(sdpa.get("is_causal", False) if causal is None else causal),
                "scale": sdpa.get("scale") if scale is None else scale, "mask_shape": mask}

    @property
    def recipe(self):
        """The recipe the run used: an ``AttentionRecipe``, a ``RecipePlan`` (a capture made
        while generating with a per-(step, layer) plan), "native" (the model's own attention) or
        None (a capture without one)."""
        from workbench.recipes import get_recipe

        r = self.attrs.get("recipe")
        return r if r is None or r == "native" else get_recipe(r)

    # data -----------------------------------------------------------------------------------------
    def find(self, step: int | None, layer: int | str) -> EntryInfo:
        """The entry at (step, layer), where layer is a block index or an entry name."""
        matches = [e for e in self.entries()
                   if e.step == step and (e.name == layer if isinstance(layer, str)
                                          else e.layer == layer)]
        if not matches:
            have = sorted({(e.step, e.layer if e.layer is not None else e.name)
                           for e in self.entries(False)}, key=str)
            damaged = [e.path for e in self.entries() if e.problem is not None]
            note = (f"; {len(damaged)} entr{'y has' if len(damaged) == 1 else 'ies have'} "
                    f"damaged metadata (workbench inspect --verify): {damaged[:3]}"
                    if damaged else "")
            raise KeyError(f"{self.path}: no entry at step={step} layer={layer!r}; complete "
                           f"entries (step, layer): {have[:20]}{' ...' if len(have) > 20 else ''}"
                           f"{note}")
        e = matches[0]
        if e.status in (UNREADABLE, INVALID):
            raise MetadataError(f"{self.path}: entry {e.path} (step={step}, layer={layer}) has "
                                f"damaged metadata: {e.problem}")
        if not e.complete:
            raise IncompleteEntryError(
                f"{self.path}: entry {e.path} (step={step}, layer={layer}) is incomplete "
                f"(status {e.status!r}): its capture stopped before the data was fully written; "
                f"resume the capture to rewrite it"
            )
        return e

    def entry_metadata(self, e: EntryInfo) -> tuple[dict, dict]:
        """(entry attributes, {array: zarr metadata}) checked against the schema; MetadataError
        naming the file and field otherwise."""
        if e.path not in self._meta:
            attrs, arrays, problems = _entry_check(self.path, e)
            if problems:
                more = (f" (and {len(problems) - 1} more problem(s); see workbench inspect "
                        f"--verify)" if len(problems) > 1 else "")
                raise MetadataError(problems[0] + more)
            self._meta[e.path] = (attrs, arrays)
        return self._meta[e.path]

    def _require_chunks(self, e: EntryInfo, array: str) -> None:
        """Every chunk the entry records for ``array`` must be on disk: zarr reads a missing
        chunk as its fill value (zeros), which would pass for data."""
        attrs, _ = self.entry_metadata(e)
        record = attrs.get(CHUNK_RECORD)
        if record is None:
            return  # written before chunk records existed (see verify)
        keys = record.get(array)
        if keys is None:
            raise MissingChunkError(f"{self.path}: entry {e.path} has no chunk record for array "
                                    f"{array!r}")
        folder = self.path / e.path / array
        missing = [k for k in keys if not (folder / k).is_file()]
        if missing:
            raise MissingChunkError(
                f"{self.path}: entry {e.path} (step={e.step}, layer={e.layer}, name={e.name}), "
                f"array {array!r}: chunk {missing[0]} is missing ({len(missing)} of {len(keys)} "
                f"recorded chunks gone); its values cannot be read back (zarr would return zeros)"
            )
        # a chunk swapped for another (of another entry, or an older run) passes its own
        # crc32c: the one stored with it (its last 4 bytes) must be the one recorded at write
        # time (4 bytes read per chunk, once per entry and array of this reader: a complete
        # entry is not rewritten)
        checked = self._crc_checked
        if isinstance(keys, dict) and (e.path, array) not in checked:
            for k, want in keys.items():
                if not isinstance(want, int) or isinstance(want, bool):
                    continue
                with open(folder / k, "rb") as fh:
                    fh.seek(0, os.SEEK_END)
                    if fh.tell() < 4:
                        got = None
                    else:
                        fh.seek(-4, os.SEEK_END)
                        got = int.from_bytes(fh.read(4), "little")
                if got != want:
                    raise ChecksumError(
                        f"{self.path}: checksum mismatch in entry {e.path} (step={e.step}, "
                        f"layer={e.layer}, name={e.name}), array {array!r}, chunk {k}: the "
                        "crc32c stored with it differs from the one recorded when the entry "
                        "was written (a corrupt or replaced chunk)")
            checked.add((e.path, array))

    def _read(self, e: EntryInfo, array: str, selection) -> np.ndarray:
        self._require_chunks(e, array)
        try:
            arr = self.root[f"{e.path}/{array}"]
            return arr.get_orthogonal_selection(selection)
        except Exception as exc:  # noqa: BLE001 - name the entry in whatever went wrong
            if _is_checksum_error(exc):
                raise ChecksumError(
                    f"{self.path}: checksum mismatch in entry {e.path} (step={e.step}, "
                    f"layer={e.layer}, name={e.name}), array {array!r}: the stored chunk is "
                    f"corrupt ({exc})"
                ) from exc
            raise CaptureStoreError(
                f"{self.path}: reading entry {e.path} array {array!r} failed: {exc}"
            ) from exc

    def qkv(
        self,
        step: int | None,
        layer: int | str,
        heads=None,
        device: str | torch.device | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(q, k, v) at (step, layer): torch tensors [B, S, H, D] in their captured dtype.

        heads: query head ids of the captured model (K/V heads they read come along under GQA).
        When the capture kept only some query rows, q holds those rows (see ``query_rows``).
        """
        e = self.find(step, layer)
        meta, _ = self.entry_metadata(e)
        q_heads, kv_heads = list(meta["q_heads"]), list(meta["kv_heads"])
        q_sel, kv_sel, kv_expand = slice(None), slice(None), None
        group = meta["num_heads"] // meta["num_kv_heads"]
        if heads is None and _kv_pairing(q_heads, kv_heads, group)[1] is not None:
            heads = q_heads  # stored heads that are not whole groups in order: pair them below
        if heads is not None:
            heads = [int(h) for h in heads]
            if not heads:
                raise ValueError(f"{self.path}: heads: an empty list; give query head ids or "
                                 "None (all)")
            missing = [h for h in heads if h not in q_heads]
            if missing:
                raise KeyError(f"{self.path}: entry {e.path} has no heads {missing}; captured "
                               f"heads: {q_heads}")
            q_sel = [q_heads.index(h) for h in heads]
            kv_sel, kv_expand = _kv_pairing(heads, kv_heads, group)
        dt = torch_dtype(e.torch_dtype)
        out = []
        for name, sel in (("q", q_sel), ("k", kv_sel), ("v", kv_sel)):
            a = self._read(e, name, (slice(None), slice(None), sel, slice(None)))
            if name != "q" and kv_expand is not None:
                a = a[:, :, kv_expand]
            t = from_numpy_bits(a, dt)
            out.append(t.to(device) if device is not None else t)
        return tuple(out)

    def query_rows(self, step: int | None, layer: int | str) -> torch.Tensor | None:
        """The q rows kept for this entry, or None when every row was kept."""
        e = self.find(step, layer)
        if not self.entry_metadata(e)[0].get("has_query_rows"):
            return None
        return torch.from_numpy(self._read(e, "q_rows", (slice(None),)))

    def verify(self) -> list[str]:
        """Check every metadata file against the schema and every chunk of every complete entry
        against its crc32c and the entry's chunk record; one line per problem, all of them."""
        return self.verify_report()[0]

    def verify_report(self) -> tuple[list[str], list[str]]:
        """(problems, notes): ``verify`` plus notes that are not errors (e.g. entries written
        before chunk records existed, whose missing chunks cannot be told from all-zero ones)."""
        problems: list[str] = list(self.root_problems) + self._root_attr_problems()
        unrecorded: list[str] = []
        base = self.path / "entries"
        group_dirs = [base, *sorted(p for p in base.iterdir() if p.is_dir())] \
            if base.is_dir() else []
        for d in group_dirs:
            f = d / "zarr.json"
            try:
                problems += group_problems(load_json(f, str(f)), str(f))
            except MetadataError as exc:
                problems.append(str(exc))
        for e in self.entries():
            if e.status in (UNREADABLE, INVALID):
                problems.append(e.problem or f"{e.path}: {e.status}")
                continue
            if not e.complete:
                problems.append(f"{e.path}: incomplete (status {e.status})")
                continue
            attrs, arrays, entry_bad = _entry_check(self.path, e)
            problems += entry_bad
            if entry_bad:
                continue
            if CHUNK_RECORD not in attrs:
                unrecorded.append(e.path)
            for name, meta in arrays.items():
                problems += _chunk_problems(self, e, name, meta, attrs.get(CHUNK_RECORD))
        notes = self._absent_requested()
        if unrecorded:
            notes.append(
                f"{len(unrecorded)} complete entr{'y' if len(unrecorded) == 1 else 'ies'} predate "
                f"chunk records (no {CHUNK_RECORD} attribute): their chunks were checked against "
                f"the array's chunk grid; first: {unrecorded[0]}")
        return problems, notes

    # xarray ---------------------------------------------------------------------------------------
    def to_xarray(self, decode: bool = False):
        """Lazy xarray Dataset of the complete entries on the (step, layer) grid.

        Variables q, k, v: (step, layer, batch, token, head, channel), dask-backed; entries missing
        from the grid read as zeros and ``complete`` (step, layer) says which are real. Stored bits
        (uint16 for bf16, uint8 for fp8) unless ``decode=True``, which maps blocks to float32
        lazily. Coordinates ``head`` / ``kv_head`` are the captured heads' ids and ``q_token``
        the sequence rows of q (a subset when the capture kept some rows). Entries whose shapes,
        dtype, heads or rows differ from the first are left out (listed in attrs).
        """
        import dask.array as da
        import xarray as xr

        done = [e for e in self.entries(False) if e.layer is not None and e.step is not None]
        if not done:
            raise CaptureStoreError(f"{self.path}: no complete (step, layer) entries to view")
        first = done[0]

        def heads_rows(e):
            """(q heads, K/V heads, kept q rows or None): the labels of an entry's head and
            q_token positions (a head subset or a row subset is not positions 0..n-1)."""
            meta = self.entry_metadata(e)[0]
            rows = (tuple(int(x) for x in self._read(e, "q_rows", (slice(None),)))
                    if meta.get("has_query_rows") else None)
            return tuple(meta["q_heads"]), tuple(meta["kv_heads"]), rows

        labels = heads_rows(first)
        same = [e for e in done if e.shape_q == first.shape_q and e.shape_kv == first.shape_kv
                and e.torch_dtype == first.torch_dtype and heads_rows(e) == labels]
        q_heads, kv_heads, q_rows = labels
        steps = sorted({e.step for e in same})
        layers = sorted({e.layer for e in same})
        by_key = {(e.step, e.layer): e for e in same}
        names = {e.layer: e.name for e in same}
        timesteps = {e.step: e.timestep for e in same}
        data_vars = {}
        for var, shape in (("q", first.shape_q), ("k", first.shape_kv), ("v", first.shape_kv)):
            rows = []
            for s in steps:
                row = []
                for lay in layers:
                    e = by_key.get((s, lay))
                    if e is not None:
                        self._require_chunks(e, var)
                    if e is None:
                        np_dt = self.root[f"{first.path}/{var}"].dtype
                        row.append(da.zeros(shape, dtype=np_dt))
                        continue
                    arr = da.from_zarr(self.root[f"{e.path}/{var}"])
                    row.append(arr)
                rows.append(da.stack(row))
            stacked = da.stack(rows)
            if decode:
                stacked = stacked.map_blocks(bits_to_float32, first.torch_dtype,
                                             dtype=np.float32)
            data_vars[var] = (("step", "layer", "batch", "token" if var != "q" else "q_token",
                               "head" if var == "q" else "kv_head", "channel"), stacked)
        complete = np.array([[(s, lay) in by_key for lay in layers] for s in steps])
        ts = [np.nan if timesteps.get(s) is None else timesteps[s] for s in steps]
        ds = xr.Dataset(
            data_vars,
            coords={
                "step": steps,
                "layer": layers,
                "layer_name": ("layer", [names[lay] for lay in layers]),
                "timestep": ("step", ts),
                "complete": (("step", "layer"), complete),
                # the captured ids: .sel(head=h) is model head h, .sel(q_token=r) sequence row r
                "head": list(q_heads),
                "kv_head": list(kv_heads),
                "q_token": list(q_rows) if q_rows is not None else np.arange(first.shape_q[1]),
                "token": np.arange(first.shape_kv[1]),
            },
            attrs={
                "store": str(self.path),
                "torch_dtype": first.torch_dtype,
                "decoded": bool(decode),
                "rotated_channels": self.rotated_channels,
                "segment_layout": json.dumps(self.attrs.get("segment_layout")),
                "left_out": json.dumps([e.path for e in done if e not in same]),
            },
        )
        return ds


def _int_or_none(x):
    return x if isinstance(x, int) and not isinstance(x, bool) else None


def _entry_check(store: Path, e: EntryInfo) -> tuple[dict, dict, list[str]]:
    """(attrs, {array: metadata}, problems) of one entry, every problem naming its file."""
    f = store / e.path / "zarr.json"
    try:
        meta = load_json(f, str(f))
    except MetadataError as exc:
        return {}, {}, [str(exc)]
    attrs = attributes_of(meta)
    problems = group_problems(meta, str(f)) + entry_problems(attrs, str(f), e.path)
    arrays: dict = {}
    if problems:
        return attrs, arrays, problems
    for name in array_names(attrs):
        af = store / e.path / name / "zarr.json"
        try:
            meta = load_json(af, str(af))
        except MetadataError as exc:
            problems.append(str(exc))
            continue
        bad = array_problems(meta, str(af), name, attrs)
        problems += bad
        if not bad:
            arrays[name] = meta
    record = attrs.get(CHUNK_RECORD)
    if record is not None:
        for name, meta in arrays.items():
            keys = record.get(name)
            if keys is None or set(keys) != set(chunk_keys(meta)):
                problems.append(f"{f}: {CHUNK_RECORD} for array {name!r} lists "
                                f"{None if keys is None else len(keys)} chunks, the array's grid "
                                f"has {len(chunk_keys(meta))}")
    return attrs, arrays, problems


def _kv_pairing(heads: list[int], kv_heads: list[int], group: int):
    """(stored K/V head indices to read, ascending; None, or the index of each query head's K/V
    head among them). None when `heads` are whole runs of equal length per K/V head in order, so
    GQA's i // (H / Hkv) rule pairs them; else one K/V head per query head (a group's read once,
    repeated), so q head i reads K/V head i."""
    need = [kv_heads.index(h // group) for h in heads]  # the K/V head of each q head
    sel = sorted(set(need))
    g = len(need) // len(sel)
    return sel, (None if need == [u for u in sel for _ in range(g)]
                 else [sel.index(x) for x in need])


def _chunk_problems(reader: CaptureReader, e: EntryInfo, name: str, meta: dict,
                    record: dict | None) -> list[str]:
    """One array of one complete entry: every chunk file present, its stored crc32c equal to the
    one recorded at write time (a chunk swapped for another passes its own checksum), then every
    chunk decoded through zarr (each chunk's bytes against its crc32c, and the metadata decoding
    them to the array's shape)."""
    import google_crc32c

    out = []
    folder = reader.path / e.path / name
    where = f"{reader.path}: entry {e.path} array {name!r}"
    keys = chunk_keys(meta)
    for key in keys:
        f = folder / key
        try:
            size = f.stat().st_size
        except FileNotFoundError:
            why = ("recorded at write time" if record is not None else
                   "no chunk record: an all-zero chunk written without write_empty_chunks would "
                   "also be absent")
            out.append(f"{where}: chunk {key} is missing ({why})")
            continue
        want = (record or {}).get(name, {}).get(key)
        if size < 4:
            out.append(f"{where}: checksum mismatch in chunk {key}: {size} bytes, truncated")
        elif want is not None:
            with open(f, "rb") as fh:
                fh.seek(-4, os.SEEK_END)
                if int.from_bytes(fh.read(4), "little") != want:
                    out.append(f"{where}: checksum mismatch in chunk {key}: the crc32c stored "
                               f"with it differs from the one recorded when the entry was "
                               f"written (a corrupt or replaced chunk)")
    if out:
        return out
    try:
        reader._read(e, name, (slice(None),) * len(meta["shape"]))
    except ChecksumError as exc:
        for key in keys:  # name the chunk(s)
            data = (folder / key).read_bytes()
            if google_crc32c.value(data[:-4]) != int.from_bytes(data[-4:], "little"):
                out.append(f"{where}: checksum mismatch in chunk {key} ({len(data)} bytes): the "
                           f"stored chunk is corrupt")
        out = out or [str(exc)]
    except CaptureStoreError as exc:
        out.append(str(exc))
    return out


def _folder_step_layer(step_dir: str, entry_dir: str) -> tuple[int | None, int | None]:
    """(step, layer) an entry's folder names (s00003 / transformer_blocks.1), for entries whose
    metadata cannot say: so that asking for them names the damage instead of 'no entry'."""
    step = int(step_dir[1:]) if step_dir[1:].isdigit() else None
    block = BLOCK_NAME.fullmatch(entry_dir)
    return step, int(block[1]) if block else None


def open_capture(path: str | os.PathLike, strict: bool = True) -> CaptureReader:
    """Open a capture store for replay (refuses unknown / newer schema versions, and root
    attributes that break the schema unless ``strict=False``)."""
    return CaptureReader(path, strict=strict)

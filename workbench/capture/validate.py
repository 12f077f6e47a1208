"""Schema checks of every JSON file of a capture store; each problem names the file and the field.

``load_json(path, rel)`` reads one metadata file; ``root_problems``, ``entry_problems`` and
``array_problems`` return one line per problem (empty when the file follows the schema in
docs/store_schema.md). The reader raises the first problem as ``MetadataError`` before it uses an
entry; ``CaptureReader.verify`` lists all of them.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import numpy as np

from .schema import (
    CHUNK_RECORD,
    DIMS,
    QKV,
    SCHEMA_NAME,
    STATUS_COMPLETE,
    STATUS_WRITING,
    MetadataError,
    _STORED,
    dtype_name,
    entry_path,
)

BLOCK_NAME = re.compile(r"transformer_blocks\.(\d+)")  # H3 entries: the layer is in the name
_DTYPES = {dtype_name(d): np_dt for d, (np_dt, _) in _STORED.items()}
KNOWN_STATUS = (STATUS_WRITING, STATUS_COMPLETE)


def load_json(path: Path, rel: str) -> dict:
    """Parse one metadata file; MetadataError naming ``rel`` when it is missing or not JSON."""
    try:
        meta = json.loads(path.read_text())
    except FileNotFoundError:
        raise MetadataError(f"{rel}: missing") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise MetadataError(f"{rel}: unreadable ({exc})") from None
    except ValueError as exc:
        raise MetadataError(f"{rel}: not valid JSON ({exc})") from None
    if not isinstance(meta, dict):
        raise MetadataError(f"{rel}: expected a JSON object, got {type(meta).__name__}")
    return meta


def attributes_of(meta: dict) -> dict:
    """A metadata document's ``attributes`` ({} when absent or not an object; the schema checks
    report that)."""
    a = meta.get("attributes")
    return a if isinstance(a, dict) else {}


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _int_list(x, n: int | None = None, positive: bool = False) -> bool:
    return (isinstance(x, list) and all(_is_int(i) and (i > 0 if positive else i >= 0) for i in x)
            and (n is None or len(x) == n))


def _node(meta: dict, rel: str, kind: str) -> list[str]:
    out = []
    if meta.get("zarr_format") != 3:
        out.append(f"{rel}: zarr_format is {meta.get('zarr_format')!r}, expected 3")
    if meta.get("node_type") != kind:
        out.append(f"{rel}: node_type is {meta.get('node_type')!r}, expected {kind!r}")
    if not isinstance(meta.get("attributes", {}), dict):
        out.append(f"{rel}: attributes is not a JSON object")
    return out


def group_problems(meta: dict, rel: str) -> list[str]:
    """A plain group (entries/, entries/s00005/): zarr v3 group metadata."""
    return _node(meta, rel, "group")


_NUM = (int, float)
_NONE = type(None)
_ROOT_TYPES = {
    "schema": (str,), "tensor_layout": (str,), "capture_point": (str,),
    "model_class": (str, _NONE), "model_config": (dict, _NONE), "model_dtype": (str, _NONE),
    "model_name": (str, _NONE), "checkpoint_id": (str, _NONE), "h3_config": (dict, _NONE),
    "segment_layout": (dict, _NONE), "recipe": (str, _NONE), "prompt": (str, int, _NONE),
    "include_refiner": (bool,), "library_versions": (dict,),
    "created_unix": _NUM, "resumed_unix": _NUM, "last_closed_unix": _NUM,
}
_ROOT_INTS = ("schema_version", "rotated_channels", "seed", "sampling_grid_points", "resume_count")
_ROOT_INT_LISTS = ("layers_requested", "steps_requested", "heads", "query_rows")
_ENTRY_TYPES = {
    "timestep": (int, float, _NONE), "source": (str,), "layout_seen": (str,),
    "sdpa_kwargs": (dict,), "attn_mask_shape": (list, _NONE), "compressor": (str,),
    "submitted_unix": _NUM, "completed_unix": _NUM, "seq_len": (int,),
}


def _type_problems(a: dict, types: dict, rel: str) -> list[str]:
    out = []
    for key, allowed in types.items():
        if key in a and (not isinstance(a[key], allowed) or (
                isinstance(a[key], bool) and bool not in allowed)):
            want = " or ".join("null" if t is _NONE else t.__name__ for t in allowed)
            out.append(f"{rel}: {key} has type {type(a[key]).__name__}, expected {want}")
    return out


def root_problems(meta: dict, rel: str = "zarr.json") -> list[str]:
    out = _node(meta, rel, "group")
    a = attributes_of(meta)
    if a.get("schema") != SCHEMA_NAME:
        out.append(f"{rel}: schema is {a.get('schema')!r}, expected {SCHEMA_NAME!r}")
    out += _type_problems(a, _ROOT_TYPES, rel)
    for key in _ROOT_INTS:
        if key in a and a[key] is not None and not (_is_int(a[key]) and a[key] >= 0):
            out.append(f"{rel}: {key} is {a[key]!r}, expected a non-negative integer or null")
    for key in _ROOT_INT_LISTS:
        if key in a and a[key] is not None and not _int_list(a[key]):
            out.append(f"{rel}: {key} is {a[key]!r}, expected a list of non-negative integers")
    if a.get("tensor_layout", "BSHD") != "BSHD":
        out.append(f"{rel}: tensor_layout is {a['tensor_layout']!r}, expected 'BSHD'")
    seg = a.get("segment_layout")
    if isinstance(seg, dict):
        from workbench.layout import SegmentLayout

        try:  # H3's four row counts, or named segments (docs/store_schema.md)
            SegmentLayout.from_dict(seg)
        except (ValueError, TypeError) as exc:
            out.append(f"{rel}: segment_layout {json.dumps(seg)[:200]} is not a layout ({exc})")
    for key, want in (("softmax_scale", "a finite positive number"),
                      ("causal", "true or false")):
        if key in a and a[key] is not None:
            ok = (isinstance(a[key], bool) if key == "causal" else
                  isinstance(a[key], _NUM) and not isinstance(a[key], bool)
                  and math.isfinite(a[key]) and a[key] > 0)
            if not ok:
                out.append(f"{rel}: {key} is {a[key]!r}, expected {want}")
    if isinstance(a.get("recipe"), str) and a["recipe"] != "native":
        try:
            json.loads(a["recipe"])
        except ValueError:
            out.append(f"{rel}: recipe is not a JSON recipe spec")
        else:
            from workbench.recipes import get_recipe

            try:  # JSON that is no recipe (or plan) this release reads
                get_recipe(a["recipe"])
            except (ValueError, TypeError, KeyError, OverflowError) as exc:
                out.append(f"{rel}: recipe cannot be read as a recipe ({str(exc)[:160]})")
    return out


def entry_problems(attrs: dict, rel: str, entry: str | None = None) -> list[str]:
    """Entry attributes: types, and shapes / heads / step / name that agree with each other and
    with the entry's folder ``entry`` ("entries/s00003/transformer_blocks.1")."""
    out = []

    def bad(field, value, want):
        out.append(f"{rel}: {field} is {value!r}, expected {want}")

    name = attrs.get("name")
    if not isinstance(name, str) or not name:
        bad("name", name, "a non-empty string")
    for key in ("step", "layer"):
        if attrs.get(key) is not None and not (_is_int(attrs[key]) and attrs[key] >= 0):
            bad(key, attrs.get(key), "a non-negative integer or null")
    if entry is not None and not out and entry_path(attrs.get("step"), name) != entry:
        out.append(f"{rel}: step {attrs.get('step')!r} and name {name!r} do not match the "
                   f"entry's folder {entry!r}")
    block = BLOCK_NAME.fullmatch(name) if isinstance(name, str) else None
    if block and attrs.get("layer") != int(block[1]):
        bad("layer", attrs.get("layer"), f"{int(block[1])} (the block index in its name)")
    if attrs.get("status") not in KNOWN_STATUS:
        bad("status", attrs.get("status"), f"one of {list(KNOWN_STATUS)}")
    if not isinstance(attrs.get("torch_dtype"), str) or attrs["torch_dtype"] not in _DTYPES:
        bad("torch_dtype", attrs.get("torch_dtype"), f"one of {sorted(_DTYPES)}")
    sq, skv = attrs.get("shape_q"), attrs.get("shape_kv")
    if not _int_list(sq, 4, positive=True):
        bad("shape_q", sq, "4 positive integers [B, S, H, D]")
    if not _int_list(skv, 4, positive=True):
        bad("shape_kv", skv, "4 positive integers [B, S, Hkv, D]")
    for key in ("num_heads", "num_kv_heads"):
        if not (_is_int(attrs.get(key)) and attrs[key] > 0):
            bad(key, attrs.get(key), "a positive integer")
    for key in ("q_heads", "kv_heads"):
        if not _int_list(attrs.get(key)):
            bad(key, attrs.get(key), "a list of head ids")
    if not isinstance(attrs.get("has_query_rows"), bool):
        bad("has_query_rows", attrs.get("has_query_rows"), "true or false")
    if CHUNK_RECORD in attrs and not _chunk_record_ok(attrs[CHUNK_RECORD]):
        bad(CHUNK_RECORD, "...", "{array: {chunk key: crc32c}}")
    out += _type_problems(attrs, _ENTRY_TYPES, rel)
    if out:
        return out
    # Cross-field consistency (types are right from here on).
    H, Hkv = attrs["num_heads"], attrs["num_kv_heads"]
    if sq[0] != skv[0]:
        out.append(f"{rel}: shape_q batch {sq[0]} differs from shape_kv batch {skv[0]}")
    if sq[3] != skv[3]:
        out.append(f"{rel}: shape_q head_dim {sq[3]} differs from shape_kv head_dim {skv[3]}")
    if not attrs["has_query_rows"] and sq[1] != skv[1]:
        out.append(f"{rel}: shape_q has {sq[1]} rows but shape_kv {skv[1]} (no query_rows)")
    if "seq_len" in attrs and attrs["seq_len"] != skv[1]:
        bad("seq_len", attrs["seq_len"], f"shape_kv's {skv[1]} rows")
    if H % Hkv:
        out.append(f"{rel}: num_kv_heads {Hkv} does not divide num_heads {H}")
    if len(attrs["q_heads"]) != sq[2] or any(h >= H for h in attrs["q_heads"]):
        bad("q_heads", attrs["q_heads"], f"{sq[2]} head ids below num_heads {H}")
    if len(attrs["kv_heads"]) != skv[2] or any(h >= Hkv for h in attrs["kv_heads"]):
        bad("kv_heads", attrs["kv_heads"], f"{skv[2]} head ids below num_kv_heads {Hkv}")
    if len(set(attrs["q_heads"])) != len(attrs["q_heads"]):
        bad("q_heads", attrs["q_heads"], "distinct head ids")
    if not out and H % Hkv == 0:  # the K/V heads are exactly those the q heads read, ascending
        # (as every release stored them: a reordered list would re-pair heads on read)
        want = sorted({h // (H // Hkv) for h in attrs["q_heads"]})
        if list(attrs["kv_heads"]) != want:
            bad("kv_heads", attrs["kv_heads"], f"{want}, the K/V heads of q_heads "
                f"{attrs['q_heads']} in ascending order (num_heads {H} / num_kv_heads {Hkv})")
    # how the replay attends: a wrong type here silently changes it ("false" is truthy)
    kw = attrs.get("sdpa_kwargs")
    if kw is not None and not isinstance(kw, dict):
        bad("sdpa_kwargs", kw, "an object")
    elif kw:
        if "is_causal" in kw and not isinstance(kw["is_causal"], bool):
            bad("sdpa_kwargs.is_causal", kw["is_causal"], "true or false")
        sc = kw.get("scale")
        if sc is not None and not (isinstance(sc, (int, float)) and not isinstance(sc, bool)
                                   and sc > 0 and sc == sc and sc != float("inf")):
            bad("sdpa_kwargs.scale", sc, "a positive number or null")
    return out


def _chunk_record_ok(rec) -> bool:
    return isinstance(rec, dict) and all(
        isinstance(v, dict) and all(isinstance(k, str) and (c is None or _is_int(c))
                                    for k, c in v.items())
        for v in rec.values())


def expected_array(name: str, attrs: dict) -> tuple[list[int], str, str | None]:
    """(shape, zarr data_type, torch_dtype attribute) an entry's array must have."""
    if name == "q_rows":
        return [attrs["shape_q"][1]], "int64", None
    shape = attrs["shape_q"] if name == "q" else attrs["shape_kv"]
    return list(shape), str(_DTYPES[attrs["torch_dtype"]]), attrs["torch_dtype"]


def array_names(attrs: dict) -> tuple[str, ...]:
    return QKV + (("q_rows",) if attrs.get("has_query_rows") else ())


def array_problems(meta: dict, rel: str, name: str, entry_attrs: dict) -> list[str]:
    """Array metadata against the (already validated) entry attributes."""
    out = _node(meta, rel, "array")
    if out:
        return out
    shape, data_type, tdt = expected_array(name, entry_attrs)
    if meta.get("shape") != shape:
        out.append(f"{rel}: shape is {meta.get('shape')!r}, but the entry attributes say {shape}")
    if meta.get("data_type") != data_type:
        out.append(f"{rel}: data_type is {meta.get('data_type')!r}, expected {data_type!r} for "
                   f"torch_dtype {entry_attrs['torch_dtype']!r}")
    attrs = attributes_of(meta)
    if tdt is not None and attrs.get("torch_dtype") != tdt:
        out.append(f"{rel}: torch_dtype is {attrs.get('torch_dtype')!r}, but the entry says "
                   f"{tdt!r}")
    grid = meta.get("chunk_grid")
    conf = grid.get("configuration") if isinstance(grid, dict) else None
    cs = conf.get("chunk_shape") if isinstance(conf, dict) else None
    if not isinstance(grid, dict) or grid.get("name") != "regular" or not _int_list(
            cs, len(shape), positive=True):
        out.append(f"{rel}: chunk_grid is {grid!r}, expected a regular grid of {len(shape)} "
                   f"positive chunk sizes")
    elif len(shape) == 4 and (cs[0] != shape[0] or cs[3] != shape[3] or cs[1] > shape[1]
                              or cs[2] > shape[2]):
        # The writer chunks [B, S, H, D] in whole (batch, channel) slabs over heads and tokens.
        out.append(f"{rel}: chunk_shape {cs} does not fit the array {shape} (chunks hold the "
                   f"whole batch and channel dims)")
    codecs = meta.get("codecs")
    names = [c.get("name") for c in codecs] if isinstance(codecs, list) and all(
        isinstance(c, dict) for c in codecs) else None
    if names and names[0] == "bytes" and (codecs[0].get("configuration") or {}).get(
            "endian", "little") != "little":
        out.append(f"{rel}: bytes codec endian is not 'little'")
    if names not in (["bytes", "crc32c"], ["bytes", "zstd", "crc32c"]):
        out.append(f"{rel}: codecs are {names!r}, expected bytes, [zstd,] crc32c")
    if meta.get("fill_value") != 0:
        out.append(f"{rel}: fill_value is {meta.get('fill_value')!r}, expected 0")
    enc = meta.get("chunk_key_encoding")
    sep = (enc.get("configuration") or {}).get("separator", "/") if isinstance(enc, dict) and \
        isinstance(enc.get("configuration", {}), dict) else None
    if not isinstance(enc, dict) or enc.get("name") != "default" or sep != "/":
        out.append(f"{rel}: chunk_key_encoding is {enc!r}, expected the default with '/'")
    dims = meta.get("dimension_names")
    want_dims = list(DIMS) if len(shape) == 4 else ["query_row"]
    if dims is not None and dims != want_dims:
        out.append(f"{rel}: dimension_names is {dims!r}, expected {want_dims}")
    if meta.get("storage_transformers") not in (None, []):
        out.append(f"{rel}: storage_transformers {meta['storage_transformers']!r} are not used "
                   f"by capture stores")
    return out


def chunk_keys(meta: dict) -> list[str]:
    """Every chunk key ("c/0/0/1/0") of the array's regular grid (default key encoding)."""
    shape = meta["shape"]
    cs = meta["chunk_grid"]["configuration"]["chunk_shape"]
    enc = meta.get("chunk_key_encoding") or {}
    sep = (enc.get("configuration") or {}).get("separator", "/")
    counts = [-(-n // c) for n, c in zip(shape, cs)]
    return ["c" + sep + sep.join(str(i) for i in idx) for idx in np.ndindex(*counts)]

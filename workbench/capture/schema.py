"""Capture store schema (version 1): names, dtype views, errors. Documented in docs/store_schema.md.

Layout of a store (zarr v3 directory)::

    STORE/zarr.json                       root group; attrs hold the run (see ROOT_ATTRS below)
    STORE/entries/s{step:05d}/{name}/     one group per captured attention call (step, name)
        zarr.json                         attrs: name, layer, step, status, dtypes, shapes, ...
        q, k, v                           arrays [batch, token, head, channel]
        q_rows (optional)                 int64 [token]: the sampled query rows when query_rows= is
                                          set

An entry's arrays are written first; its ``status`` attribute turns from "writing" to "complete"
only after every chunk is on disk (zarr's LocalStore writes each key with write-to-temp + rename),
so a reader never mistakes a partial entry for a complete one. The completion marker carries the
entry's chunk record (``chunk_crc32c``: every chunk key of every array and its crc32c), so a chunk
file that later goes missing is an error instead of zarr's fill value.
"""

from __future__ import annotations

import importlib.metadata
import platform
import re

import numpy as np
import torch

SCHEMA_NAME = "workbench.capture"
SCHEMA_VERSION = 1
ENTRIES_GROUP = "entries"
STATUS_WRITING = "writing"
STATUS_COMPLETE = "complete"
# Entry attribute written with the completion marker: {array: {chunk key: crc32c}}.
CHUNK_RECORD = "chunk_crc32c"
# Lock file a writer holds inside the store (pid, host, start time); see lock.py.
LOCK_NAME = ".workbench-writer.lock"
QKV = ("q", "k", "v")
DIMS = ("batch", "token", "head", "channel")

# torch dtype -> (numpy dtype stored, stored as a bit view?)
_STORED: dict[torch.dtype, tuple[np.dtype, bool]] = {
    torch.float64: (np.dtype("float64"), False),
    torch.float32: (np.dtype("float32"), False),
    torch.float16: (np.dtype("float16"), False),
    torch.bfloat16: (np.dtype("uint16"), True),
    torch.float8_e4m3fn: (np.dtype("uint8"), True),
    torch.float8_e5m2: (np.dtype("uint8"), True),
}
_VIEW_INT = {np.dtype("uint16"): torch.int16, np.dtype("uint8"): torch.uint8}


class CaptureStoreError(ValueError):
    """A problem with a capture store; the message names the store and the entry (a ValueError so
    the CLI prints it as one line)."""


class SchemaVersionError(CaptureStoreError):
    """The store was written with a schema this code does not know: refuse rather than misread."""


class ChecksumError(CaptureStoreError):
    """A chunk failed its crc32c check; the message names the entry and array."""


class IncompleteEntryError(CaptureStoreError):
    """The entry was started but never completed (the capture was killed mid-write)."""


class MissingChunkError(CaptureStoreError):
    """A chunk the entry records is not on disk (zarr would read it back as zeros)."""


class MetadataError(CaptureStoreError):
    """A metadata file of the store (root, step, entry or array JSON) is unreadable or does not
    follow the schema; the message names the file and the field."""


class StoreLockedError(CaptureStoreError):
    """Another live writer holds the store's lock; the message names the holder."""


class RunMismatchError(CaptureStoreError):
    """``--resume`` of a store captured from a different run (model, seed, prompt, ...)."""


def dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def torch_dtype(name: str) -> torch.dtype:
    dt = getattr(torch, name, None)
    if not isinstance(dt, torch.dtype) or dt not in _STORED:
        raise CaptureStoreError(f"unsupported stored dtype {name!r}; known: "
                                f"{[dtype_name(d) for d in _STORED]}")
    return dt


def stored_numpy_dtype(dtype: torch.dtype) -> np.dtype:
    if dtype not in _STORED:
        raise ValueError(f"capture: dtype {dtype} is not storable; use one of "
                         f"{[dtype_name(d) for d in _STORED]}")
    return _STORED[dtype][0]


def to_numpy_bits(t: torch.Tensor) -> np.ndarray:
    """CPU tensor -> numpy array in the stored dtype; bf16/fp8 become uint16/uint8 bit views."""
    np_dt, is_view = _STORED[t.dtype]
    if not is_view:
        return t.numpy()
    as_int = t.view(torch.int16 if np_dt.itemsize == 2 else torch.uint8)
    return as_int.numpy().view(np_dt)


def from_numpy_bits(a: np.ndarray, dtype: torch.dtype) -> torch.Tensor:
    """Inverse of ``to_numpy_bits``: bit-exact."""
    np_dt, is_view = _STORED[dtype]
    a = np.ascontiguousarray(a)
    if not is_view:
        return torch.from_numpy(a)
    int_dt = _VIEW_INT[np_dt]
    signed = a.view(np.int16) if np_dt.itemsize == 2 else a
    return torch.from_numpy(signed).view(int_dt).view(dtype)


_SAFE = re.compile(r"[^A-Za-z0-9._-]")


def entry_path(step: int | None, name: str) -> str:
    """Store path of an entry. Step None is stored as -1 ("no step")."""
    s = -1 if step is None else int(step)
    return f"{ENTRIES_GROUP}/s{s:05d}/{_SAFE.sub('_', name)}" if s >= 0 else \
        f"{ENTRIES_GROUP}/s_none/{_SAFE.sub('_', name)}"


def library_versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for pkg in ("torch", "numpy", "zarr", "numcodecs", "xarray", "diffusers", "transformers",
                "attention-workbench"):
        try:
            out[pkg] = importlib.metadata.version(pkg)
        except importlib.metadata.PackageNotFoundError:
            continue
    return out


def check_schema(attrs: dict, where: str) -> None:
    name = attrs.get("schema")
    version = attrs.get("schema_version")
    if name != SCHEMA_NAME:
        raise SchemaVersionError(
            f"{where}: not a workbench capture store (root attribute schema={name!r}, expected "
            f"{SCHEMA_NAME!r})"
        )
    if not isinstance(version, int) or version < 1 or version > SCHEMA_VERSION:
        raise SchemaVersionError(
            f"{where}: store schema version {version!r} is not supported by this workbench "
            f"(it reads versions 1..{SCHEMA_VERSION}); upgrade the workbench to read it"
        )

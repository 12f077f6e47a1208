"""Capture and replay of live attention q/k/v.

``capture(model, path, layers=..., steps=...)`` records the tensors that enter attention into a
crash-safe zarr v3 store; ``open_capture(path)`` replays them offline. ``AttentionInterceptor`` is
the one interception point that both capture and attention replacement use.
"""

import importlib

from .intercept import AttentionCall, AttentionInterceptor
from .schema import (
    SCHEMA_VERSION,
    CaptureStoreError,
    ChecksumError,
    IncompleteEntryError,
    MetadataError,
    MissingChunkError,
    RunMismatchError,
    SchemaVersionError,
    StoreLockedError,
)

# The store's modules import zarr; they load on first use, so that the interception (torch only)
# imports on a machine that only times a model (``workbench.bench.dit``) and has no zarr.
_LAZY = {"Capture": "recorder", "capture": "recorder", "CaptureReader": "replay",
         "EntryInfo": "replay", "open_capture": "replay", "CaptureWriteError": "writer"}


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__():
    return sorted(set(globals()) | set(_LAZY))

__all__ = [
    "SCHEMA_VERSION",
    "AttentionCall",
    "AttentionInterceptor",
    "Capture",
    "CaptureReader",
    "CaptureStoreError",
    "CaptureWriteError",
    "ChecksumError",
    "EntryInfo",
    "IncompleteEntryError",
    "MetadataError",
    "MissingChunkError",
    "RunMismatchError",
    "SchemaVersionError",
    "StoreLockedError",
    "capture",
    "open_capture",
]

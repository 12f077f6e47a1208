"""Capture and replay of live attention q/k/v.

``capture(model, path, layers=..., steps=...)`` records the tensors that enter attention into a
crash-safe zarr v3 store; ``open_capture(path)`` replays them offline. ``AttentionInterceptor`` is
the one interception point that both capture and attention replacement use.
"""

from .intercept import AttentionCall, AttentionInterceptor
from .recorder import Capture, capture
from .replay import CaptureReader, EntryInfo, open_capture
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
from .writer import CaptureWriteError

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

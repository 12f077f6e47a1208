"""``workbench archive SRC DST``: rewrite a capture store with zstd (after capture, not during).

Only complete entries are copied; each keeps its crc32c checksum (computed over the compressed
bytes) and gets a new chunk record. The source is read through its checksums and chunk records, so
a corrupt or missing source chunk stops the archive with the entry named instead of being copied
silently.

The archive is built in a hidden sibling of DST and renamed into place at the end, so a failed
archive leaves nothing behind, and ``--overwrite`` of an existing store at DST keeps the old store
until the new one is complete. DST must be new, an empty directory, or (with ``--overwrite``) a
capture store holding nothing else; SRC and DST must be different stores (compared after
resolving symlinks and relative paths).
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import zarr
from zarr.codecs import BytesCodec

from .lock import StoreLock
from .replay import open_capture
from .schema import CHUNK_RECORD, STATUS_COMPLETE, CaptureStoreError, MetadataError
from .storefs import (
    check_target,
    make_dirs,
    remove_made_dirs,
    remove_store,
    rename_into_place,
    sibling,
)
from .writer import DEFAULT_CHUNK_BYTES, chunk_record, chunk_shape, codecs_for


def _check_distinct(src: Path, dst: Path) -> None:
    rs, rd = src.resolve(), dst.resolve()
    if rs == rd:
        raise CaptureStoreError(f"SRC {src} and DST {dst} are the same store ({rs}); "
                                f"write the archive to a new path")
    if rd.is_relative_to(rs):
        raise CaptureStoreError(f"DST {dst} lies inside SRC {src}; choose a path outside")
    if rs.is_relative_to(rd):
        raise CaptureStoreError(f"SRC {src} lies inside DST {dst}; choose another DST")


def archive_store(src, dst, *, level: int = 3, overwrite: bool = False) -> dict:
    """Copy every complete entry of ``src`` into a new zstd-compressed store ``dst``."""
    src, dst = Path(src), Path(os.path.abspath(dst))  # "." names no folder to rename onto
    reader = open_capture(src)
    _check_distinct(src, dst)
    kind = check_target(dst, overwrite=overwrite, flag="DST", can_resume=False)
    # an archive of a damaged store would verify clean (new chunks, new checksums): the copy
    # reads each complete entry through the reader, which refuses damaged metadata, a missing
    # chunk and a chunk whose stored crc32c is not the recorded one (a swapped chunk)
    codecs = codecs_for(f"zstd:{level}")
    tmp = sibling(dst, "archiving")
    made: list[Path] = []
    try:
        make_dirs(dst.parent, made)
        tmp.mkdir()
    except OSError as exc:
        remove_made_dirs(made)
        raise CaptureStoreError(f"DST {dst}: cannot write the archive there: "
                                f"{exc.strerror or exc} ({exc.filename})") from None
    try:
        attrs = dict(reader.attrs, archived_from=str(src), archived_unix=time.time(),
                     archive_compressor=f"zstd:{level}")
        root = zarr.open_group(str(tmp), mode="w-", attributes=attrs)
        skipped, n = [], 0
        for e in reader.entries():
            if e.problem is not None:
                raise MetadataError(f"{src}: entry {e.path} has damaged metadata ({e.problem}); "
                                    f"see workbench inspect --verify")
            if not e.complete:
                skipped.append(e.path)
                continue
            entry_attrs, arrays = reader.entry_metadata(e)
            copied = {k: v for k, v in entry_attrs.items() if k != CHUNK_RECORD}
            g = root.create_group(e.path, attributes=dict(copied, status="writing",
                                                          compressor=f"zstd:{level}"))
            record = {}
            for name, meta in arrays.items():
                data = reader._read(e, name, (slice(None),) * len(meta["shape"]))
                out = g.create_array(
                    name, shape=data.shape, dtype=data.dtype,
                    chunks=chunk_shape(data.shape, data.dtype.itemsize, DEFAULT_CHUNK_BYTES),
                    serializer=BytesCodec(), compressors=codecs, fill_value=0,
                    dimension_names=meta.get("dimension_names"),
                    attributes=dict(meta.get("attributes") or {}),
                    config={"write_empty_chunks": True},
                )
                out[...] = data
                record[name] = chunk_record(out)
            g.attrs.update({"status": STATUS_COMPLETE, CHUNK_RECORD: record})
            n += 1
        _swap_into_place(tmp, dst, kind)
    except BaseException:
        remove_store(tmp)
        remove_made_dirs(made)
        raise

    def size(p: Path) -> int:
        return sum(f.stat().st_size for f in p.rglob("*") if f.is_file())

    return {"entries": n, "skipped_incomplete": skipped, "src_bytes": size(src),
            "dst_bytes": size(dst)}


def _swap_into_place(tmp: Path, dst: Path, kind: str) -> None:
    """Rename the finished archive to ``dst``; a replaced store is deleted only after that."""
    if kind != "replace":
        os.rename(tmp, dst)  # onto a missing path or an empty directory: atomic
        return
    with StoreLock(dst) as lock:  # refuses while a capture is writing into the old store
        old = sibling(dst, "replaced")
        os.rename(dst, old)
        lock.moved(old)
    rename_into_place(tmp, dst, old)
    remove_store(old)

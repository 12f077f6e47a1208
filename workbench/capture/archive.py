"""``workbench archive SRC DST``: rewrite a capture store with zstd (after capture, not during).

Only complete entries are copied; each keeps its crc32c checksum (computed over the compressed
bytes). The source is read through its checksums, so a corrupt source chunk stops the archive with
the entry named instead of being copied silently.
"""

from __future__ import annotations

import time
from pathlib import Path

import zarr

from .replay import open_capture
from .schema import STATUS_COMPLETE
from .writer import DEFAULT_CHUNK_BYTES, chunk_shape, codecs_for
from zarr.codecs import BytesCodec


def archive_store(src, dst, *, level: int = 3, overwrite: bool = False) -> dict:
    """Copy every complete entry of ``src`` into a new zstd-compressed store ``dst``."""
    reader = open_capture(src)
    dst = Path(dst)
    if (dst / "zarr.json").exists() and not overwrite:
        raise FileExistsError(f"{dst}: exists; pass --overwrite to replace it")
    attrs = dict(reader.attrs, archived_from=str(src), archived_unix=time.time(),
                 archive_compressor=f"zstd:{level}")
    root = zarr.open_group(str(dst), mode="w", attributes=attrs)
    codecs = codecs_for(f"zstd:{level}")
    skipped, n = [], 0
    for e in reader.entries():
        if not e.complete:
            skipped.append(e.path)
            continue
        src_group = reader.root[e.path]
        g = root.create_group(e.path, attributes=dict(src_group.attrs, status="writing",
                                                      compressor=f"zstd:{level}"))
        for name, arr in src_group.arrays():
            try:
                data = arr[...]
            except Exception as exc:  # noqa: BLE001
                reader._read(e, name, (slice(None),) * arr.ndim)  # raises the named error
                raise exc
            out = g.create_array(
                name, shape=arr.shape, dtype=arr.dtype,
                chunks=chunk_shape(arr.shape, arr.dtype.itemsize, DEFAULT_CHUNK_BYTES),
                serializer=BytesCodec(), compressors=codecs, fill_value=0,
                dimension_names=arr.metadata.dimension_names, attributes=dict(arr.attrs),
            )
            out[...] = data
        g.attrs.update({"status": STATUS_COMPLETE})
        n += 1

    def size(p: Path) -> int:
        return sum(f.stat().st_size for f in p.rglob("*") if f.is_file())

    return {"entries": n, "skipped_incomplete": skipped, "src_bytes": size(Path(src)),
            "dst_bytes": size(dst)}

"""Streaming store writer: host copy in the hook, a bounded queue, a writer thread + chunk pool.

The hook only copies and enqueues: GPU tensors go with ``non_blocking`` copies on a side CUDA stream
into a fixed ring of pinned host memory (allocated once, at capture start, sized by the budget, and
recycled), with one CUDA event per entry, so the forward never waits for the copy and never calls
cudaHostAlloc; CPU tensors are cloned. The writer thread takes entries in order, waits for the
entry's event, writes the entry's zarr metadata, hands its chunks to a pool of chunk-writer threads
and, once every chunk is on disk, writes the completion marker. Host memory held by queued entries
is
bounded by ``budget_bytes``: a hook that would exceed it blocks until the writer frees memory
(back-pressure), never grows without bound.

Chunk writes (no compressor, local store): each chunk is gathered into a per-thread scratch buffer
(or written straight from the host tensor when it is one contiguous slab), checksummed with crc32c,
and written with ``os.write`` into its final zarr key, in the exact bytes -> crc32c layout zarr
reads
(data, then the little-endian crc32c of the data). No temp file + rename per chunk: the entry is
only visible once its ``status`` marker says complete, which is written after every chunk, so a
torn chunk can only belong to an entry flagged incomplete (and rewritten on resume). With a
compressor (``zstd``) the chunks go through zarr's own array write (every chunk written, all-zero
ones included, so that a missing file always means a lost chunk).

The completion marker carries the entry's chunk record, ``chunk_crc32c`` = {array: {chunk key:
crc32c of the stored bytes}}: readers refuse an entry whose recorded chunk is missing, and verify
compares every chunk file with its record.
"""

from __future__ import annotations

import errno
import os
import queue
import struct
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from concurrent.futures import wait as wait_futures
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import google_crc32c
import numpy as np
import torch
import zarr
from zarr.codecs import BytesCodec, Crc32cCodec, ZstdCodec
from zarr.storage import LocalStore

from .schema import (
    CHUNK_RECORD,
    DIMS,
    STATUS_COMPLETE,
    STATUS_WRITING,
    CaptureStoreError,
    dtype_name,
    stored_numpy_dtype,
    to_numpy_bits,
)

DEFAULT_CHUNK_BYTES = 32 * 2**20
DEFAULT_BUDGET_BYTES = 2 * 2**30
# Chunk writes overlap: os.write and numpy's gather copy release the GIL (crc32c holds it, at
# ~6 GB/s). More threads than cores still help while the page cache absorbs the writes.
DEFAULT_WRITER_THREADS = min(8, max(2, os.cpu_count() or 2))
CRC_PIECE = 2 * 2**20  # bytes checksummed per GIL-holding call
POOL_ALIGN = 4096  # byte alignment of every tensor carved out of the pinned pool


class CaptureWriteError(CaptureStoreError):
    """The writer thread failed on an entry; completed entries before it are kept."""


def codecs_for(compressor: str | None) -> list:
    """Bytes-to-bytes codec chain: optional compressor, then crc32c (checksum of the stored
    bytes)."""
    if compressor in (None, "none"):
        return [Crc32cCodec()]
    if compressor.startswith("zstd"):
        level = int(compressor.split(":")[1]) if ":" in compressor else 3
        return [ZstdCodec(level=level), Crc32cCodec()]
    raise ValueError(f"compressor: unknown {compressor!r}; use none or zstd[:level]")


def chunk_shape(shape: tuple[int, ...], itemsize: int, chunk_bytes: int) -> tuple[int, ...]:
    """[B, S, H, D] chunks: whole (batch, token, channel) slabs over as many heads as fit
    ``chunk_bytes``; a single head slab larger than that is split along tokens."""
    if len(shape) != 4:
        return tuple(shape)
    B, S, H, D = shape
    per_head = B * S * D * itemsize
    if per_head <= chunk_bytes:
        return (B, S, max(1, min(H, chunk_bytes // per_head)), D)
    return (B, max(1, chunk_bytes // (B * D * itemsize)), 1, D)


class HostBudget:
    """Counting semaphore over bytes of host memory held by queued entries."""

    def __init__(self, budget_bytes: int):
        self.budget = int(budget_bytes)
        self.in_use = 0
        self.peak = 0
        self.waits = 0
        self.wait_seconds = 0.0
        self._cond = threading.Condition()
        self.failed: BaseException | None = None

    def acquire(self, n: int, what: str) -> None:
        if n > self.budget:
            raise CaptureStoreError(
                f"{what}: one entry needs {n / 2**20:.1f} MiB of host memory but the capture "
                f"budget "
                f"is {self.budget / 2**20:.1f} MiB; raise budget_bytes (--budget-mb) or capture "
                f"fewer heads / query rows"
            )
        with self._cond:
            if self.in_use + n > self.budget:
                self.waits += 1
                t0 = time.perf_counter()
                while self.in_use + n > self.budget and self.failed is None:
                    self._cond.wait(0.5)
                self.wait_seconds += time.perf_counter() - t0
            self.in_use += n
            self.peak = max(self.peak, self.in_use)

    def release(self, n: int) -> None:
        with self._cond:
            self.in_use -= n
            self._cond.notify_all()

    def fail(self, exc: BaseException) -> None:
        with self._cond:
            self.failed = exc
            self._cond.notify_all()


def _align(n: int) -> int:
    return (n + POOL_ALIGN - 1) // POOL_ALIGN * POOL_ALIGN


class PinnedPool:
    """A fixed ring of page-locked host memory, allocated once and recycled.

    Entries take one contiguous region each, in submission order, and are released by the writer
    mostly in the same order, so a ring (first fit after the newest live region, else at 0) needs
    no compaction. ``alloc`` blocks while no region is free (back-pressure), waking up when the
    writer has failed. Allocation goes through ``cudaHostRegister`` on a plain tensor (exact size;
    torch's pinned caching allocator would round the pool up to a power of two), falling back to
    ``pin_memory=True`` if registration is refused.
    """

    def __init__(self, nbytes: int):
        self.capacity = _align(int(nbytes))
        t0 = time.perf_counter()
        self.method = "cudaHostRegister"
        buf = torch.empty(self.capacity, dtype=torch.uint8)
        self._registered = False
        try:
            err = torch.cuda.cudart().cudaHostRegister(buf.data_ptr(), self.capacity, 0)
            self._registered = int(getattr(err, "value", err)) == 0
            if self._registered and not buf.is_pinned():  # torch would not copy asynchronously
                torch.cuda.cudart().cudaHostUnregister(buf.data_ptr())
                self._registered = False
        except Exception:  # noqa: BLE001 - fall back to torch's pinned allocator below
            self._registered = False
        if not self._registered:
            self.method = "pin_memory"
            buf = torch.empty(self.capacity, dtype=torch.uint8, pin_memory=True)
        self.buf = buf
        self.alloc_seconds = time.perf_counter() - t0
        self._live: list[list[int]] = []  # [start, end, freed] in allocation order
        self._cond = threading.Condition()
        self.failed: BaseException | None = None
        self.waits = 0
        self.wait_seconds = 0.0

    def _fit(self, n: int) -> int | None:
        if not self._live:
            return 0
        start = self._live[-1][1]
        if start + n > self.capacity:
            start = 0
        end = start + n
        if any(s < end and start < e for s, e, _ in self._live):
            return None
        return start

    def alloc(self, n: int) -> tuple[int, int]:
        if n > self.capacity:
            raise CaptureStoreError(f"pinned pool: {n} bytes asked, pool holds {self.capacity}")
        with self._cond:
            start = self._fit(n)
            if start is None:
                self.waits += 1
                t0 = time.perf_counter()
                while start is None and self.failed is None:
                    self._cond.wait(0.5)
                    start = self._fit(n)
                self.wait_seconds += time.perf_counter() - t0
                if start is None:
                    raise self.failed
            self._live.append([start, start + n, False])
            return start, start + n

    def release(self, region: tuple[int, int]) -> None:
        with self._cond:
            for r in self._live:
                if (r[0], r[1]) == tuple(region) and not r[2]:
                    r[2] = True
                    break
            while self._live and self._live[0][2]:
                self._live.pop(0)
            while self._live and self._live[-1][2]:
                self._live.pop()
            self._cond.notify_all()

    def fail(self, exc: BaseException) -> None:
        with self._cond:
            self.failed = exc
            self._cond.notify_all()

    def free(self) -> None:
        if self._registered:
            torch.cuda.cudart().cudaHostUnregister(self.buf.data_ptr())
            self._registered = False
        self.buf = None


@dataclass
class PendingEntry:
    path: str  # store path of the entry group
    attrs: dict[str, Any]
    arrays: dict[str, torch.Tensor]  # host tensors (pinned when they came from CUDA)
    nbytes: int
    event: Any = None  # CUDA event the D2H copies were recorded on
    region: tuple[int, int] | None = None  # slice of the pinned pool the arrays live in


@dataclass
class WriterStats:
    entries: int = 0
    bytes: int = 0
    write_seconds: float = 0.0
    chunks: int = 0
    threads: int = 1
    direct: bool = False  # chunks written by the chunk pool (not through zarr's array write)
    pool_bytes: int = 0
    pool_method: str | None = None
    pool_alloc_seconds: float = 0.0
    skipped: list[str] = field(default_factory=list)

    @property
    def mb_per_s(self) -> float:
        return self.bytes / 2**20 / self.write_seconds if self.write_seconds else 0.0


class StoreWriter:
    """Background writer of entries into an open zarr root group.

    threads: chunk-writer threads (entries are still completed one at a time, in order).
    pinned_pool: allocate the pinned ring (``budget_bytes``) now; otherwise it is allocated at the
    first CUDA tensor submitted. direct: write chunks with the chunk pool when the store is local
    and there is no compressor (False: always through zarr's array write, one thread).
    """

    def __init__(
        self,
        root: zarr.Group,
        *,
        budget_bytes: int = DEFAULT_BUDGET_BYTES,
        queue_size: int = 8,
        compressor: str | None = None,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        progress: bool = True,
        total: int | None = None,
        where: str = "",
        threads: int | None = None,
        pinned_pool: bool = False,
        direct: bool = True,
    ):
        self.root = root
        self.where = where
        self.budget = HostBudget(budget_bytes)
        self.codecs = codecs_for(compressor)
        self.compressor = compressor or "none"
        self.chunk_bytes = chunk_bytes
        self.threads = max(1, int(threads or DEFAULT_WRITER_THREADS))
        self.direct = bool(direct) and self.compressor == "none" and isinstance(root.store,
                                                                             LocalStore)
        self.stats = WriterStats(threads=self.threads if self.direct else 1, direct=self.direct)
        self.error: CaptureWriteError | None = None
        self._queue: queue.Queue[PendingEntry | None] = queue.Queue(maxsize=max(1, queue_size))
        self._copy_stream = None
        self._pool: PinnedPool | None = None
        if pinned_pool:
            self._make_pool()
        self._local = threading.local()
        self._chunk_pool = (ThreadPoolExecutor(self.threads, thread_name_prefix="capture-chunk")
                            if self.direct else None)
        self._bar = None
        if progress:
            from tqdm.auto import tqdm

            self._bar = tqdm(total=total, unit="entry", desc=f"capture {where}", leave=False)
        self._thread = threading.Thread(target=self._run, name="capture-writer", daemon=True)
        self._thread.start()

    def _make_pool(self) -> None:
        # The budget plus room for the per-tensor alignment of one entry, so an entry of exactly
        # budget_bytes still fits the ring.
        self._pool = PinnedPool(self.budget.budget + 8 * POOL_ALIGN)
        self.stats.pool_bytes = self._pool.capacity
        self.stats.pool_method = self._pool.method
        self.stats.pool_alloc_seconds = self._pool.alloc_seconds

    # producer side (the hook) ---------------------------------------------------------------------
    def raise_if_failed(self) -> None:
        if self.error is not None:
            raise self.error

    def submit(self, path: str, attrs: dict[str, Any], arrays: dict[str, torch.Tensor]) -> None:
        """Copy ``arrays`` to host memory (blocking while over budget) and queue them for
        writing."""
        self.raise_if_failed()
        nbytes = sum(t.numel() * t.element_size() for t in arrays.values())
        self.budget.acquire(nbytes, f"{self.where} entry {path}")
        if self.budget.failed is not None:
            self.budget.release(nbytes)
            self.raise_if_failed()
        try:
            host, event, region = self._to_host(arrays)
        except BaseException:
            self.budget.release(nbytes)
            raise
        item = PendingEntry(path=path, attrs=attrs, arrays=host, nbytes=nbytes, event=event,
                            region=region)
        while True:  # a bounded queue: block, but wake up to notice a dead writer
            try:
                self._queue.put(item, timeout=0.5)
                return
            except queue.Full:
                if self.error is not None:
                    self._free(item)
                    raise self.error from None

    def _to_host(self, arrays: dict[str, torch.Tensor]):
        def cpu_copy(t):
            # detach().clone(): the model may reuse or modify its buffers after the hook returns.
            return t.detach().contiguous().clone() if t.is_contiguous() else t.detach().contiguous()

        cuda = [k for k, t in arrays.items() if t.is_cuda]
        if not cuda:
            return {k: cpu_copy(t) for k, t in arrays.items()}, None, None
        if self._pool is None:
            self._make_pool()  # record() with CUDA tensors and no CUDA model: first use
        sizes = {k: _align(arrays[k].numel() * arrays[k].element_size()) for k in cuda}
        region = self._pool.alloc(sum(sizes.values()))
        if self._copy_stream is None:
            self._copy_stream = torch.cuda.Stream()
        self._copy_stream.wait_stream(torch.cuda.current_stream())
        host, off = {}, region[0]
        with torch.cuda.stream(self._copy_stream):
            for k, t in arrays.items():
                if not t.is_cuda:
                    host[k] = cpu_copy(t)
                    continue
                n = t.numel() * t.element_size()
                buf = self._pool.buf[off:off + n].view(t.dtype).view(t.shape)
                off += sizes[k]
                buf.copy_(t.detach(), non_blocking=True)
                t.record_stream(self._copy_stream)  # keep t alive until the copy finished
                host[k] = buf
            event = torch.cuda.Event()
            event.record(self._copy_stream)
        return host, event, region

    def _free(self, item: PendingEntry) -> None:
        item.arrays = {}
        if item.region is not None and self._pool is not None:
            self._pool.release(item.region)
            item.region = None
        self.budget.release(item.nbytes)

    def close(self) -> WriterStats:
        """Flush the queue, stop the threads, free the pinned pool, raise the first writer error."""
        while self._thread.is_alive():
            try:
                self._queue.put(None, timeout=0.5)
                break
            except queue.Full:
                continue
        self._thread.join()
        if self._chunk_pool is not None:
            self._chunk_pool.shutdown(wait=True)
        if self._pool is not None:
            if self._copy_stream is not None:
                self._copy_stream.synchronize()
            self._pool.free()
            self._pool = None
        if self._bar is not None:
            self._bar.close()
        self.raise_if_failed()
        return self.stats

    # writer thread --------------------------------------------------------------------------------
    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            try:
                if self.error is None:
                    self._write(item)
            except BaseException as exc:  # noqa: BLE001 - surfaced in the caller, naming the entry
                self.error = _describe(exc, item.path, self.where)
                self.budget.fail(self.error)
                if self._pool is not None:
                    self._pool.fail(self.error)
            finally:
                self._free(item)

    def _write(self, item: PendingEntry) -> None:
        if item.event is not None:
            item.event.synchronize()
        t0 = time.perf_counter()
        attrs = dict(item.attrs, status=STATUS_WRITING, compressor=self.compressor)
        group = self.root.create_group(item.path, overwrite=True, attributes=attrs)
        jobs: list = []  # (array name, chunk key, future of the chunk's crc32c)
        record: dict[str, dict[str, int | None]] = {}
        try:
            self._write_arrays(item, group, jobs, record)
        except BaseException:
            wait_futures([f for _, _, f in jobs])  # no chunk thread may still read recycled memory
            raise
        # Every chunk must be on disk (or failed) before the marker, and before the pinned region
        # the chunks read from is recycled (the caller frees it after this returns).
        wait_futures([f for _, _, f in jobs])
        for name, key, f in jobs:
            record.setdefault(name, {})[key] = f.result()
        # The completion marker, with the chunk record: written only after every chunk is on disk.
        group.attrs.update({"status": STATUS_COMPLETE, "completed_unix": time.time(),
                            CHUNK_RECORD: record})
        self.stats.write_seconds += time.perf_counter() - t0
        self.stats.entries += 1
        self.stats.bytes += item.nbytes
        self.stats.chunks += len(jobs)
        if self._bar is not None:
            self._bar.update(1)
            self._bar.set_postfix_str(f"{self.stats.mb_per_s:.0f} MiB/s", refresh=False)

    def _write_arrays(self, item: PendingEntry, group: zarr.Group, jobs: list,
                      record: dict) -> None:
        for name, t in item.arrays.items():
            if name != "q_rows" and not t.is_floating_point():
                raise TypeError(f"array {name!r}: dtype {t.dtype} is not a storable float dtype")
            np_dt = stored_numpy_dtype(t.dtype) if t.is_floating_point() else np.dtype("int64")
            data = to_numpy_bits(t) if t.is_floating_point() else t.numpy().astype("int64")
            dims = DIMS if data.ndim == 4 else ("query_row",)
            chunks = chunk_shape(data.shape, np_dt.itemsize, self.chunk_bytes)
            arr = group.create_array(
                name,
                shape=data.shape,
                dtype=np_dt,
                chunks=chunks,
                serializer=BytesCodec(),
                compressors=self.codecs,
                fill_value=0,
                dimension_names=dims,
                attributes={"torch_dtype": dtype_name(t.dtype)} if t.is_floating_point() else {},
                overwrite=True,
                config={"write_empty_chunks": True},
            )
            if not self.direct:
                arr[...] = data
                record[name] = chunk_record(arr)
                continue
            folder = Path(self.root.store.root) / self.root.path / item.path / name
            for path, src, cshape, key in _chunk_jobs(arr, data, chunks, folder):
                jobs.append((name, key, self._chunk_pool.submit(self._write_chunk, path, src,
                                                                  cshape)))

    # chunk threads --------------------------------------------------------------------------------
    def _scratch(self, n: int) -> np.ndarray:
        buf = getattr(self._local, "buf", None)
        if buf is None or buf.size < n:
            buf = self._local.buf = np.empty(n, dtype=np.uint8)
        return buf[:n]

    def _write_chunk(self, path: Path, src: np.ndarray, cshape: tuple[int, ...]) -> int:
        """Write one chunk file as zarr's bytes -> crc32c chain stores it: the C-order chunk
        bytes (edge chunks padded with the fill value 0 to the full chunk shape), then the crc32c
        of those bytes as a little-endian uint32. Returns the crc32c."""
        if src.shape == cshape and src.flags.c_contiguous:
            payload = src  # one contiguous slab of the host tensor: no copy
        else:
            n = int(np.prod(cshape)) * src.itemsize
            payload = self._scratch(n).view(src.dtype).reshape(cshape)
            if src.shape != cshape:
                payload.fill(0)
            payload[tuple(slice(0, s) for s in src.shape)] = src
        mv = memoryview(payload).cast("B")
        flat = payload.reshape(-1).view(np.uint8)
        crc = 0
        for off in range(0, flat.size, CRC_PIECE):
            # google_crc32c holds the GIL: checksum in pieces so that the capturing thread (the
            # one launching the forward's kernels) gets the GIL back every ~0.3 ms, not every 5.
            crc = google_crc32c.extend(crc, flat[off:off + CRC_PIECE])
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        try:
            while mv:
                mv = mv[os.write(fd, mv):]
            os.write(fd, struct.pack("<I", crc))
        finally:
            os.close(fd)
        return crc


def chunk_record(arr: zarr.Array) -> dict[str, int | None]:
    """{chunk key: crc32c} of every chunk of ``arr`` as stored (the crc32c codec's trailing 4
    bytes); crc None where the store is not a local directory."""
    keys = [arr.metadata.encode_chunk_key(idx) for idx in np.ndindex(*arr.cdata_shape)]
    store = arr.store
    if not isinstance(store, LocalStore):
        return dict.fromkeys(keys)
    folder = Path(store.root) / arr.path
    out = {}
    for key in keys:
        with open(folder / key, "rb") as f:
            f.seek(-4, os.SEEK_END)
            out[key] = struct.unpack("<I", f.read(4))[0]
    return out


def _chunk_jobs(arr, data: np.ndarray, chunks: tuple[int, ...], folder: Path):
    """(file path, source slice, chunk shape, chunk key) for every chunk of ``data``; makes the
    folders."""
    grid = [range(0, n, c) for n, c in zip(data.shape, chunks)]
    made = set()
    for starts in np.ndindex(*[len(g) for g in grid]):
        lo = [g[i] for g, i in zip(grid, starts)]
        sel = tuple(slice(a, min(a + c, n)) for a, c, n in zip(lo, chunks, data.shape))
        key = arr.metadata.encode_chunk_key(tuple(starts))
        path = folder / key
        if path.parent not in made:
            path.parent.mkdir(parents=True, exist_ok=True)
            made.add(path.parent)
        yield path, data[sel], tuple(chunks), key


_DISK_FULL = {errno.ENOSPC: "disk full", errno.EDQUOT: "disk quota exceeded",
              errno.EFBIG: "file size limit reached"}


def describe_os_error(exc: OSError, where: str, doing: str) -> CaptureStoreError:
    """One line for an OSError while ``doing`` something to the store at ``where``."""
    name = f" ({exc.filename})" if getattr(exc, "filename", None) else ""
    if exc.errno in _DISK_FULL:
        return CaptureStoreError(f"{where}: {_DISK_FULL[exc.errno]} while {doing}{name}; free "
                                 f"space, then resume (--resume)")
    return CaptureStoreError(f"{where}: {doing} failed: {exc.strerror or exc}{name}")


def _describe(exc: BaseException, path: str, where: str) -> CaptureWriteError:
    if isinstance(exc, OSError) and exc.errno in _DISK_FULL:
        msg = (f"{where}: {_DISK_FULL[exc.errno]} while writing entry {path} ({exc}); entries "
               f"completed before it are kept and the store reopens with them; free space, then "
               f"resume (--resume)")
    else:
        msg = f"{where}: writing entry {path} failed: {type(exc).__name__}: {exc}"
    err = CaptureWriteError(msg)
    err.entry = path
    err.__cause__ = exc
    return err

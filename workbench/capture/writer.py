"""Streaming store writer: host copy in the hook, a bounded queue, one background writer thread.

The hook only copies (GPU -> pinned host buffer on a side stream, or a CPU clone) and enqueues; the
writer thread does all zarr I/O, so the writer is the single owner of every chunk and every metadata
key it touches. Host memory held by queued entries is bounded by ``budget_bytes``: a hook that would
exceed it blocks until the writer frees memory (back-pressure), never grows without bound.
"""

from __future__ import annotations

import errno
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
import zarr
from zarr.codecs import BytesCodec, Crc32cCodec, ZstdCodec

from .schema import (
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


class CaptureWriteError(CaptureStoreError):
    """The writer thread failed on an entry; completed entries before it are kept."""


def codecs_for(compressor: str | None) -> list:
    """Bytes-to-bytes codec chain: optional compressor, then crc32c (checksum of the stored bytes)."""
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
                f"{what}: one entry needs {n / 2**20:.1f} MiB of host memory but the capture budget "
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


@dataclass
class PendingEntry:
    path: str  # store path of the entry group
    attrs: dict[str, Any]
    arrays: dict[str, torch.Tensor]  # host tensors (pinned when they came from CUDA)
    nbytes: int
    event: Any = None  # CUDA event the D2H copies were recorded on


@dataclass
class WriterStats:
    entries: int = 0
    bytes: int = 0
    write_seconds: float = 0.0
    skipped: list[str] = field(default_factory=list)

    @property
    def mb_per_s(self) -> float:
        return self.bytes / 2**20 / self.write_seconds if self.write_seconds else 0.0


class StoreWriter:
    """Background writer of entries into an open zarr root group."""

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
    ):
        self.root = root
        self.where = where
        self.budget = HostBudget(budget_bytes)
        self.codecs = codecs_for(compressor)
        self.compressor = compressor or "none"
        self.chunk_bytes = chunk_bytes
        self.stats = WriterStats()
        self.error: CaptureWriteError | None = None
        self._queue: queue.Queue[PendingEntry | None] = queue.Queue(maxsize=max(1, queue_size))
        self._copy_stream = None
        self._bar = None
        if progress:
            from tqdm.auto import tqdm

            self._bar = tqdm(total=total, unit="entry", desc=f"capture {where}", leave=False)
        self._thread = threading.Thread(target=self._run, name="capture-writer", daemon=True)
        self._thread.start()

    # producer side (the hook) ----------------------------------------------------------------------
    def raise_if_failed(self) -> None:
        if self.error is not None:
            raise self.error

    def submit(self, path: str, attrs: dict[str, Any], arrays: dict[str, torch.Tensor]) -> None:
        """Copy ``arrays`` to host memory (blocking while over budget) and queue them for writing."""
        self.raise_if_failed()
        nbytes = sum(t.numel() * t.element_size() for t in arrays.values())
        self.budget.acquire(nbytes, f"{self.where} entry {path}")
        if self.budget.failed is not None:
            self.budget.release(nbytes)
            self.raise_if_failed()
        host, event = self._to_host(arrays)
        item = PendingEntry(path=path, attrs=attrs, arrays=host, nbytes=nbytes, event=event)
        while True:  # a bounded queue: block, but wake up to notice a dead writer
            try:
                self._queue.put(item, timeout=0.5)
                return
            except queue.Full:
                if self.error is not None:
                    self.budget.release(nbytes)
                    raise self.error from None

    def _to_host(self, arrays: dict[str, torch.Tensor]):
        if not any(t.is_cuda for t in arrays.values()):
            # detach().clone(): the model may reuse or modify its buffers after the hook returns.
            return {k: t.detach().contiguous().clone() if t.is_contiguous() else
                    t.detach().contiguous() for k, t in arrays.items()}, None
        if self._copy_stream is None:
            self._copy_stream = torch.cuda.Stream()
        cur = torch.cuda.current_stream()
        self._copy_stream.wait_stream(cur)
        host = {}
        with torch.cuda.stream(self._copy_stream):
            for k, t in arrays.items():
                buf = torch.empty(t.shape, dtype=t.dtype, pin_memory=True)
                buf.copy_(t.detach(), non_blocking=True)
                t.record_stream(self._copy_stream)  # keep t alive until the copy finished
                host[k] = buf
            event = torch.cuda.Event()
            event.record(self._copy_stream)
        return host, event

    def close(self) -> WriterStats:
        """Flush the queue, stop the thread, and raise the first writer error, if any."""
        while self._thread.is_alive():
            try:
                self._queue.put(None, timeout=0.5)
                break
            except queue.Full:
                continue
        self._thread.join()
        if self._bar is not None:
            self._bar.close()
        self.raise_if_failed()
        return self.stats

    # writer thread ---------------------------------------------------------------------------------
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
            finally:
                item.arrays = {}
                self.budget.release(item.nbytes)

    def _write(self, item: PendingEntry) -> None:
        if item.event is not None:
            item.event.synchronize()
        t0 = time.perf_counter()
        attrs = dict(item.attrs, status=STATUS_WRITING, compressor=self.compressor)
        group = self.root.create_group(item.path, overwrite=True, attributes=attrs)
        for name, t in item.arrays.items():
            if name != "q_rows" and not t.is_floating_point():
                raise TypeError(f"array {name!r}: dtype {t.dtype} is not a storable float dtype")
            np_dt = stored_numpy_dtype(t.dtype) if t.is_floating_point() else np.dtype("int64")
            data = to_numpy_bits(t) if t.is_floating_point() else t.numpy().astype("int64")
            dims = DIMS if data.ndim == 4 else ("query_row",)
            arr = group.create_array(
                name,
                shape=data.shape,
                dtype=np_dt,
                chunks=chunk_shape(data.shape, np_dt.itemsize, self.chunk_bytes),
                serializer=BytesCodec(),
                compressors=self.codecs,
                fill_value=0,
                dimension_names=dims,
                attributes={"torch_dtype": dtype_name(t.dtype)} if t.is_floating_point() else {},
                overwrite=True,
            )
            arr[...] = data
        # The completion marker: written only after every chunk above is on disk.
        group.attrs.update({"status": STATUS_COMPLETE, "completed_unix": time.time()})
        self.stats.write_seconds += time.perf_counter() - t0
        self.stats.entries += 1
        self.stats.bytes += item.nbytes
        if self._bar is not None:
            self._bar.update(1)
            self._bar.set_postfix_str(f"{self.stats.mb_per_s:.0f} MiB/s", refresh=False)


def _describe(exc: BaseException, path: str, where: str) -> CaptureWriteError:
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        what = {errno.ENOSPC: "disk full", errno.EDQUOT: "disk quota exceeded",
                errno.EFBIG: "file size limit reached"}[exc.errno]
        msg = (f"{where}: {what} while writing entry {path} ({exc}); entries completed before it "
               f"are kept and the store reopens with them; free space, then resume")
    else:
        msg = f"{where}: writing entry {path} failed: {type(exc).__name__}: {exc}"
    err = CaptureWriteError(msg)
    err.entry = path
    err.__cause__ = exc
    return err

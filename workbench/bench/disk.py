"""Raw file-write baseline for capture-writer benchmarks: the same bytes, plain file writes."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch

PIECE = 32 * 2**20  # the capture store's chunk size


def write_file(path: Path, t: torch.Tensor, piece: int = PIECE) -> int:
    """Write a CPU tensor's bytes to `path` in `piece`-byte writes. Returns the byte count."""
    buf = t.view(torch.uint8).numpy().reshape(-1)
    with open(path, "wb") as f:
        for off in range(0, buf.size, piece):
            f.write(memoryview(buf[off:off + piece]))
    return int(buf.size)


def raw_write(tensors, folder: Path, threads: int = 1) -> tuple[int, float]:
    """Plain writes of the same bytes, one file per tensor. Returns (bytes, seconds).

    threads=1 is the sequential write the capture target refers to; more is context only.
    """
    folder.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    if threads == 1:
        total = sum(write_file(folder / f"t{i}.bin", t) for i, t in enumerate(tensors))
    else:
        with ThreadPoolExecutor(threads) as ex:
            total = sum(ex.map(lambda it: write_file(folder / f"t{it[0]}.bin", it[1]),
                               enumerate(tensors)))
    return total, time.perf_counter() - t0

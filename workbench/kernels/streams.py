"""The kernels' side CUDA streams: one per device, taken once from torch's stream pool."""

from __future__ import annotations

import functools

import torch


@functools.lru_cache(maxsize=None)
def side_stream(device_index: int) -> torch.cuda.Stream:
    """The side stream of one device (the same stream every call, without a per-call device
    switch); concurrent callers' side work runs one after the other on it, each ordered by its
    call's stream waits (``wait_stream`` before and after)."""
    return torch.cuda.Stream(device=device_index)


def device_index(t: torch.Tensor) -> int:
    """The CUDA device index of a tensor (the current device for an index-less one)."""
    return t.device.index if t.device.index is not None else torch.cuda.current_device()

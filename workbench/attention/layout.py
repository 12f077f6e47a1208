"""Input validation for [B, S, H, D] attention operands (and the segment layout, re-exported)."""

from __future__ import annotations

import math
import numbers

import torch

from workbench.layout import H3_LIVE_LAYOUT, SegmentLayout  # noqa: F401 (re-exported)

SUPPORTED_DTYPES = (torch.float16, torch.bfloat16, torch.float32, torch.float64)


class InputError(ValueError):
    """Bad attention input: the message names the tensor and the problem."""


def check_qkv(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *, allow_nonfinite: bool = False
) -> tuple[int, int, int, int, int]:
    """Validate [B, S, H, D] q and [B, S, Hkv, D] k, v. Returns (B, Sq, H, Hkv, D).

    GQA: H must be a multiple of Hkv; query head h reads K/V head h // (H // Hkv).
    """
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not isinstance(t, torch.Tensor):
            raise InputError(f"{name}: expected a torch.Tensor, got {type(t).__name__}")
        if t.dim() != 4:
            raise InputError(
                f"{name}: expected rank 4 [B, S, H, D], got rank {t.dim()} with shape "
                f"{tuple(t.shape)}"
            )
        if t.dtype not in SUPPORTED_DTYPES:
            raise InputError(
                f"{name}: unsupported dtype {t.dtype}; use one of "
                f"{[str(d) for d in SUPPORTED_DTYPES]}"
            )
        if t.shape[1] == 0:
            raise InputError(f"{name}: empty sequence (S = 0) in shape {tuple(t.shape)}")
        if t.shape[0] == 0 or t.shape[2] == 0 or t.shape[3] == 0:
            raise InputError(f"{name}: empty batch, head or channel dim in shape {tuple(t.shape)}")
    if k.shape != v.shape:
        raise InputError(f"k and v: shapes differ, k {tuple(k.shape)} vs v {tuple(v.shape)}")
    B, Sq, H, D = q.shape
    if k.shape[0] != B:
        raise InputError(f"k: batch {k.shape[0]} does not match q's batch {B}")
    if k.shape[3] != D:
        raise InputError(f"k: head_dim {k.shape[3]} does not match q's head_dim {D}")
    Hkv = k.shape[2]
    if H % Hkv:
        raise InputError(
            f"k: {Hkv} K/V heads do not divide q's {H} heads (GQA needs H % Hkv == 0)"
        )
    if not allow_nonfinite:
        for name, t in (("q", q), ("k", k), ("v", v)):
            # one cheap reduction first; locate the culprit only when it is not finite
            if bool(torch.isfinite(t.sum(dtype=torch.float32))):
                continue
            bad = ~torch.isfinite(t)
            if bool(bad.any()):
                first = tuple(int(i) for i in bad.nonzero()[0])
                raise InputError(
                    f"{name}: {int(bad.sum())} non-finite value(s) (NaN/Inf), first at "
                    f"[b, s, h, d] = {first}"
                )
    return B, Sq, H, Hkv, D


def check_query_index(query_index, seq_len: int, device=None) -> torch.Tensor:
    """Turn query row indices into a sorted-unique-free LongTensor, validating the range."""
    if query_index is None:
        return torch.arange(seq_len, device=device)
    idx = torch.as_tensor(query_index, device=device)
    if idx.dim() != 1:
        raise InputError(f"query_index: expected a 1-D list of rows, got shape {tuple(idx.shape)}")
    if idx.numel() == 0:
        raise InputError("query_index: empty; give at least one query row")
    if idx.dtype.is_floating_point or idx.dtype == torch.bool:
        raise InputError(f"query_index: expected integer rows, got dtype {idx.dtype}")
    idx = idx.long()
    lo, hi = int(idx.min()), int(idx.max())
    if lo < 0 or hi >= seq_len:
        raise InputError(
            f"query_index: rows must lie in [0, {seq_len}), got min {lo} and max {hi}"
        )
    return idx


def check_scale(scale) -> None:
    """The softmax scale, when given, is a finite positive number (NaN or Inf would otherwise
    surface later as an overflow blamed on q, k or v, or as an all-NaN kernel output)."""
    if scale is None:
        return
    value = scale
    if isinstance(scale, torch.Tensor) and scale.numel() == 1 and scale.dtype.is_floating_point:
        value = float(scale)  # a 0-dim tensor from a model's config
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not (
            math.isfinite(value) and value > 0):
        raise InputError(f"scale: {scale!r}; the softmax scale must be a finite positive number "
                         f"(None: 1/sqrt(head_dim))")


def evenly_spaced_rows(seq_len: int, n: int) -> torch.Tensor:
    """n evenly spaced query rows over [0, seq_len) (the seed's 64 sampled positions)."""
    if n >= seq_len:
        return torch.arange(seq_len)
    return torch.linspace(0, seq_len - 1, n).round().long()


def select_heads(q, k, v, heads) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Slice query heads (and the K/V heads they read under GQA). heads: list of query head ids."""
    if heads is None:
        return q, k, v
    H, Hkv = q.shape[2], k.shape[2]
    heads = list(heads)
    bad = [h for h in heads if not 0 <= h < H]
    if bad:
        raise InputError(f"heads: {bad} out of range for q with {H} heads")
    group = H // Hkv
    kv_heads = sorted({h // group for h in heads})
    if group == 1:
        return q[:, :, heads], k[:, :, heads], v[:, :, heads]
    # Keep GQA structure only when the selection is whole groups, each head once, ascending
    # (then position i // group of the selection is its K/V head); else expand K/V per query head.
    whole = all(all(g * group + j in heads for j in range(group)) for g in kv_heads)
    if whole and heads == sorted(set(heads)):
        return q[:, :, heads], k[:, :, kv_heads], v[:, :, kv_heads]
    kvi = [h // group for h in heads]
    return q[:, :, heads], k[:, :, kvi], v[:, :, kvi]

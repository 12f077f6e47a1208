"""Tensor error measures, computed in float64.

relative L2 = ||x - ref|| / ||ref||;  SQNR dB = 20 log10(||ref|| / ||x - ref||);  cosine on the
flattened tensors; MSE; max abs error. ``per_head`` reduces over every dim but the head dim.
"""

from __future__ import annotations

import math

import torch

METRICS = ("mse", "rel_l2", "cosine", "sqnr_db", "max_abs")


def error_stats(x: torch.Tensor, ref: torch.Tensor) -> dict[str, float]:
    """All METRICS of x against ref over every element."""
    if x.shape != ref.shape:
        raise ValueError(f"error_stats: shapes differ, {tuple(x.shape)} vs ref {tuple(ref.shape)}")
    x = x.double().flatten()
    ref = ref.double().flatten()
    d = x - ref
    err = float(d.norm())
    nref = float(ref.norm())
    nx = float(x.norm())
    return {
        "mse": float(d.pow(2).mean()),
        "rel_l2": err / nref if nref > 0 else (0.0 if err == 0 else math.inf),
        "cosine": float(x @ ref) / (nx * nref) if nx > 0 and nref > 0 else float(err == 0),
        "sqnr_db": 20 * math.log10(nref / err) if err > 0 else math.inf,
        "max_abs": float(d.abs().max()),
    }


def per_head(x: torch.Tensor, ref: torch.Tensor, head_dim: int = 2) -> dict[str, list[float]]:
    """METRICS per head (index `head_dim` of [B, S, H, D]). Returns {metric: [value per head]}."""
    out: dict[str, list[float]] = {m: [] for m in METRICS}
    for h in range(x.shape[head_dim]):
        s = error_stats(x.select(head_dim, h), ref.select(head_dim, h))
        for m in METRICS:
            out[m].append(s[m])
    return out


def benefit_pct(a: float, b: float) -> float:
    """How much smaller B's error is than A's, in percent of A's: (A - B) / A * 100."""
    if a == 0:
        return 0.0 if b == 0 else -math.inf
    return (a - b) / a * 100.0


def bootstrap_benefit(
    err_a: torch.Tensor, err_b: torch.Tensor, n_boot: int = 2000, seed: int = 0, level: float = 0.95
) -> tuple[float, float]:
    """Paired bootstrap interval of benefit_pct(mean(err_a), mean(err_b)) over sampled rows.

    err_a, err_b: per-row squared errors [n] of the same rows under recipes A and B. Resampling
    rows says how much of a benefit measured on a few query rows could be sampling luck.
    """
    a = err_a.double().flatten()
    b = err_b.double().flatten()
    if a.shape != b.shape:
        raise ValueError("bootstrap_benefit: err_a and err_b must cover the same rows")
    g = torch.Generator().manual_seed(seed)
    idx = torch.randint(0, a.numel(), (n_boot, a.numel()), generator=g)
    ma, mb = a[idx].mean(1), b[idx].mean(1)
    ben = torch.where(ma > 0, (ma - mb) / ma * 100.0, torch.zeros_like(ma))
    lo = float(torch.quantile(ben, (1 - level) / 2))
    hi = float(torch.quantile(ben, 1 - (1 - level) / 2))
    return lo, hi

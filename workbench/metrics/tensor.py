"""Tensor error measures, computed in float64.

relative L2 = ||x - ref|| / ||ref||;  SQNR dB = 20 log10(||ref|| / ||x - ref||);  cosine on the
flattened tensors; MSE; max abs error. ``per_head`` reduces over every dim but the head dim.
"""

from __future__ import annotations

import math

import torch

METRICS = ("mse", "rel_l2", "cosine", "sqnr_db", "max_abs")


def _moments(x: torch.Tensor, ref: torch.Tensor, dims) -> dict[str, torch.Tensor]:
    """Sums needed by every metric, reduced over `dims` with float64 accumulation.

    float64 inputs stay float64; others are differenced in float32 (exact for the small
    differences that matter here up to 2^-24 relative) and summed in float64, which keeps the
    cost of a pass over a full K or V low.
    """
    if x.shape != ref.shape:
        raise ValueError(f"error_stats: shapes differ, {tuple(x.shape)} vs ref {tuple(ref.shape)}")
    dt = torch.float64 if torch.float64 in (x.dtype, ref.dtype) else torch.float32
    x = x.to(dt)
    ref = ref.to(dt)
    d = x - ref
    f64 = torch.float64
    n = 1
    for i in dims:
        n *= x.shape[i]
    # Reduce the longest dim first in the compute dtype (torch's CPU sum is a cascade sum, so a
    # float32 partial over one row of tokens stays accurate), then finish in float64.
    inner = max(dims, key=lambda i: x.shape[i])
    rest = tuple(i - (i > inner) for i in dims if i != inner)

    def total(t: torch.Tensor) -> torch.Tensor:
        part = t.sum(dim=inner).to(f64)
        return part.sum(dim=rest) if rest else part

    return {
        "d2": total(d * d),
        "r2": total(ref * ref),
        "x2": total(x * x),
        "xr": total(x * ref),
        "maxd": d.abs().amax(dim=dims).to(f64),
        "n": torch.tensor(float(n), dtype=f64),
    }


def _from_moments(d2, r2, x2, xr, maxd, n) -> dict[str, float]:
    d2, r2, x2, xr, maxd, n = (float(t) for t in (d2, r2, x2, xr, maxd, n))
    err, nref, nx = math.sqrt(d2), math.sqrt(r2), math.sqrt(x2)
    return {
        "mse": d2 / n,
        "rel_l2": err / nref if nref > 0 else (0.0 if err == 0 else math.inf),
        "cosine": xr / (nx * nref) if nx > 0 and nref > 0 else float(err == 0),
        "sqnr_db": 20 * math.log10(nref / err) if err > 0 else math.inf,
        "max_abs": maxd,
    }


def error_stats(x: torch.Tensor, ref: torch.Tensor) -> dict[str, float]:
    """All METRICS of x against ref over every element."""
    m = _moments(x.reshape(-1), ref.reshape(-1), (0,))
    return _from_moments(**m)


def per_head(x: torch.Tensor, ref: torch.Tensor, head_dim: int = 2) -> dict[str, list[float]]:
    """METRICS per head (index `head_dim` of [B, S, H, D]). Returns {metric: [value per head]}."""
    return stats_overall_and_per_head(x, ref, head_dim)[1]


def stats_overall_and_per_head(
    x: torch.Tensor, ref: torch.Tensor, head_dim: int = 2
) -> tuple[dict[str, float], dict[str, list[float]]]:
    """(overall METRICS, {metric: [per head]}) from one pass over the tensors."""
    dims = tuple(i for i in range(x.dim()) if i != head_dim)
    m = _moments(x, ref, dims)
    heads: dict[str, list[float]] = {k: [] for k in METRICS}
    for h in range(x.shape[head_dim]):
        s = _from_moments(m["d2"][h], m["r2"][h], m["x2"][h], m["xr"][h], m["maxd"][h], m["n"])
        for k in METRICS:
            heads[k].append(s[k])
    overall = _from_moments(m["d2"].sum(), m["r2"].sum(), m["x2"].sum(), m["xr"].sum(),
                            m["maxd"].max(), m["n"] * x.shape[head_dim])
    return overall, heads


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


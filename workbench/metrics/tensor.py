"""Tensor error measures, computed in float64.

relative L2 = ||x - ref|| / ||ref||;  SQNR dB = 20 log10(||ref|| / ||x - ref||);  cosine on the
flattened tensors; MSE; max abs error. ``per_head`` reduces over every dim but the head dim.
"""

from __future__ import annotations

import math

import torch

METRICS = ("mse", "rel_l2", "cosine", "sqnr_db", "max_abs")


# Elements per chunk of a moments pass (~128 MB of float64 temporaries at most).
_CHUNK_ELEMS = 1 << 24
# Below this RMS / largest difference, float32 squares lose digits to underflow (|v| < 1.1e-19
# squares below float32's normal range); such tensors are measured in float64.
_F32_TINY = 1e-15


def _moments(x: torch.Tensor, ref: torch.Tensor, dims) -> dict[str, torch.Tensor]:
    """Sums needed by every metric, reduced over `dims`, accumulated in float64.

    float64 inputs are measured in float64. Others are differenced and multiplied in float32
    (the difference of two float32 values within a factor of two is exact) and summed along the
    longest dim in float32 (torch's CPU sum is a cascade sum: ~1e-7 relative), then in float64:
    2-3x faster than float64 throughout on a full K or V. Where float32 squares would overflow
    (|v| > ~1e19) or underflow (RMS or largest difference < 1e-15), the pass is redone in
    float64. Chunks along the longest dim bound the temporaries.
    """
    if x.shape != ref.shape:
        raise ValueError(f"error_stats: shapes differ, {tuple(x.shape)} vs ref {tuple(ref.shape)}")
    if x.numel() == 0:
        raise ValueError(f"error_stats: empty tensors (shape {tuple(x.shape)}); nothing to measure")
    if torch.float64 in (x.dtype, ref.dtype):
        return _moments_in(x, ref, dims, torch.float64)
    m = _moments_in(x, ref, dims, torch.float32)
    n = float(m["n"])
    sums = torch.stack([m["d2"], m["r2"], m["x2"], m["xr"]])
    rms = torch.stack([m["r2"], m["x2"]]) / n
    tiny = ((m["maxd"] > 0) & (m["maxd"] < _F32_TINY)).any() or \
        ((rms > 0) & (rms < _F32_TINY**2)).any()
    if not bool(torch.isfinite(sums).all()) or bool(tiny):
        return _moments_in(x, ref, dims, torch.float64)
    return m


def _moments_in(x: torch.Tensor, ref: torch.Tensor, dims, dt: torch.dtype) -> dict:
    """``_moments`` with differences and products in dt (partial sums along the longest dim in
    dt, the rest in float64)."""
    f64 = torch.float64
    n = 1
    for i in dims:
        n *= x.shape[i]
    inner = max(dims, key=lambda i: x.shape[i])
    rest = tuple(i - (i > inner) for i in dims if i != inner)
    step = max(1, _CHUNK_ELEMS // max(1, x.numel() // x.shape[inner]))
    sums: dict[str, torch.Tensor] = {}
    for a in range(0, x.shape[inner], step):
        xs = x.narrow(inner, a, min(step, x.shape[inner] - a)).to(dt)
        rs = ref.narrow(inner, a, xs.shape[inner]).to(dt)
        d = xs - rs
        part = {"d2": (d * d).sum(dim=inner), "r2": (rs * rs).sum(dim=inner),
                "x2": (xs * xs).sum(dim=inner), "xr": (xs * rs).sum(dim=inner)}
        maxd = d.abs().amax(dim=inner).to(f64)
        for key, val in part.items():
            val = val.to(f64)
            sums[key] = sums[key] + val if key in sums else val
        sums["maxd"] = torch.maximum(sums["maxd"], maxd) if "maxd" in sums else maxd
    out = {k: (t.sum(dim=rest) if rest else t) for k, t in sums.items() if k != "maxd"}
    out["maxd"] = sums["maxd"].amax(dim=rest) if rest else sums["maxd"]
    out["n"] = torch.tensor(float(n), dtype=f64)
    return out


def _from_moments(d2, r2, x2, xr, maxd, n) -> dict[str, float]:
    d2, r2, x2, xr, maxd, n = (float(t) for t in (d2, r2, x2, xr, maxd, n))
    err, nref, nx = math.sqrt(d2), math.sqrt(r2), math.sqrt(x2)
    if nx > 0 and nref > 0:
        if max(nx, nref) <= 2.0 * min(nx, nref):
            # 1 - cos = (|x - ref|^2 - (|x| - |ref|)^2) / (2 |x| |ref|): exact algebra without
            # the cancellation of two numbers near 1 (1 - cos of a close x to ~1e-7 relative)
            cos = 1.0 - (d2 - (nx - nref) ** 2) / (2.0 * nx * nref)
        else:  # norms far apart: the identity's error grows with their ratio; x.ref is exact
            cos = xr / (nx * nref)
        cos = min(1.0, max(-1.0, cos))
    else:
        cos = float(err == 0)
    return {
        "mse": d2 / n,
        "rel_l2": err / nref if nref > 0 else (0.0 if err == 0 else math.inf),
        "cosine": cos,
        "sqnr_db": (20 * math.log10(nref / err) if nref > 0 else -math.inf) if err > 0
        else math.inf,
        "max_abs": maxd,
    }


def error_stats(x: torch.Tensor, ref: torch.Tensor) -> dict[str, float]:
    """All METRICS of x against ref over every element (same shapes: a transposed or reshaped
    ref of the same size is refused, not compared element by element)."""
    if x.shape != ref.shape:
        raise ValueError(f"error_stats: shapes differ, {tuple(x.shape)} vs ref {tuple(ref.shape)}")
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


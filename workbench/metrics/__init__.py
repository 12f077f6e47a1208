"""Metrics: tensor error measures, per-boundary / per-head metrics, drift, error by position."""

from .boundaries import (
    BOUNDARIES,
    BOUNDARY_LABELS,
    BoundaryMetrics,
    boundary_metrics,
    channel_mean_norms,
    error_along_tokens,
    token_mean_drift,
)
from workbench.jsonutil import json_safe

from .tensor import (
    METRICS,
    benefit_pct,
    bootstrap_benefit,
    error_stats,
    per_head,
    stats_overall_and_per_head,
)

__all__ = [
    "BOUNDARIES",
    "BOUNDARY_LABELS",
    "METRICS",
    "BoundaryMetrics",
    "benefit_pct",
    "bootstrap_benefit",
    "boundary_metrics",
    "channel_mean_norms",
    "error_along_tokens",
    "error_stats",
    "json_safe",
    "per_head",
    "stats_overall_and_per_head",
    "token_mean_drift",
]

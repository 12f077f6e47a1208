"""Metrics: tensor error measures, per-boundary / per-head metrics, drift, error by position."""

from workbench.layout import channel_groups, channel_span, check_rotated

from .boundaries import (
    BOUNDARIES,
    BOUNDARY_LABELS,
    BoundaryMetrics,
    boundary_metrics,
    channel_mean_norms,
    drift_summary,
    error_along_tokens,
    error_by_segment,
    token_mean_drift,
)
from workbench.jsonutil import json_safe

from .formats import NUMBER_FORMATS, fmt, fmt_benefit
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
    "NUMBER_FORMATS",
    "BoundaryMetrics",
    "benefit_pct",
    "bootstrap_benefit",
    "boundary_metrics",
    "channel_groups",
    "channel_mean_norms",
    "channel_span",
    "check_rotated",
    "drift_summary",
    "error_along_tokens",
    "error_by_segment",
    "error_stats",
    "fmt",
    "fmt_benefit",
    "json_safe",
    "per_head",
    "stats_overall_and_per_head",
    "token_mean_drift",
]

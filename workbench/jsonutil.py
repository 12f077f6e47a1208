"""Strict JSON for numbers: a spec-level helper every stage that writes JSON uses."""

from __future__ import annotations

import math


def json_safe(obj):
    """Nested results as strict JSON: inf / nan become the strings "inf", "-inf", "nan"."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return str(obj)
    if isinstance(obj, dict):
        return {k: json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [json_safe(v) for v in obj]
    return obj

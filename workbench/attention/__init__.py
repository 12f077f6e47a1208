"""Reference path in plain torch: quantizer emulation, sparse routing, recipe attention, float64."""

from .layout import (
    H3_LIVE_LAYOUT,
    InputError,
    SegmentLayout,
    check_qkv,
    evenly_spaced_rows,
    select_heads,
)
from .reference import AttentionResult, dense_attention_f64, recipe_attention

__all__ = [
    "AttentionResult",
    "H3_LIVE_LAYOUT",
    "InputError",
    "SegmentLayout",
    "check_qkv",
    "dense_attention_f64",
    "evenly_spaced_rows",
    "recipe_attention",
    "select_heads",
]

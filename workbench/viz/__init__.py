"""Figures (pure builders: data in, plotly figure out), replay compute, and thin widgets.

``workbench.viz.figures`` holds the builders; ``workbench.viz.compute`` the numbers behind them
(store replay through recipes); ``workbench.viz.widgets`` the ipywidgets explorer (imported lazily:
the builders need no Jupyter).
"""

from .compute import (
    Comparison,
    RecipeEval,
    ReplaySource,
    default_device,
    evaluate_recipes,
    find_store,
    layer_head_grid,
    shipped_stores,
)
from .figures import (
    audio_comparison,
    boundary_bars,
    drift_per_channel,
    error_along_tokens,
    frame_grid,
    frame_metric_curves,
    kernel_bench,
    per_head_heatmap,
    routing_map,
)

__all__ = [
    "Comparison",
    "RecipeEval",
    "ReplaySource",
    "audio_comparison",
    "boundary_bars",
    "default_device",
    "drift_per_channel",
    "error_along_tokens",
    "evaluate_recipes",
    "find_store",
    "frame_grid",
    "frame_metric_curves",
    "kernel_bench",
    "layer_head_grid",
    "per_head_heatmap",
    "routing_map",
    "shipped_stores",
]

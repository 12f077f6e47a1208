"""Figures (pure builders: data in, plotly figure out) and thin widgets.

``workbench.viz.figures`` holds the builders, ``comparison_figures`` the set of figures drawn for
one ``workbench.evaluate.Comparison``; ``workbench.viz.widgets`` the ipywidgets explorer (imported
lazily: the builders need no Jupyter). The numbers behind the figures come from
``workbench.evaluate``.
"""

from .figures import (
    accuracy_vs_length,
    audio_comparison,
    boundary_bars,
    comparison_figures,
    drift_per_channel,
    error_along_tokens,
    frame_grid,
    frame_metric_curves,
    kernel_bench,
    per_head_heatmap,
    routing_map,
)

__all__ = [
    "accuracy_vs_length",
    "audio_comparison",
    "boundary_bars",
    "comparison_figures",
    "drift_per_channel",
    "error_along_tokens",
    "frame_grid",
    "frame_metric_curves",
    "kernel_bench",
    "per_head_heatmap",
    "routing_map",
]

_MOVED = {"Comparison", "RecipeEval", "ReplaySource", "default_device", "evaluate_recipes",
          "find_store", "layer_head_grid", "shipped_stores"}


def __getattr__(name):
    """Names that moved to ``workbench.evaluate``: still reachable here, with a warning."""
    if name in _MOVED:
        import warnings

        import workbench.evaluate as ev

        warnings.warn(f"workbench.viz.{name} moved to workbench.evaluate.{name}", FutureWarning,
                      stacklevel=2)
        return getattr(ev, name)
    raise AttributeError(f"module 'workbench.viz' has no attribute {name!r}")

"""The evaluation stage: an entry's q/k/v + recipes in, one ``Comparison`` out.

``engine.evaluate`` runs recipes on the reference path against a float64 dense reference and
collects every metric; ``source.ReplaySource`` reads entries from capture stores. The accuracy
table (``workbench.report``), the PR report, the smoothing explorer (``workbench.viz``) and the
notebooks format what this stage returns.
"""

from .engine import (
    TABLE_ROWS,
    Comparison,
    RecipeEval,
    evaluate,
    evaluate_entry,
    evaluate_recipes,
    layer_head_grid,
)
from .source import (
    CAPTURES_DIR,
    REPO_ROOT,
    ReplaySource,
    default_device,
    find_store,
    shipped_stores,
)

__all__ = [
    "CAPTURES_DIR",
    "REPO_ROOT",
    "TABLE_ROWS",
    "Comparison",
    "RecipeEval",
    "ReplaySource",
    "default_device",
    "evaluate",
    "evaluate_entry",
    "evaluate_recipes",
    "find_store",
    "layer_head_grid",
    "shipped_stores",
]

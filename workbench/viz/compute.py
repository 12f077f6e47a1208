"""Deprecated: the evaluation engine moved to ``workbench.evaluate``.

This module re-exports its names so that existing notebooks keep running; it warns on import.
"""

import warnings

from workbench.evaluate import (  # noqa: F401
    CAPTURES_DIR,
    REPO_ROOT,
    Comparison,
    RecipeEval,
    ReplaySource,
    default_device,
    evaluate_recipes,
    find_store,
    layer_head_grid,
    shipped_stores,
)

warnings.warn("workbench.viz.compute is deprecated: import from workbench.evaluate",
              FutureWarning, stacklevel=2)

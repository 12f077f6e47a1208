"""The evaluation stage: an entry's q/k/v + recipes in, one ``Comparison`` out.

``engine.evaluate`` runs recipes on the reference path against a float64 dense reference and
collects every metric; ``source.ReplaySource`` reads entries from capture stores; ``scan.run_scan``
evaluates every entry x recipe of a capture as dask tasks into a resumable scan store
(``open_scan``), and ``planning.derive_plan`` turns a scan into a per-(step, layer) recipe plan.
The accuracy table (``workbench.report``), the PR report, the smoothing explorer
(``workbench.viz``) and the notebooks format what this stage returns.
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
from .planning import PlanRule, derive_plan
from .scan import pair_benefit, run_scan
from .scan_store import ScanError, open_scan
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
    "PlanRule",
    "RecipeEval",
    "ReplaySource",
    "ScanError",
    "default_device",
    "derive_plan",
    "evaluate",
    "evaluate_entry",
    "evaluate_recipes",
    "find_store",
    "layer_head_grid",
    "open_scan",
    "pair_benefit",
    "run_scan",
    "shipped_stores",
]

"""The package follows the data: a module never imports a stage that comes later in the flow.

capture -> store -> replay -> variants (attention | kernels) -> evaluate -> viz / report, with the
specs every stage shares (recipes, the segment layout, synthetic inputs, CLI argument grammar) at
the bottom and the ``workbench`` command dispatcher at the top. Stages of one rank may import each
other (the reference path's lazy kernel dispatch, attention -> kernels, is such a pair).
docs/architecture.md explains each rank.
"""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parents[1] / "workbench"

# rank of every top-level module / folder of the package (lower = earlier in the data flow)
RANKS = {
    "recipes": 0, "layout": 0, "synthetic": 0, "cli_args": 0, "jsonutil": 0,
    "models": 1,
    "capture": 2,
    "attention": 3, "kernels": 3,
    "metrics": 4, "evaluate": 4, "generate": 4, "bench": 4,
    "viz": 5, "report": 5,
    "cli": 6, "__main__": 6,
}


def _stage(path: Path) -> str:
    rel = path.relative_to(PKG)
    return rel.parts[0].removesuffix(".py")


def _imported_stages(path: Path) -> list[tuple[str, int]]:
    """(stage, line) of every `workbench.X` import in the module, top-level or lazy."""
    tree = ast.parse(path.read_text())
    pkg_parts = ["workbench", *path.relative_to(PKG).with_suffix("").parts[:-1]]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg_parts[: len(pkg_parts) - node.level + 1]
                names = [".".join(base + ([node.module] if node.module else []))]
            else:
                names = [node.module or ""]
        else:
            continue
        for n in names:
            parts = n.split(".")
            if parts[0] == "workbench" and len(parts) > 1:
                found.append((parts[1], node.lineno))
    return found


def test_every_stage_has_a_rank():
    stages = {_stage(p) for p in PKG.rglob("*.py") if p.name != "__init__.py" or
              p.parent != PKG}
    missing = sorted(s for s in stages if s not in RANKS)
    assert not missing, f"give these modules a rank in RANKS and docs/architecture.md: {missing}"


def test_no_import_from_a_later_stage():
    bad = []
    for path in sorted(PKG.rglob("*.py")):
        if path.parent == PKG and path.name == "__init__.py":
            continue
        src = _stage(path)
        for tgt, line in _imported_stages(path):
            if tgt != src and RANKS.get(tgt, 99) > RANKS[src]:
                bad.append(f"{path.relative_to(PKG.parent)}:{line} ({src}, rank {RANKS[src]}) "
                           f"imports {tgt} (rank {RANKS.get(tgt)})")
    assert not bad, "imports against the data flow:\n" + "\n".join(bad)

"""The README's snippets run as written: every ```python and ```bash block, in a scratch folder.

Blocks run in README order, each in a fresh process (python) or shell (bash, `set -e`), in one
scratch folder that sees the repository's ``captures/`` and ``notebooks/``, so a later block may
read what an earlier one wrote, as a reader following the README would. The ```console block of
`workbench recipes` must match the command's real output line for line. Plain ``` blocks (make
targets, GPU commands) are not run.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.S | re.M)


def blocks(lang: str) -> list[tuple[int, str]]:
    """[(line number, code)] of the README's ```lang blocks."""
    text = README.read_text()
    return [(text[: m.start()].count("\n") + 1, m.group(2)) for m in FENCE.finditer(text)
            if m.group(1) == lang]


def test_readme_has_runnable_snippets():
    assert len(blocks("python")) >= 3 and len(blocks("bash")) >= 4
    text = README.read_text()
    assert "captures/demo.zarr" not in text
    for _, code in blocks("python") + blocks("bash"):
        assert "[--" not in code, "optional arguments in brackets do not run as written"


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    d = tmp_path_factory.mktemp("readme")
    for name in ("captures", "notebooks"):
        (d / name).symlink_to(ROOT / name)
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONPATH"] = f"{ROOT}{os.pathsep}{env.get('PYTHONPATH', '')}".rstrip(os.pathsep)
    return d, env


def _run(cmd: list[str], scratch, timeout: float) -> str:
    d, env = scratch
    r = subprocess.run(cmd, cwd=d, env=env, capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, f"{' '.join(cmd[:2])} failed:\n{r.stdout[-3000:]}\n{r.stderr[-3000:]}"
    return r.stdout


@pytest.mark.slow
@pytest.mark.parametrize("line, code", blocks("python"), ids=lambda x: str(x)[:12])
def test_python_snippet_runs(line, code, scratch):
    _run([sys.executable, "-c", code], scratch, timeout=300)


@pytest.mark.slow
@pytest.mark.parametrize("line, code", blocks("bash"), ids=lambda x: str(x)[:12])
def test_bash_snippet_runs(line, code, scratch):
    _run(["bash", "-e", "-c", code], scratch, timeout=600)


def test_recipes_transcript_matches(scratch):
    (_, code), = blocks("console")
    lines = code.splitlines()
    assert lines[0] == "$ workbench recipes"
    out = _run([sys.executable, "-m", "workbench", "recipes"], scratch, timeout=60).splitlines()
    shown = [ln for ln in lines[1:] if ln != "..."]
    assert shown and all(ln in out for ln in shown), f"README shows lines not in:\n{out}"

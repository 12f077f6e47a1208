"""Project setup: environment.yml mirrors the extras, the CLI lists its subcommands, the table
command works end to end, and the README keeps its two-command Quickstart."""

import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml

from workbench.cli import main

ROOT = Path(__file__).resolve().parents[1]


def test_environment_yml_mirrors_pyproject_extras():
    extras = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"])
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)
    line = next(p for p in pip if p.startswith("-e ."))
    named = set(re.search(r"\[(.*)\]", line).group(1).split(","))
    assert named == extras
    assert any(str(d).startswith("python=3.11") for d in env["dependencies"])


def test_makefile_extras_match_pyproject():
    extras = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"])
    mk = (ROOT / "Makefile").read_text()
    make_extras = set(re.search(r"^EXTRAS := (.*)$", mk, re.M).group(1).split(",")) | {"dev"}
    assert make_extras == extras


def test_readme_quickstart_has_two_commands():
    text = (ROOT / "README.md").read_text()
    block = text.split("## Quickstart", 1)[1].split("```", 2)[1]
    cmds = [c for c in block.splitlines()[1:] if c.strip() and not c.startswith("#")]
    assert cmds == ["make demo", "make test"]
    assert "make test" in (ROOT / ".ci" / "run").read_text()


def test_help_lists_every_subcommand(capsys):
    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    out = capsys.readouterr().out
    from workbench.cli import build_parser

    sub = next(a for a in build_parser()._actions if a.dest == "command")
    for name, parser in sub.choices.items():
        help_line = next(a.help for a in sub._choices_actions if a.dest == name)
        assert name in out and help_line and help_line in out


def test_python_dash_m_works():
    r = subprocess.run([sys.executable, "-m", "workbench", "recipes"], capture_output=True,
                       text=True, cwd=ROOT, check=True)
    assert "fp8_sol_kv_corrected" in r.stdout and "int8_qk_fp8_pv" in r.stdout


def test_table_cli_small_synthetic(tmp_path, capsys):
    out = tmp_path / "out.json"
    rc = main(["table", "--synthetic", "small", "--a", "fp8_sol_unsmoothed",
               "--b", "fp8_sol_kv_corrected", "--json", str(out)])
    assert rc == 0
    md = capsys.readouterr().out
    assert "| quanted K |" in md and "| dequanted V's mean |" in md
    data = json.loads(out.read_text())
    for b in ("quanted_k", "dequanted_v", "v_mean", "attention_output"):
        row = data["boundaries"][b]
        assert row["mse_a"] > 0 and row["mse_b"] >= 0
        assert row["benefit_pct"] == pytest.approx(
            (row["mse_a"] - row["mse_b"]) / row["mse_a"] * 100)
    assert data["boundaries"]["v_mean"]["benefit_pct"] > 99.99
    assert data["heads"] == [0, 1, 2, 3] and len(data["query_rows"]) == 64


def test_table_cli_bad_recipe_is_one_line_error(capsys):
    rc = main(["table", "--synthetic", "small", "--a", "fp8_dense:smoothing=q"])
    assert rc == 2
    err = capsys.readouterr().err
    assert "smoothing" in err and "Traceback" not in err


def test_demo_quick_writes_table(tmp_path):
    rc = main(["demo", "--out", str(tmp_path), "--quick"])
    assert rc == 0
    assert (tmp_path / "accuracy_table.md").read_text().startswith("### Smooth Attention")
    assert "boundaries" in json.loads((tmp_path / "accuracy_table.json").read_text())


def test_table_on_shipped_capture(tmp_path, capsys):
    store = ROOT / "captures" / "demo_h3_nano.zarr"
    if not store.exists():
        store = next((ROOT / "captures").glob("*.zarr"))
    out = tmp_path / "t.json"
    assert main(["table", "--store", str(store), "--step", "0", "--layer", "1",
                 "--json", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["boundaries"]["v_mean"]["mse_b"] < 1e-9 < data["boundaries"]["v_mean"]["mse_a"]
    assert main(["table", "--store", str(store), "--step", "0", "--layer", "99"]) == 2
    err = capsys.readouterr().err
    assert "no entry at step=0 layer=99" in err and not err.split("error: ")[1].startswith("'")

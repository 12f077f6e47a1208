"""--threads on the commands that compute on the CPU: one thread unless told otherwise."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from workbench.cli import DEFAULT_THREADS, THREADED_COMMANDS, build_parser, threads_to_use


def test_default_env_and_explicit(monkeypatch):
    monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    assert threads_to_use(None) == DEFAULT_THREADS == 1
    monkeypatch.setenv("OMP_NUM_THREADS", "3")
    assert threads_to_use(None) == 3 and threads_to_use(2) == 2 and threads_to_use(0) == 0
    monkeypatch.setenv("OMP_NUM_THREADS", "many")
    assert threads_to_use(None) == 1


def test_every_cpu_command_takes_threads(capsys):
    parser = build_parser()
    sub = next(a for a in parser._actions if a.dest == "command")
    have = [n for n in THREADED_COMMANDS if n in sub.choices]
    assert {"table", "demo", "report", "capture", "generate", "compare"} <= set(have)
    for name in have:
        action = sub.choices[name]._option_string_actions["--threads"]
        assert action.type("2") == 2 and sub.choices[name].get_default("threads") is None
    with pytest.raises(SystemExit):
        parser.parse_args(["table", "--threads", "-1"])
    assert "number of threads" in capsys.readouterr().err


@pytest.mark.parametrize("env, args, want", [({}, [], 1), ({"OMP_NUM_THREADS": "2"}, [], 2),
                                              ({"OMP_NUM_THREADS": "2"}, ["--threads", "1"], 1)])
def test_the_command_runs_with_that_many_threads(tmp_path, env, args, want):
    # a real process: the table command on a small input, printing the thread count it ran with
    code = ("import sys, torch; from workbench.cli import main; rc = main(sys.argv[1:]); "
            "print('THREADS', torch.get_num_threads())")
    out = subprocess.run(
        [sys.executable, "-c", code, "table", "--synthetic", "small", "--queries", "8",
         "--json", str(tmp_path / "t.json"), *args],
        env={**{k: v for k, v in __import__("os").environ.items() if k != "OMP_NUM_THREADS"},
             **env}, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert f"THREADS {want}" in out.stdout
    assert torch.get_num_threads() >= 1

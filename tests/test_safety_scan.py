"""Scan and plan never destroy or silently misread data: `plan --out/--force` writes only plan
files outside zarr stores, `scan --overwrite` replaces only a scan store (built beside it, swapped
in when complete), a damaged scan store is refused naming the store, array and task (a resumed
scan runs the lost tasks again), and `scan .` inside a capture works."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from workbench.cli import main
from workbench.evaluate.scan import run_scan
from workbench.evaluate.scan_store import ScanError, open_scan

ROOT = Path(__file__).resolve().parents[1]
STORE = ROOT / "captures" / "demo_h3_nano.zarr"
RECIPES = "fp8_dense,fp8_dense_k"
SMALL = dict(steps=[7, 8], layers=[1, 2], n_queries=16, scheduler="synchronous",
             progress=False, device="cpu")
CLI_SMALL = ["--recipes", RECIPES, "--steps", "7,8", "--layers", "1,2", "--queries", "16",
             "--scheduler", "synchronous", "--device", "cpu", "--quiet"]


@pytest.fixture(scope="module")
def scan(tmp_path_factory):
    """A complete small scan of the shipped capture (tests damage copies of it)."""
    out = tmp_path_factory.mktemp("scan") / "s.scan.zarr"
    run_scan(STORE, RECIPES, out=out, **SMALL)
    return out


@pytest.fixture()
def copy(scan, tmp_path):
    out = tmp_path / "c.scan.zarr"
    shutil.copytree(scan, out)
    return out


@pytest.fixture()
def small_capture(tmp_path):
    """A two-layer capture store of random tensors (workbench import), in tmp_path."""
    import torch

    from workbench.capture.importer import import_tensors

    g = torch.Generator().manual_seed(0)
    data = {f"layer{i}.{r}": torch.randn(96, 2, 32, generator=g) for i in (0, 1) for r in "qkv"}
    torch.save(data, tmp_path / "d.pt")
    store = tmp_path / "cap.zarr"
    import_tensors([tmp_path / "d.pt"], store, rotated=0)
    return store


from test_scan import _assert_same  # noqa: E402  (every number of a scan, timing aside)


def _cli_error(argv, capsys) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    return err[0]


# -- 1. plan --out / --force ---------------------------------------------------------------------
def test_plan_out_inside_a_store_is_refused_even_with_force(copy, small_capture, capsys):
    meta = (copy / "zarr.json").read_bytes()
    err = _cli_error(["plan", str(copy), "--out", str(copy / "zarr.json"), "--force"], capsys)
    assert "--out" in err and str(copy) in err
    assert (copy / "zarr.json").read_bytes() == meta
    cap_meta = (small_capture / "zarr.json").read_bytes()
    err = _cli_error(["plan", str(copy), "--out", str(small_capture / "zarr.json"), "--force"],
                     capsys)
    assert str(small_capture) in err
    assert (small_capture / "zarr.json").read_bytes() == cap_meta
    open_scan(copy)


def test_plan_force_replaces_only_a_plan(copy, tmp_path, capsys):
    notes = tmp_path / "notes.json"
    notes.write_text('{"my": "notes"}')
    err = _cli_error(["plan", str(copy), "--out", str(notes), "--force"], capsys)
    assert str(notes) in err and "not a plan" in err
    assert notes.read_text() == '{"my": "notes"}'
    plan = tmp_path / "plan.json"
    assert main(["plan", str(copy), "--out", str(plan)]) == 0
    first = plan.read_text()
    assert main(["plan", str(copy), "--out", str(plan), "--rule", "max_cost", "--budget", "0.75",
                 "--force"]) == 0
    assert plan.read_text() != first and "workbench_plan" in json.loads(plan.read_text())
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


# -- 2. scan --overwrite -------------------------------------------------------------------------
def test_overwrite_refuses_foreign_files_symlinks_and_nested_stores(copy, tmp_path, capsys):
    (copy / "notes.md").write_text("mine")
    (copy / "figs").mkdir()
    err = _cli_error(["scan", str(STORE), *CLI_SMALL, "--out", str(copy), "--overwrite"], capsys)
    assert str(copy) in err and "notes.md" in err and "figs/" in err
    assert (copy / "notes.md").read_text() == "mine"
    (copy / "notes.md").unlink()
    (copy / "figs").rmdir()
    link = tmp_path / "link.scan.zarr"
    link.symlink_to(copy)
    err = _cli_error(["scan", str(STORE), *CLI_SMALL, "--out", str(link), "--overwrite"], capsys)
    assert str(link) in err and "symbolic link" in err
    inner = copy / "inner.scan.zarr"
    err = _cli_error(["scan", str(STORE), *CLI_SMALL, "--out", str(inner)], capsys)
    assert str(inner) in err and "inside the zarr store" in err
    assert not inner.exists()
    open_scan(copy)


def test_overwrite_builds_beside_and_swaps(copy, tmp_path):
    ds, run = run_scan(STORE, RECIPES, out=copy, overwrite=True, **SMALL)
    assert run.tasks_run == ds.done.size and len(ds.attrs["runs"]) == 1
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []


def test_a_damaged_root_is_replaced_only_with_overwrite(scan, copy, tmp_path, capsys):
    (copy / "zarr.json").write_text((copy / "zarr.json").read_text()[:40])  # truncated
    err = _cli_error(["scan", str(STORE), *CLI_SMALL, "--out", str(copy)], capsys)
    assert str(copy) in err and "zarr.json is damaged: pass --overwrite" in err
    ds, _ = run_scan(STORE, RECIPES, out=copy, overwrite=True, **SMALL)
    _assert_same(ds, open_scan(scan))


def test_a_swap_interrupted_between_its_renames_is_named(scan, copy, tmp_path, capsys):
    """Killed between moving the old scan aside and moving the new one in: nothing at --out, a
    scan in each sibling; the next scan there names both instead of starting over."""
    (tmp_path / f".{copy.name}.replaced-1-2").mkdir()
    for p in (copy.iterdir()):
        p.rename(tmp_path / f".{copy.name}.replaced-1-2" / p.name)
    copy.rmdir()
    shutil.copytree(scan, tmp_path / f".{copy.name}.overwrite")
    err = _cli_error(["scan", str(STORE), *CLI_SMALL, "--out", str(copy)], capsys)
    assert "interrupted --overwrite" in err and f".{copy.name}.overwrite" in err
    assert f".{copy.name}.replaced-1-2" in err and not copy.exists()


_OVERWRITE = [sys.executable, "-m", "workbench", "scan", str(STORE), "--recipes",
              "fp8_dense,fp8_dense_k,fp8_dense_kv_corrected", "--queries", "64",
              "--scheduler", "synchronous", "--device", "cpu", "--quiet", "--overwrite"]


def test_interrupted_overwrite_keeps_the_old_scan(copy, tmp_path):
    before = open_scan(copy)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    proc = subprocess.Popen([*_OVERWRITE, "--out", str(copy)], cwd=tmp_path, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    deadline, n_done = time.time() + 120, 0
    while time.time() < deadline and proc.poll() is None and n_done < 4:
        n_done = sum(p.is_file() for d in tmp_path.glob(f".{copy.name}.overwrite/done/c")
                     for p in d.rglob("*"))
        time.sleep(0.01)
    assert proc.poll() is None, f"the scan ended before the interrupt: {proc.stderr.read()[-500:]}"
    proc.send_signal(signal.SIGINT)
    proc.wait(60)
    assert proc.returncode != 0
    _assert_same(open_scan(copy), before)
    # the new scan's finished tasks are kept beside it, and the same command continues them
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == \
        [f".{copy.name}.overwrite"]
    assert "run the same command again to continue it" in proc.stderr.read().decode()
    done = subprocess.run([*_OVERWRITE, "--out", str(copy)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-500:]
    assert "continuing an unfinished --overwrite" in done.stderr
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []
    assert open_scan(copy).done.values.all()


# -- 3. damaged values ---------------------------------------------------------------------------
def _chunk(store: Path, array: str, si: int, li: int, ri: int) -> Path:
    dims = json.loads((store / array / "zarr.json").read_text())["dimension_names"]
    idx = {"step": si, "layer": li, "recipe": ri}
    return store.joinpath(array, "c", *(str(idx.get(d, 0)) for d in dims))


@pytest.mark.parametrize("array", ["entry_metrics", "row_sq_err", "head_metrics"])
def test_lost_values_are_refused_and_rerun(array, scan, copy, capsys):
    chunk = _chunk(copy, array, 1, 0, 1)
    chunk.unlink()
    with pytest.raises(ScanError, match=rf"{array} at step 8, layer 1, recipe 'fp8_dense_k'"):
        open_scan(copy)
    err = _cli_error(["plan", str(copy), "--out", str(copy.parent / "p.json")], capsys)
    assert str(copy) in err and array in err
    assert not (copy.parent / "p.json").exists()
    err = _cli_error(["scan-report", str(copy), "--out", str(copy.parent / "rep"),
                      "--formats", "html"], capsys)
    assert array in err
    logged = []
    ds, run = run_scan(STORE, RECIPES, out=copy, log=logged.append, **SMALL)
    assert run.tasks_run == 1 and chunk.is_file()
    assert "running those tasks again" in logged[0] and array in logged[0]
    _assert_same(ds, open_scan(scan))


@pytest.mark.parametrize("array", ["row_sq_err", "head_metrics", "done"])
def test_corrupt_chunk_is_named_and_repaired_by_deleting_it(array, scan, copy, capsys):
    """A chunk file that no longer decodes (not missing: garbage) is refused by every reader
    and by a resumed scan with one line naming the array, the task and the chunk file (before:
    a resumed scan died in a traceback, readers named only the store); deleting the file named
    and running the same scan again repairs the store."""
    chunk = _chunk(copy, array, 1, 0, 1)
    chunk.write_bytes(b"not a zstd frame" * 4)
    where = "" if array == "done" else " at step 8, layer 1, recipe 'fp8_dense_k'"
    with pytest.raises(ScanError, match=rf"{array}{where} cannot be read .*: chunk file"):
        open_scan(copy)
    for argv in (["plan", str(copy), "--out", str(copy.parent / "p.json")],
                 ["scan", str(STORE), "--out", str(copy), *CLI_SMALL]):
        err = _cli_error(argv, capsys)
        assert f"{array}{where} cannot be read" in err and str(chunk) in err, err
        assert "Traceback" not in err and err.count("\n") <= 1, err
    assert not (copy.parent / "p.json").exists()
    chunk.unlink()
    ds, run = run_scan(STORE, RECIPES, out=copy, **SMALL)
    assert run.tasks_run == 1 and chunk.is_file()
    _assert_same(ds, open_scan(scan))


def test_corrupt_capture_chunk_is_named_by_the_scan(small_capture, capsys):
    """A capture chunk whose checksum fails stops the scan with one line naming the capture,
    the entry (step, layer) and the array, and how to list every damaged chunk (dask's read
    error named none of them: the synchronous scan died in a traceback, the cluster's named
    only the task)."""
    chunks = sorted((small_capture / "entries").glob("*/layer1/k/c/**/*"))
    chunk = next(c for c in chunks if c.is_file())
    chunk.write_bytes(b"garbage!" + chunk.read_bytes()[8:])
    argv = ["scan", str(small_capture), "--recipes", RECIPES, "--queries", "16",
            "--scheduler", "synchronous", "--device", "cpu", "--quiet"]
    err = _cli_error(argv, capsys)
    assert "checksum mismatch in entry" in err and "layer=1" in err and "array 'k'" in err, err
    assert f"workbench inspect {small_capture} --verify" in err, err


def test_damaged_capture_entry_metadata_is_named_by_the_scan(tmp_path, capsys):
    """An entry whose zarr.json is truncated: the scan names the entry and the file (before:
    "entries [(7, 1)] are not in the capture (or differ in shape)")."""
    store = tmp_path / "cap.zarr"
    shutil.copytree(STORE, store)
    meta = store / "entries" / "s00007" / "transformer_blocks.1" / "zarr.json"
    meta.write_text(meta.read_text()[:40])
    err = _cli_error(["scan", str(store), "--out", str(tmp_path / "s.scan.zarr"), *CLI_SMALL],
                     capsys)
    assert "(7, 1): " in err and f"{meta}: not valid JSON" in err, err


def test_lost_benefit_chunk_is_refused(scan, copy):
    (_chunk(copy, "benefit", 1, 0, 0)).unlink()
    with pytest.raises(ScanError, match="benefit has no interval at step 8"):
        open_scan(copy)
    ds, run = run_scan(STORE, RECIPES, out=copy, **SMALL)
    assert run.tasks_run == 0
    _assert_same(ds, open_scan(scan))


# -- 4. missing attributes and arrays ------------------------------------------------------------
def test_missing_params_or_array_names_the_store(copy, capsys):
    meta = json.loads((copy / "zarr.json").read_text())
    del meta["attributes"]["params"]
    (copy / "zarr.json").write_text(json.dumps(meta))
    for argv in (["plan", str(copy), "--out", str(copy.parent / "p.json")],
                 ["scan", str(STORE), *CLI_SMALL, "--out", str(copy)]):
        err = _cli_error(argv, capsys)
        assert str(copy) in err and "'params' is missing" in err


def test_missing_done_array_names_the_store(copy, capsys):
    (copy / "done" / "zarr.json").unlink()
    with pytest.raises(ScanError, match=r"the array 'done' is missing"):
        open_scan(copy)
    err = _cli_error(["scan", str(STORE), *CLI_SMALL, "--out", str(copy)], capsys)
    assert str(copy) in err and "'done'" in err


@pytest.mark.parametrize("version", [2, "1", True, None])
def test_unknown_scan_version_is_refused_naming_the_field(copy, capsys, version):
    """A scan written in another layout (or a hand-edited marker) is not read by this one's rules:
    plan, open_scan and a resume refuse it, naming the store's zarr.json and the field."""
    meta = json.loads((copy / "zarr.json").read_text())
    meta["attributes"]["workbench_scan"] = version
    (copy / "zarr.json").write_text(json.dumps(meta))
    with pytest.raises(ScanError, match=r"workbench_scan is .*version 1 only"):
        open_scan(copy)
    before = sorted(p.name for p in copy.iterdir())
    for argv in (["plan", str(copy), "--out", str(copy.parent / "p.json")],
                 ["scan", str(STORE), *CLI_SMALL, "--out", str(copy)]):
        err = _cli_error(argv, capsys)
        assert f"{copy}/zarr.json" in err and "workbench_scan" in err
    assert sorted(p.name for p in copy.iterdir()) == before
    assert not (copy.parent / "p.json").exists()


# -- 5. scan . -----------------------------------------------------------------------------------
def test_scan_and_plan_of_dot(small_capture, monkeypatch, capsys):
    monkeypatch.chdir(small_capture)
    assert main(["scan", ".", "--recipes", RECIPES, "--queries", "8", "--scheduler",
                 "synchronous", "--device", "cpu", "--quiet"]) == 0
    out = small_capture.parent / "cap.scan.zarr"
    assert open_scan(out).done.all()
    monkeypatch.chdir(out)
    assert main(["plan", "."]) == 0
    assert (small_capture.parent / "cap.scan.plan.json").is_file()


def test_another_tools_zarr_group_is_never_replaced(tmp_path, capsys):
    """A readable zarr group without the scan marker (another tool's) is refused as --out even
    with --overwrite, naming its zarr.json; nothing in it changes (before: called damaged and
    deleted by --overwrite)."""
    import zarr

    other = tmp_path / "other.zarr"
    zarr.open_group(str(other), mode="w", attributes={"owner": "x"})
    before = (other / "zarr.json").read_bytes()
    for extra in ([], ["--overwrite"]):
        err = _cli_error(["scan", str(STORE), *CLI_SMALL, "--out", str(other), *extra], capsys)
        assert str(other) in err and "a zarr group of another kind" in err, err
        assert "damaged" not in err
    assert (other / "zarr.json").read_bytes() == before

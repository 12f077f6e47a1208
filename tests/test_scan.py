"""Sensitivity scan: equal to the one-entry table, resumable after a kill, the same on 1 and 2
dask workers, and refusing bad input with one line."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from workbench.capture import open_capture
from workbench.evaluate.scan import bootstrap_many, run_scan, start_cluster
from workbench.recipes import split_recipe_list
from workbench.evaluate.scan_store import METRIC_NAMES, open_scan
from workbench.evaluate.source import default_device
from workbench.metrics import bootstrap_benefit
from workbench.report.accuracy_table import accuracy_table

ROOT = Path(__file__).resolve().parents[1]
STORE = ROOT / "captures" / "demo_h3_nano.zarr"
RECIPES = "fp8_sol_unsmoothed,fp8_sol_kv_corrected,fp8_dense_k"
SMALL = dict(steps=[7, 8], layers=[1, 2], n_queries=32)


@pytest.fixture(scope="module")
def cluster():
    """One LocalCluster of 2 single-threaded worker processes for the module (starts in s)."""
    cl, client = start_cluster(2)
    yield cl, client
    client.close()
    cl.close()


@pytest.fixture(scope="module")
def sync_scan(tmp_path_factory):
    out = tmp_path_factory.mktemp("scan") / "sync.scan.zarr"
    ds, _ = run_scan(STORE, RECIPES, out=out, scheduler="synchronous", progress=False, **SMALL)
    return ds


def _numbers(ds):
    """Everything a scan computed, without the timing column."""
    keep = [m for m in METRIC_NAMES if m != "seconds"]
    return {v: ds[v].sel(metric=keep).values if "metric" in ds[v].dims else ds[v].values
            for v in ("entry_metrics", "head_metrics", "row_sq_err", "row_sq_err_head",
                      "benefit", "head_benefit", "done")}


def _assert_same(a, b):
    na, nb = _numbers(a), _numbers(b)
    for v in na:
        np.testing.assert_array_equal(na[v], nb[v], err_msg=v)


def test_scan_equals_one_entry_table(sync_scan):
    ds = sync_scan
    cap = open_capture(STORE)
    # on the device the scan's tasks use (CUDA when present): the same ops give the same bits
    # there, while CPU and CUDA reductions round differently
    q, k, v = (t.float().to(default_device()) for t in cap.qkv(8, 2))
    t = accuracy_table(q, k, v, "fp8_sol_unsmoothed",
                       "fp8_sol_kv_corrected", layout=cap.layout, n_queries=32,
                       rotated=int(cap.rotated_channels))
    e = ds.entry_metrics.sel(step=8, layer=2)
    for row in t.rows:
        bd = row["boundary"]
        assert e.sel(recipe="fp8_sol_unsmoothed", metric=f"{bd}_mse") == row["mse_a"]
        assert e.sel(recipe="fp8_sol_kv_corrected", metric=f"{bd}_mse") == row["mse_b"]
    for m in ("cosine", "rel_l2", "sqnr_db", "max_abs"):
        assert e.sel(recipe="fp8_sol_kv_corrected", metric=f"attention_output_{m}") == \
            t.output[m]["b"]
    assert e.sel(recipe="fp8_sol_unsmoothed", metric="exact_fraction") == t.exact_fraction["a"]
    assert e.sel(recipe="fp8_sol_kv_corrected", metric="drift_v_rot") == t.drift["v_rot"]["b"]
    b = ds.benefit.sel(step=8, layer=2, recipe="fp8_sol_kv_corrected")
    assert float(b.sel(stat="benefit_pct")) == pytest.approx(
        t.row("attention_output")["benefit_pct"], rel=1e-12)
    assert (float(b.sel(stat="ci_lo")), float(b.sel(stat="ci_hi"))) == pytest.approx(
        t.output_benefit_ci, rel=1e-12)
    ph = ds.head_metrics.sel(step=8, layer=2, recipe="fp8_sol_kv_corrected",
                             metric="attention_output_mse").values
    assert ph.tolist() == t.per_head["b"]["attention_output"]["mse"]
    assert ds.done.all()
    assert list(ds.row.values) == t.query_rows


def test_bootstrap_many_matches_bootstrap_benefit():
    import torch

    g = torch.Generator().manual_seed(3)
    a, b = torch.rand(5, 40, generator=g, dtype=torch.float64), torch.rand(5, 40, generator=g,
                                                                          dtype=torch.float64)
    many = bootstrap_many(a.numpy(), b.numpy())
    for i in range(5):
        assert tuple(many[i, 1:]) == pytest.approx(bootstrap_benefit(a[i], b[i]), rel=1e-12)
    a[2, 0] = float("nan")
    assert np.isnan(bootstrap_many(a.numpy(), b.numpy())[2]).all()


def test_two_workers_equal_one_worker_and_synchronous(cluster, sync_scan, tmp_path):
    cl, client = cluster
    ds2, run2 = run_scan(STORE, RECIPES, out=tmp_path / "two.zarr", client=client,
                         progress=False, **SMALL)
    assert run2.workers == 2 and run2.tasks_run == 12
    cl.scale(1)  # the same LocalCluster with one worker process (starting another costs ~10 s)
    deadline = time.time() + 60
    while len(client.scheduler_info()["workers"]) != 1 and time.time() < deadline:
        time.sleep(0.1)
    ds1, run1 = run_scan(STORE, RECIPES, out=tmp_path / "one.zarr", client=client,
                         progress=False, **SMALL)
    assert run1.workers == 1
    _assert_same(ds1, ds2)
    _assert_same(ds1, sync_scan)
    # An existing cluster by address (what `--scheduler ADDRESS` does).
    ds3, run3 = run_scan(STORE, RECIPES, out=tmp_path / "addr.zarr",
                         scheduler=cl.scheduler_address, progress=False, **SMALL)
    assert run3.scheduler == cl.scheduler_address
    _assert_same(ds1, ds3)


_KILL_SCRIPT = """
import sys
from workbench.evaluate.scan import run_scan
run_scan(sys.argv[1], sys.argv[2], out=sys.argv[3], scheduler="synchronous", progress=False,
         n_queries=16, steps=[7, 8])
"""


def test_resume_after_sigkill_gives_the_same_dataset(tmp_path):
    out = tmp_path / "killed.scan.zarr"
    recipes = "fp8_dense,fp8_dense_k,fp8_dense_kv_corrected"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        p for p in (str(ROOT), os.environ.get("PYTHONPATH")) if p)}
    proc = subprocess.Popen([sys.executable, "-c", _KILL_SCRIPT, str(STORE), recipes, str(out)],
                            env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    done_dir = out / "done" / "c"
    deadline = time.time() + 120
    n_done = 0
    while time.time() < deadline and proc.poll() is None:
        n_done = sum(p.is_file() for p in done_dir.rglob("*")) if done_dir.exists() else 0
        if n_done >= 4:
            break
        time.sleep(0.01)
    assert proc.poll() is None, f"the scan ended before the kill: {proc.stderr.read()[-500:]}"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    part = open_scan(out)
    n = int(part.done.sum())
    assert 4 <= n < part.done.size, "killed mid-scan"
    # Every task marked done has its numbers. A task killed between its numbers and its done
    # marker may have numbers without the marker (it is recomputed): at most one entry's worth.
    filled = np.isfinite(part.entry_metrics.sel(metric="attention_output_mse")).values
    assert filled[part.done.values].all()
    assert (filled & ~part.done.values).sum() <= part.sizes["recipe"]
    resumed, run = run_scan(STORE, recipes, out=out, scheduler="synchronous", progress=False,
                            n_queries=16, steps=[7, 8])
    assert run.tasks_skipped == n and run.tasks_run == part.done.size - n
    fresh, _ = run_scan(STORE, recipes, out=tmp_path / "fresh.zarr", scheduler="synchronous",
                        progress=False, n_queries=16, steps=[7, 8])
    _assert_same(resumed, fresh)
    assert [r["tasks_skipped"] for r in resumed.attrs["runs"]] == [n]  # the killed run: none


def test_rerun_skips_done_and_refuses_other_parameters(sync_scan, tmp_path):
    from workbench.evaluate.scan_store import ScanError

    out = Path(sync_scan.attrs["path"])
    ds, run = run_scan(STORE, RECIPES, out=out, scheduler="synchronous", progress=False, **SMALL)
    assert run.tasks_run == 0 and run.tasks_skipped == 12
    with pytest.raises(ScanError, match="recipes"):
        run_scan(STORE, "fp8_dense,fp8_dense_k", out=out, scheduler="synchronous",
                 progress=False, **SMALL)
    with pytest.raises(ScanError, match="n_queries"):
        run_scan(STORE, RECIPES, out=out, scheduler="synchronous", progress=False,
                 steps=[7, 8], layers=[1, 2], n_queries=16)
    with pytest.raises(ScanError, match="inside the capture store"):
        run_scan(STORE, RECIPES, out=STORE / "scan.zarr", scheduler="synchronous",
                 progress=False, **SMALL)
    assert not (STORE / "scan.zarr").exists()


def test_device_is_a_scan_parameter(tmp_path):
    """The device the tasks ran on is stored; a scan is not resumed on another device (CPU and
    CUDA round differently); stores from before the field read as CPU scans; a CUDA scan on a
    machine without CUDA is refused before anything is written."""
    import dataclasses

    import torch

    from workbench.evaluate.scan_store import ScanError, ScanParams, ScanStore

    out = tmp_path / "cpu.scan.zarr"
    ds, _ = run_scan(STORE, "fp8_dense,fp8_dense_k", out=out, scheduler="synchronous",
                     progress=False, steps=[8], layers=[2], n_queries=16, device="cpu")
    params = ScanParams.from_dict(ds.attrs["params"])
    assert params.device == "cpu"
    with pytest.raises(ScanError, match="device: the scan has 'cpu', asked 'cuda'"):
        ScanStore(out, dataclasses.replace(params, device="cuda"))
    # a store from before the field does not say where it ran: not resumed on either device
    old = ScanParams.from_dict({k: v for k, v in params.to_dict().items() if k != "device"})
    assert old.mismatch(params) == "device: the scan has 'unknown', asked 'cpu'"
    with pytest.raises(ScanError, match="--device: 'tpu'"):
        run_scan(STORE, "fp8_dense", out=tmp_path / "x.zarr", scheduler="synchronous",
                 progress=False, device="tpu")
    if not torch.cuda.is_available():
        with pytest.raises(ScanError, match="--device cuda: torch sees no CUDA"):
            run_scan(STORE, "fp8_dense", out=tmp_path / "y.zarr", scheduler="synchronous",
                     progress=False, device="cuda")
        assert not (tmp_path / "y.zarr").exists()


def test_running_scheduler_is_checked_before_the_store_is_written(cluster, tmp_path):
    """--scheduler ADDRESS: a CUDA scan on workers without CUDA, or an address nobody listens
    on, is refused naming the workers / the address, and no scan store is left behind."""
    import dask
    import torch

    from workbench.evaluate.scan_store import ScanError

    cl, _ = cluster
    if not torch.cuda.is_available():
        with pytest.raises(ScanError, match=r"--device cuda: workers \['tcp://"):
            run_scan(STORE, "fp8_dense", out=tmp_path / "a.zarr", device="cuda",
                     scheduler=cl.scheduler_address, progress=False, **SMALL)
        assert not (tmp_path / "a.zarr").exists()
    with dask.config.set({"distributed.comm.timeouts.connect": "1s"}):
        with pytest.raises(ScanError, match="--scheduler tcp://127.0.0.1:9: cannot connect"):
            run_scan(STORE, "fp8_dense", out=tmp_path / "b.zarr", scheduler="tcp://127.0.0.1:9",
                     progress=False, **SMALL)
    assert not (tmp_path / "b.zarr").exists()


def test_scan_noise_separates_rounding_noise_from_robust_numbers():
    """``scripts/scan_noise.py`` (one-ulp nudges of K / V): the V-mean drift of a
    V-bias-corrected recipe is rounding noise (moves by > 1%), its output error and rows are
    robust (< 1e-4 / 1e-2); Sol without smoothing has rows that flip (> 1%) on each entry."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("scan_noise", ROOT / "scripts/scan_noise.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    entries = [(8, 2), (7, 1), (3, 0)]
    rows, worst = mod.noise(STORE, entries, ["fp8_sol_kv_corrected", "fp8_sol_unsmoothed"])
    by = {(st, la, r): rel for st, la, r, rel, _, _ in rows}
    assert worst[("fp8_sol_kv_corrected", "drift_v_pass")][0] > 1e-2
    assert worst[("fp8_sol_kv_corrected", "attention_output_rel_l2")][0] < 1e-4
    assert all(0 <= by[(st, la, "fp8_sol_kv_corrected")] < 1e-2 for st, la in entries)
    assert all(by[(st, la, "fp8_sol_unsmoothed")] > 1e-2 for st, la in entries)


def test_split_recipe_list():
    assert split_recipe_list("bf16,fp8_sol_k:sol_tau=0.5,sol_band=2,fp8_dense") == [
        "bf16", "fp8_sol_k:sol_tau=0.5,sol_band=2", "fp8_dense"]
    assert split_recipe_list('{"name": "a", "smoothing": "k"},plan.json') == [
        '{"name": "a", "smoothing": "k"}', "plan.json"]


@pytest.mark.parametrize("argv, needle", [
    (["scan", str(STORE), "--recipes", "fp8_dense,nope"], "'nope'"),
    (["scan", str(STORE), "--recipes", "fp8_dense", "--steps", "99"], "--steps: [99]"),
    (["scan", str(STORE), "--recipes", "fp8_dense", "--heads", "7"], "--heads: [7]"),
    (["scan", str(STORE), "--recipes", "fp8_dense,fp8_dense"], "same recipe"),
    (["scan", str(STORE), "--recipes", "fp8_dense", "--out", str(STORE)], "inside the capture"),
    (["scan", str(STORE / "missing.zarr"), "--recipes", "fp8_dense"], "no capture store"),
    (["plan", str(STORE), "--budget", "30"], "not a scan store"),
])
def test_cli_errors_are_one_line(argv, needle, capsys):
    from workbench.cli import main

    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"workbench {argv[0]}: error:")
    assert needle in err[0]


def test_cli_scan_plan_report(sync_scan, tmp_path, capsys):
    from workbench.cli import main

    scan = sync_scan.attrs["path"]
    plan = tmp_path / "plan.json"
    assert main(["plan", scan, "--rule", "max_cost", "--budget", "0.75", "--out",
                 str(plan)]) == 0
    out = capsys.readouterr().out
    assert "expected attention cost" in out and plan.exists()
    assert main(["plan", scan, "--out", str(plan)]) == 2
    assert "exists" in capsys.readouterr().err
    assert main(["plan", scan, "--rule", "cheapest", "--out", str(tmp_path / "x.json")]) == 2
    assert "--rule" in capsys.readouterr().err
    assert main(["scan-report", scan, "--plan", str(plan), "--out", str(tmp_path / "rep"),
                 "--formats", "html"]) == 0
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "plan_grid.html" in md and "smoothing_effect.html" in md
    assert main(["scan-report", scan, "--recipe", "nope", "--out", str(tmp_path / "r2"),
                 "--formats", "html"]) == 2
    assert "--recipe: 'nope'" in capsys.readouterr().err


def test_scan_of_a_causal_store_replays_with_the_mask(tmp_path):
    """A store that records a causal model (``workbench import --causal``, its softmax scale)
    is scanned with the mask and the scale, as ``evaluate_entry`` on its ReplaySource does:
    the same numbers; without them the error would differ (the mask changes every row but the
    last); a scan store made under other replay settings is not resumed."""
    import torch

    from workbench.capture.importer import import_tensors
    from workbench.evaluate import ReplaySource, evaluate_entry
    from workbench.evaluate.scan_store import ScanError

    g = torch.Generator().manual_seed(0)
    data = {f"layer{i}.{r}": torch.randn(96, 2, 32, generator=g) + (1.5 if r == "k" else 0)
            for i in (0, 1) for r in "qkv"}
    torch.save(data, tmp_path / "d.pt")
    store = tmp_path / "c.zarr"
    import_tensors([tmp_path / "d.pt"], store, rotated=0, scale=0.2, causal=True)
    ds, _ = run_scan(store, "fp8_dense,fp8_dense_k", out=tmp_path / "c.scan.zarr",
                     scheduler="synchronous", progress=False, n_queries=16)
    from workbench.evaluate.scan_store import ScanParams

    params = ScanParams.from_dict(ds.attrs["params"])
    assert params.causal and params.softmax_scale == 0.2
    src = ReplaySource(store)
    for lay in (0, 1):
        c = evaluate_entry(src, 0, lay, {"r": "fp8_dense_k"}, n_queries=16)
        e = ds.entry_metrics.sel(step=0, layer=lay, recipe="fp8_dense_k")
        assert float(e.sel(metric="attention_output_mse").squeeze()) == \
            c.evals["r"].overall["attention_output"]["mse"]
        wrong = evaluate_entry(ReplaySource(store, causal=False, scale=None), 0, lay,
                               {"r": "fp8_dense_k"}, n_queries=16)
        assert wrong.evals["r"].overall["attention_output"]["mse"] != \
            c.evals["r"].overall["attention_output"]["mse"]
    # a scan with other replay settings is refused, naming the field
    from dataclasses import replace

    from workbench.evaluate.scan_store import ScanStore

    with pytest.raises(ScanError, match="causal"):
        ScanStore(tmp_path / "c.scan.zarr", replace(params, causal=False))


def test_scan_report_states_the_rows_the_scan_sampled(tmp_path):
    """--queries beyond the sequence samples every row; the report says how many it used (before:
    "500 evenly spaced query rows of 164")."""
    from workbench.report.scan_report import write_scan_report

    ds, _ = run_scan(STORE, "fp8_dense,fp8_dense_k", out=tmp_path / "q.scan.zarr", steps=[7],
                     layers=[1], n_queries=500, scheduler="synchronous", progress=False,
                     device="cpu")
    n = len(ds.attrs["params"]["query_rows"])
    assert n < 500
    md = write_scan_report(tmp_path / "q.scan.zarr", tmp_path / "rep", formats=("html",))
    text = Path(md).read_text()
    assert f"{n} evenly spaced query rows of" in text and "500 evenly" not in text

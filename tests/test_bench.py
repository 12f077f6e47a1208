"""CPU tests of the benchmark library and the GPU scripts' argument parsing, tables and imports.

The timed paths need a GPU (tests/test_kernels_gpu.py and scripts/gpu_bench.py run them); here:
the markdown of a report dict shaped like ``workbench bench --json`` output, the time estimate,
the sweep's config parsing, the scripts' argument errors (real subprocesses), and that the GPU
scripts import nothing the GPU machine lacks (zarr, plotly, xarray, Jupyter).
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from workbench.bench import tables
from workbench.bench.sweep import parse_points
from workbench.kernels.config import DEFAULT, KernelConfig

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHAPE = "(1, 32626, 56, 128)"


def row(variant, mode, ms, rel, precision, **kw):
    return dict(shape=SHAPE, S=32626, variant=variant, mode=mode, precision=precision, ms=ms,
                tflops=30.5e12 / (ms * 1e-3) / 1e12, peak_gib=0.5, rel_l2=rel, cosine=1.0, **kw)


REPORT = {
    "env": {"device": "NVIDIA H200", "torch": "2.11.0", "triton": "3.6.0", "date": "2026-12-01",
            "commit": "abc1234"},
    "ceilings": {"copy_tbs": 4.25},
    "skipped": {"sage2_sm90": "sageattention (SM90 build) does not import"},
    "rows": [
        row("sdpa_cudnn", "full", 53.4, 1.7e-3, "bf16"),
        row("fa3_bf16", "full", 45.1, 1.7e-3, "bf16"),
        row("fa3_fp8", "full", 39.2, 0.34, "fp8", note="per-(batch, head) scales"),
        row("fa3_fp8", "kernel", 32.3, 0.34, "fp8", note="per-(batch, head) scales"),
        row("fp8_dense_kv_corrected", "full", 38.4, 1.7e-3, "fp8", emu_rel_l2=1.7e-3),
        row("fp8_dense_kv_corrected", "stats", 0.263, float("nan"), "fp8", read_tbs=3.56),
    ],
}


def test_markdown_ratio_is_against_the_fastest_bf16_peer_and_explains_accuracy():
    md = tables.markdown(REPORT)
    assert "| x fa3_bf16 |" in md and "fa3_bf16 (45.10 ms, the fastest BF16 peer" in md
    ours = next(ln for ln in md.splitlines() if ln.startswith("| fp8_dense_kv_corrected | full"))
    assert "| 1.17 |" in ours and "| 1.700e-03 | 1.700e-03 |" in ours  # 45.1 / 38.4
    assert "| 0.84 |" in next(ln for ln in md.splitlines() if ln.startswith("| sdpa_cudnn"))
    # every table row has an accuracy; the passes without an output are listed under the table
    table = [ln for ln in md.splitlines() if ln.startswith("| ") and "---" not in ln][1:]
    assert len(table) == 5 and all("e-0" in ln for ln in table)
    assert "stats 0.263 ms (3.56 TB/s read)" in md
    assert "two-level accumulation" in md and "Skipped sage2_sm90: sageattention" in md
    assert "commit abc1234" in md


def test_markdown_shows_clock_and_power_samples_when_the_rows_have_them():
    rows = [dict(r) for r in REPORT["rows"]]
    rows[1].update(sm_mhz=1755.0, power_w=688.4)  # fa3_bf16 full
    md = tables.markdown({**REPORT, "rows": rows})
    assert "| SM MHz / board W |" in md and "700 W on an H200" in md
    fa3 = next(ln for ln in md.splitlines() if ln.startswith("| fa3_bf16 | full"))
    assert "| 1755 / 688 |" in fa3
    # a row without samples keeps an empty cell, so the columns still line up
    cudnn = next(ln for ln in md.splitlines() if ln.startswith("| sdpa_cudnn"))
    assert cudnn.count("|") == fa3.count("|") and "|  /  |" in cudnn
    assert "SM MHz" not in tables.markdown(REPORT)  # reports without samples: no column


def test_board_sampler_reads_nothing_without_the_tool_and_parses_samples():
    from workbench.bench.harness import BoardSampler

    b = BoardSampler()
    b.text = "345, 81.76\n1980, 120.0\n1800, 690.5\n1795, 689.0\n1805, 691.0\n[N/A], [N/A]\n18"
    assert b.result() == {"sm_mhz": 1800.0, "power_w": 690.5}  # first two dropped, bad lines too
    b.text = ""
    assert b.result() == {}
    # the board of torch's device by its PCI address (nvidia-smi's --id), "0" without one
    from types import SimpleNamespace

    from workbench.bench.harness import _smi_id

    props = SimpleNamespace(pci_domain_id=0, pci_bus_id=0x1B, pci_device_id=0)
    assert _smi_id(props) == "00000000:1B:00.0"
    assert _smi_id(SimpleNamespace()) == "0"
    assert BoardSampler(gpu="3").gpu == "3"


def test_markdown_without_bf16_peer_and_older_reports():
    old = {"env": {}, "rows": [dict(r) for r in REPORT["rows"] if r["variant"] != "fa3_bf16"]}
    for r in old["rows"]:
        r.pop("precision")  # reports written before the peers had a precision field
    md = tables.markdown(old)
    assert "| x sdpa_cudnn |" in md
    only_ours = {"env": {}, "rows": [r for r in REPORT["rows"] if r["precision"] == "fp8"]}
    assert "No BF16 peer ran" in tables.markdown(only_ours)


def test_summary_lists_each_timed_row_with_its_ratio():
    text = tables.summary(REPORT)
    assert text.splitlines()[0] == f"{SHAPE}  (x = vs fa3_bf16)"
    assert "x1.174" in text and "stats" not in text and "MHz" not in text
    rows = [dict(r) for r in REPORT["rows"]]
    rows[4].update(sm_mhz=1808.0, power_w=690.4)  # ours, full
    ours = [ln for ln in tables.summary({**REPORT, "rows": rows}).splitlines() if "full" in ln
            and "fp8_dense_kv_corrected" in ln]
    assert ours and ours[0].endswith("relL2 1.700e-03  1808 MHz 690 W"), ours


def test_sweep_points_parse_and_refuse_bad_entries():
    pts = parse_points('[["128 rows", {"attention": {"block_m": 128, "num_warps": 8}}]]')
    assert pts[0].config == DEFAULT and pts[1].config.attention.block_m == 128
    assert pts[1].config.quant == DEFAULT.quant
    with pytest.raises(ValueError, match="entry 0"):
        parse_points('[["no overrides"]]')
    with pytest.raises(ValueError, match="unknown section 'attn'"):
        parse_points('[["x", {"attn": {}}]]')
    with pytest.raises(ValueError, match="lazy_tau"):
        KernelConfig.from_overrides({"attention": {"lazy_tau": 8.0}})
    with pytest.raises(ValueError, match="block_n"):
        KernelConfig.from_overrides({"attention": {"block_n": 256}})


def script(*args, timeout=120):
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["PYTHONPATH"] = ROOT
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=timeout)


def test_gpu_bench_plan_fits_six_minutes_and_refuses_bad_options(tmp_path):
    p = script("scripts/gpu_bench.py", "--dry-run", "--out", str(tmp_path))
    assert p.returncode == 0, p.stderr
    assert "fp8_dense_kv_corrected:p_scaling=exp2_offset8" in p.stdout
    assert (tmp_path / "gpu_bench.log").read_text().strip() in p.stdout
    sys.path.insert(0, os.path.join(ROOT, "scripts"))
    try:
        import gpu_bench
    finally:
        sys.path.pop(0)
    est = gpu_bench.estimate_seconds(gpu_bench.SHAPES, gpu_bench.RECIPES,
                                     ["sdpa_cudnn", "fa3_bf16", "fa3_fp8", "cudnn_fp8",
                                      "sage2_sm90"], 200, 200)
    assert est["total_max_s"] <= 380, est
    assert gpu_bench.estimate_seconds(gpu_bench.SHAPES[:1], gpu_bench.RECIPES, [], 200,
                                      None)["bench_s"] < est["bench_s"]
    # clock / power sampling: board_s more per timed row (4 shapes x 27 rows here)
    with_board = gpu_bench.estimate_seconds(gpu_bench.SHAPES, gpu_bench.RECIPES,
                                            ["sdpa_cudnn", "fa3_bf16", "fa3_fp8", "cudnn_fp8",
                                             "sage2_sm90"], 200, 200, board_s=2.0)
    assert with_board["bench_s"] - est["bench_s"] == 4 * 27 * 2
    assert gpu_bench.gpu_test_files() == ["tests/test_accumulator_gpu.py",
                                          "tests/test_kernels_gpu.py",
                                          "tests/test_kernels_ws_gpu.py"]
    for bad, msg in ((["--shapes", "1,8192,56"], "--shapes"), (["--peers", "fa4"], "--peers"),
                     (["--recipes", "fp8_nope"], "unknown preset"), (["--rep-ms", "0"], "rep-ms"),
                     (["--board-s", "-1"], "--board-s")):
        p = script("scripts/gpu_bench.py", "--dry-run", "--out", str(tmp_path), *bad)
        assert p.returncode == 2 and msg in p.stderr, (bad, p.stderr)


def test_gpu_kernels_script_refuses_bad_configs():
    p = script("scripts/gpu_kernels.py", "--configs", '[["x", {"attention": {"warps": 8}}]]')
    assert p.returncode == 2 and "section 'attention'" in p.stderr and "warps" in p.stderr


def test_gpu_lists_ab_refuses_a_missing_module_and_a_dense_recipe(tmp_path):
    """scripts/gpu_lists_ab.py names its bad input before it touches the GPU (in this process:
    a subprocess per case spent ~6 s importing the kernels)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "gpu_lists_ab", os.path.join(ROOT, "scripts", "gpu_lists_ab.py"))
    ab = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(ab)
    with pytest.raises(SystemExit, match="nope.py is not a file"):
        ab.main(["--other", str(tmp_path / "nope.py")])
    module = os.path.join(ROOT, "workbench", "kernels", "attention_fp8_ws_lists.py")
    with pytest.raises(SystemExit, match="is not a Sol recipe"):
        ab.main(["--other", module, "--recipe", "fp8_dense_kv_corrected"])


def test_gpu_scripts_import_nothing_the_gpu_machine_lacks():
    """Import the bench library, the kernels and both GPU scripts with zarr, plotly, xarray,
    numcodecs, dask and Jupyter made unimportable (as on the GPU machine)."""
    code = """
import importlib.abc, sys
BLOCKED = ("zarr", "plotly", "xarray", "numcodecs", "dask", "jupyter", "ipywidgets",
           "IPython", "kaleido", "pandas", "diffusers")
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError("blocked on the GPU machine: " + name)
sys.meta_path.insert(0, Block())
sys.path.insert(0, "scripts")
import gpu_bench, gpu_kernels
import workbench.bench.attention, workbench.bench.sweep, workbench.bench.cli
import workbench.kernels.dispatch, workbench.attention.runner
print("ok")
"""
    p = script("-c", code)
    assert p.returncode == 0 and p.stdout.strip() == "ok", p.stderr[-2000:]


def test_fp8_peer_emulations_are_recipes_that_lose_what_the_peers_lose():
    """The FP8 peers' numerics as recipes (the bench's 'torch emu' column for them): valid,
    unflushed truncating accumulators, and on a biased 2k-key input far less accurate than the
    project's smoothed, flushed recipe (FA3 FP8 measured 0.12 at 8k keys on the H200)."""
    import torch

    from workbench.attention import dense_attention_f64, evenly_spaced_rows, recipe_attention
    from workbench.bench.inputs import make_inputs
    from workbench.bench.peers import PEER_EMULATIONS
    from workbench.recipes import get_recipe

    (q, k, v), = make_inputs(1, 2048, 2, 128, n_sets=1, device="cpu")
    idx = evenly_spaced_rows(2048, 16)
    ref, _ = dense_attention_f64(q, k, v, query_index=idx)

    def err(recipe):
        out = recipe_attention(q, k, v, recipe, query_index=idx).out.double()
        return float((out - ref).norm() / ref.norm())

    ours = err("fp8_dense_kv_corrected")
    for name, spec in PEER_EMULATIONS.items():
        r = get_recipe(spec)
        assert r.accumulation == "reduced" and r.accum_rounding == "truncate", name
        assert r.accum_flush_keys > 10**8 and r.smoothing == "none", name
        assert err(spec) > 5 * ours, name
    assert torch.isfinite(ref).all()

"""CPU parts of the sparse benchmarks and their GPU script: argument parsing, the tables, the VSA
keep fraction for a target density, and that the modules import where the GPU machine lacks
zarr / plotly / xarray / Jupyter (a real subprocess with those imports made to fail)."""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

if not torch.cuda.is_available():  # the smoke runs route in Triton's interpreter
    os.environ.setdefault("TRITON_INTERPRET", "1")

from workbench.attention.sparsity import vsa_keep_count  # noqa: E402
from workbench.bench import cli as bench_cli  # noqa: E402
from workbench.bench import dit, sparse, tables  # noqa: E402
from workbench.recipes import get_recipe  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


def gpu_script():
    spec = importlib.util.spec_from_file_location("gpu_sparse", ROOT / "scripts" / "gpu_sparse.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.parametrize("n,n_prefix", [(510, 6), (18, 2), (10, 0)])
def test_vsa_keep_fraction_routes_the_target_density(n, n_prefix):
    rec = get_recipe("vsa_bf16")
    for d in (0.1, 0.2, 0.35, 0.5, 0.9):
        keep = sparse.vsa_keep_for_density(d, n, n_prefix)
        count = vsa_keep_count(rec.with_(vsa_keep=keep), n, n_prefix) + n_prefix
        assert count == n_prefix + min(n - n_prefix, max(1, round(d * n) - n_prefix)), (d, keep)
    assert sparse.vsa_keep_for_density(1.0, n, n_prefix) == 1.0
    # with the prefix tiles' query tiles keeping every tile, the whole map hits the target
    for d in (0.1, 0.35, 0.9):
        keep = sparse.vsa_keep_for_density(d, n, n_prefix, dense_rows=n_prefix)
        count = vsa_keep_count(rec.with_(vsa_keep=keep), n, n_prefix) + n_prefix
        density = (n_prefix * n + (n - n_prefix) * count) / n**2
        floor = (n_prefix * n + (n - n_prefix) * (n_prefix + 1)) / n**2  # one routed tile
        assert abs(density - max(d, floor)) <= 0.5 / n + 1e-9, (d, density)


def sparse_report():
    return {
        "env": {"device": "H200", "torch": "2.11", "triton": "3.6", "date": "2026-12-01"},
        "config": {"shape": [1, 32626, 56, 128], "prefix": 370, "threshold": "exact",
                   "rows": 64},
        "rows": [
            dict(variant="sdpa_cudnn_bf16", route="dense", density=1.0, tau=None, ms=50.0,
                 rel_l2=1.7e-3, ns_per_exact_pair=3.4),
            dict(variant="ours fp8_dense_kv_corrected", route="dense", density=1.0, tau=None,
                 ms=40.0, rel_l2=1.7e-3, emu_rel_l2=1.6e-3),
            dict(variant="ours FP8 Sol exact", route="sol", density=0.15, tau=1.0, ms=5.0,
                 rel_l2=6e-3, emu_rel_l2=5.9e-3),
            dict(variant="ours FP8 VSA", route="vsa", density=0.15, tau=None,
                 skipped="ValueError: backend 'kernel': no kernel supports recipe", note="k"),
            dict(variant="NVIDIA sol_attn exact BF16", route="sol", density=0.15, tau=1.0,
                 ms=10.0, rel_l2=6.5e-3),
        ],
        "routing": [dict(what="block sums of Q, K, V", ms=0.5, read_tbs=2.8,
                         pct_of_dense_fp8=1.25)],
    }


def test_sparse_table_has_the_ratios_and_the_skip_reasons():
    md = sparse.markdown(sparse_report())
    sol = next(ln for ln in md.splitlines() if ln.startswith("| ours FP8 Sol"))
    cells = [c.strip() for c in sol.split("|")]
    assert cells[4] == "5.000" and cells[6] == "10.00" and cells[7] == "2.00"  # x SDPA, x NVIDIA
    assert "skipped: ValueError: backend 'kernel'" in md
    nv = next(ln for ln in md.splitlines() if ln.startswith("| NVIDIA"))
    assert [c.strip() for c in nv.split("|")][7] == ""  # no ratio of the peer against itself
    assert "| block sums of Q, K, V | 0.500 |  | 1.25 |  | 2.80 |" in md  # no graph time
    # the header names our Sol recipe and what it does with the prefix rows
    assert "(Sol sink, BF16 prefix rows; the BF16 Sol rows route them)" in md
    assert "`fp8_sol_kv_corrected`" in md
    rep = sparse_report()
    rep["config"]["sol_recipe"] = "fp8_sol_kv_corrected:dense_prefix=false,prefix_blocks_exact=true"
    assert "(Sol sink, prefix blocks exact in FP8, in BF16 in" in sparse.markdown(rep)
    rep["config"]["sol_recipe"] = "fp8_sol_kv_corrected:dense_prefix=false"
    assert "(Sol sink, prefix rows routed)" in sparse.markdown(rep)


def test_sparse_table_graph_columns_where_timed():
    """--graph rows: the CUDA-graph time beside the eager one, its ratio against NVIDIA's graph
    time at the same tau; a row that could not be captured shows none."""
    rep = sparse_report()
    for r in rep["rows"]:
        if "ms" in r:
            r["graph_ms"] = r["ms"] / 2
    rep["rows"][0]["graph_ms"] = None  # not capturable
    rep["rows"][-1]["graph_ms"] = 4.0
    md = sparse.markdown(rep)
    assert "| x NVIDIA Sol | CUDA-graph ms | x NVIDIA Sol, graphs |" in md
    sol = next(ln for ln in md.splitlines() if ln.startswith("| ours FP8 Sol"))
    cells = [c.strip() for c in sol.split("|")]
    assert cells[4] == "5.000" and cells[7] == "2.00" and cells[8] == "2.500"
    assert cells[9] == "1.60"  # 4.0 / 2.5
    sdpa = [c.strip() for c in md.splitlines()[4].split("|")]
    assert sdpa[1] == "sdpa_cudnn_bf16" and sdpa[8] == "" and sdpa[10] == "1.700e-03"
    assert "CUDA-graph ms: the same call captured once" in md
    assert "CUDA-graph" not in sparse.markdown(sparse_report())
    assert sparse.config_from_args(sparse.parse_args(["--graph"])).graph
    assert not sparse.config_from_args(sparse.parse_args([])).graph


def test_density_fit_splits_calls_into_fixed_and_per_density_parts():
    """ms = fixed + slope x density per variant, from its rows at densities in (0, 1); a variant
    timed at one density (or skipped) has no line; the slope is also given against our dense
    FP8 call."""
    report = sparse_report()
    rows = report["rows"]
    rows += [dict(variant="ours FP8 Sol exact", route="sol", density=d, tau=None,
                  ms=3.0 + 40.0 * d + e) for d, e in ((0.1, 0.01), (0.35, -0.01), (0.5, 0.0))]
    rows.append(dict(variant="ours FP8 Sol exact", route="sol", density=1.0, tau=None, ms=99.0))
    fits = {f["variant"]: f for f in sparse.density_fits(rows)}
    assert set(fits) == {"ours FP8 Sol exact"}  # NVIDIA at one density, VSA skipped
    f = fits["ours FP8 Sol exact"]
    assert f["densities"] == [0.1, 0.15, 0.35, 0.5]  # the anchor row (5.0 ms at 0.15) included
    # least squares through (0.1, 7.01), (0.15, 5.0), (0.35, 16.99), (0.5, 23.0)
    d, t = [0.1, 0.15, 0.35, 0.5], [7.01, 5.0, 16.99, 23.0]
    md, mt = sum(d) / 4, sum(t) / 4
    slope = sum((a - md) * (b - mt) for a, b in zip(d, t)) / sum((a - md) ** 2 for a in d)
    assert f["slope_ms"] == pytest.approx(slope) and f["fixed_ms"] == pytest.approx(mt - slope * md)
    assert f["slope_of_dense"] == pytest.approx(slope / 40.0)
    md_text = sparse.markdown(report)
    assert f"| ours FP8 Sol exact | 0.100, 0.150, 0.350, 0.500 | {mt - slope * md:.2f} " in md_text


def test_sparse_table_shows_clock_and_power_where_sampled():
    report = sparse_report()
    assert "SM MHz" not in sparse.markdown(report)
    report["rows"][2].update(sm_mhz=1830.0, power_w=655.2)
    md = sparse.markdown(report)
    sol = next(ln for ln in md.splitlines() if ln.startswith("| ours FP8 Sol"))
    nv = next(ln for ln in md.splitlines() if ln.startswith("| NVIDIA"))
    assert "| 1830 / 655 |" in sol and "|  /  |" in nv and sol.count("|") == nv.count("|")
    assert "700 W on an H200" in md
    assert sparse.config_from_args(sparse.parse_args(["--board-s", "0"])).board_s == 0.0
    assert sparse.config_from_args(sparse.parse_args([])).board_s == 1.0
    with pytest.raises(SystemExit):
        sparse.parse_args(["--board-s", "-2"])


def test_sparse_table_lists_the_anchor_profile():
    """The profile table: the ten longest kernels, then the calls' span (always last)."""
    report = sparse_report()
    kernels = [dict(kernel=f"k{i}", ms_per_call=12.0 - i) for i in range(12)]
    kernels.append(dict(kernel="(span of the calls / n, incl. gaps)", ms_per_call=80.0))
    report["profile"] = dict(recipe="fp8_sol_kv_corrected", density=0.1486, kernels=kernels)
    md = sparse.markdown(report)
    lines = [ln for ln in md.splitlines()
             if ln.startswith("| k") and not ln.startswith("| kernel") or ln.startswith("| (span")]
    assert [ln.split("|")[1].strip() for ln in lines] == [f"k{i}" for i in range(10)] + [
        "(span of the calls / n, incl. gaps)"]
    assert "| (span of the calls / n, incl. gaps) | 80.000 |" in md
    assert "exact density 0.1486" in md


def test_sparse_arguments():
    a = sparse.parse_args([])
    cfg = sparse.config_from_args(a)
    assert cfg.densities == sparse.DENSITIES and cfg.heads == 56 and cfg.seq_len is None
    b = sparse.config_from_args(sparse.parse_args(["--densities", "0.25", "--no-peer",
                                                   "--threshold", "diag", "--no-vsa-peer"]))
    assert b.densities == (0.25,) and not b.peer and b.threshold == "diag" and not b.vsa_peer
    assert cfg.vsa_peer
    with pytest.raises(SystemExit) as exc:
        sparse.parse_args(["--densities", "0.2", "1.5"])
    assert exc.value.code == 2
    assert sparse.config_from_args(sparse.parse_args(["--sweep-rounds", "3"])).sweep_rounds == 3
    with pytest.raises(SystemExit):
        sparse.parse_args(["--sweep-rounds", "0"])


def test_fastvideo_vsa_peer_operands_and_absence():
    """FastVideo's layout: [B, H, T, D] with T = S rounded up to 64 and zero rows past S, the last
    tile's real length in block_sizes; without the wheel the loader says so (the row is then
    skipped with that reason)."""
    q = torch.randn(1, 130, 3, 8)
    k, v = q + 1, q + 2
    qp, kp, vp, sizes = sparse.vsa_peer_operands(q, k, v)
    assert qp.shape == (1, 3, 192, 8) and qp.is_contiguous()
    assert torch.equal(vp[:, :, :130], v.transpose(1, 2)) and not vp[:, :, 130:].any()
    assert sizes.dtype == torch.int32 and sizes.tolist() == [64, 64, 2]
    if importlib.util.find_spec("vsa") is None:
        attend, backend, why = sparse.load_fastvideo_vsa()
        assert attend is None and backend == "" and "not installed" in why


def test_workbench_bench_has_sparse_and_dit_subcommands(capsys):
    """`workbench bench sparse|dit` parse into the modules' own options and runners; the dense
    bench keeps its options without a subcommand; bad values are refused before any GPU work."""
    from workbench.cli import build_parser, main

    parser = build_parser()
    a = parser.parse_args(["bench", "sparse", "--densities", "0.1", "0.5", "--no-sweep"])
    assert a.func.runs is sparse.run_args and a.densities == [0.1, 0.5] and a.no_sweep
    assert sparse.config_from_args(a).densities == (0.1, 0.5)
    d = parser.parse_args(["bench", "dit", "--blocks", "2"])
    assert d.func.runs is dit.run_args and d.blocks == 2
    dense = parser.parse_args(["bench", "--rows", "8"])
    assert dense.bench_kind is None and dense.func.__module__.endswith("cli")
    assert bench_cli._top_args(dense).rows == 8 and bench_cli._top_args(dense).sets == 2
    assert main(["bench", "sparse", "--densities", "1.5"]) != 0
    assert "--densities" in capsys.readouterr().err
    variant = "fp8_sol_kv_corrected:dense_prefix=false,prefix_blocks_exact=true"
    a = parser.parse_args(["bench", "sparse", "--sol-recipe", variant])
    assert sparse.config_from_args(a).sol_recipe == variant
    assert sparse.config_from_args(parser.parse_args(["bench", "sparse"])).sol_recipe == \
        sparse.SOL_RECIPE
    for bad, why in (("fp8_dense_kv_corrected", "sparsity='dense'"),
                     ("bf16:sparsity=sol", "qk_format='bf16'"),
                     ("fp8_sol_kv_corrected:sol_threshold=diag", "--threshold diag"),
                     ("fp8_sol_kv_corrected:prefix_blocks_exact=true", "dense_prefix"),
                     ("no_such_recipe", "no_such_recipe")):
        assert main(["bench", "sparse", "--sol-recipe", bad]) != 0
        err = capsys.readouterr().err
        assert "--sol-recipe" in err and why in err, err
    assert main(["bench", "dit", "--blocks", "0"]) != 0
    assert "--blocks" in capsys.readouterr().err


def test_dit_table_and_arguments(capsys):
    report = {"config": {"blocks": 4, "repeats": 5}, "seq_len": 32626, "rows": [
        dict(variant="sdpa_cudnn", ms=415.0, x_cudnn=1.0),
        dict(variant="ours FP8 Sol exact", ms=207.5, x_cudnn=2.0, target=0.2, density=0.2013,
             out_rel_l2_vs_cudnn=4e-3),
        dict(variant="ours FP8 Sol exact", target=0.1, density=0.1, skipped="ValueError: x"),
    ]}
    md = dit.markdown(report)
    assert "| ours FP8 Sol exact | 0.2013 | 207.5 | 2.00 | 4.00e-03 | target 0.20 |" in md
    assert "skipped: ValueError: x" in md
    assert "skipped: no diffusers" in dit.markdown({**report, "skipped": "no diffusers"})
    assert dit.parse_args(["--blocks", "2"]).blocks == 2
    with pytest.raises(SystemExit):
        dit.parse_args(["--blocks", "0"])
    assert "--blocks" in capsys.readouterr().err


def test_gpu_script_commands_and_summary(tmp_path):
    g = gpu_script()
    args = g.parse_args(["--out", str(tmp_path), "--skip", "dit", "--densities", "0.2", "1"])
    tests = g.stage_command("tests", args, 100)
    assert tests[tests.index("-m", 3) + 1] == "gpu" and "tests/test_kernels_routing.py" in tests
    bench = g.stage_command("sparse", args, 100)
    assert bench[bench.index("--budget-s") + 1] == "70" and "--no-sweep" in bench
    assert "--no-sweep" not in g.stage_command("sparse", g.parse_args(["--sweep"]), 100)
    assert bench[bench.index("--densities") + 1 : bench.index("--densities") + 3] == ["0.2", "1.0"]
    with pytest.raises(ValueError, match="stage"):
        g.stage_command("nope", args, 10)
    with pytest.raises(SystemExit):
        g.parse_args(["--densities", "0"])
    (tmp_path / "sparse.json").write_text(json.dumps(sparse_report()))
    (tmp_path / "pytest.txt").write_text(
        ".H3 fp8_sol_kv_corrected: density 0.1487 (twin 0.1487), 3 rounding disagreements\n"
        "1 passed in 60.0s\n")
    text = g.summary(str(tmp_path), ["tests: rc 0 in 61 s"])
    assert "routing: H3 fp8_sol_kv_corrected: density 0.1487" in text
    sol = next(ln for ln in text.splitlines() if ln.startswith("ours FP8 Sol"))
    assert sol.split()[4:7] == ["0.1500", "5.000", "10.00"]  # density, ms, x SDPA
    assert "ours FP8 VSA" in text and "skipped" in text and "1.25% of dense FP8" in text


BLOCKER = """
import importlib.abc, importlib.machinery, sys

class Absent(importlib.abc.Loader):
    def create_module(self, spec):
        raise ImportError(f"No module named {spec.name!r}")

    def exec_module(self, module):
        pass

class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in {"zarr", "plotly", "xarray", "jupyter", "ipywidgets"}:
            return importlib.machinery.ModuleSpec(name, Absent())
        return None

sys.meta_path.insert(0, Block())
"""


def test_bench_modules_work_without_the_notebook_stack(tmp_path):
    """What the GPU machine lacks: the bench modules, the routing and the GPU script import, and
    the interception point still replaces attention in a real (tiny) H3 model."""
    script = str(ROOT / "scripts" / "gpu_sparse.py")
    code = BLOCKER + textwrap.dedent(f"""
        import importlib.util, torch
        from workbench.bench import dit, sparse
        from workbench.kernels import routing
        from workbench.models import load_model
        spec = importlib.util.spec_from_file_location("g", {script!r})
        g = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(g)
        g.parse_args(["--out", {str(tmp_path)!r}])
        Interceptor = dit.interceptor_class()
        m = load_model("h3-tiny")
        seg, clip = m.layout.segments, m.config.clip
        calls = []

        def handler(call):
            calls.append(call.layer)
            return torch.zeros_like(call.q)

        video = torch.randn(1, seg.video, 3 * 2 * 4 * 4)
        audio = torch.randn(1, seg.audio, clip.audio_block)
        text = torch.randn(1, clip.num_text, clip.text_dim)
        with Interceptor(m.model, handler):
            a = m.forward_packed(video, audio, text, 0.5, 0.5)[0]
        b = m.forward_packed(video, audio, text, 0.5, 0.5)[0]
        bad = sorted(k for k in sys.modules if k.split(".")[0] in {{"zarr", "plotly", "xarray"}})
        print("calls", calls, "differs", bool((a - b).abs().max() > 0), "loaded", bad)
    """)
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=str(ROOT), HF_HUB_OFFLINE="1"),
                       timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    assert "calls [0, 1] differs True loaded []" in p.stdout


cpu_only = pytest.mark.skipif(torch.cuda.is_available(), reason="CPU smoke runs")


@cpu_only
def test_sparse_bench_smoke_run_on_the_cpu(tmp_path, capsys):
    """The whole command at a small size: the routing and the tau / keep search run
    (interpreter), the emulation errors are real numbers, the GPU-only variants are skipped with
    their reason, and the JSON report and markdown table are written."""
    assert sparse.main(["--device", "cpu", "--heads", "2", "--seq", "512", "--rows", "8",
                        "--densities", "0.6", "1", "--taus", "2.0", "--no-sweep",
                        "--json", str(tmp_path / "r.json"),
                        "--markdown", str(tmp_path / "r.md")]) == 0
    report = json.loads((tmp_path / "r.json").read_text())
    table, mark, _ = (tmp_path / "r.md").read_text().rpartition("<!-- workbench bench table")
    assert mark and table.rstrip("\n") in capsys.readouterr().out
    assert report["workbench_bench"] == "sparse"
    # a re-run may replace both (its own output); with notes added the table is the user's
    ns = argparse.Namespace(json=str(tmp_path / "r.json"), markdown=str(tmp_path / "r.md"))
    tables.check_report_files(ns)
    with open(tmp_path / "r.md", "a") as f:
        f.write("\n## my analysis\n")
    with pytest.raises(ValueError, match="not an earlier bench table"):
        tables.check_report_files(ns)
    names = [r["variant"] for r in report["rows"]]
    sol_rows = ["ours FP8 Sol exact", "ours BF16 Sol exact"]
    assert names == ["sdpa_cudnn_bf16", "ours fp8_dense_kv_corrected", *sol_rows,
                     "ours FP8 VSA", *sol_rows, "ours FP8 VSA", *sol_rows]
    assert all("kernel" in r["skipped"] for r in report["rows"][1:])  # no CPU kernels
    assert "sol_attn" in report["peer"]
    bf16 = [r for r in report["rows"] if "BF16 Sol" in r["variant"]]
    sol = [r for r in report["rows"] if r["variant"] == "ours FP8 Sol exact"]
    assert [r["tau"] for r in bf16] == [r["tau"] for r in sol]
    assert abs(sol[0]["density"] - 0.6) <= 0.05 and sol[1]["density"] == 1.0
    assert sol[1]["tau"] == -math.inf and sol[2]["tau"] == 2.0 and sol[2]["density"] < 0.6
    vsa = [r for r in report["rows"] if r["route"] == "vsa"]
    assert vsa[0]["density"] == 5 / 8 and vsa[1]["density"] == 1.0  # round(0.6 * 8) tiles
    errs = [r["emu_rel_l2"] for r in report["rows"][1:]]
    assert all(0 < e < 0.05 for e in errs), errs
    assert len(report["routing"]) == 2 + 2 * 2 + 1
    assert "ours FP8 Sol exact" in sparse.markdown(report)


def test_sweep_configs_change_one_option_each():
    from workbench.kernels.config import DEFAULT

    configs = sparse.sweep_configs(DEFAULT)
    labels = [label for label, _ in configs]
    assert len(set(labels)) == len(labels) and configs[0][1] == DEFAULT
    for label, cfg in configs[1:]:
        changed = [f for f in ("attention", "sparse", "routing")
                   if getattr(cfg, f) != getattr(DEFAULT, f)]
        assert len(changed) == 1, label
        a, b = getattr(cfg, changed[0]), getattr(DEFAULT, changed[0])
        assert sum(getattr(a, n) != getattr(b, n) for n in a.__dataclass_fields__) == 1, label


@cpu_only
def test_dit_bench_smoke_run_on_the_cpu():
    """A small H3 transformer: the interception, the per-block tau calibration and the table run;
    the CUDA-only attention variants are skipped with their reason."""
    small = dict(num_attention_heads=2, attention_head_dim=128, hidden_size=128, ffn_dim=256,
                 in_channels=4, audio_in_channels=8, text_dim=32, freq_dim=32,
                 time_embed_hidden_dim=64, time_embed_dim=32, num_refiner_layers=1)
    cfg = dit.DitBenchConfig(device="cpu", blocks=2, densities=(0.6, 1.0), repeats=1, text=4,
                             audio=8, video_grid=(2, 16, 16), model=small)
    report = dit.run(cfg, log=lambda *a: None)
    assert report["seq_len"] == 4 + 8 + 512
    rows = report["rows"]
    assert [r["variant"] for r in rows] == ["sdpa_cudnn", "ours fp8_dense_kv_corrected",
                                           "ours FP8 Sol exact", "ours FP8 Sol exact"]
    assert all("skipped" in r for r in rows[1:])
    assert len(rows[2]["taus"]) == 2 and rows[3]["taus"] == [-math.inf, -math.inf]
    assert abs(rows[2]["density"] - 0.6) <= 0.05 and rows[3]["density"] == 1.0
    assert "target 0.60" not in dit.markdown(report)  # skipped rows show the reason instead


def test_sol_attn_triton_fallback_is_named():
    """A run whose NVIDIA rows time the package's Triton reference says so, with the reason;
    the CuTe backends need no note."""
    assert sparse.sol_attn_backend_note("cute_sm90") == ""
    note = sparse.sol_attn_backend_note("triton")
    assert "Triton reference" in note and "'triton'" in note
    try:
        import cutlass.cute  # noqa: F401
    except Exception:  # noqa: BLE001 - the CPU image has no CuTe DSL: the reason is named
        assert "CuTe DSL runtime does not import" in note


def test_bench_outputs_replace_only_their_own_marked_files(tmp_path):
    """--json / --markdown of the benches replace a file only when a bench wrote it unchanged
    (review findings: a user's markdown whose first line began "Device ", and a JSON object with
    "rows" and "config", were replaced; the same path for both lost the JSON)."""
    inv = tmp_path / "inv.md"
    inv.write_text("Device inventory for lab\n- H200 x8 in rack 3\n")
    mine = tmp_path / "mine.json"
    mine.write_text('{"config": {"lr": 0.001}, "rows": [[1, 2]], "notes": "my experiment"}')
    for ns, needle in ((argparse.Namespace(json=None, markdown=str(inv)), "bench table"),
                       (argparse.Namespace(json=str(mine), markdown=None), "bench report"),
                       (argparse.Namespace(json=str(tmp_path / "same.out"),
                                           markdown=str(tmp_path / "same.out")), "same file")):
        with pytest.raises(ValueError, match=needle):
            tables.check_report_files(ns)
    # written by a bench (into a folder that did not exist): replaced on a re-run
    out = tmp_path / "new" / "deeper"
    tables.write_bench_files({"rows": []}, "Device x\n| a |\n", out / "r.json", out / "r.md",
                             kind="sparse")
    ns = argparse.Namespace(json=str(out / "r.json"), markdown=str(out / "r.md"))
    tables.check_report_files(ns)
    text = (out / "r.md").read_text()
    (out / "r.md").write_text(text.replace("| a |", "| b |"))  # an edited table is the user's
    with pytest.raises(ValueError, match="bench table"):
        tables.check_report_files(ns)


def test_bench_help_names_its_options(capsys):
    from workbench.cli import main

    with pytest.raises(SystemExit):
        main(["bench", "--help"])
    out = capsys.readouterr().out
    assert "--rows ROWS" in out and "BENCH_TOP" not in out


def test_bench_options_are_checked_and_named(capsys):
    """Options that were silently ignored or failed late are refused up front, naming the option
    and the subcommand."""
    from workbench.cli import main

    cases = [(["bench", "--json", "p.json", "--rows", "3", "sparse"],
              "bench sparse: error: --json, --rows: given before 'sparse'"),
             (["bench", "--shapes", "1,64,2,16", "sparse"], "'sparse' is a subcommand"),
             (["bench", "sparse", "--taus=nan"], "--taus: [nan]"),
             (["bench", "sparse", "--seq", "1"], "--seq: 1"),
             (["bench", "sparse", "--budget-s", "-1"], "--budget-s: -1.0"),
             (["bench", "sparse", "--rep-ms", "0"], "--rep-ms: 0"),
             (["bench", "sparse", "--sol-recipe", "fp8_sol_kv_corrected:sol_threshold=exact",
               "--threshold", "diag"], "--threshold exact"),
             (["bench", "--recipes", "fp8_sol_kv_corrected"], "bench sparse"),
             (["bench", "--recipes", "bf16"], "do not run 'bf16'"),
             (["bench", "--recipes", "nosuch"], "--recipes: recipe: unknown preset")]
    for argv, needle in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert needle in err and "Traceback" not in err, (argv, err)


@cpu_only
def test_bench_modules_without_a_gpu_say_so_in_one_line():
    for mod in ("workbench.bench.sparse", "workbench.bench.dit"):
        p = subprocess.run([sys.executable, "-m", mod], capture_output=True, text=True,
                           cwd=ROOT, timeout=120)
        assert p.returncode == 2 and "no CUDA GPU" in p.stderr, p.stderr
        assert "Traceback" not in p.stderr

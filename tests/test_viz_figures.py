"""Figure builders on known data: the values a figure carries are the metrics it was given."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from workbench.attention import H3_LIVE_LAYOUT, SegmentLayout
from workbench.metrics import benefit_pct
from workbench.metrics.media import compare_media
from workbench.synthetic import small_config, synthetic_qkv
from workbench.viz import figures as F
from workbench.evaluate import evaluate

BOUNDS = ("quanted_k", "dequanted_v", "v_mean", "attention_output")


@pytest.fixture(scope="module")
def comparison():
    cfg = small_config(seq_len=512, heads=2)
    q, k, v = synthetic_qkv(cfg)
    c = evaluate(q, k, v, {"A": "fp8_sol_unsmoothed", "B": "fp8_sol_kv_corrected"},
                         layout=cfg.layout, n_queries=48, rotated=cfg.rotated)
    return c, (q, k, v), cfg


def test_per_head_heatmap_values_and_hover():
    vals = np.array([[1e-5, 2e-4, 3e-3], [4e-6, 5e-2, 6e-4]])
    fig = F.per_head_heatmap(vals, layers=[0, 7], heads=[0, 1, 2], metric="mse")
    hm = fig.data[0]
    # hover carries the exact values, colour their log10 (values span 4 decades)
    assert np.array(hm.customdata, dtype=float) == pytest.approx(vals, rel=0, abs=0)
    assert np.array(hm.z, dtype=float) == pytest.approx(np.log10(vals))
    assert list(hm.y) == ["0", "7"] and list(hm.x) == ["0", "1", "2"]
    # hover and cell text in the tables' format for MSE (three significant digits)
    assert "customdata:.3e" in hm.hovertemplate
    assert hm.text[0][0] == "1.000e-05" and hm.text[1][1] == "5.000e-02"
    with pytest.raises(ValueError, match="shape"):
        F.per_head_heatmap(vals, layers=[0], heads=[0, 1, 2])
    # signed values (a benefit) use a linear, diverging scale centred on 0
    ben = F.per_head_heatmap(np.array([[-5.0, 20.0]]), layers=[0], heads=[0, 1],
                             metric="benefit %")
    assert ben.data[0].zmid == 0 and list(ben.data[0].z[0]) == [-5.0, 20.0]


def test_boundary_bars_match_metrics(comparison):
    c, _, _ = comparison
    res = {n: {b: e.overall[b]["mse"] for b in BOUNDS} for n, e in c.evals.items()}
    fig = F.boundary_bars(res)
    assert [t.name for t in fig.data] == ["A", "B"]
    for t in fig.data:
        assert list(t.y) == [c.evals[t.name].overall[b]["mse"] for b in BOUNDS]
    # the seed's headline: V-bias correction restores V's mean far below the unsmoothed error
    a_vm, b_vm = fig.data[0].y[2], fig.data[1].y[2]
    assert b_vm < 1e-6 * a_vm
    assert fig.layout.yaxis.type == "log"


def test_drift_per_channel_split_rotated_passthrough(comparison):
    c, _, _ = comparison
    res = c.evals["A"]
    fig = F.drift_per_channel({"A": res.drift_k}, rotated=96, tensor="K")
    rot, pas = fig.data
    assert rot.name.endswith("rotated") and pas.name.endswith("pass-through")
    assert list(rot.x) == list(range(96)) and list(pas.x) == list(range(96, 128))
    y = np.array(list(rot.y) + list(pas.y))
    assert y == pytest.approx(res.drift_k)
    # the figure's per-channel values average to the metric's rotated / pass-through summary
    assert np.mean(rot.y) == pytest.approx(res.drift_summary["k_rot"], rel=1e-9)
    assert np.mean(pas.y) == pytest.approx(res.drift_summary["k_pass"], rel=1e-9)
    assert fig.layout.shapes[0].x0 == pytest.approx(95.5)
    assert "rotated channels 0-95 | pass-through channels 96-127" in fig.layout.title.text


@pytest.mark.parametrize("rotated, tensor, names, title", [
    (0, "K", ["A, pass-through"], "pass-through channels 0-63"),
    (64, "K", ["A, rotated"], "rotated channels 0-63"),
    (None, "K", ["A, all channels"], "channels 0-63 (RoPE split unknown)"),
    (32, "V", ["A, K's rotated span", "A, K's pass-through span"],
     "channels 0-31 (K's rotated span) | channels 32-63 (K's pass-through span)"),
])
def test_drift_per_channel_empty_group_vanishes(rotated, tensor, names, title):
    d = np.linspace(1e-4, 1e-3, 64)
    fig = F.drift_per_channel({"A": d}, rotated=rotated, tensor=tensor)
    assert [t.name for t in fig.data] == names
    assert [y for t in fig.data for y in t.y] == pytest.approx(d)
    assert bool(fig.layout.shapes) == (len(names) == 2) and "nan" not in fig.layout.title.text
    assert title in fig.layout.title.text and "-1" not in fig.layout.title.text


def test_error_along_tokens_and_bands(comparison):
    c, _, cfg = comparison
    fig = F.error_along_tokens({n: e.along for n, e in c.evals.items()})
    for t in fig.data:
        e = c.evals[t.name]
        assert list(t.x) == c.query_rows
        assert list(t.y) == pytest.approx(e.along["mse"])
        # row errors average to the overall output MSE (every row has B*H*D elements)
        assert np.mean(t.y) == pytest.approx(e.overall["attention_output"]["mse"], rel=1e-9)
    bands = cfg.layout.bands()
    assert len(fig.layout.shapes) == len(bands)
    for s, (_, a, b) in zip(fig.layout.shapes, bands):
        assert (s.x0, s.x1) == (a - 0.5, b - 0.5)
    assert {a.text for a in fig.layout.annotations} == {n for n, _, _ in bands}


def test_segment_labels_do_not_overlap_on_h3_layout():
    # H3's 14 text and 356 audio rows are slivers beside 32,256 video rows: each label that would
    # print over its neighbour's goes one row down
    bands = H3_LIVE_LAYOUT.bands()
    rows = list(range(0, 32626, 509))
    curve = {"row": rows, "mse": [1e-4] * len(rows), "segment": H3_LIVE_LAYOUT.segment_of(rows),
             "bands": bands}
    fig = F.error_along_tokens({"A": curve})
    ann = {a.text: a for a in fig.layout.annotations}
    assert set(ann) == {"text", "audio", "video"}
    assert len({ann[n].y for n in ann}) == 3
    assert all(ann[n].x == a - 0.5 for n, a, _ in bands)
    # wide segments share the top row
    assert F.band_label_rows([("prompt", 0, 1000), ("answer", 1000, 2000)], -0.5, 1999.5) == [0, 0]
    # a generic layout takes palette colours in order, H3 names keep theirs
    lay = SegmentLayout.of([("prompt", 100), ("answer", 60)])
    fig2 = F.error_along_tokens({"A": {"row": [0, 150], "mse": [1.0, 2.0],
                                       "segment": ["prompt", "answer"], "bands": lay.bands()}})
    assert [s.fillcolor for s in fig2.layout.shapes] == F.SEGMENT_PALETTE[:2]
    assert "%{y:.3e}" in fig2.data[0].hovertemplate


def test_routing_map_fraction(comparison):
    c, _, _ = comparison
    e = c.evals["B"]
    assert e.block_map is not None
    fig = F.routing_map(e.block_map, block=e.block, n_heads=len(c.heads))
    assert np.array(fig.data[0].customdata) == pytest.approx(e.block_map)
    # discrete colours: one step per number of heads routing a pair exactly (0, 1/2, 1 of 2)
    hm = fig.data[0]
    assert list(hm.colorbar.ticktext) == ["summary", "1/2 heads exact", "exact"]
    z = np.array(hm.z)
    assert z == pytest.approx(np.rint(e.block_map * 2))
    cs = [tuple(x) for x in hm.colorscale]
    assert len(cs) == 6 and all(cs[2 * i][1] == cs[2 * i + 1][1] for i in range(3))
    assert len({c for _, c in cs}) == 3
    # the map (averaged over heads) covers every query block, so its mean is the exact fraction
    # over all blocks; the sampled-row fraction lies within the map's range
    assert f"{float(e.block_map.mean()):.4f}" in fig.layout.title.text
    m = np.array([[1, 0, 0], [1, 1, 0], [1, 1, 1]], dtype=bool)
    fig2 = F.routing_map(m, block=64, bands=[("text", 0, 10), ("video", 10, 192)])
    assert "0.6667" in fig2.layout.title.text
    assert fig2.layout.shapes[0].x0 == pytest.approx(10 / 64 - 0.5)
    assert list(fig2.data[0].colorbar.ticktext) == ["summary", "exact"]
    # the prefix line and its label come from the layout: a generic model names its own segment
    fig3 = F.routing_map(m, block=64, prefix=70, generated="answer", zero_label="skipped")
    assert fig3.layout.shapes[0].x0 == pytest.approx(70 / 64 - 0.5)
    assert fig3.layout.annotations[0].text == "prefix | answer"
    assert list(fig3.data[0].colorbar.ticktext) == ["skipped", "exact"]
    assert not F.routing_map(m, block=64, prefix=0).layout.shapes


def test_frame_grid_and_curves():
    g = torch.Generator().manual_seed(0)
    a = torch.rand(5, 3, 16, 16, generator=g)
    b = (a + 0.05 * torch.randn(5, 3, 16, 16, generator=g)).clamp(0, 1)
    fig = F.frame_grid(a, b, frames=[0, 4])
    assert len(fig.data) == 6
    heat = fig.data[2]
    assert np.array(heat.z) == pytest.approx((a[0] - b[0]).abs().mean(0).double().numpy())
    img = fig.data[0].z
    assert np.asarray(img).shape == (16, 16, 3)
    m = compare_media(a, b)
    cf = F.frame_metric_curves({"B": m["curves"]})
    assert list(cf.data[0].y) == pytest.approx(m["curves"]["psnr_db"])
    assert list(cf.data[1].y) == pytest.approx(m["curves"]["ssim"])
    assert list(cf.data[2].y) == pytest.approx(m["curves"]["cosine"])


def test_audio_comparison_spectrogram_difference():
    sr = 4096
    t = torch.arange(4096) / sr
    a = torch.sin(2 * math.pi * 440 * t)
    b = a + 0.1 * torch.sin(2 * math.pi * 1000 * t)
    fig = F.audio_comparison(a, b, sample_rate=sr, n_fft=256)
    assert list(fig.data[0].y) == pytest.approx(a.double().tolist())
    d = np.array(fig.data[2].z)
    expect = F.log_power_spectrogram(b, 256) - F.log_power_spectrogram(a, 256)
    assert d == pytest.approx(expect)
    # the added 1 kHz tone is where the difference is largest
    freqs = np.array(fig.data[2].y)
    assert abs(freqs[np.abs(d).mean(1).argmax()] - 1000) <= sr / 256


def test_kernel_bench_from_json():
    report = {
        "env": {"device": "H200"},
        "ceilings": {"bf16_mm_tflops": 679.0},
        "rows": [
            {"shape": "(1, 8192, 56, 128)", "S": 8192, "variant": "x", "mode": "full",
             "ms": 2.0, "tflops": 100.0},
            {"shape": "(1, 4096, 56, 128)", "S": 4096, "variant": "x", "mode": "full",
             "ms": 1.0, "tflops": 50.0},
            {"shape": "(1, 4096, 56, 128)", "S": 4096, "variant": "y", "mode": "full", "ms": 1.0},
            {"shape": "(1, 4096, 56, 128)", "S": 4096, "variant": "x", "mode": "prep", "ms": 0.1,
             "tflops": 1.0},
        ],
    }
    fig = F.kernel_bench(report)
    assert [t.name for t in fig.data] == ["x (full)", "y (full)"]
    assert list(fig.data[0].x) == [4096, 8192] and list(fig.data[0].y) == [50.0, 100.0]
    # a row with only a time gets TFLOP/s from 4*B*H*S^2*D
    assert fig.data[1].y[0] == pytest.approx(4 * 56 * 4096**2 * 128 / 1e-3 / 1e12)
    assert fig.layout.shapes[0].y0 == 679.0


def test_accuracy_vs_length_draws_measured_and_emulated_errors():
    nan = float("nan")
    report = {"rows": [
        {"S": 16384, "variant": "fa3_fp8", "mode": "full", "rel_l2": 0.217, "emu_rel_l2": 0.218},
        {"S": 8192, "variant": "fa3_fp8", "mode": "full", "rel_l2": 0.122, "emu_rel_l2": 0.127},
        {"S": 8192, "variant": "fa3_fp8", "mode": "kernel", "rel_l2": 0.122},
        {"S": 8192, "variant": "ours", "mode": "full", "rel_l2": 1.9e-3},
        {"S": 8192, "variant": "nearest", "mode": "full", "rel_l2": nan, "emu_rel_l2": 2.7e-3},
        {"S": 8192, "variant": "stats", "mode": "full", "rel_l2": nan},  # no output: no line
    ]}
    fig = F.accuracy_vs_length(report)
    names = [t.name for t in fig.data]
    assert names == ["fa3_fp8 (measured)", "fa3_fp8 (emulated)", "ours (measured)",
                     "nearest (emulated)"]
    assert list(fig.data[0].x) == [8192, 16384] and list(fig.data[0].y) == [0.122, 0.217]
    assert list(fig.data[1].y) == [0.127, 0.218] and fig.data[1].line.dash == "dot"
    assert fig.data[1].line.color == fig.data[0].line.color  # one color per variant
    assert fig.layout.yaxis.type == "log" and fig.layout.xaxis.type == "log"


def test_heatmap_grid_matches_per_head_metrics(comparison):
    c, _, _ = comparison
    e = c.evals["B"]
    vals = np.array([e.heads["attention_output"]["mse"]])
    fig = F.per_head_heatmap(vals, layers=[0], heads=c.heads)
    assert list(fig.data[0].customdata[0]) == e.heads["attention_output"]["mse"]
    a = c.evals["A"].heads["attention_output"]["mse"]
    ben = [benefit_pct(x, y) for x, y in zip(a, e.heads["attention_output"]["mse"])]
    fb = F.per_head_heatmap(np.array([ben]), layers=[0], heads=c.heads, log_color=False)
    assert list(fb.data[0].z[0]) == pytest.approx(ben)


def test_layout_bands_helper():
    lay = SegmentLayout(text=4, audio=32, video=128)
    shapes = F.band_shapes(lay.bands())
    assert [(s["x0"], s["x1"]) for s in shapes] == [(-0.5, 3.5), (3.5, 35.5), (35.5, 163.5)]


def test_comparison_figures_one_set_shared_scale(comparison):
    c, _, _ = comparison
    ga = np.array([[1e-6, 2e-5], [3e-4, 4e-6]])
    gb = np.array([[5e-7, 1e-5], [2e-4, 9e-6]])
    figs = F.comparison_figures(c, "A", "B", labels={"A": "base", "B": "cand"},
                                grids={"a": ga, "b": gb}, layers=[0, 1], step=3, layer=1)
    assert set(figs) == {"boundary_bars", "error_along_tokens", "drift_k", "drift_v",
                         "heatmap_output_mse_a", "heatmap_output_mse_b", "heatmap_benefit",
                         "routing_map"}
    bars = figs["boundary_bars"][0]
    assert [t.name for t in bars.data] == ["base", "cand"]
    assert list(bars.data[1].y) == [c.evals["B"].overall[b]["mse"] for b in BOUNDS]
    # A and B heatmaps are read side by side: one colour scale spanning both grids
    ha, hb = figs["heatmap_output_mse_a"][0].data[0], figs["heatmap_output_mse_b"][0].data[0]
    lo, hi = np.log10(min(ga.min(), gb.min())), np.log10(max(ga.max(), gb.max()))
    assert (ha.zmin, ha.zmax) == pytest.approx((lo, hi))
    assert (hb.zmin, hb.zmax) == pytest.approx((lo, hi))
    ben = figs["heatmap_benefit"][0].data[0]
    assert np.array(ben.customdata, dtype=float) == pytest.approx(
        np.vectorize(benefit_pct)(ga, gb))
    assert "step 3, layer 1" in figs["error_along_tokens"][1]
    # without grids: no heatmaps; a dense pair: no routing map
    assert "heatmap_output_mse_b" not in F.comparison_figures(c, "A", "B")


def test_deprecated_compute_module_warns():
    import importlib
    import sys

    sys.modules.pop("workbench.viz.compute", None)
    with pytest.warns(FutureWarning, match="workbench.evaluate"):
        mod = importlib.import_module("workbench.viz.compute")
    from workbench.evaluate import evaluate as ev

    assert mod.evaluate_recipes is ev


def test_review_findings_on_figures():
    """A shorter waveform was cut silently (its tail drawn as no difference); a benefit or a dB
    grid got a log10 colour scale."""
    a = np.sin(2 * np.pi * 440 * np.arange(8000) / 8000)
    with pytest.raises(ValueError, match="8000 samples, B 4000"):
        F.audio_comparison(a, a[:4000].copy(), sample_rate=8000)
    for metric, vals in (("benefit %", [[0.1, 50.0]]), ("sqnr_db", [[30.0, 0.2]])):
        f = F.per_head_heatmap(vals, layers=[0], heads=[0, 1], metric=metric)
        assert list(f.data[0].z[0]) == vals[0], metric  # the values, not log10 of them
        assert "log10" not in str(f.data[0].colorbar.title.text)

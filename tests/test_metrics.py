"""Tensor and boundary metrics on known data."""

import math

import pytest
import torch

from workbench.attention import SegmentLayout, dense_attention_f64, recipe_attention
from workbench.metrics import (
    benefit_pct,
    bootstrap_benefit,
    boundary_metrics,
    channel_mean_norms,
    error_along_tokens,
    error_stats,
    per_head,
    token_mean_drift,
)


def test_error_stats_known_values():
    ref = torch.tensor([3.0, 4.0])  # norm 5
    x = torch.tensor([3.0, 4.5])  # error (0, 0.5)
    s = error_stats(x, ref)
    assert s["mse"] == pytest.approx(0.125)
    assert s["rel_l2"] == pytest.approx(0.1)
    assert s["sqnr_db"] == pytest.approx(20.0)
    assert s["max_abs"] == pytest.approx(0.5)
    assert s["cosine"] == pytest.approx((9 + 18) / (5 * math.hypot(3, 4.5)))
    same = error_stats(ref, ref)
    assert (same["sqnr_db"] == math.inf and same["rel_l2"] == 0
            and same["cosine"] == pytest.approx(1))


def test_error_stats_rejects_shape_mismatch():
    with pytest.raises(ValueError, match="shapes differ"):
        error_stats(torch.zeros(2), torch.zeros(3))


def test_per_head_separates_heads():
    ref = torch.ones(1, 4, 3, 2)
    x = ref.clone()
    x[:, :, 1] += 0.1
    ph = per_head(x, ref)
    assert ph["mse"][0] == 0 and ph["mse"][2] == 0
    assert ph["mse"][1] == pytest.approx(0.01)


def test_benefit_and_bootstrap():
    assert benefit_pct(2.0, 1.0) == 50.0
    assert benefit_pct(1.0, 2.0) == -100.0
    a = torch.full((64,), 2.0) + torch.rand(64) * 0.01
    b = torch.full((64,), 1.0) + torch.rand(64) * 0.01
    lo, hi = bootstrap_benefit(a, b)
    assert 49 < lo <= hi < 51
    # noise with no real benefit: the interval straddles zero
    g = torch.Generator().manual_seed(0)
    n1, n2 = torch.rand(64, generator=g), torch.rand(64, generator=g)
    lo, hi = bootstrap_benefit(n1, n2)
    assert lo < 0 < hi


def test_token_mean_drift_rotated_vs_passthrough():
    x = torch.zeros(1, 10, 1, 128)
    x_dq = x.clone()
    x_dq[..., :96] += 0.01
    x_dq[..., 96:] += 0.5
    d = token_mean_drift(x_dq, x, rotated=96)
    assert d["rotated"] == pytest.approx(0.01) and d["passthrough"] == pytest.approx(0.5)
    assert d["per_channel"].shape == (1, 1, 128)


def test_channel_mean_norms_energy_fraction():
    x = torch.zeros(1, 100, 1, 4)
    x[..., 2:] = 3.0  # pure bias on channels 2, 3 (pass-through when rotated=2)
    x[..., :2] = torch.randn(1, 100, 1, 2)
    n = channel_mean_norms(x, rotated=2)
    assert n["passthrough_mean_energy_frac"] == pytest.approx(1.0)
    assert n["passthrough_mean_norm"] == pytest.approx(3 * math.sqrt(2))
    assert n["rotated_mean_energy_frac"] < 0.1


def test_boundary_metrics_match_direct_computation():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 130, 2, 64, generator=g) + 1 for _ in range(3))
    lay = SegmentLayout(text=2, audio=8, video=120)
    idx = torch.tensor([0, 9, 10, 64, 129])
    ref, _ = dense_attention_f64(q, k, v, query_index=idx)
    res = recipe_attention(q, k, v, "fp8_dense_kv_corrected", layout=lay, query_index=idx)
    m = boundary_metrics(res, q, k, v, ref)
    want = float((res.k_dq.double() - k.double()).pow(2).mean())
    # float32 partial sums over tokens, float64 across them: ~1e-7 relative
    assert m.overall["quanted_k"]["mse"] == pytest.approx(want, rel=1e-6)
    assert m.overall["v_mean"]["mse"] < 1e-12
    out_h1 = float((res.out[:, :, 1].double() - ref[:, :, 1]).pow(2).mean())
    assert m.heads["attention_output"]["mse"][1] == pytest.approx(out_h1, rel=1e-6)
    assert m.row_sq_err.shape == (5,)
    along = error_along_tokens(res, ref, lay)
    assert along["segment"] == ["text", "audio", "video", "video", "video"]
    assert along["bands"] == [("text", 0, 2), ("audio", 2, 10), ("video", 10, 130)]

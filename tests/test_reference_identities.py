"""Identities of the recipes, checked on the reference path (float64 where exactness is claimed)."""

import math

import pytest
import torch

from workbench.attention import (
    SegmentLayout,
    dense_attention_f64,
    evenly_spaced_rows,
    recipe_attention,
)
from workbench.attention.sparsity import sol_block_map, vsa_block_map
from workbench.recipes import get_recipe
from workbench.synthetic import small_config, synthetic_qkv

LAYOUT = SegmentLayout(text=8, audio=56, video=456)  # 520 rows: last 64-block is partial


def _inputs(dtype=torch.float64, S=520, H=2, D=64, seed=0, bias=2.0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, S, H, D, generator=g, dtype=torch.float64)
    k = torch.randn(1, S, H, D, generator=g, dtype=torch.float64) + bias * torch.randn(
        D, generator=g, dtype=torch.float64)
    v = torch.randn(1, S, H, D, generator=g, dtype=torch.float64) + bias * torch.randn(
        D, generator=g, dtype=torch.float64)
    return q.to(dtype), k.to(dtype), v.to(dtype)


def test_exact_recipe_equals_float64_reference():
    q, k, v = _inputs()
    ref, lse_ref = dense_attention_f64(q, k, v)
    res = recipe_attention(q, k, v, "exact", layout=LAYOUT)
    assert (res.out - ref).abs().max() < 1e-12
    assert (res.lse - lse_ref).abs().max() < 1e-10


def test_k_centering_leaves_softmax_unchanged():
    q, k, v = _inputs()
    a = recipe_attention(q, k, v, "exact", layout=LAYOUT)
    b = recipe_attention(q, k, v, get_recipe("exact:smoothing=k"), layout=LAYOUT)
    assert (a.out - b.out).abs().max() < 1e-12
    # the LSE moves by exactly q . mu_K * scale: the shift the softmax cancels
    shift = (q * b.mu_k[:, None]).sum(-1) / math.sqrt(q.shape[-1])
    assert (a.lse - (b.lse + shift)).abs().max() < 1e-10


def test_v_centering_plus_mean_restore_is_exact():
    q, k, v = _inputs()
    a = recipe_attention(q, k, v, "exact", layout=LAYOUT)
    b = recipe_attention(q, k, v, get_recipe("exact:smoothing=kv"), layout=LAYOUT)
    assert (a.out - b.out).abs().max() < 1e-12


def test_correction_restores_v_mean():
    q, k, v = _inputs(bias=4.0)
    res = recipe_attention(q, k, v, "fp8_dense_kv_corrected", layout=LAYOUT,
                           query_index=[0, 100, 519])
    mean_dq, mean = res.v_dq.mean(1), v.mean(1)
    rel = (mean_dq - mean).norm() / mean.norm()
    assert rel <= 1e-6
    unc = recipe_attention(q, k, v, "fp8_dense_kv_corrected:v_bias_correction=false",
                           layout=LAYOUT, query_index=[0])
    rel_unc = (unc.v_dq.mean(1) - mean).norm() / mean.norm()
    assert rel_unc > 100 * rel  # without the correction the quantization bias is visible


def test_sol_routing_unchanged_by_k_centering():
    q, k, v = _inputs(S=1024)
    r = get_recipe("fp8_sol_kv_corrected")
    lay = SegmentLayout(text=10, audio=90, video=924)
    m1 = sol_block_map(q, k, v, r, lay, 0.125)[0]
    m2 = sol_block_map(q, k - k.mean(1, keepdim=True), v, r, lay, 0.125)[0]
    assert torch.equal(m1, m2)
    assert 0.05 < m1.float().mean() < 0.95  # a real mix of exact and summary blocks
    for mode in ("exact", "diag"):
        mm = sol_block_map(q, k, v, r.with_(sol_threshold=mode), lay, 0.125)[0]
        assert torch.equal(mm, sol_block_map(q, k - 3.0, v, r.with_(sol_threshold=mode), lay,
                                             0.125)[0])


def test_sol_tau_minus_inf_equals_dense():
    q, k, v = _inputs(dtype=torch.float32)
    idx = evenly_spaced_rows(520, 40)
    sol = recipe_attention(q, k, v, "fp8_sol_kv_corrected:sol_tau=-inf", layout=LAYOUT,
                           query_index=idx)
    dense = recipe_attention(q, k, v, "fp8_dense_kv_corrected:dense_prefix=true", layout=LAYOUT,
                             query_index=idx)
    assert sol.exact_fraction == 1.0
    assert torch.equal(sol.out, dense.out)


def test_sol_summary_route_is_used_and_bounded():
    q, k, v = _inputs(dtype=torch.float32, S=2048)
    lay = SegmentLayout(text=10, audio=90, video=1948)
    idx = evenly_spaced_rows(2048, 64)
    ref, _ = dense_attention_f64(q, k, v, query_index=idx)
    sol = recipe_attention(q, k, v, "fp8_sol_kv_corrected", layout=lay, query_index=idx)
    dense = recipe_attention(q, k, v, "fp8_dense_kv_corrected", layout=lay, query_index=idx)
    e_sol = float((sol.out - ref).norm() / ref.norm())
    e_dense = float((dense.out - ref).norm() / ref.norm())
    assert sol.exact_fraction < 0.9
    assert e_dense < e_sol < 0.5  # summaries cost accuracy, but stay an approximation


def test_vsa_keep_one_equals_dense():
    q, k, v = _inputs(dtype=torch.float32)
    idx = evenly_spaced_rows(520, 40)
    vsa = recipe_attention(q, k, v, "vsa_bf16:vsa_keep=1.0", layout=LAYOUT, query_index=idx)
    dense = recipe_attention(q, k, v, "bf16", layout=LAYOUT, query_index=idx)
    assert vsa.exact_fraction == 1.0
    assert torch.equal(vsa.out, dense.out)


def test_vsa_selection_counts():
    q, k, v = _inputs(dtype=torch.float32, S=1024)
    lay = SegmentLayout(text=10, audio=90, video=924)
    r = get_recipe("vsa_bf16:vsa_keep=0.25")
    m = vsa_block_map(q, k, r, lay, 0.125)
    n_prefix = 2  # tiles 0 and 1 hold rows < 100
    assert bool(m[..., :n_prefix].all())  # exempt: prefix tiles always kept
    assert int(m[0, 0, 0].sum()) == n_prefix + math.ceil(0.25 * (16 - n_prefix))
    mc = vsa_block_map(q, k, r.with_(vsa_prefix="compete"), lay, 0.125)
    assert int(mc[0, 0, 0].sum()) == math.ceil(0.25 * 16)


def test_dense_prefix_rows_are_bf16_dense():
    q, k, v = _inputs(dtype=torch.float32)
    idx = torch.tensor([0, 5, 63, 64, 300])
    r = recipe_attention(q, k, v, "fp8_sol_kv_corrected", layout=LAYOUT, query_index=idx)
    bf = recipe_attention(q, k, v, "bf16", layout=LAYOUT, query_index=idx)
    assert r.prefix_rows.tolist() == [True, True, True, False, False]
    assert torch.equal(r.out[:, :3], bf.out[:, :3])
    assert not torch.equal(r.out[:, 3:], bf.out[:, 3:])


def test_gqa_matches_expanded_heads():
    q, k, v = _inputs(dtype=torch.float32, H=4)
    k2, v2 = k[:, :, :2], v[:, :, :2]  # 4 query heads read 2 K/V heads
    kx, vx = k2.repeat_interleave(2, 2), v2.repeat_interleave(2, 2)
    for name in ("fp8_dense_kv_corrected", "fp8_sol_k"):
        a = recipe_attention(q, k2, v2, name, layout=LAYOUT, query_index=[1, 200])
        b = recipe_attention(q, kx, vx, name, layout=LAYOUT, query_index=[1, 200])
        assert torch.equal(a.out, b.out)


@pytest.mark.parametrize("D", [64, 128, 256])
def test_any_head_dim(D):
    q, k, v = _inputs(dtype=torch.float32, D=D, S=200)
    lay = SegmentLayout(text=4, audio=20, video=176)
    ref, _ = dense_attention_f64(q, k, v, query_index=[3, 150])
    res = recipe_attention(q, k, v, "fp8_hadamard", layout=lay, query_index=[3, 150])
    assert float((res.out - ref).norm() / ref.norm()) < 0.05


def test_smoothed_sol_beats_unsmoothed_on_synthetic():
    cfg = small_config(seq_len=2048, heads=4)
    q, k, v = synthetic_qkv(cfg)
    idx = evenly_spaced_rows(2048, 64)
    ref, _ = dense_attention_f64(q, k, v, query_index=idx)
    a = recipe_attention(q, k, v, "fp8_sol_unsmoothed", layout=cfg.layout, query_index=idx)
    b = recipe_attention(q, k, v, "fp8_sol_kv_corrected", layout=cfg.layout, query_index=idx)
    kf, vf = k.double(), v.double()

    def mse(x, y):
        return float((x.double() - y.double()).pow(2).mean())

    assert mse(b.k_dq, kf) < 0.8 * mse(a.k_dq, kf)
    assert mse(b.v_dq.mean(1), vf.mean(1)) < 1e-6 * mse(a.v_dq.mean(1), vf.mean(1))
    assert mse(b.out, ref) < mse(a.out, ref)


def test_reduced_accumulator_costs_accuracy():
    q, k, v = _inputs(dtype=torch.float32, S=1024)
    lay = SegmentLayout(video=1024)
    idx = evenly_spaced_rows(1024, 32)
    ref, _ = dense_attention_f64(q, k, v, query_index=idx)
    full = recipe_attention(q, k, v, "fp8_dense", layout=lay, query_index=idx)
    red = recipe_attention(q, k, v, "fp8_dense:accumulation=reduced,accum_mantissa_bits=4",
                           layout=lay, query_index=idx)
    e_full = float((full.out - ref).norm() / ref.norm())
    e_red = float((red.out - ref).norm() / ref.norm())
    same = recipe_attention(q, k, v, "fp8_dense:accumulation=reduced,accum_mantissa_bits=23",
                            layout=lay, query_index=idx)
    assert e_red > 1.5 * e_full
    assert float((same.out - full.out).abs().max()) <= 2**-7  # 23 bits: fp32 up to bf16 ulps


def test_truncating_accumulator_shrinks_long_unflushed_sums():
    """FlashAttention-3 FP8's numerics (P @ V accumulated on the tensor cores over the whole row):
    with the H200's truncating accumulator (``accum_rounding="truncate"``) every product under
    the running sum's 13th bit is dropped, so the output shrinks and the error grows with the
    row length; a round-to-nearest accumulator predicts ~10x less. A flush to FP32 every 128
    keys (the kernels' per-tile flush) removes most of it; with V smoothed the products change
    sign, the cuts cancel and even an unflushed accumulator costs nothing measurable."""
    q, k, v = _inputs(dtype=torch.float32, S=2048, H=2, D=128, bias=1.0)
    lay = SegmentLayout(video=2048)
    idx = evenly_spaced_rows(2048, 16)
    ref, _ = dense_attention_f64(q, k, v, query_index=idx)
    fa3 = ("fp8_dense:qk_granularity=tensor,v_granularity=tensor,smoothing=none,"
           "v_bias_correction=false,p_scaling=exp2_offset8,accumulation=reduced,"
           "accum_flush_keys=100000")

    def err(recipe):
        out = recipe_attention(q, k, v, recipe, layout=lay, query_index=idx).out.double()
        return float((out - ref).norm() / ref.norm()), float((out * ref).sum() / (ref * ref).sum())

    (e_t, proj_t), (e_n, _) = err(fa3), err(fa3 + ",accum_rounding=nearest")
    e_fp32, _ = err(fa3.replace("accumulation=reduced", "accumulation=fp32"))
    e_flush, _ = err(fa3 + ",accum_flush_keys=128")
    assert e_t > 5 * e_n and proj_t < 0.99  # the output shrinks
    assert e_n < 1.05 * e_fp32 and e_flush < 0.2 * e_t
    e_smooth, _ = err("fp8_dense_kv_corrected")
    e_smooth_t, _ = err("fp8_dense_kv_corrected:accumulation=reduced,accum_flush_keys=100000")
    assert e_smooth_t < 1.05 * e_smooth


def test_memory_bounded_at_live_length():
    """64 queries against 32,626 keys never materialise S x S: peak RSS grows far less than the
    4.2 GB an S x S float32 matrix would take (measured in a fresh subprocess)."""
    import subprocess
    import sys

    code = """
import resource, torch
from workbench.attention import H3_LIVE_LAYOUT, evenly_spaced_rows, recipe_attention
from workbench.synthetic import H3_SYNTHETIC, synthetic_qkv
q, k, v = synthetic_qkv(H3_SYNTHETIC, heads=[0])
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
res = recipe_attention(q, k, v, "fp8_sol_kv_corrected", layout=H3_LIVE_LAYOUT,
                       query_index=evenly_spaced_rows(q.shape[1], 64))
after = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
assert torch.isfinite(res.out).all()
print((after - before) / 1024)
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    grew_mib = float(out.stdout.strip().splitlines()[-1])
    assert grew_mib < 600, f"peak RSS grew by {grew_mib:.0f} MiB"


@pytest.mark.parametrize("heads", [[0, 1], [2, 3], [1, 2], [3]])
def test_select_heads_under_gqa_matches_full_run(heads):
    from workbench.attention import select_heads

    q, k, v = _inputs(dtype=torch.float32, H=4)
    k2, v2 = k[:, :, :2], v[:, :, :2]  # 4 query heads, 2 K/V heads
    full = recipe_attention(q, k2, v2, "fp8_dense_k", layout=LAYOUT, query_index=[7, 300])
    qs, ks, vs = select_heads(q, k2, v2, heads)
    part = recipe_attention(qs, ks, vs, "fp8_dense_k", layout=LAYOUT, query_index=[7, 300])
    assert torch.equal(part.out, full.out[:, :, heads])
    whole_groups = heads in ([0, 1], [2, 3])
    assert ks.shape[2] == (1 if whole_groups else len(heads))


def test_log_linear_codes_and_their_mean_bias():
    """p_exp="log_linear"'s P (reference._log_linear_p, scaled back by 2^-8): the code
    round(8 (s - m' + 8)) + 56 with m' = ceil(8 m) / 8, decoded as E4M3: the row max on the grid
    gives exactly 1, half a power of two below it the straight line's 0.75 (2^-0.5 = 0.707),
    an off-grid max shifts every code by the same fraction, far below the range gives 0; and the
    values' mean ratio to 2^x over random scores is recipe.LL_MEAN_RATIO."""
    from workbench.attention.reference import _log_linear_p
    from workbench.recipes.recipe import LL_MEAN_RATIO

    m = torch.tensor([0.0])
    s = torch.tensor([[0.0, -0.5, -1.0, -20.0, -math.inf]])
    assert _log_linear_p(s, m).tolist() == [[1.0, 0.75, 0.5, 0.0, 0.0]]
    # m = 0.3: m' = 3/8, the max's code is round(8 * 0.3 - 3 + 64) + 56 = 119: 240 / 256
    assert _log_linear_p(torch.tensor([[0.3]]), torch.tensor([0.3])).item() == 0.9375
    g = torch.Generator().manual_seed(0)
    x = -6 * torch.rand(1, 400_000, generator=g, dtype=torch.float64)
    mm = torch.rand(1, generator=g, dtype=torch.float64)
    p = _log_linear_p(x + mm, mm) * torch.exp2(torch.ceil(8 * mm) / 8 - mm)
    ratio = float((p / torch.exp2(x)).mean())
    assert abs(ratio - LL_MEAN_RATIO) < 1e-3, (ratio, LL_MEAN_RATIO)
    assert abs(LL_MEAN_RATIO - 1.04036) < 1e-5

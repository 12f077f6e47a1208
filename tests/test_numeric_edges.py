"""The Python API at numerical edges (findings of a review, each reproduced on the tree before
its fix): cached references follow writes that bypass the version counter, repeated head
selections under GQA, metrics of tiny / huge / mismatched / zero tensors in float64, float64
references at the Q/K/V boundaries, FP8 scales outside FP32's range, chunk sizes that must not
move results, the softmax scale and query rows named before any work."""

from __future__ import annotations

import math

import pytest
import torch

from workbench.attention import dense_attention_f64, recipe_attention
from workbench.attention.layout import InputError, select_heads
from workbench.evaluate import evaluate
from workbench.metrics import error_stats, per_head
from workbench.recipes import get_recipe


def _ref64(q, k, v):
    """Plain float64 softmax(q k^T / sqrt(D)) v, K/V repeated per query-head group."""
    g = q.shape[2] // k.shape[2]
    q, k, v = (t.double().transpose(1, 2) for t in (q, k, v))
    k, v = k.repeat_interleave(g, 1), v.repeat_interleave(g, 1)
    p = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(q.shape[-1]), -1)
    return (p @ v).transpose(1, 2)


def _mse(c, label="a"):
    return c.evals[label].overall["attention_output"]["mse"]


def test_cached_reference_follows_writes_past_the_version_counter():
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 128, 2, 32, generator=g) for _ in range(3))
    assert _mse(evaluate(q, k, v, {"a": "exact"}, n_queries=8)) < 1e-12
    v.numpy()[:] *= 10.0  # no version bump
    assert v._version == 0
    assert _mse(evaluate(q, k, v, {"a": "exact"}, n_queries=8)) < 1e-10  # was 2.09
    cache: dict = {}
    evaluate(q, k, v, {"a": "exact"}, n_queries=8, cache=cache)
    k.data.mul_(2)  # no version bump either
    assert _mse(evaluate(q, k, v, {"a": "exact"}, n_queries=8, cache=cache)) < 1e-10  # was 14.2


def test_repeated_heads_under_gqa_read_their_own_kv_head():
    g = torch.Generator().manual_seed(1)
    q = torch.randn(1, 64, 4, 16, dtype=torch.float64, generator=g)
    k, v = (torch.randn(1, 64, 2, 16, dtype=torch.float64, generator=g) for _ in range(2))
    heads = [0, 0, 0, 1, 2, 3]
    out = recipe_attention(*select_heads(q, k, v, heads), "exact").out
    ref = _ref64(q, k, v)
    for pos, h in enumerate(heads):  # position 3 (head 1) read K/V head 1: rel error 1.53
        err = (out[:, :, pos] - ref[:, :, h]).norm() / ref[:, :, h].norm()
        assert float(err) < 1e-12, (pos, h)


def test_error_stats_refuses_same_size_other_shape_and_empty():
    x = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    with pytest.raises(ValueError, match="shapes differ"):
        error_stats(x, x.T)
    with pytest.raises(ValueError, match="empty"):
        error_stats(torch.zeros(0), torch.zeros(0))


def test_metrics_are_float64_for_tiny_huge_and_near_equal_tensors():
    s = error_stats(torch.full((1000,), 2e-25), torch.full((1000,), 1e-25))
    assert s["rel_l2"] == pytest.approx(1.0, rel=1e-6)  # was 0 (squares underflowed)
    big = torch.full((1000,), 1e20)
    s = error_stats(1.01 * big, big)
    assert s["rel_l2"] == pytest.approx(0.01, rel=1e-5)  # was NaN (squares overflowed)
    g = torch.Generator().manual_seed(2)
    x = torch.randn(2_000_000, generator=g)
    r = x + 1e-3 * torch.randn(2_000_000, generator=g)
    xd, rd = x.double(), r.double()
    true = 1 - float(xd @ rd / (xd.norm() * rd.norm()))
    assert 1 - error_stats(x, r)["cosine"] == pytest.approx(true, rel=1e-3)  # was 17% off
    o = torch.randn(1, 8, 3, 4, generator=g)
    assert all(c <= 1.0 for c in per_head(o, o)["cosine"])  # was 1.0000000000000002


def test_zero_reference_gives_minus_inf_sqnr():
    s = error_stats(torch.ones(2, 3, 4, 5), torch.zeros(2, 3, 4, 5))  # was math domain error
    assert s["sqnr_db"] == -math.inf and s["rel_l2"] == math.inf


def test_float64_exact_recipe_is_exact_at_every_boundary():
    g = torch.Generator().manual_seed(3)
    q = torch.randn(1, 130, 4, 32, dtype=torch.float64, generator=g)
    k, v = (torch.randn(1, 130, 2, 32, dtype=torch.float64, generator=g) for _ in range(2))
    ev = evaluate(q, k, v, {"e": "exact"}, n_queries=16).evals["e"]
    for b in ("quanted_q", "quanted_k", "dequanted_v", "v_mean"):
        assert ev.overall[b]["mse"] == 0.0, b  # were ~6e-16 against float32-rounded refs
    assert ev.overall["attention_output"]["mse"] < 1e-28


@pytest.mark.parametrize("factor,dtype", [(1e-50, torch.float64), (1e40, torch.float64),
                                          (1e-43, torch.float32)])
def test_fp8_scales_outside_float32_are_named(factor, dtype):
    g = torch.Generator().manual_seed(4)
    q, k, v = (torch.randn(1, 64, 1, 16, dtype=torch.float64, generator=g) for _ in range(3))
    v = (v * factor).to(dtype)
    with pytest.raises(InputError, match=r"^v \(fp8_e4m3\): largest \|value\|.*float32"):
        # was: an all-zero output (1e-50), a float64-range overflow message (1e40), or NaN codes
        # blamed on k (1e-43)
        recipe_attention(q.to(dtype), k.to(dtype), v, "fp8_dense:out_format=exact")


def test_key_chunk_does_not_move_a_reduced_accumulator():
    g = torch.Generator().manual_seed(5)
    q, k, v = (torch.randn(1, 130, 1, 16, generator=g) for _ in range(3))
    for r in ("fp8_dense:accumulation=reduced", "fp8_dense:accumulation=reduced,row_sum=p_operand",
              "fp8_dense:accumulation=reduced,accum_rounding=nearest"):
        a = recipe_attention(q, k, v, r).out
        b = recipe_attention(q, k, v, r, key_chunk=100).out  # was up to 3.9e-3 apart
        assert torch.equal(a, b), r


@pytest.mark.parametrize("scale", [float("nan"), float("inf"), -1.0, 0.0, "0.1"])
def test_bad_softmax_scale_is_named(scale):
    q = torch.randn(1, 16, 1, 8)
    for fn in (lambda: recipe_attention(q, q, q, "exact", scale=scale),
               lambda: dense_attention_f64(q, q, q, scale=scale)):
        with pytest.raises(InputError, match="^scale: "):
            fn()  # NaN / Inf were reported as an overflow of v / q and k


@pytest.mark.parametrize("chunk", [-5, 0])
def test_reference_key_chunk_is_named(chunk):
    q = torch.randn(1, 16, 1, 8)
    with pytest.raises(ValueError, match="^key_chunk: "):
        dense_attention_f64(q, q, q, key_chunk=chunk)


@pytest.mark.parametrize("kw,msg", [({"query_index": 5}, "query_index"),
                                    ({"query_index": [[1, 2]]}, "query_index"),
                                    ({"n_queries": 2.5}, "n_queries"),
                                    ({"n_queries": True}, "n_queries")])
def test_evaluate_names_bad_rows(kw, msg):
    q = torch.randn(1, 16, 1, 8)
    with pytest.raises(ValueError, match=f"^{msg}: "):  # were bare TypeErrors
        evaluate(q, q, q, {"a": "exact"}, **kw)



def test_numbers_of_other_types_are_still_taken():
    """The checks above refuse bools, fractions and non-finite values, not numpy or torch
    numbers (a review of this change: np.int64 rows, a 0-dim tensor scale, a torch step)."""
    import numpy as np

    g = torch.Generator().manual_seed(6)
    q, k, v = (torch.randn(1, 32, 1, 16, generator=g) for _ in range(3))
    c = evaluate(q, k, v, {"a": "exact"}, n_queries=np.int64(8))
    assert len(c.query_rows) == 8
    a = recipe_attention(q, k, v, "exact", scale=torch.tensor(0.125)).out
    b = recipe_attention(q, k, v, "exact", scale=0.125).out
    assert torch.equal(a, b)
    r = get_recipe("fp8_sol_kv_corrected")
    assert r.at(step=torch.tensor(1)).name.endswith("@dense_policy")
    assert r.at(step=np.int64(12), layer=3.0) is r


def test_cosine_of_tensors_with_far_apart_norms():
    g = torch.Generator().manual_seed(7)
    r = torch.randn(1_000_000, generator=g)
    x = 1e4 * r + torch.randn(1_000_000, generator=g)
    xd, rd = x.double(), r.double()
    true = float(xd @ rd / (xd.norm() * rd.norm()))
    assert error_stats(x, r)["cosine"] == pytest.approx(true, abs=1e-6)  # was 2.3e-4 off


def test_exact_fraction_is_the_whole_maps_share_of_exact_pairs():
    """It was weighted by how many sampled rows fell in each query block (a review's finding:
    0.8333 / 0.8750 / 0.8699 at 4 / 16 / 164 rows over a map whose share is 8 / 9)."""
    from workbench.synthetic import small_config, synthetic_qkv

    q, k, v = synthetic_qkv(small_config(512, heads=2))
    r = "fp8_sol_kv_corrected:sol_tau=1.5"
    full = recipe_attention(q, k, v, r, query_index=list(range(512)), return_block_map=True)
    few = recipe_attention(q, k, v, r, query_index=[0, 1, 2, 3], return_block_map=True)
    share = float(full.block_map.float().mean())
    assert 0.0 < share < 1.0
    assert full.exact_fraction == pytest.approx(share)
    assert few.exact_fraction == pytest.approx(share)

"""Causal self-attention on the reference path: decoder models replay with their mask."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from workbench.attention import dense_attention_f64, recipe_attention


def _qkv(S=200, H=4, Hkv=2, D=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, S, H, D, generator=g, dtype=torch.float64)
    k = torch.randn(1, S, Hkv, D, generator=g, dtype=torch.float64) + 1.5
    v = torch.randn(1, S, Hkv, D, generator=g, dtype=torch.float64)
    return q, k, v


def _sdpa_causal(q, k, v):
    g = q.shape[2] // k.shape[2]
    qt, kt, vt = (t.transpose(1, 2) for t in (q, k.repeat_interleave(g, 2),
                                               v.repeat_interleave(g, 2)))
    return F.scaled_dot_product_attention(qt, kt, vt, is_causal=True).transpose(1, 2)


def test_causal_reference_matches_sdpa():
    q, k, v = _qkv()
    want = _sdpa_causal(q, k, v)
    rows = torch.tensor([0, 1, 63, 64, 130, 199])
    ref, lse = dense_attention_f64(q, k, v, query_index=rows, causal=True, key_chunk=64)
    assert torch.allclose(ref, want[:, rows], atol=1e-12, rtol=0)
    assert torch.isfinite(lse).all()
    # row 0 sees only key 0: its output is v[0] exactly (per K/V head)
    assert torch.allclose(ref[0, 0], v[0, 0].repeat_interleave(2, 0), atol=1e-14)
    # the exact recipe is the same computation in the recipe path (float64 inputs stay float64)
    res = recipe_attention(q, k, v, "exact", query_index=rows, causal=True, key_chunk=64)
    assert torch.allclose(res.out, ref, atol=1e-12, rtol=0)
    # non-causal differs for every row but the last
    full, _ = dense_attention_f64(q, k, v, query_index=rows)
    assert (full - ref).abs().amax(dim=(0, 2, 3))[:-1].min() > 1e-3
    assert torch.allclose(full[:, -1], ref[:, -1], atol=1e-12)


def test_causal_fp8_error_and_smoothing_identity():
    q, k, v = (t.float() for t in _qkv(S=256))
    rows = torch.arange(0, 256, 16)
    ref, _ = dense_attention_f64(q, k, v, query_index=rows, causal=True)
    def rel(out):
        return float((out.double() - ref).pow(2).mean() / ref.pow(2).mean())

    wrong_mask = rel(recipe_attention(q, k, v, "fp8_dense", query_index=rows).out)
    for r in ("fp8_dense", "fp8_dense_kv_corrected"):
        e = rel(recipe_attention(q, k, v, r, query_index=rows, causal=True).out)
        # FP8 rounding error, far below what replaying a decoder without its mask does
        assert 1e-7 < e < 0.05 * wrong_mask, (r, e, wrong_mask)
    # the BF16 prefix rows of a dense-prefix recipe are masked too
    from workbench.layout import SegmentLayout

    lay = SegmentLayout.of([("prompt", 64), ("answer", 192)])
    res = recipe_attention(q, k, v, "fp8_dense_kv_corrected:dense_prefix=true", layout=lay,
                           query_index=rows, causal=True)
    bf = recipe_attention(q, k, v, "bf16", query_index=rows[:4], causal=True)
    assert torch.equal(res.out[:, :4], bf.out)


def test_causal_refuses_sparse_recipes():
    q, k, v = (t.float() for t in _qkv())
    with pytest.raises(ValueError, match="causal.*sparsity='sol'"):
        recipe_attention(q, k, v, "fp8_sol_kv_corrected", causal=True)

"""Bad input gets a clear error naming the tensor and the problem."""

import pytest
import torch

from workbench.attention import (
    InputError,
    SegmentLayout,
    dense_attention_f64,
    recipe_attention,
    select_heads,
)


def _qkv(S=70, H=2, D=64):
    return (torch.randn(1, S, H, D) for _ in range(3))


@pytest.mark.parametrize(
    "mutate, match",
    [
        (lambda q, k, v: (q[0], k, v), r"q: expected rank 4"),
        (lambda q, k, v: (q, k[:, :, :, :32], v), r"k and v: shapes differ"),
        (lambda q, k, v: (q, k[:, :, :, :32], v[:, :, :, :32]), r"k: head_dim 32"),
        (lambda q, k, v: (q, k.repeat(1, 1, 3, 1)[:, :, :3], v.repeat(1, 1, 3, 1)[:, :, :3]),
         r"k: 3 K/V heads do not divide"),
        (lambda q, k, v: (q.to(torch.int32), k, v), r"q: unsupported dtype torch.int32"),
        (lambda q, k, v: (q, k, v[:, :0]), r"v: empty sequence"),
        (lambda q, k, v: (q, torch.cat([k[:1], k[:1]]), torch.cat([v[:1], v[:1]])),
         r"k: batch 2 does not match"),
    ],
)
def test_shape_and_dtype_errors(mutate, match):
    q, k, v = mutate(*_qkv())
    with pytest.raises(InputError, match=match):
        recipe_attention(q, k, v, "fp8_dense")


def test_nan_is_located():
    q, k, v = _qkv()
    v[0, 5, 1, 3] = float("nan")
    with pytest.raises(InputError, match=r"v: 1 non-finite value\(s\).*\(0, 5, 1, 3\)"):
        recipe_attention(q, k, v, "fp8_dense")


def test_inf_is_located():
    q, k, v = _qkv()
    q[0, 2, 0, 0] = float("inf")
    with pytest.raises(InputError, match=r"q: 1 non-finite"):
        recipe_attention(q, k, v, "bf16")


@pytest.mark.parametrize("idx, match", [([0, 70], r"rows must lie in \[0, 70\)"),
                                        ([-1], r"min -1"), ([], r"empty"),
                                        ([[1, 2]], r"1-D"), ([0.5], r"integer rows")])
def test_query_index_errors(idx, match):
    q, k, v = _qkv()
    with pytest.raises(InputError, match=match):
        recipe_attention(q, k, v, "fp8_dense", query_index=idx)


def test_layout_must_cover_sequence():
    q, k, v = _qkv()
    with pytest.raises(ValueError, match="layout: segments sum to 60 rows but the sequence has 70"):
        recipe_attention(q, k, v, "fp8_dense", layout=SegmentLayout(text=10, video=50))


def test_select_heads_range():
    q, k, v = _qkv()
    with pytest.raises(InputError, match=r"heads: \[5\] out of range"):
        select_heads(q, k, v, [0, 5])


@pytest.mark.parametrize("dtype, big, which, name", [
    (torch.float32, 3e38, "q", "q"), (torch.float32, 3e38, "k", "k"),
    (torch.float32, 3e38, "qk", "q and k"), (torch.float64, 1e200, "qk", "q and k"),
])
def test_finite_inputs_that_overflow_the_scores_are_named(dtype, big, which, name):
    q, k, v = (t.to(dtype).abs() + 1 for t in _qkv())  # positive: q.k cannot cancel
    if "q" in which:
        q = torch.full_like(q, big)
    if "k" in which:
        k = torch.full_like(k, big)
    for recipe in ("exact", "bf16", "fp8_dense"):
        # float64 values past FP32's range: an FP8 recipe's FP32 scales are what overflow first
        if dtype == torch.float64 and recipe == "fp8_dense":
            pattern = r"^q \(fp8_e4m3\): largest .*; k \(fp8_e4m3\): largest .* float32"
        else:
            pattern = rf"^{name}: finite values up to .* overflow the attention computation"
        with pytest.raises(InputError, match=pattern):
            recipe_attention(q, k, v, recipe)
    if dtype == torch.float64:
        with pytest.raises(InputError, match=rf"^{name}: finite values"):
            dense_attention_f64(q, k, v)


def test_finite_v_whose_sums_overflow_is_named():
    q, k, v = _qkv()
    q = torch.zeros_like(q)  # uniform attention: the output sums v over all 70 keys
    v = torch.full_like(v, 3e38)
    with pytest.raises(InputError, match=r"^v: finite values up to 3e\+38 .*sums over 70 keys"):
        recipe_attention(q, k, v, "exact")
    # Large but safe values still compute (no false alarm): max |v| over 70 keys stays finite.
    out = recipe_attention(q, k, torch.full_like(v, 1e36), "exact").out
    assert torch.isfinite(out).all() and float(out.max()) == pytest.approx(1e36, rel=1e-6)

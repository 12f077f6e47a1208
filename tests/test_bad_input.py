"""Bad input gets a clear error naming the tensor and the problem."""

import pytest
import torch

from workbench.attention import InputError, SegmentLayout, recipe_attention, select_heads


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

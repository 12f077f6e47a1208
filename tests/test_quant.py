"""Quantizer emulation: E4M3 bit-exactness, scales per granularity, INT8, Hadamard."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from workbench.attention.quant import (
    E4M3_MAX,
    hadamard_matrix,
    quantize_channels,
    quantize_tokens,
    round_to_e4m3,
    round_to_e4m3_explicit,
    round_to_mantissa,
    token_scales,
)


def _bits_equal(a, b):
    return torch.equal(a.float().view(torch.int32), b.float().view(torch.int32))


def test_e4m3_explicit_matches_torch_cast_on_every_fp16_value():
    x = torch.arange(0, 2**16, dtype=torch.int32).to(torch.int16).view(torch.float16).float()
    x = x[torch.isfinite(x)]
    ref = x.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).float()
    assert _bits_equal(round_to_e4m3_explicit(x), ref)
    assert _bits_equal(round_to_e4m3(x), ref)


def test_e4m3_known_values():
    # 7.93 rounds to 8 (the interpreter's dropped carry gives 4.0); 464 saturates to 448
    x = torch.tensor([7.93, 464.0, 1e6, 2**-9, 2**-10, 3 * 2**-11, 0.0, -17.0])
    want = torch.tensor([8.0, 448.0, 448.0, 2**-9, 0.0, 2**-9, 0.0, -16.0])
    assert torch.equal(round_to_e4m3_explicit(x), want)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(-1e4, 1e4, allow_nan=False, width=32), min_size=1, max_size=64))
def test_e4m3_explicit_matches_cast_property(values):
    x = torch.tensor(values, dtype=torch.float32)
    ref = x.clamp(-E4M3_MAX, E4M3_MAX).to(torch.float8_e4m3fn).float()
    assert _bits_equal(round_to_e4m3_explicit(x), ref)


@settings(max_examples=40, deadline=None)
@given(
    S=st.integers(1, 200), H=st.integers(1, 3), block=st.sampled_from([1, 16, 64]),
    gran=st.sampled_from(["block", "token", "tensor"]), fmt=st.sampled_from(["fp8_e4m3", "int8"]),
    mag=st.floats(1e-3, 1e3),
)
def test_token_quantizer_properties(S, H, block, gran, fmt, mag):
    g = torch.Generator().manual_seed(S * 31 + H)
    x = torch.randn(1, S, H, 8, generator=g) * mag
    dq, scale = quantize_tokens(x, fmt, gran, block)
    assert dq.shape == x.shape and torch.isfinite(dq).all()
    # the largest |x| of every scale group maps to the format max, so it is reproduced closely
    qmax = 448.0 if fmt == "fp8_e4m3" else 127.0
    assert float(scale.max()) == pytest.approx(float(x.abs().max()) / qmax, rel=1e-6)
    # relative error per element is bounded by the format's half-ulp at the group's max
    rel = (dq - x).abs().max() / x.abs().max()
    bound = 2**-4 if fmt == "fp8_e4m3" else 0.5 / 127
    assert float(rel) <= bound + 1e-6
    if gran == "block":
        assert scale.shape == (1, math.ceil(S / block), H)


def test_channel_quantizer_one_scale_per_channel():
    x = torch.randn(2, 300, 3, 16) * torch.logspace(-2, 2, 16)
    dq, scale = quantize_channels(x, "fp8_e4m3")
    assert scale.shape == (2, 3, 16)
    assert torch.allclose(scale, x.abs().amax(1) / 448)
    codes = dq.double() / scale[:, None].double()
    # dequantized values sit on the scaled E4M3 grid (up to the float32 product's rounding)
    assert (codes - round_to_e4m3(codes.float()).double()).abs().max() <= 448 * 2**-22
    assert float(codes.abs().max()) == pytest.approx(448.0, rel=1e-6)


def test_zero_tile_gets_unit_scale():
    x = torch.zeros(1, 128, 1, 8)
    x[:, 64:] = 1.0
    s = token_scales(x, "fp8_e4m3", "block", 64)
    assert s[0, 0, 0] == 1.0 and s[0, 1, 0] == pytest.approx(1 / 448)


def test_hadamard_orthonormal_and_rejects_non_power_of_two():
    h = hadamard_matrix(128, dtype=torch.float64)
    assert torch.allclose(h @ h.T, torch.eye(128, dtype=torch.float64), atol=1e-12)
    with pytest.raises(ValueError, match="power-of-two head_dim"):
        hadamard_matrix(96)


def test_reduced_mantissa():
    x = torch.tensor([1 + 2**-10, 1 + 2**-3, 3.0])
    assert torch.equal(round_to_mantissa(x, 8), torch.tensor([1.0, 1 + 2**-3, 3.0]))
    assert torch.equal(round_to_mantissa(x, 23), x)


# Row sums of E4M3 values on the H200's FP8 tensor cores (A [64, K] @ ones; Triton's tl.dot with
# max_num_imprecise_acc = K and cuBLAS's fast accumulation gave the same bits;
# scripts/gpu_accumulator_probe.py, 2026-12-02): (K, large value, its position, the other
# entries' value c, measured sum). The float64 sums differ wherever c falls under the unit of
# the largest term's 13th bit.
H200_FP8_SUMS = [
    (32, 128.0, 31, 3 * 2.0**-8, 128.0),  # exact 128.363: every c dropped
    (32, 128.0, 31, 2.0**-6, 128.484375),  # c = the unit: kept
    (32, 16.0, 0, 2.0**-9, 16.060546875),  # unit 2^-9: exact
    (64, 128.0, 0, 2.0**-7, 128.0),  # the accumulator (128) drops the next step's c
    (64, 128.0, 63, 2.0**-9, 128.0625),  # first step's 32 c kept, second step's 31 dropped
    (64, 128.0, 63, 3 * 2.0**-8, 128.375),
    (128, 128.0, 127, 2.0**-8, 128.375),
    (128, 128.0, 127, 3 * 2.0**-8, 129.125),
    (128, 128.0, 0, 2.0**-6, 129.984375),
    (128, 0.0, None, 2.0**-9, 0.25),
]


@pytest.mark.parametrize("K,big,at,c,measured", H200_FP8_SUMS)
def test_mma_step_truncating_reproduces_the_h200_sums(K, big, at, c, measured):
    from workbench.attention.quant import mma_sum_truncating

    a = torch.full((1, K), c)
    if at is not None:
        a[0, at] = big
    a = a.to(torch.float8_e4m3fn).float()
    ones = torch.ones(K, 1)
    nearest = torch.zeros(1, 1)
    for s in range(0, K, 32):
        nearest = round_to_mantissa(nearest + a[:, s : s + 32] @ ones[s : s + 32], 13)
    assert float(mma_sum_truncating(a, ones, 13)) == measured
    exact = float(a.double().sum())
    if exact != measured:  # the round-to-nearest model keeps what the tensor cores drop
        assert abs(float(nearest) - exact) < abs(measured - exact)


def test_mma_step_truncating_drifts_down_and_keeps_shapes():
    from workbench.attention.quant import mma_sum_truncating

    g = torch.Generator().manual_seed(0)
    p = torch.exp2(-12 * torch.rand(2, 3, 40, 256, generator=g)).to(torch.float8_e4m3fn).float()
    v = torch.randn(2, 3, 256, 8, generator=g).abs()
    acc = mma_sum_truncating(p, v, 13)
    chunked = mma_sum_truncating(p, v, 13, max_elements=1000)  # row chunks: the same bits
    assert acc.shape == (2, 3, 40, 8)
    exact = p.double() @ v.double()
    assert torch.equal(acc, chunked)
    assert float((acc.double() - exact).max()) <= 0  # every cut is toward zero (positive terms)
    assert float((acc.double() - exact).min()) < 0


def test_mma_step_truncating_matches_the_h200_on_random_sums():
    """The random rows of scripts/gpu_accumulator_probe.py (generated on the CPU, seed 0): on the
    H200 (2026-12-02) Triton's and cuBLAS's sums equalled the model's in every row; their
    relative error had mean -3.659242e-05 and 1687 of the 8192 rows were inexact."""
    from workbench.attention.quant import mma_sum_truncating

    g = torch.Generator().manual_seed(0)
    a = torch.exp2(-12 * torch.rand(8192, 256, generator=g)).to(torch.float8_e4m3fn).float()
    acc = mma_sum_truncating(a, torch.ones(256, 1), 13)
    exact = a.double().sum(1)
    r = (acc[:, 0].double() - exact) / exact
    assert int((r != 0).sum()) == 1687
    assert float(r.mean()) == pytest.approx(-3.659242e-05, rel=1e-6)

"""CPU tests of the FP8 attention kernels in Triton's interpreter (TRITON_INTERPRET=1).

Each kernel is compared with its torch twin (workbench.attention) and with float64. The kernels
round onto the E4M3 / BF16 grids with explicit bit arithmetic before every cast (e4m3.py), because
the interpreter mis-rounds the fp8 cast and truncates the bf16 cast; so the same code is checked
here
and on the GPU. On a machine with CUDA these tests skip (the GPU tests cover the compiled kernels,
and the interpreter flag must not leak into them).
"""

from __future__ import annotations

import math
import os

import pytest
import torch

if torch.cuda.is_available():
    pytest.skip("CUDA present: tests/test_kernels_gpu.py covers the kernels",
                allow_module_level=True)
os.environ.setdefault("TRITON_INTERPRET", "1")
triton = pytest.importorskip("triton")
import triton.language as tl  # noqa: E402

from workbench.attention import (  # noqa: E402
    SegmentLayout,
    dense_attention_f64,
    recipe_attention,
)
from workbench.attention.quant import round_to_e4m3 as torch_round_e4m3  # noqa: E402
from workbench.kernels import dispatch  # noqa: E402
from workbench.kernels.attention_fp8 import fp8_attention_fwd  # noqa: E402
from workbench.kernels.config import DEFAULT, AttentionConfig, QuantConfig  # noqa: E402
from workbench.kernels.e4m3 import interpreting, round_to_bf16, round_to_e4m3  # noqa: E402
from workbench.kernels.kv_stats import kv_stats  # noqa: E402
from workbench.kernels.merge import merge_output  # noqa: E402
from workbench.kernels.quantize import quantize_qkv, v8t_in_token_order  # noqa: E402

if not interpreting():
    pytest.skip("triton kernels were imported without TRITON_INTERPRET=1", allow_module_level=True)

RECIPES = ["fp8_dense", "fp8_dense_k", "fp8_dense_kv_corrected"]
# 64-key tiles (one K scale per tile): the interpreter runs them fastest; the production 128-key
# tiles (two folded K scales) are covered where the test says so
SMALL = DEFAULT.with_attention(block_n=64)
PROD = DEFAULT


def biased_qkv(B=1, S=200, H=2, Hkv=2, D=64, seed=0):
    """bf16 q/k/v [B, S, H, D] with per-channel biases on K and V (what smoothing targets)."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, S, H, D, generator=g)
    k = torch.randn(B, S, Hkv, D, generator=g) + 3 * torch.randn(Hkv, D, generator=g)
    v = torch.randn(B, S, Hkv, D, generator=g) + 2 * torch.randn(Hkv, D, generator=g)
    return q.bfloat16(), k.bfloat16(), v.bfloat16()


def rel_l2(x, ref):
    return float((x.double() - ref).norm() / ref.norm())


@triton.jit
def _round_kernel(X, Y, Z, n, BLOCK: tl.constexpr):
    o = tl.arange(0, BLOCK)
    m = o < n
    x = tl.load(X + o, mask=m)
    tl.store(Y + o, round_to_e4m3(x).to(tl.float8e4nv), mask=m)
    tl.store(Z + o, round_to_bf16(x), mask=m)


def test_explicit_roundings_match_torch_bitwise():
    g = torch.Generator().manual_seed(1)
    x = torch.cat([
        torch.randn(3000, generator=g) * torch.exp(3 * torch.randn(3000, generator=g)),
        torch.rand(1000, generator=g) * 0.03,  # E4M3 subnormal range
        torch.tensor([0.0, -0.0, 448.0, 460.0, 1e6, -1e6, 7.93, 2.0**-10, 3 * 2.0**-10]),
    ])
    y = torch.empty(x.numel(), dtype=torch.float8_e4m3fn)
    z = torch.empty_like(x)
    _round_kernel[(1,)](x, y, z, x.numel(), BLOCK=8192)
    assert torch.equal(y.float(), torch_round_e4m3(x))
    assert torch.equal(z, x.to(torch.bfloat16).float())


@pytest.mark.parametrize("S", [64, 300, 1100])  # 1100: a full 1024-token chunk + a partial one
def test_kv_stats_match_torch_and_are_deterministic(S):
    _, k, v = biased_qkv(B=2, S=S)
    a = kv_stats(k, v, smooth_k=True, smooth_v=True)
    b = kv_stats(k, v, smooth_k=True, smooth_v=True)
    mu_k, mu_v = k.float().mean(1), v.float().mean(1)
    torch.testing.assert_close(a.mu_k, mu_k, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(a.mu_v, mu_v, rtol=1e-6, atol=1e-6)
    amax = (v.float() - a.mu_v[:, None]).abs().amax(1)
    assert torch.equal(a.v_amax, amax)  # exact: max/min trick is exact given mu
    for x, y in zip((a.mu_k, a.mu_v, a.v_amax), (b.mu_k, b.mu_v, b.v_amax)):
        assert torch.equal(x, y)
    plain = kv_stats(k, v, smooth_k=False, smooth_v=False)
    assert not plain.mu_k.any() and torch.equal(plain.v_amax, v.float().abs().amax(1))


@pytest.mark.parametrize("name", RECIPES)
def test_quantized_operands_equal_the_emulation(name):
    q, k, v = biased_qkv(B=1, S=150, H=4, Hkv=2)
    emu = recipe_attention(q, k, v, name)
    r = emu.recipe
    st = kv_stats(k, v, smooth_k=r.smooth_k, smooth_v=r.smooth_v)
    qq = quantize_qkv(q, k, v, st.mu_k, st.mu_v, st.v_amax, smooth_k=r.smooth_k,
                      smooth_v=r.smooth_v, v_bias_correction=r.v_bias_correction)
    S = 150
    sq = qq.q_scale.repeat_interleave(64, 2)[..., None]
    sk = qq.k_scale.repeat_interleave(64, 2)[..., None]
    q_dq = (qq.q8.float() * sq)[:, :, :S].transpose(1, 2)
    k_dq = (qq.k8.float() * sk)[:, :, :S].transpose(1, 2) + emu.mu_k[:, None]
    v8t = v8t_in_token_order(qq)
    v_dq = (v8t.float()[..., :S].transpose(2, 3) * qq.v_scale[:, :, None]).transpose(1, 2)
    assert torch.equal(q_dq, emu.q_dq)
    assert torch.equal(k_dq, emu.k_dq)
    torch.testing.assert_close(v_dq + qq.v_corr[:, None], emu.v_dq, rtol=0, atol=1e-5)
    torch.testing.assert_close(qq.v_corr, emu.v_corr, rtol=1e-5, atol=1e-6)
    # pad tokens are exact zeros so the attention main loop needs no load masks
    assert not qq.k8[:, :, S:].float().any() and not v8t[..., S:].float().any()
    if r.v_bias_correction:  # the correction restores V's token mean
        eff_mean = (v_dq + qq.v_corr[:, None]).mean(1)
        torch.testing.assert_close(eff_mean, v.float().mean(1), rtol=0, atol=1e-5)


@pytest.mark.parametrize("rows", [32, 128, 256])
def test_v_tile_sizes_give_the_same_codes(rows):
    """Every V-pass tile size writes the codes of the default one; v_corr's FP32 sum may run in
    another (fixed) order."""
    q, k, v = biased_qkv(B=1, S=300, H=2)
    st = kv_stats(k, v, smooth_k=True, smooth_v=True)
    args = (q, k, v, st.mu_k, st.mu_v, st.v_amax)
    kw = dict(smooth_k=True, smooth_v=True, v_bias_correction=True)
    a = quantize_qkv(*args, **kw)
    b = quantize_qkv(*args, **kw, config=QuantConfig(v_rows=rows, v_warps=4 if rows < 256 else 8))
    assert torch.equal(a.v8t.view(torch.uint8), b.v8t.view(torch.uint8))
    torch.testing.assert_close(a.v_corr, b.v_corr, rtol=1e-6, atol=1e-7)


def test_single_tile_attention_equals_torch_of_the_same_operands():
    """One key tile: running max = final max, so the kernel must match the twin to BF16 rounding."""
    q, k, v = biased_qkv(B=2, S=100)
    emu = recipe_attention(q, k, v, "fp8_dense_kv_corrected")
    out = dispatch.fp8_recipe_attention(q, k, v, "fp8_dense_kv_corrected", config=PROD)
    diff = (out.float() - emu.out).abs()
    ulp = emu.out.abs().clamp(min=1e-3) * 2.0**-7
    assert bool((diff <= ulp).all()), float(diff.max())
    assert float((diff > 0).float().mean()) < 0.01


@pytest.mark.parametrize("name", RECIPES)
def test_attention_error_within_tolerance_of_emulation(name):
    """Tolerance rule: kernel rel-L2 vs float64 <= 1.25x the torch emulation's (partial tile)."""
    q, k, v = biased_qkv(B=1, S=200, H=2, D=64, seed=3)
    ref, ref_lse = dense_attention_f64(q, k, v)
    emu = recipe_attention(q, k, v, name)
    out, lse = dispatch.fp8_recipe_attention(q, k, v, name, config=SMALL, return_lse=True)
    assert out.dtype == torch.bfloat16 and out.shape == q.shape
    assert rel_l2(out, ref) <= 1.25 * rel_l2(emu.out, ref)
    torch.testing.assert_close(lse.transpose(1, 2), emu.lse, rtol=0, atol=2e-2)
    lse_err = float((lse.transpose(1, 2).double() - ref_lse).abs().mean())
    assert lse_err <= 1.25 * float((emu.lse.double() - ref_lse).abs().mean()) + 1e-3


def test_smoothing_beats_unsmoothed_on_biased_inputs():
    q, k, v = biased_qkv(B=1, S=256, H=2, D=64, seed=5)
    ref, _ = dense_attention_f64(q, k, v)
    errs = {n: rel_l2(dispatch.fp8_recipe_attention(q, k, v, n, config=SMALL), ref)
            for n in RECIPES}
    assert errs["fp8_dense_kv_corrected"] < errs["fp8_dense"], errs


def test_poisoned_output_is_fully_written_and_row_start_is_respected():
    q, k, v = biased_qkv(B=1, S=130, H=2)
    r = dispatch.get_recipe("fp8_dense_k")
    st = kv_stats(k, v, smooth_k=True, smooth_v=False)
    qq = quantize_qkv(q, k, v, st.mu_k, st.mu_v, st.v_amax, smooth_k=True, smooth_v=False,
                      v_bias_correction=r.v_bias_correction)
    out = torch.full_like(q, float("nan"))
    fp8_attention_fwd(qq, num_heads=2, scale=1 / math.sqrt(64), out=out, config=SMALL.attention)
    assert not out.isnan().any()
    out2 = torch.full_like(q, float("nan"))
    fp8_attention_fwd(qq, num_heads=2, scale=1 / math.sqrt(64), out=out2, row_start=10,
                      config=SMALL.attention)
    assert out2[:, :10].isnan().all() and torch.equal(out2[:, 10:], out[:, 10:])


def test_merged_output_pass_is_bitwise_concat():
    q, k, v = biased_qkv(B=1, S=140, H=4, Hkv=2)
    st = kv_stats(k, v, smooth_k=True, smooth_v=True)
    qq = quantize_qkv(q, k, v, st.mu_k, st.mu_v, st.v_amax, smooth_k=True, smooth_v=True,
                      v_bias_correction=True)
    of, _ = fp8_attention_fwd(qq, num_heads=4, scale=1 / 8, out_f32=True,
                              config=SMALL.attention)
    prefix = torch.randn(1, 37, 4, 64).bfloat16()
    merged = merge_output(of, qq.v_corr, prefix)
    corr = qq.v_corr.repeat_interleave(2, dim=1)[:, None]
    expect = torch.cat([prefix, (of[:, 37:] + corr).to(torch.bfloat16)], dim=1)
    assert torch.equal(merged, expect)
    # the fused epilogue writes the same bits as the separate pass
    fused, _ = fp8_attention_fwd(qq, num_heads=4, scale=1 / 8, config=SMALL.attention)
    assert torch.equal(fused[:, 37:], merged[:, 37:])


def test_dense_prefix_rows_come_from_bf16_attention():
    q, k, v = biased_qkv(B=1, S=160, H=2)
    layout = SegmentLayout(text=5, audio=20, video=135)
    rec = dispatch.get_recipe("fp8_dense_kv_corrected:dense_prefix=true")
    out = dispatch.fp8_recipe_attention(q, k, v, rec, layout=layout, config=SMALL)
    plain = dispatch.fp8_recipe_attention(q, k, v, "fp8_dense_kv_corrected", config=SMALL)
    assert torch.equal(out[:, 25:], plain[:, 25:])
    pre = dispatch.dense_prefix_rows(q, k, v, 25, 1 / 8)
    assert torch.equal(out[:, :25], pre)
    emu = recipe_attention(q, k, v, rec, layout=layout)
    ref, _ = dense_attention_f64(q, k, v, query_index=torch.arange(25))
    assert rel_l2(out[:, :25], ref) < 1e-2 and rel_l2(emu.out[:, :25], ref) < 1e-2


def test_tma_descriptor_path_matches_pointer_path():
    q, k, v = biased_qkv(B=1, S=140, H=2)
    a = dispatch.fp8_recipe_attention(q, k, v, "fp8_dense",
                                      config=SMALL.with_attention(use_tma=False))
    b = dispatch.fp8_recipe_attention(q, k, v, "fp8_dense", config=SMALL)
    assert torch.equal(a, b)


@pytest.mark.parametrize("S", [40, 100, 300])
def test_fma_flush_equals_the_triton_flush(S):
    """flush="fma" (fresh P @ V accumulator + FMA) does the same FP32 arithmetic in the same order
    as the triton flush, so in the interpreter (exact FP32 dots) the two agree bitwise; S = 40 has
    no full key tile, 100 one, 300 four plus a partial one."""
    q, k, v = biased_qkv(B=1, S=S, H=2, seed=S)
    name = "fp8_dense_kv_corrected"
    a, la = dispatch.fp8_recipe_attention(q, k, v, name, return_lse=True,
                                          config=SMALL.with_attention(flush="triton"))
    b, lb = dispatch.fp8_recipe_attention(q, k, v, name, return_lse=True, config=SMALL)
    assert torch.equal(a, b) and torch.equal(la, lb)
    with pytest.raises(ValueError, match="flush"):
        AttentionConfig(flush="fast")
    with pytest.raises(ValueError, match="max_imprecise=32"):
        AttentionConfig(flush="fma", block_n=64, max_imprecise=32)
    q, k, v = biased_qkv(B=1, S=64, H=1, Hkv=1, D=128)
    with pytest.raises(ValueError, match="head_dim=128"):  # the head dim is known at launch
        dispatch.fp8_recipe_attention(q, k, v, "fp8_dense", config=SMALL.with_attention(
            max_imprecise=64))


def test_dispatch_support_rules():
    q, k, v = biased_qkv(S=64)
    assert dispatch.unsupported_reason(q, k, v, dispatch.get_recipe("fp8_dense")) is None
    assert dispatch.unsupported_reason(q, k, v, dispatch.get_recipe("fp8_sol_k")) is None
    assert "sol_block" in dispatch.unsupported_reason(
        q, k, v, dispatch.get_recipe("fp8_sol_k:sol_block=32"))
    assert dispatch.unsupported_reason(q, k, v, dispatch.get_recipe("bf16")) is not None
    assert dispatch.unsupported_reason(q.float(), k.float(), v.float(),
                                       dispatch.get_recipe("fp8_dense")) is not None
    assert dispatch.try_kernel(q, k, v, "fp8_dense") is None  # CPU tensors: reference path
    with pytest.raises(ValueError, match="vsa_tile"):
        dispatch.fp8_recipe_attention(q, k, v, "fp8_dense:sparsity=vsa,vsa_tile=128")
    for p_scaling in ("exp2_offset8", "rowmax448"):
        rec = dispatch.get_recipe(f"fp8_dense:p_scaling={p_scaling}")
        assert dispatch.unsupported_reason(q, k, v, rec) is None
    with pytest.raises(ValueError, match="p_scaling"):
        fp8_attention_fwd(None, num_heads=1, scale=1.0, p_scaling="rowmax")


def test_former_tuning_keywords_still_work_with_a_deprecation_warning():
    q, k, v = biased_qkv(S=70)
    with pytest.warns(DeprecationWarning, match="config="):
        a = dispatch.fp8_recipe_attention(q, k, v, "fp8_dense", block_n=64)
    assert torch.equal(a, dispatch.fp8_recipe_attention(q, k, v, "fp8_dense", config=SMALL))
    with pytest.warns(DeprecationWarning, match="TUNING"):
        assert dispatch.TUNING["block_m"] == DEFAULT.attention.block_m
    with pytest.raises(TypeError, match="lazy_tau"), pytest.warns(DeprecationWarning):
        # a removed option is refused by name
        dispatch.fp8_recipe_attention(q, k, v, "fp8_dense", lazy_tau=8.0)


@pytest.mark.parametrize("S", [100, 300])
def test_folded_k_scales_match_the_emulation(S):
    """128-key tiles (the production tiling: two K scales per tile folded into per-half row maxes
    and the exponent's FMA) within the emulation tolerance, on one tile (S = 100: then within
    BF16 rounding of the twin) and on two full tiles plus a partial one; and the 64-key tiles
    (one K scale, no folding) agree with them up to the recipe's own error."""
    q, k, v = biased_qkv(B=1, S=S, H=2, D=64, seed=S + 1)
    ref, _ = dense_attention_f64(q, k, v)
    emu = recipe_attention(q, k, v, "fp8_dense_kv_corrected")
    b = dispatch.fp8_recipe_attention(q, k, v, "fp8_dense_kv_corrected", config=PROD)
    a = dispatch.fp8_recipe_attention(q, k, v, "fp8_dense_kv_corrected", config=SMALL)
    assert rel_l2(b, ref) <= 1.25 * rel_l2(emu.out, ref)
    assert rel_l2(b, a.double()) < 0.5 * rel_l2(emu.out, ref)
    if S <= 128:
        ulp = emu.out.abs().clamp(min=1e-3) * 2.0**-7
        assert bool(((b.float() - emu.out).abs() <= ulp).all())


def test_grid_order_and_loop_form_give_the_same_bits():
    """The other grid order of the stats / quant passes and the stats loop not unrolled: the same
    codes, scales, statistics and correction, bit for bit."""
    q, k, v = biased_qkv(B=2, S=300, H=4, Hkv=2)
    st = kv_stats(k, v, smooth_k=True, smooth_v=True)
    kw = dict(smooth_k=True, smooth_v=True, v_bias_correction=True)
    a = quantize_qkv(q, k, v, st.mu_k, st.mu_v, st.v_amax, **kw)
    other = DEFAULT.with_stats(heads_first=False, unroll=1).with_quant(heads_first=False)
    st2 = kv_stats(k, v, smooth_k=True, smooth_v=True, config=other.stats)
    for x, y in zip((st.mu_k, st.mu_v, st.v_amax), (st2.mu_k, st2.mu_v, st2.v_amax)):
        assert torch.equal(x, y)
    b = quantize_qkv(q, k, v, st.mu_k, st.mu_v, st.v_amax, **kw, config=other.quant)
    for name in ("q8", "k8", "v8t"):
        assert torch.equal(getattr(a, name).view(torch.uint8), getattr(b, name).view(torch.uint8))
    for name in ("q_scale", "k_scale", "v_scale", "v_corr"):
        assert torch.equal(getattr(a, name), getattr(b, name))


def test_permuted_v_and_p_operand_give_the_attention_of_token_order():
    """QuantConfig.v_perm stores each 32-token group of V^T in P's register order and the kernel
    permutes P the same way (PERM_P): the same attention as the token order, up to FP32 summation
    order, on a partial last group (S = 300); the stored columns are a permutation within each
    group."""
    from workbench.kernels import quantize as qz

    q, k, v = biased_qkv(B=1, S=300, H=2, D=64, seed=4)
    a = dispatch.fp8_recipe_attention(q, k, v, "fp8_dense_kv_corrected", config=PROD)
    b = dispatch.fp8_recipe_attention(q, k, v, "fp8_dense_kv_corrected",
                                      config=PROD.with_quant(v_perm=False))
    diff = (a.float() - b.float()).abs()
    assert float(diff.max()) <= float(b.float().abs().max()) * 2.0**-7  # BF16 rounding only
    order = qz.v_token_order(512, True)
    assert sorted(order.tolist()) == list(range(512))
    assert bool(((order // 32) == (torch.arange(512) // 32)).all())
    # lane 0's A-operand keys 0-3 and 16-19 = its accumulator columns 0, 1, 8, 9, 16, 17, 24, 25
    assert order[:4].tolist() + order[16:20].tolist() == [0, 1, 8, 9, 16, 17, 24, 25]


def test_p_scaling_matches_the_emulation_where_unit_loses_accuracy():
    """Each P scaling in the kernel (a constant offset in the exponent) against its torch
    emulation, on rows whose mass sits in many P values near 2^-10.5 (E4M3 subnormals for the
    unit P) and an unsmoothed V bias: kernel error <= 1.25x the emulation's, LSE unchanged by the
    scale; the unit P's error is over 2.5x the scaled ones', so a kernel that ignored the scaling
    fails the first check. 64-key tiles, and 128-key tiles (folded K scales) for one scaling."""
    from workbench.bench.inputs import sink_inputs

    q, k, v = sink_inputs(1, 256, 2, 64)
    ref, _ = dense_attention_f64(q, k, v)
    errs = {}
    for p_scaling, cfg in [("unit", SMALL), ("exp2_offset8", SMALL), ("rowmax448", SMALL),
                           ("exp2_offset8", PROD)]:
        name = f"fp8_dense_k:p_scaling={p_scaling}"
        emu = recipe_attention(q, k, v, name)
        out, lse = dispatch.fp8_recipe_attention(q, k, v, name, config=cfg, return_lse=True)
        e_kernel, e_emu = rel_l2(out, ref), rel_l2(emu.out, ref)
        assert e_kernel <= 1.25 * e_emu, (p_scaling, e_kernel, e_emu)
        torch.testing.assert_close(lse.transpose(1, 2), emu.lse, rtol=0, atol=2e-2)
        errs[p_scaling] = (e_kernel, e_emu)
    for p_scaling in ("exp2_offset8", "rowmax448"):
        assert errs["unit"][0] > 2.5 * errs[p_scaling][1], errs


def test_row_sum_of_the_p_operand_matches_the_emulation():
    """row_sum="p_operand" (l = the sum of the E4M3 P that P @ V takes, with P @ V's
    accumulation) in the kernel against its emulation on sink-dominated rows: within 1.25x of
    the emulation, and what the emulation says about the choice: with an unsmoothed V bias the
    shared weights beat the FP32 row sum (2.3x here), with smoothed V and the unit P they lose
    the mass of the P values that round to zero (2x worse), with the scaled P they are level
    (within 5%). The FP8 sparse recipes take it too (tests/test_kernels_sparse.py); the BF16
    sparse baselines keep the FP32 row sum: the dispatch names why."""
    from workbench.bench.inputs import sink_inputs

    q, k, v = sink_inputs(1, 256, 2, 64)
    ref, _ = dense_attention_f64(q, k, v)

    def err(name, kernel=False):
        if kernel:
            return rel_l2(dispatch.fp8_recipe_attention(q, k, v, name, config=SMALL), ref)
        return rel_l2(recipe_attention(q, k, v, name).out, ref)

    scaled = "fp8_dense_kv_corrected:p_scaling=exp2_offset8"
    for name in ("fp8_dense_k:row_sum=p_operand", scaled + ",row_sum=p_operand"):
        assert err(name, kernel=True) <= 1.25 * err(name), name
    assert err("fp8_dense_k") > 2 * err("fp8_dense_k:row_sum=p_operand")
    assert err("fp8_dense_kv_corrected:row_sum=p_operand") > 1.5 * err("fp8_dense_kv_corrected")
    assert err(scaled + ",row_sum=p_operand") <= 1.05 * err(scaled)
    dense = dispatch.get_recipe(scaled + ",row_sum=p_operand")
    assert dispatch.unsupported_reason(q, k, v, dense) is None
    r = dispatch.get_recipe("fp8_sol_kv_corrected:row_sum=p_operand")
    assert dispatch.unsupported_reason(q, k, v, r) is None
    r = dispatch.get_recipe("bf16:sparsity=sol,row_sum=p_operand")
    assert "row_sum" in dispatch.unsupported_reason(q.bfloat16(), k.bfloat16(), v.bfloat16(), r)


def test_log_linear_p_matches_its_emulation():
    """p_exp="log_linear" (P's E4M3 code by one FMA, no exponential) in the Triton kernel against
    its emulation on rows whose error is mostly P's rounding (sink-dominated, 64- and 128-key
    tiles): within 1.25x of the emulation's error against float64, and the flag moves the
    kernel's output about as far as it moves the emulation's (a kernel that ignored it would not
    move). The LSE within 3e-2: the kernel's codes are of the running max's grid, the
    emulation's of the final max's, and a code's error depends on where its score falls between
    two codes (measured 2.3e-2 here, 1.6e-2 with exp2)."""
    from workbench.bench.inputs import sink_inputs

    q, k, v = sink_inputs(1, 256, 2, 64)
    ref, _ = dense_attention_f64(q, k, v)
    base = "fp8_dense_kv_corrected:p_scaling=exp2_offset8,row_sum=p_operand"
    emu_x = recipe_attention(q, k, v, base)
    emu = recipe_attention(q, k, v, base + ",p_exp=log_linear")
    moved_emu = rel_l2(emu.out, emu_x.out.double())
    for cfg in (SMALL, PROD):
        out, lse = dispatch.fp8_recipe_attention(q, k, v, base + ",p_exp=log_linear",
                                                 config=cfg, return_lse=True)
        out_x = dispatch.fp8_recipe_attention(q, k, v, base, config=cfg)
        e_k, e_e = rel_l2(out, ref), rel_l2(emu.out, ref)
        moved = rel_l2(out, out_x.double())
        print(f"log_linear block_n {cfg.attention.block_n}: kernel {e_k:.4e} emulation {e_e:.4e}"
              f"; moved by the flag {moved:.3e} (emulation {moved_emu:.3e})")
        assert e_k <= 1.25 * e_e, (e_k, e_e)
        assert 0.5 * moved_emu < moved < 2 * moved_emu, (moved, moved_emu)
        torch.testing.assert_close(lse.transpose(1, 2), emu.lse, rtol=0, atol=3e-2)


def test_log_linear_p_refused_where_its_codes_do_not_apply():
    """The kernel wrapper refuses p_exp="log_linear" without the scaled P and the operand row
    sum (its codes are of 2^(s - m + 8) and the row sum must take them), naming both."""
    q, k, v = biased_qkv(S=128, D=64)
    st = kv_stats(k, v, smooth_k=True, smooth_v=True)
    qq = quantize_qkv(q, k, v, st.mu_k, st.mu_v, st.v_amax, smooth_k=True, smooth_v=True,
                      v_bias_correction=True)
    for p_scaling, row_sum in (("unit", "p_operand"), ("exp2_offset8", "p_fp32")):
        with pytest.raises(ValueError, match="p_exp='log_linear' needs p_scaling='exp2_offset8'"):
            fp8_attention_fwd(qq, num_heads=2, scale=0.125, p_scaling=p_scaling, row_sum=row_sum,
                              p_exp="log_linear", config=SMALL.attention)
    with pytest.raises(ValueError, match="p_exp: 'exp3'"):
        fp8_attention_fwd(qq, num_heads=2, scale=0.125, p_exp="exp3", config=SMALL.attention)

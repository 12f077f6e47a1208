"""GPU tests of the FP8 attention kernels (compiled Triton on Hopper): skip without CUDA/sm_90.

Tolerance rule (DESIGN.md section 5): on fresh inputs with per-channel K/V biases, the kernel's
relative L2 error against float64 must be <= 1.25x the error of the torch emulation of the same
recipe (workbench.attention.recipe_attention). The kernel's online softmax rounds P against the
running max while the emulation uses the final max, so errors are compared, not bits.
"""

from __future__ import annotations

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9,
        reason="needs a Hopper (sm_90+) CUDA GPU",
    ),
]

RECIPES = ["fp8_dense", "fp8_dense_k", "fp8_dense_kv_corrected"]


def biased_qkv(B, S, H, Hkv, D, seed):
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(B, S, H, D, device="cuda", generator=g)
    k = torch.randn(B, S, Hkv, D, device="cuda", generator=g)
    v = torch.randn(B, S, Hkv, D, device="cuda", generator=g)
    k += 3 * torch.randn(Hkv, D, device="cuda", generator=g)
    v += 2 * torch.randn(Hkv, D, device="cuda", generator=g)
    return q.bfloat16(), k.bfloat16(), v.bfloat16()


def rel_l2(x, ref):
    return float((x.double() - ref).norm() / ref.norm())


@pytest.mark.parametrize("name", RECIPES)
@pytest.mark.parametrize("shape", [(1, 4111, 4, 4, 128), (2, 1000, 4, 2, 64), (1, 2048, 2, 2, 128)])
def test_kernel_error_within_125_percent_of_emulation(name, shape):
    from workbench.attention import dense_attention_f64, evenly_spaced_rows, recipe_attention
    from workbench.kernels.dispatch import fp8_recipe_attention

    B, S, H, Hkv, D = shape
    q, k, v = biased_qkv(B, S, H, Hkv, D, seed=S + D)
    idx = evenly_spaced_rows(S, 256).cuda()
    ref, _ = dense_attention_f64(q, k, v, query_index=idx)
    emu = recipe_attention(q, k, v, name, query_index=idx)
    out = fp8_recipe_attention(q, k, v, name)
    assert out.shape == q.shape and out.dtype == torch.bfloat16 and out.isfinite().all()
    e_k, e_e = rel_l2(out[:, idx], ref), rel_l2(emu.out, ref)
    assert e_k <= 1.25 * e_e, (e_k, e_e)


def test_smoothing_beats_unsmoothed_and_runner_uses_kernel():
    from workbench.attention import dense_attention_f64, evenly_spaced_rows
    from workbench.attention.runner import run_attention

    q, k, v = biased_qkv(1, 3000, 4, 4, 128, seed=7)
    idx = evenly_spaced_rows(3000, 256).cuda()
    ref, _ = dense_attention_f64(q, k, v, query_index=idx)
    e = {n: rel_l2(run_attention(q, k, v, n, backend="kernel")[:, idx], ref) for n in RECIPES}
    assert e["fp8_dense_kv_corrected"] < e["fp8_dense"], e
    assert e["fp8_dense_k"] < e["fp8_dense"], e


def test_stats_kernel_is_bitwise_deterministic_and_exact_enough():
    from workbench.kernels.kv_stats import kv_stats

    _, k, v = biased_qkv(1, 32626, 8, 8, 128, seed=1)
    runs = [kv_stats(k, v, smooth_k=True, smooth_v=True) for _ in range(3)]
    for r in runs[1:]:
        assert torch.equal(r.mu_k, runs[0].mu_k) and torch.equal(r.mu_v, runs[0].mu_v)
        assert torch.equal(r.v_amax, runs[0].v_amax)
    torch.testing.assert_close(runs[0].mu_k, k.double().mean(1).float(), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(runs[0].mu_v, v.double().mean(1).float(), rtol=1e-5, atol=1e-5)


def test_quantized_operands_match_emulation_bitwise():
    from workbench.attention import recipe_attention
    from workbench.kernels import quantize as qz
    from workbench.kernels.kv_stats import kv_stats
    from workbench.kernels.quantize import quantize_qkv

    q, k, v = biased_qkv(1, 1000, 4, 4, 128, seed=3)
    emu = recipe_attention(q, k, v, "fp8_dense_kv_corrected", query_index=torch.arange(1000))
    st = kv_stats(k, v, smooth_k=True, smooth_v=True)
    mu_k = emu.mu_k  # same mu for a bitwise comparison of the quantizer itself
    qq = quantize_qkv(q, k, v, mu_k, emu.mu_v, (v.float() - emu.mu_v[:, None]).abs().amax(1),
                      smooth_k=True, smooth_v=True, v_bias_correction=True)
    sk = qq.k_scale.repeat_interleave(64, 2)[..., None]
    k_dq = (qq.k8.float() * sk)[:, :, :1000].transpose(1, 2) + mu_k[:, None]
    sq = qq.q_scale.repeat_interleave(64, 2)[..., None]
    q_dq = (qq.q8.float() * sq)[:, :, :1000].transpose(1, 2)
    # Bitwise: the kernel forms the Q/K scale as torch's CUDA `amax / 448.0` does (a multiply by
    # fl(1/448), see quantize._quant_tokens_kernel) and divides x / scale with IEEE div_rn.
    assert torch.equal(k_dq, emu.k_dq)
    assert torch.equal(q_dq, emu.q_dq)
    v8t = qz.v8t_in_token_order(qq)
    v_op = (v8t.float() * qq.v_scale[..., None])[..., :1000].permute(0, 3, 1, 2)
    assert torch.equal(v_op + emu.v_corr[:, None], emu.v_dq)  # V codes and channel scales
    torch.testing.assert_close(st.mu_v, emu.mu_v, rtol=1e-5, atol=1e-5)


def test_poisoned_output_overwritten_and_merge_bitwise():
    from workbench.kernels.attention_fp8 import fp8_attention_fwd
    from workbench.kernels.kv_stats import kv_stats
    from workbench.kernels.merge import merge_output
    from workbench.kernels.quantize import quantize_qkv

    q, k, v = biased_qkv(1, 1234, 4, 2, 128, seed=9)
    st = kv_stats(k, v, smooth_k=True, smooth_v=True)
    qq = quantize_qkv(q, k, v, st.mu_k, st.mu_v, st.v_amax, smooth_k=True, smooth_v=True,
                      v_bias_correction=True)
    out = torch.full_like(q, float("nan"))
    fp8_attention_fwd(qq, num_heads=4, scale=128**-0.5, out=out)
    assert not out.isnan().any()
    of, _ = fp8_attention_fwd(qq, num_heads=4, scale=128**-0.5, out_f32=True)
    prefix = torch.randn(1, 370, 4, 128, device="cuda").bfloat16()
    merged = merge_output(of, qq.v_corr, prefix)
    corr = qq.v_corr.repeat_interleave(2, dim=1)[:, None]
    expect = torch.cat([prefix, (of[:, 370:] + corr).to(torch.bfloat16)], dim=1)
    assert torch.equal(merged, expect)
    assert torch.equal(out[:, 370:], merged[:, 370:])  # fused epilogue = separate pass, bitwise


def test_round_p_and_tma_variants_agree():
    from workbench.kernels.dispatch import fp8_recipe_attention

    q, k, v = biased_qkv(1, 2000, 4, 4, 128, seed=11)
    a = fp8_recipe_attention(q, k, v, "fp8_dense_kv_corrected", round_p=True)
    b = fp8_recipe_attention(q, k, v, "fp8_dense_kv_corrected", round_p=False)
    assert torch.equal(a, b)  # explicit rounding == hardware cvt.rn.satfinite
    try:
        c = fp8_recipe_attention(q, k, v, "fp8_dense_kv_corrected", use_tma=True)
    except Exception as exc:  # noqa: BLE001
        pytest.skip(f"TMA descriptors unavailable: {exc}")
    assert torch.equal(a, c)


@pytest.mark.parametrize("extra", [{"flush": "triton"}, {"flush": "fma"},
                                   {"flush": "fma", "maxnreg": None}, {"sk_fold": False}])
def test_flush_variants_within_tolerance(extra):
    """Every accumulation / register variant the sweep may pick meets the tolerance rule, on a
    shape with many full key tiles and a partial one, and writes every row."""
    from workbench.attention import dense_attention_f64, evenly_spaced_rows, recipe_attention
    from workbench.kernels.dispatch import fp8_recipe_attention

    q, k, v = biased_qkv(1, 5000, 4, 4, 128, seed=21)
    idx = evenly_spaced_rows(5000, 256).cuda()
    ref, _ = dense_attention_f64(q, k, v, query_index=idx)
    emu = recipe_attention(q, k, v, "fp8_dense_kv_corrected", query_index=idx)
    out = fp8_recipe_attention(q, k, v, "fp8_dense_kv_corrected", **extra)
    assert out.isfinite().all()
    assert rel_l2(out[:, idx], ref) <= 1.25 * rel_l2(emu.out, ref)
    # and the variant moves the output by far less than the recipe's own error
    base = fp8_recipe_attention(q, k, v, "fp8_dense_kv_corrected")
    assert rel_l2(out[:, idx], base[:, idx].double()) < 0.2 * rel_l2(emu.out, ref)


def test_hardware_e4m3_cast_in_the_quantizer_equals_explicit_rounding(monkeypatch):
    from workbench.kernels import quantize as qz
    from workbench.kernels.kv_stats import kv_stats

    q, k, v = biased_qkv(1, 3000, 4, 2, 128, seed=5)
    q = q * 40  # reach E4M3 subnormals and the saturation edge as well
    st = kv_stats(k, v, smooth_k=True, smooth_v=True)
    runs = []
    for hw in (False, True):
        monkeypatch.setattr(qz, "HW_ROUND", hw)
        runs.append(qz.quantize_qkv(q, k, v, st.mu_k, st.mu_v, st.v_amax, smooth_k=True,
                                    smooth_v=True, v_bias_correction=True))
    a, b = runs
    for name in ("q8", "k8", "v8t"):
        # value-equal (E4M3 -0 and +0 dequantize to the same 0; the explicit rounding may give
        # the other zero sign than the cast)
        assert torch.equal(getattr(a, name).float(), getattr(b, name).float()), name
        codes_a, codes_b = getattr(a, name).view(torch.uint8), getattr(b, name).view(torch.uint8)
        differ = codes_a != codes_b
        assert bool(((codes_a[differ] & 0x7F) == 0).all()), name  # only signed zeros differ
    for name in ("q_scale", "k_scale", "v_scale", "v_corr"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name

"""The attention-running API under misuse (a review's findings, each reproduced on the tree
before its fix; kernels in Triton's interpreter at small shapes): what the kernels take on trust
(the output buffer, rows, heads, the scale, a layout of another length, NaN), the recipe's BF16
output for FP16 operands, the runner's backends (the reason no kernel runs, the dense policy's
BF16 steps under "kernel", what ran), recipe step / layer indices and the kernel configs."""

from __future__ import annotations

import json
import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from workbench.attention import SegmentLayout, dense_attention_f64, recipe_attention  # noqa: E402
from workbench.attention.runner import run_attention  # noqa: E402
from workbench.kernels import dispatch  # noqa: E402
from workbench.kernels.attention_fp8 import fp8_attention_fwd  # noqa: E402
from workbench.kernels.config import (  # noqa: E402
    DEFAULT,
    AttentionConfig,
    QuantConfig,
    SparseConfig,
    StatsConfig,
)
from workbench.kernels.kv_stats import kv_stats  # noqa: E402
from workbench.kernels.quantize import quantize_qkv  # noqa: E402
from workbench.recipes import RecipeError, get_recipe  # noqa: E402

SMALL = DEFAULT.with_attention(block_n=64)
cpu_only = pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter's behaviour")


def _qkv(B=1, S=128, H=2, Hkv=2, D=64, dtype=torch.bfloat16, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, S, H, D, generator=g)
    k = torch.randn(B, S, Hkv, D, generator=g) + 0.5
    v = torch.randn(B, S, Hkv, D, generator=g) + 0.3
    return tuple(t.to(dtype) for t in (q, k, v))


@cpu_only
def test_kernel_launch_checks_what_it_takes_on_trust():
    q, k, v = _qkv()
    st = kv_stats(k, v, smooth_k=True, smooth_v=True, config=SMALL.stats)
    qq = quantize_qkv(q, k, v, st.mu_k, st.mu_v, st.v_amax, smooth_k=True, smooth_v=True,
                      v_bias_correction=True, config=SMALL.quant)
    store = torch.full((128 * 2 * 64 * 2,), 7.0, dtype=torch.bfloat16)
    small = store[:64 * 2 * 64].view(1, 64, 2, 64)
    cases = [({"out": small}, "^out: "),  # was written 8,192 values past its end
             ({"row_start": 500}, "^row_start: "),  # was an uninitialised output
             ({"num_heads": 1}, "^num_heads: "), ({"scale": float("nan")}, "^scale: ")]
    for kw, msg in cases:
        args = dict(num_heads=2, scale=0.125, config=SMALL.attention) | kw
        with pytest.raises(ValueError, match=msg):
            fp8_attention_fwd(qq, **args)
    assert bool((store[64 * 2 * 64:] == 7).all())


@cpu_only
@pytest.mark.parametrize("bad", ["scale", "layout", "nan", "batch"])
def test_recipe_kernel_call_refuses_bad_inputs(bad):
    q, k, v = _qkv()
    kw, recipe = {"config": SMALL}, "fp8_dense_kv_corrected"
    if bad == "scale":
        kw["scale"], msg = -0.125, "^scale: "  # was an all-NaN output
    elif bad == "layout":  # was every row BF16, silently
        recipe = "fp8_dense_kv_corrected:dense_prefix=true"
        kw["layout"], msg = SegmentLayout(text=200, audio=0, video=56), "^layout: .* 256 rows"
    elif bad == "nan":  # the interpreter's E4M3 cast made it finite
        q = q.clone()
        q[0, 5, 0, 3] = float("nan")
        msg = "^q: 1 non-finite"
    else:  # was a bare reshape error
        q, msg = torch.cat([q, q]), "same batch"
    with pytest.raises(ValueError, match=msg):
        dispatch.fp8_recipe_attention(q, k, v, recipe, **kw)


@cpu_only
def test_fp16_operands_get_the_recipes_bf16_output():
    q, k, v = _qkv(dtype=torch.float16)
    out = dispatch.fp8_recipe_attention(q, k, v, "fp8_dense_kv_corrected", config=SMALL)
    assert out.dtype == torch.float16
    assert torch.equal(out.float(), out.float().bfloat16().float())  # was FP16-rounded
    ref = dense_attention_f64(q, k, v)[0]
    emu = recipe_attention(q, k, v, "fp8_dense_kv_corrected").out.double()
    e_k = float((out.double() - ref).norm() / ref.norm())
    e_emu = float((emu - ref).norm() / ref.norm())
    assert e_k <= 1.25 * e_emu, (e_k, e_emu)


def test_run_attention_backends_say_what_ran_and_why():
    q, k, v = _qkv(dtype=torch.float32)
    with pytest.raises(ValueError, match="backend: unknown ''"):  # was the default, silently
        run_attention(q, k, v, "fp8_dense", backend="")
    ran: dict = {}
    out = run_attention(q, k, v, "fp8_dense", backend="reference", ran=ran)
    assert out.is_contiguous() and ran == {"reference": 1}  # was strided [B, H, S, D] memory
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="no kernel runs .*: the kernels run on CUDA"):
            run_attention(q, k, v, "fp8_dense", backend="kernel")
        # the dense policy's BF16 steps have no FP8 kernel: the reference path, as under auto
        # (was: "no kernel supports recipe fp8_dense@dense_policy" on the first call)
        run_attention(q, k, v, "fp8_dense:dense_steps=5", backend="kernel", step=0, ran=ran)
        assert ran == {"reference": 2}


@pytest.mark.parametrize("kw", [{"step": -1}, {"layer": -3}, {"step": 1.5}, {"layer": True}])
def test_dense_policy_indices_are_checked(kw):
    with pytest.raises(RecipeError, match="an index >= 0"):  # was the BF16 policy, silently
        get_recipe("fp8_sol_kv_corrected").at(**kw)


@pytest.mark.parametrize("cls, kw, msg", [
    (StatsConfig, {"rows": 3}, "StatsConfig.rows: 3; a power of two"),
    (StatsConfig, {"final_chunks": 0}, "StatsConfig.final_chunks"),
    (QuantConfig, {"corr_rows": 0}, "QuantConfig.corr_rows"),
    (SparseConfig, {"programs_per_sm": 0}, "SparseConfig.programs_per_sm"),
    (AttentionConfig, {"num_warps": 0}, "AttentionConfig.num_warps"),
    (AttentionConfig, {"block_n": "64"}, "block_n: '64'"),
    (AttentionConfig, {"max_imprecise": -1}, "max_imprecise: -1; an int >= 0"),
])
def test_kernel_configs_name_bad_values(cls, kw, msg):
    with pytest.raises(ValueError, match=msg):  # were ZeroDivisionError / compiler errors
        cls(**kw)
    AttentionConfig(flush="triton", max_imprecise=0)  # full FP32 accumulation: the reference
    import numpy as np

    AttentionConfig(num_warps=np.int64(4))  # numpy numbers are numbers
    SparseConfig(split_below_waves=np.float32(2.0))
    with pytest.raises(ValueError, match="split_below_waves"):
        SparseConfig(split_below_waves=True)


def test_generate_records_the_backend_asked_and_the_paths_taken(tmp_path, monkeypatch):
    from workbench.cli import main

    monkeypatch.setenv("WORKBENCH_ATTENTION_BACKEND", "reference")
    assert main(["generate", "--model", "h3-tiny", "--steps", "2", "--recipe", "fp8_dense",
                 "--quiet", "--out", str(tmp_path / "a")]) == 0
    cfg = json.loads((tmp_path / "a" / "config.json").read_text())
    assert cfg["backend"] == "reference"  # was "auto"
    assert cfg["attention_paths"]["reference"] == cfg["attention_calls"]["replaced_calls"] > 0
    assert main(["generate", "--model", "h3-tiny", "--steps", "2", "--recipe", "native",
                 "--backend", "kernel", "--quiet", "--out", str(tmp_path / "b")]) == 0
    cfg = json.loads((tmp_path / "b" / "config.json").read_text())
    assert cfg["backend"] is None and cfg["attention_paths"] is None  # was "kernel"

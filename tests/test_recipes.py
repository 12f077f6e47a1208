"""Recipe spec: presets, string/JSON round trips, field-naming errors, property-based parsing."""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from workbench.recipes import PRESETS, AttentionRecipe, RecipeError, get_recipe
from workbench.recipes.recipe import QK_FORMATS, SMOOTHINGS, SPARSITIES

REQUIRED = [
    "bf16", "fp8_dense", "fp8_dense_kv_corrected", "fp8_sol_unsmoothed", "fp8_sol_k",
    "fp8_sol_kv_corrected", "int8_qk_fp8_pv", "fp8_hadamard", "vsa_bf16",
    "fp8_dense_kv_loglinear", "fp8_sol_kv_loglinear",
]


def test_required_presets_exist_and_default_is_seed_recipe():
    for name in REQUIRED:
        assert name in PRESETS
    d = get_recipe(None)
    assert d.name == "fp8_sol_kv_corrected"
    assert (d.smoothing, d.v_bias_correction, d.sparsity, d.dense_prefix) == (
        "kv", True, "sol", True)
    assert (d.dense_steps, d.dense_layers, d.qk_block, d.sol_tau) == (10, 2, 64, 1.0)


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_round_trips(name):
    r = PRESETS[name]
    assert get_recipe(r.to_string()) == r
    assert AttentionRecipe.from_json(r.to_json()) == r
    assert get_recipe(r.to_json()) == r
    assert json.loads(r.to_json())["name"] == name


def test_log_linear_presets_are_the_measured_override_forms():
    """The two fast presets hold the numerics BENCHMARKS.md measured under override strings (the
    seed presets themselves stay as they were), and the Sol one keeps the seed's dense policy."""
    ll = "p_scaling=exp2_offset8,row_sum=p_operand,p_exp=log_linear"
    dense = get_recipe(f"fp8_dense_kv_corrected:{ll}")
    sol = get_recipe(f"fp8_sol_kv_corrected:{ll},dense_prefix=false,prefix_blocks_exact=true")
    assert PRESETS["fp8_dense_kv_loglinear"].numerics_key() == dense.numerics_key()
    assert PRESETS["fp8_sol_kv_loglinear"].numerics_key() == sol.numerics_key()
    fast, seed = PRESETS["fp8_sol_kv_loglinear"], PRESETS["fp8_sol_kv_corrected"]
    assert (fast.dense_steps, fast.dense_layers, fast.sol_tau) == (
        seed.dense_steps, seed.dense_layers, seed.sol_tau)
    for seed in (seed, PRESETS["fp8_dense_kv_corrected"]):
        assert (seed.p_exp, seed.row_sum, seed.p_scaling) == ("exp2", "p_fp32", "unit")


def test_overrides_parse_and_print():
    r = get_recipe("fp8_sol_kv_corrected:sol_tau=0.5,dense_prefix=false,sol_threshold=diag")
    assert (r.sol_tau, r.dense_prefix, r.sol_threshold) == (0.5, False, "diag")
    assert get_recipe(r.to_string()) == r
    assert "sol_tau=0.5" in r.to_string()


@pytest.mark.parametrize(
    "spec, field",
    [
        ("fp8_dense:v_bias_correction=true", "v_bias_correction"),
        ("fp8_dense:qk_format=fp4", "qk_format"),
        ("fp8_dense:smoothing=q", "smoothing"),
        ("fp8_dense:vsa_keep=0", "vsa_keep"),
        ("fp8_dense:qk_block=abc", "qk_block"),
        ("fp8_dense:accumulation=reduced,accum_rounding=stochastic", "accum_rounding"),
        ("fp8_dense:nonsense=1", "nonsense"),
        ('{"qk_format": "fp16"}', "qk_format"),
        ('{"bogus": 1}', "bogus"),
        ('{"name": "fp8_dense"}', r"lacks \['qk_format'"),  # would take the defaults
        ('[1, 2]', "unknown preset '\\[1, 2\\]'"),
    ],
)
def test_invalid_recipes_name_the_field(spec, field):
    with pytest.raises(RecipeError, match=field):
        get_recipe(spec)


def test_unknown_preset_lists_presets():
    with pytest.raises(RecipeError, match="unknown preset 'fp9'.*fp8_dense"):
        get_recipe("fp9")


def test_dense_policy():
    r = PRESETS["fp8_sol_kv_corrected"]
    assert r.at(step=9, layer=5).qk_format == "bf16"
    assert r.at(step=10, layer=1).qk_format == "bf16"
    assert r.at(step=10, layer=2) is r


@settings(max_examples=60, deadline=None)
@given(
    qk=st.sampled_from(QK_FORMATS),
    smoothing=st.sampled_from(SMOOTHINGS),
    sparsity=st.sampled_from(SPARSITIES),
    tau=st.floats(-5, 5, allow_nan=False),
    block=st.integers(1, 512),
    keep=st.floats(0.01, 1.0),
    corr=st.booleans(),
)
def test_any_valid_recipe_round_trips(qk, smoothing, sparsity, tau, block, keep, corr):
    kw = dict(qk_format=qk, smoothing=smoothing, sparsity=sparsity, sol_tau=tau, qk_block=block,
              vsa_keep=keep, v_bias_correction=corr)
    if corr and smoothing != "kv":
        with pytest.raises(RecipeError, match="v_bias_correction"):
            AttentionRecipe(**kw)
        return
    r = AttentionRecipe(**kw)
    assert AttentionRecipe.from_json(r.to_json()) == r
    assert get_recipe(r.to_string()) == r


def test_log_linear_p_needs_the_scaled_p_and_the_operand_row_sum():
    """p_exp="log_linear" writes codes of the scaled P that the row sum must take: any other P
    format, scaling or row sum is refused naming each field to set; the valid form round-trips."""
    with pytest.raises(RecipeError) as e:
        get_recipe("fp8_dense_kv_corrected:p_exp=log_linear")
    assert "'p_exp'" in str(e.value) and "p_scaling='exp2_offset8'" in str(e.value)
    assert "row_sum='p_operand'" in str(e.value) and "p_format" not in str(e.value)
    with pytest.raises(RecipeError, match="p_format='fp8_e4m3'"):
        get_recipe("bf16:p_exp=log_linear")
    with pytest.raises(RecipeError, match="p_exp"):
        get_recipe("fp8_dense:p_exp=exp3")
    r = get_recipe("fp8_sol_kv_corrected:p_scaling=exp2_offset8,row_sum=p_operand,"
                   "p_exp=log_linear")
    assert r.p_exp == "log_linear" and "log_linear" in r.describe()
    assert get_recipe(r.to_string()) == r
    assert AttentionRecipe.from_json(r.to_json()) == r

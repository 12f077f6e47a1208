"""Recipe plans: the rule applied exactly on a crafted scan, and a plan accepted wherever a recipe
is (get_recipe, run_attention, generate / compare)."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from workbench.attention.runner import run_attention
from workbench.evaluate.planning import PlanRule, derive_plan
from workbench.evaluate.scan import finish_benefits
from workbench.evaluate.scan_store import METRIC_NAMES, ScanParams, ScanStore, open_scan
from workbench.recipes import PRESETS, RecipeError, RecipePlan, get_recipe

LABELS = ("bf16", "fp8_dense", "fp8_dense_k", "fp8_dense_kv_corrected")
# Output SQNR (dB) per (step, layer) for bf16, fp8_dense, fp8_dense_k, fp8_dense_kv_corrected.
SQNR = {
    (0, 0): (55, 35, 34, 36),
    (0, 1): (55, 25, 31, 32),
    (0, 2): (55, 20, 22, 24),
    (1, 0): (55, 25, 31, 33),
    (1, 1): (55, 25, 29, 31),
    (1, 2): (29, 20, 22, 24),
}
V_HURTS = {(1, 0), (1, 1)}  # kv's sampled rows are twice the K-only twin's error here
COST = {"bf16": 1.0, "fp8_dense": 37.486 / 52.974, "fp8_dense_k": 37.920 / 52.974,
        "fp8_dense_kv_corrected": 38.156 / 52.974}
N_ROWS = 8


@pytest.fixture(scope="module")
def crafted(tmp_path_factory):
    """A scan store written through the scan's own writer with chosen numbers."""
    path = tmp_path_factory.mktemp("crafted") / "crafted.scan.zarr"
    params = ScanParams(
        store="crafted", store_id="crafted", recipes=LABELS,
        recipe_specs=tuple(get_recipe(r).to_json() for r in LABELS), baseline="fp8_dense",
        steps=(0, 1), layers=(0, 1, 2), heads=(0, 1), n_queries=N_ROWS, dense_policy=False,
        seq_len=64, query_rows=tuple(range(0, 64, 8)),
        segment_layout=json.dumps({"text": 0, "conditioning": 0, "audio": 0, "video": 64}))
    store = ScanStore(path, params)
    rng = np.random.default_rng(0)
    si_of, li_of = {0: 0, 1: 1}, {0: 0, 1: 1, 2: 2}
    for (s, la), values in SQNR.items():
        k_rows = rng.uniform(0.5, 1.5, N_ROWS) * 1e-3
        for ri, lab in enumerate(LABELS):
            entry = np.full(len(METRIC_NAMES), np.nan)
            entry[METRIC_NAMES.index("attention_output_sqnr_db")] = values[ri]
            entry[METRIC_NAMES.index("exact_fraction")] = 1.0
            head = np.full((2, len(METRIC_NAMES)), np.nan)
            head[:, METRIC_NAMES.index("attention_output_sqnr_db")] = [values[ri],
                                                                      values[ri] - 2]
            if lab == "fp8_dense_kv_corrected":
                rows = k_rows * (2.0 if (s, la) in V_HURTS else 0.5)
            elif lab == "fp8_dense_k":
                rows = k_rows
            else:
                rows = rng.uniform(0.5, 1.5, N_ROWS) * 10 ** (-values[ri] / 10)
            store.write_task(si_of[s], li_of[la], ri, {
                "entry": entry, "head": head, "row": rows,
                "row_head": np.stack([rows, rows])})
    finish_benefits(store)
    return open_scan(path)


def _grid(plan):
    return {(e.step, e.layer): e.recipe for e in plan.entries}


def test_min_sqnr_rule_exact(crafted):
    plan = derive_plan(crafted, PlanRule("min_sqnr", 30.0))
    assert _grid(plan) == {(0, 0): "fp8_dense", (0, 1): "fp8_dense_k", (0, 2): "bf16",
                           (1, 0): "fp8_dense_k", (1, 1): "bf16", (1, 2): "bf16"}
    by = {(e.step, e.layer): e for e in plan.entries}
    assert "no recipe reaches 30 dB (best: bf16 at 29.00 dB): bf16" in \
        by[(1, 2)].note
    assert "V centring hurts here" in by[(1, 1)].note
    costs = [COST[_grid(plan)[k]] for k in SQNR]
    assert plan.expected_cost["relative_to_bf16"] == pytest.approx(np.mean(costs), rel=1e-12)
    assert [e.cost for e in plan.entries] == pytest.approx(costs, rel=1e-12)
    assert plan.expected_cost["uniform_recipes"]["fp8_dense"] == pytest.approx(COST["fp8_dense"])
    # Without the guard, V centring is a candidate again where it qualifies.
    free = derive_plan(crafted, PlanRule("min_sqnr", 30.0, v_centring_guard=False))
    assert _grid(free)[(1, 1)] == "fp8_dense_kv_corrected"


def test_worst_head_and_max_cost_rules_exact(crafted):
    worst = derive_plan(crafted, PlanRule("min_sqnr", 30.0, reduce="worst_head"))
    assert _grid(worst)[(0, 0)] == "fp8_dense"  # 33 dB on its worst head
    assert _grid(worst)[(0, 1)] == "fp8_dense_kv_corrected"  # worst heads: k 29, kv 30
    assert _grid(worst)[(1, 0)] == "bf16"  # k 29; kv 31 but V centring hurts there
    best = derive_plan(crafted, PlanRule("max_cost", 0.75))
    assert _grid(best) == {(0, 0): "fp8_dense_kv_corrected", (0, 1): "fp8_dense_kv_corrected",
                           (0, 2): "fp8_dense_kv_corrected", (1, 0): "fp8_dense_k",
                           (1, 1): "fp8_dense_k", (1, 2): "fp8_dense_kv_corrected"}
    tight = derive_plan(crafted, PlanRule("max_cost", 0.712))
    assert set(_grid(tight).values()) == {"fp8_dense"}
    below = derive_plan(crafted, PlanRule("max_cost", 0.5))  # nothing fits: the cheapest
    assert set(_grid(below).values()) == {"fp8_dense"}
    assert "no recipe within cost 0.5" in below.entries[0].note


def test_plan_json_runs_the_planned_recipe_per_entry(crafted, tmp_path):
    plan = derive_plan(crafted, PlanRule("min_sqnr", 30.0))
    path = tmp_path / "plan.json"
    path.write_text(plan.to_json(indent=1))
    loaded = get_recipe(str(path))
    assert isinstance(loaded, RecipePlan) and loaded == plan
    assert get_recipe(plan.to_json()) == plan
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 128, 2, 64, generator=g) + 0.5 for _ in range(3))
    for (s, la), lab in _grid(plan).items():
        want = run_attention(q, k, v, PRESETS[lab], backend="reference")
        got = run_attention(q, k, v, str(path), step=s, layer=la, backend="reference")
        assert torch.equal(got, want), (s, la, lab)
    a = run_attention(q, k, v, str(path), step=0, layer=0, backend="reference")
    b = run_attention(q, k, v, str(path), step=0, layer=1, backend="reference")
    assert not torch.equal(a, b)  # fp8_dense vs fp8_dense_k
    off = run_attention(q, k, v, str(path), step=7, layer=9, backend="reference")
    assert torch.equal(off, run_attention(q, k, v, "bf16", backend="reference"))  # default
    assert loaded.is_dense_at(1, 2) and not loaded.is_dense_at(0, 0)


def test_plan_in_generate_and_compare(crafted, tmp_path, capsys):
    from workbench.cli import main
    from workbench.generate.run import resolve_recipe

    plan = derive_plan(crafted, PlanRule("min_sqnr", 30.0))
    path = tmp_path / "plan.json"
    path.write_text(plan.to_json(indent=1))
    assert resolve_recipe(str(path)) == plan
    with pytest.raises(RecipeError, match="dense_steps"):
        resolve_recipe(str(path), dense_steps=2)
    out = tmp_path / "cmp"
    assert main(["compare", "--recipes", f"bf16,{path}", "--model", "h3-tiny", "--steps", "3",
                 "--out", str(out), "--quiet"]) == 0
    cfg = json.loads((out / "plan" / "config.json").read_text())
    # h3-tiny: 2 steps x its blocks; planned bf16 entries and uncovered ones run dense BF16
    calls = cfg["attention_calls"]
    assert calls["replaced_calls"] > calls["dense_policy_calls"] > 0
    assert cfg["recipe"]["workbench_plan"] == 1
    # a capture made while generating with the plan records it, and its reader returns it
    from workbench.capture import open_capture
    from workbench.generate import generate
    from workbench.models import load_model

    store = tmp_path / "plan.zarr"
    generate(load_model("h3-tiny"), "red", seed=0, steps=3, recipe=str(path), capture=store,
             capture_layers=[0], capture_steps=[0], progress=False)
    assert open_capture(store).recipe == plan
    assert main(["compare", "--recipes", f"bf16,{tmp_path / 'nope.json'}", "--model", "h3-tiny",
                 "--steps", "2", "--out", str(tmp_path / "cmp2"), "--quiet"]) == 2
    assert "nope.json: no such file" in capsys.readouterr().err


def test_bad_plans_are_refused_naming_the_field():
    with pytest.raises(RecipeError, match="default recipe 'x'"):
        RecipePlan({"bf16": PRESETS["bf16"]}, (), default="x")
    with pytest.raises(RecipeError, match="names recipe 'k'"):
        get_recipe('{"workbench_plan": 1, "recipes": {"bf16": {}}, '
                   '"entries": [{"step": 0, "layer": 0, "recipe": "k"}]}')
    with pytest.raises(RecipeError, match="workbench_plan"):
        get_recipe('{"workbench_plan": 7, "recipes": {}, "entries": []}')

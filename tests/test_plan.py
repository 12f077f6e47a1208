"""Recipe plans: the rule applied exactly on a crafted scan, and a plan accepted wherever a recipe
is (get_recipe, run_attention, generate / compare)."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest
import torch

from workbench.attention.runner import run_attention
from workbench.evaluate.planning import PlanRule, derive_plan
from workbench.evaluate.scan import finish_benefits
from workbench.evaluate.scan_store import METRIC_NAMES, ScanParams, ScanStore, open_scan
from workbench.recipes import PRESETS, RecipeError, RecipePlan, get_recipe

ROOT = Path(__file__).resolve().parents[1]

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
        get_recipe('{"workbench_plan": 1, "recipes": {"bf16": "bf16"}, '
                   '"entries": [{"step": 0, "layer": 0, "recipe": "k"}]}')
    with pytest.raises(RecipeError, match="workbench_plan"):
        get_recipe('{"workbench_plan": 7, "recipes": {}, "entries": []}')


PLAN = {"workbench_plan": 1, "name": "hand", "default": "bf16",
        "recipes": {"bf16": "bf16", "fp8": "fp8_dense"},
        "entries": [{"step": 7, "layer": 1, "recipe": "fp8"}]}


@pytest.mark.parametrize("edit, message", [
    ({"recipes": []}, "field 'recipes' must be an object"),
    ({"recipes": {}}, "field 'recipes' is empty"),
    ({"entries": None}, "field 'entries' must be a list"),
    ({"default": ["bf16"]}, "field 'default' must be a recipe label"),
    ({"rule": "x"}, "field 'rule' must be an object"),
    ({"recipes": {"bf16": {"name": "fp8_dense"}, "fp8": "fp8_dense"}},
     r"recipes\['bf16'\]: recipe: a recipe object lists every field"),
    ({"recipes": {"bf16": "bf16", "fp8": "fp8_dense:qk_block=0"}},
     r"recipes\['fp8'\]: recipe field 'qk_block'"),
    ({"entries": [{"step": True, "layer": 1, "recipe": "fp8"}]}, "step must be a non-negative"),
    ({"entries": [{"step": 7.9, "layer": 1, "recipe": "fp8"}]}, "step must be a non-negative"),
    ({"entries": [{"step": 7, "layer": -1, "recipe": "fp8"}]}, "layer must be a non-negative"),
    ({"entries": ["x"]}, r"entries\[0\] is not a plan entry"),
])
def test_plan_files_of_the_wrong_shape_are_refused_naming_file_and_field(edit, message,
                                                                         tmp_path):
    """A hand-edited plan whose fields have the wrong JSON type, whose recipe object is partial
    (it would take the dataclass defaults, not the preset its name says) or whose entries are
    not integer indices is refused naming the file and the field (before: tracebacks, silent
    coercions such as step 7.9 -> 7 or true -> 1, and errors naming neither)."""
    path = tmp_path / "plan.json"
    path.write_text(json.dumps({**PLAN, **edit}))
    with pytest.raises(RecipeError, match=message) as err:
        get_recipe(str(path))
    assert str(path) in str(err.value)
    (tmp_path / "list.json").write_text("[1, 2]")
    with pytest.raises(RecipeError, match="list.json: not a plan or recipe"):
        get_recipe(str(tmp_path / "list.json"))


def test_plan_recipes_may_be_recipe_strings():
    plan = get_recipe(PLAN)
    assert plan.at(7, 1) == PRESETS["fp8_dense"] and plan.at(0, 0) == PRESETS["bf16"]


def test_table_and_report_run_the_plans_recipe_of_the_entry(tmp_path, capsys):
    """`table --store --step --layer` and `report` with a plan run the plan's recipe of that
    entry (before: the table ran the plan's default, B = bf16 with zero error, exit 0; the
    report died on an AttributeError after writing its figures)."""
    from workbench.cli import main

    store = ROOT / "captures" / "demo_h3_nano.zarr"
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(PLAN))
    assert main(["table", "--store", str(store), "--step", "7", "--layer", "1", "--queries",
                 "16", "--a", "bf16", "--b", str(path)]) == 0
    out, err = capsys.readouterr()
    assert "B = `fp8_dense`" in out and "plan 'hand' at step 7, layer 1: recipe 'fp8'" in err
    assert main(["table", "--store", str(store), "--step", "8", "--layer", "1", "--queries",
                 "16", "--a", "fp8_dense", "--b", str(path)]) == 0
    assert "B = `bf16`" in capsys.readouterr().out  # no entry there: the default
    assert main(["report", str(store), "--step", "7", "--layer", "1", "--queries", "16",
                 "--b", str(path), "--out", str(tmp_path / "rep"), "--formats", "svg"]) == 0
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "B: plan 'hand' at step 7, layer 1: recipe 'fp8'" in md and "`fp8_dense`" in md


def test_report_heatmap_of_a_plan_runs_each_layers_planned_recipe(tmp_path, capsys):
    """A plan's per-layer heatmap in `report` runs the recipe the plan gives each layer (before:
    the entry's recipe at every layer, so the heatmap showed fp8_dense's error at layers the plan
    leaves in bf16)."""
    from workbench.cli import main

    store = ROOT / "captures" / "demo_h3_nano.zarr"
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(PLAN))
    args = ["--step", "7", "--layer", "1", "--queries", "16", "--heads", "0,1", "--formats", "svg",
            "--a", "fp8_dense_k"]
    assert main(["report", str(store), *args, "--b", str(path), "--out",
                 str(tmp_path / "plan")]) == 0
    assert main(["report", str(store), *args, "--b", "fp8_dense", "--out",
                 str(tmp_path / "fp8")]) == 0
    assert main(["report", str(store), *args, "--b", "bf16", "--out", str(tmp_path / "bf16")]) == 0
    capsys.readouterr()
    rep = {n: json.loads((tmp_path / n / "report.json").read_text())
           for n in ("plan", "fp8", "bf16")}
    grid = {n: np.array(r["layer_head_output_mse"]["b"]) for n, r in rep.items()}
    assert rep["plan"]["layers"] == [0, 1, 2, 3]
    np.testing.assert_array_equal(grid["plan"][1], grid["fp8"][1])
    for la in (0, 2, 3):
        np.testing.assert_array_equal(grid["plan"][la], grid["bf16"][la])
        assert (grid["plan"][la] < grid["fp8"][la] / 10).all()  # bf16, not fp8_dense
    # the plan's label of each layer, with the recipe where they differ
    assert rep["plan"]["layer_head_recipes"]["b"] == ["bf16", "fp8 (fp8_dense)", "bf16", "bf16"]
    md = (tmp_path / "plan" / "report.md").read_text()
    assert ("B's per-layer heatmap at step 7 runs the plan's recipe of each layer: layer 0 "
            "`bf16`, layer 1 `fp8 (fp8_dense)`") in md
    svg = (tmp_path / "plan" / "figures" / "heatmap_output_mse_b.svg").read_text()
    assert "plan &#39;hand&#39;" in svg or "plan 'hand'" in svg


def test_generate_notes_a_plan_from_another_sampling_grid(tmp_path, capsys):
    """A plan records its capture's sampling grid (`workbench plan` reads the store's
    sampling_grid_points); generating with it on another grid notes that its step indices mean
    other noise levels (before: silence), and says nothing on the same grid."""
    from workbench.cli import main

    store = ROOT / "captures" / "demo_h3_nano.zarr"
    scan = tmp_path / "s.scan.zarr"
    assert main(["scan", str(store), "--recipes", "fp8_dense,fp8_dense_k", "--steps", "7,8",
                 "--layers", "1,2", "--queries", "16", "--scheduler", "synchronous",
                 "--device", "cpu", "--quiet", "--out", str(scan)]) == 0
    assert main(["plan", str(scan), "--out", str(tmp_path / "p.json")]) == 0
    plan = get_recipe(str(tmp_path / "p.json"))
    assert plan.source["grid_points"] == 10
    capsys.readouterr()
    argv = ["generate", "--model", "h3-tiny", "--prompt", "red", "--recipe",
            str(tmp_path / "p.json"), "--quiet"]
    assert main([*argv, "--steps", "3", "--out", str(tmp_path / "g3")]) == 0
    out, err = capsys.readouterr()
    assert "comes from a capture of 10 sampling grid points, this run has 3" in err, err
    assert "recipe plan plan:" in out and '"workbench_plan"' not in out, out
    assert main([*argv, "--steps", "10", "--out", str(tmp_path / "g10")]) == 0
    assert "sampling grid points" not in capsys.readouterr().err


def test_scan_runs_a_plans_recipe_with_its_own_numerics(tmp_path):
    """A plan scanned without --dense-policy runs the recipe it plans at each entry with that
    recipe's own numerics, as a recipe is scanned and as `table` / `report` run it (before: the
    plan's recipe with its dense policy, so fp8_sol_kv_corrected, dense at steps < 10, was
    scanned as BF16: 55 dB instead of 29)."""
    from workbench.evaluate.scan import run_scan

    plan = {"workbench_plan": 1, "name": "hand", "default": "sol",
            "recipes": {"sol": "fp8_sol_kv_corrected"}, "entries": []}
    path = tmp_path / "hand.json"
    path.write_text(json.dumps(plan))
    ds, _ = run_scan(ROOT / "captures" / "demo_h3_nano.zarr",
                     f"fp8_sol_kv_corrected,{path}", out=tmp_path / "s.scan.zarr", steps=[0],
                     layers=[2], n_queries=16, scheduler="synchronous", progress=False,
                     device="cpu")
    sq = ds.entry_metrics.sel(metric="attention_output_sqnr_db").values[0, 0]
    assert sq[1] == sq[0] and sq[0] < 40, sq  # the plan's entry is the recipe's, FP8 numerics


def test_dense_policy_scans_still_pair_the_smoothing_twins(tmp_path):
    """With --dense-policy every recipe is BF16 at its dense steps, the first entry included; the
    twins (none -> k -> kv smoothing) are still found by their own numerics, so the smoothing
    figure and the V-centring guard work (before: no pair found, the figure named recipes that
    were in the scan)."""
    from workbench.evaluate.planning import v_centring_hurts
    from workbench.evaluate.scan import run_scan
    from workbench.viz.scan_figures import smoothing_pairs

    names = [f"{r}:dense_steps=1" for r in ("fp8_dense", "fp8_dense_k", "fp8_dense_kv_corrected")]
    ds, _ = run_scan(ROOT / "captures" / "demo_h3_nano.zarr", ",".join(names),
                     out=tmp_path / "dp.scan.zarr", steps=[0, 4], layers=[3], n_queries=16,
                     dense_policy=True, scheduler="synchronous", progress=False, device="cpu")
    labels = [str(x) for x in ds.recipe.values]
    assert sorted(smoothing_pairs(ds)) == sorted([(labels[0], labels[1]),
                                                  (labels[1], labels[2])])
    hurts = v_centring_hurts(ds)
    assert list(hurts) == [labels[2]] and hurts[labels[2]].shape == (2, 1)
    assert not hurts[labels[2]][0, 0]  # step 0: both BF16 under the policy, no difference


def test_plan_fallback_defaults_and_scan_report_checks(crafted, tmp_path):
    """The fallback runs its own numerics in a scan without --dense-policy (before: fp8_sol_k
    kept its dense steps, so the plan's "fp8_sol_k" entries ran BF16); plan options name their
    flag; scan-report refuses an unfinished scan (its medians were of a part, benefits 0 / 0)
    and a plan from another capture; the plan's grid points come only from the scanned capture."""
    import zarr

    from workbench.evaluate.planning import _capture_grid
    from workbench.evaluate.scan import run_scan
    from workbench.evaluate.scan_store import store_fingerprint
    from workbench.report.scan_report import write_scan_report

    plan = derive_plan(crafted, PlanRule("min_sqnr", 60.0, fallback="fp8_sol_k"))
    assert plan.at(1, 2).sparsity == "sol"  # not the dense policy's BF16
    for kw, flag in ((dict(fallback="nope"), "--fallback 'nope'"),):
        with pytest.raises(ValueError, match=flag):
            derive_plan(crafted, PlanRule("min_sqnr", 30.0, **kw))
    with pytest.raises(ValueError, match="--default 'nope'"):
        derive_plan(crafted, PlanRule("min_sqnr", 30.0), default="nope")
    store = ROOT / "captures" / "demo_h3_nano.zarr"
    from workbench.capture import open_capture

    right = store_fingerprint(open_capture(store))
    assert _capture_grid(str(store), "not-this-one") == {}
    assert _capture_grid(str(store), right) == _capture_grid(str(store))
    path = tmp_path / "s.scan.zarr"
    ds, _ = run_scan(store, "fp8_dense,fp8_dense_k", out=path, steps=[7], layers=[1, 2],
                     n_queries=16, scheduler="synchronous", progress=False, device="cpu")
    other = {**PLAN, "source": {"store_id": "0123456789abcdef", "scan": "elsewhere"}}
    with pytest.raises(ValueError, match="planned from another capture"):
        write_scan_report(path, tmp_path / "r1", plan=other, formats=("html",))
    with pytest.raises(ValueError, match="--plan .*missing.json"):
        write_scan_report(path, tmp_path / "r2", plan=str(tmp_path / "missing.json"),
                          formats=("html",))
    zarr.open_group(str(path))["done"][0, 1, 0] = 0  # as a scan killed before its last task
    with pytest.raises(ValueError, match="1 of 4 .* tasks are not done"):
        write_scan_report(path, tmp_path / "r3", formats=("html",))


def test_plan_costs_and_defaults_are_the_fallbacks_as_run(crafted):
    """A review's findings: a fallback the scan did not run was costed without the prefix rows
    and the plan's default kept the dense policy the fallback had dropped (two recipes under one
    name, BF16 where the scan had no entry); sparse recipes named the dense cost row."""
    from workbench.recipes.cost import relative_cost

    plan = derive_plan(crafted, PlanRule("min_sqnr", 99.0, fallback="fp8_dense:dense_prefix=true"))
    fb = plan.recipes[plan.entries[0].recipe]
    assert fb.dense_prefix and plan.default == plan.entries[0].recipe  # one recipe, one label
    # a fallback the scan did not run, with prefix rows (the crafted scan has none): costed with
    # them (was without)
    from workbench.evaluate.planning import _choose

    rule = PlanRule("min_sqnr", 99.0, fallback="fp8_dense:dense_prefix=true")
    e = _choose(0, 0, [], rule, fb, lambda r, lab: lab, prefix_fraction=0.25)
    assert e.cost == pytest.approx(relative_cost(fb, prefix_fraction=0.25))
    assert e.cost != pytest.approx(relative_cost(fb))
    plan = derive_plan(crafted, PlanRule("min_sqnr", 99.0, fallback="fp8_sol_unsmoothed"))
    d = plan.recipes[plan.default]
    assert (d.dense_steps, d.dense_layers) == (0, 0)  # was 10 / 2: BF16 at unscanned entries
    assert plan.at(20, 0).sparsity == "sol"
    src = plan.expected_cost["cost_sources"]
    assert "density" in src[plan.default], src


def test_table_says_when_a_dense_policy_was_not_applied():
    from workbench.report.accuracy_table import accuracy_table
    from workbench.synthetic import small_config, synthetic_qkv

    q, k, v = synthetic_qkv(small_config(256, heads=1))
    t = accuracy_table(q, k, v, "fp8_dense", "fp8_sol_kv_corrected", n_queries=8)
    md = t.to_markdown()
    b_line = next(ln for ln in md.splitlines() if ln.startswith("- B = "))
    assert "dense policy not applied" in b_line  # it listed "dense steps<10" as if applied
    a_line = next(ln for ln in md.splitlines() if ln.startswith("- A = "))
    assert "dense policy" not in a_line  # fp8_dense has none


def test_plan_grammar_review_findings(tmp_path):
    """A review's findings on plans and recipe specs (each reproduced first): a torch step ran
    the plan's default (hashed by identity); a recipe file named in a plan was read from the
    current folder; a misspelt key ("defualt") was ignored; an entry without cost made two equal
    plans unequal (NaN); the same recipe with other notes scanned twice under one label; a huge
    JSON number raised OverflowError; "fp8_dense : x=1" was an unknown preset."""
    import torch

    from workbench.evaluate.scan import ScanError, resolve_recipes
    from workbench.recipes import PRESETS, RecipeError

    spec = {"workbench_plan": 1, "default": "bf16",
            "recipes": {"bf16": "bf16", "fast": "fp8_dense_k"},
            "entries": [{"step": 0, "layer": 1, "recipe": "fast"}]}
    p = get_recipe(json.dumps(spec))
    assert p.at(torch.tensor(0), torch.tensor(1)).name == "fp8_dense_k"
    assert get_recipe(p.to_json()) == p
    with pytest.raises(RecipeError, match="unknown field.*defualt"):
        get_recipe(json.dumps({**spec, "defualt": "fast"}))
    with pytest.raises(RecipeError, match=r"entries\[0\] has unknown field.*lyaer"):
        get_recipe(json.dumps({**spec, "entries": [{"step": 0, "lyaer": 1, "recipe": "fast"}]}))
    folder = tmp_path / "plans"
    folder.mkdir()
    (folder / "r.json").write_text(PRESETS["fp8_dense"].to_json())
    (tmp_path / "r.json").write_text(PRESETS["fp8_hadamard"].to_json())  # the cwd's, not it
    (folder / "plan.json").write_text(json.dumps({**spec, "recipes": {"bf16": "bf16",
                                                                      "fast": "r.json"}}))
    cwd = os.getcwd()
    try:
        os.chdir(tmp_path)
        assert get_recipe(str(folder / "plan.json")).at(0, 1).name == "fp8_dense"
    finally:
        os.chdir(cwd)
    with pytest.raises(ScanError, match="same recipe"):
        resolve_recipes(["fp8_dense", PRESETS["fp8_dense"].with_(notes="mine")])
    big = json.dumps(PRESETS["fp8_sol_k"].to_dict()).replace('"sol_tau": 1.0',
                                                            '"sol_tau": 1' + "0" * 400)
    with pytest.raises(RecipeError, match="sol_tau.*past the float range"):
        get_recipe(big)
    assert get_recipe("fp8_dense : qk_block=32").qk_block == 32


def test_report_grid_names_tell_same_named_custom_recipes_apart():
    from workbench.recipes import PRESETS
    from workbench.report.export import _grid_name

    a = dict(PRESETS["fp8_dense"].to_dict(), name="mine")
    b = dict(a, qk_block=32, hadamard=True)
    plan = {"workbench_plan": 1, "default": "a", "recipes": {"a": a, "b": b},
            "entries": [{"step": 0, "layer": 1, "recipe": "b"}]}
    names = [_grid_name(json.dumps(plan), 0, layer) for layer in (0, 1)]
    assert names[0] != names[1] and names[1].startswith("b ")  # were both "mine (custom recipe)"

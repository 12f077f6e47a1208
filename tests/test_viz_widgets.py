"""The smoothing explorer keeps the recipes it is given and says what the table says.

Runs the real widget classes (no browser; ``tests/test_browser.py`` drives the page) on the
shipped capture store.
"""

from __future__ import annotations

import re

import pytest

pytest.importorskip("ipywidgets")

from workbench.capture import open_capture  # noqa: E402
from workbench.evaluate import find_store  # noqa: E402
from workbench.metrics import fmt_benefit  # noqa: E402
from workbench.recipes import get_recipe  # noqa: E402
from workbench.report.accuracy_table import accuracy_table  # noqa: E402
from workbench.viz.widgets import SmoothingExplorer  # noqa: E402

A = "fp8_sol_unsmoothed:sol_tau=0.5"
B = "fp8_dense:p_scaling=rowmax448,out_format=exact"


@pytest.fixture(scope="module")
def explorer():
    return SmoothingExplorer(find_store(), recipe_a=A, recipe_b=B, heatmap=False)


def test_given_recipes_keep_their_overrides(explorer):
    ex = explorer
    assert ex.recipe_a() == get_recipe(A) and ex.recipe_b() == get_recipe(B)
    assert (ex.w_pscale.value, ex.w_out.value) == ("rowmax448", "exact")
    assert ex.names() == {"A": f"A {A}", "B": f"B {B}"}
    # the numbers are the accuracy table's for the same entry, heads and rows
    cap = open_capture(find_store())
    step, layer = ex.w_step.value, ex.w_layer.value
    q, k, v = cap.qkv(step, layer)
    t = accuracy_table(q.float(), k.float(), v.float(), A, B, layout=cap.layout,
                       rotated=cap.rotated_channels, n_queries=ex.w_queries.value)
    r = ex.comparison.readout()
    assert r["A"]["output_mse"] == pytest.approx(t.output["mse"]["a"], rel=1e-12)
    assert r["B"]["output_mse"] == pytest.approx(t.output["mse"]["b"], rel=1e-12)
    assert r["B"]["output_rel_l2"] == pytest.approx(t.output["rel_l2"]["b"], rel=1e-12)


def test_readout_has_interval_segments_and_drift(explorer):
    ex = explorer
    c = ex.comparison
    text = ex.w_readout.value
    lo, hi = c.benefit_ci("A", "B")
    assert f"(95% CI {fmt_benefit(lo)} to {fmt_benefit(hi)})" in text
    for name in (n for n, *_ in c.layout.bands()):
        assert f"output MSE, {name} (" in text
    rows = re.findall(r"<td>([KV]) token-mean drift, ([^<]+)</td>", text)
    assert rows == [("K", "rotated channels 0-95"), ("K", "pass-through channels 96-127"),
                    ("V", "channels 0-95 (K&#x27;s rotated span)"),
                    ("V", "channels 96-127 (K&#x27;s pass-through span)")]
    b_val = re.search(r'data-key="B\.drift_k_pass">([^<]+)<', text).group(1)
    assert float(b_val) == pytest.approx(c.evals["B"].drift_summary["k_pass"], rel=1e-3)
    assert "nan" not in text


def test_controls_override_only_what_changes(explorer):
    ex = explorer
    before = ex.comparison.readout()["B"]["output_mse"]
    ex.w_pscale.value = "unit"
    assert ex.recipe_b() == get_recipe("fp8_dense:out_format=exact")
    after = ex.comparison.readout()["B"]["output_mse"]
    assert after != before  # P scaling changes the error the recipe makes
    ex.w_pscale.value = "rowmax448"
    assert ex.recipe_b() == get_recipe(B)
    assert ex.comparison.readout()["B"]["output_mse"] == before
    # a preset chosen from the dropdown loads all of its fields; unsmoothing drops the correction
    ex.w_b.value = "fp8_sol_kv_corrected"
    assert ex.recipe_b() == get_recipe("fp8_sol_kv_corrected") and ex.w_pscale.value == "unit"
    ex.w_smooth.value = "k"
    assert ex.recipe_b() == get_recipe("fp8_sol_k").with_(name="fp8_sol_kv_corrected")
    assert ex.recipe_b().to_string() == "fp8_sol_kv_corrected:smoothing=k,v_bias_correction=false"
    ex.w_smooth.value = "kv"
    assert ex.recipe_b() == get_recipe("fp8_sol_kv_corrected")
    assert ex.error is None


# -- findings of a review (2026-12-03), each reproduced first on the tree before its fix ---------

def _small(**kw):
    from workbench.evaluate import ReplaySource

    kw = {"n_queries": 16, "heatmap": False, **kw}
    return SmoothingExplorer(source=ReplaySource(find_store(), device="cpu"), **kw)


def test_two_custom_recipes_of_one_name_both_run():
    """Two recipes with the name "custom" shared a dropdown label, so A ran B (before: both
    columns 2.07e-4 with A at smoothing kv)."""
    from workbench.evaluate import evaluate_entry
    from workbench.recipes import AttentionRecipe

    ra = AttentionRecipe(name="custom", smoothing="none", v_bias_correction=False)
    rb = AttentionRecipe(name="custom")
    ex = _small(recipe_a=ra.to_json(), recipe_b=rb.to_json())
    assert ex.recipe_a() == ra and ex.recipe_b() == rb
    want = evaluate_entry(ex.source, ex.w_step.value, ex.w_layer.value, {"a": ra},
                          heads=ex.selected_heads(), n_queries=16).evals["a"]
    assert ex.comparison.readout()["A"]["output_mse"] == pytest.approx(
        want.overall["attention_output"]["mse"], rel=1e-12)


def test_dense_policy_names_what_ran_and_plans_bad_entries_are_named():
    ex = _small()
    ex.w_policy.value = True  # step 0 of the shipped capture: both recipes dense BF16
    assert all("@dense_policy" in n for n in ex.names().values()), ex.names()
    for kw, needle in ((dict(recipe_b={"workbench_plan": 1, "name": "p", "default": "b",
                                       "recipes": {"b": "bf16"}, "entries": []}), "recipe_b"),
                       (dict(step=99), "step: 99"), (dict(n_queries=4), "n_queries: 4")):
        with pytest.raises(ValueError, match=needle):
            _small(**kw)


def test_an_invalid_combination_clears_the_figures_and_names_still_answer():
    """After an invalid combination the old figures were left, read as the new settings', and
    names() raised."""
    ex = _small(recipe_b="fp8_sol_kv_corrected:dense_prefix=false,prefix_blocks_exact=true")
    ex.w_sparse.value = "dense"
    assert ex.error and "prefix_blocks_exact" in ex.error
    assert len(ex.fig_bars.data) == 0 and "not computed" in ex.fig_bars.layout.title.text
    assert "not computed" in ex.w_readout.value
    assert "invalid" in ex.names()["B"]
    ex.w_sparse.value = "sol"  # valid again: drawn again
    assert ex.error is None and len(ex.fig_bars.data) > 0


def test_switching_stores_back_to_the_in_memory_source():
    import torch

    from workbench.evaluate import ReplaySource

    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, 256, 2, 64, generator=g) for _ in range(3))
    ex = SmoothingExplorer(source=ReplaySource(tensors=(q, k, v), device="cpu"), n_queries=16,
                           heatmap=False)
    mine = ex.source
    ex.w_store.value = str(find_store())
    assert ex.source is not mine
    ex.w_store.value = "tensors"
    assert ex.source is mine and ex.error is None


def test_figure_updates_clear_unset_properties_and_benefits_diverge():
    """A small grid's cell text stayed on a large grid drawn in its place; an all-positive
    benefit grid lost its diverging colours; a missing scan value was drawn as "unclear"."""
    import numpy as np
    import plotly.graph_objects as go

    from workbench.viz.figures import per_head_heatmap
    from workbench.viz.scan_figures import smoothing_effect
    from workbench.viz.widgets import _update_in_place

    fw = go.FigureWidget()
    _update_in_place(fw, per_head_heatmap(np.ones((10, 1)), layers=range(10), heads=[5]))
    assert fw.data[0].text is not None
    _update_in_place(fw, per_head_heatmap(np.ones((10, 24)), layers=range(10), heads=range(24)))
    assert fw.data[0].text is None
    ben = per_head_heatmap(np.full((2, 2), 5.0), layers=[0, 1], heads=[0, 1],
                           metric="benefit %", log_color=False)
    assert ben.data[0].zmid == 0 and ben.data[0].colorscale[0][1] != \
        per_head_heatmap(np.ones((2, 2)), layers=[0, 1], heads=[0, 1]).data[0].colorscale[0][1]
    fig = smoothing_effect({"a -> b": np.array([[[10, 5, 15], [np.nan] * 3]])}, steps=[0],
                           layers=[0, 1])
    assert fig.data[0].z[1][0] is None and fig.data[0].text[1][0] == ""


def test_an_evaluation_error_clears_and_the_policy_grid_names_its_recipes():
    """A review's findings: an evaluation that failed left the previous numbers on screen and in
    .comparison under the new names; the heatmap under the dense policy was titled with this
    layer's recipe although each layer ran its own; a placeholder kept the routing map's axes."""
    from workbench.evaluate import ReplaySource

    base = ReplaySource(find_store(), device="cpu")
    q, k, v = base.qkv(0, 3)
    src = ReplaySource(tensors=(q, k, v), layout=base.layout, rotated=96, causal=True,
                       device="cpu")
    ex = SmoothingExplorer(source=src, n_queries=16, heatmap=False, recipe_a="fp8_dense",
                           recipe_b="fp8_dense_kv_corrected")
    assert ex.comparison is not None
    ex.w_sparse.value = "sol"  # evaluate raises: causal replays take dense recipes only
    assert ex.error and ex.comparison is None
    assert "not computed" in ex.w_readout.value and len(ex.fig_bars.data) == 0
    assert not ex.fig_along.layout.shapes and not ex.fig_along.layout.annotations

    ex = _small(recipe_b="fp8_sol_kv_corrected:dense_steps=0", heatmap=True, step=8, layer=0)
    ex.w_policy.value = True
    title = ex.fig_heat.layout.title.text
    assert "BF16 at layers < 2" in title, title
    ex.w_sparse.value = "dense"  # the routing map's placeholder: no routing axes left
    assert ex.fig_route.layout.xaxis.title.text is None

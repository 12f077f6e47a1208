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

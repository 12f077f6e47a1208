"""The notebook-facing API under misuse and edge cases (findings of a review, each reproduced
first on the tree before its fix): cached evaluations follow in-place edits and the layout, a
plan runs its entry's recipe in ``evaluate_entry``, recipe fields are type-checked naming the
field, K/V-boundary grids under GQA, routing maps averaged over a batch, chunk sizes named."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

from workbench.attention import SegmentLayout, recipe_attention
from workbench.evaluate import ReplaySource, evaluate, evaluate_entry, layer_head_grid
from workbench.recipes import PRESETS, RecipeError, get_recipe

ROOT = Path(__file__).resolve().parents[1]


def _qkv(B=1, S=128, H=2, Hkv=2, D=32, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(B, S, H, D, generator=g), torch.randn(B, S, Hkv, D, generator=g),
            torch.randn(B, S, Hkv, D, generator=g))


def test_evaluate_recomputes_after_an_in_place_edit_and_a_new_layout():
    """The float64 reference and the caller's cache follow the tensors' contents and the layout
    (before: keyed by id(), so `v.mul_(3)` left the old reference: exact's MSE 0.086, not 1e-14;
    another layout returned the first one's segments)."""
    q, k, v = _qkv()
    cache: dict = {}
    evaluate(q, k, v, {"e": "exact"}, n_queries=16, cache=cache)
    v.mul_(3)
    c = evaluate(q, k, v, {"e": "exact"}, n_queries=16, cache=cache)
    assert c.evals["e"].overall["attention_output"]["mse"] < 1e-10
    S = q.shape[1]
    a = evaluate(q, k, v, {"r": "fp8_dense"}, n_queries=16, cache=cache,
                 layout=SegmentLayout.tokens(S))
    two = SegmentLayout.of([("prompt", S // 2), ("answer", S - S // 2)])
    b = evaluate(q, k, v, {"r": "fp8_dense"}, n_queries=16, cache=cache, layout=two)
    assert list(a.evals["r"].segments) == ["tokens"]
    assert list(b.evals["r"].segments) == ["prompt", "answer"]


def test_evaluate_entry_runs_a_plans_recipe_of_the_entry():
    """A plan given to evaluate_entry runs the recipe it plans at (step, layer), as the grids,
    `table` and `report` do (before: its default recipe, bf16, at a planned fp8_dense entry)."""
    plan = {"workbench_plan": 1, "name": "p", "default": "bf16",
            "recipes": {"bf16": "bf16", "fp8": "fp8_dense"},
            "entries": [{"step": 0, "layer": 3, "recipe": "fp8"}]}
    src = ReplaySource(ROOT / "captures" / "demo_h3_nano.zarr", device="cpu")
    got = evaluate_entry(src, 0, 3, {"p": plan, "f": "fp8_dense", "b": "bf16"}, heads=[0, 1],
                         n_queries=16).evals
    mse = {n: got[n].overall["attention_output"]["mse"] for n in got}
    assert mse["p"] == mse["f"] and mse["p"] > 100 * mse["b"]


def test_recipe_fields_are_type_checked_naming_the_field():
    """A string "false" in a bool field ran the Hadamard rotation (before: accepted, and its
    to_string round trip gave another recipe); 64.5 tokens per block crashed far away."""
    for kw, field in ((dict(hadamard="false"), "hadamard"), (dict(qk_block=64.5), "qk_block"),
                      (dict(sol_tau="0.5"), "sol_tau"), (dict(dense_steps=True), "dense_steps")):
        with pytest.raises(RecipeError, match=f"recipe field '{field}'"):
            PRESETS["fp8_dense"].with_(**kw)
    r = PRESETS["fp8_sol_kv_corrected"].with_(sol_tau=1, dense_steps=np.int64(3))
    assert type(r.sol_tau) is float and type(r.dense_steps) is int
    assert get_recipe(r.to_string()) == r
    assert PRESETS["fp8_sol_kv_corrected"].with_(sol_tau=1) == PRESETS["fp8_sol_kv_corrected"]


def test_k_boundary_grid_under_gqa_shows_each_query_heads_group():
    """layer_head_grid at a K / V boundary under GQA (4 query heads on 2 K/V heads): one column
    per query head, its group's value (before: numpy's broadcast error)."""
    q, k, v = _qkv(S=128, H=4, Hkv=2)
    src = ReplaySource(tensors=(q, k, v), device="cpu")
    g = layer_head_grid(src, 0, "fp8_dense", boundary="quanted_k", n_queries=8)["mse"]
    assert g.shape == (1, 4) and g[0, 0] == g[0, 1] and g[0, 2] == g[0, 3] and g[0, 0] != g[0, 2]


def test_routing_map_levels_count_every_batch_and_head_map():
    """A routing map averaged over batch 2 x 2 heads holds quarters; its colours count 4 maps
    (before: 2, so 0.25 was drawn as "summary" and 0.75 as "1/2 heads exact")."""
    from workbench.viz.figures import comparison_figures

    q, k, v = _qkv(B=2, S=512, H=2, Hkv=2, D=32, seed=1)
    c = evaluate(q, k, v, {"a": "fp8_dense", "b": "fp8_sol_kv_corrected:sol_tau=0.5"},
                 n_queries=16)
    assert c.evals["b"].block_maps == 4
    fig, _ = comparison_figures(c, "a", "b")["routing_map"]
    ticks = fig.data[0].colorbar.ticktext
    assert len(ticks) == 5 and "1/4 heads exact" in ticks and "3/4 heads exact" in ticks


def test_chunk_sizes_are_named_when_invalid():
    q, k, v = _qkv()
    for kw in (dict(key_chunk=0), dict(query_chunk=0)):
        with pytest.raises(ValueError, match=next(iter(kw))):
            recipe_attention(q, k, v, "fp8_dense", **kw)


def test_synthetic_config_refuses_what_it_would_silently_change():
    """rotated must be a multiple of 6 (H3's RoPE: rotated / 6 frequencies per axis; 64 rotated
    only 60 before, without a word); a video_grid that does not hold the video rows was replaced
    by a raster before."""
    from dataclasses import replace

    from workbench.synthetic import H3_SYNTHETIC, small_config

    with pytest.raises(ValueError, match="rotated: 64"):
        small_config(256, rotated=64)
    with pytest.raises(ValueError, match=r"video_grid: \(2, 2, 2\) holds 8 rows"):
        replace(H3_SYNTHETIC, video_grid=(2, 2, 2))
    assert small_config(256, rotated=60).rotated == 60


def test_evaluate_takes_inference_tensors():
    """Inference tensors have no version counter: evaluated without the cache (the version-keyed
    cache first made evaluate raise on them)."""
    with torch.inference_mode():
        q, k, v = _qkv()
    a = evaluate(q, k, v, {"r": "fp8_dense"}, n_queries=16, cache={})
    b = evaluate(q, k, v, {"r": "fp8_dense"}, n_queries=16, cache={})
    assert a.evals["r"].overall["attention_output"]["mse"] == \
        b.evals["r"].overall["attention_output"]["mse"] > 0

"""Labels that fit the model: segment layouts, channel groups and recipe names in every table.

An LLM's rows are not video, a model without RoPE has no rotated channels and one that rotates
every channel has no pass-through ones: names come from the layout and the rotated count, and an
empty group vanishes instead of printing nan or "64-63".
"""

from __future__ import annotations

import dataclasses
import math
import pickle

import pytest
import torch

from workbench.evaluate import ReplaySource, evaluate
from workbench.layout import H3_LIVE_LAYOUT, LayoutError, SegmentLayout
from workbench.metrics import channel_groups, drift_summary, error_by_segment, token_mean_drift
from workbench.recipes import PRESETS, get_recipe
from workbench.report.accuracy_table import accuracy_table


def _qkv(S=256, H=2, Hkv=1, D=64, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(1, S, H, D, generator=g)
    k = torch.randn(1, S, Hkv, D, generator=g) + 2.0 * torch.randn(D, generator=g)
    v = torch.randn(1, S, Hkv, D, generator=g) + torch.randn(D, generator=g)
    return q, k, v


# -- SegmentLayout --------------------------------------------------------------------------------
def test_h3_layout_keeps_fields_prefix_and_stored_form():
    lay = H3_LIVE_LAYOUT
    assert (lay.text, lay.conditioning, lay.audio, lay.video) == (14, 0, 356, 32256)
    assert lay.prefix_len == 370 and lay.total == 32626 and lay.generated == "video"
    # stores written before named segments hold exactly these four keys: both ways
    assert lay.to_dict() == {"text": 14, "conditioning": 0, "audio": 356, "video": 32256}
    assert SegmentLayout.from_dict({"text": 14, "audio": 356, "video": 32256}) == lay
    assert SegmentLayout.parse("text:14,audio:356,video:32256") == lay
    assert lay.bands() == [("text", 0, 14), ("audio", 14, 370), ("video", 370, 32626)]
    assert repr(lay) == "SegmentLayout(text=14, conditioning=0, audio=356, video=32256)"


def test_named_segments_tokens_and_round_trips():
    tok = SegmentLayout.tokens(100)
    assert tok.bands() == [("tokens", 0, 100)] and tok.prefix_len == 0 and tok.video == 0
    assert tok.to_dict() == {"segments": [["tokens", 100]], "prefix_segments": 0}
    lay = SegmentLayout.parse("sink:4,prompt:60,answer:36")
    assert lay.prefix_len == 64 and lay.generated == "answer" and lay.total == 100
    assert lay.segment_of(torch.tensor([0, 3, 4, 63, 64, 99])) == [
        "sink", "sink", "prompt", "prompt", "answer", "answer"]
    assert lay.describe() == "sink 4 | prompt 60 | answer 36 (prefix 64 rows)"
    for x in (tok, lay, SegmentLayout.of({"a": 3, "b": 0, "c": 5}, prefix_segments=1)):
        assert SegmentLayout.from_dict(x.to_dict()) == x
        assert pickle.loads(pickle.dumps(x)) == x
    assert dataclasses.replace(lay, prefix_segments=1).prefix_len == 4


@pytest.mark.parametrize("text, match", [
    ("a:1,a:2", "appear more than once"),
    ("tokens", "not NAME:ROWS"),
    ("tokens:ten", "not an integer"),
    ("9x:3", "must start with a letter"),
    ("x:-1", "non-negative"),
])
def test_bad_layouts_name_the_segment(text, match):
    with pytest.raises(LayoutError, match=match):
        SegmentLayout.parse(text)


def test_bad_stored_layout_and_prefix():
    with pytest.raises(LayoutError, match="unknown field"):
        SegmentLayout.from_dict({"text": 1, "frames": 3})
    with pytest.raises(LayoutError, match="prefix_segments"):
        SegmentLayout.of([("a", 1)], prefix_segments=2)


# -- channel groups -------------------------------------------------------------------------------
def test_channel_groups_drop_the_empty_group():
    assert [g[1] for g in channel_groups(96, 128)] == ["rotated channels 0-95",
                                                       "pass-through channels 96-127"]
    assert [g[0] for g in channel_groups(0, 64)] == ["pass"]
    assert [g[0] for g in channel_groups(64, 64)] == ["rot"]
    assert channel_groups(None, 64)[0][:2] == ("all", "channels 0-63 (RoPE split unknown)")
    with pytest.raises(ValueError, match="0..64"):
        channel_groups(96, 64)
    with pytest.raises(ValueError, match="0..64"):
        token_mean_drift(torch.zeros(1, 2, 1, 64), torch.zeros(1, 2, 1, 64), rotated=96)
    d = torch.arange(8.0).reshape(1, 1, 8)
    assert drift_summary(d, 6) == {"rot": 2.5, "pass": 6.5}
    assert drift_summary(d, 8) == {"rot": 3.5}


def test_error_by_segment_means_rows_of_each_segment():
    along = {"row": [0, 5, 6, 9], "mse": [1.0, 3.0, 10.0, 20.0],
             "segment": ["sys", "sys", "user", "user"],
             "bands": [("sys", 0, 6), ("user", 6, 10), ("empty", 10, 12)]}
    assert error_by_segment(along) == {"sys": {"rows": 2, "mse": 2.0},
                                       "user": {"rows": 2, "mse": 15.0}}


# -- the evaluation and the table on non-H3 data --------------------------------------------------
@pytest.mark.parametrize("rotated, present, absent", [
    (64, ["K, rotated channels 0-63"], ["pass-through"]),
    (0, ["K, pass-through channels 0-63"], ["rotated channels"]),
    (32, ["K, rotated channels 0-31", "V, channels 32-63 (K's pass-through span)"],
     ["V, rotated", "V, pass-through"]),
])
def test_table_on_llm_shaped_input(rotated, present, absent):
    q, k, v = _qkv()
    t = accuracy_table(q, k, v, "fp8_dense", "fp8_dense_k", rotated=rotated, n_queries=32)
    md = t.to_markdown()
    for s in present:
        assert s in md
    for s in absent + ["nan", "video", "64-63"]:
        assert s not in md
    # one segment: no per-segment table
    assert "by segment" not in md
    keys = set(t.drift) - {"rotated"}
    assert keys == {f"{x}_{g}" for x in "kv" for g, *_ in channel_groups(rotated, 64)}
    for key in keys:
        assert all(math.isfinite(t.drift[key][r]) for r in "ab")


def test_per_segment_table_comes_from_the_layout():
    q, k, v = _qkv(S=320)
    lay = SegmentLayout.parse("system:64,user:128,answer:128")
    t = accuracy_table(q, k, v, "fp8_dense", "fp8_dense_k", layout=lay, rotated=48,
                       n_queries=40)
    md = t.to_markdown()
    assert "| Attention output MSE by segment |" in md
    for line in ("| system (rows 0-63) |", "| user (rows 64-191) |", "| answer (rows 192-319) |"):
        assert line in md
    # each segment's MSE is the mean of the squared output error over its sampled rows
    rows = torch.tensor(t.query_rows)
    seg = lay.segment_of(rows)
    from workbench.attention import dense_attention_f64, recipe_attention

    ref, _ = dense_attention_f64(q, k, v, query_index=rows)
    res = recipe_attention(q, k, v, "fp8_dense_k", query_index=rows, layout=lay)
    err = (res.out.double() - ref).pow(2).mean(dim=(0, 2, 3))
    want = float(err[[s == "user" for s in seg]].mean())
    assert t.segments["user"]["b"] == pytest.approx(want, rel=1e-9)
    assert t.segments["user"]["rows"] == sum(s == "user" for s in seg)


def test_evaluate_defaults_to_tokens_segment_and_unknown_rotation():
    q, k, v = _qkv()
    c = evaluate(q, k, v, {"A": "fp8_dense"}, n_queries=16)
    assert c.layout.bands() == [("tokens", 0, 256)]
    assert set(c.evals["A"].drift_summary) == {"k_all", "v_all"}
    assert set(c.evals["A"].segments) == {"tokens"}
    src = ReplaySource(tensors=(q, k, v))
    assert "tokens 256" in src.describe() and "rotated channels unknown" in src.describe()
    assert "video" not in src.describe()


# -- recipes say their numerics -------------------------------------------------------------------
def test_describe_shows_p_scaling_out_format_and_accumulation():
    d = get_recipe("fp8_dense:p_scaling=rowmax448,out_format=exact,accumulation=reduced").describe()
    assert "P fp8_e4m3 scaling rowmax448" in d and "out exact" in d
    assert "accum reduced 13b truncate flush 128 keys" in d
    assert "out bf16" in PRESETS["bf16"].describe() and "scaling" not in PRESETS["bf16"].describe()
    assert "QK fp8_e4m3/block32" in get_recipe("fp8_dense:qk_block=32").describe()


def test_table_headers_carry_the_override_string():
    q, k, v = _qkv()
    a = "fp8_dense:p_scaling=rowmax448"
    b = "fp8_dense:p_scaling=exp2_offset8,out_format=exact"
    md = accuracy_table(q, k, v, a, b, rotated=64, n_queries=16).to_markdown()
    assert f"| Boundary | A `{a}` MSE | B `{b}` MSE | Benefit |" in md
    assert f"| Attention output | A `{a}` | B `{b}` |" in md
    custom = get_recipe(PRESETS["fp8_dense"].to_dict() | {"name": "mine"})
    assert custom.label() == "mine (custom recipe)"

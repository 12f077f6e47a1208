"""Generate, compare, import, inspect and resume under misuse (findings of a review, each
reproduced first on the tree before its fix): GQA head subsets read the right K/V heads, imports
that would write an unreadable store are refused, compare names what ran and checks every recipe
before generating, a clip folder with only video.mp4 compares, inspect shows a recipe's
overrides, a refused resume shows what differs, flags named when out of range."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from test_store_safety import cli, one_line_error  # noqa: E402

TINY = ["--model", "h3-tiny", "--steps", "2", "--quiet"]


def _gqa(S=64, H=8, Hkv=2, D=32, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return {"q": torch.randn(S, H, D, generator=g).to(dtype),
            "k": torch.randn(S, Hkv, D, generator=g).to(dtype),
            "v": torch.randn(S, Hkv, D, generator=g).to(dtype)}


def test_a_gqa_head_subset_reads_each_query_heads_own_kv_head(tmp_path, capsys):
    """Query heads 0, 4, 5, 6 of 8 on 2 K/V heads: head 4 reads K/V head 1 (before: the K/V
    heads were deduplicated to [0, 1] and GQA's i // 2 rule gave head 4 K/V head 0, so its error
    changed with the company it was selected in); 0, 1, 2 of 4 on 2 no longer fail."""
    from workbench.capture import open_capture

    src = _gqa()
    torch.save(src, tmp_path / "g.pt")
    store = tmp_path / "g.zarr"
    assert cli(capsys, "import", tmp_path / "g.pt", "--out", store, "--quiet")[0] == 0
    cap = open_capture(store)
    for heads in ([0, 4, 5, 6], [4], [6, 0], [0, 1, 4, 5], [1, 2, 3]):
        q, k, v = cap.qkv(0, 0, heads=heads)
        group = q.shape[2] // k.shape[2]
        for i, h in enumerate(heads):
            assert torch.equal(q[0, :, i], src["q"][:, h])
            assert torch.equal(k[0, :, i // group], src["k"][:, h // 4]), (heads, h)
            assert torch.equal(v[0, :, i // group], src["v"][:, h // 4]), (heads, h)
    rows = []
    for heads in ("4", "0,4,5,6"):
        rc, out, _ = cli(capsys, "table", "--store", store, "--step", "0", "--layer", "0",
                         "--a", "fp8_dense", "--b", "fp8_dense_k", "--queries", "16",
                         "--heads", heads)
        assert rc == 0
        rows.append([x for x in out.splitlines() if x.startswith("| output MSE A |")][0])
    assert rows[0].split("|")[2] == rows[1].split("|")[3]  # head 4 alone = head 4 in the set


def test_import_refuses_mixed_dtypes_and_empty_tensors_naming_them(tmp_path, capsys):
    """q float32 with k / v float16 wrote a store nothing could read (before: "imported 1
    entries", then inspect --verify found 4 problems); a zero-length tensor failed with a
    ZeroDivisionError. Both refused, naming the tensors, no store written."""
    mixed = _gqa()
    mixed["k"], mixed["v"] = mixed["k"].half(), mixed["v"].half()
    empty = {"q": torch.zeros(0, 4, 32), "k": torch.zeros(0, 2, 32), "v": torch.zeros(0, 2, 32)}
    for name, data, needle in (("m", mixed, "q is torch.float32, k torch.float16"),
                               ("e", empty, "zero-length")):
        torch.save(data, tmp_path / f"{name}.pt")
        rc, _, err = cli(capsys, "import", tmp_path / f"{name}.pt", "--out",
                         tmp_path / f"{name}.zarr", "--quiet")
        one_line_error(rc, err, "import", needle)
        assert not (tmp_path / f"{name}.zarr").exists()


def test_compare_checks_every_recipe_first_and_names_what_ran(tmp_path, capsys):
    """A bad second recipe is refused before the first clip is generated (before: after it,
    leaving a half-written --out); a recipe's JSON text gets a short folder name (before: "File
    name too long" after generating); with --dense-steps the table and compare.json say what ran
    (before: the plain spec, as if it had run unchanged)."""
    out = tmp_path / "c"
    rc, _, err = cli(capsys, "compare", "--recipes", "bf16,fp8_dense:smoothing=q", *TINY,
                     "--out", out)
    one_line_error(rc, err, "compare", "fp8_dense:smoothing=q", "smoothing")
    assert not out.exists() or not any(out.iterdir())
    from workbench.recipes import PRESETS

    spec = json.dumps({**json.loads(PRESETS["fp8_dense"].to_json()), "name": "mine"})
    rc, stdout, err = cli(capsys, "compare", "--recipes", f"bf16,{spec}",
                          "--dense-steps", "0", *TINY, "--out", out)
    assert rc == 0, err
    folders = json.loads((out / "compare.json").read_text())["folders"]
    assert all(len(name) < 100 for name in folders.values())
    assert folders[spec].startswith("mine-json-")
    summary = json.loads((out / "compare.json").read_text())
    from workbench.recipes import get_recipe

    assert summary["dense_steps"] == 0
    assert summary["ran"][spec] == get_recipe(spec).with_(dense_steps=0).to_string()
    assert "what ran:" in stdout


def test_compare_reads_a_clip_folder_with_only_its_video_and_audio(tmp_path, capsys):
    """The documented fallback (video.mp4 + audio.wav, no clip.safetensors) compares against a
    full clip folder (before: "video shapes differ: (16, 3, 16, 16) vs (16, 3, 128, 128)")."""
    a = tmp_path / "A"
    assert cli(capsys, "generate", *TINY, "--out", a)[0] == 0
    b = tmp_path / "B"
    b.mkdir()
    for name in ("video.mp4", "audio.wav"):
        shutil.copy(a / name, b / name)
    rc, out, err = cli(capsys, "compare", a, b, "--out", tmp_path / "cmp")
    assert rc == 0, err
    m = json.loads((tmp_path / "cmp" / "metrics.json").read_text())
    psnr = m.get("psnr_db", m.get("metrics", {}).get("psnr_db"))
    assert psnr > 25, m  # the same clip, through the codec


def test_inspect_shows_overrides_and_resume_shows_what_differs(tmp_path, capsys):
    store = tmp_path / "s.zarr"
    assert cli(capsys, "generate", *TINY, "--recipe", "fp8_dense:smoothing=k", "--out",
               tmp_path / "clip", "--capture", store, "--layers", "0")[0] == 0
    rc, out, _ = cli(capsys, "inspect", store)
    assert rc == 0 and "fp8_dense:smoothing=k" in out
    # the store names its model and capture point (before: "model: None", "explicit record()")
    assert "model: diffusers.models.transformers.transformer_minimax_h3.MiniMaxH3" in out
    assert "capture point: workbench generate" in out
    from workbench.capture.identity import RunMismatchError, check_resume_identity
    from workbench.recipes import PRESETS

    a = PRESETS["fp8_dense"].to_json()
    b = PRESETS["fp8_dense"].with_(smoothing="k", v_bias_correction=False).to_json()
    with pytest.raises(RunMismatchError) as exc:
        check_resume_identity({"recipe": a}, {"recipe": b}, "S")
    assert 'store has {"smoothing": "none"}, this run has {"smoothing": "k"}' in str(exc.value)


def test_out_of_range_flags_are_named(tmp_path, capsys):
    rc, _, err = cli(capsys, "generate", *TINY, "--backend", "bogus", "--out", tmp_path / "g")
    one_line_error(rc, err, "generate", "--backend", "bogus")
    assert not (tmp_path / "g" / "config.json").exists()
    store = Path(__file__).resolve().parents[1] / "captures" / "demo_h3_nano.zarr"
    rc, _, err = cli(capsys, "archive", store, tmp_path / "a.zarr", "--level", "23")
    one_line_error(rc, err, "archive", "--level", "1 to 22")


def test_generate_notes_plan_entries_outside_the_run(tmp_path, capsys):
    """A plan entry at a layer or step this run never reaches is noted (before: silence, and the
    summary counted the plan's entries as if they ran)."""
    plan = {"workbench_plan": 1, "name": "far", "default": "bf16",
            "recipes": {"bf16": "bf16", "fast": "fp8_dense"},
            "entries": [{"step": 0, "layer": 0, "recipe": "fast"},
                        {"step": 0, "layer": 99, "recipe": "fast"}]}
    (tmp_path / "p.json").write_text(json.dumps(plan))
    rc, _, err = cli(capsys, "generate", *TINY, "--recipe", tmp_path / "p.json", "--out",
                     tmp_path / "g")
    assert rc == 0
    assert "plan 'far': 1 of its 2 entries lie outside this run" in err and "(0, 99)" in err

"""Bring your own tensors: .pt / .safetensors / .npy / .npz sources become capture stores that
replay, evaluate and tabulate like a live capture; shapes that do not fit are refused by name."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from workbench.capture import open_capture
from workbench.capture.importer import ImportDataError, import_tensors
from workbench.evaluate import ReplaySource, evaluate_entry
from workbench.layout import SegmentLayout


def _entry(S=96, H=4, Hkv=2, D=64, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(S, H, D, generator=g)
    k = torch.randn(S, Hkv, D, generator=g) + 3 * torch.randn(D, generator=g)
    v = torch.randn(S, Hkv, D, generator=g)
    return {"q": q.to(dtype), "k": k.to(dtype), "v": v.to(dtype)}


def test_pt_nested_dict_gqa_round_trip(tmp_path):
    data = {"layers": {"0": _entry(seed=0), "1": _entry(seed=1, dtype=torch.bfloat16)}}
    torch.save(data, tmp_path / "acts.pt")
    cap, entries = import_tensors([tmp_path / "acts.pt"], tmp_path / "s.zarr", rotated=64)
    assert [(e.name, e.step, e.layer) for e in entries] == [("layers.0", 0, 0), ("layers.1", 0, 1)]
    r = open_capture(tmp_path / "s.zarr")
    assert r.layers == [0, 1] and r.rotated_channels == 64
    assert r.layout == SegmentLayout.tokens(96)
    q, k, v = r.qkv(0, 1)
    assert q.shape == (1, 96, 4, 64) and k.shape == (1, 96, 2, 64)
    assert q.dtype == torch.bfloat16 and torch.equal(q[0], data["layers"]["1"]["q"])
    assert torch.equal(v[0], data["layers"]["1"]["v"])
    # the replay reads the labels from the store: one `tokens` segment, rotated 0-63 only
    src = ReplaySource(tmp_path / "s.zarr")
    assert "tokens 96" in src.describe() and "video" not in src.describe()
    c = evaluate_entry(src, 0, 0, {"A": "fp8_dense", "B": "fp8_dense_k"}, n_queries=16)
    assert set(c.evals["B"].drift_summary) == {"k_rot", "v_rot"}
    # K carries a large per-channel mean: K smoothing cuts the quantized K error
    assert c.evals["B"].overall["quanted_k"]["mse"] < 0.5 * c.evals["A"].overall["quanted_k"]["mse"]


def test_safetensors_npz_and_npy_folder(tmp_path):
    from safetensors.torch import save_file

    flat = {f"step{s}.layer{lay}.{r}": t.contiguous() for s in (2, 5) for lay in (3,)
            for r, t in _entry(seed=s, S=64, H=2, Hkv=2, D=32).items()}
    save_file(flat, str(tmp_path / "a.safetensors"))
    _, entries = import_tensors([tmp_path / "a.safetensors"], tmp_path / "a.zarr", rotated=0,
                                layout="prompt:16,answer:48", scale=0.125, causal=True)
    assert [(e.step, e.layer) for e in entries] == [(2, 3), (5, 3)]
    src = ReplaySource(tmp_path / "a.zarr")
    assert src.steps == [2, 5] and src.causal and src.scale == 0.125 and src.rotated == 0
    assert src.layout.bands() == [("prompt", 0, 16), ("answer", 16, 64)]
    c = evaluate_entry(src, 5, 3, {"A": "fp8_dense"}, n_queries=8)
    assert c.causal and c.scale == 0.125 and set(c.evals["A"].drift_summary) == {"k_pass",
                                                                                   "v_pass"}
    # a folder of .npy files, and an .npz: names from paths / keys
    d = tmp_path / "npy" / "block7"
    d.mkdir(parents=True)
    e = _entry(S=32, H=2, Hkv=1, D=16)
    for r, t in e.items():
        np.save(d / f"{r}.npy", t.numpy())
    np.savez(tmp_path / "b.npz", **{f"l2.{r}": t.numpy() for r, t in e.items()})
    _, entries = import_tensors([tmp_path / "npy", tmp_path / "b.npz"], tmp_path / "n.zarr",
                                rotated=16)
    assert sorted((x.name, x.layer) for x in entries) == [("block7", 7), ("l2", 2)]


@pytest.mark.parametrize("make, match", [
    (lambda e: {**e, "v": e["v"][..., :32]}, r"k \[1, 96, 2, 64\] and v \[1, 96, 2, 32\] differ"),
    (lambda e: {k: v for k, v in e.items() if k != "v"}, "has k, q but no v"),
    (lambda e: {**e, "q": e["q"].transpose(0, 1)}, r"heads first \(\[H, S, D\]\)"),
    (lambda e: {**e, "q": e["q"][:, :3]}, "3 query heads are not a multiple of 2 K/V heads"),
    (lambda e: {**e, "k": e["k"].to(torch.int32)}, "dtype torch.int32"),
    (lambda e: {**e, "bias": e["q"]}, "not named q, k or v: bias"),
    (lambda e: {**e, "q": e["q"][0]}, r"shape \[4, 64\]; expected \[S, heads, head_dim\]"),
])
def test_bad_sources_are_refused_by_name(tmp_path, make, match):
    torch.save(make(_entry()), tmp_path / "x.pt")
    with pytest.raises(ImportDataError, match=match):
        import_tensors([tmp_path / "x.pt"], tmp_path / "x.zarr")
    assert not (tmp_path / "x.zarr").exists()


@pytest.mark.parametrize("name, data, match", [
    ("bad.pt", b"garbage", "UnpicklingError: not a torch.save file of tensors"),
    ("bad.safetensors", b"garbage garbage", "SafetensorError"),
])
def test_unreadable_files_are_refused_by_name(tmp_path, name, data, match):
    """A file that is not what its suffix says is refused in one line naming it (before: the
    unpickler's or safetensors' traceback; torch's message even advised an unsafe load)."""
    (tmp_path / name).write_bytes(data)
    with pytest.raises(ImportDataError, match=rf"{name}: cannot read it \({match}"):
        import_tensors([tmp_path / name], tmp_path / "x.zarr")
    assert not (tmp_path / "x.zarr").exists()


def test_bad_layout_rotated_scale(tmp_path):
    torch.save(_entry(), tmp_path / "x.pt")
    with pytest.raises(ImportDataError, match="segments sum to 100 rows but the tensors have 96"):
        import_tensors([tmp_path / "x.pt"], tmp_path / "x.zarr", layout="a:50,b:50")
    with pytest.raises(ImportDataError, match="65 channels do not fit head dim 64"):
        import_tensors([tmp_path / "x.pt"], tmp_path / "x.zarr", rotated=65)
    with pytest.raises(ImportDataError, match="positive"):
        import_tensors([tmp_path / "x.pt"], tmp_path / "x.zarr", scale=0.0)
    with pytest.raises(FileNotFoundError, match="missing.pt"):
        import_tensors([tmp_path / "missing.pt"], tmp_path / "x.zarr")
    assert not (tmp_path / "x.zarr").exists()


# -- the command ---------------------------------------------------------------------------------
def test_import_cli_then_table_inspect_report(tmp_path, capsys):
    from workbench.cli import main

    torch.save({"layers": {"0": _entry(seed=0), "1": _entry(seed=1)}}, tmp_path / "a.pt")
    store = str(tmp_path / "a.zarr")
    assert main(["import", str(tmp_path / "a.pt"), "--out", store, "--layout",
                 "system:32,answer:64", "--rotated", "64", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert "imported 2 entries" in out and "system 32 | answer 64" in out
    assert main(["inspect", store, "--verify"]) == 0
    out = capsys.readouterr().out
    assert "segment layout: system 32 | answer 64 (prefix 32 rows)" in out
    assert "over rotated channels 0-63" in out and "pass-through" not in out
    assert "K rot" in out and "K pass" not in out and "all chunks pass crc32c" in out
    assert main(["table", "--store", store, "--step", "0", "--layer", "1", "--heads", "all",
                 "--a", "fp8_dense", "--b", "fp8_dense_k", "--queries", "16"]) == 0
    md = capsys.readouterr().out
    assert "Heads 0-3" in md and "| system (rows 0-31) |" in md and "| answer (rows 32-95) |" in md
    assert "K, rotated channels 0-63" in md and "pass-through" not in md and "nan" not in md
    assert main(["table", "--store", store, "--step", "0", "--layer", "1", "--heads", "1-2",
                 "--a", "fp8_dense", "--b", "fp8_dense_k", "--queries", "16"]) == 0
    assert "Heads 1,2" in capsys.readouterr().out
    # refusals: bad heads, an existing store, a bad layout, shapes that do not fit
    assert main(["table", "--store", store, "--step", "0", "--layer", "1", "--heads", "7"]) == 2
    assert "--heads: [7] not captured" in capsys.readouterr().err
    assert main(["import", str(tmp_path / "a.pt"), "--out", store, "--quiet"]) == 2
    assert main(["import", str(tmp_path / "a.pt"), "--out", str(tmp_path / "b.zarr"),
                 "--layout", "x:5", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "workbench import: error: --layout: segments sum to 5 rows" in err
    torch.save({"q": torch.randn(8, 2, 16), "k": torch.randn(8, 2, 8), "v": torch.randn(8, 2, 8)},
               tmp_path / "bad.pt")
    assert main(["import", str(tmp_path / "bad.pt"), "--out", str(tmp_path / "c.zarr")]) == 2
    assert "head dim 16 of q and 8 of k differ" in capsys.readouterr().err
    assert not (tmp_path / "b.zarr").exists() and not (tmp_path / "c.zarr").exists()


def test_causal_store_table_masks_and_says_so(tmp_path, capsys):
    from workbench.cli import main

    torch.save(_entry(S=128), tmp_path / "d.pt")
    store = str(tmp_path / "d.zarr")
    assert main(["import", str(tmp_path / "d.pt"), "--out", store, "--causal", "--rotated", "64",
                 "--quiet"]) == 0
    capsys.readouterr()
    args = ["table", "--store", store, "--step", "0", "--layer", "0", "--a", "fp8_dense",
            "--b", "fp8_dense_k", "--queries", "8"]
    assert main(args) == 0
    assert "causal: each row attends to the keys up to itself" in capsys.readouterr().out
    assert main(args + ["--no-causal"]) == 0
    cap = capsys.readouterr()
    assert "non-causal replay" in cap.out and "records a causal model" in cap.err
    # the seed's default recipes are sparse: refused for a causal replay, naming why
    assert main(["table", "--store", store, "--step", "0", "--layer", "0"]) == 2
    assert "causal" in capsys.readouterr().err


def test_report_on_a_store_with_gaps_and_all_heads(tmp_path, capsys):
    """`report` on a store lacking some (step, layer) pairs draws the missing layers of its
    per-layer heatmap as gaps (before: it failed on a valid entry, naming one never asked for);
    `--heads all` reports every captured head (before: silently heads 0-3)."""
    import json

    import numpy as np

    from workbench.cli import main

    src = {"step0": {"layer0": _entry(H=8, Hkv=2, seed=0), "layer1": _entry(H=8, Hkv=2, seed=1)},
           "step1": {"layer1": _entry(H=8, Hkv=2, seed=2)}}
    torch.save(src, tmp_path / "p.pt")
    store = str(tmp_path / "p.zarr")
    assert main(["import", str(tmp_path / "p.pt"), "--out", store, "--quiet"]) == 0
    capsys.readouterr()
    out = tmp_path / "rep"
    assert main(["report", store, "--step", "1", "--layer", "1", "--queries", "8",
                 "--heads", "all", "--formats", "html", "--out", str(out)]) == 0
    rep = json.loads((out / "report.json").read_text())
    assert rep["heads"] == list(range(8))
    grid = np.array(rep["layer_head_output_mse"]["b"], dtype=float)
    assert rep["layers"] == [0, 1] and grid.shape == (2, 8)
    assert np.isnan(grid[0]).all() and np.isfinite(grid[1]).all() and (grid[1] > 0).all()

"""Capture stores at their edges (a review's findings, each reproduced on the tree before its
fix): import names that share a folder, record() calls that would shadow or drop an entry or
mix dtypes, xarray coordinates that are the captured heads and rows, reordered K/V heads and an
infinite softmax scale in zarr.json, and "." as an output."""

from __future__ import annotations

import json
import os
import warnings

import numpy as np
import pytest
import torch

from workbench.capture import capture, open_capture
from workbench.capture.importer import ImportDataError, import_tensors
from workbench.cli import main


def _qkv(S=32, H=4, Hkv=2, D=8, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(1, S, H, D, generator=g).to(dtype),
            *(torch.randn(1, S, Hkv, D, generator=g).to(dtype) for _ in range(2)))


def test_import_refuses_names_that_share_a_folder(tmp_path):
    t = {n: torch.randn(32, 2, 8) for n in ("q", "k", "v")}
    src = tmp_path / "collide.pt"
    torch.save({"blk:0": t, "blk_0": t}, src)
    # was: one of the two kept, "imported 2 entries" printed
    with pytest.raises(ImportDataError, match="blk_0.*rename one"):
        import_tensors([src], tmp_path / "c.zarr")
    assert not (tmp_path / "c.zarr").exists()


def test_import_refuses_an_infinite_scale_and_warns_on_heads_first(tmp_path):
    src = tmp_path / "a.pt"
    torch.save({"q": torch.randn(12, 36, 32), "k": torch.randn(12, 36, 32),
                "v": torch.randn(12, 36, 32)}, src)  # [H, S, D] with H == Hkv
    with pytest.raises(ImportDataError, match="--scale.*finite"):  # was a store replay refused
        import_tensors([src], tmp_path / "s.zarr", scale=float("inf"))
    with pytest.warns(UserWarning, match="fewer rows than heads"):  # was silently [S=12, H=36]
        import_tensors([src], tmp_path / "h.zarr")


def test_record_refuses_shadowed_entries_and_mixed_dtypes(tmp_path):
    q, k, v = _qkv()
    with capture(None, tmp_path / "r.zarr", progress=False) as cap:
        cap.record("attn_a", q, k, v, step=0, layer=1)
        with pytest.raises(ValueError, match="step 0 layer 1 was already recorded.*'attn_a'"):
            cap.record("attn_b", q * 2, k, v, step=0, layer=1)  # readers disagreed which is (0, 1)
        with pytest.raises(ValueError, match="already recorded"):
            cap.record("attn:a", q, k, v, step=0, layer=2)  # the folder of attn_a: was dropped
        with pytest.raises(ValueError, match="one dtype"):  # was an entry no reader opens
            cap.record("mixed", q, k.bfloat16(), v.half(), step=0, layer=3)
    r = open_capture(tmp_path / "r.zarr")
    assert [(e.step, e.layer) for e in r.entries()] == [(0, 1)] and not r.verify()
    assert torch.equal(r.qkv(0, 1)[0].float(), q)


def test_xarray_coordinates_are_the_captured_heads_and_rows(tmp_path):
    q, k, v = _qkv(H=4, Hkv=4)
    rows = [0, 5, 31]
    with capture(None, tmp_path / "x.zarr", heads=[1, 3], query_rows=rows, progress=False) as cap:
        cap.record("attn", q, k, v, step=0, layer=0)
    ds = open_capture(tmp_path / "x.zarr").to_xarray(decode=True)
    assert list(ds["head"].values) == [1, 3] and list(ds["q_token"].values) == rows
    got = ds.q.sel(step=0, layer=0, batch=0, head=1, q_token=5).values
    assert np.array_equal(got, q[0, 5, 1].numpy())  # was head 3 (position 1)


def test_verify_names_reordered_kv_heads_and_an_infinite_scale(tmp_path):
    q, k, v = _qkv(H=4, Hkv=2)
    store = tmp_path / "v.zarr"
    with capture(None, store, progress=False) as cap:
        cap.record("attn", q, k, v, step=0, layer=0)
    entry = next(store.glob("entries/*/attn"))
    meta = json.loads((entry / "zarr.json").read_text())
    meta["attributes"]["kv_heads"] = [1, 0]  # re-pairs q heads with K/V heads on read
    (entry / "zarr.json").write_text(json.dumps(meta))
    root = json.loads((store / "zarr.json").read_text())
    root["attributes"]["softmax_scale"] = float("inf")
    (store / "zarr.json").write_text(json.dumps(root))
    problems = open_capture(store, strict=False).verify()
    assert any("kv_heads" in p and "ascending" in p for p in problems), problems
    assert any("softmax_scale" in p and "finite" in p for p in problems), problems


def test_dot_as_output_folder(tmp_path, capsys):
    src = tmp_path / "a.pt"
    torch.save({"blk0.q": torch.randn(32, 2, 8), "blk0.k": torch.randn(32, 2, 8),
                "blk0.v": torch.randn(32, 2, 8)}, src)
    (tmp_path / "imp").mkdir()
    (tmp_path / "arc").mkdir()
    cwd = os.getcwd()
    try:
        os.chdir(tmp_path / "imp")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            assert main(["import", str(src), "--out", ".", "--quiet"]) == 0
        os.chdir(tmp_path / "arc")  # was "Device or resource busy" (a sibling inside ".")
        assert main(["archive", str(tmp_path / "imp"), "."]) == 0, capsys.readouterr().err
    finally:
        os.chdir(cwd)
    r = open_capture(tmp_path / "arc")
    assert not r.verify() and len(r.entries()) == 1

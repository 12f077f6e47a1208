"""Capture stores under misuse (findings of a review, each reproduced first on the tree before
its fix): heads given out of order pair with their own K/V heads, a swapped chunk is refused by
readers and by archive, verify faults entry fields that change how a replay attends, a call a
store cannot hold is refused (record) or skipped with a warning (hooks), a repeated name is
said, and RoPE channel counts are not guessed for ALiBi or latent attention."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch

from workbench.capture import capture, open_capture

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "captures" / "demo_h3_nano.zarr"


def _qkv(S=32, H=8, Hkv=8, D=16, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(1, S, H, D, generator=g), torch.randn(1, S, Hkv, D, generator=g),
            torch.randn(1, S, Hkv, D, generator=g))


def test_heads_out_of_order_pair_with_their_own_kv_heads(tmp_path):
    """--heads 5,1 stored q as [5, 1] and K/V as [1, 5], so q head 5 met K/V head 1; GQA
    order 2,3,0,1 likewise. Now the heads are stored ascending and each reads its own."""
    for H, Hkv, heads in ((8, 8, [5, 1]), (4, 2, [2, 3, 0, 1])):
        q, k, v = _qkv(H=H, Hkv=Hkv)
        path = tmp_path / f"h{H}.zarr"
        with capture(None, path, heads=heads) as cap:
            cap.record("attn", q, k, v, step=0, layer=0)
        rq, rk, rv = open_capture(path).qkv(0, "attn")
        group = rq.shape[2] // rk.shape[2]
        for i, h in enumerate(sorted(heads)):
            assert torch.equal(rq[0, :, i], q[0, :, h])
            assert torch.equal(rk[0, :, i // group], k[0, :, h // (H // Hkv)])


def _swapped(tmp_path) -> Path:
    store = shutil.copytree(SHIPPED, tmp_path / "S.zarr")
    a = store / "entries/s00004/transformer_blocks.1/k/c/0/0/0/0"
    b = store / "entries/s00003/transformer_blocks.1/k/c/0/0/0/0"
    shutil.copy(a, b)  # a valid chunk of another entry, with its own valid crc32c
    return store


def test_a_swapped_chunk_is_refused_by_readers_and_by_archive(tmp_path, capsys):
    """Before: qkv(3, 1) read the other entry's K silently (table's benefit 4.51% for 28.63%)
    and `archive` wrote a store that then verified clean."""
    from workbench.capture.replay import ChecksumError
    from workbench.cli import main

    store = _swapped(tmp_path)
    with pytest.raises(ChecksumError, match="s00003/transformer_blocks.1.*chunk"):
        open_capture(store).qkv(3, 1)
    assert main(["archive", str(store), str(tmp_path / "a.zarr")]) == 2
    err = capsys.readouterr().err
    assert "checksum mismatch" in err and "s00003/transformer_blocks.1" in err
    assert not (tmp_path / "a.zarr").exists()


@pytest.mark.parametrize("edit, needle", [
    (lambda a: a["sdpa_kwargs"].update(is_causal="false"), "sdpa_kwargs.is_causal"),
    (lambda a: a["sdpa_kwargs"].update(scale=-5), "sdpa_kwargs.scale"),
    (lambda a: a.update(num_heads=a["num_heads"] * 2), "kv_heads"),
])
def test_verify_faults_entry_fields_that_change_the_replay(tmp_path, edit, needle):
    """A string is_causal made the replay causal, a negative scale changed `table`, a doubled
    num_heads made head selection read another K head: all passed verify before."""
    store = shutil.copytree(SHIPPED, tmp_path / "S.zarr")
    meta = store / "entries/s00003/transformer_blocks.1/zarr.json"
    d = json.loads(meta.read_text())
    d["attributes"].setdefault("sdpa_kwargs", {})
    edit(d["attributes"])
    meta.write_text(json.dumps(d))
    problems = open_capture(store).verify()
    assert any(needle in p for p in problems), problems


def test_calls_a_store_cannot_hold_are_refused_or_skipped_and_repeats_said(tmp_path):
    """k and v of different head dims (latent attention), cross-attention and negative query
    rows wrote stores that did not open; a block's name without layer= too; a second call of
    one name in one step was dropped without a word (then with a warning; record() now refuses
    it, naming the first: tests/test_capture_edges.py)."""
    q, k, v = _qkv()
    with capture(None, tmp_path / "a.zarr") as cap:
        with pytest.raises(ValueError, match="k .* and v .* differ"):
            cap.record("mla", q, k, v[..., :8])
        with pytest.raises(ValueError, match="cross-attention"):
            cap.record("cross", q[:, :16], k, v)
        cap.record("transformer_blocks.1", q, k, v, step=0)
        with pytest.raises(ValueError, match="already recorded in this run"):
            cap.record("transformer_blocks.1", q, k, v, step=0)
    r = open_capture(tmp_path / "a.zarr")
    assert r.verify() == [] and r.layers == [1]
    with pytest.raises(ValueError, match="query_rows"):
        capture(None, tmp_path / "b.zarr", query_rows=[-1, 2])


def test_rope_channels_not_guessed_for_alibi_or_latent_attention():
    from types import SimpleNamespace

    from workbench.capture.hf import rotated_channels

    base = dict(hidden_size=64, num_attention_heads=4, rope_theta=10000.0)
    assert rotated_channels(SimpleNamespace(**base)) == 16
    assert rotated_channels(SimpleNamespace(**base, alibi=True)) == 0
    assert rotated_channels(SimpleNamespace(**base, qk_rope_head_dim=8)) is None


def test_each_entry_replays_with_its_own_recorded_causal_flag(tmp_path):
    """An encoder-decoder's entries differ (the decoder's self-attention is causal); before, the
    first entry's flag was applied to every entry of the store."""
    from workbench.evaluate import ReplaySource, evaluate_entry

    store = shutil.copytree(SHIPPED, tmp_path / "S.zarr")
    meta = store / "entries/s00007/transformer_blocks.1/zarr.json"
    d = json.loads(meta.read_text())
    d["attributes"]["sdpa_kwargs"] = {**(d["attributes"].get("sdpa_kwargs") or {}),
                                      "is_causal": True}
    meta.write_text(json.dumps(d))
    src = ReplaySource(store, device="cpu")
    got = {la: evaluate_entry(src, 7, la, {"r": "fp8_dense"}, heads=[0], n_queries=8).causal
           for la in (0, 1)}
    assert got == {0: False, 1: True}
    forced = ReplaySource(store, device="cpu", causal=False)  # the caller's choice wins
    assert evaluate_entry(forced, 7, 1, {"r": "fp8_dense"}, heads=[0], n_queries=8).causal is False


def test_verify_faults_a_recipe_this_release_cannot_read(tmp_path):
    store = shutil.copytree(SHIPPED, tmp_path / "S.zarr")
    meta = store / "zarr.json"
    d = json.loads(meta.read_text())
    d["attributes"]["recipe"] = json.dumps({"name": "x", "smoothing": "sideways"})
    meta.write_text(json.dumps(d))
    from workbench.capture.schema import MetadataError

    with pytest.raises(MetadataError, match="recipe cannot be read as a recipe"):
        open_capture(store)


def test_archive_skips_incomplete_entries_and_scans_follow_each_entry(tmp_path, capsys):
    """An interrupted capture (an entry still 'writing') is archived without it (a full verify
    pass first refused it); a scan replays each entry with its own causal flag, as reports do;
    a GQA store scans (its K/V boundaries: one value per K/V head, shown per query head); an
    empty head list is named; a mark through a linked --out folder sees the files written."""
    from workbench.capture.archive import archive_store
    from workbench.cli_args import WRITING_MARK, writing_mark
    from workbench.evaluate import ReplaySource, evaluate_entry
    from workbench.evaluate.scan import run_scan

    store = shutil.copytree(SHIPPED, tmp_path / "S.zarr")
    meta = store / "entries/s00002/transformer_blocks.0/zarr.json"
    d = json.loads(meta.read_text())
    d["attributes"]["status"] = "writing"
    meta.write_text(json.dumps(d))
    r = archive_store(store, tmp_path / "a.zarr")
    assert r["skipped_incomplete"] == ["entries/s00002/transformer_blocks.0"]

    meta = store / "entries/s00007/transformer_blocks.1/zarr.json"
    d = json.loads(meta.read_text())
    d["attributes"]["sdpa_kwargs"] = {**(d["attributes"].get("sdpa_kwargs") or {}),
                                      "is_causal": True}
    meta.write_text(json.dumps(d))
    ds, _ = run_scan(store, "fp8_dense,bf16", out=tmp_path / "s.scan.zarr", steps=[7],
                     layers=[0, 1], heads=[0], n_queries=16, scheduler="synchronous",
                     progress=False, device="cpu")
    src = ReplaySource(store, device="cpu")
    for li, la in enumerate((0, 1)):
        want = evaluate_entry(src, 7, la, {"r": "fp8_dense"}, heads=[0], n_queries=16)
        got = float(ds.entry_metrics.sel(metric="attention_output_mse").values[0, li, 0])
        assert got == pytest.approx(want.evals["r"].overall["attention_output"]["mse"],
                                    rel=1e-9), la

    g = torch.Generator().manual_seed(1)
    torch.save({"q": torch.randn(64, 8, 32, generator=g), "k": torch.randn(64, 2, 32, generator=g),
                "v": torch.randn(64, 2, 32, generator=g)}, tmp_path / "g.pt")
    from workbench.cli import main

    assert main(["import", str(tmp_path / "g.pt"), "--out", str(tmp_path / "g.zarr"),
                 "--quiet"]) == 0
    ds, _ = run_scan(tmp_path / "g.zarr", "fp8_dense,fp8_dense_k", out=tmp_path / "g.scan.zarr",
                     n_queries=16, scheduler="synchronous", progress=False, device="cpu")
    kq = ds.head_metrics.sel(metric="quanted_k_mse").isel(step=0, layer=0, recipe=0).values
    assert kq.shape == (8,) and kq[0] == kq[3] and kq[4] == kq[7]
    with pytest.raises(ValueError, match="heads: an empty list"):
        open_capture(tmp_path / "g.zarr").qkv(0, 0, heads=[])

    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    with pytest.raises(KeyboardInterrupt):
        with writing_mark(tmp_path / "link", "report"):
            (real / "report.md").write_text("half\n")
            raise KeyboardInterrupt
    assert (real / WRITING_MARK).is_file()

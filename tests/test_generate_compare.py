"""``workbench compare``: two folders, and --recipes generating the same clip per recipe."""

import json
import math

import torch

from workbench.cli import main
from workbench.generate import compare_dirs, generate, read_clip, write_clip
from workbench.generate.compare import (
    LABEL_PX,
    MAX_DIFF_GAIN,
    diff_gain,
    side_by_side_frames,
)
from workbench.models import load_model


def test_compare_dirs_writes_artifacts(tmp_path):
    h = load_model("h3-tiny")
    kw = dict(seed=1, steps=4, dense_steps=0, dense_layers=0, progress=False)
    a = write_clip(generate(h, "red", recipe="bf16", **kw), tmp_path / "a")
    b = write_clip(generate(h, "red", recipe="fp8_sol_unsmoothed", **kw), tmp_path / "b")
    m = compare_dirs(a, b, tmp_path / "cmp")
    assert 0.9 < m["frame_cosine"] < 1.0 and math.isfinite(m["psnr_db"])
    assert m["ssim_min"] <= m["ssim_mean"] < 1.0 and m["lsd_db"] > 0
    for f in ("metrics.json", "table.md", "curves.csv", "curves.svg", "side_by_side.mp4"):
        assert (tmp_path / "cmp" / f).stat().st_size > 0
    same = compare_dirs(a, a)
    assert same["psnr_db"] == math.inf and same["si_sdr_db"] > 100
    # the side-by-side video: three labelled panels, the difference's gain printed
    gain = m["side_by_side"]["gain"]
    assert gain >= 1 and gain == 2 ** round(math.log2(gain))
    saved = json.loads((tmp_path / "cmp" / "metrics.json").read_text())
    assert saved["side_by_side"]["gain"] == gain
    assert f"amplified x{gain:g}" in (tmp_path / "cmp" / "table.md").read_text()
    import imageio_ffmpeg

    reader = imageio_ffmpeg.read_frames(str(tmp_path / "cmp" / "side_by_side.mp4"))
    meta = reader.__next__()
    reader.close()
    w, h = meta["size"]
    frames, _ = side_by_side_frames(read_clip(a).video, read_clip(b).video, "a", "b")
    assert (h, w) == frames[0].shape[:2]


def test_side_by_side_panels_labels_and_gain():
    g = torch.Generator().manual_seed(0)
    a = torch.rand(3, 3, 16, 24, generator=g) * 0.9
    b = a + 0.01  # |B - A| = 0.01 everywhere: gain 64 puts it at 0.64 of full scale
    frames, gain = side_by_side_frames(a, b, "bf16", "fp8_sol_kv_corrected")
    assert gain == 64.0 == diff_gain(a, b)
    fr = frames[0]
    W = fr.shape[1] // 3
    body = fr[LABEL_PX:]
    assert body.shape[0] % 2 == 0 and fr.shape[1] % 2 == 0
    # third panel: the amplified difference, 0.64 * 255 everywhere
    assert abs(int(body[: 16 * (body.shape[0] // 16), 2 * W:].mean()) - round(0.64 * 255)) <= 1
    # each label strip holds drawn text (light pixels on the dark strip)
    for i in range(3):
        strip = fr[:LABEL_PX, i * W:(i + 1) * W]
        assert (strip > 200).sum() > 30, f"panel {i} has no label"
    assert diff_gain(a, a) == 1.0
    assert diff_gain(a, a + 1e-9) == MAX_DIFF_GAIN


def test_compare_recipes_cli(tmp_path, capsys):
    out = tmp_path / "run"
    rc = main(["compare", "--recipes", "bf16,fp8_sol_kv_corrected", "--model", "h3-tiny",
               "--steps", "4", "--dense-steps", "0", "--dense-layers", "0", "--out", str(out),
               "--quiet"])
    assert rc == 0
    text = capsys.readouterr().out
    assert "| bf16 | 1.000000 | inf |" in text
    assert "| fp8_sol_kv_corrected |" in text
    assert "`compare_fp8_sol_kv_corrected/side_by_side.mp4`" in text and "amplified x" in text
    summary = json.loads((out / "compare.json").read_text())
    m = summary["metrics"]["fp8_sol_kv_corrected"]
    assert m["frame_cosine"] < 1.0 and m["psnr_db"] != "inf"
    assert (out / "bf16" / "video.mp4").exists()


def test_generate_cli_and_bad_input(tmp_path, capsys):
    assert main(["generate", "--model", "h3-tiny", "--prompt", "a green ball", "--steps", "3",
                 "--recipe", "bf16", "--out", str(tmp_path / "g"), "--quiet"]) == 0
    assert (tmp_path / "g" / "audio.wav").exists()
    assert main(["generate", "--model", "h3-tiny", "--prompt", "a purple cube", "--steps", "3",
                 "--out", str(tmp_path / "x"), "--quiet"]) == 2
    assert "knows the classes" in capsys.readouterr().err


def test_compare_names_an_unreadable_clip_file(tmp_path, capsys):
    """A clip folder whose clip.safetensors or config.json is damaged is refused in one line
    naming the file (before: safetensors' traceback, a bare JSON error)."""
    from workbench.generate import Clip

    clip = Clip(torch.rand(2, 3, 16, 16), torch.zeros(800), 8, 8000, {"prompt": "x"})
    a, b = write_clip(clip, tmp_path / "a"), write_clip(clip, tmp_path / "b")
    (b / "clip.safetensors").write_bytes(b"garbage garbage")
    out = ["--out", str(tmp_path / "cmp"), "--quiet"]
    assert main(["compare", str(a), str(b), *out]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{b / 'clip.safetensors'}: not a readable clip" in err[0], err
    write_clip(clip, b)
    (b / "config.json").write_text('{"prompt": "x", "seed')
    assert main(["compare", str(a), str(b), *out]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{b / 'config.json'}: cannot be read as JSON" in err[0], err


def test_generate_and_compare_refuse_to_replace_earlier_results(tmp_path, capsys):
    """A second run into the same --out is refused before any work, naming the file; the earlier
    files keep their bytes; --overwrite replaces only the run's own files."""
    import hashlib

    def digest(p):
        return hashlib.sha256(p.read_bytes()).hexdigest()

    g = tmp_path / "g"
    args = ["generate", "--model", "h3-tiny", "--prompt", "a green ball", "--steps", "2",
            "--recipe", "bf16", "--out", str(g), "--quiet"]
    assert main(args) == 0
    (g / "notes.txt").write_text("mine")
    before = {p.name: digest(p) for p in g.iterdir()}
    capsys.readouterr()
    assert main(args[:-1] + ["--seed", "7", "--quiet"]) == 2
    err = capsys.readouterr().err
    assert f"--out {g}: already holds video.mp4" in err and "--overwrite" in err
    assert {p.name: digest(p) for p in g.iterdir()} == before
    assert main(args[:-1] + ["--seed", "7", "--overwrite", "--quiet"]) == 0
    after = {p.name: digest(p) for p in g.iterdir()}
    assert after["notes.txt"] == before["notes.txt"] and after["clip.safetensors"] != before[
        "clip.safetensors"]
    # compare into a folder with an earlier comparison; --recipes into a non-empty folder
    cmp = tmp_path / "cmp"
    assert main(["compare", str(g), str(g), "--out", str(cmp)]) == 0
    capsys.readouterr()
    assert main(["compare", str(g), str(g), "--out", str(cmp)]) == 2
    assert "already holds side_by_side.mp4" in capsys.readouterr().err
    assert main(["compare", "--recipes", "bf16,fp8_dense", "--model", "h3-tiny", "--out",
                 str(g), "--quiet"]) == 2
    assert "not empty" in capsys.readouterr().err


def test_compare_dirs_refuses_clips_that_are_not_the_same_clip_format(tmp_path):
    """Frame rates, sample rates and exact clips of other sizes were compared sample by sample
    without a word (a review's findings); an mp4-only folder is read at its own frame rate."""
    import pytest

    from workbench.generate.run import Clip

    g = torch.Generator().manual_seed(0)
    v = torch.rand(16, 3, 16, 16, generator=g)
    au = torch.randn(8192, generator=g) * 0.1
    write_clip(Clip(v, au, 8, 4096, {}), tmp_path / "a")
    write_clip(Clip(v, au, 24, 4096, {}), tmp_path / "fps24")
    write_clip(Clip(v, au, 8, 16000, {}), tmp_path / "sr16k")
    big = v.repeat_interleave(2, -1).repeat_interleave(2, -2)
    write_clip(Clip(big, au, 8, 4096, {}), tmp_path / "big")
    for other, msg in (("fps24", "frame rates differ .8 vs 24"),
                       ("sr16k", "sample rates differ .4096 vs 16000"),
                       ("big", "the larger is an exact clip")):
        with pytest.raises(ValueError, match=msg):
            compare_dirs(tmp_path / "a", tmp_path / other)
    (tmp_path / "fps24" / "clip.safetensors").unlink()  # an mp4-only folder
    assert read_clip(tmp_path / "fps24").fps == 24  # was 8 (the default)

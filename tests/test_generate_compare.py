"""``workbench compare``: two folders, and --recipes generating the same clip per recipe."""

import json
import math

from workbench.cli import main
from workbench.generate import compare_dirs, generate, write_clip
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


def test_compare_recipes_cli(tmp_path, capsys):
    out = tmp_path / "run"
    rc = main(["compare", "--recipes", "bf16,fp8_sol_kv_corrected", "--model", "h3-tiny",
               "--steps", "4", "--dense-steps", "0", "--dense-layers", "0", "--out", str(out),
               "--quiet"])
    assert rc == 0
    text = capsys.readouterr().out
    assert "| bf16 | 1.000000 | inf |" in text
    assert "| fp8_sol_kv_corrected |" in text
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

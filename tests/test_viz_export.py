"""`workbench report`: PNG / SVG through kaleido + system Chromium, self-contained HTML,
markdown."""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path

import pytest

from workbench.cli import main
from workbench.report.export import (
    FIG_HEIGHT,
    FIG_WIDTH,
    PNG_SCALE,
    browser_path,
    plotlyjs_name,
    report_figures,
    write_figures,
)
from workbench.evaluate import find_store

needs_chromium = pytest.mark.skipif(browser_path() is None,
                                    reason="/usr/bin/chromium absent (scripts/ensure_chromium.sh)")


def _png_size(p: Path) -> tuple[int, int]:
    head = p.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n", f"{p} is not a PNG"
    return struct.unpack(">II", head[16:24])


@needs_chromium
def test_report_writes_pngs_svgs_html_and_markdown(tmp_path):
    out = tmp_path / "report"
    rc = main(["report", str(find_store()), "--a", "fp8_sol_unsmoothed",
               "--b", "fp8_sol_kv_corrected", "--out", str(out)])
    assert rc == 0
    md = (out / "report.md").read_text()
    data = json.loads((out / "report.json").read_text())
    figs = data["figures"]
    assert {"boundary_bars", "error_along_tokens", "drift_k", "drift_v", "heatmap_output_mse_a",
            "heatmap_output_mse_b", "heatmap_benefit", "routing_map"} <= set(figs)
    from PIL import Image

    for name, files in figs.items():
        png = out / files["png"]
        assert PNG_SCALE == 2 and _png_size(png) == (2 * FIG_WIDTH, 2 * FIG_HEIGHT)
        # non-trivial: many distinct colours, not a blank canvas
        im = Image.open(png).convert("RGB").resize((200, 112))
        assert len(im.getcolors(maxcolors=1 << 16) or []) > 20, f"{png} looks blank"
        assert png.stat().st_size > 10_000
        svg = (out / files["svg"]).read_text()
        assert svg.lstrip().startswith("<svg") and "</svg>" in svg
        html = (out / files["html"]).read_text()
        assert 'src="https://cdn.plot.ly' not in html
        # every page loads the one plotly.js written next to them (works offline)
        assert f'src="{plotlyjs_name()}"' in html and len(html) < 200_000
        assert f"]({files['png']})" in md and f"]({files['html']})" in md
    bundle = out / "figures" / plotlyjs_name()
    assert bundle.stat().st_size > 1_000_000 and data["html"] == f"figures/{plotlyjs_name()}"
    # paths in the report are relative to it: the folder can move
    assert str(tmp_path) not in md and f"Store `{data['store']}`" in md
    assert data["store"] == os.path.relpath(find_store().resolve(), out.resolve())
    assert not data["store"].startswith("/")
    assert (out / data["store"] / "zarr.json").exists()
    # the tables are the seed's layout, and the numbers agree with the figures' inputs
    assert "### Smooth Attention Kernel Accuracy" in md and "| quanted K |" in md
    t = data["table"]["boundaries"]["attention_output"]
    assert t["mse_a"] == pytest.approx(data["readout"]["fp8_sol_unsmoothed"]["output_mse"])
    assert t["mse_b"] == pytest.approx(data["readout"]["fp8_sol_kv_corrected"]["output_mse"])


def test_report_html_only_and_bad_format(tmp_path):
    out = tmp_path / "r"
    assert main(["report", str(find_store()), "--out", str(out), "--formats", "html",
                 "--queries", "16"]) == 0
    assert (out / "figures" / "boundary_bars.html").exists()
    assert not list((out / "figures").glob("*.png"))
    assert main(["report", str(find_store()), "--out", str(out), "--formats", "gif"]) == 2
    assert main(["report", str(tmp_path / "missing.zarr"), "--out", str(out)]) == 2


def test_html_inline_pages_are_self_contained(tmp_path):
    from workbench.evaluate import ReplaySource

    src = ReplaySource(find_store())
    figs, _, _ = report_figures(src, "fp8_sol_unsmoothed", "fp8_sol_kv_corrected",
                                step=src.steps[-1], layer=src.layers[-1], heads=src.heads[:2],
                                n_queries=16)
    one = {"drift_k": figs["drift_k"]}
    w = write_figures(one, tmp_path / "inline", formats=("html",), html_inline=True)
    page = w["drift_k"]["html"].read_text()
    assert len(page) > 1_000_000 and "<script src=" not in page.split("</head>")[0]
    assert not list((tmp_path / "inline").glob("*.js"))
    w = write_figures(one, tmp_path / "shared", formats=("html",))
    assert (tmp_path / "shared" / plotlyjs_name()).exists()
    assert len(w["drift_k"]["html"].read_text()) < 200_000

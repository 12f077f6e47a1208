"""`workbench report`: PNG / SVG through kaleido + system Chromium, self-contained HTML,
markdown."""

from __future__ import annotations

import json
import struct
from pathlib import Path

import pytest

from workbench.cli import main
from workbench.report.export import FIG_HEIGHT, FIG_WIDTH, browser_path
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
        assert _png_size(png) == (FIG_WIDTH, FIG_HEIGHT)
        # non-trivial: many distinct colours, not a blank canvas
        im = Image.open(png).convert("RGB").resize((200, 112))
        assert len(im.getcolors(maxcolors=1 << 16) or []) > 20, f"{png} looks blank"
        assert png.stat().st_size > 10_000
        svg = (out / files["svg"]).read_text()
        assert svg.lstrip().startswith("<svg") and "</svg>" in svg
        html = (out / files["html"]).read_text()
        assert 'src="https://cdn.plot.ly' not in html
        assert len(html) > 1_000_000, "plotly.js must be inlined (works offline)"
        assert f"]({files['png']})" in md and f"]({files['html']})" in md
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

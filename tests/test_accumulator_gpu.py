"""GPU test: the reference path's model of Hopper's FP8 accumulator (``accum_rounding=
"truncate"``, ``attention.quant.mma_step_truncating``) against the tensor cores' own sums, bit for
bit (the checks of ``scripts/gpu_accumulator_probe.py``, docs/numerics.md)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9,
        reason="needs a Hopper (sm_90+) CUDA GPU",
    ),
]


def _probe():
    path = Path(__file__).resolve().parents[1] / "scripts" / "gpu_accumulator_probe.py"
    spec = importlib.util.spec_from_file_location("gpu_accumulator_probe", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_tensor_core_sums_equal_the_truncating_model():
    probe = _probe()
    rows = probe.placement_rows("cuda")
    assert len(rows) == 168
    assert all(r["triton"] == r["cublas"] == r["model"] for r in rows)
    assert sum(r["triton"] != r["exact"] for r in rows) == 36  # the probe does see the cuts
    rnd = probe.random_rows("cuda")
    assert rnd["model_equals_triton"] == 1.0
    assert rnd["triton"] == rnd["cublas"] == rnd["model"]
    assert rnd["model"]["inexact"] > 0.1

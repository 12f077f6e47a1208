"""The shipped h3-nano checkpoint: its samples pass the distribution check; untrained weights fail.

The check (``workbench.models.procedural.distribution_check``) compares statistics of generated
clips with held-out procedural clips: background fraction, the prompted color, one object per
frame (compactness), motion, a tonal audio track with its pitch in range and following the ball's
height. (Thresholds were revised after training; see ``CheckThresholds``' docstring.)
"""

import pytest
import torch

from workbench.models import load_model
from workbench.models.h3 import H3_NANO
from workbench.models.registry import CHECKPOINTS, H3Model, _build_transformer, prompt_table
from workbench.models.train_h3_nano import evaluate

pytestmark = pytest.mark.skipif(not CHECKPOINTS["h3-nano"].exists(),
                                reason="h3-nano checkpoint not trained yet")


def test_checkpoint_size_and_attention_path():
    path = CHECKPOINTS["h3-nano"]
    assert path.stat().st_size <= 20 * 10**6
    h = load_model("h3-nano")
    cfg = h.model.config
    assert cfg.attention_head_dim == 128 and cfg.rope_freq_dim == 16
    assert len(h.model.transformer_blocks) == 4


def test_trained_passes_distribution_check_random_fails():
    torch.set_num_threads(min(2, torch.get_num_threads()))
    trained = evaluate(load_model("h3-nano"), n=8, steps=20)
    assert trained["passed"], trained["criteria"]
    g = trained["generated"]
    # the tone follows the ball
    assert g["color_accuracy"] >= 0.75 and g["pitch_height_corr"] >= 0.3

    untrained = H3Model(_build_transformer(H3_NANO, 0), "h3-nano-untrained", H3_NANO,
                        prompt_table(H3_NANO))
    rand = evaluate(untrained, n=4, steps=20)
    assert not rand["passed"]
    failed = [k for k, (_, _, ok) in rand["criteria"].items() if not ok]
    assert len(failed) >= 3, rand["criteria"]

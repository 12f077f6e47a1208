"""``GraphedAttention``: one attention call captured in a CUDA graph. On the GPU its replays
equal the eager call bit for bit (new inputs copied in, or written into its buffers in place);
everywhere it refuses inputs it cannot take, naming them."""

from __future__ import annotations

import pytest
import torch

from workbench.attention import SegmentLayout
from workbench.attention.graphed import GraphedAttention
from workbench.attention.runner import run_attention
from workbench.synthetic import small_config, synthetic_qkv

hopper = pytest.mark.skipif(
    not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] < 9,
    reason="needs a Hopper (sm_90+) CUDA GPU")


def _inputs(S, H, seed, device=None):
    q, k, v = synthetic_qkv(small_config(S, heads=H, seed=seed), device=device)
    return q, k, v, SegmentLayout(text=14, audio=100, video=S - 114)


def test_refuses_cpu_tensors_and_no_warmup_naming_them():
    q, k, v, layout = _inputs(256, 2, 0)
    with pytest.raises(ValueError, match="q is on cpu"):
        GraphedAttention(q, k, v, "fp8_sol_kv_corrected", layout=layout)
    with pytest.raises(ValueError, match="q is a list"):
        GraphedAttention([1.0], k, v, "fp8_sol_kv_corrected", layout=layout)
    if torch.cuda.is_available():  # a CUDA q with a CPU k: refused, naming k
        with pytest.raises(ValueError, match="k is on cpu"):
            GraphedAttention(q.cuda(), k, v, "fp8_sol_kv_corrected", layout=layout)
    with pytest.raises(ValueError, match="warmup 0"):
        GraphedAttention(q, k, v, "fp8_sol_kv_corrected", layout=layout, warmup=0)


@pytest.mark.gpu
@hopper
@pytest.mark.parametrize("name", ["fp8_sol_kv_corrected",
                                  "fp8_dense_kv_corrected:dense_prefix=true"])
def test_gpu_replays_equal_the_eager_call_bitwise(name):
    """Captured on one input set, replayed on two others (copied in, then written in place) and
    on the first again: each output equals the eager call on the same inputs, bit for bit, and
    the sets' outputs differ (the copies reached the graph). Another shape is refused."""
    a = _inputs(4111, 4, 1, "cuda")
    b = _inputs(4111, 4, 2, "cuda")
    c = _inputs(4111, 4, 3, "cuda")
    layout = a[3]
    att = GraphedAttention(*a[:3], name, layout=layout)
    eager = {s: run_attention(*x[:3], name, layout=layout, backend="kernel")
             for s, x in (("a", a), ("b", b), ("c", c))}
    out_b = att(*b[:3]).clone()
    assert torch.equal(out_b, eager["b"])
    for buf, t in zip(att.inputs, c[:3]):
        buf.copy_(t)
    out_c = att().clone()
    assert torch.equal(out_c, eager["c"])
    out_a = att(*a[:3])
    assert torch.equal(out_a, eager["a"])
    assert not torch.equal(out_b, out_c) and out_a.isfinite().all()
    q_short = a[0][:, :4000]
    with pytest.raises(ValueError, match=r"q is \(1, 4000, 4, 128\)"):
        att(q_short, a[1], a[2])

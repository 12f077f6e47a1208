"""One attention call captured in a CUDA graph and replayed: the same kernels without the host's
launch time.

A kernel call of a sparse recipe is about twenty launches (block sums, the routing front, the
scores' matmul, the lists, the quantizer, the summary operands, the exact tiles, the BF16
prefix rows on a side stream). Issuing them from Python takes about 2 ms on the H200's host,
which at S = 8192 is more than the GPU needs for them (2.36 ms per call issued eagerly against
1.23 ms replayed, H3 proportions, 56 heads, ``fp8_sol_kv_corrected``; BENCHMARKS.md). At the
full H3 length the GPU is the longer of the two and a graph gains nothing. ``GraphedAttention``
is ``run_attention`` for one fixed shape, recipe and layout, captured once; each call copies the
inputs into the graph's own buffers (or takes them in place: ``inputs``) and replays.

    att = GraphedAttention(q, k, v, "fp8_sol_kv_corrected", layout=layout)
    out = att(q2, k2, v2)            # [B, S, H, D], overwritten by the next call
    qs, ks, vs = att.inputs          # or write the inputs here and call att() with none

Replays compute what the eager call computes on the same inputs, bit for bit (GPU test). One
graph serves every layer that shares the shape, recipe and layout (copy each layer's q, k, v in
and take the output before the next call): each graph holds its own memory pool, a full set of
the call's intermediates (for Sol at the H3 shape about 1.3 GB by their sizes: the E4M3
codes, the output, the routing lists) plus its input buffers.
"""

from __future__ import annotations

import torch

from workbench.recipes import AttentionRecipe, get_recipe

from .layout import SegmentLayout
from .runner import run_attention


class GraphedAttention:
    """``run_attention(q, k, v, recipe, ...)`` at the shapes, dtypes and device of the example
    q [B, S, H, D], k / v [B, S, Hkv, D], captured in a CUDA graph after ``warmup`` eager calls
    (which compile the kernels). backend: as ``run_attention`` ("kernel" by default: a graph of
    the reference path gains little and may not capture). The example tensors are copied, not
    kept."""

    def __init__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                 recipe: AttentionRecipe | str, *, layout: SegmentLayout | None = None,
                 step: int | None = None, layer: int | None = None,
                 scale: float | None = None, backend: str = "kernel", warmup: int = 2):
        if warmup < 1:
            raise ValueError(f"GraphedAttention: warmup {warmup}; at least one eager call "
                             "must compile the kernels before the capture")
        for name, t in (("q", q), ("k", k), ("v", v)):
            if not isinstance(t, torch.Tensor):
                raise ValueError(f"GraphedAttention: {name} is a {type(t).__name__}, not a "
                                 "tensor")
            if t.device.type != "cuda":
                raise ValueError(f"GraphedAttention: {name} is on {t.device}; CUDA graphs need "
                                 "CUDA tensors (use run_attention elsewhere)")
            if t.device != q.device:
                raise ValueError(f"GraphedAttention: {name} is on {t.device}, q on {q.device}; "
                                 "one graph runs on one device")
        self.recipe = get_recipe(recipe).at(step, layer)
        self._inputs = tuple(t.detach().clone() for t in (q, k, v))

        def call() -> torch.Tensor:
            return run_attention(*self._inputs, self.recipe, layout=layout, scale=scale,
                                 backend=backend)

        # warm-up on a side stream, as torch's capture expects (lazy initialisation and the
        # kernels' compilation stay out of the graph); both on q's device, also when another
        # one is current
        with torch.cuda.device(q.device):
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                for _ in range(warmup):
                    call()
            torch.cuda.current_stream().wait_stream(side)
            self.graph = torch.cuda.CUDAGraph()
            try:
                with torch.cuda.graph(self.graph):
                    self.out = call()
            except RuntimeError as exc:
                first = (str(exc).splitlines() or [type(exc).__name__])[0]
                raise RuntimeError(f"GraphedAttention: recipe {self.recipe.to_string()!r} with "
                                   f"backend {backend!r} could not be captured in a CUDA graph "
                                   f"({first[:200]})") from exc

    @property
    def inputs(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """The graph's q, k, v buffers: write new inputs here in place to skip the copies."""
        return self._inputs

    def __call__(self, q: torch.Tensor | None = None, k: torch.Tensor | None = None,
                 v: torch.Tensor | None = None) -> torch.Tensor:
        """Copy q, k, v (each optional: None keeps the buffer's contents) into the graph's
        buffers, replay, and return the output [B, S, H, D] (the graph's buffer: the next call
        overwrites it; clone it to keep it). Inputs of another shape, dtype or device are
        refused, naming the input."""
        for name, t, buf in zip("qkv", (q, k, v), self._inputs):
            if t is None or t is buf:
                continue
            if not isinstance(t, torch.Tensor):
                raise ValueError(f"GraphedAttention: {name} is a {type(t).__name__}, not a "
                                 "tensor")
            if (t.shape, t.dtype, t.device) != (buf.shape, buf.dtype, buf.device):
                raise ValueError(f"GraphedAttention: {name} is {tuple(t.shape)} {t.dtype} on "
                                 f"{t.device}; this graph was captured for {tuple(buf.shape)} "
                                 f"{buf.dtype} on {buf.device} (capture another one)")
        for t, buf in zip((q, k, v), self._inputs):
            if t is not None and t is not buf:
                buf.copy_(t)
        with torch.cuda.device(self._inputs[0].device):
            self.graph.replay()
        return self.out

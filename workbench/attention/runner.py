"""Drop-in attention call for models: a recipe applied to the full sequence, kernel or reference.

``run_attention`` is what the interception point (capture / replacement) calls in place of
``dispatch_attention_fn``. It returns the output in q's dtype and layout [B, S, H, D].
"""

from __future__ import annotations

import os

import torch

from workbench.recipes import AttentionRecipe, get_recipe

from .layout import SegmentLayout
from .reference import recipe_attention

BACKENDS = ("auto", "reference", "kernel")


def default_backend() -> str:
    return os.environ.get("WORKBENCH_ATTENTION_BACKEND", "auto")


def run_attention(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    recipe: AttentionRecipe | str | None = None,
    *,
    layout: SegmentLayout | None = None,
    step: int | None = None,
    layer: int | None = None,
    scale: float | None = None,
    backend: str | None = None,
    ran: dict | None = None,
) -> torch.Tensor:
    """Attention of every row of q [B, S, H, D] against k, v [B, S, Hkv, D] under `recipe`.

    backend: "auto" uses a Triton kernel on CUDA when one supports the recipe and shape, else the
    reference path; "kernel" requires a kernel (error naming why none applies), except at the
    steps / layers where the recipe runs BF16 dense (its dense policy, a plan's BF16 entries):
    no FP8 kernel computes that, so those calls take the reference path, as under "auto";
    "reference" forces torch. None: the environment variable WORKBENCH_ATTENTION_BACKEND, else
    "auto".
    ran: a dict the caller keeps; "kernel" or "reference" is counted up for the path this call
    took (what a run records instead of the backend it asked for).
    Returns a contiguous [B, S, H, D] tensor in q's dtype.
    """
    backend = backend if backend is not None else default_backend()
    if backend not in BACKENDS:
        raise ValueError(f"backend: unknown {backend!r}; choose one of {BACKENDS}")
    base = get_recipe(recipe)
    recipe = base.at(step, layer)
    out = why = None
    if backend in ("auto", "kernel"):
        out, why = _try_kernel(q, k, v, recipe, layout, scale)
        # the dense policy's BF16 steps have no FP8 kernel: the reference path, as under auto
        if out is None and backend == "kernel" and not base.is_dense_at(step, layer):
            raise ValueError(
                f"backend 'kernel': no kernel runs recipe {recipe.to_string()!r} on "
                f"{q.device.type} with q {tuple(q.shape)} {q.dtype}: {why}"
            )
    path = "kernel" if out is not None else "reference"
    if out is None:
        out = recipe_attention(q, k, v, recipe, layout=layout, scale=scale).out
        out = out.to(q.dtype).contiguous()
    if ran is not None:
        ran[path] = ran.get(path, 0) + 1
    return out


def _try_kernel(q, k, v, recipe, layout, scale):
    """(the kernels' output or None, why none ran). Triton is imported on CUDA only, so the
    reference path runs where it is absent."""
    if q.device.type != "cuda":
        return None, "the kernels run on CUDA (Hopper) only"
    try:
        from workbench.kernels import dispatch
    except ImportError:
        return None, "Triton is not installed"
    why = dispatch.kernel_unavailable(q, k, v, recipe)
    if why:
        return None, why
    return dispatch.fp8_recipe_attention(q, k, v, recipe, layout=layout, scale=scale), None

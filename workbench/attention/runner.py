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


def _default_backend() -> str:
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
) -> torch.Tensor:
    """Attention of every row of q [B, S, H, D] against k, v [B, S, Hkv, D] under `recipe`.

    backend: "auto" uses a Triton kernel on CUDA when one supports the recipe and shape, else the
    reference path; "kernel" requires a kernel (error if none applies); "reference" forces torch.
    The environment variable WORKBENCH_ATTENTION_BACKEND sets the default.
    """
    backend = backend or _default_backend()
    if backend not in BACKENDS:
        raise ValueError(f"backend: unknown {backend!r}; choose one of {BACKENDS}")
    recipe = get_recipe(recipe).at(step, layer)
    if backend in ("auto", "kernel"):
        out = _try_kernel(q, k, v, recipe, layout, scale)
        if out is not None:
            return out
        if backend == "kernel":
            raise ValueError(
                f"backend 'kernel': no kernel supports recipe {recipe.to_string()!r} on "
                f"{q.device.type} with q {tuple(q.shape)} {q.dtype}"
            )
    res = recipe_attention(q, k, v, recipe, layout=layout, scale=scale)
    return res.out.to(q.dtype)


def _try_kernel(q, k, v, recipe, layout, scale):
    if q.device.type != "cuda":
        return None
    try:
        from workbench.kernels import dispatch
    except ImportError:
        return None
    return dispatch.try_kernel(q, k, v, recipe, layout=layout, scale=scale)

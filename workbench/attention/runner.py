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
    steps / layers where the recipe's dense policy runs BF16 (no FP8 kernel computes that: those
    calls take the reference path, as under "auto"); "reference" forces torch. None: the
    environment variable WORKBENCH_ATTENTION_BACKEND, else "auto".
    ran: a dict the caller keeps; "kernel" or "reference" is counted up for the path this call
    took (what a run records instead of the backend it asked for).
    Returns a contiguous [B, S, H, D] tensor in q's dtype.
    """
    backend = backend if backend is not None else default_backend()
    if backend not in BACKENDS:
        raise ValueError(f"backend: unknown {backend!r}; choose one of {BACKENDS}")
    base = get_recipe(recipe)
    recipe = base.at(step, layer)
    policy = recipe is not base and recipe.name.endswith("@dense_policy")
    out = None
    if backend in ("auto", "kernel"):
        out = _try_kernel(q, k, v, recipe, layout, scale)
        if out is None and backend == "kernel" and not policy:
            raise ValueError(
                f"backend 'kernel': no kernel runs recipe {recipe.to_string()!r} on "
                f"{q.device.type} with q {tuple(q.shape)} {q.dtype}: {_why_not(q, k, v, recipe)}"
            )
    path = "kernel" if out is not None else "reference"
    if out is None:
        out = recipe_attention(q, k, v, recipe, layout=layout, scale=scale).out
        out = out.to(q.dtype).contiguous()
    if ran is not None:
        ran[path] = ran.get(path, 0) + 1
    return out


def _kernels():
    try:
        from workbench.kernels import dispatch
    except ImportError:
        return None
    return dispatch


def _try_kernel(q, k, v, recipe, layout, scale):
    if q.device.type != "cuda":
        return None
    dispatch = _kernels()
    return None if dispatch is None else dispatch.try_kernel(q, k, v, recipe, layout=layout,
                                                             scale=scale)


def _why_not(q, k, v, recipe) -> str:
    """The one-line reason no kernel runs (device, Triton, or the kernels' own reason)."""
    if q.device.type != "cuda":
        return "the kernels run on CUDA (Hopper) only"
    dispatch = _kernels()
    if dispatch is None:
        return "Triton is not installed"
    if torch.cuda.get_device_capability(q.device)[0] < 9:
        return "FP8 tensor cores need a Hopper (sm_90) or newer GPU"
    return dispatch.unsupported_reason(q, k, v, recipe) or "unsupported"

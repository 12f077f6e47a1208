"""One interception point for attention: capture (observe q/k/v) and replacement (return a new
output).

Two adapters share the ``AttentionCall`` / handler contract:

- diffusers' ``MiniMaxH3Transformer3DModel``: each ``transformer_blocks.{i}.attn`` processor is
  swapped
  for ``InterceptingH3Processor`` (a ``MiniMaxH3AttnProcessor`` subclass). It runs diffusers' own
  processor code unchanged; only the call to ``dispatch_attention_fn`` is routed through the
  handler,
  so the handler sees exactly the tensors that enter attention (post-QK-norm, post-RoPE,
  [B, S, H, D]).
  The token refiner (no RoPE) is excluded unless ``include_refiner=True``.
- any other model that calls ``torch.nn.functional.scaled_dot_product_attention`` (HF transformers
  with
  ``attn_implementation="sdpa"``, other DiTs): a ``TorchFunctionMode`` catches the call. SDPA takes
  [B, H, S, D]; the handler gets [B, S, H, D] views (``call.layout == "BHSD->BSHD"``) and a returned
  output is transposed back. Entries are named by the innermost running module path; ``layer`` is
  the
  call order index within one forward of the root model.

``handler(call) -> Tensor | None``: a returned [B, S, H, D] tensor (same dtype) replaces the
attention
output and the original kernel is not run; ``None`` keeps the original result. Capturing returns
None,
so the model's output is bit-identical with and without capture.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

Handler = Callable[["AttentionCall"], "Tensor | None"]


@dataclass
class AttentionCall:
    """One attention call seen at the interception point. q, k, v: [B, S, H, D] (K/V may have fewer
    heads under GQA), exactly as passed to ``dispatch_attention_fn`` (or SDPA, transposed)."""

    name: str  # "transformer_blocks.3", or the module path for SDPA models
    layer: int | None  # block index for H3, call order index for SDPA interception
    step: int | None  # the interceptor's current denoising step
    q: Tensor
    k: Tensor
    v: Tensor
    layout: str = "BSHD"  # "BHSD->BSHD" when the model passed [B, H, S, D] (SDPA)
    source: str = "h3_processor"  # "h3_processor" | "sdpa"
    # SDPA keyword arguments of the call (attn_mask, is_causal, scale, enable_gqa, dropout_p).
    kwargs: dict[str, Any] = field(default_factory=dict)


# --------------------------------------------------------------------------------------------------
# diffusers MiniMax-H3 adapter

_tls = threading.local()  # the processor call currently routing dispatch_attention_fn, per thread
_trampoline_lock = threading.Lock()
_trampoline_users = 0
_original_dispatch = None


def _h3_module():
    from diffusers.models.transformers import transformer_minimax_h3

    return transformer_minimax_h3


def _dispatch_trampoline(query, key, value, *args, **kwargs):
    """Stands in for ``dispatch_attention_fn`` inside diffusers' H3 module while an interceptor is
    active. Outside an intercepting processor call it is a plain pass-through."""
    route = getattr(_tls, "route", None)
    if route is None:
        return _original_dispatch(query, key, value, *args, **kwargs)
    interceptor, name, layer = route
    call = AttentionCall(
        name=name, layer=layer, step=interceptor.step, q=query, k=key, v=value,
        source="h3_processor", kwargs={},
    )
    out = interceptor.handler(call)
    if out is None:
        return _original_dispatch(query, key, value, *args, **kwargs)
    _check_replacement(out, query, name)
    return out


def _check_replacement(out: Tensor, q: Tensor, name: str) -> None:
    if not isinstance(out, Tensor) or out.shape != q.shape or out.dtype != q.dtype:
        raise ValueError(
            f"attention handler for {name}: replacement must be a [B, S, H, D] tensor shaped "
            f"{tuple(q.shape)} of dtype {q.dtype}, got "
            f"{tuple(out.shape) if isinstance(out, Tensor) else type(out).__name__} "
            f"{getattr(out, 'dtype', '')}"
        )


def _install_trampoline() -> None:
    global _trampoline_users, _original_dispatch
    with _trampoline_lock:
        mod = _h3_module()
        if _trampoline_users == 0:
            _original_dispatch = mod.dispatch_attention_fn
            mod.dispatch_attention_fn = _dispatch_trampoline
        _trampoline_users += 1


def _remove_trampoline() -> None:
    global _trampoline_users
    with _trampoline_lock:
        _trampoline_users -= 1
        if _trampoline_users == 0:
            _h3_module().dispatch_attention_fn = _original_dispatch


def _make_h3_processor_class():
    base = _h3_module().MiniMaxH3AttnProcessor

    class InterceptingH3Processor(base):
        """MiniMaxH3AttnProcessor whose dispatch_attention_fn call goes through the interceptor."""

        def __init__(self, original, interceptor: AttentionInterceptor, name: str, layer: int):
            super().__init__()
            self.original = original
            self.interceptor = interceptor
            self.name = name
            self.layer = layer
            # Keep the backend / context-parallel settings diffusers put on the original instance.
            self._attention_backend = getattr(original, "_attention_backend", None)
            self._parallel_config = getattr(original, "_parallel_config", None)

        def __call__(self, attn, hidden_states, rotary_emb=None, attention_mask=None):
            previous = getattr(_tls, "route", None)
            _tls.route = (self.interceptor, self.name, self.layer)
            try:
                return super().__call__(attn, hidden_states, rotary_emb, attention_mask)
            finally:
                _tls.route = previous

    return InterceptingH3Processor


def is_h3_model(model: nn.Module) -> bool:
    try:
        mod = _h3_module()
    except ImportError:
        return False
    return isinstance(model, mod.MiniMaxH3Transformer3DModel)


# --------------------------------------------------------------------------------------------------
# SDPA adapter


class _SDPAMode(TorchFunctionMode):
    def __init__(self, interceptor: AttentionInterceptor):
        super().__init__()
        self.interceptor = interceptor

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func is not torch.nn.functional.scaled_dot_product_attention:
            return func(*args, **kwargs)
        return self.interceptor._on_sdpa(func, args, kwargs)


_SDPA_ARGS = ("query", "key", "value", "attn_mask", "dropout_p", "is_causal", "scale", "enable_gqa")


class AttentionInterceptor:
    """Context manager that routes every attention call of ``model`` through ``handler``.

    layers: block indices (H3) or SDPA call-order indices to intercept; None = all.
    step: settable; a pipeline step callback or ``interceptor.step = i`` sets it.
    """

    def __init__(
        self,
        model: nn.Module,
        handler: Handler,
        *,
        layers: Iterable[int] | None = None,
        include_refiner: bool = False,
    ):
        self.model = model
        self.handler = handler
        self.layers = None if layers is None else {int(x) for x in layers}
        self.include_refiner = include_refiner
        self.step: int | None = None
        self.kind = "h3_processor" if is_h3_model(model) else "sdpa"
        self._saved: list[tuple[nn.Module, Any]] = []
        self._hooks: list[Any] = []
        self._mode: _SDPAMode | None = None
        self._module_stack: list[str] = []
        self._sdpa_calls = 0
        self._active = False

    # H3 -------------------------------------------------------------------------------------------
    def _h3_targets(self) -> list[tuple[str, int, nn.Module]]:
        targets = []
        for i, block in enumerate(self.model.transformer_blocks):
            if self.layers is None or i in self.layers:
                targets.append((f"transformer_blocks.{i}", i, block.attn))
        if self.include_refiner:
            n = len(self.model.transformer_blocks)
            for j, block in enumerate(self.model.token_refiner.refiner_blocks):
                # Refiner layers get indices after the block stack so they never collide.
                if self.layers is None or (n + j) in self.layers:
                    targets.append((f"token_refiner.refiner_blocks.{j}", n + j, block.attn))
        if self.layers is not None:
            n_total = len(self.model.transformer_blocks)
            if self.include_refiner:
                n_total += len(self.model.token_refiner.refiner_blocks)
            bad = sorted(x for x in self.layers if not 0 <= x < n_total)
            if bad:
                raise ValueError(f"layers: {bad} out of range for a model with {n_total} blocks")
        return targets

    def check_layers(self) -> None:
        """Refuse layers the model does not have (H3: block indices), before any work. SDPA
        layers are call-order indices, known only once the model runs."""
        if self.kind == "h3_processor":
            self._h3_targets()

    # SDPA -----------------------------------------------------------------------------------------
    def _on_sdpa(self, func, args, kwargs):
        bound = dict(zip(_SDPA_ARGS, args))
        bound.update(kwargs)
        q, k, v = bound["query"], bound["key"], bound["value"]
        index = self._sdpa_calls
        self._sdpa_calls += 1
        if q.dim() != 4 or (self.layers is not None and index not in self.layers):
            return func(*args, **kwargs)
        name = self._module_stack[-1] if self._module_stack else f"sdpa.{index}"
        extra = {k_: bound[k_] for k_ in _SDPA_ARGS[3:] if k_ in bound}
        call = AttentionCall(
            name=name, layer=index, step=self.step,
            q=q.transpose(1, 2), k=k.transpose(1, 2), v=v.transpose(1, 2),
            layout="BHSD->BSHD", source="sdpa", kwargs=extra,
        )
        out = self.handler(call)
        if out is None:
            return func(*args, **kwargs)
        _check_replacement(out, call.q, name)
        return out.transpose(1, 2)

    def _install_module_hooks(self) -> None:
        def reset(_module, _args):
            self._sdpa_calls = 0

        self._hooks.append(self.model.register_forward_pre_hook(reset))
        for path, module in self.model.named_modules():
            if not path:
                continue

            def pre(_m, _a, path=path):
                self._module_stack.append(path)

            def post(_m, _a, _o):
                if self._module_stack:
                    self._module_stack.pop()

            self._hooks.append(module.register_forward_pre_hook(pre))
            self._hooks.append(module.register_forward_hook(post))

    # context manager ------------------------------------------------------------------------------
    def __enter__(self) -> AttentionInterceptor:
        if self._active:
            raise RuntimeError("AttentionInterceptor is not re-entrant")
        self._active = True
        if self.kind == "h3_processor":
            try:
                targets = self._h3_targets()  # raises on a bad layer before anything is patched
            except BaseException:
                self._active = False
                raise
            cls = _make_h3_processor_class()
            _install_trampoline()
            for name, layer, attn in targets:
                self._saved.append((attn, attn.processor))
                attn.processor = cls(attn.processor, self, name, layer)
        else:
            self._install_module_hooks()
            self._mode = _SDPAMode(self)
            self._mode.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        try:
            if self.kind == "h3_processor":
                for attn, proc in reversed(self._saved):
                    attn.processor = proc
                self._saved.clear()
                _remove_trampoline()
            else:
                if self._mode is not None:
                    self._mode.__exit__(*exc)
                    self._mode = None
                for h in self._hooks:
                    h.remove()
                self._hooks.clear()
                self._module_stack.clear()
        finally:
            self._active = False

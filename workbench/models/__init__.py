"""Models: diffusers' MiniMax-H3 transformer adapters, the embedded h3-nano / h3-tiny, loading.

``load_model("h3-tiny" | "h3-nano" | PATH, device=, dtype=)`` returns an ``H3Model`` with
``.model`` (the diffusers transformer), ``.name``, ``.config`` and ``.sample(prompt, seed=, steps=,
callback=)``. ``workbench.models.h3`` holds the sequence packing (``pack_h3_sequence``) that also
yields the attention ``SegmentLayout``.
"""

from .h3 import (
    AUDIO_TAG,
    CONFIGS,
    TEXT_TAG,
    VIDEO_TAG,
    ClipSpec,
    H3Config,
    PackedLayout,
    build_packed_layout,
    pack_h3_sequence,
    patchify_video,
    unpatchify_video,
)
from .registry import H3Model, Sample, list_models, load_model, save_checkpoint

__all__ = [
    "AUDIO_TAG",
    "CONFIGS",
    "TEXT_TAG",
    "VIDEO_TAG",
    "ClipSpec",
    "H3Config",
    "H3Model",
    "PackedLayout",
    "Sample",
    "build_packed_layout",
    "list_models",
    "load_model",
    "pack_h3_sequence",
    "patchify_video",
    "save_checkpoint",
    "unpatchify_video",
]

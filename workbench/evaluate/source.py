"""Where the evaluation stage reads entries from: a capture store (or in-memory q/k/v), cached.

``ReplaySource`` wraps ``workbench.capture.open_capture`` with a small cache of entries decoded to
float32 on the evaluation device; ``find_store`` / ``shipped_stores`` locate the stores shipped
under ``captures/``.
"""

from __future__ import annotations

from pathlib import Path

import torch

from workbench.layout import SegmentLayout

REPO_ROOT = Path(__file__).resolve().parents[2]
CAPTURES_DIR = REPO_ROOT / "captures"


def default_device() -> str:
    """The reference path runs on CUDA when present, else on the CPU."""
    return "cuda" if torch.cuda.is_available() else "cpu"


def shipped_stores(root: Path | str = CAPTURES_DIR) -> list[Path]:
    """Capture stores (directories holding a zarr.json) under captures/, sorted by name."""
    root = Path(root)
    if not root.is_dir():
        return []
    # Scan stores (`workbench scan`) live beside their capture and are not captures.
    return sorted(p for p in root.iterdir() if p.is_dir() and (p / "zarr.json").exists()
                  and not p.name.endswith(".scan.zarr"))


def find_store(store: str | Path | None = None) -> Path:
    """`store` if given, else the first store shipped under captures/ (FileNotFoundError if
    none)."""
    if store:
        p = Path(store)
        if not (p / "zarr.json").exists():
            raise FileNotFoundError(f"{p}: no capture store here (no zarr.json)")
        return p
    found = shipped_stores()
    if not found:
        raise FileNotFoundError(
            f"no capture store under {CAPTURES_DIR}; make one with `workbench capture --model "
            "h3-tiny --out captures/h3_tiny.zarr`")
    return found[0]


class ReplaySource:
    """Entries of a capture store (or one in-memory q/k/v) as float32 tensors, cached.

    q [B, S, H, D], k/v [B, S, Hkv, D]. ``heads`` are the captured query head ids.
    rotated: RoPE channels per head (0..D) when the store does not record them (a store's own
    ``rotated_channels`` wins); unknown everywhere: 0, and ``describe`` says it was assumed.
    layout: in-memory tensors only; default one ``tokens`` segment.
    causal / scale: how the model attends (a store records ``causal`` and ``softmax_scale`` when
    known); causal replays mask keys after each row, in the recipes and in the reference.
    """

    def __init__(self, store: str | Path | None = None, *, tensors=None,
                 layout: SegmentLayout | None = None, rotated: int | None = None,
                 name: str = "tensors", causal: bool | None = None,
                 scale: float | None = None, device: str | None = None, cache_size: int = 16):
        self.device = device or default_device()
        self._cache: dict = {}
        self._cache_size = cache_size
        if tensors is not None:
            q, k, v = tensors
            self.path = None
            self.name = name
            self.steps, self.layers = [0], [0]
            self.heads = list(range(q.shape[2]))
            self.layout = layout or SegmentLayout.tokens(q.shape[1])
            self.rotated = rotated
            self.causal, self.scale, self.mask_shape = bool(causal), scale, None
            self._cache[(0, 0)] = tuple(t.float().to(self.device) for t in (q, k, v))
            self.cap = None
            return
        from workbench.capture import open_capture

        self.path = find_store(store)
        self.name = self.path.name
        self.cap = open_capture(self.path)
        self.steps = self.cap.steps or [None]
        self.layers = self.cap.layers
        if not self.layers:
            raise FileNotFoundError(f"{self.path}: no complete (step, layer) entries")
        e = self.cap.find(self.steps[0], self.layers[0])
        meta = self.cap.root[e.path].attrs
        self.heads = [int(h) for h in meta["q_heads"]]
        self.layout = self.cap.layout
        # 0 is a real count (a model without RoPE): only None means the store does not know.
        stored = self.cap.rotated_channels
        self.rotated = stored if stored is not None else rotated
        call = self.cap.attention_call()
        self.causal = call["causal"] if causal is None else bool(causal)
        self.scale = call["scale"] if scale is None else scale
        self.mask_shape = call["mask_shape"]
        self._given = (causal, scale)  # the caller's choices win over each entry's record

    def describe(self) -> str:
        rot = (f"rotated channels {self.rotated}" if self.rotated is not None
               else "rotated channels unknown")
        mask = "causal" if self.causal else "non-causal"
        scale = f", softmax scale {self.scale:g}" if self.scale is not None else ""
        note = (f"; the model's attention mask {self.mask_shape} is not replayed"
                if self.mask_shape else "")
        return (f"{self.name}: steps {self.steps}, layers {self.layers}, heads {self.heads}, "
                f"{self.layout.total:,} rows ({self.layout.describe()}), {rot}, {mask} "
                f"replay{scale}{note}")

    def call_at(self, step, layer) -> tuple[bool, float | None]:
        """(causal, scale) of the entry at (step, layer): its own recorded SDPA arguments (an
        encoder-decoder's entries differ), unless the caller gave them."""
        if self.cap is None:
            return self.causal, self.scale
        call = self.cap.attention_call(step, layer)
        causal, scale = self._given
        return (call["causal"] if causal is None else bool(causal),
                call["scale"] if scale is None else scale)

    def has(self, step, layer) -> bool:
        """Whether the source holds a complete entry at (step, layer) (a store may lack some
        pairs of its steps x layers: an interrupted capture, an import of a few)."""
        if self.cap is None:
            return (step, layer) in self._cache
        if not hasattr(self, "_entries"):
            self._entries = {(e.step, e.layer) for e in self.cap.entries(False)}
        return (step, layer) in self._entries

    def qkv(self, step, layer, heads=None):
        """(q, k, v) float32 on the source's device; heads = captured query head ids (None: all)."""
        key = (step, layer)
        if key not in self._cache:
            if self.cap is None:
                raise KeyError(f"in-memory source has only (step, layer) = (0, 0), not {key}")
            q, k, v = self.cap.qkv(step, layer)
            if len(self._cache) >= self._cache_size:
                self._cache.pop(next(iter(self._cache)))
            self._cache[key] = tuple(t.float().to(self.device) for t in (q, k, v))
        q, k, v = self._cache[key]
        if heads is None or list(heads) == self.heads:
            return q, k, v
        from workbench.attention import select_heads

        missing = [h for h in heads if h not in self.heads]
        if missing:
            raise KeyError(f"{self.name}: heads {missing} were not captured; captured heads: "
                           f"{self.heads}")
        return select_heads(q, k, v, [self.heads.index(h) for h in heads])

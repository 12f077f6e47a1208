"""The identity of a capture run, which ``--resume`` must match field for field.

A resumed capture appends entries to a store whose root attributes describe the first run; entries
of another model, seed, prompt, dtype or sampling grid would be silently mixed in. The fields below
(root attributes written by ``Capture``) are compared before anything is written; a difference is
refused naming the field, its CLI flag and both values.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path

from .schema import RunMismatchError

# root attribute -> what the user changes to change it (CLI words first)
IDENTITY_FIELDS = {
    "model_name": "--model",
    "checkpoint_id": "--model (checkpoint contents)",
    "model_class": "--model (class)",
    "model_config": "--model (config)",
    "h3_config": "--model (config)",
    "model_dtype": "--dtype",
    "seed": "--seed",
    "prompt": "--prompt",
    "recipe": "--recipe",
    "sampling_grid_points": "--num-steps (sampling grid)",
    "segment_layout": "layout (sequence packing)",
    "layers_requested": "--layers",
    "steps_requested": "--steps",
    "heads": "--heads",
    "query_rows": "query_rows",
    "include_refiner": "include_refiner",
    "rotated_channels": "rotated_channels",
}
# Set later in a run by some callers (``Capture.set_layout``): compared only when both know it.
_ONLY_IF_BOTH = ("segment_layout",)

FULL_HASH_MAX_BYTES = 2 * 2**30  # larger checkpoints get a sampled fingerprint (see below)
SAMPLE_BYTES = 8 * 2**20


def _short(value) -> str:
    text = json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= 80 else text[:77] + "..."


def _differing(a, b) -> tuple[str, str]:
    """(stored, new) as short text: of two objects (or JSON texts of objects, e.g. a recipe)
    only the keys whose values differ, so that a long value's difference is not cut off."""
    def obj(x):
        if isinstance(x, str):
            try:
                x = json.loads(x)
            except ValueError:
                return None
        return x if isinstance(x, dict) else None

    da, db = obj(a), obj(b)
    if da is None or db is None:
        return _short(a), _short(b)
    same = lambda k: json.dumps(da.get(k), sort_keys=True, default=str) == json.dumps(  # noqa: E731
        db.get(k), sort_keys=True, default=str)
    # the numerics first, a name or notes (free text) last
    keys = sorted((k for k in set(da) | set(db) if not same(k)),
                  key=lambda k: (k in ("name", "notes"), k))
    return _short({k: da.get(k) for k in keys}), _short({k: db.get(k) for k in keys})


def _comparable(key: str, value):
    """Model configs carry library bookkeeping ("_diffusers_version", "_use_default_values" in
    set order): leave the underscore keys out."""
    if key in ("model_config", "h3_config") and isinstance(value, dict):
        return {k: v for k, v in value.items() if not str(k).startswith("_")}
    return value


def identity_mismatches(stored: dict, new: dict) -> list[tuple[str, str, object, object]]:
    """[(field, flag, stored value, new value)] for every identity field that differs.

    Fields the stored store does not have (written by an older workbench) are not compared.
    """
    out = []
    for key, flag in IDENTITY_FIELDS.items():
        if key not in stored or key not in new:
            continue
        a, b = _comparable(key, stored[key]), _comparable(key, new[key])
        if key in _ONLY_IF_BOTH and (a is None or b is None):
            continue
        if json.dumps(a, sort_keys=True, default=str) != json.dumps(b, sort_keys=True,
                                                                    default=str):
            out.append((key, flag, a, b))
    return out


def check_resume_identity(stored: dict, new: dict, where: str) -> None:
    bad = identity_mismatches(stored, new)
    if not bad:
        return
    key, flag, a, b = bad[0]
    a, b = _differing(a, b)
    others = ", ".join(k for k, *_ in bad[1:])
    more = f" (and {len(bad) - 1} more: {others})" if others else ""
    raise RunMismatchError(
        f"{where}: --resume refused: this run differs from the stored one in {key} ({flag}): "
        f"store has {a}, this run has {b}{more}; resume with the same settings "
        f"or capture into a new --out"
    )


def _feed(h, f) -> None:
    for block in iter(lambda: f.read(1 << 20), b""):
        h.update(block)


def _hash_file(h, path: Path, sampled: bool) -> None:
    size = path.stat().st_size
    h.update(f"{path.name}:{size}\n".encode())
    with open(path, "rb") as f:
        if not sampled:
            _feed(h, f)
            return
        h.update(f.read(SAMPLE_BYTES))
        f.seek(max(0, size - SAMPLE_BYTES))
        h.update(f.read(SAMPLE_BYTES))


def checkpoint_id(name_or_path) -> str | None:
    """A content id of a model's weights: ``sha256:<hex>`` of the checkpoint file(s), or, above
    FULL_HASH_MAX_BYTES, ``sampled-sha256:<hex>`` over the sizes and the first and last 8 MiB of
    each file (a full hash of a production checkpoint would cost minutes per capture). None for
    a model built from a seed (h3-tiny): its config and seed identify it."""
    from workbench.models.registry import CHECKPOINTS

    key = str(name_or_path)
    if key in CHECKPOINTS:
        files = [CHECKPOINTS[key]]
    else:
        p = Path(key)
        if p.is_file():
            files = [p]
        elif p.is_dir():
            files = sorted(x for x in p.iterdir() if x.is_file() and (
                x.suffix in (".safetensors", ".bin", ".json")))
        else:
            return None
    files = [f for f in files if f.exists()]
    if not files:
        return None
    sampled = sum(f.stat().st_size for f in files) > FULL_HASH_MAX_BYTES
    h = hashlib.sha256()
    for f in files:
        _hash_file(h, f, sampled)
    return ("sampled-sha256:" if sampled else "sha256:") + h.hexdigest()


def file_sha256(path: str | os.PathLike) -> str | None:
    """Hex sha256 of one file (None when it does not exist)."""
    path = Path(path)
    if not path.exists():
        return None
    h = hashlib.sha256()
    with open(path, "rb") as f:
        _feed(h, f)
    return h.hexdigest()

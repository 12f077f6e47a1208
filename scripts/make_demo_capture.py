"""Regenerate the shipped demo capture ``captures/demo_h3_nano.zarr`` (see captures/README.md).

    python scripts/make_demo_capture.py            # writes captures/demo_h3_nano.zarr
    python scripts/make_demo_capture.py --check    # also replays it and prints the inspect view

Deterministic on CPU: model "h3-nano" from workbench.models (the trained embedded model), bf16,
prompt "a red ball bouncing", seed 0, a 10-point sigma grid (9 model calls), every block
(layers 0-3), steps 0-8, all heads, all rows.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from workbench.capture import capture, open_capture  # noqa: E402
from workbench.capture.inspect import inspect_store  # noqa: E402

MODEL, SEED, PROMPT, GRID = "h3-nano", 0, "a red ball bouncing", 10


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=str(ROOT / "captures" / "demo_h3_nano.zarr"))
    ap.add_argument("--check", action="store_true")
    args = ap.parse_args()
    from workbench.models import load_model

    h3 = load_model(MODEL, dtype=torch.bfloat16)
    out = Path(args.out)
    n_layers = len(h3.model.transformer_blocks)
    with capture(h3.model, out, layers=range(n_layers), steps=range(GRID - 1),
                 layout=h3.layout.segments, seed=SEED, prompt=PROMPT, recipe="native",
                 progress=False, overwrite=True,
                 extra_attrs={"model_name": h3.name, "sampling_grid_points": GRID,
                              "h3_config": h3.config.to_dict(),
                              "made_by": "scripts/make_demo_capture.py"}) as cap:
        h3.sample(PROMPT, seed=SEED, steps=GRID, callback=cap.step)
    size = sum(f.stat().st_size for f in out.rglob("*") if f.is_file())
    print(f"wrote {out} ({cap.stats.entries} entries, {size / 2**20:.2f} MiB on disk)")
    if size > 30 * 2**20:
        raise SystemExit("demo capture exceeds 30 MB")
    if args.check:
        assert not open_capture(out).verify()
        print(inspect_store(out))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

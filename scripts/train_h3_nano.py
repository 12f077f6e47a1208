"""Train the embedded h3-nano and write workbench/models/weights/h3_nano.safetensors.

    nice -n 10 python scripts/train_h3_nano.py --minutes 20 --threads 1       # CPU (as shipped)
    python scripts/train_h3_nano.py --device cuda --minutes 10                # one GPU

A thin wrapper over ``python -m workbench.models.train_h3_nano`` (all options are the same).
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from workbench.models.train_h3_nano import main  # noqa: E402

if __name__ == "__main__":
    raise SystemExit(main())

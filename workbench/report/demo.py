"""`make demo`: the main job on the embedded default, headless, written under reports/demo/.

Steps (each writes its own files; a step whose stage is not installed is reported and skipped):
1. the seed's accuracy table on the synthetic H3 input (full live shape, heads 0-3, 64 rows).
"""

from __future__ import annotations

import sys
import time
from pathlib import Path


def run_demo(out: Path, quick: bool = False) -> int:
    from workbench.report.accuracy_table import accuracy_table, write_table
    from workbench.synthetic import H3_SYNTHETIC, small_config, synthetic_qkv

    out.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    cfg = small_config(seq_len=2048, heads=4) if quick else H3_SYNTHETIC
    heads = [0, 1, 2, 3]
    q, k, v = synthetic_qkv(cfg, heads=heads)
    table = accuracy_table(
        q, k, v, "fp8_sol_unsmoothed", "fp8_sol_kv_corrected", layout=cfg.layout,
        head_labels=heads, rotated=cfg.rotated,
        source=f"synthetic H3-like input (seed {cfg.seed}, {cfg.seq_len:,} rows; "
               "not H3 activations)",
    )
    write_table(table, out / "accuracy_table.md", out / "accuracy_table.json")
    print(table.to_markdown())
    print(f"[demo] accuracy table -> {out / 'accuracy_table.md'} "
          f"({time.perf_counter() - t0:.1f} s)", file=sys.stderr)
    return 0

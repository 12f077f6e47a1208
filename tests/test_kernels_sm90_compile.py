"""The default attention kernel compiles for sm_90 without wgmma serialization (no GPU needed).

scripts/sass_stats.py compiles the kernel with triton's bundled ptxas for sm_90a and reports
ptxas's notes and the SASS instruction mix. With triton's max_num_imprecise_acc bound on the FP8
dots, ptxas 13 serializes every wgmma of the kernel (C7514); the default flush="fma" does not.
A kernel edit that brings the serialization back (for example a non-wgmma read of a wgmma
accumulator inside the pipeline) fails here, on the CPU, before any device time is spent.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

triton = pytest.importorskip("triton")
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PTXAS = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/ptxas")


def sass_stats(*overrides: dict) -> list[dict]:
    """scripts/sass_stats.py's counts for each override object (compiled in one subprocess)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}  # compile, not emulate
    p = subprocess.run([sys.executable, "scripts/sass_stats.py", *map(json.dumps, overrides)],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    return [json.loads(line.split("} ", 1)[1]) for line in p.stdout.strip().splitlines()]


@pytest.mark.skipif(not os.path.exists(PTXAS), reason="triton wheel without its ptxas")
def test_default_attention_kernel_is_not_wgmma_serialized():
    stats, scaled = sass_stats({}, {"p_scaling": "exp2_offset8"})
    assert "SERIALIZED" not in stats["ptxas"], stats["ptxas"]
    # main loop + peeled tile, two dots each, 4 QGMMA (k = 32) per 128-long chain
    assert stats["QGMMA"] == 16, stats
    assert stats["regs"] <= 168, stats  # 3 programs per SM (AttentionConfig.maxnreg)
    assert stats["MUFU.EX2"] >= 128, stats
    # one key tile = 512 SASS instructions per warp with the folded K scales and P fed to P @ V
    # in its accumulator registers (609 with neither, 563 with sk_fold only): a per-element
    # multiply by s_k coming back, a layout conversion of P (SHFL / SEL / PRMT), or another
    # per-element op fails here
    loop = stats["main_loop"]
    assert loop["QGMMA"] == 8 and loop["MUFU"] == 66, loop
    assert loop["loop"] <= 525 and loop.get("FMUL", 0) <= 16, loop
    assert loop.get("SHFL", 0) <= 12 and loop.get("SEL", 0) == 0 and loop.get("PRMT", 0) == 0, loop
    # a scaled P (2^(s - m + 8)) costs one add per row held by the thread (2 per tile: 514), not
    # a per-element operation (which would add 64)
    sl = scaled["main_loop"]
    assert "SERIALIZED" not in scaled["ptxas"] and scaled["regs"] <= 168, scaled
    assert sl["MUFU"] == 66 and sl["loop"] <= loop["loop"] + 4, (sl, loop)

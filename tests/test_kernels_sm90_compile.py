"""The attention kernels compile for sm_90 as measured (no GPU needed): the programs kernel
(Triton) without wgmma serialization, the warp-specialized dense kernel (Gluon) with its register
split and its leaner consumer loop.

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
def test_programs_attention_kernel_is_not_wgmma_serialized():
    stats, scaled = sass_stats({"schedule": "programs"},
                               {"schedule": "programs", "p_scaling": "exp2_offset8"})
    assert "SERIALIZED" not in stats["ptxas"], stats["ptxas"]
    # main loop + peeled tile, two dots each, 4 QGMMA (k = 32) per 128-long chain
    assert stats["QGMMA"] == 16, stats
    assert stats["regs"] <= 168, stats  # 3 programs per SM (AttentionConfig.maxnreg)
    assert stats["MUFU.EX2"] >= 128, stats
    # one key tile = 512-518 SASS instructions per warp with the folded K scales and P fed to P @ V
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


@pytest.mark.skipif(not os.path.exists(PTXAS), reason="triton wheel without its ptxas")
def test_warp_specialized_kernel_compiles_as_measured():
    """The Gluon kernel cannot run in the interpreter; its compiled form is checked here: no
    spills, the register split of its partitions (setmaxnreg 24 for the producer, 160 / 168 for
    the consumers), and one consumer's key tile: the programs kernel's arithmetic (8 QGMMA, 66
    MUFU) without its TMA issue and barrier bookkeeping (456 vs 512 instructions, H200
    2026-12-01: 33.44 vs 37.47 ms). P reaches P @ V without a layout conversion (the kernel's
    ``assert_trivial`` would not compile otherwise)."""
    for st in sass_stats({"schedule": "warp_specialized"},
                         {"schedule": "warp_specialized", "num_stages": 3},
                         {"schedule": "warp_specialized", "p_scaling": "exp2_offset8"}):
        assert st["ptxas"] == "spill stores 0 B" and st["STL"] == 0, st
        assert {24, 160, 168} <= set(st["setmaxnreg"]), st["setmaxnreg"]
        assert st["QGMMA"] == 16 * 3, st  # main loop + peeled tile per consumer, 2 dots of 4
        loop = st["main_loop"]
        assert loop["QGMMA"] == 8 and loop["MUFU"] == 66, loop
        assert loop["loop"] <= 470 and loop.get("FMUL", 0) <= 16, loop
        assert loop.get("SHFL", 0) <= 12 and loop.get("PRMT", 0) == 0, loop
        assert loop.get("UTMALDG", 0) == 0, loop  # the producer loads, not the consumers


@pytest.mark.skipif(not os.path.exists(PTXAS), reason="triton wheel without its ptxas")
def test_warp_specialized_list_kernel_compiles_as_measured():
    """The block-sparse exact tiles on the warp-specialized schedule (Sol, merging the summary
    pass; VSA without it): one consumer's tile of two 64-key boxes is the programs kernel's
    arithmetic in 8 QGMMA (the two K boxes, adjacent in shared memory, feed one 128-key Q K^T
    of 4 k-steps; two P @ V of 2: 12 QGMMA before commit 77d15e8) and fewer instructions (489
    against 600 per 128 exact keys), no TMA issued by the consumer, no spills anywhere, the
    same register split, and the three rings fit one SM's shared memory."""
    sol, vsa = sass_stats({"schedule": "warp_specialized", "sparse": True},
                          {"schedule": "warp_specialized", "sparse": True, "summary": False})
    for st in (sol, vsa):
        assert st["shared"] <= 227 * 1024 and {24, 160, 168} <= set(st["setmaxnreg"]), st
        loop = st["main_loop"]
        assert loop["QGMMA"] == 8 and loop["MUFU"] == 66, loop
        assert loop["loop"] <= 500 and st["ptxas"] == "spill stores 0 B" and st["STL"] == 0, st
        assert loop.get("UTMALDG", 0) == 0 and loop.get("PRMT", 0) == 0, loop


@pytest.mark.skipif(not os.path.exists(PTXAS), reason="triton wheel without its ptxas")
def test_list_kernel_with_summary_tiles_compiles_without_loop_spills():
    """Sol's summary route as E4M3 tiles of the exact-tile kernel (``summary_kernel=
    "fp8_tiles"``), compiled as a launch at the H3 anchor specializes it: each consumer's
    exact-tile loop as without them (8 QGMMA, <= 500 instructions) and a summary-tile loop of
    <= 540 (the bias add from shared memory is the difference), neither spilling, the bias slots
    within one SM's shared memory. With GROUP = 1 made a constant (the launch's specialization
    before the kernel said ``do_not_specialize``) consumers 1 and 2 spilled 20 times per exact
    tile and 18 per summary tile, and the kernel ran 4-6% slower on the H200. Not asserted: the
    producer's round (18 spills per round at 24 registers while the last summary tile was peeled,
    none since), and forms whose rounds
    spilled more (a leaner round: 11 and 104 per round; a 32-register producer: 6, and consumer
    0 then 12 per tile) measured as fast on the H200 (2026-12-02). No summary tile is peeled
    (the short last block rides in its score bias and vc8 column): 72 QGMMA in the kernel
    against 96 with the peeled last tile, whose range spilled."""
    st, = sass_stats({"schedule": "warp_specialized", "sparse": True,
                      "summary_kernel": "fp8_tiles"})
    assert st["shared"] <= 227 * 1024 and {24, 160, 168} <= set(st["setmaxnreg"]), st
    assert st["main_loop"]["QGMMA"] == 8 and st["main_loop"]["loop"] <= 500, st["main_loop"]
    loops = [loop for loop in st["tile_loops"] if loop[0] <= 540]
    exact = [n for n, _ in loops if n <= 500]
    assert len(exact) >= 3 and len(loops) - len(exact) >= 3, st["tile_loops"]
    assert all(spills == 0 for _, spills in loops), st["tile_loops"]
    assert st["producer_loops"] and st["QGMMA"] == 72, st


@pytest.mark.skipif(not os.path.exists(PTXAS), reason="triton wheel without its ptxas")
def test_gluon_summary_pass_compiles_four_per_sm():
    """Sol's summary pass in Gluon (``summary_gluon``): at most 128 registers without spills or
    wgmma serialization and about 48 KB of shared memory, so four programs share an SM (the Triton
    pass: 168 registers, three), with the chunk's 16 exponentials per thread (+ 2 for the
    rescale) the only ones."""
    gl_st, tr_st = sass_stats({"sparse": True, "summary_only": True},
                              {"sparse": True, "summary_only": True, "summary_kernel": "triton"})
    assert gl_st["regs"] <= 128 and gl_st["ptxas"] == "spill stores 0 B", gl_st
    # four programs' shared memory (with the static part) within one SM's 228 KB
    assert gl_st["STL"] == 0 and 4 * (gl_st["shared"] + gl_st["shared_static"]) <= 228 * 1024, \
        gl_st
    assert 65536 // (128 * gl_st["regs"]) >= 4 > 65536 // (128 * tr_st["regs"]), (gl_st, tr_st)
    assert gl_st["MUFU.EX2"] == 18, gl_st  # the loop's, no other exponentials


@pytest.mark.skipif(not os.path.exists(PTXAS), reason="triton wheel without its ptxas")
def test_small_n_mma_probe_compiles_its_cases():
    """scripts/gpu_small_n_mma_probe.py (the probe of the tensor-core row sum's narrow product)
    compiles every case for sm_90a: each emits the n = 128 P @ V and its narrow n-wide product,
    so the probe runs as written on the GPU."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    p = subprocess.run([sys.executable, "scripts/gpu_small_n_mma_probe.py", "--compile-only"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr[-2000:]
    lines = [ln for ln in p.stdout.splitlines() if " n=" in ln]
    assert len(lines) == 21, p.stdout
    for ln in lines:
        n = int(ln.split(" n=")[1].split()[0])
        want = {f"m64n{n}k32", "m64n128k32"}
        assert f"{sorted(want)}" in ln, ln


@pytest.mark.skipif(not os.path.exists(PTXAS), reason="triton wheel without its ptxas")
def test_ws_kernel_row_sum_on_the_tensor_cores_compiles_leaner():
    """row_sum="p_operand" in the warp-specialized dense kernel: each consumer's tile takes 4 more
    QGMMA (P @ ones, n = 8) and drops the 64 FADD of the row sum and its shuffles: under 420
    SASS instructions per tile against 456, no spills."""
    base, rs = sass_stats({"schedule": "warp_specialized"},
                          {"schedule": "warp_specialized", "row_sum": "p_operand"})
    assert base["tile_loops_row_sum_mma"] == [] and base["main_loop"]["FADD"] >= 64, base
    loops = rs["tile_loops_row_sum_mma"]
    assert len(loops) >= 3 and all(spills == 0 for _, spills in loops), loops
    assert rs["ptxas"] == "spill stores 0 B" and rs["QGMMA"] == base["QGMMA"] + 24, rs
    assert rs["main_loop"]["QGMMA"] == 12 and rs["main_loop"].get("FADD", 0) < 8, rs["main_loop"]
    assert rs["main_loop"]["loop"] < 420 < base["main_loop"]["loop"], (rs["main_loop"],
                                                                       base["main_loop"])


@pytest.mark.skipif(not os.path.exists(PTXAS), reason="triton wheel without its ptxas")
def test_list_kernel_row_sum_on_the_tensor_cores_compiles_leaner():
    """row_sum="p_operand" in the warp-specialized exact tiles (VSA; Sol with its summary
    tiles): each consumer's tile takes 4 more QGMMA (P @ ones of the two 64-key halves, n = 8)
    and drops the row sum's FADD and shuffles: under 425 SASS instructions per tile against
    ~490. The [64, 8] row-sum accumulator costs consumers 1 and 2 (160 registers) a few spill
    instructions per tile (<= 4; consumer 0 at 168: none), which only the GPU can price."""
    for extra in ({"summary": False}, {"summary_kernel": "fp8_tiles"}):
        base, rs = sass_stats({"schedule": "warp_specialized", "sparse": True, **extra},
                              {"schedule": "warp_specialized", "sparse": True, **extra,
                               "row_sum": "p_operand"})
        loops = [loop for loop in rs["tile_loops_row_sum_mma"] if loop[0] < 600]  # the tiles
        assert base["tile_loops_row_sum_mma"] == [] and len(loops) >= 3, (extra, loops)
        assert all(n < 425 and spills <= 4 for n, spills in loops), (extra, loops)
        assert min(spills for _, spills in loops) == 0, (extra, loops)
        assert rs["main_loop"].get("FADD", 0) < 8 <= base["main_loop"]["FADD"], (extra, rs)
        assert rs["QGMMA"] == base["QGMMA"] + 24 and base["main_loop"]["loop"] >= 480, (extra,
                                                                                        base)


@pytest.mark.skipif(not os.path.exists(PTXAS), reason="triton wheel without its ptxas")
def test_ws_kernel_log_linear_p_compiles_without_exponentials():
    """p_exp="log_linear" in the warp-specialized dense kernel: the tile's 64 MUFU.EX2 (and 32
    F2FP) are gone, two stay (the rescale's), P's codes cost one FFMA and one FMNMX per element
    and 48-64 PRMT per tile (three per four codes, plus ptxas's reorder of the operand's
    halves), no spills."""
    base, ll = sass_stats(
        {"schedule": "warp_specialized", "row_sum": "p_operand", "p_scaling": "exp2_offset8"},
        {"schedule": "warp_specialized", "row_sum": "p_operand", "p_scaling": "exp2_offset8",
         "p_exp": "log_linear"})
    assert base["main_loop"]["MUFU"] >= 64 and ll["main_loop"].get("MUFU", 0) <= 2, ll
    assert ll["main_loop"].get("F2FP", 0) == 0 and 48 <= ll["main_loop"]["PRMT"] <= 64, ll
    assert ll["ptxas"] == "spill stores 0 B", ll
    assert all(spills == 0 for _, spills in ll["tile_loops_row_sum_mma"]), ll


@pytest.mark.skipif(not os.path.exists(PTXAS), reason="triton wheel without its ptxas")
def test_list_kernel_log_linear_p_compiles_without_exponentials():
    """p_exp="log_linear" in the warp-specialized exact tiles (VSA; Sol with its summary tiles,
    whose weights are codes too): the exact tile's 66 MUFU.EX2 go (two stay, the rescale's),
    under 470 SASS instructions per tile, at most 6 spill instructions per tile in consumers 1
    and 2 (4 as compiled at 1b19fcb; 10 when the summary tiles kept their exponentials, aa05a21)
    and none in consumer 0. With Sol's summary tiles no tile loop keeps an FP32 row sum (their
    P @ ones), each under 520 instructions with at most 6 spills (505-509 and 5 at 1b19fcb;
    542-549 with the exponentials), and the kernel's MUFU.EX2 fall from 216 to under 24. The
    programs kernel compiles with the codes too."""
    base = {"schedule": "warp_specialized", "sparse": True, "row_sum": "p_operand",
            "p_scaling": "exp2_offset8"}
    for extra in ({"summary": False}, {"summary_kernel": "fp8_tiles"}):
        ll, = sass_stats({**base, **extra, "p_exp": "log_linear"})
        exact = [loop for loop in ll["tile_loops_row_sum_mma"] if loop[0] < 470]
        assert len(exact) >= 3 and all(spills <= 6 for _, spills in exact), (extra, exact)
        assert min(spills for _, spills in exact) == 0, (extra, exact)
        assert ll["main_loop"].get("MUFU", 0) <= 2 and ll["main_loop"]["PRMT"] >= 48, ll
        if "summary_kernel" in extra:
            summary = [loop for loop in ll["tile_loops_row_sum_mma"] if 470 <= loop[0] < 600]
            assert not ll["tile_loops"], ll["tile_loops"]  # no FP32-sum summary loop left
            assert len(summary) >= 3 and all(n < 520 and spills <= 6 for n, spills in summary)
            assert ll["MUFU.EX2"] < 24, ll["MUFU.EX2"]
    prog, = sass_stats({"p_scaling": "exp2_offset8", "row_sum": "p_operand",
                        "p_exp": "log_linear"})
    assert prog["main_loop"].get("MUFU", 0) <= 4, prog["main_loop"]

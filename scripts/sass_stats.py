"""Compile the FP8 attention kernel for sm_90 on ANY machine (no GPU needed) and count what ptxas
made of it: registers, shared memory, spills and the instruction mix of the SASS.

    python scripts/sass_stats.py '{"flush": "triton"}' '{"p_scaling": "exp2_offset8"}' [...]

Each argument is a JSON object of overrides of the default ``AttentionConfig`` (block_m, block_n,
num_warps, num_stages, maxnreg, use_tma, flush, max_imprecise), plus ``p_scaling`` (the recipe's P
scaling, default "unit"), ``row_sum``, ``p_exp`` (the recipe's row sum and P from its exponent)
and ``perm_p`` (V^T in P's register order; default
``QuantConfig.v_perm``), ``bf16`` (BF16 operands: the sparse recipes' BF16 baselines).
``"schedule": "warp_specialized"`` (with ``num_stages``; ``row_sum``: "p_operand" for P @ ones on
the tensor cores) compiles the dense Gluon kernel (``attention_fp8_ws``) instead, with
``"sparse": true`` the warp-specialized exact tiles (``attention_fp8_ws_lists``); their main loop
is one consumer's loop.
``"sparse": true`` compiles the block-sparse specialization (routing
lists) with the ``SparseConfig`` fields ``tma`` (per-block TMA boxes or gathered loads),
``summary_precision``, ``summary_chunk``, ``schedule`` and ``sparse_maxnreg`` (the exact-tile
launch's register cap); ``"summary_only": true`` compiles Sol's summary pass instead of the
exact-tile launch (the Gluon kernel ``summary_gluon`` where it runs, else the Triton one;
``"summary_kernel": "triton"`` forces the latter), and ``"summary": false`` for VSA (no summary
route, no merge of its state). Its arguments carry the specializations of a launch at the H3
anchor (16-byte aligned pointers, ``H3_LAUNCH_INTS``; ``"row_start"`` sets that argument). Used
to check a kernel change (spills, MUFU / FP32 op counts, the main loop's instruction count; for
the warp-specialized kernels each consumer's tile loops and the producer's rounds, with their
spills) before spending GPU time on it.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import subprocess
import sys

import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from workbench.kernels import summary_gluon  # noqa: E402
from workbench.kernels.attention_fp8 import P_LOG2_SCALES  # noqa: E402
from workbench.kernels.attention_fp8 import _fp8_attn_fwd_kernel as KERNEL  # noqa: E402
from workbench.kernels.config import DEFAULT  # noqa: E402

OPS = ["QGMMA", "MUFU.EX2", "FMUL", "FFMA", "FADD", "FMNMX", "HADD2", "F2FP", "F2F", "STL", "LDL",
       "SHFL", "BAR", "STS", "LDS"]


SPARSE_KEYS = ("sparse", "summary", "tma", "summary_precision", "summary_chunk", "schedule",
               "sparse_maxnreg", "summary_only", "summary_kernel")

# The integer arguments of a launch at the H3 anchor (1, 32626, 56, 128), specialized as triton
# specializes them at a launch: an int equal to 1 becomes a constant, one divisible by 16 carries
# that divisibility. Without them the offline code was not the launch's: the list kernel's output
# stores compiled to 16-bit stores (32-bit at the launch) and its spills sat elsewhere.
# "row_start" is a key of the JSON overrides (0 here; 370 for the Sol recipe's BF16 prefix rows).
H3_LAUNCH_INTS = dict(S=32626, S_len=32626, S_pad=32640, H=56, GROUP=1, row_start=0,
                      stride_ob=32626 * 56 * 128, stride_os=56 * 128, stride_oh=128, N_QB=510,
                      N_KB=510, N_BH=56, ORDER_STRIDE=510, HEAVY=0)


def launch_specialization(fn, sig: dict, cst: dict, ints: dict) -> dict:
    """The launch's specializations of kernel fn's run-time arguments: every pointer 16-byte
    aligned (torch's allocations), and each int argument named in `ints` as triton specializes
    its value (1: a constant, put into `cst` and `sig`; divisible by 16: that divisibility),
    unless the kernel says ``do_not_specialize`` for it. Returns the compile attributes."""
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.compiler import BaseBackend

    attrs = {}
    for i, param in enumerate(fn.params):
        n = param.name
        if sig[n].startswith("*"):
            attrs[(i,)] = [["tt.divisibility", 16]]
        elif sig[n] in ("i32", "i64") and n in ints and not param.do_not_specialize:
            kind, spec = native_specialize_impl(BaseBackend, ints[n], False, True, True)
            if kind == "constexpr":
                sig[n], cst[n] = "constexpr", ints[n]
            elif spec == "D":
                attrs[(i,)] = [["tt.divisibility", 16]]
    return attrs


def _compile_gluon(fn, types: list[str], constexprs: dict, ints: dict,
                   maxnreg: int | None = None):
    """Compile a Gluon kernel for sm_90a as its launch does: `types` the leading arguments'
    signature types (the rest constexpr), `constexprs` their values (a "constexpr" type's value
    None), `ints` the launch's integer arguments (``launch_specialization``). num_warps 4 and
    the warp-specialized kernels' register cap."""
    from triton.experimental.gluon._runtime import GluonASTSource

    from workbench.kernels.attention_fp8_ws import MAXNREG

    names = fn.arg_names
    sig = dict(zip(names, types + ["constexpr"] * (len(names) - len(types))))
    cst = dict(constexprs)
    cst.update({n: None for n, t in zip(names, types) if t == "constexpr"})
    attrs = launch_specialization(fn, sig, cst, ints)
    src = GluonASTSource(fn=fn, signature=sig, attrs=attrs,
                         constexprs={(names.index(k),): v for k, v in cst.items()})
    kernel = triton.compile(src, target=GPUTarget("cuda", 90, 32),
                            options=dict(num_warps=4, maxnreg=maxnreg or MAXNREG))
    return kernel


def _ws_types(k_box: int, v_box: int) -> list[str]:
    """The leading signature types both warp-specialized kernels share: the Q / K / V TMA
    descriptors (E4M3, 64-row Q box, k_box-key K box, V^T box of v_box keys), the scale and
    output pointers (BF16 output) and the run-time scalars."""
    from triton.experimental.gluon import language as gl

    f8 = gl.float8e4nv
    lq = gl.NVMMASharedLayout.get_default_for([64, 128], f8)
    lk = gl.NVMMASharedLayout.get_default_for([k_box, 128], f8)
    lv = gl.NVMMASharedLayout.get_default_for([128, v_box], f8)
    return [f"tensordesc<fp8e4nv[64, 128],{lq!r}>", f"tensordesc<fp8e4nv[{k_box}, 128],{lk!r}>",
            f"tensordesc<fp8e4nv[128, {v_box}],{lv!r}>",
            "*fp32", "*fp32", "*fp32", "*fp32", "*bf16", "*bf16"] + ["i32"] * 5 + ["fp32"] \
        + ["i32"] * 3


def _ws_constexprs(overrides: dict) -> dict:
    from workbench.kernels.attention_fp8_ws import CONSUMER_REGS

    return dict(STAGES=overrides.get("num_stages", DEFAULT.attention.num_stages),
                CONS_REGS=CONSUMER_REGS,
                P_LOG2_SCALE=P_LOG2_SCALES[overrides.get("p_scaling", "unit")],
                PERM_P=bool(overrides.get("perm_p", DEFAULT.quant.v_perm)), WRITE_LSE=False,
                OUT_F32=False)


def _ws_p_constexprs(overrides: dict) -> dict:
    """``row_sum`` "p_operand" = P @ ones on the tensor cores (both warp-specialized kernels);
    ``p_exp`` "log_linear": P's codes without an exponential."""
    return dict(ROW_SUM_MMA=overrides.get("row_sum", "p_fp32") == "p_operand",
                P_LL=overrides.get("p_exp", "exp2") == "log_linear")


def compile_ws(overrides: dict, ints: dict):
    """The warp-specialized dense kernel (``attention_fp8_ws``, Gluon) as ``fp8_attention_fwd``
    launches it for ``schedule="warp_specialized"`` (head dim 128, BF16 output)."""
    from workbench.kernels.attention_fp8_ws import CONSUMERS, MAXNREG
    from workbench.kernels.attention_fp8_ws import _fp8_attn_ws_kernel as ws

    cfg = dataclasses.replace(DEFAULT.attention, **{k: v for k, v in overrides.items()
                                                    if k not in ("p_scaling", "perm_p",
                                                                 "row_sum", "p_exp")})
    cst = dict(_ws_constexprs({**overrides, "num_stages": cfg.num_stages}), N_CONS=CONSUMERS,
               **_ws_p_constexprs(overrides))
    kernel = _compile_gluon(ws, _ws_types(128, 128), cst, ints)
    return kernel, dataclasses.replace(cfg, maxnreg=MAXNREG)


def compile_ws_lists(overrides: dict, ints: dict):
    """The warp-specialized exact tiles of block-sparse attention (``attention_fp8_ws_lists``)
    as the sparse launch takes them (Sol: merging the summary pass's state; ``"summary": false``
    for VSA)."""
    from workbench.kernels.attention_fp8_ws import MAXNREG
    from workbench.kernels.attention_fp8_ws_lists import _fp8_attn_ws_lists_kernel as ws

    from triton.experimental.gluon import language as gl

    summary = bool(overrides.get("summary", True))
    # Sol's summary route as E4M3 tiles in this kernel instead of its own pass
    tiles = summary and overrides.get("summary_kernel") == "fp8_tiles"
    merge = summary and not tiles
    types = _ws_types(64, 64) + ["*i32", "*i32", "i32", "i32", "i32"]  # lists, N_QB, N_KB, N_BH
    types += ["*fp32", "*fp32"] if merge else ["constexpr", "constexpr"]  # SUM_O, SUM_ML
    types += ["*i32", "i32", "i32"]  # ORDER, ORDER_STRIDE, HEAVY
    if tiles:  # the kc8 / vc8^T descriptors, SKC, EXACT
        f8 = gl.float8e4nv
        lk = gl.NVMMASharedLayout.get_default_for([64, 128], f8)
        lv = gl.NVMMASharedLayout.get_default_for([128, 64], f8)
        types += [f"tensordesc<fp8e4nv[64, 128],{lk!r}>",
                  f"tensordesc<fp8e4nv[128, 64],{lv!r}>", "*fp32", "*u8"]
    else:
        types += ["constexpr"] * 4
    types += ["fp32"]  # LAST_LOG2
    cst = dict(_ws_constexprs(overrides), INIT_SUMMARY=merge, SUM_TILES=tiles,
               **_ws_p_constexprs(overrides))
    kernel = _compile_gluon(ws, types, cst, ints)
    return kernel, dataclasses.replace(DEFAULT.attention, maxnreg=MAXNREG)


def compile_summary_gluon(overrides: dict, ints: dict):
    """Sol's summary pass in Gluon (``summary_gluon``) as the sparse launch takes it (head dim
    128, the prefix blocks skipped)."""
    chunk = overrides.get("summary_chunk", DEFAULT.sparse.summary_chunk)
    p_log2 = P_LOG2_SCALES[overrides.get("p_scaling", "unit")]
    types = ["*fp8e4nv", "*fp32", "*i32", "*i32", "*bf16", "*bf16", "*fp32", "*fp32"]
    types += ["i32"] * 7 + ["fp32", "i32"]
    cst = dict(HEAD_D=128, CHUNK=chunk, P_LOG2_SCALE=p_log2, SKIP_PREFIX=True)
    regs = summary_gluon.MAXNREG
    kernel = _compile_gluon(summary_gluon._summary_kernel, types, cst, ints, maxnreg=regs)
    return kernel, dataclasses.replace(DEFAULT.attention, maxnreg=regs)


def compile_sm90(overrides: dict):
    """Compile the kernel as ``fp8_attention_fwd`` launches it at the H3 anchor (head dim 128,
    BF16 output, ``H3_LAUNCH_INTS`` with the overrides' "row_start")."""
    ints = dict(H3_LAUNCH_INTS, **{k: overrides[k] for k in ("row_start",) if k in overrides})
    overrides = {k: v for k, v in overrides.items() if k != "row_start"}
    sp_cfg = dataclasses.replace(DEFAULT.sparse, **{k: overrides[k] for k in (
        "summary_kernel", "summary_chunk", "summary_precision") if k in overrides})
    if overrides.get("summary_only") and summary_gluon.takes(sp_cfg):
        return compile_summary_gluon(overrides, ints)  # the kernel the sparse launch takes
    if overrides.get("schedule") == "warp_specialized":
        if overrides.get("sparse"):
            return compile_ws_lists(overrides, ints)
        return compile_ws(overrides, ints)
    if not overrides.get("sparse"):  # "schedule": "programs": AttentionConfig's, this kernel
        overrides = {k: v for k, v in overrides.items() if k != "schedule"}
    extra = {k: overrides[k] for k in ("p_scaling", "perm_p", "bf16", "row_sum", "p_exp")
             if k in overrides}
    sp = {k: overrides[k] for k in SPARSE_KEYS if k in overrides}
    cfg = dataclasses.replace(DEFAULT.attention, **{k: v for k, v in overrides.items()
                                                    if k not in extra and k not in sp})
    sparse = bool(sp.pop("sparse", False))
    summary = bool(sp.pop("summary", True))
    summary_only = bool(sp.pop("summary_only", False))
    if "sparse_maxnreg" in sp:
        sp["maxnreg"] = sp.pop("sparse_maxnreg")
    scfg = dataclasses.replace(DEFAULT.sparse, **sp)
    bm, bn = cfg.block_m, cfg.block_n
    tma = scfg.tma if sparse else cfg.use_tma
    box = 64 if sparse else bn  # the sparse tiles load one TMA box per 64-key block
    op = "bf16" if extra.get("bf16") else "fp8e4nv"  # the BF16 baselines' operands
    types = [f"*{op}", "*fp32", f"*{op}", "*fp32", f"*{op}", "*fp32", "*fp32", "*bf16", "*fp32"]
    if tma:
        types += [f"tensordesc<{op}[{bm}, 128]>", f"tensordesc<{op}[{box}, 128]>",
                  f"tensordesc<{op}[128, {box}]>"]
    else:
        types += ["constexpr"] * 3
    types += ["i32"] * 5 + ["fp32"] + ["i32"] * 3
    # BLOCKS, COUNTS, ORDER, KC, VCS, LENS, PART_O, PART_ML (None unless sparse; one KV part);
    # the summary operands only in the summary pass (summary_only)
    work_list = sparse and scfg.schedule == "heavy_first" and not summary_only
    sum_t = "*bf16" if scfg.summary_precision == "bf16" else "*fp32"
    types += ["*i32" if sparse else "constexpr"] * 2 + ["*i32" if work_list else "constexpr"]
    types += ([sum_t, sum_t, "*fp32"] if summary_only else ["constexpr"] * 3)
    types += ["constexpr"] * 2
    types += ["i32"] * 3  # N_QB, N_KB, N_BH
    # Sol: this is the exact-tile launch, which merges the summary pass's state (SUM_O, SUM_ML)
    init_summary = sparse and summary and not summary_only
    types += ["*fp32" if sparse and summary else "constexpr"] * 2  # SUM_O, SUM_ML
    names = KERNEL.arg_names
    sig = dict(zip(names, types + ["constexpr"] * (len(names) - len(types))))
    pv_fma = cfg.flush == "fma"
    cst = dict(HEAD_D=128, BLOCK_M=bm, BLOCK_N=bn, SCALE_BLOCK=64, ROUND_P=False,
               IMP_QK=-1 if pv_fma else min(cfg.max_imprecise, 128),
               IMP_PV=min(cfg.max_imprecise, bn), WRITE_LSE=False, OUT_F32=False,
               USE_TMA=tma, PV_FMA=pv_fma,
               PERM_P=bool(extra.get("perm_p", DEFAULT.quant.v_perm)) and not extra.get("bf16"),
               P_LOG2_SCALE=P_LOG2_SCALES[extra.get("p_scaling", "unit")], INTERPRET=False,
               SPARSE=sparse, SUMMARY=summary_only,
               WORK_LIST=work_list, KV_SPLITS=1, SUM_CHUNK=scfg.summary_chunk,
               SUM_PREC=scfg.summary_precision, SUMMARY_ONLY=summary_only,
               INIT_SUMMARY=init_summary,
               ROW_SUM_P=extra.get("row_sum", "p_fp32") == "p_operand",
               P_LL=extra.get("p_exp", "exp2") == "log_linear")
    cst.update({n: None for n, t in zip(names, types) if t == "constexpr"})
    attrs = launch_specialization(KERNEL, sig, cst, ints)
    src = ASTSource(fn=KERNEL, signature=sig,
                    constexprs={(names.index(k),): v for k, v in cst.items()}, attrs=attrs)
    opts = dict(num_warps=cfg.num_warps, num_stages=cfg.num_stages)
    cap = (None if summary_only else scfg.maxnreg) if sparse else cfg.maxnreg
    if cap:
        opts["maxnreg"] = cap
    return triton.compile(src, target=GPUTarget("cuda", 90, 32), options=opts), \
        dataclasses.replace(cfg, maxnreg=cap)


def ptxas_info(kernel, maxnreg=None) -> str:
    """ptxas -v's notes for the kernel's PTX (spills and C7514-style wgmma serialization)."""
    ptx = "/tmp/sass/_k.ptx"
    os.makedirs("/tmp/sass", exist_ok=True)
    with open(ptx, "w") as f:
        f.write(kernel.asm["ptx"])
    tool = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/ptxas")
    cmd = [tool, "-arch=sm_90a", "-v", ptx, "-o", "/tmp/sass/_k.cubin"]
    if maxnreg:
        cmd += ["--maxrregcount", str(maxnreg)]
    r = subprocess.run(cmd, capture_output=True, text=True)
    text = r.stdout + r.stderr
    notes = []
    if "serialized" in text:
        why = text.split("serialized due to", 1)[1].split(" in the")[0]
        notes.append("WGMMA SERIALIZED: " + why)
    m = re.search(r"(\d+) bytes spill stores", text)
    notes.append(f"spill stores {m.group(1) if m else '?'} B")
    return "; ".join(notes)


def sass_counts(kernel, tag: str, out_dir: str = "/tmp/sass") -> dict:
    os.makedirs(out_dir, exist_ok=True)
    cubin = os.path.join(out_dir, f"{tag}.cubin")
    with open(cubin, "wb") as f:
        f.write(kernel.asm["cubin"])
    tool = os.path.join(os.path.dirname(triton.__file__), "backends/nvidia/bin/cuobjdump")
    sass = subprocess.run([tool, "-sass", cubin], capture_output=True, text=True).stdout
    with open(os.path.join(out_dir, f"{tag}.sass"), "w") as f:
        f.write(sass)
    with open(os.path.join(out_dir, f"{tag}.ttgir"), "w") as f:
        f.write(kernel.asm["ttgir"])
    res = subprocess.run([tool, "-res-usage", cubin], capture_output=True, text=True).stdout
    m = re.search(r"REG:(\d+).*?SHARED:(\d+).*?LOCAL:(\d+)", res, re.S)
    counts = {op: len(re.findall(rf"\b{re.escape(op)}\b", sass)) for op in OPS}
    counts["main_loop"] = main_loop_counts(sass)
    counts["tile_loops"] = tile_loops(sass)
    counts["tile_loops_row_sum_mma"] = tile_loops(sass, 12)
    counts["producer_loops"] = producer_loops(sass)
    # warp-specialized kernels: the per-partition register counts (setmaxnreg in the PTX)
    counts["setmaxnreg"] = sorted({int(x) for x in re.findall(
        r"setmaxnreg\.(?:inc|dec)\.sync\.aligned\.u32\s+(\d+)", kernel.asm["ptx"])})
    regs, shared, local = (int(x) for x in m.groups()) if m else (None, None, None)
    return {"regs": regs, "shared_static": shared, "local": local,
            "shared": kernel.metadata.shared, **counts}


def _instructions(sass: str) -> tuple[list[int], list[str]]:
    """(addresses, instructions without their predicates) of a cuobjdump SASS listing."""
    addr, ops = [], []
    for line in sass.splitlines():
        m = re.match(r"\s+/\*([0-9a-f]{4,})\*/\s+(.*?);", line)
        if m:
            addr.append(int(m.group(1), 16))
            ops.append(re.sub(r"^@!?U?P[T0-9]+\s+", "", m.group(2).strip()))
    return addr, ops


def _loop_bodies(sass: str) -> list[list[str]]:
    """The instructions of every backward-branch range (a loop body, or loops nested in one)."""
    addr, ops = _instructions(sass)
    bodies = []
    for a, ins in zip(addr, ops):
        m = re.match(r"BRA\s+(?:`\(.*?\)\s*)?0x([0-9a-f]+)", ins)
        if m and int(m.group(1), 16) < a:
            bodies.append([o for x, o in zip(addr, ops) if int(m.group(1), 16) <= x <= a])
    return bodies


def _spills(body: list[str]) -> int:
    return sum(o.startswith(("STL", "LDL")) for o in body)


def tile_loops(sass: str, qgmma: int = 8) -> list[list[int]]:
    """[instructions, spill loads + stores] of every backward-branch range holding one tile's
    8 QGMMAs (each consumer's exact-tile loop, and its summary-tile loop where there is one);
    qgmma=12: the dense kernel's tile with the row sum on the tensor cores (4 more, P @ ones)."""
    return [[len(b), _spills(b)] for b in _loop_bodies(sass)
            if sum(o.startswith("QGMMA") for o in b) == qgmma]


def producer_loops(sass: str) -> list[list[int]]:
    """[instructions, spill loads + stores] of every backward-branch range that issues TMA loads
    and no wgmma: the warp-specialized kernels' producer rounds (the producer warp has 24
    registers). A per-item form of the list kernel whose round spilled ran 15-21% slower, but
    its 32-register form, with fewer spills (2 and 8 against 13 and 29), was slower still, and
    forms that spilled more ran as fast (BENCHMARKS.md, thirteenth and fourteenth rounds): what a
    spill costs there is small."""
    return [[len(b), _spills(b)] for b in _loop_bodies(sass)
            if any(o.startswith("UTMALDG") for o in b)
            and not any(o.startswith("QGMMA") for o in b)]


def main_loop_counts(sass: str) -> dict:
    """Instruction counts of the key-tile main loop: the smallest backward branch range that
    holds the 8 QGMMAs of one tile (4 for Q K^T, 4 for P @ V). Returns {"loop": total, op: n}."""
    addr, ops = _instructions(sass)
    best = None
    for a, ins in zip(addr, ops):
        m = re.match(r"BRA\s+(?:`\(.*?\)\s*)?0x([0-9a-f]+)", ins)
        if not m or int(m.group(1), 16) >= a:
            continue
        t = int(m.group(1), 16)
        body = [o for x, o in zip(addr, ops) if t <= x <= a]
        # 8 QGMMAs per 128-key tile (4 for Q K^T, 4 for P @ V), 12 for two 64-key halves
        one_tile = sum(o.startswith("QGMMA") for o in body) in (8, 12)
        if one_tile and (best is None or len(body) < len(best)):
            best = body
    counts = {}
    for o in best or []:
        op = o.split()[0].split(".")[0]
        counts[op] = counts.get(op, 0) + 1
    return {"loop": len(best or []), **dict(sorted(counts.items(), key=lambda kv: -kv[1]))}


def main(argv):
    for i, arg in enumerate(argv or ["{}"]):
        kernel, cfg = compile_sm90(json.loads(arg))
        stats = sass_counts(kernel, f"k{i}")
        stats["ptxas"] = ptxas_info(kernel, cfg.maxnreg)
        print(json.dumps(json.loads(arg)), json.dumps(stats), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])

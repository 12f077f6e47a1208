"""Does a narrow FP8 wgmma (n = 8 .. 64) with P in registers read its shared-memory B right?

    python scripts/gpu_small_n_mma_probe.py [--out DIR]          # Hopper GPU
    python scripts/gpu_small_n_mma_probe.py --compile-only       # any machine: the PTX's wgmma

Why: the row sum on the tensor cores (recipe field ``row_sum="p_operand"``: l = P @ ones with the
E4M3 P of P @ V, one n = 8 product per key tile) measured 2-3% faster than the FP32 row sum but
4-6x the recipe's error (commit 1a048a6). This probe isolates the product from the attention
kernel: one Gluon program per 64 x 128 tile of P (FP32 in global memory, rounded to E4M3 in the
accumulator layout and handed to the MMA in registers exactly as ``attention_fp8_ws`` does, V^T's
keys in P's register order), then
- ``ones``: P @ B with B an [n, 128] shared tile of E4M3 ones (``NVMMASharedLayout``, swizzle
  ``--swizzles``), every column of the result should be the row sum of the E4M3 P;
- ``vslice``: P @ B with B the first n rows of the V^T tile that P @ V reads (written the same
  way), which should equal the first n columns of P @ V;
- the tile's n = 128 P @ V from the same registers, against torch.
It also reads the B tile back from shared memory with an ordinary load. Each row of the table:
the read-back's min / max, the narrow product's relative error against torch (rel-L2 and the mean
signed error of the ones product) and P @ V's rel-L2. A narrow product that is off while P @ V
and the read-back are right means the MMA reads the narrow B tile from elsewhere than the data.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    warpgroup_mma,
    warpgroup_mma_wait,
)

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from workbench.kernels.attention_fp8_ws import _p_operand  # noqa: E402

CASES = [  # (source of B, n, rows allocated for the B tile)
    ("ones", 8, 8), ("ones", 8, 64), ("ones", 16, 16), ("ones", 32, 32), ("ones", 128, 128),
    ("vslice", 8, 128), ("vslice", 16, 128), ("vslice", 64, 128),
    ("ones_bits", 8, 8), ("ones_bits", 16, 16), ("vones", 8, 128),
]


@gluon.jit
def _probe_kernel(P, VT, OUT_N, OUT_PV, OUT_B, NL: gl.constexpr, ALLOC: gl.constexpr,
                  SW: gl.constexpr, FROM_V: gl.constexpr, ONES_BITS: gl.constexpr = False):
    """P [T, 64, 128] fp32, VT [128, 128] e4m3 (V^T, keys in P's register order) -> OUT_N
    [T, 64, NL] = P8 @ B, OUT_PV [T, 64, 128] = P8 @ V, OUT_B [T, NL, 128] = B read back."""
    mma: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                  instr_shape=[16, 128, 32])
    a_layout: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma, k_width=4)
    mma_n: gl.constexpr = gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1],
                                                    instr_shape=[16, NL, 32])
    a_n: gl.constexpr = gl.DotOperandLayout(operand_index=0, parent=mma_n, k_width=4)
    fill: gl.constexpr = gl.BlockedLayout([1, 4], [1, 32], [4, 1], [1, 0])
    t = gl.program_id(0)
    rows = gl.arange(0, 64, layout=gl.SliceLayout(1, mma))
    cols = gl.arange(0, 128, layout=gl.SliceLayout(0, mma))
    p = gl.load(P + t * 64 * 128 + rows[:, None] * 128 + cols[None, :])
    p8 = _p_operand(p.to(gl.float8e4nv), a_layout, True)
    vt_l: gl.constexpr = gl.NVMMASharedLayout.get_default_for([128, 128], gl.float8e4nv)
    vr = gl.arange(0, 128, layout=gl.SliceLayout(1, fill))
    vc = gl.arange(0, 128, layout=gl.SliceLayout(0, fill))
    vt = gl.load(VT + vr[:, None] * 128 + vc[None, :])
    vt_smem = gl.allocate_shared_memory(gl.float8e4nv, [128, 128], vt_l, vt)
    if FROM_V:
        b_smem = vt_smem.slice(0, NL, 0)
    else:
        ones_l: gl.constexpr = gl.NVMMASharedLayout(swizzle_byte_width=SW, element_bitwidth=8,
                                                    rank=2)
        if ONES_BITS:  # E4M3 1.0 as its byte 0x38, reinterpreted
            ones = gl.full([ALLOC, 128], 0x38, gl.uint8, fill).to(gl.float8e4nv, bitcast=True)
        else:  # 1.0 in FP32 converted to E4M3
            ones = gl.full([ALLOC, 128], 1.0, gl.float32, fill).to(gl.float8e4nv)
        b_smem = gl.allocate_shared_memory(gl.float8e4nv, [ALLOC, 128], ones_l,
                                           ones).slice(0, NL, 0)
    fence_async_shared()
    gl.thread_barrier()
    br = gl.arange(0, NL, layout=gl.SliceLayout(1, fill))
    bc = gl.arange(0, 128, layout=gl.SliceLayout(0, fill))
    gl.store(OUT_B + t * NL * 128 + br[:, None] * 128 + bc[None, :],
             b_smem.load(fill).to(gl.float32))
    pv = warpgroup_mma(p8, vt_smem.permute((1, 0)), gl.zeros([64, 128], gl.float32, mma),
                       use_acc=False, is_async=True)
    pn = warpgroup_mma(gl.convert_layout(p8, a_n, assert_trivial=True), b_smem.permute((1, 0)),
                       gl.zeros([64, NL], gl.float32, mma_n), use_acc=False, is_async=True)
    pv, pn = warpgroup_mma_wait(0, deps=(pv, pn))
    gl.store(OUT_PV + t * 64 * 128 + rows[:, None] * 128 + cols[None, :], pv)
    rn = gl.arange(0, 64, layout=gl.SliceLayout(1, mma_n))
    cn = gl.arange(0, NL, layout=gl.SliceLayout(0, mma_n))
    gl.store(OUT_N + t * 64 * NL + rn[:, None] * NL + cn[None, :], pn)


def register_order(n: int = 128) -> torch.Tensor:
    """Key held by column c of the permuted P (``attention_fp8_ws._p_operand``): within each
    32-key group, c's bits (k4, k2, k1, k3, k0) name key (k4, k3, k2, k1, k0)."""
    return torch.arange(n).view(n // 32, 2, 2, 2, 2, 2).permute(0, 1, 3, 4, 2, 5).reshape(n)


def run_case(source: str, n: int, alloc: int, sw: int, tiles: int = 16, seed: int = 0) -> dict:
    g = torch.Generator(device="cuda").manual_seed(seed)
    # attention-like P: 2^-(0..12), so E4M3 rounding and the row sums are those of real tiles
    p = torch.exp2(-12 * torch.rand(tiles, 64, 128, device="cuda", generator=g))
    p8 = p.to(torch.float8_e4m3fn).float()
    v = torch.randn(128, 128, device="cuda", generator=g).to(torch.float8_e4m3fn)
    if source == "vones":  # the V^T tile holds ones, loaded from global memory as V is
        v = torch.ones_like(v)
    vt = v.float()[register_order().cuda()].t().contiguous().to(torch.float8_e4m3fn)
    out_n = torch.full((tiles, 64, n), float("nan"), device="cuda")
    out_pv = torch.full((tiles, 64, 128), float("nan"), device="cuda")
    out_b = torch.full((tiles, n, 128), float("nan"), device="cuda")
    _probe_kernel[(tiles,)](p, vt, out_n, out_pv, out_b, NL=n, ALLOC=alloc, SW=sw,
                            FROM_V=source in ("vslice", "vones"), ONES_BITS=source == "ones_bits",
                            num_warps=4)
    torch.cuda.synchronize()
    ref_pv = p8 @ v.float()
    ones = source.startswith("ones") or source == "vones"
    ref_n = p8.sum(-1, keepdim=True).expand(-1, -1, n) if ones else ref_pv[..., :n]
    # the V^T tile as the kernel loaded it (keys in P's register order)
    ref_b = torch.ones_like(out_b) if ones else vt.float()[:n].expand(tiles, -1, -1)

    def rel(x, r):
        return float((x - r).norm() / r.norm())

    res = {"source": source, "n": n, "alloc": alloc, "swizzle": sw if source == "ones" else 128,
           "read_back_ok": bool(torch.equal(out_b, ref_b)),
           "read_back_min": float(out_b.min()), "read_back_max": float(out_b.max()),
           "narrow_rel_l2": rel(out_n, ref_n), "pv_rel_l2": rel(out_pv, ref_pv)}
    if ones:
        res["ones_mean_rel"] = float(((out_n - ref_n) / ref_n).mean())
    return res


def compile_only(swizzles) -> None:
    """Compile every case for sm_90a (no GPU) and print the wgmma shapes each emits."""
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.experimental.gluon._runtime import GluonASTSource

    names = _probe_kernel.arg_names
    for source, n, alloc in CASES:
        for sw in swizzles if source == "ones" else [128]:
            sig = dict(zip(names, ["*fp32", "*fp8e4nv", "*fp32", "*fp32", "*fp32"]
                           + ["constexpr"] * 5))
            cst = {"NL": n, "ALLOC": alloc, "SW": sw, "FROM_V": source in ("vslice", "vones"),
                   "ONES_BITS": source == "ones_bits"}
            src = GluonASTSource(fn=_probe_kernel, signature=sig, attrs={},
                                 constexprs={(names.index(k),): v for k, v in cst.items()})
            k = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=dict(num_warps=4))
            ptx = k.asm["ptx"]
            shapes = sorted(set(re.findall(r"wgmma\.mma_async\.sync\.aligned\.(m64n\d+k32)", ptx)))
            print(f"{source:9s} n={n:3d} alloc={alloc:3d} swizzle={sw:3d}: {shapes}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default=os.environ.get("OUT"), help="folder for the JSON rows")
    ap.add_argument("--swizzles", type=int, nargs="+", default=[128, 64, 32],
                    help="shared-memory swizzles of the ones tile (bytes)")
    ap.add_argument("--compile-only", action="store_true")
    args = ap.parse_args(argv)
    if args.compile_only:
        compile_only(args.swizzles)
        return 0
    if not torch.cuda.is_available() or torch.cuda.get_device_capability()[0] != 9:
        print("needs a Hopper GPU (sm_90); --compile-only runs anywhere", file=sys.stderr)
        return 2
    rows = []
    for source, n, alloc in CASES:
        for sw in args.swizzles if source == "ones" else [128]:
            try:
                rows.append(run_case(source, n, alloc, sw))
            except Exception as exc:  # a case that does not compile or launch: say which
                rows.append({"source": source, "n": n, "alloc": alloc, "swizzle": sw,
                             "error": f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}"})
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "small_n_mma.json"), "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "torch": torch.__version__,
                       "rows": rows}, f, indent=1)
    print("| B | n | rows allocated | swizzle | B read back | narrow product rel-L2 "
          "| ones: mean rel error | P @ V rel-L2 |")
    print("|---|---|---|---|---|---|---|---|")
    for r in rows:
        if "error" in r:
            print(f"| {r['source']} | {r['n']} | {r['alloc']} | {r['swizzle']} | {r['error']} |")
            continue
        back = ("exact" if r["read_back_ok"]
                else f"{r['read_back_min']:.3g}..{r['read_back_max']:.3g}")
        ones = f"{r['ones_mean_rel']:+.3f}" if "ones_mean_rel" in r else ""
        print(f"| {r['source']} | {r['n']} | {r['alloc']} | {r['swizzle']} | {back} | "
              f"{r['narrow_rel_l2']:.3e} | {ones} | {r['pv_rel_l2']:.3e} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())

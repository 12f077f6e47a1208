"""Probe Hopper's FP8 tensor-core accumulator and check the reference path's model of it (GPU).

    python3 scripts/gpu_accumulator_probe.py [--out DIR]

Sums of E4M3 values on the tensor cores (A @ ones, A [64, K] E4M3 with K = 32..256, B = ones),
through a Triton ``tl.dot`` with ``max_num_imprecise_acc = K`` (no FP32 promotion inside the
product) and through ``torch._scaled_mm(use_fast_accum=True)`` (cuBLAS), against the float64 sum
and against ``workbench.attention.quant.mma_sum_truncating`` (the recipe field
``accum_rounding="truncate"``) step by step:

1. placement rows: one large value (2^7 or 2^4) at the first, the 32nd or the last position, or
   none, the other entries one small value c in 2^-9 .. 2^-3: which products the accumulator
   drops, and relative to what;
2. random rows: 2^(-12 u) rounded to E4M3 (u uniform), K = 256: the mean and spread of the
   relative error and the share of inexact rows, for the model and both GPU paths.

Prints the mismatches between the GPU sums and the model (0 expected) and writes
``accumulator_probe.json`` under --out.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from workbench.attention.quant import mma_sum_truncating  # noqa: E402

E4M3 = torch.float8_e4m3fn


@triton.jit
def _sum_rows_kernel(A, B, C, K: tl.constexpr, N: tl.constexpr, IMPRECISE: tl.constexpr):
    """C [64, N] = A [64, K] @ B [K, N] (E4M3 in, FP32 out), one program per 64 rows."""
    rm = tl.program_id(0) * 64 + tl.arange(0, 64)
    rk = tl.arange(0, K)
    rn = tl.arange(0, N)
    a = tl.load(A + rm[:, None] * K + rk[None, :])
    b = tl.load(B + rk[:, None] * N + rn[None, :])
    c = tl.dot(a, b, max_num_imprecise_acc=IMPRECISE, out_dtype=tl.float32)
    tl.store(C + rm[:, None] * N + rn[None, :], c)


def tensor_core_sums(a8: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Row sums of a8 [M, K] (E4M3, M a multiple of 64, on the GPU) by Triton and by cuBLAS."""
    M, K = a8.shape
    ones = torch.ones(K, 16, device=a8.device).to(E4M3)
    c = torch.empty(M, 16, device=a8.device)
    _sum_rows_kernel[(M // 64,)](a8, ones, c, K=K, N=16, IMPRECISE=K, num_warps=4)
    one = torch.tensor(1.0, device=a8.device)
    cb = torch._scaled_mm(a8, ones.t().contiguous().t(), scale_a=one, scale_b=one,
                          out_dtype=torch.float32, use_fast_accum=True)
    return c[:, 0].cpu(), cb[:, 0].cpu()


def model_sums(a: torch.Tensor, bits: int = 13) -> torch.Tensor:
    """a [M, K] float32 (E4M3 values) -> the model's row sums, one 32-key MMA step at a time."""
    return mma_sum_truncating(a, torch.ones(a.shape[1], 1), bits)[:, 0]


def placement_rows(device: str) -> list[dict]:
    rows = []
    for K in (32, 64, 128):
        for big in (2.0**7, 2.0**4, 0.0):
            for at in ((0, 31, K - 1) if big else (None,)):
                for c in (2.0**-9, 2.0**-8, 2.0**-7, 3 * 2.0**-8, 2.0**-6, 2.0**-5,
                          3 * 2.0**-6, 2.0**-3):
                    a = torch.full((64, K), c)
                    if at is not None:
                        a[:, at] = big
                    a8 = a.to(E4M3)
                    tri, cub = tensor_core_sums(a8.to(device))
                    model = model_sums(a8.float())
                    rows.append(dict(K=K, big=big, at=at, c=c, exact=float(a8[0].double().sum()),
                                     triton=float(tri[0]), cublas=float(cub[0]),
                                     model=float(model[0])))
    return rows


def random_rows(device: str, K: int = 256, M: int = 8192, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    a8 = torch.exp2(-12 * torch.rand(M, K, generator=g)).to(E4M3)
    exact = a8.double().sum(1)
    tri, cub = tensor_core_sums(a8.to(device))
    model = model_sums(a8.float())

    def stats(x):
        r = (x.double() - exact) / exact
        return dict(mean=float(r.mean()), std=float(r.std()),
                    inexact=float((r != 0).double().mean()))

    return dict(K=K, rows=M, triton=stats(tri), cublas=stats(cub), model=stats(model),
                model_equals_triton=float((model == tri).double().mean()))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=".")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("gpu_accumulator_probe: no CUDA GPU", file=sys.stderr)
        return 2
    place = placement_rows("cuda")
    rnd = random_rows("cuda")
    bad = [r for r in place if not r["triton"] == r["cublas"] == r["model"]]
    print(f"placement rows: {len(place)}, GPU sum != model or Triton != cuBLAS: {len(bad)}")
    for r in bad[:10]:
        print("  ", r)
    for what in ("triton", "cublas", "model"):
        s = rnd[what]
        print(f"random rows, K = {rnd['K']}, {what:6s}: relative error mean {s['mean']:.3e}, "
              f"std {s['std']:.3e}, inexact {s['inexact']:.3f}")
    print(f"random rows: model bit for bit equal to Triton's sum in "
          f"{rnd['model_equals_triton']:.4f} of the rows")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "accumulator_probe.json"), "w") as f:
        json.dump(dict(device=torch.cuda.get_device_name(), torch=torch.__version__,
                       triton=triton.__version__, placement=place, random=rnd), f, indent=1)
    return 0 if not bad else 1


if __name__ == "__main__":
    raise SystemExit(main())

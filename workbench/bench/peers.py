"""Peer attention implementations for the side-by-side benchmark, each optional.

Every peer takes the same bf16 q/k/v [B, S, H, D] as the project's kernels and returns the output
[B, S, H, D]. A peer that does not import or build on this machine is skipped with a one-line
reason (``PeerUnavailable``); none of their code is part of the project.

- ``sdpa_cudnn`` / ``sdpa_flash``: BF16, torch SDPA with the backend forced;
- ``fa3_bf16``: BF16 FlashAttention-3 (``fa3-fwd`` wheel, sm_90a);
- ``fa3_fp8``: FlashAttention-3 on E4M3 Q/K/V with one scale per (batch, KV head), BF16 out;
  "full" = torch quantization + the call, "kernel" = the call on pre-quantized operands;
- ``cudnn_fp8``: cuDNN's ``sdpa_fp8`` on E4M3 Q/K/V with per-tensor scales, P scaled by 448, BF16
  out (E4M3 out where this cuDNN refuses BF16; the row's note says which); full / kernel as FA3;
- ``sage2_sm90``: SageAttention2 SM90: INT8 Q/K (per thread, K smoothed), FP8 V per channel, P @ V
  flushed to an FP32 buffer ("fp32+fp32"); quantizes inside the call ("full" only).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch

BF16_PEERS = ("sdpa_cudnn", "sdpa_flash", "fa3_bf16")
DEFAULT_PEERS = ("sdpa_cudnn", "fa3_bf16", "fa3_fp8", "cudnn_fp8", "sage2_sm90")
ALL_PEERS = ("sdpa_cudnn", "sdpa_flash", "fa3_bf16", "fa3_fp8", "cudnn_fp8", "sage2_sm90")


class PeerUnavailable(Exception):
    """The peer cannot run here (not installed, not built, refused this shape): the reason."""


# The FP8 peers' numerics as recipes of the reference path (docs/numerics.md): E4M3 operands
# with one scale per tensor (FA3's are per (batch, KV head); the quantization's whole share is
# 2.1-3.0e-3 on the benchmark's inputs, the accumulator's 0.1-0.5), P scaled into E4M3's range
# (FA3: 2^8; cuDNN: 448), no smoothing,
# P @ V in Hopper's truncating 13-bit accumulator over the whole key range (no flush). cuDNN's
# FP8 output rounding (where its BF16 output is refused) is not emulated.
PEER_EMULATIONS = {
    "fa3_fp8": ("fp8_dense:qk_granularity=tensor,v_granularity=tensor,smoothing=none,"
                "v_bias_correction=false,p_scaling=exp2_offset8,accumulation=reduced,"
                "accum_flush_keys=1000000000"),
    "cudnn_fp8": ("fp8_dense:qk_granularity=tensor,v_granularity=tensor,smoothing=none,"
                  "v_bias_correction=false,p_scaling=rowmax448,accumulation=reduced,"
                  "accum_flush_keys=1000000000"),
}


@dataclass
class Peer:
    """One peer built for one shape. full(q, k, v) -> out; kernel(state) -> out on the state that
    prepare(q, k, v) returns (the FP8 operands), when the peer has a separate kernel.
    emulation: the recipe string that emulates its numerics on the reference path, if any."""

    name: str
    precision: str  # "bf16", "fp8" or "int8+fp8": the operand formats of the matrix products
    full: Callable
    prepare: Callable | None = None
    kernel: Callable | None = None
    note: str = ""
    emulation: str | None = None


def _first(o):
    return o[0] if isinstance(o, (tuple, list)) else o


def _sdpa(backend: str, B, S, H, D) -> Peer:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    be = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}[backend]

    def full(q, k, v):
        with sdpa_kernel(be):
            o = torch.nn.functional.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        return o.transpose(1, 2)

    return Peer(f"sdpa_{backend}", "bf16", full)


def _fa3_func():
    try:
        from fa3_fwd_interface import flash_attn_func
    except Exception as exc:  # noqa: BLE001 - any import failure means absent
        raise PeerUnavailable(f"fa3_fwd_interface does not import ({type(exc).__name__}: "
                              f"{str(exc)[:100]}); pip install fa3-fwd einops") from None
    return flash_attn_func


def per_head_e4m3(x: torch.Tensor):
    """x [B, S, H, D] -> (E4M3 codes [B, S, H, D], descale [B, H] float32 = amax / 448)."""
    s = (x.abs().amax(dim=(1, 3)).float() / 448.0).clamp(min=1e-12)
    return (x.float() / s[:, None, :, None]).to(torch.float8_e4m3fn), s


def _fa3(precision: str, B, S, H, D) -> Peer:
    fa3 = _fa3_func()
    if precision == "bf16":
        return Peer("fa3_bf16", "bf16", lambda q, k, v: _first(fa3(q, k, v)))

    def prepare(q, k, v):
        return [per_head_e4m3(x) for x in (q, k, v)]

    def kernel(st):
        (q8, sq), (k8, sk), (v8, sv) = st
        return _first(fa3(q8, k8, v8, q_descale=sq, k_descale=sk, v_descale=sv))

    return Peer("fa3_fp8", "fp8", lambda q, k, v: kernel(prepare(q, k, v)), prepare, kernel,
                note="per-(batch, head) scales", emulation=PEER_EMULATIONS["fa3_fp8"])


class CudnnFp8:
    """cuDNN frontend FP8 SDPA (``graph.sdpa_fp8``) with per-tensor scales on [B, S, H, D] E4M3
    tensors; output in BF16 when the installed cuDNN builds that graph, else E4M3."""

    def __init__(self, B, S, H, D, out_dtype=torch.bfloat16):
        import cudnn

        self.cudnn = cudnn
        self.handle = cudnn.create_handle()
        e4m3, f32 = cudnn.data_type.FP8_E4M3, cudnn.data_type.FLOAT
        out_t = cudnn.data_type.BFLOAT16 if out_dtype == torch.bfloat16 else e4m3
        g = cudnn.pygraph(io_data_type=e4m3, intermediate_data_type=f32, compute_data_type=f32,
                          handle=self.handle)
        shape, stride = (B, H, S, D), (S * H * D, D, H * D, 1)
        self.t = {n: g.tensor(name=n, dim=shape, stride=stride, data_type=e4m3) for n in "qkv"}
        sc = dict(dim=(1, 1, 1, 1), stride=(1, 1, 1, 1), data_type=f32)  # noqa: C408
        for n in ("dq", "dk", "dv", "ds", "ss", "so"):
            self.t[n] = g.tensor(name=n, **sc)
        t = self.t
        o, _, amax_s, amax_o = g.sdpa_fp8(
            q=t["q"], k=t["k"], v=t["v"], descale_q=t["dq"], descale_k=t["dk"],
            descale_v=t["dv"], descale_s=t["ds"], scale_s=t["ss"], scale_o=t["so"],
            attn_scale=1.0 / math.sqrt(D), use_causal_mask=False, generate_stats=False)
        o.set_output(True).set_dim(shape).set_stride(stride).set_data_type(out_t)
        for a in (amax_s, amax_o):
            a.set_output(True).set_dim((1, 1, 1, 1)).set_stride((1, 1, 1, 1)).set_data_type(f32)
        self.o, self.amax = o, (amax_s, amax_o)
        g.validate()
        g.build_operation_graph()
        g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
        g.check_support()
        g.build_plans()
        self.g = g
        self.out_dtype = out_dtype
        self.ws = torch.empty(g.get_workspace_size(), dtype=torch.uint8, device="cuda")
        self.amax_buf = [torch.empty(1, 1, 1, 1, device="cuda") for _ in range(2)]
        self.out = torch.empty((B, S, H, D), dtype=out_dtype, device="cuda")

    def quantize(self, q, k, v):
        """Per-tensor E4M3: x8 = x / (amax/448); P scaled by 448; an FP8 O scaled by
        448 / amax(V) (|O| <= amax(V)), a BF16 O not scaled."""
        out = {}
        for n, x in zip("qkv", (q, k, v)):
            s = (x.abs().amax().float() / 448.0).clamp(min=1e-12)
            out[n] = (x.float() / s).to(torch.float8_e4m3fn)
            out["d" + n] = s.view(1, 1, 1, 1)
        one = torch.ones(1, 1, 1, 1, device="cuda")
        out["ds"], out["ss"] = one / 448.0, one * 448.0
        out["so"] = one if self.out_dtype == torch.bfloat16 else (1.0 / out["dv"]).view(1, 1, 1, 1)
        return out

    def attend(self, qd):
        pack = {self.t[n]: qd[n] for n in ("q", "k", "v", "dq", "dk", "dv", "ds", "ss", "so")}
        pack[self.o] = self.out
        pack[self.amax[0]], pack[self.amax[1]] = self.amax_buf
        self.cudnn.set_stream(handle=self.handle, stream=torch.cuda.current_stream().cuda_stream)
        self.g.execute(pack, self.ws, handle=self.handle)
        return self.out

    def full(self, q, k, v):
        qd = self.quantize(q, k, v)
        o = self.attend(qd)
        return o if self.out_dtype == torch.bfloat16 else o.float() / qd["so"]


def _cudnn_fp8(B, S, H, D) -> Peer:
    try:
        import cudnn  # noqa: F401
    except Exception as exc:  # noqa: BLE001
        raise PeerUnavailable(f"cudnn frontend does not import ({type(exc).__name__}); "
                              "pip install nvidia-cudnn-frontend") from None
    note = "per-tensor scales, BF16 output"
    try:
        cd = CudnnFp8(B, S, H, D, out_dtype=torch.bfloat16)
    except Exception as exc:  # noqa: BLE001 - this cuDNN may not build FP8 -> BF16
        try:
            cd = CudnnFp8(B, S, H, D, out_dtype=torch.float8_e4m3fn)
        except Exception as exc2:  # noqa: BLE001
            raise PeerUnavailable(f"sdpa_fp8 graph not built: {type(exc2).__name__}: "
                                  f"{str(exc2)[:120]}") from None
        # cuDNN proposes no FP8 -> BF16 sdpa plan on sm_90 (cuDNN 9.19): say so, briefly
        note = f"per-tensor scales, FP8 output (BF16 output: {type(exc).__name__})"
    return Peer("cudnn_fp8", "fp8", cd.full, cd.quantize, cd.attend, note=note,
                emulation=PEER_EMULATIONS["cudnn_fp8"])


def _sage(B, S, H, D) -> Peer:
    try:
        from sageattention.core import sageattn_qk_int8_pv_fp8_cuda_sm90 as sage
    except Exception as exc:  # noqa: BLE001
        raise PeerUnavailable(f"sageattention (SM90 build) does not import ({type(exc).__name__}:"
                              f" {str(exc)[:100]}); build it from source for sm_90") from None

    def full(q, k, v):
        return sage(q, k, v, tensor_layout="NHD", is_causal=False, qk_quant_gran="per_thread",
                    pv_accum_dtype="fp32+fp32", smooth_k=True)

    return Peer("sage2_sm90", "int8+fp8", full, note="smooth K, per-thread INT8 Q/K")


def build_peer(name: str, B: int, S: int, H: int, D: int) -> Peer:
    """The peer `name` for this shape, or PeerUnavailable with the reason."""
    if name in ("sdpa_cudnn", "sdpa_flash"):
        return _sdpa(name.removeprefix("sdpa_"), B, S, H, D)
    if name == "fa3_bf16":
        return _fa3("bf16", B, S, H, D)
    if name == "fa3_fp8":
        return _fa3("fp8", B, S, H, D)
    if name == "cudnn_fp8":
        return _cudnn_fp8(B, S, H, D)
    if name == "sage2_sm90":
        return _sage(B, S, H, D)
    raise ValueError(f"peer {name!r}: unknown; choose from {ALL_PEERS}")

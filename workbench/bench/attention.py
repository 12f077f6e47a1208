"""Side-by-side attention benchmark: SDPA (cuDNN, flash), cuDNN FP8, and the FP8 recipe kernels.

For each shape [B, S, H, D] (bf16 inputs with per-channel K/V biases, a few rotating input sets):
- ``sdpa_cudnn`` / ``sdpa_flash``: torch SDPA with one backend forced, BF16;
- ``cudnn_fp8``: cuDNN's own FP8 attention (``nvidia-cudnn-frontend`` ``graph.sdpa_fp8``) with
  per-tensor scales, FP8 output (Hopper); "kernel" = the graph alone, "full" adds the per-tensor
  quantization of Q/K/V and the dequantization of O in torch; skipped if it fails to import/build;
- ours, per recipe: "full" = ``dispatch.fp8_recipe_attention`` (stats + quantization + attention +
  epilogue), "kernel" = ``attention_fp8.fp8_attention_fwd`` on pre-quantized operands.
Each row: median ms, TFLOP/s (4*B*H*S*S*D), peak extra memory, and accuracy (relative L2, cosine)
against float64 on 64 evenly spaced query rows over the full K/V context.
"""

from __future__ import annotations

import math

import torch

from .harness import Rotating, median_ms, peak_extra_gib

RECIPES = ("fp8_dense", "fp8_dense_k", "fp8_dense_kv_corrected")


def make_inputs(B, S, H, D, n_sets=2, seed=0, device="cuda"):
    """bf16 q/k/v [B, S, H, D]; K and V carry a per-(head, channel) bias (what smoothing
    removes)."""
    g = torch.Generator(device=device).manual_seed(seed)
    sets = []
    for _ in range(n_sets):
        q = torch.randn(B, S, H, D, device=device, generator=g, dtype=torch.bfloat16)
        k = torch.randn(B, S, H, D, device=device, generator=g, dtype=torch.bfloat16)
        v = torch.randn(B, S, H, D, device=device, generator=g, dtype=torch.bfloat16)
        k += 2 * torch.randn(H, D, device=device, generator=g, dtype=torch.bfloat16)
        v += torch.randn(H, D, device=device, generator=g, dtype=torch.bfloat16)
        sets.append((q, k, v))
    return sets


def _sdpa(backend):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    be = {"cudnn": SDPBackend.CUDNN_ATTENTION, "flash": SDPBackend.FLASH_ATTENTION}[backend]

    def fn(q, k, v):
        with sdpa_kernel(be):
            o = torch.nn.functional.scaled_dot_product_attention(
                q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
        return o.transpose(1, 2)

    return fn


class CudnnFp8:
    """cuDNN frontend FP8 SDPA with per-tensor scales on [B, S, H, D] fp8 tensors."""

    def __init__(self, B, S, H, D):
        import cudnn

        self.cudnn = cudnn
        self.handle = cudnn.create_handle()
        e4m3, f32 = cudnn.data_type.FP8_E4M3, cudnn.data_type.FLOAT
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
        o.set_output(True).set_dim(shape).set_stride(stride).set_data_type(e4m3)
        for a in (amax_s, amax_o):
            a.set_output(True).set_dim((1, 1, 1, 1)).set_stride((1, 1, 1, 1)).set_data_type(f32)
        self.o, self.amax = o, (amax_s, amax_o)
        g.validate()
        g.build_operation_graph()
        g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
        g.check_support()
        g.build_plans()
        self.g = g
        self.ws = torch.empty(g.get_workspace_size(), dtype=torch.uint8, device="cuda")
        self.amax_buf = [torch.empty(1, 1, 1, 1, device="cuda") for _ in range(2)]
        self.out8 = torch.empty((B, S, H, D), dtype=torch.float8_e4m3fn, device="cuda")

    def quantize(self, q, k, v):
        """Per-tensor E4M3: x8 = x / (amax/448); P scaled by 448; O scaled by 448 / amax(V)."""
        out = {}
        for n, x in zip("qkv", (q, k, v)):
            s = (x.abs().amax().float() / 448.0).clamp(min=1e-12)
            out[n] = (x.float() / s).to(torch.float8_e4m3fn)
            out["d" + n] = s.view(1, 1, 1, 1)
        one = torch.ones(1, 1, 1, 1, device="cuda")
        out["ds"], out["ss"] = one / 448.0, one * 448.0
        out["so"] = (448.0 / (out["dv"] * 448.0)).view(1, 1, 1, 1)  # |O| <= amax(V)
        return out

    def attend(self, qd):
        pack = {self.t[n]: qd[n] for n in ("q", "k", "v", "dq", "dk", "dv", "ds", "ss", "so")}
        pack[self.o] = self.out8
        pack[self.amax[0]], pack[self.amax[1]] = self.amax_buf
        self.cudnn.set_stream(handle=self.handle, stream=torch.cuda.current_stream().cuda_stream)
        self.g.execute(pack, self.ws, handle=self.handle)
        return self.out8

    def full(self, q, k, v):
        qd = self.quantize(q, k, v)
        return self.attend(qd).float() / qd["so"]


def _accuracy(out_rows: torch.Tensor, ref: torch.Tensor) -> tuple[float, float]:
    o = out_rows.double()
    rel = float((o - ref).norm() / ref.norm())
    cos = float((o.flatten() @ ref.flatten()) / (o.norm() * ref.norm()))
    return rel, cos


def side_by_side(B, S, H, D, *, n_sets=2, recipes=RECIPES, rows=64, emulate=True,
                 rep_ms=500, log=print) -> list[dict]:
    """Time and check every variant at one shape. Returns one dict per (variant, mode)."""
    from workbench.attention import dense_attention_f64, evenly_spaced_rows, recipe_attention
    from workbench.kernels.attention_fp8 import fp8_attention_fwd
    from workbench.kernels.dispatch import fp8_recipe_attention, get_recipe
    from workbench.kernels.kv_stats import kv_stats
    from workbench.kernels.quantize import quantize_qkv

    sets = make_inputs(B, S, H, D, n_sets=n_sets)
    q0, k0, v0 = sets[0]
    idx = evenly_spaced_rows(S, rows).to(q0.device)
    ref, _ = dense_attention_f64(q0, k0, v0, query_index=idx)
    flops = 4.0 * B * H * S * S * D
    results = []

    def record(variant, mode, fn_rot, out0, extra=None):
        rot = Rotating(sets)
        ms = median_ms(lambda: fn_rot(*rot.next()), rep_ms=rep_ms)
        mem = peak_extra_gib(lambda: fn_rot(*sets[0]))
        rel, cos = _accuracy(out0[:, idx], ref) if out0 is not None else (float("nan"),) * 2
        row = dict(shape=f"({B}, {S}, {H}, {D})", S=S, variant=variant, mode=mode, ms=ms,
                   tflops=flops / (ms * 1e-3) / 1e12, peak_gib=mem, rel_l2=rel, cosine=cos)
        row.update(extra or {})
        results.append(row)
        log(f"  {variant:24s} {mode:6s} {ms:9.3f} ms {row['tflops']:7.1f} TFLOP/s "
            f"peak+{mem:6.2f} GiB  relL2 {rel:.3e}  cos {cos:.6f}")
        return row

    for be in ("cudnn", "flash"):
        fn = _sdpa(be)
        try:
            record(f"sdpa_{be}", "full", fn, fn(q0, k0, v0))
        except Exception as exc:  # noqa: BLE001 - a backend may refuse a shape: report, go on
            log(f"  sdpa_{be}: skipped ({type(exc).__name__}: {str(exc)[:120]})")
    torch.cuda.empty_cache()

    try:
        cd = CudnnFp8(B, S, H, D)
        qds = [cd.quantize(*s) for s in sets]
        out0 = cd.full(q0, k0, v0)
        record("cudnn_fp8_per_tensor", "full", cd.full, out0)
        rot_q = Rotating(qds)
        record("cudnn_fp8_per_tensor", "kernel", lambda *_: cd.attend(rot_q.next()), out0)
        qds = None  # free the FP8 copies before the next variant
    except Exception as exc:  # noqa: BLE001 - optional baseline
        log(f"  cudnn_fp8_per_tensor: skipped ({type(exc).__name__}: {str(exc)[:200]})")
    torch.cuda.empty_cache()

    for name in recipes:
        r = get_recipe(name)
        emu_rel = float("nan")
        if emulate:
            emu = recipe_attention(q0, k0, v0, r, query_index=idx)
            emu_rel = _accuracy(emu.out, ref)[0]
            del emu
            torch.cuda.empty_cache()
        full = lambda q, k, v, r=r: fp8_recipe_attention(q, k, v, r)  # noqa: E731
        out0 = full(q0, k0, v0)
        record(name, "full", full, out0, {"emu_rel_l2": emu_rel})

        def prep(q, k, v, r=r):
            st = kv_stats(k, v, smooth_k=r.smooth_k, smooth_v=r.smooth_v)
            return quantize_qkv(q, k, v, st.mu_k, st.mu_v, st.v_amax, smooth_k=r.smooth_k,
                                smooth_v=r.smooth_v, v_bias_correction=r.v_bias_correction)

        qkvs = [prep(*s) for s in sets]
        outbuf = torch.empty_like(q0)
        rot_k = Rotating(qkvs)
        record(name, "kernel",
               lambda *_: fp8_attention_fwd(rot_k.next(), num_heads=H, scale=D**-0.5,
                                            out=outbuf, **_tuning()),
               out0, {"emu_rel_l2": emu_rel})
        record(name, "prep", prep, None)
        st_row = record(name, "stats", lambda q, k, v, r=r: kv_stats(
            k, v, smooth_k=r.smooth_k, smooth_v=r.smooth_v), None)
        n_read = (2 if r.smooth_k else 1) * B * S * H * D * 2  # bytes of K and/or V read once
        st_row["read_tbs"] = n_read / (st_row["ms"] * 1e-3) / 1e12
        del qkvs
        torch.cuda.empty_cache()
    return results


def _tuning():
    from workbench.kernels.dispatch import TUNING

    return TUNING

"""Side-by-side attention benchmark: peers (``peers.py``) and the project's FP8 recipe kernels.

For each shape [B, S, H, D] (bf16 inputs with per-channel K/V biases, ``inputs.make_inputs``, a
few rotating input sets), in one process:
- every peer that builds here ("full"; FP8 peers also "kernel" = the call on operands quantized
  beforehand), skipped with a one-line reason otherwise;
- ours, per recipe: "full" = ``dispatch.fp8_recipe_attention`` (statistics + quantization +
  attention + epilogue), "kernel" = ``attention_fp8.fp8_attention_fwd`` on pre-quantized operands,
  "prep" = statistics + quantization, "stats" = the statistics kernel alone.
Each row: median ms, TFLOP/s (4*B*H*S*S*D), peak extra memory, and accuracy (relative L2, cosine)
against float64 on `rows` evenly spaced query rows over the full K/V context; ours also carries the
torch emulation's rel-L2 (the tolerance rule compares the two).
"""

from __future__ import annotations

import torch

from workbench.kernels.config import DEFAULT, KernelConfig

from .harness import Rotating, board_under_load, median_ms, peak_extra_gib
from .inputs import make_inputs, sink_inputs  # noqa: F401 - re-exported for scripts
from .peers import DEFAULT_PEERS, PeerUnavailable, build_peer
from .tables import board_text

RECIPES = ("fp8_dense", "fp8_dense_k", "fp8_dense_kv_corrected")


def _accuracy(out_rows: torch.Tensor, ref: torch.Tensor) -> tuple[float, float]:
    o = out_rows.double()
    rel = float((o - ref).norm() / ref.norm())
    cos = float((o.flatten() @ ref.flatten()) / (o.norm() * ref.norm()))
    return rel, cos


def side_by_side(B, S, H, D, *, n_sets=2, recipes=RECIPES, peers=DEFAULT_PEERS, rows=64,
                 emulate=True, rep_ms=500, config: KernelConfig = DEFAULT, skipped=None,
                 board_s: float = 2.0, log=print) -> list[dict]:
    """Time and check every peer and recipe at one shape. Returns one dict per (variant, mode).

    skipped: a dict that receives {peer: reason} for peers that could not run. board_s: seconds
    of back-to-back calls per row under ``harness.board_under_load`` (SM clock and board power;
    0 skips it)."""
    from workbench.attention import dense_attention_f64, evenly_spaced_rows, recipe_attention
    from workbench.kernels.attention_fp8 import fp8_attention_fwd
    from workbench.kernels.dispatch import fp8_recipe_attention, get_recipe
    from workbench.kernels.kv_stats import kv_stats
    from workbench.kernels.quantize import quantize_qkv

    skipped = {} if skipped is None else skipped
    sets = make_inputs(B, S, H, D, n_sets=n_sets)
    q0, k0, v0 = sets[0]
    idx = evenly_spaced_rows(S, rows).to(q0.device)
    ref, _ = dense_attention_f64(q0, k0, v0, query_index=idx)
    flops = 4.0 * B * H * S * S * D
    shape = f"({B}, {S}, {H}, {D})"
    results = []

    def accuracy(out0) -> tuple[float, float]:
        # taken before any timing: some peers return the same output buffer on every call
        return _accuracy(out0[:, idx], ref)

    def record(variant, mode, fn_rot, acc, precision, extra=None):
        rot = Rotating(sets)
        ms = median_ms(lambda: fn_rot(*rot.next()), rep_ms=rep_ms)
        board = board_under_load(lambda: fn_rot(*rot.next()), board_s) if board_s > 0 else {}
        mem = peak_extra_gib(lambda: fn_rot(*sets[0]))
        rel, cos = acc if acc is not None else (float("nan"),) * 2
        row = dict(shape=shape, S=S, variant=variant, mode=mode, precision=precision, ms=ms,
                   tflops=flops / (ms * 1e-3) / 1e12, peak_gib=mem, rel_l2=rel, cosine=cos,
                   **board)
        row.update(extra or {})
        results.append(row)
        log(f"  {variant:34s} {mode:6s} {ms:9.3f} ms {row['tflops']:7.1f} TFLOP/s "
            f"peak+{mem:6.2f} GiB  relL2 {rel:.3e}  cos {cos:.6f}{board_text(row)}")
        return row

    for name in peers:
        try:
            peer = build_peer(name, B, S, H, D)
            acc = accuracy(peer.full(q0, k0, v0))
        except PeerUnavailable as exc:
            skipped[name] = str(exc)
            log(f"  {name}: skipped ({exc})")
            continue
        except Exception as exc:  # noqa: BLE001 - a peer may refuse a shape: report, go on
            skipped[name] = f"{type(exc).__name__}: {str(exc)[:160]}"
            log(f"  {name}: skipped ({skipped[name]})")
            continue
        extra = {"note": peer.note} if peer.note else {}
        if emulate and peer.emulation:  # its numerics on the reference path, same rows
            emu = recipe_attention(q0, k0, v0, peer.emulation, query_index=idx)
            extra["emu_rel_l2"] = _accuracy(emu.out, ref)[0]
            del emu
        record(name, "full", peer.full, acc, peer.precision, extra)
        if peer.kernel is not None:
            states = Rotating([peer.prepare(*s) for s in sets])
            # the kernel computes the full call's values on pre-quantized operands, but its raw
            # output may still carry the output scale (cuDNN's FP8 O): report the full call's
            # accuracy for it
            record(name, "kernel", lambda *_, peer=peer, states=states: peer.kernel(states.next()),
                   acc, peer.precision, extra)
            del states
        del peer
        torch.cuda.empty_cache()

    for name in recipes:
        r = get_recipe(name)
        label = r.to_string()
        emu_rel = float("nan")
        if emulate:
            emu = recipe_attention(q0, k0, v0, r, query_index=idx)
            emu_rel = _accuracy(emu.out, ref)[0]
            del emu
            torch.cuda.empty_cache()

        def full(q, k, v, r=r):
            return fp8_recipe_attention(q, k, v, r, config=config)

        acc = accuracy(full(q0, k0, v0))
        record(label, "full", full, acc, "fp8", {"emu_rel_l2": emu_rel})

        def prep(q, k, v, r=r):
            st = kv_stats(k, v, smooth_k=r.smooth_k, smooth_v=r.smooth_v, config=config.stats)
            return quantize_qkv(q, k, v, st.mu_k, st.mu_v, st.v_amax, smooth_k=r.smooth_k,
                                smooth_v=r.smooth_v, v_bias_correction=r.v_bias_correction,
                                config=config.quant)

        qkvs = Rotating([prep(*s) for s in sets])
        outbuf = torch.empty_like(q0)
        acc_k = accuracy(fp8_attention_fwd(qkvs.sets[0], num_heads=H, scale=D**-0.5,
                                           p_scaling=r.p_scaling, row_sum=r.row_sum,
                                           p_exp=r.p_exp, config=config.attention)[0])
        record(label, "kernel",
               lambda *_, r=r, qkvs=qkvs, outbuf=outbuf: fp8_attention_fwd(
                   qkvs.next(), num_heads=H, scale=D**-0.5, out=outbuf, p_scaling=r.p_scaling,
                   row_sum=r.row_sum, p_exp=r.p_exp, config=config.attention),
               acc_k, "fp8", {"emu_rel_l2": emu_rel})
        record(label, "prep", prep, None, "fp8")
        st_row = record(label, "stats", lambda q, k, v, r=r: kv_stats(
            k, v, smooth_k=r.smooth_k, smooth_v=r.smooth_v, config=config.stats), None, "fp8")
        n_read = (2 if r.smooth_k else 1) * B * S * H * D * 2  # bytes of K and/or V read once
        st_row["read_tbs"] = n_read / (st_row["ms"] * 1e-3) / 1e12
        del qkvs, outbuf
        torch.cuda.empty_cache()
    return results

"""Config sweeps of the FP8 kernels: a list of named ``KernelConfig`` in, one row per (config, part)
out, timed with the same harness as the side-by-side benchmark (``harness.median_ms``, rotating
input sets, fresh biased inputs).

Parts: "attention" = the attention kernel alone on operands quantized with that config's
quantizer (rel-L2 vs float64 on `rows` rows; TFLOP/s; the fraction of outputs bitwise equal to the
first config's and the largest difference); "stats" = the statistics kernel (TB/s of
K and V read; bitwise equal to the first config's statistics when the summation order is the
same); "quant" = the whole quantizer (same values as the first config's codes, scales and
correction). A config that fails to compile or run gives a row with its error. The results of
past sweeps are in BENCHMARKS.md; this module keeps no lists of them.

    points = parse_points('[["128 rows", {"attention": {"block_m": 128, "num_warps": 8}}]]')
    rows = sweep(points, shape=(1, 32626, 56, 128))
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import torch

from workbench.kernels.config import DEFAULT, KernelConfig

from .harness import Rotating, median_ms
from .inputs import make_inputs

PARTS = ("attention", "stats", "quant")


@dataclass(frozen=True)
class SweepPoint:
    label: str
    config: KernelConfig


def parse_points(text: str, *, with_default: bool = True) -> list[SweepPoint]:
    """JSON ``[[label, {"attention": {...}, "quant": {...}, "stats": {...}}], ...]`` (overrides of
    the default config) -> points, the default first when `with_default`. ValueError names the
    bad entry."""
    try:
        items = json.loads(text) if text else []
    except json.JSONDecodeError as exc:
        raise ValueError(f"--configs: not JSON ({exc})") from None
    if not isinstance(items, list):
        raise ValueError("--configs: expected a JSON list of [label, overrides] pairs")
    points = [SweepPoint("default (KernelConfig.h200)", DEFAULT)] if with_default else []
    for i, item in enumerate(items):
        if not (isinstance(item, list) and len(item) == 2 and isinstance(item[0], str)
                and isinstance(item[1], dict)):
            raise ValueError(f"--configs entry {i}: expected [label, {{section: {{...}}}}], "
                             f"got {item!r}")
        points.append(SweepPoint(item[0], KernelConfig.from_overrides(item[1])))
    return points


def sweep(points: list[SweepPoint], *, shape=(1, 32626, 56, 128),
          recipe: str = "fp8_dense_kv_corrected", parts=PARTS, n_sets: int = 2, rows: int = 64,
          rep_ms: int = 250, repeats: int = 2, log=print) -> list[dict]:
    """Time every point's kernels (see the module docstring). Returns the rows."""
    from workbench.attention import dense_attention_f64, evenly_spaced_rows
    from workbench.kernels.attention_fp8 import fp8_attention_fwd
    from workbench.kernels.kv_stats import kv_stats
    from workbench.kernels.quantize import quantize_qkv
    from workbench.recipes import get_recipe

    bad = [p for p in parts if p not in PARTS]
    if bad:
        raise ValueError(f"sweep parts: unknown {bad}; choose from {PARTS}")
    r = get_recipe(recipe)
    B, S, H, D = shape
    sets = make_inputs(B, S, H, D, n_sets=n_sets, seed=1)
    q0, k0, v0 = sets[0]
    idx = evenly_spaced_rows(S, rows).to(q0.device)
    ref, _ = dense_attention_f64(q0, k0, v0, query_index=idx)
    flops = 4.0 * B * H * S * S * D
    kv_bytes = 2 * B * S * H * D * q0.element_size()
    smooth = dict(smooth_k=r.smooth_k, smooth_v=r.smooth_v)
    out = []
    first: dict[str, object] = {}

    def timed(fn) -> list[float]:
        return [median_ms(fn, rep_ms=rep_ms) for _ in range(repeats)]

    def add(label, part, **row):
        out.append(dict(label=label, part=part, **row))
        if "error" in row:
            log(f"{label:40s} {part:9s} FAILED {row['error'][:160]}")
        else:
            ms = " ".join(f"{x:8.3f}" for x in row["ms_runs"])
            log(f"{label:40s} {part:9s} {ms} ms " + " ".join(
                f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}" for k, v in row.items()
                if k not in ("ms_runs", "ms")))

    for pt in points:
        cfg = pt.config
        try:
            stats = [kv_stats(k, v, **smooth, config=cfg.stats) for _, k, v in sets]

            def quant(q, k, v, st):
                return quantize_qkv(q, k, v, st.mu_k, st.mu_v, st.v_amax,
                                    v_bias_correction=r.v_bias_correction, config=cfg.quant,
                                    **smooth)

            qkvs = [quant(*s, st) for s, st in zip(sets, stats)]
        except Exception as exc:  # noqa: BLE001 - a config may not compile: report, go on
            for part in parts:
                add(pt.label, part, error=f"{type(exc).__name__}: {exc}")
            continue
        if "attention" in parts:
            try:
                o, _ = fp8_attention_fwd(qkvs[0], num_heads=H, scale=D**-0.5,
                                         p_scaling=r.p_scaling, row_sum=r.row_sum,
                                         p_exp=r.p_exp, config=cfg.attention)
                rel = float((o[:, idx].double() - ref).norm() / ref.norm())
                buf, rot = torch.empty_like(q0), Rotating(qkvs)
                ms = timed(lambda: fp8_attention_fwd(rot.next(), num_heads=H, scale=D**-0.5,
                                                     out=buf, p_scaling=r.p_scaling,
                                                     row_sum=r.row_sum, p_exp=r.p_exp,
                                                     config=cfg.attention))
                # against the first config's output (operands from each config's own
                # quantizer: the same codes unless the quant section changes them)
                o0 = first.setdefault("attention", o)
                add(pt.label, "attention", ms_runs=ms, ms=min(ms),
                    tflops=flops / (min(ms) * 1e-3) / 1e12, rel_l2=rel,
                    equal_frac=float((o == o0).float().mean()),
                    max_diff=float((o.float() - o0.float()).abs().max()))
            except Exception as exc:  # noqa: BLE001
                add(pt.label, "attention", error=f"{type(exc).__name__}: {exc}")
        if "stats" in parts:
            st = stats[0]
            again = kv_stats(k0, v0, **smooth, config=cfg.stats)
            det = all(torch.equal(getattr(st, n), getattr(again, n))
                      for n in ("mu_k", "mu_v", "v_amax"))
            ref_st = first.setdefault("stats", st)
            same = all(torch.equal(getattr(st, n), getattr(ref_st, n))
                       for n in ("mu_k", "mu_v", "v_amax"))
            rot = Rotating(sets)
            ms = timed(lambda: kv_stats(*rot.next()[1:], **smooth, config=cfg.stats))
            add(pt.label, "stats", ms_runs=ms, ms=min(ms),
                tbs=kv_bytes / (min(ms) * 1e-3) / 1e12, deterministic=det, same_values=same)
        if "quant" in parts:
            a = qkvs[0]
            ref_q = first.setdefault("quant", a)
            same = a.v_perm == ref_q.v_perm and all(
                torch.equal(getattr(a, n).float(), getattr(ref_q, n).float())
                for n in ("q8", "k8", "v8t", "q_scale", "k_scale", "v_scale"))
            same = same and bool(torch.allclose(a.v_corr, ref_q.v_corr, rtol=1e-6, atol=1e-7))
            rot = Rotating(list(zip(sets, stats)))

            def run_quant():
                (q, k, v), st = rot.next()
                return quant(q, k, v, st)

            ms = timed(run_quant)
            add(pt.label, "quant", ms_runs=ms, ms=min(ms),
                tbs=3 * kv_bytes * 0.75 / (min(ms) * 1e-3) / 1e12, same_values=same)
        del qkvs, stats
        torch.cuda.empty_cache()
    return out

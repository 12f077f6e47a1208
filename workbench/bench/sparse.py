"""Block-sparse attention at the H3 shape: FP8 Sol and VSA against dense FP8, SDPA cuDNN BF16 and
NVIDIA's BF16 Sol attention, on synthetic H3 inputs (GPU).

    workbench bench sparse --json sparse.json --markdown sparse.md
    python -m workbench.bench.sparse ...   (the same)

Inputs: ``workbench.synthetic.synthetic_qkv`` at the live shape (1, 32626, 56, 128) with its
layout (370 prefix rows: the Sol sink and the BF16 prefix rows), or ``--seq`` for a smaller
``small_config``. Sol's tau per target density is found with the GPU routing
(``routing.sol_tau_for_density``; 100% = tau -inf), plus the anchor taus (default 1, the recipe's
and the reference measurement's); VSA's keep fraction is set so that it routes
the same density (prefix tiles exempt), on the same recipe otherwise (K/V smoothing, V-bias
correction, BF16 prefix rows).

Rows, each with the exact density, the full-call time (``harness.median_ms``: CUDA-event median),
the time per exact (64 x 64) block pair and the relative L2 error against float64 dense attention
on ``rows`` evenly spaced query rows (prefix rows included); "emu" is the recipe's torch emulation
(``recipe_attention``, the kernels' twin) on the same rows:
- ``sdpa_cudnn_bf16`` (dense), ours ``fp8_dense_kv_corrected`` (dense, full call);
- ours FP8 Sol / FP8 VSA per density (``run_attention(..., backend="kernel")``; a row says
  "skipped" with the reason while no sparse kernel supports the recipe), and BF16 Sol on the same
  loop (``bf16:sparsity=sol``: what NVIDIA's BF16 kernel computes);
- NVIDIA ``sol_attn`` (CuTe DSL, SM90, BF16; optional: timed when importable, e.g. the caller puts
  it on PYTHONPATH) at the same tau, threshold and sink (``sink_start=0, sink_tokens=prefix``);
  its density column is our routing's at that tau;
- FastVideo's VSA block-sparse attention (the ``vsa`` wheel, BF16; optional: timed when it
  imports) on our VSA routing's block map at each density: its SM90 kernel when the wheel's
  extension loads with this torch, else its Triton kernel (the row says which); the kernel alone,
  the operands already in its [B, H, S padded to 64, D] layout;
- routing: the block-sum pass alone (read rate of Q, K and V) and the Sol / VSA routing given
  those block sums (scores, decisions, lists);
- stages: each pass of one call timed alone at the anchor tau (``stage_times``), and the
  anchor call's GPU time per kernel (``harness.kernel_profile``);
- the sparse kernel's options (``sweep_configs``: schedule, KV splits, loads, summary precision,
  register cap, CTA grouping, block-sum launch shape) at the anchor tau, full calls, each time the
  median of ``sweep_rounds`` interleaved rounds (``harness.interleaved_ms``).
"""

from __future__ import annotations

import argparse
import importlib.util
import math
import os
import site
import statistics
import sys
import time
from dataclasses import asdict, dataclass, replace

import torch

from .tables import (
    BOARD_HEADER,
    BOARD_NOTE,
    add_board_argument,
    board_cell,
    check_board_s,
    check_report_files,
    write_bench_files,
)

DENSITIES = (0.10, 0.20, 0.35, 0.50, 1.0)
MIN_SEQ = 64  # --seq: the smallest small layout (text, audio, video rows; one 64-row block)
SOL_RECIPE = "fp8_sol_kv_corrected"
DENSE_RECIPE = "fp8_dense_kv_corrected"


@dataclass(frozen=True)
class SparseBenchConfig:
    """What one run measures. seq_len None = the live H3 layout (32,626 rows)."""

    heads: int = 56
    seq_len: int | None = None
    densities: tuple[float, ...] = DENSITIES
    threshold: str = "exact"  # Sol's theta: full covariance ("exact") or its diagonal
    rows: int = 64
    rep_ms: int = 300
    emulate: bool = True
    peer: bool = True
    vsa_peer: bool = True  # FastVideo's VSA kernel on our VSA block maps, when it imports
    budget_s: float = 300.0  # no new variant starts after this many seconds
    seed: int = 0
    anchor_taus: tuple[float, ...] = (1.0,)  # Sol rows at these taus too (the recipe's default)
    sweep: bool = True  # time the sparse kernel's options (config.SparseConfig) at the anchor
    sweep_rounds: int = 5  # their times: medians of this many interleaved rounds (CUDA)
    stages: bool = True  # time each pass of one call at the anchor (``stage_times``)
    bf16: bool = True  # BF16 Sol rows (the same loop with BF16 operands) beside the FP8 ones
    sol_recipe: str = SOL_RECIPE  # the base of the Sol and VSA rows (tau / keep set per density)
    dense_recipe: str = DENSE_RECIPE
    device: str = "cuda"  # "cpu": a smoke run of the plumbing (routing in Triton's interpreter)
    board_s: float = 1.0  # per row: seconds of back-to-back calls under harness.board_under_load
    # per row also "graph_ms", the GPU time of CUDA-graph replays (``gpu_ms``; CUDA only): below
    # ~16k tokens a sparse call's eager time is the host's launch time, not the GPU's
    graph: bool = False


def vsa_keep_for_density(density: float, n_tiles: int, n_prefix: int,
                         dense_rows: int = 0) -> float:
    """The ``vsa_keep`` whose exempt-prefix selection routes round(density * n_tiles) tiles per
    query tile (the prefix tiles plus ceil(keep * video tiles)); 1.0 at density 1. dense_rows:
    query tiles that keep every tile (``prefix_blocks_exact``): the others then route
    round(n_tiles * (density * n_tiles - dense_rows) / (n_tiles - dense_rows)), so that the
    whole map's density is the target."""
    n_video = n_tiles - n_prefix
    if density >= 1.0 or n_video <= 0 or dense_rows >= n_tiles:
        return 1.0
    per_row = n_tiles * (density * n_tiles - dense_rows) / (n_tiles - dense_rows)
    m = min(n_video, max(1, round(per_row) - n_prefix))
    return (m - 0.5) / n_video  # ceil((m - 0.5)) = m, away from rounding at the integer


def load_sol_attn():
    """(NVIDIA's ``sol_attn`` function or None, one-line reason when None).

    The CuTe DSL wheels installed with ``pip --target DIR`` rely on a .pth file that only site
    directories run; add such directories on sys.path as site dirs first."""
    for p in list(sys.path):
        if p and os.path.isfile(os.path.join(p, "nvidia_cutlass_dsl_packages.pth")):
            site.addsitedir(p)
    try:
        from sol_attn import sol_attn
    except Exception as exc:  # noqa: BLE001 - any import failure means the peer is absent
        return None, f"sol_attn does not import ({type(exc).__name__}: {str(exc)[:120]})"
    return sol_attn, ""


def load_fastvideo_vsa():
    """(attend, backend, note) for FastVideo's VSA block-sparse attention (the ``vsa`` wheel), or
    (None, "", why not). attend(q, k, v, block_map, block_sizes) -> o: q / k / v [B, H, T, D]
    bf16 with T a multiple of 64 (zero rows past the sequence), block_map [B, H, T/64, T/64]
    bool (key tiles per query tile), block_sizes [T/64] int32 (rows per tile). backend "sm90"
    (its CUDA extension ``vsa_cuda``) or "triton" (its Triton kernel), with the extension's
    import error in note. The package's own ``__init__`` imports the extension unconditionally on
    sm_90, so its two Python modules are loaded from their files."""
    spec = importlib.util.find_spec("vsa")
    if spec is None or not spec.submodule_search_locations:
        return None, "", "the vsa (FastVideo) package is not installed"
    root = list(spec.submodule_search_locations)[0]

    def load(name):
        mspec = importlib.util.spec_from_file_location(f"_fastvideo_vsa_{name}",
                                                       os.path.join(root, f"{name}.py"))
        mod = importlib.util.module_from_spec(mspec)
        mspec.loader.exec_module(mod)
        return mod

    try:
        index = load("index")
        tri = load("block_sparse_attn_triton")
    except Exception as exc:  # noqa: BLE001 - any import failure means the peer is absent
        return None, "", f"vsa does not import ({type(exc).__name__}: {str(exc)[:120]})"
    try:
        from vsa_cuda import block_sparse_fwd
    except Exception as exc:  # noqa: BLE001 - the extension is built for one torch / CUDA
        block_sparse_fwd, note = None, f"SM90 extension: {type(exc).__name__}: {str(exc)[:100]}"
    else:
        note = ""

    def attend(q, k, v, block_map, block_sizes):
        idx, num = index.map_to_index(block_map.int())
        if block_sparse_fwd is not None:
            return block_sparse_fwd(q, k, v, idx, num, block_sizes.int())[0]
        return tri.triton_block_sparse_attn_forward(q, k, v, idx, num, block_sizes)[0]

    return attend, "sm90" if block_sparse_fwd is not None else "triton", note


def vsa_peer_operands(q, k, v):
    """q / k / v [B, S, H, D] -> ([B, H, T, D] contiguous copies, T = S rounded up to 64, zero
    rows past S; block_sizes [T / 64] int32: 64, the last S - (T/64 - 1) * 64)."""
    B, S, H, D = q.shape
    T = -(-S // 64) * 64

    def padded(x):
        out = torch.zeros((B, x.shape[2], T, D), dtype=x.dtype, device=x.device)
        out[:, :, :S] = x.transpose(1, 2)
        return out

    sizes = torch.full((T // 64,), 64, dtype=torch.int32, device=q.device)
    sizes[-1] = S - (T // 64 - 1) * 64
    return padded(q), padded(k), padded(v), sizes


def sol_attn_backend() -> str:
    """Which of NVIDIA's implementations ``sol_attn`` runs here: "cute_sm90" (the CuTe DSL kernel,
    when its runtime imports) or "triton" (its Triton reference), or "?" when unknown."""
    try:
        from sol_attn import get_sol_attn_backend

        return str(get_sol_attn_backend())
    except Exception:  # noqa: BLE001 - the label only; the timing itself says if it fails
        return "?"


def sol_attn_backend_note(backend: str) -> str:
    """'' when NVIDIA's package runs a CuTe kernel; else a line saying that its rows time its
    Triton reference and why the CuTe runtime did not load (rows a reader would otherwise take
    for NVIDIA's kernel)."""
    if backend.startswith("cute"):
        return ""
    try:
        import cutlass.cute  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - any failure: the reason is what the line reports
        why = f"the CuTe DSL runtime does not import ({type(exc).__name__}: {str(exc)[:100]})"
    else:
        why = "no CuTe kernel for this GPU"
    return (f"its rows time backend {backend!r}, NVIDIA's Triton reference, not its CuTe kernel: "
            f"{why}")


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def gpu_ms(fn, device: str, rep_ms: int) -> float | None:
    """CUDA: the GPU time of fn from CUDA-graph replays (``harness.graph_median_ms``), None
    elsewhere or when fn cannot be captured."""
    if device != "cuda":
        return None
    from .harness import graph_median_ms

    return graph_median_ms(fn, rep_ms=rep_ms)


def time_ms(fn, device: str, rep_ms: int) -> float:
    """CUDA: do_bench's event median (``harness.median_ms``); CPU: one wall time (smoke runs)."""
    if device == "cuda":
        from .harness import median_ms

        return median_ms(fn, rep_ms=rep_ms)
    t = time.perf_counter()
    fn()
    return 1e3 * (time.perf_counter() - t)


def sweep_configs(base) -> list[tuple[str, object]]:
    """(label, KernelConfig) of the sparse kernel's options, each one change from `base`."""
    return [
        ("default", base),
        ("no register cap", base.with_sparse(maxnreg=None)),
        ("heavy-first work list", base.with_sparse(schedule="heavy_first")),
        ("kv_splits 2", base.with_sparse(kv_splits=2)),
        ("gathered loads", base.with_sparse(tma=False)),
        ("summary route as its own pass (Gluon)", base.with_sparse(summary_kernel="gluon")),
        ("summary pass in Triton", base.with_sparse(summary_kernel="triton")),
        ("summary chunk 16", base.with_sparse(summary_chunk=16)),
        ("summary chunk 64 (the Triton pass takes it)", base.with_sparse(summary_chunk=64)),
        ("programs (rows)", base.with_sparse(schedule="rows")),
        ("CTAs of consecutive query blocks", base.with_sparse(ws_grouping="consecutive")),
        ("block sums 2 warps", base.with_routing(block_warps=2)),
        ("block sums 4 rows", base.with_routing(block_rows=4)),
        ("Sol routing front in torch ops", base.with_routing(sol_front="torch")),
        ("prefix rows after the FP8 passes", base.with_attention(prefix_stream=False)),
    ]


def stage_times(q, k, v, recipe, layout, kernel_config, dev: str, rep_ms: int) -> list[dict]:
    """[{what, ms, gpu_ms}] of the passes of one sparse full call
    (``dispatch.fp8_recipe_attention``), each timed alone on the same operands: block sums,
    routing given them, quantizer, the attention launches (with Sol's summary pass; the exact
    tiles alone), the BF16 prefix rows; gpu_ms (CUDA-graph replays) for the first two."""
    from workbench.kernels import dispatch
    from workbench.kernels.attention_fp8 import fp8_attention_fwd
    from workbench.kernels.quantize import quantize_qkv

    B, S, H, D = q.shape
    scale = D ** -0.5
    rcfg = kernel_config.routing
    sums = dispatch.sparse_block_sums(q, k, v, rcfg)

    def route():  # as the call: the statistics with the routing (Sol's front: one launch)
        return dispatch.routing_given_sums(q, k, v, recipe, layout, scale, sums, rcfg)

    mu_k, mu_v, v_amax, r = route()

    def quant():
        return quantize_qkv(q, k, v, mu_k, mu_v, v_amax, smooth_k=recipe.smooth_k,
                            smooth_v=recipe.smooth_v,
                            v_bias_correction=recipe.v_bias_correction,
                            config=kernel_config.quant)

    qkv = quant()
    prefix = layout.prefix_len if recipe.dense_prefix else 0
    out = torch.empty_like(q)

    def attend(rt):
        return fp8_attention_fwd(qkv, num_heads=H, scale=scale, out=out, row_start=prefix,
                                 p_scaling=recipe.p_scaling, row_sum=recipe.row_sum,
                                 p_exp=recipe.p_exp,
                                 config=kernel_config.attention,
                                 routing=rt, sparse=kernel_config.sparse)

    stages = [
        ("block sums + V extremes", lambda: dispatch.sparse_block_sums(q, k, v, rcfg)),
        ("statistics and routing (given the block sums)", route),
        ("quantizer", quant),
        ("attention launches", lambda: attend(r)),
    ]
    if r.kc is not None:
        exact_only = replace(r, kc=None, vc=None)
        stages.append(("attention, exact tiles only", lambda: attend(exact_only)))
    if prefix:
        stages.append(("BF16 prefix rows", lambda: dispatch.dense_prefix_rows(q, k, v, prefix,
                                                                              scale)))
    # the two passes of many small launches also replayed from a CUDA graph: their GPU time
    # without the host's launch time (GPU test: test_routing_replays_from_a_cuda_graph)
    graphed = {stages[0][0], stages[1][0]}
    return [dict(what=what, ms=time_ms(fn, dev, rep_ms),
                 gpu_ms=gpu_ms(fn, dev, rep_ms) if what in graphed else None)
            for what, fn in stages]


def _rel_l2(out_rows: torch.Tensor, ref: torch.Tensor) -> float:
    o = out_rows.double()
    return float((o - ref).norm() / ref.norm())


def _inputs(cfg: SparseBenchConfig):
    from workbench.synthetic import H3_SYNTHETIC, small_config, synthetic_qkv

    if cfg.seq_len is None:
        syn = replace(H3_SYNTHETIC, heads=cfg.heads, seed=cfg.seed)
    else:
        syn = small_config(cfg.seq_len, heads=cfg.heads, seed=cfg.seed)
    q, k, v = (t.contiguous() for t in synthetic_qkv(syn, device=cfg.device))
    return q, k, v, syn.layout


def run(cfg: SparseBenchConfig = SparseBenchConfig(), log=print) -> dict:
    """Measure every variant (see the module docstring). Returns {env, config, routing, rows}."""
    from workbench.attention import dense_attention_f64, evenly_spaced_rows, recipe_attention
    from workbench.attention.runner import run_attention
    from workbench.attention.sparsity import prefix_query_blocks
    from workbench.kernels import routing
    from workbench.recipes import get_recipe

    from .harness import env_info
    from .peers import build_peer

    if cfg.device == "cuda" and not torch.cuda.is_available():
        raise ValueError("sparse bench: device 'cuda' but no CUDA GPU (use --device cpu for a "
                         "smoke run)")
    dev = cfg.device
    t0 = time.time()
    q, k, v, layout = _inputs(cfg)
    B, S, H, D = q.shape
    prefix = layout.prefix_len
    idx = evenly_spaced_rows(S, cfg.rows).to(q.device)
    ref, _ = dense_attention_f64(q, k, v, query_index=idx)
    nb = -(-S // 64)
    pairs = B * H * nb * nb

    def ns_per_exact_pair(ms: float, density: float) -> float:
        """The call's time per exact (query block, key block) pair, in ns."""
        return ms * 1e6 / (density * pairs)

    report = {"env": env_info(), "config": {**asdict(cfg), "shape": [B, S, H, D],
                                             "prefix": prefix, "layout": layout.to_dict()},
              "routing": [], "rows": []}
    log(f"inputs {tuple(q.shape)} {q.dtype}, prefix {prefix} rows, {time.time() - t0:.1f} s")

    def over_budget() -> bool:
        return time.time() - t0 > cfg.budget_s

    def record(variant, fn, *, route="dense", density=1.0, tau=None, emu=None, note="",
               rows_of=None):
        """rows_of(out): fn's output as [B, S, H, D] rows (default: fn's output itself)."""
        row = dict(variant=variant, route=route, density=density, tau=tau, emu_rel_l2=emu,
                   note=note)
        report["rows"].append(row)
        if over_budget():
            row["skipped"] = f"time budget {cfg.budget_s:.0f} s reached"
            log(f"  {variant}: skipped (budget)")
            return row
        try:
            out = fn()
            sync(dev)
            if rows_of is not None:
                out = rows_of(out)
            row["rel_l2"] = _rel_l2(out[:, idx], ref)
            del out
            row["ms"] = time_ms(fn, dev, cfg.rep_ms)
            if cfg.graph and dev == "cuda":
                try:  # a row whose capture fails keeps its eager time
                    row["graph_ms"] = gpu_ms(fn, dev, cfg.rep_ms)
                except Exception as exc:  # noqa: BLE001 - reported in the row's note
                    row["graph_ms"] = None
                    row["note"] = (row.get("note", "") + f" no graph time: {type(exc).__name__}"
                                   ).strip()
                    torch.cuda.empty_cache()
            if dev == "cuda" and cfg.board_s > 0:
                from .harness import board_under_load

                row.update(board_under_load(fn, cfg.board_s))
        except Exception as exc:  # noqa: BLE001 - one variant failing must not stop the table
            first = (str(exc).splitlines() or [""])[0]
            row["skipped"] = f"{type(exc).__name__}: {first[:160]}"
            log(f"  {variant}: skipped ({row['skipped']})")
            torch.cuda.empty_cache()
            return row
        row["ns_per_exact_pair"] = ns_per_exact_pair(row["ms"], density)
        log(f"  {variant:34s} density {density:.4f} {row['ms']:8.3f} ms "
            f"relL2 {row['rel_l2']:.3e}" + (f" (emu {emu:.3e})" if emu is not None else ""))
        torch.cuda.empty_cache()
        return row

    def emulate(recipe) -> float | None:
        if not cfg.emulate or over_budget():
            return None
        res = recipe_attention(q, k, v, recipe, query_index=idx, layout=layout)
        err = _rel_l2(res.out, ref)
        del res
        torch.cuda.empty_cache()
        return err

    # dense references
    sdpa = build_peer("sdpa_cudnn", B, S, H, D)
    record("sdpa_cudnn_bf16", lambda: sdpa.full(q, k, v))
    dense = get_recipe(cfg.dense_recipe)
    dense_row = record(f"ours {dense.name}", lambda: run_attention(
        q, k, v, dense, layout=layout, backend="kernel"), emu=emulate(dense))

    # routing: the block-sum pass and the tau for each density
    sol_base = get_recipe(cfg.sol_recipe).with_(sol_threshold=cfg.threshold)
    n_bytes = sum(t.numel() * t.element_size() for t in (q, k, v))
    for minmax in (False, True):  # one kernel each: its launch time is its GPU time
        ms = time_ms(lambda mm=minmax: routing.block_sums(q, k, v, minmax=mm), dev, cfg.rep_ms)
        what = "block sums of Q, K, V" + (" + V extremes (replaces kv_stats)" if minmax else "")
        report["routing"].append(dict(what=what, ms=ms, read_tbs=n_bytes / (ms * 1e-3) / 1e12))
        log(f"  {what}: {ms:.3f} ms, {n_bytes / (ms * 1e-3) / 1e12:.2f} TB/s read")
    # what a VSA call spends before its routing: the block sums and the statistics taken from
    # them in torch (mu_K, mu_V, V's range: a few small launches), on the GPU; a Sol call makes
    # the statistics inside its routing front (the "sol statistics and routing" rows)
    from workbench.kernels.dispatch import routing_given_sums, sparse_statistics

    def sums_and_stats():
        return sparse_statistics(q, k, v, sol_base)

    g = gpu_ms(sums_and_stats, dev, cfg.rep_ms)
    if g is not None:
        report["routing"].append(dict(what="block sums + V extremes + the statistics in torch",
                                      ms=time_ms(sums_and_stats, dev, cfg.rep_ms), gpu_ms=g))
        log(f"  block sums + statistics: GPU {g:.3f} ms")
    if cfg.sweep:  # the block-sum pass's launch shape (config.RoutingConfig), with extremes
        from workbench.kernels.config import RoutingConfig

        for rows, warps in ((4, 4), (1, 4), (2, 2), (2, 8)):
            bp = RoutingConfig(block_rows=rows, block_warps=warps)
            ms = time_ms(lambda bp=bp: routing.block_sums(q, k, v, minmax=True, config=bp), dev,
                         cfg.rep_ms)
            what = f"block sums + V extremes [rows {rows}, {warps} warps]"
            report["routing"].append(dict(what=what, ms=ms,
                                          read_tbs=n_bytes / (ms * 1e-3) / 1e12))
            log(f"  {what}: {ms:.3f} ms")
    # the routing rows time routing given these sums (a sparse call takes them once, minmax
    # for its statistics), so that the block-sum pass above is not counted twice
    sums = routing.block_sums(q, k, v, block=64, minmax=True)
    n_prefix_tiles = -(-prefix // 64)
    plan = []  # (Sol recipe, its density, VSA recipe or None, its density)
    targets = [(d, None) for d in cfg.densities] + [(None, t) for t in cfg.anchor_taus]
    for d, tau in targets:
        if tau is None:
            tau = routing.sol_tau_for_density(q, k, v, sol_base, d, layout=layout, sums=sums)
        sol = sol_base.with_(sol_tau=tau)
        def sol_route(sol=sol, s=sums):  # as the calls route (RoutingConfig.sol_front)
            return routing_given_sums(q, k, v, sol, layout, q.shape[-1] ** -0.5, s)[3]

        r = sol_route()
        ms_sol, g_sol = time_ms(sol_route, dev, cfg.rep_ms), gpu_ms(sol_route, dev, cfg.rep_ms)
        report["routing"].append(dict(what=f"sol statistics and routing (given block sums) "
                                           f"tau={tau:.4g}",
                                      target=d, ms=ms_sol, gpu_ms=g_sol, density=r.density))
        log(f"  target {d}: sol tau {tau:.4g} density {r.density:.4f} routing {ms_sol:.3f} ms"
            f" (GPU {_fmt(g_sol, '.3f')} ms)")
        vsa = rv_density = None
        if d is not None:
            vsa = sol_base.with_(sparsity="vsa", vsa_tile=64,
                                 vsa_keep=vsa_keep_for_density(
                                     d, nb, n_prefix_tiles, prefix_query_blocks(
                                         sol_base, layout.prefix_len, 64, nb)))
            rv_density = routing.vsa_routing(q, k, v, vsa, layout=layout, sums=sums).density
            def vsa_route(vsa=vsa, s=sums):
                return routing.vsa_routing(q, k, v, vsa, layout=layout, sums=s)

            ms_vsa = time_ms(vsa_route, dev, cfg.rep_ms)
            g_vsa = gpu_ms(vsa_route, dev, cfg.rep_ms)
            report["routing"].append(dict(
                what=f"vsa routing (given block sums) keep={vsa.vsa_keep:.4g}", target=d,
                ms=ms_vsa, gpu_ms=g_vsa, density=rv_density))
            log(f"  target {d:.2f}: vsa keep {vsa.vsa_keep:.4g} density {rv_density:.4f} "
                f"routing {ms_vsa:.3f} ms")
        plan.append((sol, r.density, vsa, rv_density))
        del r
    del sums
    torch.cuda.empty_cache()
    if "ms" in dense_row:
        for r in report["routing"]:
            r["pct_of_dense_fp8"] = 100 * (r.get("gpu_ms") or r["ms"]) / dense_row["ms"]

    # ours, sparse (skipped with the reason where no kernel supports the recipe)
    for sol, dens, vsa, dens_v in plan:
        record(f"ours FP8 Sol {cfg.threshold}", lambda sol=sol: run_attention(
            q, k, v, sol, layout=layout, backend="kernel"), route="sol", density=dens,
            tau=sol.sol_tau, emu=emulate(sol))
        if cfg.bf16:  # the BF16 baseline on the same loop (NVIDIA's kernel is BF16 too)
            b16 = get_recipe("bf16").with_(sparsity="sol", sol_tau=sol.sol_tau,
                                           sol_threshold=cfg.threshold,
                                           prefix_blocks_exact=sol.prefix_blocks_exact)
            record(f"ours BF16 Sol {cfg.threshold}", lambda b16=b16: run_attention(
                q, k, v, b16, layout=layout, backend="kernel"), route="sol", density=dens,
                tau=sol.sol_tau, emu=emulate(b16))
        if vsa is not None:
            record("ours FP8 VSA", lambda vsa=vsa: run_attention(
                q, k, v, vsa, layout=layout, backend="kernel"), route="vsa", density=dens_v,
                emu=emulate(vsa), note=f"keep={vsa.vsa_keep:.4g}")

    # NVIDIA's Sol attention at the same tau, threshold and sink
    sol_attn, why = load_sol_attn() if cfg.peer else (None, "disabled (--no-peer)")
    if sol_attn is None or D != 128 or k.shape[2] != H:
        why = why or "sol_attn needs head dim 128 and as many K/V heads as query heads"
        report["peer"] = why
        log(f"  NVIDIA sol_attn: skipped ({why})")
    else:
        backend = sol_attn_backend()
        report["peer_backend"] = backend
        note = sol_attn_backend_note(backend)
        if note:
            report["peer"] = note
            log(f"  NVIDIA sol_attn: {note}")
        for sol, dens, _, _ in plan:
            record(f"NVIDIA sol_attn [{backend}] {cfg.threshold} BF16", lambda sol=sol: sol_attn(
                q, k, v, tau=sol.sol_tau, thresh_type=cfg.threshold, sink_start=0,
                sink_tokens=prefix, kv_splits=1), route="sol", density=dens, tau=sol.sol_tau,
                note="density: ours at the same tau")

    # FastVideo's VSA kernel on our VSA routing's block maps (the same exact tiles)
    vsa_plan = [(vsa, dens_v) for _, _, vsa, dens_v in plan if vsa is not None]
    if not cfg.vsa_peer:
        attend, fv_backend, fv_note = None, "", "disabled (--no-vsa-peer)"
    elif not vsa_plan:
        attend, fv_backend, fv_note = None, "", "no VSA rows in this run"
    elif dev != "cuda":
        attend, fv_backend, fv_note = None, "", "needs CUDA"
    elif k.shape[2] != H:
        attend, fv_backend, fv_note = None, "", "its kernel takes as many K/V heads as query heads"
    else:
        attend, fv_backend, fv_note = load_fastvideo_vsa()
    report["vsa_peer"] = (fv_backend + (f" ({fv_note})" if fv_note else "")) if attend \
        else fv_note
    if attend is None:
        log(f"  FastVideo VSA: skipped ({fv_note})")
    else:
        qp, kp, vp, sizes = vsa_peer_operands(q, k, v)
        for vsa, dens_v in vsa_plan:
            bmap = routing.vsa_routing(q, k, v, vsa, layout=layout).exact
            record(f"FastVideo VSA [{fv_backend}] BF16", lambda bmap=bmap: attend(
                qp, kp, vp, bmap, sizes), route="vsa", density=dens_v,
                rows_of=lambda o: o[:, :, :S].transpose(1, 2),
                note="its block_sparse_attn (map_to_index + forward) on our VSA block map; "
                     "prefix rows block-sparse too (ours: dense BF16)")
            del bmap
        del qp, kp, vp

    # the sparse kernel's options at the last plan entry (the anchor tau): what the defaults of
    # config.SparseConfig are to be chosen from
    if cfg.sweep:
        from workbench.kernels.config import DEFAULT
        from workbench.kernels.dispatch import fp8_recipe_attention

        sol, dens, _, _ = plan[-1]
        fns, rows = {}, {}
        for label, kcfg in sweep_configs(DEFAULT):
            fns[label] = lambda kcfg=kcfg, sol=sol: fp8_recipe_attention(
                q, k, v, sol, layout=layout, config=kcfg)
            rows[label] = record(f"ours FP8 Sol {cfg.threshold} [{label}]", fns[label],
                                 route="sol", density=dens, tau=sol.sol_tau, note="option sweep")
        # one timing each moves with the GPU's drifts: the options' times are medians of
        # interleaved rounds (the first timing above warmed and checked them)
        timed = {lab: fn for lab, fn in fns.items() if "ms" in rows[lab]}
        if dev == "cuda" and cfg.sweep_rounds > 1 and timed and not over_budget():
            from .harness import interleaved_ms

            for lab, ts in interleaved_ms(timed, rounds=cfg.sweep_rounds,
                                          rep_ms=cfg.rep_ms).items():
                row = rows[lab]
                row["ms"] = statistics.median(ts)
                row["ns_per_exact_pair"] = ns_per_exact_pair(row["ms"], dens)
                row["note"] = (f"option sweep: median of {len(ts)} interleaved rounds "
                               f"({min(ts):.3f}-{max(ts):.3f})")

    # where the time of one call goes, at the anchor tau (and VSA at the first density)
    if cfg.stages and dev == "cuda" and not over_budget():  # (kernels: CUDA only)
        from workbench.kernels.config import DEFAULT

        report["stages"] = []
        picks = [(plan[-1][0], plan[-1][1])] + [(p[2], p[3]) for p in plan[:1] if p[2]]
        for rec, dens in picks:
            for st in stage_times(q, k, v, rec, layout, DEFAULT, dev, cfg.rep_ms):
                st.update(recipe=rec.to_string(), density=dens)
                report["stages"].append(st)
                log(f"  stage [{rec.sparsity} {dens:.4f}] {st['what']:34s} {st['ms']:8.3f} ms")
            torch.cuda.empty_cache()
        # the anchor call's GPU time per kernel (the passes above run alone; here they share
        # the GPU as in a call: the prefix rows' side stream overlaps the rest)
        from .harness import kernel_profile

        sol = plan[-1][0]
        report["profile"] = dict(recipe=sol.to_string(), density=plan[-1][1],
                                 kernels=kernel_profile(lambda: run_attention(
                                     q, k, v, sol, layout=layout, backend="kernel")))
    report["total_s"] = time.time() - t0
    return report


def _fmt(x, spec: str) -> str:
    return "" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def density_fits(rows: list[dict]) -> list[dict]:
    """Per variant with timed rows at two or more exact densities in (0, 1): the least-squares
    line ms = fixed + slope x density. fixed: the part of a call that does not scale with the
    density (routing, quantizer, prefix rows, per-CTA costs); slope: the cost of the exact
    blocks, also as a share of our dense FP8 call (1 = as cheap per block as the dense call)."""
    dense = next((r.get("ms") for r in rows if r["variant"] == f"ours {DENSE_RECIPE}"), None)
    by: dict[str, list[tuple[float, float]]] = {}
    for r in rows:
        if r.get("ms") and 0.0 < r["density"] < 1.0 and r["route"] != "dense":
            by.setdefault(r["variant"], []).append((r["density"], r["ms"]))
    fits = []
    for variant, pts in by.items():
        if len({d for d, _ in pts}) < 2:
            continue
        n = len(pts)
        md = sum(d for d, _ in pts) / n
        mt = sum(t for _, t in pts) / n
        slope = (sum((d - md) * (t - mt) for d, t in pts)
                 / sum((d - md) ** 2 for d, _ in pts))
        fits.append(dict(variant=variant, densities=sorted(d for d, _ in pts),
                         fixed_ms=mt - slope * md, slope_ms=slope,
                         slope_of_dense=slope / dense if dense else None))
    return fits


def _prefix_words(recipe: str) -> str:
    """What our Sol rows do with the prefix rows, in the table's words."""
    from workbench.recipes import get_recipe

    r = get_recipe(recipe)
    if r.dense_prefix:
        return "Sol sink, BF16 prefix rows; the BF16 Sol rows route them"
    if r.prefix_blocks_exact:
        return "Sol sink, prefix blocks exact in FP8, in BF16 in the BF16 Sol rows"
    return "Sol sink, prefix rows routed"


def markdown(report: dict) -> str:
    """Two tables: the attention variants (ratios against SDPA cuDNN and against NVIDIA's Sol at
    the same tau) and the routing passes."""
    env, c = report["env"], report["config"]
    sol_recipe = c.get("sol_recipe", SOL_RECIPE)  # reports before the option: the default
    lines = [f"Device {env.get('device')}, torch {env.get('torch')}, triton {env.get('triton')}, "
             f"{env.get('date')}. Synthetic H3 input {tuple(c['shape'])}, prefix {c['prefix']} "
             f"rows ({_prefix_words(sol_recipe)}), Sol threshold {c['threshold']}, our Sol rows "
             f"`{sol_recipe}`; accuracy: rel-L2 vs float64 on {_rows_sampled(c)} evenly spaced "
             "rows.",
             ""]
    rows = report["rows"]
    base = next((r.get("ms") for r in rows if r["variant"] == "sdpa_cudnn_bf16"), None)
    peer = {r["tau"]: r.get("ms") for r in rows if r["variant"].startswith("NVIDIA")}
    peer_g = {r["tau"]: r.get("graph_ms") for r in rows if r["variant"].startswith("NVIDIA")}
    board = any("sm_mhz" in r for r in rows)  # clock / power samples (older reports: none)
    graph = any("graph_ms" in r for r in rows)  # --graph runs
    lines += ["| variant | tau | exact density | ms | ns / exact block | x SDPA cuDNN "
              "| x NVIDIA Sol |" + (" CUDA-graph ms | x NVIDIA Sol, graphs |" if graph else "")
              + " rel-L2 vs f64 | emu rel-L2 |" + (BOARD_HEADER if board else "") + " note |",
              "|---|---|---|---|---|---|---|---|---|" + ("---|---|" if graph else "")
              + ("---|" if board else "") + "---|"]
    for r in rows:
        ms = r.get("ms")
        x_sdpa = _fmt(base / ms, ".2f") if base and ms else ""
        ours_sol = r["route"] == "sol" and not r["variant"].startswith("NVIDIA")
        p = peer.get(r["tau"]) if ours_sol else None
        x_peer = _fmt(p / ms, ".2f") if p and ms else ""
        g_cells = ""
        if graph:
            g, pg = r.get("graph_ms"), peer_g.get(r["tau"]) if ours_sol else None
            g_cells = f" {_fmt(g, '.3f')} | {_fmt(pg / g, '.2f') if pg and g else ''} |"
        note = r.get("skipped") and f"skipped: {r['skipped']}" or r.get("note", "")
        lines.append(
            f"| {r['variant']} | {_fmt(r['tau'], '.4g')} | {r['density']:.4f} | {_fmt(ms, '.3f')} "
            f"| {_fmt(r.get('ns_per_exact_pair'), '.2f')} | {x_sdpa} | {x_peer} |" + g_cells
            + f" {_fmt(r.get('rel_l2'), '.3e')} | {_fmt(r.get('emu_rel_l2'), '.3e')} |"
            + (board_cell(r) if board else "") + f" {note} |")
    if graph:
        lines += ["", "ms: eager calls (`do_bench` medians: where the host is the bottleneck, "
                  "its time to issue a call); CUDA-graph ms: the same call captured once and "
                  "replayed (the GPU's time without the host's launch time; empty where the call "
                  "cannot be captured)."]
    if board:
        lines += ["", BOARD_NOTE]
    fits = density_fits(rows)
    if fits:
        lines += ["", "| variant: ms = fixed + slope x density (least squares) | densities "
                  "| fixed ms | slope ms | slope / our dense FP8 call |", "|---|---|---|---|---|"]
        for f in fits:
            lines.append(f"| {f['variant']} | {', '.join(f'{d:.3f}' for d in f['densities'])} "
                         f"| {f['fixed_ms']:.2f} | {f['slope_ms']:.2f} "
                         f"| {_fmt(f['slope_of_dense'], '.2f')} |")
    if report.get("peer"):
        lines += ["", f"NVIDIA sol_attn: {report['peer']}"]
    if report.get("vsa_peer"):
        lines += ["", f"FastVideo VSA: {report['vsa_peer']}"]
    if report.get("stages"):
        lines += ["", "| pass of one call (timed alone) | route | exact density | ms "
                  "| GPU ms (CUDA graph) |", "|---|---|---|---|---|"]
        for r in report["stages"]:
            lines.append(f"| {r['what']} | {r['recipe']} | {r['density']:.4f} | {r['ms']:.3f} "
                         f"| {_fmt(r.get('gpu_ms'), '.3f')} |")
    if report.get("profile"):
        prof = report["profile"]
        lines += ["", f"| kernel of one call (torch profiler; {prof['recipe']}, exact density "
                      f"{prof['density']:.4f}) | ms per call |", "|---|---|"]
        kernels = prof["kernels"]
        for r in kernels[:10] + ([kernels[-1]] if len(kernels) > 10 else []):
            lines.append(f"| {r['kernel']} | {r['ms_per_call']:.3f} |")
    lines += ["", "| routing pass | ms (launches) | GPU ms (CUDA graph) | % of dense FP8 full call "
              "(GPU ms where measured) | exact density | read TB/s |",
              "|---|---|---|---|---|---|"]
    for r in report["routing"]:
        lines.append(f"| {r['what']} | {r['ms']:.3f} | {_fmt(r.get('gpu_ms'), '.3f')} "
                     f"| {_fmt(r.get('pct_of_dense_fp8'), '.2f')} "
                     f"| {_fmt(r.get('density'), '.4f')} | {_fmt(r.get('read_tbs'), '.2f')} |")
    return "\n".join(lines) + "\n"


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``python -m workbench.bench.sparse`` and ``workbench bench sparse``."""
    p.add_argument("--heads", type=int, default=56, help="query (= K/V) heads")
    p.add_argument("--seq", type=int, default=None,
                   help="sequence length of a small synthetic layout (default: live H3)")
    p.add_argument("--densities", type=float, nargs="+", default=list(DENSITIES))
    p.add_argument("--threshold", choices=("exact", "diag"), default="exact")
    p.add_argument("--sol-recipe", default=SOL_RECIPE,
                   help="the FP8 Sol recipe of our Sol rows and the base of the VSA rows (tau / "
                        "keep set per density), e.g. fp8_sol_kv_corrected:dense_prefix=false,"
                        f"prefix_blocks_exact=true (default {SOL_RECIPE})")
    p.add_argument("--rows", type=int, default=64, help="query rows for accuracy vs float64")
    p.add_argument("--rep-ms", type=int, default=300)
    p.add_argument("--budget-s", type=float, default=300.0)
    p.add_argument("--no-emulate", action="store_true", help="skip the torch emulation error")
    p.add_argument("--no-peer", action="store_true", help="skip NVIDIA's sol_attn")
    p.add_argument("--no-vsa-peer", action="store_true", help="skip FastVideo's VSA kernel")
    p.add_argument("--no-sweep", action="store_true", help="skip the sparse kernel's options")
    p.add_argument("--sweep-rounds", type=int, default=5,
                   help="interleaved rounds behind each option's time (CUDA)")
    p.add_argument("--no-stages", action="store_true", help="skip the per-pass times")
    p.add_argument("--no-bf16", action="store_true", help="skip the BF16 Sol rows")
    p.add_argument("--taus", type=float, nargs="*", default=[1.0],
                   help="Sol rows (and NVIDIA's) at these taus too")
    p.add_argument("--graph", action="store_true",
                   help="also time each row from CUDA-graph replays (short sequences: the "
                        "GPU's time without the host's launch time)")
    add_board_argument(p, 1.0)
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                   help="cpu: a smoke run of the plumbing (set TRITON_INTERPRET=1)")
    p.add_argument("--json", default=None)
    p.add_argument("--markdown", default=None)


def check_args(args: argparse.Namespace) -> None:
    """Refuse bad options before any GPU work (ValueError naming the option)."""
    bad = [d for d in args.densities if not 0.0 < d <= 1.0]
    if bad:
        raise ValueError(f"--densities: {bad} not in (0, 1]")
    if args.heads < 1 or args.rows < 1:
        raise ValueError("--heads and --rows must be >= 1")
    if args.sweep_rounds < 1:
        raise ValueError(f"--sweep-rounds: {args.sweep_rounds} < 1")
    if args.rep_ms < 1:
        raise ValueError(f"--rep-ms: {args.rep_ms} (milliseconds of repetitions per row, >= 1)")
    if not (math.isfinite(args.budget_s) and args.budget_s > 0):
        raise ValueError(f"--budget-s: {args.budget_s} (seconds for the rows, > 0)")
    if args.seq is not None and args.seq < MIN_SEQ:
        raise ValueError(f"--seq: {args.seq}; the small layout needs at least {MIN_SEQ} rows "
                         "(text, audio and video segments and one 64-row block)")
    bad = [t for t in args.taus if not (math.isfinite(t) and t > 0)]
    if bad:
        raise ValueError(f"--taus: {bad}; Sol taus are finite and > 0")
    from workbench.recipes import PRESETS, RecipeError, get_recipe

    try:
        sol = get_recipe(args.sol_recipe)
    except (RecipeError, KeyError, ValueError) as e:
        raise ValueError(f"--sol-recipe: {e}") from None
    if sol.sparsity != "sol" or sol.qk_format != "fp8_e4m3":
        raise ValueError(f"--sol-recipe: {args.sol_recipe!r} has sparsity={sol.sparsity!r}, "
                         f"qk_format={sol.qk_format!r}; an FP8 Sol recipe is needed (the BF16 "
                         "Sol rows are bf16:sparsity=sol)")
    preset = PRESETS.get(sol.name)
    # set in the string (a preset's own value given again counts: it is what the user asked)
    own = (preset is None or sol.sol_threshold != preset.sol_threshold
           or "sol_threshold" in str(args.sol_recipe))
    if own and sol.sol_threshold != args.threshold:
        raise ValueError(f"--sol-recipe: {args.sol_recipe!r} sets sol_threshold="
                         f"{sol.sol_threshold!r}, --threshold is {args.threshold!r} (the bench "
                         f"sets it for every Sol row): pass --threshold {sol.sol_threshold}")
    check_board_s(args.board_s)
    check_report_files(args)


def check_cuda(device: str, *, what: str = "--device cuda") -> None:
    """A CUDA run needs a CUDA GPU (said before any work, not after the inputs are made)."""
    if device == "cuda" and not torch.cuda.is_available():
        hint = (" (--device cpu with TRITON_INTERPRET=1 runs a small smoke test of the plumbing)"
                if what == "--device cuda" else "")
        raise ValueError(f"{what}: no CUDA GPU here{hint}")


def parse_checked(argv, prog: str, description: str, add, check) -> argparse.Namespace:
    """A bench module's own parser (``python -m``): its options (``add``), parsed and checked
    (``check``'s ValueError becomes argparse's usage error, exit 2)."""
    p = argparse.ArgumentParser(prog=prog, description=description)
    add(p)
    args = p.parse_args(argv)
    try:
        check(args)
    except ValueError as e:
        p.error(str(e))
    return args


def parse_args(argv=None) -> argparse.Namespace:
    return parse_checked(argv, "python -m workbench.bench.sparse",
                         "block-sparse attention at the H3 shape (GPU)", add_arguments,
                         check_args)


def config_from_args(args: argparse.Namespace) -> SparseBenchConfig:
    return SparseBenchConfig(heads=args.heads, seq_len=args.seq,
                             densities=tuple(args.densities), threshold=args.threshold,
                             rows=args.rows, rep_ms=args.rep_ms, emulate=not args.no_emulate,
                             peer=not args.no_peer, vsa_peer=not args.no_vsa_peer,
                             budget_s=args.budget_s, device=args.device,
                             sweep=not args.no_sweep, sweep_rounds=args.sweep_rounds,
                             stages=not args.no_stages,
                             bf16=not args.no_bf16, board_s=args.board_s,
                             anchor_taus=tuple(args.taus), graph=args.graph,
                             sol_recipe=args.sol_recipe)


def _rows_sampled(c: dict) -> int:
    """Query rows the accuracy used: --rows, or every row of a shorter sequence."""
    return min(c["rows"], c["shape"][1]) if "shape" in c else c["rows"]


def write_report(report: dict, md: str, json_path: str | None, md_path: str | None, *,
                 kind: str = "sparse") -> None:
    """Print the table; write the report as JSON and the table as markdown where asked (each
    with the mark that lets a re-run replace it: ``tables.write_bench_files``)."""
    print(md)
    write_bench_files(report, md, json_path, md_path, kind=kind)


def main(argv=None) -> int:
    return run_main(parse_args(argv), run_args, "python -m workbench.bench.sparse")


def run_main(args, run_fn, prog: str) -> int:
    """A bench module run as a program: its refusals (ValueError) as one line, rc 2."""
    try:
        return run_fn(args)
    except ValueError as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2


def run_args(args: argparse.Namespace) -> int:
    """Run from parsed options (``workbench bench sparse``)."""
    check_args(args)
    check_cuda(args.device)
    report = run(config_from_args(args))
    write_report(report, markdown(report), args.json, args.markdown)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

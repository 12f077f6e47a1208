"""GPU scale check of the capture path: capture overhead and writer throughput at full H3 width.

Builds diffusers' MiniMaxH3Transformer3DModel at full H3 width (56 heads x 128, hidden 5376, FFN
14336; ``--blocks`` blocks, random weights, bf16) over a packed sequence of 32,626 rows
(14 text | 356 audio | 32 x 1008 video), captures 3 layers x 2 steps, and measures:

- capture writer throughput (MiB/s) against a raw sequential write of the same bytes to the same
  disk in the same run (``f.write`` in 32 MiB pieces, one thread, no zarr, no checksum; after the
  store is deleted and ``os.sync()``), plus a raw write with as many threads as the writer
  (context);
- forward-pass overhead of capturing: forward time with capture vs without, per step;
- that the model output is bit-identical with and without capture.

Usage (GPU):  python scripts/gpu_capture_scalecheck.py --blocks 8 --json $OUT/scalecheck.json
CPU dry run:  python scripts/gpu_capture_scalecheck.py --small
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from workbench.bench.disk import raw_write  # noqa: E402
from workbench.capture import capture, open_capture  # noqa: E402

FULL = dict(num_attention_heads=56, attention_head_dim=128, hidden_size=5376, ffn_dim=14336,
            in_channels=24, audio_in_channels=32, text_dim=5120, freq_dim=256,
            time_embed_hidden_dim=5376, time_embed_dim=2688, num_refiner_layers=2)
SMALL = dict(num_attention_heads=4, attention_head_dim=128, hidden_size=128, ffn_dim=256,
             in_channels=4, audio_in_channels=8, text_dim=32, freq_dim=32,
             time_embed_hidden_dim=64, time_embed_dim=32, num_refiner_layers=1)


def packed_inputs(cfg, text, audio, frames, hp, wp, device, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    nv = frames * hp * wp
    S = text + audio + nv
    ti, ai, vi = torch.arange(text), torch.arange(text, text + audio), torch.arange(text + audio, S)
    tags = torch.zeros(S, dtype=torch.long)
    tags[ti], tags[ai] = 1, 2
    pos = torch.zeros(S, 3)
    pos[ti, 0] = torch.arange(text).float()
    pos[ai, 0] = torch.arange(audio).float() * frames / audio
    t, h, w = torch.meshgrid(torch.arange(frames), torch.arange(hp), torch.arange(wp),
                             indexing="ij")
    pos[vi] = torch.stack([t.flatten(), h.flatten(), w.flatten()], 1).float()
    kw = dict(
        hidden_states=torch.randn(1, nv, cfg["in_channels"] * 4, generator=g),
        audio_hidden_states=torch.randn(1, audio, cfg["audio_in_channels"], generator=g),
        encoder_hidden_states=torch.randn(1, text, cfg["text_dim"], generator=g).to(dtype),
        timestep_indices=torch.zeros(S, dtype=torch.long), token_tags=tags, position_ids=pos,
        video_indices=vi, audio_indices=ai, text_indices=ti,
    )
    return {k: v.to(device) for k, v in kw.items()}, (text, 0, audio, nv)


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def timed_forward(model, kw, sigma, device):
    sync(device)
    t0 = time.perf_counter()
    with torch.no_grad():
        out = model(**kw, timestep=torch.tensor([sigma], device=device), return_dict=False)
    sync(device)
    return time.perf_counter() - t0, out


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--blocks", type=int, default=8)
    ap.add_argument("--small", action="store_true", help="tiny CPU dry run")
    ap.add_argument("--dir", default=None, help="scratch folder for the stores (default tmp)")
    ap.add_argument("--budget-gb", type=float, default=16.0)
    ap.add_argument("--repeats", type=int, default=2, help="uncaptured forwards per step")
    ap.add_argument("--threads", type=int, default=None, help="chunk-writer threads")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    from diffusers import MiniMaxH3Transformer3DModel

    device = torch.device("cpu" if args.small or not torch.cuda.is_available() else "cuda")
    dtype = torch.bfloat16
    cfg = dict(SMALL if args.small else FULL, num_layers=args.blocks)
    geo = (14, 356, 32, 24, 42) if not args.small else (14, 36, 4, 6, 8)
    t0 = time.perf_counter()
    torch.manual_seed(0)
    with torch.device(device):
        model = MiniMaxH3Transformer3DModel(**cfg).eval()
    keep = model._keep_in_fp32_modules
    for name, p in model.named_parameters():
        if not any(k in name for k in keep):
            p.data = p.data.to(dtype)
    build_s = time.perf_counter() - t0
    kw, seg = packed_inputs(cfg, *geo, device=device, dtype=dtype)
    S = sum(seg)
    layers = [0, args.blocks // 2, args.blocks - 1]
    sigmas = [1.0, 0.96]
    print(f"device {device}, {args.blocks} blocks, S={S}, build {build_s:.1f}s", flush=True)

    timed_forward(model, kw, sigmas[0], device)  # warm-up (kernels, allocator)
    base = {i: [] for i in range(2)}
    ref_out = {}
    for _ in range(args.repeats):
        for i, s in enumerate(sigmas):
            dt, out = timed_forward(model, kw, s, device)
            base[i].append(dt)
            ref_out[i] = out[0]
    entry_bytes = 3 * S * cfg["num_attention_heads"] * 128 * 2
    # No pinned pre-warm any more: capture() pins one host ring of budget_bytes at its start
    # (before the first forward) and recycles it, so no forward allocates pinned memory.

    scratch = Path(args.dir or tempfile.mkdtemp(prefix="capscale_"))
    store = scratch / "cap.zarr"
    shutil.rmtree(store, ignore_errors=True)
    cap_times, identical = {}, {}
    t_cap0 = time.perf_counter()
    with capture(model, store, layers=layers, steps=[0, 1], progress=False,
                 budget_bytes=int(args.budget_gb * 2**30), queue_size=16,
                 writer_threads=args.threads,
                 seed=0, prompt="random packed inputs (scale check)") as cap:
        t_started = time.perf_counter()
        for i, s in enumerate(sigmas):
            cap.step(i, timestep=s)
            dt, out = timed_forward(model, kw, s, device)
            cap_times[i] = dt
            identical[i] = bool(torch.equal(out[0], ref_out[i]))
        t_fwd_done = time.perf_counter()
    t_cap1 = time.perf_counter()
    st = cap.stats
    r = open_capture(store)
    n_complete = len(r.entries(include_incomplete=False))
    q0, k0, v0 = r.qkv(1, layers[-1], heads=[0, 55] if not args.small else [0])
    # Raw write of the same bytes (read back from the store into host tensors first), after
    # deleting the store and syncing, so the raw write starts from a clean page cache as the
    # capture did (not flattered by throttling behind the capture's dirty pages).
    tensors = []
    for e in r.entries(include_incomplete=False):
        tensors.extend(r.qkv(e.step, e.layer))
    store_bytes = sum(f.stat().st_size for f in store.rglob("*") if f.is_file())
    shutil.rmtree(store, ignore_errors=True)
    t_sync = time.perf_counter()
    os.sync()
    sync_s = time.perf_counter() - t_sync
    raw_bytes, raw_s = raw_write(tensors, scratch / "raw")
    shutil.rmtree(scratch / "raw", ignore_errors=True)
    os.sync()
    threads = cap.stats.threads
    rawp_bytes, rawp_s = raw_write(tensors, scratch / "rawp", threads=threads)
    del tensors
    shutil.rmtree(scratch, ignore_errors=True)

    res = {
        "device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
        "torch": torch.__version__,
        "blocks": args.blocks, "seq_len": S, "segments": seg, "heads": cfg["num_attention_heads"],
        "captured_layers": layers, "captured_steps": [0, 1], "entries_complete": n_complete,
        "entry_mib": entry_bytes / 2**20,
        "captured_bytes": st.bytes, "store_bytes_on_disk": store_bytes,
        "writer_busy_s": st.write_seconds, "writer_mib_s": st.mb_per_s,
        "capture_end_to_end_s": t_cap1 - t_cap0,
        "flush_after_forwards_s": t_cap1 - t_fwd_done,
        "raw_write_bytes": raw_bytes, "raw_write_s": raw_s,
        "raw_write_mib_s": raw_bytes / 2**20 / raw_s,
        "writer_vs_raw": st.mb_per_s / (raw_bytes / 2**20 / raw_s),
        "writer_end_to_end_mib_s": st.bytes / 2**20 / (t_cap1 - t_started),
        f"raw_parallel_{threads}_write_mib_s": rawp_bytes / 2**20 / rawp_s,
        "sync_before_raw_s": sync_s,
        "writer_threads": st.threads, "direct_chunk_writes": st.direct, "chunks": st.chunks,
        "pinned_pool_gib": st.pool_bytes / 2**30, "pinned_pool_method": st.pool_method,
        "pinned_pool_alloc_s": st.pool_alloc_seconds,
        "capture_start_s": t_started - t_cap0,
        "forward_s_no_capture": {i: statistics.median(v) for i, v in base.items()},
        "forward_s_capture": cap_times,
        "forward_overhead": {i: cap_times[i] / statistics.median(base[i]) - 1 for i in base},
        "output_bit_identical": identical,
        "budget_peak_gib": cap.writer.budget.peak / 2**30,
        "budget_waits": cap.writer.budget.waits,
        "budget_wait_s": cap.writer.budget.wait_seconds,
        "replay_check": [list(q0.shape), str(q0.dtype)],
    }
    print(json.dumps(res, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(res, indent=2))
    ok = (n_complete == 6 and all(identical.values()))
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())

"""Train the embedded h3-nano (diffusers' MiniMaxH3Transformer3DModel at a small config).

    nice -n 10 python -m workbench.models.train_h3_nano --minutes 16 --threads 2   # CPU
    python -m workbench.models.train_h3_nano --device cuda --minutes 10           # one GPU

Rectified flow in H3's convention (t = 1 - sigma, 1 = clean; x_t = t x0 + (1 - t) noise; the model
predicts the data-ward velocity x0 - noise). Half the micro-batches draw the (video, audio) noise
levels as the sampler pairs them (one u through shift 12 / shift 3), the other half draw them
independently and uniformly, so every level is trained. The model's batch axis shares one
timestep pair per call, hence micro-batches with one noise level each.

DiT-style init: the AdaLN modulation projections and the output heads start at zero, so every
block starts as the identity. The learning rate follows the elapsed fraction of the time budget
(linear warm-up, cosine decay), so a run ends on time on any machine. EMA weights are saved.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import time
from pathlib import Path

import torch

from .codec import encode_audio, encode_video
from .h3 import H3_NANO, pack_h3_sequence, patchify_video
from .procedural import distribution_check, heldout_summary, make_clips, summarize
from .registry import CHECKPOINTS, H3Model, _build_transformer, prompt_table, save_checkpoint


def _shift(sigma: torch.Tensor, s: float) -> torch.Tensor:
    return s * sigma / (1 + (s - 1) * sigma)


def init_for_training(model) -> None:
    """Zero the AdaLN modulation and the output heads (each block starts as the identity)."""
    for blk in model.transformer_blocks:
        torch.nn.init.zeros_(blk.adaln_proj.linear.weight)
        torch.nn.init.zeros_(blk.adaln_proj.linear.bias)
    for lin in (model.norm_out.linear, model.proj_out, model.audio_proj_out):
        torch.nn.init.zeros_(lin.weight)
        torch.nn.init.zeros_(lin.bias)


def evaluate(h: H3Model, n: int = 8, steps: int = 20, seed: int = 0) -> dict:
    """Sample n clips (classes cycling) and run the distribution check against held-out clips."""
    from .procedural import clip_statistics

    spec = h.config.clip
    stats, labels = [], []
    for i in range(n):
        c = i % len(h.config.classes)
        s = h.sample(c, seed=seed + i, steps=steps)
        stats.append(clip_statistics(s.video, s.audio, spec))
        labels.append(c)
    gen = summarize(stats, labels)
    ref = heldout_summary(spec)
    ok, crit = distribution_check(gen, ref)
    return {"passed": ok, "generated": gen, "heldout": ref,
            "criteria": {k: [float(v), r, bool(o)] for k, (v, r, o) in crit.items()}}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--minutes", type=float, default=16.0, help="wall-clock training budget")
    p.add_argument("--micro", type=int, default=4, help="clips per micro-batch (one noise level)")
    p.add_argument("--accum", type=int, default=4, help="micro-batches per optimizer step")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--ema", type=float, default=0.995)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--device", default="cpu")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=str(CHECKPOINTS["h3-nano"]))
    p.add_argument("--eval-clips", type=int, default=8)
    p.add_argument("--init-from", default=None,
                   help="continue from a workbench .safetensors checkpoint (weights only)")
    args = p.parse_args(argv)

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    cfg = H3_NANO
    spec = cfg.clip
    dev = torch.device(args.device)
    model = _build_transformer(cfg, cfg.seed)
    init_for_training(model)
    if args.init_from:
        from .registry import _load_safetensors

        model.load_state_dict(_load_safetensors(Path(args.init_from), "cpu",
                                                torch.float32).model.state_dict())
    model.to(dev).train()
    ema = copy.deepcopy(model).eval()
    for q in ema.parameters():
        q.requires_grad_(False)
    prompts = prompt_table(cfg)
    layout = spec.layout().to(dev)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr, betas=(0.9, 0.99), weight_decay=0.0)
    nparams = sum(q.numel() for q in model.parameters())
    print(f"h3-nano: {nparams / 1e6:.2f} M parameters, sequence {layout.segments}", flush=True)

    budget = args.minutes * 60.0
    t0 = time.time()
    step, data_seed, log = 0, 1_000 * (args.seed + 1), []
    g = torch.Generator().manual_seed(args.seed)
    while True:
        frac = (time.time() - t0) / budget
        if frac >= 1.0:
            break
        lr = args.lr * min(1.0, frac / 0.05) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
        for group in opt.param_groups:
            group["lr"] = lr
        opt.zero_grad(set_to_none=True)
        tot_v = tot_a = 0.0
        for m in range(args.accum):
            b = make_clips(args.micro, spec, seed=data_seed)
            data_seed += 1
            x0v = patchify_video(encode_video(b.video), spec.patch).to(dev)
            x0a = encode_audio(b.audio, spec.audio_block).to(dev)
            text = prompts[b.labels].to(dev)
            u = torch.rand((), generator=g)
            if m % 2 == 0:  # the sampler's pairing of the two schedules
                sig_v, sig_a = _shift(u, cfg.video_shift), _shift(u, cfg.audio_shift)
            else:
                sig_v, sig_a = u, torch.rand((), generator=g)
            sig_v, sig_a = sig_v.clamp(1e-3, 1.0), sig_a.clamp(1e-3, 1.0)
            nv = torch.randn(x0v.shape, generator=g).to(dev)
            na = torch.randn(x0a.shape, generator=g).to(dev)
            tv, ta = 1.0 - sig_v, 1.0 - sig_a
            xv, xa = tv * x0v + (1 - tv) * nv, ta * x0a + (1 - ta) * na
            kwargs, _ = pack_h3_sequence(xv, xa, text, layout, video_t=tv, audio_t=ta)
            pv, pa = model(**kwargs, return_dict=False)
            lv = torch.mean((pv - (x0v - nv)) ** 2)
            la = torch.mean((pa - (x0a - na)) ** 2)
            ((lv + la) / args.accum).backward()
            tot_v += lv.item() / args.accum
            tot_a += la.item() / args.accum
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        decay = min(args.ema, (1 + step) / (10 + step))
        with torch.no_grad():
            for pe, pm in zip(ema.parameters(), model.parameters()):
                pe.lerp_(pm, 1 - decay)
        log.append([step, round(time.time() - t0, 1), tot_v, tot_a, lr])
        if step % 10 == 0:
            print(f"step {step} t={time.time() - t0:.0f}s loss video {tot_v:.4f} "
                  f"audio {tot_a:.4f} lr {lr:.2e}", flush=True)

    h = H3Model(ema.cpu().float(), cfg.name, cfg, prompts)
    out = save_checkpoint(h, args.out)
    print(f"saved {out} ({out.stat().st_size / 1e6:.1f} MB) after {step} steps", flush=True)
    report = {"steps": step, "seconds": round(time.time() - t0, 1), "params": nparams,
              "micro": args.micro, "accum": args.accum, "lr": args.lr, "ema": args.ema,
              "device": str(dev), "threads": args.threads, "loss_log": log[-50:]}
    if args.eval_clips:
        report["eval"] = evaluate(h, n=args.eval_clips)
        print(json.dumps(report["eval"], indent=1), flush=True)
    Path(out).with_suffix(".train.json").write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""``workbench capture``, ``workbench import``, ``workbench inspect``, ``workbench archive``."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

from workbench.cli_args import check_in_range, nonneg_int, parse_int_list, positive_int


DEFAULT_PROMPT = "a red ball bouncing"


def _capture_plan(args):
    """Selections parsed and checked before anything is loaded or written."""
    from .storefs import check_target

    layers = parse_int_list(args.layers, "--layers")
    steps = parse_int_list(args.steps, "--steps")
    heads = parse_int_list(args.heads, "--heads")
    if args.num_steps < 2:
        raise ValueError(f"--num-steps: need at least 2 sigma grid points (1 model call), got "
                         f"{args.num_steps}")
    if args.budget_mb <= 0:
        raise ValueError(f"--budget-mb: must be positive, got {args.budget_mb}")
    check_target(args.out, resume=args.resume, overwrite=args.overwrite, flag="--out")
    return layers, steps, heads


def _run_recipe(args) -> str:
    """What the store records as the run's attention: "native", the model's own, which is what
    `workbench capture` runs (earlier releases recorded the label "bf16" by default: a resume of
    such a store keeps it). Any other --recipe would record a recipe the run never used."""
    if args.recipe not in (None, "native"):
        raise ValueError(f"--recipe {args.recipe}: `workbench capture` runs the model's own "
                         "attention (recorded as 'native'); to capture q/k/v of a run under a "
                         f"recipe: `workbench generate --recipe {args.recipe} --capture STORE`")
    if args.recipe is None and args.resume:
        from workbench.recipes import PRESETS

        try:
            root = json.loads((Path(args.out) / "zarr.json").read_text(encoding="utf-8"))
            stored = root.get("attributes", {}).get("recipe")
        except (OSError, ValueError, AttributeError):
            stored = None
        if stored == PRESETS["bf16"].to_json():
            return "bf16"
    return "native"


def cmd_capture(args) -> int:
    import torch

    from .recorder import capture
    from .schema import entry_path

    layers, steps, heads = _capture_plan(args)
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[args.dtype]
    prompt = args.prompt or DEFAULT_PROMPT
    kw = dict(layers=layers, steps=steps, heads=heads, seed=args.seed, prompt=prompt,
              recipe=_run_recipe(args), resume=args.resume, overwrite=args.overwrite,
              budget_bytes=int(args.budget_mb * 2**20), progress=not args.quiet)
    t0 = time.perf_counter()
    from .hf import capture_hf, is_hf_spec

    if is_hf_spec(args.model):
        if steps is not None:
            raise ValueError(f"--steps: {args.model} runs one forward (step 0); leave --steps out")
        cap = capture_hf(args.model, args.out, prompt=args.prompt, dtype=dtype,
                         check_range=check_in_range,
                         **{k: val for k, val in kw.items() if k not in ("steps", "prompt")})
    elif args.model == "minilm":
        from .minilm import load_minilm, minilm_batch

        if steps is not None:
            raise ValueError("--steps: minilm is one forward (no denoising steps); leave it out")
        model, tok = load_minilm()
        check_in_range(layers, model.config.num_hidden_layers, "--layers", "minilm", "layers")
        check_in_range(heads, model.config.num_attention_heads, "--heads", "minilm", "heads")
        batch = minilm_batch(tok, prompt)
        with capture(model, args.out, extra_attrs={"model_name": "minilm"},
                     **{**kw, "steps": None}) as cap:
            cap.step(0)
            with torch.no_grad():
                model(**batch)
    else:
        from workbench.models import load_model

        from .identity import checkpoint_id

        h3 = load_model(args.model, dtype=dtype)
        n_calls = h3.schedule_steps(args.num_steps, "--num-steps")
        h3.check_capture_steps(steps, args.num_steps, "--steps", "--num-steps")
        n_blocks = len(h3.model.transformer_blocks)
        check_in_range(layers, n_blocks, "--layers", h3.name, "blocks")
        check_in_range(heads, h3.model.config.num_attention_heads, "--heads", h3.name,
                       "query heads")
        expected = {entry_path(s, f"transformer_blocks.{i}")
                    for s in (steps if steps is not None else range(n_calls))
                    for i in (layers if layers is not None else range(n_blocks))}
        with capture(h3.model, args.out, layout=h3.layout.segments,
                     extra_attrs={"model_name": h3.name, "checkpoint_id": checkpoint_id(args.model),
                                  "sampling_grid_points": args.num_steps,
                                  "h3_config": h3.config.to_dict() if h3.config else None},
                     **kw) as cap:
            if args.resume and expected <= cap.completed:
                print(f"{args.out}: nothing to capture: the store is already complete "
                      f"({len(expected)} already complete entries of {len(expected)} requested)")
                return 0
            h3.sample(prompt, seed=args.seed, steps=args.num_steps, callback=cap.step)
    stats = cap.stats
    print(f"captured {stats.entries} entries ({stats.bytes / 2**20:.2f} MiB) into {args.out} in "
          f"{time.perf_counter() - t0:.1f} s; writer {stats.mb_per_s:.0f} MiB/s; "
          f"{len(cap.skipped)} already complete (resume)")
    return 0


def cmd_import(args) -> int:
    from .importer import import_tensors
    from .storefs import check_target

    check_target(args.out, resume=False, overwrite=args.overwrite, flag="--out")
    t0 = time.perf_counter()
    cap, entries = import_tensors(args.src, args.out, layout=args.layout, rotated=args.rotated,
                                  scale=args.scale, causal=args.causal,
                                  overwrite=args.overwrite, progress=not args.quiet)
    q, k = entries[0].q, entries[0].k
    from .replay import open_capture

    r = open_capture(args.out)
    print(f"imported {len(entries)} entries (steps {sorted({e.step for e in entries})}, layers "
          f"{sorted({e.layer for e in entries})}; q {list(q.shape)}, k/v {list(k.shape)}, "
          f"{q.dtype}) into {args.out} in {time.perf_counter() - t0:.1f} s; layout "
          f"{r.layout.describe()}; rotated channels "
          f"{'not recorded' if args.rotated is None else args.rotated}; "
          f"{'causal' if args.causal else 'non-causal'}")
    return 0


def cmd_inspect(args) -> int:
    from .inspect import inspect_store
    from .replay import open_capture

    print(inspect_store(args.store, stats=not args.no_stats, strict=not args.verify))
    if args.verify:
        problems, notes = open_capture(args.store, strict=False).verify_report()
        print("\nverify: " + ("metadata valid, every chunk present, all chunks pass crc32c"
                              if not problems else f"{len(problems)} problem(s)"))
        for p in problems:
            print("  " + p)
        for n in notes:
            print("  note: " + n)
        return 1 if problems else 0
    return 0


def cmd_archive(args) -> int:
    from .archive import archive_store

    if not 1 <= args.level <= 22:
        raise ValueError(f"--level: {args.level}; zstd's levels are 1 to 22")
    r = archive_store(args.src, args.dst, level=args.level, overwrite=args.overwrite)
    print(f"archived {r['entries']} entries: {r['src_bytes'] / 2**20:.2f} MiB -> "
          f"{r['dst_bytes'] / 2**20:.2f} MiB (zstd:{args.level}); skipped incomplete: "
          f"{r['skipped_incomplete'] or 'none'}")
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("capture", help="capture live attention q/k/v into a zarr store")
    p.add_argument("--model", default="h3-tiny",
                   help="h3-tiny | h3-nano | PATH (workbench.models), minilm, or hf:PATH_OR_NAME "
                        "(a local transformers model folder, a .gguf file or a cached hub name, "
                        "captured through SDPA: one forward on --prompt)")
    p.add_argument("--out", required=True, help="store path (a .zarr directory)")
    p.add_argument("--layers", default=None, help="block indices, e.g. 0,2 or 0-3 (default all)")
    p.add_argument("--steps", default=None,
                   help="denoising steps to keep, e.g. 0,2 or 0-2; within the --num-steps "
                        "schedule (default all)")
    p.add_argument("--heads", default=None, help="query heads, e.g. 0,1 or 0-3 (default all)")
    p.add_argument("--num-steps", type=int, default=4,
                   help="sigma grid points of the sampler (N points: steps 0..N-2)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--prompt", default=None,
                   help="prompt of the run (default: 'a red ball bouncing'; hf: a built-in text)")
    p.add_argument("--recipe", default=None,
                   help="the run's attention as recorded: only 'native' (the default: capture "
                        "runs the model's own attention; `workbench generate --recipe R "
                        "--capture STORE` captures a run under recipe R)")
    p.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    p.add_argument("--budget-mb", type=float, default=2048.0, help="host memory bound (MiB)")
    p.add_argument("--resume", action="store_true",
                   help="continue a store of the same run; keep its complete entries")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an existing capture store (never anything else)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_capture)

    p = subparsers.add_parser(
        "import", help="q/k/v from .pt/.safetensors/.npy files into a store")
    p.add_argument("src", nargs="+",
                   help="files or folders: tensors named q, k, v or <entry>.q / .k / .v; q [S, H, "
                        "D], k and v [S, Hkv, D], optionally with a leading batch dim")
    p.add_argument("--out", required=True, help="store path (a .zarr directory)")
    p.add_argument("--layout", default=None,
                   help="named segments NAME:ROWS,... in sequence order, e.g. prompt:200,answer:56"
                        " (default: one segment 'tokens'); the segments before the last form the "
                        "prefix (text:14,audio:356,video:32256 is H3's)")
    p.add_argument("--rotated", type=nonneg_int, default=None,
                   help="RoPE-rotated channels per head, 0 to D (default: not recorded)")
    p.add_argument("--scale", type=float, default=None,
                   help="the model's softmax scale (default 1/sqrt(D))")
    p.add_argument("--causal", action="store_true",
                   help="the model attends causally: replays mask keys after each row")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an existing capture store (never anything else)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_import)

    p = subparsers.add_parser("inspect", help="list a capture store's entries and K/V norms")
    p.add_argument("store")
    p.add_argument("--no-stats", action="store_true", help="skip the per-layer norms (no reads)")
    p.add_argument("--verify", action="store_true", help="read every chunk through its crc32c")
    p.set_defaults(func=cmd_inspect)

    p = subparsers.add_parser("archive", help="rewrite a capture store with zstd compression")
    p.add_argument("src")
    p.add_argument("dst")
    p.add_argument("--level", type=positive_int, default=3, help="zstd level (default 3)")
    p.add_argument("--overwrite", action="store_true",
                   help="replace DST if it is a capture store (kept until the new one is done)")
    p.set_defaults(func=cmd_archive)


if __name__ == "__main__":
    sys.exit("use: workbench capture|inspect|archive")

"""``workbench capture``, ``workbench inspect``, ``workbench archive``."""

from __future__ import annotations

import sys
import time


def _ints(text: str | None) -> list[int] | None:
    if text in (None, "", "all"):
        return None
    try:
        return [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"expected a comma-separated list of integers, got {text!r}") from None


def cmd_capture(args) -> int:
    import torch

    from .recorder import capture

    layers, steps, heads = _ints(args.layers), _ints(args.steps), _ints(args.heads)
    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[args.dtype]
    kw = dict(layers=layers, steps=steps, heads=heads, seed=args.seed, prompt=args.prompt,
              recipe=args.recipe, resume=args.resume, overwrite=args.overwrite,
              budget_bytes=int(args.budget_mb * 2**20), progress=not args.quiet)
    t0 = time.perf_counter()
    if args.model == "minilm":
        from .minilm import load_minilm, minilm_batch

        model, tok = load_minilm()
        batch = minilm_batch(tok, args.prompt)
        with capture(model, args.out, extra_attrs={"model_name": "minilm"},
                     **{**kw, "steps": None}) as cap:
            cap.step(0)
            with torch.no_grad():
                model(**batch)
    else:
        from workbench.models import load_model

        h3 = load_model(args.model, dtype=dtype)
        n_calls = (max(steps) + 1) if steps else args.num_steps - 1
        grid = max(args.num_steps, n_calls + 1)
        with capture(h3.model, args.out, layout=h3.layout.segments,
                     extra_attrs={"model_name": h3.name, "sampling_grid_points": grid,
                                  "h3_config": h3.config.to_dict() if h3.config else None},
                     **kw) as cap:
            h3.sample(args.prompt, seed=args.seed, steps=grid, callback=cap.step)
    stats = cap.stats
    print(f"captured {stats.entries} entries ({stats.bytes / 2**20:.2f} MiB) into {args.out} in "
          f"{time.perf_counter() - t0:.1f} s; writer {stats.mb_per_s:.0f} MiB/s; "
          f"{len(cap.skipped)} already complete (resume)")
    return 0


def cmd_inspect(args) -> int:
    from .inspect import inspect_store
    from .replay import open_capture

    print(inspect_store(args.store, stats=not args.no_stats))
    if args.verify:
        problems = open_capture(args.store).verify()
        print("\nverify: " + ("all chunks pass crc32c" if not problems else
                              f"{len(problems)} problem(s)"))
        for p in problems:
            print("  " + p)
        return 1 if problems else 0
    return 0


def cmd_archive(args) -> int:
    from .archive import archive_store

    r = archive_store(args.src, args.dst, level=args.level, overwrite=args.overwrite)
    print(f"archived {r['entries']} entries: {r['src_bytes'] / 2**20:.2f} MiB -> "
          f"{r['dst_bytes'] / 2**20:.2f} MiB (zstd:{args.level}); skipped incomplete: "
          f"{r['skipped_incomplete'] or 'none'}")
    return 0


def register(subparsers) -> None:
    p = subparsers.add_parser("capture", help="capture live attention q/k/v into a zarr store")
    p.add_argument("--model", default="h3-tiny",
                   help="h3-tiny | h3-nano | PATH (workbench.models) or minilm (SDPA capture)")
    p.add_argument("--out", required=True, help="store path (a .zarr directory)")
    p.add_argument("--layers", default=None, help="comma-separated block indices (default all)")
    p.add_argument("--steps", default=None, help="comma-separated denoising steps (default all)")
    p.add_argument("--heads", default=None, help="comma-separated query heads (default all)")
    p.add_argument("--num-steps", type=int, default=4, help="sigma grid points when --steps unset")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--prompt", default="a red ball bouncing")
    p.add_argument("--recipe", default="bf16", help="recipe of the run (stored in attributes)")
    p.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    p.add_argument("--budget-mb", type=float, default=2048.0, help="host memory bound (MiB)")
    p.add_argument("--resume", action="store_true", help="continue a store; keep complete entries")
    p.add_argument("--overwrite", action="store_true", help="replace an existing store")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_capture)

    p = subparsers.add_parser("inspect", help="list a capture store's entries and K/V norms")
    p.add_argument("store")
    p.add_argument("--no-stats", action="store_true", help="skip the per-layer norms (no reads)")
    p.add_argument("--verify", action="store_true", help="read every chunk through its crc32c")
    p.set_defaults(func=cmd_inspect)

    p = subparsers.add_parser("archive", help="rewrite a capture store with zstd compression")
    p.add_argument("src")
    p.add_argument("dst")
    p.add_argument("--level", type=int, default=3)
    p.add_argument("--overwrite", action="store_true")
    p.set_defaults(func=cmd_archive)


if __name__ == "__main__":
    sys.exit("use: workbench capture|inspect|archive")

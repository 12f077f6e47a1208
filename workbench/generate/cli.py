"""``workbench generate`` and ``workbench compare``.

    workbench generate --model h3-nano --prompt "a red ball bouncing" --seed 0 --steps 50 \\
        --recipe fp8_sol_kv_corrected --dense-steps 10 --dense-layers 2 --out runs/fp8
    workbench compare runs/bf16 runs/fp8 --out runs/cmp
    workbench compare --recipes bf16,fp8_sol_unsmoothed,fp8_sol_kv_corrected --model h3-nano
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from workbench.capture.storefs import check_outside_stores
from workbench.recipes.plan import RecipePlan, read_plan_spec
from workbench.cli_args import (
    CLIP_FILES,
    CLIP_MARKER,
    COMPARE_FILES,
    COMPARE_MARKER,
    COMPARE_RECIPES_MARKER,
    check_device,
    check_no_clobber,
    check_out_dir,
    nonneg_int,
    parse_int_list,
    writing_mark,
)

DEFAULT_PROMPT = "a red ball bouncing"


def _dtype(name: str, device: str):
    import torch

    if name == "auto":
        return torch.bfloat16 if device.startswith("cuda") else torch.float32
    try:
        return {"float32": torch.float32, "bfloat16": torch.bfloat16,
                "float16": torch.float16}[name]
    except KeyError:
        raise ValueError(
            f"--dtype: unknown {name!r}; use auto, float32, bfloat16 or float16"
        ) from None


def _check_common(args) -> None:
    """Checks that need no model: run before anything is loaded."""
    if args.steps is not None and args.steps < 2:
        raise ValueError(f"--steps: need at least 2 sigma grid points (1 model call), got "
                         f"{args.steps}")
    check_device(args.device)
    _dtype(args.dtype, args.device)


def _load(args):
    import torch

    from workbench.models import load_model

    torch.set_num_threads(max(1, args.threads)) if args.threads else None
    return load_model(args.model, device=args.device, dtype=_dtype(args.dtype, args.device))


def _model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="h3-nano", help="h3-nano | h3-tiny | PATH (local only)")
    p.add_argument("--prompt", default=DEFAULT_PROMPT, help="names a class: red/green/blue/yellow")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=None,
                   help="sigma grid points, at least 2 (default: the model's)")
    p.add_argument("--dense-steps", type=nonneg_int, default=None, help="override the recipe's")
    p.add_argument("--dense-layers", type=nonneg_int, default=None, help="override the recipe's")
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="auto", help="auto (bf16 on CUDA, fp32 on CPU) | ...")
    p.add_argument("--backend", default=None, help="auto | reference | kernel")
    p.add_argument("--threads", type=nonneg_int, default=0, help="torch CPU threads (0: default)")
    p.add_argument("--quiet", action="store_true", help="no progress bar")


def cmd_generate(args) -> int:
    from .run import generate, write_clip

    _check_common(args)
    check_out_dir(args.out)
    check_outside_stores(args.out, "--out")
    check_no_clobber(args.out, CLIP_FILES, overwrite=args.overwrite, marker=CLIP_MARKER,
                     command="generate")
    layers = parse_int_list(args.layers, "--layers")
    capture_steps = parse_int_list(args.capture_steps, "--capture-steps")
    if args.capture is not None:
        cap = Path(args.capture)
        o, c = Path(args.out).resolve(), cap.resolve()
        if o == c or c in o.parents or o in c.parents:
            raise ValueError(f"--capture {cap}: the same folder as --out {args.out} or nested "
                             "with it; the clip's files would land in the store (or the store "
                             "in the clip folder): give two separate paths")
        if cap.exists() and (not cap.is_dir() or any(cap.iterdir())):
            raise ValueError(f"--capture {cap}: already exists; generate writes a new capture "
                             f"store (workbench capture --resume continues one): choose a new path")
        check_out_dir(cap, "--capture")
    h3 = _load(args)
    clip = generate(
        h3, args.prompt, seed=args.seed, steps=args.steps, recipe=args.recipe,
        dense_steps=args.dense_steps, dense_layers=args.dense_layers, backend=args.backend,
        capture=args.capture, capture_layers=layers,
        capture_steps=capture_steps, progress=not args.quiet,
    )
    with writing_mark(args.out, "generate"):
        out = write_clip(clip, args.out)
    calls = clip.config["attention_calls"]
    used = clip.config["recipe_string"]
    plan = read_plan_spec(used)
    if isinstance(plan, RecipePlan):  # a plan: its summary, not its JSON
        used = plan.describe()
    print(f"wrote {out} ({clip.video.shape[0]} frames, {clip.audio.numel()} audio samples) in "
          f"{clip.config['seconds']:.1f} s; recipe {used}; "
          f"attention calls replaced {calls['replaced_calls']} "
          f"(dense policy {calls['dense_policy_calls']}), captured {calls['captured_calls']}")
    return 0


def cmd_compare(args) -> int:
    from .compare import compare_dirs, compare_recipes

    if args.recipes:
        if args.dirs:
            raise ValueError("give either two clip folders or --recipes, not both")
        _check_common(args)
        from workbench.recipes import split_recipe_list

        recipes = split_recipe_list(args.recipes)
        if not recipes:
            raise ValueError("--recipes: empty; give recipes like bf16,fp8_sol_kv_corrected")
        out = check_out_dir(args.out or "runs/compare")
        check_outside_stores(out, "--out")
        check_no_clobber(out, None, overwrite=args.overwrite, marker=COMPARE_RECIPES_MARKER,
                         command="compare")
        h3 = _load(args)
        t0 = time.perf_counter()
        with writing_mark(out, "compare"):
            _, table = compare_recipes(
                h3, recipes, prompt=args.prompt, seed=args.seed, steps=args.steps, out=out,
                dense_steps=args.dense_steps, dense_layers=args.dense_layers,
                backend=args.backend, progress=not args.quiet,
            )
        print(f"model {h3.name}, prompt {args.prompt!r}, seed {args.seed}, "
              f"steps {args.steps or h3.config.default_steps}, device {args.device}; "
              f"against {recipes[0]}:\n")
        print(table)
        print(f"\nwrote {out} in {time.perf_counter() - t0:.1f} s")
        return 0
    if len(args.dirs) != 2:
        raise ValueError("give two clip folders (A B) or --recipes r1,r2,...")
    a, b = args.dirs
    for d in (a, b):
        if not Path(d).is_dir():
            raise ValueError(f"{d}: not a clip folder (video.mp4 / clip.safetensors)")
    out = args.out or str(Path(b).parent / f"compare_{Path(a).name}_{Path(b).name}")
    check_out_dir(out)
    check_outside_stores(out, "--out")
    check_no_clobber(out, COMPARE_FILES, overwrite=args.overwrite, marker=COMPARE_MARKER,
                     command="compare")
    with writing_mark(out, "compare"):
        m = compare_dirs(a, b, out)
    from workbench.metrics.media import media_table

    print(media_table({Path(b).name: m}, Path(a).name))
    print(f"\nwrote {out}")
    return 0


def register(sub) -> None:
    g = sub.add_parser("generate",
                       help="generate a clip (mp4 + wav + config) with an attention recipe")
    _model_args(g)
    g.add_argument("--recipe", default="bf16",
                   help="preset, 'preset:field=value', JSON, or 'native' (no replacement)")
    g.add_argument("--out", required=True, help="output folder")
    g.add_argument("--overwrite", action="store_true",
                   help="replace an earlier clip in --out (its video/audio/config files only; "
                        "refused where config.json is not a clip's)")
    g.add_argument("--capture", default=None, metavar="STORE", help="also capture q/k/v here")
    g.add_argument("--layers", default=None, help="capture layers, e.g. 0,2 or 0-3 (default all)")
    g.add_argument("--capture-steps", "--steps-to-capture", dest="capture_steps", default=None,
                   help="capture steps, e.g. 0,10,40 (default all)")
    g.set_defaults(func=cmd_generate)

    c = sub.add_parser("compare", help="frame/audio metrics of clips (two folders, or --recipes)")
    c.add_argument("dirs", nargs="*", help="DIR_A DIR_B (metrics of B against A)")
    c.add_argument("--recipes", default=None, help="generate with each, compare against the first")
    c.add_argument("--out", default=None, help="output folder")
    c.add_argument("--overwrite", action="store_true",
                   help="write into an --out that holds earlier comparison results (refused "
                        "where they are not a comparison's)")
    _model_args(c)
    c.set_defaults(func=cmd_compare)

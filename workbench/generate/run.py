"""Generate one clip with an attention recipe applied per layer and per step.

The recipe replaces attention through the capture interception point
(``workbench.capture.AttentionInterceptor``): every ``dispatch_attention_fn`` call of the H3 blocks
goes to ``workbench.attention.runner.run_attention(q, k, v, recipe, layout=, step=, layer=)``, which
applies the dense policy (BF16 dense below ``dense_steps`` / ``dense_layers``) and the BF16
dense-prefix replacement as the recipe says. The same handler records q/k/v into a capture store
when ``capture=`` is given, so capture and replacement share one interceptor.

Output folder: ``video.mp4`` (frames enlarged for viewing, audio muxed in), ``audio.wav`` (float),
``clip.safetensors`` (the exact float frames [T, 3, H, W] and waveform [N], used by compare), and
``config.json`` (model, checkpoint hash, prompt, seed, steps, recipe JSON, device, versions).
"""

from __future__ import annotations

import json
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from workbench.attention.runner import run_attention
from workbench.recipes import AttentionRecipe, RecipePlan, get_recipe

VIEW_MIN_SIDE = 128  # enlarge small frames (nearest, integer factor) in the mp4 for viewing


@dataclass
class Clip:
    """video [T, 3, H, W] float32 in [0, 1]; audio [N] float32; fps; sample_rate; config dict."""

    video: torch.Tensor
    audio: torch.Tensor
    fps: int
    sample_rate: int
    config: dict


def resolve_recipe(spec: str | AttentionRecipe | None, dense_steps: int | None = None,
                   dense_layers: int | None = None) -> AttentionRecipe | None:
    """The recipe with dense-policy overrides; None/'native' keeps the model's own attention."""
    if spec is None or spec == "native":
        return None
    r = get_recipe(spec)
    over = {}
    if dense_steps is not None:
        over["dense_steps"] = int(dense_steps)
    if dense_layers is not None:
        over["dense_layers"] = int(dense_layers)
    return r.with_(**over) if over else r


def generate(
    h3,
    prompt: str | int | None = None,
    *,
    seed: int = 0,
    steps: int | None = None,
    recipe: str | AttentionRecipe | None = "bf16",
    dense_steps: int | None = None,
    dense_layers: int | None = None,
    backend: str | None = None,
    capture: str | Path | None = None,
    capture_layers=None,
    capture_steps=None,
    progress: bool = True,
    capture_kwargs: dict | None = None,
) -> Clip:
    """Sample one clip from `h3` (an ``H3Model``) with `recipe` replacing every block's attention.

    recipe None / "native": no replacement (diffusers' own attention backend).
    capture: a zarr store path; q/k/v of `capture_layers` x `capture_steps` are recorded there
    (the tensors that enter attention, before the replacement computes the output).
    """
    from workbench.capture import AttentionInterceptor
    from workbench.capture.intercept import h3_rotated_channels
    from workbench.capture.identity import checkpoint_id
    from workbench.cli_args import check_in_range

    # Everything the run will need is checked before any work (the schedule, the capture
    # selection, the recipe), so a typo fails in a second, not after the sampling.
    grid = h3.grid_points(steps, "--steps")
    h3.check_capture_steps(capture_steps, steps, "--capture-steps", "--steps")
    check_in_range(None if capture_layers is None else [int(x) for x in capture_layers],
                   len(h3.model.transformer_blocks), "--layers", h3.name, "blocks")
    from workbench.attention.runner import BACKENDS, default_backend

    if backend is not None and backend not in BACKENDS:
        raise ValueError(f"--backend: unknown {backend!r}; choose one of {BACKENDS}")
    rec = resolve_recipe(recipe, dense_steps, dense_layers)
    if rec is None and (dense_steps is not None or dense_layers is not None):
        print("note: --dense-steps / --dense-layers do nothing with the model's own attention "
              "(--recipe native): every call runs it", file=sys.stderr)
    if isinstance(rec, RecipePlan):  # entries this run never reaches: say so, not silence
        n_blocks = len(h3.model.transformer_blocks)
        off = [(e.step, e.layer) for e in rec.entries if e.step >= grid - 1 or e.layer >= n_blocks]
        if off:
            print(f"note: plan {rec.name!r}: {len(off)} of its {len(rec.entries)} entries lie "
                  f"outside this run (steps 0-{grid - 2}, layers 0-{n_blocks - 1}), e.g. (step, "
                  f"layer) {off[0]}; they do not apply", file=sys.stderr)
    plan_grid = rec.source.get("grid_points") if isinstance(rec, RecipePlan) else None
    if plan_grid is not None and plan_grid != grid:
        print(f"note: plan {rec.name!r} comes from a capture of {plan_grid} sampling grid "
              f"points, this run has {grid}: its step indices mean other noise levels here "
              f"(generate with --steps {plan_grid}, or plan from a capture of this schedule)",
              file=sys.stderr)
    layout = h3.layout.segments
    cap_ctx = None
    if capture is not None:
        from workbench.capture import capture as open_capture
        from workbench.capture.recorder import model_metadata

        # fed through record() by the interceptor below: name the model and where q, k, v come
        # from, which a store opened without a model cannot know
        meta = {k: v for k, v in model_metadata(h3.model).items() if k != "rotated_channels"}
        meta["capture_point"] = ("workbench generate: the H3 blocks' dispatch_attention_fn(q, k, "
                                 "v) inputs (AttentionInterceptor), post-QK-norm, post-RoPE, "
                                 "[B, S, H, D]")
        cap_ctx = open_capture(
            None, capture, layers=capture_layers, steps=capture_steps, layout=layout,
            recipe=rec.to_json() if rec is not None else "native", seed=seed,
            prompt=str(prompt), progress=False,
            rotated_channels=h3_rotated_channels(h3.model),
            extra_attrs={**meta, "model_name": h3.name,
                         "checkpoint_id": checkpoint_id(h3.source or h3.name),
                         "model_dtype": str(h3.dtype).removeprefix("torch."),
                         "sampling_grid_points": grid,
                         "h3_config": h3.config.to_dict() if h3.config else None},
            **(capture_kwargs or {}),
        )
    stats = {"replaced_calls": 0, "dense_policy_calls": 0, "captured_calls": 0}
    ran: dict[str, int] = {}  # the path each replaced call took (runner.run_attention)
    if rec is None and backend is not None:
        print(f"note: --backend {backend} does nothing with the model's own attention (--recipe "
              "native): diffusers' attention runs every call", file=sys.stderr)

    def handler(call):
        if cap_ctx is not None and cap_ctx.wants(call.step, call.layer):
            cap_ctx.record(call.name, call.q, call.k, call.v, step=call.step, layer=call.layer)
            stats["captured_calls"] += 1
        if rec is None:
            return None
        stats["replaced_calls"] += 1
        if rec.is_dense_at(call.step, call.layer):
            stats["dense_policy_calls"] += 1
        return run_attention(call.q, call.k, call.v, rec, layout=layout, step=call.step,
                             layer=call.layer, backend=backend, ran=ran)

    t0 = time.perf_counter()
    with AttentionInterceptor(h3.model, handler) as icpt:

        def on_step(i, t):
            icpt.step = i
            if cap_ctx is not None:
                cap_ctx.step(i, timestep=t)

        if cap_ctx is not None:
            with cap_ctx:
                sample = h3.sample(prompt, seed=seed, steps=grid, callback=on_step,
                                   progress=progress)
        else:
            sample = h3.sample(prompt, seed=seed, steps=grid, callback=on_step, progress=progress)
    seconds = time.perf_counter() - t0

    import diffusers

    from workbench.capture.identity import file_sha256
    from workbench.models.registry import CHECKPOINTS

    # the weights that ran: the file loaded (a fine-tuned nano keeps the name "h3-nano")
    ckpt = Path(h3.source) if h3.source else CHECKPOINTS.get(h3.name)
    cfg = {
        "model": h3.name,
        "model_config": h3.config.to_dict() if h3.config else dict(h3.model.config),
        "checkpoint_sha256": file_sha256(ckpt) if ckpt and ckpt.is_file() else None,
        "prompt": prompt,
        "prompt_class": h3.config.classes[h3.class_of(prompt)] if h3.config else None,
        "seed": seed,
        "steps": grid,
        "video_shift": h3.config.video_shift if h3.config else None,
        "audio_shift": h3.config.audio_shift if h3.config else None,
        "recipe": json.loads(rec.to_json()) if rec is not None else "native",
        "recipe_string": rec.to_string() if rec is not None else "native",
        # what was asked (the option, else the environment's default) and what ran
        "backend": None if rec is None else (backend or default_backend()),
        "attention_paths": {"kernel": ran.get("kernel", 0),
                            "reference": ran.get("reference", 0)} if rec is not None else None,
        "segment_layout": layout.to_dict(),
        "device": str(h3.device),
        "dtype": str(h3.dtype).removeprefix("torch."),
        "seconds": round(seconds, 3),
        "attention_calls": stats,
        "capture": str(capture) if capture is not None else None,
        "versions": {"torch": torch.__version__, "diffusers": diffusers.__version__,
                     "python": platform.python_version()},
    }
    return Clip(sample.video, sample.audio, sample.fps, sample.sample_rate, cfg)


# -- writing and reading clip folders ----------------------------------------------------------


def _to_uint8_frames(video: torch.Tensor, min_side: int = VIEW_MIN_SIDE):
    """[T, 3, H, W] in [0, 1] -> list of [H', W', 3] uint8, enlarged by an integer factor."""
    f = max(1, -(-min_side // min(video.shape[-2:])))
    v = video.repeat_interleave(f, -2).repeat_interleave(f, -1)
    v = (v.clamp(0, 1) * 255.0 + 0.5).to(torch.uint8).permute(0, 2, 3, 1).contiguous()
    return [fr.numpy() for fr in v]


def write_mp4(path: Path, frames: list, fps: int, audio_path: Path | None = None) -> None:
    import imageio_ffmpeg

    h, w = frames[0].shape[:2]
    writer = imageio_ffmpeg.write_frames(
        str(path), (w, h), fps=fps, codec="libx264", quality=8, macro_block_size=1,
        audio_path=str(audio_path) if audio_path else None,
        audio_codec="aac" if audio_path else None, ffmpeg_log_level="error",
    )
    writer.send(None)
    for fr in frames:
        writer.send(fr)
    writer.close()


def write_clip(clip: Clip, out: str | Path) -> Path:
    """Write video.mp4, audio.wav, clip.safetensors and config.json into `out`."""
    import soundfile as sf
    from safetensors.torch import save_file

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    wav = out / "audio.wav"
    sf.write(str(wav), clip.audio.numpy(), clip.sample_rate, subtype="FLOAT")
    save_file({"video": clip.video.contiguous(), "audio": clip.audio.contiguous()},
              str(out / "clip.safetensors"),
              metadata={"fps": str(clip.fps), "sample_rate": str(clip.sample_rate)})
    write_mp4(out / "video.mp4", _to_uint8_frames(clip.video), clip.fps, audio_path=wav)
    (out / "config.json").write_text(json.dumps(clip.config, indent=1, default=str))
    return out


def read_clip(folder: str | Path) -> Clip:
    """Read a clip folder: exact tensors from clip.safetensors, else video.mp4 + audio.wav."""
    folder = Path(folder)
    cfg_path = folder / "config.json"
    cfg = {}
    if cfg_path.exists():
        try:
            cfg = json.loads(cfg_path.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise ValueError(f"{cfg_path}: cannot be read as JSON ({exc})") from None
        if not isinstance(cfg, dict):
            raise ValueError(f"{cfg_path}: not a clip's config (a JSON {type(cfg).__name__})")
    st = folder / "clip.safetensors"
    if st.exists():
        from safetensors import safe_open
        from safetensors.torch import load_file

        try:
            with safe_open(str(st), framework="pt") as f:
                meta = f.metadata() or {}
            t = load_file(str(st))
            return Clip(t["video"], t["audio"], int(meta.get("fps", 8)),
                        int(meta.get("sample_rate", 0)), cfg)
        except Exception as exc:  # noqa: BLE001 - a damaged file (SafetensorError), a missing
            # tensor or metadata of the wrong type: name the file
            raise ValueError(f"{st}: not a readable clip ({type(exc).__name__}: {exc})") from None
    mp4, wav = folder / "video.mp4", folder / "audio.wav"
    if not mp4.exists():
        raise FileNotFoundError(f"{folder}: no clip.safetensors or video.mp4")
    import imageio.v3 as iio

    frames = torch.from_numpy(iio.imread(str(mp4)))
    video = frames.permute(0, 3, 1, 2).float() / 255.0
    try:  # the container's frame rate (a 24 fps mp4 was read as 8 fps)
        fps = float(iio.immeta(str(mp4)).get("fps") or 0)
    except Exception:  # noqa: BLE001 - no metadata plugin: the config's, else the default
        fps = 0.0
    fps = round(fps) if fps > 0 else int(cfg.get("fps", 8))
    audio, sr = torch.zeros(0), 0
    if wav.exists():
        import soundfile as sf

        a, sr = sf.read(str(wav), dtype="float32", always_2d=True)
        audio = torch.from_numpy(a.mean(axis=1))
    return Clip(video, audio, fps, int(sr), cfg)

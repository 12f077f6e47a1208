"""Model registry and the sampling loop: ``load_model(name_or_path)`` -> ``H3Model``.

Names: "h3-tiny" (random seeded weights), "h3-nano" (the embedded trained checkpoint under
``workbench/models/weights/``). A path: a ``.safetensors`` file written by the training script, or
a diffusers folder (``config.json`` + weights) loaded with ``local_files_only=True`` (no hub).

Sampling is rectified flow with H3's scheduler (diffusers' ``MiniMaxH3Scheduler``: t = 1 - sigma,
data-ward velocity, shift 12 for video and 3 for audio, one model call per step, no CFG since H3
is guidance-distilled).
"""

from __future__ import annotations

import json
import numbers
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from .codec import decode_audio, decode_video
from .h3 import CONFIGS, H3Config, PackedLayout, pack_h3_sequence, patchify_video, unpatchify_video

WEIGHTS_DIR = Path(__file__).parent / "weights"
CHECKPOINTS = {"h3-nano": WEIGHTS_DIR / "h3_nano.safetensors"}
CONFIG_KEY = "workbench_config"


@dataclass
class Sample:
    """One generated clip. video [T, 3, H, W] float32 in [0, 1]; audio [N] float32 waveform.

    video_rows / audio_rows are the final packed rows (before decoding), [1, Nv, Cv] / [1, Na, Ca].
    """

    video: torch.Tensor | None
    audio: torch.Tensor | None
    fps: int | None
    sample_rate: int | None
    video_rows: torch.Tensor
    audio_rows: torch.Tensor


def _build_transformer(config: H3Config, seed: int):
    from diffusers import MiniMaxH3Transformer3DModel

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = MiniMaxH3Transformer3DModel(**config.transformer)
    return model.eval()


def prompt_table(config: H3Config, seed: int | None = None) -> torch.Tensor:
    """Fixed per-class text embeddings [n_classes, num_text, text_dim] (seeded, unit variance)."""
    g = torch.Generator().manual_seed(1000 + (config.seed if seed is None else seed))
    c = config.clip
    return torch.randn(len(config.classes), c.num_text, c.text_dim, generator=g)


def _cast(model, dtype: torch.dtype):
    """Cast to dtype but keep H3's float32 modules (patch projections, time MLP, heads, rope).

    Casts tensor by tensor (``model.to`` would also cast the float32 modules and warn).
    """
    keep = model._keep_in_fp32_modules
    for name, t in list(model.named_parameters()) + list(model.named_buffers()):
        target = torch.float32 if any(k in name for k in keep) else dtype
        if t.is_floating_point() and t.dtype != target:
            t.data = t.data.to(target)
    return model


class H3Model:
    """A MiniMax-H3 transformer with its config, packing and sampler.

    Attributes: model (diffusers MiniMaxH3Transformer3DModel), name, config (H3Config or None for
    a bare diffusers folder), prompt_embeddings [n_classes, num_text, text_dim] or None, source:
    the checkpoint file or folder the weights were loaded from (None: built from a seed). The
    name comes from the checkpoint's config, so a fine-tuned h3-nano is still named "h3-nano":
    its weights' identity is the source's.
    """

    def __init__(self, model, name: str, config: H3Config | None, prompt_embeddings=None,
                 source: str | None = None):
        self.model = model
        self.name = name
        self.config = config
        self.prompt_embeddings = prompt_embeddings
        self.source = source
        self._layout: PackedLayout | None = None

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return self.model.transformer_blocks[0].attn.to_q.weight.dtype

    @property
    def layout(self) -> PackedLayout:
        """The packed layout of one clip (on the model's device)."""
        if self.config is None:
            raise ValueError(f"model {self.name!r}: no clip geometry (bare diffusers folder)")
        if self._layout is None:
            self._layout = self.config.clip.layout().to(self.device)
        return self._layout

    # -- prompts -----------------------------------------------------------------------------
    def class_of(self, prompt: str | int | None) -> int:
        """Map a prompt to its class: an index, or the first class name found in the text."""
        if self.config is None:
            raise ValueError(f"model {self.name!r}: no prompt classes (bare diffusers folder); "
                             "pass text_embeds")
        classes = self.config.classes
        if prompt is None:
            return 0
        if isinstance(prompt, numbers.Integral) and not isinstance(prompt, bool):
            if not 0 <= prompt < len(classes):
                raise ValueError(f"prompt class {prompt} out of range 0..{len(classes) - 1}")
            return int(prompt)
        if not isinstance(prompt, str):
            raise ValueError(f"prompt {prompt!r}: a text or a class index (an int), got "
                             f"{type(prompt).__name__}")
        # the first class named in the text, in the text's order ("a blue ball, then a red one"
        # is blue); punctuation separates words
        for word in re.findall(r"[a-z0-9]+", prompt.lower()):
            if word in classes:
                return list(classes).index(word)
        raise ValueError(
            f"prompt {prompt!r}: {self.name} knows the classes {list(classes)}; name one "
            f"(e.g. 'a {classes[0]} ball bouncing')"
        )

    def encode_prompt(self, prompt: str | int | None) -> torch.Tensor:
        """[1, num_text, text_dim] text conditioning for `prompt` (a fixed embedding per class)."""
        if self.prompt_embeddings is None:
            raise ValueError(f"model {self.name!r} has no prompt table; pass text_embeds")
        emb = self.prompt_embeddings[self.class_of(prompt)][None]
        return emb.to(self.device)

    # -- sampling ----------------------------------------------------------------------------
    def grid_points(self, steps: int | None, flag: str = "steps") -> int:
        """Sigma grid points of a run: ``steps``, or the model's default when None (0 is not
        "default": it is refused, like any count below 2)."""
        if steps is None:
            if self.config is None:
                raise ValueError(f"{flag}: model {self.name!r} has no default schedule; give one")
            return int(self.config.default_steps)
        if isinstance(steps, bool) or int(steps) != steps or steps < 2:
            raise ValueError(f"{flag}: need at least 2 sigma grid points (1 model call), got "
                             f"{steps!r}")
        return int(steps)

    def schedule_steps(self, steps: int | None, flag: str = "steps") -> int:
        """Model calls (denoising step indices 0 .. n-1) of a ``steps``-point sigma grid."""
        return self.grid_points(steps, flag) - 1

    def check_capture_steps(self, capture_steps, steps: int | None, flag: str = "steps",
                            grid_flag: str = "steps") -> None:
        """Every step to capture must be one the sampler runs; refuse before any work."""
        if capture_steps is None:
            return
        g = self.grid_points(steps, grid_flag)
        bad = sorted(int(s) for s in capture_steps if not 0 <= int(s) < g - 1)
        if bad:
            grid = f"{grid_flag} {g}" if steps is not None else f"the default {g}-point grid"
            raise ValueError(f"{flag}: {bad} outside the sampling schedule ({grid}: {g - 1} "
                             f"model calls, steps 0-{g - 2})")

    def forward_packed(self, video_rows, audio_rows, text_embeds, video_t, audio_t):
        """One transformer call on packed rows. Returns (video_velocity, audio_velocity)."""
        kwargs, _ = pack_h3_sequence(
            video_rows, audio_rows, text_embeds, self.layout, video_t=video_t, audio_t=audio_t
        )
        return self.model(**kwargs, return_dict=False)

    @torch.no_grad()
    def sample(
        self,
        prompt: str | int | None = None,
        *,
        seed: int = 0,
        steps: int | None = None,
        video_shift: float | None = None,
        audio_shift: float | None = None,
        callback: Callable[[int, float], None] | None = None,
        progress: bool = False,
        text_embeds: torch.Tensor | None = None,
    ) -> Sample:
        """Generate one clip. `steps` sigma grid points (H3 convention: steps - 1 model calls).

        callback(step_index, timestep) runs before each model call (timestep = video t, 1 = clean);
        the capture / replacement interceptor uses it to learn the step. Noise is drawn on CPU from
        `seed`, so a seed gives the same start on every device.
        """
        from diffusers.schedulers.scheduling_minimax_h3 import MiniMaxH3Scheduler

        cfg = self.config
        if cfg is None:
            raise ValueError(f"model {self.name!r}: no clip geometry (bare diffusers folder): "
                             "sample() needs a workbench checkpoint's config")
        clip = cfg.clip
        steps = self.grid_points(steps)
        text = self.encode_prompt(prompt) if text_embeds is None else text_embeds.to(self.device)
        g = torch.Generator().manual_seed(int(seed))
        noise_v = torch.randn(1, 3, clip.frames, clip.height, clip.width, generator=g)
        noise_a = torch.randn(1, clip.audio_rows, clip.audio_block, generator=g)
        dev = self.device
        xv = patchify_video(noise_v, clip.patch).to(dev)
        xa = noise_a.to(dev)
        # None: the model's shift (a given 0 is passed on, and the scheduler refuses it)
        sv = MiniMaxH3Scheduler(shift=cfg.video_shift if video_shift is None else video_shift)
        sa = MiniMaxH3Scheduler(shift=cfg.audio_shift if audio_shift is None else audio_shift)
        sv.set_timesteps(steps, device=dev)
        sa.set_timesteps(steps, device=dev)
        if len(sv.timesteps) != len(sa.timesteps):
            raise ValueError("video and audio schedules differ in length; use fewer steps")
        it = list(zip(sv.timesteps, sa.timesteps))
        if progress:
            from tqdm.auto import tqdm

            it = tqdm(it, desc=f"{self.name} sampling", unit="step")
        for i, (tv, ta) in enumerate(it):
            if callback is not None:
                callback(i, float(tv))
            vel_v, vel_a = self.forward_packed(xv, xa, text, tv, ta)
            xv = sv.step(vel_v.float(), tv, xv).prev_sample
            xa = sa.step(vel_a.float(), ta, xa).prev_sample
        xv, xa = xv.float().cpu(), xa.float().cpu()
        video = unpatchify_video(xv, clip.patch, (3, clip.frames, clip.height, clip.width))
        frames = decode_video(video)[0]
        wave = decode_audio(xa)[0].clamp(-1.0, 1.0)
        return Sample(frames, wave, clip.fps, clip.sample_rate, xv, xa)


def _load_safetensors(path: Path, device, dtype) -> H3Model:
    from safetensors import safe_open
    from safetensors.torch import load_file

    with safe_open(str(path), framework="pt") as f:
        meta = f.metadata() or {}
    if CONFIG_KEY not in meta:
        raise ValueError(f"{path}: no {CONFIG_KEY!r} metadata; not a workbench checkpoint")
    config = H3Config.from_dict(json.loads(meta[CONFIG_KEY]))
    tensors = load_file(str(path))
    prompts = tensors.pop("prompt_embeddings", None)
    state = {k.removeprefix("transformer."): v for k, v in tensors.items()}
    model = _build_transformer(config, config.seed)
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if not k.endswith("inv_freq")]
    if missing or unexpected:
        raise ValueError(f"{path}: missing keys {missing[:5]}, unexpected {unexpected[:5]}")
    model = _cast(model.float(), dtype).to(device)
    return H3Model(model, config.name, config, prompts)


def save_checkpoint(h: H3Model, path: str | Path, dtype: torch.dtype = torch.float32) -> Path:
    """Write model + config + prompt table as one safetensors file (config in the metadata)."""
    from safetensors.torch import save_file

    tensors = {f"transformer.{k}": v.detach().to(dtype).contiguous().cpu()
               for k, v in h.model.state_dict().items()}
    if h.prompt_embeddings is not None:
        tensors["prompt_embeddings"] = h.prompt_embeddings.float().contiguous().cpu()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    save_file(tensors, str(path), metadata={CONFIG_KEY: json.dumps(h.config.to_dict())})
    return path


def _read_folder_weights(path: Path) -> dict:
    """State dict of a diffusers folder: one safetensors file or a sharded index."""
    from safetensors.torch import load_file

    index = path / "diffusion_pytorch_model.safetensors.index.json"
    if index.exists():
        shards = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        state = {}
        for sh in shards:
            state.update(load_file(str(path / sh)))
        return state
    single = path / "diffusion_pytorch_model.safetensors"
    if not single.exists():
        raise FileNotFoundError(f"{path}: no diffusion_pytorch_model.safetensors (or index)")
    return load_file(str(single))


def _load_diffusers_dir(path: Path, device, dtype) -> H3Model:
    from diffusers import MiniMaxH3Transformer3DModel

    try:
        model = MiniMaxH3Transformer3DModel.from_pretrained(
            str(path), local_files_only=True, torch_dtype=dtype
        )
    except ValueError as exc:
        # Without accelerate, diffusers refuses its keep-in-fp32 path (low_cpu_mem_usage):
        # build from the local config and load the (possibly sharded) safetensors ourselves.
        if "low_cpu_mem_usage" not in str(exc):
            raise
        model = MiniMaxH3Transformer3DModel.from_config(
            MiniMaxH3Transformer3DModel.load_config(str(path), local_files_only=True)
        )
        model.load_state_dict(_read_folder_weights(path), strict=True)
    with torch.no_grad():
        # With accelerate installed, from_pretrained leaves the weights as views into the memory
        # mapped file (not 64-byte aligned): CPU matmuls then take other SIMD paths and the
        # results move in the last bits. Own, aligned copies give the same bits as a model built
        # in memory (and detach the model from the file).
        for t in list(model.parameters()) + list(model.buffers()):
            t.data = t.data.clone()
    model = _cast(model, dtype).to(device).eval()
    config, prompts = None, None
    side = path / "workbench.json"  # optional clip geometry + prompt classes saved next to it
    if side.exists():
        config = H3Config.from_dict(json.loads(side.read_text()))
        prompts = prompt_table(config)
    return H3Model(model, config.name if config else path.name, config, prompts)


def load_model(
    name_or_path: str | Path,
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
) -> H3Model:
    """Load a registered model by name or a local checkpoint; never touches the network."""
    key = str(name_or_path)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise ValueError(f"dtype: {dtype!r}; a floating torch dtype (torch.float32, "
                         "torch.bfloat16, ...)")
    if key in CHECKPOINTS:
        path = CHECKPOINTS[key]
        if not path.exists():
            raise FileNotFoundError(f"model {key!r}: checkpoint {path} is missing (train it: "
                                    "python -m workbench.models.train_h3_nano)")
        return _sourced(_load_safetensors(path, device, dtype), path)
    if key in CONFIGS:
        config = CONFIGS[key]
        model = _cast(_build_transformer(config, config.seed), dtype).to(device)
        return H3Model(model, config.name, config, prompt_table(config))
    path = Path(key)
    if path.is_file() and path.suffix == ".safetensors":
        return _sourced(_load_safetensors(path, device, dtype), path)
    if path.is_dir() and (path / "config.json").exists():
        return _sourced(_load_diffusers_dir(path, device, dtype), path)
    raise ValueError(
        f"model {key!r}: not a registered name ({sorted(set(CONFIGS) | set(CHECKPOINTS))}), "
        "a workbench .safetensors file, or a diffusers folder with config.json"
    )


def _sourced(h3: H3Model, path: Path) -> H3Model:
    h3.source = str(path)
    return h3


def list_models() -> list[str]:
    return sorted(set(CONFIGS) | set(CHECKPOINTS))

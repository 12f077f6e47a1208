"""``capture(model, path, ...)``: record live attention q/k/v into a crash-safe zarr v3 store.

Built on ``AttentionInterceptor``: the handler copies the tensors that enter attention into host
memory and returns None, so the model computes exactly what it computes without capture.

Opening never destroys data: a path holding anything but a capture store is refused
(``storefs.check_target``); ``overwrite=True`` moves the old store aside and deletes it only once
the new capture has succeeded; ``resume=True`` refuses a run whose identity differs from the
stored one (``identity.py``); the writer holds the store's lock (``lock.py``) while it writes. A
capture that fails before its first entry is complete removes what it created (and puts a replaced
store back), so the corrected command can run at once.
"""

from __future__ import annotations

import json
import os
import time
import warnings
from collections import Counter
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import torch
import zarr
from zarr.errors import ContainsGroupError
from zarr.storage import LocalStore

from workbench.layout import SegmentLayout

from .identity import check_resume_identity
from .intercept import AttentionCall, AttentionInterceptor, h3_rotated_channels, is_h3_model
from .lock import StoreLock
from .schema import (
    CHUNK_RECORD,
    ENTRIES_GROUP,
    SCHEMA_NAME,
    SCHEMA_VERSION,
    STATUS_COMPLETE,
    CaptureStoreError,
    MetadataError,
    check_schema,
    dtype_name,
    entry_path,
    library_versions,
)
from .storefs import (
    check_target,
    make_dirs,
    remove_made_dirs,
    remove_store,
    remove_store_files,
    sibling,
)
from .validate import (
    BLOCK_NAME,
    attributes_of,
    entry_problems,
    group_problems,
    load_json,
    root_problems,
)
from .writer import (
    DEFAULT_BUDGET_BYTES,
    DEFAULT_CHUNK_BYTES,
    StoreWriter,
    WriterStats,
    describe_os_error,
)


def _jsonable(obj: Any) -> Any:
    """Model configs hold tuples, dtypes, paths: make them plain JSON."""
    return json.loads(json.dumps(obj, default=str))


def model_dtype(model) -> str | None:
    """The floating dtype holding most of the model's parameters (H3 keeps a few modules fp32)."""
    params = getattr(model, "parameters", None)
    if params is None:
        return None
    count: Counter = Counter()
    for p in params():
        if p.is_floating_point():
            count[p.dtype] += p.numel()
    return dtype_name(count.most_common(1)[0][0]) if count else None


def model_metadata(model) -> dict[str, Any]:
    """model_class, model_config, model_dtype and rotated_channels for a diffusers / HF / plain
    torch model."""
    if model is None:
        return {"model_class": None, "model_config": None, "model_dtype": None,
                "rotated_channels": None}
    cls = f"{type(model).__module__}.{type(model).__qualname__}"
    cfg = getattr(model, "config", None)
    if cfg is not None and hasattr(cfg, "to_dict"):
        cfg = cfg.to_dict()
    elif cfg is not None:
        cfg = dict(cfg)
    rotated = None
    if is_h3_model(model):
        rotated = h3_rotated_channels(model)
    elif cfg and cfg.get("position_embedding_type") == "absolute":
        rotated = 0  # BERT-style models: no rotary channels at all
    return {"model_class": cls, "model_config": _jsonable(cfg), "model_dtype": model_dtype(model),
            "rotated_channels": rotated}


def _on_cuda(model) -> bool:
    params = getattr(model, "parameters", None)
    if params is None:
        return False
    return any(p.is_cuda for p in params())


def completed_entries(store: Path) -> set[str]:
    """Entry paths a resume keeps: status complete, valid attributes, every recorded chunk on disk.

    Walks the directory (like the reader); a damaged group folder (entries/ or a step) refuses the
    resume naming the file, since new entries would be written under it.
    """
    done: set[str] = set()
    base = store / ENTRIES_GROUP
    if not base.is_dir():
        return done
    for meta_dir in [base, *sorted(p for p in base.iterdir() if p.is_dir())]:
        rel = meta_dir.relative_to(store).as_posix() + "/zarr.json"
        if (meta_dir / "zarr.json").exists():
            problems = group_problems(load_json(meta_dir / "zarr.json", f"{store}/{rel}"),
                                      f"{store}/{rel}")
            if problems:
                raise MetadataError(problems[0] + "; see workbench inspect --verify")
    for step_dir in sorted(p for p in base.iterdir() if p.is_dir()):
        for entry_dir in sorted(p for p in step_dir.iterdir() if p.is_dir()):
            rel = f"{ENTRIES_GROUP}/{step_dir.name}/{entry_dir.name}"
            try:
                attrs = attributes_of(load_json(entry_dir / "zarr.json", rel))
            except MetadataError:
                continue  # rewritten by the resume
            if attrs.get("status") != STATUS_COMPLETE or entry_problems(attrs, rel, rel):
                continue
            record = attrs.get(CHUNK_RECORD) or {}
            if all((entry_dir / name / key).is_file() for name, keys in record.items()
                   for key in keys):
                done.add(rel)
    return done


class Capture:
    """Context manager returned by ``capture()``. See ``capture`` for the arguments."""

    def __init__(
        self,
        model,
        path: str | os.PathLike,
        *,
        layers: Iterable[int] | None = None,
        steps: Iterable[int] | None = None,
        heads: Sequence[int] | None = None,
        query_rows: Sequence[int] | torch.Tensor | None = None,
        layout: SegmentLayout | None = None,
        recipe=None,
        seed: int | None = None,
        prompt: str | None = None,
        rotated_channels: int | None = None,
        include_refiner: bool = False,
        budget_bytes: int = DEFAULT_BUDGET_BYTES,
        queue_size: int = 8,
        compressor: str | None = None,
        chunk_bytes: int = DEFAULT_CHUNK_BYTES,
        writer_threads: int | None = None,
        pinned_pool: bool | None = None,
        direct_writes: bool = True,
        resume: bool = False,
        overwrite: bool = False,
        progress: bool = True,
        extra_attrs: dict[str, Any] | None = None,
    ):
        self.model = model
        self.path = Path(path)
        self.layers = None if layers is None else sorted({int(x) for x in layers})
        self.steps = None if steps is None else sorted({int(x) for x in steps})
        # ascending, once each: the stored q heads and the K/V heads they read (kv_heads,
        # ascending) then pair by GQA's rule; "5,1" kept in that order paired q head 5 with K/V
        # head 1
        self.heads = None if heads is None else sorted({int(h) for h in heads})
        self._unstorable_seen: set = set()
        self._repeat_seen: set = set()
        self.query_rows = None if query_rows is None else torch.as_tensor(query_rows).long()
        if self.query_rows is not None and (self.query_rows.dim() != 1
                                            or bool((self.query_rows < 0).any())):
            raise ValueError(f"query_rows: {self.query_rows.tolist()!r}; give a list of row "
                             "indices >= 0 (a store of negative rows does not open)")
        self.layout = layout
        self.recipe = recipe
        self.seed = seed
        self.prompt = prompt
        self.rotated_channels = rotated_channels
        self.include_refiner = include_refiner
        self.resume = resume
        self.overwrite = overwrite
        if pinned_pool is None:
            # A model on the GPU: pin the host ring now, before any forward, so that no forward
            # pays for cudaHostAlloc (record()-only captures pin it at their first CUDA tensor).
            pinned_pool = _on_cuda(model)
        self._writer_kw = dict(budget_bytes=budget_bytes, queue_size=queue_size,
                               compressor=compressor, chunk_bytes=chunk_bytes, progress=progress,
                               threads=writer_threads, pinned_pool=pinned_pool,
                               direct=direct_writes)
        self.extra_attrs = extra_attrs or {}
        self.interceptor: AttentionInterceptor | None = None
        self.writer: StoreWriter | None = None
        self.root: zarr.Group | None = None
        self.skipped: list[str] = []  # entries not rewritten because a resumed store had them
        self.submitted: list[str] = []
        self._recorded: dict[tuple, str] = {}  # record(): (step, layer) and paths of this run
        self._done: set[str] = set()
        self._lock: StoreLock | None = None
        self._created = False  # this capture created the store (remove it if nothing completes)
        self._made: list[Path] = []  # directories this capture created
        self._aside: Path | None = None  # a store being replaced, kept until the capture succeeds
        self._timestep: float | None = None
        self._step: int | None = None if self.steps is None else self.steps[0]
        self._seen_steps: set[int | None] = set()  # steps the run reached (step() / record())

    # store ----------------------------------------------------------------------------------------
    def _root_attrs(self) -> dict[str, Any]:
        from workbench.recipes import get_recipe

        meta = model_metadata(self.model)
        if self.rotated_channels is not None:
            meta["rotated_channels"] = int(self.rotated_channels)
        # "native": the model's own attention (generate --recipe native), not a recipe spec.
        recipe_json = None if self.recipe is None else (
            "native" if self.recipe == "native" else get_recipe(self.recipe).to_json())
        return {
            "schema": SCHEMA_NAME,
            "schema_version": SCHEMA_VERSION,
            "capture_point": (
                "diffusers MiniMaxH3AttnProcessor: dispatch_attention_fn(q, k, v) inputs, "
                "post-QK-norm, post-RoPE, [B, S, H, D]"
                if is_h3_model(self.model) else
                "torch.nn.functional.scaled_dot_product_attention inputs, transposed from "
                "[B, H, S, D] to [B, S, H, D]"
                if self.model is not None else "explicit record() calls, [B, S, H, D]"
            ),
            "tensor_layout": "BSHD",
            **meta,
            "segment_layout": None if self.layout is None else self.layout.to_dict(),
            "recipe": recipe_json,
            "seed": self.seed,
            "prompt": self.prompt,
            "layers_requested": self.layers,
            "steps_requested": self.steps,
            "heads": self.heads,
            "query_rows": None if self.query_rows is None else self.query_rows.tolist(),
            "include_refiner": self.include_refiner,
            "library_versions": library_versions(),
            "created_unix": time.time(),
            **_jsonable(self.extra_attrs),
        }

    def _open_store(self) -> zarr.Group:
        where = str(self.path)
        kind = check_target(self.path, resume=self.resume, overwrite=self.overwrite)
        try:
            if kind == "resume":
                return self._open_for_resume()
            if kind == "replace":
                self._move_aside()
            make_dirs(self.path, self._made)
            self._lock = StoreLock(self.path).acquire()
            try:
                root = zarr.create_group(store=LocalStore(str(self.path)),
                                         attributes=self._root_attrs(), overwrite=False)
            except ContainsGroupError:
                raise CaptureStoreError(f"{where}: another capture created a store here while "
                                        f"this one was starting") from None
            # Only from here on does the folder hold files of this capture (before, a failure
            # must not touch what another writer may have put there).
            self._created = True
            return root
        except OSError as exc:
            raise describe_os_error(exc, where, "opening the store for writing") from exc

    def _open_for_resume(self) -> zarr.Group:
        where = str(self.path)
        meta = load_json(self.path / "zarr.json", f"{where}/zarr.json")
        stored = attributes_of(meta)
        check_schema(stored, where)
        problems = root_problems(meta, f"{where}/zarr.json")
        if problems:
            raise MetadataError(problems[0] + "; see workbench inspect --verify")
        self._lock = StoreLock(self.path).acquire()
        check_resume_identity(stored, self._root_attrs(), where)
        self._done = completed_entries(self.path)
        root = zarr.open_group(where, mode="r+")
        root.attrs.update({"resumed_unix": time.time(),
                           "resume_count": int(stored.get("resume_count", 0)) + 1})
        return root

    def _move_aside(self) -> None:
        """Lock the store being replaced (refusing a live writer) and rename it to a sibling."""
        old = StoreLock(self.path).acquire()
        aside = sibling(self.path, "replaced")
        try:
            os.rename(self.path, aside)
            old.moved(aside)
        finally:
            old.release()
        self._aside = aside

    @property
    def completed(self) -> set[str]:
        """Entry paths never (re)written by this capture: complete in the store when it was opened
        (resume), plus those submitted since."""
        return set(self._done)

    def __enter__(self) -> Capture:
        if self.model is not None:
            # Layers and heads are checked against the model before the store exists.
            self.interceptor = AttentionInterceptor(
                self.model, self._handle, layers=self.layers, include_refiner=self.include_refiner
            )
            self.interceptor.check_layers()
            self._check_heads()
        try:
            self.root = self._open_store()
            total = None
            if self.layers is not None and self.steps is not None:
                total = len(self.layers) * len(self.steps) - len(self._done)
            self.writer = StoreWriter(self.root, total=total, where=str(self.path),
                                      **self._writer_kw)
            if self.interceptor is not None:
                self.interceptor.step = self._step
                self.interceptor.__enter__()
        except BaseException:
            if self.writer is not None:
                self._close_quietly()
            self._finish(ok=False)
            raise
        return self

    def _check_heads(self) -> None:
        cfg = getattr(self.model, "config", None)
        H = getattr(cfg, "num_attention_heads", None) if is_h3_model(self.model) else None
        if self.heads is not None and H is not None:
            bad = [h for h in self.heads if not 0 <= h < H]
            if bad:
                raise ValueError(f"heads: {bad} out of range for a model with {H} query heads "
                                 f"(0-{H - 1})")

    def __exit__(self, exc_type, exc, tb) -> None:
        ok = False
        try:
            if self.interceptor is not None:
                self.interceptor.__exit__(exc_type, exc, tb)
        finally:
            if exc_type is None:
                try:
                    self.stats = self.writer.close()
                    self.root.attrs.update({"last_closed_unix": time.time()})
                    ok = True
                finally:
                    self._finish(ok=ok)
                self._check_steps_reached()
            else:
                self.stats = self._close_quietly()
                self._finish(ok=False)

    def _check_steps_reached(self) -> None:
        """Requested steps the run never reached (and the store does not hold) are an error, not
        a silently smaller store: e.g. steps=[49] with a 50-point grid, whose steps are 0-48."""
        if self.steps is None:
            return
        held = {p.split("/")[1] for p in self._done}
        missing = [s for s in self.steps
                   if s not in self._seen_steps and entry_path(s, "x").split("/")[1] not in held]
        if missing:
            reached = sorted(s for s in self._seen_steps if s is not None)
            ran = f"steps {reached[0]}-{reached[-1]}" if reached else "no step"
            raise CaptureStoreError(
                f"{self.path}: steps {missing} were requested (--steps) but the run never reached "
                f"them (it ran {ran}); the entries of the steps it ran are complete. Pick steps "
                f"inside the sampler's schedule"
            )

    def _finish(self, ok: bool) -> None:
        """Release the lock; on failure with no entry complete, undo what this capture created
        and put a replaced store back; after success, delete the replaced store."""
        completed = self.writer.stats.entries if self.writer is not None else 0
        undo = not ok and completed == 0
        try:
            if undo and self._created:
                # Only the store-owned names this capture wrote, while still holding the lock.
                remove_store_files(self.path, keep_lock=True)
        finally:
            if self._lock is not None:
                self._lock.release()
                self._lock = None
        if undo:
            remove_made_dirs(self._made)
            if self._aside is not None and not self.path.exists():
                os.rename(self._aside, self.path)  # the replaced store comes back untouched
                self._aside = None
        if self._aside is not None:
            if ok:
                remove_store(self._aside)
            else:
                warnings.warn(f"{self.path}: the capture failed; the store it was replacing is "
                              f"kept at {self._aside}", stacklevel=3)
            self._aside = None

    def _close_quietly(self) -> WriterStats | None:
        try:
            return self.writer.close()
        except CaptureStoreError:
            return None  # the body's own exception is the one to show


    # step -----------------------------------------------------------------------------------------
    def step(self, i: int | None, timestep: float | None = None) -> None:
        """Set the current denoising step (and optionally its timestep / sigma value)."""
        self._step = None if i is None else int(i)
        self._seen_steps.add(self._step)
        self._timestep = None if timestep is None else float(timestep)
        if self.interceptor is not None:
            self.interceptor.step = self._step

    def set_layout(self, layout: SegmentLayout) -> None:
        """Record the packed-sequence segment layout once the caller knows it."""
        self.layout = layout
        self.root.attrs.update({"segment_layout": layout.to_dict()})

    @property
    def current_step(self) -> int | None:
        return self._step

    def wants(self, step: int | None, layer: int | None) -> bool:
        if self.steps is not None and step not in self.steps:
            return False
        return not (self.layers is not None and layer is not None and layer not in self.layers)

    # recording ------------------------------------------------------------------------------------
    def _handle(self, call: AttentionCall) -> None:
        if self.wants(call.step, call.layer):
            why = _unstorable(call.q, call.k, call.v, self.query_rows)
            if why is not None:  # inside the model's forward: skip the call, say so once
                if call.name not in self._unstorable_seen:
                    self._unstorable_seen.add(call.name)
                    warnings.warn(f"capture {call.name}: not stored: {why}", stacklevel=2)
                return None
            self._submit(call.name, call.layer, call.step, call.q, call.k, call.v,
                         source=call.source, layout=call.layout, kwargs=call.kwargs)
        return None  # never replace: capture leaves the model's computation untouched

    def record(self, name: str, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, *,
               step: int | None = None, layer: int | None = None) -> bool:
        """Store q, k, v ([B, S, H, D]) under (step, name). Returns False when a resumed store
        already holds the entry complete (nothing is rewritten)."""
        step = self._step if step is None else int(step)
        why = _unstorable(q, k, v, self.query_rows)
        if why is not None:
            raise ValueError(f"capture {name}: {why}")
        if layer is None:  # an H3 block's name carries its index (the store's readers ask it)
            block = BLOCK_NAME.fullmatch(name)
            layer = int(block[1]) if block else None
        # readers find an entry by (step, layer) and store it under its path: a second record()
        # of either in this run would be dropped or shadow the first (refused, naming both)
        path = entry_path(step, name)
        for key, what in ((("path", path), f"its folder {path}"),
                          (("entry", step, layer), f"step {step} layer {layer}")):
            if key[-1] is None:
                continue
            other = self._recorded.get(key)
            if other is not None:
                raise ValueError(f"capture {name}: {what} was already recorded in this run by "
                                 f"{other!r} (names keep only letters, digits, '.', '_', '-'; "
                                 "each (step, layer) is one entry)")
        ok = self._submit(name, layer, step, q, k, v, source="record", layout="BSHD", kwargs={})
        self._recorded[("path", path)] = name
        if layer is not None:
            self._recorded[("entry", step, layer)] = name
        return ok

    def _submit(self, name, layer, step, q, k, v, *, source, layout, kwargs) -> bool:
        self._seen_steps.add(step)
        path = entry_path(step, name)
        if path in self._done:
            self.skipped.append(path)
            if path in self.submitted and path not in self._repeat_seen:
                # this run stored it already: a second call of one name in one step (a layer
                # shared across depths, two names one folder) is not stored: say so
                self._repeat_seen.add(path)
                warnings.warn(f"capture {name}: a second call stored as {path} in step {step}; "
                              "only the first is kept (a module called twice per step, or two "
                              "names that map to one folder)", stacklevel=3)
            return False
        B, S, H, D = q.shape
        Hkv = k.shape[2]
        group = H // Hkv if Hkv else 1
        q_heads, kv_heads = list(range(H)), list(range(Hkv))
        if self.heads is not None:
            bad = [h for h in self.heads if not 0 <= h < H]
            if bad:
                raise ValueError(f"capture {name}: heads {bad} out of range for {H} heads")
            q_heads = self.heads
            kv_heads = sorted({h // group for h in q_heads})
            q = q[:, :, q_heads]
            k, v = k[:, :, kv_heads], v[:, :, kv_heads]
        arrays = {"q": q, "k": k, "v": v}
        if self.query_rows is not None:
            arrays["q"] = q[:, self.query_rows.to(q.device)]
            arrays["q_rows"] = self.query_rows
        scalar_kwargs = {key: val for key, val in kwargs.items()
                         if isinstance(val, (bool, int, float, str)) or val is None}
        mask = kwargs.get("attn_mask")
        attrs = {
            "name": name,
            "layer": layer,
            "step": step,
            "timestep": self._timestep,
            "source": source,
            "layout_seen": layout,
            "torch_dtype": dtype_name(q.dtype),
            "shape_q": list(arrays["q"].shape),
            "shape_kv": list(k.shape),
            "seq_len": S,
            "num_heads": H,
            "num_kv_heads": Hkv,
            "q_heads": q_heads,
            "kv_heads": kv_heads,
            "has_query_rows": self.query_rows is not None,
            "sdpa_kwargs": scalar_kwargs,
            "attn_mask_shape": None if mask is None else list(mask.shape),
            "submitted_unix": time.time(),
        }
        self.writer.submit(path, attrs, arrays)
        self._done.add(path)
        self.submitted.append(path)
        return True


def _unstorable(q, k, v, query_rows) -> str | None:
    """Why a store could not hold this call's q, k, v ([B, S, H, D]; its readers would refuse
    the entry), or None."""
    for label, t in (("q", q), ("k", k), ("v", v)):
        if t.dim() != 4:
            return f"{label} must be [B, S, H, D], got {tuple(t.shape)}"
    if tuple(k.shape) != tuple(v.shape):
        return (f"k {tuple(k.shape)} and v {tuple(v.shape)} differ (e.g. a V head dim of its own, "
                "as in multi-head latent attention); a capture holds one head dim")
    if q.shape[0] != k.shape[0] or q.shape[3] != k.shape[3]:
        return f"q {tuple(q.shape)} and k {tuple(k.shape)} differ in batch or head dim"
    if q.shape[1] != k.shape[1]:
        return (f"q has {q.shape[1]} rows and k {k.shape[1]} (cross-attention): a capture holds "
                "self-attention")
    if not q.dtype == k.dtype == v.dtype:
        return (f"q is {q.dtype}, k {k.dtype}, v {v.dtype}: an entry holds one dtype (cast them "
                "to one first)")
    if query_rows is not None and query_rows.numel() and int(query_rows.max()) >= q.shape[1]:
        return f"query_rows reach row {int(query_rows.max())} of a {q.shape[1]}-row sequence"
    return None


def capture(model, path, layers=None, steps=None, heads=None, query_rows=None, **kwargs) -> Capture:
    """Capture live attention q/k/v of ``model`` into the zarr v3 store at ``path``.

    ::

        with capture(model, "captures/run.zarr", layers=[0, 20, 41], steps=[0, 10, 48]) as cap:
            for i, t in enumerate(timesteps):
                cap.step(i, timestep=t)
                model(...)

    layers: H3 block indices (SDPA models: call order index per forward); None = all.
    steps: denoising steps to keep; None = every step (calls with step None are stored too).
    heads: query heads to keep (K/V heads they read under GQA are kept); None = all.
    query_rows: keep only these q rows (K/V keep every row); the rows go in ``q_rows``.
    Keyword options: layout (SegmentLayout), recipe (spec of the run), seed, prompt,
    rotated_channels, include_refiner, budget_bytes (host memory bound), queue_size,
    compressor (None | "zstd[:level]"), chunk_bytes, writer_threads (chunk-writer threads),
    pinned_pool (None = pin a ring of budget_bytes at start when the model is on CUDA),
    direct_writes (False = every chunk through zarr's array write), resume, overwrite, progress,
    extra_attrs.
    ``model=None`` gives a store fed only through ``cap.record(name, q, k, v, step=...)``.
    """
    return Capture(model, path, layers=layers, steps=steps, heads=heads, query_rows=query_rows,
                   **kwargs)

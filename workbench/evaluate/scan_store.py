"""The scan store: a Zarr v3 group holding one scan's results, resumable task by task.

Layout (``open_scan`` returns it as one labelled xarray Dataset)::

    STORE.scan.zarr/
      zarr.json          attrs: workbench_scan (1; other versions refused), params, names, runs
      step, layer, head, row                       coordinates (ints; row = sampled query rows)
      entry_metrics      [step, layer, recipe, metric]        float64, NaN until written
      head_metrics       [step, layer, head, recipe, metric]  float64 (NaN: no per-head value)
      row_sq_err         [step, layer, recipe, row]           output squared error per row
      row_sq_err_head    [step, layer, head, recipe, row]     the same per head
      benefit            [step, layer, recipe, stat]          output-MSE benefit over the baseline
      head_benefit       [step, layer, head, recipe, stat]    (stat: benefit_pct, ci_lo, ci_hi)
      done               [step, layer, recipe]                uint8: 1 once the task's rows are in

Every (entry, recipe) task writes its own chunk of each array (chunks are one task wide) and then
its ``done`` chunk; zarr writes each chunk file atomically (temporary file + rename), so a killed
scan leaves whole tasks or no task, and a re-run skips the done ones. The string labels of recipe,
metric and stat live in the attributes (zarr v3 has no stable string dtype).

A damaged store is never read as if it were whole (``scan_attrs``, ``lost_task_chunks``): a
missing attribute or array, a coordinate that differs from the parameters, or a task marked done
whose chunk is missing (it would read back as NaN, the fill value) is refused by ``open_scan``
naming the store, the array and the task; a resumed scan runs such tasks again.
``--overwrite`` builds the new scan in a hidden sibling and swaps it in only once it is complete
(``swap_scan``), and never replaces a folder that holds files a scan store does not own.
"""

from __future__ import annotations

import hashlib
import json
import os
import warnings
from dataclasses import MISSING, asdict, dataclass, fields
from pathlib import Path

import numpy as np

from workbench.capture.storefs import (
    check_not_inside_store,
    remove_owned,
    rename_into_place,
    sibling,
)
from workbench.metrics import BOUNDARIES, METRICS

SCAN_MARKER = "workbench_scan"
SCAN_VERSION = 1
DRIFTS = ("drift_k_rot", "drift_k_pass", "drift_v_rot", "drift_v_pass")
# Per-entry metrics; per-head values exist for the boundary metrics only (NaN for the rest).
METRIC_NAMES = tuple(f"{b}_{m}" for b in BOUNDARIES for m in METRICS) + (
    "exact_fraction", *DRIFTS, "seconds")
STATS = ("benefit_pct", "ci_lo", "ci_hi")
BOOTSTRAP = {"n_boot": 2000, "seed": 0, "level": 0.95}  # workbench.metrics.bootstrap_benefit's
OUTPUT_MSE = "attention_output_mse"

# The store's arrays and their dimensions; a scan store owns these names and zarr.json, nothing
# else (--overwrite refuses to delete anything else).
ARRAY_DIMS = {
    "step": ("step",), "layer": ("layer",), "head": ("head",), "row": ("row",),
    "entry_metrics": ("step", "layer", "recipe", "metric"),
    "head_metrics": ("step", "layer", "head", "recipe", "metric"),
    "row_sq_err": ("step", "layer", "recipe", "row"),
    "row_sq_err_head": ("step", "layer", "head", "recipe", "row"),
    "benefit": ("step", "layer", "recipe", "stat"),
    "head_benefit": ("step", "layer", "head", "recipe", "stat"),
    "done": ("step", "layer", "recipe"),
}
COORD_PARAMS = {"step": "steps", "layer": "layers", "head": "heads", "row": "query_rows"}
TASK_ARRAYS = ("entry_metrics", "head_metrics", "row_sq_err", "row_sq_err_head")  # one chunk a task
OWNED_NAMES = ("zarr.json", *ARRAY_DIMS)
ARRAY_OWNED_NAMES = ("zarr.json", "c")  # inside each array: its metadata and its chunks
DAMAGED = "the scan store is damaged: make it again (workbench scan ... --overwrite)"


class ScanError(ValueError):
    """Bad scan input or a scan store that does not match: the message names the path / field."""


@dataclass(frozen=True)
class ScanParams:
    """What a scan computed; a resumed scan must ask for exactly the same."""

    store: str  # the capture store's path when the scan started (informative)
    store_id: str  # fingerprint of the capture store's metadata and entry list
    recipes: tuple[str, ...]  # labels, in order
    recipe_specs: tuple[str, ...]  # full JSON of each recipe
    baseline: str  # label the benefit is measured against
    steps: tuple[int, ...]
    layers: tuple[int, ...]
    heads: tuple[int, ...]  # captured query head ids
    n_queries: int
    dense_policy: bool  # recipes' dense steps / layers applied at each entry
    seq_len: int
    query_rows: tuple[int, ...]
    segment_layout: str = "{}"  # JSON of the capture's SegmentLayout
    # how the capture's attention is replayed (CaptureReader.attention_call): keys after each
    # row masked (decoder self-attention), and the softmax scale (None: 1/sqrt(D))
    causal: bool = False
    softmax_scale: float | None = None
    # where the recipes and the float64 reference ran: CPU and CUDA round differently, so a
    # resumed scan keeps its device. Stores written before this field ran on CUDA where present,
    # else on the CPU, and do not say which: "unknown", never resumed (a new scan or --overwrite)
    device: str = "unknown"

    def to_dict(self) -> dict:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, d: dict) -> ScanParams:
        return cls(**{f.name: tuple(d[f.name]) if isinstance(d[f.name], list) else d[f.name]
                      for f in fields(cls) if f.name in d})

    def mismatch(self, other: ScanParams) -> str | None:
        """The first field (other than the store's path) that differs, with both values."""
        for f in fields(self):
            if f.name == "store":
                continue
            a, b = getattr(self, f.name), getattr(other, f.name)
            if a != b:
                return f"{f.name}: the scan has {_short(a)}, asked {_short(b)}"
        return None


def _short(x) -> str:
    s = repr(list(x) if isinstance(x, tuple) else x)
    return s if len(s) <= 160 else s[:157] + "..."


def store_fingerprint(cap) -> str:
    """sha256 of a capture store's root attributes and its complete entries (path, shape,
    dtype): changes when the capture is rewritten or extended, not when it is only read."""
    entries = [(e.path, e.shape_q, e.shape_kv, e.torch_dtype) for e in cap.entries(False)]
    blob = json.dumps({"attrs": cap.attrs, "entries": entries}, sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def named_path(path: str | Path) -> Path:
    """`path`, made absolute when it has no name of its own ("." or ".."), so that a sibling
    can be named after it."""
    p = Path(path)
    return Path(os.path.abspath(p)) if p.name in ("", "..") else p


def default_scan_path(store: str | Path) -> Path:
    """STORE.zarr -> STORE.scan.zarr, next to the capture."""
    p = named_path(store)
    return p.with_name(p.name.removesuffix(".zarr").rstrip("/") + ".scan.zarr")


def is_scan_store(path: str | Path) -> bool:
    meta = Path(path) / "zarr.json"
    if not meta.is_file():
        return False
    try:
        attrs = json.loads(meta.read_text()).get("attributes")
    except (OSError, ValueError, AttributeError):
        return False
    return isinstance(attrs, dict) and SCAN_MARKER in attrs


def foreign_names(path: Path, limit: int = 5) -> list[str]:
    """Entries of the scan store at ``path`` that a scan store does not own: top-level names
    other than its arrays and zarr.json, and names inside an array other than its metadata and
    chunks (at most ``limit``)."""
    out = []
    for p in sorted(path.iterdir()):
        if p.name not in OWNED_NAMES:
            out.append(p.name + ("/" if p.is_dir() else ""))
        elif p.is_dir() and not p.is_symlink():
            out += [f"{p.name}/{q.name}" for q in sorted(p.iterdir())
                    if q.name not in ARRAY_OWNED_NAMES]
    return out[:limit]


def interrupted_swap(out: Path) -> list[Path]:
    """What a ``scan --overwrite`` interrupted between its two renames leaves beside a missing
    ``out``: the finished new scan (``.NAME.overwrite``) and the old one (``.NAME.replaced-*``)."""
    p = Path(os.path.abspath(out))
    if not p.parent.is_dir():
        return []
    return sorted(x for x in (p.parent / f".{p.name}.overwrite",
                              *p.parent.glob(f".{p.name}.replaced-*"))
                  if x.is_dir() and is_scan_store(x))


def check_out_path(out: Path, capture: Path, overwrite: bool = False) -> None:
    """Refuse an output inside (or equal to) the capture store or any other zarr store, a
    non-scan directory, and for --overwrite a symbolic link or a scan folder holding other
    files (they would go with it)."""
    o, c = out.resolve(), capture.resolve()
    if o == c or c in o.parents:
        raise ScanError(f"--out: {out} is inside the capture store {capture}; a scan never "
                        "writes into a capture (choose a path outside it)")
    if out.is_symlink() and (overwrite or not out.exists()):
        # a swap would replace the link, not the scan it points to
        raise ScanError(f"--out: {out} is a symbolic link (to {os.readlink(out)}); give the "
                        "scan store's real path")
    check_not_inside_store(out, "--out")
    if not out.exists():
        left = interrupted_swap(out)
        if left:
            raise ScanError(f"--out: {out} is missing, and an interrupted --overwrite left "
                            f"{' and '.join(map(str, left))} beside it: rename the scan you "
                            f"want to keep to {out.name}, or remove them")
    if out.exists() and not is_scan_store(out):
        # a scan store whose root metadata is damaged (unreadable as a JSON object; its own
        # names only) may be replaced; a readable zarr.json without the scan marker is another
        # tool's zarr group, never replaced
        meta = out / "zarr.json"
        damaged = meta.is_file() and _unreadable_json_object(meta) and not foreign_names(out)
        other = meta.is_file() and not _unreadable_json_object(meta)
        if not (overwrite and damaged):
            raise ScanError(f"--out: {out} exists and is not a scan store"
                            + (f" (a zarr group of another kind: {meta} has no "
                               f"{SCAN_MARKER!r} attribute)" if other else "")
                            + ("" if not damaged else " (its zarr.json is damaged: pass "
                               "--overwrite to replace it)") + "; choose another path")
    if overwrite and out.exists():
        foreign = foreign_names(out)
        if foreign:
            raise ScanError(f"--out: {out} also holds files that are not part of the scan store "
                            f"({', '.join(foreign)}); --overwrite would delete them: move them "
                            "out first")


def _unreadable_json_object(path: Path) -> bool:
    """Whether ``path`` cannot be read as a JSON object (cut short, not UTF-8, not JSON)."""
    try:
        return not isinstance(json.loads(path.read_text(encoding="utf-8")), dict)
    except (OSError, ValueError):
        return True


def remove_scan(path: Path) -> None:
    """Delete the names a scan store owns at ``path``, then the folder if nothing else is left
    (never a whole tree blindly)."""
    remove_owned(path, OWNED_NAMES)
    try:
        path.rmdir()
    except OSError:
        pass  # something else lives there: keep it


def swap_scan(new: Path, old: Path) -> None:
    """Put the complete scan ``new`` in the place of the scan ``old`` (both on one filesystem:
    renames), then delete the old one. If the second rename fails the old scan goes back."""
    aside = sibling(old, "replaced")
    os.rename(old, aside)
    rename_into_place(new, old, aside)
    remove_scan(aside)
    if aside.exists():
        warnings.warn(f"{old}: replaced; the old scan's folder {aside} still holds other files "
                      "and was kept", stacklevel=2)


# -- checking a stored scan ---------------------------------------------------------------------
def _sizes(attrs: dict) -> dict[str, int]:
    p, names = attrs["params"], attrs["names"]
    return {"step": len(p["steps"]), "layer": len(p["layers"]), "head": len(p["heads"]),
            "recipe": len(p["recipes"]), "row": len(p["query_rows"]),
            "metric": len(names["metric"]), "stat": len(names["stat"])}


def _read_json(path: Path, where: str):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise ScanError(f"{where}: cannot be read as JSON ({exc}); {DAMAGED}") from None


def scan_attrs(path: Path) -> dict:
    """The root attributes of the scan store at ``path``, after checking that its parameters,
    labels and every array's metadata are there with the shapes the parameters give; a
    ScanError names the store and the missing or wrong field / array otherwise."""
    where = f"{path}/zarr.json"
    meta = _read_json(path / "zarr.json", where)
    attrs = meta.get("attributes") if isinstance(meta, dict) else None
    if not isinstance(attrs, dict) or SCAN_MARKER not in attrs:
        raise ScanError(f"{path}: not a scan store (no {SCAN_MARKER!r} attribute)")
    version = attrs[SCAN_MARKER]
    if type(version) is not int or version != SCAN_VERSION:
        # Another layout (a newer release's, or a hand edit) would be read by this one's rules.
        raise ScanError(f"{where}: {SCAN_MARKER} is {version!r}, this workbench reads version "
                        f"{SCAN_VERSION} only; run the scan again with this release, or open it "
                        "with the release that wrote it")
    for key in ("params", "names"):
        if not isinstance(attrs.get(key), dict):
            raise ScanError(f"{where}: the attribute {key!r} is missing; {DAMAGED}")
    need = [f.name for f in fields(ScanParams) if f.default is MISSING]
    missing = [k for k in need if k not in attrs["params"]]
    if missing:
        raise ScanError(f"{where}: params has no {missing[0]!r}; {DAMAGED}")
    for key in ("recipe", "metric", "stat"):
        if not isinstance(attrs["names"].get(key), list):
            raise ScanError(f"{where}: names has no {key!r} list; {DAMAGED}")
    if attrs["names"]["recipe"] != list(attrs["params"]["recipes"]):
        raise ScanError(f"{where}: names.recipe differs from params.recipes; {DAMAGED}")
    sizes = _sizes(attrs)
    for name, dims in ARRAY_DIMS.items():
        if not (path / name / "zarr.json").is_file():
            raise ScanError(f"{path}: the array {name!r} is missing (no {name}/zarr.json); "
                            f"{DAMAGED}")
        shape = _read_json(path / name / "zarr.json", f"{path}/{name}/zarr.json").get("shape")
        if shape != [sizes[d] for d in dims]:
            raise ScanError(f"{path}/{name}: shape {shape}, the scan's parameters give "
                            f"{[sizes[d] for d in dims]}; {DAMAGED}")
    return attrs


def check_coords(path: Path, values: dict, params: dict) -> None:
    """The coordinate arrays must hold the parameters' values (a deleted chunk reads as 0)."""
    for name, key in COORD_PARAMS.items():
        have = [int(x) for x in values[name]]
        if have != [int(x) for x in params[key]]:
            raise ScanError(f"{path}/{name}: holds {_short(have)}, the scan's params.{key} is "
                            f"{_short(list(params[key]))}; {DAMAGED}")


def benefit_gaps(values: dict, params: dict) -> list[tuple[str, int, int, int]]:
    """(array, si, li, ri) where a benefit interval is NaN though both recipes' rows are
    numbers (``bootstrap_many`` gives NaN only where a row is not): a lost benefit chunk."""
    bi = list(params["recipes"]).index(params["baseline"])
    done = np.asarray(values["done"]).astype(bool)
    done = done & done[:, :, bi:bi + 1]
    out = []
    for name, rows_name in (("benefit", "row_sq_err"), ("head_benefit", "row_sq_err_head")):
        rows = np.asarray(values[rows_name])
        ok = np.isfinite(rows).all(-1) & np.isfinite(rows[..., bi:bi + 1, :]).all(-1)
        lost = ok & np.isnan(np.asarray(values[name])[..., 1])  # ci_lo
        if lost.ndim == 4:
            lost = lost.any(2)  # [S, L, H, R] -> [S, L, R]
        out += [(name, int(si), int(li), int(ri)) for si, li, ri in zip(*np.nonzero(lost & done))]
    return out


def describe_gaps(gaps: list, params: dict, limit: int = 3) -> str:
    """'N task(s) marked done have no stored values: ARRAY at step S, layer L, recipe 'R', ...'"""
    tasks = sorted({g[1:] for g in gaps})
    shown = [f"{name} at step {params['steps'][si]}, layer {params['layers'][li]}, recipe "
             f"{params['recipes'][ri]!r}" for name, si, li, ri in gaps[:limit]]
    more = f" (+{len(gaps) - limit} more)" if len(gaps) > limit else ""
    return (f"{len(tasks)} task(s) marked done have no stored values: {'; '.join(shown)}"
            f"{more}")


def unreadable_chunks(arr) -> list[tuple[tuple[int, ...], str]]:
    """(chunk index, error) of every chunk of zarr array `arr` that cannot be read back (a
    corrupt chunk file), read chunk by chunk: for naming what broke once a read failed."""
    import itertools

    grid = [range(-(-size // chunk)) for size, chunk in zip(arr.shape, arr.chunks)]
    bad = []
    for idx in itertools.product(*grid):
        sel = tuple(slice(i * c, min((i + 1) * c, n))
                    for i, c, n in zip(idx, arr.chunks, arr.shape))
        try:
            arr[sel]
        except Exception as exc:
            bad.append((idx, str(exc) or type(exc).__name__))
    return bad


def describe_unreadable(path: Path, name: str, bad: list, params: dict, limit: int = 3) -> str:
    """What ``unreadable_chunks`` found in array `name`, by task where the array has one chunk
    a task (ARRAY at step S, layer L, recipe 'R'), with each chunk file and what to do."""
    dims = ARRAY_DIMS.get(name, ())
    labels = {"step": params.get("steps"), "layer": params.get("layers"),
              "recipe": params.get("recipes")}
    shown = []
    for idx, err in bad[:limit]:
        at = [f"{d} {labels[d][i]!r}" if d == "recipe" else f"{d} {labels[d][i]}"
              for d, i in zip(dims, idx) if labels.get(d) is not None and i < len(labels[d])]
        where = f" at {', '.join(at)}" if at and name in TASK_ARRAYS else ""
        chunk = path / name / "c" / Path(*map(str, idx))
        shown.append(f"{name}{where} cannot be read ({err}): chunk file {chunk}")
    more = f" (+{len(bad) - limit} more)" if len(bad) > limit else ""
    if name in COORD_PARAMS:
        fix = "make the scan again (workbench scan ... --overwrite)"
    else:  # a task's values, done flags or benefits: a run writes them again
        fix = ("delete the chunk file(s) named and run the same workbench scan again (it "
               "re-runs those tasks and recomputes the benefits), or make it again with "
               "--overwrite")
    return f"{'; '.join(shown)}{more}; the scan store is damaged: {fix}"


def unreadable_error(path: Path, arr, name: str, params: dict, exc: Exception) -> ScanError:
    """The ScanError for a failed read of array `name` (zarr array `arr`): its corrupt chunks
    located (``unreadable_chunks``) and named (``describe_unreadable``)."""
    bad = unreadable_chunks(arr) or [((), str(exc))]
    return ScanError(f"{path}: {describe_unreadable(path, name, bad, params)}")


def read_array(path: Path, arrays, name: str, params: dict) -> np.ndarray:
    """All of array `name` (of the group or dict `arrays`) as numpy; a corrupt chunk raises
    ScanError naming the array, the task and the chunk file (``unreadable_error``)."""
    try:
        return np.asarray(arrays[name][...])
    except Exception as exc:
        raise unreadable_error(path, arrays[name], name, params, exc) from exc


def _chunk_keys(array_dir: Path) -> set[tuple[int, ...]]:
    """The chunk indices with a chunk file under ``array_dir/c`` (zarr's default chunk keys)."""
    root = array_dir / "c"
    keys = set()
    for d, _, files in os.walk(root):
        rel = Path(d).relative_to(root).parts
        for f in files:
            if f.isdigit() and all(x.isdigit() for x in rel):
                keys.add(tuple(int(x) for x in (*rel, f)))
    return keys


def lost_task_chunks(path: Path, done: np.ndarray,
                     output_mse) -> list[tuple[str, int, int, int]]:
    """(array, si, li, ri) of each task marked done (``done`` [S, L, R]) whose chunk of that
    array is missing (one chunk per task and array), found by listing the chunk files: a lost
    chunk would read back as NaN, the fill value.

    A task that ran always stores numbers in its entry_metrics chunk (its seconds at least). zarr
    writes no file for a chunk that is all fill value, so the per-head and per-row chunks of a
    recipe whose output error is not a number have none: a missing one counts as lost only where
    ``output_mse(si, li, ri)`` (read for those tasks only) is a number."""
    head = {"head_metrics", "row_sq_err_head"}
    present = {name: _chunk_keys(path / name) for name in TASK_ARRAYS}
    gaps = []
    for si, li, ri in zip(*np.nonzero(done)):
        si, li, ri = int(si), int(li), int(ri)
        if (si, li, ri, 0) not in present["entry_metrics"]:
            gaps.append(("entry_metrics", si, li, ri))
            continue
        lost = [name for name in TASK_ARRAYS[1:] if
                ((si, li, 0, ri, 0) if name in head else (si, li, ri, 0)) not in present[name]]
        if lost and np.isnan(output_mse(si, li, ri)):
            lost = []  # not a number: its other chunks hold only the fill value
        gaps += [(name, si, li, ri) for name in lost]
    return gaps


def _output_mse(metric_names: list, entry_at):
    """output_mse(si, li, ri) for ``lost_task_chunks`` from ``entry_at(si, li, ri, m)`` (NaN
    where the scan has no output error metric)."""
    if OUTPUT_MSE not in metric_names:
        return lambda si, li, ri: float("nan")
    m = metric_names.index(OUTPUT_MSE)
    return lambda si, li, ri: float(entry_at(si, li, ri, m))


class ScanStore:
    """The scan store opened for writing by one process (the scan's client).

    An existing store is resumed when its parameters match; tasks marked done whose values are
    missing (``damaged``) are not counted as done, so the scan runs them again."""

    def __init__(self, path: Path, params: ScanParams):
        import zarr

        self.path = Path(path)
        self.params = params
        self.damaged: list[tuple[str, int, int, int]] = []
        existed = self.path.exists()
        if existed:
            attrs = scan_attrs(self.path)
            stored = ScanParams.from_dict(attrs["params"])
            why = stored.mismatch(params)
            if why:
                raise ScanError(f"{self.path}: cannot resume a scan with different parameters "
                                f"({why}); use --out for a new scan or --overwrite")
            self.root = zarr.open_group(str(self.path), mode="r+")
        else:
            self.root = self._create()
        self.arrays = {name: self.root[name] for name in
                       ("entry_metrics", "head_metrics", "row_sq_err", "row_sq_err_head", "done",
                        "benefit", "head_benefit")}
        self._done = read_array(self.path, self.arrays, "done", attrs["params"] if existed
                                else params.to_dict()).astype(bool)
        if existed:
            # the benefits are not read: every run writes them again at its end; lost task
            # chunks are found by their chunk files here, before any task runs (reading them all
            # made a resume several times slower; listed, a resume of a finished scan of the
            # shipped capture takes 0.61-0.72 s, as before the check: 0.61-0.71 s, 2026-12-02).
            # A corrupt chunk (present, not decodable) is named when the run's end reads the
            # task arrays (``scan.finish_benefits``: 0.06 s for the 108 tasks of a 3-recipe
            # scan of the shipped capture, 2026-12-02)
            values = {name: read_array(self.path, self.root, name, attrs["params"])
                      for name in COORD_PARAMS}
            check_coords(self.path, values, attrs["params"])
            entry = self.arrays["entry_metrics"]

            def entry_at(*idx):
                try:
                    return entry[idx]
                except Exception as exc:  # a corrupt chunk: name the array, task and file
                    raise unreadable_error(self.path, entry, "entry_metrics", attrs["params"],
                                           exc) from exc

            self.damaged = lost_task_chunks(
                self.path, self._done, _output_mse(list(attrs["names"]["metric"]), entry_at))
            for _, si, li, ri in self.damaged:
                self._done[si, li, ri] = False

    def _create(self):
        import zarr

        p = self.params
        S, L, H, R, M, N, T = (len(p.steps), len(p.layers), len(p.heads), len(p.recipes),
                               len(METRIC_NAMES), len(p.query_rows), len(STATS))
        root = zarr.open_group(str(self.path), mode="w", attributes={
            SCAN_MARKER: SCAN_VERSION,
            "params": p.to_dict(),
            "names": {"recipe": list(p.recipes), "metric": list(METRIC_NAMES),
                      "stat": list(STATS)},
            "bootstrap": BOOTSTRAP,
            "runs": [],
        })
        for name, values in (("step", p.steps), ("layer", p.layers), ("head", p.heads),
                             ("row", p.query_rows)):
            a = root.create_array(name, shape=(len(values),), dtype="int64",
                                  dimension_names=(name,))
            a[:] = np.asarray(values, dtype=np.int64)
        specs = {
            "entry_metrics": (("step", "layer", "recipe", "metric"), (S, L, R, M), (1, 1, 1, M)),
            "head_metrics": (("step", "layer", "head", "recipe", "metric"), (S, L, H, R, M),
                             (1, 1, H, 1, M)),
            "row_sq_err": (("step", "layer", "recipe", "row"), (S, L, R, N), (1, 1, 1, N)),
            "row_sq_err_head": (("step", "layer", "head", "recipe", "row"), (S, L, H, R, N),
                                (1, 1, H, 1, N)),
            "benefit": (("step", "layer", "recipe", "stat"), (S, L, R, T), (1, L, R, T)),
            "head_benefit": (("step", "layer", "head", "recipe", "stat"), (S, L, H, R, T),
                             (1, L, H, R, T)),
        }
        for name, (dims, shape, chunks) in specs.items():
            root.create_array(name, shape=shape, chunks=chunks, dtype="float64",
                              fill_value=np.nan, dimension_names=dims)
        root.create_array("done", shape=(S, L, R), chunks=(1, 1, 1), dtype="uint8",
                          fill_value=0, dimension_names=("step", "layer", "recipe"))
        return root

    def done_mask(self) -> np.ndarray:
        """Tasks done with their values stored (a damaged task counts as not done)."""
        return self._done.copy()

    def write_task(self, si: int, li: int, ri: int, rec: dict) -> None:
        """One task's numbers, then its done marker (after the data, so a kill between the two
        leaves the task undone and it is recomputed)."""
        a = self.arrays
        a["entry_metrics"][si, li, ri, :] = rec["entry"]
        a["head_metrics"][si, li, :, ri, :] = rec["head"]
        a["row_sq_err"][si, li, ri, :] = rec["row"]
        a["row_sq_err_head"][si, li, :, ri, :] = rec["row_head"]
        a["done"][si, li, ri] = 1

    def write_benefits(self, benefit: np.ndarray, head_benefit: np.ndarray) -> None:
        self.arrays["benefit"][...] = benefit
        self.arrays["head_benefit"][...] = head_benefit

    def add_run(self, run: dict) -> None:
        runs = list(self.root.attrs.get("runs", []))
        runs.append(run)
        self.root.attrs["runs"] = runs


def open_scan(path: str | Path):
    """The scan store at `path` as an xarray Dataset with string labels on recipe, metric, stat.

    Dims: step, layer, head, recipe, metric, stat, row. Variables: entry_metrics, head_metrics,
    benefit, head_benefit, row_sq_err, row_sq_err_head, done (bool). attrs: params (dict), runs.
    Values are loaded (a scan is small next to the capture it summarises). A damaged store
    (missing attribute or array, lost values of a done task) is refused naming what is missing.
    """
    import xarray as xr

    path = Path(path)
    if not is_scan_store(path):
        raise FileNotFoundError(f"{path}: not a scan store (no {SCAN_MARKER!r} attribute); make "
                                "one with `workbench scan STORE --recipes ...`")
    attrs = scan_attrs(path)
    try:
        ds = xr.open_zarr(str(path), consolidated=False, decode_times=False).load()
    except Exception as exc:  # a corrupt chunk: name the array, the task and the chunk file
        import zarr

        root = zarr.open_group(str(path), mode="r")
        for name in ARRAY_DIMS:
            if name in root:
                read_array(path, root, name, attrs["params"])
        raise ScanError(f"{path}: cannot be read ({exc}); {DAMAGED}") from exc
    values = {name: ds[name].values for name in ARRAY_DIMS}
    params = attrs["params"]
    check_coords(path, values, params)
    entry = values["entry_metrics"]
    gaps = lost_task_chunks(path, np.asarray(values["done"]).astype(bool),
                            _output_mse(list(attrs["names"]["metric"]),
                                        lambda *idx: entry[idx]))
    if gaps:
        raise ScanError(f"{path}: {describe_gaps(gaps, params)}; the store is damaged: run the "
                        "same workbench scan again (it re-runs those tasks)")
    # benefits are computed after the last task of a run: only a finished run vouches for them
    gaps = benefit_gaps(values, params) if attrs.get("runs") else []
    if gaps:
        raise ScanError(f"{path}: {gaps[0][0]} has no interval at step "
                        f"{params['steps'][gaps[0][1]]}, layer {params['layers'][gaps[0][2]]}, "
                        f"recipe {params['recipes'][gaps[0][3]]!r} though its rows are stored; "
                        "the store is damaged: run the same workbench scan again (it "
                        "recomputes the benefits)")
    names = attrs["names"]
    ds = ds.assign_coords(recipe=list(names["recipe"]), metric=list(names["metric"]),
                          stat=list(names["stat"]))
    ds["done"] = ds["done"].astype(bool)
    ds = ds.assign_coords(recipe_spec=("recipe", list(params["recipe_specs"])))
    ds.attrs["path"] = str(path)
    return ds

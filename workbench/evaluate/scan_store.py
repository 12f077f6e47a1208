"""The scan store: a Zarr v3 group holding one scan's results, resumable task by task.

Layout (``open_scan`` returns it as one labelled xarray Dataset)::

    STORE.scan.zarr/
      zarr.json          attrs: workbench_scan (version), params (ScanParams), names, runs
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
"""

from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import numpy as np

from workbench.metrics import BOUNDARIES, METRICS

SCAN_MARKER = "workbench_scan"
SCAN_VERSION = 1
DRIFTS = ("drift_k_rot", "drift_k_pass", "drift_v_rot", "drift_v_pass")
# Per-entry metrics; per-head values exist for the boundary metrics only (NaN for the rest).
METRIC_NAMES = tuple(f"{b}_{m}" for b in BOUNDARIES for m in METRICS) + (
    "exact_fraction", *DRIFTS, "seconds")
STATS = ("benefit_pct", "ci_lo", "ci_hi")
BOOTSTRAP = {"n_boot": 2000, "seed": 0, "level": 0.95}  # workbench.metrics.bootstrap_benefit's


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


def default_scan_path(store: str | Path) -> Path:
    """STORE.zarr -> STORE.scan.zarr, next to the capture."""
    p = Path(store)
    return p.with_name(p.name.removesuffix(".zarr").rstrip("/") + ".scan.zarr")


def is_scan_store(path: str | Path) -> bool:
    meta = Path(path) / "zarr.json"
    if not meta.is_file():
        return False
    try:
        return SCAN_MARKER in json.loads(meta.read_text()).get("attributes", {})
    except (OSError, ValueError):
        return False


def check_out_path(out: Path, capture: Path) -> None:
    """Refuse an output inside (or equal to) the capture store, or a non-scan directory."""
    o, c = out.resolve(), capture.resolve()
    if o == c or c in o.parents:
        raise ScanError(f"--out: {out} is inside the capture store {capture}; a scan never "
                        "writes into a capture (choose a path outside it)")
    if out.exists() and not is_scan_store(out):
        raise ScanError(f"--out: {out} exists and is not a scan store; choose another path")


class ScanStore:
    """The scan store opened for writing by one process (the scan's client)."""

    def __init__(self, path: Path, params: ScanParams, *, overwrite: bool = False):
        import zarr

        self.path = Path(path)
        self.params = params
        if self.path.exists() and overwrite:
            if not is_scan_store(self.path):
                raise ScanError(f"--out: {self.path} is not a scan store; not removing it")
            shutil.rmtree(self.path)
        if self.path.exists():
            self.root = zarr.open_group(str(self.path), mode="r+")
            stored = ScanParams.from_dict(self.root.attrs["params"])
            why = stored.mismatch(params)
            if why:
                raise ScanError(f"{self.path}: cannot resume a scan with different parameters "
                                f"({why}); use --out for a new scan or --overwrite")
        else:
            self.root = self._create()
        self.arrays = {name: self.root[name] for name in
                       ("entry_metrics", "head_metrics", "row_sq_err", "row_sq_err_head", "done",
                        "benefit", "head_benefit")}

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
        return np.asarray(self.arrays["done"][...], dtype=bool)

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
    Values are loaded (a scan is small next to the capture it summarises).
    """
    import xarray as xr

    path = Path(path)
    if not is_scan_store(path):
        raise FileNotFoundError(f"{path}: not a scan store (no {SCAN_MARKER!r} attribute); make "
                                "one with `workbench scan STORE --recipes ...`")
    ds = xr.open_zarr(str(path), consolidated=False, decode_times=False).load()
    names = ds.attrs["names"]
    ds = ds.assign_coords(recipe=list(names["recipe"]), metric=list(names["metric"]),
                          stat=list(names["stat"]))
    ds["done"] = ds["done"].astype(bool)
    params = ds.attrs["params"]
    ds = ds.assign_coords(recipe_spec=("recipe", list(params["recipe_specs"])))
    ds.attrs["path"] = str(path)
    return ds

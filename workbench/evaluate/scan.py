"""Sensitivity scan: every (step, layer) entry of a capture x every recipe, as dask tasks.

``run_scan(store, recipes, ...)`` builds one dask graph: per entry, the q/k/v chunks are read
through the capture's lazy xarray view (``CaptureReader.to_xarray(decode=True)``); per (entry,
recipe), one task runs ``evaluate_entry`` on that entry and returns a flat record of numbers. The
graph runs on a ``dask.distributed`` cluster (a LocalCluster of single-threaded worker processes
by default, or an existing scheduler), and the client writes each finished task into the scan
store (``scan_store``) as it arrives, so an interrupted scan resumes where it stopped. When every
task is in, the paired-bootstrap interval of each recipe's output-MSE benefit over the baseline is
computed from the stored per-row errors. ``open_scan`` reads the result back as one Dataset.

``device``: where the recipes and the float64 reference run ("cpu" / "cuda"; "auto" = CUDA when
present). ``scheduler``: None = a new LocalCluster (``workers`` processes, default one per core
for a CPU scan, one per GPU for a CUDA scan, each worker pinned to its own GPU); "synchronous" =
dask's in-process scheduler (debugging, small scans, notebooks); anything else = the address of
a running scheduler (its workers must see the capture store's path). ``client``: a distributed
Client to use as is (tests share one).
"""

from __future__ import annotations

import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from workbench.metrics import BOUNDARIES, METRICS

from .scan_store import (
    BOOTSTRAP,
    METRIC_NAMES,
    STATS,
    ScanError,
    ScanParams,
    ScanStore,
    check_out_path,
    default_scan_path,
    describe_gaps,
    foreign_names,
    is_scan_store,
    named_path,
    open_scan,
    read_array,
    remove_scan,
    scan_attrs,
    store_fingerprint,
    swap_scan,
)

_METRIC_INDEX = {m: i for i, m in enumerate(METRIC_NAMES)}


# -- recipes -------------------------------------------------------------------------------------
def resolve_recipes(specs) -> tuple[list[str], list[str]]:
    """(labels, full JSON specs). Labels are the specs as given (stripped); a spec given twice, or
    two specs that are the same recipe, is refused naming both."""
    from workbench.recipes import get_recipe, split_recipe_list

    if isinstance(specs, str):
        specs = split_recipe_list(specs)
    from workbench.recipes import AttentionRecipe

    labels, jsons, numerics = [], [], []
    for s in specs:
        label = s if isinstance(s, str) else s.to_string()
        label = label.strip()
        try:
            r = get_recipe(s)
        except ValueError as exc:
            raise ScanError(f"--recipes: {label!r}: {exc}") from None
        j = r.to_json()
        # the same numerics under another name or notes is the same recipe (== says so too)
        key = r.numerics_key() if isinstance(r, AttentionRecipe) else j
        if key in numerics:
            raise ScanError(f"--recipes: {label!r} is the same recipe as "
                            f"{labels[numerics.index(key)]!r}")
        labels.append(label)
        jsons.append(j)
        numerics.append(key)
    if not labels:
        raise ScanError("--recipes: give at least one recipe")
    return labels, jsons


# -- the task (runs on a worker) -----------------------------------------------------------------
_ENTRY_TENSORS: dict = {}  # worker-side: (store id, step, layer) -> tensors, so the float64
_ENTRY_CACHE_SIZE = 4  # reference of evaluate() is reused by the next recipe on the same entry


class _EntrySource:
    """A one-entry source for ``evaluate_entry``: q [B, S, H, D], k/v [B, S, Hkv, D] float32."""

    def __init__(self, q, k, v, heads, layout, rotated, causal=False, scale=None):
        from .source import ReplaySource

        self._src = ReplaySource(tensors=(q, k, v), layout=layout, rotated=rotated,
                                 device=str(q.device), causal=causal, scale=scale)
        self._src.heads = list(heads)
        self.heads, self.layout, self.rotated = list(heads), layout, rotated
        self.causal, self.scale = bool(causal), scale  # read by evaluate_entry

    def qkv(self, step, layer, heads=None):
        return self._src.qkv(0, 0, heads)


def _entry_tensors(key, q, k, v, device):
    if key not in _ENTRY_TENSORS:
        if len(_ENTRY_TENSORS) >= _ENTRY_CACHE_SIZE:
            _ENTRY_TENSORS.pop(next(iter(_ENTRY_TENSORS)))
        _ENTRY_TENSORS[key] = tuple(torch.from_numpy(np.ascontiguousarray(a)).to(device)
                                    for a in (q, k, v))
    return _ENTRY_TENSORS[key]


def scan_task(qkv, *, store_id, step, layer, captured_heads, heads, spec, layout,
              rotated, n_queries, dense_policy, causal=False, scale=None,
              device=None) -> dict:
    """evaluate_entry of one recipe on one entry -> a flat record of numbers.

    qkv: numpy float32 q [B, S, H, D], k, v [B, S, Hkv, D] as read through the capture's xarray
    view (captured_heads: the head ids they hold); heads: the query head ids to evaluate. A plan
    is resolved at (step, layer). causal / scale: how the capture's model attends (the store's
    ``attention_call``), in the recipes and in the float64 reference. Returns {"entry": [M],
    "head": [H, M], "row": [n], "row_head": [H, n], "query_rows": [n]}.
    """
    from workbench.attention import SegmentLayout
    from .engine import evaluate_entry, per_query_head
    from .source import default_device

    device = device or default_device()
    t0 = time.perf_counter()
    tq, tk, tv = _entry_tensors((store_id, step, layer, tuple(captured_heads), device), *qkv,
                                device)
    src = _EntrySource(tq, tk, tv, captured_heads, SegmentLayout.from_dict(layout), rotated,
                       causal, scale)
    # a plan runs its recipe of this entry (evaluate_entry resolves it), its dense policy only
    # with dense_policy, as a recipe's
    c = evaluate_entry(src, step, layer, {"r": spec}, heads=list(heads), n_queries=n_queries,
                       dense_policy=dense_policy)
    e = c.evals["r"]
    entry = np.full(len(METRIC_NAMES), np.nan)
    head = np.full((len(heads), len(METRIC_NAMES)), np.nan)
    for b in BOUNDARIES:
        for m in METRICS:
            i = _METRIC_INDEX[f"{b}_{m}"]
            entry[i] = e.overall[b][m]
            head[:, i] = per_query_head(e.heads[b][m], len(heads))
    entry[_METRIC_INDEX["exact_fraction"]] = e.exact_fraction
    for key, val in e.drift_summary.items():
        # channel groups the store's rotated count leaves empty (or "all": split unknown) have
        # no slot and stay NaN
        if f"drift_{key}" in _METRIC_INDEX:
            entry[_METRIC_INDEX[f"drift_{key}"]] = val
    entry[_METRIC_INDEX["seconds"]] = time.perf_counter() - t0
    return {"entry": entry, "head": head, "row": e.row_sq_err.double().numpy(),
            "row_head": e.row_sq_err_heads.double().numpy().T,
            "query_rows": np.asarray(c.query_rows)}


# -- workers ------------------------------------------------------------------------------------
def _setup_worker(dask_worker=None, device: str = "cuda") -> str:
    """One torch thread per task slot; for a CUDA scan on a CUDA machine worker i uses GPU i mod
    count (a CPU scan makes no CUDA context in its workers). Imports the evaluation stage now,
    so the first task does not pay for it."""
    import dask.array  # noqa: F401
    import zarr  # noqa: F401

    import workbench.capture.replay  # noqa: F401
    import workbench.evaluate.engine  # noqa: F401

    torch.set_num_threads(1)
    if device == "cuda" and torch.cuda.is_available() and dask_worker is not None:
        name = dask_worker.name
        index = name if isinstance(name, int) else abs(hash(str(name)))
        torch.cuda.set_device(index % torch.cuda.device_count())
        return f"cuda:{torch.cuda.current_device()}"
    return "cpu"


DEVICES = ("auto", "cpu", "cuda")


def scan_device(device: str | None) -> str:
    """The device a scan's tasks run on: "cpu", "cuda", or None / "auto" = CUDA when torch sees
    it here, else the CPU. The two round differently (not bit for bit the same numbers)."""
    if device is None or device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if device not in DEVICES:
        raise ScanError(f"--device: {device!r} is not one of {', '.join(DEVICES)}")
    return device


def default_workers(device: str | None = None) -> int:
    """One worker process per GPU for CUDA scans, one per core for CPU scans."""
    if scan_device(device) == "cuda" and torch.cuda.is_available():
        return torch.cuda.device_count()
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()


def start_cluster(workers: int | None = None, device: str | None = None):
    """(LocalCluster, Client): `workers` single-threaded processes (default: one per GPU for a
    CUDA scan, one per core for a CPU scan; ``scan_device``), each with one torch thread."""
    from distributed import Client, LocalCluster

    n = int(workers or default_workers(device))
    if n < 1:
        raise ScanError(f"--workers: need at least 1, got {n}")
    # Loopback only; ":0" picks a free port for the scheduler's HTTP routes (8787 may be taken).
    # Worker logs below CRITICAL stay quiet: a failed task reaches the client, which names the
    # task and its entry in one line (``task_failure``); the worker's own "Compute Failed" log
    # (ERROR) repeated it as a page of traceback.
    cluster = LocalCluster(n_workers=n, threads_per_worker=1, processes=True, host="127.0.0.1",
                           dashboard_address=":0", silence_logs=50)
    client = Client(cluster)
    client.run(_setup_worker, device=scan_device(device))
    return cluster, client


def connect_scheduler(address: str, device: str):
    """A Client of the running scheduler at `address`, its workers set up for a `device` scan
    (``_setup_worker``); ScanError naming the address when it cannot be reached or has no
    workers, or naming the workers that see no CUDA device for a CUDA scan. The connect
    timeout is dask's ``distributed.comm.timeouts.connect``."""
    from distributed import Client

    try:
        client = Client(address)
    except OSError as exc:  # TimeoutError included
        raise ScanError(f"--scheduler {address}: cannot connect ({exc})") from None
    try:
        seen = client.run(_setup_worker, device=device)
        if not seen:
            raise ScanError(f"--scheduler {address}: no workers are connected to it")
        bad = sorted(w for w, d in seen.items() if device == "cuda" and d == "cpu")
        if bad:
            raise ScanError(f"--device cuda: workers {bad} of {address} see no CUDA device "
                            "(use --device cpu)")
    except BaseException:
        client.close()
        raise
    return client


# -- the scan -----------------------------------------------------------------------------------
@dataclass
class ScanRun:
    """What one call of ``run_scan`` did."""

    path: Path
    tasks_total: int
    tasks_run: int
    tasks_skipped: int
    seconds: float  # running the tasks (cluster start excluded)
    workers: int
    scheduler: str

    @property
    def tasks_per_second(self) -> float:
        return self.tasks_run / self.seconds if self.seconds > 0 else float("nan")

    def to_dict(self) -> dict:
        return {"tasks_total": self.tasks_total, "tasks_run": self.tasks_run,
                "tasks_skipped": self.tasks_skipped, "seconds": round(self.seconds, 4),
                "tasks_per_second": round(self.tasks_per_second, 3) if self.tasks_run else None,
                "workers": self.workers, "scheduler": self.scheduler,
                "finished_unix": time.time()}


def _select(name: str, asked, have: list[int]) -> list[int]:
    if asked is None:
        return list(have)
    asked = [int(x) for x in asked]
    missing = [x for x in asked if x not in have]
    if missing:
        raise ScanError(f"--{name}: {missing} not in the capture (it has {have})")
    return asked


def plan_scan(store, recipes, *, steps=None, layers=None, heads=None, n_queries: int = 64,
              dense_policy: bool = False, baseline: str | None = None,
              device: str | None = None):
    """(CaptureReader, ScanParams, lazy xarray view) for a scan of `store`; checks the input."""
    from workbench.attention import evenly_spaced_rows
    from workbench.capture import open_capture

    store = Path(store)
    if not (store / "zarr.json").exists():
        raise ScanError(f"{store}: no capture store here (no zarr.json)")
    cap = open_capture(store)
    ds = cap.to_xarray(decode=True)
    steps = _select("steps", steps, [int(s) for s in ds.step.values])
    layers = _select("layers", layers, [int(x) for x in ds.layer.values])
    complete = ds.complete.sel(step=steps, layer=layers).values
    if not complete.all():
        miss = [(s, lay) for i, s in enumerate(steps) for j, lay in enumerate(layers)
                if not complete[i, j]]
        try:  # the capture reader says why the first of them cannot be read
            cap.find(*miss[0])
            why = "its shape differs from the other entries'"
        except (KeyError, ValueError) as exc:  # no entry, damaged metadata, incomplete
            why = str(exc.args[0]) if exc.args else repr(exc)
        raise ScanError(f"{store}: entries (step, layer) {miss[:8]} cannot be scanned; "
                        f"{miss[0]}: {why}; choose --steps / --layers that it has "
                        f"(`workbench inspect {store} --verify` lists every problem)")
    first = cap.find(steps[0], layers[0])
    meta = cap.root[first.path].attrs
    if meta.get("has_query_rows"):
        raise ScanError(f"{store}: entries kept only some query rows; a scan needs every Q row "
                        "(Q scales are per 64-row block)")
    captured = [int(h) for h in meta["q_heads"]]
    heads = _select("heads", heads, captured)
    if n_queries < 1:
        raise ScanError(f"--queries: need at least one query row, got {n_queries}")
    labels, specs = resolve_recipes(recipes)
    baseline = labels[0] if baseline is None else baseline
    if baseline not in labels:
        raise ScanError(f"--baseline: {baseline!r} is not one of the recipes {labels}")
    S = int(ds.sizes["token"])
    call = cap.attention_call()
    params = ScanParams(
        store=str(store.resolve()), store_id=store_fingerprint(cap), recipes=tuple(labels),
        recipe_specs=tuple(specs), baseline=baseline, steps=tuple(steps), layers=tuple(layers),
        heads=tuple(heads), n_queries=int(n_queries), dense_policy=bool(dense_policy),
        seq_len=S, query_rows=tuple(int(i) for i in evenly_spaced_rows(S, n_queries)),
        segment_layout=json.dumps(cap.layout.to_dict(), sort_keys=True),
        causal=bool(call["causal"]), softmax_scale=call["scale"], device=scan_device(device))
    return cap, params, ds


def _qkv_arrays(q, k, v):
    """The read task's result: one entry's q, k, v as numpy float32."""
    return q, k, v


@dataclass
class EntryJobs:
    """One entry: its read (a dask.delayed over the capture's xarray view) and the keyword
    arguments of ``scan_task`` for each pending recipe index."""

    key: tuple[int, int]
    read: object
    heads: list[int]  # the captured query head ids the read holds
    tasks: dict  # {(si, li, ri): kwargs}
    call: tuple | None = None  # (causal, scale) the entry recorded


def build_jobs(cap, params: ScanParams, ds, todo: list[tuple[int, int, int]]) -> list[EntryJobs]:
    """The pending (step, layer, recipe) tasks grouped by entry, in entry order.

    Each entry is read once (shared by its recipes) from the capture's lazy xarray view; only
    the selected heads are read when K/V heads are not grouped (else all, and the task selects).
    """
    import dask

    first = cap.find(params.steps[0], params.layers[0])
    meta = cap.root[first.path].attrs
    captured = [int(h) for h in meta["q_heads"]]
    grouped = int(meta["num_heads"]) != int(meta["num_kv_heads"])
    layout = cap.layout.to_dict()
    rotated = cap.rotated_channels  # 0 is a count (no RoPE); None: not recorded
    jobs: dict[tuple[int, int], EntryJobs] = {}
    for si, li, ri in todo:
        step, layer = params.steps[si], params.layers[li]
        if (si, li) not in jobs:
            sub = ds.sel(step=step, layer=layer)
            have = captured
            if grouped:
                q, k, v = sub.q.data, sub.k.data, sub.v.data
            else:
                idx = [captured.index(h) for h in params.heads]
                have = list(params.heads)
                q, k, v = (sub.q.isel(head=idx).data, sub.k.isel(kv_head=idx).data,
                           sub.v.isel(kv_head=idx).data)
            read = dask.delayed(_qkv_arrays, pure=True)(
                q, k, v, dask_key_name=f"read-{params.store_id}-s{step}-l{layer}")
            jobs[(si, li)] = EntryJobs((si, li), read, have, {})
            # the entry's own recorded SDPA arguments (an encoder-decoder's entries differ)
            call = cap.attention_call(step, layer)
            jobs[(si, li)].call = (bool(call["causal"]), call["scale"])
        causal, scale = jobs[(si, li)].call or (params.causal, params.softmax_scale)
        jobs[(si, li)].tasks[(si, li, ri)] = dict(
            store_id=params.store_id, step=step, layer=layer,
            captured_heads=jobs[(si, li)].heads,
            heads=list(params.heads), spec=params.recipe_specs[ri], layout=layout,
            rotated=rotated, n_queries=params.n_queries, dense_policy=params.dense_policy,
            causal=causal, scale=scale, device=params.device)
    return list(jobs.values())


def run_scan(store, recipes, *, out=None, steps=None, layers=None, heads=None,
             n_queries: int = 64, dense_policy: bool = False, baseline: str | None = None,
             scheduler: str | None = None, workers: int | None = None, client=None,
             overwrite: bool = False, progress: bool = True, log=None,
             device: str | None = None):
    """Scan `store` with `recipes` into `out` (default STORE.scan.zarr); returns (Dataset, ScanRun).

    device: where the recipes and the float64 reference run ("cpu", "cuda"; default "auto":
    CUDA when this machine's torch sees it, also for a running scheduler's workers); part of
    the scan's parameters, so a resumed scan keeps it. Resumes a scan already at `out` when its
    parameters match (else ScanError naming the field), running again any task marked done whose
    values are missing. overwrite: replace the scan at `out` (only a scan store holding nothing
    else) by a new one built beside it, swapped in once complete.
    """
    log = log or (lambda msg: print(msg, file=sys.stderr))
    cap, params, ds = plan_scan(store, recipes, steps=steps, layers=layers, heads=heads,
                                n_queries=n_queries, dense_policy=dense_policy,
                                baseline=baseline, device=device)
    remote = client is None and scheduler not in (None, "synchronous")
    if params.device == "cuda" and client is None and not remote \
            and not torch.cuda.is_available():
        raise ScanError("--device cuda: torch sees no CUDA device on this machine (use "
                        "--device cpu, or --scheduler ADDRESS of a cluster with GPU workers)")
    out = Path(out) if out is not None else default_scan_path(store)
    check_out_path(out, Path(store), overwrite=overwrite)
    # --overwrite builds the new scan in a hidden sibling and swaps it in only once it is
    # complete: a failure or an interrupt (Ctrl-C) leaves the old scan as it was, and the new
    # one's finished tasks in the sibling, which the same command continues when run again
    target = named_path(out)  # "." has no name to make a sibling of
    build = overwrite_build_path(target) if overwrite and out.exists() else out
    if build != out:
        _prepare_build(build, params, log)
    # a running scheduler is reached and its workers checked before the scan store is written
    own = (None, connect_scheduler(scheduler, params.device)) if remote else None
    try:
        run = _scan_into(build, out, cap, params, ds, own=own, scheduler=scheduler,
                         workers=workers, client=client, progress=progress, log=log)
    except BaseException:
        if build != out and build.exists():
            log(f"[scan] {out}: not replaced (interrupted or failed); the new scan's finished "
                f"tasks are kept in {build}: run the same command again to continue it")
        raise
    if build != out:
        swap_scan(build, target)
    return open_scan(target), run


def overwrite_build_path(target: Path) -> Path:
    """Where ``scan --overwrite`` builds the scan that replaces ``target`` (a hidden sibling with
    a fixed name, so that an interrupted --overwrite is continued by the next one)."""
    return target.parent / f".{target.name}.overwrite"


def _prepare_build(build: Path, params: ScanParams, log) -> None:
    """Keep an earlier --overwrite's partial scan at ``build`` when its parameters are these
    (the scan continues it), remove it when they are not (it held only the replaced run's
    own names); refuse anything else there, naming it."""
    if build.is_symlink() or (build.exists() and not build.is_dir()):
        raise ScanError(f"{build}: is not a scan folder; move it away (--overwrite builds its "
                        "new scan there)")
    if not build.exists():
        return
    if not is_scan_store(build) or foreign_names(build):
        raise ScanError(f"{build}: holds files that are not an unfinished scan's; move them "
                        "away (--overwrite builds its new scan there)")
    stored = ScanParams.from_dict(scan_attrs(build)["params"])
    if stored.mismatch(params):
        log(f"[scan] {build}: an unfinished --overwrite with other parameters; removed")
        remove_scan(build)
    else:
        log(f"[scan] {build}: continuing an unfinished --overwrite")


def _scan_into(build: Path, out: Path, cap, params: ScanParams, ds, *, own, scheduler, workers,
               client, progress, log) -> ScanRun:
    """Run the tasks not yet done in the scan store at `build` (created when missing), then its
    benefits and its run record; `out` is where the scan will be (the run's path, the log)."""
    try:
        sstore = ScanStore(build, params)
        if sstore.damaged:
            log(f"[scan] {out}: {describe_gaps(sstore.damaged, params.to_dict())}; running "
                "those tasks again")
        done = sstore.done_mask()
        todo = [(si, li, ri) for si in range(len(params.steps))
                for li in range(len(params.layers)) for ri in range(len(params.recipes))
                if not done[si, li, ri]]
        jobs = build_jobs(cap, params, ds, todo)
        t0 = time.perf_counter()
        if not todo:
            n_workers, sched = 0, "none (nothing to do)"
        elif scheduler == "synchronous":
            n_workers, sched = 1, "synchronous"
            _run_synchronous(jobs, sstore, params, progress, cap)
        else:
            if own is not None:
                client = own[1]
            elif client is None:
                own = start_cluster(workers, params.device)
                client = own[1]
            n_workers = len(client.scheduler_info(n_workers=-1)["workers"])
            sched = scheduler or "LocalCluster"
            t0 = time.perf_counter()
            _run_distributed(jobs, sstore, params, client, progress, 2 * n_workers, cap)
    finally:
        if own is not None:
            own[1].close()
            if own[0] is not None:
                own[0].close()
    seconds = time.perf_counter() - t0
    run = ScanRun(out, done.size, len(todo), done.size - len(todo), seconds, n_workers, sched)
    finish_benefits(sstore)
    sstore.add_run(run.to_dict())
    if todo:
        log(f"[scan] {len(todo)} tasks (entries x recipes) in {seconds:.2f} s = "
            f"{run.tasks_per_second:.1f} tasks/s on {n_workers} worker(s) ({sched}); "
            f"{run.tasks_skipped} already done; -> {out}")
    else:
        log(f"[scan] all {done.size} tasks already done in {out}")
    return run


def _progress_bar(n: int, progress: bool):
    from tqdm.auto import tqdm

    return tqdm(total=n, disable=not progress, unit="task", desc="scan", file=sys.stderr)


def _write(sstore: ScanStore, params: ScanParams, key, rec: dict) -> None:
    if tuple(int(i) for i in rec["query_rows"]) != params.query_rows:
        raise ScanError(f"scan task {key}: sampled rows differ from the scan's")
    sstore.write_task(*key, rec)


def task_failure(cap, params: ScanParams, key: tuple[int, int, int],
                 exc: BaseException) -> ScanError:
    """The ScanError for task `key` (si, li, ri) that raised `exc`. When the entry itself cannot
    be read (a corrupt or missing capture chunk: dask's read names no store, entry or array),
    the capture reader's own message names them (read again here, on the error path only)."""
    from workbench.capture.schema import CaptureStoreError

    step, layer = params.steps[key[0]], params.layers[key[1]]
    try:
        cap.qkv(step, layer)
    except CaptureStoreError as read_exc:
        return ScanError(f"{read_exc}; `workbench inspect {cap.path} --verify` lists every "
                         "damaged chunk")
    except Exception:  # noqa: BLE001 - the task's own failure is reported below
        pass
    return ScanError(f"scan task step {step}, layer {layer}, recipe "
                     f"{params.recipes[key[2]]!r} failed: {exc}")


def _run_synchronous(jobs: list[EntryJobs], sstore: ScanStore, params: ScanParams, progress,
                     cap):
    """dask's in-process scheduler, one entry (its read + its recipes) per compute."""
    import dask

    task = dask.delayed(scan_task, pure=True)
    with _progress_bar(sum(len(j.tasks) for j in jobs), progress) as bar:
        for job in jobs:
            keys = list(job.tasks)
            try:
                recs = dask.compute(*[task(job.read, **job.tasks[k]) for k in keys],
                                    scheduler="synchronous")
            except ScanError:
                raise
            except Exception as exc:  # noqa: BLE001 - name the entry and what broke
                raise task_failure(cap, params, keys[0], exc) from exc
            for key, rec in zip(keys, recs):
                _write(sstore, params, key, rec)
                bar.update(1)


def _run_distributed(jobs: list[EntryJobs], sstore: ScanStore, params: ScanParams, client,
                     progress: bool, window: int, cap):
    """Entries go to the cluster `window` at a time (their q/k/v stay in worker memory only
    while their recipes run); each task's record is written as it completes (the client is the
    only writer)."""
    from distributed import as_completed

    pending = list(jobs)
    left: dict = {}  # entry key -> [read future, tasks not finished]
    owner: dict = {}  # task future key -> (si, li, ri)
    ac = as_completed()

    def submit_next():
        job = pending.pop(0)
        read = client.compute(job.read)
        left[job.key] = [read, len(job.tasks)]
        for key, kw in job.tasks.items():
            fut = client.submit(scan_task, read, **kw, pure=False)
            owner[fut.key] = key
            ac.add(fut)

    for _ in range(min(window, len(pending))):
        submit_next()
    try:
        with _progress_bar(sum(len(j.tasks) for j in jobs), progress) as bar:
            for fut in ac:
                key = owner.pop(fut.key)
                try:
                    rec = fut.result()
                except Exception as exc:  # noqa: BLE001 - name the task, keep the cause
                    raise task_failure(cap, params, key, exc) from exc
                _write(sstore, params, key, rec)
                bar.update(1)
                entry = left[key[:2]]
                entry[1] -= 1
                if entry[1] == 0:
                    del left[key[:2]]  # drops the read future: the worker frees the q/k/v
                    if pending:
                        submit_next()
    finally:
        for fut in list(ac.futures):
            fut.cancel()


# -- benefits -----------------------------------------------------------------------------------
def bootstrap_many(err_a, err_b, *, batch: int = 64) -> np.ndarray:
    """``workbench.metrics.bootstrap_benefit`` over leading dims: err_a, err_b [..., n] ->
    [..., 3] (benefit_pct of the means, ci_lo, ci_hi). Same resampled rows (seed 0) for every
    series, as the one-entry table draws them; NaN where either input has NaN."""
    from workbench.metrics import benefit_pct

    a = torch.tensor(np.asarray(err_a, dtype=np.float64))
    b = torch.tensor(np.asarray(err_b, dtype=np.float64))
    lead, n = a.shape[:-1], a.shape[-1]
    a, b = a.reshape(-1, n), b.reshape(-1, n)
    out = np.full((a.shape[0], 3), np.nan)
    g = torch.Generator().manual_seed(BOOTSTRAP["seed"])
    idx = torch.randint(0, n, (BOOTSTRAP["n_boot"], n), generator=g)
    lvl = BOOTSTRAP["level"]
    ok = ~(torch.isnan(a).any(1) | torch.isnan(b).any(1))
    rows = torch.nonzero(ok).flatten()
    for i in range(0, rows.numel(), batch):
        r = rows[i:i + batch]
        ma, mb = a[r][:, idx].mean(-1), b[r][:, idx].mean(-1)
        ben = torch.where(ma > 0, (ma - mb) / ma * 100.0, torch.zeros_like(ma))
        out[r.numpy(), 1] = torch.quantile(ben, (1 - lvl) / 2, dim=-1).numpy()
        out[r.numpy(), 2] = torch.quantile(ben, 1 - (1 - lvl) / 2, dim=-1).numpy()
        for j in r.tolist():
            out[j, 0] = benefit_pct(float(a[j].mean()), float(b[j].mean()))
    return out.reshape(*lead, 3)


def finish_benefits(sstore: ScanStore) -> None:
    """Benefit of every recipe over the baseline (entry and per head) from the stored rows."""
    p = sstore.params
    bi = p.recipes.index(p.baseline)
    pd = p.to_dict()
    rows = read_array(sstore.path, sstore.arrays, "row_sq_err", pd)  # [S, L, R, n]
    rows_h = read_array(sstore.path, sstore.arrays, "row_sq_err_head", pd)  # [S, L, H, R, n]
    for name in ("entry_metrics", "head_metrics"):  # the other task arrays: a corrupt chunk
        read_array(sstore.path, sstore.arrays, name, pd)  # is named before "all done" is said
    base = np.broadcast_to(rows[:, :, bi:bi + 1], rows.shape)
    base_h = np.broadcast_to(rows_h[:, :, :, bi:bi + 1], rows_h.shape)
    sstore.write_benefits(bootstrap_many(base, rows), bootstrap_many(base_h, rows_h))


def pair_benefit(ds, a: str, b: str, *, per_head: bool = False):
    """Benefit of recipe `b` over recipe `a` (output MSE, %, with the paired-bootstrap 95%
    interval over the sampled rows) at every entry of a scan: DataArray [step, layer(, head),
    stat] with stat = benefit_pct, ci_lo, ci_hi."""
    import xarray as xr

    for r in (a, b):
        if r not in ds.recipe.values:
            raise ScanError(f"recipe {r!r} is not in the scan (it has {list(ds.recipe.values)})")
    var = ds.row_sq_err_head if per_head else ds.row_sq_err
    ea, eb = var.sel(recipe=a), var.sel(recipe=b)
    vals = bootstrap_many(ea.values, eb.values)
    dims = [d for d in ea.dims if d != "row"] + ["stat"]
    coords = {d: ea[d] for d in dims if d != "stat"}
    return xr.DataArray(vals, dims=dims, coords={**coords, "stat": list(STATS)},
                        name=f"benefit of {b} over {a}")


__all__ = ["ScanError", "ScanParams", "ScanRun", "bootstrap_many", "default_scan_path",
           "open_scan", "pair_benefit", "run_scan", "start_cluster"]

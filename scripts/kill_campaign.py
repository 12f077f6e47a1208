"""Crash and corruption campaigns for capture stores (results: docs/reliability.md).

    python scripts/kill_campaign.py kill --trials 20          # SIGKILLs during capture
    python scripts/kill_campaign.py corrupt                   # every chunk / JSON corruption
    python scripts/kill_campaign.py all --trials 20           # both, one summary

Kill campaign: a child process captures N entries of several MiB each (chunks of 1 MiB, so a kill
lands mid-chunk-write most of the time) through ``capture(..., resume=True)``; the parent SIGKILLs
it at a random moment (after a random number of completed entries plus a random delay), 1 to 3
times per trial, then lets a final resume finish. After every kill the store must open, verify
must report nothing but the interrupted entries, and every complete entry must be bit-exact; the
finished store must verify clean and equal an uninterrupted run chunk file for chunk file.

Corruption campaign: on copies of a reference store (H3-style names, several chunks per array,
query rows, one zstd entry), flip a byte in / truncate / delete each chunk file, and for every JSON
file (root, entries/, step groups, entries, arrays) break the syntax, delete each field, give each
field a value of the wrong type, and change each field whose value other metadata pins down (shapes,
heads, dtypes, step, name, layer, chunk grid, codecs, chunk record). Every corruption must be one
of: flagged by verify naming the file / entry, or harmless (every read still bit-exact); and no
open / read / inspect / verify may fail with anything but a one-line CaptureStoreError.

The functions are imported by tests/test_reliability.py, which runs a short version in CI.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from workbench.capture import CaptureStoreError, capture, open_capture  # noqa: E402
from workbench.capture.inspect import inspect_store  # noqa: E402
from workbench.capture.lock import read_holder  # noqa: E402


@dataclass(frozen=True)
class KillConfig:
    """Entries of ``3 * rows * heads * dim * 2`` bytes (bf16), ``chunk_bytes`` per chunk."""

    entries: int = 6
    rows: int = 4096
    heads: int = 8
    dim: int = 64
    chunk_bytes: int = 1 << 20
    min_kills: int = 1  # kills per trial (min_kills..max_kills), then a final resume
    max_kills: int = 3

    @property
    def entry_mib(self) -> float:
        return 3 * self.rows * self.heads * self.dim * 2 / 2**20


FULL = KillConfig()
SHORT = KillConfig(entries=4, rows=2048, heads=8, chunk_bytes=1 << 19, min_kills=2, max_kills=2)


def entry_qkv(i: int, cfg: KillConfig):
    """Deterministic q, k, v [1, rows, heads, dim] bf16 of entry i."""
    g = torch.Generator().manual_seed(7000 + i)
    return tuple(torch.randn(1, cfg.rows, cfg.heads, cfg.dim, generator=g).to(torch.bfloat16)
                 for _ in range(3))


def write_store(store: Path, cfg: KillConfig, resume: bool) -> int:
    """Capture every entry of the campaign (the child's work); returns entries skipped."""
    with capture(None, store, progress=False, resume=resume, chunk_bytes=cfg.chunk_bytes,
                 budget_bytes=4 * int(cfg.entry_mib * 2**20) + (1 << 20), seed=0,
                 prompt="kill campaign") as cap:
        for i in range(cfg.entries):
            cap.record(f"transformer_blocks.{i}", *entry_qkv(i, cfg), step=0, layer=i)
    return len(cap.skipped)


def _child(store: Path, cfg: KillConfig) -> subprocess.Popen:
    args = json.dumps(cfg.__dict__)
    return subprocess.Popen([sys.executable, __file__, "child", str(store), args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _statuses(store: Path) -> list[str]:
    out = []
    for p in (store / "entries").glob("*/*/zarr.json"):
        try:
            out.append(json.loads(p.read_text())["attributes"]["status"])
        except (ValueError, KeyError, OSError):
            out.append("?")
    return out


def _chunk_files(store: Path) -> dict[str, bytes]:
    return {p.relative_to(store).as_posix(): p.read_bytes()
            for p in sorted(store.rglob("*")) if p.is_file() and "/c/" in p.as_posix()}


@dataclass
class KillResult:
    trials: int = 0
    kills: int = 0
    kills_mid_entry: int = 0  # an entry was "writing" when the process died
    kills_torn_chunk: int = 0  # ... and one of its chunk files was short or missing
    missed: int = 0  # the child finished before the planned kill
    resumes: int = 0
    failures: list[str] = field(default_factory=list)


def _check_after_kill(store: Path, cfg: KillConfig, res: KillResult, tag: str) -> None:
    r = open_capture(store)
    problems = r.verify()
    incomplete = {e.path for e in r.incomplete}
    for p in problems:
        if not any(p.startswith(f"{path}: incomplete") for path in incomplete):
            res.failures.append(f"{tag}: verify after the kill: {p}")
    for e in r.entries(include_incomplete=False):
        if not all(_same_bits(a, b) for a, b in zip(r.qkv(0, e.layer), entry_qkv(e.layer, cfg))):
            res.failures.append(f"{tag}: complete entry {e.path} is not bit-exact")
    if incomplete:
        res.kills_mid_entry += 1
        full = None
        for path in incomplete:
            files = [f for f in (store / path).rglob("*") if f.is_file() and "/c/" in
                     f.as_posix()]
            sizes = {f.stat().st_size for f in files}
            full = full or cfg.chunk_bytes + 4
            per_entry = 3 * -(-cfg.rows * cfg.heads * cfg.dim * 2 // cfg.chunk_bytes)
            if len(files) < per_entry or any(s != full for s in sizes):
                res.kills_torn_chunk += 1
                break


def kill_campaign(trials: int, cfg: KillConfig = FULL, seed: int = 0,
                  workdir: Path | None = None) -> KillResult:
    rng = random.Random(seed)
    res = KillResult()
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        tmp = Path(tmp)
        reference = tmp / "reference.zarr"
        write_store(reference, cfg, resume=False)  # uninterrupted, in this process
        want = _chunk_files(reference)
        for t in range(trials):
            store = tmp / f"trial{t}.zarr"
            res.trials += 1
            for k in range(rng.randint(cfg.min_kills, cfg.max_kills)):
                share = rng.random()  # how far into the entries still to write
                mid_entry = rng.random() < 0.8  # else anywhere, between entries included
                delay = rng.uniform(0.0, 0.02 if mid_entry else 0.1)
                proc = _child(store, cfg)
                deadline = time.time() + 300
                try:
                    # Wait until the child holds the writer lock (it has opened the store), then
                    # until a random number of further entries is complete, then the delay.
                    while time.time() < deadline and proc.poll() is None:
                        if (read_holder(store) or {}).get("pid") == proc.pid:
                            break
                        time.sleep(0.002)
                    base = _statuses(store).count("complete")
                    target = base + int(share * (cfg.entries - base))
                    while time.time() < deadline and proc.poll() is None:
                        st = _statuses(store)
                        if st.count("complete") >= target and (not mid_entry or "writing" in st):
                            break
                        time.sleep(0.001)
                    time.sleep(delay)
                    if proc.poll() is not None:
                        res.missed += 1
                        continue
                    os.kill(proc.pid, signal.SIGKILL)
                    proc.wait()
                finally:
                    if proc.poll() is None:
                        proc.kill()
                        proc.wait()
                res.kills += 1
                if (store / "zarr.json").exists():
                    _check_after_kill(store, cfg, res, f"trial {t} kill {k}")
            proc = _child(store, cfg)
            out, err = proc.communicate(timeout=600)
            res.resumes += 1
            if proc.returncode != 0:
                res.failures.append(f"trial {t}: final resume failed: {err.strip()[-300:]}")
                continue
            problems = open_capture(store).verify()
            if problems:
                res.failures.append(f"trial {t}: verify after resume: {problems[:3]}")
            got = _chunk_files(store)
            if got != want:
                diff = sorted(set(got) ^ set(want)) or [p for p in want if got[p] != want[p]]
                res.failures.append(f"trial {t}: resumed store differs from the uninterrupted "
                                    f"run: {diff[:3]}")
            shutil.rmtree(store)
    return res


# -- corruption campaign ---------------------------------------------------------------------

REFERENCE_STORES = {  # name -> capture options; together they use every part of the schema
    "plain": {"chunk_bytes": 16 * 1024, "seed": 1, "prompt": "p", "recipe": "bf16"},
    "rows": {"chunk_bytes": 16 * 1024, "query_rows": [0, 5, 95]},
    "zstd": {"compressor": "zstd:3"},
}


def reference_store(path: Path, **options) -> dict:
    """A small store (H3-style entry names, 2 steps x 2 layers, several chunks per array);
    returns {(step, layer): (q, k, v)} as they read back."""
    data = {}
    rows = options.get("query_rows")
    with capture(None, path, progress=False, **options) as cap:
        for step in (0, 3):
            for layer in (0, 1):
                g = torch.Generator().manual_seed(100 * step + layer)
                q, k, v = (torch.randn(1, 96, 4, 64, generator=g).to(torch.bfloat16)
                           for _ in range(3))
                cap.record(f"transformer_blocks.{layer}", q, k, v, step=step, layer=layer)
                data[(step, layer)] = (q if rows is None else q[:, rows], k, v)
    return data


def _json_files(store: Path) -> list[Path]:
    return sorted(store.rglob("zarr.json"))


def _wrong_type(value):
    if isinstance(value, dict):
        return "corrupt"
    if isinstance(value, str):
        return {"corrupt": 1}
    if isinstance(value, bool):
        return "yes"
    if isinstance(value, (int, float)):
        return "corrupt"
    if isinstance(value, list):
        return {"corrupt": 1}
    return 12345  # null -> a number


def _pinned_value(key: str, value):
    """A same-type different value for fields that other metadata pins down, else None."""
    if key in ("shape", "shape_q", "shape_kv") and isinstance(value, list) and value:
        return value[:-1] + [value[-1] + 1]
    if key in ("q_heads", "kv_heads") and isinstance(value, list):
        return value + [len(value) + 5]
    if key in ("num_heads", "num_kv_heads", "seq_len") and isinstance(value, int):
        return value + 3
    if key == "step" and isinstance(value, int):
        return value + 1
    if key == "layer" and isinstance(value, int):
        return value + 1
    if key == "name" and isinstance(value, str):
        return value + "x"
    if key in ("torch_dtype",) and isinstance(value, str):
        return "float16" if value != "float16" else "bfloat16"
    if key == "data_type" and isinstance(value, str):
        return "uint8" if value != "uint8" else "uint16"
    if key == "fill_value":
        return 1
    if key == "status":
        return "writing"
    if key == "chunk_grid" and isinstance(value, dict):
        v = copy.deepcopy(value)
        cs = v.get("configuration", {}).get("chunk_shape")
        if cs:
            cs[-1] = cs[-1] * 2
            return v
    if key == "codecs" and isinstance(value, list):
        return [c for c in value if c.get("name") != "crc32c"]
    if key == "chunk_crc32c" and isinstance(value, dict) and value:
        v = copy.deepcopy(value)
        arr = next(iter(v))
        first = next(iter(v[arr]))
        v[arr][first] = (v[arr][first] or 0) ^ 1
        return v
    if key == "schema_version":
        return 99
    if key == "schema":
        return "something.else"
    return None


def _edits(meta: dict):
    """(label, edited metadata) for every field of one JSON document (attributes included)."""
    for key in list(meta):
        m = copy.deepcopy(meta)
        del m[key]
        yield f"delete {key}", m
        m = copy.deepcopy(meta)
        m[key] = _wrong_type(meta[key])
        yield f"wrong type {key}", m
        pinned = _pinned_value(key, meta[key])
        if pinned is not None:
            m = copy.deepcopy(meta)
            m[key] = pinned
            yield f"change {key}", m
    for key in list(meta.get("attributes") or {}):
        a = meta["attributes"]
        m = copy.deepcopy(meta)
        del m["attributes"][key]
        yield f"delete attributes.{key}", m
        m = copy.deepcopy(meta)
        m["attributes"][key] = _wrong_type(a[key])
        yield f"wrong type attributes.{key}", m
        pinned = _pinned_value(key, a[key])
        if pinned is not None:
            m = copy.deepcopy(meta)
            m["attributes"][key] = pinned
            yield f"change attributes.{key}", m


@dataclass
class CorruptResult:
    trials: int = 0
    flagged: int = 0  # verify named the damaged file / entry
    harmless: int = 0  # not flagged, and every read is still bit-exact
    by_kind: dict = field(default_factory=dict)  # kind -> [trials, flagged]
    harmless_edits: dict = field(default_factory=dict)  # edit label -> count
    failures: list[str] = field(default_factory=list)


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and \
        a.contiguous().view(torch.uint8).numpy().tobytes() == \
        b.contiguous().view(torch.uint8).numpy().tobytes()


def _judge(store: Path, data: dict, what: str, names: tuple[str, ...], res: CorruptResult,
           kind: str) -> None:
    """One corrupted store: flagged naming ``names`` or harmless; never a stray exception."""
    res.trials += 1
    counts = res.by_kind.setdefault(kind, [0, 0])
    counts[0] += 1
    try:
        try:
            r = open_capture(store, strict=False)
        except CaptureStoreError as exc:
            # Refused at open (schema name / version, unreadable root): must name the store.
            if str(store) in str(exc):
                res.flagged += 1
                counts[1] += 1
            else:
                res.failures.append(f"{what}: open refused without naming the store: {exc}")
            return
        problems = r.verify()
        try:
            inspect_store(store, strict=False)
        except CaptureStoreError:
            pass
        flagged = any(any(n in p for n in names) for p in problems)
        exact = True
        for (step, layer), want in data.items():
            try:
                got = r.qkv(step, layer)
            except CaptureStoreError:
                exact = False
                continue
            if not all(_same_bits(a, b) for a, b in zip(got, want)):
                exact = False
                if not flagged:
                    res.failures.append(f"{what}: entry ({step}, {layer}) reads different data "
                                        f"and verify does not flag it")
        if flagged:
            res.flagged += 1
            counts[1] += 1
        elif problems:
            res.failures.append(f"{what}: verify flags other files only: {problems[:2]}")
        elif exact:
            res.harmless += 1
            label = what.split(": ", 1)[1].split(" in ")[0]
            res.harmless_edits[label] = res.harmless_edits.get(label, 0) + 1
        else:
            res.failures.append(f"{what}: a read fails but verify reports nothing")
    except Exception as exc:  # noqa: BLE001 - the campaign counts these as failures
        res.failures.append(f"{what}: {type(exc).__name__}: {exc}")


def corruption_campaign(seed: int = 0, workdir: Path | None = None,
                        max_chunk_files: int | None = None, max_edits: int | None = None,
                        stores: tuple[str, ...] = tuple(REFERENCE_STORES)) -> CorruptResult:
    """Every corruption of every reference store (or a random sample per store:
    ``max_chunk_files`` chunk files, each flipped / truncated / deleted, and ``max_edits`` of the
    JSON corruptions)."""
    rng = random.Random(seed)
    res = CorruptResult()
    with tempfile.TemporaryDirectory(dir=workdir) as tmp:
        for name in stores:
            options = REFERENCE_STORES[name]
            ref = Path(tmp) / f"{name}.zarr"
            data = reference_store(ref, **options)
            _corrupt_store(ref, data, Path(tmp) / f"work-{name}.zarr", rng, res,
                           max_chunk_files, max_edits)
    return res


def _corrupt_store(ref: Path, data: dict, work: Path, rng: random.Random, res: CorruptResult,
                   max_chunk_files: int | None, max_edits: int | None) -> None:
    """Each corruption is applied to one file of a working copy, judged, and undone."""
    if work.exists():
        shutil.rmtree(work)
    shutil.copytree(ref, work)

    def judged(rel: Path, content: bytes | None, what: str, names, kind: str) -> None:
        f = work / rel
        original = f.read_bytes()
        if content is None:
            f.unlink()
        else:
            f.write_bytes(content)
        try:
            _judge(work, data, f"{ref.name}: {what}", names, res, kind)
        finally:
            f.write_bytes(original)

    chunks = sorted(p.relative_to(ref) for p in ref.rglob("*") if p.is_file()
                    and "/c/" in p.as_posix())
    if max_chunk_files is not None:
        chunks = rng.sample(chunks, min(max_chunk_files, len(chunks)))
    for rel in chunks:
        entry = "/".join(rel.parts[:3])
        raw = (ref / rel).read_bytes()
        flipped = bytearray(raw)
        flipped[rng.randrange(len(raw))] ^= 1 << rng.randrange(8)
        for kind, content in (("flip", bytes(flipped)), ("truncate", raw[:rng.randrange(len(raw))]),
                              ("delete", None)):
            judged(rel, content, f"{kind} {rel}", (entry,), f"chunk {kind}")
    edits = []  # (file, new content, label, names, kind) for every JSON corruption
    for rel in (p.relative_to(ref) for p in _json_files(ref)):
        text = (ref / rel).read_text()
        meta = json.loads(text)
        kind_of = ("root" if rel.as_posix() == "zarr.json" else
                   "array" if meta.get("node_type") == "array" else
                   "entry" if "name" in (meta.get("attributes") or {}) else "group")
        # Problems name the file; those found by reading an entry's chunks name the entry.
        names = (str(work / rel), *(["/".join(rel.parts[:3])] if len(rel.parts) > 3 else []))
        if kind_of == "root":
            names += (str(work),)
        edits.append((rel, text[: len(text) // 2].encode(), f"truncate {rel}", names,
                      f"{kind_of} syntax"))
        for label, edited in _edits(meta):
            edits.append((rel, json.dumps(edited).encode(), f"{label} in {rel}", names,
                          f"{kind_of} field"))
    if max_edits is not None:
        edits = rng.sample(edits, min(max_edits, len(edits)))
    for rel, content, label, names, kind in edits:
        judged(rel, content, label, names, kind)


def _summary(name: str, res) -> str:
    d = dict(res.__dict__)
    d["failures"] = len(res.failures)
    return f"{name}: " + ", ".join(f"{k}={v}" for k, v in d.items())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("what", choices=["kill", "corrupt", "all", "child"])
    ap.add_argument("args", nargs="*", help=argparse.SUPPRESS)
    ap.add_argument("--trials", type=int, default=20)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--short", action="store_true", help="the CI configuration")
    a = ap.parse_args()
    if a.what == "child":
        store, cfg = Path(a.args[0]), KillConfig(**json.loads(a.args[1]))
        skipped = write_store(store, cfg, resume=True)
        print("SKIPPED", skipped)
        return 0
    failures = 0
    t0 = time.time()
    if a.what in ("kill", "all"):
        cfg = SHORT if a.short else FULL
        print(f"kill campaign: {a.trials} trials, {cfg.entries} entries of "
              f"{cfg.entry_mib:.1f} MiB, chunks of {cfg.chunk_bytes >> 10} KiB", flush=True)
        res = kill_campaign(a.trials, cfg, seed=a.seed)
        print(_summary("kill", res))
        for f in res.failures:
            print("  FAIL " + f)
        failures += len(res.failures)
    if a.what in ("corrupt", "all"):
        res = corruption_campaign(seed=a.seed)
        print(_summary("corrupt", res))
        for f in res.failures:
            print("  FAIL " + f)
        failures += len(res.failures)
    print(f"{time.time() - t0:.0f} s, {failures} failure(s)")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())

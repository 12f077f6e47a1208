"""Store integrity: SIGKILL mid-capture then open + resume, crc32c corruption, schema refusal,
memory budget with back-pressure, disk full, readers during a write."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import torch

from workbench.capture import (
    CaptureWriteError,
    ChecksumError,
    IncompleteEntryError,
    SchemaVersionError,
    capture,
    open_capture,
)

REPO = Path(__file__).resolve().parents[1]


def entry_tensors(i: int, rows: int = 256, heads: int = 4, dim: int = 64):
    """Deterministic q, k, v [1, rows, heads, dim] bf16 for entry i."""
    g = torch.Generator().manual_seed(1000 + i)
    return tuple(torch.randn(1, rows, heads, dim, generator=g).to(torch.bfloat16)
                 for _ in range(3))


CHILD = textwrap.dedent("""
    import sys, torch
    sys.path.insert(0, {repo!r})
    from tests.test_capture_store import entry_tensors
    from workbench.capture import capture
    resume = sys.argv[2] == "resume"
    with capture(None, sys.argv[1], progress=False, resume=resume, chunk_bytes=16384,
                 budget_bytes=64 << 20) as cap:
        for i in range({n}):
            q, k, v = entry_tensors(i, rows=2048)
            cap.record(f"blocks.{{i}}", q, k, v, step=0, layer=i)
    print("SKIPPED", len(cap.skipped), flush=True)
""")


def _statuses(store: Path) -> dict[str, str]:
    out = {}
    for p in (store / "entries").glob("*/*/zarr.json"):
        try:
            out[p.parent.name] = json.loads(p.read_text())["attributes"]["status"]
        except (ValueError, KeyError, OSError):
            out[p.parent.name] = "?"
    return out


def test_sigkill_mid_capture_then_open_and_resume(tmp_path):
    n = 40
    store = tmp_path / "k.zarr"
    script = tmp_path / "child.py"
    script.write_text(CHILD.format(repo=str(REPO), n=n))
    proc = subprocess.Popen([sys.executable, str(script), str(store), "new"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.time() + 60
    try:
        # Kill once at least two entries are complete and another one is being written.
        while time.time() < deadline and proc.poll() is None:
            st = _statuses(store) if (store / "entries").exists() else {}
            if sum(s == "complete" for s in st.values()) >= 2 and "writing" in st.values():
                break
            time.sleep(0.002)
        assert proc.poll() is None, "capture finished before it could be killed; grow n"
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
    r = open_capture(store)
    done = [e for e in r.entries() if e.complete]
    partial = r.incomplete
    assert len(done) >= 2 and len(done) < n
    assert partial, "the kill landed between entries; the incomplete flag went untested"
    for e in done:  # every entry listed complete reads back bit-exact
        got = r.qkv(0, e.layer)
        want = entry_tensors(e.layer, rows=2048)
        assert all(torch.equal(a.view(torch.int16), b.view(torch.int16))
                   for a, b in zip(got, want))
    with pytest.raises(IncompleteEntryError, match=partial[0].path):
        r.qkv(0, partial[0].layer)
    # Resume: completed entries are not rewritten, the rest are written.
    mtimes = {e.path: (store / e.path / "zarr.json").stat().st_mtime_ns for e in done}
    out = subprocess.run([sys.executable, str(script), str(store), "resume"], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert f"SKIPPED {len(done)}" in out.stdout
    r2 = open_capture(store)
    assert len(r2.entries()) == n and not r2.incomplete
    assert all((store / p / "zarr.json").stat().st_mtime_ns == t for p, t in mtimes.items())
    last = r2.qkv(0, n - 1)
    assert torch.equal(last[1].view(torch.int16), entry_tensors(n - 1, rows=2048)[1]
                       .view(torch.int16))


def _small_store(path, n=3):
    with capture(None, path, progress=False) as cap:
        for i in range(n):
            cap.record(f"blocks.{i}", *entry_tensors(i), step=1, layer=i)
    return path


def test_flipped_byte_is_detected_and_names_the_entry(tmp_path):
    store = _small_store(tmp_path / "c.zarr")
    chunk = next((store / "entries/s00001/blocks.1/k/c").rglob("*"))
    while chunk.is_dir():
        chunk = next(chunk.iterdir())
    data = bytearray(chunk.read_bytes())
    data[len(data) // 2] ^= 0x01
    chunk.write_bytes(bytes(data))
    r = open_capture(store)
    with pytest.raises(ChecksumError, match=r"entry entries/s00001/blocks\.1.*array 'k'"):
        r.qkv(1, 1)
    r.qkv(1, 0)
    r.qkv(1, 2)  # the other entries still read
    problems = r.verify()
    assert len(problems) == 1 and "blocks.1" in problems[0] and "checksum" in problems[0]


@pytest.mark.parametrize("attrs, msg", [
    ({"schema_version": 2}, "schema version 2 is not supported"),
    ({"schema_version": "1"}, "schema version '1' is not supported"),
    ({"schema": "something.else"}, "not a workbench capture store"),
])
def test_newer_or_unknown_schema_is_refused(tmp_path, attrs, msg):
    store = _small_store(tmp_path / "s.zarr", n=1)
    meta_path = store / "zarr.json"
    meta = json.loads(meta_path.read_text())
    meta["attributes"].update(attrs)
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(SchemaVersionError, match=msg):
        open_capture(store)
    with pytest.raises(SchemaVersionError):
        with capture(None, store, resume=True, progress=False):
            pass


def test_memory_stays_under_budget_with_back_pressure(tmp_path):
    entry_bytes = 3 * 1 * 1024 * 4 * 64 * 2  # 1.5 MiB of q/k/v per entry
    budget = 4 * 2**20
    n = 16  # 24 MiB in total, 6x the budget
    # zstd level 19 makes the writer the slow side, so the hook must wait for it.
    with capture(None, tmp_path / "b.zarr", progress=False, budget_bytes=budget,
                 compressor="zstd:19", queue_size=64) as cap:
        for i in range(n):
            cap.record(f"blocks.{i}", *entry_tensors(i, rows=1024), step=0, layer=i)
            assert cap.writer.budget.in_use <= budget
    b = cap.writer.budget
    assert n * entry_bytes > 5 * budget
    assert b.peak <= budget and b.peak >= entry_bytes
    assert b.waits > 0 and b.wait_seconds > 0  # back-pressure, not unbounded growth
    assert b.in_use == 0
    r = open_capture(tmp_path / "b.zarr")
    assert len(r.entries(include_incomplete=False)) == n
    with pytest.raises(Exception, match="raise budget_bytes"):
        with capture(None, tmp_path / "b2.zarr", progress=False, budget_bytes=2**20) as cap:
            cap.record("big", *entry_tensors(0, rows=1024), step=0, layer=0)


DISK_FULL_CHILD = textwrap.dedent("""
    import resource, signal, sys, torch
    sys.path.insert(0, {repo!r})
    from workbench.capture import capture, CaptureWriteError
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    # A file-size limit makes the kernel refuse the big chunk (EFBIG), as a full disk would.
    resource.setrlimit(resource.RLIMIT_FSIZE, (200_000, 200_000))
    try:
        with capture(None, sys.argv[1], progress=False, chunk_bytes=1 << 22) as cap:
            small = torch.ones(1, 16, 2, 32)
            cap.record("small", small, small, small, step=0, layer=0)
            big = torch.ones(1, 1024, 2, 64)
            cap.record("big", big, big, big, step=0, layer=1)
    except CaptureWriteError as exc:
        print("ERROR", exc)
        sys.exit(3)
""")


def test_disk_full_gives_a_clear_error_and_keeps_completed_entries(tmp_path):
    script = tmp_path / "full.py"
    script.write_text(DISK_FULL_CHILD.format(repo=str(REPO)))
    store = tmp_path / "f.zarr"
    out = subprocess.run([sys.executable, str(script), str(store)], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 3, out.stderr
    assert "file size limit reached while writing entry entries/s00000/big" in out.stdout
    assert "entries completed before it are kept" in out.stdout
    r = open_capture(store)
    assert [(e.name, e.status) for e in r.entries()] == [("small", "complete"), ("big", "writing")]
    assert torch.equal(r.qkv(0, 0)[0], torch.ones(1, 16, 2, 32))


def test_writer_error_surfaces_in_the_caller_naming_the_entry(tmp_path):
    with pytest.raises(CaptureWriteError, match="entries/s00000/bad"):
        with capture(None, tmp_path / "e.zarr", progress=False) as cap:
            x = torch.ones(1, 4, 1, 8)
            cap.record("ok", x, x, x, step=0, layer=0)
            xi = x.to(torch.int32)  # a dtype the writer cannot store (fails in its thread)
            cap.record("bad", xi, xi, xi, step=0, layer=1)
    status = {e.name: e.status for e in open_capture(tmp_path / "e.zarr").entries()}
    assert status["ok"] == "complete" and status["bad"] != "complete", status


def test_two_readers_while_writing(tmp_path):
    store = tmp_path / "r.zarr"
    n = 24
    stop = threading.Event()
    seen: list[list[int]] = [[], []]
    errors: list[BaseException] = []

    def reader(slot):
        try:
            while not stop.is_set():
                if not (store / "zarr.json").exists():
                    time.sleep(0.005)
                    continue
                r = open_capture(store)
                done = r.entries(include_incomplete=False)
                for e in done[-2:]:
                    got = r.qkv(0, e.layer)[2]
                    assert torch.equal(got.view(torch.int16),
                                       entry_tensors(e.layer)[2].view(torch.int16))
                seen[slot].append(len(done))
        except BaseException as exc:  # noqa: BLE001
            errors.append(exc)

    threads = [threading.Thread(target=reader, args=(s,)) for s in (0, 1)]
    for t in threads:
        t.start()
    with capture(None, store, progress=False, compressor="zstd:9") as cap:
        for i in range(n):
            cap.record(f"blocks.{i}", *entry_tensors(i), step=0, layer=i)
            time.sleep(0.01)
    deadline = time.time() + 30  # let each reader finish a listing that started after the close
    while time.time() < deadline and not all(x and x[-1] == n for x in seen) and not errors:
        time.sleep(0.01)
    stop.set()
    for t in threads:
        t.join()
    assert not errors, errors
    for s in seen:
        assert s == sorted(s) and s[-1] == n  # monotone listing, ends with every entry
        assert len(set(s)) > 2  # the reader saw the store grow, not only its final state


def test_direct_chunk_writes_are_byte_identical_to_zarr_writes(tmp_path):
    """The chunk-writer pool writes the exact files zarr's own array write produces (edge chunks
    padded, crc32c appended), for bf16 / fp16 / fp8 and the int64 q_rows."""
    g = torch.Generator().manual_seed(7)
    q = torch.randn(1, 300, 7, 32, generator=g).to(torch.bfloat16)
    k = torch.randn(1, 300, 7, 32, generator=g).to(torch.bfloat16)
    v = torch.randn(1, 300, 7, 32, generator=g).to(torch.bfloat16)
    cases = {"bf16": (q, k, v), "fp8": tuple(t.to(torch.float8_e4m3fn) for t in (q, k, v)),
             "fp16": tuple(t.half() for t in (q, k, v))}
    files = {}
    for direct in (True, False):
        store = tmp_path / f"d{direct}.zarr"
        # 3 heads per chunk over 7 heads: the last chunk is an edge chunk (1 head + padding).
        with capture(None, store, progress=False, chunk_bytes=3 * 300 * 32 * 2 + 1,
                     query_rows=[0, 7, 299], direct_writes=direct, writer_threads=3) as cap:
            for i, (name, qkv) in enumerate(cases.items()):
                cap.record(name, *qkv, step=0, layer=i)
        assert cap.stats.direct is direct
        # per entry: q (3 rows) 1 chunk, q_rows 1, k and v 3 each (bf16/fp16: 3+3+1 heads) or
        # 2 each (fp8: 6+1 heads)
        assert cap.stats.chunks == ((8 + 6 + 8) if direct else 0)
        files[direct] = {p.relative_to(store).as_posix(): p.read_bytes()
                         for p in store.rglob("*") if p.is_file() and "/c/" in p.as_posix()}
        r = open_capture(store)
        assert r.verify() == []
        for i, qkv in enumerate(cases.values()):
            got = r.qkv(0, i)
            want = (qkv[0][:, [0, 7, 299]], qkv[1], qkv[2])
            assert all(torch.equal(a.view(torch.uint8), b.view(torch.uint8))
                       for a, b in zip(got, want))
    assert files[True].keys() == files[False].keys() and len(files[True]) == 22
    assert all(files[True][p] == files[False][p] for p in files[True])


def test_pinned_ring_regions_never_overlap_and_recycle():
    from workbench.capture.writer import PinnedPool

    ring = object.__new__(PinnedPool)  # the ring logic only; no CUDA allocation
    ring.capacity, ring._live, ring._cond = 100, [], threading.Condition()
    ring.failed, ring.waits, ring.wait_seconds = None, 0, 0.0
    a, b, c = ring.alloc(40), ring.alloc(40), None
    assert (a, b) == ((0, 40), (40, 80))
    assert ring._fit(30) is None  # 80 + 30 > 100 and [0, 30) is still held by a
    ring.release(a)
    c = ring.alloc(30)  # wraps to the start once a is free
    assert c == (0, 30)
    ring.release(b)
    ring.release(c)
    assert ring._live == [] and ring.alloc(100) == (0, 100)
    done = threading.Event()

    def late_release():
        time.sleep(0.05)
        done.set()
        ring.release((0, 100))

    threading.Thread(target=late_release).start()
    assert ring.alloc(10) == (0, 10) and done.is_set()  # blocked until the release
    assert ring.waits == 1

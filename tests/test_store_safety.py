"""Misuse never destroys or silently corrupts data: capture / archive refuse foreign paths, a
deleted chunk is an error (not zeros), resume refuses another run, one writer at a time, verify
names every damaged file, schedules are checked before any work, a failed capture leaves nothing.

Every test uses real stores; the CLI runs as `python -m workbench` where a process boundary is the
point (the headline data-loss case, two writers), else through `workbench.cli.main` in process.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from workbench.capture import (
    CaptureStoreError,
    MetadataError,
    MissingChunkError,
    RunMismatchError,
    StoreLockedError,
    capture,
    open_capture,
)
from workbench.capture.lock import StoreLock, holder_is_stale, read_holder
from workbench.capture.schema import CHUNK_RECORD, LOCK_NAME
from workbench.cli import main
from workbench.recipes import PRESETS

REPO = Path(__file__).resolve().parents[1]


def digest(root: Path) -> dict[str, str]:
    """sha256 of every file under root (relative path -> hex)."""
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def cli(capsys, *args) -> tuple[int, str, str]:
    try:
        rc = main([str(a) for a in args])
    except SystemExit as exc:  # argparse's own usage errors exit through SystemExit
        rc = exc.code
    out, err = capsys.readouterr()
    return rc, out, err


def one_line_error(rc: int, err: str, command: str, *needles: str) -> str:
    """The CLI's bad-input contract: exit 2, one `workbench CMD: error: ...` line, no traceback."""
    assert rc == 2, err
    assert "Traceback" not in err, err
    lines = [x for x in err.splitlines() if x.startswith(f"workbench {command}: error: ")]
    assert len(lines) == 1, err
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]


def run_workbench(*args, cwd: Path, **kw) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    return subprocess.run([sys.executable, "-m", "workbench", *map(str, args)], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=600, **kw)


def qkv(i: int, rows: int = 64, heads: int = 2, dim: int = 32):
    g = torch.Generator().manual_seed(i)
    return tuple(torch.randn(1, rows, heads, dim, generator=g).to(torch.bfloat16)
                 for _ in range(3))


def small_store(path: Path, n: int = 3, **kw) -> Path:
    with capture(None, path, progress=False, seed=0, prompt="p", **kw) as cap:
        for i in range(n):
            cap.record(f"transformer_blocks.{i}", *qkv(i), step=0, layer=i)
    return path


def foreign_tree(root: Path) -> Path:
    """A folder of someone's files, the kind a typo in --out points at."""
    (root / "fp8").mkdir(parents=True)
    (root / "fp8" / "video.mp4").write_bytes(b"clip" * 100)
    (root / "notes.txt").write_text("keep me")
    return root


@pytest.fixture(scope="module")
def cli_store(tmp_path_factory) -> Path:
    """A store written by `workbench capture` (h3-tiny, layers 0-1, steps 0-1)."""
    store = tmp_path_factory.mktemp("cli") / "run.zarr"
    assert main(["capture", "--model", "h3-tiny", "--out", str(store), "--layers", "0-1",
                 "--steps", "0-1", "--quiet"]) == 0
    return store


@pytest.fixture
def read_only_dir(tmp_path) -> Path:
    """A folder nothing can be written into: permission bits when not root, else a read-only
    filesystem (sysfs refuses new files even to root)."""
    if os.geteuid() != 0:
        d = tmp_path / "ro"
        d.mkdir()
        d.chmod(0o555)
        yield d
        d.chmod(0o755)
        return
    probe = Path("/sys/workbench-ro-probe")
    try:
        probe.mkdir()
    except OSError:
        yield Path("/sys")
        return
    probe.rmdir()
    pytest.skip("no read-only location available (root, and /sys is writable)")


# -- 1. nothing is destroyed --------------------------------------------------------------------

def test_capture_into_a_foreign_folder_refuses_and_keeps_every_file(tmp_path):
    """The reported case, as a user types it: `--out` names a folder of other files."""
    runs = foreign_tree(tmp_path / "runs")
    before = digest(runs)
    r = run_workbench("capture", "--model", "h3-tiny", "--out", runs, "--layers", "0",
                      "--steps", "0", "--quiet", cwd=tmp_path)
    one_line_error(r.returncode, r.stderr, "capture", str(runs), "not a workbench capture store",
                   "fp8/")
    assert digest(runs) == before


@pytest.mark.parametrize("flag", ["--resume", "--overwrite"])
def test_resume_or_overwrite_never_touch_a_foreign_folder(tmp_path, capsys, flag):
    runs = foreign_tree(tmp_path / "runs")
    before = digest(runs)
    rc, _, err = cli(capsys, "capture", "--model", "h3-tiny", "--out", runs, "--layers", "0",
                     "--steps", "0", "--quiet", flag)
    one_line_error(rc, err, "capture", str(runs), "--overwrite only replaces a capture store")
    assert digest(runs) == before
    # A zarr group of another tool is not a capture store either.
    (runs / "zarr.json").write_text(json.dumps({"zarr_format": 3, "node_type": "group",
                                                "attributes": {"schema": "other.tool"}}))
    before = digest(runs)
    rc, _, err = cli(capsys, "capture", "--model", "h3-tiny", "--out", runs, "--quiet", flag)
    one_line_error(rc, err, "capture", str(runs), "schema='other.tool'")
    assert digest(runs) == before


def test_overwrite_replaces_only_a_pure_store_and_keeps_the_old_one_until_success(tmp_path,
                                                                                  capsys):
    store = small_store(tmp_path / "s.zarr")
    (store / "my_notes.txt").write_text("results of last week")
    before = digest(store)
    rc, _, err = cli(capsys, "capture", "--model", "h3-tiny", "--out", store, "--layers", "0",
                     "--steps", "0", "--quiet", "--overwrite")
    one_line_error(rc, err, "capture", str(store), "my_notes.txt", "move them out first")
    assert digest(store) == before
    (store / "my_notes.txt").unlink()
    before = digest(store)
    # A capture that fails before its first entry puts the replaced store back, byte for byte.
    with pytest.raises(RuntimeError, match="model crashed"):
        with capture(None, store, overwrite=True, progress=False):
            raise RuntimeError("model crashed")
    assert digest(store) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.zarr"]  # no sibling left behind
    # A successful one replaces it, and the old copy is gone.
    rc, out, _ = cli(capsys, "capture", "--model", "h3-tiny", "--out", store, "--layers", "0",
                     "--steps", "0", "--quiet", "--overwrite")
    assert rc == 0 and "captured 1 entries" in out
    assert [e.name for e in open_capture(store).entries()] == ["transformer_blocks.0"]
    assert open_capture(store).attrs["model_name"] == "h3-tiny"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s.zarr"]


def test_archive_refuses_foreign_same_and_file_destinations(tmp_path, capsys, monkeypatch):
    src = small_store(tmp_path / "X.zarr")
    src_before = digest(src)
    other = foreign_tree(tmp_path / "other")
    other_before = digest(other)
    rc, _, err = cli(capsys, "archive", src, other)
    one_line_error(rc, err, "archive", str(other), "not a workbench capture store")
    rc, _, err = cli(capsys, "archive", src, other, "--overwrite")
    one_line_error(rc, err, "archive", str(other))
    assert digest(other) == other_before
    (tmp_path / "link.zarr").symlink_to(src, target_is_directory=True)
    monkeypatch.chdir(tmp_path)
    for dst in (src, "X.zarr", "./X.zarr/", "link.zarr", "../" + tmp_path.name + "/X.zarr"):
        rc, _, err = cli(capsys, "archive", "X.zarr", dst, "--overwrite")
        one_line_error(rc, err, "archive", "are the same store", str(src.resolve()))
    rc, _, err = cli(capsys, "archive", src, src / "inner.zarr")
    one_line_error(rc, err, "archive", "lies inside SRC")
    rc, _, err = cli(capsys, "archive", src, other / "notes.txt")
    one_line_error(rc, err, "archive", str(other / "notes.txt"), "not a directory")
    assert digest(src) == src_before and digest(other) == other_before


def test_archive_onto_a_store_needs_overwrite_and_swaps_only_on_success(tmp_path, capsys):
    src = small_store(tmp_path / "X.zarr")
    dst = tmp_path / "A.zarr"
    rc, out, _ = cli(capsys, "archive", src, dst)
    assert rc == 0 and "archived 3 entries" in out
    before = digest(dst)
    rc, _, err = cli(capsys, "archive", src, dst)
    one_line_error(rc, err, "archive", str(dst), "already exists", "--overwrite")
    # A failing archive (a corrupt source chunk) leaves the old DST as it was, and no temp dir.
    chunk = next((src / "entries/s00000/transformer_blocks.2/k/c").rglob("*"))
    while chunk.is_dir():
        chunk = next(chunk.iterdir())
    raw = bytearray(chunk.read_bytes())
    raw[10] ^= 0xFF
    chunk.write_bytes(bytes(raw))
    rc, _, err = cli(capsys, "archive", src, dst, "--overwrite")
    one_line_error(rc, err, "archive", "checksum mismatch", "transformer_blocks.2")
    assert digest(dst) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["A.zarr", "X.zarr"]
    raw[10] ^= 0xFF
    chunk.write_bytes(bytes(raw))
    rc, out, _ = cli(capsys, "archive", src, dst, "--overwrite", "--level", "9")
    assert rc == 0 and open_capture(dst).attrs["archive_compressor"] == "zstd:9"
    assert open_capture(dst).verify() == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["A.zarr", "X.zarr"]


def test_no_writer_puts_a_store_inside_another_store(tmp_path, capsys):
    """capture, import and archive refuse a destination inside an existing zarr store (the outer
    store would no longer verify), naming the outer store; nothing in it changes."""
    src = small_store(tmp_path / "X.zarr")
    before = digest(src)
    inner = src / "entries" / "s00000" / "nested.zarr"
    rc, _, err = cli(capsys, "capture", "--model", "h3-tiny", "--out", inner, "--layers", "0",
                     "--steps", "0", "--quiet")
    one_line_error(rc, err, "capture", str(inner), "inside the zarr store", str(src.resolve()))
    other = small_store(tmp_path / "Y.zarr")
    rc, _, err = cli(capsys, "archive", other, src / "a.zarr")
    one_line_error(rc, err, "archive", "inside the zarr store", str(src.resolve()))
    acts = tmp_path / "acts.pt"
    torch.save({"q": torch.randn(1, 8, 2, 4), "k": torch.randn(1, 8, 2, 4),
                "v": torch.randn(1, 8, 2, 4)}, acts)
    rc, _, err = cli(capsys, "import", acts, "--out", src / "imported.zarr")
    one_line_error(rc, err, "import", "inside the zarr store", str(src.resolve()))
    with pytest.raises(CaptureStoreError, match="inside the zarr store"):
        small_store(src / "entries" / "lib.zarr")
    assert digest(src) == before


def test_overwrite_through_a_symlink_is_refused_and_the_target_kept(tmp_path, capsys):
    real = small_store(tmp_path / "elsewhere" / "real.zarr")
    before = digest(real)
    link = tmp_path / "lnk.zarr"
    link.symlink_to(real, target_is_directory=True)
    for extra in (["--overwrite"], ["--resume"], []):
        rc, _, err = cli(capsys, "capture", "--model", "h3-tiny", "--out", link, "--layers",
                         "0", "--steps", "0", "--quiet", *extra)
        one_line_error(rc, err, "capture", str(link), "symbolic link", str(real))
    assert link.is_symlink() and digest(real) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["elsewhere", "lnk.zarr"]


def test_inspect_names_the_store_an_interrupted_overwrite_kept(tmp_path, capsys):
    """A writer killed between moving the old store aside and finishing leaves it in a hidden
    sibling; inspect says where, so the user can take it back."""
    store = small_store(tmp_path / "big.zarr", n=1)
    kept = small_store(tmp_path / ".big.zarr.replaced-123-456")
    rc, out, _ = cli(capsys, "inspect", store)
    assert rc == 0 and f"replaced store kept: {kept}" in out
    shutil.rmtree(kept)
    rc, out, _ = cli(capsys, "inspect", store)
    assert rc == 0 and "replaced store kept" not in out


# -- 2. a deleted chunk is an error, not zeros ------------------------------------------------

@pytest.mark.parametrize("kw", [{}, {"direct_writes": False}, {"compressor": "zstd:3"}],
                         ids=["direct", "zarr-write", "zstd"])
def test_chunk_record_lists_every_chunk_with_its_crc(tmp_path, kw):
    store = small_store(tmp_path / "c.zarr", n=1, chunk_bytes=64 * 32 * 2, **kw)
    attrs = json.loads((store / "entries/s00000/transformer_blocks.0/zarr.json").read_text())
    record = attrs["attributes"][CHUNK_RECORD]
    assert sorted(record) == ["k", "q", "v"]
    for name, chunks in record.items():
        folder = store / "entries/s00000/transformer_blocks.0" / name
        files = sorted(p.relative_to(folder).as_posix() for p in (folder / "c").rglob("*")
                       if p.is_file())
        assert sorted(chunks) == files and len(files) == 2  # one head per chunk, 2 heads
        for key, crc in chunks.items():
            assert (folder / key).read_bytes()[-4:] == crc.to_bytes(4, "little")


def test_deleted_chunk_is_an_error_naming_entry_array_and_chunk(tmp_path, capsys):
    store = small_store(tmp_path / "d.zarr", chunk_bytes=64 * 32 * 2)
    (store / "entries/s00000/transformer_blocks.1/v/c/0/0/1/0").unlink()
    r = open_capture(store)
    with pytest.raises(MissingChunkError,
                       match=r"transformer_blocks\.1.*array 'v': chunk c/0/0/1/0 is missing"):
        r.qkv(0, 1)
    with pytest.raises(MissingChunkError):
        r.to_xarray()
    assert torch.equal(r.qkv(0, 2)[2].view(torch.int16), qkv(2)[2].view(torch.int16))
    problems = r.verify()
    assert len(problems) == 1 and "chunk c/0/0/1/0 is missing" in problems[0]
    rc, _, err = cli(capsys, "table", "--store", store, "--step", "0", "--layer", "1",
                     "--heads", "0-1")
    one_line_error(rc, err, "table", "transformer_blocks.1", "array 'v'", "c/0/0/1/0")
    rc, out, _ = cli(capsys, "inspect", store, "--verify")
    assert rc == 1 and "chunk c/0/0/1/0 is missing" in out


def test_store_without_chunk_records_reads_and_verify_says_it_lacks_them(tmp_path, capsys):
    """Stores written before chunk records keep working; verify notes what it cannot know."""
    store = small_store(tmp_path / "old.zarr")
    for f in (store / "entries").glob("*/*/zarr.json"):
        meta = json.loads(f.read_text())
        del meta["attributes"][CHUNK_RECORD]
        f.write_text(json.dumps(meta))
    r = open_capture(store)
    for i in range(3):
        assert all(torch.equal(a.view(torch.int16), b.view(torch.int16))
                   for a, b in zip(r.qkv(0, i), qkv(i)))
    problems, notes = r.verify_report()
    assert problems == [] and len(notes) == 1 and "3 complete entries predate chunk records" \
        in notes[0]
    rc, out, _ = cli(capsys, "inspect", store, "--verify")
    assert rc == 0 and "note: 3 complete entries predate chunk records" in out
    (store / "entries/s00000/transformer_blocks.0/q/c/0/0/0/0").unlink()
    assert any("chunk c/0/0/0/0 is missing (no chunk record" in p for p in r.verify())


def test_verify_notes_a_requested_entry_whose_folder_was_removed(tmp_path, capsys):
    """A removed entry folder leaves no chunk to miss: verify notes the requested (step, layer)
    entries the store lacks, naming the first, and stays quiet on the complete shipped capture."""
    shipped = Path(__file__).resolve().parents[1] / "captures" / "demo_h3_nano.zarr"
    assert open_capture(shipped).verify_report()[1] == []
    store = tmp_path / "demo.zarr"
    shutil.copytree(shipped, store)
    shutil.rmtree(store / "entries" / "s00003" / "transformer_blocks.2")
    problems, notes = open_capture(store).verify_report()
    assert problems == [] and len(notes) == 1
    assert "1 requested (step, layer) entry is not in the store" in notes[0]
    assert "first: step 3, layer 2" in notes[0] and f"{store}/zarr.json" in notes[0]
    rc, out, _ = cli(capsys, "inspect", store, "--verify")
    assert rc == 0 and "note: 1 requested (step, layer) entry" in out


# -- 3. resume refuses another run --------------------------------------------------------------

@pytest.mark.parametrize("args, field, stored, new", [
    (["--seed", "1"], "seed (--seed)", "0", "1"),
    (["--prompt", "a blue ball"], "prompt (--prompt)", '"a red ball bouncing"', '"a blue ball"'),
    (["--dtype", "float32"], "model_dtype (--dtype)", '"bfloat16"', '"float32"'),
    (["--num-steps", "6"], "sampling_grid_points (--num-steps", "4", "6"),
    (["--heads", "1"], "heads (--heads)", "null", "[1]"),
    (["--model", "h3-nano"], "model_name (--model)", '"h3-tiny"', '"h3-nano"'),
])
def test_resume_refuses_a_different_run_naming_the_field(cli_store, capsys, args, field, stored,
                                                         new):
    before = digest(cli_store)
    rc, _, err = cli(capsys, "capture", "--model", "h3-tiny", "--out", cli_store, "--layers",
                     "0-1", "--steps", "0-1", "--quiet", "--resume", *args)
    line = one_line_error(rc, err, "capture", str(cli_store), "--resume refused", field)
    assert f"store has {stored}" in line and f"this run has {new}" in line
    assert digest(cli_store) == before and not (cli_store / LOCK_NAME).exists()


def test_capture_records_the_attention_it_ran(cli_store, tmp_path, capsys):
    """`workbench capture` runs the model's own attention: its store says "native" (it recorded
    "bf16" by default, and any --recipe given, though neither ran); another --recipe is refused
    with the command that captures a run under a recipe; a store of an earlier release with the
    "bf16" label still resumes."""
    root = json.loads((cli_store / "zarr.json").read_text())
    assert root["attributes"]["recipe"] == "native"
    out = tmp_path / "r.zarr"
    rc, _, err = cli(capsys, "capture", "--model", "h3-tiny", "--out", out, "--layers", "0",
                     "--steps", "0", "--quiet", "--recipe", "fp8_dense")
    one_line_error(rc, err, "capture", "--recipe fp8_dense",
                   "workbench generate --recipe fp8_dense --capture STORE")
    assert not out.exists()
    old = tmp_path / "old.zarr"
    shutil.copytree(cli_store, old)
    root["attributes"]["recipe"] = PRESETS["bf16"].to_json()
    (old / "zarr.json").write_text(json.dumps(root))
    rc, out_text, err = cli(capsys, "capture", "--model", "h3-tiny", "--out", old, "--layers",
                            "0-1", "--steps", "0-1", "--quiet", "--resume")
    assert rc == 0 and "already complete" in out_text, err


def test_resume_of_a_complete_store_says_so_and_writes_nothing(cli_store, capsys):
    entries = digest(cli_store / "entries")
    rc, out, _ = cli(capsys, "capture", "--model", "h3-tiny", "--out", cli_store, "--layers",
                     "0-1", "--steps", "0-1", "--quiet", "--resume")
    assert rc == 0
    assert "nothing to capture: the store is already complete (4 already complete" in out
    assert digest(cli_store / "entries") == entries


def test_library_resume_refuses_another_seed(tmp_path):
    store = small_store(tmp_path / "s.zarr", n=1)
    with pytest.raises(RunMismatchError, match=r"seed \(--seed\): store has 0, this run has 5"):
        with capture(None, store, resume=True, seed=5, prompt="p", progress=False):
            pass


# -- 4. one writer at a time --------------------------------------------------------------------

HOLD_LOCK = textwrap.dedent("""
    import sys
    from workbench.capture.lock import StoreLock
    StoreLock(sys.argv[1]).acquire()
    print("LOCKED", flush=True)
    sys.stdin.read()
""")


def test_a_second_writer_is_refused_and_a_dead_holder_is_taken_over(tmp_path, capsys):
    store = tmp_path / "w.zarr"
    assert main(["capture", "--model", "h3-tiny", "--out", str(store), "--layers", "0-1",
                 "--steps", "0", "--quiet"]) == 0
    (store / "entries/s00000/transformer_blocks.1/zarr.json").unlink()  # leave work to resume
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(store)],
                              env=dict(os.environ, PYTHONPATH=str(REPO)), stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "LOCKED"
        before = digest(store)
        r = run_workbench("capture", "--model", "h3-tiny", "--out", store, "--layers", "0-1",
                          "--steps", "0", "--quiet", "--resume", cwd=tmp_path)
        one_line_error(r.returncode, r.stderr, "capture", str(store),
                       f"another writer holds this store (pid {holder.pid} on")
        with pytest.raises(StoreLockedError, match=f"pid {holder.pid}"):
            capture(None, store, resume=True, progress=False).__enter__()
        rc, out, _ = cli(capsys, "inspect", store, "--no-stats")
        assert f"writer lock: held by pid {holder.pid}" in out
        assert digest(store) == before
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    # The holder died without releasing: its lock is stale, and the next writer takes it over.
    assert read_holder(store)["pid"] == holder.pid
    rc, out, _ = cli(capsys, "inspect", store, "--no-stats")
    assert "writer lock: left by a writer that is gone (stale)" in out
    rc, out, _ = cli(capsys, "capture", "--model", "h3-tiny", "--out", store, "--layers", "0-1",
                     "--steps", "0", "--quiet", "--resume")
    assert rc == 0 and "captured 1 entries" in out and "1 already complete" in out
    assert not (store / LOCK_NAME).exists() and open_capture(store).verify() == []


def test_a_writer_refused_by_the_lock_leaves_the_holders_files_alone(tmp_path):
    """Between the destination check and the lock another writer may start in the same empty
    folder: the refused capture must not clean up what is not its own."""
    folder = tmp_path / "empty.zarr"
    folder.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(folder)],
                              env=dict(os.environ, PYTHONPATH=str(REPO)), stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "LOCKED"  # its store is not made yet
        before = digest(folder)
        with pytest.raises(StoreLockedError, match=f"pid {holder.pid}"):
            with capture(None, folder, progress=False):
                pass
        assert digest(folder) == before and read_holder(folder)["pid"] == holder.pid
    finally:
        holder.kill()
        holder.wait()


def test_lock_without_flock_falls_back_to_the_recorded_pid(tmp_path):
    """A lock file whose holder pid is dead on this host is stale even when nothing holds the
    flock (a filesystem without flock); a live holder on another host is not."""
    store = tmp_path / "s"
    store.mkdir()
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    lock = StoreLock(store)
    (store / LOCK_NAME).write_text(json.dumps({"pid": dead.pid, "host": os.uname().nodename}))
    assert holder_is_stale({"pid": dead.pid, "host": os.uname().nodename})
    assert not holder_is_stale({"pid": os.getpid(), "host": os.uname().nodename})
    assert not holder_is_stale({"pid": dead.pid, "host": "another-host.example"})
    lock.acquire()
    assert lock.took_over["pid"] == dead.pid and read_holder(store)["pid"] == os.getpid()
    lock.release()
    assert not (store / LOCK_NAME).exists()


# -- 5. verify names every damaged file ---------------------------------------------------------

def test_verify_lists_every_damaged_entry_naming_the_file(tmp_path, capsys):
    store = tmp_path / "m.zarr"
    with capture(None, store, progress=False, chunk_bytes=64 * 32 * 2) as cap:
        for step in (0, 1):
            for i in range(3):
                cap.record(f"transformer_blocks.{i}", *qkv(10 * step + i), step=step, layer=i)

    def edit(rel, fn):
        f = store / rel
        meta = json.loads(f.read_text())
        fn(meta)
        f.write_text(json.dumps(meta))

    edit("entries/s00000/transformer_blocks.0/k/zarr.json",
         lambda m: m.__setitem__("shape", [1, 60, 2, 32]))
    edit("entries/s00000/transformer_blocks.1/zarr.json",
         lambda m: m["attributes"].__setitem__("torch_dtype", "uint16"))
    (store / "entries/s00001/zarr.json").write_text('{"zarr_format": 3 "node_type": "group"}')
    (store / "entries/s00001/transformer_blocks.2/q/c/0/0/0/0").unlink()
    rc, out, err = cli(capsys, "inspect", store, "--verify")  # stats on
    assert rc == 1 and "Traceback" not in err
    assert "verify: 4 problem(s)" in out
    for want in (f"{store}/entries/s00000/transformer_blocks.0/k/zarr.json: shape is "
                 f"[1, 60, 2, 32], but the entry attributes say [1, 64, 2, 32]",
                 f"{store}/entries/s00000/transformer_blocks.1/zarr.json: torch_dtype is "
                 f"'uint16'",
                 f"{store}/entries/s00001/zarr.json: not valid JSON (Expecting ',' delimiter",
                 "entries/s00001/transformer_blocks.2 array 'q': chunk c/0/0/0/0 is missing"):
        assert want in out, want
    assert "norms leave out 2 damaged entries" in out  # the stats pass skipped, not stopped
    rc, _, err = cli(capsys, "table", "--store", store, "--step", "0", "--layer", "0",
                     "--heads", "0-1")
    one_line_error(rc, err, "table", "transformer_blocks.0/k/zarr.json: shape is")
    assert "shapes differ" not in err
    rc, _, err = cli(capsys, "table", "--store", store, "--step", "0", "--layer", "1",
                     "--heads", "0-1")
    one_line_error(rc, err, "table", "transformer_blocks.1/zarr.json", "torch_dtype")
    with pytest.raises(MetadataError, match="transformer_blocks.1/zarr.json"):
        open_capture(store).qkv(0, 1)
    # The resume refuses to write under a damaged step group, naming it.
    with pytest.raises(MetadataError, match="entries/s00001/zarr.json: not valid JSON"):
        with capture(None, store, resume=True, progress=False):
            pass


# -- 7. steps checked before any work; a failed capture leaves nothing --------------------------

@pytest.mark.parametrize("args, needles", [
    (["--steps", "-1"], ["--steps: '-1' is not a non-negative integer"]),
    (["--steps", "999"], ["--steps: [999] outside the sampling schedule", "--num-steps 4",
                          "steps 0-2"]),
    (["--num-steps", "0"], ["--num-steps: need at least 2 sigma grid points"]),
    (["--num-steps", "1"], ["--num-steps: need at least 2"]),
    (["--layers", "99"], ["--layers: [99] out of range for h3-tiny, which has 2 blocks"]),
    (["--heads", "7"], ["--heads: [7] out of range for h3-tiny, which has 2 query heads"]),
])
def test_capture_checks_the_selection_before_any_work(tmp_path, capsys, args, needles):
    out = tmp_path / "s.zarr"
    rc, _, err = cli(capsys, "capture", "--model", "h3-tiny", "--out", out, "--quiet", *args)
    one_line_error(rc, err, "capture", *needles)
    assert not out.exists()


@pytest.mark.parametrize("args, needles", [
    (["--steps", "0"], ["--steps: need at least 2 sigma grid points", "got 0"]),
    (["--steps", "3", "--capture-steps", "99"],
     ["--capture-steps: [99] outside the sampling schedule", "--steps 3", "steps 0-1"]),
    (["--capture-steps", "0,10,49"], ["--capture-steps: [49] outside", "default 50-point grid",
                                      "steps 0-48"]),
    (["--steps", "3", "--layers", "99"], ["--layers: [99] out of range for h3-tiny"]),
])
def test_generate_checks_steps_before_any_work(tmp_path, capsys, args, needles):
    rc, _, err = cli(capsys, "generate", "--model", "h3-tiny", "--out", tmp_path / "g",
                     "--capture", tmp_path / "g.zarr", "--quiet", *args)
    one_line_error(rc, err, "generate", *needles)
    assert sorted(tmp_path.iterdir()) == []


def test_sampler_refuses_zero_steps_instead_of_the_default():
    from workbench.models import load_model

    h3 = load_model("h3-tiny")
    with pytest.raises(ValueError, match=r"steps: need at least 2 sigma grid points \(1 model "
                                         r"call\), got 0"):
        h3.sample("red", steps=0)
    assert h3.schedule_steps(None) == 49 and h3.schedule_steps(4) == 3


def test_library_capture_of_steps_the_run_never_reaches_is_an_error(tmp_path):
    """capture(steps=[0, 10, 49]) around a 49-call loop (steps 0-48): step 49 never comes."""
    store = tmp_path / "s.zarr"
    with pytest.raises(CaptureStoreError, match=r"steps \[49\] were requested \(--steps\) "
                       r"but the run never reached them \(it ran steps 0-48\)"):
        with capture(None, store, steps=[0, 10, 49], progress=False) as cap:
            for i in range(49):
                cap.step(i)
                if cap.wants(i, 0):
                    cap.record("transformer_blocks.0", *qkv(i), layer=0)
    assert sorted(e.step for e in open_capture(store).entries()) == [0, 10]  # kept


def test_a_capture_that_fails_before_its_first_entry_leaves_nothing(tmp_path):
    new = tmp_path / "a" / "b" / "new.zarr"
    with pytest.raises(RuntimeError):
        with capture(None, new, progress=False):
            raise RuntimeError("model crashed")
    assert sorted(tmp_path.iterdir()) == []  # the folders it made are gone too
    empty = tmp_path / "empty.zarr"
    empty.mkdir()
    with pytest.raises(RuntimeError):
        with capture(None, empty, progress=False):
            raise RuntimeError("model crashed")
    assert empty.is_dir() and list(empty.iterdir()) == []  # as it was: empty, not removed
    # After one complete entry the store is kept (resume continues it).
    kept = tmp_path / "kept.zarr"
    with pytest.raises(RuntimeError):
        with capture(None, kept, progress=False) as cap:
            cap.record("transformer_blocks.0", *qkv(0), step=0, layer=0)
            raise RuntimeError("model crashed")
    assert [e.complete for e in open_capture(kept).entries()] == [True]
    # The corrected command runs at once on the path the failed one used.
    small_store(new, n=1)
    assert open_capture(new).verify() == []


# -- 8. one-line errors --------------------------------------------------------------------------

def _file(tmp_path) -> Path:
    f = tmp_path / "existing.txt"
    f.write_text("not yours to overwrite")
    return f


@pytest.mark.parametrize("make_args, command, needles", [
    (lambda t, s, f: ["capture", "--out", f, "--quiet"], "capture", ["not a directory"]),
    (lambda t, s, f: ["archive", s, f], "archive", ["DST", "not a directory"]),
    (lambda t, s, f: ["generate", "--model", "h3-tiny", "--out", f], "generate",
     ["--out", "exists and is a file"]),
    (lambda t, s, f: ["compare", "--recipes", "bf16", "--model", "h3-tiny", "--out", f],
     "compare", ["--out", "exists and is a file"]),
    (lambda t, s, f: ["report", s, "--out", f], "report", ["--out", "exists and is a file"]),
    (lambda t, s, f: ["demo", "--out", f, "--quick"], "demo", ["--out", "exists and is a file"]),
    (lambda t, s, f: ["table", "--synthetic", "small", "--json", t], "table",
     ["--json", "is a folder"]),
    (lambda t, s, f: ["table", "--synthetic", "small", "--md", t], "table",
     ["--md", "is a folder"]),
    (lambda t, s, f: ["table", "--synthetic", "small", "--queries", "-5"], "table",
     ["argument --queries: expected a positive integer, got -5"]),
    (lambda t, s, f: ["table", "--synthetic", "small", "--queries", "0"], "table",
     ["argument --queries", "got 0"]),
    (lambda t, s, f: ["report", s, "--out", t / "r", "--queries", "-5"], "report",
     ["argument --queries"]),
    (lambda t, s, f: ["table", "--synthetic", "small", "--heads", "abc"], "table",
     ["--heads: 'abc' is not a non-negative integer"]),
    (lambda t, s, f: ["report", s, "--out", t / "r", "--heads", "5"], "report",
     ["--heads: [5] not captured", "captured query heads: [0, 1]"]),
    (lambda t, s, f: ["archive", s, s.parent / "copy.zarr", "--level", "0"], "archive",
     ["argument --level"]),
    (lambda t, s, f: ["capture", "--out", t / "n.zarr", "--layers", "0-x"], "capture",
     ["--layers: '0-x'"]),
])
def test_bad_input_is_one_line_naming_it(tmp_path, capsys, cli_store, make_args, command,
                                         needles):
    f = _file(tmp_path)
    before = digest(tmp_path)
    store_before = digest(cli_store)
    rc, _, err = cli(capsys, *make_args(tmp_path, cli_store, f))
    one_line_error(rc, err, command, *needles)
    assert digest(tmp_path) == before and digest(cli_store) == store_before


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
@pytest.mark.parametrize("args", [
    ["table", "--synthetic", "small"],
    ["generate", "--model", "h3-tiny", "--out", "{t}/g"],
    ["compare", "--recipes", "bf16", "--model", "h3-tiny", "--out", "{t}/c"],
    ["report", "{s}", "--out", "{t}/r"],
])
def test_device_cuda_without_cuda_is_one_line(tmp_path, capsys, cli_store, args):
    args = [a.format(t=tmp_path, s=cli_store) for a in args]
    rc, _, err = cli(capsys, *args, "--device", "cuda")
    one_line_error(rc, err, args[0], "--device cuda: CUDA is not available")
    assert sorted(tmp_path.iterdir()) == []


@pytest.mark.parametrize("make_args, command", [
    (lambda ro, s: ["capture", "--out", ro / "wb-test.zarr", "--quiet"], "capture"),
    (lambda ro, s: ["archive", s, ro / "wb-test.zarr"], "archive"),
    (lambda ro, s: ["generate", "--model", "h3-tiny", "--out", ro / "wb-g"], "generate"),
    (lambda ro, s: ["table", "--synthetic", "small", "--json", ro / "wb-t.json"], "table"),
    (lambda ro, s: ["report", s, "--out", ro / "wb-r"], "report"),
    (lambda ro, s: ["demo", "--out", ro / "wb-demo", "--quick"], "demo"),
])
def test_read_only_output_is_one_line_naming_the_path(read_only_dir, cli_store, capsys,
                                                      make_args, command):
    args = make_args(read_only_dir, cli_store)
    rc, _, err = cli(capsys, *args)
    one_line_error(rc, err, command, str(read_only_dir))


def test_demo_write_failure_midway_names_the_path(tmp_path, capsys):
    """An OSError from deep inside a command (past every input check) is still one line naming
    the path: `workbench demo` writing its table where a folder sits."""
    (tmp_path / "accuracy_table.md").mkdir()
    rc, _, err = cli(capsys, "demo", "--out", tmp_path, "--quick")
    one_line_error(rc, err, "demo", str(tmp_path / "accuracy_table.md"), "Is a directory")


DISK_FULL = textwrap.dedent("""
    import resource, signal, sys
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (64, 64))  # every metadata write now fails (EFBIG)
    from workbench.cli import main
    sys.exit(main(sys.argv[1:]))
""")


def test_resume_while_the_disk_is_still_full_is_one_line(cli_store, tmp_path):
    store = tmp_path / "full.zarr"
    shutil.copytree(cli_store, store)
    (store / "entries/s00001/transformer_blocks.1/zarr.json").unlink()
    before = digest(store)
    r = subprocess.run([sys.executable, "-c", DISK_FULL, "capture", "--model", "h3-tiny",
                        "--out", str(store), "--layers", "0-1", "--steps", "0-1", "--quiet",
                        "--resume"], env=dict(os.environ, PYTHONPATH=str(REPO)),
                       capture_output=True, text=True, timeout=600)
    one_line_error(r.returncode, r.stderr, "capture", str(store), "file size limit reached",
                   "free space, then resume (--resume)")
    assert digest(store) == before


# -- 9. one integer-list grammar ----------------------------------------------------------------

def test_int_list_grammar():
    from workbench.cli_args import parse_int_list

    assert parse_int_list("0,2,5", "--x") == [0, 2, 5]
    assert parse_int_list("0-3", "--x") == [0, 1, 2, 3]
    assert parse_int_list(" 5, 0-2 ,1 ", "--x") == [5, 0, 1, 2]  # order kept, repeats dropped
    assert parse_int_list("all", "--x") is None and parse_int_list(None, "--x") is None
    for bad, msg in (("", "empty"), ("-1", "'-1' is not"), ("3-1", "runs backwards"),
                     ("1,,2", "'' is not"), ("a", "'a' is not"), ("0-99999999", "expands to"),
                     ("1.5", "'1.5' is not")):
        with pytest.raises(ValueError, match=f"^--x: .*{msg}"):
            parse_int_list(bad, "--x")
    with pytest.raises(ValueError, match="'all' is not"):
        parse_int_list("all", "--heads", allow_all=False)


@pytest.mark.parametrize("args, command, flag", [
    (["capture", "--out", "{t}/c.zarr", "--layers", "1-x"], "capture", "--layers"),
    (["capture", "--out", "{t}/c.zarr", "--steps", "1-x"], "capture", "--steps"),
    (["capture", "--out", "{t}/c.zarr", "--heads", "1-x"], "capture", "--heads"),
    (["generate", "--model", "h3-tiny", "--out", "{t}/g", "--layers", "1-x"], "generate",
     "--layers"),
    (["generate", "--model", "h3-tiny", "--out", "{t}/g", "--capture-steps", "1-x"], "generate",
     "--capture-steps"),
    (["table", "--synthetic", "small", "--heads", "1-x"], "table", "--heads"),
    (["report", "{s}", "--out", "{t}/r", "--heads", "1-x"], "report", "--heads"),
])
def test_every_cli_uses_the_same_list_grammar(tmp_path, capsys, cli_store, args, command, flag):
    args = [a.format(t=tmp_path, s=cli_store) for a in args]
    rc, _, err = cli(capsys, *args)
    one_line_error(rc, err, command, f"{flag}: '1-x' is not a non-negative integer or a range "
                   f"(in '1-x'); give integers like 0,2,5 or ranges like 0-3")


def test_ranges_select_the_same_entries_in_capture_and_table(cli_store, capsys):
    assert sorted((e.step, e.layer) for e in open_capture(cli_store).entries()) == [
        (0, 0), (0, 1), (1, 0), (1, 1)]
    rc, out, _ = cli(capsys, "table", "--store", cli_store, "--step", "1", "--layer", "0",
                     "--heads", "0-1", "--queries", "8")
    assert rc == 0 and "| Head | 0 | 1 |" in out


@pytest.mark.parametrize("edit, message", [
    ({"rotated_channels": 500}, "attribute 'rotated_channels' is 500, not a channel count of "
                                "the entries' head dim 128"),
    ({"segment_layout": {"text": 4, "conditioning": 0, "audio": 32, "video": 100}},
     "attribute 'segment_layout': its segments sum to 136 rows, but the entries hold 164"),
])
def test_root_attributes_that_contradict_the_entries_are_named(tmp_path, capsys, edit, message):
    """A root attribute that does not fit the entries (a RoPE channel count past the head dim, a
    layout that does not sum to the sequence) is refused by every reader naming the store's
    zarr.json and the attribute, and listed by `inspect --verify` (before: "rotated: the RoPE
    channel count must be ..." / "layout: segments sum to ..." naming neither, and `--verify`
    said the metadata was valid)."""
    store = tmp_path / "cap.zarr"
    shutil.copytree(Path(__file__).resolve().parents[1] / "captures" / "demo_h3_nano.zarr",
                    store)
    root = store / "zarr.json"
    meta = json.loads(root.read_text())
    meta["attributes"].update(edit)
    root.write_text(json.dumps(meta))
    assert main(["table", "--store", str(store), "--step", "7", "--layer", "1",
                 "--queries", "16"]) == 2
    err = capsys.readouterr().err
    assert f"{root}: {message}" in err, err
    assert main(["inspect", str(store), "--verify", "--no-stats"]) == 1
    assert f"{root}: {message}" in capsys.readouterr().out


def test_inspect_tells_damaged_metadata_from_an_interrupted_entry(tmp_path, capsys):
    """`inspect` without --verify lists an entry whose zarr.json is damaged as damaged, with the
    file and the problem (before: "INCOMPLETE ... resume the capture to rewrite")."""
    store = tmp_path / "cap.zarr"
    shutil.copytree(Path(__file__).resolve().parents[1] / "captures" / "demo_h3_nano.zarr",
                    store)
    meta = store / "entries" / "s00007" / "transformer_blocks.1" / "zarr.json"
    meta.write_text(meta.read_text()[:40])
    assert main(["inspect", str(store), "--no-stats"]) == 0
    out = capsys.readouterr().out
    assert "INCOMPLETE" not in out and "DAMAGED METADATA" in out and f"{meta}: not valid JSON" \
        in out, out

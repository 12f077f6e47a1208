"""Where a store may be written, and how one is replaced or removed without touching other files.

Rules (every writer: capture, resume, overwrite, archive):

- a path that does not exist, or an empty directory, may receive a new store;
- an existing file, or a directory that is not a workbench capture store (no ``zarr.json`` with
  ``schema = "workbench.capture"``), is refused, naming the path; ``--overwrite`` does not change
  that, because it may only replace a capture store;
- a store that holds files the store layout does not own (anything but ``zarr.json``,
  ``entries/`` and the writer lock at the top level) is not replaced either: those files would go
  with it;
- a store is replaced by building the new one beside it (a temporary sibling) and swapping, so a
  failure leaves the old store intact; a writer killed in between leaves the old store in the
  sibling ``.NAME.replaced-*``, which ``inspect`` names;
- a destination inside another zarr store (a folder above it holds ``zarr.json``), or given as a
  symbolic link, is refused: the outer store would stop verifying; replacing through a link would
  empty the store it points at.

Removal only ever deletes the store-owned names (``STORE_NAMES``), never a whole tree blindly.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

from .schema import LOCK_NAME, SCHEMA_NAME, CaptureStoreError, SchemaVersionError

# Top-level names a capture store owns; everything under entries/ is the store's.
STORE_NAMES = ("zarr.json", "entries", LOCK_NAME)


def store_schema_of(path: Path) -> str | None:
    """The root ``schema`` attribute of the zarr group at ``path`` ('' when the JSON is not a
    readable zarr group; None when there is no zarr.json)."""
    meta = path / "zarr.json"
    if not meta.is_file():
        return None
    try:
        attrs = json.loads(meta.read_text()).get("attributes")
        return str(attrs.get("schema", "")) if isinstance(attrs, dict) else ""
    except (OSError, ValueError, AttributeError):
        return ""


def is_capture_store(path: str | os.PathLike) -> bool:
    p = Path(path)
    return p.is_dir() and store_schema_of(p) == SCHEMA_NAME


_ZARR_MARKERS = ("zarr.json", ".zgroup", ".zarray")


def _is_zarr_node(d: Path) -> bool:
    """A zarr group or array: its metadata file parses as JSON with ``zarr_format`` (any file
    merely named zarr.json, e.g. a project's own, does not make a folder a store)."""
    for m in _ZARR_MARKERS:
        meta = d / m
        if meta.is_file():
            try:
                data = json.loads(meta.read_text())
            except (OSError, ValueError, UnicodeDecodeError):
                continue
            if isinstance(data, dict) and "zarr_format" in data:
                return True
    return False


def _outermost_store(path: Path) -> Path | None:
    found = None
    for d in (path, *path.parents):
        if d.is_dir() and _is_zarr_node(d):
            found = d
    return found


def enclosing_store(path: str | os.PathLike) -> Path | None:
    """The outermost directory at or above ``path`` (made absolute; symlinks followed too) that
    is a zarr store of any kind (``_is_zarr_node``), or None. A file or store written below it
    would land inside that store's tree."""
    p = Path(os.path.abspath(path))
    real = Path(os.path.realpath(p))
    return _outermost_store(p) or (_outermost_store(real) if real != p else None)


def check_outside_stores(path: str | os.PathLike, flag: str = "", *,
                         above_only: bool = False) -> None:
    """Refuse ``path`` when it is a zarr store or lies inside one (``enclosing_store``), naming
    both: what is written there would change that store. above_only: only a folder above
    ``path`` counts (an output file, or a store writer whose own path may be the store it
    replaces)."""
    # realpath: an output file that is a symbolic link is written where the link points
    probe = Path(os.path.realpath(path)).parent if above_only else path
    outer = enclosing_store(probe)
    if outer is not None:
        where = f"{flag} {path}" if flag else str(path)
        raise CaptureStoreError(f"{where}: is or lies inside the zarr store {outer}; writing "
                                "there would change that store: choose a path outside it")


def check_not_inside_store(path: str | os.PathLike, flag: str = "") -> None:
    """``check_outside_stores(path, flag, above_only=True)``."""
    check_outside_stores(path, flag, above_only=True)


def foreign_names(store: Path, limit: int = 5) -> list[str]:
    """Top-level entries of ``store`` that a capture store does not own (at most ``limit``)."""
    out = []
    for p in sorted(store.iterdir()):
        if p.name not in STORE_NAMES:
            out.append(p.name + ("/" if p.is_dir() else ""))
            if len(out) >= limit:
                break
    return out


def _examples(path: Path, limit: int = 3) -> str:
    names = []
    for p in sorted(path.iterdir())[:limit]:
        names.append(p.name + ("/" if p.is_dir() else ""))
    return ", ".join(names)


def check_target(path: str | os.PathLike, *, resume: bool = False, overwrite: bool = False,
                 flag: str = "", can_resume: bool = True) -> str:
    """Classify ``path`` as a store destination, refusing what must not be written.

    Returns "new" (missing, or an empty directory), "resume" (a store to continue) or "replace"
    (a store to overwrite). Raises CaptureStoreError naming the path (after ``flag``, the CLI
    word for it) otherwise; ``can_resume=False`` for writers without ``--resume`` (archive).
    """
    p = Path(path)
    where = f"{flag} {p}" if flag else str(p)
    if p.is_symlink():
        # replacing through a link would empty the store it points at and leave a folder where
        # the link was; resuming would write a store other than the one named
        raise CaptureStoreError(f"{where}: is a symbolic link (to {os.readlink(p)}); give the "
                                "real path of the store")
    if p.exists() and not p.is_dir():
        raise CaptureStoreError(f"{where}: exists and is not a directory; a capture store is a "
                                f"directory: choose another path")
    check_not_inside_store(p, flag)
    if not p.exists():
        for parent in p.parents:  # the nearest existing ancestor must be a writable directory
            if parent.exists():
                if not parent.is_dir():
                    raise CaptureStoreError(f"{where}: {parent} is a file, not a directory")
                break
        return "new"
    if all(c.name == LOCK_NAME for c in p.iterdir()):
        return "new"  # empty, or a writer's lock only (stale: taken over; live: refused then)
    schema = store_schema_of(p)
    if schema != SCHEMA_NAME:
        what = (f"its zarr.json has schema={schema!r}" if schema is not None else
                f"it holds other files ({_examples(p)})")
        error = SchemaVersionError if schema is not None else CaptureStoreError
        raise error(
            f"{where}: exists and is not a workbench capture store ({what}); refusing to write "
            f"into it (--overwrite only replaces a capture store): choose a new path"
        )
    if resume:
        return "resume"
    if not overwrite:
        how = "pass --resume to continue it or --overwrite to replace it" if can_resume else \
            "pass --overwrite to replace it"
        raise CaptureStoreError(f"{where}: a capture store already exists; {how}")
    foreign = foreign_names(p)
    if foreign:
        raise CaptureStoreError(
            f"{where}: the store also holds files that are not part of it ({', '.join(foreign)})"
            f"; --overwrite would delete them: move them out first"
        )
    return "replace"


def replaced_leftovers(path: str | os.PathLike) -> list[Path]:
    """Stores an interrupted ``--overwrite`` of ``path`` left beside it (``sibling(path,
    "replaced")``: the writer was killed before it could put the old store back or delete it)."""
    p = Path(os.path.abspath(path))
    if not p.parent.is_dir():
        return []
    return sorted(x for x in p.parent.glob(f".{p.name}.replaced-*") if x.is_dir())


def remove_owned(folder: Path, names) -> None:
    """Delete the entries ``names`` of ``folder`` (the names a store layout owns), nothing else:
    never a whole tree blindly."""
    for name in names:
        p = folder / name
        if p.is_dir() and not p.is_symlink():
            shutil.rmtree(p)
        elif p.exists() or p.is_symlink():
            p.unlink()


def rename_into_place(new: Path, dst: Path, aside: Path) -> None:
    """Rename the finished ``new`` to ``dst``, whose old content was just renamed to ``aside``;
    if that fails, ``aside`` goes back to ``dst`` (the second half of a swap by renames)."""
    try:
        os.rename(new, dst)
    except BaseException:
        os.rename(aside, dst)
        raise


def remove_store_files(store: Path, keep_lock: bool = False) -> None:
    """Delete the store-owned names of ``store`` (not the directory, not other files);
    ``keep_lock``: leave the lock file to its holder's release."""
    remove_owned(store, [n for n in STORE_NAMES if not (keep_lock and n == LOCK_NAME)])


def remove_store(store: Path) -> None:
    """Delete a store directory that holds only store-owned names; leave anything else."""
    remove_store_files(store)
    try:
        store.rmdir()
    except OSError:
        pass  # not empty: something else lives there, keep it


def make_dirs(path: Path, made: list[Path] | None = None) -> list[Path]:
    """mkdir -p ``path``; the directories created are appended to ``made`` as they are made
    (outermost first, so a failure halfway still leaves the list of what to remove)."""
    made = [] if made is None else made
    for d in reversed([path, *path.parents]):
        if not d.exists():
            d.mkdir()
            made.append(d)
    return made


def remove_made_dirs(made: list[Path]) -> None:
    """rmdir the directories ``make_dirs`` created (innermost first), as long as they are empty."""
    for d in reversed(made):
        try:
            d.rmdir()
        except OSError:
            break


def sibling(path: Path, tag: str) -> Path:
    """A hidden, unique sibling path of ``path`` (same filesystem, so renames are atomic). The
    path is made absolute first: "." or "x/.." have no name of their own, and their "sibling"
    would lie inside them."""
    path = Path(os.path.abspath(path))
    return path.parent / f".{path.name}.{tag}-{os.getpid()}-{time.time_ns() % 10**9}"

"""Argument grammar shared by every ``workbench`` subcommand.

Integer lists (layers, steps, heads): ``0,2,5``, inclusive ranges ``0-3``, mixes ``0-3,8``, or
``all`` (every one: returned as None). Counts, devices and output paths are checked here too, before
any work starts. Every error is a ValueError (or argparse's own) naming the flag, which
``workbench.cli.main`` prints as one line ``workbench CMD: error: ...`` with exit status 2.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import tempfile
from pathlib import Path

MAX_LIST = 100_000  # longest list a range may expand to (a typo like 0-9999999999 is an error)
_ITEM = re.compile(r"(\d+)(?:-(\d+))?")
LIST_GRAMMAR = "integers like 0,2,5 or ranges like 0-3"


def _grammar(allow_all: bool) -> str:
    return LIST_GRAMMAR + (", or all" if allow_all else "")


def parse_int_list(text: str | None, flag: str, *, allow_all: bool = True) -> list[int] | None:
    """``0,2,5`` / ``0-3`` / ``0-3,8`` -> sorted-as-given list without repeats; ``all`` or None ->
    None (no selection). Negative numbers are not indices here and are refused."""
    if text is None:
        return None
    s = str(text).strip()
    if allow_all and s.lower() == "all":
        return None
    if not s:
        raise ValueError(f"{flag}: empty; give {_grammar(allow_all)}")
    out: list[int] = []
    seen: set[int] = set()
    for part in s.split(","):
        part = part.strip()
        m = _ITEM.fullmatch(part)
        if not m:
            raise ValueError(f"{flag}: {part!r} is not a non-negative integer or a range "
                             f"(in {s!r}); give {_grammar(allow_all)}")
        lo = int(m[1])
        hi = int(m[2]) if m[2] is not None else lo
        if hi < lo:
            raise ValueError(f"{flag}: range {part!r} runs backwards; write {hi}-{lo}")
        if hi - lo + len(out) >= MAX_LIST:
            raise ValueError(f"{flag}: {part!r} expands to more than {MAX_LIST} values")
        for x in range(lo, hi + 1):
            if x not in seen:
                seen.add(x)
                out.append(x)
    return out


def check_in_range(values: list[int] | None, n: int, flag: str, owner: str, unit: str) -> None:
    """Every value of an index list must lie in [0, n): '--layers: [99] out of range for h3-tiny,
    which has 2 blocks (0-1)'."""
    if values is None:
        return
    bad = [x for x in values if not 0 <= x < n]
    if bad:
        raise ValueError(f"{flag}: {bad} out of range for {owner}, which has {n} {unit} "
                         f"(0-{n - 1})")


def _int_at_least(lo: int, what: str):
    """argparse type: an integer >= lo (argparse names the flag in its one-line error)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
        if value < lo:
            raise argparse.ArgumentTypeError(f"expected {what}, got {value}")
        return value

    parse.__name__ = what  # argparse shows it for a type it cannot apply
    return parse


positive_int = _int_at_least(1, "a positive integer")
nonneg_int = _int_at_least(0, "an integer >= 0")


def check_device(text: str, flag: str = "--device") -> str:
    """A torch device string that exists on this machine."""
    import torch

    try:
        dev = torch.device(text)
    except (RuntimeError, TypeError):
        raise ValueError(f"{flag}: {text!r} is not a torch device (cpu, cuda, cuda:1, ...)") \
            from None
    if dev.type == "cuda":
        if not torch.cuda.is_available():
            raise ValueError(f"{flag} {text}: CUDA is not available on this machine (torch "
                             f"{torch.__version__}); use --device cpu")
        if dev.index is not None and dev.index >= torch.cuda.device_count():
            raise ValueError(f"{flag} {text}: this machine has {torch.cuda.device_count()} CUDA "
                             f"device(s)")
    elif dev.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"{flag} {text}: MPS is not available on this machine; use --device cpu")
    return text


def _nearest_existing(path: Path) -> Path:
    for p in (path, *path.parents):
        if p.exists():
            return p
    return Path(".")


def _probe_write(base: Path, flag: str, p: Path) -> None:
    """Create and delete a temporary file in ``base``: permission bits do not tell a read-only
    filesystem, or root, apart."""
    try:
        with tempfile.TemporaryFile(dir=base):
            pass
    except OSError as exc:
        raise ValueError(f"{flag} {p}: cannot write in {base} ({exc.strerror or exc})") from None


def check_out_dir(path, flag: str = "--out") -> Path:
    """An output folder: absent (it will be made) or a directory, where a file can be written
    (probed in the nearest existing folder)."""
    p = Path(path)
    if p.exists() and not p.is_dir():
        raise ValueError(f"{flag} {p}: exists and is a file, not a folder; choose another path")
    base = _nearest_existing(p)
    if not base.is_dir():
        raise ValueError(f"{flag} {p}: {base} is a file, not a folder")
    _probe_write(base, flag, p)
    return p


CLIP_FILES = ("video.mp4", "audio.wav", "clip.safetensors", "config.json")  # generate.write_clip
COMPARE_FILES = ("side_by_side.mp4", "metrics.json", "table.md", "curves.csv", "curves.svg")
# (file, keys) that tell a folder's earlier result from a user's files of the same names: the
# clip's config.json (generate.generate), the comparison's metrics.json (compare.compare_clips) and
# compare.json of `compare --recipes` (compare.compare_recipes).
CLIP_MARKER = ("config.json", ("model", "prompt", "seed", "recipe_string", "attention_calls"))
COMPARE_MARKER = ("metrics.json", ("reference", "test", "side_by_side"))
COMPARE_RECIPES_MARKER = ("compare.json", ("model", "prompt", "seed", "reference", "metrics"))
MAX_RESULT_JSON = 64 << 20  # a result JSON is far smaller; a larger file is not read to check


def json_has_keys(path, keys) -> bool:
    """Whether ``path`` is a JSON object file holding every one of ``keys``: how a command knows
    its own earlier result from a user's file of the same name."""
    p = Path(path)
    try:
        if not p.is_file() or p.stat().st_size > MAX_RESULT_JSON:
            return False
        data = json.loads(p.read_text(encoding="utf-8"))
    except (OSError, ValueError):  # unreadable, not UTF-8, not JSON: not ours
        return False
    return isinstance(data, dict) and all(k in data for k in keys)


def _holds(path: Path) -> bool:
    # an empty folder holds nothing a write could replace
    return path.exists() and not (path.is_dir() and not any(path.iterdir()))


# Left in an output folder while a command writes into it, removed when it finishes: a run
# interrupted midway (Ctrl-C, a failed figure export) leaves it, and with it the folder's partial
# files count as the command's own for --overwrite and a re-run of `make demo`, although the
# result's record (report.json, config.json, ...) is written last and is missing. It vouches only
# for the command it names and only for files written after it was made (a run that failed
# before writing anything removes it), so a user's older files beside it stay protected.
WRITING_MARK = ".workbench-writing"


def _read_mark(folder: Path) -> dict | None:
    try:
        data = json.loads((folder / WRITING_MARK).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


_WALK_LIMIT = 10000


def _files_under(path: Path):
    """(the files at or under `path`, without following links inside it, at most _WALK_LIMIT;
    whether the walk stopped at the limit). A link to a folder is walked (an --out may be one)."""
    if not path.is_dir():
        return [path], False
    out = []
    for root, _, files in os.walk(path):
        for f in files:
            if len(out) >= _WALK_LIMIT:
                return out, True
            out.append(Path(root) / f)
    return out, False


def _mtime(f: Path) -> float | None:
    try:
        return f.lstat().st_mtime
    except OSError:
        return None


def _wrote_since(path: Path, t0: float) -> bool:
    """Whether some file under `path` (other than the mark) was modified at or after t0 (a
    folder too big to walk counts as written: the mark is kept)."""
    files, truncated = _files_under(path)
    return truncated or any(f.name != WRITING_MARK and (_mtime(f) or -1.0) >= t0 for f in files)


def _all_written_since(path: Path, t0: float) -> bool:
    """Whether every file under `path` was modified at or after t0 (a file the marked run
    wrote), none before it (a user's file, or an older result's); a walk cut short: False."""
    files, truncated = _files_under(path)
    return not truncated and all((_mtime(f) or -1.0) >= t0 for f in files)


@contextlib.contextmanager
def writing_mark(out, command: str):
    """Mark the folder `out` (made if absent) as being written by `command` until the block
    ends without an exception (``WRITING_MARK``). A block that raises before writing any file
    removes the mark too (it would vouch for nothing). A mark of the same command left by an
    earlier interrupted run keeps that run's start time (its partial files stay its own)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    mark = out / WRITING_MARK
    old = _read_mark(out)
    mark.write_text("{}")  # its time is the run's start on the files' own clock and rounding (a
    # network filesystem's clock may differ from time.time(), another rounds to seconds)
    t_run = started = mark.stat().st_mtime
    if old is not None and old.get("command") == command and \
            isinstance(old.get("started_unix"), (int, float)):
        started = min(started, float(old["started_unix"]))
    mark.write_text(json.dumps({"command": command, "pid": os.getpid(),
                                "started_unix": started}))
    try:
        yield
    except BaseException:
        if not _wrote_since(out, t_run):  # this run wrote nothing: its mark vouches for nothing
            if old is None:
                mark.unlink(missing_ok=True)
            else:
                mark.write_text(json.dumps(old))
        raise
    mark.unlink(missing_ok=True)


def interrupted_here(path, commands=None, names=None) -> bool:
    """Whether a workbench command (one of `commands`, default any) was interrupted while
    writing into the folder `path`, and every file of `names` there (default: all the folder's
    files) was written by that run (after its mark was made)."""
    p = Path(path)
    mark = _read_mark(p)
    if mark is None:
        return False
    if commands is not None and mark.get("command") not in commands:
        return False
    t0 = mark.get("started_unix")
    if not isinstance(t0, (int, float)):
        return False
    targets = [p / n for n in names] if names is not None else [p]
    return all(_all_written_since(t, float(t0)) for t in targets if t.exists())


def check_no_clobber(path, names, *, flag: str = "--out", overwrite: bool = False,
                     marker: tuple[str, tuple[str, ...]] | None = None,
                     command: str | None = None) -> None:
    """Refuse to write `names` into the folder `path` when it already holds one of them (an
    earlier result), naming the file, unless `overwrite` (then those files are replaced and
    nothing else in the folder is touched). names=None: the folder must be absent or empty.

    marker (file, keys): with `overwrite`, the folder must also hold that file with those JSON
    keys (the earlier result's own record), so that --overwrite never replaces a user's files
    that merely share a name (a config.json, a report.md) with the command's; or the folder holds
    the writing mark of an interrupted run of `command` that wrote those files itself
    (``interrupted_here``)."""
    p = Path(path)
    if not p.is_dir():
        return
    if names is None:
        held = [q.name for q in sorted(p.iterdir())[:1]]
    else:
        held = [n for n in names if _holds(p / n)]
    if not held:
        return
    if not overwrite:
        if names is None:
            raise ValueError(f"{flag} {p}: not empty (holds {held[0]}); choose a new folder "
                             "or pass --overwrite to replace the results in it")
        raise ValueError(f"{flag} {p}: already holds {held[0]}; choose a new folder, or pass "
                         "--overwrite to replace an earlier result there")
    if marker is not None and not json_has_keys(p / marker[0], marker[1]) and \
            not interrupted_here(p, None if command is None else (command,),
                                 None if names is None else held):
        what = "is not" if (p / marker[0]).exists() else "is missing, so the folder is not"
        raise ValueError(f"{flag} {p}: --overwrite replaces only an earlier result of this "
                         f"command, and {p / marker[0]} {what} one (the folder holds {held[0]}); "
                         "choose a new folder")


def check_out_file(path, flag: str, *, own=None, kind: str = "result") -> Path:
    """An output file: not a directory, in a folder that exists or can be made. An existing
    non-empty file is replaced only when ``own(path)`` recognises it as an earlier `kind` (the
    same command's output, re-run); anything else there is refused, naming it."""
    p = Path(path)
    if p.is_dir():
        raise ValueError(f"{flag} {p}: is a folder; give a file path (e.g. {p / 'table.json'})")
    if p.parent != p and p.parent.exists() and not p.parent.is_dir():
        raise ValueError(f"{flag} {p}: {p.parent} is a file, not a folder")
    base = _nearest_existing(p.parent)
    if not base.is_dir():
        raise ValueError(f"{flag} {p}: {base} is a file, not a folder")
    # an empty file holds nothing; /dev/null and other non-files are not replaced by a write
    if p.is_file() and p.stat().st_size > 0 and not (own is not None and own(p)):
        raise ValueError(f"{flag} {p}: already exists and is not an earlier {kind}; choose "
                         "another path (only a file this command wrote is replaced)")
    _probe_write(base, flag, p)
    return p

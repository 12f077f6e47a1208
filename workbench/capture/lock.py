"""The writer lock of a capture store: one writer at a time, readers never blocked.

A writer (capture, resume, overwrite, archive onto a store) holds ``STORE/.workbench-writer.lock``
for as long as it writes. The file holds the holder's pid, host, start time and command line (for
the refusal message and for ``workbench inspect``). Mutual exclusion is ``flock`` on that file: the
kernel drops it when the holder dies, SIGKILL included, so a lock left by a killed capture is stale
by construction and the next writer takes it over. On a filesystem without ``flock`` the recorded
holder decides: a dead pid on this host is stale, anything else is refused.

The file is removed on release while the lock is still held; a writer that locked a file which was
removed or replaced in the meantime (``fstat`` vs ``stat`` inode) retries on the new file, so two
writers can never both hold the lock.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import sys
import time
from pathlib import Path

from .schema import LOCK_NAME, StoreLockedError

try:
    import fcntl
except ImportError:  # pragma: no cover - not on POSIX
    fcntl = None


def holder_info() -> dict:
    return {"pid": os.getpid(), "host": socket.gethostname(), "start_unix": time.time(),
            "start": time.strftime("%Y-%m-%d %H:%M:%S %z"), "command": " ".join(sys.argv)[:500]}


def read_holder(store: str | os.PathLike) -> dict | None:
    """The recorded holder of ``store``'s lock, or None (no lock file, empty or unreadable)."""
    try:
        text = (Path(store) / LOCK_NAME).read_text()
        info = json.loads(text) if text.strip() else None
    except (OSError, ValueError):
        return None
    return info if isinstance(info, dict) else None


def pid_alive(pid) -> bool:
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except (PermissionError, ValueError, TypeError, OverflowError):
        return True  # exists but not ours (or unparsable: do not call it dead)
    return True


def holder_is_stale(info: dict | None) -> bool:
    """A recorded holder is stale when it ran on this host and its pid is gone."""
    if not info:
        return True
    return info.get("host") == socket.gethostname() and not pid_alive(info.get("pid"))


def describe_holder(info: dict | None) -> str:
    if not info:
        return "another process (no holder recorded)"
    return (f"pid {info.get('pid')} on {info.get('host')} since {info.get('start')} "
            f"({info.get('command') or '?'})")


class StoreLock:
    """Exclusive writer lock on a store directory (which must exist). Use as a context manager
    or call ``acquire()`` / ``release()``. ``took_over`` holds the stale holder replaced, if any."""

    def __init__(self, store: str | os.PathLike):
        self.store = Path(store)
        self.path = self.store / LOCK_NAME
        self.fd: int | None = None
        self.took_over: dict | None = None

    def acquire(self) -> StoreLock:
        for _ in range(20):  # retries only when the file was replaced under us
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o644)
            locked = False
            try:
                if not self._lock_fd(fd):
                    raise StoreLockedError(
                        f"{self.store}: another writer holds this store "
                        f"({describe_holder(read_holder(self.store))}); wait for it to finish, "
                        f"or stop it; two writers would corrupt the store"
                    )
                try:
                    same = os.fstat(fd).st_ino == os.stat(self.path).st_ino
                except FileNotFoundError:
                    same = False
                if not same:  # released and removed between our open and our lock
                    os.close(fd)
                    continue
                locked = True
                previous = read_holder(self.store)
                if previous and previous.get("pid") != os.getpid():
                    self.took_over = previous
                data = json.dumps(holder_info()).encode()
                os.ftruncate(fd, 0)
                os.pwrite(fd, data, 0)
                os.fsync(fd)
            except BaseException:
                if locked:  # e.g. disk full while recording the holder: leave no lock file
                    try:
                        os.unlink(self.path)
                    except OSError:
                        pass
                os.close(fd)
                raise
            self.fd = fd
            return self
        raise StoreLockedError(f"{self.store}: could not take the writer lock {self.path}")

    def _lock_fd(self, fd: int) -> bool:
        if fcntl is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return True
            except BlockingIOError:
                return False
            except OSError as exc:
                if exc.errno not in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS):
                    raise
        # No flock on this filesystem: trust the recorded holder.
        info = read_holder(self.store)
        return info is None or info.get("pid") == os.getpid() or holder_is_stale(info)

    def moved(self, store: str | os.PathLike) -> None:
        """The locked store directory was renamed to ``store`` (the lock file went with it)."""
        self.store = Path(store)
        self.path = self.store / LOCK_NAME

    def release(self) -> None:
        if self.fd is None:
            return
        try:
            try:
                os.unlink(self.path)  # while still holding the lock (see the module docstring)
            except FileNotFoundError:
                pass
        finally:
            os.close(self.fd)
            self.fd = None

    def __enter__(self) -> StoreLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()

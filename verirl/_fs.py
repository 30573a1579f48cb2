"""File-system helpers for code that reads what others wrote and writes only where it may.

Reads never open anything but a regular file and never read more than a cap,
so a FIFO or a 10 GB file where a small JSON file belongs cannot hang or
exhaust the process. Writes never go through a symlink. Locks are
``flock`` locks (between threads as well as processes: each holder opens the
file itself) and every wait for one has a deadline.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import stat
import time
from collections.abc import Iterator
from pathlib import Path

__all__ = ["FileRefusedError", "expand_user", "flock_with_deadline", "lstat_kind", "read_capped"]

_CHUNK = 1 << 20
_FIRST_LOCK_POLL = 0.01
_MAX_LOCK_POLL = 0.25


class FileRefusedError(OSError):
    """A file that is not read on purpose: not a regular file, or larger than the cap."""


def expand_user(text: str) -> str | None:
    """``text`` with a leading ``~`` or ``~user`` expanded; None when it cannot be.

    `os.path.expanduser` leaves ``~nosuchuser`` as it is (and `pathlib` raises
    `RuntimeError`), so a path that still starts with ``~`` means "no such
    user" or "no home directory" and is reported instead of used literally.
    """
    if not text.startswith("~"):
        return text
    expanded = os.path.expanduser(text)  # noqa: PTH111 - pathlib raises RuntimeError instead
    return None if expanded.startswith("~") else expanded


def lstat_kind(path: Path) -> str | None:
    """``"dir"``, ``"file"``, ``"symlink"`` or ``"other"`` for ``path`` itself; None if absent."""
    try:
        mode = path.lstat().st_mode
    except (FileNotFoundError, NotADirectoryError):
        return None
    if stat.S_ISLNK(mode):
        return "symlink"
    if stat.S_ISDIR(mode):
        return "dir"
    return "file" if stat.S_ISREG(mode) else "other"


def read_capped(path: Path, limit: int, *, follow_symlinks: bool = True) -> bytes:
    """The bytes of the regular file ``path``, at most ``limit`` of them.

    Raises `FileRefusedError` for anything that is not a regular file (checked
    before opening, and again on the open descriptor) or is larger than
    ``limit``; other `OSError` as `os.open` raises them.
    """
    if not stat.S_ISREG((path.stat() if follow_symlinks else path.lstat()).st_mode):
        raise FileRefusedError(f"{path.name} is not a regular file")
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
    if not follow_symlinks:
        flags |= os.O_NOFOLLOW
    fd = os.open(path, flags)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise FileRefusedError(f"{path.name} is not a regular file")
        if info.st_size > limit:
            raise FileRefusedError(f"{path.name} is too large ({info.st_size} bytes > {limit})")
        chunks: list[bytes] = []
        total = 0
        while chunk := os.read(fd, min(_CHUNK, limit + 1 - total)):
            chunks.append(chunk)
            total += len(chunk)
            if total > limit:  # it grew while being read
                raise FileRefusedError(f"{path.name} is too large (> {limit} bytes)")
        return b"".join(chunks)
    finally:
        os.close(fd)


@contextlib.contextmanager
def flock_with_deadline(path: Path, timeout: float) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (created if missing, never through a symlink).

    Raises `TimeoutError` when the lock is still held by someone else after
    ``timeout`` seconds, `FileRefusedError` when ``path`` is not a regular file
    and `OSError` (``ELOOP``) when it is a symlink. The lock goes with the
    descriptor: a process that dies releases it.
    """
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
    fd = os.open(path, flags, 0o644)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise FileRefusedError(f"{path.name} is not a regular file")
        deadline = time.monotonic() + timeout
        pause = _FIRST_LOCK_POLL
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                left = deadline - time.monotonic()
                if left <= 0:
                    raise TimeoutError(f"{path} is still locked after {timeout:g}s") from None
                time.sleep(min(pause, left))
                pause = min(pause * 2, _MAX_LOCK_POLL)
        yield
    finally:
        os.close(fd)

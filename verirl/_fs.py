"""File-system helpers for code that reads what others wrote and writes only where it may.

Reads never open anything but a regular file and never read more than a cap,
so a FIFO or a 10 GB file where a small JSON file belongs cannot hang or
exhaust the process. Writes never go through a symlink. Locks are
``flock`` locks (between threads as well as processes: each holder opens the
file itself) and every wait for one has a deadline.

A scratch directory verirl may later delete is made with `make_owned_dir`: it
holds an ownership marker (`OWNER_MARKER`, with the random id that ends the
directory's name) from the moment it exists, and `read_owner_record` is how a
later process tells such a directory from a user's one with a similar name.
`remove_tree` deletes one, at any depth, never following a symlink.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import secrets
import stat
import time
from collections.abc import Iterator, Mapping
from pathlib import Path

__all__ = [
    "OWNER_MARKER",
    "FileRefusedError",
    "escape_bytes",
    "expand_user",
    "flock_with_deadline",
    "lstat_kind",
    "make_owned_dir",
    "own_outputs",
    "printable",
    "quoted",
    "read_capped",
    "read_owner_record",
    "remove_tree",
    "same_file",
    "shortened",
    "stdout_kept_in",
]

OWNER_MARKER = ".verirl-owner.json"
"""The file `make_owned_dir` writes first into every directory it makes."""
_OWNER_ID = re.compile(r"[0-9a-f]{32}")
_MAX_OWNER_RECORD = 64 << 20

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


def printable(value: str | os.PathLike[str]) -> str:
    r"""``value`` as any UTF-8 log line, message or terminal can show it.

    A name the OS hands over as bytes that are not UTF-8 arrives
    surrogate-escaped (``os.fsdecode(b"\xff") == "\udcff"``), which a UTF-8
    stream refuses to write: those bytes are shown as ``\xff`` (other lone
    surrogates, from JSON, as ``\ud800``), and control characters as ``repr``
    escapes them (``\n``, ``\x00``, ``\x1b``). Other text is returned as it is.
    Only for showing: the path itself is what is opened, passed and returned.
    """
    return escape_bytes(os.fspath(value)).translate(_CONTROLS)


def escape_bytes(text: str) -> str:
    r"""``text`` with the bytes that are not UTF-8 shown as ``\xff``, as `printable` shows them.

    For text of several lines (a log line quoting a server log's tail), which
    `printable` would fold into one.
    """
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        try:
            return os.fsencode(text).decode("utf-8", "backslashreplace")
        except UnicodeEncodeError:  # a surrogate that is no escaped byte
            return text.encode("utf-8", "backslashreplace").decode("utf-8")
    return text


def shortened(text: str, limit: int) -> str:
    """``text`` cut to about ``limit`` characters, at a space, with ``…`` where it was cut.

    Never in the middle of a word: a token cut through would keep its start,
    which no later scrub of the whole token matches. A first word longer than
    the limit is left out whole.
    """
    if len(text) <= limit:
        return text
    kept = text[: limit + 1]
    space = max(kept.rfind(" "), kept.rfind("\n"), kept.rfind("\t"))
    return f"{text[:space].rstrip() if space > 0 else ''}…"


def quoted(value: object) -> str:
    r"""``repr(value)``, bytes that are not UTF-8 shown as `printable` shows them (``\xff``).

    ``repr("x\udcff")`` writes the escaped byte as ``\udcff`` where the path
    beside it in the same message reads ``\xff``: one byte, one spelling.
    """
    return _ESCAPED_BYTE.sub(r"\1\\x\2", repr(value))


# An escaped byte (U+DC80..U+DCFF) as repr() writes it, not preceded by an escaped backslash.
_ESCAPED_BYTE = re.compile(r"(?<!\\)((?:\\\\)*)\\udc([89a-f][0-9a-f])")


# A control character in a name (a NUL, a new line, an escape sequence) would cut or forge a log
# line or drive a terminal: shown escaped, as repr() writes it.
_CONTROLS = {code: repr(chr(code))[1:-1] for code in (*range(0x20), 0x7F)}


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
        raise FileRefusedError(f"{printable(path.name)} is not a regular file")
    flags = os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
    if not follow_symlinks:
        flags |= os.O_NOFOLLOW
    fd = os.open(path, flags)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise FileRefusedError(f"{printable(path.name)} is not a regular file")
        if info.st_size > limit:
            raise FileRefusedError(
                f"{printable(path.name)} is too large ({info.st_size} bytes > {limit})"
            )
        chunks: list[bytes] = []
        total = 0
        while chunk := os.read(fd, min(_CHUNK, limit + 1 - total)):
            chunks.append(chunk)
            total += len(chunk)
            if total > limit:  # it grew while being read
                raise FileRefusedError(f"{printable(path.name)} is too large (> {limit} bytes)")
        return b"".join(chunks)
    finally:
        os.close(fd)


@contextlib.contextmanager
def flock_with_deadline(path: Path, timeout: float) -> Iterator[os.stat_result]:
    """Hold an exclusive ``flock`` on ``path`` (created if missing, never through a symlink).

    Yields the locked file's `os.stat_result` (its ``st_dev``/``st_ino`` tell
    another process which file the holder locked). Raises `TimeoutError` when
    the lock is still held by someone else after ``timeout`` seconds,
    `FileRefusedError` when ``path`` is not a regular file and `OSError`
    (``ELOOP``) when it is a symlink. A lock file that is replaced or removed
    while this waits is not trusted: the lock is taken on the file that is at
    ``path`` once it is held, so a waiter never ends up holding a file that
    the next comer no longer sees. The lock goes with the descriptor: a
    process that dies releases it.
    """
    held: list[int] = []  # the descriptor as soon as it is open: a Ctrl-C anywhere closes it
    try:
        yield _acquire(path, timeout, held)
    finally:
        while held:
            os.close(held[-1])  # then forgotten: interrupted here, it is closed already
            held.pop()


def _acquire(path: Path, timeout: float, held: list[int]) -> os.stat_result:
    """Lock ``path``; the locked descriptor is ``held``'s one item (the caller closes it)."""
    flags = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
    deadline = time.monotonic() + timeout
    pause = _FIRST_LOCK_POLL
    while True:
        held.append(os.open(path, flags, 0o644))
        info = _lock_if_free(held[-1], path)
        if info is not None:
            return info
        os.close(held.pop())
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError(f"{printable(path)} is still locked after {timeout:g}s")
        time.sleep(min(pause, left))
        pause = min(pause * 2, _MAX_LOCK_POLL)


def _lock_if_free(fd: int, path: Path) -> os.stat_result | None:
    """Lock ``fd`` (opened at ``path``) if no one holds it and ``path`` is still that file."""
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        raise FileRefusedError(f"{printable(path.name)} is not a regular file")
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return None
    # Replaced or removed while we waited: what we hold locks nothing, try again.
    return info if same_file(path, info) else None


def same_file(path: Path, info: os.stat_result) -> bool:
    """Whether ``path`` itself (not followed) is the file ``info`` describes."""
    try:
        now = path.lstat()
    except (FileNotFoundError, NotADirectoryError):
        return False
    return (now.st_dev, now.st_ino) == (info.st_dev, info.st_ino)


def write_new_file(path: Path, text: str, mode: int = 0o644) -> None:
    """Create ``path`` holding ``text`` (UTF-8): never through a symlink, never over a file.

    `FileExistsError` when something is there. The descriptor is closed by a
    ``finally`` that starts right after it is opened: a Ctrl-C while writing
    leaves no file object for the collector to close (``os.fdopen``'s window).
    """
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(path, flags, mode)
    try:
        view = memoryview(text.encode("utf-8"))
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


def make_owned_dir(parent: Path, prefix: str, record: Mapping[str, object]) -> Path:
    """A new directory ``parent/<prefix><id>`` (mode 0700) that verirl may delete later.

    ``id`` is random; `OWNER_MARKER` (``record`` plus ``written_by`` and
    ``id``) is written into the directory before anything else is, and never
    through a symlink. Raises `OSError` (the directory is gone again then).
    """
    for _ in range(100):
        ident = secrets.token_hex(16)
        path = parent / f"{prefix}{ident}"
        try:
            path.mkdir(mode=0o700)
        except FileExistsError:
            continue
        try:
            data = json.dumps({**record, "written_by": "verirl", "id": ident}) + "\n"
            write_new_file(path / OWNER_MARKER, data, 0o600)
        except BaseException:
            remove_tree(path)
            raise
        return path
    raise FileExistsError(f"no free name for a new {prefix}* directory in {printable(parent)}")


def read_owner_record(path: Path, prefix: str) -> Mapping[str, object] | str:
    """The record `make_owned_dir` left in ``path``, or why ``path`` is not such a directory.

    ``path`` must be a real directory (not a symlink) named ``<prefix><id>``
    holding a regular-file `OWNER_MARKER` written by verirl with that same id.
    """
    if lstat_kind(path) != "dir":
        return "it is not a directory (a symlink is never followed)"
    ident = path.name[len(prefix) :] if path.name.startswith(prefix) else ""
    if not _OWNER_ID.fullmatch(ident):
        return "its name does not end in the id verirl gives its folders"
    try:
        data = json.loads(
            read_capped(path / OWNER_MARKER, _MAX_OWNER_RECORD, follow_symlinks=False)
        )
    except (OSError, ValueError, RecursionError) as exc:
        return f"it has no readable {OWNER_MARKER} ({type(exc).__name__})"
    if not isinstance(data, dict) or data.get("written_by") != "verirl" or data.get("id") != ident:
        return f"its {OWNER_MARKER} was not written by verirl for this folder"
    return data


_Identity = tuple[int, int]
"""A directory's ``(st_dev, st_ino)``: which folder a path named when it was listed."""
_Pending = tuple[Path, _Identity, _Identity | None, bool]
"""A folder `remove_tree` has still to empty (False) or to remove (True), and its parent's id."""


def remove_tree(top: Path) -> None:
    """Delete the directory ``top`` and everything in it, as far as it can; never raises.

    What ``shutil.rmtree(top, ignore_errors=True)`` does, without its
    recursion (a `RecursionError` on 3.10-3.12 for a folder nested ~1000
    deep, which ``ignore_errors`` lets through) and without an open
    descriptor per level: folders wait on an explicit stack, one is open at
    a time. Nothing is followed: ``top`` that is not a directory (a symlink)
    is left alone, a symlink inside is removed, never what it points to, and
    a folder is emptied, or removed from its parent, only through a
    descriptor opened with ``O_NOFOLLOW`` on the very folder that was listed
    (one swapped for a link meanwhile is left, and so is what it points to).
    What cannot be deleted (permissions, a path too long to name) stays.
    """
    try:
        info = top.lstat()
    except OSError:
        return
    if not stat.S_ISDIR(info.st_mode):
        return
    stack: list[_Pending] = [(top, (info.st_dev, info.st_ino), None, False)]
    while stack:
        path, ident, parent, emptied = stack.pop()
        if emptied:
            with contextlib.suppress(OSError):
                _remove_empty(path, parent)
            continue
        stack.append((path, ident, parent, True))
        with contextlib.suppress(OSError):
            stack.extend(reversed(_empty_but_folders(path, ident)))


@contextlib.contextmanager
def _opened_folder(path: Path, ident: _Identity) -> Iterator[int]:
    """A descriptor on the directory ``path``; `OSError` if it is not the folder ``ident``."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC)
    try:
        info = os.fstat(fd)
        if (info.st_dev, info.st_ino) != ident:
            raise FileRefusedError(f"{printable(path)} was replaced")
        yield fd
    finally:
        os.close(fd)


def _empty_but_folders(path: Path, ident: _Identity) -> list[_Pending]:
    """Delete all but the folders in ``path`` (the folder ``ident``); its folders, to empty."""
    with _opened_folder(path, ident) as fd:
        with os.scandir(fd) as listing:
            entries = list(listing)
        return [
            folder for entry in entries if (folder := _unlink_unless_folder(entry, fd, path, ident))
        ]


def _unlink_unless_folder(
    entry: os.DirEntry[str], fd: int, path: Path, ident: _Identity
) -> _Pending | None:
    """Unlink ``entry`` of the folder ``fd`` (``path``, ``ident``); a folder is returned instead."""
    try:
        if not entry.is_dir(follow_symlinks=False):
            os.unlink(entry.name, dir_fd=fd)
            return None
        info = entry.stat(follow_symlinks=False)
    except OSError:
        return None
    return (path / entry.name, (info.st_dev, info.st_ino), ident, False)


def _remove_empty(path: Path, parent: _Identity | None) -> None:
    """Remove the emptied folder ``path`` from its parent, if that is still the folder listed."""
    if parent is None:  # top: named by the caller
        path.rmdir()
        return
    with _opened_folder(path.parent, parent) as fd:
        os.rmdir(path.name, dir_fd=fd)


_KEPT_STDOUT: list[int] = []
"""The descriptors that hold the program's real stdout while descriptor 1 points elsewhere."""


def own_outputs() -> list[tuple[str, int]]:
    """This program's stdout and stderr: ``(name, descriptor)``, the real stdout while moved."""
    return [("stdout", _KEPT_STDOUT[-1] if _KEPT_STDOUT else 1), ("stderr", 2)]


@contextlib.contextmanager
def stdout_kept_in(fd: int) -> Iterator[None]:
    """Inside the block, ``fd`` holds the program's stdout (``launch --json`` moved 1 to 2)."""
    _KEPT_STDOUT.append(fd)
    try:
        yield
    finally:
        _KEPT_STDOUT.remove(fd)

"""The vLLM server's log file: where it goes, the header of each run, and its tail.

The server writes stdout and stderr to one file that outlives a failure, so
that `VLLMServerExited` and `VLLMStartupTimeout` can quote the lines that
explain it. A run appends to the file (never truncates it) after a header
line with its command line, secrets hidden, and its tail is read from where
that run began, never from an earlier run's lines.

The log must be a regular file that verirl can read back: a FIFO, a socket or
a device is refused before anything is spawned (opening a FIFO for writing
would block until a reader came, reading it would block until a writer came,
and either way its tail could not be quoted). Every open here is non-blocking.
Without ``log_path``, the log goes to one folder per user under the temp
directory (`default_log_dir`), ``vllm-serve-<port>.log`` appended to by every
attempt, so that retries do not leave a folder each behind.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import stat
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import BinaryIO

import attrs

from verirl._fs import printable
from verirl._secrets import shown_line
from verirl.errors import ConfigError

__all__ = [
    "LOG_TAIL_LINES",
    "KeptLog",
    "OpenedLog",
    "check_lines",
    "default_log_dir",
    "log_file_name",
    "open_server_log",
    "read_log_tail",
    "read_regular",
]

log = logging.getLogger("verirl.vllm_server")

LOG_TAIL_LINES = 40
"""Lines of the log an error quotes."""

_LOG_TAIL_BYTES = 64 * 1024


@attrs.frozen
class OpenedLog:
    """A run's log: the open handle (the child's stdout), its path, where the run begins."""

    handle: BinaryIO
    path: Path
    offset: int


class KeptLog:
    """A reading handle on the file a run's server writes to, kept for its tail.

    The path is only where the file was: a rotation (renamed, or deleted and
    made again) leaves the server writing to the old file, whose lines say
    why it died. Reading through this handle (a duplicate of the one the
    server was given) sees exactly what the server wrote, wherever the name
    went. Closed by `close` or when dropped; never inherited by a child.
    """

    __slots__ = ("fd",)

    def __init__(self, handle: BinaryIO) -> None:
        self.fd: int | None = os.dup(handle.fileno())

    def close(self) -> None:
        """Close the handle (again: nothing)."""
        fd, self.fd = self.fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)

    def __del__(self) -> None:
        self.close()


def log_file_name(port: int) -> str:
    """The log's name inside a folder: one file per port."""
    return f"vllm-serve-{port}.log"


def default_log_dir() -> Path:
    """The folder of logs without ``log_path``: ``<tmp>/verirl-vllm-<uid>``, made once, mode 0700.

    A folder of that name that is not a directory of ours (a symlink, another
    user's) is never written into: a fresh ``verirl-vllm-*`` folder is made
    instead, with a warning.
    """
    folder = _default_folder_path()
    with contextlib.suppress(FileExistsError):
        folder.mkdir(mode=0o700)
    try:
        info = os.lstat(folder)
    except OSError:
        info = None
    if info is not None and _ours(info):
        return folder
    fresh = Path(tempfile.mkdtemp(prefix="verirl-vllm-"))
    log.warning(
        "%s is not a private folder of this user: the vLLM server log goes to %s instead",
        printable(folder),
        printable(fresh),
    )
    return fresh


def _default_folder_path() -> Path:
    """Where `default_log_dir` is: ``<tmp>/verirl-vllm-<uid>``."""
    uid = os.getuid() if hasattr(os, "getuid") else None
    return Path(tempfile.gettempdir()) / ("verirl-vllm" if uid is None else f"verirl-vllm-{uid}")


def _ours(info: os.stat_result) -> bool:
    """Whether the default folder's ``lstat`` is a directory of this user's alone."""
    uid = os.getuid() if hasattr(os, "getuid") else None
    return (
        stat.S_ISDIR(info.st_mode)
        and (uid is None or info.st_uid == uid)
        and not info.st_mode & (stat.S_IWGRP | stat.S_IWOTH)
    )


_DEFAULT_TRIES = 3
"""Times the default folder is made again when it vanishes before its log is opened."""

_MISSING = (
    "must be an existing folder: it is missing (removed since it was given?); verirl never "
    "makes it again nor writes a file in its place"
)


def _open_folder(folder: Path, *, follow: bool = True) -> int:
    """A descriptor of the directory ``folder`` (an `OSError` if it is missing or no folder).

    The log is then opened relative to it, so that the folder checked is the
    folder written into: one removed in between fails, never becomes a file.
    ``O_PATH`` (Linux) needs no read permission: a drop-box folder (``1733``),
    where files can be made but not listed, is a folder to log into.
    """
    flags = getattr(os, "O_PATH", os.O_RDONLY) | os.O_DIRECTORY | os.O_CLOEXEC
    flags |= 0 if follow else os.O_NOFOLLOW
    return os.open(folder, flags)


def _default_folder(field: str) -> tuple[Path, int]:
    """`default_log_dir` and a descriptor of it; made again (0700) if it vanished meanwhile."""
    tries_left = _DEFAULT_TRIES
    while True:
        tries_left -= 1
        folder = Path(tempfile.gettempdir())  # named if even that cannot be made
        try:
            folder = default_log_dir()
            return folder, _open_folder(folder, follow=False)
        except FileNotFoundError as exc:
            if tries_left > 0:
                log.info("%s vanished before the server's log was opened: made again",
                         printable(folder))  # fmt: skip
                continue
            problem: OSError = exc
        except OSError as exc:
            problem = exc
        raise ConfigError.invalid(
            field, printable(folder), f"no log file can be made ({problem.strerror or problem})"
        ) from None


def _existing_default_folder() -> tuple[Path, int] | None:
    """`default_log_dir` and a descriptor of it, when it exists and is this user's; else None.

    Nothing is made: a folder missing, or not ours (`default_log_dir` then
    logs elsewhere), leaves nothing to check beforehand.
    """
    folder = _default_folder_path()
    try:
        fd = _open_folder(folder, follow=False)
    except OSError:
        return None
    if not _ours(os.fstat(fd)):
        os.close(fd)
        return None
    return folder, fd


def _kept_folder(folder: Path, field: str) -> int:
    """A descriptor of the folder given as one; a `ConfigError` naming ``field`` if it is none."""
    try:
        return _open_folder(folder)
    except FileNotFoundError:
        why = _MISSING
    except NotADirectoryError:
        why = "must be a folder: it is not one"
    except OSError as exc:
        why = f"cannot be opened as a folder ({exc.strerror or exc})"
    raise ConfigError.invalid(field, printable(folder), why) from None


def _made_folder(folder: Path, field: str) -> int:
    """A descriptor of the folder spelled with a trailing slash, made if missing."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        return _open_folder(folder)
    except OSError as exc:
        raise ConfigError.invalid(
            field, printable(folder), f"no log file can be made ({exc.strerror or exc})"
        ) from None


def _log_file(requested: Path | None, port: int, field: str) -> tuple[Path, int | None]:
    """The log file's path and, when it lies in a folder, a descriptor of that folder."""
    name = log_file_name(port)
    if requested is None:
        folder, fd = _default_folder(field)
        return folder / name, fd
    if getattr(requested, "must_exist", False):
        return Path(requested) / name, _kept_folder(requested, field)
    if getattr(requested, "folder", False):
        return Path(requested) / name, _made_folder(requested, field)
    try:
        requested.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise ConfigError.invalid(
            field, printable(requested), f"its folder cannot be made ({exc.strerror or exc})"
        ) from None
    return requested, None


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISDIR, "a directory"),
    ):
        if test(mode):
            return name
    return "not a regular file"


_NOT_REGULAR = (
    "must be a regular file (or a folder): it is {kind}, whose last lines verirl could not "
    "quote when the server fails"
)


_CANNOT_APPEND = "cannot be opened for appending and reading back ({})"
"""Why a log cannot be used: `open_server_log`'s words, and `check_server_log`'s for the same."""


def _open_for_appending(path: Path, field: str, folder: int | None) -> BinaryIO:
    """Open ``path`` (in the open ``folder`` if given) to append and read back, without blocking.

    Only a regular file; any other is a `ConfigError` naming ``field``.
    """
    flags = os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NONBLOCK | os.O_CLOEXEC
    try:
        if folder is None:
            fd = os.open(path, flags, 0o644)
        else:
            fd = os.open(path.name, flags, 0o644, dir_fd=folder)
    except OSError as exc:
        if exc.errno == errno.ENXIO:  # a FIFO or socket with nobody at the other end
            why = _NOT_REGULAR.format(kind="a FIFO or socket")
        else:
            why = _CANNOT_APPEND.format(exc.strerror or exc)
        raise ConfigError.invalid(field, printable(path), why) from None
    try:
        mode = os.fstat(fd).st_mode
    except BaseException:
        os.close(fd)
        raise
    if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode):  # never written to: a reader would get it
        os.close(fd)
        raise ConfigError.invalid(field, printable(path), _NOT_REGULAR.format(kind=_kind(mode)))
    own = _own_output(fd)
    if own is not None:  # /dev/stdout to a file: the server's lines amid the program's own
        os.close(fd)
        why = f"must be a file of its own: it is this program's {own}"
        raise ConfigError.invalid(field, printable(path), why)
    try:
        os.set_blocking(fd, True)
        return os.fdopen(fd, "ab", buffering=0)  # seeks to the end: a /proc file cannot
    except OSError as exc:
        os.close(fd)
        why = _CANNOT_APPEND.format(exc.strerror or exc)
        raise ConfigError.invalid(field, printable(path), why) from None


def _own_output(fd: int) -> str | None:
    """``"stdout"`` or ``"stderr"`` when ``fd`` is the same file as this process's; else None."""
    try:
        info = os.fstat(fd)
    except OSError:
        return None
    for name, std in (("stdout", 1), ("stderr", 2)):
        if std == fd:  # the program's was closed: the log took its number, it is no output
            continue
        try:
            other = os.fstat(std)
        except OSError:
            continue
        if (other.st_dev, other.st_ino) == (info.st_dev, info.st_ino):
            return name
    return None


def check_server_log(requested: Path | None, *, port: int, field: str = "log_path") -> None:
    """What `open_server_log` would refuse, found without making or writing anything.

    ``doctor``'s preflight: a folder given as one that is missing or no folder,
    an existing log that is not a regular file or cannot be appended to and
    read back, a missing log in a folder that cannot be written: the
    `ConfigError` `open_server_log` would raise, in its words; in the
    default folder too, when it is there and ours. What is made at start (the
    default folder, one spelled with a trailing slash, a file's missing
    parent) is not checked, nor a full disk.
    """
    name = log_file_name(port)
    if requested is None:
        default = _existing_default_folder()
        if default is not None:
            try:
                _check_in_folder(default[0] / name, default[1], field)
            finally:
                os.close(default[1])
        return
    if getattr(requested, "must_exist", False):
        path, folder = Path(requested) / name, _kept_folder(requested, field)
    else:
        path = Path(requested) / name if getattr(requested, "folder", False) else requested
        try:
            folder = _open_folder(path.parent)
        except OSError:
            return  # made, or refused, at start: as `_made_folder` or `_log_file` does then
    try:
        _check_in_folder(path, folder, field)
    finally:
        os.close(folder)


def _check_in_folder(path: Path, folder: int, field: str) -> None:
    """`check_server_log`'s look at ``path`` in the open ``folder``."""
    cannot = _CANNOT_APPEND  # launch and doctor say the same
    try:
        mode = os.stat(path.name, dir_fd=folder).st_mode
    except FileNotFoundError:
        if not os.access(".", os.W_OK | os.X_OK, dir_fd=folder):
            why = cannot.format(os.strerror(errno.EACCES))
            raise ConfigError.invalid(field, printable(path), why) from None
        return
    except OSError as exc:
        raise ConfigError.invalid(
            field, printable(path), cannot.format(exc.strerror or exc)
        ) from None
    if stat.S_ISDIR(mode):
        raise ConfigError.invalid(field, printable(path), cannot.format(os.strerror(errno.EISDIR)))
    if not stat.S_ISREG(mode):
        raise ConfigError.invalid(field, printable(path), _NOT_REGULAR.format(kind=_kind(mode)))
    if not os.access(path.name, os.R_OK | os.W_OK, dir_fd=folder):
        raise ConfigError.invalid(field, printable(path), cannot.format(os.strerror(errno.EACCES)))


def _check_regular(handle: BinaryIO, path: Path, field: str) -> None:
    """After the header was written (a full disk says so first): only a regular file."""
    mode = os.fstat(handle.fileno()).st_mode
    if not stat.S_ISREG(mode):
        raise ConfigError.invalid(field, printable(path), _NOT_REGULAR.format(kind=_kind(mode)))


def open_server_log(
    requested: Path | None, *, port: int, argv: Sequence[str], field: str = "log_path"
) -> OpenedLog:
    """Open the log for appending and write the run's header line.

    ``requested`` is ``VLLMServer``'s ``log_path`` or ``log_dir``: a file, a
    folder, which gets ``vllm-serve-<port>.log`` (one spelled with a trailing
    slash is made if missing; one given as a folder, a `KeptFolder`, must
    exist), or ``None`` (`default_log_dir`, made again if it vanished). A log
    in a folder is opened relative to that folder, so a folder removed
    meanwhile fails rather than turning into a file. A path that is not a
    regular file (a FIFO, a device), or that cannot be read back, is a
    `ConfigError` naming ``field``; nothing here blocks. Unbuffered, so that
    a write that fails (a full disk) fails here; the handle is closed before
    the `ConfigError` is raised.
    """
    path, folder = _log_file(requested, port, field)
    try:
        handle = _open_for_appending(path, field, folder)
    finally:
        if folder is not None:
            os.close(folder)
    try:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        handle.write(f"--- verirl {stamp}: {shown_line(argv)}\n".encode())
        _check_regular(handle, path, field)
        offset = handle.tell()
    except OSError as exc:
        handle.close()
        raise ConfigError.invalid(
            field, printable(path), f"cannot be written ({exc.strerror or exc})"
        ) from None
    except BaseException:
        handle.close()
        raise
    return OpenedLog(handle=handle, path=path, offset=offset)


def read_regular(path: Path | str | KeptLog, start: int, limit: int) -> tuple[int, bytes] | None:
    """``(size, bytes)``: up to ``limit`` bytes of the regular file ``path`` from ``start``.

    ``None`` when it is missing, unreadable or not a regular file (never
    blocks on a FIFO), or a closed `KeptLog`. A ``start`` past the end (the
    file was truncated or replaced) reads nothing; the size tells.
    """
    if isinstance(path, KeptLog):
        kept = path.fd
        if kept is None:
            return None
        return _read_open(kept, start, limit)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return _read_open(fd, start, limit)
    finally:
        os.close(fd)


def _read_open(fd: int, start: int, limit: int) -> tuple[int, bytes] | None:
    """`read_regular` of the open ``fd``, which stays open."""
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return None
        if start >= info.st_size:
            return info.st_size, b""
        return info.st_size, os.pread(fd, min(limit, info.st_size - start), start)
    except OSError:
        return None


def check_lines(lines: object) -> int:
    """``log_tail``'s ``lines``: an integer >= 0, else `ConfigError` naming it."""
    if isinstance(lines, bool) or not isinstance(lines, int) or lines < 0:
        raise ConfigError.invalid("lines", lines, "must be an integer >= 0")
    return lines


def read_log_tail(
    path: Path | str | KeptLog, *, lines: int = LOG_TAIL_LINES, start: int = 0
) -> str:
    """The last ``lines`` lines of the log at ``path`` from byte offset ``start`` ("" if none).

    ``path`` may be a `KeptLog`: the file the server writes to, wherever its name went.

    At most the last 64 KiB are read: a line cut by that window is dropped,
    unless it is the only one (a last line longer than the window), which is
    kept, cut, after ``…``. A ``start`` past the end of the file (truncated,
    or replaced by a rotation) reads the tail of what is there now. Never
    blocks, never raises: a FIFO, a folder or an unreadable file has no tail.
    """
    if check_lines(lines) == 0:
        return ""
    probe = read_regular(path, 0, 0)
    if probe is None:
        return ""
    size = probe[0]
    if start > size:  # truncated or replaced since the run began: what is there is its
        start = 0
    begin = max(start, size - _LOG_TAIL_BYTES)
    before = 1 if begin > start else 0  # the byte before the window: does a line end there?
    read = read_regular(path, begin - before, _LOG_TAIL_BYTES + before)
    if read is None:
        return ""
    cut = bool(before) and read[1][:1] != b"\n"
    text = read[1][before:].decode("utf-8", errors="replace")
    kept = text.splitlines()
    while kept and not kept[-1].strip():  # trailing blank lines say nothing of why it died
        kept.pop()
    if cut and kept:  # the first line was cut by the byte window
        # Dropped only when a line with something in it follows; else it is the tail, cut.
        kept = kept[1:] if len(kept) > 1 else ["\u2026" + kept[0]]
    return "\n".join(kept[-lines:]) + ("\n" if kept else "")

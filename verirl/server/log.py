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

Here: opening the log for a run. The folder is `verirl.server.log_folder`'s,
the preflight that refuses a path before anything is spawned
`verirl.server.log_check`'s, and reading the tail `verirl.server.log_tail`'s.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import stat
import time
from collections.abc import Sequence
from pathlib import Path
from typing import BinaryIO

import attrs

from verirl._fs import own_outputs, printable
from verirl._secrets import shown_line
from verirl.errors import ConfigError
from verirl.server.log_folder import (
    _default_folder,
    _kept_folder,
    _made_folder,
    log_file_name,
)

__all__ = [
    "OpenedLog",
    "open_server_log",
]

log = logging.getLogger("verirl.vllm_server")


@attrs.frozen
class OpenedLog:
    """A run's log: the open handle (the child's stdout), its path, where the run begins."""

    handle: BinaryIO
    path: Path
    offset: int


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

_APPEND = os.O_RDWR | os.O_APPEND | os.O_NONBLOCK | os.O_CLOEXEC
"""How the log is opened: with ``O_CREAT`` by `open_server_log`, without by `check_server_log`."""

_FOLDER_PATH = getattr(os, "O_PATH", os.O_RDONLY) | os.O_DIRECTORY | os.O_CLOEXEC
"""A descriptor of a folder to look up names in (``O_PATH``: no read permission needed)."""

_MAX_LINKS = 40
"""Symbolic links one open follows at most (Linux's ``MAXSYMLINKS``); one more is ``ELOOP``."""


def _open_for_appending(path: Path, field: str, folder: int | None) -> BinaryIO:
    """Open ``path`` (in the open ``folder`` if given) to append and read back, without blocking.

    Only a regular file; any other is a `ConfigError` naming ``field``.
    """
    try:
        fd = os.open(_name_in(path, folder), _APPEND | os.O_CREAT, 0o644, dir_fd=folder)
    except OSError as exc:
        raise _refusal(path, field, exc, folder) from None
    try:
        _check_opened(fd, path, field)
        os.set_blocking(fd, True)
        return os.fdopen(fd, "ab", buffering=0)
    except OSError as exc:
        os.close(fd)
        why = _CANNOT_APPEND.format(exc.strerror or exc)
        raise ConfigError.invalid(field, printable(path), why) from None
    except BaseException:
        os.close(fd)
        raise


def _name_in(path: Path, folder: int | None) -> str | Path:
    """What is opened: ``path``'s name in the open ``folder``, or ``path`` itself without one."""
    return path if folder is None else path.name


def _refusal(path: Path, field: str, exc: OSError, folder: int | None) -> ConfigError:
    """The `ConfigError` for an open of the log that failed with ``exc``: launch's and doctor's."""
    if exc.errno == errno.ENXIO:  # a socket, or a device with nothing behind it
        kind = "a FIFO or socket"
        with contextlib.suppress(OSError):
            kind = _kind(os.stat(_name_in(path, folder), dir_fd=folder).st_mode)
        return ConfigError.invalid(field, printable(path), _NOT_REGULAR.format(kind=kind))
    why = _CANNOT_APPEND.format(exc.strerror or exc)
    return ConfigError.invalid(field, printable(path), why)


def _check_opened(fd: int, path: Path, field: str) -> None:
    """What launch refuses of the log it opened as ``fd``; doctor asks the same of its own open.

    A FIFO or a socket (never written to: a reader would get it), this
    program's own stdout or stderr file, a file that cannot be appended to
    (appending seeks to the end: a ``/proc`` file cannot).
    """
    mode = os.fstat(fd).st_mode
    if stat.S_ISFIFO(mode) or stat.S_ISSOCK(mode):
        raise ConfigError.invalid(field, printable(path), _NOT_REGULAR.format(kind=_kind(mode)))
    own = _own_output(fd)
    if own is not None:  # /dev/stdout to a file: the server's lines amid the program's own
        why = f"must be a file of its own: it is this program's {own}"
        raise ConfigError.invalid(field, printable(path), why)
    os.lseek(fd, 0, os.SEEK_END)


def _own_output(fd: int) -> str | None:
    """``"stdout"`` or ``"stderr"`` when ``fd`` is the same file as this process's; else None."""
    try:
        info = os.fstat(fd)
    except OSError:
        return None
    for name, std in own_outputs():
        if std == fd:  # the program's was closed: the log took its number, it is no output
            continue
        try:
            other = os.fstat(std)
        except OSError:
            continue
        if (other.st_dev, other.st_ino) == (info.st_dev, info.st_ino):
            return name
    return None


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

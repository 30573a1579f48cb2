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

from verirl._fs import own_outputs, printable
from verirl._secrets import shown_line
from verirl.errors import ConfigError

__all__ = [
    "OpenedLog",
    "check_server_log",
    "default_log_dir",
    "log_file_name",
    "open_server_log",
]

log = logging.getLogger("verirl.vllm_server")


@attrs.frozen
class OpenedLog:
    """A run's log: the open handle (the child's stdout), its path, where the run begins."""

    handle: BinaryIO
    path: Path
    offset: int


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


def check_server_log(requested: Path | None, *, port: int, field: str = "log_path") -> None:
    """What `open_server_log` would refuse, found without making or writing anything.

    ``doctor``'s preflight: the `ConfigError` `open_server_log` would raise,
    in its words, for whatever is at the log's path (see `_check_in_folder`:
    a missing log in a folder where none can be made, a symbolic link to
    nowhere that can be made, to a folder, in a loop, a FIFO, a device, a
    file that cannot be appended to and read back, ...); a folder given as
    one that is missing or no folder; a folder that start would make and
    cannot (see `_mkdirs_refusal`: a file or a dangling link in its place, no
    permission). The default folder is looked into when it is there and
    ours (else a fresh one is made at start). A file system with no block
    left, where launch's first line would fail (`_check_space`), is refused too.
    """
    name = log_file_name(port)
    if requested is None:
        default = _existing_default_folder()
        if default is not None:
            try:
                _check_in_folder(default[0] / name, default[1], field)
                _check_space(default[0] / name, default[1], field)
            finally:
                os.close(default[1])
        return
    if getattr(requested, "must_exist", False):
        path, folder = Path(requested) / name, _kept_folder(requested, field)
    else:
        made = getattr(requested, "folder", False)
        path = Path(requested) / name if made else requested
        problem = _mkdirs_refusal(path.parent)
        if problem is not None:  # as `_made_folder` and `_log_file` say it
            shown, why = (
                (path.parent, "no log file can be made") if made
                else (requested, "its folder cannot be made")
            )  # fmt: skip
            why = f"{why} ({problem.strerror or problem})"
            raise ConfigError.invalid(field, printable(shown), why)
        try:
            folder = _open_folder(path.parent)
        except FileNotFoundError:
            return  # made at start, empty: the log is made in it
        except OSError as exc:
            raise _refusal(path, field, exc, None) from None
    try:
        _check_in_folder(path, folder, field)
        _check_space(path, folder, field)
    finally:
        os.close(folder)


def _check_space(path: Path, folder: int, field: str) -> None:
    """A full file system where the log is: launch's first line there fails (``ENOSPC``).

    Only when no block is left (root's reserve counts for root) and the line
    would need a new one: the file is missing, or it ends on a block boundary.
    """
    target = Path(os.path.realpath(path))  # through links: where the lines go
    try:
        info, size = os.statvfs(target), target.stat().st_size
    except OSError:
        try:  # to be made: in the folder the last link points into
            info, size = (os.statvfs(target.parent) if target != path else os.fstatvfs(folder)), 0
        except OSError:
            return
    free = info.f_bfree if os.geteuid() == 0 else info.f_bavail
    if free == 0 and size % max(info.f_bsize, 1) == 0:
        why = f"cannot be written ({os.strerror(errno.ENOSPC)})"
        raise ConfigError.invalid(field, printable(path), why)


def _check_in_folder(path: Path, folder: int, field: str) -> None:
    """`check_server_log`'s look at ``path`` in the open ``folder``: what launch's open would do.

    Launch opens it with `_APPEND` and ``O_CREAT``, following symbolic links,
    then `_check_opened`. Here the same path is walked as that open walks it
    (`_follow`), and the end of it judged as the kernel would, nothing made:
    a name to make needs a folder that can be written; a folder is
    ``EISDIR``; another user's file in a sticky world-writable folder may be
    refused (`_sticky_refuses`); a FIFO, a socket or a device (not opened
    here: opening one is not without effect) is refused as launch refuses
    it; a regular file is opened as launch opens it, without ``O_CREAT``
    (nothing written), and `_check_opened`. Looked at again when it changed
    meanwhile.
    """
    try:
        for _ in range(3):
            if _judged(path, folder, field):
                return
    except OSError as exc:
        raise _refusal(path, field, exc, folder) from None


def _judged(path: Path, folder: int, field: str) -> bool:
    """One look of `_check_in_folder`: True if judged usable, False if it changed while looked at.

    An `OSError` as launch's open would fail, or its `ConfigError`.
    """
    directory, name, info = _follow(path.name, folder)
    try:
        if info is None:  # launch makes it here
            problem = _creation_refusal(directory)
            if problem is not None:
                raise _os_error(problem)
            return True
        mode = info.st_mode
        if stat.S_ISDIR(mode):
            raise _os_error(errno.EISDIR)
        if _sticky_refuses(os.fstat(directory), info):
            raise _os_error(errno.EACCES)
        if not stat.S_ISREG(mode):
            _judge_special(name, directory, mode, path, field)
        try:
            fd = os.open(name, _APPEND | os.O_NOFOLLOW, dir_fd=directory)
        except OSError as exc:
            if exc.errno in (errno.ENOENT, errno.ELOOP):  # gone, or a link now: again
                return False
            raise
        try:
            _check_opened(fd, path, field)
            mode = os.fstat(fd).st_mode
        finally:
            os.close(fd)
        if not stat.S_ISREG(mode):  # launch writes its header first, then refuses it so
            raise ConfigError.invalid(field, printable(path), _NOT_REGULAR.format(kind=_kind(mode)))
        return True
    finally:
        os.close(directory)


def _judge_special(name: str, directory: int, mode: int, path: Path, field: str) -> None:
    """`_judged` of what is neither a folder nor a regular file: refused, as launch refuses it."""
    if not _may(name, directory, os.R_OK | os.W_OK):
        raise _os_error(errno.EACCES)
    if stat.S_ISSOCK(mode):
        raise _os_error(errno.ENXIO)
    raise ConfigError.invalid(field, printable(path), _NOT_REGULAR.format(kind=_kind(mode)))


def _os_error(code: int) -> OSError:
    return OSError(code, os.strerror(code))


def _may(name: str, directory: int, mode: int) -> bool:
    """`os.access` of ``name`` in ``directory`` (not followed) for this process's effective ids."""
    effective = os.access in os.supports_effective_ids
    return os.access(name, mode, dir_fd=directory, effective_ids=effective, follow_symlinks=False)


def _creation_refusal(directory: int) -> int | None:
    """Why a file (or folder) cannot be made in the open ``directory`` (an errno), or None."""
    with contextlib.suppress(OSError):
        if os.statvfs(directory).f_flag & os.ST_RDONLY:
            return errno.EROFS
    return None if _may(".", directory, os.W_OK | os.X_OK) else errno.EACCES


def _follow(name: str, folder: int) -> tuple[int, str, os.stat_result | None]:
    """Where an ``O_CREAT`` open of ``name`` in the open ``folder`` ends, found without opening it.

    ``(a descriptor of the folder it is in, its name there, its lstat)``,
    the lstat None where nothing is: that open would make it. Each symbolic
    link at the end is followed as the kernel follows it: its target's folder
    is walked (an `OSError` where that walk fails: ``ENOENT`` for a link into
    a missing folder, ``ENOTDIR``, ``EACCES``), ``ELOOP`` after
    `_MAX_LINKS`; a target that ends with ``/``, ``.`` or ``..`` is a
    folder's name, ``EISDIR`` for ``O_CREAT``. The descriptor is the caller's.
    """
    directory = os.dup(folder)
    links = 0
    try:
        while True:
            try:
                info = os.stat(name, dir_fd=directory, follow_symlinks=False)
            except FileNotFoundError:
                return directory, name, None
            if not stat.S_ISLNK(info.st_mode):
                return directory, name, info
            links += 1
            directory, name = _through_link(directory, name, links)
    except BaseException:
        os.close(directory)
        raise


def _through_link(directory: int, name: str, links: int) -> tuple[int, str]:
    """`_follow`'s step through the link ``name`` in ``directory`` (closed once it is done).

    The folder its target names a file in, and that name; an `OSError` where the kernel stops.
    """
    if links > _MAX_LINKS:
        raise _os_error(errno.ELOOP)
    target = os.readlink(name, dir_fd=directory)
    if not target:
        raise _os_error(errno.ENOENT)
    bare = target.rstrip("/")
    above, slash, name = bare.rpartition("/")
    if not bare:  # the root
        above, slash, name = "/", "/", "."
    elif slash and not above:
        above = "/"
    inner = os.open(above if slash else ".", _FOLDER_PATH, dir_fd=directory)
    if bare != target or name in (".", ".."):  # a folder's name: no file is made there
        searchable = _may(".", inner, os.X_OK)  # looked up in all the same
        os.close(inner)
        raise _os_error(errno.EISDIR if searchable else errno.EACCES)
    os.close(directory)
    return inner, name


def _sticky_refuses(folder: os.stat_result, info: os.stat_result) -> bool:
    """Whether Linux refuses ``O_CREAT`` on this existing file (``info``) in ``folder``.

    Another user's regular file or FIFO in a sticky folder that others can
    write (``/tmp``), when ``fs.protected_regular`` or ``fs.protected_fifos``
    says so (2: a group-writable one too); its owner's, or the folder owner's,
    is not refused.
    """
    if stat.S_ISREG(info.st_mode):
        level = _protected("regular")
    elif stat.S_ISFIFO(info.st_mode):
        level = _protected("fifos")
    else:
        return False
    if not level or not folder.st_mode & stat.S_ISVTX:
        return False
    if info.st_uid in (folder.st_uid, os.geteuid()):
        return False
    group = level >= 2 and folder.st_mode & stat.S_IWGRP  # noqa: PLR2004 - the sysctl's level
    return bool(folder.st_mode & stat.S_IWOTH or group)


def _protected(kind: str) -> int:
    """``fs.protected_<kind>`` (0 where it cannot be read)."""
    try:
        return int(Path(f"/proc/sys/fs/protected_{kind}").read_text())
    except (OSError, ValueError):
        return 0


def _mkdirs_refusal(folder: Path) -> OSError | None:
    """What ``folder.mkdir(parents=True, exist_ok=True)`` would fail with, found making nothing.

    None where it would not: a folder already (through links too), or one that
    can be made, and its missing parents. Otherwise: something there that is
    no folder (``EEXIST``: a file, a link to nowhere), a walk that fails
    (``ENOTDIR``, ``EACCES``, ``ELOOP``), a parent that cannot be written in.
    Walked up in a loop, not by recursion: any depth of missing folders.
    """
    current, missing = folder, False
    while True:
        with contextlib.suppress(OSError):
            if stat.S_ISDIR(current.stat().st_mode):
                break  # mkdir's error, if any, is forgiven: it is a folder
        try:
            current.lstat()
        except FileNotFoundError:
            if current.parent == current:
                return _os_error(errno.ENOENT)
            current, missing = current.parent, True
            continue
        except OSError as exc:
            return exc
        return _os_error(errno.EEXIST)
    return _made_in(current) if missing else None


def _made_in(folder: Path) -> OSError | None:
    """Why no folder can be made in ``folder`` (the deepest one there), or None.

    The first missing folder is made there; the rest, by this process, in it.
    """
    try:
        fd = os.open(folder, _FOLDER_PATH)
    except FileNotFoundError:
        return None
    except OSError as exc:
        return exc
    try:
        code = _creation_refusal(fd)
    finally:
        os.close(fd)
    return None if code is None else _os_error(code)


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

"""The vLLM server log's preflight: refuse a path that could not be used before anything is spawned.

`check_server_log` asks what `open_server_log` will do, without creating or
opening for writing anything: a FIFO, socket or device, a link out of reach,
a folder that cannot be made or written, a full disk. Each refusal is a
`ConfigError` naming the setting the path came from.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from pathlib import Path

from verirl._fs import printable
from verirl.errors import ConfigError
from verirl.server.log import (
    _APPEND,
    _FOLDER_PATH,
    _MAX_LINKS,
    _NOT_REGULAR,
    _check_opened,
    _kind,
    _refusal,
)
from verirl.server.log_folder import (
    _existing_default_folder,
    _kept_folder,
    _open_folder,
    log_file_name,
)

__all__ = ["check_server_log"]


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

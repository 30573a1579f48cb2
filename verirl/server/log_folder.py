"""Where the vLLM server's log goes: the folder given, or one per user under the temp directory.

Without ``log_path``, every attempt appends to ``vllm-serve-<port>.log`` in one
folder per user (`default_log_dir`), so that retries do not leave a folder
each behind; the folder is verirl's own only when it is the user's and
private, and is made again if it vanishes before the log is opened.
"""

from __future__ import annotations

import contextlib
import logging
import os
import stat
import tempfile
from pathlib import Path

from verirl._fs import printable
from verirl.errors import ConfigError

__all__ = ["default_log_dir", "log_file_name"]

log = logging.getLogger("verirl.vllm_server")


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

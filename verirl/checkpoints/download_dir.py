"""A remote source's ``download_dir``: stage, verify and rename folders into place, under a lock.

A folder is downloaded into a staging folder, checked file by file against
the listing it came from, and only then renamed to ``download_dir/<folder>``:
a download cut short never looks complete. verirl's bookkeeping there is all
its own: a lock file per folder (concurrent fetches, threads or processes,
take turns, and the wait has a deadline), a marker in each folder it
downloaded (what may be replaced later), and staging/old folders made with
`make_owned_dir` (what a killed run left that the next one may delete).
Anything else, symlinks included, is never written to, followed or deleted.
Folders are walked and deleted from a stack, never by recursion: any depth a
path can reach is handled, and one deeper is an error naming the folder.
What cannot be read there (an I/O error, a marker that is a directory) is a
`CheckpointSourceError`, never taken for "nothing there" or "not ours".
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path

import attrs

from verirl._fs import (
    OWNER_MARKER,
    FileRefusedError,
    flock_with_deadline,
    lstat_kind,
    make_owned_dir,
    printable,
    quoted,
    read_owner_record,
    remove_tree,
)
from verirl.checkpoints.download_record import (
    MARKER,
    FileEntry,
    RemoteFolder,
    mismatch,
    read_marker,
    write_marker,
)
from verirl.checkpoints.model import unreadable
from verirl.errors import CheckpointSourceError, ConfigError, VeriRLError

__all__ = ["FolderName", "fetch_folder", "human_size"]

log = logging.getLogger("verirl.checkpoints")  # the component's logger, which users filter on

_STAGING_PREFIX = ".verirl-tmp-"
_OLD_PREFIX = ".verirl-old-"
# Where huggingface_hub keeps a local_dir download's state.
_HF_CACHE = ".cache/huggingface"
_KIB = 1024
_STRAYS_SHOWN = 10


def human_size(size: int) -> str:
    """``size`` bytes for a log line: ``512 B``, ``293.2 KiB``, ``1.5 GiB``; any int will do."""
    if size < _KIB:
        return f"{size} B"
    unit, scale = "KiB", _KIB
    for bigger in ("MiB", "GiB", "TiB"):
        if size < scale * _KIB:
            break
        unit, scale = bigger, scale * _KIB
    # In integers: a size too large for a float (a hostile listing's) never becomes one.
    tenths = (size * 10 + scale // 2) // scale
    return f"{tenths // 10}.{tenths % 10} {unit}"


PER_JOB_HINT = "use a separate download_dir per job"
SAME_FOLDER_HINT = "with the same download_dir?"
_SETTING_HINTS = (PER_JOB_HINT, SAME_FOLDER_HINT)
"""Hints naming the setting to change: `FolderName.renamed` puts the one the user gave there."""
_MOVE_IT = "move it away, or use a dedicated download directory, not the training output_dir"
"""What to do about a thing of the user's in the way, in a ``download_dir`` the user gave."""
_MOVE_IT_OUT = "move it out of that folder"
"""The same, in a folder verirl made: the user cannot choose another (`FolderName.renamed`)."""


@attrs.frozen
class FolderName:
    """What the download folder's errors call it: the ``download_dir`` a user gave, or else.

    A folder verirl made from another setting (``output_dir``) is named as
    such (``label``), with what it was made from (``note``), and a hint about
    ``download_dir`` names that ``setting``: a user never reads a field they
    did not give, nor advice to choose another folder. The `ConfigError`
    keeps ``field="download_dir"`` and its bare ``reason``, for a caller that
    words it its own way (the CLI).
    """

    label: str = "download_dir"
    note: str = ""
    setting: str = "download_dir"

    def check(self, root: Path) -> None:
        """`ConfigError` when ``root`` is a file, or a link to nothing: no folder can be there.

        A link to a folder is followed (a folder put on another disk on purpose).
        One look at ``root`` itself decides: another thread or process making
        the folder meanwhile is never taken for a thing in the way.
        """
        kind = lstat_kind(root)
        if kind in (None, "dir") or (kind == "symlink" and root.is_dir()):
            return
        if kind == "symlink" and not root.exists():
            reason = "is a symlink to nothing (a folder that does not exist); make the folder "
            reason += "it points to, or remove the link"
        else:
            reason = "exists and is not a directory"
        raise self.renamed(ConfigError.invalid("download_dir", str(root), reason), root)

    def renamed(self, exc: VeriRLError, root: Path) -> VeriRLError:
        """``exc``, raised about the folder ``root``, in these words."""
        if not self.note or self.note in str(exc):  # given, or said already
            return exc
        renamed: VeriRLError
        if isinstance(exc, ConfigError) and exc.field == "download_dir" and exc.reason:
            reason = exc.reason.replace(_MOVE_IT, _MOVE_IT_OUT)
            message = f"{self.label}={quoted(exc.value)}: {reason}; {self.note}"
            renamed = ConfigError(message, field=exc.field, value=exc.value, reason=reason)
        elif isinstance(exc, CheckpointSourceError):
            message = str(exc).replace(f"download_dir {printable(root)}", self.named(root))
            for hint in _SETTING_HINTS:  # only these: a path may hold the word too
                message = message.replace(hint, hint.replace("download_dir", self.setting))
            renamed = CheckpointSourceError(
                f"{message}; {self.note}",
                repo_missing=exc.repo_missing,
                checkpoint_unreadable=exc.checkpoint_unreadable,
                step=exc.step,
            )
        else:
            return exc
        renamed.__cause__ = exc.__cause__
        return renamed

    def named(self, root: Path) -> str:
        """``root``, called what this folder is."""
        return f"{self.label} {printable(root)}"


def fetch_folder(
    root: Path,
    remote: RemoteFolder,
    *,
    lock_timeout: float,
    download: Callable[[Sequence[str], str, Path], None],
    name: FolderName = FolderName(),
) -> Path:
    """Make ``root/<remote.name>`` hold ``remote``'s files and return it.

    A folder already there is reused when it matches the listing, replaced
    when verirl downloaded it (its marker, nothing else of the user's), and
    otherwise refused with a `ConfigError`. ``download(repo_paths, commit,
    local_dir)`` fetches the files into ``local_dir`` (as ``local_dir/<repo
    path>``) and raises `CheckpointSourceError` when it cannot. Errors about
    ``root`` call it ``name``.
    """
    try:
        return _fetch_folder(root, remote, lock_timeout=lock_timeout, download=download)
    except (ConfigError, CheckpointSourceError) as exc:
        raise name.renamed(exc, root) from exc.__cause__


def _fetch_folder(
    root: Path,
    remote: RemoteFolder,
    *,
    lock_timeout: float,
    download: Callable[[Sequence[str], str, Path], None],
) -> Path:
    FolderName().check(root)
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise _kept_from(remote, f"cannot create download_dir {printable(root)}", exc) from exc
    lock = root / f".verirl-{remote.name}.lock"
    with _locked(lock, lock_timeout, root, remote):
        try:
            return _fetch_locked(root, remote, download)
        except VeriRLError:
            raise
        except OSError as exc:  # what the download folder answered, whatever the step
            raise _kept_from(remote, f"cannot use download_dir {printable(root)}", exc) from exc


def _kept_from(remote: RemoteFolder, doing: str, exc: OSError) -> CheckpointSourceError:
    """The error for a download folder on this machine that keeps verirl from ``remote``.

    The checkpoint is there; what stops verirl is local (permissions, a full
    disk, a read-only mount) and would stop it for any other download too, so
    it is ``checkpoint_unreadable``: an older checkpoint never stands in.
    """
    why = printable(exc.strerror or str(exc) or type(exc).__name__)
    msg = (
        f"{doing}: {type(exc).__name__}: {why}; {remote.name} (step {remote.step}) is there "
        "but cannot be brought here, so no older checkpoint is resumed in its place"
    )
    return CheckpointSourceError(msg, checkpoint_unreadable=True, step=remote.step)


def _fetch_locked(
    root: Path, remote: RemoteFolder, download: Callable[[Sequence[str], str, Path], None]
) -> Path:
    folder, target, expected = remote.name, root / remote.name, remote.expected
    _remove_leftovers(root, folder)
    kind = lstat_kind(target)
    if kind in ("symlink", "file", "other"):
        what = "a symlink (never followed)" if kind == "symlink" else "not a directory"
        raise ConfigError.invalid(
            "download_dir",
            str(root),
            f"holds {folder}, which is {what} and which verirl did not download; refusing "
            f"to overwrite it ({_MOVE_IT})",
        )
    if kind == "dir" and _reusable(root, target, folder, expected):
        return target
    size = sum(entry.size for entry in expected.values())
    log.info(
        "downloading %s (step %d) from %s at commit %s: %d files, %s, into %s",
        folder,
        remote.step,
        remote.origin,
        remote.commit[:12],
        len(expected),
        human_size(size),
        printable(target),
    )
    staging = make_owned_dir(
        root,
        f"{_STAGING_PREFIX}{folder}-",
        {"kind": "staging", "folder": folder, "files": sorted(expected)},
    )
    try:
        download(sorted(remote.files), remote.commit, staging)
        fresh = staging / folder
        problem = mismatch(fresh, expected, None)
        if problem is not None:
            msg = f"downloaded {folder} from {remote.origin} but it is unusable: {problem}"
            raise CheckpointSourceError(msg) from ValueError(problem)
        write_marker(fresh, remote)
        _move_into_place(root, fresh, target, remote, replace=kind == "dir")
    finally:
        remove_tree(staging)
    log.info("downloaded %s (%s) to %s", folder, human_size(size), printable(target))
    return target


def _reusable(root: Path, target: Path, folder: str, expected: Mapping[str, FileEntry]) -> bool:
    """Whether the existing ``target`` already holds ``expected``; False if it may be replaced.

    Raises `ConfigError` when it differs and is not (only) verirl's to replace.
    """
    marker = read_marker(target)
    why = mismatch(target, expected, marker)
    if why is None:
        log.info("%s already holds %s as listed; nothing to download", printable(root), folder)
        _warn_about_strays(target, folder, expected)
        return True
    if marker is None:
        raise ConfigError.invalid(
            "download_dir",
            str(root),
            f"already holds {folder}, which verirl did not download there ({why}); "
            f"refusing to overwrite it ({_MOVE_IT})",
        )
    strays = _strays(target, marker)
    if strays:
        raise ConfigError.invalid(
            "download_dir",
            str(root),
            f"holds an outdated download of {folder} ({why}) with files verirl did "
            f"not download ({', '.join(map(printable, strays[:_STRAYS_SHOWN]))}); refusing to "
            "replace it: move those files away or delete the folder",
        )
    log.info("replacing the outdated download %s (%s)", printable(target), why)
    return False


@contextlib.contextmanager
def _locked(lock: Path, timeout: float, root: Path, remote: RemoteFolder) -> Iterator[None]:
    """`flock_with_deadline` on ``lock``, refusing what an older checkpoint must not replace.

    The checkpoint is there, so what keeps verirl from it never makes an
    older one stand in: a lock still held after ``timeout`` is a
    `CheckpointSourceError` marked ``checkpoint_unreadable`` (with the step),
    and a lock file verirl did not make (a symlink, a folder, a FIFO) is a
    `ConfigError` naming ``download_dir``, as such a thing in the
    checkpoint's own place is; a lock verirl cannot open or lock otherwise
    (another user's, a read-only folder) is `checkpoint_unreadable` too.
    """
    try:
        with flock_with_deadline(lock, timeout):
            yield
            return
    except TimeoutError as exc:
        msg = (
            f"gave up after waiting {timeout:g}s for another download of {remote.name} into "
            f"{printable(root)} to finish (lock file {printable(lock)}); "
            f"raise lock_timeout, or {PER_JOB_HINT}"
        )
        raise CheckpointSourceError(msg, checkpoint_unreadable=True, step=remote.step) from exc
    except OSError as exc:
        refused = (errno.ELOOP, errno.EISDIR, errno.ENXIO)  # a symlink, a folder, a socket
        if exc.errno in refused or isinstance(exc, FileRefusedError):
            what = "a symlink (never followed)" if exc.errno == errno.ELOOP else "not a file"
            raise ConfigError.invalid(
                "download_dir",
                str(root),
                f"holds the lock file {printable(lock.name)}, which is {what} and which "
                f"verirl did not make; refusing to use it ({_MOVE_IT})",
            ) from None
        raise _kept_from(remote, f"cannot lock {printable(lock)}", exc) from exc


def _remove_leftovers(root: Path, folder: str) -> None:
    """Delete ``folder``'s staging/old folders that a killed verirl left (the lock is ours now).

    Only a folder `make_owned_dir` made (a real directory with verirl's
    ownership marker, whose id is in its name) that holds nothing but what a
    download puts there goes. Anything else with such a name is a user's: it
    is left alone, with a warning.
    """
    prefixes = (f"{_STAGING_PREFIX}{folder}-", f"{_OLD_PREFIX}{folder}-")
    try:
        with os.scandir(root) as entries:
            candidates = sorted(Path(e.path) for e in entries if e.name.startswith(prefixes))
    except OSError as exc:
        msg = f"cannot list download_dir {printable(root)}: {type(exc).__name__}: {exc.strerror}"
        raise CheckpointSourceError(msg) from exc
    for path in candidates:
        prefix = next(p for p in prefixes if path.name.startswith(p))
        why = _not_a_leftover(path, prefix, folder)
        if why is None:
            log.info("removing %s, left by an interrupted download", printable(path))
            remove_tree(path)  # never follows symlinks
        else:
            log.warning(
                "leaving %s alone: it is named like a folder of an interrupted verirl download, "
                "but %s; delete or move it yourself if you do not need it",
                printable(path),
                why,
            )


def _not_a_leftover(path: Path, prefix: str, folder: str) -> str | None:
    """Why ``path`` is no staging/old folder of ``folder`` verirl may delete; None if it is."""
    record = read_owner_record(path, prefix)
    if isinstance(record, str):
        return record
    listed = record.get("files")
    if record.get("folder") != folder or not isinstance(listed, list):
        return f"its {OWNER_MARKER} is not about {folder}"
    files = {f"{folder}/{name}" for name in listed if isinstance(name, str)}
    files |= {OWNER_MARKER, f"{folder}/{MARKER}"}
    parents = {
        "/".join(name.split("/")[:i]) for name in files for i in range(1, name.count("/") + 1)
    }
    try:
        for relative, _ in _tree(path):
            kind = lstat_kind(path / relative)
            in_cache = relative.startswith(f"{_HF_CACHE}/") or relative in (".cache", _HF_CACHE)
            if kind == "dir" and (relative in parents or in_cache):
                continue
            if kind == "file" and (relative in files or relative.startswith(f"{_HF_CACHE}/")):
                continue
            return f"it holds {quoted(relative)}, which no download puts there"
    except OSError as exc:
        return f"it cannot be read ({type(exc).__name__}: {exc.strerror})"
    return None


def _raise(exc: OSError) -> None:
    """`os.walk`'s ``onerror``: a folder that cannot be listed is never skipped quietly."""
    raise exc


def _tree(top: Path) -> Iterator[tuple[str, bool]]:
    """``(relative path, is a folder)`` for everything under the folder ``top``, parents first.

    Nothing is followed: a symlink, to a folder too, is listed, not a folder.
    Walked from a stack, one folder listed at a time (`os.walk` for one
    level: it recurses on 3.10 and 3.11, a `RecursionError` ~1000 folders
    deep): any depth a path can reach is walked. A folder that cannot be
    listed raises its `OSError`; one nested too deeply for a path to reach
    it, an `OSError` (``ENAMETOOLONG``) that names ``top``.
    """
    stack = [(top, "")]
    while stack:
        folder, prefix = stack.pop()
        try:
            folders, others = _listing(folder)
        except OSError as exc:
            if exc.errno != errno.ENAMETOOLONG or not prefix:
                raise
            depth = prefix.count("/")
            why = f"folders nested {depth} deep, deeper than a path can reach"
            raise OSError(errno.ENAMETOOLONG, why, os.fspath(top)) from exc
        for name in folders:
            yield f"{prefix}{name}", True
        for name in others:
            yield f"{prefix}{name}", False
        stack.extend((folder / name, f"{prefix}{name}/") for name in reversed(folders))


def _listing(folder: Path) -> tuple[list[str], list[str]]:
    """The names in ``folder``: its subfolders (real ones), and all else, symlinks included."""
    # Its first step lists ``folder`` alone (top-down), then it waits: no recursion yet.
    _, dirnames, filenames = next(os.walk(folder, onerror=_raise, followlinks=False), (0, [], []))
    links = [name for name in dirnames if (folder / name).is_symlink()]
    linked = set(links)
    return [name for name in dirnames if name not in linked], [*links, *filenames]


def _files_in(folder: Path) -> list[str]:
    """Relative paths of everything but directories under ``folder``; symlinks are not followed.

    A subfolder that cannot be listed is a `CheckpointSourceError`: what it
    holds could be the user's, and would be taken for nothing. So is a
    nesting deeper than a path can reach.
    """
    try:
        found = [relative for relative, is_folder in _tree(folder) if not is_folder]
    except OSError as exc:
        raise unreadable(exc.filename or folder, exc) from exc
    return sorted(found)


def _strays(folder: Path, marker: Mapping[str, object]) -> list[str]:
    """Files in ``folder`` that its marker does not list (the user's, not the download's)."""
    recorded = marker.get("files")
    known = set(recorded) if isinstance(recorded, dict) else set()
    return [name for name in _files_in(folder) if name not in known and name != MARKER]


def _move_into_place(
    root: Path, fresh: Path, target: Path, remote: RemoteFolder, *, replace: bool
) -> None:
    """Rename the verified download to ``target``; an old download of ours is removed after."""
    try:
        if replace:
            # rename() replaces an empty directory: the old folder goes aside in one step.
            # The old folder goes into a folder verirl owns first, so that a kill
            # before the end leaves only what the next run may safely delete.
            old = make_owned_dir(
                root,
                f"{_OLD_PREFIX}{target.name}-",
                {"kind": "old", "folder": target.name, "files": _files_in(target)},
            )
            target.rename(old / target.name)
            fresh.rename(target)
            remove_tree(old)
        elif lstat_kind(target) is not None:
            raise ConfigError.invalid(
                "download_dir",
                str(root),
                f"{target.name} appeared there during the download; refusing to overwrite it",
            )
        else:
            fresh.rename(target)  # fails rather than replace anything but an empty directory
    except OSError as exc:
        doing = f"cannot move the finished download into {printable(target)}"
        raise _kept_from(remote, doing, exc) from exc


def _warn_about_strays(target: Path, folder: str, files: Iterable[str]) -> None:
    """Warn about files in ``target`` the listed commit does not have (an older download's)."""
    expected = set(files) | {MARKER}
    strays = [name for name in _files_in(target) if name not in expected]
    if strays:
        log.warning(
            "%s holds files the Hub's %s does not (from an earlier download?): %s",
            printable(target),
            folder,
            ", ".join(printable(name) for name in strays[:_STRAYS_SHOWN])
            + (" ..." if len(strays) > _STRAYS_SHOWN else ""),
        )

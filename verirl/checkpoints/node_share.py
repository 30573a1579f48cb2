"""One checkpoint choice per node: local rank 0 resolves (and downloads), the other ranks wait.

With 8 ranks on a node, each resolving ``latest`` on its own lists the Hub 8
times, queues 8 times at the download lock, and may even pick different
checkpoints if one is pushed meanwhile. Here local rank 0 (the *leader*)
resolves while holding a lock file in the Hub source's ``download_dir``, then
publishes its answer (a path, or the error it hit) in a record beside it; the
other local ranks read that record. Files are named by an *attempt key* that
all ranks of one node attempt share and the next attempt does not (see
`verirl.checkpoints.attempt.attempt_key`), so a retry never reads its predecessor's answer.

A follower gives up with `CheckpointSourceError` when the deadline passes,
and at once when the leader has stopped without an answer (it took the lock,
and the lock is free again: a process that dies releases its ``flock``). The
files are read and written as untrusted: never through a symlink, a record
that cannot be read or is not verirl's is an error, and a lock file replaced
under the leader is never taken for a leader that stopped.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import logging
import os
import secrets
import stat
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

import attrs

from verirl import _defaults as defaults
from verirl._fs import (
    FileRefusedError,
    flock_with_deadline,
    printable,
    quoted,
    read_capped,
    write_new_file,
)
from verirl.checkpoints.attempt import attempt_key
from verirl.checkpoints.download_dir import SAME_FOLDER_HINT, FolderName
from verirl.checkpoints.model import shorten
from verirl.errors import CheckpointNotFoundError, CheckpointSourceError, ConfigError

__all__ = ["NODE_WAIT_TIMEOUT", "CheckpointResolving", "NodeSharedResolver", "attempt_key"]

log = logging.getLogger("verirl.checkpoints")

NODE_WAIT_TIMEOUT = defaults.NODE_WAIT_TIMEOUT
"""Seconds a follower waits for the leader's choice by default (a download may take that long)."""

_PREFIX = ".verirl-node-"
_UNTAKABLE = (errno.ELOOP, errno.EISDIR, errno.ENXIO,  # a link, a folder, a socket
              errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL)  # no locks  # fmt: skip
_STALE_AFTER = 7 * 24 * 3600.0
_RECORD_LIMIT = 1 << 20
_FIRST_PAUSE = 0.02
_MAX_PAUSE = 0.5


class CheckpointResolving(Protocol):
    """What the runtime needs of a `verirl.CheckpointResolver` (and what is shared per node)."""

    def resolve(self, request: str | None) -> str | None:
        """The local path to resume from, or ``None`` for a fresh start."""
        ...


def _error_record(exc: BaseException) -> dict[str, object]:
    if isinstance(exc, CheckpointNotFoundError):
        return {"error": "not-found", "request": exc.request, "searched": list(exc.searched),
                "reason": exc.reason}  # fmt: skip
    if isinstance(exc, ConfigError):
        return {"error": "config", "message": str(exc), "field": exc.field}
    if isinstance(exc, Exception):
        return {"error": "failed", "message": f"{type(exc).__name__}: {exc}"}
    return {"error": "interrupted", "message": type(exc).__name__}


def _raise_from_record(record: Mapping[str, object]) -> None:
    kind = record.get("error")
    if kind == "not-found":
        searched = record.get("searched")
        reason = record.get("reason")
        raise CheckpointNotFoundError(
            str(record.get("request")),
            [printable(str(place)) for place in searched] if isinstance(searched, list) else [],
            reason=printable(reason) if isinstance(reason, str) else None,
        )
    message = printable(str(record.get("message")))
    if kind == "config":
        field = record.get("field")
        raise ConfigError(message, field=field if isinstance(field, str) else None)
    if kind == "interrupted":
        message = f"it was interrupted ({message})"
    msg = f"local rank 0 could not choose the checkpoint: {message}"
    raise CheckpointSourceError(msg)


@attrs.define
class NodeSharedResolver:
    """Resolve once per node: the leader through ``resolver``, the others from its record."""

    resolver: CheckpointResolving
    folder: Path
    key: str
    leader: bool
    timeout: float = NODE_WAIT_TIMEOUT
    name: FolderName = attrs.field(factory=FolderName, kw_only=True)  # the folder, in errors

    def _path(self, suffix: str) -> Path:
        return self.folder / f"{_PREFIX}{self.key}{suffix}"

    def resolve(self, request: str | None) -> str | None:
        """The leader's answer for ``request`` on every local rank (or its error, re-raised).

        An error about the folder names it as ``name`` does (the Hub download
        folder verirl made from ``output_dir``, not a ``download_dir`` never given).
        """
        try:
            return self._lead(request) if self.leader else self._follow()
        except CheckpointSourceError as exc:
            raise self.name.renamed(exc, self.folder) from exc.__cause__

    def _lead(self, request: str | None) -> str | None:
        """Choose under the lock, and record the choice, or what ended the choosing.

        From the lock on, whatever ends this is recorded for the followers,
        never over an answer already written, and only under the lock (or
        where no process can hold it: a lock file that cannot be taken): a
        leader interrupted before it holds the lock (or one that waits for a
        lock another process holds) writes nothing, and the followers wait
        their deadline, as for a leader that died then.
        """
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            msg = f"cannot create download_dir {printable(self.folder)}: {exc.strerror}"
            raise CheckpointSourceError(msg) from exc
        _sweep(self.folder)
        lock = self._path(".lock")
        with contextlib.ExitStack() as stack:
            try:
                locked = stack.enter_context(flock_with_deadline(lock, self.timeout))
            except TimeoutError as exc:
                msg = (
                    f"local rank 0 could not take its lock {printable(lock)} within "
                    f"{self.timeout:g}s (another process holds it)"
                )
                raise CheckpointSourceError(msg) from exc
            except OSError as exc:
                why = printable(exc.strerror or str(exc))
                msg = f"cannot lock {printable(lock)}: {type(exc).__name__}: {why} (remove it)"
                error = CheckpointSourceError(msg)
                # No process can hold a lock that cannot be taken (a link, a folder, a file
                # system without locks): the followers get the reason now, not at their
                # deadline. Any other failure (permissions, no descriptor left) may be this
                # process's alone, the lock another's: nothing written.
                untakable = isinstance(exc, FileRefusedError) or exc.errno in _UNTAKABLE
                with contextlib.suppress(CheckpointSourceError):
                    if untakable and self._read() is None:
                        self._write(".json", _error_record(error))
                raise error from exc
            answer: dict[str, object] | None = None
            try:
                # Which file the lock is on: a follower never trusts a lock file put in its place.
                self._write(".claim", {"pid": os.getpid(), "lock": _identity(locked)})
                path = self.resolver.resolve(request)
                answer = {"path": path}
                self._write(".json", answer)
            except BaseException as exc:
                with contextlib.suppress(CheckpointSourceError):  # the error matters more
                    if answer is None or self._read() != answer:  # not over the answer given
                        self._write(".json", _error_record(exc))
                raise
        return path

    def _write(self, suffix: str, record: Mapping[str, object]) -> None:
        """Write ``record`` as the file ``suffix`` in one step, never through a symlink."""
        final = self._path(suffix)
        partial = final.with_name(f"{final.name}.{secrets.token_hex(8)}.tmp")
        try:
            write_new_file(partial, json.dumps(record))
            partial.replace(final)  # replaces a symlink there, never what it points to
        except BaseException as exc:  # a Ctrl-C too: no partial file left behind
            with contextlib.suppress(OSError):
                partial.unlink()
            if not isinstance(exc, OSError):
                raise
            why = printable(exc.strerror or str(exc))
            msg = f"cannot write {printable(final)}: {type(exc).__name__}: {why}"
            raise CheckpointSourceError(msg) from exc

    def _read(self, suffix: str = ".json") -> Mapping[str, object] | None:
        """The record ``suffix``, or None while there is none; anything unusable is an error."""
        path = self._path(suffix)
        try:
            data = json.loads(read_capped(path, _RECORD_LIMIT, follow_symlinks=False))
        except FileNotFoundError:
            return None
        except (OSError, ValueError, RecursionError) as exc:
            why = (
                printable(str(exc)) if not isinstance(exc, RecursionError) else "nested too deeply"
            )
            msg = f"cannot read local rank 0's record {printable(path)}: {why}"
            raise CheckpointSourceError(msg) from exc
        if not isinstance(data, dict):
            msg = f"local rank 0's record {printable(path)} is not a JSON object"
            raise CheckpointSourceError(msg)
        return data

    def _follow(self) -> str | None:
        log.info("waiting for local rank 0's checkpoint choice (in %s)", printable(self.folder))
        deadline = time.monotonic() + self.timeout
        pause = _FIRST_PAUSE
        while True:
            record = self._read()
            if record is None and self._leader_gone():
                record = self._read()  # it may have answered just before it let go
                if record is None:
                    msg = (
                        "local rank 0 stopped before it chose a checkpoint (its lock in "
                        f"{printable(self.folder)} is free and it left no answer); see its log"
                    )
                    raise CheckpointSourceError(msg)
            if record is not None:
                if "path" not in record:
                    _raise_from_record(record)
                path = None if record["path"] is None else self._check_choice(record["path"])
                log.info("local rank 0 chose %s", printable(path) if path else "a fresh start")
                return path
            left = deadline - time.monotonic()
            if left <= 0:
                msg = (
                    f"local rank 0 did not choose a checkpoint within {self.timeout:g}s "
                    f"(nothing in {printable(self.folder)}); is it running, {SAME_FOLDER_HINT}"
                )
                raise CheckpointSourceError(msg)
            time.sleep(min(pause, left))
            pause = min(pause * 2, _MAX_PAUSE)

    def _check_choice(self, path: object) -> str:
        """``path``, or `CheckpointSourceError` unless it names a folder this rank finds.

        The record is a file in a shared folder: anything may stand there. Local
        rank 0 writes ``null`` for a fresh start, never ``""``, and a folder it
        found on this node.
        """
        where = printable(self._path(".json"))
        if not isinstance(path, str) or not path or "\x00" in path:
            shown = shorten(quoted(path))
            msg = f"local rank 0's checkpoint choice is not a path: {shown} (in {where})"
            raise CheckpointSourceError(msg)
        try:
            os.fsencode(path)
            found = os.path.isdir(path)  # noqa: PTH112 - text in, no Path() round trip
        except (UnicodeError, OSError, ValueError):
            found = False
        if not found:
            msg = (
                f"local rank 0 chose {shorten(quoted(path))} (in {where}), which is no folder "
                "this rank finds"
            )
            raise CheckpointSourceError(msg)
        return path

    def _leader_gone(self) -> bool:
        """The leader took the lock (its claim exists) and no longer holds it.

        Only the very file the leader locked counts: a lock file removed or
        replaced meanwhile says nothing about the leader (the follower keeps
        waiting for the record, up to its deadline).
        """
        claim = self._read(".claim")
        if claim is None:
            return False
        locked = claim.get("lock")
        if not isinstance(locked, dict) or not all(
            isinstance(locked.get(key), int) and not isinstance(locked.get(key), bool)
            for key in ("dev", "ino")
        ):
            msg = (
                f"local rank 0's claim {printable(self._path('.claim'))} was not written by verirl"
            )
            raise CheckpointSourceError(msg)
        flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY
        try:
            fd = os.open(self._path(".lock"), flags)
        except (FileNotFoundError, NotADirectoryError):
            return False  # removed: nothing to tell by
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                return False  # a symlink now: not the leader's file
            raise self._unreadable_lock(exc) from exc
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode) or _identity(info) != locked:
                return False
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError as exc:
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                return False
            raise self._unreadable_lock(exc) from exc
        else:
            return True
        finally:
            os.close(fd)

    def _unreadable_lock(self, exc: OSError) -> CheckpointSourceError:
        why = printable(exc.strerror or str(exc))
        lock = printable(self._path(".lock"))
        return CheckpointSourceError(f"cannot check local rank 0's lock {lock}: {why}")


def _identity(info: os.stat_result) -> dict[str, int]:
    """Which file ``info`` describes, as a claim records it."""
    return {"dev": info.st_dev, "ino": info.st_ino}


def _sweep(folder: Path) -> None:
    """Delete our own node records older than a week (each attempt leaves three small files)."""
    cutoff = time.time() - _STALE_AFTER
    with contextlib.suppress(OSError), os.scandir(folder) as entries:
        for entry in entries:
            if not entry.name.startswith(_PREFIX) or not entry.is_file(follow_symlinks=False):
                continue
            with contextlib.suppress(OSError):
                if entry.stat(follow_symlinks=False).st_mtime < cutoff:
                    os.unlink(entry.path)  # noqa: PTH108

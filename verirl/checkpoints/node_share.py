"""One checkpoint choice per node: local rank 0 resolves (and downloads), the other ranks wait.

With 8 ranks on a node, each resolving ``latest`` on its own lists the Hub 8
times, queues 8 times at the download lock, and may even pick different
checkpoints if one is pushed meanwhile. Here local rank 0 (the *leader*)
resolves while holding a lock file in the Hub source's ``download_dir``, then
publishes its answer (a path, or the error it hit) in a record beside it; the
other local ranks read that record. Files are named by an *attempt key* that
all ranks of one node attempt share and the next attempt does not (see
`attempt_key`), so a retry never reads its predecessor's answer.

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
import hashlib
import json
import logging
import os
import re
import secrets
import stat
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol

import attrs

from verirl import _procfs
from verirl._fs import (
    FileRefusedError,
    flock_with_deadline,
    printable,
    quoted,
    read_capped,
    write_new_file,
)
from verirl.checkpoints.download_dir import SAME_FOLDER_HINT, FolderName
from verirl.checkpoints.model import shorten
from verirl.errors import CheckpointNotFoundError, CheckpointSourceError, ConfigError

__all__ = ["NODE_WAIT_TIMEOUT", "CheckpointResolving", "NodeSharedResolver", "attempt_key"]

log = logging.getLogger("verirl.checkpoints")

NODE_WAIT_TIMEOUT = 3600.0
"""Seconds a follower waits for the leader's choice by default (a download may take that long)."""

_PREFIX = ".verirl-node-"
_UNTAKABLE = (errno.ELOOP, errno.EISDIR, errno.ENXIO,  # a link, a folder, a socket
              errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL)  # no locks  # fmt: skip
_STALE_AFTER = 7 * 24 * 3600.0
_RECORD_LIMIT = 1 << 20
_FIRST_PAUSE = 0.02
_MAX_PAUSE = 0.5

_generations: dict[str, int] = {}
_generations_lock = threading.Lock()


class CheckpointResolving(Protocol):
    """What the runtime needs of a `verirl.CheckpointResolver` (and what is shared per node)."""

    def resolve(self, request: str | None) -> str | None:
        """The local path to resume from, or ``None`` for a fresh start."""
        ...


def _parent_identity() -> str:
    """The parent's pid and start time: the launcher process all local ranks share."""
    ppid = os.getppid()
    started = _procfs.start_time(ppid)
    return f"{ppid}@{'?' if started is None else started}"


_DIGITS = re.compile(rb"[0-9]+")
_SLURM_STEP = ("SLURM_JOB_ID", "SLURM_STEP_ID", "SLURM_RESTART_COUNT")
_PMIX = ("PMIX_NAMESPACE",)
_TORCHRUN = ("TORCHELASTIC_ERROR_FILE",)  # compared by its attempt folder (`_scope_values`)


def _shape(pid: int) -> bytes | None:
    """The process's command line with every number made ``#``: the same for each local rank.

    Launchers number their ranks on the command line (``--local_rank=3``,
    ``mp.spawn``'s ``pipe_handle=11``); the program and its flags stay. Read
    through a live thread when the main one has ended (`verirl._procfs.read`):
    a rank training on in its threads still has its command line.
    """
    try:
        return _DIGITS.sub(b"#", _procfs.read(pid, "cmdline"))
    except OSError:
        return None


def _environ_values(pid: int, names: tuple[str, ...]) -> tuple[str, ...] | None:
    """``names``' values in the environment the process started with (``None``: unreadable).

    Read through a live thread when the main one has ended (`verirl._procfs.read`).
    """
    try:
        raw = _procfs.read(pid, "environ")
    except OSError:
        return None
    found: dict[str, str] = {}
    for item in raw.split(b"\0"):
        name, _, value = item.partition(b"=")
        text = name.decode("utf-8", "replace")
        if text in names:
            found[text] = value.decode("utf-8", "surrogateescape")
    return tuple(found.get(name, "") for name in names)


def _torchrun_attempt(error_file: str) -> str:
    """Torchrun's attempt folder in ``<run>/attempt_<n>/<local rank>/error.json``."""
    return os.path.dirname(os.path.dirname(error_file))  # noqa: PTH120


def _scope_values(pid: int, scope: tuple[str, ...]) -> tuple[str, ...] | None:
    """`_environ_values` of ``scope``; torchrun's error file as its attempt folder.

    Each local rank has an error file of its own, in the attempt's folder.
    """
    values = _environ_values(pid, scope)
    if values is None or scope != _TORCHRUN:
        return values
    return tuple(_torchrun_attempt(value) for value in values)


def _first_rank(scope: tuple[str, ...] | None) -> str:
    """The oldest running process of this attempt's local ranks, as ``pid@start``.

    A rank of this attempt is a process running the same program with the
    same flags (`_shape`), in the same *scope*: with ``scope`` ``None``, a child
    of our parent; else a process whose environment holds the same values of
    ``scope``'s variables (one srun step, through any wrapper). The ranks of
    the attempt before have all ended, so a retry by the same parent or in
    the same step gets another first rank, hence another key. A rank whose
    main thread has ended while its others run (Zl) still runs. ``""`` where
    ``/proc`` cannot tell (our own command line or environment unreadable:
    it would match a kernel thread's).
    """
    me, parent = os.getpid(), str(os.getppid())
    mine, own = _shape(me), _procfs.stat_fields(me)
    ours = None if scope is None else _scope_values(me, scope)
    if not mine or own is None or (scope is not None and ours is None):
        return ""
    oldest = (int(own[_procfs.STARTTIME]), me)
    # A wrapper with our command line counts too: each rank sees the same processes, so
    # all pick the same oldest one (leaving out each rank's own wrapper would split them).
    with contextlib.suppress(OSError), os.scandir("/proc") as entries:
        for entry in entries:
            if not entry.name.isdigit() or int(entry.name) == me:
                continue
            pid = int(entry.name)
            fields = _procfs.stat_fields(pid)
            if fields is None or (
                fields[0] in _procfs.ENDED_STATES and not _procfs.threads_run(pid)
            ):
                continue
            if scope is None and fields[1] != parent:
                continue
            if _shape(pid) != mine:
                continue
            if scope is not None and _scope_values(pid, scope) != ours:
                continue
            oldest = min(oldest, (int(fields[_procfs.STARTTIME]), pid))
    return f"{oldest[1]}@{oldest[0]}"


def _launch_attempt(environ: Mapping[str, str]) -> str:
    """What tells this node attempt from the next: torchrun's attempt folder, else the ranks.

    torchrun gives each rank ``TORCHELASTIC_ERROR_FILE`` =
    ``<a new temporary folder per agent run>/attempt_<n>/<local rank>/error.json``,
    inherited through any wrapper (a shell, ``verirl launch``). ``srun`` gives
    each step an id (``SLURM_JOB_ID``, ``SLURM_STEP_ID``, a requeue's
    ``SLURM_RESTART_COUNT``) and PMIx launchers a namespace, inherited alike;
    other launchers (``mp.spawn``, a supervisor) start every local rank as a
    child of one process (its pid and start time). Within a step or under one
    parent the ranks may be started again (a retry loop): the attempt's first
    rank (`_first_rank`) tells the attempts apart. That first rank must still
    run when the others compute the key, as a leader does while it trains (one
    that fails at once, before the others have started, leaves them waiting
    to their deadline). torchrun's folder is new for each attempt, but the
    variable may also be inherited as it is by a retry loop under one of
    torchrun's ranks, or set for good in a job's environment: there too the
    first rank (of those with the same attempt folder) tells attempts apart.
    """
    error_file = environ.get("TORCHELASTIC_ERROR_FILE", "")
    if error_file and error_file != os.devnull:
        return f"{_torchrun_attempt(error_file)}/{_first_rank(_TORCHRUN)}"
    if environ.get("SLURM_JOB_ID") and environ.get("SLURM_STEP_ID"):
        step = ".".join(environ.get(name, "") for name in _SLURM_STEP)
        return f"slurm:{step}/{_first_rank(_SLURM_STEP)}"
    if environ.get("PMIX_NAMESPACE"):
        return f"pmix:{environ['PMIX_NAMESPACE']}/{_first_rank(_PMIX)}"
    return f"{_parent_identity()}/{_first_rank(None)}"


def attempt_key(environ: Mapping[str, str], *, folder: Path, request: str | None = None) -> str:
    """A name shared by the local ranks of one node attempt, different for the next attempt.

    Made of the launcher's attempt (`_launch_attempt`), its run id and restart
    count, the rendezvous address, the node index, the request, and how many
    times this process resolved into ``folder`` before.
    """
    parts = [
        _launch_attempt(environ),
        str(request),
        *(
            environ.get(name, "")
            for name in (
                "TORCHELASTIC_RUN_ID",
                "TORCHELASTIC_RESTART_COUNT",
                "MASTER_ADDR",
                "MASTER_PORT",
                "WORLD_SIZE",
                "GROUP_RANK",
                "NODE_RANK",
                # one srun step, one requeue, one PMIx job: shared by its tasks, not the next
                "SLURM_JOB_ID",
                "SLURM_STEP_ID",
                "SLURM_RESTART_COUNT",
                "PMIX_NAMESPACE",
            )
        ),
    ]
    # surrogatepass: a path or variable holding bytes that are not UTF-8 still makes a key.
    base = hashlib.sha256("\x00".join(parts).encode("utf-8", "surrogatepass")).hexdigest()[:20]
    where = f"{base}:{os.path.realpath(folder)}"
    with _generations_lock:
        generation = _generations.get(where, 0)
        _generations[where] = generation + 1
    return f"{base}-{generation}"


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

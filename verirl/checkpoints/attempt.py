"""Which attempt of a job this process belongs to: the key all local ranks of one attempt share.

A retry (torchrun's restart, SLURM's requeue, a platform's rerun) gets a new
key, so that it never reads the answer its predecessor published (see
`verirl.checkpoints.node_share`).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import threading
from collections.abc import Mapping
from pathlib import Path

from verirl import _procfs

__all__ = ["attempt_key"]

_generations: dict[str, int] = {}
_generations_lock = threading.Lock()


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

"""What ``/proc`` says about a process, also when its main thread has ended (Linux).

A process whose main thread has exited (``pthread_exit``, a program that
lives on in its threads) while others still run shows as ``Zl``: its
``/proc/PID/stat`` says ``Z``, and what is read through the main thread
(``/proc/PID/environ``, ``cmdline``, ``task/PID/children``) reads empty or
fails, as psutil's ``status()``, ``environ()``, ``cmdline()`` do. Yet the
process is alive and holds what it held (GPU memory). Its live threads share
its memory, so ``/proc/PID/task/TID/environ`` of one of them still reads
the process's environment: every read here falls back to one. Everything is
psutil-free (``import verirl`` must not load psutil) and never raises for a
process that is gone or unreadable: the answer is then "ended", ``None`` or
empty, as each function says.
"""

from __future__ import annotations

import contextlib
import time
from pathlib import Path

__all__ = [
    "ENDED_STATES",
    "STARTTIME",
    "children",
    "environ",
    "proc_state",
    "read",
    "running",
    "start_time",
    "stat_fields",
    "threads_run",
]

ENDED_STATES = frozenset({"Z", "X", "x", ""})
"""State letters of a thread that has ended: zombie, dead ("" when ``stat`` is unreadable)."""

STARTTIME = 19
"""Index of ``/proc/PID/stat``'s field 22 (start time, in clock ticks after boot) from field 3."""

_FLAGS = 6
"""Index of ``/proc/PID/stat``'s field 9 (the kernel's ``PF_*`` flags) from field 3."""
_ENV_END = 48
"""Index of ``/proc/PID/stat``'s field 51 (where the environment ends in memory) from field 3."""
_PF_EXITING = 0x4
_PF_KTHREAD = 0x200000
_EXEC_WAIT_S = 2.0
"""How long a read waits for an ``execve`` under way to give the process its new memory."""


def _stat(path: str) -> list[str] | None:
    """A ``stat`` file's fields from field 3 (the state) on; ``None`` when unreadable.

    The command name (field 2) may hold spaces and parentheses: the fields
    start after its last ``)``.
    """
    try:
        text = Path(path).read_bytes().decode("ascii", "replace")
    except OSError:
        return None
    return text.rsplit(")", 1)[-1].split()


def stat_fields(pid: int) -> list[str] | None:
    """``/proc/PID/stat`` from field 3 (the state) on; ``None`` when unreadable or short.

    Read through the main thread even when it has ended: the start time and
    the parent stay right there (only the state says ``Z``).
    """
    fields = _stat(f"/proc/{pid}/stat")
    if fields is None or len(fields) <= STARTTIME or not fields[STARTTIME].isdigit():
        return None
    return fields


def start_time(pid: int) -> int | None:
    """When ``pid`` started, in clock ticks after boot (with the pid: which process it is)."""
    fields = stat_fields(pid)
    return None if fields is None else int(fields[STARTTIME])


def proc_state(pid: int) -> str:
    """The state letter of ``pid``'s main thread (``Z`` for a Zl process too); "" if unreadable."""
    fields = _stat(f"/proc/{pid}/stat")
    return fields[0] if fields else ""


def _tasks(pid: int) -> list[str]:
    """The thread ids of ``pid`` (``[]`` when it is gone or unreadable)."""
    try:
        return [task.name for task in Path(f"/proc/{pid}/task").iterdir()]
    except OSError:
        return []


def _live_threads(pid: int) -> list[str]:
    """The threads of ``pid`` other than the main one that have not ended."""
    live = []
    for tid in _tasks(pid):
        if tid == str(pid):
            continue
        fields = _stat(f"/proc/{pid}/task/{tid}/stat")
        if fields and fields[0] not in ENDED_STATES:
            live.append(tid)
    return live


def threads_run(pid: int) -> bool:
    """Whether a thread of ``pid`` other than the main one still runs (a Zl process is alive)."""
    return bool(_live_threads(pid))


def running(pid: int) -> bool:
    """Whether ``pid`` has not ended: its state is not a zombie's, or another thread runs.

    A zombie whose other threads run (Zl) is alive; a real zombie (ended,
    not reaped yet) and a pid that is gone are not.
    """
    return proc_state(pid) not in ENDED_STATES or threads_run(pid)


def _execing(pid: int) -> bool:
    """Whether ``pid`` is inside ``execve``: alive, not exiting, no kernel thread, no layout yet.

    From the moment ``execve`` closes the close-on-exec descriptors (when
    `subprocess.Popen` returns) until it has laid out the new program's
    arguments and environment, ``environ`` and ``cmdline`` read empty: a
    process started a moment ago would read as one with no environment (no
    launch marker) or as one that is ending. The new memory's end of the
    environment (``stat`` field 51) is 0 until that layout is done.
    """
    fields = _stat(f"/proc/{pid}/stat")
    if not fields or fields[0] in ENDED_STATES or len(fields) <= _FLAGS:
        return False
    try:
        flags = int(fields[_FLAGS])
    except ValueError:
        return False
    if flags & (_PF_EXITING | _PF_KTHREAD):
        return False
    if len(fields) > _ENV_END:
        return fields[_ENV_END] == "0"
    try:  # a kernel before 3.5 shows no layout: no command line is the sign
        return not Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def _read_after_exec(pid: int, name: str) -> bytes:
    """``/proc/PID/NAME`` read again once an ``execve`` under way has ended (or its deadline)."""
    deadline = time.monotonic() + _EXEC_WAIT_S
    pause = 0.0005
    while _execing(pid) and time.monotonic() < deadline:
        time.sleep(pause)  # nothing to wait on: the kernel tells no one an exec is done
        pause = min(pause * 2, 0.02)
    try:
        return Path(f"/proc/{pid}/{name}").read_bytes()
    except OSError:
        return b""


def read(pid: int, name: str) -> bytes:
    """The bytes of ``/proc/PID/NAME``, read through a live thread if the main one has ended.

    A Zl process's main thread reads ``environ`` and ``cmdline`` empty, or
    fails (``ESRCH``, ``EACCES``): then the first live other thread's
    ``/proc/PID/task/TID/NAME`` is read instead (the threads share the
    memory these come from). A process inside ``execve`` (just started)
    reads empty too: the read waits, up to a deadline, for the exec to end.
    Raises the first read's `OSError` when no thread can be read either; an
    empty read stays empty then (a real zombie's, an exiting process's, or
    a process with an empty environment).
    """
    try:
        data = Path(f"/proc/{pid}/{name}").read_bytes()
    except OSError as exc:
        error: OSError | None = exc
        data = b""
    else:
        error = None
        if data:
            return data
    for tid in _live_threads(pid):
        try:
            found = Path(f"/proc/{pid}/task/{tid}/{name}").read_bytes()
        except OSError:
            continue
        if found:
            return found
    if error is not None:
        raise error
    if name in {"environ", "cmdline"}:  # read again: an exec may have ended since the first read
        return _read_after_exec(pid, name)
    return data


def environ(pid: int) -> dict[str, str] | None:
    """The environment ``pid`` started with (`read`'s fallback included); ``None``: unreadable.

    Values that are not UTF-8 keep their bytes as surrogates, so a marker
    compares equal whatever else the environment holds.
    """
    try:
        raw = read(pid, "environ")
    except OSError:
        return None
    found: dict[str, str] = {}
    for item in raw.split(b"\0"):
        name, equal, value = item.partition(b"=")
        if not name or not equal:  # as psutil: an entry without a name or "=" is no variable
            continue
        found[name.decode("utf-8", "surrogateescape")] = value.decode("utf-8", "surrogateescape")
    return found


def children(pid: int) -> list[int]:
    """The children of ``pid``, gathered from every thread's ``children`` file (``[]``: none).

    Each thread lists only the children it forked (or inherited when a
    thread that forked them ended), so reading the main thread alone misses
    those of a Zl process and those any other thread started.
    """
    found: list[int] = []
    for tid in _tasks(pid):
        with contextlib.suppress(OSError, ValueError):
            found += [
                int(child)
                for child in Path(f"/proc/{pid}/task/{tid}/children").read_bytes().split()
            ]
    return found

"""The command line's standard descriptors: never closed under a child, never a pipe nobody reads.

A closed 0, 1 or 2 is reopened on ``/dev/null`` before anything else is opened
(a child would take the next file for its stdin or stdout), and a pipe whose
reader went away is pointed at ``/dev/null`` so that no write, the
interpreter's own at exit included, fails on it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import select
from collections.abc import Iterator

from verirl._cli_output import STDOUT
from verirl._fs import stdout_kept_in

__all__ = ["abandoned_pipes_to_devnull", "reserve_standard_fds", "stdout_to_stderr"]


def reserve_standard_fds() -> None:
    """Open ``/dev/null`` on any of the descriptors 0, 1, 2 that is closed.

    Otherwise the next file or socket opened would get that number, and a
    child (the vLLM server, ``launch``'s command) would take it for its
    stdin, stdout or stderr.
    """
    for fd in (0, 1, 2):
        _reserve(fd)


def _reserve(fd: int) -> None:
    try:
        os.fstat(fd)
    except OSError:
        with contextlib.suppress(OSError):
            opened = os.open(os.devnull, os.O_RDWR)  # the lowest free number: ``fd`` (0-2 in turn)
            if opened != fd:
                os.dup2(opened, fd)
                os.close(opened)
            os.set_inheritable(fd, True)  # noqa: FBT003 - a child started here must find it open too


def _writable(fd: int) -> bool:
    """Whether ``fd`` is open for writing and, if a pipe or socket, someone still reads it.

    A write of nothing fails where every write would (``/dev/full``: ENOSPC).
    """
    try:
        mode = fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE
    except OSError:
        return False
    if mode not in (os.O_WRONLY, os.O_RDWR) or _reader_gone(fd):
        return False
    if os.isatty(fd):  # a write, even of nothing, stops a background job under ``stty tostop``
        return True
    try:
        os.write(fd, b"")
    except BlockingIOError:  # a reader behind: it is there
        return True
    except OSError:
        return False
    return True


def _reader_gone(fd: int) -> bool:
    """Whether ``fd`` is a pipe or socket whose reading end has gone (a write would be EPIPE)."""
    if not hasattr(select, "poll"):
        return False
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    try:
        events = poller.poll(0)
    except OSError:
        return False
    return any(event & (select.POLLERR | select.POLLHUP) for _, event in events)


@contextlib.contextmanager
def abandoned_pipes_to_devnull() -> Iterator[None]:
    """Inside the block, descriptors 1 and 2 that no write can reach write to null.

    ``launch``'s command inherits them: a pipe whose reader has gone (``verirl
    launch … | head -1`` after ``head`` ended, a supervisor that closed its
    end) would fail its first write (or kill it by SIGPIPE), as would a full
    device (``>/dev/full``) or a descriptor open for reading only; and a
    training run must not end because its output had nowhere to go (as under
    ``--json``: `stdout_to_stderr`). Restored after.
    """
    saved: list[tuple[int, int]] = []
    try:
        for fd in (1, 2):
            if _writable(fd):
                continue
            with contextlib.suppress(OSError):
                kept = os.dup(fd)
                devnull = os.open(os.devnull, os.O_WRONLY)
                try:
                    os.dup2(devnull, fd)
                finally:
                    os.close(devnull)
                saved.append((fd, kept))
        yield
    finally:
        for fd, kept in saved:
            with contextlib.suppress(OSError):
                os.dup2(kept, fd)
            os.close(kept)


@contextlib.contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """Send what goes to descriptor 1 (children included) to descriptor 2 inside the block.

    ``launch --json``: the training command's own output must not mix with the
    one JSON document on stdout. Nothing is changed when either descriptor is
    unusable. A descriptor 2 that cannot be written (``2</dev/null``, a pipe
    whose reader has gone) gets the command's output to ``/dev/null`` instead:
    the command must not fail on it (nor die of SIGPIPE).
    """
    STDOUT.flush()
    try:
        saved = os.dup(1)
    except OSError:
        yield
        return
    try:
        if _writable(2):
            os.dup2(2, 1)
        else:
            devnull = os.open(os.devnull, os.O_WRONLY)
            try:
                os.dup2(devnull, 1)
            finally:
                os.close(devnull)
    except OSError:
        os.close(saved)
        yield
        return
    try:
        with stdout_kept_in(saved):  # a server log there is still this program's stdout
            yield
    finally:
        STDOUT.flush()
        with contextlib.suppress(OSError):
            os.dup2(saved, 1)
        os.close(saved)

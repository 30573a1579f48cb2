"""Readiness of a server we spawned: poll its health URL until *our* process answers 200.

A 200 alone proves little: another server may hold the port while ours is
still loading. So each attempt also asks whether the answering socket
belongs to our process tree, and the wait ends early, with a reason, when
waiting is pointless: the server exited, `stop` was called from another
thread (the nap between attempts wakes at once), or this system will not
tell whose the socket is.

Between attempts the wait also watches the server's log for the line that
says its HTTP server is up (uvicorn's "Application startup complete." and
"Uvicorn running on"): on that line it probes at once and then every few
milliseconds for a moment, instead of sleeping out a backoff of up to a
second. The line only hastens the next probe: ready still means a 200 from
our own process.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import attrs
import requests

from verirl._http import deadline_session, request_health
from verirl._poll import Backoff, PollResult, poll
from verirl.server.log_tail import KeptLog, read_regular
from verirl.server.process import ProcessTree

__all__ = [
    "BACKOFF",
    "FAST_BACKOFF",
    "LOG_WATCH_INTERVAL",
    "READY_LOG_LINES",
    "REQUEST_TIMEOUT_CAP",
    "LogWatch",
    "Nap",
    "ReadinessProbe",
    "ServerExitedError",
    "StartCancelledError",
    "UnprovableError",
    "health_check",
    "wait_for_health",
]

# Its records are the server's.
log = logging.getLogger("verirl.vllm_server")

REQUEST_TIMEOUT_CAP = 5.0
"""The longest one health request of the readiness wait may take."""

BACKOFF = Backoff(initial=0.02, factor=2.0, cap=0.25)
"""Between attempts: tens of milliseconds at first, a quarter of a second later.

Our own server, not yet listening, costs nothing to ask; the cap matters only
when its log says nothing (a quiet ``--uvicorn-log-level``)."""


READY_LOG_LINES = (b"Application startup complete", b"Uvicorn running on")
"""Log lines after which the HTTP server answers (or is about to): probe at once."""

LOG_WATCH_INTERVAL = 0.01
"""How often the nap between attempts looks at the log's size."""

FAST_BACKOFF = Backoff(initial=0.005, factor=2.0, cap=0.1)
"""Between attempts once a ready line was logged: the socket may lag the line a little."""

_LOG_READ_LIMIT = 1024 * 1024


@attrs.define(eq=False)
class LogWatch:
    """Reads a growing log from ``offset`` on, telling when one of ``lines`` appears.

    Only the bytes written since the last look are read (at most 1 MiB a
    look); a line split across two looks is still found. A log that cannot be
    read, or is not a regular file (a FIFO: never opened), is simply never seen to fire.
    """

    path: Path | KeptLog
    offset: int = 0
    lines: tuple[bytes, ...] = READY_LOG_LINES
    _carry: bytes = b""

    def fired(self) -> bool:
        """Whether one of ``lines`` was written since the last call."""
        read = read_regular(self.path, self.offset, _LOG_READ_LIMIT)  # never blocks on a FIFO
        if read is None:
            return False
        data = read[1]
        self.offset += len(data)
        text = self._carry + data
        if any(line in text for line in self.lines):
            self._carry = b""
            return True
        keep = max(len(line) for line in self.lines) - 1  # a line cut by this look's end
        self._carry = text[-keep:] if keep else b""
        return False


@attrs.define(eq=False)
class Nap:
    """The sleep between readiness attempts: cut short by `stop`, or by a ready log line.

    Until a ready line is logged it sleeps the backoff's interval, looking at
    the log every `LOG_WATCH_INTERVAL`; when the line appears it returns at
    once, and from then on sleeps at most `FAST_BACKOFF`'s intervals.
    """

    stopping: threading.Event
    watch: LogWatch | None
    fast: Iterator[float] | None = None

    def __call__(self, seconds: float) -> None:
        """Sleep ``seconds``, less once the log says ready; wake at once on `stop`."""
        if self.fast is not None:
            self.stopping.wait(min(seconds, next(self.fast)))
            return
        deadline = time.monotonic() + seconds
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            if self.watch is None:
                self.stopping.wait(left)
                return
            if self.stopping.wait(min(left, LOG_WATCH_INTERVAL)):
                return
            if self.watch.fired():
                log.debug("the vLLM server logged that it is up; probing at once")
                self.fast = FAST_BACKOFF.intervals()
                return


class ServerExitedError(Exception):
    """Raised inside the readiness poll when the server process is gone."""


class UnprovableError(Exception):
    """Raised inside the readiness poll when the owner of the answering socket cannot be told."""


class StartCancelledError(Exception):
    """Raised inside the readiness poll when `VLLMServer.stop` was called meanwhile."""


@attrs.define(eq=False)
class ReadinessProbe:
    """One readiness attempt: ``None`` once *our* server answers 200, else why not.

    Raises when waiting is pointless: the start was cancelled, the server
    exited, or the owner of the answering socket cannot be told.
    """

    tree: ProcessTree
    session: requests.Session
    url: str
    port: int
    foreign_seen: bool = False

    def __call__(self, time_left: float) -> str | None:
        """One attempt within ``time_left`` seconds: ``None`` when ours answers, else why not."""
        if self.tree.stopping.is_set():
            raise StartCancelledError
        if self.tree.exited():
            raise ServerExitedError
        reason = health_check(self.session, self.url, time_left)
        if reason is not None:
            return reason
        # A 200 proves nothing yet: another server may hold the port while ours loads.
        ours = self.tree.listens_on(self.port)
        if ours is None:
            raise UnprovableError
        if ours:
            return None
        if not self.foreign_seen:
            self.foreign_seen = True
            log.warning(
                "port %d answered by another process, not by the vLLM server pid %d "
                "(is another server using the port?); waiting for ours",
                self.port,
                self.tree.pid,
            )
        return f"port {self.port} answered by another process"


def health_check(session: requests.Session, url: str, time_left: float) -> str | None:
    """One ``GET`` of the health URL within the time left (at most 5 s): ``None`` on 200."""
    return request_health(session, url, max(min(time_left, REQUEST_TIMEOUT_CAP), 0.01))


def wait_for_health(
    tree: ProcessTree,
    url: str,
    port: int,
    *,
    timeout: float,
    progress: Callable[[float, str | None], None],
    progress_every: float,
    log_path: Path | KeptLog | None = None,
    log_offset: int = 0,
) -> PollResult:
    """Poll ``url`` until ``tree``'s server answers 200 on ``port``, or ``timeout`` is spent.

    ``log_path`` (read from ``log_offset`` on) is the server's log, watched
    between attempts for `READY_LOG_LINES` (see `Nap`). Raises
    `StartCancelledError`, `ServerExitedError` or `UnprovableError` when
    waiting is pointless. The environment's proxy settings are ignored:
    a proxy must not see (or answer for) our own server.
    """
    with deadline_session() as session:
        session.trust_env = False
        probe = ReadinessProbe(tree, session, url, port)
        watch = None if log_path is None else LogWatch(log_path, log_offset)
        return poll(
            probe,
            timeout=timeout,
            backoff=BACKOFF,
            sleep=Nap(tree.stopping, watch),
            progress=progress,
            progress_every=progress_every,
        )

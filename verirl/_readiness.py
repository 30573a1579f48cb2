"""Readiness of a server we spawned: poll its health URL until *our* process answers 200.

A 200 alone proves little: another server may hold the port while ours is
still loading. So each attempt also asks whether the answering socket
belongs to our process tree, and the wait ends early, with a reason, when
waiting is pointless: the server exited, `stop` was called from another
thread (the nap between attempts wakes at once), or this system will not
tell whose the socket is.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

import attrs
import requests

from verirl._http import deadline_session, request_health
from verirl._poll import Backoff, PollResult, poll
from verirl._process import ProcessTree

__all__ = [
    "BACKOFF",
    "REQUEST_TIMEOUT_CAP",
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

BACKOFF = Backoff(initial=0.02, factor=2.0, cap=1.0)
"""Between attempts: tens of milliseconds at first, at most a second later."""


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
) -> PollResult:
    """Poll ``url`` until ``tree``'s server answers 200 on ``port``, or ``timeout`` is spent.

    Raises `StartCancelledError`, `ServerExitedError` or `UnprovableError`
    when waiting is pointless. The environment's proxy settings are ignored:
    a proxy must not see (or answer for) our own server.
    """
    with deadline_session() as session:
        session.trust_env = False
        probe = ReadinessProbe(tree, session, url, port)

        def nap(seconds: float) -> None:
            tree.stopping.wait(seconds)  # wakes at once when stop() is called

        return poll(
            probe,
            timeout=timeout,
            backoff=BACKOFF,
            sleep=nap,
            progress=progress,
            progress_every=progress_every,
        )

"""The vLLM server watchdog: a server that dies mid-training stops the training within seconds.

A GRPO trainer whose vLLM server died (an OOM, a driver fault) does not fail
fast: it blocks on generation requests and weight-transfer collectives until
a TCPStore or NCCL timeout, 5 to 30 billed minutes later. While the runtime
holds a server, a background thread watches it:

- **exit** of the server process verirl started (checked every 0.2 s, no I/O);
- **health**: ``GET /health`` about once a second (each request bounded);
  a server that has answered nothing healthy for ``unresponsive_timeout``
  seconds counts as dead. One failed request never trips it. Other ranks and
  remote topologies have only this check.

On death it logs an ERROR (exit status, last lines of the server log), then
asks a training loop that can stop cleanly to save and stop
(`verirl._stop.STOP_REQUESTS`, where `PreemptionCallback` listens) and
gives it ``save_grace`` seconds; without a listener, or once that is spent,
it interrupts the main thread with the error through the one SIGTERM policy
(`verirl._signals.SigtermPolicy.interrupt`). After `ServerWatchdog.stop` it
never acts.
"""

from __future__ import annotations

import contextlib
import logging
import signal
import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING

import attrs

from verirl import _defaults as defaults
from verirl._secrets import redact_url
from verirl._signals import SIGTERM_POLICY
from verirl._stop import STOP_REQUESTS
from verirl.errors import VLLMServerError, VLLMServerExited, VLLMServerUnresponsive

if TYPE_CHECKING:
    import requests

    from verirl.server.handle import ServerHandle

__all__ = [
    "EXIT_POLL",
    "HEALTH_INTERVAL",
    "HEALTH_REQUEST_TIMEOUT",
    "SAVE_GRACE",
    "UNRESPONSIVE_TIMEOUT",
    "ServerWatchdog",
    "interrupt_main",
]

log = logging.getLogger(__name__)

UNRESPONSIVE_TIMEOUT = defaults.VLLM_UNRESPONSIVE_TIMEOUT
"""Default seconds without a healthy ``/health`` answer after which a live server counts as dead.

A busy vLLM server answers ``/health`` in milliseconds: the API server's event
loop serves it while the engine generates. What can hold it for seconds is a
full garbage collection of a large heap or a blocking weight update or
wake-up on the event loop; 60 s leaves those an order of magnitude of room,
and is still 5x shorter than TCPStore's and 30x shorter than NCCL's timeouts
that end a hung job otherwise. Model loading is before readiness: not watched.
"""

SAVE_GRACE = defaults.FAILURE_GRACE
"""Default seconds a listening training loop gets to save and stop before the main thread is
interrupted anyway (`verirl._defaults.FAILURE_GRACE`)."""

HEALTH_INTERVAL = 1.0
"""Seconds between two health requests: about one request a second to the user's server."""

HEALTH_REQUEST_TIMEOUT = 5.0
"""Most seconds one health request may take (clipped to what is left of the bound)."""

EXIT_POLL = 0.2
"""Seconds between two checks whether our own server process exited (a ``waitpid``, no I/O)."""

_MIN_REQUEST_TIMEOUT = 0.5


def interrupt_main(error: BaseException, *, held: bool) -> bool:
    """Unwind the main thread with ``error``; False (logged) when that cannot be done.

    Through the policy when its handler (or `PreemptionCallback`'s, which
    cooperates with it) is installed. A SIGTERM handler of the program's own
    is its preemption path: it gets a SIGTERM (main thread
    only), as on a preemption. ``held`` says whether the runtime holds the
    policy from the main thread; when it does not (started in another
    thread), or SIGTERM is ignored, the main thread is left alone.
    """
    if held and SIGTERM_POLICY.interrupt(error):
        return True
    handler = signal.getsignal(signal.SIGTERM)
    if held and callable(handler) and not SIGTERM_POLICY.fired:
        log.warning("the program handles SIGTERM itself: sending it one, as on a preemption")
        main = threading.main_thread().ident
        if main is not None:
            signal.pthread_kill(main, signal.SIGTERM)
            return True
    if SIGTERM_POLICY.fired:
        return False  # the main thread is already unwinding
    log.error(
        "cannot interrupt the training loop (%s); it fails on its next request to the server",
        "SIGTERM is ignored" if held else "the runtime was not started from the main thread",
    )
    return False


def _tail_of(server: ServerHandle | None) -> tuple[str, str | None]:
    """The server's log tail and log path (a remote one, ``None``, has neither)."""
    if server is None:
        return "", None
    path = server.log_path
    return server.log_tail(), (None if path is None else str(path))


@attrs.define
class _Health:
    """The health half of the watchdog: when the server last answered, and why not since."""

    shown: str
    target: str
    bound: float
    last_ok: float = attrs.field(factory=time.monotonic)
    last_error: str | None = None

    def check(self, session: requests.Session) -> bool:
        """One request (bounded by what is left of ``bound``); False once ``bound`` is spent."""
        from verirl._http import request_health  # noqa: PLC0415 - requests

        started = time.monotonic()
        left = self.last_ok + self.bound - started
        timeout = max(min(HEALTH_REQUEST_TIMEOUT, left), _MIN_REQUEST_TIMEOUT)
        reason = request_health(session, self.target, timeout)
        now = time.monotonic()
        if reason is None:
            if self.last_error is not None:
                log.info("vLLM server %s answers /health again", self.shown)
            self.last_ok, self.last_error = now, None
            return True
        if self.last_error is None:
            log.warning(
                "vLLM server %s did not answer /health (%s); it counts as dead if it answers "
                "nothing for %gs",
                self.shown,
                reason,
                self.bound,
            )
        self.last_error = reason
        return now - self.last_ok < self.bound


@attrs.define
class ServerWatchdog:
    """Watch one vLLM server from a daemon thread; on its death, stop the training loop.

    ``server`` is the server this process started (its ``running`` and
    ``returncode`` are polled), ``None`` for one started elsewhere.
    ``health_url`` is the base URL whose ``/health`` is checked, ``None``
    (or ``unresponsive_timeout=0``) for no health checks. ``interrupt`` is
    what unwinds the main thread (`interrupt_main` in the runtime).
    """

    server: ServerHandle | None
    health_url: str | None
    unresponsive_timeout: float = UNRESPONSIVE_TIMEOUT
    save_grace: float = SAVE_GRACE
    interrupt: Callable[[BaseException], bool] = attrs.field(
        default=lambda error: interrupt_main(error, held=True)
    )
    interval: float = HEALTH_INTERVAL
    _stopping: threading.Event = attrs.field(factory=threading.Event, init=False)
    _lock: threading.RLock = attrs.field(
        factory=threading.RLock, init=False
    )  # stop() from a handler
    _stopped: bool = attrs.field(default=False, init=False)
    _thread: threading.Thread | None = attrs.field(default=None, init=False)
    _failure: VLLMServerError | None = attrs.field(default=None, init=False)

    @property
    def failure(self) -> VLLMServerError | None:
        """The error of the death it saw, or ``None``."""
        return self._failure

    def start(self) -> None:
        """Start watching (once)."""
        if self._thread is not None:
            return
        self._thread = threading.Thread(target=self._run, name="verirl-vllm-watchdog", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        """Stop watching: from the moment this returns, the watchdog never acts. Quick."""
        with self._lock:
            self._stopped = True
        self._stopping.set()

    def join(self, timeout: float) -> None:
        """Wait (bounded) for the thread to end, e.g. once the server is gone."""
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            with contextlib.suppress(RuntimeError):  # a signal cut `start` short: it never ran
                thread.join(timeout)

    # ------------------------------------------------------------ the thread

    def _run(self) -> None:
        try:
            error = self._watch()
        except Exception:
            log.exception("the vLLM server watchdog failed; the server is no longer watched")
            return
        if error is not None:
            self._fire(error)

    def _exit_status(self) -> tuple[bool, int | None]:
        """Whether our server process exited, and its exit status when known."""
        server = self.server
        if server is None or server.running:
            return False, None
        return True, server.returncode

    def _exited_error(self, code: int | None) -> VLLMServerExited:
        tail, path = _tail_of(self.server)
        return VLLMServerExited(code, tail, path)

    def _watch(self) -> VLLMServerError | None:
        """Block until the server dies (its error) or `stop` is called (``None``)."""
        if self.health_url is None or self.unresponsive_timeout <= 0:
            while not self._stopping.wait(EXIT_POLL):
                exited, code = self._exit_status()
                if exited:
                    return self._exited_error(code)
            return None
        return self._watch_health(self.health_url, self.unresponsive_timeout)

    def _watch_health(self, url: str, bound: float) -> VLLMServerError | None:
        """`_watch` with a health request every `interval` seconds, the exit polled between."""
        from verirl._http import deadline_session  # noqa: PLC0415 - requests, only when watching

        health = _Health(redact_url(url), url.rstrip("/") + "/health", bound)
        next_check = time.monotonic() + self.interval
        with deadline_session() as session:
            while not self._stopping.wait(max(min(EXIT_POLL, next_check - time.monotonic()), 0)):
                exited, code = self._exit_status()
                if exited:
                    return self._exited_error(code)
                started = time.monotonic()
                if started < next_check:
                    continue
                next_check = started + self.interval
                if health.check(session) or self._stopping.is_set():
                    continue
                exited, code = self._exit_status()
                if exited:  # it exited meanwhile: that is the truer story
                    return self._exited_error(code)
                tail, path = _tail_of(self.server)
                return VLLMServerUnresponsive(
                    health.shown,
                    time.monotonic() - health.last_ok,
                    health.last_error,
                    log_tail=tail,
                    log_path=path,
                )
        return None

    def _is_stopped(self) -> bool:
        with self._lock:
            return self._stopped

    def _fire(self, error: VLLMServerError) -> None:
        """Report the death, ask a listening loop to save and stop, then interrupt."""
        with self._lock:
            if self._stopped:
                return
            self._failure = error  # under the lock: stop() then sees it, or it is not set
        pid = None if self.server is None else self.server.pid
        where = "" if pid is None else f" (pid {pid})"
        log.error("the vLLM server%s failed while training ran: %s", where, error)
        if STOP_REQUESTS.request(error):
            log.warning(
                "asked the training loop to save a checkpoint and stop; interrupting it "
                "in %gs if it has not stopped by then",
                self.save_grace,
            )
            if self._stopping.wait(self.save_grace):
                return
            log.error("the training loop did not stop within %gs: interrupting it", self.save_grace)
        with self._lock:  # stop() waits for an interrupt under way, and none starts after it
            if not self._stopped:
                self.interrupt(error)

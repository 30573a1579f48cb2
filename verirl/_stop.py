"""Stop requests: how verirl asks a training loop that can stop cleanly to stop.

Two things end a run early: a preemption (SIGTERM) and the vLLM server dying
under it. A training loop that can stop at a step boundary and save first
(`verirl.preemption.PreemptionCallback`) *listens* here; verirl's own
watchdogs *request* a stop here. Without a listener a request returns False
and the requester falls back to interrupting the main thread.

The error a request carries (e.g. `verirl.VLLMServerExited`) is what the
listener raises once training has stopped and its checkpoint is written, so
the program ends with the right cause (and the CLI with the right exit code).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Callable

__all__ = ["STOP_REQUESTS", "StopListener", "StopRequests"]

log = logging.getLogger("verirl.signals")

StopListener = Callable[[BaseException], None]
"""Called (from any thread, possibly several times) with the error to raise after the stop."""


class StopRequests:
    """The process-wide registry of stop listeners; thread-safe and signal-safe.

    A signal handler may take the lock while the main thread holds it
    (`PreemptionCallback`'s handler removes its listener): re-entrant, and each
    locked section leaves no half-done state for a handler to trip on.
    """

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._listeners: list[StopListener] = []
        self._first: BaseException | None = None

    def listen(self, listener: StopListener) -> Callable[[], None]:
        """Add ``listener``; return the function that removes it again (idempotent)."""
        with self._lock:
            self._listeners.append(listener)

        def remove() -> None:
            # One list call, not check-then-remove: a handler run in between removes it first.
            with self._lock, contextlib.suppress(ValueError):
                self._listeners.remove(listener)

        return remove

    @property
    def listening(self) -> bool:
        """Whether some training loop would act on a request now."""
        with self._lock:
            return bool(self._listeners)

    @property
    def requested(self) -> BaseException | None:
        """The error of the first request made while someone listened, or ``None``."""
        return self._first

    def request(self, error: BaseException) -> bool:
        """Ask every listener to stop, then raise ``error``; False when nobody listens."""
        with self._lock:
            listeners = list(self._listeners)
            if listeners and self._first is None:
                self._first = error
        for listener in listeners:
            try:
                listener(error)
            except Exception:  # noqa: PERF203 - one listener must not silence the others
                log.exception("a stop listener failed")
        return bool(listeners)

    def reset(self) -> None:
        """Forget the first request (a new run in the same process starts clean)."""
        with self._lock:
            self._first = None

    def reset_after_fork(self) -> None:
        """A forked child runs none of its parent's training loops: nobody listens there."""
        self._lock = threading.RLock()
        self._listeners = []
        self._first = None


STOP_REQUESTS = StopRequests()
"""The registry `PreemptionCallback` listens on and verirl's watchdogs request through."""

if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=STOP_REQUESTS.reset_after_fork)

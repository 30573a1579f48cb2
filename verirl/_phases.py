"""Start-up phases run at once: each in a daemon thread, timed, the first failure raised.

`verirl.TrainingRuntime.start` submits its phases (server start, waits,
checkpoint) here and waits for all of them or the first exception, the
`concurrent.futures` way. The threads are daemons: a wait abandoned after a
failure or Ctrl-C must not keep the interpreter alive until its timeout.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED
from typing import Any, ParamSpec, TypeVar

import attrs

from verirl._signals import raise_if_dropped

__all__ = ["SIGNAL_CHECK", "DaemonExecutor", "PhaseTiming", "Phases"]

log = logging.getLogger("verirl.runtime")

SIGNAL_CHECK = 0.2
"""Seconds `Phases.wait` blocks at most before the interpreter may run a due signal handler.

Python runs a handler (SIGTERM's ``SystemExit``, SIGINT's ``KeyboardInterrupt``)
in the main thread, between two bytecodes. A lock wait without a timeout ends
early only if the signal interrupts that very wait. When the kernel hands the
signal to another thread (a download's worker), or it lands just before the
main thread blocks (a loaded machine preempts it there), the handler is only
marked as due, and would run when the last phase ends: for a download the Hub
holds, a minute or more after the signal. Each wake-up also raises the exit
of a SIGTERM that Python dropped or swallowed (`verirl._signals.raise_if_dropped`).
"""

_T = TypeVar("_T")
_P = ParamSpec("_P")


@attrs.frozen
class PhaseTiming:
    """When a start-up phase ran, in seconds since the runtime started."""

    name: str
    start: float
    end: float

    @property
    def duration(self) -> float:
        """Seconds the phase took."""
        return self.end - self.start


class DaemonExecutor(concurrent.futures.Executor):
    """Runs each call in its own daemon thread.

    `concurrent.futures.ThreadPoolExecutor` joins its workers at interpreter
    exit, so an env-server wait left running after Ctrl-C would hold the
    process for up to its timeout; a phase abandoned on failure must not.
    """

    def submit(
        self, fn: Callable[_P, _T], /, *args: _P.args, **kwargs: _P.kwargs
    ) -> concurrent.futures.Future[_T]:
        future: concurrent.futures.Future[_T] = concurrent.futures.Future()
        self.run(future, fn, *args, **kwargs)
        return future

    def run(
        self,
        future: concurrent.futures.Future[_T],
        fn: Callable[_P, _T],
        /,
        *args: _P.args,
        **kwargs: _P.kwargs,
    ) -> None:
        """Run ``fn`` in a daemon thread of its own, its outcome to ``future``.

        The caller makes ``future``, so that it can record it before the thread starts.
        """

        def run() -> None:
            if not future.set_running_or_notify_cancel():
                return
            try:
                result = fn(*args, **kwargs)
            except BaseException as exc:  # noqa: BLE001 - handed to whoever waits on the future
                future.set_exception(exc)
            else:
                future.set_result(result)

        name = f"verirl-{getattr(fn, '__name__', 'phase')}"
        threading.Thread(target=run, name=name, daemon=True).start()


@attrs.define
class Phases:
    """Start-up phases running at once, each timed from ``origin``."""

    origin: float
    _executor: DaemonExecutor = attrs.field(factory=DaemonExecutor, init=False)
    _windows: dict[concurrent.futures.Future[Any], tuple[str, list[float]]] = attrs.field(
        factory=dict, init=False
    )
    _cancelled: concurrent.futures.Future[None] = attrs.field(
        factory=concurrent.futures.Future, init=False
    )

    def cancel(self, error: BaseException) -> None:
        """End `wait` at once with ``error`` (from any thread); the phases run on, abandoned."""
        with contextlib.suppress(concurrent.futures.InvalidStateError):  # cancelled twice at once
            self._cancelled.set_exception(error)

    def submit(
        self, name: str, job: Callable[_P, _T], /, *args: _P.args, **kwargs: _P.kwargs
    ) -> concurrent.futures.Future[_T]:
        window: list[float] = []

        def timed() -> _T:
            window.append(time.monotonic() - self.origin)
            try:
                return job(*args, **kwargs)
            finally:
                window.append(time.monotonic() - self.origin)

        timed.__name__ = name
        future: concurrent.futures.Future[_T] = concurrent.futures.Future()
        self._windows[future] = (name, window)  # before its thread starts: `started` finds it
        self._executor.run(future, timed)
        return future

    def started(self, name: str) -> concurrent.futures.Future[Any] | None:
        """The future of the phase ``name``, once submitted; else ``None``.

        A caller interrupted before it kept the one `submit` returned finds it here.
        """
        return next((f for f, (named, _) in self._windows.items() if named == name), None)

    def wait(self) -> list[PhaseTiming]:
        """Every phase's timing once all are done; the first failure's error as soon as it fails."""
        pending: set[concurrent.futures.Future[Any]] = {*self._windows, self._cancelled}
        done: set[concurrent.futures.Future[Any]] = set()
        # Woken by each phase that ends (or by `cancel`), until all are done or one failed;
        # and every `SIGNAL_CHECK` seconds, so that a signal's handler runs (see there).
        while pending - {self._cancelled} and not any(f.exception() for f in done):
            newly, pending = concurrent.futures.wait(
                pending, timeout=SIGNAL_CHECK, return_when=FIRST_COMPLETED
            )
            done |= newly
            raise_if_dropped()  # a SIGTERM whose SystemExit Python dropped or swallowed
            if self._cancelled in newly:
                raise self._cancelled.exception()  # type: ignore[misc]
        failed = [future for future in done if future.exception() is not None]
        if failed:
            first = min(failed, key=lambda future: self._windows[future][1][-1])
            name, window = self._windows[first]
            error = first.exception()
            # Not an error line: the caller gets the error itself and reports it once.
            log.info(
                "start-up phase %r failed at %.2fs (%s)", name, window[-1], type(error).__name__
            )
            raise error  # type: ignore[misc]
        timings = [PhaseTiming(name, *window) for name, window in self._windows.values()]
        for timing in timings:
            log.info("start-up phase %r done in %.2fs", timing.name, timing.duration)
        return timings

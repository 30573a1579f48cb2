"""Deadline-bounded polling with capped exponential backoff.

Shared by the env-server probe and the vLLM server's readiness wait, so both
notice a service within tens of milliseconds early on, never sleep past their
deadline, and report progress the same way.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator

import attrs

from verirl._signals import raise_if_dropped
from verirl._validate import check_number
from verirl.errors import ConfigError

Clock = Callable[[], float]
Sleep = Callable[[float], None]


MAX_INTERVAL = 86_400.0
"""Longest poll interval (``initial``, ``cap``) accepted: one day."""

MAX_FACTOR = 1000.0
"""Largest growth ``factor`` accepted."""


def _interval(_inst: object, attribute: attrs.Attribute[float], value: object) -> None:
    check_number(attribute.name, value, positive=True, at_most=MAX_INTERVAL)


def _factor(_inst: object, attribute: attrs.Attribute[float], value: object) -> None:
    if check_number(attribute.name, value, at_most=MAX_FACTOR) < 1:
        raise ConfigError.invalid(attribute.name, value, "must be >= 1")


def _cap(inst: Backoff, attribute: attrs.Attribute[float], value: object) -> None:
    _interval(inst, attribute, value)
    if inst.cap < inst.initial:
        raise ConfigError.invalid("cap", value, f"must be >= initial ({inst.initial})")


@attrs.frozen
class Backoff:
    """Poll intervals: ``initial``, then times ``factor`` each turn, at most ``cap`` seconds.

    Each is a finite number (`ConfigError` naming it otherwise): ``initial``
    and ``cap`` in ``(0, MAX_INTERVAL]``, ``factor`` in ``[1, MAX_FACTOR]``.
    """

    initial: float = attrs.field(default=0.02, validator=_interval)
    factor: float = attrs.field(default=2.0, validator=_factor)
    cap: float = attrs.field(default=1.0, validator=_cap)

    def intervals(self) -> Iterator[float]:
        """Yield the sleep before each next attempt, forever."""
        interval = self.initial
        while True:
            yield interval
            interval = min(interval * self.factor, self.cap)


@attrs.frozen
class PollResult:
    """How a poll ended: ``ready``, after ``elapsed`` seconds and ``attempts`` tries."""

    ready: bool
    elapsed: float
    attempts: int
    last_error: str | None


def poll(
    attempt: Callable[[float], str | None],
    *,
    timeout: float,
    backoff: Backoff,
    clock: Clock = time.monotonic,
    sleep: Sleep = time.sleep,
    progress: Callable[[float, str | None], None] | None = None,
    progress_every: float = 10.0,
) -> PollResult:
    """Call ``attempt(time_left)`` until it returns ``None`` (ready) or time runs out.

    ``attempt`` returns a short failure reason otherwise; it may raise to abort
    the poll (the exception propagates). It is always tried at least once, and
    is told how much time is left so it can clip its own request timeout. The
    backoff's intervals run from when one attempt was due to when the next is
    (an attempt slower than its interval is followed at once, and the schedule
    starts again from there). Sleeps
    are clipped to the deadline, so the call ends within ``timeout`` plus the
    duration of the last attempt. ``progress(elapsed, last_error)`` is called at
    most every ``progress_every`` seconds while waiting. In the main thread, a
    SIGTERM whose ``SystemExit`` never arrived is raised before each attempt
    (`verirl._signals.raise_if_dropped`).
    """
    start = clock()
    deadline = start + timeout
    next_progress = start + progress_every
    attempts = 0
    last_error: str | None = None
    slot = start  # when this attempt is due: the schedule does not drift with late wake-ups
    for interval in backoff.intervals():
        raise_if_dropped()  # in the main thread: a SIGTERM whose SystemExit was lost
        attempts += 1
        last_error = attempt(max(deadline - clock(), 0.0))
        now = clock()
        if last_error is None:
            return PollResult(ready=True, elapsed=now - start, attempts=attempts, last_error=None)
        if now >= deadline:
            break
        if progress is not None and now >= next_progress:
            progress(now - start, last_error)
            next_progress = now + progress_every
        # Intervals run from one attempt's due time to the next, so neither slow answers
        # nor late wake-ups stretch the schedule or raise the rate above 1/interval.
        slot = max(slot + interval, now)
        nap = min(slot, deadline) - now
        if nap > 0:
            sleep(nap)
    return PollResult(
        ready=False, elapsed=clock() - start, attempts=attempts, last_error=last_error
    )

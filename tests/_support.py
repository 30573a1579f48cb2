"""Helpers shared by several test modules (pytest puts tests/ on sys.path)."""

from __future__ import annotations

import psutil


class FakeClock:
    """Virtual time: sleeping advances the clock, nothing really waits."""

    def __init__(self) -> None:
        self.now = 100.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        assert seconds >= 0
        self.sleeps.append(seconds)
        self.now += seconds


def alive(process: psutil.Process) -> bool:
    """Running and not a zombie (PID 1 in a container may never reap an orphan's zombie)."""
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False

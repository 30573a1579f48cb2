"""An in-memory `verirl.CheckpointSource`, for resolver and runtime tests without disk or network.

::

    local = FakeCheckpointSource(steps=[10, 20], description="fake:local")
    hub = FakeCheckpointSource(error=CheckpointSourceError("hub down"))
    assert CheckpointResolver([local, hub]).resolve("latest") == "/fake/checkpoint-20"
    assert local.fetched[0].step == 20
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from pathlib import Path

import attrs

from verirl.checkpoints import Checkpoint

__all__ = ["FakeCheckpointSource"]


def _steps(steps: Iterable[int]) -> tuple[int, ...]:
    return tuple(steps)


@attrs.define
class FakeCheckpointSource:
    """Holds complete checkpoints at ``steps``; `latest` returns the highest.

    Paths are ``<root>/checkpoint-<step>`` and nothing is created on disk:
    `fetch` returns the path without checking it. ``error`` is raised by
    `latest` (model an unreachable source), ``fetch_error`` by `fetch`;
    ``fetch_delay`` seconds model a download's duration. Calls are recorded
    in ``latest_calls`` and ``fetched``.
    """

    steps: tuple[int, ...] = attrs.field(default=(), converter=_steps)
    description: str = "fake"
    root: str = "/fake"
    error: Exception | None = None
    fetch_error: Exception | None = None
    fetch_delay: float = 0.0
    latest_calls: int = attrs.field(default=0, init=False)
    fetched: list[Checkpoint] = attrs.field(factory=list, init=False)

    def checkpoint(self, step: int) -> Checkpoint:
        """The `Checkpoint` this source reports for ``step``."""
        return Checkpoint(step, f"{self.root.rstrip('/')}/checkpoint-{step}", self.description)

    def latest(self) -> Checkpoint | None:
        """The highest step as a `Checkpoint`, or None; raises ``error`` if set."""
        self.latest_calls += 1
        if self.error is not None:
            raise self.error
        return self.checkpoint(max(self.steps)) if self.steps else None

    def fetch(self, checkpoint: Checkpoint) -> Path:
        """Record ``checkpoint`` and return its path; raises ``fetch_error`` if set."""
        self.fetched.append(checkpoint)
        if self.fetch_delay:
            time.sleep(self.fetch_delay)
        if self.fetch_error is not None:
            raise self.fetch_error
        return Path(checkpoint.path)

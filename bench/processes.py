"""Process bookkeeping the bench's teardown figures share: who is alive, kill the rest."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence

import psutil


def alive(process: psutil.Process) -> bool:
    """Whether ``process`` (the same one, not a reused pid) still runs and is no zombie."""
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def kill_survivors(processes: Sequence[psutil.Process], *, timeout: float = 5.0) -> None:
    """SIGKILL whatever of ``processes`` is still alive; wait up to ``timeout`` for it to go."""
    left = [process for process in processes if alive(process)]
    for process in left:
        with contextlib.suppress(psutil.Error):
            process.kill()
    psutil.wait_procs(left, timeout=timeout)

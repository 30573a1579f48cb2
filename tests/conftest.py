"""Suite-wide guards: no test may leave a child process behind."""

from __future__ import annotations

import os
from collections.abc import Iterator

import psutil
import pytest

from verirl.vllm_server import MARKER_VAR

# tests/compat needs the real trl (and torch); only `nox -s compat` installs them.
collect_ignore = [] if os.environ.get("VERIRL_COMPAT") else ["compat"]


def _children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True)}


def _marked_servers() -> set[int]:
    """Processes started by a VLLMServer (they carry its marker variable), wherever they are.

    Orphaned workers are re-parented to init, so only this finds them.
    """
    found = set()
    for proc in psutil.process_iter():
        try:
            if MARKER_VAR in proc.environ():
                found.add(proc.pid)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


@pytest.fixture(autouse=True, scope="session")
def _no_leftover_children() -> Iterator[None]:
    """Fail the run if any process started by the suite outlives it."""
    before = _children() | _marked_servers()
    yield
    left = []
    for pid in (_children() | _marked_servers()) - before:
        try:
            proc = psutil.Process(pid)
            if proc.status() != psutil.STATUS_ZOMBIE:
                left.append(f"{pid}: {' '.join(proc.cmdline())}")
        except psutil.NoSuchProcess:
            continue
    assert not left, "processes left behind by the suite:\n" + "\n".join(left)

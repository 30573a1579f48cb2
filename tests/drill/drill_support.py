"""Running the drill's training script under `verirl launch` or torchrun, and reading its events."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(__file__).resolve().parent / "grpo_script.py"
BIN = Path(sys.executable).parent
RUN_LIMIT = 240.0  # seconds for one run of the script, start-up included


def clean_env(**extra: str) -> dict[str, str]:
    """This environment without VERIRL_* settings or a GPU mask, offline, one thread per rank."""
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith("VERIRL_") and name not in ("CUDA_VISIBLE_DEVICES", "HF_TOKEN")
    }
    env.update(HF_HUB_OFFLINE="1", TOKENIZERS_PARALLELISM="false", OMP_NUM_THREADS="1")
    env.update(extra)
    return env


def script_args(model: Path, out: Path, events: Path, *more: str) -> list[str]:
    """The training script's command line."""
    return [sys.executable, str(SCRIPT), "--model", str(model), "--output-dir", str(out),
            "--events", str(events), *more]  # fmt: skip


def launch_command(out: Path, *command: str) -> list[str]:
    """The one command an orchestrator runs, first attempt and every retry alike."""
    return [sys.executable, "-m", "verirl", "launch", "--gpus", "1", "--output-dir", str(out),
            "--resume", "auto", "--", *command]  # fmt: skip


def events(path: Path) -> list[dict[str, object]]:
    """The events written so far."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def wait_for_event(
    path: Path, process: subprocess.Popen[bytes], **match: object
) -> dict[str, object]:
    """The first event matching ``match``; fails if the process ends first or time runs out."""
    deadline = time.monotonic() + RUN_LIMIT
    tick = threading.Event()
    while time.monotonic() < deadline:
        for event in events(path):
            if all(event.get(key) == value for key, value in match.items()):
                return event
        if process.poll() is not None:
            msg = f"the run exited with {process.returncode} before the event {match}"
            raise AssertionError(msg)
        tick.wait(0.05)
    msg = f"no event {match} within {RUN_LIMIT}s"
    raise AssertionError(msg)


def finish(process: subprocess.Popen[bytes]) -> int:
    """Wait for ``process`` within the limit; kill its tree on the way out if it overstays."""
    try:
        return process.wait(timeout=RUN_LIMIT)
    finally:
        if process.poll() is None:
            kill_tree(process.pid)


def kill_tree(pid: int) -> None:
    """SIGKILL ``pid`` and everything under it."""
    try:
        parent = psutil.Process(pid)
        tree = [parent, *parent.children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    for proc in tree:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.send_signal(signal.SIGKILL)
    psutil.wait_procs(tree, timeout=10)


def newest_complete(out: Path) -> int | None:
    """The step of the newest complete checkpoint in ``out`` (verirl's own resolver decides)."""
    from verirl.checkpoints import LocalCheckpointSource

    found = LocalCheckpointSource(out).latest()
    return None if found is None else found.step

"""Running a shipped example in the test "container" (container.py) and reading its events."""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

import psutil

from _support import still_alive, unshared_port
from verirl.checkpoints import LocalCheckpointSource

if TYPE_CHECKING:
    from typing_extensions import Self

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
CONTAINER = Path(__file__).resolve().parent / "container.py"
RUN_LIMIT = 300.0  # seconds for one attempt, start-up included, on a loaded 2-core machine
FAKE_VLLM = f"{shlex.quote(sys.executable)} -m fakes.vllm_serve"

# GRPOConfig fields for a CPU run of the tiny model. vLLM generation is off: TRL refuses
# use_vllm=True without vllm installed; the vLLM server (the fake) still starts and stops.
CPU_GRPO_CONFIG = {
    "use_cpu": True,
    "bf16": False,
    "use_vllm": False,
    "per_device_train_batch_size": 2,
    "num_generations": 2,
    "max_completion_length": 4,
    "learning_rate": 1e-4,
    "logging_steps": 1,
    "report_to": "none",
    "seed": 0,
    "dataloader_num_workers": 0,
}


def example_env(tmp: Path, **extra: str) -> dict[str, str]:
    """This environment without VERIRL_* settings, tokens or a GPU mask; offline; 2 fake GPUs.

    The vLLM server is the fake program on a port of its own, its log in ``tmp``.
    """
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("VERIRL_", "MODAL_"))
        and name not in ("CUDA_VISIBLE_DEVICES", "HF_TOKEN", "HF_ENDPOINT")
    }
    env.update(
        HF_HUB_OFFLINE="1",
        HF_DATASETS_OFFLINE="1",
        HF_HOME=str(tmp / "hf-home"),
        HF_HUB_DISABLE_TELEMETRY="1",
        TOKENIZERS_PARALLELISM="false",
        OMP_NUM_THREADS="1",
        PYTHONUNBUFFERED="1",
        VERIRL_GPU_COUNT="2",
        VERIRL_VLLM_COMMAND=FAKE_VLLM,
        VERIRL_VLLM_PORT=str(unshared_port()),
        VERIRL_VLLM_LOG_DIR=str(tmp),
    )
    env.update(extra)
    return env


def container(events: Path, how: str, example: str, *rest: str, pause_at: int = -1) -> list[str]:
    """The command that runs ``examples/<example>`` in the container (see container.py)."""
    return [sys.executable, str(CONTAINER), "--events", str(events), "--pause-at", str(pause_at),
            how, str(EXAMPLES / example), *rest]  # fmt: skip


def events(path: Path) -> list[dict[str, object]]:
    """The events written so far."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def other_pid(path: Path, pid: int) -> int:
    """The pid of the attempt that wrote events in ``path`` and is not ``pid``."""
    return next(int(str(event["pid"])) for event in events(path) if event["pid"] != pid)


def only(path: Path, pid: int, **match: object) -> list[dict[str, object]]:
    """The events of process ``pid`` matching ``match``."""
    return [
        event for event in events(path)
        if event["pid"] == pid and all(event.get(k) == v for k, v in match.items())
    ]  # fmt: skip


class Attempt:
    """One attempt of an example, started at once; its tree is killed on leaving a ``with``.

    Its output goes to a file, not a pipe: nobody reads a pipe while the test
    waits for an event, and a full one would stall the example.
    """

    def __init__(self, command: list[str], env: dict[str, str], output: Path) -> None:
        self.output = output
        with output.open("wb") as sink:
            self.process = subprocess.Popen(command, env=env, stdout=sink, stderr=subprocess.STDOUT)
        self.pid = self.process.pid

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc_info: object) -> None:
        if self.process.poll() is None:
            kill_tree(self.pid)
        self.process.wait()

    @property
    def text(self) -> str:
        """Everything it printed so far."""
        return self.output.read_text(errors="replace")

    def wait_for(self, log: Path, **match: object) -> dict[str, object]:
        """The first event in ``log`` matching ``match``; fails if it ends first or times out."""
        deadline = time.monotonic() + RUN_LIMIT
        tick = threading.Event()
        while time.monotonic() < deadline:
            for event in events(log):
                if all(event.get(key) == value for key, value in match.items()):
                    return event
            if self.process.poll() is not None:
                msg = f"exited with {self.process.returncode} before the event {match}:\n"
                raise AssertionError(msg + tail(self.text))
            tick.wait(0.05)
        msg = f"no event {match} within {RUN_LIMIT}s:\n"
        raise AssertionError(msg + tail(self.text))

    def wait(self) -> int:
        """Its exit status, within the limit."""
        return self.process.wait(timeout=RUN_LIMIT)


def run(command: list[str], env: dict[str, str], output: Path) -> Attempt:
    """One attempt, to its end (its process tree killed if it overstays)."""
    with Attempt(command, env, output) as attempt:
        attempt.wait()
    return attempt


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


def vllm_servers(pid: int) -> list[psutil.Process]:
    """The fake vLLM server under process ``pid`` and everything under it (its workers)."""
    servers = [
        child for child in psutil.Process(pid).children(recursive=True)
        if "fakes.vllm_serve" in " ".join(child.cmdline())
    ]  # fmt: skip
    found = {
        proc.pid: proc for server in servers for proc in (server, *server.children(recursive=True))
    }
    return list(found.values())


def gone(processes: list[psutil.Process], timeout: float = 30.0) -> bool:
    """Whether every one of ``processes`` has exited (zombies count as gone) within ``timeout``."""
    return still_alive(processes, timeout=timeout) == []


def newest_complete(out: Path) -> int | None:
    """The step of the newest complete checkpoint in ``out`` (verirl's own resolver decides)."""
    found = LocalCheckpointSource(out).latest()
    return None if found is None else found.step


def tail(text: str, lines: int = 60) -> str:
    """The last lines of an attempt's output, for a failure message."""
    return "\n".join(text.splitlines()[-lines:])

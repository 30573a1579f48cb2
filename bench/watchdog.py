"""Figure 7: time from the vLLM server's death to the job's exit, verirl vs the old helper.

verirl: ``python -m verirl launch`` on the fake server program with a training
script that saves on SIGTERM and exits 143 (what `PreemptionCallback` does);
the server is SIGKILLed (as the OOM killer does) or frozen with SIGSTOP (alive,
answering nothing; ``--vllm-unresponsive-timeout`` 2 s) once the script runs,
and the clock runs until ``launch`` exits (4).

Baseline: the old helper started the server with ``Popen``, ran the training
command and waited for it; nothing watched the server, so the job ends only when
the training command ends on its own. A real trainer then blocks until a TCPStore
(300 s) or NCCL (1800 s) timeout; here the script blocks like it and the baseline
is reported as "never within" the observation window.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import textwrap
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import psutil

from processes import kill_survivors
from verirl import find_free_port

FAKE_SERVE = (sys.executable, "-m", "fakes.vllm_serve")
WINDOW = 10.0
"""Seconds the baseline is watched after the death (a real job hangs 300–1800 s)."""
UNRESPONSIVE_BOUND = 2.0
GOAL = 5.0  # the issue: exit within 5 s of the death (plus the trainer's save)
EXIT_VLLM = 4  # launch's exit code for a failed vLLM server

TRAIN = """
import os, signal, sys, threading
out = sys.argv[1]
def save_and_stop(signum, frame):
    open(os.path.join(out, "saved"), "w").close()
    sys.exit(143)
signal.signal(signal.SIGTERM, save_and_stop)
open(os.path.join(out, "pid"), "w").write(str(os.getpid()))
threading.Event().wait(600)  # a trainer blocked on a dead server: it never ends by itself
"""


def _wait_for(path: Path, proc: subprocess.Popen[bytes], timeout: float = 60.0) -> int:
    deadline = time.monotonic() + timeout
    while not (path.exists() and path.read_text()):
        if proc.poll() is not None:
            raise RuntimeError(f"exited with {proc.returncode} before training started")
        if time.monotonic() > deadline:
            raise TimeoutError("the training script never started")
        psutil.wait_procs([], timeout=0.02)
    return int(path.read_text())


def _tree(pid: int) -> list[psutil.Process]:
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return []


def verirl_trial(scratch: Path, *, freeze: bool) -> float:
    """Seconds from the server's death (SIGKILL, or SIGSTOP) to ``verirl launch``'s exit 4."""
    folder = Path(tempfile.mkdtemp(dir=scratch))
    script = folder / "train.py"
    script.write_text(textwrap.dedent(TRAIN))
    flags = ["--vllm-unresponsive-timeout", str(UNRESPONSIVE_BOUND)] if freeze else []
    argv = [sys.executable, "-m", "verirl", "-q", "launch", "--gpus", "2", "--model", "m",
            "--vllm-port", str(find_free_port()), "--vllm-command", " ".join(FAKE_SERVE),
            "--log-dir", str(folder), *flags,
            "--", sys.executable, str(script), str(folder)]  # fmt: skip
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    processes: list[psutil.Process] = []
    try:
        trainer = _wait_for(folder / "pid", proc)
        processes = _tree(proc.pid)
        (server,) = [c for c in psutil.Process(proc.pid).children() if c.pid != trainer]
        if freeze:
            server.suspend()
        else:
            server.kill()
        died = time.monotonic()
        code = proc.wait(timeout=60)
        took = time.monotonic() - died
        saved = (folder / "saved").exists()
        if code != EXIT_VLLM or not saved:
            raise RuntimeError(f"launch exited {code}, checkpoint saved: {saved}")
        return took
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        kill_survivors([p for p in processes if p.is_running()])


def baseline_trial(scratch: Path) -> float | None:
    """The old helper: seconds until its training command ends on its own; None: not in WINDOW."""
    folder = Path(tempfile.mkdtemp(dir=scratch))
    script = folder / "train.py"
    script.write_text(textwrap.dedent(TRAIN))
    port = find_free_port()
    log = (folder / "server.log").open("wb")
    server = subprocess.Popen(
        [*FAKE_SERVE, "--model", "m", "--port", str(port)],
        stdout=log, stderr=subprocess.STDOUT, start_new_session=True,
    )  # fmt: skip
    trainer = subprocess.Popen([sys.executable, str(script), str(folder)])
    processes: list[psutil.Process] = []
    try:
        _wait_for(folder / "pid", trainer)
        processes = _tree(server.pid) + _tree(trainer.pid)
        server.kill()
        died = time.monotonic()
        try:
            trainer.wait(timeout=WINDOW)
        except subprocess.TimeoutExpired:
            return None
        return time.monotonic() - died
    finally:
        for proc in (trainer, server):
            if proc.poll() is None:
                proc.kill()
            proc.wait()
        log.close()
        kill_survivors([p for p in processes if p.is_running()])


RowMaker = Callable[[str, str, str, str, str, str, bool | None], None]
"""figure, case, verirl, baseline, ratio, goal, met? (`run.Row`'s fields)."""
HANG = "real jobs: TCPStore 300 s / NCCL 1800 s timeouts, then the command's own code"


def bench_watchdog(add_row: RowMaker, runs: int, scratch: Path) -> None:
    """Add figure 7's rows: killed server and frozen server, verirl vs the old helper."""
    runs = min(runs, 3)  # each trial starts a server and a launcher: seconds each

    def median(values: Sequence[float]) -> float:
        ordered = sorted(values)
        return ordered[len(ordered) // 2]

    baseline = [baseline_trial(scratch) for _ in range(runs)]
    ended = [b for b in baseline if b is not None]
    old = f"never within {WINDOW:g} s" if not ended else f"{median(ended):.2f} s"
    for case, freeze, goal in (
        ("server SIGKILLed", False, GOAL),
        (
            f"server frozen (SIGSTOP), bound {UNRESPONSIVE_BOUND:g} s",
            True,
            UNRESPONSIVE_BOUND + GOAL,
        ),
    ):
        took = median([verirl_trial(scratch, freeze=freeze) for _ in range(runs)])
        add_row(
            "7 death to exit",
            case,
            f"{took:.2f} s, exit 4, checkpoint saved",
            f"{old} ({HANG})",
            "—" if not ended else f"{took / median(ended):.2f}",
            f"< {goal:g} s",
            took < goal,
        )

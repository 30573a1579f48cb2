"""``verirl launch`` when its vLLM server dies mid-training: SIGTERM to the command, exit 4, resume.

Real processes throughout: ``python -m verirl launch`` on the fake server
program (``python -m fakes.vllm_serve``), a training script that saves a
checkpoint on SIGTERM (what `PreemptionCallback` does) and exits 143, and the
server killed (SIGKILL, as the OOM killer does) or frozen (SIGSTOP: alive, but
answering nothing).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from _support import nothing_listens, unshared_port
from verirl.server.watchdog import EXIT_POLL

DEADLINE = 5.0
"""The issue's bound: launch exits within this many seconds of the death, plus the save."""

TRAIN = """
import json, os, signal, sys, threading, time
out = sys.argv[1]
resume = os.environ.get("VERIRL_RESUME_FROM_CHECKPOINT") or ""
if resume:
    state = json.load(open(os.path.join(resume, "trainer_state.json")))
    open(os.path.join(out, "resumed-from"), "w").write(f"{resume} {state['global_step']}")
    sys.exit(0)
step = 7
slow = os.environ.get("TRAIN_SAVES_SLOWLY") == "1"  # the save ends when the test sends SIGUSR1
if slow:
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR1})
def save_and_stop(signum, frame):
    # What PreemptionCallback does: a complete checkpoint (trainer_state.json last), then 128+N.
    open(os.path.join(out, "got-sigterm"), "w").write(repr(time.monotonic()))
    if slow:
        signal.sigwait({signal.SIGUSR1})
    folder = os.path.join(out, f"checkpoint-{step}")
    os.makedirs(folder)
    open(os.path.join(folder, "model.safetensors"), "wb").write(b"weights")
    json.dump({"global_step": step}, open(os.path.join(folder, "trainer_state.json"), "w"))
    sys.exit(128 + signum)
ignore = os.environ.get("TRAIN_IGNORES_SIGTERM") == "1"
signal.signal(signal.SIGTERM, signal.SIG_IGN if ignore else save_and_stop)
if slow:
    signal.signal(signal.SIGINT, save_and_stop)  # Modal's preemption
open(os.path.join(out, "pid"), "w").write(str(os.getpid()))
threading.Event().wait(120)
sys.exit(0)
"""


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in list(os.environ):
        if name.startswith("VERIRL_") or name in ("CUDA_VISIBLE_DEVICES", "HF_TOKEN"):
            monkeypatch.delenv(name)


class Job:
    """One ``verirl launch`` of the training script on the fake server, in a subprocess."""

    def __init__(self, tmp_path: Path, *flags: str, env: dict[str, str] | None = None) -> None:
        self.out = tmp_path / "out"
        self.out.mkdir(exist_ok=True)
        script = tmp_path / "train.py"
        script.write_text(textwrap.dedent(TRAIN))
        self.port = unshared_port()
        self.stderr_path = tmp_path / f"launch-{time.monotonic_ns()}.err"
        argv = [
            sys.executable, "-m", "verirl", "launch", "--gpus", "2", "--model", "m",
            "--vllm-port", str(self.port),
            "--vllm-command", f"{sys.executable} -m fakes.vllm_serve", "--log-dir", str(tmp_path),
            "--output-dir", str(self.out), *flags,
            "--", sys.executable, str(script), str(self.out),
        ]  # fmt: skip
        with self.stderr_path.open("w") as sink:  # a file: an orphan holding a pipe cannot hang us
            self.proc = subprocess.Popen(
                argv,
                stdout=subprocess.DEVNULL,
                stderr=sink,
                env={**os.environ, **(env or {})},
            )

    @property
    def stderr(self) -> str:
        return self.stderr_path.read_text()

    def wait_for_training(self, timeout: float = 60) -> tuple[psutil.Process, psutil.Process]:
        """The server and trainer processes, once the trainer runs."""
        pid_file = self.out / "pid"
        deadline = time.monotonic() + timeout
        while not (pid_file.exists() and pid_file.read_text()):
            assert self.proc.poll() is None, self.stderr
            assert time.monotonic() < deadline, "the training command never started"
            psutil.wait_procs([], timeout=0.02)
        trainer = psutil.Process(int(pid_file.read_text()))
        (server,) = [c for c in psutil.Process(self.proc.pid).children() if c.pid != trainer.pid]
        return server, trainer

    def everything(self) -> list[psutil.Process]:
        try:
            launcher = psutil.Process(self.proc.pid)
            return [launcher, *launcher.children(recursive=True)]
        except psutil.NoSuchProcess:
            return []

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


@pytest.fixture
def jobs(clean_env: None) -> Iterator[list[Job]]:
    started: list[Job] = []
    yield started
    for job in started:
        job.close()


def test_a_killed_server_ends_the_job_with_4_after_a_checkpoint_and_the_retry_resumes(
    tmp_path: Path, jobs: list[Job]
) -> None:
    job = Job(tmp_path)
    jobs.append(job)
    server, trainer = job.wait_for_training()
    processes = job.everything()
    killed_at = time.monotonic()  # before the kill: the watchdog may act before we read a clock
    server.kill()  # as the OOM killer does
    code = job.proc.wait(timeout=60)
    took = time.monotonic() - killed_at
    stderr = job.stderr
    assert code == 4, stderr
    assert took < DEADLINE, (took, stderr)
    # The command got SIGTERM (and wrote a complete checkpoint) before launch exited.
    assert float((job.out / "got-sigterm").read_text()) > killed_at
    assert json.loads((job.out / "checkpoint-7" / "trainer_state.json").read_text()) == {
        "global_step": 7
    }
    assert "exited with code -9" in stderr
    assert "ERROR" in stderr
    assert "Uvicorn running" in stderr  # the last lines of the server's log
    assert "the training command exited with 143 after the vLLM server failed" in stderr
    _, alive = psutil.wait_procs(processes, timeout=10)
    assert not alive, alive
    assert not trainer.is_running()
    assert nothing_listens(job.port)

    # The orchestrator's retry resumes from that checkpoint (`--resume auto` after issue 15).
    retry = Job(tmp_path, "--resume", "latest")
    jobs.append(retry)
    assert retry.proc.wait(timeout=60) == 0, retry.stderr
    resumed = (job.out / "resumed-from").read_text()
    assert resumed == f"{job.out / 'checkpoint-7'} 7"


def test_a_server_that_stops_answering_counts_as_dead_after_the_bound(
    tmp_path: Path, jobs: list[Job]
) -> None:
    bound = 2.0
    job = Job(tmp_path, "--vllm-unresponsive-timeout", str(bound))
    jobs.append(job)
    server, _ = job.wait_for_training()
    processes = job.everything()
    frozen_at = time.monotonic()  # before the freeze, so `took` never under-reads the wait
    server.suspend()  # SIGSTOP: alive, port open, answering nothing
    code = job.proc.wait(timeout=60)
    took = time.monotonic() - frozen_at
    stderr = job.stderr
    assert code == 4, stderr
    # The bound runs from the last healthy answer, which came up to one health interval before
    # the freeze, or earlier if launch was not scheduled then (a loaded machine): no lower bound
    # on the test's clock. The watchdog's own clock says it waited the bound out.
    assert took < bound + DEADLINE, (took, stderr)
    waited = re.search(r"did not answer /health for ([0-9.]+)s", stderr)
    assert waited is not None, stderr
    assert float(waited[1]) >= bound, stderr
    assert (job.out / "checkpoint-7" / "trainer_state.json").exists()
    _, alive = psutil.wait_procs(processes, timeout=10)  # the frozen server too (SIGCONT)
    assert not alive, alive
    assert nothing_listens(job.port)


def test_a_command_that_ignores_sigterm_is_killed_after_the_grace_and_launch_still_exits_4(
    tmp_path: Path, jobs: list[Job]
) -> None:
    job = Job(tmp_path, "--shutdown-timeout", "1", env={"TRAIN_IGNORES_SIGTERM": "1"})
    jobs.append(job)
    server, trainer = job.wait_for_training()
    processes = job.everything()
    killed_at = time.monotonic()  # before the kill: the watchdog may act before we read a clock
    server.kill()
    code = job.proc.wait(timeout=60)
    took = time.monotonic() - killed_at
    stderr = job.stderr
    assert code == 4, stderr
    assert took < DEADLINE + 1, (took, stderr)
    assert "outlived its 1s grace: sending SIGKILL" in stderr
    assert "exited with 137 after the vLLM server failed" in stderr
    _, alive = psutil.wait_procs(processes, timeout=10)
    assert not alive, alive
    assert not trainer.is_running()


def test_sigterm_to_launch_as_the_server_dies_still_stops_everything_once(
    tmp_path: Path, jobs: list[Job]
) -> None:
    job = Job(tmp_path)
    jobs.append(job)
    server, _ = job.wait_for_training()
    processes = job.everything()
    server.kill()
    job.proc.send_signal(signal.SIGTERM)
    code = job.proc.wait(timeout=60)
    stderr = job.stderr
    assert code in (4, 143), stderr  # whichever came first: both are retried
    assert (job.out / "checkpoint-7" / "trainer_state.json").exists()
    assert "Traceback" not in stderr
    _, alive = psutil.wait_procs(processes, timeout=10)
    assert not alive, alive


BOUND = "--vllm-unresponsive-timeout"


@pytest.mark.parametrize(
    "argv",
    [
        ["--gpus", "2", "--model", "m", BOUND, "-1"],
        ["--gpus", "1", "--mode", "colocate", BOUND, "5"],  # no server to watch
    ],
)
def test_a_bad_or_unused_bound_is_a_usage_error_naming_the_flag(
    argv: list[str], clean_env: None, capsys: pytest.CaptureFixture[str]
) -> None:
    from _support import run_cli

    assert run_cli(["launch", *argv, "--", sys.executable, "-c", "pass"]) == 2
    assert BOUND in capsys.readouterr().err


def test_the_bound_from_the_variable_reaches_the_runtime(clean_env: None) -> None:
    from verirl import TrainingRuntime

    env = {"VERIRL_GPU_COUNT": "2", "VERIRL_VLLM_UNRESPONSIVE_TIMEOUT": "12.5"}
    assert TrainingRuntime.from_settings(environ=env).vllm_unresponsive_timeout == 12.5
    assert TrainingRuntime.from_settings(gpu_count=2).vllm_unresponsive_timeout == 60.0


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_server_dying_while_the_command_saves_after_a_preemption_does_not_cut_the_save(
    tmp_path: Path, jobs: list[Job], sig: signal.Signals
) -> None:
    """Modal preempts with SIGINT, Kubernetes with SIGTERM; the server may die meanwhile.

    The command has the whole grace to save: the watchdog, stopped once the
    signal is passed on, must not interrupt the wait and SIGKILL it.
    """
    job = Job(tmp_path, "--shutdown-timeout", "120", env={"TRAIN_SAVES_SLOWLY": "1"})
    jobs.append(job)
    server, trainer = job.wait_for_training()
    processes = job.everything()
    job.proc.send_signal(sig)
    deadline = time.monotonic() + 30
    while not (job.out / "got-sigterm").exists():
        assert time.monotonic() < deadline, job.stderr
        assert job.proc.poll() is None, job.stderr
        psutil.wait_procs([], timeout=0.02)
    server.kill()
    # The watchdog looks at its server's exit every EXIT_POLL s: ten of its looks and more.
    gone, _ = psutil.wait_procs([trainer], timeout=20 * EXIT_POLL)
    assert not gone, job.stderr  # still saving
    assert job.proc.poll() is None, job.stderr
    trainer.send_signal(signal.SIGUSR1)  # the save completes
    code = job.proc.wait(timeout=60)
    stderr = job.stderr
    assert code == 128 + sig, stderr
    assert json.loads((job.out / "checkpoint-7" / "trainer_state.json").read_text()) == {
        "global_step": 7
    }
    assert "SIGKILL to the training command" not in stderr
    assert "Traceback" not in stderr
    _, alive = psutil.wait_procs(processes, timeout=10)
    assert not alive, alive
    assert nothing_listens(job.port)


def test_a_second_sigterm_while_launch_stops_its_server_is_ignored(
    tmp_path: Path, jobs: list[Job]
) -> None:
    """Launch caught the first SIGTERM's exit, stopped the command and tears down on: a second
    SIGTERM while its vLLM server shuts down is ignored (fire once), the server ends gracefully.
    A rule that took a caught exit for a program that went on SIGKILLed the server there
    (review of 187e82d)."""
    job = Job(tmp_path, env={"FAKE_VLLM_SHUTDOWN_DELAY": "3"})
    jobs.append(job)
    job.wait_for_training()
    job.proc.send_signal(signal.SIGTERM)
    log = tmp_path / f"vllm-serve-{job.port}.log"
    deadline = time.monotonic() + 60
    while "Received SIGTERM" not in log.read_text(errors="replace"):
        assert job.proc.poll() is None, job.stderr
        assert time.monotonic() < deadline, "the server's shutdown never began"
        psutil.wait_procs([], timeout=0.02)
    job.proc.send_signal(signal.SIGTERM)  # while the server shuts down
    assert job.proc.wait(60) == 128 + signal.SIGTERM, job.stderr
    assert "SIGTERM received again while tearing down; ignored" in job.stderr
    assert "Finished server process" in log.read_text(errors="replace"), job.stderr

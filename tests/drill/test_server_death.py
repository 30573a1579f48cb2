"""Self-healing: the vLLM server dies mid-training under `verirl launch --resume auto`.

The real GRPOTrainer of the drill (``use_vllm=False``: the server is the
fake program, which the trainer never calls) runs with `PreemptionCallback`
under ``verirl launch --gpus 2``. At step PAUSE the fake vLLM server is
SIGKILLed, as an OOM or a driver fault would: the watchdog must SIGTERM the
command, the callback save a complete checkpoint at that step, and launch
exit 4 within seconds; the same command then resumes from that checkpoint.
"""

from __future__ import annotations

import datetime as dt
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
from drill_support import (
    RUN_LIMIT,
    clean_env,
    events,
    finish,
    newest_complete,
    script_args,
    wait_for_event,
)

from verirl import find_free_port

PAUSE = 3
STEPS = 5
DEATH_TO_EXIT = 5.0  # the bound, before the trainer's save and exit


def launch_with_a_server(out: Path, log_dir: Path, port: int, *command: str) -> list[str]:
    return [sys.executable, "-m", "verirl", "launch", "--gpus", "2", "--model", "tiny",
            "--vllm-port", str(port), "--vllm-command", f"{sys.executable} -m fakes.vllm_serve",
            "--log-dir", str(log_dir), "--output-dir", str(out), "--resume", "auto",
            "--", *command]  # fmt: skip


def test_a_dead_server_ends_the_job_with_a_checkpoint_and_exit_4(tiny_model, tmp_path):
    out, log = tmp_path / "out", tmp_path / "events.jsonl"
    command = launch_with_a_server(
        out, tmp_path, find_free_port(),
        *script_args(tiny_model, out, log, "--max-steps", str(STEPS), "--pause-at", str(PAUSE)),
    )  # fmt: skip
    first = subprocess.Popen(command, env=clean_env(), stderr=subprocess.PIPE)
    try:
        paused = wait_for_event(log, first, event="paused")
        trainer = psutil.Process(int(paused["pid"]))  # type: ignore[arg-type]
        (server,) = [
            child for child in psutil.Process(first.pid).children()
            if "fakes.vllm_serve" in " ".join(child.cmdline())
        ]  # fmt: skip
        tree = [server, *server.children(recursive=True)]
        died, died_at = time.monotonic(), dt.datetime.now()  # noqa: DTZ005 - the log's local time
        server.send_signal(signal.SIGKILL)
        _, stderr = first.communicate(timeout=RUN_LIMIT)
        elapsed = time.monotonic() - died
    finally:
        finish(first)
    text = stderr.decode(errors="replace")
    assert first.returncode == 4, text[-3000:]
    assert "exited with code -9" in text
    end = events(log)[-2]  # then the callback's exit
    assert end["event"] == "end"
    assert end["step"] == PAUSE
    assert newest_complete(out) == PAUSE  # the callback saved at the step the server died
    # Noticed within the watchdog's exit poll; the job's exit is that, the save and the exit
    # of a torch process on a loaded 2-core machine.
    noticed = next(
        line for line in text.splitlines() if " ERROR verirl" in line and line[:2] == "20"
    )
    noticed_at = dt.datetime.strptime(noticed[:23], "%Y-%m-%d %H:%M:%S,%f")  # noqa: DTZ007
    assert (noticed_at - died_at).total_seconds() < 2.0, noticed
    assert elapsed < DEATH_TO_EXIT + 20, elapsed
    assert not trainer.is_running()
    assert all(not p.is_running() or p.status() == psutil.STATUS_ZOMBIE for p in tree)

    # The retry: the same command, a new server, resumes at step PAUSE and finishes.
    second = subprocess.run(command, env=clean_env(), capture_output=True, timeout=RUN_LIMIT,
                            check=False)  # fmt: skip
    assert second.returncode == 0, second.stderr.decode(errors="replace")[-3000:]
    retry = [e for e in events(log) if e["pid"] != paused["pid"]]
    assert retry[0]["resume"] == str(out / f"checkpoint-{PAUSE}")
    assert newest_complete(out) == STEPS

"""The preemption drill: one `verirl launch --resume auto` command, SIGTERMed mid-run, rerun.

A real GRPOTrainer (CPU, tiny random model, no vLLM) with ``save_steps``
far beyond the run, so that no regular save happens: the only checkpoint
before the end is the one `PreemptionCallback` writes at the step the
SIGTERM came. The script pauses at that step until the signal has arrived
(an event, not a sleep), so the step is known.
"""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import psutil
from drill_support import (
    clean_env,
    events,
    finish,
    launch_command,
    newest_complete,
    script_args,
    wait_for_event,
)

PAUSE = 3
STEPS = 6


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {
        os.fspath(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()
    }


def test_the_same_command_starts_fresh_saves_on_sigterm_and_resumes(tiny_model, tmp_path):
    out, log = tmp_path / "out", tmp_path / "events.jsonl"
    command = launch_command(
        out, *script_args(tiny_model, out, log, "--max-steps", str(STEPS), "--pause-at", str(PAUSE))
    )

    # First attempt: nothing to resume from, a fresh start; SIGTERM at step PAUSE.
    first = subprocess.Popen(command, env=clean_env(), stderr=subprocess.PIPE)
    try:
        paused = wait_for_event(log, first, event="paused")
        trainer = psutil.Process(int(paused["pid"]))  # type: ignore[arg-type]
        first.send_signal(signal.SIGTERM)  # to verirl launch, which passes it on
        _, stderr = first.communicate(timeout=240)
    finally:
        finish(first)
    text = stderr.decode(errors="replace")
    assert first.returncode == 143, text[-3000:]
    assert "'auto': no complete checkpoint yet, starting fresh; searched: local:" in text
    assert not trainer.is_running()
    begin, *_, end, exited = events(log)
    assert begin["resume"] is None
    assert exited["code"] == 143
    assert end == {
        "pid": paused["pid"],
        "rank": 0,
        "event": "end",
        "step": PAUSE,
        "signalled": True,
    }
    assert sorted(p.name for p in out.glob("checkpoint-*")) == [f"checkpoint-{PAUSE}"]
    assert newest_complete(out) == PAUSE  # complete: trainer_state.json written

    # A kill during a later save left a newer, half-written checkpoint behind.
    torn = out / f"checkpoint-{PAUSE + 2}"
    torn.mkdir()
    (torn / "model.safetensors").write_bytes(b"\0" * 100)
    before = _snapshot(torn)

    # The retry: the very same command resumes at step PAUSE and finishes.
    second = subprocess.run(command, env=clean_env(), capture_output=True, timeout=240, check=False)
    text = second.stderr.decode(errors="replace")
    assert second.returncode == 0, text[-3000:]
    assert f"skipping incomplete checkpoint {torn}" in text
    retry = [e for e in events(log) if e["pid"] != paused["pid"]]
    assert retry[0]["event"] == "begin"
    assert retry[0]["resume"] == str(out / f"checkpoint-{PAUSE}")
    assert retry[0]["step"] == PAUSE
    assert [e["step"] for e in retry if e["event"] == "step"] == list(range(PAUSE + 1, STEPS + 1))
    assert retry[-1]["event"] == "end"  # finished: no exit event, a normal return
    assert retry[-1]["step"] == STEPS
    assert _snapshot(torn) == before  # ignored and left exactly as it was
    assert newest_complete(out) == STEPS


def test_trainer_alone_loses_the_steps_since_its_last_save(tiny_model, tmp_path):
    """The baseline: without the callback SIGTERM kills Trainer where it stands."""
    out, log = tmp_path / "out", tmp_path / "events.jsonl"
    args = script_args(tiny_model, out, log, "--max-steps", str(STEPS), "--pause-at", str(PAUSE),
                       "--save-steps", "2", "--no-callback")  # fmt: skip
    first = subprocess.Popen(launch_command(out, *args), env=clean_env(), stderr=subprocess.DEVNULL)
    try:
        wait_for_event(log, first, event="paused")
        first.send_signal(signal.SIGTERM)
        assert finish(first) == 143  # 128 + SIGTERM: it died of the signal
    finally:
        finish(first)
    assert [e["event"] for e in events(log)][-1] == "paused"  # no end: killed mid-run
    assert newest_complete(out) == 2  # step 3 is lost


def test_a_second_sigterm_while_stopping_is_ignored_and_the_exit_code_is_configurable(
    tiny_model, tmp_path
):
    out, log = tmp_path / "out", tmp_path / "events.jsonl"
    args = script_args(tiny_model, out, log, "--max-steps", str(STEPS), "--pause-at", "2",
                       "--exit-code", "75", "--then-pause", "1")  # fmt: skip
    run = subprocess.Popen(args, env=clean_env(), stderr=subprocess.PIPE)  # no launcher
    try:
        wait_for_event(log, run, event="paused")
        run.send_signal(signal.SIGTERM)
        # The first one was handled; the script holds the step end for a second, then saves.
        wait_for_event(log, run, event="unpaused")
        run.send_signal(signal.SIGTERM)
        _, stderr = run.communicate(timeout=240)
    finally:
        finish(run)
    text = stderr.decode(errors="replace")
    assert run.returncode == 75, text[-3000:]
    assert "again while stopping: ignored" in text
    assert newest_complete(out) == 2

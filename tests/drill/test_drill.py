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
import sys
from pathlib import Path

import psutil
import pytest
from drill_support import (
    clean_env,
    events,
    finish,
    launch_command,
    newest_complete,
    script_args,
    wait_for_event,
)

from verirl.checkpoints import INCOMPLETE_MARKER

PAUSE = 3
STEPS = 6


def _snapshot(folder: Path) -> dict[str, bytes]:
    return {
        os.fspath(p.relative_to(folder)): p.read_bytes() for p in folder.rglob("*") if p.is_file()
    }


@pytest.mark.parametrize(
    ("signum", "code", "exit_event"),
    [
        (signal.SIGTERM, 143, 143),  # Kubernetes, SLURM
        (signal.SIGINT, 130, "KeyboardInterrupt"),  # Modal, Ctrl-C
    ],
)
def test_the_same_command_starts_fresh_saves_on_the_signal_and_resumes(
    tiny_model, tmp_path, signum, code, exit_event
):
    out, log = tmp_path / "out", tmp_path / "events.jsonl"
    command = launch_command(
        out, *script_args(tiny_model, out, log, "--max-steps", str(STEPS), "--pause-at", str(PAUSE))
    )

    # First attempt: nothing to resume from, a fresh start; the signal at step PAUSE.
    first = subprocess.Popen(command, env=clean_env(), stderr=subprocess.PIPE)
    try:
        paused = wait_for_event(log, first, event="paused")
        trainer = psutil.Process(int(paused["pid"]))  # type: ignore[arg-type]
        first.send_signal(signum)  # to verirl launch, which passes it on
        _, stderr = first.communicate(timeout=240)
    finally:
        finish(first)
    text = stderr.decode(errors="replace")
    assert first.returncode == code, text[-3000:]
    assert "'auto': no complete checkpoint yet, starting fresh; searched: local:" in text
    assert f"{signal.Signals(signum).name}: finishing the step in flight" in text
    assert not trainer.is_running()
    begin, *_, end, exited = events(log)
    assert begin["resume"] is None
    assert exited["code"] == exit_event
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


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_trainer_alone_loses_the_steps_since_its_last_save_on_either_signal(
    tiny_model, tmp_path, signum
):
    """The baseline, run directly as Modal runs a function body: no launcher in between."""
    out, log = tmp_path / "out", tmp_path / "events.jsonl"
    args = script_args(tiny_model, out, log, "--max-steps", str(STEPS), "--pause-at", str(PAUSE),
                       "--save-steps", "2", "--no-callback")  # fmt: skip
    run = subprocess.Popen(args, env=clean_env(), stderr=subprocess.DEVNULL)
    try:
        wait_for_event(log, run, event="paused")
        run.send_signal(signum)
        assert finish(run) == -signum  # died of it, mid-run
    finally:
        finish(run)
    assert newest_complete(out) == 2  # step 3 is lost


def test_sigint_alone_saves_at_its_step_and_dies_of_sigint(tiny_model, tmp_path):
    """Modal's preemption, as its runtime sees it: the function body ends in KeyboardInterrupt."""
    out, log = tmp_path / "out", tmp_path / "events.jsonl"
    args = script_args(tiny_model, out, log, "--max-steps", str(STEPS), "--pause-at", str(PAUSE))
    run = subprocess.Popen(args, env=clean_env(), stderr=subprocess.PIPE)
    try:
        wait_for_event(log, run, event="paused")
        run.send_signal(signal.SIGINT)
        _, stderr = run.communicate(timeout=240)
    finally:
        finish(run)
    text = stderr.decode(errors="replace")
    assert run.returncode == -signal.SIGINT, text[-3000:]  # a shell shows 130
    assert "raising KeyboardInterrupt (exit 130)" in text
    assert events(log)[-1] == {"pid": run.pid, "rank": 0, "event": "exit",
                               "code": "KeyboardInterrupt"}  # fmt: skip
    assert newest_complete(out) == PAUSE
    assert not (out / f"checkpoint-{PAUSE}" / INCOMPLETE_MARKER).exists()


def test_a_second_sigint_during_the_save_ends_at_once_and_the_folder_stays_incomplete(
    tiny_model, tmp_path
):
    """A person pressing Ctrl-C twice wants out; what was being saved must not count."""
    out, log = tmp_path / "out", tmp_path / "events.jsonl"
    args = script_args(tiny_model, out, log, "--max-steps", str(STEPS), "--pause-at", "2",
                       "--hold-save", "200")  # fmt: skip
    run = subprocess.Popen(args, env=clean_env(), stderr=subprocess.PIPE)
    try:
        wait_for_event(log, run, event="paused")
        run.send_signal(signal.SIGINT)
        wait_for_event(log, run, event="saving")  # weights written, trainer_state.json not yet
        run.send_signal(signal.SIGINT)
        _, stderr = run.communicate(timeout=60)  # at once, not after the 200 s hold
    finally:
        finish(run)
    text = stderr.decode(errors="replace")
    assert run.returncode == -signal.SIGINT, text[-3000:]
    assert "SIGINT again while stopping: stopping now" in text
    folder = out / "checkpoint-2"
    assert (folder / INCOMPLETE_MARKER).exists()
    assert newest_complete(out) is None
    assert "exiting with" not in text


def test_with_transformers_jit_checkpoint_one_checkpoint_at_the_step_and_one_owner(
    tiny_model, tmp_path
):
    """enable_jit_checkpoint=True and PreemptionCallback together: ours saves, JIT stays out."""
    out, log = tmp_path / "out", tmp_path / "events.jsonl"
    args = script_args(tiny_model, out, log, "--max-steps", str(STEPS), "--pause-at", str(PAUSE),
                       "--jit")  # fmt: skip
    run = subprocess.Popen(args, env=clean_env(), stderr=subprocess.PIPE)
    try:
        wait_for_event(log, run, event="paused")
        run.send_signal(signal.SIGTERM)
        _, stderr = run.communicate(timeout=240)
    finally:
        finish(run)
    text = stderr.decode(errors="replace")
    assert run.returncode == 143, text[-3000:]
    owner = "SIGTERM (PreemptionCallback handles it; transformers' JIT checkpoint is set aside)"
    assert text.count(owner) == 1
    assert "JIT checkpoint" not in text.replace(owner, "").replace(
        "takes over from transformers' JIT checkpoint", ""
    )
    assert sorted(p.name for p in out.glob("checkpoint-*")) == [f"checkpoint-{PAUSE}"]
    assert newest_complete(out) == PAUSE


def test_a_jit_checkpoint_killed_before_it_ended_is_not_resumed_from(tiny_model, tmp_path):
    """transformers' own JIT save, SIGKILLed after trainer_state.json, before its sentinel went."""
    out, log = tmp_path / "out", tmp_path / "events.jsonl"
    args = script_args(tiny_model, out, log, "--max-steps", "500", "--jit", "--no-callback",
                       "--hold-jit-save")  # fmt: skip
    run = subprocess.Popen(args, env=clean_env(), stderr=subprocess.DEVNULL)
    try:
        wait_for_event(log, run, event="step", step=1)
        run.send_signal(signal.SIGTERM)  # JIT waits its 3 s, then saves at a step boundary
        saved = wait_for_event(log, run, event="saved-state")
        run.send_signal(signal.SIGKILL)
        assert finish(run) == -signal.SIGKILL
    finally:
        finish(run)
    folder = out / f"checkpoint-{saved['step']}"
    assert (folder / "trainer_state.json").exists()  # parses: only the sentinel tells
    assert (folder / INCOMPLETE_MARKER).exists()
    before = sorted(p.name for p in folder.iterdir())
    resumed = subprocess.run(
        [sys.executable, "-m", "verirl", "resume", "--output-dir", str(out), "--resume", "auto"],
        env=clean_env(), capture_output=True, timeout=60, check=False,
    )  # fmt: skip
    text = resumed.stderr.decode(errors="replace")
    assert resumed.returncode == 0, text
    assert resumed.stdout.decode().strip() == ""  # a fresh start, not the torn folder
    assert f"skipping incomplete checkpoint {folder}" in text
    assert f"{INCOMPLETE_MARKER} is present" in text
    assert sorted(p.name for p in folder.iterdir()) == before  # left as it was

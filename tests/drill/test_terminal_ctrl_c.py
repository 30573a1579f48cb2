"""Ctrl-C at a terminal running ``verirl launch``: the trainer saves once and exits 130.

A terminal sends SIGINT to its whole foreground process group, launch
included. Were the training command in that group, it would get the SIGINT
from the terminal and again from launch, and `PreemptionCallback` reads a
second SIGINT as "out now": no checkpoint. (Here the two often arrive before
the trainer's main thread runs its handler, and Python then calls it once;
tests/test_launch_signals.py counts them with a program that handles each.)
launch runs it in a group of its own and passes the one SIGINT on (see
`verirl._supervise`); this is that, with a real Trainer and the callback.
"""

from __future__ import annotations

import os
import signal
import subprocess

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


def test_ctrl_c_to_launchs_process_group_saves_at_that_step_and_exits_130(tiny_model, tmp_path):
    out, log = tmp_path / "out", tmp_path / "events.jsonl"
    command = launch_command(
        out, *script_args(tiny_model, out, log, "--max-steps", str(STEPS), "--pause-at", str(PAUSE))
    )
    # A session of its own: launch leads the group a terminal's Ctrl-C would reach.
    run = subprocess.Popen(command, env=clean_env(), stderr=subprocess.PIPE, start_new_session=True)
    try:
        paused = wait_for_event(log, run, event="paused")
        os.killpg(run.pid, signal.SIGINT)
        _, stderr = run.communicate(timeout=240)
    finally:
        finish(run)
    text = stderr.decode(errors="replace")
    assert run.returncode == 130, text[-3000:]
    assert "SIGINT: finishing the step in flight" in text
    assert "SIGINT again" not in text, text[-3000:]
    *_, end, exited = events(log)
    assert exited["code"] == "KeyboardInterrupt"
    assert end["pid"] == paused["pid"]
    assert end["step"] == PAUSE
    assert newest_complete(out) == PAUSE
    assert not list(out.glob(f"checkpoint-*/{INCOMPLETE_MARKER}"))

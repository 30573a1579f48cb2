"""Two ranks (torchrun, gloo, CPU) under `verirl launch --resume auto`: one preempted, both stop.

Only rank 0 gets the SIGTERM (one node's preemption, or a signal that
reaches the ranks at different steps): rank 1 must stop at the same step by
the callback's per-step agreement, or the next collective would deadlock.
"""

from __future__ import annotations

import signal
import subprocess

import psutil
from drill_support import (
    BIN,
    clean_env,
    events,
    finish,
    launch_command,
    newest_complete,
    script_args,
    wait_for_event,
)

PAUSE = 2
STEPS = 4


def test_two_ranks_stop_at_the_same_step_with_one_checkpoint_and_resume(tiny_model, tmp_path):
    out, log = tmp_path / "out", tmp_path / "events.jsonl"
    script = script_args(tiny_model, out, log, "--max-steps", str(STEPS), "--pause-at", str(PAUSE))
    torchrun = [str(BIN / "torchrun"), "--standalone", "--nproc-per-node", "2", *script[1:]]
    command = launch_command(out, *torchrun)
    (tmp := tmp_path / "tmp").mkdir()  # torchrun's agent leaves a torchelastic_* folder there

    first = subprocess.Popen(command, env=clean_env(TMPDIR=str(tmp)), stderr=subprocess.PIPE)
    try:
        paused = wait_for_event(log, first, event="paused", rank=0)
        psutil.Process(int(paused["pid"])).send_signal(signal.SIGTERM)  # type: ignore[arg-type]
        _, stderr = first.communicate(timeout=240)
    finally:
        finish(first)
    text = stderr.decode(errors="replace")
    assert first.returncode != 0, text[-3000:]  # torchrun reports a failed worker as 1
    ends = {e["rank"]: e for e in events(log) if e["event"] == "end"}
    exits = {e["rank"]: e["code"] for e in events(log) if e["event"] == "exit"}
    assert exits == {0: 143, 1: 143}  # each rank exited 143 itself, none was killed
    assert ends[0]["step"] == ends[1]["step"] == PAUSE
    assert ends[0]["signalled"] is True
    assert ends[1]["signalled"] is False  # it stopped because rank 0 did
    assert sorted(p.name for p in out.glob("checkpoint-*")) == [f"checkpoint-{PAUSE}"]
    assert newest_complete(out) == PAUSE
    assert {p.name for p in (out / f"checkpoint-{PAUSE}").glob("rng_state_*.pth")} == {
        "rng_state_0.pth",
        "rng_state_1.pth",
    }

    second = subprocess.run(
        command, env=clean_env(TMPDIR=str(tmp)), capture_output=True, timeout=240, check=False
    )
    assert second.returncode == 0, second.stderr.decode(errors="replace")[-3000:]
    retry = [e for e in events(log) if e["pid"] not in {end["pid"] for end in ends.values()}]
    begins = [e for e in retry if e["event"] == "begin"]
    assert sorted(e["rank"] for e in begins) == [0, 1]
    assert all(e["step"] == PAUSE for e in begins)
    assert all(e["step"] == STEPS for e in retry if e["event"] == "end")
    assert newest_complete(out) == STEPS

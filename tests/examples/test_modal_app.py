"""examples/modal_app.py with the real Modal client: its definitions, a preemption as Modal does.

No cloud: the client works offline for definitions and for ``.local()``,
which runs the function's body in the calling process, as a container runs
it. The container here is a subprocess (container.py); Modal preempts a
container with SIGINT (``KeyboardInterrupt`` in the main thread, where a sync
function's body runs), SIGKILL about 30 s later, and runs the input again.
What must hold: the step in flight is saved as a complete checkpoint, nothing
of the job survives (the vLLM server included), the container dies of the
``KeyboardInterrupt`` (what Modal's runtime reports as a preemption, so it
retries; a function that returned would count as done), and the next attempt
resumes at that step and finishes.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

import modal
import psutil
from examples_support import (
    CPU_GRPO_CONFIG,
    EXAMPLES,
    Attempt,
    container,
    example_env,
    gone,
    newest_complete,
    only,
    other_pid,
    run,
    tail,
    vllm_servers,
)
from modal.cli.import_refs import import_and_filter, parse_import_ref

STEPS, PAUSE = 4, 2
GRACE = 30.0  # Modal's SIGKILL comes about this long after the SIGINT
KILLED_BY_SIGINT = (-signal.SIGINT, 128 + signal.SIGINT)


def test_modal_run_finds_the_function_and_its_spec_offline():
    """What ``modal run examples/modal_app.py`` resolves, and the function's spec; no network."""
    ref = parse_import_ref(str(EXAMPLES / "modal_app.py"), command="run")
    runnable, commands, _ = import_and_filter(ref, base_cmd="modal run")
    assert [command.names for command in commands] == [["train", "app.train"]]
    assert isinstance(runnable, modal.Function)
    info = runnable.info()  # static: filled in at definition, no hydration
    assert info.max_retries == 5
    assert info.timeout == 24 * 3600
    assert info.gpus == [("H100", 4)]
    assert list(info.volumes) == ["/ckpt"]
    module = sys.modules["modal_app"]
    assert module.app.name == "verirl-grpo"


def test_sigint_saves_at_the_step_and_the_next_attempt_resumes(tiny_model, prompts, tmp_path):
    out, log = tmp_path / "ckpt" / "run", tmp_path / "events.jsonl"
    command = container(log, "modal", "modal_app.py", "train", pause_at=PAUSE)
    env = example_env(
        tmp_path,
        VERIRL_MODEL=str(tiny_model),
        VERIRL_OUTPUT_DIR=str(out),  # on Modal: the Volume's /ckpt/run
        GRPO_DATASET=str(prompts),
        GRPO_MAX_STEPS=str(STEPS),
        GRPO_SAVE_STEPS="1000",  # no regular save before the preemption
        GRPO_CONFIG=json.dumps(CPU_GRPO_CONFIG),
    )

    # Attempt 1: an empty Volume; preempted at step PAUSE.
    with Attempt(command, env, tmp_path / "attempt-1.log") as first:
        paused = first.wait_for(log, event="paused", step=PAUSE)
        job = [psutil.Process(int(paused["pid"])), *vllm_servers(first.pid)]
        sent = time.monotonic()
        os.kill(first.pid, signal.SIGINT)  # as Modal delivers it
        code = first.wait()
        took = time.monotonic() - sent
    text = first.text
    assert code in KILLED_BY_SIGINT, tail(text)
    (train,) = only(log, first.pid, event="train")
    assert train["resume"] is None  # auto with nothing saved yet: a fresh start, not an error
    (raised,) = only(log, first.pid, event="raised")
    assert raised["type"] == "KeyboardInterrupt", tail(text)  # Modal's preemption, not a failure
    assert not only(log, first.pid, event="returned")  # a return would count as done
    steps = [e["step"] for e in only(log, first.pid, event="step")]
    assert steps == list(range(1, PAUSE + 1))  # stopped at the step the signal came
    assert newest_complete(out) == PAUSE, tail(text)
    assert len(job) > 1, "the fake vLLM server did not run under the example"
    assert gone(job), tail(text)  # the container, the vLLM server and its workers
    assert took < GRACE, f"{took:.1f}s from SIGINT to exit: Modal SIGKILLs after ~{GRACE:.0f}s"
    print(f"\nattempt 1: SIGINT at step {PAUSE}, exit {code} after {took:.1f}s")  # noqa: T201

    # Attempt 2: Modal runs the input again, same environment: resumes at PAUSE, finishes.
    started = time.monotonic()
    second = run(command, env, tmp_path / "attempt-2.log")
    assert second.process.returncode == 0, tail(second.text)
    pid = other_pid(log, first.pid)
    (retry,) = only(log, pid, event="train")
    assert retry["resume"] == str(out / f"checkpoint-{PAUSE}")
    (begin,) = only(log, pid, event="begin")
    assert begin["step"] == PAUSE
    assert only(log, pid, event="returned")  # done: Modal does not run it again
    assert newest_complete(out) == STEPS
    print(f"attempt 2: resumed at {PAUSE}, done in {time.monotonic() - started:.1f}s")  # noqa: T201

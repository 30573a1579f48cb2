"""examples/grpo_train.py: the first attempt starts fresh, a preemption saves, the retry resumes.

The real GRPOTrainer on CPU (the tiny model, a local prompt file) behind
`TrainingRuntime` with two planned GPUs, so the fake vLLM server is started
and torn down on each attempt. The same command runs both attempts, with no
``VERIRL_RESUME_FROM_CHECKPOINT``: the example's own default (``auto``) must
start the first attempt on an empty output folder and resume the second.
"""

from __future__ import annotations

import json
import signal
import time

import psutil
from examples_support import (
    CPU_GRPO_CONFIG,
    Attempt,
    container,
    events,
    example_env,
    gone,
    newest_complete,
    only,
    run,
    tail,
    vllm_servers,
)

STEPS, PAUSE = 4, 2


def test_first_attempt_starts_fresh_a_sigterm_saves_and_the_retry_resumes(
    tiny_model, prompts, tmp_path
):
    out, log = tmp_path / "out", tmp_path / "events.jsonl"
    command = container(
        log, "script", "grpo_train.py",
        "--model", str(tiny_model), "--output-dir", str(out), "--dataset", str(prompts),
        "--max-steps", str(STEPS), "--save-steps", "1000",
        "--grpo-config", json.dumps(CPU_GRPO_CONFIG),
        pause_at=PAUSE,
    )  # fmt: skip
    env = example_env(tmp_path)

    # Attempt 1: nothing to resume; preempted (SIGTERM) at step PAUSE.
    with Attempt(command, env, tmp_path / "attempt-1.log") as first:
        paused = first.wait_for(log, event="paused", step=PAUSE)
        job = [psutil.Process(int(paused["pid"])), *vllm_servers(first.pid)]
        sent = time.monotonic()
        first.process.send_signal(signal.SIGTERM)
        code = first.wait()
        took = time.monotonic() - sent
    text = first.text
    assert code == 143, tail(text)
    (train,) = only(log, first.pid, event="train")
    assert train["resume"] is None  # auto, and nothing yet: a fresh start, not an error
    assert "'auto': no complete checkpoint yet, starting fresh" in text
    assert only(log, first.pid, event="trainer")[0]["preemption_callback"]
    assert newest_complete(out) == PAUSE  # saved at the step the signal came
    assert len(job) > 1, "the fake vLLM server did not run under the example"
    assert gone(job), tail(text)  # the trainer, the server and its workers
    print(f"attempt 1: SIGTERM to exit {took:.1f}s")  # noqa: T201

    # Attempt 2: the same command resumes at step PAUSE and finishes.
    second = run(command, env, tmp_path / "attempt-2.log")
    assert second.process.returncode == 0, tail(second.text)
    (retry,) = [e for e in events(log) if e["event"] == "train" and e["pid"] != first.pid]
    assert retry["resume"] == str(out / f"checkpoint-{PAUSE}")
    (begin,) = only(log, int(retry["pid"]), event="begin")
    assert begin["step"] == PAUSE
    assert newest_complete(out) == STEPS

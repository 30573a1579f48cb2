"""examples/hf_job.py on a fake Hub: a missing repo on the first attempt, a fresh disk on each.

The first attempt finds no repo (HTTP 404 to a request with a token, as on
the Hub) and must start fresh with ``auto``; the Trainer creates the repo
and pushes ``last-checkpoint/`` when the preemption (SIGTERM) makes it save.
The second attempt, on a new empty disk, downloads that checkpoint from the
Hub, resumes at its step, finishes and pushes the final one.
"""

from __future__ import annotations

import json
import signal

import psutil
from examples_support import (
    CPU_GRPO_CONFIG,
    Attempt,
    container,
    example_env,
    gone,
    only,
    other_pid,
    run,
    tail,
    vllm_servers,
)

from fakes.hub import FakeHub

STEPS, PAUSE = 4, 2
REPO, TOKEN = "me/grpo-run", "hf_job_token"


def pushed_step(hub: FakeHub) -> int:
    state = hub.files(REPO)["last-checkpoint/trainer_state.json"]
    return int(json.loads(state)["global_step"])


def test_a_missing_repo_starts_fresh_and_the_retry_resumes_from_the_hub(
    tiny_model, prompts, tmp_path
):
    log = tmp_path / "events.jsonl"
    command = container(
        log, "script", "hf_job.py",
        "--model", str(tiny_model), "--dataset", str(prompts),
        "--max-steps", str(STEPS), "--save-steps", "1000",
        "--grpo-config", json.dumps(CPU_GRPO_CONFIG),
        pause_at=PAUSE,
    )  # fmt: skip
    with FakeHub() as hub:
        hub.protect(REPO, TOKEN)  # without the token: 401, as the Hub answers
        env = example_env(
            tmp_path,
            VERIRL_HUB_REPO_ID=REPO,
            VERIRL_HUB_ENDPOINT=hub.endpoint,
            HF_ENDPOINT=hub.endpoint,  # where the Trainer pushes
            HF_TOKEN=TOKEN,
            HF_HUB_OFFLINE="0",
        )

        # Attempt 1: a fresh disk and no repo; preempted at step PAUSE.
        first_env = {**env, "VERIRL_OUTPUT_DIR": str(tmp_path / "attempt-1" / "out")}
        with Attempt(command, first_env, tmp_path / "attempt-1.log") as first:
            paused = first.wait_for(log, event="paused", step=PAUSE)
            job = [psutil.Process(int(paused["pid"])), *vllm_servers(first.pid)]
            first.process.send_signal(signal.SIGTERM)
            code = first.wait()
        text = first.text
        assert code == 143, tail(text)
        assert "does not exist yet" in text, tail(text)
        (train,) = only(log, first.pid, event="train")
        assert train["resume"] is None
        assert gone(job), tail(text)
        assert pushed_step(hub) == PAUSE, tail(text)  # the preemption's checkpoint is on the Hub

        # Attempt 2: another fresh disk; the checkpoint comes from the Hub.
        second_out = tmp_path / "attempt-2" / "out"
        second_env = {**env, "VERIRL_OUTPUT_DIR": str(second_out)}
        second = run(command, second_env, tmp_path / "attempt-2.log")
        assert second.process.returncode == 0, tail(second.text)
        pid = other_pid(log, first.pid)
        (retry,) = only(log, pid, event="train")
        assert retry["resume"] == str(second_out / "_verirl-hub-download" / "last-checkpoint")
        (begin,) = only(log, pid, event="begin")
        assert begin["step"] == PAUSE
        assert pushed_step(hub) == STEPS
        # The retry pushed its own checkpoints, not the copy it had downloaded from the Hub.
        assert not [name for name in hub.files(REPO) if "verirl-hub-download" in name]


def test_without_a_hub_repo_it_refuses_to_start(tmp_path):
    log = tmp_path / "events.jsonl"
    result = run(container(log, "script", "hf_job.py"), example_env(tmp_path), tmp_path / "out.log")
    assert result.process.returncode == 1
    assert "set VERIRL_HUB_REPO_ID" in result.text

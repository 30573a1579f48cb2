r"""Where verirl goes in a Hugging Face Jobs entry point.

Submit with retries so a preempted job starts again and resumes, e.g.::

    hf jobs run --flavor a100x4 --attempts 3 --secrets HF_TOKEN \\
        -e VERIRL_HUB_REPO_ID=me/grpo-run -e VERIRL_RESUME_FROM_CHECKPOINT=latest \\
        -e VERIRL_MODEL=Qwen/Qwen3-0.6B <image> python examples/hf_job.py

The job's disk is fresh on every attempt, so the checkpoint comes from the Hub
repo that the Trainer pushes ``last-checkpoint/`` to (``hub_strategy="checkpoint"``);
only that one checkpoint is downloaded.
"""

from __future__ import annotations

import sys

from verirl import TrainingRuntime


def main() -> int:
    """Bring the runtime up; a real job builds GRPOTrainer from the session."""
    with TrainingRuntime.from_settings(output_dir="/tmp/grpo-out") as session:  # noqa: S108 - the job's scratch disk
        print(session.timeline())
        print("resume from:", session.resume_from_checkpoint or "fresh start")
    return 0


if __name__ == "__main__":
    sys.exit(main())

r"""A Hugging Face Jobs entry point: examples/grpo_train.py, resuming from the Hub.

Submit it with attempts, so that a preempted or failed run is run again with
the very same command (up to 3 runs in all)::

    hf jobs run --flavor a100x4 --attempts 3 --secrets HF_TOKEN \\
        -e VERIRL_HUB_REPO_ID=me/grpo-run -e VERIRL_MODEL=Qwen/Qwen3-0.6B \\
        <image> python examples/hf_job.py --max-steps 500

A job's disk is fresh on every attempt, so the checkpoint lives on the Hub:
the Trainer pushes ``last-checkpoint/`` to ``VERIRL_HUB_REPO_ID``
(``hub_strategy="checkpoint"``), and each attempt resumes with ``auto``: the
newest complete checkpoint there (only that one is downloaded), else a fresh
start. On the first attempt the repo does not exist yet (the Trainer creates
it when it first pushes): ``auto`` starts fresh where ``latest`` would fail
every attempt. Flags are grpo_train.py's.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import grpo_train  # the training itself: one recipe for every platform


def main() -> None:
    """Check that the Hub is configured, put the output on scratch disk, train."""
    if not os.environ.get("VERIRL_HUB_REPO_ID"):
        sys.exit("set VERIRL_HUB_REPO_ID: a job's disk is fresh on every attempt, so the Hub repo "
                 "is where the next attempt finds the checkpoint")  # fmt: skip
    os.environ.setdefault("VERIRL_OUTPUT_DIR", "/tmp/grpo-out")  # noqa: S108 - the job's scratch disk
    grpo_train.main()


if __name__ == "__main__":
    main()

r"""A real GRPO run on a GPU machine: TRL's GRPOTrainer behind `verirl.TrainingRuntime`.

Run with ``python examples/grpo_train.py`` (one process) or under
``torchrun``/``accelerate launch``; only local rank 0 starts the vLLM server.
Settings come from the environment (see the README's table), for example::

    VERIRL_MODEL=Qwen/Qwen3-0.6B VERIRL_OUTPUT_DIR=out VERIRL_HUB_REPO_ID=me/run \\
    VERIRL_ENV_SERVER_URL=http://127.0.0.1:8000 VERIRL_RESUME_FROM_CHECKPOINT=latest \\
        python examples/grpo_train.py
"""

from __future__ import annotations

import logging
import os

from verirl import TrainingRuntime


def reward_len(completions: list[str], **_: object) -> list[float]:
    """A toy reward; a real job asks its env server."""
    return [-abs(20 - len(c)) / 20 for c in completions]


def main() -> None:
    """Bring the runtime up, train, and let the ``with`` block tear vLLM down."""
    logging.basicConfig(level=logging.INFO)
    from datasets import load_dataset  # noqa: PLC0415 - GPU-only dependencies
    from trl import GRPOConfig, GRPOTrainer  # noqa: PLC0415

    runtime = TrainingRuntime.from_settings()
    output_dir = os.environ.get("VERIRL_OUTPUT_DIR", "grpo-out")
    with runtime as session:
        config = GRPOConfig(
            output_dir=output_dir,
            push_to_hub=bool(os.environ.get("VERIRL_HUB_REPO_ID")),
            hub_model_id=os.environ.get("VERIRL_HUB_REPO_ID"),
            hub_strategy="checkpoint",  # pushes last-checkpoint/ for the next attempt
            save_steps=50,
            **session.grpo_kwargs,
        )
        trainer = GRPOTrainer(
            model=runtime.model or "Qwen/Qwen3-0.6B",
            reward_funcs=reward_len,
            args=config,
            train_dataset=load_dataset("trl-lib/tldr", split="train"),
        )
        trainer.train(resume_from_checkpoint=session.resume_from_checkpoint)


if __name__ == "__main__":
    main()

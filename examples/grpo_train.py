r"""A real GRPO run: TRL's GRPOTrainer behind `verirl.TrainingRuntime`, resumable.

Run with ``python examples/grpo_train.py`` (one process) or under
``torchrun``/``accelerate launch``; only local rank 0 starts the vLLM server.
verirl's settings come from the environment (the README's table), the run's
own from flags::

    VERIRL_ENV_SERVER_URL=http://127.0.0.1:8000 VERIRL_HUB_REPO_ID=me/run \\
        python examples/grpo_train.py --model Qwen/Qwen3-0.6B --output-dir out --max-steps 500

Run the same command for the first attempt and for every retry: it resumes
with ``auto`` (the newest complete checkpoint, locally or on the Hub, else a
fresh start) unless ``VERIRL_RESUME_FROM_CHECKPOINT`` says otherwise. On
SIGTERM (a preemption) `PreemptionCallback` finishes the step, saves a
checkpoint at it and exits 143, so the retry loses nothing.

``--dataset`` is a Hub dataset (default ``trl-lib/tldr``) or a local
``.json``/``.jsonl``/``.csv``/``.parquet`` file with a ``prompt`` column;
``--grpo-config`` adds GRPOConfig fields as JSON, e.g. for a CPU smoke run:
``'{"use_cpu": true, "bf16": false, "use_vllm": false}'``.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
from pathlib import Path
from typing import Any

from verirl import TrainingRuntime


def reward_len(completions: list[str], **_: object) -> list[float]:
    """A toy reward; a real job asks its env server."""
    return [-abs(20 - len(str(c))) / 20 for c in completions]


def load_prompts(name: str) -> Any:  # noqa: ANN401 - a datasets.Dataset
    """A local file (by its extension) or a Hub dataset's train split."""
    from datasets import load_dataset  # noqa: PLC0415 - training-only dependency

    path = Path(name)
    if path.is_file():
        builder = {".jsonl": "json"}.get(path.suffix, path.suffix.lstrip("."))
        return load_dataset(builder, data_files=str(path), split="train")
    return load_dataset(name, split="train")


def parse_args() -> argparse.Namespace:
    """The run's flags; defaults fit a GPU machine."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=os.environ.get("VERIRL_MODEL", "Qwen/Qwen3-0.6B"))
    parser.add_argument("--output-dir", default=os.environ.get("VERIRL_OUTPUT_DIR", "grpo-out"))
    parser.add_argument("--dataset", default="trl-lib/tldr")
    parser.add_argument("--max-steps", type=int, default=500)
    parser.add_argument("--save-steps", type=int, default=50)
    parser.add_argument("--grpo-config", type=json.loads, default={}, help="more fields, JSON")
    return parser.parse_args()


def main() -> None:
    """Bring the runtime up, train, and let the ``with`` block tear vLLM down."""
    args = parse_args()
    logging.basicConfig(level=logging.INFO)
    from trl import GRPOConfig, GRPOTrainer  # noqa: PLC0415 - training-only dependencies

    from verirl.preemption import PreemptionCallback  # noqa: PLC0415 - imports transformers

    hub_repo = os.environ.get("VERIRL_HUB_REPO_ID")
    runtime = TrainingRuntime.from_settings(
        model=args.model,  # the model vLLM serves is the one trained
        output_dir=args.output_dir,  # where `auto` looks first
        resume_from=os.environ.get("VERIRL_RESUME_FROM_CHECKPOINT", "auto"),
    )
    with runtime as session:
        config = GRPOConfig(
            **{
                **session.grpo_kwargs,  # use_vllm, vllm_mode, the server's host and port, …
                "output_dir": args.output_dir,
                "max_steps": args.max_steps,
                "save_steps": args.save_steps,
                "push_to_hub": hub_repo is not None,
                "hub_model_id": hub_repo,
                "hub_strategy": "checkpoint",  # pushes last-checkpoint/ for the next attempt
                **args.grpo_config,
            }
        )
        trainer = GRPOTrainer(
            model=args.model,
            reward_funcs=reward_len,
            args=config,
            train_dataset=load_prompts(args.dataset),
            callbacks=[PreemptionCallback()],  # SIGTERM: save at this step, exit 143
        )
        trainer.train(resume_from_checkpoint=session.resume_from_checkpoint)


if __name__ == "__main__":
    main()

"""A GRPO job on Modal that survives preemption: ``modal run examples/modal_app.py``.

Modal preempts a container with SIGINT (a ``KeyboardInterrupt`` in the
function body), SIGKILLs it about 30 s later and runs the input again.
`PreemptionCallback` turns the SIGINT into a stop: the step in flight
finishes, a complete checkpoint is saved on the Volume at that step, and the
``KeyboardInterrupt`` goes on out of the function, which Modal reads as the
preemption (a function that returns counts as done and is never retried; any
other exception is a failure, retried per ``retries=``). On the way out the
``with`` block takes the vLLM server down. Every attempt, the first included,
resumes with ``auto``: the newest complete checkpoint on the Volume (or the
Hub), else a fresh start.

Four GPUs: vLLM on the last, training on three. The container's environment
(``env=`` or a Secret) may override any ``VERIRL_*`` setting (the README's
table) and ``GRPO_DATASET`` (a Hub dataset or a local JSON-lines/CSV file),
``GRPO_MAX_STEPS``, ``GRPO_SAVE_STEPS`` and ``GRPO_CONFIG`` (more GRPOConfig
fields as JSON).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import modal

MODEL = "Qwen/Qwen3-0.6B"
CHECKPOINTS = "/ckpt"

app = modal.App("verirl-grpo")
image = (
    modal.Image.debian_slim()
    .pip_install("trl", "vllm", "attrs", "requests", "psutil", "huggingface_hub")
    .add_local_python_source("verirl")
)
volume = modal.Volume.from_name("grpo-checkpoints", create_if_missing=True)


def reward_len(completions: list[str], **_: object) -> list[float]:
    """A toy reward; a real job asks its env server."""
    return [-abs(20 - len(str(c))) / 20 for c in completions]


def load_prompts(name: str) -> Any:  # noqa: ANN401 - a datasets.Dataset
    """A local file (by its extension) or a Hub dataset's train split."""
    from datasets import load_dataset  # noqa: PLC0415 - inside the container only

    path = Path(name)
    if path.is_file():
        builder = {".jsonl": "json"}.get(path.suffix, path.suffix.lstrip("."))
        return load_dataset(builder, data_files=str(path), split="train")
    return load_dataset(name, split="train")


def commit_volume_on_save() -> Any:  # noqa: ANN401 - a transformers.TrainerCallback
    """A callback committing the Volume after each checkpoint, so the retry's container sees it."""
    from transformers import TrainerCallback  # noqa: PLC0415 - inside the container only

    class CommitVolume(TrainerCallback):  # type: ignore[misc]  # transformers is untyped here
        def on_save(self, *_: object, **__: object) -> None:
            if not modal.is_local():  # `.local()` runs have no Volume mounted
                volume.commit()

    return CommitVolume()


@app.function(
    image=image,
    gpu="H100:4",
    timeout=24 * 3600,
    retries=modal.Retries(max_retries=5, initial_delay=0.0),  # preemptions do not count
    volumes={CHECKPOINTS: volume},
    secrets=[modal.Secret.from_name("huggingface")],  # HF_TOKEN, for the model and the Hub
)
def train() -> None:
    """Train until done; a preemption saves at the step it came and raises on to Modal."""
    from trl import GRPOConfig, GRPOTrainer  # noqa: PLC0415 - inside the container only

    from verirl import TrainingRuntime  # noqa: PLC0415
    from verirl.preemption import PreemptionCallback  # noqa: PLC0415

    output_dir = os.environ.setdefault("VERIRL_OUTPUT_DIR", f"{CHECKPOINTS}/run")
    os.environ.setdefault("VERIRL_RESUME_FROM_CHECKPOINT", "auto")
    model = os.environ.get("VERIRL_MODEL", MODEL)
    with TrainingRuntime.from_settings(model=model) as session:
        config = GRPOConfig(
            **{
                **session.grpo_kwargs,  # use_vllm, vllm_mode, the server's host and port, …
                "output_dir": output_dir,
                "max_steps": int(os.environ.get("GRPO_MAX_STEPS", "500")),
                "save_steps": int(os.environ.get("GRPO_SAVE_STEPS", "50")),
                **json.loads(os.environ.get("GRPO_CONFIG", "{}")),
            }
        )
        trainer = GRPOTrainer(
            model=model,
            reward_funcs=reward_len,
            args=config,
            train_dataset=load_prompts(os.environ.get("GRPO_DATASET", "trl-lib/tldr")),
            callbacks=[PreemptionCallback(), commit_volume_on_save()],
        )
        trainer.train(resume_from_checkpoint=session.resume_from_checkpoint)

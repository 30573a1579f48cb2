"""Where verirl goes in a Modal job.

Modal preempts a function by sending it an interrupt signal and retrying it
(``retries=``). `TrainingRuntime` turns SIGTERM into a normal exit, so the
``with`` block tears vLLM down, and the retry resumes from the newest complete
checkpoint (``VERIRL_RESUME_FROM_CHECKPOINT=latest``), on the volume or the Hub.
"""

from __future__ import annotations

import os

import modal

app = modal.App("verirl-grpo")
image = (
    modal.Image.debian_slim()
    .pip_install("trl", "vllm", "attrs", "requests", "psutil", "huggingface_hub")
    .add_local_python_source("verirl")
)
volume = modal.Volume.from_name("grpo-checkpoints", create_if_missing=True)


@app.function(  # type: ignore[untyped-decorator]  # modal is not installed here
    image=image,
    gpu="H100:4",
    timeout=24 * 3600,
    retries=modal.Retries(max_retries=5, initial_delay=0.0),
    volumes={"/ckpt": volume},
    secrets=[modal.Secret.from_name("huggingface")],
)
def train() -> None:
    """Four GPUs: vLLM on the last, training on three; resumes after preemption."""
    from verirl import TrainingRuntime  # noqa: PLC0415 - runs inside the container

    os.environ.setdefault("VERIRL_OUTPUT_DIR", "/ckpt/run")
    os.environ.setdefault("VERIRL_RESUME_FROM_CHECKPOINT", "latest")
    with TrainingRuntime.from_settings(model="Qwen/Qwen3-0.6B") as session:
        # GRPOTrainer(..., args=GRPOConfig(**session.grpo_kwargs, ...)).train(
        #     resume_from_checkpoint=session.resume_from_checkpoint)
        print(session.timeline())
        volume.commit()

"""A stand-in training script for `verirl launch`: what a real one reads, minus the GPU.

It reads what ``verirl launch`` exported, checks the vLLM server the way TRL's
client does, and "trains" by writing a Trainer-shaped checkpoint (weights
first, ``trainer_state.json`` last, as transformers does).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import urllib.error
import urllib.request
from http import HTTPStatus
from pathlib import Path

STEPS_PER_RUN = 10


def get_json(url: str) -> dict[str, object] | None:
    """``GET url`` as JSON; ``None`` for an HTTP error (a route this server lacks)."""
    try:
        with urllib.request.urlopen(url, timeout=5) as reply:  # noqa: S310 - our own loopback URL
            body: dict[str, object] = json.load(reply)
    except urllib.error.HTTPError:
        return None
    return body


def world_size(vllm_url: str) -> str:
    """What TRL's client asks before it syncs weights; "unknown" without vLLM's dev endpoints."""
    for path in ("/get_world_size", "/get_world_size/"):  # vLLM (dev mode), TRL 0.2x
        body = get_json(vllm_url + path)
        if body is not None:
            return str(body["world_size"])
    return "unknown"


def main() -> int:
    """Resume, check the server, write the next checkpoint; print what happened."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--output-dir", required=True)
    args = parser.parse_args()

    resume = os.environ.get("VERIRL_RESUME_FROM_CHECKPOINT") or None
    grpo_kwargs = json.loads(os.environ["VERIRL_GRPO_KWARGS"])
    vllm_url = os.environ.get("VERIRL_VLLM_URL")
    print(f"[train] GRPOConfig kwargs: {grpo_kwargs}")
    print(f"[train] CUDA_VISIBLE_DEVICES={os.environ.get('CUDA_VISIBLE_DEVICES')}")

    if vllm_url:
        # vLLM's server answers /health (TRL 0.2x's redirects it to /health/; urllib follows).
        with urllib.request.urlopen(f"{vllm_url}/health", timeout=5) as reply:  # noqa: S310 - our own loopback URL
            assert reply.status == HTTPStatus.OK  # noqa: S101 - a demo's sanity check
        print(f"[train] vLLM server at {vllm_url} is healthy (world size {world_size(vllm_url)})")

    step = 0
    if resume:
        state = json.loads((Path(resume) / "trainer_state.json").read_text())
        step = int(state["global_step"])
        print(f"[train] resuming from {resume} (step {step})")
    else:
        print("[train] fresh start")

    step += STEPS_PER_RUN
    out = Path(args.output_dir) / f"checkpoint-{step}"
    out.mkdir(parents=True, exist_ok=False)
    (out / "model.safetensors").write_bytes(os.urandom(1024))
    (out / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    print(f"[train] wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

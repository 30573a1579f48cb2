"""One rank of a multi-node GRPO job, as ``torchrun`` starts it on each training node.

Everything comes from the environment, the same on every node (the README's
"Multi-node" section): ``VERIRL_VLLM_HOST``/``VERIRL_VLLM_PORT`` name the vLLM
node, ``VERIRL_ENV_SERVER_URL`` the reward env server, ``VERIRL_OUTPUT_DIR`` and
``VERIRL_HUB_REPO_ID`` where checkpoints are. `TrainingRuntime` starts nothing
here (vLLM is remote): every rank waits for the vLLM server's health, local
rank 0 alone waits for the env server and resolves/downloads the checkpoint
for its node. It resumes with ``auto`` (``VERIRL_RESUME_FROM_CHECKPOINT``
unset): the newest complete checkpoint, else a fresh start, so the first
attempt and every retry run the same command.

Where a real script builds ``GRPOTrainer(args=GRPOConfig(**session.grpo_kwargs,
resume_from_checkpoint=…))``, this one proves the job is wired: a gloo
``all_reduce`` over every rank, and one JSON line per rank in ``--report``
(rank, node, checkpoint, server URL). ``--steps 0`` keeps all-reducing until
killed (the teardown drill).
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import time
import urllib.request
from pathlib import Path

import torch
import torch.distributed as dist

from verirl import TrainingRuntime


def main() -> None:
    """Start the runtime, join the job, all-reduce, report."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--report", type=Path, required=True, help="folder for one JSON per rank")
    parser.add_argument("--steps", type=int, default=3, help="all_reduce steps; 0: until killed")
    args = parser.parse_args()

    resume = os.environ.get("VERIRL_RESUME_FROM_CHECKPOINT", "auto")
    with TrainingRuntime.from_settings(resume_from=resume) as session:
        dist.init_process_group("gloo", timeout=dt.timedelta(seconds=120))
        rank, world = dist.get_rank(), dist.get_world_size()
        if session.server_url is None:
            raise SystemExit("no vLLM server URL: set VERIRL_VLLM_HOST to the vLLM node")
        with urllib.request.urlopen(f"{session.server_url}/health", timeout=10) as reply:  # noqa: S310
            healthy = reply.status == 200  # noqa: PLR2004
        total = torch.tensor([float(rank)])
        dist.all_reduce(total)
        record = {
            "rank": rank,
            "world_size": world,
            "local_rank": session.dist_env.local_rank,
            "node_rank": session.dist_env.node_rank,
            "pid": os.getpid(),
            "resume_from_checkpoint": session.resume_from_checkpoint,
            "server_url": session.server_url,
            "vllm_healthy": healthy,
            "all_reduce": total.item(),
        }
        (args.report / f"rank-{rank}.json").write_text(json.dumps(record))
        step = 0
        while args.steps == 0 or step < args.steps:
            dist.all_reduce(torch.ones(1))
            step += 1
            if args.steps == 0:
                time.sleep(0.05)
        dist.destroy_process_group()


if __name__ == "__main__":
    main()

"""A multi-node GRPO job on one machine: two torchrun agents as two nodes, a vLLM node.

``nox -s multinode`` runs this (CPU torch, gloo). The layout is the README's
"Multi-node" section, on loopback (`_cluster`):

- the vLLM node: ``verirl serve --dedicated`` with the fake server program;
- two training nodes: ``torchrun --nnodes 2 --nproc-per-node 2`` with c10d
  rendezvous on 127.0.0.1, each with its own output folder (its own disk),
  running ``examples/multinode_rank.py`` through `TrainingRuntime`;
- a fake Hub holding the checkpoints and a fake env server.
"""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from _cluster import (
    DEADLINE,
    NODES,
    PER_NODE,
    Cluster,
    check_shared_start,
    checkpoint_hub,
    vllm_node,
)
from _support import still_alive
from fakes import FakeEnvServer, FakeHub


@pytest.fixture
def vllm_port(tmp_path: Path) -> Iterator[int]:
    """The vLLM node: ``verirl serve --dedicated`` with the fake server."""
    with vllm_node(
        tmp_path, "tiny-grpo", "--vllm-command", f"{sys.executable} -m fakes.vllm_serve"
    ) as port:
        yield port


@pytest.fixture
def hub() -> Iterator[FakeHub]:
    with checkpoint_hub() as hub:
        yield hub


@pytest.fixture
def env_server() -> Iterator[FakeEnvServer]:
    with FakeEnvServer(ready_after=0.5) as server:
        yield server


@pytest.fixture
def cluster(
    tmp_path: Path, hub: FakeHub, env_server: FakeEnvServer, vllm_port: int
) -> Iterator[Cluster]:
    cluster = Cluster(tmp_path, hub, env_server, vllm_port)
    try:
        yield cluster
    finally:
        cluster.close()


def test_four_ranks_on_two_nodes_share_the_checkpoint_and_the_server(cluster, hub, vllm_port):
    check_shared_start(cluster, hub, vllm_port)


def test_the_same_job_with_verirl_launch_as_each_rank(cluster, hub, vllm_port):
    """``torchrun --no-python verirl launch -- python rank.py``: launch does the node's work."""
    check_shared_start(cluster, hub, vllm_port, under_launch=True)


def test_a_first_attempt_with_nothing_to_resume_starts_fresh_on_every_rank(
    tmp_path, env_server, vllm_port
):
    """``auto`` with no repo on the Hub yet and empty disks: every rank starts fresh, no error."""
    with FakeHub() as empty:
        cluster = Cluster(tmp_path, empty, env_server, vllm_port)
        try:
            cluster.start(steps=3)
            assert cluster.wait(DEADLINE) == [0, 0], cluster.logs()
        finally:
            cluster.close()
        reports = cluster.reports(NODES * PER_NODE, timeout=5)
        assert sorted(r["rank"] for r in reports) == [0, 1, 2, 3]
        assert [r["resume_from_checkpoint"] for r in reports] == [None] * (NODES * PER_NODE)
        assert cluster.logs().count("does not exist yet") == NODES  # local rank 0 of each node
        downloaded = tmp_path.glob("node*/out/_verirl-hub-download/*checkpoint*")
        assert not list(downloaded), "nothing to download, nothing downloaded"


def test_killing_one_agent_tears_down_the_whole_job(cluster):
    cluster.start(steps=0)  # all-reduce until killed
    reports = cluster.reports(NODES * PER_NODE, timeout=DEADLINE)
    ranks = [psutil.Process(r["pid"]) for r in reports]
    victim = cluster.agents[1]
    victim_ranks = [p for p in ranks if p.ppid() == victim.pid]
    assert len(victim_ranks) == PER_NODE
    victim.send_signal(signal.SIGKILL)
    victim.wait(timeout=30)
    # The killed agent's ranks die with it (they run in sessions of their own, so nothing
    # but verirl's death signal reaches them); the other node's ranks see their peers
    # gone in the next all_reduce, and that node's agent ends the job.
    assert still_alive(victim_ranks, timeout=30) == [], cluster.logs()
    survivor = cluster.agents[0]
    try:
        code = survivor.wait(timeout=DEADLINE)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the surviving agent still runs\n{cluster.logs()}")
    assert code != 0
    assert still_alive(ranks, timeout=30) == [], cluster.logs()

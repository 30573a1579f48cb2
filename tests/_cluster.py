"""A simulated cluster for the multi-node tests: torchrun agents as nodes, a vLLM node.

Shared by tests/multinode (the fake vLLM server) and tests/engine (the real
CPU engine). The layout is the README's "Multi-node" section, on loopback.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from _support import still_alive, unshared_port
from fakes import FakeEnvServer, FakeHub

ROOT = Path(__file__).resolve().parents[1]
RANK_SCRIPT = ROOT / "examples" / "multinode_rank.py"
REPO = "org/grpo-run"
NODES, PER_NODE = 2, 2
DEADLINE = 120.0


class Lines:
    """A process's stdout, line by line, waited on with a deadline."""

    def __init__(self, stream: object) -> None:
        self._queue: queue.Queue[str] = queue.Queue()
        self.seen: list[str] = []
        thread = threading.Thread(target=self._pump, args=(stream,), daemon=True)
        thread.start()

    def _pump(self, stream: object) -> None:
        for line in stream:  # type: ignore[attr-defined]
            self._queue.put(line)

    def wait_for(self, text: str, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            try:
                line = self._queue.get(timeout=left)
            except queue.Empty:
                break
            self.seen.append(line)
            if text in line:
                return line
        pytest.fail(f"no line with {text!r} within {timeout}s; got:\n{''.join(self.seen)}")


def wait_listening(port: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 0.5):
            return
        time.sleep(0.05)
    pytest.fail(f"nothing listens on 127.0.0.1:{port} after {timeout}s")


def stop(proc: subprocess.Popen[str], sig: int = signal.SIGTERM) -> int:
    if proc.poll() is None:
        proc.send_signal(sig)
    try:
        return proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        return proc.wait()


@contextlib.contextmanager
def vllm_node(log_dir: Path, model: str, *extra: str, env: dict[str, str] | None = None,
              timeout: float = DEADLINE) -> Iterator[int]:  # fmt: skip
    """``verirl serve --dedicated`` as a vLLM node would run it; yields the port once ready."""
    port = unshared_port()
    serve = subprocess.Popen(
        [sys.executable, "-m", "verirl", "serve", "--dedicated", "--gpus", "1",
         "--host", "127.0.0.1", "--vllm-port", str(port), "--model", model,
         "--log-dir", str(log_dir), *extra],
        stdout=subprocess.PIPE, text=True, env={**os.environ, **(env or {})},
    )  # fmt: skip
    try:
        Lines(serve.stdout).wait_for("vLLM server ready at", timeout)
        yield port
    finally:
        code = stop(serve)
        if serve.stdout is not None:
            serve.stdout.close()
    assert code == 128 + signal.SIGTERM


class Cluster:
    """Two torchrun agents, each a 'node' with its own output folder."""

    def __init__(
        self, tmp_path: Path, hub: FakeHub, env_server: FakeEnvServer, vllm_port: int
    ) -> None:
        """Configure the nodes as the README does: the same variables, their own folders."""
        self.report = tmp_path / "report"
        self.report.mkdir()
        self.tmp_path = tmp_path
        self.rdzv_port = unshared_port()
        (tmp_path / "tmp").mkdir()
        self.common = {
            **os.environ,
            "TMPDIR": str(tmp_path / "tmp"),  # torchrun's agent leaves a torchelastic_* folder
            "VERIRL_VLLM_HOST": "127.0.0.1",
            "VERIRL_VLLM_PORT": str(vllm_port),
            "VERIRL_GPU_COUNT": "1",
            "VERIRL_ENV_SERVER_URL": env_server.url,
            "VERIRL_HUB_REPO_ID": REPO,
            "VERIRL_HUB_ENDPOINT": hub.endpoint,
            "VERIRL_RESUME_FROM_CHECKPOINT": "auto",  # the same on the first attempt and retries
            "PYTHONUNBUFFERED": "1",
            "HF_HUB_OFFLINE": "0",  # the engine session sets it; the fake Hub is local
        }
        self.agents: list[subprocess.Popen[bytes]] = []

    def start(self, steps: int, *, under_launch: bool = False) -> None:
        """Start both agents; ``under_launch``: each rank is ``verirl launch -- python rank.py``."""
        script = [str(RANK_SCRIPT), "--report", str(self.report), "--steps", str(steps)]
        if under_launch:
            script = ["--no-python", sys.executable, "-m", "verirl", "launch", "--",
                      sys.executable, *script]  # fmt: skip
        for node in range(NODES):
            out = self.tmp_path / f"node{node}" / "out"
            out.mkdir(parents=True)
            log = (self.tmp_path / f"agent{node}.log").open("wb")
            command = [
                sys.executable, "-m", "torch.distributed.run",
                "--nnodes", str(NODES), "--node-rank", str(node),
                "--nproc-per-node", str(PER_NODE),
                "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{self.rdzv_port}",
                "--rdzv-id", "verirl-multinode-test", "--max-restarts", "0", *script,
            ]  # fmt: skip
            env = {**self.common, "VERIRL_OUTPUT_DIR": str(out)}
            self.agents.append(
                subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT)
            )
            log.close()
            if node == 0:  # the first node hosts the rendezvous store, as a real head node does
                wait_listening(self.rdzv_port, DEADLINE)

    def logs(self) -> str:
        return "\n".join(
            f"--- agent {n} ---\n" + (self.tmp_path / f"agent{n}.log").read_text(errors="replace")
            for n in range(NODES)
        )

    def reports(self, count: int, timeout: float) -> list[dict[str, object]]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            files = sorted(self.report.glob("rank-*.json"))
            if len(files) >= count:
                return [json.loads(path.read_text()) for path in files]
            if any(agent.poll() is not None for agent in self.agents) and len(files) < count:
                time.sleep(0.5)  # let the others report before giving up
                if len(sorted(self.report.glob("rank-*.json"))) < count:
                    break
            time.sleep(0.05)
        pytest.fail(f"{count} ranks did not report within {timeout}s\n{self.logs()}")

    def wait(self, timeout: float) -> list[int]:
        codes = []
        deadline = time.monotonic() + timeout
        for agent in self.agents:
            try:
                codes.append(agent.wait(timeout=max(deadline - time.monotonic(), 0.1)))
            except subprocess.TimeoutExpired:
                pytest.fail(f"agent {agent.pid} still runs after {timeout}s\n{self.logs()}")
        return codes

    def close(self) -> None:
        for agent in self.agents:
            stop(agent, signal.SIGKILL)


@contextlib.contextmanager
def checkpoint_hub() -> Iterator[FakeHub]:
    """A fake Hub with checkpoint-10, checkpoint-20 and an incomplete checkpoint-30."""
    with FakeHub() as hub:
        hub.add_checkpoint(REPO, "checkpoint-10", 10, size=2048)
        hub.add_checkpoint(REPO, "checkpoint-20", 20, size=8192)
        hub.add_checkpoint(REPO, "checkpoint-30", 30, complete=False)  # cut short by a kill
        yield hub


def check_shared_start(
    cluster: Cluster, hub: FakeHub, vllm_port: int, *, under_launch: bool = False
) -> None:
    """Run 3 all-reduce steps on 4 ranks; check what every rank got and what the Hub served."""
    cluster.start(steps=3, under_launch=under_launch)
    assert cluster.wait(DEADLINE) == [0, 0], cluster.logs()
    reports = cluster.reports(NODES * PER_NODE, timeout=5)
    assert sorted(r["rank"] for r in reports) == [0, 1, 2, 3]
    assert {r["world_size"] for r in reports} == {NODES * PER_NODE}
    assert {r["all_reduce"] for r in reports} == {0.0 + 1 + 2 + 3}  # a real gloo all_reduce
    assert {r["server_url"] for r in reports} == {f"http://127.0.0.1:{vllm_port}"}
    assert all(r["vllm_healthy"] for r in reports)
    by_node: dict[object, set[object]] = {}
    for r in reports:
        by_node.setdefault(r["node_rank"], set()).add(r["resume_from_checkpoint"])
    assert sorted(by_node) == [0, 1]
    # Each node resumes from its own download of checkpoint-20 (30 is incomplete).
    paths = [next(iter(p)) for p in by_node.values()]
    assert all(len(p) == 1 for p in by_node.values()), by_node
    assert [Path(str(p)).name for p in paths] == ["checkpoint-20", "checkpoint-20"]
    assert len(set(paths)) == NODES  # two nodes, two disks
    # The Hub served the checkpoint's bytes exactly once per node, and was listed once per node.
    assert hub.bytes_served == NODES * hub.folder_size(REPO, "checkpoint-20")
    assert sum("/tree/" in path for _, path in hub.requests) == NODES
    pids = [psutil.Process(r["pid"]) for r in reports if psutil.pid_exists(r["pid"])]
    assert still_alive(pids, timeout=10) == []

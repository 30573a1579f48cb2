"""The multi-node layout of tests/multinode with the real vLLM engine on the vLLM node.

Two torchrun agents (gloo, CPU torch) as two training nodes, each rank
through `TrainingRuntime` with a remote vLLM host: the vLLM node is
``verirl serve --dedicated`` running vLLM's own server on the tiny model.
"""

from __future__ import annotations

import shlex
from pathlib import Path

from engine_support import ENGINE_ENV, ENGINE_STARTUP_TIMEOUT
from tiny_model import MAX_MODEL_LEN, SERVE_ARGS

from _cluster import Cluster, check_shared_start, checkpoint_hub, vllm_node
from fakes import FakeEnvServer


def test_four_ranks_on_two_nodes_against_the_real_engine(tiny_model: Path, tmp_path: Path):
    serve_flags = ("--max-model-len", str(MAX_MODEL_LEN), "--vllm-args", shlex.join(SERVE_ARGS))
    with (
        vllm_node(
            tmp_path, str(tiny_model), *serve_flags, env=ENGINE_ENV, timeout=ENGINE_STARTUP_TIMEOUT
        ) as port,  # fmt: skip
        checkpoint_hub() as hub,
        FakeEnvServer(ready_after=0.5) as env_server,
    ):
        cluster = Cluster(tmp_path, hub, env_server, port)
        try:
            check_shared_start(cluster, hub, port)
        finally:
            cluster.close()

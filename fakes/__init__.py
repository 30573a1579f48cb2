"""Test doubles for verirl: GPU-free, network-free, and real where it matters.

Each fake implements the same interface as the verirl component it stands in
for, and is injected through the constructor::

    from fakes import FakeEnvServer
    from verirl import HttpEnvServerProbe

    with FakeEnvServer(ready_after=0.2) as env:
        HttpEnvServerProbe(env.url).wait(timeout=5)
"""

from __future__ import annotations

from fakes.checkpoints import FakeCheckpointSource
from fakes.envserver import FakeEnvServer, FakeEnvServerProbe
from fakes.hub import FakeHub, isolated_hf_client, serve_fake_hub
from fakes.vllm import FakeVLLMServer

__all__ = [
    "FakeCheckpointSource",
    "FakeEnvServer",
    "FakeEnvServerProbe",
    "FakeHub",
    "FakeVLLMServer",
    "isolated_hf_client",
    "serve_fake_hub",
]

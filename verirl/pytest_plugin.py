"""pytest fixtures for testing verirl adapters with no GPU, no vLLM and no network.

Registered through the ``pytest11`` entry point, so installing verirl makes
them available in any test suite::

    def test_my_adapter(fake_runtime):
        with fake_runtime as session:
            assert session.grpo_kwargs["vllm_mode"] == "server"

Fixtures: `fake_env_server` (a healthy `FakeEnvServer`), `fake_vllm_command`
(argv of the fake vLLM server program, for `VLLMServer(command=...)`: vLLM's
API as TRL 1.x launches it, or TRL 0.2x's ``trl vllm-serve`` with
``env={"FAKE_VLLM_PROTOCOL": "trl-legacy"}``; see `fakes.vllm_serve`),
`fake_hub` (a started `FakeHub`, with huggingface_hub kept off the network),
`fake_runtime` (a `TrainingRuntime` wired to in-process fakes: a 2-GPU plan,
`FakeVLLMServer`, `FakeEnvServerProbe`, `FakeCheckpointSource` at step 10).

The plugin lives in ``verirl``, not in ``fakes``, and imports ``fakes`` only
inside a fixture that needs it: a project with a ``fakes`` package of its own
(a common name) must still be able to run pytest with verirl installed.
`import verirl` does not import this module.
"""

from __future__ import annotations

import sys
from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from fakes.envserver import FakeEnvServer
    from fakes.hub import FakeHub
    from verirl.runtime import ServerHandle, TrainingRuntime
    from verirl.topology import VLLMTopology

__all__ = ["fake_env_server", "fake_hub", "fake_runtime", "fake_vllm_command"]


@pytest.fixture
def fake_env_server() -> Iterator[FakeEnvServer]:
    """A loopback env server that answers ``GET /health`` with 200 at once."""
    from fakes.envserver import FakeEnvServer  # noqa: PLC0415 - only when used

    with FakeEnvServer() as server:
        yield server


@pytest.fixture
def fake_vllm_command() -> list[str]:
    """The fake vLLM server program's argv, to pass as ``VLLMServer(command=...)``."""
    return [sys.executable, "-m", "fakes.vllm_serve"]


@pytest.fixture
def fake_hub() -> Iterator[FakeHub]:
    """A started `FakeHub`; huggingface_hub may reach only loopback meanwhile."""
    from fakes.hub import serve_fake_hub  # noqa: PLC0415 - only when used

    with serve_fake_hub() as hub:
        yield hub


@pytest.fixture
def fake_runtime() -> TrainingRuntime:
    """A `TrainingRuntime` on fakes: 2-GPU server plan, checkpoint-10 to resume from.

    The distributed env is applied to a private dict, never to ``os.environ``.
    """
    # Only when used: see the module docstring.
    from fakes.checkpoints import FakeCheckpointSource  # noqa: PLC0415
    from fakes.envserver import FakeEnvServerProbe  # noqa: PLC0415
    from fakes.vllm import FakeVLLMServer  # noqa: PLC0415
    from verirl.checkpoints import CheckpointResolver  # noqa: PLC0415
    from verirl.distenv import DistributedEnv, avoided_ports, find_free_port  # noqa: PLC0415
    from verirl.runtime import TrainingRuntime  # noqa: PLC0415
    from verirl.topology import VLLMTopology  # noqa: PLC0415

    def factory(topology: VLLMTopology) -> ServerHandle:
        # Serving /health on its port: the runtime's watchdog polls it, and a fake that
        # answered nothing was declared dead after vllm_unresponsive_timeout (60 s).
        return FakeVLLMServer.from_topology(topology, model="fake/model", serve_http=True)

    environ: dict[str, str] = {}
    port = find_free_port()  # free now, bound only at start: MASTER_PORT must not pick it too
    return TrainingRuntime(
        VLLMTopology.plan(2, max_model_len=4096, port=port),
        model="fake/model",
        env_probe=FakeEnvServerProbe(),
        checkpoints=CheckpointResolver([FakeCheckpointSource(steps=[10])]),
        resume_from="latest",
        dist_env=DistributedEnv.single_node(environ=environ, avoid_ports=avoided_ports(port)),
        server_factory=factory,
        environ=environ,
    )

"""verirl: start, resume and tear down GRPO jobs (TRL + vLLM + a reward env server).

See the README for a tour. Nothing here imports torch, trl, vllm or transformers.

The names below are imported on first use (PEP 562), so ``import verirl`` costs
next to nothing: ``verirl.VLLMTopology`` loads `verirl.topology` and nothing
else, and requests, urllib3, psutil and huggingface_hub load only with what
needs them. Type checkers and IDEs read the ``TYPE_CHECKING`` block.
"""

from __future__ import annotations

from verirl._version import __version__

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy reads the name)
if TYPE_CHECKING:
    from verirl._launch import LaunchPlan
    from verirl._poll import Backoff
    from verirl.checkpoints import (
        Checkpoint,
        CheckpointResolver,
        CheckpointSource,
        HubCheckpointSource,
        LocalCheckpointSource,
    )
    from verirl.distenv import DistributedEnv, find_free_port
    from verirl.envserver import EnvServerProbe, HttpEnvServerProbe
    from verirl.errors import (
        CheckpointNotFoundError,
        CheckpointSourceError,
        ConfigError,
        EnvServerUnavailable,
        PortInUseError,
        VeriRLError,
        VLLMServerError,
        VLLMServerExited,
        VLLMServerUnavailable,
        VLLMServerUnresponsive,
        VLLMStartupTimeout,
    )
    from verirl.runtime import (
        CheckpointResolving,
        PhaseTiming,
        RuntimeSession,
        ServerFactory,
        ServerHandle,
        TrainingRuntime,
        resolver_from_settings,
        topology_from_settings,
    )
    from verirl.topology import ServerTopology, VLLMTopology, detect_gpu_count
    from verirl.vllm_server import VLLMServer

__all__ = [
    "Backoff",
    "Checkpoint",
    "CheckpointNotFoundError",
    "CheckpointResolver",
    "CheckpointResolving",
    "CheckpointSource",
    "CheckpointSourceError",
    "ConfigError",
    "DistributedEnv",
    "EnvServerProbe",
    "EnvServerUnavailable",
    "HttpEnvServerProbe",
    "HubCheckpointSource",
    "LaunchPlan",
    "LocalCheckpointSource",
    "PhaseTiming",
    "PortInUseError",
    "RuntimeSession",
    "ServerFactory",
    "ServerHandle",
    "ServerTopology",
    "TrainingRuntime",
    "VLLMServer",
    "VLLMServerError",
    "VLLMServerExited",
    "VLLMServerUnavailable",
    "VLLMServerUnresponsive",
    "VLLMStartupTimeout",
    "VLLMTopology",
    "VeriRLError",
    "__version__",
    "detect_gpu_count",
    "find_free_port",
    "resolver_from_settings",
    "topology_from_settings",
]

# The module each lazy name comes from: the same as the TYPE_CHECKING block above
# (tests/test_api.py holds the two together).
_SUBMODULES: dict[str, tuple[str, ...]] = {
    "verirl._launch": ("LaunchPlan",),
    "verirl._poll": ("Backoff",),
    "verirl.checkpoints": (
        "Checkpoint",
        "CheckpointResolver",
        "CheckpointSource",
        "HubCheckpointSource",
        "LocalCheckpointSource",
    ),
    "verirl.distenv": ("DistributedEnv", "find_free_port"),
    "verirl.envserver": ("EnvServerProbe", "HttpEnvServerProbe"),
    "verirl.errors": (
        "CheckpointNotFoundError",
        "CheckpointSourceError",
        "ConfigError",
        "EnvServerUnavailable",
        "PortInUseError",
        "VeriRLError",
        "VLLMServerError",
        "VLLMServerExited",
        "VLLMServerUnavailable",
        "VLLMServerUnresponsive",
        "VLLMStartupTimeout",
    ),
    "verirl.runtime": (
        "CheckpointResolving",
        "PhaseTiming",
        "RuntimeSession",
        "ServerFactory",
        "ServerHandle",
        "TrainingRuntime",
        "resolver_from_settings",
        "topology_from_settings",
    ),
    "verirl.topology": ("ServerTopology", "VLLMTopology", "detect_gpu_count"),
    "verirl.vllm_server": ("VLLMServer",),
}
_MODULE_OF = {name: module for module, names in _SUBMODULES.items() for name in names}


if not TYPE_CHECKING:  # type checkers see the imports above, and so reject a misspelt name

    def __getattr__(name: str) -> object:
        """Import a public name's module on first access, and keep the name here."""
        module = _MODULE_OF.get(name)
        if module is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        from importlib import import_module  # noqa: PLC0415 - not at start-up: only when needed

        value = getattr(import_module(module), name)
        globals()[name] = value
        return value


def __dir__() -> list[str]:
    """The public names, imported or not yet."""
    return list(__all__)

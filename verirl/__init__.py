"""verirl: start, resume and tear down GRPO jobs (TRL + vLLM + a reward env server).

See the README for a tour. Nothing here imports torch, trl, vllm or transformers.

The names below are imported on first use (PEP 562), so ``import verirl`` costs
next to nothing: ``verirl.VLLMTopology`` loads `verirl.topology` and nothing
else, and requests, urllib3, psutil and huggingface_hub load only with what
needs them. Type checkers and IDEs read the ``TYPE_CHECKING`` block.

``verirl.PreemptionCallback`` is a transformers ``TrainerCallback``: it is
reachable here on first use like the others, but not listed in ``__all__``, so
that ``from verirl import *`` never needs the ML stack. A few types that only
appear in signatures (``LaunchPlan``, ``ServerFactory``, …) stay reachable here
too, unlisted: ``__all__`` is what the docs use, and their home modules own them.
"""

from __future__ import annotations

from verirl._version import __version__

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy reads the name)
if TYPE_CHECKING:
    from verirl._poll import Backoff
    from verirl._settings import Settings
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
    from verirl.preemption import PreemptionCallback as PreemptionCallback
    from verirl.runtime import CheckpointResolving as CheckpointResolving
    from verirl.runtime import PhaseTiming as PhaseTiming
    from verirl.runtime import (
        RuntimeSession,
        ServerHandle,
        TrainingRuntime,
        resolver_from_settings,
        topology_from_settings,
    )
    from verirl.runtime import ServerFactory as ServerFactory
    from verirl.server.launch import LaunchPlan as LaunchPlan
    from verirl.topology import ServerTopology as ServerTopology
    from verirl.topology import VLLMTopology, detect_gpu_count
    from verirl.vllm_server import VLLMServer

__all__ = [
    "Backoff",
    "Checkpoint",
    "CheckpointNotFoundError",
    "CheckpointResolver",
    "CheckpointSource",
    "CheckpointSourceError",
    "ConfigError",
    "DistributedEnv",
    "EnvServerProbe",
    "EnvServerUnavailable",
    "HttpEnvServerProbe",
    "HubCheckpointSource",
    "LocalCheckpointSource",
    "PortInUseError",
    "RuntimeSession",
    "ServerHandle",
    "Settings",
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
    "verirl.server.launch": ("LaunchPlan",),
    "verirl._poll": ("Backoff",),
    "verirl._settings": ("Settings",),
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
# Names that need an optional dependency (transformers): resolved the same way, not in __all__.
_OPTIONAL: dict[str, str] = {"PreemptionCallback": "verirl.preemption"}
# Reachable for code written against them, not in __all__: types only signatures name.
_UNLISTED = frozenset(
    {"CheckpointResolving", "LaunchPlan", "PhaseTiming", "ServerFactory", "ServerTopology"}
)
_MODULE_OF = {name: module for module, names in _SUBMODULES.items() for name in names}
_MODULE_OF.update(_OPTIONAL)


if not TYPE_CHECKING:  # type checkers see the imports above, and so reject a misspelt name

    def __getattr__(name: str) -> object:
        """Import a public name's module on first access, and keep the name here."""
        module = _MODULE_OF.get(name)
        if module is None:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        from importlib import import_module  # noqa: PLC0415 - not at start-up: only when needed

        try:
            imported = import_module(module)
        except ModuleNotFoundError as exc:
            if name not in _OPTIONAL:
                raise
            msg = f"verirl.{name} needs {exc.name}: pip install trl (which installs it)"
            raise ImportError(msg, name=exc.name) from exc
        value = getattr(imported, name)
        globals()[name] = value
        return value


def __dir__() -> list[str]:
    """The public names, imported or not yet."""
    return list(__all__)

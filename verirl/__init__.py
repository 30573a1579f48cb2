"""verirl: start, resume and tear down GRPO jobs (TRL + vLLM + a reward env server).

See the README for a tour. Nothing here imports torch, trl, vllm or transformers.
"""

from __future__ import annotations

from verirl._poll import Backoff
from verirl._version import __version__
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
from verirl.topology import VLLMTopology, detect_gpu_count
from verirl.vllm_server import LaunchPlan, ServerTopology, VLLMServer

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
    "VLLMStartupTimeout",
    "VLLMTopology",
    "VeriRLError",
    "__version__",
    "detect_gpu_count",
    "find_free_port",
    "resolver_from_settings",
    "topology_from_settings",
]

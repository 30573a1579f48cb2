"""verirl: start, resume and tear down GRPO jobs (TRL + vLLM + a reward env server).

See the README for a tour. Nothing here imports torch, trl, vllm or transformers.
"""

from __future__ import annotations

__version__ = "0.1.0"

from verirl.errors import (
    CheckpointNotFoundError,
    CheckpointSourceError,
    ConfigError,
    EnvServerUnavailable,
    PortInUseError,
    VeriRLError,
    VLLMServerError,
    VLLMServerExited,
    VLLMStartupTimeout,
)

__all__ = [
    "CheckpointNotFoundError",
    "CheckpointSourceError",
    "ConfigError",
    "EnvServerUnavailable",
    "PortInUseError",
    "VLLMServerError",
    "VLLMServerExited",
    "VLLMStartupTimeout",
    "VeriRLError",
    "__version__",
]

"""The exit codes of ``verirl`` commands and the variables ``launch`` exports."""

from __future__ import annotations

import signal

from verirl import _defaults as defaults
from verirl.errors import (
    CheckpointNotFoundError,
    CheckpointSourceError,
    ConfigError,
    EnvServerUnavailable,
    VLLMServerError,
)

__all__ = [
    "EXIT_CHECKPOINT",
    "EXIT_CODES",
    "EXIT_CONFIG",
    "EXIT_ENV_SERVER",
    "EXIT_ERROR",
    "EXIT_OK",
    "EXIT_VLLM",
    "GRPO_KWARGS_VARIABLE",
    "LAUNCH_GRACE",
    "SHUTDOWN_TIMEOUT_VARIABLE",
    "SIGNALLED",
    "VLLM_URL_VARIABLE",
]


GRPO_KWARGS_VARIABLE = "VERIRL_GRPO_KWARGS"
VLLM_URL_VARIABLE = "VERIRL_VLLM_URL"

LAUNCH_GRACE = defaults.SHUTDOWN_TIMEOUT
"""Seconds ``launch`` gives its command after passing SIGTERM/SIGINT on, before SIGKILL.

Under the 30 s that Kubernetes (``terminationGracePeriodSeconds``' default)
and Modal give a preempted container: the command's last checkpoint must be
written, and verirl's own teardown done, before the platform's SIGKILL.
"""
SHUTDOWN_TIMEOUT_VARIABLE = "VERIRL_SHUTDOWN_TIMEOUT"

_POLL_INTERVAL = 0.5

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_CONFIG = 2
EXIT_ENV_SERVER = 3
EXIT_VLLM = 4
EXIT_CHECKPOINT = 5

EXIT_CODES: dict[type[BaseException], int] = {
    ConfigError: EXIT_CONFIG,
    EnvServerUnavailable: EXIT_ENV_SERVER,
    VLLMServerError: EXIT_VLLM,
    CheckpointNotFoundError: EXIT_CHECKPOINT,
    CheckpointSourceError: EXIT_CHECKPOINT,
}


def _exit_code(exc: BaseException) -> int:
    for kind, code in EXIT_CODES.items():
        if isinstance(exc, kind):
            return code
    return EXIT_ERROR


SIGNALLED = (128 + signal.SIGINT, 128 + signal.SIGTERM)
"""The exit codes of a run a signal ended."""

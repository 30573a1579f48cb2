"""The default of each setting, written once.

The settings declaration (`verirl._settings.Settings`: its variable, flag,
help and the docs' table), the components' own keyword defaults
(`verirl.VLLMServer`, `verirl.VLLMTopology`, `verirl.TrainingRuntime`) and
``verirl launch`` read them here, so that no two of them can disagree.
"""

from __future__ import annotations

__all__ = [
    "COLOCATE_MEMORY",
    "ENV_TIMEOUT",
    "FAILURE_GRACE",
    "MAX_MODEL_LEN",
    "MODE",
    "NODE_WAIT_TIMEOUT",
    "SERVER_MEMORY",
    "SERVER_SHUTDOWN_TIMEOUT",
    "SERVER_STARTUP_TIMEOUT",
    "SHUTDOWN_TIMEOUT",
    "VLLM_GPUS",
    "VLLM_OWN_PORT",
    "VLLM_PORT",
    "VLLM_STARTUP_TIMEOUT",
    "VLLM_UNRESPONSIVE_TIMEOUT",
]

ENV_TIMEOUT = 600.0
"""Seconds to wait for the env server to answer."""
MAX_MODEL_LEN = 8192
"""vLLM's max model length."""
MODE = "auto"
"""The layout: server mode with two or more GPUs, colocate with one."""
VLLM_GPUS = 1
"""GPUs given to vLLM in server mode (its tensor parallel size when colocated)."""
VLLM_PORT = 8001
"""The vLLM server's port."""
VLLM_OWN_PORT = 8000
"""``vllm serve``'s own default port: never picked for ``MASTER_PORT`` either."""
VLLM_STARTUP_TIMEOUT = 900.0
"""Seconds a vLLM server may take to become healthy under the runtime and the CLI.

A first start downloads the weights, loads them onto the GPUs and captures
CUDA graphs: 600 s (`verirl.VLLMServer`'s own default) was too short for a 70B
model.
"""
SERVER_STARTUP_TIMEOUT = 600.0
"""`verirl.VLLMServer`'s own ``startup_timeout`` (its public signature's default)."""
SERVER_SHUTDOWN_TIMEOUT = 30.0
"""`verirl.VLLMServer`'s ``shutdown_timeout``: its grace after SIGTERM, before SIGKILL."""
SERVER_MEMORY = 0.9
"""vLLM's ``gpu_memory_utilization`` in server mode (the GPUs are the server's own)."""
COLOCATE_MEMORY = 0.5
"""vLLM's ``gpu_memory_utilization`` when colocated (the trainer shares the GPU)."""
VLLM_UNRESPONSIVE_TIMEOUT = 60.0
"""Seconds without a healthy ``/health`` answer after which a live server counts as dead."""
FAILURE_GRACE = 120.0
"""Seconds a listening training loop gets to save and stop after the vLLM server failed, before
the main thread is interrupted anyway (a checkpoint of a few billion parameters with optimizer
state takes tens of seconds to write; a loop stuck in a collective never gets there)."""
NODE_WAIT_TIMEOUT = 3600.0
"""Seconds local ranks above 0 wait for local rank 0's checkpoint choice (a download may take
that long)."""
SHUTDOWN_TIMEOUT = 25.0
"""Seconds ``launch`` gives its command after passing SIGTERM/SIGINT on, before SIGKILL.

Under the 30 s that Kubernetes (``terminationGracePeriodSeconds``' default)
and Modal give a preempted container.
"""

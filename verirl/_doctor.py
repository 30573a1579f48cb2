"""``verirl doctor``'s table: what this machine has for a GRPO job.

Versions of the stack, what `VLLMServer` would launch, GPUs, whether the
ports are free, the env server's health and whether a Hub token is set
(never its value). Each row is a fact, read once; nothing is changed.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import sys

from verirl._launch import CLI_COMMAND_HINT, COMMAND_HINT, vllm_distribution
from verirl._net import port_is_free
from verirl._version import __version__
from verirl.distenv import DistributedEnv
from verirl.envserver import HttpEnvServerProbe
from verirl.errors import VeriRLError
from verirl.topology import TRL_GROUP_PORT, detect_gpu_count
from verirl.vllm_server import VLLMServer

__all__ = ["machine_report"]


def _version_of(distribution: str) -> str:
    if distribution == "vllm":
        found = vllm_distribution()
        if found is None:
            return "missing"
        return found.version if found.name == "vllm" else f"{found.version} ({found.name})"
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "missing"


def _launch_row() -> str:
    """What `VLLMServer` would run here, and why, or why it cannot."""
    try:
        plan = VLLMServer("MODEL").launch_plan()
    except VeriRLError as exc:  # in the command line's words: doctor is a command
        return f"cannot start: {str(exc).replace(COMMAND_HINT, CLI_COMMAND_HINT)}"
    return f"{plan.kind}: {plan.reason}"


def machine_report(
    *, vllm_port: int, probe: HttpEnvServerProbe | None, hub_token: str | None
) -> list[tuple[str, str]]:
    """The doctor's rows, (label, value), in the order printed."""
    rows: list[tuple[str, str]] = [
        ("python", f"{platform.python_version()} ({sys.executable})"),
        ("verirl", __version__),
    ]
    rows += [(name, _version_of(name)) for name in ("trl", "vllm", "torch", "transformers")]
    rows.append(("vLLM launch", _launch_row()))
    try:
        gpus = str(detect_gpu_count())
    except Exception as exc:  # noqa: BLE001 - a broken torch install is a finding, not a crash
        gpus = f"unknown: torch failed to load ({type(exc).__name__}: {exc})"
    rows.append(("GPUs visible", gpus))
    rows.append(("CUDA_VISIBLE_DEVICES", os.environ.get("CUDA_VISIBLE_DEVICES", "(unset)")))
    for label, port in (("vLLM port", vllm_port), ("TRL group port", TRL_GROUP_PORT)):
        rows.append((f"{label} {port}", "free" if port_is_free(port) else "IN USE"))
    if probe is not None:
        healthy = probe.check()
        rows.append((f"env server {probe.url}", "healthy" if healthy else "NOT reachable/healthy"))
    else:
        rows.append(("env server", "(no --env-url / VERIRL_ENV_SERVER_URL)"))
    token_set = bool(hub_token or os.environ.get("HUGGING_FACE_HUB_TOKEN"))
    rows.append(("Hub token", "set" if token_set else "not set"))
    dist = DistributedEnv.single_node()
    rows.append(
        ("launcher", "none" if "RANK" in dist.defaulted else f"rank {dist.rank}/{dist.world_size}")
    )
    return rows

"""Helpers of the real-engine tests: servers on the tiny model, process trees."""

from __future__ import annotations

import sys
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import psutil
from tiny_model import MAX_MODEL_LEN, SERVE_ARGS

from _support import unshared_port
from verirl import VLLMServer

FAKE_COMMAND = (sys.executable, "-m", "fakes.vllm_serve")
ENGINE_STARTUP_TIMEOUT = 300.0
ENGINE_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1"}


def engine_server(model: Path | str, log_dir: Path, **overrides: Any) -> VLLMServer:
    """A `VLLMServer` for the real engine on the CPU: the default launch, the tiny model's flags."""
    settings: dict[str, Any] = {
        "devices": (0,),
        "port": unshared_port(),
        "max_model_len": MAX_MODEL_LEN,
        "extra_args": SERVE_ARGS,
        "env": ENGINE_ENV,
        "log_path": log_dir,
        "startup_timeout": ENGINE_STARTUP_TIMEOUT,
    }
    settings.update(overrides)
    return VLLMServer(str(model), **settings)


def fake_server(model: Path | str, log_dir: Path, **overrides: Any) -> VLLMServer:
    """The shipped fake under `VLLMServer`, with the same settings as `engine_server`."""
    return engine_server(model, log_dir, command=FAKE_COMMAND, **overrides)


def process_tree(pid: int) -> list[psutil.Process]:
    """``pid`` and every descendant (API server, EngineCore, Worker, resource tracker)."""
    root = psutil.Process(pid)
    return [root, *root.children(recursive=True)]


def names(processes: Iterable[psutil.Process]) -> list[str]:
    """Process names, for assertion messages ("" for one that is gone)."""
    found = []
    for process in processes:
        try:
            found.append(process.name())
        except psutil.Error:
            found.append("")
    return found

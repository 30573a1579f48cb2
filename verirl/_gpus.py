"""How many GPUs this process may use, read as torch reads them.

`detect_gpu_count` asks torch when it is installed (imported only then) and
otherwise reads ``CUDA_VISIBLE_DEVICES``; `check_visible_gpus` refuses a
count that variable does not make visible. Logged under the topology's logger.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Mapping

from verirl._fs import quoted
from verirl._validate import (
    check_environ,
)
from verirl.errors import ConfigError
from verirl.server.child_env import VISIBLE_DEVICES_VAR, parse_visible_devices

__all__ = ["check_visible_gpus", "detect_gpu_count"]

log = logging.getLogger("verirl.topology")  # the component users filter on


def detect_gpu_count(
    *,
    environ: Mapping[str, str] | None = None,
    cuda_device_count: Callable[[], int] | None = None,
) -> int:
    """Count the GPUs this process may use.

    Uses ``torch.cuda.device_count()`` (imported only here, lazily), which
    honours ``CUDA_VISIBLE_DEVICES``. Without torch, counts the GPUs
    ``CUDA_VISIBLE_DEVICES`` makes visible when it is set, read as torch reads
    it (`verirl.server.child_env.parse_visible_devices`: empty, ``-1`` or a repeated
    entry hide every GPU, an invalid entry ends the list), else returns 0
    with a log line.
    ``cuda_device_count`` replaces torch's counter (tests, other backends).
    """
    env = os.environ if environ is None else check_environ(environ)
    visible = env.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and not isinstance(visible, str):
        raise ConfigError.invalid("CUDA_VISIBLE_DEVICES", visible, "must be a string")
    listed = None if visible is None else parse_visible_devices(visible)  # torch's failures first
    if cuda_device_count is None:
        try:
            import torch  # noqa: PLC0415 - torch is heavy and optional
        except ImportError:
            pass
        else:
            cuda_device_count = torch.cuda.device_count
    if cuda_device_count is not None:
        count = int(cuda_device_count())
        log.debug("detected %d GPU(s) (CUDA_VISIBLE_DEVICES=%s)", count, visible)
        return count
    if visible is not None:
        count = len(listed or ())  # as torch reads it: "0,,1" is one GPU
        log.info("torch is not installed; CUDA_VISIBLE_DEVICES=%s makes %d GPU(s) visible",
                 quoted(visible), count)  # fmt: skip
        return count
    log.info("torch is not installed and CUDA_VISIBLE_DEVICES is unset: assuming 0 GPUs")
    return 0


def check_visible_gpus(gpu_count: int, environ: Mapping[str, str], *, field: str) -> None:
    """Refuse a GPU count that ``CUDA_VISIBLE_DEVICES`` (when set) does not make visible.

    A plan for 4 GPUs under ``CUDA_VISIBLE_DEVICES=0,1`` (or ``""``, or ``-1``,
    which hide every GPU) would hand out GPUs that are not there. ``field``
    names where the count came from (``--gpus``, ``VERIRL_GPU_COUNT``); the
    message names ``CUDA_VISIBLE_DEVICES`` and its value too.
    """
    visible = environ.get(VISIBLE_DEVICES_VAR)
    if visible is None:
        return
    listed = parse_visible_devices(visible)
    if gpu_count > len(listed):
        seen = "hides every GPU" if not listed else f"makes only {len(listed)} GPU(s) visible"
        raise ConfigError.invalid(
            field,
            gpu_count,
            f"{VISIBLE_DEVICES_VAR}={quoted(visible)} {seen} (read as torch reads it); "
            f"lower the count or change {VISIBLE_DEVICES_VAR}",
        )

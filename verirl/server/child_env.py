"""The vLLM server's environment: the trainer's, minus what would pull it into the trainer's job.

A server that inherits ``RANK``/``MASTER_PORT`` from a ``torchrun`` trainer
tries to join the trainer's process group; one that inherits the trainer's
``CUDA_VISIBLE_DEVICES`` sees the wrong GPUs. This module builds the child's
environment from the parent's without ever modifying the parent's.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Mapping

from verirl._fs import quoted
from verirl.errors import ConfigError

__all__ = [
    "SCRUBBED_ENV_PREFIXES",
    "SCRUBBED_ENV_VARS",
    "VISIBLE_DEVICES_VAR",
    "map_visible_devices",
    "parse_visible_devices",
    "vllm_child_environ",
]

VISIBLE_DEVICES_VAR = "CUDA_VISIBLE_DEVICES"

# Its records are the server's.
log = logging.getLogger("verirl.vllm_server")

SCRUBBED_ENV_VARS = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "ROLE_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
)
"""torch.distributed variables the server must not see: it would try to join the trainer's group."""

SCRUBBED_ENV_PREFIXES = ("TORCHELASTIC_",)
"""Prefixes of launcher variables dropped from the server's environment too."""


def _is_scrubbed(name: str) -> bool:
    return name in SCRUBBED_ENV_VARS or name.startswith(SCRUBBED_ENV_PREFIXES)


def _ordinal(entry: str, value: str) -> int:
    """The integer an entry starts with, as torch's ``_strtoul`` reads it.

    -1 if none (that ends the list); ``1gpu2`` is 1 (CUDA reads it as
    ``strtoul`` does). What torch would crash
    on (a lone sign) or read differently from CUDA (non-ASCII digits) is a
    `ConfigError` naming ``CUDA_VISIBLE_DEVICES``.
    """
    if not entry:
        return -1
    end = 0
    while end < len(entry) and (entry[end].isdigit() or (end == 0 and entry[end] in "+-")):
        end += 1
    prefix = entry[:end]
    if not prefix:
        return -1
    if not prefix.isascii() or not prefix.lstrip("+-"):
        raise ConfigError.invalid(
            VISIBLE_DEVICES_VAR,
            value,
            f"entry {quoted(entry)} is not a GPU index (ASCII digits) or a GPU-/MIG- UUID",
        )
    return int(prefix)


def _prefixed(value: str, prefix: str) -> tuple[str, ...]:
    found: list[str] = []
    for entry in value.split(","):
        if entry in found:
            return ()  # a repeated UUID hides every GPU
        if not entry.startswith(prefix):
            break  # anything else ends the list
        found.append(entry)
    return tuple(found)


def parse_visible_devices(value: str) -> tuple[str, ...]:
    """The GPUs ``CUDA_VISIBLE_DEVICES=value`` makes visible, in order, as torch reads it.

    Follows ``torch.cuda._parse_visible_devices``: a list of ``GPU-``/``MIG-``
    UUIDs (up to the first entry without the prefix), else of ordinals, each
    read as ``strtoul`` does (``1gpu2`` is 1, spaces are stripped), up to the
    first entry that is not one (empty, ``-1``, a name); a repeated entry
    hides every GPU, so does an empty value. Ordinals come back in canonical
    form (``+1`` → ``"1"``), UUIDs as given. Entries torch would fail on are a
    `ConfigError` naming ``CUDA_VISIBLE_DEVICES``.
    """
    if not isinstance(value, str):
        raise ConfigError.invalid(VISIBLE_DEVICES_VAR, value, "must be a string")
    for prefix in ("GPU-", "MIG-"):
        if value.startswith(prefix):
            return _prefixed(value, prefix)
    ordinals: list[int] = []
    for entry in value.split(","):
        ordinal = _ordinal(entry.strip(), value)
        if ordinal in ordinals:
            return ()  # a repeated ordinal hides every GPU
        if ordinal < 0:
            break
        ordinals.append(ordinal)
    return tuple(str(ordinal) for ordinal in ordinals)


def map_visible_devices(devices: Iterable[int], parent_visible: str | None) -> str:
    """``CUDA_VISIBLE_DEVICES`` for the child: ``devices`` index the GPUs the parent sees.

    With the parent's ``CUDA_VISIBLE_DEVICES=4,5,6,7``, ``devices=(1,)`` gives
    ``"5"`` (torch's numbering, which `verirl.VLLMTopology` uses; the parent's
    value is read as torch reads it, see `parse_visible_devices`). Unset in the
    parent, the indices pass through. An index past the GPUs the parent sees
    is a `ConfigError`.
    """
    chosen = tuple(devices)
    if parent_visible is None:
        return ",".join(str(device) for device in chosen)
    visible = parse_visible_devices(parent_visible)
    for device in chosen:
        if device >= len(visible):
            raise ConfigError.invalid(
                "devices",
                chosen,
                f"GPU index {device} is beyond the {len(visible)} GPU(s) this process sees "
                f"(CUDA_VISIBLE_DEVICES={quoted(parent_visible)})",
            )
    return ",".join(visible[device] for device in chosen)


def vllm_child_environ(
    environ: Mapping[str, str],
    *,
    devices: Iterable[int],
    env: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The server's environment: a scrubbed copy of ``environ``, then ``env`` on top.

    Drops `SCRUBBED_ENV_VARS` and ``TORCHELASTIC_*`` (a vLLM server that sees
    ``RANK``/``MASTER_PORT`` tries to join the trainer's process group), sets
    ``CUDA_VISIBLE_DEVICES`` (see `map_visible_devices`) and
    ``PYTHONUNBUFFERED=1`` (so the log file is current), then applies ``env``,
    which may override those two but never re-adds a scrubbed variable (that
    one is dropped with a warning). ``environ`` itself is not modified.
    """
    child = {name: value for name, value in environ.items() if not _is_scrubbed(name)}
    child["CUDA_VISIBLE_DEVICES"] = map_visible_devices(
        devices, environ.get("CUDA_VISIBLE_DEVICES")
    )
    child["PYTHONUNBUFFERED"] = "1"
    for name, value in (env or {}).items():
        if _is_scrubbed(name):
            log.warning(
                "not passing %s to the vLLM server: it must not join the trainer's group", name
            )
            continue
        child[name] = value
    return child

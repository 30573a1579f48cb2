"""`ServerHandle`: what verirl reads of a vLLM server, and the check that a handle has it all.

`verirl.VLLMServer` and `fakes.FakeVLLMServer` implement it; a
`ServerFactory` builds one for a topology (`verirl.TrainingRuntime`'s
``server_factory``).
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Protocol, runtime_checkable

from verirl.errors import ConfigError
from verirl.topology import VLLMTopology

__all__ = ["ServerFactory", "ServerHandle", "checked_handle", "missing_members"]


@runtime_checkable
class ServerHandle(Protocol):
    """What the runtime, its watchdog and the CLI read of a vLLM server.

    `verirl.VLLMServer` and `fakes.FakeVLLMServer` are the two. A server
    factory's handle must have every member: one without ``running`` could
    never be seen to die, so `TrainingRuntime` refuses it at start with a
    `ConfigError` naming what it lacks (see `missing_members`).
    """

    @property
    def base_url(self) -> str:
        """``http://host:port`` of the running server."""
        ...

    @property
    def pid(self) -> int | None:
        """The server process id while started, else ``None`` (a fake has none)."""
        ...

    @property
    def running(self) -> bool:
        """Started, and not exited: the watchdog and ``verirl serve`` watch it."""
        ...

    @property
    def returncode(self) -> int | None:
        """The exit status once the server exited on its own, else ``None``."""
        ...

    @property
    def log_path(self) -> Path | None:
        """The server's log file, if it has one."""
        ...

    def log_tail(self, lines: int = ...) -> str:
        """The last ``lines`` lines of the log: what an error about the server shows."""
        ...

    def start(self) -> None:
        """Launch and block until healthy; raise on failure, leaving nothing behind."""
        ...

    def stop(self) -> None:
        """Tear down; idempotent, and safe to call while `start` runs in another thread."""
        ...

    def cut_stop_short(self) -> None:
        """End the grace of a `stop` under way or about to be (a second interruption)."""
        ...

    def check_log(self) -> None:
        """What `start` would refuse about the log, as a `ConfigError`, found without writing."""
        ...


_HANDLE_MEMBERS = ("base_url", "pid", "running", "returncode", "log_path", "log_tail",
                   "start", "stop", "cut_stop_short", "check_log")  # fmt: skip


def missing_members(handle: object) -> tuple[str, ...]:
    """The `ServerHandle` members ``handle`` lacks, in the protocol's order."""
    return tuple(name for name in _HANDLE_MEMBERS if not hasattr(handle, name))


def checked_handle(handle: object, source: str = "server_factory") -> ServerHandle:
    """``handle`` if it has every `ServerHandle` member, else a `ConfigError` naming ``source``."""
    missing = missing_members(handle)
    if missing:
        kind = type(handle).__qualname__
        reason = (
            f"lacks {', '.join(missing)}; a ServerHandle has all of {', '.join(_HANDLE_MEMBERS)}"
        )
        raise ConfigError(
            f"{source} built a {kind}, which {reason}", field=source, value=kind, reason=reason
        )
    return handle  # type: ignore[return-value]


ServerFactory = Callable[[VLLMTopology], ServerHandle]
"""Builds the server for a local server-mode topology."""

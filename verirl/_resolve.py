"""Name lookups with a deadline that a signal can interrupt.

`socket.getaddrinfo` takes no timeout, and a signal handler cannot cut it
short: with a DNS server that never answers, a lookup blocks the calling
thread for the resolver's own retries (10 s and more), whatever the request's
timeout, and a SIGTERM waits for it too. So the lookup runs in a daemon
thread and the caller waits for it with the time left (a wait a signal
handler's exception ends). Lookups of the same name that overlap share one
thread, so a poll against a name that never resolves does not pile them up.
IP literals and ``localhost`` are looked up in place: no DNS is asked.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import threading
from typing import Any

from verirl._fs import quoted

__all__ = ["AddrInfo", "LookupTimeoutError", "needs_dns", "resolve"]

AddrInfo = tuple[Any, Any, int, str, Any]
"""One entry of `socket.getaddrinfo`'s answer: family, type, proto, canonname, sockaddr."""

_Key = tuple[str, "int | str | None", int, int, int, int]


class LookupTimeoutError(TimeoutError):
    """A name lookup that did not finish within its timeout; ``host`` is the name asked."""

    def __init__(self, host: str, timeout: float) -> None:
        super().__init__(f"DNS lookup of {quoted(host)} timed out (timeout={timeout:g}s)")
        self.host = host
        self.timeout = timeout


def needs_dns(host: str) -> bool:
    """Whether looking ``host`` up may ask DNS: not for an IP literal or ``localhost``."""
    bare = host.strip("[]").lower().removesuffix(".")
    if bare == "localhost":
        return False
    try:
        ipaddress.ip_address(bare)
    except ValueError:
        return True
    return False


class _Lookup:
    """One `socket.getaddrinfo` call running in its thread, and what it gave."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.found: list[AddrInfo] = []
        self.error: BaseException | None = None


_lock = threading.Lock()
_in_flight: dict[_Key, _Lookup] = {}


def _reset_after_fork() -> None:
    """A forked child has no lookup threads: forget the parent's, and its lock's state."""
    global _lock  # noqa: PLW0603 - the module's one lock, made anew in the child
    _lock = threading.Lock()
    _in_flight.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_after_fork)


def _run(key: _Key, lookup: _Lookup) -> None:
    try:
        lookup.found = socket.getaddrinfo(*key)
    except BaseException as exc:  # noqa: BLE001 - handed to the waiting caller
        lookup.error = exc
    finally:
        with _lock:
            if _in_flight.get(key) is lookup:
                del _in_flight[key]
        lookup.done.set()


def _start(key: _Key) -> _Lookup:
    """The lookup of ``key`` under way (one already running is shared), started if none is."""
    with _lock:
        lookup = _in_flight.get(key)
        if lookup is not None:
            return lookup
        lookup = _Lookup()
        _in_flight[key] = lookup
    thread = threading.Thread(target=_run, args=(key, lookup), name="verirl-dns", daemon=True)
    try:
        thread.start()
    except BaseException:
        with _lock:
            if _in_flight.get(key) is lookup:
                del _in_flight[key]
        raise
    return lookup


def resolve(
    host: str,
    port: int | str | None,
    *,
    family: int = 0,
    kind: int = socket.SOCK_STREAM,
    flags: int = 0,
    timeout: float | None,
) -> list[AddrInfo]:
    """``socket.getaddrinfo(host, port, family, kind, 0, flags)``, given up after ``timeout`` s.

    ``timeout=None`` waits as long as the lookup takes (a signal still ends the wait).

    Raises `LookupTimeoutError` when the answer does not come in time (the
    lookup goes on in its daemon thread, and a later call for the same name
    waits for it rather than start another), and what `socket.getaddrinfo`
    raises (`socket.gaierror`) when it fails. The wait is one a signal
    handler's exception ends at once.
    """
    if not needs_dns(host):
        return socket.getaddrinfo(host, port, family, kind, 0, flags)
    if timeout is not None and timeout <= 0:
        raise LookupTimeoutError(host, 0.0)
    lookup = _start((host, port, family, kind, 0, flags))
    if not lookup.done.wait(timeout) and timeout is not None:
        raise LookupTimeoutError(host, timeout)
    error = lookup.error
    if error is None:
        return list(lookup.found)
    if isinstance(error, socket.gaierror):  # a fresh one: several callers may share this lookup
        raise socket.gaierror(error.errno, error.strerror) from None
    raise error

"""Local TCP addresses: where to connect for a bind address, and whether a port is free.

One copy of each, because several copies used to disagree: the vLLM server,
the topology (what TRL is told) and the runtime (rank 0 and the ranks above)
must reach a wildcard bind at the same address, and ``verirl doctor``, the
server's pre-spawn check and the distributed env's ``MASTER_PORT`` must agree
on what "free" means.
"""

from __future__ import annotations

import errno
import ipaddress
import os
import socket
from collections.abc import Collection

from verirl._secrets import redact_text
from verirl.errors import ConfigError, PortInUseError, VLLMServerError

__all__ = ["check_port_free", "connect_host", "find_free_port", "port_is_free", "url_host"]


def connect_host(host: str) -> str:
    """The address that reaches a server bound to ``host``: a wildcard means loopback.

    ``0.0.0.0`` (and ``""``) give ``127.0.0.1``, ``::`` gives ``::1`` (the same
    family, so an IPv6-only bind is reached); any other host is returned as
    it is. Bare, without brackets: see `url_host` for a URL.
    """
    if not host:
        return "127.0.0.1"
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        return host
    if not address.is_unspecified:
        return host
    return "::1" if address.version == 6 else "127.0.0.1"  # noqa: PLR2004 - the IP version


def url_host(host: str) -> str:
    """`connect_host` as a URL writes it: an IPv6 address in brackets."""
    connect = connect_host(host)
    return f"[{connect}]" if ":" in connect else connect


_BIND_LOOKUP_TIMEOUT = 30.0
"""Seconds a bind host's name may take to resolve (a DNS server that never answers)."""


def _bind_addresses(host: str, port: int) -> list[tuple[int, int, int, tuple[object, ...]]]:
    """The addresses binding ``host:port`` means, the name looked up within a deadline."""
    from verirl._resolve import LookupTimeoutError, resolve  # noqa: PLC0415 - threads, when used

    try:
        found = resolve(host, port, flags=socket.AI_PASSIVE, timeout=_BIND_LOOKUP_TIMEOUT)
    except LookupTimeoutError:
        raise ConfigError.invalid(
            "host",
            redact_text(host),
            f"cannot be resolved (timed out after {_BIND_LOOKUP_TIMEOUT:g}s)",
        ) from None
    except socket.gaierror as exc:
        raise ConfigError.invalid(
            "host", redact_text(host), f"cannot be resolved ({exc.strerror})"
        ) from None
    unique = dict.fromkeys(
        (family, kind, proto, address) for family, kind, proto, _, address in found
    )
    return list(unique)


def check_port_free(host: str, port: int) -> None:
    """Raise `PortInUseError` if a server could not bind ``host:port`` now.

    SO_REUSEADDR is set as uvicorn sets it, so that connections lingering in
    TIME_WAIT from a previous server do not count as "in use" while a socket
    that is listening does. A host that is no address of this machine (or
    cannot be resolved) is a `ConfigError`; another bind failure is a
    `VLLMServerError`.
    """
    addresses = _bind_addresses(host, port)
    unavailable = 0
    for family, kind, proto, address in addresses:
        try:
            probe = socket.socket(family, kind, proto)
        except OSError:  # e.g. no IPv6 on this kernel
            unavailable += 1
            continue
        with probe:
            if os.name == "posix":
                probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                probe.bind(address)
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    raise PortInUseError(port, host) from None
                if exc.errno != errno.EADDRNOTAVAIL:
                    raise VLLMServerError(
                        f"port={port}: cannot bind {host}: {exc.strerror}"
                    ) from exc
                unavailable += 1
    if unavailable == len(addresses):
        raise ConfigError.invalid("host", redact_text(host), "is not an address of this machine")


def port_is_free(port: int, *, host: str = "127.0.0.1") -> bool:
    """Whether a server could bind ``host:port`` now: `check_port_free` as a yes or no.

    A port that cannot be bound for another reason (a privileged port, say)
    is not free either; a host that is no address of this machine is still
    a `ConfigError`.
    """
    try:
        check_port_free(host, port)
    except VLLMServerError:  # PortInUseError included
        return False
    return True


def find_free_port(*, host: str = "127.0.0.1", avoid: Collection[int] = ()) -> int:
    """Return a TCP port the OS reports free on ``host``, never one in ``avoid``."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    while True:
        with socket.socket(family, socket.SOCK_STREAM) as sock:
            sock.bind((host, 0))
            port: int = sock.getsockname()[1]
        if port not in avoid:
            return port

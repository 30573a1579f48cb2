"""Ports and addresses of this machine that a job's settings must not collide with.

A caller's ``MASTER_PORT`` on the local vLLM server's port or TRL's group port,
or an env-server URL on this host at one of them (the vLLM server would
answer it), is a `ConfigError` before anything starts. Whether an address is
this machine's is read from the interfaces the kernel lists (``/proc``), not
guessed from its spelling.
"""

from __future__ import annotations

import ipaddress
import socket
import urllib.parse
from collections.abc import Iterator
from pathlib import Path

from verirl._secrets import redact_text
from verirl._validate import (
    host_address,
)
from verirl.distenv import DistributedEnv
from verirl.errors import (
    ConfigError,
)
from verirl.topology import TRL_GROUP_PORT, VLLMTopology

__all__ = ["check_master_port"]


def check_master_port(
    topology: VLLMTopology, dist: DistributedEnv, port_name: str | None = None
) -> None:
    """Refuse a ``MASTER_PORT`` that is a port a vLLM server binds on this host.

    torch's rendezvous store listens on ``MASTER_PORT``; the server started
    here, or a "remote" one whose host names this machine (``verirl serve``
    beside the job), listens on its port and, for TRL's weight sync, on
    TRL's group port. Two listeners on one port: one of them fails at
    start-up, or later.
    ``port_name``: where the server's port came from, when a variable gave it
    (an argument, a flag or the default is shown as the number alone).
    """
    where = _server_on_this_host(topology)
    if where is None:
        return
    raw = dist.variables.get("MASTER_PORT")
    try:
        master = int(raw) if raw is not None else None
    except ValueError:
        return
    named = f"{port_name}={topology.port}" if port_name and port_name.isupper() else None
    taken = _server_ports(topology, named)
    if master in taken:
        reason = (
            f"is {taken[master]}, which {where} listens on; "
            "set MASTER_PORT or the server's port to another"
        )
        raise ConfigError.invalid("MASTER_PORT", raw, reason)


def _server_on_this_host(topology: VLLMTopology) -> str | None:
    """How to name the vLLM server ``topology`` has on this machine; ``None``: it has none here."""
    if topology.is_local_server:
        return "the vLLM server started here"
    if topology.remote_host is not None and _names_this_host(topology.remote_host):
        return f"the vLLM server on this host ({topology.remote_host})"
    return None


def _server_ports(topology: VLLMTopology, named: str | None = None) -> dict[int, str]:
    """The ports ``topology``'s vLLM server listens on, each with how a message names it."""
    return {topology.port: f"the vLLM server's port ({named or topology.port})",
            TRL_GROUP_PORT: f"TRL's weight-sync group port ({TRL_GROUP_PORT})"}  # fmt: skip


def _names_this_host(host: str) -> bool:
    """Whether ``host`` (a name or an address, IPv6 in brackets or not) is this machine."""
    bare = host.strip("[]").lower().removesuffix(".")
    if bare == "localhost" or bare.endswith(".localhost") or bare == socket.gethostname().lower():
        return True
    address = host_address(bare)  # 0x7f000001, 0177.0.0.1, 127.1, 0: as the resolver reads them
    if address is None:
        return False
    return address.is_loopback or address.is_unspecified or _held_by_this_machine(address)


def _held_by_this_machine(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    """Whether ``address`` is one of this machine's own, as the kernel's tables list them.

    ``/proc/net/fib_trie`` (IPv4 ``host LOCAL`` routes) and
    ``/proc/net/if_inet6``: no name is resolved (a DNS lookup has no
    deadline here), and a bind is no proof (``ip_nonlocal_bind`` lets any
    address bind; multicast and broadcast ones bind too). Where a table
    cannot be read (a sandbox's /proc), a bind to a unicast address decides.
    """
    networks, unread = _local_networks()
    if any(address in network for network in networks):
        return True
    if address.version not in unread or address.is_multicast or address.is_unspecified:
        return False
    if isinstance(address, ipaddress.IPv4Address) and address.packed[-1] == 255:  # noqa: PLR2004
        return False  # a broadcast address, as a rule
    family = socket.AF_INET6 if address.version == 6 else socket.AF_INET  # noqa: PLR2004
    try:
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            probe.bind((str(address), 0))
    except OSError:
        return False
    return True


def _local_networks() -> tuple[list[ipaddress.IPv4Network | ipaddress.IPv6Network], set[int]]:
    """This machine's addresses (and local prefixes, 127.0.0.0/8), and the IP versions unread."""
    networks: list[ipaddress.IPv4Network | ipaddress.IPv6Network] = []
    unread: set[int] = set()
    tables = (("fib_trie", 4, _fib_trie_locals), ("if_inet6", 6, _if_inet6_addresses))
    for name, version, parse in tables:
        try:
            lines = Path(f"/proc/net/{name}").read_text().splitlines()
        except OSError:
            unread.add(version)
            continue
        networks.extend(parse(lines))
    return networks, unread


def _fib_trie_locals(lines: list[str]) -> Iterator[ipaddress.IPv4Network]:
    """The ``host LOCAL`` routes of ``/proc/net/fib_trie`` (each under its address line)."""
    address = None
    for line in lines:
        words = line.split()
        if len(words) == 2 and words[0] in ("|--", "+--"):  # noqa: PLR2004 - "|-- 192.0.2.2"
            address = words[1]
        elif address is not None and words[1:] == ["host", "LOCAL"]:
            try:
                network = ipaddress.IPv4Network(f"{address}{words[0]}", strict=False)
            except ValueError:  # one odd line, not every address after it
                continue
            yield network


def _if_inet6_addresses(lines: list[str]) -> Iterator[ipaddress.IPv6Network]:
    """The addresses of ``/proc/net/if_inet6`` (32 hex digits first on each line)."""
    for line in lines:
        words = line.split()
        try:
            address = ipaddress.IPv6Address(bytes.fromhex(words[0])) if words else None
        except ValueError:  # one odd line, not every address after it
            continue
        if address is not None:
            yield ipaddress.IPv6Network(address)


def _check_env_url_port(topology: VLLMTopology, url: str, name: str = "env_url") -> None:
    """Refuse an env-server URL on this host at a port the local vLLM server listens on.

    The env wait asks ``GET /health``, which verirl's own vLLM server answers
    too: the wait would pass with no env server running, and every reward
    request would go to vLLM.
    """
    where = _server_on_this_host(topology)
    if where is None:
        return
    try:
        parts = urllib.parse.urlsplit(url)
        host, port = parts.hostname or "", parts.port
    except (TypeError, ValueError):
        return  # the probe has refused it already, or it is a fake's
    if port is None:
        port = 443 if parts.scheme == "https" else 80
    taken = _server_ports(topology)
    if _names_this_host(host) and port in taken:
        answer = (
            "it would answer the env server's /health"
            if port == topology.port
            else "no env server can listen there"
        )
        reason = (
            f"is on {taken[port]} on this host, where {where} listens: "
            f"{answer}; give the env server's own address"
        )
        raise ConfigError.invalid(name, redact_text(url), reason)

"""Single-node ``torch.distributed`` variables that never trample a real launcher's.

TRL's trainer calls into ``torch.distributed`` even for one process, which
needs ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT``. The old
helper overwrote them with constants (port 29500 for every job on the host);
here a launcher's values win and a missing ``MASTER_PORT`` is a free port.
"""

from __future__ import annotations

import logging
import os
import re
import types
from collections.abc import Collection, Mapping, MutableMapping

import attrs

from verirl import _defaults as defaults
from verirl._fs import quoted
from verirl._net import find_free_port
from verirl._validate import (
    MAX_PORT,
    MAX_RANKS,
    check_environ,
    check_host,
    check_port,
    parse_int,
)
from verirl.errors import ConfigError
from verirl.topology import TRL_GROUP_PORT

__all__ = ["DistributedEnv", "avoided_ports", "find_free_port"]

log = logging.getLogger(__name__)

_ALLOC_VARS = ("PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF")
_DEFAULT_VLLM_PORTS = (defaults.VLLM_OWN_PORT, defaults.VLLM_PORT, TRL_GROUP_PORT)
_LAUNCHER_VARS = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
)
# The node's index and the node count: torchrun sets GROUP_RANK and GROUP_WORLD_SIZE,
# accelerate and others NODE_RANK. Kept as they are, never defaulted.
_NODE_VARS = ("GROUP_RANK", "NODE_RANK", "GROUP_WORLD_SIZE")


def avoided_ports(*ports: int) -> frozenset[int]:
    """The ports a free ``MASTER_PORT`` must never be: vLLM's defaults, TRL's group port, ``ports``.

    The runtime adds its own vLLM port, so that the port verirl picks for
    ``MASTER_PORT`` (free *now*, before the server binds) never equals it.
    """
    return frozenset((*_DEFAULT_VLLM_PORTS, *ports))


def _read_int(
    environ: Mapping[str, str], name: str, minimum: int, maximum: int = MAX_RANKS
) -> int | None:
    raw = environ.get(name)
    if raw is None:
        return None
    return parse_int(name, raw, minimum, maximum)


def _check_avoid(avoid_ports: object) -> frozenset[int]:
    reason = "must be a collection of port numbers"
    if isinstance(avoid_ports, (str, bytes)) or not isinstance(avoid_ports, Collection):
        raise ConfigError.invalid("avoid_ports", avoid_ports, reason)
    for port in avoid_ports:
        if isinstance(port, bool) or not isinstance(port, int):
            raise ConfigError.invalid("avoid_ports", avoid_ports, reason)
    return frozenset(avoid_ports)


def _frozen_mapping(value: Mapping[str, str]) -> Mapping[str, str]:
    return types.MappingProxyType(dict(value))


def _check_strings(env: Mapping[str, str]) -> None:
    for name in (*_LAUNCHER_VARS, *_NODE_VARS, *_ALLOC_VARS):
        if name in env and not isinstance(env[name], str):
            raise ConfigError.invalid(name, env[name], "must be a string")


@attrs.frozen
class _Launcher:
    """The ranks and sizes a launcher set (``None``: unset), checked against each other."""

    env: Mapping[str, str]
    rank: int | None
    local_rank: int | None
    world_size: int | None
    local_world_size: int | None
    group_rank: int | None = None
    node_rank: int | None = None
    group_world_size: int | None = None

    @classmethod
    def read(cls, env: Mapping[str, str]) -> _Launcher:
        _check_strings(env)
        launcher = cls(
            env,
            rank=_read_int(env, "RANK", 0),
            local_rank=_read_int(env, "LOCAL_RANK", 0),
            world_size=_read_int(env, "WORLD_SIZE", 1),
            local_world_size=_read_int(env, "LOCAL_WORLD_SIZE", 1),
            group_rank=_read_int(env, "GROUP_RANK", 0),
            node_rank=_read_int(env, "NODE_RANK", 0),
            group_world_size=_read_int(env, "GROUP_WORLD_SIZE", 1),
        )
        _read_int(env, "MASTER_PORT", 1, MAX_PORT)
        return launcher

    def check(self) -> None:
        """Raise `ConfigError` for ranks and sizes that contradict each other."""
        self.check_rank()
        self.check_local_rank()
        self.check_local_world_size()
        self.check_node()
        self.check_one_node()

    def check_node(self) -> None:
        """The node index against the node count, the other spelling and the global rank."""
        env, group_rank, nodes = self.env, self.group_rank, self.group_world_size
        if group_rank is not None and self.node_rank is not None and group_rank != self.node_rank:
            raise ConfigError.invalid(
                "NODE_RANK",
                env["NODE_RANK"],
                f"must equal GROUP_RANK={group_rank} (both name the node)",
            )
        node = group_rank if group_rank is not None else self.node_rank
        name = "GROUP_RANK" if group_rank is not None else "NODE_RANK"
        if node is not None and nodes is not None and node >= nodes:
            raise ConfigError.invalid(name, env[name], f"must be < GROUP_WORLD_SIZE={nodes}")
        world, local_world = self.world_size, self.local_world_size
        if nodes is not None and world is not None and nodes > world:
            raise ConfigError.invalid(
                "GROUP_WORLD_SIZE", env["GROUP_WORLD_SIZE"], f"must be <= WORLD_SIZE={world}"
            )
        if node is None or self.rank is None or self.local_rank is None or local_world is None:
            return
        # With the same number of ranks on every node (world = nodes x local), torchrun
        # and accelerate number a node's ranks from node * local_world_size.
        homogeneous = world is None or (
            nodes * local_world == world if nodes is not None else world % local_world == 0
        )
        if not homogeneous:
            return
        expected = node * local_world + self.local_rank
        if self.rank != expected:
            raise ConfigError.invalid(
                "RANK",
                env["RANK"],
                f"must be {name} * LOCAL_WORLD_SIZE + LOCAL_RANK = {node} * {local_world} + "
                f"{self.local_rank} = {expected} (check the launcher's --node-rank on each node)",
            )

    def check_one_node(self) -> None:
        """On one node, ``RANK`` is ``LOCAL_RANK``: a stale ``RANK`` from elsewhere is refused.

        One node: ``WORLD_SIZE == LOCAL_WORLD_SIZE`` (every rank is here), or
        ``GROUP_WORLD_SIZE=1`` (torchrun's node count), with no node index needed.
        """
        rank, local_rank = self.rank, self.local_rank
        if rank is None or local_rank is None or rank == local_rank:
            return
        world, local_world = self.world_size, self.local_world_size
        if self.group_world_size == 1:
            why = "GROUP_WORLD_SIZE=1"
        elif world is not None and world == local_world:
            why = f"WORLD_SIZE=LOCAL_WORLD_SIZE={world}"
        else:
            return
        raise ConfigError.invalid(
            "RANK",
            self.env["RANK"],
            f"must equal LOCAL_RANK={local_rank} on one node ({why}): a RANK left over from "
            "another job? let the launcher set both",
        )

    def check_rank(self) -> None:
        rank, world_size = self.rank, self.world_size
        if rank is None:
            return
        if world_size is not None and rank >= world_size:
            raise ConfigError.invalid(
                "RANK", self.env["RANK"], f"must be < WORLD_SIZE={world_size}"
            )
        if world_size is None and rank > 0:
            raise ConfigError.invalid("RANK", self.env["RANK"], "is set without WORLD_SIZE")

    def check_local_rank(self) -> None:
        local_rank, local_world_size = self.local_rank, self.local_world_size
        if local_rank is None:
            return
        raw = self.env["LOCAL_RANK"]
        if local_world_size is not None and local_rank >= local_world_size:
            raise ConfigError.invalid(
                "LOCAL_RANK", raw, f"must be < LOCAL_WORLD_SIZE={local_world_size}"
            )
        if local_world_size is None and local_rank > 0:
            raise ConfigError.invalid(
                "LOCAL_RANK",
                raw,
                "is set without LOCAL_WORLD_SIZE (a launcher sets both; LOCAL_RANK must be "
                "< LOCAL_WORLD_SIZE)",
            )

    def check_local_world_size(self) -> None:
        world_size, local_world_size = self.world_size, self.local_world_size
        if local_world_size is not None:
            raw = self.env["LOCAL_WORLD_SIZE"]
            if world_size is None and local_world_size > 1:
                raise ConfigError.invalid("LOCAL_WORLD_SIZE", raw, "is set without WORLD_SIZE")
            if world_size is not None and local_world_size > world_size:
                raise ConfigError.invalid(
                    "LOCAL_WORLD_SIZE", raw, f"must be <= WORLD_SIZE={world_size}"
                )
        if self.rank is not None and self.local_rank is not None and self.local_rank > self.rank:
            raise ConfigError.invalid(
                "LOCAL_RANK", self.env["LOCAL_RANK"], f"must be <= RANK={self.rank}"
            )

    def warn_unshared_defaults(self, env: Mapping[str, str]) -> None:
        """A multi-rank job without a rendezvous address: our default reaches no other rank."""
        if self.world_size is None or self.world_size <= 1:
            return
        for name in ("MASTER_ADDR", "MASTER_PORT"):
            if name not in env:
                log.warning(
                    "WORLD_SIZE=%d but %s is unset: filling in a single-node default, "
                    "which other ranks will not share; let the launcher set it",
                    self.world_size,
                    name,
                )


def _defaults(
    env: Mapping[str, str], master_port: int | None, avoid: frozenset[int]
) -> dict[str, str]:
    """The single-node values for what ``env`` lacks (``MASTER_PORT`` only if missing)."""
    defaults: dict[str, str] = {
        "RANK": "0",
        "LOCAL_RANK": "0",
        "WORLD_SIZE": "1",
        "LOCAL_WORLD_SIZE": "1",
        "MASTER_ADDR": "127.0.0.1",
    }
    if not any(name in env for name in _ALLOC_VARS):
        defaults["PYTORCH_CUDA_ALLOC_CONF"] = "expandable_segments:True"
    if "MASTER_PORT" not in env:
        port = master_port if master_port is not None else find_free_port(avoid=avoid)
        defaults["MASTER_PORT"] = str(port)
    return defaults


# What torchrun's agent sets besides the ranks: with no launcher, a value was left by another job
# (torch.distributed.is_torchelastic_launched() reads TORCHELASTIC_RUN_ID).
_AGENT_VARS = ("ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME")
_AGENT_PREFIX = "TORCHELASTIC_"
_LOOPBACK_NAMES = frozenset({"127.0.0.1", "localhost", "::1"})


def _stale_launcher_variables(env: Mapping[str, str]) -> frozenset[str]:
    """A launcher's variables in ``env`` that no launcher set for this process (it has none).

    Logged once each: ``MASTER_ADDR`` (this process's rendezvous is with
    itself, on 127.0.0.1: another address would wait for a peer that never
    comes) and torchrun's agent's own variables, which are removed.
    """
    address = env.get("MASTER_ADDR")
    if address is not None and address.strip() not in _LOOPBACK_NAMES:
        log.warning(
            "MASTER_ADDR=%s is ignored: no launcher set WORLD_SIZE, so this is one process "
            "that meets only itself, on 127.0.0.1",
            quoted(address),
        )
    stale = frozenset(name for name in env if name.startswith(_AGENT_PREFIX) or name in _AGENT_VARS)
    if stale:
        log.warning(
            "removed %s: torchrun's agent sets them, and none started this process "
            "(WORLD_SIZE is unset)",
            ", ".join(sorted(stale)),
        )
    return stale


def _check_filled(variables: Mapping[str, str], filled: set[str]) -> None:
    """The launcher's values with verirl's defaults must pass the same checks as given ones.

    ``LOCAL_RANK=1 LOCAL_WORLD_SIZE=2 WORLD_SIZE=2`` without ``RANK`` would get
    ``RANK=0``, which contradicts ``LOCAL_RANK=1``: that is a `ConfigError`
    naming the variable left unset, never a combination the checks refuse.
    """
    if not filled & set(_LAUNCHER_VARS[:4]):
        return
    try:
        launcher = _Launcher.read(variables)
        launcher.check()
        _refuse_unknown_local_rank(launcher, filled)
    except ConfigError as exc:
        missing = [name for name in _LAUNCHER_VARS[:4] if name in filled]  # ranks and sizes
        given = [
            n for n in (*_LAUNCHER_VARS[:4], *_NODE_VARS) if n in variables and n not in filled
        ]
        message = str(exc)
        mentioned = [n for n in given if re.search(rf"(?<![A-Z_]){n}(?![A-Z_])", message)]
        name = exc.field if exc.field in given else (mentioned or given or missing)[0]
        defaults = ", ".join(f"{n}={variables[n]}" for n in missing)
        reason = (
            f"contradicts verirl's single-node default(s) for what the launcher left unset "
            f"({defaults}): {message}; set {' and '.join(missing)} as the "
            "launcher should"
        )
        value = variables.get(name)
        raise ConfigError(f"{name}={quoted(value)}: {reason}", field=name, value=value,
                          reason=reason) from None  # fmt: skip


def _refuse_unknown_local_rank(launcher: _Launcher, filled: set[str]) -> None:
    """A ``RANK`` past 0 with several ranks a node and no ``LOCAL_RANK``: which one is unknown.

    The default ``LOCAL_RANK=0`` would make this process act as its node's
    first rank (start the node's vLLM server, lead the checkpoint choice)
    beside the real one. On one node the checks already refuse it.
    """
    rank, local_world = launcher.rank, launcher.local_world_size
    if "LOCAL_RANK" not in filled or "RANK" in filled or not rank or (local_world or 1) <= 1:
        return
    raise ConfigError.invalid(
        "RANK",
        launcher.env["RANK"],
        f"with LOCAL_WORLD_SIZE={local_world} does not tell which rank of its node this is",
    )


@attrs.frozen
class DistributedEnv:
    """The ``torch.distributed`` variables a trainer process should run with.

    ``variables`` holds every value (the launcher's and the defaults),
    ``defaulted`` the names verirl filled in.
    """

    variables: Mapping[str, str] = attrs.field(converter=_frozen_mapping, hash=False)
    defaulted: frozenset[str] = frozenset()
    removed: frozenset[str] = frozenset()
    """Variables a launcher sets that `apply` removes: left from another job, none ran this one."""

    @classmethod
    def single_node(
        cls,
        *,
        environ: Mapping[str, str] | None = None,
        master_port: int | None = None,
        avoid_ports: Collection[int] = _DEFAULT_VLLM_PORTS,
    ) -> DistributedEnv:
        """Read ``environ`` (default ``os.environ``) and fill in what a launcher did not set.

        Defaults: ``RANK=0``, ``LOCAL_RANK=0``, ``WORLD_SIZE=1``,
        ``LOCAL_WORLD_SIZE=1``, ``MASTER_ADDR=127.0.0.1``, ``MASTER_PORT``
        = ``master_port`` or a free port outside ``avoid_ports`` (the vLLM
        server ports and TRL's group port), and
        ``PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True`` unless an
        allocator config is set. Inconsistent launcher values raise `ConfigError`.
        """
        env = os.environ if environ is None else check_environ(environ)
        avoid = _check_avoid(avoid_ports)
        launcher = _Launcher.read(env)
        if master_port is not None:
            master_port = check_port("master_port", master_port)
        launcher.check()
        if "MASTER_ADDR" in env:
            check_host("MASTER_ADDR", env["MASTER_ADDR"].strip())
        launcher.warn_unshared_defaults(env)
        defaults = _defaults(env, master_port, avoid)
        variables: dict[str, str] = {}
        filled: set[str] = set()
        for name in (*defaults, "MASTER_PORT", *_NODE_VARS, *_ALLOC_VARS):
            if name in env:
                variables[name] = env[name]
            elif name in defaults:
                variables[name] = defaults[name]
                filled.add(name)
        _check_filled(variables, filled)
        stale: frozenset[str] = frozenset()
        if "WORLD_SIZE" in filled:  # no launcher: one process, which meets only itself
            stale = _stale_launcher_variables(env)
            filled.add("MASTER_ADDR")
            variables["MASTER_ADDR"] = defaults["MASTER_ADDR"]
        return cls(variables=variables, defaulted=frozenset(filled), removed=stale)

    @property
    def rank(self) -> int:
        """Global rank of this process."""
        return int(self.variables["RANK"])

    @property
    def local_rank(self) -> int:
        """Rank of this process on its node."""
        return int(self.variables["LOCAL_RANK"])

    @property
    def world_size(self) -> int:
        """Number of trainer processes in the job."""
        return int(self.variables["WORLD_SIZE"])

    @property
    def local_world_size(self) -> int:
        """Number of trainer processes on this node."""
        return int(self.variables["LOCAL_WORLD_SIZE"])

    @property
    def node_rank(self) -> int:
        """Index of this node in the job (``GROUP_RANK`` or ``NODE_RANK``; 0 when unset)."""
        for name in ("GROUP_RANK", "NODE_RANK"):
            if name in self.variables:
                return int(self.variables[name])
        return 0

    @property
    def is_local_main(self) -> bool:
        """True on local rank 0, the process that owns node-wide work like the vLLM server."""
        return self.local_rank == 0

    def apply(self, environ: MutableMapping[str, str] | None = None) -> None:
        """Write the variables into ``environ`` (default ``os.environ``) before CUDA starts."""
        target = os.environ if environ is None else environ
        check_environ(target, mutable=True)
        for name in self.removed:
            target.pop(name, None)
        target.update(self.variables)

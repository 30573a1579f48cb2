"""Run the vLLM server TRL expects for the length of a ``with`` block; leave no process behind.

::

    from verirl import VLLMServer

    with VLLMServer("Qwen/Qwen3-0.6B", devices=(1,), max_model_len=4096) as server:
        trainer.train()  # GRPOConfig(vllm_server_port=server.port, ...)

What runs is what the installed TRL would run (see `VLLMServer.launch_plan`):
with TRL 1.x, vLLM's own OpenAI-compatible server with the flags TRL's
``build_command`` adds and ``VLLM_SERVER_DEV_MODE=1``; with TRL 0.2x,
``trl vllm-serve``; with ``command=``, that program.

`VLLMServer.start` (what ``with`` calls) refuses a port that is already bound,
launches the server in its own session with a scrubbed environment, its output
in a log file, and waits until ``GET /health`` answers 200 from a socket that
the server's own process tree listens on (not from another server that bound
the port meanwhile). `VLLMServer.stop`
(what leaving the block calls, whatever the reason) sends SIGTERM to the
server's process group and to every descendant that left it, waits up to
``shutdown_timeout`` and SIGKILLs what is left.

If the trainer dies first, the server goes too: on Linux the child asks the
kernel for SIGTERM when its parent dies (``PR_SET_PDEATHSIG``), which covers a
SIGKILLed trainer, and while a server runs a SIGTERM sent to the trainer (a
preemption) raises ``SystemExit(143)`` in the main thread so that the ``with``
block unwinds and the full teardown runs (the one policy of `verirl._signals`:
a handler the program installed is kept, and is what runs).
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import errno
import functools
import logging
import os
import queue
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import types
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping
from concurrent.futures import Future
from concurrent.futures import wait as wait_futures
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

import attrs
import psutil
import requests

from verirl._launch import (
    INSTALL_HINT,
    LaunchPlan,
    find_trl_command,
    import_trl_serve,
    plan_launch,
    redact_argv,
    vllm_distribution,
)
from verirl._poll import Backoff, poll
from verirl._serve_args import vllm_serve_args
from verirl._signals import SIGTERM_POLICY
from verirl._validate import (
    MAX_GPUS,
    MAX_LENGTH,
    check_host,
    check_int,
    check_number,
    check_port,
    check_seconds,
    check_text,
    has_control_chars,
)
from verirl.envserver import deadline_session, request_health
from verirl.errors import (
    ConfigError,
    PortInUseError,
    VLLMServerError,
    VLLMServerExited,
    VLLMStartupTimeout,
)

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = [
    "INSTALL_HINT",
    "MARKER_VAR",
    "SCRUBBED_ENV_PREFIXES",
    "SCRUBBED_ENV_VARS",
    "LaunchPlan",
    "ServerTopology",
    "VLLMServer",
    "death_signal_preexec",
    "find_trl_command",
    "map_visible_devices",
    "read_log_tail",
    "vllm_child_environ",
]

log = logging.getLogger(__name__)

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

MARKER_VAR = "VERIRL_VLLM_SERVER_MARKER"
"""Set in every server's environment (inherited by its workers), so teardown finds orphans."""
_LOG_TAIL_LINES = 40
_LOG_TAIL_BYTES = 64 * 1024
_REQUEST_TIMEOUT_CAP = 5.0
_KILL_WAIT = 5.0
_PR_SET_PDEATHSIG = 1
_BACKOFF = Backoff(initial=0.02, factor=2.0, cap=1.0)


# ---------------------------------------------------------------- protocols


class ServerTopology(Protocol):
    """What `VLLMServer.from_topology` reads; `verirl.VLLMTopology` provides it."""

    @property
    def mode(self) -> str:
        """``"server"`` or ``"colocate"``."""

    @property
    def is_local_server(self) -> bool:
        """Whether this machine runs the vLLM server itself."""

    @property
    def vllm_devices(self) -> tuple[int, ...]:
        """GPU indices (as this process numbers them) for vLLM."""

    @property
    def host(self) -> str:
        """Address the server binds."""

    @property
    def port(self) -> int:
        """Port the server binds."""

    @property
    def max_model_len(self) -> int:
        """The ``--max-model-len`` flag."""

    @property
    def gpu_memory_utilization(self) -> float:
        """The ``--gpu-memory-utilization`` flag."""

    @property
    def tensor_parallel_size(self) -> int:
        """The ``--tensor-parallel-size`` flag."""

    @property
    def data_parallel_size(self) -> int:
        """The ``--data-parallel-size`` flag."""


# ---------------------------------------------------------------- pure helpers


def _is_scrubbed(name: str) -> bool:
    return name in SCRUBBED_ENV_VARS or name.startswith(SCRUBBED_ENV_PREFIXES)


def map_visible_devices(devices: Iterable[int], parent_visible: str | None) -> str:
    """``CUDA_VISIBLE_DEVICES`` for the child: ``devices`` index the GPUs the parent sees.

    With the parent's ``CUDA_VISIBLE_DEVICES=4,5,6,7``, ``devices=(1,)`` gives
    ``"5"`` (torch's numbering, which `verirl.VLLMTopology` uses). Unset in the
    parent, the indices pass through. An index past the parent's list is a
    `ConfigError`.
    """
    chosen = tuple(devices)
    if parent_visible is None:
        return ",".join(str(device) for device in chosen)
    visible = [entry.strip() for entry in parent_visible.split(",") if entry.strip()]
    for device in chosen:
        if device >= len(visible):
            raise ConfigError.invalid(
                "devices",
                chosen,
                f"GPU index {device} is beyond the {len(visible)} GPU(s) this process sees "
                f"(CUDA_VISIBLE_DEVICES={parent_visible!r})",
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


def read_log_tail(path: Path | str, *, lines: int = _LOG_TAIL_LINES, start: int = 0) -> str:
    """The last ``lines`` lines of the log at ``path`` from byte offset ``start`` ("" if none)."""
    try:
        with Path(path).open("rb") as handle:
            size = handle.seek(0, os.SEEK_END)
            begin = max(start, size - _LOG_TAIL_BYTES)
            handle.seek(begin)
            data = handle.read()
    except OSError:
        return ""
    text = data.decode("utf-8", errors="replace")
    kept = text.splitlines()
    if begin > start and kept:  # the first line was cut by the byte window
        kept = kept[1:]
    return "\n".join(kept[-lines:]) + ("\n" if kept else "")


def _connect_host(host: str) -> str:
    """The address to reach a server bound to ``host`` (a wildcard means loopback)."""
    if host in ("0.0.0.0", ""):  # noqa: S104 - mapping the wildcard to loopback, not binding it
        return "127.0.0.1"
    if host == "::":
        return "[::1]"
    return f"[{host}]" if ":" in host else host


def _check_port_free(host: str, port: int) -> None:
    """Raise `PortInUseError` if ``host:port`` cannot be bound.

    SO_REUSEADDR is set as uvicorn sets it, so that connections lingering in
    TIME_WAIT from a previous server do not count as "in use" while a socket
    that is listening does.
    """
    try:
        addresses = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    except socket.gaierror as exc:
        raise ConfigError.invalid("host", host, f"cannot be resolved ({exc.strerror})") from None
    unavailable: list[str] = []
    for family, kind, proto, _, address in dict.fromkeys(
        (family, kind, proto, "", address) for family, kind, proto, _, address in addresses
    ):
        try:
            probe = socket.socket(family, kind, proto)
        except OSError:  # e.g. no IPv6 on this kernel
            unavailable.append(str(address[0]))
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
                unavailable.append(str(address[0]))
    if len(unavailable) == len(addresses):
        raise ConfigError.invalid("host", host, "is not an address of this machine")


# ---------------------------------------------------------------- converters, validators


def _unportable(text: str) -> str | None:
    """Why ``text`` cannot be passed in argv or the environment, or ``None`` if it can."""
    if "\x00" in text:
        return "contains a null byte, which a command line or environment cannot carry"
    try:
        os.fsencode(text)
    except UnicodeEncodeError:
        return "contains a character that cannot be encoded for a command line (a lone surrogate)"
    return None


def _to_devices(value: Iterable[int]) -> tuple[int, ...]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise ConfigError.invalid("devices", value, "must be a sequence of GPU indices, e.g. (1,)")
    items: tuple[object, ...] = tuple(value)
    if not items:
        raise ConfigError.invalid("devices", value, "must name at least one GPU")
    devices: list[int] = []
    for item in items:
        if isinstance(item, bool) or not isinstance(item, int) or not 0 <= item < MAX_GPUS:
            raise ConfigError.invalid(
                "devices", value, f"GPU indices must be integers from 0 to {MAX_GPUS - 1}"
            )
        devices.append(item)
    if len(set(devices)) != len(devices):
        raise ConfigError.invalid("devices", value, "GPU indices must be unique")
    return tuple(devices)


def _to_strings(field: str, value: Iterable[str]) -> tuple[str, ...]:
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise ConfigError.invalid(field, value, "must be a sequence of strings, not one string")
    items = tuple(value)
    if not all(isinstance(item, str) for item in items):
        raise ConfigError.invalid(field, value, "must contain only strings")
    for item in items:
        problem = _unportable(item)
        if problem:
            raise ConfigError.invalid(field, value, f"{item!r} {problem}")
    return items


def _to_extra_args(value: Iterable[str]) -> tuple[str, ...]:
    return _to_strings("extra_args", value)


def _to_command(value: Iterable[str] | None) -> tuple[str, ...] | None:
    if value is None:
        return None
    command = _to_strings("command", value)
    if not command or not all(command):
        raise ConfigError.invalid("command", value, "must be a non-empty list of non-empty strings")
    return command


def _to_env(value: Mapping[str, str] | None) -> Mapping[str, str]:
    if value is None:
        return types.MappingProxyType({})
    if not isinstance(value, Mapping):
        raise ConfigError.invalid("env", type(value).__name__, "must be a mapping of str to str")
    pairs: list[tuple[object, object]] = list(value.items())
    for name, item in pairs:
        if not isinstance(name, str) or not name or "=" in name:
            raise ConfigError.invalid("env", name, "variable names must be non-empty, without '='")
        problem = _unportable(name)
        if problem:
            raise ConfigError.invalid("env", name, f"the variable name {problem}")
        # Values are never echoed, only the variable's name: environment values may be secrets.
        if not isinstance(item, str):
            raise ConfigError.invalid(
                "env", name, f"value must be a str, not {type(item).__name__}"
            )
        problem = _unportable(item)
        if problem:
            raise ConfigError.invalid("env", name, f"the value of {name} {problem}")
    return types.MappingProxyType(dict(value))


def _to_log_path(value: str | os.PathLike[str] | None) -> Path | None:
    if value is None:
        return None
    raw: object = value
    if not isinstance(raw, (str, os.PathLike)):
        raise ConfigError.invalid("log_path", value, "must be a non-empty path or None")
    text = os.fspath(raw)
    if not isinstance(text, str) or not text:
        raise ConfigError.invalid("log_path", value, "must be a non-empty path or None")
    problem = _unportable(text)
    if problem:
        raise ConfigError.invalid("log_path", value, problem)
    return Path(text)


def _field_name(attribute: attrs.Attribute[Any]) -> str:
    return attribute.alias or attribute.name


def _v_model(_: object, attribute: attrs.Attribute[str], value: object) -> None:
    field = _field_name(attribute)
    text = check_text(field, value)
    if not text.strip():
        raise ConfigError.invalid(field, value, "must not be blank")
    if has_control_chars(text):
        raise ConfigError.invalid(field, value, "must not contain control characters")
    problem = _unportable(text)
    if problem:
        raise ConfigError.invalid(field, value, problem)


def _v_host(_: object, attribute: attrs.Attribute[str], value: object) -> None:
    check_host(_field_name(attribute), value)


def _v_port(_: object, attribute: attrs.Attribute[int], value: object) -> None:
    check_port(_field_name(attribute), value)


def _v_count(_: object, attribute: attrs.Attribute[int], value: object) -> None:
    check_int(_field_name(attribute), value, 1, MAX_GPUS)


def _v_max_model_len(_: object, attribute: attrs.Attribute[int | None], value: object) -> None:
    if value is not None:
        check_int(_field_name(attribute), value, 1, MAX_LENGTH)


def _v_fraction(_: object, attribute: attrs.Attribute[float], value: object) -> None:
    check_number(_field_name(attribute), value, positive=True, at_most=1.0)


def _v_seconds(_: object, attribute: attrs.Attribute[float], value: object) -> None:
    check_seconds(_field_name(attribute), value, positive=True)


def _v_bool(_: object, attribute: attrs.Attribute[bool], value: object) -> None:
    if not isinstance(value, bool):
        raise ConfigError.invalid(_field_name(attribute), value, "must be True or False")


# ---------------------------------------------------------------- spawning


@functools.cache
def _prctl() -> Callable[..., int] | None:
    """The C library's ``prctl`` (Linux only), resolved in the parent, not the forked child."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        function = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong]
    function.restype = ctypes.c_int
    return function


def death_signal_preexec() -> Callable[[], None] | None:
    """A ``preexec_fn`` asking the kernel to SIGTERM the child when its parent dies.

    SIGTERM rather than SIGKILL, so that the server still stops its own
    workers. If the parent already died between fork and ``prctl`` (then
    ``getppid`` no longer names it), the child exits at once.
    """
    prctl = _prctl()
    if prctl is None:
        return None
    parent = os.getpid()
    sigterm = int(signal.SIGTERM)

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, sigterm, 0)
        if os.getppid() != parent:
            os._exit(1)

    return preexec


_Job = tuple[Callable[[], Any], Future[Any]]


class _Spawner:
    """Starts child processes from one long-lived daemon thread.

    Linux sends ``PR_SET_PDEATHSIG`` when the *thread* that forked the child
    exits, not the process. A server started from a short-lived thread (a
    thread pool overlapping startup with other work) would be killed as soon
    as that thread finished, so every spawn goes through this thread instead,
    which lives as long as the process.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._jobs: queue.SimpleQueue[_Job] | None = None

    def submit(self, job: Callable[[], subprocess.Popen[bytes]]) -> Future[subprocess.Popen[bytes]]:
        with self._lock:
            if self._jobs is None:
                self._jobs = queue.SimpleQueue()
                thread = threading.Thread(
                    target=self._run, args=(self._jobs,), name="verirl-vllm-spawner", daemon=True
                )
                thread.start()
            jobs = self._jobs
        future: Future[subprocess.Popen[bytes]] = Future()
        jobs.put((job, future))
        return future

    @staticmethod
    def _run(jobs: queue.SimpleQueue[_Job]) -> None:
        while True:
            job, future = jobs.get()
            if not future.set_running_or_notify_cancel():
                continue
            try:
                result = job()
            except BaseException as exc:  # noqa: BLE001 - handed to the caller through the future
                future.set_exception(exc)
            else:
                future.set_result(result)

    def reset_after_fork(self) -> None:
        """A forked child has no spawner thread; start a fresh one on demand."""
        self._lock = threading.Lock()
        self._jobs = None


_SPAWNER = _Spawner()


def _spawn(job: Callable[[], subprocess.Popen[bytes]]) -> subprocess.Popen[bytes]:
    """Run ``job`` on the spawner thread and return its result.

    Interrupted meanwhile (Ctrl-C, SIGTERM as ``SystemExit``), it still waits
    for the job to finish, then re-raises: the job records the child it
    started (see `_Launch`), so the caller's teardown can reach it.
    """
    future = _SPAWNER.submit(job)
    interrupted: BaseException | None = None
    while not future.done():
        try:
            wait_futures([future])
        except BaseException as exc:  # noqa: BLE001, PERF203 - re-raised below, once the child is known
            interrupted = interrupted or exc
    if interrupted is not None:
        raise interrupted
    return future.result()


# ---------------------------------------------------------------- servers of this process


_RUNNING: set[VLLMServer] = set()


def _stop_all_at_exit() -> None:
    for server in list(_RUNNING):
        try:
            server.stop()
        except Exception:  # noqa: PERF203 - one failing server must not keep the others running
            log.exception("stopping %r at exit failed", server)


def _after_fork_in_child() -> None:
    # The child inherits neither the servers (they are the parent's) nor the threads.
    _RUNNING.clear()
    _SPAWNER.reset_after_fork()


atexit.register(_stop_all_at_exit)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


# ---------------------------------------------------------------- the process tree


def _alive(process: psutil.Process) -> bool:
    """Running and not a zombie (an orphan's zombie may never be reaped in a container)."""
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
    except psutil.Error:
        return True


def _tcp_connections(process: psutil.Process) -> list[Any]:
    """``process``'s TCP sockets (psutil >= 6 ``net_connections``, older ``connections``)."""
    method = getattr(process, "net_connections", None) or process.connections
    return list(method(kind="tcp"))


def _listening(connection: Any, port: int) -> bool:  # noqa: ANN401 - psutil's named tuples
    """Whether ``connection`` is a socket listening on ``port``."""
    address = connection.laddr
    return bool(connection.status == psutil.CONN_LISTEN and address and address.port == port)


def _marked_processes(marker: str, since: float) -> Iterator[psutil.Process]:
    """Processes created after ``since`` whose environment carries ``marker``.

    Every process the server starts inherits the marker, so this finds its
    workers even after they left its session and were orphaned.
    """
    me = os.getpid()
    for process in psutil.process_iter():
        try:
            if process.pid == me or process.create_time() < since:
                continue
            if process.environ().get(MARKER_VAR) == marker:
                yield process
        except (psutil.Error, OSError):
            continue


@attrs.define(eq=False)
class _ProcessTree:
    """The server process, its group, and every descendant ever seen."""

    popen: subprocess.Popen[bytes]
    marker: str
    leader: psutil.Process | None = attrs.field(default=None, init=False)
    since: float = attrs.field(default=0.0, init=False)
    seen: dict[int, psutil.Process] = attrs.field(factory=dict, init=False)
    stopping: threading.Event = attrs.field(factory=threading.Event, init=False)
    ready: bool = attrs.field(default=False, init=False)

    def __attrs_post_init__(self) -> None:
        try:
            self.leader = psutil.Process(self.popen.pid)
            self.since = self.leader.create_time() - 1.0
        except psutil.Error:
            self.since = time.time() - 60.0

    @property
    def pid(self) -> int:
        return self.popen.pid

    def exited(self) -> bool:
        """Whether the server process has exited, without reaping it."""
        return self.popen.returncode is not None or self.exit_status() is not None

    def exit_status(self) -> int | None:
        """The exit code (negative: killed by that signal) once exited, without reaping.

        Not reaping keeps the server's pid (which is also its group id)
        reserved, so a later ``killpg`` cannot reach an unrelated group that
        reused the number.
        """
        if self.popen.returncode is not None:
            return self.popen.returncode
        if hasattr(os, "waitid"):
            flags = os.WEXITED | os.WNOHANG | os.WNOWAIT
            try:
                info = os.waitid(os.P_PID, self.popen.pid, flags)
            except ChildProcessError:
                return self.popen.poll()
            if info is None:
                return None
            return info.si_status if info.si_code == os.CLD_EXITED else -info.si_status
        return self.popen.poll()

    def collect(self) -> None:
        """Remember current descendants and marked orphans (pid + creation time)."""
        found: list[psutil.Process] = []
        if self.leader is not None:
            with contextlib.suppress(psutil.Error):
                found += self.leader.children(recursive=True)
        found += [p for p in _marked_processes(self.marker, self.since) if p.pid != self.pid]
        for process in found:
            known = self.seen.get(process.pid)
            if known is None or not _alive(known):
                self.seen[process.pid] = process

    def listens_on(self, port: int) -> bool | None:
        """Whether the server or a descendant has a TCP socket listening on ``port``.

        ``None`` when the system denies reading the sockets (then no proof
        either way). The port check before the spawn cannot rule out another
        server that binds later, so a 200 counts only with this proof.
        """
        members: list[psutil.Process] = []
        with contextlib.suppress(psutil.Error):
            leader = self.leader or psutil.Process(self.pid)
            members = [leader, *leader.children(recursive=True)]
        denied = False
        for process in members:
            try:
                if any(_listening(c, port) for c in _tcp_connections(process)):
                    return True
            except psutil.AccessDenied:  # noqa: PERF203 - one process at a time, few of them
                denied = True
            except psutil.Error:
                continue
        if not denied:
            return False
        try:  # another view: the system-wide table, which names each socket's process
            table = psutil.net_connections(kind="tcp")
        except (psutil.Error, OSError):
            return None
        pids = {process.pid for process in members}
        owners = {c.pid for c in table if _listening(c, port)}
        if owners & pids:
            return True
        return False if owners and None not in owners else None

    def signal_all(self, sig: int) -> None:
        """``sig`` to the group, and to each remembered descendant outside it."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.pid, sig)
        for process in self.seen.values():
            if sig == signal.SIGTERM:
                with contextlib.suppress(OSError):
                    if os.getpgid(process.pid) == self.pid:
                        continue  # the group signal reached it
            with contextlib.suppress(psutil.Error):
                process.send_signal(sig)  # psutil refuses a pid that was reused

    def survivors(self) -> list[psutil.Process]:
        return [process for process in self.seen.values() if _alive(process)]

    def wait_gone(self, deadline: float) -> bool:
        """Wait until the server and every remembered descendant are gone; False at deadline."""
        delay = 0.001
        while True:
            if self.exited() and not self.survivors():
                return True
            now = time.monotonic()
            if now >= deadline:
                return False
            time.sleep(min(delay, deadline - now))
            delay = min(delay * 2, 0.02)

    def gone(self, *, rescan: bool) -> bool:
        """Whether the server and every descendant (rescanned first if asked) are gone; reaps."""
        if not self.exited():
            return False
        if rescan:
            with contextlib.suppress(Exception):
                self.collect()
        if self.survivors():
            return False
        with contextlib.suppress(OSError):
            self.popen.poll()  # reap, now that nothing can reuse the group id against us
        return True

    def kill_now(self) -> None:
        """SIGKILL all that is found, wait (bounded) for it to go, reap; raises no `Exception`."""
        with contextlib.suppress(Exception):
            self.collect()
            self.signal_all(signal.SIGKILL)
            # SIGKILL is delivered asynchronously; wait until the tree is really gone.
            self.wait_gone(time.monotonic() + _KILL_WAIT)
        with contextlib.suppress(Exception):
            self.popen.wait(timeout=_KILL_WAIT)

    def shutdown(self, grace: float) -> bool:
        """SIGTERM everything, ``grace`` seconds, SIGKILL the rest, reap. True if it was clean.

        Interrupted (a second Ctrl-C), it skips the grace, SIGKILLs at once,
        reaps and re-raises.
        """
        clean = False
        try:
            self.collect()
            self.signal_all(signal.SIGTERM)
            clean = self.wait_gone(time.monotonic() + grace)
            if not clean:
                log.warning(
                    "vLLM server pid %d still running %.1fs after SIGTERM; sending SIGKILL "
                    "(processes: %s)",
                    self.pid,
                    grace,
                    ", ".join(str(p.pid) for p in self.survivors()) or "the server itself",
                )
            # Always a last sweep: anything forked during the shutdown, or orphaned.
            self.collect()
            self.signal_all(signal.SIGKILL)
            if not self.wait_gone(time.monotonic() + _KILL_WAIT):
                log.error(
                    "processes of the vLLM server survive SIGKILL (stuck in the kernel?): %s",
                    ", ".join(str(p.pid) for p in self.survivors()),
                )
        except BaseException:
            self.kill_now()
            raise
        finally:
            try:
                self.popen.wait(timeout=_KILL_WAIT)
            except subprocess.TimeoutExpired:
                log.exception("vLLM server pid %d could not be reaped", self.pid)
        return clean


class _ServerExitedError(Exception):
    """Raised inside the readiness poll when the server process is gone."""


class _UnprovableError(Exception):
    """Raised inside the readiness poll when the owner of the answering socket cannot be told."""


class _StartCancelledError(Exception):
    """Raised inside the readiness poll when `VLLMServer.stop` was called meanwhile."""


@attrs.define(eq=False)
class _ReadinessProbe:
    """One readiness attempt: ``None`` once *our* server answers 200, else why not.

    Raises when waiting is pointless: the start was cancelled, the server
    exited, or the owner of the answering socket cannot be told.
    """

    tree: _ProcessTree
    session: requests.Session
    url: str
    port: int
    foreign_seen: bool = False

    def __call__(self, time_left: float) -> str | None:
        if self.tree.stopping.is_set():
            raise _StartCancelledError
        if self.tree.exited():
            raise _ServerExitedError
        reason = _health_check(self.session, self.url, time_left)
        if reason is not None:
            return reason
        # A 200 proves nothing yet: another server may hold the port while ours loads.
        ours = self.tree.listens_on(self.port)
        if ours is None:
            raise _UnprovableError
        if ours:
            return None
        if not self.foreign_seen:
            self.foreign_seen = True
            log.warning(
                "port %d answered by another process, not by the vLLM server pid %d "
                "(is another server using the port?); waiting for ours",
                self.port,
                self.tree.pid,
            )
        return f"port {self.port} answered by another process"


def _health_check(session: requests.Session, url: str, time_left: float) -> str | None:
    """One ``GET`` of the health URL within the time left (at most 5 s): ``None`` on 200."""
    return request_health(session, url, max(min(time_left, _REQUEST_TIMEOUT_CAP), 0.01))


@attrs.define(eq=False)
class _Run:
    """One `VLLMServer.start`: what it holds and spawned, recorded as it happens.

    The spawner thread sets ``popen`` the moment the child exists, so an
    interruption at any point after the spawn still finds the child to stop.
    """

    marker: str
    holds_sigterm: bool = False
    popen: subprocess.Popen[bytes] | None = None
    tree: _ProcessTree | None = None

    def release_sigterm(self) -> None:
        """Release this run's hold on `SIGTERM_POLICY`, at most once."""
        if self.holds_sigterm:
            self.holds_sigterm = False
            SIGTERM_POLICY.release()


# ---------------------------------------------------------------- the server


@attrs.define(eq=False, repr=False)
class VLLMServer:
    """The vLLM server as a context manager: started healthy, stopped with its whole tree.

    Arguments mirror ``trl vllm-serve``'s flags (see `vllm_serve_args`), plus:

    - ``devices``: GPU indices *as this process numbers them* (mapped through
      the parent's ``CUDA_VISIBLE_DEVICES``);
    - ``command``: the program to run instead of the one the installed TRL
      expects (see `launch_plan`), followed by the same flags, e.g.
      ``[sys.executable, "-m", "fakes.vllm_serve"]``;
    - ``env``: variables added to the inherited (scrubbed) environment; see
      `vllm_child_environ`;
    - ``log_path``: where stdout and stderr go. An existing file is appended
      to, never truncated; a directory gets ``vllm-serve-<port>.log``;
      ``None`` means a fresh ``verirl-vllm-*`` temp directory (left in place,
      so the log outlives a failure);
    - ``startup_timeout`` / ``shutdown_timeout``: seconds to become healthy /
      to stop after SIGTERM before SIGKILL;
    - ``progress_interval``: seconds between "still starting" log lines;
    - ``handle_sigterm``: while running, turn the trainer's SIGTERM into
      ``SystemExit(143)`` so the ``with`` block unwinds (main thread only,
      and only when SIGTERM has no handler yet).

    Every argument is checked here and a bad one raises `ConfigError`. Failing
    to start raises `PortInUseError` (nothing spawned), `VLLMServerExited` or
    `VLLMStartupTimeout` (both after the process tree is gone), or
    `VLLMServerError` (no launch command).
    """

    model: str = attrs.field(validator=_v_model)
    port: int = attrs.field(default=8001, kw_only=True, validator=_v_port)
    host: str = attrs.field(default="127.0.0.1", kw_only=True, validator=_v_host)
    devices: tuple[int, ...] = attrs.field(default=(1,), kw_only=True, converter=_to_devices)
    max_model_len: int | None = attrs.field(default=None, kw_only=True, validator=_v_max_model_len)
    gpu_memory_utilization: float = attrs.field(default=0.9, kw_only=True, validator=_v_fraction)
    tensor_parallel_size: int = attrs.field(default=1, kw_only=True, validator=_v_count)
    data_parallel_size: int = attrs.field(default=1, kw_only=True, validator=_v_count)
    extra_args: tuple[str, ...] = attrs.field(default=(), kw_only=True, converter=_to_extra_args)
    command: tuple[str, ...] | None = attrs.field(default=None, kw_only=True, converter=_to_command)
    env: Mapping[str, str] = attrs.field(default=None, kw_only=True, converter=_to_env, repr=False)
    _log_path: Path | None = attrs.field(
        default=None, kw_only=True, converter=_to_log_path, alias="log_path"
    )
    startup_timeout: float = attrs.field(default=600.0, kw_only=True, validator=_v_seconds)
    shutdown_timeout: float = attrs.field(default=30.0, kw_only=True, validator=_v_seconds)
    progress_interval: float = attrs.field(default=30.0, kw_only=True, validator=_v_seconds)
    handle_sigterm: bool = attrs.field(default=True, kw_only=True, validator=_v_bool)

    _tree: _ProcessTree | None = attrs.field(default=None, init=False, repr=False)
    _argv: tuple[str, ...] | None = attrs.field(default=None, init=False, repr=False)
    _active_log: Path | None = attrs.field(default=None, init=False, repr=False)
    _log_offset: int = attrs.field(default=0, init=False, repr=False)
    _run: _Run | None = attrs.field(default=None, init=False, repr=False)
    _owner: int = attrs.field(factory=os.getpid, init=False, repr=False)
    _lock: threading.RLock = attrs.field(factory=threading.RLock, init=False, repr=False)

    def __attrs_post_init__(self) -> None:
        wanted = self.tensor_parallel_size * self.data_parallel_size
        if len(self.devices) < wanted:
            log.warning(
                "devices=%s has %d GPU(s) but tensor_parallel_size * data_parallel_size = %d",
                self.devices,
                len(self.devices),
                wanted,
            )

    @classmethod
    def from_topology(
        cls,
        topology: ServerTopology,
        *,
        model: str,
        **overrides: Any,  # noqa: ANN401 - forwarded to the constructor, which checks them
    ) -> Self:
        """A server for ``topology``'s vLLM GPUs, host, port and flags; ``overrides`` win.

        A topology that runs no local server (colocate mode, or vLLM on a
        remote host) is a `ConfigError`.
        """
        if not topology.is_local_server:
            remote = getattr(topology, "remote_host", None)
            if remote:
                raise ConfigError.invalid(
                    "topology.remote_host",
                    remote,
                    f"vLLM runs on that host (mode={topology.mode!r}); no local server to start",
                )
            raise ConfigError.invalid(
                "topology.mode",
                topology.mode,
                "only server mode runs a local vLLM server "
                "(in colocate mode TRL runs vLLM inside the trainer)",
            )
        settings: dict[str, Any] = {
            "devices": topology.vllm_devices,
            "host": topology.host,
            "port": topology.port,
            "max_model_len": topology.max_model_len,
            "gpu_memory_utilization": topology.gpu_memory_utilization,
            "tensor_parallel_size": topology.tensor_parallel_size,
            "data_parallel_size": topology.data_parallel_size,
        }
        settings.update(overrides)
        return cls(model, **settings)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(model={self.model!r}, base_url={self.base_url!r}, "
            f"devices={self.devices!r}, running={self.running}, pid={self.pid}, "
            f"log_path={None if self.log_path is None else str(self.log_path)!r})"
        )

    # ------------------------------------------------------------ properties

    @property
    def base_url(self) -> str:
        """``http://host:port`` (a wildcard host is reached over loopback)."""
        return f"http://{_connect_host(self.host)}:{self.port}"

    @property
    def pid(self) -> int | None:
        """The server process id while started, else ``None``."""
        tree = self._tree
        return None if tree is None else tree.pid

    @property
    def running(self) -> bool:
        """Started, and the server process has not exited."""
        tree = self._tree
        return tree is not None and not tree.exited()

    @property
    def log_path(self) -> Path | None:
        """The log file of the current (or last) run; the requested path before the first."""
        return self._active_log or self._log_path

    @property
    def serve_args(self) -> tuple[str, ...]:
        """The flags after the command: ``--model M --host H --port P ...`` then ``extra_args``."""
        return tuple(
            vllm_serve_args(
                self.model,
                host=self.host,
                port=self.port,
                gpu_memory_utilization=self.gpu_memory_utilization,
                max_model_len=self.max_model_len,
                tensor_parallel_size=self.tensor_parallel_size,
                data_parallel_size=self.data_parallel_size,
                extra_args=self.extra_args,
            )
        )

    def launch_plan(self) -> LaunchPlan:
        """What `start` runs, and why: the argv, the variables it adds, the kind of launch.

        Without ``command``: vLLM's own server as the installed TRL 1.x runs it
        (``trl.scripts.vllm_serve.build_command``, ``VLLM_SERVER_DEV_MODE=1``), or
        ``trl vllm-serve`` with a TRL that has no ``build_command``. Spawns
        nothing; raises `VLLMServerError` when neither can run.
        """
        own: dict[str, object] = {
            "model": self.model,
            "host": self.host,
            "port": self.port,
            "tensor_parallel_size": self.tensor_parallel_size,
            "data_parallel_size": self.data_parallel_size,
            "gpu_memory_utilization": self.gpu_memory_utilization,
        }
        if self.max_model_len is not None:
            own["max_model_len"] = self.max_model_len
        return plan_launch(
            self.serve_args,
            command=self.command,
            environ=os.environ,
            trl=None if self.command is not None else import_trl_serve(),
            vllm=None if self.command is not None else vllm_distribution(),
            own=own,
        )

    @property
    def argv(self) -> tuple[str, ...] | None:
        """The full command line of the current (or last) launch, ``None`` before one."""
        return self._argv

    def log_tail(self, lines: int = _LOG_TAIL_LINES) -> str:
        """The last ``lines`` lines this run wrote to its log ("" before a run)."""
        if self._active_log is None:
            return ""
        return read_log_tail(self._active_log, lines=lines, start=self._log_offset)

    # ------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Launch the server and return once ``GET /health`` answers 200 from it.

        Checks come first and spawn nothing: the launch command, the GPU
        mapping, the port, the log file. From the spawn on, any failure or
        interruption (an exception, Ctrl-C, SIGTERM as ``SystemExit``), at any
        point until this returns, stops the whole process tree before the
        exception propagates. `stop` may be called from another thread
        meanwhile: the start then ends promptly with `VLLMServerError`.
        """
        run = _Run(marker=uuid.uuid4().hex)
        try:
            with self._lock:
                tree = self._launch(run)
            # Wait outside the lock, so that stop() from another thread can cancel the start.
            self._wait_until_ready(tree)
        except BaseException:
            self._abandon(run)
            raise

    def stop(self) -> None:
        """Stop the server and everything it started; safe to call any number of times.

        SIGTERM to the process group and to descendants that left it, up to
        ``shutdown_timeout`` seconds for all of them to exit, then SIGKILL to
        whatever is left (pids checked against their creation time), then the
        server is reaped. Interrupted (Ctrl-C), it SIGKILLs the tree at once
        and waits for it (bounded) before re-raising. The server is forgotten
        only once every process of it is gone: if one may have survived, the
        next call (``__exit__``, another `stop`, or the exit hook) tries again.
        """
        with self._lock:
            tree = self._tree
            if tree is None:
                return
            tree.stopping.set()  # a start() waiting in another thread gives up
            if os.getpid() != self._owner:
                self._forget(release=False)  # a forked copy: the server is the parent's
                return
            started = time.monotonic()
            try:
                status = tree.exit_status()
                if status is not None and tree.ready:  # a crash while in use
                    log.warning(
                        "the vLLM server had already exited (code %s); see %s",
                        status,
                        self._active_log,
                    )
                clean = tree.shutdown(self.shutdown_timeout)
            except BaseException:
                tree.kill_now()
                if tree.gone(rescan=True):
                    self._forget()
                else:
                    log.error(  # noqa: TRY400 - no traceback: the exception propagates
                        "stopping the vLLM server pid %d was interrupted and processes may "
                        "survive; stop() will try again",
                        tree.pid,
                    )
                raise
            if not tree.gone(rescan=False):
                log.error(
                    "processes of the vLLM server pid %d survive; stop() will try again: %s",
                    tree.pid,
                    ", ".join(str(p.pid) for p in tree.survivors()) or "the server itself",
                )
                return
            self._forget()
            log.info(
                "stopped vLLM server pid %d in %.2fs%s",
                tree.pid,
                time.monotonic() - started,
                "" if clean else " (SIGKILL needed)",
            )

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: types.TracebackType | None,
    ) -> None:
        self.stop()

    # ------------------------------------------------------------ internals

    def _launch(self, run: _Run) -> _ProcessTree:
        """Check, open the log, spawn and adopt the child (under the lock); ``run`` records it."""
        if self._tree is not None and self._tree.stopping.is_set():
            self.stop()  # an interrupted stop: finish it first
        previous = self._tree
        if previous is not None and previous.stopping.is_set():
            raise VLLMServerError(
                f"processes of the previous vLLM server on port {self.port} survive "
                f"SIGKILL (pid {previous.pid}); it cannot be started again"
            )
        if previous is not None:
            raise VLLMServerError(f"the vLLM server on port {self.port} is already started")
        plan = self.launch_plan()
        argv = plan.argv
        environ = vllm_child_environ(os.environ, devices=self.devices, env={**plan.env, **self.env})
        environ[MARKER_VAR] = run.marker
        _check_port_free(self.host, self.port)
        log_file = self._open_log(argv)
        try:
            run.holds_sigterm = self.handle_sigterm and SIGTERM_POLICY.acquire()

            def job() -> subprocess.Popen[bytes]:
                run.popen = self._popen(argv, environ, log_file)
                return run.popen

            try:
                popen = _spawn(job)
            except OSError as exc:
                if run.popen is not None:
                    raise
                hint = "" if plan.kind == "command" else f"; `{INSTALL_HINT}`"
                raise VLLMServerError(
                    f"command={argv[0]!r}: cannot be started ({exc.strerror or exc}){hint}"
                ) from exc
        finally:
            log_file.close()
        tree = self._adopt(run, argv)
        log.info(
            "started vLLM server (pid %d, GPUs %s) for %s at %s; log: %s; launch: %s",
            popen.pid,
            environ["CUDA_VISIBLE_DEVICES"],
            self.model,
            self.base_url,
            self._active_log,
            plan.reason,
        )
        return tree

    def _adopt(self, run: _Run, argv: tuple[str, ...] | None) -> _ProcessTree:
        """Remember ``run``'s child as this server's, so that `stop` and the exit hook reach it."""
        if run.tree is not None:
            return run.tree
        if run.popen is None:  # pragma: no cover - only called once a child exists
            msg = "no child process to adopt"
            raise AssertionError(msg)
        _RUNNING.add(self)
        tree = _ProcessTree(run.popen, run.marker)
        self._owner = os.getpid()
        if argv is not None:
            self._argv = argv
        self._run = run
        self._tree = tree
        run.tree = tree
        return tree

    def _abandon(self, run: _Run) -> None:
        """After a failed or interrupted `start`: stop whatever ``run`` spawned, release SIGTERM."""
        with self._lock:
            if run.popen is not None and run.tree is None:
                self._adopt(run, None)  # spawned but not yet remembered
            tree = run.tree
            if tree is not None and tree is self._tree and not tree.stopping.is_set():
                self.stop()
            elif tree is None or tree is not self._tree:
                run.release_sigterm()

    def _forget(self, *, release: bool = True) -> None:
        """The server is gone: drop the tree and, once, this run's hold on SIGTERM."""
        run = self._run
        self._tree = None
        self._run = None
        _RUNNING.discard(self)
        if run is not None:
            if release:
                run.release_sigterm()
            else:
                run.holds_sigterm = False

    def _open_log(self, argv: tuple[str, ...]) -> Any:  # noqa: ANN401 - a binary file object
        """Open this run's log for appending, write a header, remember where the run starts.

        Unbuffered, so that a write that fails (a full disk) fails here, and the
        handle is closed before the `ConfigError` naming ``log_path`` is raised.
        """
        requested = self._log_path
        try:
            if requested is None:
                folder = Path(tempfile.mkdtemp(prefix="verirl-vllm-"))
                path = folder / f"vllm-serve-{self.port}.log"
            elif requested.is_dir():
                path = requested / f"vllm-serve-{self.port}.log"
            else:
                path = requested
        except OSError as exc:
            raise ConfigError.invalid(
                "log_path", requested, f"no log file can be made ({exc.strerror or exc})"
            ) from None
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            handle = path.open("ab", buffering=0)
        except OSError as exc:
            raise ConfigError.invalid(
                "log_path", str(path), f"cannot be opened for appending ({exc.strerror or exc})"
            ) from None
        try:
            stamp = time.strftime("%Y-%m-%d %H:%M:%S")
            handle.write(f"--- verirl {stamp}: {shlex.join(redact_argv(argv))}\n".encode())
            offset = handle.tell()
        except OSError as exc:
            handle.close()
            raise ConfigError.invalid(
                "log_path", str(path), f"cannot be written ({exc.strerror or exc})"
            ) from None
        except BaseException:
            handle.close()
            raise
        self._active_log = path
        self._log_offset = offset
        return handle

    @staticmethod
    def _popen(
        argv: tuple[str, ...],
        environ: dict[str, str],
        log_file: Any,  # noqa: ANN401 - a file
    ) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env=environ,
            start_new_session=True,
            preexec_fn=death_signal_preexec(),  # noqa: PLW1509 - only prctl + getppid, no locks
        )

    def _wait_until_ready(self, tree: _ProcessTree) -> None:
        # vLLM serves /health and redirects /health/ to it; TRL 0.2x's server the other
        # way round. requests follows the redirect, so one path suits both.
        url = f"{self.base_url}/health"
        with deadline_session() as session:
            session.trust_env = False  # a proxy from the environment must not see our own server
            probe = _ReadinessProbe(tree, session, url, self.port)

            def nap(seconds: float) -> None:
                tree.stopping.wait(seconds)  # wakes at once when stop() is called

            try:
                result = poll(
                    probe,
                    timeout=self.startup_timeout,
                    backoff=_BACKOFF,
                    sleep=nap,
                    progress=self._log_progress,
                    progress_every=self.progress_interval,
                )
            except _UnprovableError:
                self.stop()
                raise VLLMServerError(
                    f"{url} answered 200, but whether from the vLLM server we started cannot be "
                    "told: this system denies reading its sockets (psutil AccessDenied)"
                ) from None
            except (_ServerExitedError, _StartCancelledError):
                cancelled = tree.stopping.is_set()
                self.stop()
                if cancelled:
                    raise VLLMServerError(
                        "stop() was called while the vLLM server was starting; it was stopped"
                    ) from None
                raise VLLMServerExited(
                    tree.popen.returncode, self.log_tail(), str(self._active_log)
                ) from None
        if not result.ready:
            self.stop()
            raise VLLMStartupTimeout(self.startup_timeout, self.log_tail(), str(self._active_log))
        tree.ready = True
        log.info("vLLM server at %s is ready after %.1fs", self.base_url, result.elapsed)

    def _log_progress(self, elapsed: float, last_error: str | None) -> None:
        last_line = self.log_tail(lines=1).strip()
        log.info(
            "vLLM server at %s not ready after %.0fs (%s); last log line: %s",
            self.base_url,
            elapsed,
            last_error,
            last_line or "(none yet)",
        )

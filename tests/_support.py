"""Helpers shared by several test modules (pytest puts tests/ on sys.path)."""

from __future__ import annotations

import contextlib
import http.server
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

import psutil
import pytest

from fakes._http import QuietHTTPServer, serve_in_background, stop_serving
from fakes.vllm import FakeVLLMServer
from verirl import ServerHandle, VLLMTopology, _procfs, find_free_port
from verirl._net import port_is_free
from verirl.server.process import MARKER_VAR
from verirl.topology import TRL_GROUP_PORT

SESSION_VAR = "PYTEST_VERIRL_SESSION"
"""Set to a fresh id in each pytest process (each xdist worker too) at configure time.

Every process the suite starts inherits it, so the leftover check can tell
this run's processes from those of another checkout or job on the same
machine. The name is outside ``VERIRL_*`` on purpose: tests that clear
verirl's settings variables must not clear the tag too.
"""

LEFTOVER_GRACE = 15.0
"""Seconds a process already on its way out (SIGKILLed, being reaped) gets before it counts."""


class FakeClock:
    """Virtual time: sleeping advances the clock, nothing really waits."""

    def __init__(self) -> None:
        self.now = 100.0
        self.sleeps: list[float] = []

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        assert seconds >= 0
        self.sleeps.append(seconds)
        self.now += seconds


def alive(process: psutil.Process) -> bool:
    """Running and not a zombie (PID 1 in a container may never reap an orphan's zombie).

    A process whose main thread has ended while others run (Zl) reads as a
    zombie to psutil but is alive: verirl's own `verirl._procfs.running` tells.
    """
    try:
        return process.is_running() and _procfs.running(process.pid)
    except psutil.NoSuchProcess:
        return False


def tagged_processes(tag: str) -> set[psutil.Process]:
    """Live processes other than this one whose environment carries ``SESSION_VAR=tag``.

    Wherever they are: a server's worker orphaned to init still carries the
    tag it inherited. Processes of other users (unreadable) or with another
    tag or none, as another checkout's jobs have, are never returned.
    """
    me = os.getpid()
    found = set()
    for proc in psutil.process_iter():
        try:
            if proc.pid == me:
                continue
            environ = _procfs.environ(proc.pid)  # psutil's fails for a Zl process
            if environ is not None and environ.get(SESSION_VAR) == tag and alive(proc):
                found.add(proc)
        except (psutil.Error, OSError):
            continue
    return found


def descendants() -> set[psutil.Process]:
    """Live descendants of this process (found even when started without the tag)."""
    try:
        children = psutil.Process().children(recursive=True)
    except psutil.Error:
        return set()
    return {proc for proc in children if alive(proc)}


def naming(text: str) -> list[psutil.Process]:
    """Live processes but this one with ``text`` in their command line (a Zl one's too)."""
    me, found = os.getpid(), []
    for proc in psutil.process_iter():
        if proc.pid == me or not alive(proc):
            continue
        with contextlib.suppress(OSError):  # psutil's cmdline() reads a Zl process's empty
            if text.encode() in _procfs.read(proc.pid, "cmdline"):
                found.append(proc)
    return found


def session_processes(tag: str) -> set[psutil.Process]:
    """Every live process this test session started that can still be found."""
    return descendants() | tagged_processes(tag)


def describe(proc: psutil.Process) -> str:
    """``pid: cmdline`` plus the server marker when it carries one, for a failure message."""
    try:  # through verirl's /proc reads: psutil's fail for a Zl process
        argv = _procfs.read(proc.pid, "cmdline").split(b"\0")
        cmdline = " ".join(arg.decode(errors="replace") for arg in argv if arg) or proc.name()
        marker = (_procfs.environ(proc.pid) or {}).get(MARKER_VAR)
    except (psutil.Error, OSError) as exc:
        return f"{proc.pid}: ({type(exc).__name__})"
    extra = f" [{MARKER_VAR}={marker}]" if marker is not None else ""
    return f"{proc.pid}: {cmdline}{extra}"


def leftovers(
    tag: str, before: Iterable[psutil.Process], *, grace: float = LEFTOVER_GRACE
) -> list[psutil.Process]:
    """Processes of this session that were not there ``before`` and outlive ``grace`` seconds."""
    new = session_processes(tag) - set(before)
    if not new:
        return []
    return sorted(still_alive(new, timeout=grace), key=lambda proc: proc.pid)


def still_alive(processes: Iterable[psutil.Process], *, timeout: float) -> list[psutil.Process]:
    """Those of ``processes`` still running (zombies count as gone) after up to ``timeout`` s.

    Polls: most of them are not our children (orphans re-parented to init), so
    there is no exit event to wait on, and `psutil.wait_procs` would wait for
    init to reap a zombie.
    """
    deadline = time.monotonic() + timeout
    left = [proc for proc in processes if alive(proc)]
    while left and time.monotonic() < deadline:
        time.sleep(0.02)
        left = [proc for proc in left if alive(proc)]
    return left


def kill_all(processes: Iterable[psutil.Process]) -> None:
    """SIGKILL each process (the leftover check cleans up what it reports)."""
    procs = list(processes)
    for proc in procs:
        try:
            proc.kill()
        except psutil.Error:
            continue
    still_alive(procs, timeout=10)


def end_launch(proc: subprocess.Popen[bytes], processes: Iterable[psutil.Process]) -> None:
    """Test teardown: SIGKILL ``processes``, then the launch ``proc`` and its group; reap it."""
    for process in processes:
        with contextlib.suppress(psutil.Error):
            process.kill()
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


def unshared_port(host: str = "127.0.0.1") -> int:
    """A free port outside the kernel's ephemeral range.

    A port from ``bind(0)`` is in that range, where any other process's
    ``connect()`` or ``bind(0)`` may take it before our server binds it; other
    verirl servers on the machine may be running too. Outside the range only
    an explicit bind can collide, and the pick is random.
    """
    low, high = 32768, 60999
    with contextlib.suppress(OSError, ValueError):
        low, high = map(int, Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
    candidates = [port for port in range(10000, 65536) if not low <= port <= high]
    rng = random.SystemRandom()
    for _ in range(200):
        port = rng.choice(candidates)
        if port_is_free(port, host=host):
            return port
    return find_free_port(host=host)


def master_port_beside(topology: VLLMTopology) -> int:
    """A free ``MASTER_PORT`` that is none of the ports ``topology``'s server listens on.

    Two ports picked each on its own may be the same (the kernel hands a port freed by the
    first pick out again), or the pick may be TRL's fixed group port, which lies in the
    ephemeral range: the runtime then rightly refuses MASTER_PORT (seen in CI).
    """
    return master_port_avoiding(topology.port)


def master_port_avoiding(*ports: int) -> int:
    """A free ``MASTER_PORT``, none of ``ports`` (a server's) nor TRL's group port."""
    return find_free_port(avoid={*ports, TRL_GROUP_PORT})


class Recorder:
    """A server factory that hands out FakeVLLMServers and remembers them."""

    def __init__(self, **kwargs) -> None:
        self.kwargs = kwargs
        self.servers: list[FakeVLLMServer] = []

    def __call__(self, topology: VLLMTopology) -> ServerHandle:
        server = FakeVLLMServer.from_topology(topology, model="m", **self.kwargs)
        self.servers.append(server)
        return server


def clear_verirl_env(monkeypatch: pytest.MonkeyPatch, folder: Path) -> None:
    """No VERIRL_* setting, GPU mask or Hub token from the caller, and ``folder`` as cwd.

    For CLI tests: a Hub download folder, if any, lands in ``folder``.
    """
    for name in list(os.environ):
        if name.startswith("VERIRL_") or name in ("CUDA_VISIBLE_DEVICES", "HF_TOKEN"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(folder)


def run_cli(argv: list[str]) -> object:
    """`verirl.cli.main`'s exit code, argparse's usage error (``SystemExit``) included."""
    from verirl.cli import main  # here, not at the top: conftest imports this module

    try:
        return main(argv)
    except SystemExit as exc:
        return exc.code


def nothing_listens(port: int) -> bool:
    """Nothing listens on 127.0.0.1:``port`` (TIME_WAIT leftovers of closed connections do not
    count); the tests' own check, independent of verirl's `verirl._net.port_is_free`."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


_T = TypeVar("_T")


def while_the_group_port_is_free(run: Callable[[], _T], *, within: float = 120.0) -> _T:
    """``run()`` (a doctor), from a moment TRL's fixed group port is free to one it still is.

    doctor rightly reports 51216 in use (exit 4, which outranks a plan's 2) while anything
    holds it, and verirl has no setting for it yet: another test's connection may, as the
    port lies in the kernel's ephemeral range. Busy for ``within`` seconds: an AssertionError.
    """
    from verirl.topology import TRL_GROUP_PORT

    deadline = time.monotonic() + within
    while True:
        while not nothing_listens(TRL_GROUP_PORT):
            assert time.monotonic() < deadline, f"port {TRL_GROUP_PORT} stayed in use {within} s"
            time.sleep(0.05)
        result = run()
        if nothing_listens(TRL_GROUP_PORT):
            return result


ZL_PROGRAM = """
import ctypes, os, signal, subprocess, sys, threading, time
# A Zl process: its main thread ends (pthread_exit) while another thread runs on.
ready, forks = sys.argv[1], int(sys.argv[2])
if sys.argv[3:] == ["ignore-sigterm"]:  # SIGKILL alone ends it
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
sleeper = [sys.executable, "-c", "import time; time.sleep(300)"]
first = [subprocess.Popen(sleeper).pid for _ in range(forks)]  # forked by the main thread
me = os.getpid()

def run():
    second = [subprocess.Popen(sleeper).pid for _ in range(forks)]  # forked by this thread
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # until the main thread has ended
        with open(f"/proc/{me}/task/{me}/stat", "rb") as stat:
            if stat.read().rsplit(b")", 1)[1].split()[0] == b"Z":
                break
        time.sleep(0.005)
    with open(ready + ".tmp", "w") as sink:
        sink.write(" ".join(map(str, [me, *first, *second])))
    os.replace(ready + ".tmp", ready)
    threading.Event().wait(300)

threading.Thread(target=run).start()
ctypes.CDLL(None).pthread_exit(None)
"""


class ZlProcess:
    """A real Zl process (main thread ended, another running), child of this test process.

    It forks ``forks`` sleepers from its main thread before that ends, and as
    many from its live thread. `close` kills it and them, and reaps it.
    """

    def __init__(self, folder: Path, *, env: dict[str, str] | None = None, forks: int = 0) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        script = folder / "zl.py"
        script.write_text(ZL_PROGRAM)
        ready = folder / "zl.ready"
        self.popen = subprocess.Popen(
            [sys.executable, str(script), str(ready), str(forks)], env=env
        )
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert self.popen.poll() is None, "the Zl program exited"
            assert time.monotonic() < deadline, "the Zl program did not get ready"
            time.sleep(0.01)
        self.pid, *self.children = map(int, ready.read_text().split())

    def close(self) -> None:
        """SIGKILL the process and its sleepers; reap it."""
        for pid in (self.pid, *self.children):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.popen.wait()
        left = []
        for pid in self.children:
            with contextlib.suppress(psutil.NoSuchProcess):
                left.append(psutil.Process(pid))
        still_alive(left, timeout=10)


Answer = tuple[int, Mapping[str, str], bytes]
"""What a `LoopbackServer` sends: status, headers, body."""


class _AnsweringHandler(http.server.BaseHTTPRequestHandler):
    server: LoopbackServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        """Quiet: the server records each request in ``hits``."""

    def _answer(self) -> None:
        self.server.record(self.command, self.path)
        status, headers, body = self.server.answer(self)
        self.send_response(status)
        for name, value in headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    do_GET = do_HEAD = do_CONNECT = _answer  # noqa: N815


class LoopbackServer(QuietHTTPServer):
    """A loopback HTTP server (a proxy, a redirector, a failing Hub) whose answers a test scripts.

    ``answer`` gets the request handler (its ``path``, ``headers``, ``command``)
    and returns an `Answer`; ``hits`` lists each request as ``"METHOD path"``.
    """

    daemon_threads = True

    def __init__(self, answer: Callable[[http.server.BaseHTTPRequestHandler], Answer]) -> None:
        super().__init__(("127.0.0.1", 0), _AnsweringHandler)
        self.answer = answer
        self._hits: list[str] = []
        self._hits_lock = threading.Lock()

    def record(self, method: str, path: str) -> None:
        with self._hits_lock:
            self._hits.append(f"{method} {path}")

    @property
    def hits(self) -> list[str]:
        with self._hits_lock:
            return list(self._hits)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


@contextlib.contextmanager
def loopback_server(
    answer: Callable[[http.server.BaseHTTPRequestHandler], Answer],
) -> Iterator[LoopbackServer]:
    """Serve `LoopbackServer` in the background for the ``with`` block, then stop and join it."""
    server = LoopbackServer(answer)
    thread = serve_in_background(server, "test-loopback-server")
    try:
        yield server
    finally:
        stop_serving(server, thread)


def clean_environ(tmp_path: Path, **extra: str) -> dict[str, str]:
    """This process's environment without verirl/HF settings, HF_HOME in ``tmp_path``."""
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("VERIRL_", "HF_", "HUGGING_FACE_"))
        and name not in ("CUDA_VISIBLE_DEVICES", "RANK", "LOCAL_RANK", "WORLD_SIZE")
    }
    env["HF_HOME"] = str(tmp_path / "hf-home")
    env["HF_HUB_OFFLINE"] = "1"
    env["HF_HUB_DISABLE_TELEMETRY"] = "1"
    env.update(extra)
    return env


def place_hub_token(
    where: str, token: str, tmp_path: Path, saved_login: Path, monkeypatch: pytest.MonkeyPatch
) -> str:
    """Put ``token`` where huggingface_hub finds it by itself; the start of verirl's refusal.

    ``where``: ``"HF_TOKEN_PATH"`` (a file of its own), ``"saved login"``
    (``saved_login``, the file under ``HF_HOME``) or ``"HUGGING_FACE_HUB_TOKEN"``.
    """
    from huggingface_hub import constants

    if where == "HF_TOKEN_PATH":
        path = tmp_path / "elsewhere-token"
        path.write_text(token + "\n", encoding="utf-8")
        monkeypatch.setenv("HF_TOKEN_PATH", str(path))
        monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(path))
        return f"HF_TOKEN_PATH='{path}': the Hub token in that file contains"
    if where == "saved login":
        saved_login.write_text(token, encoding="utf-8")
        return f"HF_HOME='{saved_login}': the Hub token in that file contains"
    monkeypatch.setenv("HUGGING_FACE_HUB_TOKEN", token)
    return "HUGGING_FACE_HUB_TOKEN='<hidden>': contains"


def command_flags(command: str) -> list[str]:
    """Every option of ``verirl COMMAND`` that takes a value, from the parser itself."""
    import argparse

    from verirl.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return sorted(
        action.option_strings[-1]
        for action in sub.choices[command]._actions
        if action.option_strings
        and action.nargs is None
        and not isinstance(action, argparse._HelpAction)
    )


def duplicate_window() -> float:
    """Seconds a recorder of signals stays after its first one: through launch's catch-up looks
    until their gap is its longest, and two looks more (a duplicate from any is counted)."""
    from verirl import _supervise

    gap, window = _supervise._FIRST_CATCH_UP, 0.0
    while gap < _supervise._MAX_CATCH_UP:
        window += gap
        gap *= 2
    return window + 2 * _supervise._MAX_CATCH_UP


_CALLED_BY_THE_COLLECTOR = ("__del__", "_remove")  # a finalizer, a WeakSet's callback


def _interrupting_profile(
    codes: set[Any], point: int | None, before: Callable[[], object] | None = None
) -> tuple[list[int], Any]:
    """A profile function that counts the points in ``codes``' frames where a signal can be
    handled and, with ``point``, raises a Ctrl-C at that one (``before()`` first, untraced);
    and the count so far.

    Python handles a signal at a function's entry, right after a call returns and at a
    loop's jump back (none in the code checked here): the profile's "call" of such a frame,
    and the "c_return" or "return" of a call it made. An exception from a profile function
    is raised there, and unsets it: one interrupt, at a point a signal can reach.
    """
    seen = [0]

    def profile(frame: Any, event: str, _arg: object) -> None:
        if event == "call" and frame.f_lasti >= 0 and sys.version_info < (3, 11):
            return  # a generator resumed: on 3.10 an exception here skips its handlers, which
            # a signal (handled at an instruction inside it) never does
        if event in ("call", "c_return"):
            ours = frame.f_code in codes
        elif event == "return":  # not a finalizer's or weakref callback's: only printed
            ours = frame.f_code.co_name not in _CALLED_BY_THE_COLLECTOR
            ours = ours and frame.f_back is not None
            ours = ours and frame.f_back.f_code in codes
        else:
            return
        if ours:
            seen[0] += 1
            if seen[0] == point:
                if before is not None:
                    before()
                raise KeyboardInterrupt

    return seen, profile


def interrupted_at_point(
    codes: set[Any],
    point: int | None,
    job: Callable[[], object],
    before: Callable[[], object] | None = None,
) -> int:
    """``job()`` with a Ctrl-C at its ``point``-th point in ``codes`` (none: count them);
    ``before()`` runs just before the Ctrl-C is raised."""
    seen, profile = _interrupting_profile(codes, point, before)
    previous = sys.getprofile()
    sys.setprofile(profile)
    try:
        job()
    except KeyboardInterrupt:
        assert point is not None
    finally:
        sys.setprofile(previous)
    return seen[0]


def codes_of(*functions: Any) -> set[Any]:
    return {getattr(function, "__wrapped__", function).__code__ for function in functions}

"""VLLMServer against real processes: the fake `trl vllm-serve` (fakes.vllm_serve) and workers."""

from __future__ import annotations

import _thread
import contextlib
import importlib.util
import json
import logging
import math
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import attrs
import psutil
import pytest
import requests

from _support import alive, codes_of, interrupted_at_point, unshared_port
from fakes.envserver import FakeEnvServer
from verirl._fs import quoted
from verirl._http import deadline_session
from verirl.errors import (
    ConfigError,
    PortInUseError,
    VLLMServerError,
    VLLMServerExited,
    VLLMStartupTimeout,
)
from verirl.server.args import vllm_serve_args
from verirl.server.child_env import SCRUBBED_ENV_VARS, map_visible_devices, vllm_child_environ
from verirl.server.launch import COMMAND_HINT, INSTALL_HINT, find_trl_command
from verirl.server.log_tail import read_log_tail
from verirl.server.readiness import health_check
from verirl.topology import VLLMTopology
from verirl.vllm_server import VLLMServer

FAKE = (sys.executable, "-m", "fakes.vllm_serve")
MODEL = "fake/model"

linux_only = pytest.mark.skipif(
    sys.platform != "linux", reason="the death signal (PR_SET_PDEATHSIG) exists on Linux only"
)


# ---------------------------------------------------------------- helpers


def survivors(processes, timeout: float = 0.0) -> list[psutil.Process]:
    """The processes still alive, after waiting up to ``timeout`` for them to go."""
    deadline = time.monotonic() + timeout
    while True:
        left = [p for p in processes if alive(p)]
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.01)


def healthy(server: VLLMServer) -> bool:
    """``GET /health`` answers 200, the readiness check of vLLM's server (and the fake's)."""
    return requests.get(server.base_url + "/health", timeout=5).status_code == 200


def get_json(server: VLLMServer, path: str):
    response = requests.get(server.base_url + path, timeout=5)
    response.raise_for_status()
    return response.json()


def start_in_thread(server: VLLMServer) -> tuple[threading.Thread, list[BaseException]]:
    """Call ``server.start()`` in a new thread; what it raises lands in the returned list."""
    errors: list[BaseException] = []

    def start() -> None:
        try:
            server.start()
        except BaseException as exc:  # noqa: BLE001 - reported to the test
            errors.append(exc)

    thread = threading.Thread(target=start)
    thread.start()
    return thread, errors


def tree(server: VLLMServer) -> list[psutil.Process]:
    """The server and its workers, as the fake reports them."""
    assert server.pid is not None
    workers = get_json(server, "/verirl/workers/")["pids"]
    return [psutil.Process(server.pid), *(psutil.Process(pid) for pid in workers)]


def pids_in_log(path: Path | str, what: str) -> list[int]:
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        return []
    return [int(pid) for pid in re.findall(rf"Started {what} process \[(\d+)\]", text)]


def processes(pids) -> list[psutil.Process]:
    """Processes of the fake program among ``pids`` (gone ones, and reused pids, are left out)."""
    found = []
    for pid in pids:
        try:
            process = psutil.Process(pid)
            if "vllm_serve" in " ".join(process.cmdline()):
                found.append(process)
        except psutil.Error:
            continue
    return found


def children() -> set[int]:
    return {p.pid for p in psutil.Process().children(recursive=True) if alive(p)}


@pytest.fixture
def make_server(tmp_path):
    """Build servers on free ports running the fake program; stop them all afterwards."""
    made: list[VLLMServer] = []

    def make(**kwargs) -> VLLMServer:
        kwargs.setdefault("port", unshared_port())
        kwargs.setdefault("command", FAKE)
        kwargs.setdefault("log_path", tmp_path / f"server-{len(made)}.log")
        kwargs.setdefault("startup_timeout", 30.0)
        kwargs.setdefault("shutdown_timeout", 5.0)
        server = VLLMServer(kwargs.pop("model", MODEL), **kwargs)
        made.append(server)
        return server

    yield make
    for server in made:
        server.stop()


# ---------------------------------------------------------------- ready, teardown


def test_ready_server_answers_health_and_logs_to_its_file(make_server):
    server = make_server(max_model_len=2048, extra_args=["--dtype", "bfloat16"])
    with server as entered:
        assert entered is server
        assert server.running
        assert healthy(server)
        assert get_json(server, "/get_world_size") == {"world_size": 1}
        expected = vllm_serve_args(
            MODEL,
            host="127.0.0.1",
            port=server.port,
            gpu_memory_utilization=0.9,
            max_model_len=2048,
            extra_args=["--dtype", "bfloat16"],
        )
        assert get_json(server, "/verirl/argv/")["argv"] == expected
        assert server.argv == (*FAKE, *expected)
        assert get_json(server, "/verirl/args/")["dtype"] == "bfloat16"
        procs = tree(server)
        assert procs[0].pid == server.pid
    assert server.pid is None
    assert not server.running
    assert not survivors(procs)
    log = server.log_path.read_text()
    assert "Uvicorn running on http://127.0.0.1:" in log
    assert "Finished server process" in log


def test_well_behaved_server_with_workers_stops_on_sigterm_without_the_grace(make_server, caplog):
    """Well under a second in `nox -s bench`; here the proof is that no SIGKILL was needed."""
    server = make_server(
        tensor_parallel_size=2, data_parallel_size=2, devices=(0, 1, 2, 3), shutdown_timeout=60.0
    )
    server.start()
    procs = tree(server)
    assert len(procs) == 5
    assert get_json(server, "/get_world_size") == {"world_size": 4}
    started = time.monotonic()
    server.stop()
    took = time.monotonic() - started
    assert not survivors(procs)
    assert took < 60.0, f"teardown took {took:.2f}s"
    stopped = [r.getMessage() for r in caplog.records if "stopped vLLM server" in r.getMessage()]
    assert len(stopped) == 1
    assert "SIGKILL" not in stopped[0]
    assert "SIGKILL" not in server.log_path.read_text()


def test_ignored_sigterm_costs_shutdown_timeout_then_sigkill_reaches_every_process(
    make_server, caplog
):
    server = make_server(
        tensor_parallel_size=2,
        devices=(0, 1),
        shutdown_timeout=0.5,
        env={"FAKE_VLLM_IGNORE_SIGTERM": "1", "FAKE_VLLM_WORKER_NEW_SESSION": "1"},
    )
    server.start()
    procs = tree(server)
    # The workers left the server's process group: only the psutil sweep reaches them.
    assert all(os.getpgid(worker.pid) != server.pid for worker in procs[1:])
    started = time.monotonic()
    server.stop()
    took = time.monotonic() - started
    assert not survivors(procs)
    assert 0.45 <= took < 0.5 + 30, f"teardown took {took:.2f}s"
    assert any("SIGKILL" in record.getMessage() for record in caplog.records)


def test_exception_in_the_block_propagates_unchanged_and_the_server_is_gone(make_server):
    class BoomError(Exception):
        pass

    error = BoomError("training crashed")
    server = make_server(tensor_parallel_size=2, devices=(0, 1))
    with pytest.raises(BoomError) as info, server:  # noqa: PT012 - the block is what is tested
        procs = tree(server)
        raise error
    assert info.value is error
    assert not survivors(procs)
    assert server.pid is None


def test_keyboard_interrupt_in_the_block_stops_the_server(make_server):
    server = make_server(tensor_parallel_size=2, devices=(0, 1))
    with pytest.raises(KeyboardInterrupt), server:  # noqa: PT012 - the block is what is tested
        procs = tree(server)
        raise KeyboardInterrupt
    assert not survivors(procs)


def test_stop_is_idempotent_and_the_server_can_start_again(make_server):
    server = make_server()
    server.stop()  # never started: nothing to do
    server.start()
    first = server.pid
    with pytest.raises(VLLMServerError, match="already started"):
        server.start()
    procs = tree(server)
    server.stop()
    server.stop()
    server.__exit__(None, None, None)
    assert not survivors(procs)
    with server:
        assert server.pid not in (None, first)
        assert healthy(server)


def test_stop_from_another_thread_cancels_a_start_in_progress(make_server, tmp_path):
    server = make_server(
        tensor_parallel_size=2,
        devices=(0, 1),
        startup_timeout=600.0,
        env={"FAKE_VLLM_LOAD_UNTIL": str(tmp_path / "never")},
    )
    thread, errors = start_in_thread(server)
    wait_for_log(server.log_path, "Loading model")  # both workers are up by then
    pids = pids_in_log(server.log_path, "server") + pids_in_log(server.log_path, "worker")
    assert len(pids) == 3
    procs = processes(pids)
    stopped_at = time.monotonic()
    server.stop()
    thread.join(timeout=60)  # far less than the 600 s startup timeout
    assert not thread.is_alive()
    # Promptly: the readiness wait wakes on stop(), it does not sleep out its backoff.
    assert time.monotonic() - stopped_at < 5.0 + 10.0  # the 5 s shutdown_timeout, and load
    assert not survivors(procs)
    assert len(errors) == 1
    assert type(errors[0]) is VLLMServerError
    assert "stop() was called while the vLLM server was starting" in str(errors[0])
    assert server.pid is None
    assert not children()
    # The start was cancelled for good: a second start is refused, nothing is spawned.
    with pytest.raises(VLLMServerError, match="cannot be started again: make a new one"):
        server.start()
    assert not children()
    assert server.pid is None
    server.stop()  # still idempotent


def test_a_stop_as_the_server_gets_ready_makes_start_raise_never_return(make_server, monkeypatch):
    server = make_server()
    ready = VLLMServer._wait_until_ready

    def then_stop_from_another_thread(self: VLLMServer, tree: object) -> None:
        ready(self, tree)  # ready: start() has not returned yet, a stop() lands now
        stopper = threading.Thread(target=self.stop)
        stopper.start()
        stopper.join(60)

    monkeypatch.setattr(VLLMServer, "_wait_until_ready", then_stop_from_another_thread)
    with pytest.raises(VLLMServerError, match="stop\\(\\) was called while the vLLM server"):
        server.start()  # it returned with the server already stopped
    assert server.pid is None
    assert not children()


def test_a_stop_before_start_cancels_nothing(make_server):
    server = make_server()
    server.stop()
    with server:
        assert healthy(server)


@linux_only
def test_server_started_from_a_short_lived_thread_outlives_that_thread(make_server):
    # PR_SET_PDEATHSIG fires when the *thread* that forked the child exits.
    server = make_server()
    thread, errors = start_in_thread(server)
    thread.join(timeout=30)
    assert not errors
    assert server._tree is not None
    with pytest.raises(subprocess.TimeoutExpired):
        server._tree.popen.wait(timeout=0.5)
    assert healthy(server)


# ---------------------------------------------------------------- startup failures


def test_crash_during_startup_raises_exited_with_code_and_log_tail(make_server):
    server = make_server(
        tensor_parallel_size=2,
        devices=(0, 1),
        env={"FAKE_VLLM_CRASH": "3:torch.OutOfMemoryError: CUDA out of memory (fake)"},
    )
    with pytest.raises(VLLMServerExited) as info:
        server.start()
    assert info.value.returncode == 3
    assert "CUDA out of memory (fake)" in info.value.log_tail
    assert info.value.log_path == str(server.log_path)
    assert "CUDA out of memory (fake)" in str(info.value)
    workers = pids_in_log(server.log_path, "worker")
    assert len(workers) == 2
    assert not survivors(processes(workers))
    assert server.pid is None


def test_crash_leaves_no_orphaned_worker_even_one_that_left_the_session(make_server):
    # Workers without a death signal, in their own session: after the server
    # dies they belong to no group or tree of ours; the environment marker finds them.
    server = make_server(
        tensor_parallel_size=2,
        devices=(0, 1),
        env={
            "FAKE_VLLM_CRASH": "1:engine core died",
            "FAKE_VLLM_ORPHAN_WORKERS": "1",
            "FAKE_VLLM_WORKER_NEW_SESSION": "1",
        },
    )
    with pytest.raises(VLLMServerExited) as info:
        server.start()
    assert info.value.returncode == 1
    workers = pids_in_log(server.log_path, "worker")
    assert len(workers) == 2
    assert not survivors(processes(workers))


def test_slow_start_times_out_and_the_tree_is_gone_when_raised(make_server, interrupt_on, tmp_path):
    # The fake never finishes loading. How far it got in 2 s depends on the
    # machine's load, so the test checks what holds whatever that was.
    server = make_server(
        tensor_parallel_size=2,
        devices=(0, 1),
        startup_timeout=2.0,
        env={"FAKE_VLLM_LOAD_UNTIL": str(tmp_path / "never")},
    )
    spawned = interrupt_on("started vLLM server", None)
    started = time.monotonic()
    with pytest.raises(VLLMStartupTimeout) as info:
        server.start()
    took = time.monotonic() - started
    assert 2.0 <= took < 2.0 + 30
    assert isinstance(info.value, TimeoutError)
    assert info.value.timeout == 2.0
    assert info.value.log_tail == server.log_tail()  # this run's lines, whatever they were
    assert info.value.log_path == str(server.log_path)
    leader = spawned.record.args[0]
    logged = pids_in_log(server.log_path, "server") + pids_in_log(server.log_path, "worker")
    assert not survivors(processes({leader, *logged}))  # already gone, no waiting
    assert server.pid is None


def test_progress_is_logged_with_the_last_server_log_line(
    make_server, caplog, interrupt_on, tmp_path
):
    caplog.set_level(logging.INFO, logger="verirl.vllm_server")
    go = tmp_path / "go"
    server = make_server(progress_interval=0.1, env={"FAKE_VLLM_LOAD_UNTIL": str(go)})
    loading = interrupt_on("Loading model", None)  # only a progress line quotes the server log
    thread, errors = start_in_thread(server)
    try:
        assert wait_until(lambda: loading.seen.is_set() or not thread.is_alive())
    finally:
        go.touch()
        thread.join(timeout=60)
    assert not errors
    server.stop()
    progress = [r.getMessage() for r in caplog.records if "not ready after" in r.getMessage()]
    assert progress
    assert any("last log line:" in line and "Loading model" in line for line in progress)


def test_health_check_reasons():
    with requests.Session() as session:
        with FakeEnvServer(ready_after=None, status_when_not_ready=503) as env:
            assert health_check(session, env.url + "/health", 5.0) == "HTTP 503"
            env.set_ready()
            assert health_check(session, env.url + "/health", 5.0) is None
        with FakeEnvServer(hang=True) as env:
            assert health_check(session, env.url + "/health", 0.2) == "timed out"
        with socket.socket() as bound_not_listening:  # refuses connections, and is ours
            bound_not_listening.bind(("127.0.0.1", 0))
            port = bound_not_listening.getsockname()[1]
            url = f"http://127.0.0.1:{port}/health"
            assert health_check(session, url, 5.0) == "connection refused"


def test_health_check_bounds_the_whole_request_against_a_trickling_server():
    with deadline_session() as session, FakeEnvServer(trickle=0.2) as env:
        started = time.monotonic()
        assert health_check(session, env.url + "/health", 1.0) == "timed out"
        assert time.monotonic() - started < 1.0 + 2.0


def test_port_in_use_is_refused_before_anything_is_spawned(make_server):
    with socket.create_server(("127.0.0.1", 0)) as holder:
        port = holder.getsockname()[1]
        server = make_server(port=port)
        before = children()
        with pytest.raises(PortInUseError) as info:
            server.start()
        assert children() == before
    assert info.value.port == port
    assert f"port={port}" in str(info.value)
    assert not server.log_path.exists()
    assert server.pid is None


def test_port_in_use_on_the_wildcard_address_too(make_server):
    with socket.create_server(("0.0.0.0", 0)) as holder:
        server = make_server(port=holder.getsockname()[1])
        with pytest.raises(PortInUseError):
            server.start()


def test_a_port_with_connections_in_time_wait_is_not_in_use(make_server):
    port = unshared_port()
    with socket.create_server(("127.0.0.1", port)) as listener:
        client = socket.create_connection(("127.0.0.1", port))
        conn, _ = listener.accept()
        conn.close()  # the server side closes first, so TIME_WAIT lands on `port`
        client.recv(1)
        client.close()

    def in_time_wait() -> bool:
        return any(
            c.laddr and c.laddr.port == port and c.status == psutil.CONN_TIME_WAIT
            for c in psutil.net_connections(kind="tcp4")
        )

    deadline = time.monotonic() + 5
    while not in_time_wait() and time.monotonic() < deadline:
        time.sleep(0.01)
    assert in_time_wait()
    with socket.socket() as plain, pytest.raises(OSError):
        plain.bind(("127.0.0.1", port))  # without SO_REUSEADDR the port looks taken
    with make_server(port=port) as server:
        assert healthy(server)


def test_server_that_dies_during_the_block_is_swept_with_its_workers(make_server, caplog):
    # Workers without a death signal outlive a killed server, as vLLM engine cores can.
    server = make_server(
        tensor_parallel_size=2, devices=(0, 1), env={"FAKE_VLLM_ORPHAN_WORKERS": "1"}
    )
    with server:
        procs = tree(server)
        procs[0].kill()
        deadline = time.monotonic() + 10
        while server.running and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not server.running
        assert all(alive(worker) for worker in procs[1:])
    assert not survivors(procs)
    assert any("already exited (code -9)" in r.getMessage() for r in caplog.records)


@pytest.fixture
def ctrl_c_raises():
    """Ctrl-C raises KeyboardInterrupt here, even if pytest was started with SIGINT ignored."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def test_an_interrupt_during_teardown_skips_the_grace_period(make_server, ctrl_c_raises):
    server = make_server(shutdown_timeout=600.0, env={"FAKE_VLLM_IGNORE_SIGTERM": "1"})
    server.start()
    procs = tree(server)
    stopping = server._tree.stopping  # set as stop() begins
    done = threading.Event()

    def second_ctrl_c() -> None:
        if stopping.wait(timeout=60) and not done.wait(0.2):  # well inside the grace wait
            _thread.interrupt_main()

    interrupter = threading.Thread(target=second_ctrl_c)
    interrupter.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            server.stop()  # would wait the 600 s grace without the interrupt
    finally:
        done.set()
        interrupter.join()
    assert not survivors(procs)
    assert server.pid is None


def test_a_stop_from_a_sigterm_handler_during_the_grace_keeps_its_end(make_server):
    """The README's advice for a program with its own SIGTERM handler is to call ``stop()``
    there; one that landed during a ``stop()`` started a whole new grace (6 s + 4 s here)."""
    grace = 6.0
    server = make_server(shutdown_timeout=grace, env={"FAKE_VLLM_IGNORE_SIGTERM": "1"})
    server.start()
    procs = tree(server)
    stopping = server._tree.stopping  # set as stop() begins
    done = threading.Event()

    def sigterm_inside_the_grace() -> None:
        if stopping.wait(timeout=60) and not done.wait(grace - 2):
            os.kill(os.getpid(), signal.SIGTERM)

    previous = signal.signal(signal.SIGTERM, lambda *_: server.stop())
    preempter = threading.Thread(target=sigterm_inside_the_grace)
    preempter.start()
    try:
        started = time.monotonic()
        server.stop()
        took = time.monotonic() - started
    finally:
        done.set()
        preempter.join()
        signal.signal(signal.SIGTERM, previous)
    assert not survivors(procs)
    assert took < grace + 2.5, took  # a new grace would end at 2 * grace - 2


def test_a_ctrl_c_while_another_thread_stops_the_server_cuts_its_grace_short(
    make_server, ctrl_c_raises
):
    """A supervisor thread runs ``stop()``; the main thread, interrupted, waits for it in its
    own ``stop()``: a second Ctrl-C there waited out the other thread's whole grace."""
    server = make_server(shutdown_timeout=600.0, env={"FAKE_VLLM_IGNORE_SIGTERM": "1"})
    server.start()
    procs = tree(server)
    stopping = server._tree.stopping  # set as stop() begins
    supervisor = threading.Thread(target=server.stop)
    supervisor.start()
    assert stopping.wait(timeout=60)
    done = threading.Event()

    def ctrl_c() -> None:  # a real signal: interrupt_main() would not wake a lock's wait
        if not done.wait(0.3):  # the main thread waits for the supervisor's stop by then
            signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)

    interrupter = threading.Thread(target=ctrl_c)
    interrupter.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            server.stop()  # waits for the supervisor's 600 s grace without the interrupt
    finally:
        done.set()
        interrupter.join()
    supervisor.join(timeout=60)
    assert not supervisor.is_alive()
    assert not survivors(procs)
    assert server.pid is None


def test_a_stop_cut_short_before_it_began_skips_its_grace(make_server):
    """A Ctrl-C in a runtime's stop() that waits for another thread's teardown can come
    before that teardown's server.stop() began (it stops the watchdog first): the cut was
    lost and the whole grace ran (review round 28, B's last note). It holds for that stop."""
    server = make_server(shutdown_timeout=600.0, env={"FAKE_VLLM_IGNORE_SIGTERM": "1"})
    server.start()
    procs = tree(server)
    server.cut_stop_short()
    supervisor = threading.Thread(target=server.stop)
    supervisor.start()
    supervisor.join(timeout=60)  # the 600 s grace, without the cut
    assert not supervisor.is_alive()
    assert not survivors(procs)
    assert server.pid is None


# A Ctrl-C as a call returns a file drops it: CPython closes it then (its last reference),
# with a ResourceWarning; nothing stays open.
@pytest.mark.filterwarnings("ignore::ResourceWarning")
@pytest.mark.parametrize("interrupted", ["start", "stop"])
def test_a_ctrl_c_at_any_point_of_start_or_stop_leaves_a_server_that_stop_ends(
    make_server, default_sigterm, interrupted
):
    """The class of f0fff40 and of the policy's hold (review round 28, B-F2), swept: a Ctrl-C
    at every point of VLLMServer's own code where a signal can be handled, as start() or
    stop() runs. Then stop() leaves no process and the SIGTERM policy released; the server
    starts and stops again."""
    from verirl._signals import SIGTERM_POLICY

    codes = codes_of(*(f for f in vars(VLLMServer).values() if hasattr(f, "__code__")))
    server = make_server()

    def run(point: int | None) -> int:
        if interrupted == "start":
            return interrupted_at_point(codes, point, server.start)
        server.start()
        return interrupted_at_point(codes, point, server.stop)

    before = {child.pid for child in psutil.Process().children(recursive=True)}
    points = run(None)
    server.stop()
    assert points > 10
    for point in range(1, points + 1):
        where = f"a Ctrl-C at point {point} of {points} of {interrupted}()"
        run(point)
        server.stop()
        left = [c for c in psutil.Process().children(recursive=True) if c.pid not in before]
        assert not survivors(left, timeout=10), where
        assert server.pid is None, where
        assert SIGTERM_POLICY._users == 0, where
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL, where
    with server:
        assert healthy(server)
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


class _InterruptAsReleased:
    """A lock that raises KeyboardInterrupt once, as its first ``with`` block ends."""

    def __init__(self, lock: threading.RLock) -> None:
        self._lock = lock
        self.armed = True

    def __enter__(self) -> object:
        self._lock.acquire()
        return self

    def __exit__(self, *_exc: object) -> None:
        self._lock.release()
        if self.armed:
            self.armed = False
            raise KeyboardInterrupt


def test_a_ctrl_c_as_start_counts_itself_leaves_the_server_usable(make_server):
    """The start was counted before its ``try``: a Ctrl-C right then left it counted for good,
    so the next stop() took it for a start in progress and cancelled every later start."""
    server = make_server()
    server._starts_lock = _InterruptAsReleased(server._starts_lock)  # the count's lock
    with pytest.raises(KeyboardInterrupt):
        server.start()
    server.stop()
    server.start()  # refused before: "start was cancelled"
    assert server.pid is not None
    server.stop()


# ---------------------------------------------------------------- interrupted at awkward points


class InterruptOn(logging.Handler):
    """Raise ``exc`` (once) while the library logs a record containing ``text``.

    A logging handler is a real extension point of the library: this injects a
    Ctrl-C exactly where a user's would land, without touching verirl's code.
    """

    def __init__(self, text: str, exc: type[BaseException] | None = KeyboardInterrupt) -> None:
        super().__init__(logging.DEBUG)
        self.text = text
        self.exc = exc
        self.record: logging.LogRecord | None = None
        self.seen = threading.Event()

    def emit(self, record: logging.LogRecord) -> None:
        if self.record is None and self.text in record.getMessage():
            self.record = record
            self.seen.set()
            if self.exc is not None:
                raise self.exc


@pytest.fixture
def interrupt_on():
    """Attach `InterruptOn` handlers to verirl's server logger; detach them afterwards."""
    logger = logging.getLogger("verirl.vllm_server")
    attached: list[InterruptOn] = []
    previous = logger.level
    logger.setLevel(logging.DEBUG)

    def attach(text: str, exc: type[BaseException] | None = KeyboardInterrupt) -> InterruptOn:
        handler = InterruptOn(text, exc)
        logger.addHandler(handler)
        attached.append(handler)
        return handler

    yield attach
    for handler in attached:
        logger.removeHandler(handler)
    logger.setLevel(previous)


@pytest.mark.parametrize(
    "exc", [KeyboardInterrupt, SystemExit, RuntimeError], ids=["ctrl-c", "exit", "error"]
)
def test_interrupt_right_after_the_spawn_tears_the_tree_down(make_server, interrupt_on, exc):
    server = make_server(
        tensor_parallel_size=2, devices=(0, 1), env={"FAKE_VLLM_ORPHAN_WORKERS": "1"}
    )
    handler = interrupt_on("started vLLM server", exc)
    with pytest.raises(exc):
        server.start()
    assert handler.record is not None
    leader = handler.record.args[0]
    assert server.pid is None
    assert not server.running
    logged = pids_in_log(server.log_path, "server") + pids_in_log(server.log_path, "worker")
    assert not survivors(processes({leader, *logged}))
    with server:  # nothing is left half-started: it starts again
        assert healthy(server)


def crashed_in_use(make_server, **kwargs) -> tuple[VLLMServer, list[psutil.Process]]:
    """A server whose process was killed while in use; its orphaned workers run on."""
    server = make_server(
        tensor_parallel_size=2, devices=(0, 1), env={"FAKE_VLLM_ORPHAN_WORKERS": "1"}, **kwargs
    )
    server.start()
    procs = tree(server)
    procs[0].kill()
    deadline = time.monotonic() + 30
    while server.running and time.monotonic() < deadline:
        time.sleep(0.01)
    assert not server.running
    assert all(alive(worker) for worker in procs[1:])
    return server, procs


@pytest.mark.parametrize(
    "where", ["had already exited", "stopped vLLM server"], ids=["crash-warning", "stopped-info"]
)
def test_a_stop_interrupted_after_a_crash_is_finished_by_the_next_stop(
    make_server, interrupt_on, where
):
    server, procs = crashed_in_use(make_server)
    try:
        interrupt_on(where)
        with pytest.raises(KeyboardInterrupt):
            server.stop()
        server.stop()
        assert not survivors(procs)
        assert server.pid is None
        server.stop()  # still idempotent
    finally:
        for process in survivors(procs):
            process.kill()


def test_a_stop_interrupted_before_sigkill_is_finished_by_the_next_stop(make_server, interrupt_on):
    server = make_server(
        tensor_parallel_size=2,
        devices=(0, 1),
        shutdown_timeout=0.2,
        env={"FAKE_VLLM_IGNORE_SIGTERM": "1", "FAKE_VLLM_WORKER_NEW_SESSION": "1"},
    )
    server.start()
    procs = tree(server)
    try:
        interrupt_on("still running")
        with pytest.raises(KeyboardInterrupt):
            server.stop()
        server.stop()
        assert not survivors(procs)
        assert server.pid is None
    finally:
        for process in survivors(procs):
            process.kill()


# ---------------------------------------------------------------- readiness is our own child's


def wait_for_log(path: Path, text: str, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(FileNotFoundError):
            if text in path.read_text():
                return
        time.sleep(0.01)
    pytest.fail(f"{text!r} never appeared in {path}")


def wait_until(condition, timeout: float = 60) -> bool:
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.01)
    return condition()


FOREIGN = "answered by another process"


def test_a_server_still_loading_on_a_port_is_not_ready_on_anothers_answer(
    make_server, interrupt_on, tmp_path
):
    go_first, go_second = tmp_path / "go-first", tmp_path / "go-second"
    first = make_server(env={"FAKE_VLLM_LOAD_UNTIL": str(go_first)})
    second = make_server(port=first.port, env={"FAKE_VLLM_LOAD_UNTIL": str(go_second)})
    foreign = interrupt_on(FOREIGN, None)
    first_thread, first_errors = start_in_thread(first)
    wait_for_log(first.log_path, "Loading model")  # spawned; the port is not bound yet
    second_thread, second_errors = start_in_thread(second)
    wait_for_log(second.log_path, "Loading model")  # so second passed the port check
    go_first.touch()
    first_thread.join(timeout=60)
    assert not first_errors
    assert first.running
    # second gets 200 from first's /health and must not call itself ready on it.
    assert wait_until(lambda: foreign.seen.is_set() or not second_thread.is_alive())
    assert second_thread.is_alive(), f"second ended: {second_errors}"
    assert str(first.port) in foreign.record.getMessage()
    go_second.touch()  # second's own server now tries to bind, fails and exits
    second_thread.join(timeout=60)
    assert not second_thread.is_alive()
    assert len(second_errors) == 1
    assert type(second_errors[0]) is VLLMServerExited
    assert "Address already in use" in second_errors[0].log_tail
    assert second.pid is None
    assert healthy(first)  # first is untouched


def test_a_foreign_http_server_bound_after_the_port_check_is_not_our_server(
    make_server, interrupt_on, tmp_path
):
    from fakes._http import serve_in_background, stop_serving
    from fakes.vllm_serve import make_http_server

    go = tmp_path / "go"
    server = make_server(env={"FAKE_VLLM_LOAD_UNTIL": str(go)})
    foreign = interrupt_on(FOREIGN, None)
    thread, errors = start_in_thread(server)
    wait_for_log(server.log_path, "Loading model")  # the port check has passed
    impostor = make_http_server("127.0.0.1", server.port, world_size=1)
    serving = serve_in_background(impostor, "impostor")
    try:
        assert healthy(server)
        assert wait_until(lambda: foreign.seen.is_set() or not thread.is_alive())
        assert thread.is_alive(), f"start ended: {errors}"
        go.touch()
        thread.join(timeout=60)
    finally:
        stop_serving(impostor, serving)
    assert not thread.is_alive()
    assert len(errors) == 1
    assert type(errors[0]) is VLLMServerExited
    assert "Address already in use" in errors[0].log_tail


def test_host_that_is_not_an_address_here_is_a_config_error(make_server):
    server = make_server(host="192.0.2.1")  # TEST-NET-1: never local
    with pytest.raises(ConfigError, match="not an address of this machine") as info:
        server.start()
    assert info.value.field == "host"
    assert not server.log_path.exists()


def test_a_log_path_that_cannot_be_opened_is_a_config_error(make_server, tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    server = make_server(log_path=blocker / "server.log")
    before = children()
    with pytest.raises(ConfigError) as info:
        server.start()
    assert info.value.field == "log_path"
    assert children() == before


# ---------------------------------------------------------------- environment


def test_child_environment_is_scrubbed_and_mapped_and_ours_untouched(make_server, monkeypatch):
    for name in SCRUBBED_ENV_VARS:
        monkeypatch.setenv(name, "7")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "run-1")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")
    monkeypatch.delenv("PYTHONUNBUFFERED", raising=False)
    before = dict(os.environ)
    server = make_server(
        devices=(1,),
        env={
            "VERIRL_TEST_EXTRA": "yes",
            "MASTER_PORT": "29500",
            "TORCHELASTIC_ERROR_FILE": "/tmp/x",
        },
    )
    with server:
        child = get_json(server, "/verirl/env/")["env"]
    assert dict(os.environ) == before
    leaked = [n for n in child if n in SCRUBBED_ENV_VARS or n.startswith("TORCHELASTIC_")]
    assert leaked == []
    assert child["CUDA_VISIBLE_DEVICES"] == "5"
    assert child["PYTHONUNBUFFERED"] == "1"
    assert child["VERIRL_TEST_EXTRA"] == "yes"
    assert child["VLLM_SERVER_DEV_MODE"] == "1"  # as `trl vllm-serve` sets it
    assert "CUDA_VISIBLE_DEVICES=5" in server.log_path.read_text()  # the worker's view


def test_env_can_turn_vllms_dev_mode_off(make_server):
    with make_server(env={"VLLM_SERVER_DEV_MODE": "0"}) as server:
        child = get_json(server, "/verirl/env/")["env"]
        assert child["VLLM_SERVER_DEV_MODE"] == "0"
        # The fake, like vLLM, serves its development endpoints only in dev mode.
        assert requests.get(server.base_url + "/server_info", timeout=5).status_code == 404


def log_shows(server: VLLMServer, text: str, timeout: float = 10.0) -> bool:
    """Whether the server's log shows ``text`` within ``timeout`` (it logs after answering)."""
    deadline = time.monotonic() + timeout
    while text not in server.log_path.read_text():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True


def test_readiness_follows_the_old_trl_servers_redirect_to_health_slash(make_server):
    server = make_server(env={"FAKE_VLLM_PROTOCOL": "trl-legacy"})
    with server:
        assert log_shows(server, '"GET /health HTTP/1.1" 307')  # verirl asked /health ...
        assert log_shows(server, '"GET /health/ HTTP/1.1" 200')  # ... and followed the redirect
        moved = requests.get(server.base_url + "/health", timeout=5, allow_redirects=False)
        assert moved.status_code == 307
        assert moved.headers["Location"].endswith("/health/")


def test_readiness_of_vllms_own_server_asks_health_without_the_slash(make_server):
    with make_server() as server:
        assert log_shows(server, '"GET /health HTTP/1.1" 200')
        assert "GET /health/" not in server.log_path.read_text()


def test_device_beyond_the_parents_visible_gpus_is_a_config_error_at_start(
    make_server, monkeypatch
):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    server = make_server(devices=(2,))
    before = children()
    with pytest.raises(ConfigError) as info:
        server.start()
    assert info.value.field == "devices"
    assert "CUDA_VISIBLE_DEVICES='0,1'" in str(info.value)
    assert children() == before
    assert not server.log_path.exists()


@pytest.mark.parametrize(
    ("devices", "parent", "expected"),
    [
        ((1,), "4,5,6,7", "5"),
        ((0, 3), "4,5,6,7", "4,7"),
        ((1, 2), None, "1,2"),
        ((0,), "GPU-a,GPU-b", "GPU-a"),  # torch's reading: " GPU-a" (a space first) is no GPU
    ],
)
def test_map_visible_devices(devices, parent, expected):
    assert map_visible_devices(devices, parent) == expected


@pytest.mark.parametrize("parent", ["", "0", "3,4"])
def test_map_visible_devices_rejects_an_index_beyond_the_list(parent):
    with pytest.raises(ConfigError, match=r"devices=\(2,\)"):
        map_visible_devices((2,), parent)


def test_vllm_child_environ_is_a_copy_and_env_cannot_readd_scrubbed_names(caplog):
    parent = {"RANK": "1", "TORCHELASTIC_X": "1", "HOME": "/root", "PYTHONUNBUFFERED": "0"}
    child = vllm_child_environ(
        parent, devices=(0,), env={"RANK": "2", "CUDA_VISIBLE_DEVICES": "9", "A": "b"}
    )
    assert child == {
        "HOME": "/root",
        "PYTHONUNBUFFERED": "1",
        "CUDA_VISIBLE_DEVICES": "9",  # env may override the mapping on purpose
        "A": "b",
    }
    assert parent == {"RANK": "1", "TORCHELASTIC_X": "1", "HOME": "/root", "PYTHONUNBUFFERED": "0"}
    assert any("RANK" in record.getMessage() for record in caplog.records)


# ---------------------------------------------------------------- command


def test_missing_program_is_a_server_error_and_nothing_is_left(make_server, tmp_path):
    server = make_server(command=[str(tmp_path / "no-such-program"), "vllm-serve"])
    before = children()
    with pytest.raises(VLLMServerError, match="no-such-program") as info:
        server.start()
    assert not isinstance(info.value, ConfigError)
    assert children() == before
    assert server.pid is None


def _executable(path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return path


def test_find_trl_command_prefers_the_trl_beside_the_interpreter(tmp_path):
    python = tmp_path / "venv" / "bin" / "python"
    beside = _executable(tmp_path / "venv" / "bin" / "trl")
    on_path = _executable(tmp_path / "elsewhere" / "trl")
    found = find_trl_command(executable=str(python), search_path=str(on_path.parent))
    assert found == (str(beside), "vllm-serve")
    beside.unlink()
    found = find_trl_command(executable=str(python), search_path=str(on_path.parent))
    assert found == (str(on_path), "vllm-serve")


def test_find_trl_command_without_trl_says_how_to_install(tmp_path):
    with pytest.raises(VLLMServerError, match=re.escape(INSTALL_HINT)):
        find_trl_command(executable=str(tmp_path / "python"), search_path=str(tmp_path))


def test_default_command_without_trl_is_a_server_error(make_server, monkeypatch, tmp_path):
    # An interpreter with no trl beside it, and a PATH without one.
    monkeypatch.setattr(sys, "executable", str(tmp_path / "bin" / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))
    server = make_server(command=None)
    with pytest.raises(VLLMServerError, match=re.escape(INSTALL_HINT)):
        server.start()
    assert not server.log_path.exists()


def test_a_trl_command_that_cannot_run_names_the_program_not_a_keyword(
    make_server, monkeypatch, tmp_path
):
    if importlib.util.find_spec("trl") is not None:
        pytest.skip("trl is importable here: the launch does not run the `trl` command")
    trl = tmp_path / "bin" / "trl"
    trl.parent.mkdir()
    trl.write_text("#!/nonexistent/interpreter\n")
    trl.chmod(0o755)
    monkeypatch.setattr(sys, "executable", str(tmp_path / "bin" / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))
    server = make_server(command=None)
    with pytest.raises(VLLMServerError) as info:
        server.start()
    message = str(info.value)
    assert message.startswith(f"cannot start {str(trl)!r} (")
    assert INSTALL_HINT in message
    assert message.endswith(COMMAND_HINT)
    assert "command='" not in message


# ---------------------------------------------------------------- configuration


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"model": ""}, "model"),
        ({"model": None}, "model"),
        ({"port": 0}, "port"),
        ({"port": 70000}, "port"),
        ({"port": True}, "port"),
        ({"port": "8001"}, "port"),
        ({"host": ""}, "host"),
        ({"devices": ()}, "devices"),
        ({"devices": [-1]}, "devices"),
        ({"devices": [1, 1]}, "devices"),
        ({"devices": "1"}, "devices"),
        ({"devices": 1}, "devices"),
        ({"devices": [1.0]}, "devices"),
        ({"devices": [True]}, "devices"),
        ({"max_model_len": 0}, "max_model_len"),
        ({"max_model_len": 1.5}, "max_model_len"),
        ({"gpu_memory_utilization": 0}, "gpu_memory_utilization"),
        ({"gpu_memory_utilization": 1.01}, "gpu_memory_utilization"),
        ({"gpu_memory_utilization": math.nan}, "gpu_memory_utilization"),
        ({"gpu_memory_utilization": True}, "gpu_memory_utilization"),
        ({"tensor_parallel_size": 0}, "tensor_parallel_size"),
        ({"data_parallel_size": -1}, "data_parallel_size"),
        ({"extra_args": "--enforce-eager"}, "extra_args"),
        ({"extra_args": ["--port", 1]}, "extra_args"),
        ({"command": "trl vllm-serve"}, "command"),
        ({"command": []}, "command"),
        ({"command": ["trl", ""]}, "command"),
        ({"env": "A=1"}, "env"),
        ({"env": {"": "x"}}, "env"),
        ({"log_path": ""}, "log_path"),
        ({"startup_timeout": 0}, "startup_timeout"),
        ({"startup_timeout": -1.0}, "startup_timeout"),
        ({"shutdown_timeout": 0}, "shutdown_timeout"),
        ({"shutdown_timeout": math.inf}, "shutdown_timeout"),
        ({"progress_interval": 0}, "progress_interval"),
        ({"handle_sigterm": "yes"}, "handle_sigterm"),
        # blank, or what a command line / an environment cannot carry
        ({"model": " "}, "model"),
        ({"model": "\t\n"}, "model"),
        ({"model": "fake\x00model"}, "model"),
        ({"model": "fake\nmodel"}, "model"),
        ({"model": "\ud800"}, "model"),
        ({"extra_args": ["--dtype", "bf\x0016"]}, "extra_args"),
        ({"extra_args": ["\udcff\ud800"]}, "extra_args"),
        ({"command": ["python\x00", "-m"]}, "command"),
        ({"env": {"A\x00B": "1"}}, "env"),
        ({"env": {"A=B": "1"}}, "env"),
        ({"env": {"\ud800": "1"}}, "env"),
        ({"log_path": "logs/\x00.log"}, "log_path"),
        # hosts
        ({"host": " "}, "host"),
        ({"host": "[::1]"}, "host"),
        ({"host": "http://localhost"}, "host"),
        ({"host": "local host"}, "host"),
        ({"host": "localhost\n"}, "host"),
        ({"host": "127.0.0.1\x00"}, "host"),
        ({"host": "localhost/x"}, "host"),
        ({"host": "localhost:8001"}, "host"),
        ({"host": "::zz"}, "host"),
        ({"host": "a" * 300}, "host"),
        # numbers out of range, of the wrong type, not finite
        ({"port": 8001.0}, "port"),
        ({"port": math.nan}, "port"),
        ({"port": 2**70}, "port"),
        ({"devices": [10**30]}, "devices"),
        ({"devices": [2**63]}, "devices"),
        ({"max_model_len": 10**30}, "max_model_len"),
        ({"tensor_parallel_size": 2**64}, "tensor_parallel_size"),
        ({"data_parallel_size": math.inf}, "data_parallel_size"),
        ({"gpu_memory_utilization": -0.5}, "gpu_memory_utilization"),
        ({"gpu_memory_utilization": math.inf}, "gpu_memory_utilization"),
        ({"startup_timeout": math.inf}, "startup_timeout"),
        ({"startup_timeout": math.nan}, "startup_timeout"),
        ({"startup_timeout": "600"}, "startup_timeout"),
        ({"shutdown_timeout": math.nan}, "shutdown_timeout"),
        ({"shutdown_timeout": -1}, "shutdown_timeout"),
        ({"progress_interval": math.inf}, "progress_interval"),
        ({"progress_interval": -math.inf}, "progress_interval"),
    ],
)
def test_bad_input_is_a_config_error_naming_field_and_value(kwargs, field):
    model = kwargs.pop("model", MODEL)
    with pytest.raises(ConfigError) as info:
        VLLMServer(model, **kwargs)
    assert info.value.field == field
    assert str(info.value).startswith(f"{field}=")
    if field not in ("env", "devices"):
        value = kwargs.get(field, model)
        assert quoted(value) in str(info.value)


@pytest.mark.parametrize(
    "value", [987654321, "hf_secret\x00", "hf_secret\ud800"], ids=["int", "null", "surrogate"]
)
def test_env_values_are_not_echoed_in_errors(value):
    with pytest.raises(ConfigError) as info:
        VLLMServer(MODEL, env={"HF_TOKEN": value})
    assert info.value.field == "env"
    assert "HF_TOKEN" in str(info.value)
    assert "987654321" not in str(info.value)
    assert "secret" not in str(info.value)
    assert "secret" not in repr(info.value.value)


def test_bracketed_ipv6_host_says_to_drop_the_brackets():
    with pytest.raises(ConfigError, match=r"host='\[::1\]'.*'::1'"):
        VLLMServer(MODEL, host="[::1]")


def test_a_scheme_in_the_host_says_to_drop_it():
    with pytest.raises(ConfigError, match=r"host='http://node-1'.*'node-1'"):
        VLLMServer(MODEL, host="http://node-1")


@pytest.mark.parametrize("host", ["localhost", "node-1.cluster.local", "0.0.0.0", "::", "::1"])
def test_plain_hosts_are_accepted(host):
    assert VLLMServer(MODEL, host=host).host == host


def test_a_log_file_on_a_full_disk_is_a_clear_error_with_nothing_spawned(make_server):
    me = psutil.Process()
    server = make_server(log_path="/dev/full")  # every write fails with ENOSPC
    before_children, before_fds = children(), me.num_fds()
    with pytest.raises(ConfigError) as info:
        server.start()
    assert info.value.field == "log_path"
    assert "/dev/full" in str(info.value)
    assert "No space left" in str(info.value)
    assert children() == before_children
    assert me.num_fds() == before_fds  # the log's handle was closed
    assert server.pid is None


def test_settings_are_checked_when_changed_too():
    server = VLLMServer(MODEL)
    with pytest.raises(ConfigError, match="port="):
        server.port = 0


def test_repr_shows_no_environment():
    server = VLLMServer(MODEL, env={"HF_TOKEN": "hf_secret"}, command=FAKE)
    assert "hf_secret" not in repr(server)
    assert "fake/model" in repr(server)


def test_defaults_match_the_contract():
    server = VLLMServer(MODEL)
    assert (server.port, server.host, server.devices) == (8001, "127.0.0.1", (1,))
    assert (server.startup_timeout, server.shutdown_timeout) == (600.0, 30.0)
    assert server.base_url == "http://127.0.0.1:8001"
    assert (server.pid, server.log_path, server.argv) == (None, None, None)
    assert server.serve_args == tuple(
        vllm_serve_args(MODEL, host="127.0.0.1", port=8001, gpu_memory_utilization=0.9)
    )
    assert VLLMServer(MODEL, host="0.0.0.0").base_url == "http://127.0.0.1:8001"
    assert VLLMServer(MODEL, host="::1", port=9).base_url == "http://[::1]:9"
    assert VLLMServer(MODEL, host="::", port=9).base_url == "http://[::1]:9"


# ---------------------------------------------------------------- log file


def test_an_existing_log_is_appended_to_and_the_tail_is_this_runs(make_server, tmp_path):
    log_path = tmp_path / "kept.log"
    log_path.write_text("previous run: do not lose me\n")
    server = make_server(log_path=log_path, env={"FAKE_VLLM_CRASH": "2:second run failed"})
    with pytest.raises(VLLMServerExited) as info:
        server.start()
    text = log_path.read_text()
    assert text.startswith("previous run: do not lose me\n")
    assert "second run failed" in text
    assert "second run failed" in info.value.log_tail
    assert "previous run" not in info.value.log_tail


def test_a_log_directory_gets_a_per_port_file(make_server, tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    server = make_server(log_path=logs)
    with server:
        pass
    assert server.log_path == logs / f"vllm-serve-{server.port}.log"
    assert "Uvicorn running" in server.log_path.read_text()


def test_default_log_goes_to_the_users_temp_folder_and_is_logged(
    make_server, caplog, tmp_path, monkeypatch
):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))  # this test's own temp directory
    caplog.set_level(logging.INFO, logger="verirl.vllm_server")
    server = make_server(log_path=None)
    with server:
        path = server.log_path
        assert path is not None
        assert path == tmp_path / f"verirl-vllm-{os.getuid()}" / f"vllm-serve-{server.port}.log"
    assert "Uvicorn running" in path.read_text()
    assert any(str(path) in record.getMessage() for record in caplog.records)


def test_read_log_tail_keeps_the_last_lines_after_the_offset(tmp_path):
    path = tmp_path / "x.log"
    path.write_text("old\n" + "".join(f"line {i}\n" for i in range(100)))
    assert read_log_tail(path, lines=2) == "line 98\nline 99\n"
    assert read_log_tail(path, start=len("old\n"), lines=1000).startswith("line 0\n")
    assert read_log_tail(tmp_path / "missing.log") == ""
    assert VLLMServer(MODEL).log_tail() == ""


def test_read_log_tail_of_a_huge_log_drops_the_cut_first_line(tmp_path):
    path = tmp_path / "big.log"
    path.write_text("x" * 200_000 + "\nlast line\n")
    assert read_log_tail(path) == "last line\n"


# ---------------------------------------------------------------- SIGTERM / SIGKILL of the trainer


def test_sigterm_to_the_trainer_unwinds_the_block_and_restores_the_handler(
    make_server, default_sigterm
):
    server = make_server(tensor_parallel_size=2, devices=(0, 1))
    with pytest.raises(SystemExit) as info, server:  # noqa: PT012 - the block is what is tested
        procs = tree(server)
        handler = signal.getsignal(signal.SIGTERM)
        # Without a handler, raise_signal would kill pytest itself.
        assert handler not in (signal.SIG_DFL, signal.SIG_IGN, None)
        signal.raise_signal(signal.SIGTERM)
        pytest.fail("SIGTERM did not leave the with-block")
    assert info.value.code == 128 + signal.SIGTERM
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    assert not survivors(procs)


def test_a_sigterm_handler_of_the_program_is_left_alone_and_is_what_runs(make_server):
    calls: list[int] = []

    def mine(signum, frame):
        calls.append(signum)

    previous = signal.signal(signal.SIGTERM, mine)
    try:
        with make_server() as server:
            assert signal.getsignal(signal.SIGTERM) is mine
            signal.raise_signal(signal.SIGTERM)  # no SystemExit: the program's handler runs
            assert calls == [signal.SIGTERM]
            assert server.running
        assert signal.getsignal(signal.SIGTERM) is mine
    finally:
        signal.signal(signal.SIGTERM, previous)


def test_sigterm_is_held_while_any_server_runs_and_released_once_each(make_server, default_sigterm):
    first, second = make_server(), make_server()
    with first:
        with second:
            assert signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, None)
        assert signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, None)
        second.stop()  # idempotent: does not release the first server's hold
        assert signal.getsignal(signal.SIGTERM) not in (signal.SIG_DFL, None)
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


@pytest.mark.parametrize(
    "env",
    [{"FAKE_VLLM_CRASH": "3:boom"}, {"FAKE_VLLM_STARTUP_DELAY": "60"}],
    ids=["crash", "timeout"],
)
def test_a_failed_start_releases_sigterm(make_server, default_sigterm, env):
    server = make_server(env=env, startup_timeout=0.5)
    with pytest.raises(VLLMServerError):
        server.start()
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


def test_an_interrupted_start_releases_sigterm(make_server, default_sigterm, interrupt_on):
    server = make_server()
    interrupt_on("started vLLM server")
    with pytest.raises(KeyboardInterrupt):
        server.start()
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    assert server.pid is None


def test_handle_sigterm_false_and_other_threads_leave_sigterm_alone(make_server, default_sigterm):
    with make_server(handle_sigterm=False):
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    server = make_server()
    thread, errors = start_in_thread(server)
    thread.join(timeout=60)
    assert not errors
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    server.stop()
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


HOLDER = """
import json, signal, sys, time
import requests
from verirl.vllm_server import VLLMServer

# A trainer with the default SIGTERM disposition (coverage's `sigterm = true` installs its own).
signal.signal(signal.SIGTERM, signal.SIG_DFL)

port, log_path, handle = int(sys.argv[1]), sys.argv[2], sys.argv[3] == "1"
command = [sys.executable, "-m", "fakes.vllm_serve"]
with VLLMServer(
    "fake/model", port=port, command=command, log_path=log_path, handle_sigterm=handle,
    tensor_parallel_size=2, devices=(0, 1), startup_timeout=30, shutdown_timeout=5,
) as server:
    pids = requests.get(server.base_url + "/verirl/workers/", timeout=5).json()["pids"]
    print(json.dumps({"server": server.pid, "workers": pids}), flush=True)
    while True:
        time.sleep(3600)
"""


@pytest.mark.parametrize(
    ("sig", "handle_sigterm", "returncode"),
    [
        pytest.param(signal.SIGTERM, True, 128 + signal.SIGTERM, id="sigterm-handled"),
        pytest.param(
            signal.SIGTERM, False, -signal.SIGTERM, id="sigterm-death-signal", marks=linux_only
        ),
        pytest.param(
            signal.SIGKILL, True, -signal.SIGKILL, id="sigkill-death-signal", marks=linux_only
        ),
    ],
)
def test_killing_the_trainer_leaves_no_server_or_worker(tmp_path, sig, handle_sigterm, returncode):
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            HOLDER,
            str(unshared_port()),
            str(tmp_path / "server.log"),
            "1" if handle_sigterm else "0",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    procs: list[psutil.Process] = []
    try:
        line = holder.stdout.readline()
        assert line, "the holder exited before its server was ready"
        reported = json.loads(line)
        procs = processes([reported["server"], *reported["workers"]])
        assert len(procs) == 3
        holder.send_signal(sig)
        assert holder.wait(timeout=60) == returncode
        assert not survivors(procs, timeout=30)
    finally:
        if holder.poll() is None:
            holder.kill()
            holder.wait()
        holder.stdout.close()
        for process in survivors(procs):
            process.kill()


# ---------------------------------------------------------------- from_topology


@attrs.frozen
class StandInTopology:
    mode: str = "server"
    is_local_server: bool = True
    vllm_devices: tuple[int, ...] = (2, 3)
    host: str = "127.0.0.1"
    port: int = 8123
    max_model_len: int = 4096
    gpu_memory_utilization: float = 0.8
    tensor_parallel_size: int = 2
    data_parallel_size: int = 1
    remote_host: str | None = None


def test_from_topology_takes_gpus_address_and_flags():
    server = VLLMServer.from_topology(StandInTopology(), model=MODEL, shutdown_timeout=3.0)
    assert server.devices == (2, 3)
    assert (server.host, server.port, server.shutdown_timeout) == ("127.0.0.1", 8123, 3.0)
    assert server.serve_args == tuple(
        vllm_serve_args(
            MODEL,
            host="127.0.0.1",
            port=8123,
            gpu_memory_utilization=0.8,
            max_model_len=4096,
            tensor_parallel_size=2,
        )
    )
    assert VLLMServer.from_topology(StandInTopology(), model=MODEL, port=9000).port == 9000


def test_from_topology_refuses_colocate_and_remote_modes():
    colocate = StandInTopology(mode="colocate", is_local_server=False)
    with pytest.raises(ConfigError, match="colocate") as info:
        VLLMServer.from_topology(colocate, model=MODEL)
    assert info.value.field == "topology.mode"
    remote = StandInTopology(is_local_server=False, remote_host="vllm-node")
    with pytest.raises(ConfigError, match=r"vllm-node.*mode='server'"):
        VLLMServer.from_topology(remote, model=MODEL)


def test_from_topology_with_the_real_topology():
    topology = VLLMTopology.plan(4, max_model_len=8192)
    server = VLLMServer.from_topology(topology, model=MODEL)
    assert server.devices == topology.vllm_devices
    assert list(server.serve_args) == topology.serve_args(MODEL)
    with pytest.raises(ConfigError, match="mode"):
        VLLMServer.from_topology(VLLMTopology.plan(1, max_model_len=8192), model=MODEL)


LOGS_ITS_SECRETS = """
import os, sys
# What vLLM does at start-up (it logs its non-default arguments), and a program that prints
# its environment, then dies.
print(f"non-default args: {sys.argv[1:]!r}", flush=True)
print(f"HF_TOKEN seen: {os.environ.get('HF_TOKEN')}", flush=True)
print(f"EXTRA_PASSWORD seen: {os.environ.get('EXTRA_PASSWORD')}", flush=True)
print("endpoint http://user:hunter2-pw@example.com/x", flush=True)
sys.exit(1)
"""


def test_the_servers_log_quoted_in_an_error_never_shows_a_secret(tmp_path, monkeypatch):
    """--api-key, the Hub token and secret variables appear in no error and no log tail."""
    script = tmp_path / "server.py"
    script.write_text(LOGS_ITS_SECRETS)
    secrets = ["sk-TOPSECRET-123456", "hf_SUPERSECRETTOKEN123", "pw-in-env-9876543", "hunter2-pw"]
    monkeypatch.setenv("HF_TOKEN", secrets[1])
    server = VLLMServer(
        "m", port=unshared_port(), command=[sys.executable, str(script)],
        extra_args=["--api-key", secrets[0]], env={"EXTRA_PASSWORD": secrets[2]},
        log_path=tmp_path / "server.log", startup_timeout=60,
    )  # fmt: skip
    with pytest.raises(VLLMServerExited) as info:
        server.start()
    shown = [str(info.value), info.value.log_tail, server.log_tail()]
    assert "non-default args" in info.value.log_tail  # the tail is quoted, minus the secrets
    assert "<hidden>" in info.value.log_tail
    for text in shown:
        for secret in secrets:
            assert secret not in text, (secret, text)


def _interrupt() -> None:
    raise KeyboardInterrupt


def _leave_on(how: str) -> None:
    """Leave a ``with`` block as two signals at once do, or as a program's exit after one."""
    if how == "two signals":
        try:
            sys.exit(128 + signal.SIGTERM)  # the SIGTERM policy's
        finally:
            _interrupt()  # a Ctrl-C whose handler ran as the first unwound
    if how == "one, re-raised as its own":
        try:
            sys.exit(128 + signal.SIGTERM)
        except SystemExit as exc:
            sys.exit(exc.code)  # the program's own re-raise: one signal
    if how == "one, re-raised from None":
        try:
            _interrupt()
        except KeyboardInterrupt:
            raise KeyboardInterrupt("training interrupted by user") from None
    try:
        _interrupt()
    except KeyboardInterrupt:
        sys.exit(1)  # the program's own exit: one signal, then a plain exit


def _timed_block(block: contextlib.AbstractContextManager[object], server, how: str):
    """Enter ``block``, leave it as ``how`` says; the exception, server processes, teardown time."""
    procs: list[psutil.Process] = []
    started = math.inf
    try:
        with block:
            procs = tree(server)
            started = time.monotonic()
            _leave_on(how)
    except (KeyboardInterrupt, SystemExit) as exc:
        return exc, procs, time.monotonic() - started
    raise AssertionError("the block was left without an exception")


@pytest.mark.parametrize(
    "how",
    ["two signals", "one, then sys.exit", "one, re-raised as its own", "one, re-raised from None"],
)
@pytest.mark.parametrize("holder", ["server", "runtime"])
def test_a_block_left_on_two_signals_at_once_skips_the_server_s_grace(make_server, holder, how):
    """Two at once ask for what a second Ctrl-C asks for: SIGKILL now (review of 07089a3).

    The server ignores SIGTERM, so its grace is waited out in full unless it
    is skipped; a program's ``sys.exit`` after one Ctrl-C is no second signal.
    """
    from verirl import DistributedEnv, TrainingRuntime

    grace = 30.0 if how == "two signals" else 2.0
    server = make_server(shutdown_timeout=grace, env={"FAKE_VLLM_IGNORE_SIGTERM": "1"})
    if holder == "server":
        block: contextlib.AbstractContextManager[object] = server
    else:
        topology = VLLMTopology.plan(2, max_model_len=64, port=server.port)
        block = TrainingRuntime(
            topology,
            environ={},
            dist_env=DistributedEnv.single_node(environ={}, master_port=unshared_port()),
            server_factory=lambda _topology: server,
        )
    expected = (
        KeyboardInterrupt if how in ("two signals", "one, re-raised from None") else SystemExit
    )
    exc, procs, took = _timed_block(block, server, how)
    assert type(exc) is expected
    assert not survivors(procs)
    if how == "two signals":
        assert took < grace / 2, took  # SIGKILLed at once, not after the 30 s grace
    else:
        assert took >= grace, took  # the grace, waited out as for one signal

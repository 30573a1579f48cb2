"""The server watchdog in-process: `TrainingRuntime` unwinds its ``with`` block when vLLM dies.

Real parts: `VLLMServer` running the fake server program (SIGKILLed as the
OOM killer does), loopback HTTP servers for the health half, the real
SIGTERM policy. The main thread blocks as a trainer does (an event wait, a
socket read) and must be interrupted promptly.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Callable, Iterator
from http.server import BaseHTTPRequestHandler, HTTPServer

import psutil
import pytest

from _support import master_port_beside, unshared_port
from verirl import (
    DistributedEnv,
    TrainingRuntime,
    VLLMServer,
    VLLMServerExited,
    VLLMServerUnresponsive,
    VLLMTopology,
)
from verirl._signals import SIGTERM_POLICY, exit_on_sigterm
from verirl._stop import STOP_REQUESTS
from verirl.server.watchdog import ServerWatchdog

FAKE = (sys.executable, "-m", "fakes.vllm_serve")


def fake_server_runtime(tmp_path, **kwargs) -> TrainingRuntime:
    """A local server-mode runtime whose server is the fake program, in a real process."""
    env: dict[str, str] = {}
    topology = VLLMTopology.plan(2, max_model_len=64, port=unshared_port())
    return TrainingRuntime(
        topology,
        environ=env,
        dist_env=DistributedEnv.single_node(environ=env, master_port=master_port_beside(topology)),
        server_factory=lambda t: VLLMServer.from_topology(
            t, model="m", command=FAKE, log_path=tmp_path
        ),
        **kwargs,
    )


class Health(BaseHTTPRequestHandler):
    """``/health``: 200, or 503 while the server's ``failing`` counter is positive."""

    def do_GET(self) -> None:
        server = self.server
        assert isinstance(server, HealthServer)
        with server.lock:
            server.requests += 1
            failing = server.failing != 0
            server.failing = max(server.failing - 1, 0) if server.failing != -1 else -1
            if not failing:
                server.last_ok = time.monotonic()  # before the answer leaves: the client's is later
        self.send_response(503 if failing else 200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        pass


class HealthServer(HTTPServer):
    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), Health)
        self.lock = threading.Lock()
        self.failing = 0  # -1: always
        self.requests = 0
        self.last_ok: float | None = None  # when it last answered 200

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


@pytest.fixture
def health_server() -> Iterator[HealthServer]:
    server = HealthServer()
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05})
    thread.start()
    yield server
    server.shutdown()
    server.server_close()
    thread.join()


@pytest.fixture
def no_stop_state() -> Iterator[None]:
    STOP_REQUESTS.reset()
    yield
    STOP_REQUESTS.reset()


def test_a_killed_server_interrupts_a_blocking_main_thread_with_its_exit(
    tmp_path, default_sigterm, no_stop_state
):
    rt = fake_server_runtime(tmp_path)
    workers: list[psutil.Process] = []
    killed_at: list[float] = []

    def train() -> None:
        with rt as session:
            pid = session.server.pid  # type: ignore[union-attr]
            workers.extend(psutil.Process(pid).children(recursive=True))
            killed_at.append(time.monotonic())  # before: the watchdog may be faster than us
            psutil.Process(pid).kill()
            threading.Event().wait(60)  # a trainer blocked on the server: the watchdog ends it

    with pytest.raises(VLLMServerExited) as caught:
        train()
    took = time.monotonic() - killed_at[0]
    assert took < 3, took
    assert type(caught.value) is VLLMServerExited
    assert caught.value.returncode == -signal.SIGKILL
    assert "Uvicorn running" in caught.value.log_tail
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # the policy was released
    _, alive = psutil.wait_procs(workers, timeout=10)
    assert not alive


@contextlib.contextmanager
def _killer(pid: int) -> Iterator[Callable[[], None]]:
    """A SIGKILL for the server at each call, through a pidfd opened once, closed after.

    The watchdog's interrupt may land anywhere in the loop that calls it: in
    psutil, between its opening a /proc file and its ``with``, the file was
    left for the collector, whose ResourceWarning failed the test (a
    fresh-clone CI run, tests-3.10). A pidfd is never another process's.
    """
    pidfd = os.pidfd_open(pid)
    try:

        def kill() -> None:
            with contextlib.suppress(ProcessLookupError):  # gone already
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)

        yield kill
    finally:
        os.close(pidfd)


def test_a_swallowed_interrupt_still_ends_the_block_with_the_servers_death(
    tmp_path, default_sigterm, no_stop_state
):
    """A retry wrapper that catches every Exception swallows the one interrupt: the block
    must not then end as if training had succeeded with a dead server."""
    rt = fake_server_runtime(tmp_path)
    swallowed: list[BaseException] = []

    def train() -> None:
        with rt as session, _killer(session.server.pid) as kill:  # type: ignore[union-attr]
            deadline = time.monotonic() + 30
            try:  # the interrupt may also land on the loop's own lines, outside the retry's try
                while not swallowed and time.monotonic() < deadline:
                    try:  # the kill inside: the interrupt may come before the next line runs
                        kill()
                        threading.Event().wait(0.05)  # a generation call, retried on any error
                    except Exception as exc:  # noqa: BLE001 - the user's code under test
                        swallowed.append(exc)
            except Exception as exc:  # noqa: BLE001 - the same user's code, one level up
                swallowed.append(exc)

    with pytest.raises(VLLMServerExited) as caught:
        train()
    assert swallowed == [caught.value]  # the same death, raised again as the block ends
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


def test_a_failure_handed_over_by_stop_watchdog_is_not_raised_again(
    tmp_path, default_sigterm, no_stop_state
):
    """verirl launch takes the failure itself (stop_watchdog) once its command has ended."""
    rt = fake_server_runtime(tmp_path)
    with rt as session, _killer(session.server.pid) as kill:  # type: ignore[union-attr]
        deadline = time.monotonic() + 30
        interrupted: list[BaseException] = []
        try:  # the interrupt may land on the loop's own lines as well as inside
            while not interrupted and time.monotonic() < deadline:
                try:
                    kill()
                    threading.Event().wait(0.05)
                except VLLMServerExited as exc:
                    interrupted.append(exc)
        except VLLMServerExited as exc:
            interrupted.append(exc)
        assert len(interrupted) == 1  # its one interrupt has come: none is on its way
        assert rt.stop_watchdog() is interrupted[0]
    assert rt.session is None


def test_a_blocking_socket_read_is_interrupted_too(tmp_path, default_sigterm, no_stop_state):
    rt = fake_server_runtime(tmp_path)
    reader, writer = socket.socketpair()
    try:

        def train() -> None:
            with rt as session:
                psutil.Process(session.server.pid).kill()  # type: ignore[union-attr]
                reader.recv(1)  # never answered: a collective waiting on a peer

        with pytest.raises(VLLMServerExited):
            train()
    finally:
        reader.close()
        writer.close()


def test_a_listening_training_loop_saves_and_raises_first_and_is_not_interrupted(
    tmp_path, default_sigterm, no_stop_state
):
    requested: list[BaseException] = []
    stop = threading.Event()

    def listener(error: BaseException) -> None:  # what PreemptionCallback does
        requested.append(error)
        stop.set()

    remove = STOP_REQUESTS.listen(listener)
    saved: list[bool] = []

    def train() -> None:
        with fake_server_runtime(tmp_path) as session:
            psutil.Process(session.server.pid).kill()  # type: ignore[union-attr]
            assert stop.wait(30)  # the step ends, the checkpoint is written ...
            saved.append(True)
            raise requested[0]  # ... and the callback raises the error it was given

    try:
        with pytest.raises(VLLMServerExited) as caught:
            train()
    finally:
        remove()
    assert saved == [True]
    assert caught.value is requested[0]
    assert len(requested) == 1
    assert not SIGTERM_POLICY.fired


def test_a_listening_loop_that_never_stops_is_interrupted_after_the_grace(
    tmp_path, default_sigterm, no_stop_state
):
    requested: list[BaseException] = []
    remove = STOP_REQUESTS.listen(requested.append)
    try:
        rt = fake_server_runtime(tmp_path, vllm_failure_grace=0.5)

        def train() -> None:
            with rt as session:
                psutil.Process(session.server.pid).kill()  # type: ignore[union-attr]
                threading.Event().wait(60)  # stuck in a collective: never reaches its step end

        with pytest.raises(VLLMServerExited) as caught:
            train()
    finally:
        remove()
    assert requested == [caught.value]


def test_a_remote_server_that_stops_answering_unwinds_another_rank(
    health_server, default_sigterm, no_stop_state
):
    port = health_server.server_address[1]
    env: dict[str, str] = {}
    topology = VLLMTopology.plan(1, max_model_len=64, remote_host="127.0.0.1", port=port)
    rt = TrainingRuntime(
        topology,
        environ=env,
        dist_env=DistributedEnv.single_node(environ=env, master_port=master_port_beside(topology)),
        vllm_unresponsive_timeout=1.0,
    )
    failing_since: list[float] = []

    def train() -> None:
        with rt:
            failing_since.append(time.monotonic())  # before: the next check may come at once
            with health_server.lock:
                health_server.failing = -1
            threading.Event().wait(60)

    with pytest.raises(VLLMServerUnresponsive) as caught:
        train()
    ended = time.monotonic()
    # The bound runs from the last healthy answer (up to one health interval before the
    # server started failing), not from when this thread got round to making it fail.
    assert health_server.last_ok is not None
    assert ended - health_server.last_ok >= 1.0, ended - health_server.last_ok
    assert ended - failing_since[0] < 4.0, ended - failing_since[0]
    assert caught.value.returncode is None
    assert caught.value.last_error == "HTTP 503"
    assert caught.value.url == health_server.url


def test_one_failed_health_request_does_not_trip_it(health_server):
    fired: list[BaseException] = []
    dog = ServerWatchdog(
        None, health_server.url, unresponsive_timeout=1.0, interval=0.1, interrupt=fired.append
    )
    dog.start()
    try:
        deadline = time.monotonic() + 3.0
        while time.monotonic() < deadline:  # ~30 requests, every fifth one failing
            with health_server.lock:
                if health_server.requests % 5 == 0:
                    health_server.failing = 1
            threading.Event().wait(0.1)
    finally:
        dog.stop()
        dog.join(5)
    assert health_server.requests >= 10
    assert fired == []
    assert dog.failure is None


def test_it_never_acts_after_stop(health_server):
    fired: list[BaseException] = []
    dog = ServerWatchdog(
        None, health_server.url, unresponsive_timeout=0.3, interval=0.05, interrupt=fired.append
    )
    dog.start()
    dog.stop()
    with health_server.lock:
        health_server.failing = -1
    dog.join(5)
    assert fired == []
    assert dog.failure is None


def test_a_normal_exit_stops_the_watchdog_before_the_server(tmp_path, default_sigterm):
    rt = fake_server_runtime(tmp_path, vllm_unresponsive_timeout=0.5)
    with rt:
        pass
    # Stopping the server did not look like its death: no interrupt is pending.
    assert not SIGTERM_POLICY.fired
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


def test_the_policy_interrupts_only_while_its_handler_is_installed(default_sigterm):
    error = VLLMServerExited(-9, "")
    assert not SIGTERM_POLICY.interrupt(error)  # not held
    with exit_on_sigterm():

        def block() -> None:
            assert SIGTERM_POLICY.interrupt(error)
            threading.Event().wait(10)

        with pytest.raises(VLLMServerExited) as caught:
            block()
        assert caught.value is error
        assert not SIGTERM_POLICY.interrupt(error)  # it fired once: a second one is ignored
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    with exit_on_sigterm():
        assert not SIGTERM_POLICY.interrupt(error)  # a program's disposition is never taken over


def test_a_withdrawn_interrupt_is_ignored_when_it_lands(default_sigterm):
    error = VLLMServerExited(-9, "")
    with exit_on_sigterm():
        signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
        try:
            assert SIGTERM_POLICY.interrupt(error)
            assert SIGTERM_POLICY.withdraw(error)
        finally:
            signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})  # it lands here
        assert not SIGTERM_POLICY.fired

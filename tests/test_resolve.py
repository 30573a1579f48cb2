"""Name lookups have a deadline: a DNS server that never answers holds no request past it.

`socket.getaddrinfo` takes no timeout and runs no signal handler until it
returns. The tests stand in for such a resolver without touching the
system: `socket.getaddrinfo` is replaced, in this process or in a CLI
subprocess, by one that holds names under ``.example`` for `HANG` seconds
and defers any signal handler's exception until it returns, as the C call
does. The real resolver answers every other name.
"""

from __future__ import annotations

import contextlib
import http.server
import os
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from fakes._http import serve_in_background, stop_serving
from verirl import CheckpointSourceError, ConfigError, EnvServerUnavailable, HttpEnvServerProbe
from verirl._http import TIMED_OUT, deadline_session, request_health
from verirl.checkpoints import HubCheckpointSource

ROOT = Path(__file__).resolve().parent.parent

HANG = 10.0
"""How long the stand-in resolver holds a name, as glibc does with an unanswered server."""

SLACK = 4.0
"""What a deadline may overrun on a loaded machine: well short of `HANG`, so a hang still fails."""

REAL_GETADDRINFO = socket.getaddrinfo


class HangingResolver:
    """`socket.getaddrinfo` for a DNS server that never answers names under ``.example``."""

    def __init__(self) -> None:
        self.released = threading.Event()
        self.calls: list[tuple[str, str]] = []  # (host, thread name)
        self.answers: dict[str, str] = {}  # host -> address, answered at once

    def __call__(self, host: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
        name = host.decode() if isinstance(host, bytes) else str(host)
        if name in self.answers:
            self.calls.append((name, threading.current_thread().name))
            return REAL_GETADDRINFO(self.answers[name], port, *args, **kwargs)
        if not name.endswith(".example"):
            return REAL_GETADDRINFO(host, port, *args, **kwargs)
        self.calls.append((name, threading.current_thread().name))
        deadline = time.monotonic() + HANG
        deferred: BaseException | None = None
        while (left := deadline - time.monotonic()) > 0 and not self.released.is_set():
            try:
                self.released.wait(min(left, 0.05))
            except BaseException as exc:  # noqa: BLE001 - the C call runs no handler until it returns
                deferred = deferred or exc
        if deferred is not None:
            raise deferred
        raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")


@pytest.fixture
def resolver(monkeypatch: pytest.MonkeyPatch) -> Iterator[HangingResolver]:
    hanging = HangingResolver()
    monkeypatch.setattr(socket, "getaddrinfo", hanging)
    try:
        yield hanging
    finally:
        hanging.released.set()  # the lookup threads left hanging end now


def timed(call: Callable[[], object]) -> tuple[object, float]:
    started = time.monotonic()
    try:
        result: object = call()
    except BaseException as exc:  # noqa: BLE001 - returned for the test to look at
        result = exc
    return result, time.monotonic() - started


# ---------------------------------------------------------------- in this process


def test_wait_ends_at_its_deadline_while_the_lookup_hangs(resolver):
    probe = HttpEnvServerProbe("http://envserver.example:8000", request_timeout=1.0)
    error, took = timed(lambda: probe.wait(1.0))
    assert isinstance(error, EnvServerUnavailable), error
    assert error.last_error == TIMED_OUT
    assert took < 1.0 + SLACK, f"wait(1.0) took {took:.2f}s"
    assert resolver.calls, "the stand-in resolver was not asked"
    assert all(thread != threading.current_thread().name for _, thread in resolver.calls)


def test_check_ends_within_request_timeout_while_the_lookup_hangs(resolver):
    probe = HttpEnvServerProbe("http://envserver.example:8000", request_timeout=0.5)
    healthy, took = timed(probe.check)
    assert healthy is False
    assert took < 0.5 + SLACK, f"check() took {took:.2f}s"


def test_request_health_names_a_timeout_and_the_host(resolver):
    with deadline_session() as session:
        reason, took = timed(lambda: request_health(session, "http://envserver.example/h", 0.3))
    assert reason == TIMED_OUT
    assert took < 0.3 + SLACK, f"request_health took {took:.2f}s"


def test_overlapping_lookups_of_one_name_share_one_thread(resolver):
    from verirl._resolve import LookupTimeoutError, resolve  # new in this change

    for _ in range(3):
        with pytest.raises(LookupTimeoutError, match=r"envserver\.example"):
            resolve("envserver.example", 80, timeout=0.05)
    assert len(resolver.calls) == 1, resolver.calls


def test_a_failed_lookup_is_still_a_dns_failure(resolver, monkeypatch):
    def unknown(host: Any, *args: Any, **kwargs: Any) -> Any:
        raise socket.gaierror(socket.EAI_NONAME, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", unknown)
    with deadline_session() as session:
        assert request_health(session, "http://nowhere.example/", 2.0) == "DNS lookup failed"


def test_a_signal_ends_a_wait_on_a_hanging_lookup(resolver):
    class Stop(BaseException):  # as SystemExit and KeyboardInterrupt are
        pass

    def stop(*_: object) -> None:
        raise Stop

    previous = signal.signal(signal.SIGALRM, stop)
    probe = HttpEnvServerProbe("http://envserver.example:8000", request_timeout=30.0)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.3)
        error, took = timed(lambda: probe.wait(30.0))
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    assert isinstance(error, Stop), error
    assert took < 0.3 + SLACK, f"the signal ended the wait after {took:.2f}s"


@contextlib.contextmanager
def host_recorder() -> Iterator[tuple[int, list[str]]]:
    """A loopback server answering 200 that records each request's ``Host`` header."""
    hosts: list[str] = []

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            hosts.append(self.headers.get("Host", ""))
            self.send_response(200)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, *_: object) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = serve_in_background(server, "test-host-recorder")
    try:
        yield server.server_address[1], hosts
    finally:
        stop_serving(server, thread)


def test_the_connection_goes_to_the_address_found_and_keeps_the_host_name(resolver):
    resolver.answers["envserver.example"] = "127.0.0.1"
    with host_recorder() as (port, hosts):
        probe = HttpEnvServerProbe(f"http://envserver.example:{port}", request_timeout=5.0)
        assert probe.check()
    assert hosts == [f"envserver.example:{port}"]
    assert [host for host, _ in resolver.calls] == ["envserver.example"]  # one lookup, bounded


def test_a_hub_source_fails_within_its_timeout_while_the_lookup_hangs(
    resolver, tmp_path, monkeypatch
):
    # Not isolated_hf_client: it refuses hub.example before any lookup. The
    # stand-in resolver holds the name, so nothing leaves this machine.
    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_TOKEN_PATH"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    source = HubCheckpointSource(
        "org/run", download_dir=tmp_path / "dl", endpoint="http://hub.example", timeout=1.0
    )
    from huggingface_hub import close_session

    try:
        error, took = timed(source.latest)
    finally:
        close_session()
    assert isinstance(error, CheckpointSourceError), error
    assert "timed out" in str(error)
    assert "hub.example" in str(error)
    assert took < 1.0 + SLACK, f"latest() took {took:.2f}s"


# ---------------------------------------------------------------- the CLI

WRAPPER = textwrap.dedent(
    """
    import socket, sys, threading, time, runpy
    real, marker = socket.getaddrinfo, sys.argv.pop(1)

    def hanging(host, *args, **kwargs):
        if not str(host).endswith(".example"):
            return real(host, *args, **kwargs)
        open(marker, "w").close()
        deadline, deferred = time.monotonic() + HANG, None
        while time.monotonic() < deadline:
            try:
                time.sleep(0.05)
            except BaseException as exc:  # the C call runs no handler until it returns
                deferred = deferred or exc
        if deferred is not None:
            raise deferred
        raise socket.gaierror(socket.EAI_AGAIN, "Temporary failure in name resolution")

    socket.getaddrinfo = hanging
    sys.argv[0] = "verirl"
    runpy.run_module("verirl", run_name="__main__", alter_sys=True)
    """
).replace("HANG", repr(HANG))


def verirl_with_hanging_dns(tmp_path: Path, *args: str) -> tuple[subprocess.Popen[bytes], Path]:
    marker = tmp_path / "lookup-started"
    env = {name: value for name, value in os.environ.items() if not name.startswith("VERIRL_")}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    command = [sys.executable, "-c", WRAPPER, str(marker), *args]
    proc = subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path
    )
    return proc, marker


def test_wait_env_ends_at_its_timeout_while_the_lookup_hangs(tmp_path):
    started = time.monotonic()
    proc, marker = verirl_with_hanging_dns(
        tmp_path, "wait-env", "http://envserver.example:8000", "--timeout", "1"
    )
    try:
        out, err = proc.communicate(timeout=HANG + 20)
    finally:
        proc.kill()
        proc.wait()
    took = time.monotonic() - started
    assert marker.exists(), err.decode(errors="replace")
    assert proc.returncode == 3, err.decode(errors="replace")
    assert "timed out" in out.decode(errors="replace")
    assert took < 5.0, f"wait-env --timeout 1 took {took:.2f}s"


def test_sigterm_ends_wait_env_at_once_while_the_lookup_hangs(tmp_path):
    proc, marker = verirl_with_hanging_dns(
        tmp_path, "wait-env", "http://envserver.example:8000", "--timeout", "60"
    )
    try:
        deadline = time.monotonic() + 30
        while not marker.exists() and time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.02)
        assert marker.exists(), "the lookup never started"
        time.sleep(0.2)
        sent = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=HANG + 20)
        took = time.monotonic() - sent
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == 143, err.decode(errors="replace")
    assert took < SLACK, f"SIGTERM ended wait-env after {took:.2f}s"


def test_a_bind_host_that_does_not_resolve_in_time_is_a_config_error(resolver, monkeypatch):
    from verirl import _net

    monkeypatch.setattr(_net, "_BIND_LOOKUP_TIMEOUT", 0.3, raising=False)
    error, took = timed(lambda: _net.check_port_free("vllm-node.example", 8123))
    assert isinstance(error, ConfigError), error
    assert "vllm-node.example" in str(error)
    assert "timed out" in str(error)
    assert took < 0.3 + SLACK, f"check_port_free took {took:.2f}s"

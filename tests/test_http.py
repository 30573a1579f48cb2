"""verirl._http: the one health GET, and the reason it gives, against real loopback sockets.

Both the env-server probe and the vLLM server's readiness wait send this
request, so a misread reason would mislead both. Each reason is produced by
a real socket doing that thing, never by an exception made up for the test.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
from collections.abc import Iterator

import pytest
import requests

from fakes import FakeEnvServer
from verirl import EnvServerUnavailable, HttpEnvServerProbe
from verirl._http import deadline_session, request_health


@contextlib.contextmanager
def closed_port() -> Iterator[int]:
    """A loopback port bound by this test but not listening: connecting is refused."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        yield sock.getsockname()[1]


@contextlib.contextmanager
def hangs_up(*, reset: bool) -> Iterator[int]:
    """A listener that reads each request and closes without answering (``reset``: with RST)."""
    listener = socket.create_server(("127.0.0.1", 0))
    listener.settimeout(10.0)
    done = threading.Event()

    def serve() -> None:
        while not done.is_set():
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                conn.settimeout(5.0)
                with contextlib.suppress(OSError):
                    conn.recv(4096)
                if reset:
                    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    try:
        yield listener.getsockname()[1]
    finally:
        done.set()
        with contextlib.suppress(OSError):  # wakes the accept() so that the thread ends now
            socket.create_connection(listener.getsockname(), timeout=1).close()
        thread.join(timeout=10)
        listener.close()


@pytest.fixture(params=["deadline", "plain"])
def session(request) -> Iterator[requests.Session]:
    """Both kinds of session a caller may pass: the reason must not depend on it."""
    with deadline_session() if request.param == "deadline" else requests.Session() as made:
        yield made


def test_a_closed_port_is_connection_refused(session):
    with closed_port() as port:
        assert request_health(session, f"http://127.0.0.1:{port}/health", 5.0) == (
            "connection refused"
        )


def test_a_name_that_does_not_resolve_is_a_dns_failure_not_a_refusal(session):
    """The host reads "refused"; a reason taken from the message text would say so."""
    url = "http://connection-refused.invalid:8000/refused"  # .invalid never resolves (RFC 6761)
    assert request_health(session, url, 5.0) == "DNS lookup failed"


def test_a_server_that_never_answers_is_timed_out(session):
    with FakeEnvServer(hang=True) as env:
        assert request_health(session, env.url + "/health", 0.3) == "timed out"


def test_an_error_status_is_reported_as_such(session):
    with FakeEnvServer(ready_after=None, status_when_not_ready=503) as env:
        assert request_health(session, env.url + "/health", 5.0) == "HTTP 503"
        env.set_ready()
        assert request_health(session, env.url + "/health", 5.0) is None


def test_a_server_that_closes_without_answering_is_not_a_refusal(session):
    with hangs_up(reset=False) as port:
        reason = request_health(session, f"http://127.0.0.1:{port}/health", 5.0)
    assert reason == "connection closed before an answer"


def test_a_server_that_resets_the_connection_is_not_a_refusal(session):
    with hangs_up(reset=True) as port:
        reason = request_health(session, f"http://127.0.0.1:{port}/health", 5.0)
    assert reason in ("connection reset", "connection closed before an answer")


def test_the_probe_reports_the_same_reasons():
    with closed_port() as port, pytest.raises(EnvServerUnavailable) as refused:
        HttpEnvServerProbe(f"http://127.0.0.1:{port}").wait(timeout=2.0)
    assert refused.value.last_error == "connection refused"
    with pytest.raises(EnvServerUnavailable) as unresolved:
        HttpEnvServerProbe("http://refused.invalid:8000").wait(timeout=2.0)
    assert unresolved.value.last_error == "DNS lookup failed"

"""Test doubles for the reward environment server.

`FakeEnvServer` is a real HTTP server on loopback whose health endpoint you
script; `FakeEnvServerProbe` implements `verirl.EnvServerProbe` with no
network at all. Both are used by verirl's own tests and ship for yours::

    with FakeEnvServer(ready_after=0.5) as server:
        HttpEnvServerProbe(server.url).wait(timeout=5)
"""

from __future__ import annotations

import http
import http.server
import socket
import ssl
import sys
import threading
import time
from typing import Any

import attrs

from fakes._http import QuietHTTPServer, serve_in_background, stop_serving
from verirl.envserver import check_wait_timeout
from verirl.errors import EnvServerUnavailable

if sys.version_info >= (3, 11):
    from typing import Self
else:
    from typing_extensions import Self

__all__ = ["FakeEnvServer", "FakeEnvServerProbe"]


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _HTTPServer
    protocol_version = "HTTP/1.1"
    # uvicorn, like most servers, sets TCP_NODELAY: without it a keep-alive answer written
    # in two parts waits ~40 ms for the client's delayed ACK.
    disable_nagle_algorithm = True

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002, ANN401
        """Keep test output quiet; requests are recorded on the fake instead."""

    def do_GET(self) -> None:
        fake = self.server.fake
        fake._record(self.path, self.headers.get("Authorization"))  # noqa: SLF001
        if self.path.rstrip("/") != fake.health_path.rstrip("/"):
            self._reply(404, b'{"detail": "Not Found"}')
            return
        if fake.hang:
            fake._released.wait()  # noqa: SLF001 - held until the fake is told or closed
            return
        if fake.is_ready():
            self._reply(200, b'{"status": "ok"}')
        else:
            self._reply(fake.status_when_not_ready, b'{"status": "starting"}')

    def _reply(self, status: int, body: bytes) -> None:
        trickle = self.server.fake.trickle
        if trickle is not None:
            self._trickle(status, body, trickle)
            return
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _trickle(self, status: int, body: bytes, interval: float) -> None:
        """Send the whole answer one byte every ``interval`` seconds, then close."""
        self.close_connection = True
        head = (
            f"HTTP/1.1 {status} {http.HTTPStatus(status).phrase}\r\n"
            "Content-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n"
            "Connection: close\r\n\r\n"
        )
        data = head.encode("ascii") + body
        released = self.server.fake._released  # noqa: SLF001 - the fake owns its handler
        for index in range(len(data)):
            if released.wait(interval):  # the fake was stopped: give up at once
                return
            try:
                self.wfile.write(data[index : index + 1])
                self.wfile.flush()
            except OSError:  # the client gave up, as a bounded probe should
                return


class _HTTPServer(QuietHTTPServer):
    daemon_threads = True
    fake: FakeEnvServer


class _HTTPServer6(_HTTPServer):
    address_family = socket.AF_INET6


@attrs.define
class FakeEnvServer:
    """A loopback HTTP server whose ``health_path`` answers as scripted.

    ``ready_after`` seconds after `start` (``None``: only when `set_ready` is
    called) it answers 200 ``{"status": "ok"}``; before that,
    ``status_when_not_ready`` (503). ``hang=True`` accepts connections and
    never answers, like a wedged server. ``trickle`` (seconds) sends every
    answer one byte at a time, that far apart, like a server stuck in a slow
    network. ``ssl_context`` (a server-side context with its certificate
    loaded) serves HTTPS. ``host`` may be an IPv6 address (``"::1"``). ``request_times``
    records when each request arrived (monotonic clock), ``paths`` what it
    asked for, ``authorizations`` its ``Authorization`` header (or ``None``).
    """

    ready_after: float | None = 0.0
    status_when_not_ready: int = 503
    hang: bool = False
    trickle: float | None = None
    ssl_context: ssl.SSLContext | None = attrs.field(default=None, repr=False)
    health_path: str = "/health"
    host: str = "127.0.0.1"
    port: int = 0
    request_times: list[float] = attrs.field(factory=list, init=False)
    paths: list[str] = attrs.field(factory=list, init=False)
    authorizations: list[str | None] = attrs.field(factory=list, init=False)
    _started_at: float | None = attrs.field(default=None, init=False)
    _ready_event: threading.Event = attrs.field(factory=threading.Event, init=False)
    _released: threading.Event = attrs.field(factory=threading.Event, init=False)
    _lock: threading.Lock = attrs.field(factory=threading.Lock, init=False)
    _httpd: _HTTPServer | None = attrs.field(default=None, init=False)
    _thread: threading.Thread | None = attrs.field(default=None, init=False)

    @property
    def url(self) -> str:
        """Base URL, e.g. ``http://127.0.0.1:54321``."""
        if self._httpd is None:
            msg = "FakeEnvServer is not started"
            raise RuntimeError(msg)
        host = f"[{self.host}]" if ":" in self.host else self.host
        scheme = "http" if self.ssl_context is None else "https"
        return f"{scheme}://{host}:{self._httpd.server_address[1]}"

    @property
    def requests(self) -> int:
        """How many requests arrived so far."""
        with self._lock:
            return len(self.request_times)

    def _record(self, path: str, authorization: str | None) -> None:
        with self._lock:
            self.request_times.append(time.monotonic())
            self.paths.append(path)
            self.authorizations.append(authorization)

    def is_ready(self) -> bool:
        """Whether the health endpoint answers 200 right now."""
        if self._ready_event.is_set():
            return True
        if self.ready_after is None or self._started_at is None:
            return False
        if time.monotonic() - self._started_at >= self.ready_after:
            self._ready_event.set()
            return True
        return False

    @property
    def ready_at(self) -> float | None:
        """Monotonic time the server became (or becomes) healthy, if known."""
        if self._started_at is None or self.ready_after is None:
            return None
        return self._started_at + self.ready_after

    def set_ready(self, ready: bool = True) -> None:
        """Turn health on (or off again) now."""
        if ready:
            self._ready_event.set()
        else:
            self._ready_event.clear()
            self.ready_after = None

    def release(self) -> None:
        """Let hanging requests finish (they get no answer) and trickling ones stop."""
        self._released.set()

    def start(self) -> None:
        """Bind and serve in a background thread."""
        server_class = _HTTPServer6 if ":" in self.host else _HTTPServer
        self._httpd = server_class((self.host, self.port), _Handler)
        self._httpd.fake = self
        if self.ssl_context is not None:
            # The handshake happens in the handler's thread, not in the accept loop.
            self._httpd.socket = self.ssl_context.wrap_socket(
                self._httpd.socket, server_side=True, do_handshake_on_connect=False
            )
        self._started_at = time.monotonic()
        self._thread = serve_in_background(self._httpd, "fake-env-server")

    def stop(self) -> None:
        """Stop serving and close the socket; safe to call twice."""
        self._released.set()
        stop_serving(self._httpd, self._thread)
        self._httpd = None
        self._thread = None

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


@attrs.define
class FakeEnvServerProbe:
    """A scripted `verirl.EnvServerProbe`: healthy from the ``ready_after_checks``-th check.

    ``ready_after_checks=None`` never becomes healthy. ``wait`` takes
    ``wait_delay`` seconds (to model a slow environment in overlap tests),
    then succeeds or raises `EnvServerUnavailable`. Calls are recorded.
    """

    url: str = "http://fake-env-server"
    ready_after_checks: int | None = 0
    wait_delay: float = 0.0
    checks: int = attrs.field(default=0, init=False)
    waits: list[float] = attrs.field(factory=list, init=False)

    def check(self) -> bool:
        """Count the check; healthy once ``ready_after_checks`` checks have failed."""
        self.checks += 1
        return self.ready_after_checks is not None and self.checks > self.ready_after_checks

    def wait(self, timeout: float) -> None:
        """Record ``timeout``, take ``wait_delay`` seconds, then succeed or raise.

        ``timeout`` is checked as `verirl.HttpEnvServerProbe.wait` checks it
        (`verirl.ConfigError` unless a finite number of seconds >= 0).
        """
        timeout = check_wait_timeout(timeout)
        self.waits.append(timeout)
        if self.wait_delay:
            time.sleep(min(self.wait_delay, timeout))
        if self.ready_after_checks is None or self.wait_delay > timeout:
            raise EnvServerUnavailable(self.url, min(self.wait_delay, timeout), "fake: never ready")
        self.checks = max(self.checks, self.ready_after_checks + 1)

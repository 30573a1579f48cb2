"""Loopback HTTP for the fakes: serve in a background thread, stop, and route JSON requests.

`serve_in_background` / `stop_serving` run any `socketserver` one way for
every fake. `bind_json_server` binds a threaded server that dispatches to a
table of routes the way Starlette (under FastAPI, uvicorn and so vLLM) does
where that is cheap to copy: an unknown path is 404 ``{"detail": "Not Found"}``,
a known path asked with another method 405 ``{"detail": "Method Not Allowed"}``
with an ``Allow`` header, and the trailing-slash twin of a known path a 307 to
it (query kept). Bodies are read only up to ``max_body`` bytes (413 beyond, 411
for a chunked one), idle connections time out, and a handler that raises gets
a 500 instead of taking a thread's traceback to stderr.
"""

from __future__ import annotations

import http.server
import json
import logging
import socket
import socketserver
import sys
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from http import HTTPStatus
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

log = logging.getLogger(__name__)

__all__ = [
    "MAX_CONNECTIONS",
    "JSONHTTPServer",
    "Request",
    "Response",
    "Routes",
    "bind_json_server",
    "serve_in_background",
    "stop_serving",
]

_IDLE_TIMEOUT = 30.0
MAX_CONNECTIONS = 64
"""Connections served at once; one more is closed at once."""


def serve_in_background(server: socketserver.BaseServer, name: str) -> threading.Thread:
    """Start ``server.serve_forever`` in a daemon thread named ``name``; return the thread."""
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, name=name, daemon=True
    )
    thread.start()
    return thread


def stop_serving(server: socketserver.BaseServer | None, thread: threading.Thread | None) -> None:
    """Stop ``server`` (if any), close its socket and join its ``thread``."""
    if server is not None:
        server.shutdown()
        server.server_close()
    if thread is not None:
        thread.join(timeout=5)


@dataclass(frozen=True)
class Request:
    """One request, its body already read: what a route handler gets."""

    method: str
    path: str
    query: Mapping[str, Sequence[str]]
    headers: Mapping[str, str]
    body: bytes
    client_host: str

    def query_value(self, name: str) -> str | None:
        """The last value of query parameter ``name`` (as Starlette reads it), or ``None``."""
        values = self.query.get(name)
        return values[-1] if values else None


@dataclass(frozen=True)
class Response:
    """What a route handler returns: a status and a JSON body (``None``: an empty body)."""

    status: int
    body: object = None
    headers: Mapping[str, str] = field(default_factory=dict)


Routes = Mapping[str, Mapping[str, Callable[[Request], Response]]]
"""path → method → handler."""


class QuietHTTPServer(http.server.ThreadingHTTPServer):
    """A threaded server that logs a client hanging up mid-answer instead of printing a traceback.

    Clients hang up as a rule in tests (a probe's deadline, a download aborted
    on purpose); the stdlib prints each such error to stderr.
    """

    def handle_error(self, request: Any, client_address: Any) -> None:  # noqa: ANN401
        """Log a connection error at DEBUG; anything else as the stdlib does."""
        error = sys.exc_info()[1]
        if isinstance(error, ConnectionError):
            log.debug("%s: client %s hung up: %s", type(self).__name__, client_address, error)
            return
        super().handle_error(request, client_address)


class JSONHTTPServer(QuietHTTPServer):
    """A threaded HTTP server answering from `Routes` (see `bind_json_server`).

    At most `MAX_CONNECTIONS` connections are served at once (one thread
    each); a connection beyond that is closed at once, so that many slow or
    idle clients cannot pile up threads and buffered bodies.
    """

    daemon_threads = True
    routes: Routes
    max_body: int
    access_log: Callable[[str], None] | None
    internal_error: object
    _slots = threading.BoundedSemaphore(1)  # replaced per instance in bind_json_server

    def process_request(self, request: Any, client_address: Any) -> None:  # noqa: ANN401
        """Serve ``request`` on a thread if a slot is free, else close it."""
        if not self._slots.acquire(blocking=False):
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self._slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:  # noqa: ANN401
        """What a connection's thread runs; frees its slot when done."""
        try:
            super().process_request_thread(request, client_address)
        finally:
            self._slots.release()


class _JSONHTTPServerV6(JSONHTTPServer):
    address_family = socket.AF_INET6


def bind_json_server(
    host: str,
    port: int,
    routes: Routes,
    *,
    max_body: int,
    access_log: Callable[[str], None] | None = None,
    internal_error: object = None,
) -> JSONHTTPServer:
    """Bind ``host:port`` (IPv6 when ``host`` has a colon) and answer from ``routes``.

    ``access_log`` gets one uvicorn-style line per response; ``internal_error``
    is the JSON body of the 500 sent when a handler raises (default
    ``{"detail": "Internal Server Error"}``). The caller serves the result
    (`serve_in_background`). Raises ``OSError`` if the address is taken.
    """
    server_class = _JSONHTTPServerV6 if ":" in host else JSONHTTPServer
    httpd = server_class((host, port), _JSONHandler)
    httpd._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)  # noqa: SLF001 - set up here
    httpd.routes = routes
    httpd.max_body = max_body
    httpd.access_log = access_log
    httpd.internal_error = (
        {"detail": "Internal Server Error"} if internal_error is None else internal_error
    )
    return httpd


def _detail(status: HTTPStatus) -> Response:
    return Response(status, {"detail": status.phrase})


class _JSONHandler(http.server.BaseHTTPRequestHandler):
    server: JSONHTTPServer
    protocol_version = "HTTP/1.1"
    # uvicorn, like most servers, sets TCP_NODELAY: without it a keep-alive answer written
    # in two parts waits ~40 ms for the client's delayed ACK.
    disable_nagle_algorithm = True
    timeout = _IDLE_TIMEOUT  # an idle or dribbling client loses its connection, not a thread

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        """Silence http.server's own stderr lines; ``access_log`` gets uvicorn-style ones."""

    def _dispatch(self) -> None:
        try:
            response = self._respond()
            data = b"" if response.body is None else _dumps(response.body)
        except Exception:  # noqa: BLE001 - a handler's bug is a 500, never a dead thread
            response = Response(HTTPStatus.INTERNAL_SERVER_ERROR, self.server.internal_error)
            data = _dumps(response.body)
        self._send(response, data)

    do_GET = do_HEAD = do_POST = do_PUT = do_PATCH = do_DELETE = do_OPTIONS = _dispatch  # noqa: N815

    def _respond(self) -> Response:
        body = self._read_body()
        if isinstance(body, Response):
            return body
        target = urlsplit(self.path)
        path = unquote(target.path) or "/"
        methods = self.server.routes.get(path)
        if methods is None:
            twin = path[:-1] if path.endswith("/") else path + "/"
            if path != "/" and twin in self.server.routes:
                location = f"http://{self._authority()}{twin}"
                if target.query:
                    location += "?" + target.query
                return Response(HTTPStatus.TEMPORARY_REDIRECT, None, {"Location": location})
            return _detail(HTTPStatus.NOT_FOUND)
        handler = methods.get(self.command)
        if handler is None:
            return Response(
                HTTPStatus.METHOD_NOT_ALLOWED,
                {"detail": HTTPStatus.METHOD_NOT_ALLOWED.phrase},
                {"Allow": ", ".join(sorted(methods))},
            )
        request = Request(
            method=self.command,
            path=path,
            query=parse_qs(target.query, keep_blank_values=True),
            headers={name.lower(): value for name, value in self.headers.items()},
            body=body,
            client_host=str(self.client_address[0]),
        )
        return handler(request)

    def _read_body(self) -> bytes | Response:
        if self.headers.get("Transfer-Encoding"):
            self.close_connection = True
            return _detail(HTTPStatus.LENGTH_REQUIRED)
        raw = self.headers.get("Content-Length")
        if raw is None:
            return b""
        raw = raw.strip()
        if not raw.isdigit() or not raw.isascii():
            self.close_connection = True
            return Response(HTTPStatus.BAD_REQUEST, {"detail": "Invalid Content-Length"})
        length = int(raw)
        if length > self.server.max_body:
            self.close_connection = True
            return _detail(HTTPStatus.REQUEST_ENTITY_TOO_LARGE)
        body = self.rfile.read(length) if length else b""
        if len(body) != length:  # the client went away mid-body
            self.close_connection = True
            return Response(HTTPStatus.BAD_REQUEST, {"detail": "Incomplete body"})
        return body

    def _authority(self) -> str:
        """The Host the client used (what Starlette builds redirects from), or our address."""
        host = self.headers.get("Host", "")
        if host and host.isascii() and host.isprintable() and " " not in host:
            return host
        address, port = self.server.server_address[:2]
        address = str(address)
        return f"[{address}]:{port}" if ":" in address else f"{address}:{port}"

    def _send(self, response: Response, data: bytes) -> None:
        status = HTTPStatus(response.status)
        try:
            self.send_response(status, status.phrase)
            for name, value in response.headers.items():
                self.send_header(name, value)
            if response.body is not None:
                self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            if self.close_connection:
                self.send_header("Connection", "close")
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(data)
        except OSError:  # the client hung up: nothing left to tell it
            self.close_connection = True
            return
        if self.server.access_log is not None:
            host, port = self.client_address[:2]
            request_line = f"{self.command} {self.path} HTTP/1.1"
            self.server.access_log(
                f'{host}:{port} - "{request_line}" {int(status)} {status.phrase}'
            )


def _dumps(body: object) -> bytes:
    """Compact UTF-8 JSON, as Starlette's ``JSONResponse`` writes it (escaped if it must be)."""
    text = json.dumps(body, allow_nan=False, ensure_ascii=False, separators=(",", ":"))
    try:
        return text.encode()
    except UnicodeEncodeError:  # a lone surrogate echoed from the request
        return json.dumps(body, allow_nan=False, separators=(",", ":")).encode()

"""One health request over HTTP, done within a deadline, with a reason when it fails.

The one ``GET /health`` that both the environment-server probe and the vLLM
server's readiness wait send, and what it needs: a `requests` transport whose
deadline bounds the *whole* request (name lookup, connect, status line,
headers, body, not each read), loopback URLs kept off every proxy (`verirl._url` checks
the URL), and the short reason a failure is
reported under ("HTTP 503", "connection refused", "timed out", "DNS lookup
failed", ...), read from the exception's causes, never from its text (which
quotes the URL).
"""

from __future__ import annotations

import contextvars
import errno
import http.client
import io
import os
import socket
import ssl
import sys
import time
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, cast
from urllib.parse import urlsplit

import requests
import requests.adapters
import urllib3
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool
from urllib3.util.connection import allowed_gai_family

from verirl._fs import shortened
from verirl._resolve import AddrInfo, LookupTimeoutError, needs_dns, resolve
from verirl._url import (
    is_loopback_host,
)

if TYPE_CHECKING:  # urllib3 1.26, which requests still allows, has no BaseHTTPResponse
    from urllib3.response import BaseHTTPResponse

__all__ = [
    "TIMED_OUT",
    "DeadlineAdapter",
    "deadline_session",
    "describe_request_error",
    "request_health",
]

TIMED_OUT = "timed out"
"""The reason given when a request's deadline, or a socket timeout, ended it."""

_MIN_REQUEST_TIMEOUT = 0.01
"""A floor, so a spent budget is never passed on as "no timeout"."""

_BODY_LIMIT = 64 * 1024
"""Read at most this much of a health answer; a short body lets the connection be reused."""


# ---------------------------------------------------------------- one request, one deadline

_DEADLINE: contextvars.ContextVar[float | None] = contextvars.ContextVar(
    "verirl_request_deadline", default=None
)
"""Monotonic time the current `request_health` must be done by; read by our connections."""


class _DeadlineReader(io.RawIOBase):
    """A socket's byte stream whose every read may only use the time left before a deadline."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        super().__init__()
        self._sock = sock
        self._raw = sock.makefile("rb", buffering=0)
        self._deadline = deadline

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int | None:  # noqa: ANN401 - io's own signature
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("timed out")
        self._sock.settimeout(left)
        return self._raw.readinto(buffer)

    def fileno(self) -> int:
        return self._raw.fileno()

    def close(self) -> None:
        if not self.closed:
            self._raw.close()
        super().close()


class _SocketView:
    """The connection's socket as `http.client` sees it while a response is read."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self._sock = sock
        self._deadline = deadline

    def makefile(self, *_args: object, **_kwargs: object) -> io.BufferedReader:
        return io.BufferedReader(_DeadlineReader(self._sock, self._deadline))

    def __getattr__(self, name: str) -> Any:  # noqa: ANN401 - a transparent proxy
        return getattr(self._sock, name)


def _getresponse_by_deadline(
    conn: HTTPConnection, getresponse: Callable[[], BaseHTTPResponse]
) -> BaseHTTPResponse:
    deadline = _DEADLINE.get()
    sock = conn.sock
    if deadline is None or sock is None:
        return getresponse()
    view = _SocketView(sock, deadline)
    conn.sock = view
    try:
        return getresponse()
    finally:
        if conn.sock is view:  # http.client sets None when it hands the socket to the response
            conn.sock = sock


def _connect_timeout(conn: HTTPConnection) -> float | None:
    """How long ``conn`` may take to connect: its timeout, clipped to the deadline's time left."""
    value: object = conn.timeout  # urllib3 1.26 may hold its "default" sentinel here
    timeout: float | None
    if value is None or isinstance(value, (int, float)):
        timeout = value
    else:  # the socket module's default, as urllib3 reads the sentinel
        timeout = socket.getdefaulttimeout()
    deadline = _DEADLINE.get()
    if deadline is None:
        return timeout
    left = max(deadline - time.monotonic(), 0.0)
    return left if timeout is None else min(timeout, left)


def _new_conn_by_deadline(
    conn: HTTPConnection, new_conn: Callable[[], socket.socket]
) -> socket.socket:
    """``conn``'s socket, its host name looked up within the connect timeout and the deadline.

    urllib3 looks the name up with `socket.getaddrinfo`, which no timeout
    bounds and no signal interrupts; here `verirl._resolve.resolve` does it
    and the socket is connected to the addresses it found, so no second,
    unbounded lookup is made. A lookup not done in time is a connect timeout
    naming the host; a failed one the error urllib3 raises for it. The host
    name stays what the request sends (``Host``, TLS SNI): only the socket
    is connected by address. IP literals and ``localhost`` go to urllib3 as
    they are.
    """
    host = conn._dns_host  # noqa: SLF001 - the name urllib3 itself would look up (the proxy's, via one)
    if not needs_dns(host):
        return new_conn()
    timeout = _connect_timeout(conn)
    try:
        found = resolve(
            host, conn.port, family=allowed_gai_family(), kind=socket.SOCK_STREAM, timeout=timeout
        )
    except LookupTimeoutError as exc:
        raise urllib3.exceptions.ConnectTimeoutError(
            conn, f"Name resolution of {conn.host} timed out. (connect timeout={conn.timeout})"
        ) from exc
    except socket.gaierror as exc:
        resolution_error = getattr(urllib3.exceptions, "NameResolutionError", None)  # urllib3 2
        if resolution_error is not None:
            raise resolution_error(conn.host, conn, exc) from exc
        raise urllib3.exceptions.NewConnectionError(
            conn, f"Failed to establish a new connection: {exc}"
        ) from exc
    return _connect_to(conn, found)


def _connect_to(conn: HTTPConnection, found: list[AddrInfo]) -> socket.socket:
    """A socket connected to the first of ``found`` that answers, as urllib3 would connect it."""
    error: urllib3.exceptions.HTTPError | None = None
    for family, kind, proto, _, address in found:
        timeout = _connect_timeout(conn)
        if timeout is not None and timeout <= 0:  # the deadline is spent (0 would not block)
            error = error or urllib3.exceptions.ConnectTimeoutError(
                conn, f"Connection to {conn.host} timed out. (connect timeout={conn.timeout})"
            )
            break
        sock = socket.socket(family, kind, proto)
        try:
            for option in conn.socket_options or ():
                sock.setsockopt(*option)
            sock.settimeout(timeout)
            if conn.source_address:
                sock.bind(conn.source_address)
            sock.connect(address)
        except TimeoutError as exc:
            sock.close()
            error = urllib3.exceptions.ConnectTimeoutError(
                conn, f"Connection to {conn.host} timed out. (connect timeout={conn.timeout})"
            )
            error.__cause__ = exc
        except OSError as exc:
            sock.close()
            error = urllib3.exceptions.NewConnectionError(
                conn, f"Failed to establish a new connection: {exc}"
            )
            error.__cause__ = exc
        except BaseException:
            sock.close()
            raise
        else:
            sys.audit("http.client.connect", conn, conn.host, conn.port)
            return sock
    if error is None:
        error = urllib3.exceptions.NewConnectionError(
            conn, "Failed to establish a new connection: getaddrinfo returned no address"
        )
    raise error


class _DeadlineHTTPConnection(HTTPConnection):
    def _new_conn(self) -> socket.socket:
        return _new_conn_by_deadline(self, super()._new_conn)

    def getresponse(self) -> BaseHTTPResponse:  # type: ignore[override]
        return _getresponse_by_deadline(self, super().getresponse)


class _DeadlineHTTPSConnection(HTTPSConnection):
    def _new_conn(self) -> socket.socket:
        return _new_conn_by_deadline(self, super()._new_conn)

    def getresponse(self) -> BaseHTTPResponse:  # type: ignore[override]
        return _getresponse_by_deadline(self, super().getresponse)


class _DeadlineHTTPConnectionPool(HTTPConnectionPool):
    ConnectionCls = _DeadlineHTTPConnection


class _DeadlineHTTPSConnectionPool(HTTPSConnectionPool):
    ConnectionCls = _DeadlineHTTPSConnection


_POOL_CLASSES = {"http": _DeadlineHTTPConnectionPool, "https": _DeadlineHTTPSConnectionPool}


class DeadlineAdapter(requests.adapters.HTTPAdapter):
    """A `requests` transport for `request_health`: deadline-bound reads, no proxy for loopback.

    Inside `request_health`, the host name's lookup and every read of the
    answer (status line, headers, body) get only the time left before the
    request's deadline, so the deadline bounds the whole request; elsewhere
    the lookup gets the connect timeout, and reads are as in `HTTPAdapter`.
    The lookup runs in a thread of its own, so a signal ends the wait for it.
    Requests to loopback hosts, redirects included, never use a proxy. Over a
    SOCKS proxy only the per-read timeouts apply.
    """

    def init_poolmanager(
        self,
        connections: int,
        maxsize: int,
        block: bool = False,
        **pool_kwargs: Any,  # noqa: ANN401 - HTTPAdapter's signature
    ) -> None:
        """Build the pool manager, with connections that honour the deadline."""
        super().init_poolmanager(connections, maxsize, block, **pool_kwargs)
        self.poolmanager.pool_classes_by_scheme = _POOL_CLASSES

    def proxy_manager_for(self, proxy: str, **proxy_kwargs: Any) -> Any:  # noqa: ANN401
        """The proxy's pool manager, with connections that honour the deadline."""
        manager = super().proxy_manager_for(proxy, **proxy_kwargs)
        if isinstance(manager, urllib3.ProxyManager):
            manager.pool_classes_by_scheme = _POOL_CLASSES
        return manager

    def send(  # noqa: PLR0917 - HTTPAdapter's signature
        self,
        request: requests.PreparedRequest,
        stream: bool = False,
        timeout: Any = None,  # noqa: ANN401 - HTTPAdapter's signature
        verify: Any = True,  # noqa: ANN401
        cert: Any = None,  # noqa: ANN401
        proxies: Mapping[str, str] | None = None,
    ) -> requests.Response:
        """Send ``request``; a loopback host is always reached directly."""
        if is_loopback_host(urlsplit(request.url or "").hostname):
            proxies = {}
        return super().send(
            request, stream=stream, timeout=timeout, verify=verify, cert=cert, proxies=proxies
        )


def deadline_session() -> requests.Session:
    """A new `requests.Session` whose transport is `DeadlineAdapter`; close it when done."""
    session = requests.Session()
    session.mount("http://", DeadlineAdapter())
    session.mount("https://", DeadlineAdapter())
    return session


_LOOPBACK_NO_PROXY = "localhost,.localhost,127.0.0.0/8,::1"


def _no_proxy_for(url: str) -> dict[str, str] | None:
    """Per-request proxy settings that keep a loopback ``url`` off every proxy, else ``None``.

    ``None`` values override the environment's and the session's proxies for
    this request; ``no_proxy`` also covers redirects to other loopback hosts.
    """
    parts = urlsplit(url)
    host = parts.hostname
    if not is_loopback_host(host):
        return None
    keys = ("http", "https", "all", f"http://{host}", f"https://{host}", f"all://{host}")
    proxies: dict[str, str | None] = dict.fromkeys(keys)
    inherited = os.environ.get("no_proxy") or os.environ.get("NO_PROXY")
    proxies["no_proxy"] = f"{_LOOPBACK_NO_PROXY},{inherited}" if inherited else _LOOPBACK_NO_PROXY
    return cast("dict[str, str]", proxies)


def request_health(session: requests.Session, url: str, timeout: float) -> str | None:
    """One ``GET url`` done within ``timeout`` seconds in all: ``None`` on 200, else the reason.

    With a `deadline_session` the deadline bounds the whole request. With
    another session each read gets at most ``timeout`` seconds, and an answer
    that comes after the deadline counts as "timed out" all the same. A
    loopback ``url`` never goes through a proxy. Raises only what ``session``
    raises beyond `requests.RequestException`.
    """
    timeout = max(timeout, _MIN_REQUEST_TIMEOUT)
    deadline = time.monotonic() + timeout
    token = _DEADLINE.set(deadline)
    try:
        with session.get(url, timeout=timeout, stream=True, proxies=_no_proxy_for(url)) as answer:
            status = answer.status_code
            read = 0
            for chunk in answer.iter_content(chunk_size=8192):
                read += len(chunk)
                if read >= _BODY_LIMIT or time.monotonic() > deadline:
                    break
    except requests.RequestException as exc:
        return TIMED_OUT if time.monotonic() >= deadline else describe_request_error(exc)
    finally:
        _DEADLINE.reset(token)
    if time.monotonic() > deadline:
        return TIMED_OUT
    return None if status == requests.codes.ok else f"HTTP {status}"


def _causes(exc: BaseException) -> Iterator[BaseException]:
    """``exc`` and every exception it wraps: causes, contexts, urllib3 reasons, arguments."""
    seen: set[int] = set()
    todo: list[BaseException] = [exc]
    while todo:
        current = todo.pop(0)
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        wrapped = [current.__cause__, current.__context__, getattr(current, "reason", None)]
        wrapped += list(current.args)
        todo += [item for item in wrapped if isinstance(item, BaseException)]


def _is_timeout(exc: BaseException) -> bool:
    # urllib3 2 makes NewConnectionError (a refused or failed connect) a ConnectTimeoutError.
    if isinstance(exc, urllib3.exceptions.NewConnectionError):
        return False
    return isinstance(exc, (TimeoutError, requests.Timeout, urllib3.exceptions.TimeoutError))


_KINDS: tuple[tuple[Callable[[BaseException], bool], str], ...] = (
    (
        lambda e: (
            isinstance(e, socket.gaierror) or type(e).__name__ == "NameResolutionError"
        ),  # urllib3 2 only
        "DNS lookup failed",
    ),
    (
        lambda e: (
            isinstance(e, ConnectionRefusedError)
            or (isinstance(e, OSError) and e.errno == errno.ECONNREFUSED)
        ),
        "connection refused",
    ),
    (_is_timeout, TIMED_OUT),
    (
        lambda e: isinstance(e, (http.client.RemoteDisconnected, http.client.IncompleteRead)),
        "connection closed before an answer",
    ),
    (lambda e: isinstance(e, ConnectionResetError), "connection reset"),
    (lambda e: isinstance(e, ssl.SSLError), "TLS error"),
    (lambda e: isinstance(e, requests.exceptions.ProxyError), "proxy error"),
)


def describe_request_error(exc: requests.RequestException) -> str:
    """The short reason a request failed, for logs and errors, read from what ``exc`` wraps.

    "DNS lookup failed", "connection refused", "timed out", "connection
    closed before an answer", "connection reset", "TLS error", "proxy
    error"; another socket error gives its ``strerror`` ("connection error
    (No route to host)"). The message text is never searched: it quotes
    the URL, whose host may read "refused".
    """
    causes = list(_causes(exc))
    for matches, reason in _KINDS:
        if any(matches(cause) for cause in causes):
            return reason
    for cause in causes:
        if isinstance(cause, OSError) and cause.strerror:
            return f"connection error ({cause.strerror})"
    if isinstance(exc, requests.ConnectionError):
        return f"connection error ({type(exc).__name__})"
    return shortened(f"{type(exc).__name__}: {exc}", 200)

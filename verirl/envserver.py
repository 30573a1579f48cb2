"""Wait for the reward environment server to answer ``GET /health``.

The old helper polled every 2 s with no deadline; here a wait keeps a deadline
on a monotonic clock and backs off from tens of milliseconds to about a second,
so a server that comes up is noticed almost at once and a dead one fails on
time with the reason ("HTTP 503", "connection refused", "timed out").

Three rules hold for every request the probe sends:

- the deadline bounds the *whole* request (connect, status line, headers,
  body), not each read, so a server that trickles bytes cannot hold a wait
  (name resolution is the one step no socket timeout reaches: a host name
  whose DNS lookup hangs can still hold a request);
- a loopback URL (``127.0.0.0/8``, ``::1``, ``localhost``) never goes through
  a proxy, whatever ``HTTP_PROXY``/``ALL_PROXY`` or a session say; other hosts
  honour the environment's proxy and ``NO_PROXY`` settings as usual;
- credentials in a URL (``http://user:pass@host``) are sent, but never shown:
  reprs, log lines and errors carry ``http://***@host``.
"""

from __future__ import annotations

import contextlib
import contextvars
import io
import ipaddress
import logging
import os
import re
import socket
import time
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Protocol, cast, runtime_checkable
from urllib.parse import unquote, urlsplit

import attrs
import requests
import requests.adapters
import urllib3
from urllib3.connection import HTTPConnection, HTTPSConnection
from urllib3.connectionpool import HTTPConnectionPool, HTTPSConnectionPool

from verirl._poll import Backoff, Clock, Sleep, poll
from verirl._secrets import redact_text, redact_url, scrub
from verirl._validate import MAX_PORT, check_number
from verirl.errors import ConfigError, EnvServerUnavailable

if TYPE_CHECKING:  # urllib3 1.26, which requests still allows, has no BaseHTTPResponse
    from urllib3.response import BaseHTTPResponse

__all__ = [
    "MAX_REQUEST_TIMEOUT",
    "MAX_WAIT_TIMEOUT",
    "DeadlineAdapter",
    "EnvServerProbe",
    "HttpEnvServerProbe",
    "check_wait_timeout",
    "deadline_session",
    "describe_request_error",
    "is_loopback_host",
    "redact_url",
    "request_health",
    "validate_http_url",
]

log = logging.getLogger(__name__)

MAX_REQUEST_TIMEOUT = 86_400.0
"""Longest ``request_timeout`` accepted (one day); sockets reject far larger ones."""

MAX_WAIT_TIMEOUT = 365 * 86_400.0
"""Longest ``wait`` timeout (and ``progress_every``) accepted: every wait has a real deadline."""

_MIN_REQUEST_TIMEOUT = 0.01
_TIMED_OUT = "timed out"
"""A floor, so a spent budget is never passed on as "no timeout"."""

_BODY_LIMIT = 64 * 1024
"""Read at most this much of a health answer; a short body lets the connection be reused."""


@runtime_checkable
class EnvServerProbe(Protocol):
    """Something that can tell whether the reward environment server is up."""

    @property
    def url(self) -> str:
        """The server's base URL, for messages (credentials redacted)."""
        ...

    def check(self) -> bool:
        """Send one health request; never raise."""
        ...

    def wait(self, timeout: float) -> None:
        """Return once healthy; raise `EnvServerUnavailable` after ``timeout`` seconds."""
        ...


# ---------------------------------------------------------------- URLs

_USERINFO = re.compile(r"\A[^:/?#]*://(?P<userinfo>[^/?#]*)@")
_HOST_LABEL = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?")
_IPV6_ZONE = re.compile(r"%25[A-Za-z0-9._~-]+")
_MAX_HOST_LENGTH = 253


def _redact_value(value: object) -> object:
    """What a `ConfigError` may show of a URL that failed validation.

    A malformed URL cannot be trusted to split where a valid one would, so
    everything before its last ``@`` goes.
    """
    return redact_text(value) if isinstance(value, str) else value


def _invalid_url(field: str, url: object, reason: str, part: str | None = None) -> ConfigError:
    """The `ConfigError`; ``part`` (the bad piece) is quoted only if no credential can be in it."""
    if part is not None and not (isinstance(url, str) and "@" in url):
        reason = f"{reason} {part}"
    return ConfigError.invalid(field, _redact_value(url), reason)


def _check_host(field: str, url: str, host: str) -> None:
    if not host:
        raise _invalid_url(field, url, "has no host")
    if host.startswith("["):
        address = _IPV6_ZONE.sub("", host[1:-1], count=1)
        try:
            ipaddress.IPv6Address(address)
        except ValueError:
            raise _invalid_url(field, url, "has an invalid IPv6 address", host) from None
        return
    labels = host.removesuffix(".").split(".")
    if len(host) > _MAX_HOST_LENGTH or not all(_HOST_LABEL.fullmatch(label) for label in labels):
        raise _invalid_url(field, url, "has an invalid host name", repr(host))
    if all(label.isdigit() for label in labels):
        try:
            ipaddress.IPv4Address(host)
        except ValueError:
            raise _invalid_url(field, url, "has an invalid IPv4 address", repr(host)) from None


def _check_port(field: str, url: str, port: str | None) -> None:
    if port is None:
        return
    if not (port.isascii() and port.isdigit()):
        raise _invalid_url(field, url, "has an invalid port", repr(port))
    if not 1 <= int(port) <= MAX_PORT:
        raise _invalid_url(field, url, f"port must be 1..{MAX_PORT}")


def validate_http_url(field: str, url: object) -> str:
    """Return ``url`` if it is a plain ``http(s)://host[:port][/path]`` URL.

    Otherwise raise `ConfigError` naming ``field`` (and the URL, credentials
    redacted): not a string, whitespace, control or non-ASCII characters
    (write host names in their ``xn--`` form), another scheme, a query or
    fragment, no host or a malformed one, a port outside 1..65535. Credentials
    (``user:password@``) are allowed; show the URL through `redact_url`.
    """
    if not isinstance(url, str):
        raise ConfigError.invalid(field, url, "must be a string such as 'http://127.0.0.1:8000'")
    if not url.isascii() or not url.isprintable() or any(c.isspace() for c in url):
        raise _invalid_url(
            field, url, "must not contain whitespace, control or non-ASCII characters"
        )
    try:
        parts = urlsplit(url)
    except ValueError as exc:
        raise _invalid_url(field, url, "is not a valid URL:", str(exc)) from None
    if parts.scheme not in ("http", "https"):
        raise _invalid_url(field, url, "must start with http:// or https://")
    if "?" in url or "#" in url:
        raise _invalid_url(field, url, "must not have a query (?…) or fragment (#…)")
    hostport = parts.netloc.rpartition("@")[2]
    if hostport.startswith("["):
        end = hostport.find("]") + 1
        host, rest = hostport[:end], hostport[end:]
        if not end or (rest and not rest.startswith(":")):
            raise _invalid_url(field, url, "has an invalid host", repr(hostport))
        port = rest[1:] if rest else None
    else:
        host, colon, port_text = hostport.partition(":")
        port = port_text if colon else None
    _check_host(field, url, host)
    _check_port(field, url, port)
    return url


def is_loopback_host(host: str | None) -> bool:
    """Whether ``host`` (as `urllib.parse` gives it, no brackets) names this machine's loopback."""
    if not host:
        return False
    name = host.lower().removesuffix(".")
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        address = ipaddress.ip_address(name.partition("%")[0])
    except ValueError:
        return False
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped.is_loopback
    return address.is_loopback


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


class _DeadlineHTTPConnection(HTTPConnection):
    def getresponse(self) -> BaseHTTPResponse:  # type: ignore[override]
        return _getresponse_by_deadline(self, super().getresponse)


class _DeadlineHTTPSConnection(HTTPSConnection):
    def getresponse(self) -> BaseHTTPResponse:  # type: ignore[override]
        return _getresponse_by_deadline(self, super().getresponse)


class _DeadlineHTTPConnectionPool(HTTPConnectionPool):
    ConnectionCls = _DeadlineHTTPConnection


class _DeadlineHTTPSConnectionPool(HTTPSConnectionPool):
    ConnectionCls = _DeadlineHTTPSConnection


_POOL_CLASSES = {"http": _DeadlineHTTPConnectionPool, "https": _DeadlineHTTPSConnectionPool}


class DeadlineAdapter(requests.adapters.HTTPAdapter):
    """A `requests` transport for `request_health`: deadline-bound reads, no proxy for loopback.

    Inside `request_health`, every read of the answer (status line, headers,
    body) gets only the time left before the request's deadline, so the
    deadline bounds the whole request; elsewhere it is a plain `HTTPAdapter`.
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
        return _TIMED_OUT if time.monotonic() >= deadline else describe_request_error(exc)
    finally:
        _DEADLINE.reset(token)
    if time.monotonic() > deadline:
        return _TIMED_OUT
    return None if status == requests.codes.ok else f"HTTP {status}"


def describe_request_error(exc: requests.RequestException) -> str:
    """Turn a requests failure into a short reason for logs and errors."""
    if isinstance(exc, requests.Timeout) or any(
        isinstance(arg, urllib3.exceptions.TimeoutError) for arg in exc.args
    ):
        return _TIMED_OUT
    text = str(exc)
    if isinstance(exc, requests.ConnectionError):
        if "refused" in text.lower():
            return "connection refused"
        return f"connection error ({type(exc).__name__})"
    return f"{type(exc).__name__}: {text}"[:200]


# ---------------------------------------------------------------- the probe


def check_wait_timeout(value: object) -> float:
    """A wait's ``timeout``: a finite number of seconds, ``0..MAX_WAIT_TIMEOUT``."""
    return check_number("timeout", value, non_negative=True, at_most=MAX_WAIT_TIMEOUT)


def _url(value: object) -> str:
    return validate_http_url("url", value)


def _request_timeout(_inst: object, attribute: attrs.Attribute[float], value: object) -> None:
    check_number(attribute.name, value, positive=True, at_most=MAX_REQUEST_TIMEOUT)


def _progress_every(_inst: object, attribute: attrs.Attribute[float], value: object) -> None:
    check_number(attribute.name, value, positive=True, at_most=MAX_WAIT_TIMEOUT)


_PATH_CHARS = re.compile(r"[A-Za-z0-9\-._~!$&'()*+,;=:@/%]*")


def _health_path(_inst: object, _attribute: attrs.Attribute[str], value: object) -> None:
    if not isinstance(value, str) or (value and not value.startswith("/")):
        raise ConfigError.invalid("health_path", value, "must be empty or start with '/'")
    if not _PATH_CHARS.fullmatch(value):
        raise ConfigError.invalid(
            "health_path",
            value,
            "must be a plain URL path: no spaces, control or non-ASCII characters, '?' or '#'",
        )


def _session(_inst: object, _attribute: attrs.Attribute[Any], value: object) -> None:
    if value is not None and not isinstance(value, requests.Session):
        raise ConfigError.invalid("session", value, "must be None or a requests.Session")


def _backoff(_inst: object, _attribute: attrs.Attribute[Any], value: object) -> None:
    if not isinstance(value, Backoff):
        raise ConfigError.invalid("backoff", value, "must be a verirl Backoff")


def _callable(_inst: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if not callable(value):
        raise ConfigError.invalid(attribute.alias or attribute.name, value, "must be callable")


def _scrubber(url: str) -> Callable[[str], str]:
    """Something that removes ``url``'s credentials, in any spelling, from a text."""
    match = _USERINFO.match(url)
    if match is None:
        return lambda text: text
    userinfo = match["userinfo"]
    user, _, password = userinfo.partition(":")
    secrets = [userinfo, unquote(userinfo), password, unquote(password)]
    if not password:  # a token given as the user name
        secrets += [user, unquote(user)]

    def scrub_all(text: str) -> str:
        for secret in sorted(set(secrets), key=len, reverse=True):
            text = scrub(text, secret, "***")
        return text

    return scrub_all


@attrs.define(repr=False)
class HttpEnvServerProbe:
    """Probe ``{url}{health_path}`` over HTTP with `requests`.

    Each request, `check`'s and every one `wait` sends, must be done within
    its timeout in all: a server that trickles its answer is "timed out", not
    healthy. A loopback URL never goes through a proxy; other hosts honour
    the environment's proxy settings. ``user:password@`` in the URL is sent
    as basic auth and shown as ``***`` (`url`, `repr`, logs, errors).

    Pass ``session`` to reuse a connection pool or to inject a test transport.
    Its adapters are used as they are, so the whole-request deadline holds
    only if they are `DeadlineAdapter` s (see `deadline_session`); with any
    other adapter each read is bounded and a late answer counts as timed
    out, but a server trickling bytes can hold one request past the
    deadline. ``clock``/``sleep`` let unit tests run the backoff without real
    time.
    """

    _target: str = attrs.field(alias="url", converter=_url)
    health_path: str = attrs.field(default="/health", kw_only=True, validator=_health_path)
    request_timeout: float = attrs.field(default=5.0, kw_only=True, validator=_request_timeout)
    _session: requests.Session | None = attrs.field(
        default=None, kw_only=True, alias="session", validator=_session
    )
    _clock: Clock = attrs.field(
        default=time.monotonic, kw_only=True, alias="clock", validator=_callable
    )
    _sleep: Sleep = attrs.field(
        default=time.sleep, kw_only=True, alias="sleep", validator=_callable
    )
    backoff: Backoff = attrs.field(factory=Backoff, kw_only=True, validator=_backoff)
    progress_every: float = attrs.field(default=10.0, kw_only=True, validator=_progress_every)
    _scrub: Callable[[str], str] = attrs.field(init=False)

    @_scrub.default
    def _scrub_default(self) -> Callable[[str], str]:
        return _scrubber(self._target)

    def __repr__(self) -> str:
        return (
            f"HttpEnvServerProbe(url={self.url!r}, health_path={self.health_path!r}, "
            f"request_timeout={self.request_timeout!r}, backoff={self.backoff!r}, "
            f"progress_every={self.progress_every!r})"
        )

    @property
    def url(self) -> str:
        """The server's base URL, credentials shown as ``***``."""
        return redact_url(self._target)

    @property
    def health_url(self) -> str:
        """The URL each health request goes to, credentials shown as ``***``."""
        return redact_url(self._health_target)

    @property
    def _health_target(self) -> str:
        if not self.health_path:
            return self._target
        return self._target.rstrip("/") + self.health_path

    @contextlib.contextmanager
    def _open(self) -> Iterator[requests.Session]:
        if self._session is not None:
            yield self._session
            return
        with deadline_session() as session:
            yield session

    def _attempt(self, session: requests.Session, timeout: float) -> str | None:
        """One request; ``None`` when healthy, else the reason it is not (never raises)."""
        try:
            reason = request_health(session, self._health_target, timeout)
        except Exception as exc:  # noqa: BLE001 - a probe reports, it never fails its caller
            reason = f"unexpected error ({type(exc).__name__}: {exc})"[:200]
        return None if reason is None else self._scrub(reason)

    def check(self) -> bool:
        """Send one health request, done within ``request_timeout``; ``True`` on HTTP 200.

        Never raises.
        """
        try:
            with self._open() as session:
                reason = self._attempt(session, self.request_timeout)
        except Exception as exc:  # noqa: BLE001 - e.g. a session that fails to close
            reason = self._scrub(f"unexpected error ({type(exc).__name__}: {exc})")[:200]
        if reason is not None:
            log.debug("health check of %s: %s", self.health_url, reason)
        return reason is None

    def wait(self, timeout: float) -> None:
        """Block until healthy, or raise `EnvServerUnavailable` once ``timeout`` is spent.

        Each request must be done within ``request_timeout`` clipped to the
        time left, so a server that never answers, or answers a byte at a
        time, cannot hold the wait past its deadline. ``timeout`` must be
        finite (`ConfigError` otherwise); nothing else is raised.
        """
        timeout = check_wait_timeout(timeout)
        log.info("waiting up to %.0fs for env server %s", timeout, self.health_url)

        def progress(elapsed: float, last_error: str | None) -> None:
            log.info(
                "still waiting for env server %s after %.0fs (last: %s)",
                self.health_url,
                elapsed,
                last_error,
            )

        previous: list[str | None] = [None]

        def attempt(session: requests.Session, left: float) -> str | None:
            budget = min(self.request_timeout, left)
            reason = self._attempt(session, budget)
            if reason == _TIMED_OUT and budget < self.request_timeout and previous[0]:
                # The deadline, not the server, cut this one short: keep the real reason.
                return previous[0]
            previous[0] = reason
            return reason

        with self._open() as session:
            result = poll(
                lambda left: attempt(session, left),
                timeout=timeout,
                backoff=self.backoff,
                clock=self._clock,
                sleep=self._sleep,
                progress=progress,
                progress_every=self.progress_every,
            )
        if not result.ready:
            raise EnvServerUnavailable(self.url, result.elapsed, result.last_error)
        log.info(
            "env server %s healthy after %.2fs (%d requests)",
            self.url,
            result.elapsed,
            result.attempts,
        )

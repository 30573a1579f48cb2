"""Wait for the reward environment server to answer ``GET /health``.

The old helper polled every 2 s with no deadline; here a wait keeps a deadline
on a monotonic clock and backs off from tens of milliseconds to a fifth of a second,
so a server that comes up is noticed almost at once and a dead one fails on
time with the reason ("HTTP 503", "connection refused", "timed out").
The cap is 0.2 s: a shared reward server sees at most five requests a second
from a waiting job, and one that comes up is noticed within 0.2 s.

Each request is `verirl._http`'s one health GET (re-exported here, as are its
URL check and deadline session), so three rules hold for every one:

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
import functools
import logging
import os
import re
import time
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable
from urllib.parse import unquote

import attrs

from verirl._fs import quoted, shortened
from verirl._hidden import HIDDEN
from verirl._poll import Backoff, Clock, Sleep, poll
from verirl._secrets import redact_url, scrub_all, secrets_in_environ
from verirl._url import is_loopback_host, validate_http_url
from verirl._validate import check_number
from verirl.errors import ConfigError, EnvServerUnavailable

if TYPE_CHECKING:  # at run time imported where used: requests is not light to import
    import requests

    from verirl._http import (
        DeadlineAdapter,
        deadline_session,
        describe_request_error,
        request_health,
    )

__all__ = [
    "ENV_SERVER_BACKOFF",
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


def shown_url(url: str) -> str:
    """``url`` safe to log: `redact_url`, and the values of this process's secret variables.

    A URL built with one (``http://h/$HF_TOKEN``) carries it with nothing to
    tell it is a secret: it is hidden wherever it stands.
    """
    return scrub_all(redact_url(url), secrets_in_environ(os.environ), HIDDEN)


ENV_SERVER_BACKOFF = Backoff(initial=0.02, factor=2.0, cap=0.2)
"""`HttpEnvServerProbe`'s polls: 20 ms, doubling, then every 0.2 s (at most 5 a second)."""

_HTTP_NAMES = frozenset(
    {
        "DeadlineAdapter",
        "deadline_session",
        "describe_request_error",
        "request_health",
    }
)


if not TYPE_CHECKING:  # type checkers see the imports above, and so reject a misspelt name

    def __getattr__(name: str) -> object:
        """`verirl._http`'s re-exported names, imported (with requests) on first access."""
        if name not in _HTTP_NAMES:
            raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
        from verirl import _http  # noqa: PLC0415 - keep importing this module light

        return getattr(_http, name)


MAX_REQUEST_TIMEOUT = 86_400.0
"""Longest ``request_timeout`` accepted (one day); sockets reject far larger ones."""

MAX_WAIT_TIMEOUT = 365 * 86_400.0
"""Longest ``wait`` timeout (and ``progress_every``) accepted: every wait has a real deadline."""

_USERINFO = re.compile(r"\A[^:/?#]*://(?P<userinfo>[^/?#]*)@")


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


def _label(_inst: object, _attribute: attrs.Attribute[str], value: object) -> None:
    if not isinstance(value, str) or not value.isprintable() or not value.strip():
        raise ConfigError.invalid("label", value, "must be printable, non-empty text")


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
    if value is None:
        return
    import requests  # noqa: PLC0415 - only when a session is given

    if not isinstance(value, requests.Session):
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

    return functools.partial(scrub_all, secrets=secrets, placeholder="***")


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
    backoff: Backoff = attrs.field(default=ENV_SERVER_BACKOFF, kw_only=True, validator=_backoff)
    progress_every: float = attrs.field(default=10.0, kw_only=True, validator=_progress_every)
    # What the log lines call the server: the runtime waits on a remote vLLM server with a probe.
    label: str = attrs.field(default="env server", kw_only=True, repr=False, validator=_label)
    _scrub: Callable[[str], str] = attrs.field(init=False)

    @_scrub.default
    def _scrub_default(self) -> Callable[[str], str]:
        return _scrubber(self._target)

    def __repr__(self) -> str:
        return (
            f"HttpEnvServerProbe(url={quoted(self.url)}, health_path={quoted(self.health_path)}, "
            f"request_timeout={quoted(self.request_timeout)}, backoff={quoted(self.backoff)}, "
            f"progress_every={quoted(self.progress_every)})"
        )

    @property
    def url(self) -> str:
        """The server's base URL, credentials shown as ``***`` (`shown_url`)."""
        return shown_url(self._target)

    @property
    def health_url(self) -> str:
        """The URL each health request goes to, credentials shown as ``***`` (`shown_url`)."""
        return shown_url(self._health_target)

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
        from verirl._http import deadline_session  # noqa: PLC0415

        with deadline_session() as session:
            yield session

    def _attempt(self, session: requests.Session, timeout: float) -> str | None:
        """One request; ``None`` when healthy, else the reason it is not (never raises)."""
        from verirl._http import request_health  # noqa: PLC0415

        try:
            reason = request_health(session, self._health_target, timeout)
        except Exception as exc:  # noqa: BLE001 - a probe reports, it never fails its caller
            reason = shortened(f"unexpected error ({type(exc).__name__}: {exc})", 200)
        return None if reason is None else self._scrub(reason)

    def check(self) -> bool:
        """Send one health request, done within ``request_timeout``; ``True`` on HTTP 200.

        Never raises.
        """
        try:
            with self._open() as session:
                reason = self._attempt(session, self.request_timeout)
        except Exception as exc:  # noqa: BLE001 - e.g. a session that fails to close
            reason = shortened(self._scrub(f"unexpected error ({type(exc).__name__}: {exc})"), 200)
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
        from verirl._http import TIMED_OUT  # noqa: PLC0415

        timeout = check_wait_timeout(timeout)
        log.info("waiting up to %gs for %s %s", timeout, self.label, self.health_url)

        def progress(elapsed: float, last_error: str | None) -> None:
            log.info(
                "still waiting for %s %s after %.0fs (last: %s)",
                self.label,
                self.health_url,
                elapsed,
                last_error,
            )

        previous: list[str | None] = [None]

        def attempt(session: requests.Session, left: float) -> str | None:
            budget = min(self.request_timeout, left)
            reason = self._attempt(session, budget)
            if reason == TIMED_OUT and budget < self.request_timeout and previous[0]:
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
            "%s %s healthy after %.2fs (%d requests)",
            self.label,
            self.url,
            result.elapsed,
            result.attempts,
        )

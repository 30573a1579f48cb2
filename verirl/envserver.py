"""Wait for the reward environment server to answer ``GET /health``.

The old helper polled every 2 s with no deadline; here a wait keeps a deadline
on a monotonic clock and backs off from tens of milliseconds to about a second,
so a server that comes up is noticed almost at once and a dead one fails on
time with the reason ("HTTP 503", "connection refused", "timed out").
"""

from __future__ import annotations

import logging
import time
from typing import Protocol, runtime_checkable
from urllib.parse import urlsplit

import attrs
import requests

from verirl._poll import Backoff, Clock, Sleep, poll
from verirl._validate import check_number
from verirl.errors import ConfigError, EnvServerUnavailable

__all__ = ["EnvServerProbe", "HttpEnvServerProbe", "describe_request_error", "validate_http_url"]

log = logging.getLogger(__name__)


@runtime_checkable
class EnvServerProbe(Protocol):
    """Something that can tell whether the reward environment server is up."""

    @property
    def url(self) -> str:
        """The server's base URL, for messages."""
        ...

    def check(self) -> bool:
        """Send one health request; never raise."""
        ...

    def wait(self, timeout: float) -> None:
        """Return once healthy; raise `EnvServerUnavailable` after ``timeout`` seconds."""
        ...


def validate_http_url(field: str, url: object) -> str:
    """Return ``url`` if it is an ``http(s)://host…`` URL; else `ConfigError` naming ``field``."""
    if not isinstance(url, str):
        raise ConfigError.invalid(field, url, "must be a string such as 'http://127.0.0.1:8000'")
    try:
        parts = urlsplit(url)
        _ = parts.port  # raises ValueError for a bad port
    except ValueError as exc:
        raise ConfigError.invalid(field, url, f"is not a valid URL ({exc})") from None
    if parts.scheme not in ("http", "https"):
        raise ConfigError.invalid(field, url, "must start with http:// or https://")
    if not parts.hostname:
        raise ConfigError.invalid(field, url, "has no host")
    return url


def describe_request_error(exc: requests.RequestException) -> str:
    """Turn a requests failure into a short reason for logs and errors."""
    if isinstance(exc, requests.Timeout):
        return "timed out"
    text = str(exc)
    if isinstance(exc, requests.ConnectionError):
        if "refused" in text.lower():
            return "connection refused"
        return f"connection error ({type(exc).__name__})"
    return f"{type(exc).__name__}: {text}"[:200]


def _url(value: object) -> str:
    return validate_http_url("url", value)


def _positive(_inst: object, attribute: attrs.Attribute[float], value: object) -> None:
    check_number(attribute.name, value, positive=True)


@attrs.define
class HttpEnvServerProbe:
    """Probe ``{url}{health_path}`` over HTTP with `requests`.

    Pass ``session`` to reuse a connection pool or to inject a test transport;
    ``clock``/``sleep`` let unit tests run the backoff without real time.
    """

    url: str = attrs.field(converter=_url)
    health_path: str = attrs.field(default="/health", kw_only=True)
    request_timeout: float = attrs.field(default=5.0, kw_only=True, validator=_positive)
    _session: requests.Session | None = attrs.field(default=None, kw_only=True, alias="session")
    _clock: Clock = attrs.field(default=time.monotonic, kw_only=True, alias="clock", repr=False)
    _sleep: Sleep = attrs.field(default=time.sleep, kw_only=True, alias="sleep", repr=False)
    backoff: Backoff = attrs.field(factory=Backoff, kw_only=True)
    progress_every: float = attrs.field(default=10.0, kw_only=True, validator=_positive)

    def __attrs_post_init__(self) -> None:
        path: object = self.health_path
        if not isinstance(path, str) or (path and not path.startswith("/")):
            raise ConfigError.invalid(
                "health_path", self.health_path, "must be empty or start with '/'"
            )

    @property
    def health_url(self) -> str:
        """The URL each health request goes to."""
        return self.url.rstrip("/") + self.health_path if self.health_path else self.url

    def _attempt(self, timeout: float) -> str | None:
        """One request; ``None`` when healthy, else the reason it is not."""
        getter = self._session.get if self._session is not None else requests.get
        try:
            # A floor keeps requests from treating a spent budget as "no timeout".
            response = getter(self.health_url, timeout=max(timeout, 0.01))
        except requests.RequestException as exc:
            return describe_request_error(exc)
        status = response.status_code
        response.close()
        return None if status == requests.codes.ok else f"HTTP {status}"

    def check(self) -> bool:
        """Send one health request (``request_timeout``); ``True`` on HTTP 200, never raises."""
        try:
            return self._attempt(self.request_timeout) is None
        except Exception:  # a probe reports, it never fails its caller
            log.debug("health check of %s failed unexpectedly", self.health_url, exc_info=True)
            return False

    def wait(self, timeout: float) -> None:
        """Block until healthy, or raise `EnvServerUnavailable` once ``timeout`` is spent.

        Each request's timeout is ``request_timeout`` clipped to the time left,
        so a server that accepts connections but never answers cannot hold the
        wait past its deadline.
        """
        timeout = check_number("timeout", timeout, non_negative=True)
        log.info("waiting up to %.0fs for env server %s", timeout, self.health_url)

        def progress(elapsed: float, last_error: str | None) -> None:
            log.info(
                "still waiting for env server %s after %.0fs (last: %s)",
                self.health_url,
                elapsed,
                last_error,
            )

        result = poll(
            lambda left: self._attempt(min(self.request_timeout, left)),
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

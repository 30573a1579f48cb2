"""Whether a URL is a plain ``http(s)://host[:port][/path]``, and whether its host is loopback.

Standard library only, so that checking a setting never imports `requests`.
"""

from __future__ import annotations

import ipaddress
import re
from urllib.parse import unquote, urlsplit

from verirl._fs import quoted
from verirl._secrets import redact_text
from verirl._validate import MAX_PORT, host_address, ipv4_spelling
from verirl.errors import ConfigError

__all__ = ["is_loopback_host", "validate_http_url"]

_HOST_LABEL = re.compile(r"[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?")
_IPV6_ZONE = re.compile(r"%25[A-Za-z0-9._~-]+")
_MAX_HOST_LENGTH = 253


def _redact_value(value: object) -> object:
    """What a `ConfigError` may show of a URL that failed validation.

    A malformed URL cannot be trusted to split where a valid one would, so
    everything before its last ``@`` goes.
    """
    return redact_text(value) if isinstance(value, str) else value


def _invalid_url(
    field: str, url: object, reason: str, part: str | None = None, hint: str | None = None
) -> ConfigError:
    """The `ConfigError`; ``part`` (the bad piece) is quoted only if no credential can be in it."""
    if part is not None and not (isinstance(url, str) and "@" in url):
        reason = f"{reason} {part}"
    if hint is not None:
        reason = f"{reason}; {hint}"
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
        raise _invalid_url(field, url, "has an invalid host name", quoted(host))
    if all(label.isdigit() for label in labels) or ipv4_spelling(host) is not None:
        # A resolver reads hex, octal and short forms (0x7f000001, 0177.0.0.1,
        # 127.1) as an IPv4 address too: only the dotted quad is taken, so the
        # loopback and same-port checks see the address the request will reach.
        try:
            ipaddress.IPv4Address(host)
        except ValueError:
            spelled = ipv4_spelling(host)
            hint = None if spelled is None else f"write it as a dotted quad, e.g. {str(spelled)!r}"
            raise _invalid_url(
                field, url, "has an invalid IPv4 address", quoted(host), hint
            ) from None


def _check_port(field: str, url: str, port: str | None) -> None:
    if port is None:
        return
    if not (port.isascii() and port.isdigit()):
        raise _invalid_url(field, url, "has an invalid port", quoted(port))
    if not 1 <= int(port) <= MAX_PORT:
        raise _invalid_url(field, url, f"port must be 1..{MAX_PORT}")


def _check_userinfo(field: str, url: str, userinfo: str) -> None:
    """Credentials HTTP basic auth can send: percent-decoded, Latin-1 (as requests encodes them)."""
    parts = userinfo.split(":", 1) if userinfo else []
    if not all(ord(char) < 256 for part in parts for char in unquote(part)):  # noqa: PLR2004
        raise _invalid_url(
            field,
            url,
            "has a user name or password that HTTP basic auth cannot send: percent-decoded, "
            "it holds characters outside Latin-1 (or bytes that are not UTF-8)",
        )


def validate_http_url(field: str, url: object) -> str:
    """Return ``url`` if it is a plain ``http(s)://host[:port][/path]`` URL.

    Otherwise raise `ConfigError` naming ``field`` (and the URL, credentials
    redacted): not a string, whitespace, control or non-ASCII characters
    (write host names in their ``xn--`` form), a backslash (HTTP clients
    disagree on where it ends the host), another scheme, a query or
    fragment, no host or a malformed one, a port outside 1..65535. Credentials
    (``user:password@``) are allowed; show the URL through `redact_url`.
    """
    if not isinstance(url, str):
        raise ConfigError.invalid(field, url, "must be a string such as 'http://127.0.0.1:8000'")
    if not url.isascii() or not url.isprintable() or any(c.isspace() for c in url):
        raise _invalid_url(
            field, url, "must not contain whitespace, control or non-ASCII characters"
        )
    if "\\" in url:  # urllib3 ends the host part there, urllib.parse does not
        raise _invalid_url(
            field, url, "must not contain a backslash (write it %5C in a password or path)"
        )
    try:
        parts = urlsplit(url)
    except ValueError as exc:
        raise _invalid_url(field, url, "is not a valid URL:", str(exc)) from None
    if parts.scheme not in ("http", "https"):
        raise _invalid_url(field, url, "must start with http:// or https://")
    if "?" in url or "#" in url:
        raise _invalid_url(field, url, "must not have a query (?…) or fragment (#…)")
    userinfo, _, hostport = parts.netloc.rpartition("@")
    _check_userinfo(field, url, userinfo)
    if hostport.startswith("["):
        end = hostport.find("]") + 1
        host, rest = hostport[:end], hostport[end:]
        if not end or (rest and not rest.startswith(":")):
            raise _invalid_url(field, url, "has an invalid host", quoted(hostport))
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
    address = host_address(name)  # 0x7f000001, 0177.0.0.1, 127.1: as the resolver reads them
    return address is not None and address.is_loopback

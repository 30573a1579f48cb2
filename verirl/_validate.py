"""Input checks that raise `ConfigError` naming the field and the value.

Parameters are typed ``object`` on purpose: these run on what users actually
pass, which is not always what the annotations promise. Numbers have sane
upper bounds (a count of 10**30 GPUs is a typo, not a plan) and must be
finite: every wait has a deadline.
"""

from __future__ import annotations

import ipaddress
import math
import re
import socket
from collections.abc import Mapping, MutableMapping

from verirl._fs import quoted
from verirl._secrets import redact_url
from verirl.errors import ConfigError

MAX_PORT = 65535
MAX_GPUS = 2**16
"""Upper bound for GPU counts and parallel sizes."""
MAX_LENGTH = 2**30
"""Upper bound for token lengths (``max_model_len``)."""
MAX_RANKS = 2**24
"""Upper bound for ``WORLD_SIZE`` and ranks."""
MAX_SECONDS = 7 * 24 * 3600.0
"""Upper bound for timeouts: a week; longer is a typo, and a deadline must be finite."""

_ASCII_INT = re.compile(r"[+-]?[0-9]+")
_MAX_DIGITS = 30
_ASCII_DECIMAL = re.compile(
    r"[+-]?(?:[0-9]{1,30}(?:\.[0-9]{0,30})?|\.[0-9]{1,30})(?:[eE][+-]?[0-9]{1,4})?"
)
_SPACE = " \t\r\n"
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f]")
_HOSTNAME = re.compile(
    r"(?=.{1,253}\.?$)[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?"
    r"(?:\.[A-Za-z0-9_](?:[A-Za-z0-9_-]{0,61}[A-Za-z0-9_])?)*\.?"
)


def check_int(field: str, value: object, minimum: int, maximum: int | None = None) -> int:
    """An ``int`` (not a bool) that is at least ``minimum`` and at most ``maximum``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError.invalid(field, value, "must be an integer")
    if value < minimum:
        raise ConfigError.invalid(field, value, f"must be >= {minimum}")
    if maximum is not None and value > maximum:
        raise ConfigError.invalid(field, value, f"must be <= {maximum}")
    return value


def check_port(field: str, value: object) -> int:
    """A TCP port, 1..65535."""
    return check_int(field, value, 1, MAX_PORT)


def check_number(
    field: str,
    value: object,
    *,
    positive: bool = False,
    non_negative: bool = False,
    at_most: float | None = None,
) -> float:
    """A finite real number (not a bool), optionally ``> 0``, ``>= 0`` and ``<= at_most``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ConfigError.invalid(field, value, "must be a number")
    try:
        number = float(value)
    except OverflowError:  # an int too large for a float
        raise ConfigError.invalid(field, value, "must be a finite number") from None
    if not math.isfinite(number):
        raise ConfigError.invalid(field, value, "must be a finite number")
    if positive and not number > 0:
        raise ConfigError.invalid(field, value, "must be > 0")
    if non_negative and not number >= 0:
        raise ConfigError.invalid(field, value, "must be >= 0")
    if at_most is not None and number > at_most:
        raise ConfigError.invalid(field, value, f"must be <= {at_most:g}")
    return number


def check_seconds(field: str, value: object, *, positive: bool = False) -> float:
    """A timeout: finite, ``>= 0`` (``> 0`` if ``positive``), at most `MAX_SECONDS`."""
    return check_number(field, value, positive=positive, non_negative=True, at_most=MAX_SECONDS)


def check_environ(value: object, *, mutable: bool = False) -> Mapping[str, str]:
    """An ``environ=`` argument: a mapping (a mutable one when written to)."""
    kind = MutableMapping if mutable else Mapping
    if not isinstance(value, kind):
        what = "a mutable mapping of str" if mutable else "a mapping of str"
        raise ConfigError.invalid("environ", type(value).__name__, f"must be {what}")
    return value


def check_text(field: str, value: object, what: str = "a non-empty string") -> str:
    """A non-empty string."""
    if not isinstance(value, str) or not value:
        raise ConfigError.invalid(field, value, f"must be {what}")
    return value


_NUMERIC_SPELLING = re.compile(r"[0-9A-Fa-fXx.]+")


def ipv4_spelling(host: str) -> ipaddress.IPv4Address | None:
    """The IPv4 address the C library reads ``host`` as, in any spelling; ``None``: not one.

    ``inet_aton`` (which resolvers use on a numeric host) takes one to four
    parts, each decimal, octal (a leading ``0``) or hex (``0x``): ``127.1``,
    ``2130706433``, ``0x7f000001`` and ``0177.0.0.1`` are all ``127.0.0.1``.
    Only characters a number can be spelled with are passed on, so nothing
    after a space or a NUL is ignored into a match. A trailing dot is dropped.
    """
    name = host.removesuffix(".")
    if not name or not _NUMERIC_SPELLING.fullmatch(name):
        return None
    try:
        return ipaddress.IPv4Address(socket.inet_aton(name))
    except (OSError, ValueError):
        return None


def host_address(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """The address a host string reaches, if it is one; ``None`` for a name.

    An IPv6 scope (``%eth0``) is dropped, an IPv4-mapped IPv6 address is its
    IPv4 address, and an unusual IPv4 spelling is read as `ipv4_spelling` does.
    """
    try:
        address: ipaddress.IPv4Address | ipaddress.IPv6Address = ipaddress.ip_address(
            host.partition("%")[0]
        )
    except ValueError:
        return ipv4_spelling(host)
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        return address.ipv4_mapped
    return address


def check_host(field: str, value: object) -> str:
    """A bare host: a DNS name or an IP address (IPv6 without brackets).

    No scheme, port, path, brackets, spaces or control characters: the host is
    put into URLs (``server_url`` brackets an IPv6 address itself) and argv.
    """
    what = "a host name or IP address (no scheme, port, path or brackets)"
    if isinstance(value, str) and "@" in value:  # user:password@host: never echo the password
        raise ConfigError.invalid(field, redact_url(value), f"must be {what}, without credentials")
    text = check_text(field, value, what)
    if len(text) > 2 and text[0] == "[" and text[-1] == "]":  # noqa: PLR2004 - "[" + "]"
        raise ConfigError.invalid(
            field, value, f"write an IPv6 address without brackets, e.g. {quoted(text[1:-1])}"
        )
    scheme, sep, rest = text.partition("://")
    if sep:
        bare = rest.split("/", 1)[0]
        raise ConfigError.invalid(
            field,
            value,
            f"is a URL, not a host: drop the {quoted(scheme)} scheme, e.g. {quoted(bare)}",
        )
    try:
        ipaddress.ip_address(text)
    except ValueError:
        pass
    else:
        return text
    spelled = ipv4_spelling(text)
    if spelled is not None:  # 0x7f000001, 127.1: checks by address would not see 127.0.0.1
        raise ConfigError.invalid(
            field, value, f"is an IPv4 address spelled unusually; write it as {str(spelled)!r}"
        )
    if not _HOSTNAME.fullmatch(text) or text.rstrip(".").rsplit(".", 1)[-1].isdigit():
        # An all-numeric last label is no DNS name (RFC 3696): a mistyped address.
        raise ConfigError.invalid(field, value, f"must be {what}")
    return text


def has_control_chars(text: str) -> bool:
    """Whether ``text`` holds a control character (C0, DEL or C1)."""
    return _CONTROL.search(text) is not None


def parse_int(field: str, raw: object, minimum: int, maximum: int | None = None) -> int:
    """An integer written in ASCII digits (``[+-]?[0-9]+``, surrounding blanks allowed).

    ``int()`` also takes ``"1_0"`` (10) and other scripts' digits (``"٣"``);
    a setting should mean what it shows, so those are errors.
    """
    if not isinstance(raw, str):
        raise ConfigError.invalid(field, raw, "must be a string")
    text = raw.strip(_SPACE)
    if not _ASCII_INT.fullmatch(text):
        raise ConfigError.invalid(field, raw, "must be an integer written in ASCII digits")
    if len(text.lstrip("+-0")) > _MAX_DIGITS:
        bound = f"<= {maximum}" if maximum is not None else f"at most {_MAX_DIGITS} digits"
        raise ConfigError.invalid(field, raw, f"must be {bound}")
    try:
        return check_int(field, int(text), minimum, maximum)
    except ConfigError as exc:
        raise ConfigError.invalid(field, raw, exc.reason or str(exc)) from None


def parse_seconds(field: str, raw: object, *, positive: bool = False) -> float:
    """A timeout as an ASCII decimal (no ``nan``, ``inf``, ``_``); bounds of `check_seconds`."""
    if not isinstance(raw, str):
        raise ConfigError.invalid(field, raw, "must be a string")
    text = raw.strip(_SPACE)
    if not _ASCII_DECIMAL.fullmatch(text):
        raise ConfigError.invalid(field, raw, "must be a number of seconds in ASCII digits")
    try:
        number = float(text)
    except (ValueError, OverflowError):
        raise ConfigError.invalid(field, raw, "must be a finite number") from None
    try:
        return check_seconds(field, number, positive=positive)
    except ConfigError as exc:
        raise ConfigError.invalid(field, raw, exc.reason or str(exc)) from None

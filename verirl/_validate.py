"""Input checks that raise `ConfigError` naming the field and the value.

Parameters are typed ``object`` on purpose: these run on what users actually
pass, which is not always what the annotations promise.
"""

from __future__ import annotations

from verirl.errors import ConfigError

MAX_PORT = 65535


def check_int(field: str, value: object, minimum: int) -> int:
    """An ``int`` (not a bool) that is at least ``minimum``."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ConfigError.invalid(field, value, "must be an integer")
    if value < minimum:
        raise ConfigError.invalid(field, value, f"must be >= {minimum}")
    return value


def check_port(field: str, value: object) -> int:
    """A TCP port, 1..65535."""
    port = check_int(field, value, 1)
    if port > MAX_PORT:
        raise ConfigError.invalid(field, value, f"must be <= {MAX_PORT}")
    return port


def check_number(
    field: str,
    value: object,
    *,
    positive: bool = False,
    non_negative: bool = False,
    at_most: float | None = None,
) -> float:
    """A real number (not a bool), optionally ``> 0``, ``>= 0`` and ``<= at_most``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value != value:  # noqa: PLR0124 - NaN check
        raise ConfigError.invalid(field, value, "must be a number")
    if positive and not value > 0:
        raise ConfigError.invalid(field, value, "must be > 0")
    if non_negative and not value >= 0:
        raise ConfigError.invalid(field, value, "must be >= 0")
    if at_most is not None and value > at_most:
        raise ConfigError.invalid(field, value, f"must be <= {at_most}")
    return float(value)


def check_text(field: str, value: object, what: str = "a non-empty string") -> str:
    """A non-empty string."""
    if not isinstance(value, str) or not value:
        raise ConfigError.invalid(field, value, f"must be {what}")
    return value

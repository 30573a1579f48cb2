"""Keep secrets (Hub tokens, URL passwords) out of reprs, logs and error messages.

A token is checked up front: one with whitespace or control characters (a
token read from a file keeps its newline) would otherwise fail deep inside the
HTTP client with an error that quotes the header, token included. What is
scrubbed is every spelling of the secret a message could carry: raw, as
`repr` escapes it, as a bytes repr, URL-encoded, JSON-escaped and base64.
"""

from __future__ import annotations

import base64
import json
import re
from urllib.parse import quote, quote_plus

from verirl.errors import ConfigError

__all__ = [
    "HIDDEN",
    "check_token",
    "hub_token_in_use",
    "redact_text",
    "redact_url",
    "scrub",
    "scrub_exception",
]

HIDDEN = "<hidden>"
_MIN_SCRUBBED = 4  # shorter strings would scrub ordinary words; tokens are much longer
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")


def check_token(value: object) -> str | None:
    """``value`` as a token (``None`` or ``""``: none); `ConfigError` that never shows it."""
    if value is None or value == "":
        return None
    if not isinstance(value, str):
        raise ConfigError.invalid(
            "token", HIDDEN, f"must be a str or None, not {type(value).__name__}"
        )
    for index, char in enumerate(value):
        if not "!" <= char <= "~":
            what = "a non-ASCII character" if ord(char) > 0x7F else f"U+{ord(char):04X}"  # noqa: PLR2004
            raise ConfigError.invalid(
                "token",
                HIDDEN,
                f"contains {what} at position {index} (of {len(value)}); a token is printable "
                "ASCII without spaces (one read from a file keeps its newline: strip it)",
            )
    return value


def hub_token_in_use(explicit: str | None) -> str | None:
    """The token a Hub request carries: ``explicit``, else the one huggingface_hub finds itself.

    huggingface_hub's ``get_token`` decides (``HF_TOKEN``,
    ``HUGGING_FACE_HUB_TOKEN``, the file at ``HF_TOKEN_PATH`` or
    ``$HF_HOME/token``, an OIDC exchange), so that a token verirl was never
    given is still scrubbed from what it shows. Never raises.
    """
    if explicit:
        return explicit
    try:
        from huggingface_hub import get_token  # noqa: PLC0415 - keep import verirl light

        return get_token() or None
    except Exception:  # noqa: BLE001 - no token to scrub is better than a new error
        return None


def _forms(secret: str) -> list[str]:
    forms = {
        secret,
        repr(secret)[1:-1],
        ascii(secret)[1:-1],
        repr(secret.encode("utf-8", "backslashreplace"))[2:-1],
        quote(secret),
        quote(secret, safe=""),
        quote_plus(secret),
        json.dumps(secret)[1:-1],
        base64.b64encode(secret.encode("utf-8", "backslashreplace")).decode(),
        base64.b64encode(f"Bearer {secret}".encode("utf-8", "backslashreplace")).decode(),
    }
    # Longest first, so that a form containing another is replaced whole.
    return sorted((f for f in forms if len(f) >= _MIN_SCRUBBED), key=len, reverse=True)


def scrub(text: str, secret: str | None, placeholder: str = "<token>") -> str:
    """``text`` with every form of ``secret`` replaced by ``placeholder``."""
    if not secret:
        return text
    for form in _forms(secret):
        text = text.replace(form, placeholder)
    return text


def scrub_exception(exc: BaseException, secret: str | None) -> None:
    """Scrub ``secret`` from the string arguments of ``exc`` and of its cause/context chain."""
    if not secret:
        return
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        args = tuple(
            scrub(arg, secret) if isinstance(arg, str) else _scrub_bytes(arg, secret)
            for arg in current.args
        )
        if args != current.args:
            current.args = args
        current = current.__cause__ or current.__context__


def _scrub_bytes(arg: object, secret: str) -> object:
    if isinstance(arg, bytes) and scrub(repr(arg), secret) != repr(arg):
        return scrub(repr(arg), secret)
    return arg


def redact_text(value: str) -> str:
    """``value`` (a URL, a ``host``, any string a user gave) safe to echo: no ``user:password@``.

    Everything before the *last* ``@`` goes, after the ``scheme://`` if the
    value starts with one: ``http://u:pw@h:1/x`` gives ``http://***@h:1/x``,
    ``u:pw@h`` gives ``***@h``. No attempt is made to find where a URL's
    authority ends (a password may hold ``/``, ``?``, ``#`` or ``:``, and a
    malformed value splits differently for every parser), so a value with an
    ``@`` in its path is redacted too: over-redaction is accepted, a leak is
    not. A value without ``@`` comes back unchanged. Use it on every
    user-given string that may carry credentials before it goes into a
    message, a log line or a repr.
    """
    if "@" not in value:
        return value
    match = _SCHEME.match(value)
    prefix = match.group(0) if match else ""
    return f"{prefix}***@{value.rpartition('@')[2]}"


def redact_url(url: str) -> str:
    """``url`` with any ``user:password@`` part replaced by ``***@`` (see `redact_text`)."""
    return redact_text(url)

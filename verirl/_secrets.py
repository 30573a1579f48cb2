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
import shlex
from collections.abc import Iterable, Mapping, Sequence
from urllib.parse import quote, quote_plus

from verirl.errors import ConfigError

__all__ = [
    "HIDDEN",
    "check_token",
    "hub_token_in_use",
    "redact_argv",
    "redact_text",
    "redact_url",
    "scrub",
    "scrub_exception",
    "secrets_in_environ",
    "shown_command",
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


_SECRET_WORDS = frozenset({"token", "key", "secret", "password", "passwd", "apikey",
                           "credential", "credentials", "auth"})  # fmt: skip
_WORD = re.compile(r"[A-Za-z0-9]+")
_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _secret_name(name: str) -> bool:
    """Whether a flag or variable name holds a secret (its last word is token, key, …).

    ``--api-key``, ``--hf-token``, ``--hub_token``, ``HF_TOKEN``,
    ``WANDB_API_KEY``, ``--password``: over-redaction (``--pad-token``) is
    accepted, a leak is not.
    """
    words = _WORD.findall(name.lower())
    return bool(words) and words[-1] in _SECRET_WORDS


def _redact_shell_line(arg: str, secrets: Sequence[str]) -> str:
    """A shell line (``sh -c '...'``) with its words redacted; any other word as it is."""
    if not any(char.isspace() for char in arg):
        return arg
    try:
        words = shlex.split(arg)
    except ValueError:
        return arg
    if len(words) < 2:  # noqa: PLR2004 - one word: nothing to split
        return arg
    redacted = _redact_words(words, secrets)
    return arg if redacted == words else shlex.join(redacted)


def _redact_words(argv: Sequence[str], secrets: Sequence[str]) -> list[str]:
    shown: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            shown.append(HIDDEN)
            hide_next = False
            continue
        name, equals, _ = arg.partition("=")
        if arg.startswith("-") and _secret_name(name):
            # --api-key=V hides V; --api-key V hides the next word
            shown.append(f"{name}={HIDDEN}" if equals else arg)
            hide_next = not equals
            continue
        if equals and _ASSIGNMENT.fullmatch(name) and _secret_name(name):
            shown.append(f"{name}={HIDDEN}")  # HF_TOKEN=V, as `env` and a shell take it
            continue
        shown.append(redact_text(_redact_shell_line(arg, secrets)))
    return shown


def redact_argv(argv: Iterable[str], *, secrets: Iterable[str | None] = ()) -> list[str]:
    """``argv`` safe to log: the vLLM server's and ``verirl launch``'s command line alike.

    Hidden: the value of a flag named like a secret (``--api-key V``,
    ``--hub_token=V``, ``--password V``: the last word of the name is token,
    key, secret, password, …), of a ``NAME=V`` assignment named so
    (``HF_TOKEN=V``), the same inside a shell line (``sh -c '...'``), a URL's
    ``user:password@``, and every form of each of ``secrets`` (the Hub token
    verirl was given) wherever it appears.
    """
    known = [secret for secret in secrets if secret]
    shown = _redact_words(list(argv), known)
    for secret in known:
        shown = [scrub(arg, secret, HIDDEN) for arg in shown]
    return shown


def secrets_in_environ(environ: Mapping[str, str]) -> list[str]:
    """The values of ``environ``'s variables named like secrets (``HF_TOKEN``, ``*_API_KEY``, …).

    A command line that expanded ``$HF_TOKEN`` carries it with no flag name to
    tell: `redact_argv` scrubs these wherever they appear.
    """
    return [
        value
        for name, value in environ.items()
        if _secret_name(name) and len(value) >= _MIN_SCRUBBED
    ]


def shown_command(value: object) -> object:
    """A command (argv, or one shell-like string) as an error message may show it: redacted.

    A list of strings goes through `redact_argv`; a string is split like a
    shell (on white space when its quotes do not balance) and redacted word by
    word; anything else is shown as it is (it holds no argv to leak).
    """
    if isinstance(value, str):
        try:
            words = shlex.split(value)
        except ValueError:
            words = value.split()
        return " ".join(redact_argv(words))
    if isinstance(value, (list, tuple)) and all(isinstance(item, str) for item in value):
        return type(value)(redact_argv(value))
    return value

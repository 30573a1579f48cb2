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
import os
import re
import shlex
import stat
from collections.abc import Callable, Iterable, Mapping, Sequence
from urllib.parse import quote, quote_plus, unquote

from verirl._fs import printable
from verirl.errors import ConfigError

__all__ = [
    "HIDDEN",
    "check_token",
    "hub_token_in_use",
    "known_secrets",
    "redact_argv",
    "redact_text",
    "redact_url",
    "refuse_unreadable_token_file",
    "scrub",
    "scrub_exception",
    "secrets_in_environ",
    "shown_command",
    "shown_line",
]

HIDDEN = "<hidden>"
_MIN_SCRUBBED = 4  # shorter strings would scrub ordinary words; tokens are much longer
_MIN_ENVIRON_SECRET = 8
"""A variable named like a secret with a shorter value holds a setting (``=true``, ``=EMPTY``)."""
_NOT_SECRETS = frozenset({"true", "false", "yes", "no", "none", "null", "empty", "disabled",
                          "enabled", "unset", "changeme", "dummy", "placeholder"})  # fmt: skip
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
        refuse_unreadable_token_file()  # huggingface_hub would block on it: no token
        from huggingface_hub import get_token  # noqa: PLC0415 - keep import verirl light

        return get_token() or None
    except Exception:  # noqa: BLE001 - no token to scrub is better than a new error
        return None


def _forms(secret: str) -> list[str]:
    raw = _utf8(secret)
    forms = {
        secret,
        repr(secret)[1:-1],
        ascii(secret)[1:-1],
        repr(secret.encode("utf-8", "backslashreplace"))[2:-1],
        quote(raw),
        quote(raw, safe=""),
        quote_plus(raw),
        json.dumps(secret)[1:-1],
        base64.b64encode(secret.encode("utf-8", "backslashreplace")).decode(),
        base64.b64encode(f"Bearer {secret}".encode("utf-8", "backslashreplace")).decode(),
    }
    # Longest first, so that a form containing another is replaced whole.
    return sorted((f for f in forms if len(f) >= _MIN_SCRUBBED), key=len, reverse=True)


def _utf8(text: str) -> bytes:
    """``text``'s bytes: escaped bytes (``os.fsdecode``) as they were, other surrogates escaped."""
    try:
        return text.encode("utf-8", "surrogateescape")
    except UnicodeEncodeError:
        return text.encode("utf-8", "backslashreplace")


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
    """``value`` (a URL, a ``host``, any string a user gave) safe to echo.

    Hidden: a URL's ``user:password@``, the value of a query or fragment
    parameter named like a secret (``?token=V``, ``&api_key=V``,
    ``#access_token=V``, ``?X-Amz-Signature=V``, ``?sig=V``: see
    `_secret_param`), and the credential of an HTTP header that carries one
    (``Authorization: Bearer V`` keeps its scheme, ``X-Api-Key: V``,
    ``Cookie: V``) wherever it appears in ``value``.

    For ``user:password@``, everything before the *last* ``@`` goes, after the
    ``scheme://`` if the value starts with one: ``http://u:pw@h:1/x`` gives
    ``http://***@h:1/x``, ``u:pw@h`` gives ``***@h``. No attempt is made to
    find where a URL's authority ends (a password may hold ``/``, ``?``,
    ``#`` or ``:``, and a malformed value splits differently for every
    parser), so a value with an ``@`` in its path is redacted too:
    over-redaction is accepted, a leak is not. Use it on every user-given
    string that may carry credentials before it goes into a message, a log
    line or a repr.
    """
    value = _redact_params(value)
    if "@" not in value:
        return value
    match = _SCHEME.match(value)
    prefix = match.group(0) if match else ""
    return f"{prefix}***@{value.rpartition('@')[2]}"


# A query or fragment parameter's name: it follows ?, &, ; or #. The value of a secret one runs
# to the next & or # or white space (a ? ; or quote is taken in: hiding too much beats showing a
# part). Names are found without consuming values, so "?a=b?token=V" still finds token.
_PARAM_NAME = re.compile(r"(?<=[?&;#])([^=&#;?\s]+)=")
_PARAM_VALUE = re.compile(r"[^&#\s]*")
_PARAM_WORDS = frozenset({"sig", "signature", "pwd", "pass", "jwt", "session", "sessionid",
                          "sid", "cookie", "code", "bearer"})  # fmt: skip
# An HTTP header that carries a credential: Authorization or Cookie, or a name whose last word is
# secret-like (X-Api-Key, Private-Token, X-Auth-Token); an auth scheme before the value is kept.
_HEADER_NAME = re.compile(r"(?<![A-Za-z0-9_-])([A-Za-z][A-Za-z0-9_-]*)[ \t]*:[ \t]*")
_HEADER_VALUE = re.compile(
    r"((?:bearer|basic|token|digest|negotiate|apikey|dpop|hoba|mutual|ntlm)\b[ \t]*)?([^\s'\"]*)",
    re.IGNORECASE,
)
_HEADER_NAMES = frozenset({"authorization", "proxy-authorization", "cookie", "set-cookie"})
# A credential after the Bearer scheme, wherever it stands (``--header=Bearer V``).
_BEARER = re.compile(r"(?<![A-Za-z0-9_-])bearer[ \t]+", re.IGNORECASE)
_BEARER_VALUE = re.compile(r"[^\s'\"]+")


def _secret_param(name: str) -> bool:
    """Whether a query parameter holds a secret (any word of its name is token, key, sig, …)."""
    words = _WORD.findall(unquote(name).lower())
    return any(word in _SECRET_WORDS or word in _PARAM_WORDS for word in words)


def _secret_header(name: str) -> bool:
    return name.lower() in _HEADER_NAMES or _secret_name(name)


def _hide_after(
    text: str,
    names: re.Pattern[str],
    secret: Callable[[str], bool],
    values: re.Pattern[str],
    group: int,
) -> str:
    """``text`` with ``values``' ``group`` hidden after each name (``names``) ``secret`` accepts.

    Only a hidden value is consumed: a name inside another's shown value is still found.
    """
    shown: list[str] = []
    position = 0
    for found in names.finditer(text):
        if found.start() < position or not secret(found.group(found.lastindex or 0)):
            continue
        value = values.match(text, found.end())
        if value is None or not value.group(group) or value.group(group) == HIDDEN:
            continue
        shown += [text[position : value.start(group)], HIDDEN]
        position = value.end(group)
    return "".join([*shown, text[position:]])


def _redact_params(value: str) -> str:
    """``value`` without secret query parameters' values and header credentials."""
    if "=" in value:
        value = _hide_after(value, _PARAM_NAME, _secret_param, _PARAM_VALUE, 0)
    if ":" in value:
        value = _hide_after(value, _HEADER_NAME, _secret_header, _HEADER_VALUE, 2)
    return _hide_after(value, _BEARER, lambda _: True, _BEARER_VALUE, 0)


def redact_url(url: str) -> str:
    """``url`` with any ``user:password@`` part replaced by ``***@`` (see `redact_text`)."""
    return redact_text(url)


_SECRET_WORDS = frozenset({"token", "key", "secret", "password", "passwd", "apikey",
                           "credential", "credentials", "auth"})  # fmt: skip
_WORD = re.compile(r"[A-Za-z0-9]+")
_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


# Flags that hold a secret, dashes for underscores: a flag written as a prefix of one of these
# (argparse takes an unambiguous abbreviation: ``--api-k V`` is ``--api-key V``) holds it too.
_SECRET_FLAGS = ("--api-key", "--api-token", "--hub-token", "--hf-token", "--token", "--secret",
                 "--auth-token", "--access-token", "--password", "--passwd")  # fmt: skip
_MIN_ABBREVIATION = 4  # "--ap": shorter ("--a", "--") abbreviates too many flags to mean one


def _secret_name(name: str) -> bool:
    """Whether a flag or variable name holds a secret.

    Its last word is token, key, secret, password, … (``--api-key``,
    ``--hf-token``, ``--hub_token``, ``HF_TOKEN``, ``WANDB_API_KEY``,
    ``--password``), or it is a ``--`` flag of at least 4 characters (dashes
    included) that, *as written*, is a prefix of a secret flag in
    ``_SECRET_FLAGS`` (``_`` read as ``-``, any case), as argparse takes an
    unambiguous abbreviation: ``--ap``, ``--api-k``, ``--hub-t``, ``--pass``,
    ``--acc``, ``--sec``. The flag must be the shorter one: ``--tokenizer`` is
    not a prefix of ``--token`` and is not secret, nor are ``--top-k``,
    ``--max-tokens``, ``--port``, ``--seed``. ``--tok``/``--toke`` (a prefix of
    both ``--token`` and ``--tokenizer``, which argparse calls ambiguous where
    a parser has both) *are* hidden, like every short abbreviation of a secret
    flag (``--to``, ``--pa``, ``--se``): over-redaction (``--pad-token``, an
    abbreviation meant for another flag) is accepted, a leak is not.
    """
    lowered = name.lower()
    words = _WORD.findall(lowered)
    if words and words[-1] in _SECRET_WORDS:
        return True
    if not lowered.startswith("--") or len(lowered) < _MIN_ABBREVIATION:
        return False
    flag = lowered.replace("_", "-")
    return any(secret.startswith(flag) for secret in _SECRET_FLAGS)


_QUOTES = "'\"`"


def _redact_split_line(arg: str, secrets: Sequence[str]) -> str:
    """A line whose quotes do not balance, redacted word by word on white space.

    A word is judged without the quotes around it (``"--api-key`` is the flag,
    ``'HF_TOKEN=V`` the assignment) and shown as written unless it is hidden.
    """
    arg = _redact_params(arg)  # a header or a query split over words (-H "Authorization: Bearer V)
    words = arg.split()
    bare = [word.strip(_QUOTES) or word for word in words]
    redacted = _redact_words(bare, secrets, shell=False)  # no word of it is split again
    shown = [
        word if new == old else new for word, old, new in zip(words, bare, redacted, strict=True)
    ]
    return arg if shown == words else _redact_params(" ".join(shown))


def _redact_shell_line(arg: str, secrets: Sequence[str]) -> str:
    """A shell line (``sh -c '...'``) with its words redacted; any other word as it is.

    A line shlex cannot split (an unbalanced quote: ``# don't``) is split on
    white space instead: it is never returned unredacted.
    """
    if not any(char.isspace() or char in _QUOTES or char == "\\" for char in arg):
        return arg  # a plain word: nothing to split or unquote
    try:
        words = shlex.split(arg)
    except ValueError:
        return _redact_split_line(arg, secrets)
    if words == [arg]:  # one word, nothing to unquote: nothing more to split
        return arg
    redacted = _redact_words(words, secrets)
    return arg if redacted == words else shlex.join(redacted)


def _redact_words(argv: Sequence[str], secrets: Sequence[str], *, shell: bool = True) -> list[str]:
    shown: list[str] = []
    hide_next = False
    for arg in argv:
        if hide_next:
            shown.append(HIDDEN)
            hide_next = False
            continue
        name, equals, _ = arg.partition("=")
        flag = arg.startswith("-") and not any(char.isspace() for char in name)  # not a line
        if flag and _secret_name(name):
            # --api-key=V hides V; --api-key V hides the next word
            shown.append(f"{name}={HIDDEN}" if equals else arg)
            hide_next = not equals
            continue
        if equals and _ASSIGNMENT.fullmatch(name) and _secret_name(name):
            shown.append(f"{name}={HIDDEN}")  # HF_TOKEN=V, as `env` and a shell take it
            continue
        # a header or query first, whole: split, "Authorization: Bearer V" would lose its name
        text = _redact_params(arg)
        shown.append(redact_text(_redact_shell_line(text, secrets) if shell else text))
    return shown


def redact_argv(argv: Iterable[str], *, secrets: Iterable[str | None] = ()) -> list[str]:
    """``argv`` safe to log: the vLLM server's and ``verirl launch``'s command line alike.

    Hidden: the value of a flag named like a secret (``--api-key V``,
    ``--hub_token=V``, ``--password V``: the last word of the name is token,
    key, secret, password, …; or an abbreviation such as ``--api-k V``: see
    `_secret_name`), of a ``NAME=V`` assignment named so (``HF_TOKEN=V``), the
    same inside a shell line (``sh -c '...'``, split on white space when its
    quotes do not balance), what `redact_text` hides (a URL's
    ``user:password@``, ``?token=V``, ``Authorization: Bearer V``), and every
    form of each of ``secrets`` (the Hub token verirl was given) and of
    `known_secrets` (this process's secret variables, the saved Hub login)
    wherever it appears. `shown_line` is the same as one line any UTF-8 log
    can hold.
    """
    known = [secret for secret in (*secrets, *known_secrets()) if secret]
    shown = _redact_words(list(argv), known)
    for secret in known:
        shown = [scrub(arg, secret, HIDDEN) for arg in shown]
    return shown


def shown_line(argv: Iterable[str], *, secrets: Iterable[str | None] = ()) -> str:
    """`redact_argv` joined as a shell line; bytes that are not UTF-8 shown as `printable` does."""
    return printable(shlex.join(redact_argv(argv, secrets=secrets)))


def secrets_in_environ(environ: Mapping[str, str]) -> list[str]:
    """The values of ``environ``'s variables named like secrets (``HF_TOKEN``, ``*_API_KEY``, …).

    A command line that expanded ``$HF_TOKEN`` carries it with no flag name to
    tell: `redact_argv` scrubs these wherever they appear.
    """
    return [
        value
        for name, value in environ.items()
        if _secret_name(name)
        and len(value) >= _MIN_ENVIRON_SECRET
        and value.strip().lower() not in _NOT_SECRETS
    ]


def known_secrets(environ: Mapping[str, str] | None = None) -> list[str]:
    """The secrets a command line may carry unnamed: `secrets_in_environ` and the saved Hub token.

    The saved token is the file huggingface_hub itself reads when no variable
    gives one (``HF_TOKEN_PATH``, else ``$HF_HOME/token`` as ``hf auth login``
    writes it): read here without huggingface_hub, without blocking (a FIFO
    or a folder there is no token).
    """
    env = os.environ if environ is None else environ
    found = secrets_in_environ(env)
    saved = _saved_hub_token(env)
    if saved is not None and saved not in found:
        found.append(saved)
    return found


def _token_path(environ: Mapping[str, str]) -> str:
    """Where huggingface_hub reads the saved token (``constants.HF_TOKEN_PATH``'s rules)."""

    # As huggingface_hub.constants has it: a variable set but empty is used as it is.
    def expanded(text: str) -> str:
        return os.path.expandvars(os.path.expanduser(text))  # noqa: PTH111 - its own order

    if environ.get("HUGGINGFACE_CO_STAGING", "").upper() in {"1", "ON", "YES", "TRUE"}:
        return os.path.join(os.path.expanduser("~"), ".cache", "huggingface_staging", "token")  # noqa: PTH111, PTH118
    cache = environ.get("XDG_CACHE_HOME", os.path.join(os.path.expanduser("~"), ".cache"))  # noqa: PTH111, PTH118
    home = expanded(environ.get("HF_HOME", os.path.join(cache, "huggingface")))  # noqa: PTH118
    return expanded(environ.get("HF_TOKEN_PATH", os.path.join(home, "token")))  # noqa: PTH118


_FILE_KINDS = ((stat.S_ISFIFO, "a FIFO", "block forever"), (stat.S_ISSOCK, "a socket", "fail"),
               (stat.S_ISDIR, "a directory", "fail"), (stat.S_ISCHR, "a device", "block"),
               (stat.S_ISBLK, "a device", "block"))  # fmt: skip


def refuse_unreadable_token_file(environ: Mapping[str, str] | None = None) -> None:
    """`ConfigError` when huggingface_hub would look for the token in something not a file.

    With no ``HF_TOKEN``/``HUGGING_FACE_HUB_TOKEN``, huggingface_hub reads
    the file at ``HF_TOKEN_PATH`` (else ``$HF_HOME/token``) on every request,
    with a plain ``open``: a FIFO there blocks it forever, with no deadline
    verirl could set. Checked before anything asks huggingface_hub; the
    message names the variable and the path, never a token.
    """
    env = os.environ if environ is None else environ
    if any((env.get(name) or "").strip() for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")):
        return  # huggingface_hub takes the variable and never opens the file
    token = _token_path(env)
    # the token file, and the stored_tokens file beside it (read once a token is found there)
    for path in (token, os.path.join(os.path.dirname(token), "stored_tokens")):  # noqa: PTH118, PTH120
        try:
            mode = os.stat(path).st_mode  # noqa: PTH116 - a str that may not be UTF-8
        except (OSError, ValueError):
            continue  # no file: nothing read there
        for test, kind, effect in _FILE_KINDS:
            if test(mode):
                variable = "HF_TOKEN_PATH" if "HF_TOKEN_PATH" in env else "HF_HOME"
                why = (
                    f"the Hub token file there is {kind}, not a file: huggingface_hub would "
                    f"{effect} reading it; point HF_TOKEN_PATH at the token file, remove it, "
                    "or set HF_TOKEN"
                )
                raise ConfigError.invalid(variable, printable(path), why)


def _saved_hub_token(environ: Mapping[str, str]) -> str | None:
    path = _token_path(environ)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except (OSError, ValueError):
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):  # a FIFO, a directory: no token
            return None
        token = os.read(fd, 4096).decode("utf-8", "replace").strip()
    except OSError:
        return None
    finally:
        os.close(fd)
    return token if len(token) >= _MIN_SCRUBBED else None


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
            return _redact_split_line(value, [])
        return " ".join(redact_argv(words))
    if isinstance(value, (list, tuple)) and all(isinstance(item, str) for item in value):
        return type(value)(redact_argv(value))
    return value

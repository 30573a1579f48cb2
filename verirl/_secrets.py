"""Keep secrets (Hub tokens, URL passwords, keys on command lines) out of reprs, logs and errors.

What is scrubbed is every spelling of the secret a message could carry: raw,
as `repr` escapes it, as a bytes repr, URL-encoded, JSON-escaped and base64;
what is redacted is every place a secret stands by its name or its form (a
URL's password, ``?token=``, a header, a flag's value, another tool's
secret words). Where the Hub token comes from, and its check up front, is
`verirl._hub_token`'s.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shlex
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import NamedTuple
from urllib.parse import quote, quote_plus, unquote

from verirl._fs import escape_bytes, printable, quoted
from verirl._hidden import HIDDEN
from verirl._hidden import MIN_SCRUBBED as _MIN_SCRUBBED
from verirl._hub_token import _saved_hub_token, cleaned_token
from verirl.errors import ConfigError

__all__ = [
    "known_secrets",
    "redact_and_scrub",
    "redact_argv",
    "redact_message",
    "redact_text",
    "redact_url",
    "scrub",
    "scrub_config_error",
    "scrub_exception",
    "secrets_in_environ",
    "shown_command",
    "shown_line",
    "taken_out",
]

_MIN_ENVIRON_SECRET = 8
"""A variable named like a secret with a shorter value holds a setting (``=true``, ``=EMPTY``)."""
_NOT_SECRETS = frozenset({"true", "false", "yes", "no", "none", "null", "empty", "disabled",
                          "enabled", "unset", "changeme", "dummy", "placeholder"})  # fmt: skip
_SCHEME = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://")


def _scrubbed_value(value: object, secret: str) -> object:
    """An error's value with ``secret`` scrubbed: text, and each text word of an argv."""
    if isinstance(value, str):
        return scrub(value, secret)
    if isinstance(value, (list, tuple)):
        words = [_scrubbed_value(item, secret) for item in value]
        return tuple(words) if isinstance(value, tuple) else words
    if isinstance(value, (bytes, os.PathLike)):  # shown as the text it stands for, if it shows
        text = _word_text(value)
        shown = scrub(text, secret)
        return shown if shown != text else value
    return value


def scrub_config_error(exc: ConfigError, secret: str | None) -> ConfigError:
    """``exc`` with every form of ``secret`` scrubbed from its message, value and reason."""
    if not secret:
        return exc
    value = _scrubbed_value(exc.value, secret)
    reason = None if exc.reason is None else scrub(exc.reason, secret)
    return type(exc)(scrub(str(exc), secret), field=exc.field, value=value, reason=reason)


def _forms(secret: str) -> list[str]:
    raw = _utf8(secret)
    forms = {
        secret,
        repr(secret)[1:-1],
        quoted(secret)[1:-1],
        printable(secret),
        escape_bytes(secret),
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


def scrub_all(text: str, secrets: Iterable[str], placeholder: str = "<token>") -> str:
    """``text`` with every form of each of ``secrets`` replaced, a longer one before its parts."""
    for secret in sorted(set(secrets), key=len, reverse=True):
        text = scrub(text, secret, placeholder)
    return text


def redact_and_scrub(text: str, secrets: Iterable[str], placeholder: str = HIDDEN) -> str:
    """``text`` with what `redact_message` hides and every form of ``secrets`` hidden, both.

    Redacted first: scrubbed first, ``https://<hidden>:PASSWORD@h`` is no URL
    credential any more. But the redaction may cut into a secret the text
    quotes (``ab:KEY@host`` shows as ``***@host``), so the whole forms no
    longer match what is left: of a secret the text quotes, each fragment
    between the characters a redaction or a line break cuts at is hidden too.
    So is a secret's start that a message cut short kept (`_PREFIX_SHOWN`
    characters or more). A ``placeholder`` already written is never rewritten:
    each is a NUL (which no argument or variable holds) until the end.
    """
    secrets = sorted({s for s in secrets if s}, key=len, reverse=True)
    forms = {secret: _forms(secret) for secret in secrets}
    fragments = {
        part
        for secret in secrets
        if any(form in text for form in forms[secret])
        for part in _FRAGMENT_CUTS.split(secret)
    }
    shown = redact_message(text.replace(_MARK, "\\x00")).replace(placeholder, _MARK)
    for secret in secrets:
        for form in forms[secret]:
            shown = shown.replace(form, _MARK)
    for fragment in sorted(fragments, key=len, reverse=True):
        if len(fragment) >= _MIN_SCRUBBED:
            shown = shown.replace(fragment, _MARK)
    return _MARKS.sub(placeholder, _hide_prefixes(shown, secrets))


_MARK = "\0"
"""`redact_and_scrub`'s placeholder until the end."""
_MARKS = re.compile("\0+")
_PREFIX_SHOWN = 8
"""Characters of a secret's start that count as quoting it (a message cut at a length)."""


def _hide_prefixes(text: str, secrets: Iterable[str]) -> str:
    """``text`` with each run that starts like one of ``secrets`` (`_PREFIX_SHOWN`) a `_MARK`."""
    for secret in secrets:
        if len(secret) <= _PREFIX_SHOWN:
            continue
        pieces: list[str] = []
        done = 0
        start = text.find(secret[:_PREFIX_SHOWN])
        while start != -1:
            end = start + _PREFIX_SHOWN
            while (
                end < len(text) and end - start < len(secret) and text[end] == secret[end - start]
            ):
                end += 1
            pieces += [text[done:start], _MARK]
            done = end
            start = text.find(secret[:_PREFIX_SHOWN], end)
        text = "".join([*pieces, text[done:]])
    return text


# What a redaction's patterns stop at (an auth scheme's word ends at '-' or '.'), and a line
# break: a fragment between two is kept whole.
_FRAGMENT_CUTS = re.compile(r"""[\s:@=&?/#;,.'"`<>()\[\]{}|\\\x00-\x1f\x7f-]+""")


def scrub_exception(exc: BaseException, secret: str | None) -> None:
    """Scrub ``secret`` from ``exc`` and its cause/context chain.

    Their string arguments, and the ``value`` and ``reason`` a `ConfigError`
    keeps beside its message: code that walks the chain reads those too.
    """
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
        kept = vars(current)
        if "value" in kept:
            current.value = _scrubbed_value(kept["value"], secret)  # type: ignore[attr-defined]
        if isinstance(kept.get("reason"), str):
            current.reason = scrub(kept["reason"], secret)  # type: ignore[attr-defined]
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
    ``Cookie: V``, ``X-Goog-Api-Key=V``) wherever it appears in ``value``, and
    the value of a secret-named key in a structured value (``{"api_key": "V"}``
    with or without spaces, nested, ``{'token': 'V'}``, ``token: "V"``): only
    the value goes, its quotes and everything around it stay (see
    `_hide_structured`).

    For ``user:password@``, everything before the *last* ``@`` goes, after the
    ``scheme://`` if the value starts with one: ``http://u:pw@h:1/x`` gives
    ``http://***@h:1/x``, ``u:pw@h`` gives ``***@h``. No attempt is made to
    find where a URL's authority ends (a password may hold ``/``, ``?``,
    ``#`` or ``:``, and a malformed value splits differently for every
    parser), so a value with an ``@`` in its path is redacted too:
    over-redaction is accepted, a leak is not. Kept: a value that is a path at
    a revision and nothing else (``org/repo@main``, ``org/repo/sub@v1.2``).
    Use it on every user-given string that may carry credentials before it
    goes into a message, a log line or a repr.
    """
    value = _redact_params(value)
    if "@" not in value:
        return value
    match = _SCHEME.match(value)
    prefix = match.group(0) if match else ""
    if _PATH_AT_REVISION.fullmatch(value):
        return value  # org/repo@main: no user, no password
    return f"{prefix}***@{value.rpartition('@')[2]}"


_PATH_AT_REVISION = re.compile(r"[A-Za-z0-9_][\w.-]*(?:/[\w.-]+)+@[\w.+-]+")
"""``org/repo@main``: a Hub repository or a path at a revision, one ``@``, no scheme, no user."""


# A query or fragment parameter's name: it follows ?, &, ; or #. The value of a secret one runs
# to the next & or # or white space, or a quote that ends it (one followed by white space, a quote
# or a delimiter: the value was quoted); a ? ; or other quote is taken in: hiding too much beats
# showing a part. Names are found without consuming values, so "?a=b?token=V" still finds token.
_PARAM_NAME = re.compile(r"(?<=[?&;#])([^=&#;?\s]+)=")
_PARAM_VALUE = re.compile(r"""(?:[^&#\s'"]|['"](?=[^\s'",;:)}\]]))*""")
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
    words = _words(unquote(name))
    return any(
        word in _PARAM_WORDS or _ends_secret(words[: end + 1]) for end, word in enumerate(words)
    )


def _secret_header(name: str) -> bool:
    return name.lower() in _HEADER_NAMES or _secret_name(name)


_Span = Callable[[str, re.Match[str]], "tuple[int, int] | None"]
"""Where the value after a name's match is, or ``None``: nothing to hide there."""


def _hide_after(
    text: str, names: re.Pattern[str], secret: Callable[[str], bool], span: _Span
) -> str:
    """``text`` with the value ``span`` finds hidden after each name (``names``) ``secret`` accepts.

    Only a hidden value is consumed: a name inside another's shown value is
    still found. A value that is `HIDDEN` alone was hidden by an earlier pass
    (``auth_token:<hidden>}}`` once a split dropped JSON's quotes): kept, and
    told before its span is looked for (a span runs to the next white space:
    looked for at each of many such names, it made the pass quadratic).
    """
    shown: list[str] = []
    position = 0
    for found in names.finditer(text):
        name = found["name"] if "name" in names.groupindex else found[found.lastindex or 0]
        if found.start() < position or _hidden_at(text, found.end()):
            continue
        if not secret(name) and not _secret_subscript(names, found, secret):
            continue
        value = span(text, found)
        if value is None or value[0] == value[1] or text[value[0] : value[1]] == HIDDEN:
            continue
        shown += [text[position : value[0]], HIDDEN]
        position = value[1]
    return "".join([*shown, text[position:]])


def _secret_subscript(
    names: re.Pattern[str], found: re.Match[str], secret: Callable[[str], bool]
) -> bool:
    """Whether a quoted subscript after the name names a secret (``os.environ["HF_TOKEN"]``)."""
    index: str | None = found["index"] if "index" in names.groupindex else None
    if not index:
        return False
    return any(secret(key) for _, key in _QUOTED_SUBSCRIPT.findall(index))


_QUOTED_SUBSCRIPT = re.compile(r"""\[[ \t]*(\\*["'])(.*?)\1[ \t]*\]""")
"""A subscript that is a quoted string (``["HF_TOKEN"]``, ``[ 'key' ]``, ``[\\"key\\"]``)."""

_AFTER_HIDDEN = frozenset(" \t\r\n'\"`,;&#)}]")


def _hidden_at(text: str, start: int) -> bool:
    """Whether `HIDDEN` alone (a delimiter or the end after it) is at ``start`` in ``text``."""
    end = start + len(HIDDEN)
    return text.startswith(HIDDEN, start) and (end == len(text) or text[end] in _AFTER_HIDDEN)


def _regex_span(values: re.Pattern[str], group: int) -> _Span:
    """The span of ``values``' ``group`` matched right after the name."""

    def span(text: str, found: re.Match[str]) -> tuple[int, int] | None:
        value = values.match(text, found.end())
        return None if value is None else value.span(group)

    return span


# A secret-named key in a structured value, its quotes kept: "name": V (JSON, with or without
# spaces), 'name': V (a Python dict), \"name\": V (JSON inside a quoted shell string), name: "V"
# (YAML), name=V (a header or setting given as one word). A bare name and a bare value after ":"
# are a header's: _HEADER_NAME's pass keeps their auth scheme.
_KEY = re.compile(
    r"(?<![A-Za-z0-9_.\\-])(\\*[\"']|)(?P<name>[A-Za-z_][A-Za-z0-9_.-]*)"
    r"(?P<index>(?:\[[^\]\r\n]{0,64}\])*)\1([ \t]*)(\+?=|:)(\s*)"
)
_OPEN_QUOTE = re.compile(r"\\*[\"']")
# Inside "…", '"'"' is a ' as shlex.quote writes it in a shell line, not the string's end.
_QUOTED = {
    '"': re.compile(r"""(?:'"'"'|[^"\\]|\\.)*""", re.DOTALL),
    "'": re.compile(r"(?:[^'\\]|\\.)*", re.DOTALL),
}
_JSON_SCALAR = re.compile(r"[^\s,}\]]*")
# A bare value runs to white space or a quote that ends it (one followed by a quote, white space
# or a JSON delimiter); a quote inside it (pass=ab"cd) is taken in. An auth scheme stays.
_BARE_VALUE = re.compile(
    r"((?:bearer|basic|token|digest|negotiate|apikey|dpop|hoba|mutual|ntlm)\b[ \t]*)?"
    r"((?:\\[ \t]|[^\s'\"]|['\"](?=[^\s'\",;)}\]]))*)",  # "\ ": a space kept in (printf %q)
    re.IGNORECASE,
)


def _structured_span(text: str, found: re.Match[str]) -> tuple[int, int] | None:
    """Where the value after a key (`_KEY`) is, or ``None`` when another pass judges it.

    A quoted string's inside (its quotes stay), a whole ``{…}`` or ``[…]``, a
    scalar after a quoted key, a bare ``name=V``'s ``V`` (a query's is
    `_PARAM_NAME`'s, a bare ``name: V`` a header's).
    """
    key_quote, separator, spaced = found.group(1), found.group(5), found.group(6)
    start = _past_string_prefix(text, _past_continuation(text, found.end()))
    quoted = _quoted_span(text, start)
    if quoted is not None:
        return quoted
    if text.startswith(("{", "["), start):
        return start, _bracket_end(text, start)
    if key_quote:
        return start, _match_end(_JSON_SCALAR, text, start)
    before = text[found.start() - 1 : found.start()]
    bare = (
        ((separator in {"=", "+="} and not spaced) or (separator == ":" and bool(found["index"])))
        and before not in {"?", "&", ";", "#"}
        and not text.startswith(("=", ":"), start)  # "key == x": an operator, no value
    )
    value = _BARE_VALUE.match(text, start) if bare else None
    # None: "a == b", "key = value" in code; a bare header and a query: their own passes
    return None if value is None else value.span(2)


_TYPOGRAPHIC = {"\u201c": "\u201d", "\u2018": "\u2019", "\u201e": "\u201c", "\u00ab": "\u00bb",
                "\u201d": "\u201d"}  # fmt: skip
"""A typographic opening quote → its closing one (Swedish ”V” opens and closes alike)."""

_STRING_PREFIX = re.compile(r"[rbfuRBFU]{1,2}(?=\\*[\"'])")


def _quoted_span(text: str, start: int) -> tuple[int, int] | None:
    """The inside of a quoted string opening at ``start`` (its quotes stay), else None.

    Typographic quotes (``“V”``, ``‘V’``, ``«V»``: text pasted from a document)
    count too, up to their closing one or the end of the line.
    """
    closing = _TYPOGRAPHIC.get(text[start : start + 1])
    if closing is not None:
        line_end = text.find("\n", start)
        line_end = len(text) if line_end < 0 else line_end
        end = text.find(closing, start + 1, line_end)
        return start + 1, line_end if end < 0 else end
    quote = _OPEN_QUOTE.match(text, start)
    if quote is None:
        return None
    mark = quote.group(0)
    if len(mark) == 1:
        return start + 1, _match_end(_QUOTED[mark], text, start + 1)
    end = text.find(mark, quote.end())  # \"…\": the same escaped quote ends it
    return quote.end(), len(text) if end < 0 else end


def _past_continuation(text: str, start: int) -> int:
    """``start``, or past a shell's line continuation there (a backslash, a line break)."""
    continued = _CONTINUATION.match(text, start)
    return start if continued is None else continued.end()


_CONTINUATION = re.compile(r"\\\r?\n[^\S\r\n]*")


def _past_string_prefix(text: str, start: int) -> int:
    """``start``, or past a Python string's prefix there (``f"Bearer {t}"``, ``rb'…'``)."""
    prefix = _STRING_PREFIX.match(text, start)
    return start if prefix is None else prefix.end()


def _match_end(pattern: re.Pattern[str], text: str, start: int) -> int:
    """Where ``pattern`` (one that matches the empty string too) ends when matched at ``start``."""
    found = pattern.match(text, start)
    return start if found is None else found.end()


def _bracket_end(text: str, start: int) -> int:
    """The end of the ``{…}`` or ``[…]`` at ``start`` (strings skipped), or of ``text``."""
    depth = 0
    position = start
    while position < len(text):
        char = text[position]
        if char == '"':
            position = _match_end(_QUOTED['"'], text, position + 1)
        elif char in "{[":
            depth += 1
        elif char in "}]":
            depth -= 1
            if depth == 0:
                return position + 1
        position += 1
    return len(text)


def _hide_structured(text: str) -> str:
    """``text`` with the value of each secret-named key of a structured value hidden (`_KEY`)."""
    return _hide_after(text, _KEY, _secret_key, _structured_span)


def _redact_params(value: str) -> str:
    """``value`` without secret keys', query parameters' and header credentials' values.

    A URL's password (or its user alone, ``//TOKEN@``) is shielded from
    these passes (`_shield_credentials`) and put back for the URL pass that
    follows: one that reads like a secret key (``u:mypwd=@h``) was taken for
    one, its empty value hidden with the ``@``, and so never seen as a URL's.
    It is put back only behind what led to it; where a pass rewrote that
    (a user that is a Hub token), it stays hidden.
    """
    if "@" not in value:
        return _redact_names(value)
    shield = next((chr(code) for code in _PRIVATE_USE if chr(code) not in value), None)
    shielded, credentials = _shield_credentials(value, shield)
    value = _redact_names(shielded)
    if shield is None or not credentials:
        return value

    def put_back(mark: re.Match[str]) -> str:
        lead, credential = credentials[int(mark.group(1))]
        return credential if mark.string.endswith(lead, 0, mark.start()) else HIDDEN

    return re.sub(f"{shield}([0-9]+){shield}", put_back, value)


_PRIVATE_USE = range(0xE000, 0xF900)
"""Characters no pass reads as part of a name or a value: a shield is one the text lacks."""


def _shield_credentials(text: str, shield: str | None) -> tuple[str, list[tuple[str, str]]]:
    """``text`` with each URL credential (`_userinfo_spans`) replaced by a numbered shield.

    Each credential comes with what leads to it: ``user:`` before a
    password, ``//`` before a user alone. Without a shield (the text holds
    every private-use character), each is hidden outright.
    """
    pieces: list[str] = []
    credentials: list[tuple[str, str]] = []
    position = 0
    for start, end in _userinfo_spans(text):
        user, colon, password = text[start : end - 1].partition(":")
        if colon and password:
            cut, lead = start + len(user) + 1, f"{user}:"
        elif not colon and user and text[max(0, start - 2) : start] == "//":
            cut, lead = start, "//"
        else:
            continue
        mark = HIDDEN if shield is None else f"{shield}{len(credentials)}{shield}"
        pieces += [text[position:cut], mark]
        credentials.append((lead, text[cut : end - 1]))
        position = end - 1
    return "".join([*pieces, text[position:]]), credentials


def _redact_names(value: str) -> str:
    """``value`` without secret keys', query parameters' and header credentials' values."""
    if "=" in value or ":" in value:
        value = _hide_structured(value)
    if "=" in value:
        value = _hide_after(value, _PARAM_NAME, _secret_param, _regex_span(_PARAM_VALUE, 0))
    if ":" in value:
        value = _hide_after(value, _HEADER_NAME, _secret_header, _header_span)
    if "--" in value:
        value = _hide_after(value, _FLAG, _secret_name, _flag_span)
    if "," in value:
        value = _hide_after(value, _NAME_THEN_VALUE, _secret_name, _quoted_or_bare_span)
    if "set" in value:
        value = _hide_after(value, _SETENV, _secret_name, _quoted_or_bare_span)
    if "hf_" in value:
        value = _HUB_TOKEN.sub(HIDDEN, value)
    return _hide_after(value, _BEARER, lambda _: True, _regex_span(_BEARER_VALUE, 0))


# A secret's name as the quoted first argument of a call that reads or sets a variable, its
# value the next one: os.environ.get("HF_TOKEN", "V"), getenv, setdefault, pop, os.putenv
# (print("token", "saved") is no such call); and csh's and fish's own assignments: setenv NAME
# V, set -gx NAME V.
_NAME_THEN_VALUE = re.compile(
    r"(?<![A-Za-z0-9_])(?:get|getenv|setdefault|putenv|pop|setenv|__setitem__)\s*\(\s*"
    r"""(?P<quote>\\*["'])(?P<name>[A-Za-z_][A-Za-z0-9_.-]*)(?P=quote)\s*,\s*"""
    r"""(?=[rbfuRBFU]{0,2}\\*["'])"""
)
_SETENV = re.compile(
    r"(?<![A-Za-z0-9_-])(?:setenv|set(?:[ \t]+-[A-Za-z]+)+)"
    r"[ \t]+(?P<name>[A-Za-z_][A-Za-z0-9_]*)[ \t]+"
)


def _quoted_or_bare_span(text: str, found: re.Match[str]) -> tuple[int, int] | None:
    """A quoted value's inside (its quotes stay), else a bare one (`_BARE_VALUE`'s)."""
    quoted = _quoted_span(text, _past_string_prefix(text, found.end()))
    return quoted if quoted is not None else _regex_span(_BARE_VALUE, 2)(text, found)


_HUB_TOKEN = re.compile(
    r"(?:(?<![A-Za-z0-9_])|(?<=%[0-9A-Fa-f]{2})|(?<=\\x[0-9A-Fa-f]{2})|(?<=\\u[0-9A-Fa-f]{4}))"
    r"hf_[A-Za-z0-9]{30,}(?![A-Za-z0-9_])"
)
"""A Hugging Face token by its shape, whatever names it (``login("hf_…")``, ``echo hf_…``)."""


_BLOCK = re.compile(r"[|>][-+0-9]{0,3}[ \t]*(?=\r?\n)")
"""A YAML block scalar's indicator (``key: |``): the value is on the lines below."""

_LINE_END = re.compile(r"\r?\n")
"""Nothing after ``key:`` on its line: in YAML, the value is on the lines below, indented."""

_YAML_INDENT = re.compile(r"[ \t]*(?:-[ \t]+)*")
"""What may stand before a YAML key on its line (prose before ``token:`` is no YAML)."""


def _header_span(text: str, found: re.Match[str]) -> tuple[int, int] | None:
    """A header's credential (its scheme kept), or the lines of a YAML value below it."""
    start = found.end()
    line_start = text.rfind("\n", 0, found.start()) + 1
    below = _LINE_END.match(text, start) is not None and bool(  # a YAML key alone on its line
        _YAML_INDENT.fullmatch(text, line_start, found.start())
    )
    if _BLOCK.match(text, start) is None and not below:
        return _regex_span(_HEADER_VALUE, 2)(text, found)
    indent = len(text[line_start:]) - len(text[line_start:].lstrip(" \t"))
    end = text.index("\n", start)
    while end < len(text):  # the block: the lines after it indented deeper, and blank ones
        line_end = text.find("\n", end + 1)
        line = text[end + 1 : len(text) if line_end < 0 else line_end]
        if (line_end < 0 and not line) or (
            line.strip() and len(line) - len(line.lstrip(" \t")) <= indent
        ):
            break
        end = len(text) if line_end < 0 else line_end
    return start, end


# A long flag in free text (a command line logged as one string): --api-key=V or --api-key V.
_FLAG = re.compile(r"(?<![A-Za-z0-9_-])(--[A-Za-z][A-Za-z0-9_-]*)(?:=|[^\S\r\n]+)")


def _flag_span(text: str, found: re.Match[str]) -> tuple[int, int] | None:
    """The value after a secret flag: a quoted string's inside, else the word (not a next flag)."""
    start = _past_continuation(text, found.end())
    quote = text[start : start + 1]
    if quote in {"'", '"'}:
        return start + 1, _match_end(_QUOTED[quote], text, start + 1)
    if text.startswith("-", start):
        return None
    return start, _match_end(_ESCAPED_WORD, text, start)


_ESCAPED_WORD = re.compile(r"(?:\\[ \t]|[^\s'\"])+")
"""A word of a shell line, its escaped characters in it (``correct\\ horse``: printf %q's)."""


# ``user:password@`` inside a longer text (a message naming a URL, a path made of one): the part
# before the @ that holds a colon, up to white space, a quote or a slash; a scheme stays.
# The user part starts where a run of its characters does (the leftmost match starts there
# anyway): tried from every character of a long run, it took seconds (a 30 KB progress bar).
# A URL's user:password@ in free text: a user (these characters, after one that is not) and a
# colon, or a colon right after "//"; then a password (these) and the @. Right after "//", the
# user alone too (//TOKEN@host).
_USER_STOPS = frozenset(" \t\n\r\x0b\x0c/@'\"<>()[]")
_PASSWORD_STOPS = frozenset(" \t\n\r\x0b\x0c/@'\"<>")


def _userinfo_spans(text: str) -> Iterator[tuple[int, int]]:
    """Where each ``user:password@`` of ``text`` is, the ``@`` included: in linear time.

    Looked for back from each ``@``, never past the one before it: a regular
    expression that tried each colon as the user's end took quadratic time
    (a 100 KB argument of colons took 23 s).
    """
    floor = 0
    for at, char in enumerate(text):
        if char != "@":
            continue
        low = at
        while low > floor and text[low - 1] not in _PASSWORD_STOPS and not text[low - 1].isspace():
            low -= 1
        floor = at + 1
        start = _user_start(text, low, at)
        if start is not None:
            yield start, at + 1


def _user_start(text: str, low: int, at: int) -> int | None:
    """The first start in ``text[low:at]`` (password characters) of a user and its colon.

    Right after ``//`` the whole is hidden, colon or not: a URL's user alone
    may be its token (``https://TOKEN@github.com``, as git takes it).
    """
    if low < at and text[max(0, low - 2) : low] == "//":
        return low  # "//user@", "//:pw@", "//user:pw@"
    start = low
    while start < at:
        end = start
        while end < at and text[end] not in _USER_STOPS and not text[end].isspace():
            if text[end] == ":" and end > start:
                return start
            end += 1
        start = end + 1  # past the bracket or parenthesis that ended this run
    return None


def redact_message(text: str) -> str:
    """``text`` (a message, a log line) with the credentials it may quote hidden.

    What `redact_text` hides in a value: a secret key's, parameter's or
    header's value and a bearer token; and a URL's ``user:password@`` wherever
    it stands (``***@``), its scheme and host kept, and its user alone right
    after ``//`` (``https://TOKEN@github.com``). Unlike `redact_text`, the
    rest of the text stays (an ``@`` without a colon before it, as in
    ``org/repo@revision``, is no credential).
    """
    text = _redact_params(text)
    if "@" not in text:
        return text
    shown: list[str] = []
    position = 0
    for start, end in _userinfo_spans(text):
        shown += [text[position:start], _hide_userinfo(text[start:end])]
        position = end
    return "".join([*shown, text[position:]])


def _hide_userinfo(userinfo: str) -> str:
    scheme = _SCHEME_PREFIX.match(userinfo)
    return f"{scheme.group(0) if scheme else ''}***@"


_SCHEME_PREFIX = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*:/{1,2}|[A-Za-z]+:(?=[^:]*:)")


def redact_url(url: str) -> str:
    """``url`` with any ``user:password@`` part replaced by ``***@`` (see `redact_text`)."""
    return redact_text(url)


# pat: a personal access token (--github-pat)
_SECRET_WORDS = frozenset({"token", "key", "secret", "password", "passwd", "pass", "apikey",
                           "credential", "credentials", "auth", "passphrase", "pat", "pwd", "jwt",
                           "cookie", "sessionid", "bearer", "signature"})  # fmt: skip
_SECRET_ENDINGS = ("password", "passwd", "apikey", "passphrase")
# "tokens" is mostly a count (--max-tokens, num_tokens): a secret only after one of these.
_TOKEN_OWNERS = frozenset({"api", "auth", "access", "refresh", "bearer", "hub", "hf", "session"})
_OWNER_TOKENS = frozenset(f"{owner}token" for owner in _TOKEN_OWNERS)  # one word: HFTOKEN


def _ends_secret(words: Sequence[str]) -> bool:
    """Whether a name's last word (of ``words``) names a secret: token, key, secret, ….

    Plurals too (``api_keys``, ``auth_tokens``; ``max_tokens`` is a count), and
    ``access_key_id``, the half of an S3/AWS key pair that is sent with each request.
    """
    words = [word.rstrip("0123456789") for word in words]  # api_key_2, token2: numbered
    while words and not words[-1]:
        words.pop()
    if not words:
        return False
    last, before = words[-1], words[-2] if len(words) > 1 else ""
    if last == "token" and before in _TOKEN_KINDS:
        return False  # a tokenizer's special token (eos_token: "</s>"), not a credential
    if (
        last in _SECRET_WORDS
        or any(tuple(words[-len(t) :]) == t for t in _SECRET_TAILS)
        # one word: PGPASSWORD, MYSQLPASSWD, OPENAIAPIKEY, HFTOKEN, APITOKEN
        or last.endswith(_SECRET_ENDINGS)
        or last in _OWNER_TOKENS
    ):
        return True
    if last == "tokens":
        return before in _TOKEN_OWNERS
    if last == "keys" and before in _COUNTS:
        return False  # num_keys: a count
    return last.endswith("s") and last[:-1] in _SECRET_WORDS


# access_key_id: half of an S3 key pair; session_id: as the sessionid parameter.
_SECRET_TAILS = (("access", "key", "id"), ("session", "id"))
_TOKEN_KINDS = frozenset({"eos", "bos", "pad", "unk", "sep", "cls", "mask", "start", "end",
                          "special", "image", "video", "audio", "eot", "eom", "think"})  # fmt: skip
_COUNTS = frozenset({"num", "max", "min", "n", "total", "count"})
# Names a query parameter's secret words share with a structured value's keys ("code" and
# "session" are too often plain data in JSON to hide there).
_KEY_WORDS = frozenset({"sig", "signature", "pwd", "pass", "passphrase", "jwt", "cookie"})


def _secret_key(name: str) -> bool:
    """Whether a key of a structured value (JSON, a mapping, NAME=VALUE) holds a secret."""
    return _secret_header(name) or any(word in _KEY_WORDS for word in _words(name))


# A name's words: split on anything not a letter or digit, and where camelCase starts one
# (secretAccessKey, HFToken); "keyboard", "monkey", "tokenizer" stay one word each.
_WORD = re.compile(r"[A-Z]+(?![a-z])|[A-Z]?[a-z0-9]+")


def _words(name: str) -> list[str]:
    return [word.lower() for word in _WORD.findall(name)]


_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\+?")  # NAME=V, or bash's NAME+=V


# Flags that hold a secret, dashes for underscores: a flag written as a prefix of one of these
# (argparse takes an unambiguous abbreviation: ``--api-k V`` is ``--api-key V``) holds it too.
_SECRET_FLAGS = ("--api-key", "--api-token", "--hub-token", "--hf-token", "--token", "--secret",
                 "--auth-token", "--access-token", "--password", "--passwd", "--pwd", "--jwt",
                 "--cookie", "--sessionid", "--session-id", "--bearer",
                 "--signature")  # fmt: skip
_MIN_ABBREVIATION = 4  # "--ap": shorter ("--a", "--") abbreviates too many flags to mean one


def _secret_name(name: str) -> bool:
    """Whether a flag or variable name holds a secret.

    Its last word is token, key, secret, password, … or their plural
    (``--api-key``, ``--api-keys``, ``--hf-token``, ``--hub_token``,
    ``HF_TOKEN``, ``WANDB_API_KEY``, ``secretAccessKey``, ``--password``;
    ``--max-tokens`` is a count: see `_ends_secret`), or it is a ``--`` flag
    of at least 4 characters (dashes included) that, *as written*, is a
    prefix of a secret flag in ``_SECRET_FLAGS`` (``_`` read as ``-``, any
    case), as argparse takes an unambiguous abbreviation: ``--ap``,
    ``--api-k``, ``--hub-t``, ``--pass``, ``--acc``, ``--sec``. The flag must
    be the shorter one: ``--tokenizer`` is not a prefix of ``--token`` and is
    not secret, nor are ``--top-k``,
    ``--max-tokens``, ``--port``, ``--seed``. ``--tok``/``--toke`` (a prefix of
    both ``--token`` and ``--tokenizer``, which argparse calls ambiguous where
    a parser has both) *are* hidden, like every short abbreviation of a secret
    flag (``--to``, ``--pa``, ``--se``): over-redaction (``--pad-token``, an
    abbreviation meant for another flag) is accepted, a leak is not.
    """
    lowered = name.lower()
    if _ends_secret(_words(name)):
        return True
    if not lowered.startswith("--") or len(lowered) < _MIN_ABBREVIATION:
        return False
    flag = lowered.replace("_", "-")
    return any(secret.startswith(flag) for secret in _SECRET_FLAGS)


_QUOTES = "'\"`"
_MAX_SHELL_LINE = 1 << 16
"""Longer words are split on white space, not as a shell line, for the time shlex would take."""


def _redact_split_line(arg: str, secrets: Sequence[str]) -> str:
    """A line whose quotes do not balance, redacted word by word on white space.

    A word is judged without the quotes around it (``"--api-key`` is the flag,
    ``'HF_TOKEN=V`` the assignment) and shown as written unless it is hidden.
    """
    arg = _redact_params(arg)  # a header or a query split over words (-H "Authorization: Bearer V)
    words = arg.split()
    bare = [word.strip(_QUOTES) or word for word in words]
    redacted = _redact_words(bare, secrets, shell=False)  # no word of it is split again
    shown = [  # a hidden word loses its quotes: a stray one would open a quote to the end
        word if new == old != HIDDEN else new
        for word, old, new in zip(words, bare, redacted, strict=True)
    ]
    return arg if shown == words else _redact_params(" ".join(shown))


def _redact_shell_line(arg: str, secrets: Sequence[str]) -> str:
    """A word, whole (a header, a JSON object), then as a shell line (``sh -c '...'``) its words.

    Judged whole first: split, ``"api_key": "V"`` or ``Authorization: Bearer
    V`` would part the name from its value, and JSON without spaces would lose
    its quotes. A line is shown as given unless one of its words is hidden; one
    shlex cannot split (an unbalanced quote: ``# don't``) is split on white
    space instead: it is never returned unredacted.
    """
    text = _redact_params(arg)
    if not any(char.isspace() or char in _QUOTES or char == "\\" for char in text):
        return text  # a plain word: nothing to split or unquote
    if len(text) > _MAX_SHELL_LINE:  # shlex takes quadratic time on one long token
        return _redact_split_line(text, secrets)
    try:
        words = shlex.split(text)
    except ValueError:
        shown = _redact_split_line(arg, secrets)
    else:
        if words == [text]:  # one word, nothing to unquote: nothing more to split
            return text
        redacted = _redact_words(words, secrets)
        shown = text if redacted == words else shlex.join(redacted)
    return _split_first_if_shown(arg, shown, secrets)


def _split_first_if_shown(arg: str, shown: str, secrets: Sequence[str]) -> str:
    r"""``shown``, unless ``arg``'s own words, judged each, hide what ``shown`` still shows.

    The whole pass runs on the quoted line, where a quoting wrapper's escapes
    (``shlex.join``'s ``'"'"'``, ``printf %q``'s ``\"``) can make it hide the
    wrong span; the line then splits into words that no longer look like a
    secret's (round 50). Then the words of ``arg`` itself are redacted and
    joined (a JSON value's quotes may go: showing less beats a leak).
    """
    shell = len(arg) <= _MAX_SHELL_LINE  # shlex takes quadratic time on one long token
    words: list[str] = []
    if shell:
        try:
            words = shlex.split(arg)
        except ValueError:
            shell = False
    if not shell:  # on white space, each word judged as it is, never split again
        words = arg.split()
    if words == [arg]:
        return shown  # one word: judged whole already
    redacted = _redact_words(words, secrets, shell=shell)
    for word, hidden in zip(words, redacted, strict=True):
        if word != hidden and _still_shown(word, hidden, shown):
            return _redact_params(shlex.join(redacted))
    return shown


def _common_start(one: str, other: str) -> int:
    """How many characters ``one`` and ``other`` share at their start."""
    for at, (a, b) in enumerate(zip(one, other, strict=False)):
        if a != b:
            return at
    return min(len(one), len(other))


def taken_out(word: str, hidden: str) -> str:
    """What redacting ``word`` into ``hidden`` took out: the part between what both share.

    With several parts taken, everything from the first to the last (more
    than the secrets: for hiding, not for showing).
    """
    head = _common_start(word, hidden)
    tail = _common_start(word[head:][::-1], hidden[head:][::-1])
    return word[head : len(word) - tail]


def _still_shown(word: str, hidden: str, shown: str) -> bool:
    """Whether what redacting ``word`` into ``hidden`` took out is still in ``shown``.

    Whole or in a quoted form; not in pieces: a word's redaction may take more
    than the secret (``{key:V,region:us}`` split loses its quotes), and what
    the whole pass rightly shows of the rest would count.
    """
    taken = taken_out(word, hidden)
    if not taken:
        return False
    return any(form in shown for form in (taken, taken.replace("'", "'\"'\"'"), *_forms(taken)))


class _Tool(NamedTuple):
    """Another program's secrets that no name tells: its flags' values, or its words.

    ``flags``: flag → how its value is hidden (`_hide_tool_value`); ``after``:
    the word (a subcommand) from which they count, ``""`` from the program on;
    ``joined``: the short flags that hold a value only joined to it (``mysql
    -pV``: a lone ``-p`` asks for the password, and the next word is the
    database); ``words``: every word not a flag after ``after`` is secret
    (``wandb login KEY``); ``clusters``: its short flags may be written
    together (``curl -sSu user:pw``).
    """

    flags: Mapping[str, str]
    after: str = ""
    joined: frozenset[str] = frozenset()
    words: bool = False
    clusters: bool = False


_WHOLE, _AFTER_COLON, _AFTER_PASS = "whole", "after ':'", "after 'pass:'"
_LOGIN = _Tool({"-p": _WHOLE}, after="login")  # docker login -p V: -p is a port elsewhere
_MYSQL = _Tool({"-p": _WHOLE}, joined=frozenset({"-p"}))
_TOOLS: Mapping[str, _Tool] = {
    "curl": _Tool({"-u": _AFTER_COLON, "--user": _AFTER_COLON, "-U": _AFTER_COLON,
                   "--proxy-user": _AFTER_COLON}, clusters=True),
    "sshpass": _Tool({"-p": _WHOLE}),
    "redis-cli": _Tool({"-a": _WHOLE}),
    "openssl": _Tool({"-passin": _AFTER_PASS, "-passout": _AFTER_PASS, "-pass": _AFTER_PASS}),
    "skopeo": _Tool({"--creds": _AFTER_COLON, "--src-creds": _AFTER_COLON,
                     "--dest-creds": _AFTER_COLON, "-p": _WHOLE}),
    "wandb": _Tool({}, after="login", words=True),
    **dict.fromkeys(("docker", "podman", "nerdctl", "buildah", "helm", "oras"), _LOGIN),
    **dict.fromkeys(("mysql", "mariadb", "mysqldump", "mysqladmin"), _MYSQL),
}  # fmt: skip
_COMMAND_ENDS = frozenset({"&&", "||", ";", "|", "&"})


def _hide_tool_value(value: str, how: str) -> str:
    """``value`` of a tool's secret flag, hidden as ``how`` says (a user name or a kind kept)."""
    if how == _AFTER_COLON:  # curl -u user:password (no colon: curl asks for it)
        user, colon, _ = value.partition(":")
        return f"{user}:{HIDDEN}" if colon else value
    if how == _AFTER_PASS:  # openssl -passin pass:V; env:NAME and file:PATH name no secret
        return f"pass:{HIDDEN}" if value.startswith("pass:") else value
    return HIDDEN


class _ToolWords:
    """Follows the words of a command line: which tool runs, and which of its words are secret."""

    def __init__(self) -> None:
        self.tool: _Tool | None = None
        self.counting = False  # past the tool's ``after`` word
        self.next_how: str | None = None  # the next word is a secret flag's value

    def shown(self, arg: str) -> str | None:
        """``arg`` as shown if it is a tool's secret (or its flag), else None; then follows it.

        A tool's words end at a word that is a shell operator alone (``&&``,
        ``;``, ``|``); not at one that ends in ``)`` or ``;``: a quoted value
        may (``curl -d '{"a":1}' -u user:pw``), and then a secret would show.
        """
        if self.next_how is not None:
            how, self.next_how = self.next_how, None
            return _hide_tool_value(arg, how)
        tool = self.tool
        if arg in _COMMAND_ENDS:
            self.tool = None
        elif tool is not None and self.counting:
            return self._in_tool(tool, arg)
        elif tool is not None and arg == tool.after:
            self.counting = True
        elif not arg.startswith("-"):
            # its program: after "$(", "(", "`", "x=" (a subshell, a substitution), out of a path
            found = _TOOLS.get(_COMMAND_STARTS.split(arg)[-1].rpartition("/")[2])
            if found is not None:
                self.tool, self.counting = found, not found.after
        return None

    def _in_tool(self, tool: _Tool, arg: str) -> str | None:
        if tool.words and not arg.startswith("-"):
            return HIDDEN
        for flag, how in tool.flags.items():
            if arg == flag and flag not in tool.joined:
                self.next_how = how
                return arg
            if flag.startswith("--") and arg.startswith(f"{flag}="):
                return f"{flag}={_hide_tool_value(arg[len(flag) + 1 :], how)}"
            if not flag.startswith("--") and arg.startswith(flag) and len(arg) > len(flag):
                return flag + _hide_tool_value(arg[len(flag) :], how)
        return self._in_cluster(tool, arg) if tool.clusters else None

    def _in_cluster(self, tool: _Tool, arg: str) -> str | None:
        """``curl -sSu user:pw``: a secret's short flag last of several, its value after it."""
        cluster = _CLUSTER.fullmatch(arg)
        if cluster is None:
            return None
        letters = cluster["letters"]
        for flag, how in tool.flags.items():
            if not _SHORT_FLAG.fullmatch(flag) or flag[1] not in letters:
                continue
            at = letters.index(flag[1]) + 1
            value = letters[at:] + cluster["rest"]
            if not value:
                self.next_how = how
                return arg
            return f"-{letters[:at]}{_hide_tool_value(value, how)}"
        return None


_COMMAND_STARTS = re.compile(r"[$(`{=!;|&]")
_CLUSTER = re.compile(r"-(?P<letters>[A-Za-z]+)(?P<rest>.*)", re.DOTALL)
_SHORT_FLAG = re.compile(r"-[A-Za-z]")
"""Short flags together (``-sSu``), what follows the last letter of them the value's start."""


def _redact_words(argv: Sequence[str], secrets: Sequence[str], *, shell: bool = True) -> list[str]:
    shown: list[str] = []
    hiding = False
    after_flag = False  # the word right after a secret flag is its value, whatever it looks like
    tools = _ToolWords()
    for arg in argv:
        tool_shown = tools.shown(arg)
        if tool_shown is not None:
            shown.append(tool_shown)
            continue
        if hiding and (after_flag or not arg.startswith("-")):
            shown.append(HIDDEN)
            after_flag = False
            continue
        hiding = False
        name, equals, _ = arg.partition("=")
        flag = arg.startswith("-") and not any(char.isspace() for char in name)  # not a line
        if flag and _secret_name(name):
            # --api-key=V hides V; --api-key V hides the next word and each one after it up to
            # the next flag (vLLM's --api-key takes several keys: nargs="+")
            shown.append(f"{name}={HIDDEN}" if equals else arg)
            hiding = after_flag = not equals
            continue
        if equals and _ASSIGNMENT.fullmatch(name) and _secret_name(name.rstrip("+")):
            shown.append(f"{name}={HIDDEN}")  # HF_TOKEN=V, as `env` and a shell take it
            continue
        text = _redact_shell_line(arg, secrets) if shell else _redact_params(arg)
        # A line's words were judged each as a value already: as a whole, only a URL's
        # user:password@ (what comes before its last @ is no value: "--model org/repo@main").
        line = any(char in " \t\r\n" for char in text)  # where shlex splits, not \xa0
        shown.append(redact_message(text) if line else redact_text(text))
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
    return [scrub_all(arg, known, HIDDEN) for arg in shown]


def shown_line(argv: Iterable[str], *, secrets: Iterable[str | None] = ()) -> str:
    """`redact_argv` joined as a shell line; bytes that are not UTF-8 shown as `printable` does."""
    return printable(shlex.join(redact_argv(argv, secrets=secrets)))


def secrets_in_environ(environ: Mapping[str, str]) -> list[str]:
    """The values of ``environ``'s variables named like secrets (``HF_TOKEN``, ``*_API_KEY``, …).

    A command line that expanded ``$HF_TOKEN`` carries it with no flag name to
    tell: `redact_argv` scrubs these wherever they appear. A value with white
    space around it or a line break in it (a Kubernetes secret, an ``echo`` into
    a file) also counts as huggingface_hub sends it (`cleaned_token`): an
    unquoted ``$HF_TOKEN`` or a URL made of it carries that form.
    """
    found: list[str] = []
    for name, value in environ.items():
        password = _url_password(value)  # as written, and decoded (%40 is @)
        forms: list[str | None] = [] if password is None else [password, unquote(password)]
        if (
            (_secret_name(name) or _secret_then_qualifier(name))
            and name != "PWD"  # the shell's working directory, not a password
            and value.strip().lower() not in _NOT_SECRETS
        ):
            forms += [value, cleaned_token(value)]
        for form in forms:
            if form is not None and len(form) >= _MIN_ENVIRON_SECRET and form not in found:
                found.append(form)
    return found


def _secret_then_qualifier(name: str) -> bool:
    """A secret's name and one word more that tells which (``HF_TOKEN_BACKUP``, ``API_KEY_OPENAI``).

    Not a word that tells what the value is instead (`_DESCRIBES`:
    ``HF_TOKEN_PATH``, ``SORT_KEY_ORDER``, ``AUTH_METHOD``, ``KEY_STORE``):
    such a value, scrubbed wherever it appears, would hide a user's paths and
    words. Any other word counts: a leak is worse than a word hidden.
    """
    words = _words(name)
    return len(words) > 1 and words[-1] not in _DESCRIBES and _ends_secret(words[:-1])


_DESCRIBES = frozenset({"path", "file", "files", "dir", "directory", "folder", "url", "uri",
                        "endpoint", "host", "port", "name", "type", "kind", "id", "length", "len",
                        "size", "count", "header", "location", "source", "env", "var",
                        "variable", "mode", "format", "prefix", "suffix", "timeout", "ttl",
                        "expiry", "expires", "expiration", "scope", "scopes", "audience",
                        "issuer", "version", "enabled", "disabled", "required", "provider",
                        "user", "username", "sock", "socket", "helper", "command", "cmd", "info",
                        "limit", "level", "order", "method", "methods", "backend", "store",
                        "mount", "field", "algorithm", "algo", "policy", "rotation", "style",
                        "strategy", "manager", "service", "server", "client", "flag", "option",
                        "options", "config", "setting", "settings", "support",
                        "check"})  # fmt: skip


def _url_password(value: str) -> str | None:
    """The password of a URL that is the value (``DATABASE_URL=postgres://u:PASSWORD@h/db``).

    The authority runs to the first ``/`` after ``//``; the user information
    to its last ``@`` (a password may hold a raw ``@``: ``redis://:p@ss@h``).
    """
    scheme = _SCHEME.match(value.strip())
    if scheme is None:
        return None
    authority = re.split(r"[/?#]", value.strip()[scheme.end() :], maxsplit=1)[0]
    userinfo, at, _ = authority.rpartition("@")
    _, colon, password = userinfo.partition(":")
    return (
        password if at and colon and password and not any(c.isspace() for c in password) else None
    )


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
    if isinstance(value, Sequence) and not isinstance(value, bytes):
        # Any sequence (a UserList too), and words that are not text (a Path, bytes, a number)
        # redacted as the text they stand for: an --api-key's value after one is still hidden.
        items = list(value)
        words = [item if isinstance(item, str) else _word_text(item) for item in items]
        shown = [
            item if not isinstance(item, str) and word == words[index] else word
            for index, (item, word) in enumerate(zip(items, redact_argv(words), strict=True))
        ]
        return tuple(shown) if isinstance(value, tuple) else shown
    return value


def _word_text(item: object) -> str:
    """A command word that is not text, as text: a path-like's path, bytes decoded, else ``str``."""
    if isinstance(item, os.PathLike):
        item = os.fspath(item)
    if isinstance(item, bytes):
        return os.fsdecode(item)
    return str(item)

"""The Hub token huggingface_hub would send, found as it finds it, checked, and never shown.

Every source huggingface_hub honours (``token=``, ``HF_TOKEN``, ``HF_TOKEN_PATH``,
the saved login) is looked at the same way, within a deadline (an OIDC
exchange or an OAuth refresh has none of its own); a token with whitespace or
control characters is a `ConfigError` naming where it came from, never the
token, since the HTTP client would fail deep inside with an error quoting it.
"""

from __future__ import annotations

import concurrent.futures
import locale
import os
import stat
from collections.abc import Mapping

from verirl._fs import printable
from verirl._hidden import HIDDEN
from verirl._hidden import MIN_SCRUBBED as _MIN_SCRUBBED
from verirl._phases import DaemonExecutor
from verirl.errors import ConfigError

__all__ = [
    "TOKEN_SOURCES",
    "check_token",
    "cleaned_token",
    "hub_offline",
    "hub_token_in_use",
    "hub_token_within",
    "implicit_hub_token",
    "implicit_token_disabled",
    "refuse_unreadable_token_file",
    "token_variable",
    "tokens_to_hide",
]


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
                f"contains {what} at position {index} (of {len(value)}); {_PRINTABLE_RULE}"
                f"{_NEWLINE_HINT}",
            )
    return value


_PRINTABLE_RULE = "a token is printable ASCII without spaces"


_NEWLINE_HINT = " (one read from a file keeps its newline: strip it)"


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
        return _known_hub_token()
    except Exception:  # noqa: BLE001 - no token to scrub is better than a new error
        return None


def _known_hub_token() -> str | None:
    """``get_token``'s answer without its network calls, for scrubbing; never blocks.

    huggingface_hub's ``get_token`` may exchange an OIDC token or refresh an
    OAuth one, with no deadline: here, the OIDC token it got (its cache),
    else the variable's, else the token file's (a refresh is written there).
    """
    if os.environ.get("HF_OIDC_RESOURCE"):
        from huggingface_hub.utils import _auth  # noqa: PLC0415 - keep import verirl light

        cache = getattr(_auth, "_OIDC_TOKEN_CACHE", None)
        token = cache.get("token") if isinstance(cache, dict) else None
        return token if isinstance(token, str) and token else None
    found = token_variable(os.environ)
    if found is not None:
        return found[1]
    from huggingface_hub import constants  # noqa: PLC0415 - keep import verirl light

    return cleaned_token(_read_token_file(constants.HF_TOKEN_PATH))


def hub_token_within(timeout: float) -> str | None:
    """huggingface_hub's own ``get_token()``, given at most ``timeout`` seconds.

    It may call the network with no deadline of its own (an OIDC exchange
    with ``HF_OIDC_RESOURCE``, an OAuth token's refresh): run in a daemon
    thread, it raises `TimeoutError` when it has not answered in time, and
    whatever ``get_token`` raised. ``None``: no token.
    """
    future = DaemonExecutor().submit(_get_token)
    try:
        return future.result(timeout) or None
    except concurrent.futures.TimeoutError:
        source = (
            " (an OIDC exchange: HF_OIDC_RESOURCE)" if os.environ.get("HF_OIDC_RESOURCE") else ""
        )
        msg = f"huggingface_hub did not find the Hub token{source} within {timeout:g}s"
        raise TimeoutError(msg) from None


def _get_token() -> str | None:
    from huggingface_hub import get_token  # noqa: PLC0415 - the light path loads no Hub client

    return get_token()


def implicit_token_disabled(environ: Mapping[str, str] | None = None) -> bool:
    """Whether huggingface_hub sends no token it finds itself (``HF_HUB_DISABLE_IMPLICIT_TOKEN``).

    For this process, as huggingface_hub read it at import; for ``environ``
    (a child's), as a huggingface_hub started with it will read it.
    """
    if environ is not None:
        return (environ.get("HF_HUB_DISABLE_IMPLICIT_TOKEN") or "").upper() in _TRUE_VALUES
    from huggingface_hub import constants  # noqa: PLC0415 - keep import verirl light

    return bool(constants.HF_HUB_DISABLE_IMPLICIT_TOKEN)


_TOKEN_FILE_VARIABLES = ("HF_TOKEN_PATH", "HF_HOME", "XDG_CACHE_HOME")
"""The variables that put huggingface_hub's token file where it is, the nearest first."""


_SAVED_LOGIN = "the saved login (hf auth login)"
"""The token file's name in an error when none of `_TOKEN_FILE_VARIABLES` is set."""


TOKEN_SOURCES = frozenset({"HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", *_TOKEN_FILE_VARIABLES,
                           _SAVED_LOGIN})  # fmt: skip
"""The fields of a Hub token's errors (`implicit_hub_token`, `refuse_unreadable_token_file`)."""


def implicit_hub_token() -> str | None:
    """The token huggingface_hub sends when given none, checked by `check_token`; or ``None``.

    Found as huggingface_hub's ``get_token`` finds it: ``HF_TOKEN``, else
    ``HUGGING_FACE_HUB_TOKEN`` (the first one set, newlines and surrounding
    white space dropped), else the file at ``constants.HF_TOKEN_PATH``
    (``HF_TOKEN_PATH``, else ``$HF_HOME/token`` as ``hf auth login`` saves it),
    read as huggingface_hub reads it (the locale's encoding) but without
    blocking. A `ConfigError` names where the token is (the variable, or the
    file and the variable that points there) and never shows any of it: a
    token with a space, a control or a non-ASCII character (huggingface_hub
    would fail to encode its header, or the Hub answer 401), a token file that
    is not text, or one huggingface_hub would block on
    (`refuse_unreadable_token_file`). ``None`` when no token is found, when
    none is sent (offline mode, `hub_offline`; ``HF_HUB_DISABLE_IMPLICIT_TOKEN``),
    and for an OIDC exchange (``HF_OIDC_RESOURCE``: the Hub's own token, got
    when a request needs it). A file that cannot be read otherwise is left to
    the request, which reports it as before.
    """
    if hub_offline():
        return None
    refuse_unreadable_token_file()
    from huggingface_hub import constants  # noqa: PLC0415 - keep import verirl light

    if constants.HF_HUB_DISABLE_IMPLICIT_TOKEN or os.environ.get("HF_OIDC_RESOURCE"):
        return None
    found = token_variable(os.environ)
    if found is not None and found[1] is not None:
        return _checked(found[1], found[0], HIDDEN, "", "")
    path = constants.HF_TOKEN_PATH
    variable = _token_file_variable(os.environ)
    try:
        text = _read_token_file(path)
    except UnicodeDecodeError:
        encoding = locale.getpreferredencoding(False)  # noqa: FBT003 - what open() uses
        why = (
            f"the Hub token file there is not text in {encoding} (huggingface_hub reads it "
            "so, when no HF_TOKEN is set): write the token there again (hf auth login), "
            "remove the file, or set HF_TOKEN"
        )
        raise ConfigError.invalid(variable, printable(path), why) from None
    token = cleaned_token(text)
    if token is None:
        return None
    fix = ": fix the file, log in again (hf auth login), or set HF_TOKEN"
    return _checked(token, variable, printable(path), "the Hub token in that file ", fix)


_OFFLINE_ENV_VARS = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")


_TRUE_VALUES = frozenset({"1", "ON", "YES", "TRUE"})


def hub_offline() -> bool:
    """Whether HF offline mode is on, as huggingface_hub saw it at import or the env says now.

    As huggingface_hub reads them: ``HF_HUB_OFFLINE`` when it is set and not
    empty (``0`` turns it off whatever ``TRANSFORMERS_OFFLINE`` says), else
    ``TRANSFORMERS_OFFLINE``.
    """
    first, second = (os.environ.get(name) for name in _OFFLINE_ENV_VARS)
    if (first or second or "").upper() in _TRUE_VALUES:
        return True
    from huggingface_hub import constants  # noqa: PLC0415 - keep import verirl light

    return bool(constants.is_offline_mode())


def token_variable(environ: Mapping[str, str]) -> tuple[str, str | None] | None:
    """The token variable huggingface_hub takes, and its token cleaned (``None``: blank).

    ``HF_TOKEN`` when it is set and not empty, else ``HUGGING_FACE_HUB_TOKEN``
    when that is; ``None`` when neither is. A blank one that wins (``HF_TOKEN="
    "``) gives no token: huggingface_hub then reads the token file.
    """
    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
        raw = environ.get(name)
        if raw:
            return name, cleaned_token(raw)
    return None


def tokens_to_hide(environ: object, *given: object) -> list[str]:
    """Every Hub token an error may quote, longest first (a prefix leaves no tail).

    Those ``given``, ``HF_TOKEN`` in ``environ`` (when it is a mapping), and
    the one huggingface_hub finds itself.
    """
    from_env = environ.get("HF_TOKEN") if isinstance(environ, Mapping) else None
    found = (*given, from_env, hub_token_in_use(None))
    tokens = {cleaned_token(token) or "" for token in found if isinstance(token, str)} - {""}
    return sorted(tokens, key=len, reverse=True)


def cleaned_token(raw: str | None) -> str | None:
    """``raw`` as huggingface_hub cleans a token: no CR or LF anywhere, stripped; ``None``: none."""
    if raw is None:
        return None
    return raw.replace("\r", "").replace("\n", "").strip() or None


def _checked(token: str, variable: str, shown: str, where: str, fix: str) -> str:
    """``token`` if `check_token` takes it; else its `ConfigError` naming ``variable``.

    huggingface_hub drops a newline itself: `check_token`'s hint about one goes.
    """
    try:
        return check_token(token) or token
    except ConfigError as exc:
        why = (exc.reason or _PRINTABLE_RULE).replace(_NEWLINE_HINT, "")
        raise ConfigError.invalid(variable, shown, f"{where}{why}{fix}") from None


def _read_token_file(path: str) -> str | None:
    """The token file's text; ``None``: no file, or none to read here (left to the request).

    Opened without blocking: a FIFO or a device there is no token file (and
    `refuse_unreadable_token_file` refuses it where huggingface_hub would read it).
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except (OSError, ValueError):
        return None
    with os.fdopen(fd, "rb") as file:
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return None
            data = file.read(_MAX_TOKEN_FILE + 1)
        except OSError:
            return None
    if len(data) > _MAX_TOKEN_FILE:
        return None  # no token: huggingface_hub's own read decides what it is
    return data.decode(locale.getpreferredencoding(False))  # noqa: FBT003 - what open() uses


_MAX_TOKEN_FILE = 1 << 20


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


def _token_file_variable(environ: Mapping[str, str]) -> str:
    """The variable that puts the token file where it is, as an error names it.

    ``HF_TOKEN_PATH``, else ``HF_HOME`` (the file is its ``token``), else
    ``XDG_CACHE_HOME`` (``huggingface/token`` below it); with none set, the
    saved login in the home folder.
    """
    for name in _TOKEN_FILE_VARIABLES:
        if name in environ:
            return name
    return _SAVED_LOGIN


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
    found = token_variable(env)
    if found is not None and found[1] is not None:
        return  # huggingface_hub takes the variable and never opens the file
    if env.get("HF_OIDC_RESOURCE") or implicit_token_disabled(environ):
        return  # an OIDC exchange instead, or no token it finds sent: the file is not read
    token = _token_path(env)
    # the token file, and the stored_tokens file beside it (read once a token is found there)
    for path in (token, os.path.join(os.path.dirname(token), "stored_tokens")):  # noqa: PTH118, PTH120
        try:
            mode = os.stat(path or os.curdir).st_mode  # noqa: PTH116 - "": Path("") is "."
        except FileNotFoundError:
            continue  # no file: nothing read there
        except (OSError, ValueError) as exc:
            if path != token:
                continue
            # huggingface_hub's read fails alike (only a missing file is "no token")
            why = (
                f"the Hub token file there cannot be read ({printable(_os_reason(exc))}): "
                "huggingface_hub would fail reading it; point HF_TOKEN_PATH at the token file, "
                "or set HF_TOKEN"
            )
            raise ConfigError.invalid(_token_file_variable(env), printable(path), why) from None
        for test, kind, effect in _FILE_KINDS:
            if test(mode):
                variable = _token_file_variable(env)
                why = (
                    f"the Hub token file there is {kind}, not a file: huggingface_hub would "
                    f"{effect} reading it; point HF_TOKEN_PATH at the token file, remove it, "
                    "or set HF_TOKEN"
                )
                raise ConfigError.invalid(variable, printable(path), why)


def _os_reason(exc: BaseException) -> str:
    """An OS error's reason, without the path it quotes."""
    return (exc.strerror if isinstance(exc, OSError) else None) or type(exc).__name__


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

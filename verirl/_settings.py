"""`Settings`: every ``VERIRL_*`` variable (and ``HF_TOKEN``), read and checked in one place.

Each field names its variable in its metadata, and `Settings.from_environ` is
the one reader: a blank variable counts as unset, and a bad value is a
`ConfigError` naming the variable and showing its value (a token never), so a
user knows which one to fix. ``from_settings``, the CLI and ``doctor`` all go
through it; the README's settings table is checked against these fields.
`Read` picks a ``from_settings`` argument over its variable, so that an error
names whichever of the two the value came from.
"""

from __future__ import annotations

import contextlib
import os
import shlex
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any

import attrs

from verirl import _defaults as defaults
from verirl._fs import quoted
from verirl._hidden import HIDDEN
from verirl._hub_token import cleaned_token, hub_token_in_use, tokens_to_hide
from verirl._plan_inputs import check_mode
from verirl._secrets import redact_url, scrub, scrub_config_error, scrub_exception, shown_command
from verirl._validate import (
    MAX_GPUS,
    MAX_LENGTH,
    MAX_PORT,
    check_environ,
    check_int,
    has_control_chars,
    parse_int,
    parse_seconds,
)
from verirl.checkpoints import RESUME_ENV_VAR
from verirl.errors import ConfigError

__all__ = ["Read", "Settings", "command_problem", "split_args", "split_command"]

_Parse = Callable[[str, str], object]


def split_command(field: str, command: str) -> list[str]:
    """``shlex.split(command)``; an unbalanced quote is a `ConfigError` naming ``field``."""
    try:
        argv = shlex.split(command)
    except ValueError as exc:
        shown = shown_command(command)
        raise ConfigError.invalid(field, shown, f"cannot be split like a shell: {exc}") from None
    if any("\x00" in arg for arg in argv):
        raise ConfigError.invalid(field, shown_command(command), "must not contain a null byte")
    return argv


def split_args(field: str, args: str) -> list[str]:
    """`split_command` for server flags, whose errors never show them (an ``--api-key``)."""
    try:
        return split_command(field, args)
    except ConfigError as exc:
        raise ConfigError.invalid(field, HIDDEN, exc.reason or "cannot be split") from None


def _text(name: str, raw: str) -> str:
    text = raw.strip()
    if has_control_chars(text):
        raise ConfigError.invalid(name, redact_url(text), "must not contain control characters")
    return text


def _secret(name: str, raw: str) -> str:
    # As huggingface_hub reads HF_TOKEN: every CR and LF dropped (a token wrapped over lines)
    text = raw.replace("\r", "").replace("\n", "").strip()
    if has_control_chars(text):
        raise ConfigError.invalid(name, HIDDEN, "must not contain control characters")
    return text


def _mode(name: str, raw: str) -> str:
    return check_mode(name, _text(name, raw))


def _integer(minimum: int, maximum: int) -> _Parse:
    return lambda name, raw: parse_int(name, raw, minimum, maximum)


def command_problem(argv: Sequence[str]) -> str | None:
    """Why ``argv`` cannot be run as a command (none of it may be empty or hold a NUL), or None.

    Nothing else is refused: a word may hold any other character, a line break
    too (a ``python -c`` program of several lines), as exec takes it.
    """
    if not argv:
        return "must not be empty"
    if any(arg == "" for arg in argv):
        return "must not hold an empty argument ('')"
    if any("\x00" in arg for arg in argv):
        return "must not contain a null byte"
    return None


def _argv(name: str, raw: str) -> tuple[str, ...]:
    # A shell line: split first (a newline is white space to it), then each word checked.
    argv = tuple(split_command(name, raw.strip()))
    problem = command_problem(argv)
    if problem is not None:  # the words, where an empty one shows as ''
        raise ConfigError.invalid(name, shown_command(list(argv) if argv else raw), problem)
    return argv


def _positive_seconds(name: str, raw: str) -> float:
    return parse_seconds(name, raw, positive=True)


def _flags(name: str, raw: str) -> tuple[str, ...]:
    return tuple(split_args(name, raw))


def _shown_url(value: str | None) -> str:
    """A URL setting in the repr: its password and secret parameters hidden."""
    return quoted(value if value is None else _url_in_errors(value))


def _url_in_errors(value: object) -> object:
    """A URL setting as an error shows it: its password and secret parameters hidden."""
    if isinstance(value, bytes):  # refused (not text), yet it may hold a password
        value = os.fsdecode(value)
    return redact_url(value) if isinstance(value, str) else value


def _never_shown(value: object) -> str:  # noqa: ARG001 - the same shape as the others
    """Server flags as an error shows them: not at all (errors never echo ``extra_args``)."""
    return HIDDEN


def _shown_argv(value: tuple[str, ...] | None) -> str:
    """A command or flags setting in the repr: ``--api-key`` values and tokens hidden."""
    return quoted(value if value is None else shown_command(value))


def _setting(
    variable: str,
    parse: _Parse,
    default: object = None,
    *,
    flag: str | None = None,
    help: str,  # noqa: A002 - argparse's word
    secret: bool = False,
    shown: Callable[[Any], str] | None = None,
    in_errors: Callable[[Any], object] | None = None,
) -> Any:  # noqa: ANN401 - what attrs.field returns
    """A setting's one declaration: its variable, parser, default, flag and help.

    ``parse`` reads the variable's text; ``default`` is the value used when
    neither the argument, the flag nor the variable gives one (from
    `verirl._defaults`), or a description of what is done instead ("detected");
    ``flag`` is its ``verirl`` option (None: none). The CLI's flags, their
    help and the README's table come from here. ``secret``: never in the repr
    nor in an error; ``shown``: what the repr shows of the value (one that
    may hold a credential, hidden); ``in_errors``: what an error about a value
    given shows of it (`Settings.shown_in_error`).
    """
    metadata = {
        "variable": variable,
        "parse": parse,
        "default": _shown_default(default),
        "value": None if isinstance(default, _Described) else default,
        "flag": flag,
        "help": help,
        "secret": secret,
        "in_errors": (lambda _: HIDDEN) if secret else in_errors,
    }
    shows: bool | Callable[[Any], str] = False if secret else (shown or True)
    return attrs.field(default=None, kw_only=True, repr=shows, metadata=metadata)


class _Described(str):
    """A default that is a description of what is done, not a value (``detected``)."""

    __slots__ = ()


def _shown_default(default: object) -> str:
    """A default as the docs and ``--help`` show it: ``600`` for 600.0, ``""`` for none."""
    if default is None:
        return ""
    if isinstance(default, float):
        return f"{default:g}"
    return str(default)


_LOG_DIR_DEFAULT = _Described("`verirl-vllm-<uid>` under the temp directory")


@attrs.frozen(repr=False)
class Settings:
    """The job's settings as read from the environment; ``None`` is unset (or blank).

    Field names are the keyword arguments of `verirl.TrainingRuntime.from_settings`,
    which fall back to these values for arguments left ``None``. Each field is
    the one declaration of its setting (`_setting`).
    """

    env_url: str | None = _setting(
        "VERIRL_ENV_SERVER_URL", _text, flag="--env-url", help="env server base URL",
        shown=_shown_url, in_errors=_url_in_errors,
    )  # fmt: skip
    env_timeout: float | None = _setting(
        "VERIRL_ENV_TIMEOUT", parse_seconds, defaults.ENV_TIMEOUT, flag="--env-timeout",
        help="seconds to wait for the env server",
    )  # fmt: skip
    model: str | None = _setting("VERIRL_MODEL", _text, flag="--model", help="model to serve")
    max_model_len: int | None = _setting(
        "VERIRL_MAX_MODEL_LEN", _integer(1, MAX_LENGTH), defaults.MAX_MODEL_LEN,
        flag="--max-model-len", help="vLLM max model length",
    )  # fmt: skip
    output_dir: str | None = _setting(
        "VERIRL_OUTPUT_DIR", _text, flag="--output-dir", help="local checkpoints"
    )
    hub_repo_id: str | None = _setting(
        "VERIRL_HUB_REPO_ID", _text, flag="--hub-repo", help="Hub repo with checkpoints"
    )
    hub_token: str | None = _setting("HF_TOKEN", _secret, help="Hub token", secret=True)
    hub_endpoint: str | None = _setting(
        "VERIRL_HUB_ENDPOINT", _text, flag="--hub-endpoint", help="Hub endpoint URL",
        shown=_shown_url, in_errors=_url_in_errors,
    )  # fmt: skip
    hub_revision: str | None = _setting(
        "VERIRL_HUB_REVISION", _text, flag="--hub-revision", help="Hub revision"
    )
    gpu_count: int | None = _setting(
        "VERIRL_GPU_COUNT", _integer(1, MAX_GPUS), _Described("detected"), flag="--gpus",
        help="GPU count",
    )  # fmt: skip
    mode: str | None = _setting(
        "VERIRL_VLLM_MODE", _mode, defaults.MODE, flag="--mode",
        help="where vLLM runs: auto (server mode with 2 or more GPUs, else colocate), server, "
        "colocate",
    )  # fmt: skip
    vllm_gpus: int | None = _setting(
        "VERIRL_VLLM_GPUS", _integer(1, MAX_GPUS), defaults.VLLM_GPUS, flag="--vllm-gpus",
        help="GPUs given to vLLM in server mode, its tensor parallel size when colocated",
    )  # fmt: skip
    vllm_port: int | None = _setting(
        "VERIRL_VLLM_PORT", _integer(1, MAX_PORT), defaults.VLLM_PORT, flag="--vllm-port",
        help="vLLM server port",
    )  # fmt: skip
    vllm_remote_host: str | None = _setting(
        "VERIRL_VLLM_HOST", _text, flag="--vllm-host",
        help="a remote vLLM host: start nothing locally", shown=_shown_url,
        in_errors=_url_in_errors,
    )  # fmt: skip
    vllm_command: tuple[str, ...] | None = _setting(
        "VERIRL_VLLM_COMMAND", _argv, flag="--vllm-command",
        help="program replacing the server the installed TRL runs, e.g. "
        "'python -m fakes.vllm_serve'",
        shown=_shown_argv, in_errors=shown_command,
    )  # fmt: skip
    vllm_args: tuple[str, ...] | None = _setting(
        "VERIRL_VLLM_ARGS", _flags, flag="--vllm-args",
        help="more server flags, split like a shell, e.g. '--enforce-eager --dtype float32'",
        shown=_shown_argv, in_errors=_never_shown,
    )  # fmt: skip
    vllm_log_dir: str | None = _setting(
        "VERIRL_VLLM_LOG_DIR", _text, _LOG_DIR_DEFAULT, flag="--log-dir",
        help="existing folder for the server's log, vllm-serve-PORT.log, appended to; gone "
        "when the server starts, exit 2 (never made, never a file); the default is the same "
        "folder for every retry",
    )  # fmt: skip
    vllm_startup_timeout: float | None = _setting(
        "VERIRL_VLLM_STARTUP_TIMEOUT", _positive_seconds, defaults.VLLM_STARTUP_TIMEOUT,
        flag="--vllm-startup-timeout",
        help="seconds the vLLM server may take to answer /health before it is stopped "
        "(exit 4): a first start downloads the weights, loads them and captures CUDA graphs "
        "(600 s was too short for a 70B model); with --vllm-host, how long to wait for the "
        "server started there",
    )  # fmt: skip
    vllm_unresponsive_timeout: float | None = _setting(
        "VERIRL_VLLM_UNRESPONSIVE_TIMEOUT", parse_seconds, defaults.VLLM_UNRESPONSIVE_TIMEOUT,
        flag="--vllm-unresponsive-timeout",
        help="while the job runs, seconds the vLLM server may go without answering /health "
        "before it counts as dead: the command gets SIGTERM and launch exits 4, as when the "
        "server exits (0: watch its exit only)",
    )  # fmt: skip
    vllm_shutdown_timeout: float | None = _setting(
        "VERIRL_VLLM_SHUTDOWN_TIMEOUT", parse_seconds, defaults.SERVER_SHUTDOWN_TIMEOUT,
        help="seconds the vLLM server started here gets after SIGTERM to end, with its "
        "workers, before SIGKILL",
    )  # fmt: skip
    vllm_failure_grace: float | None = _setting(
        "VERIRL_VLLM_FAILURE_GRACE", parse_seconds, defaults.FAILURE_GRACE,
        help="after the vLLM server died or hung, seconds a training that listens for stop "
        "requests (PreemptionCallback) gets to save and stop before the main thread is "
        "interrupted (0: at once)",
    )  # fmt: skip
    checkpoint_wait_timeout: float | None = _setting(
        "VERIRL_CHECKPOINT_WAIT_TIMEOUT", _positive_seconds, defaults.NODE_WAIT_TIMEOUT,
        help="seconds local ranks above 0 wait for local rank 0 to choose (and download) the "
        "checkpoint to resume from",
    )  # fmt: skip
    resume_from: str | None = _setting(
        RESUME_ENV_VAR, _text, flag="--resume",
        help="'auto' (the newest complete checkpoint, else a fresh start: the same command "
        "for the first attempt and every retry), 'latest' (one must exist), a path, or empty "
        "for a fresh start",
    )  # fmt: skip

    def __repr__(self) -> str:
        """Attrs' repr of the shown fields, with the Hub token scrubbed wherever it stands.

        Each field shows what its declaration lets it (a URL's password and
        an ``--api-key`` hidden); a token inside another value (a proxy
        endpoint, a command word) is hidden as the token itself is.
        """
        parts = []
        for field in attrs.fields(Settings):
            if field.repr is False:
                continue
            value = getattr(self, field.name)
            shown = field.repr(value) if callable(field.repr) else repr(value)
            parts.append(f"{field.name}={shown}")
        text = f"Settings({', '.join(parts)})"
        token = cleaned_token(self.hub_token) if isinstance(self.hub_token, str) else None
        return scrub(text, token) if token else text

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """Read and check every variable of ``environ`` (default ``os.environ``)."""
        env = os.environ if environ is None else check_environ(environ)
        values: dict[str, Any] = {}
        for field in attrs.fields(cls):
            name = field.metadata["variable"]
            if name not in env:
                continue
            raw: object = env[name]
            if not isinstance(raw, str):
                shown = HIDDEN if field.metadata["secret"] else raw
                raise ConfigError.invalid(name, shown, "must be a string")
            if raw.strip():
                try:
                    values[field.name] = field.metadata["parse"](name, raw)
                except ConfigError as exc:
                    failure, cause = exc, exc.__cause__
                else:
                    continue
                # Any value may hold the Hub token (a proxy endpoint, a path): never shown.
                for token in tokens_to_hide(env):
                    failure = scrub_config_error(failure, token)
                    if cause is not None:
                        scrub_exception(cause, token)
                raise failure from cause
        return cls(**values)

    @staticmethod
    def parse(field: str, name: str, raw: str) -> Any:  # noqa: ANN401 - the field's own type
        """``raw`` read by the field's parser, as its variable is; errors name ``name``."""
        return attrs.fields_dict(Settings)[field].metadata["parse"](name, raw)

    @staticmethod
    def shown_in_error(field: str, value: object) -> object:
        """``value`` of ``field`` as an error may show it: a secret hidden, a URL's password too."""
        hide = attrs.fields_dict(Settings)[field].metadata["in_errors"]
        return value if hide is None else hide(value)

    @staticmethod
    def variable(field: str) -> str:
        """The variable a field is read from: ``variable("gpu_count") == "VERIRL_GPU_COUNT"``."""
        return str(attrs.fields_dict(Settings)[field].metadata["variable"])

    @staticmethod
    def variables() -> dict[str, str]:
        """Field name → variable, in the README table's order."""
        return {field.name: field.metadata["variable"] for field in attrs.fields(Settings)}

    @staticmethod
    def default(field: str) -> Any:  # noqa: ANN401 - the field's own type
        """The value a field takes when nothing gives one; ``None`` where it is worked out."""
        return attrs.fields_dict(Settings)[field].metadata["value"]

    @staticmethod
    def flag(field: str) -> str | None:
        """The ``verirl`` option that gives a field: ``flag("gpu_count") == "--gpus"``."""
        return attrs.fields_dict(Settings)[field].metadata["flag"]  # type: ignore[no-any-return]

    @staticmethod
    def flags() -> dict[str, str]:
        """Field name → its ``verirl`` option, for the fields that have one."""
        return {
            field.name: field.metadata["flag"]
            for field in attrs.fields(Settings)
            if field.metadata["flag"] is not None
        }

    @staticmethod
    def help(field: str, lead: str | None = None) -> str:
        """A field's ``--help`` text: ``lead`` (default: its own help), variable and default."""
        metadata = attrs.fields_dict(Settings)[field].metadata
        default = metadata["default"].replace("`", "")  # Markdown in the README's table
        tail = f"${metadata['variable']}" + (f"; default: {default}" if default else "")
        return f"{lead or metadata['help']} ({tail})"


@attrs.frozen
class Read:
    """A ``from_settings`` argument when given, else its setting; errors name the source."""

    settings: Settings
    given: Mapping[str, object] = attrs.field(repr=False)  # may hold a token
    environ: Mapping[str, str] = attrs.field(repr=False)
    typed: bool = False
    """The values came as a `Settings` (no variable read): an unset one is named by its field."""

    def unset_name(self, field: str) -> str:
        """How to name ``field`` when nothing gave it: its variable, or its field when typed."""
        return field if self.typed else Settings.variable(field)

    def name(self, field: str) -> str | None:
        """The argument's name if given, the variable's if set, else ``None`` (a default)."""
        if self.given.get(field) is not None:
            return field
        return Settings.variable(field) if getattr(self.settings, field) is not None else None

    def text(self, field: str) -> str | None:
        value = self.given.get(field)
        if value is None:
            return getattr(self.settings, field)  # type: ignore[no-any-return]
        path = isinstance(value, os.PathLike)
        given: object = os.fspath(value) if isinstance(value, os.PathLike) else value
        if not isinstance(given, str):
            raise self.refusal(field, value, "must be a string")
        # Read as its variable is (`_text`, `_secret`), so that no door takes what another
        # refuses, nor reads other bytes: blanks around the value are not part of it (a path
        # object is a path as it is), a control character inside it is refused.
        if field == "hub_token":  # as huggingface_hub reads a token
            given = cleaned_token(given) or ""
        elif not path:
            given = given.strip()
        if has_control_chars(given.strip()):
            raise self.refusal(field, given, "must not contain control characters")
        return given

    def refusal(self, field: str, value: object, reason: str) -> ConfigError:
        """An error about a value given for ``field``, never showing a secret.

        The value is shown as its setting shows values in errors
        (`Settings.shown_in_error`; a URL's password hidden), and the Hub
        token, wherever it stands, is scrubbed.
        """
        shown = Settings.shown_in_error(field, value)
        if shown is value and isinstance(value, str):
            shown = redact_url(value)
        token = self.given.get("hub_token") or self.settings.hub_token
        in_use = hub_token_in_use(token if isinstance(token, str) else None)
        return scrub_config_error(ConfigError.invalid(field, shown, reason), in_use)

    def integer(self, field: str, maximum: int) -> int | None:
        value = self.given.get(field)
        if value is None:
            return getattr(self.settings, field)  # type: ignore[no-any-return]
        return check_int(field, value, 1, maximum)

    @contextlib.contextmanager
    def naming(self, fields: Mapping[str, str] | str) -> Iterator[None]:
        """Re-raise a component's `ConfigError` under the name of the setting it came from.

        ``fields`` maps the component's field names to settings; a single
        setting takes every error of the component.
        """
        try:
            yield
        except ConfigError as exc:
            field = fields if isinstance(fields, str) else fields.get(exc.field or "")
            name = self.name(field) if field is not None else None
            if name is None:
                raise
            raise exc.renamed(name) from exc

    def unset_gpu_count(self, reason: str, count: int | None = None) -> ConfigError:
        """An error about the GPU count, which no argument or variable gave."""
        name = self.unset_name("gpu_count")
        raw = None if self.typed else self.environ.get(name)
        how = "unset" if raw is None else "blank"
        detected = "" if count is None else f"; {count} GPU(s) detected"
        return ConfigError(
            f"{name}={quoted(raw)} ({how}{detected}): {reason}",
            field=name,
            value=raw,
            reason=reason,
        )


# VLLMTopology.plan's fields → the settings they come from

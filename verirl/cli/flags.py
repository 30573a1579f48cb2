"""Each setting's flag, made from its one declaration (`verirl._settings.Settings`).

The argument types (syntax only: argparse names the flag), the flag ↔ setting
tables, the argument groups shared by commands, and what the flags give
`verirl.TrainingRuntime.from_settings` and a command's environment.
"""

from __future__ import annotations

import argparse
import os
import shlex
from collections.abc import Mapping
from typing import Any

from verirl._fs import quoted
from verirl._hidden import HIDDEN
from verirl._settings import Settings, split_args
from verirl._validate import parse_int, parse_seconds
from verirl.cli.codes import SHUTDOWN_TIMEOUT_VARIABLE
from verirl.errors import ConfigError
from verirl.runtime import TrainingRuntime
from verirl.server.args import own_flag, own_flag_reason
from verirl.topology import MODES


def _ascii_int(text: str) -> int:
    """An integer in ASCII digits: ``int()`` would also take ``1_0`` and ``٣``."""
    try:
        return parse_int("value", text, -(2**63))
    except ConfigError:
        raise argparse.ArgumentTypeError(f"invalid integer: {quoted(text)}") from None


class _GivenSeconds(float):
    """Seconds that an error message shows as the user wrote them (``5``, not ``5.0``)."""

    text: str

    def __repr__(self) -> str:
        return self.text

    def __str__(self) -> str:  # a float's own: what launch exports (VERIRL_ENV_TIMEOUT=10.0)
        return float.__repr__(self)


def _ascii_seconds(text: str, *, positive: bool = False) -> float:
    """Seconds as an ASCII decimal number, finite (no ``nan``/``inf``), see `MAX_SECONDS`."""
    try:
        seconds = _GivenSeconds(parse_seconds("value", text, positive=positive))
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(f"invalid seconds {quoted(text)}: {exc.reason}") from None
    seconds.text = text.strip()
    return seconds


def _ascii_positive_seconds(text: str) -> float:
    """`_ascii_seconds` above zero: a deadline of no time would fail every start."""
    return _ascii_seconds(text, positive=True)


def _stripped(text: str) -> str:
    """A flag's value without the blanks around it (a line end read from a file)."""
    return text.strip()


def _dest(flag: str) -> str:
    """The argparse destination of ``flag``: ``--vllm-host`` → ``vllm_host``."""
    return flag.removeprefix("--").replace("-", "_")


_ALIASES = {
    # a component's field → the setting it comes from: an error about it names that setting
    "tensor_parallel_size": "vllm_gpus", "port": "vllm_port", "remote_host": "vllm_remote_host",
    "log_path": "vllm_log_dir", "log_dir": "vllm_log_dir", "root": "output_dir",
    "download_dir": "output_dir", "repo_id": "hub_repo_id", "endpoint": "hub_endpoint",
    "revision": "hub_revision", "request": "resume_from",
}  # fmt: skip
_OTHER_FLAGS = {
    # fields given by flags that are no setting (a command's own, serve's node choices)
    "health_path": "--health-path", "timeout": "--timeout",
    "shutdown_timeout": "--shutdown-timeout", "vllm_bind_host": "--host", "host": "--host",
    "vllm_tensor_parallel_size": "--tensor-parallel-size",
    "vllm_data_parallel_size": "--data-parallel-size", "vllm_dedicated": "--dedicated",
}  # fmt: skip
_FLAGS: dict[str, tuple[str, str]] = {
    # library field → (argparse dest, flag); an error about a value given as a flag names it
    field: (_dest(flag), flag)
    for field, flag in {
        **Settings.flags(),
        **{alias: Settings.flags()[setting] for alias, setting in _ALIASES.items()},
        **_OTHER_FLAGS,
    }.items()
}
_SETTING_OF = {_dest(flag): field for field, flag in Settings.flags().items()}
"""Flags (argparse destinations) → the settings they give."""


def _flag(dest: str) -> str:
    """The flag whose argparse destination is ``dest`` (`_dest` undone)."""
    return "--" + dest.replace("_", "-")


def _variable_of(dest: str) -> str | None:
    """The variable behind the flag whose argparse destination is ``dest`` (None: none)."""
    field = _SETTING_OF.get(dest)
    return None if field is None else Settings.variable(field)


_REQUIRED: dict[str, tuple[str, str, str]] = {
    # variable → (argparse dest, flag, how to give it): values a command cannot do without
    "VERIRL_MODEL": ("model", "--model", "pass --model NAME or set VERIRL_MODEL"),
    "VERIRL_GPU_COUNT": ("gpus", "--gpus", "pass --gpus N or set VERIRL_GPU_COUNT"),
}


def _unset(variable: str, reason: str, *, state: str | None = None) -> ConfigError:
    """A required value given neither as its flag nor by ``variable``: name both, and how."""
    _, flag, how = _REQUIRED[variable]
    if state is None:
        state = "is unset" if os.environ.get(variable) is None else "is blank"
    message = f"{flag} not given and {variable} {state}: {reason}; {how}"
    return ConfigError(message, field=flag, value=None, reason=reason)


def _add_setting(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup,
    field: str,
    *,
    lead: str | None = None,
    **kwargs: Any,  # noqa: ANN401 - argparse's own
) -> None:
    """The flag of the setting ``field``, as `Settings` declares it (flag, variable, default).

    ``lead``: this command's words for it (``doctor``'s "vLLM port to check").
    """
    flag = Settings.flag(field)
    if flag is None:  # pragma: no cover - a setting without a flag is never added
        raise ValueError(field)
    parser.add_argument(flag, help=Settings.help(field, lead), **kwargs)


def _add_topology_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("topology")
    _add_setting(group, "gpu_count", type=_ascii_int)
    _add_setting(group, "max_model_len", type=_ascii_int)
    # blanks around it dropped before argparse's choices, as VERIRL_VLLM_MODE's are; a bad one
    # stays argparse's usage error, which hides a word that may be a misplaced secret
    _add_setting(group, "mode", type=_stripped, choices=MODES)
    _add_setting(group, "vllm_gpus", type=_ascii_int)
    _add_setting(group, "vllm_port", type=_ascii_int)
    _add_setting(group, "vllm_remote_host")


def _add_checkpoint_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("checkpoints")
    for field in ("output_dir", "hub_repo_id", "hub_endpoint", "hub_revision", "resume_from"):
        _add_setting(group, field)


def _add_server_args(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("vLLM server")
    for field in ("model", "vllm_command", "vllm_args", "vllm_log_dir"):
        _add_setting(group, field)
    _add_setting(group, "vllm_startup_timeout", type=_ascii_positive_seconds, metavar="S")


def read_setting_flags(args: argparse.Namespace) -> None:
    """Read each text flag of a setting by that setting's parser, as its variable is read.

    A value from a file keeps its line end (``--resume "$(cat f)"`` does not,
    ``read -r`` from a Windows file does): blanks around it are dropped and a
    control character inside it is refused, the same for the flag and the
    variable, whichever command takes it. Commands and server flags are split
    like a shell where they are used.
    """
    for dest, field in _SETTING_OF.items():
        value = getattr(args, dest, None)
        if isinstance(value, str) and field not in ("vllm_command", "vllm_args"):
            setattr(args, dest, Settings.parse(field, _flag(dest), value))
    if args.cmd == "wait-env":  # its URL is --env-url's, given as an argument
        args.url = Settings.parse("env_url", "url", args.url)


def _runtime_from_args(args: argparse.Namespace) -> TrainingRuntime:
    return TrainingRuntime.from_settings(**_settings_from_args(args))


def _settings_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """`TrainingRuntime.from_settings`'s arguments as the flags give them (``None``: not given)."""
    raw_command = getattr(args, "vllm_command", None)
    command = None
    if raw_command is not None:  # read as its variable is: split, printable, not empty
        command = list(Settings.parse("vllm_command", "--vllm-command", raw_command))
    given: dict[str, Any] = {
        field: getattr(args, dest, None) for dest, field in _SETTING_OF.items()
    }
    given.update(
        vllm_command=command,
        vllm_args=_vllm_args(args),
        # serve's node choices: arguments, never settings
        vllm_bind_host=getattr(args, "host", None),
        vllm_tensor_parallel_size=getattr(args, "tensor_parallel_size", None),
        vllm_data_parallel_size=getattr(args, "data_parallel_size", None),
        vllm_dedicated=getattr(args, "dedicated", None),
    )
    return given


def _flag_variables(args: argparse.Namespace, given: Mapping[str, Any]) -> dict[str, str]:
    """The settings' variables whose values launch's flags gave, as the command should see them.

    A flag wins over its variable; a caller's ``VERIRL_VLLM_PORT=9000`` under
    ``launch --vllm-port 9100`` must not reach the command as 9000.
    """
    variables = Settings.variables()
    exported: dict[str, str] = {}
    for field, value in given.items():
        if value is None or field not in variables or isinstance(value, bool):
            continue
        if isinstance(value, (list, tuple)):
            exported[variables[field]] = shlex.join(value)
        else:
            exported[variables[field]] = (
                os.fspath(value) if isinstance(value, os.PathLike) else str(value)
            )
    if getattr(args, "shutdown_timeout", None) is not None:
        exported[SHUTDOWN_TIMEOUT_VARIABLE] = str(args.shutdown_timeout)
    return exported


_OWN_FLAG_SOURCES = {
    # a server flag verirl sets itself → where a user sets it instead
    "--model": "--model/VERIRL_MODEL",
    "--host": "serve --host",
    "--port": "--vllm-port/VERIRL_VLLM_PORT",
    "--gpu-memory-utilization": "the layout (--mode, --gpus, --vllm-gpus)",
    "--max-model-len": "--max-model-len/VERIRL_MAX_MODEL_LEN",
    "--tensor-parallel-size": "--vllm-gpus (serve: --tensor-parallel-size)",
    "--data-parallel-size": "serve --data-parallel-size",
}


def _refusal(flag: str) -> str:
    """Why a ``--vllm-args`` flag is refused, and where to set what it meant."""
    source = _OWN_FLAG_SOURCES.get(flag)
    if source is None:
        return f"is refused: {own_flag_reason(flag)}"
    return f"verirl sets itself and waits on; set it with {source} instead"


def _vllm_args(args: argparse.Namespace) -> list[str] | None:
    """``--vllm-args`` split; one that changes a server flag verirl sets itself is refused.

    The variable is checked the same way (when the flag is not given), and the
    check is on the words alone: the same answer whether or not vLLM is installed.
    """
    raw = getattr(args, "vllm_args", None)
    if raw is not None:
        given: list[str] | None = split_args("--vllm-args", raw)
        source = "--vllm-args"
    else:
        variable = Settings.variable("vllm_args")
        env = os.environ.get(variable, "")
        given = None
        words = list(Settings.from_environ().vllm_args or ()) if env.strip() else []
        source = variable
    found = own_flag(given if given is not None else words)
    if found is not None:
        written, flag = found
        raise ConfigError.invalid(
            source,
            HIDDEN,
            # quoted: a secret-looking flag's next word is not its value (the redaction's rule)
            f"{quoted(written)} sets the server's {flag}, which {_refusal(flag)}",
        )
    return given

"""The ``verirl`` command line: plan, wait-env, resume, serve, launch, doctor.

argparse, not click: it is in the standard library, so the core keeps its
four dependencies, and ``--help`` on every command comes for free.

Messages: every error is one line on stderr, printed once, naming the flag
(or the variable, when the value came from the environment) and the value;
a required value given neither way is asked for before anything else; a flag
that the layout chosen by other flags would ignore is an error, not a no-op.
``-v``/``-q``/``--json`` go before or after the command (counts add up).
With ``--json`` stdout carries exactly one JSON document on every path
(``{"error": {"code": N, "message": M}}`` for a failed run), and a closed,
``None`` or abandoned stdout/stderr never fails a command (`verirl._cli_output`).

Exit codes (`EXIT_CODES`; the parser's epilog and the README say the same):

- 0 success; 1 any other verirl error;
- 2 bad usage or configuration (argparse's usage error, `ConfigError`);
- 3 the env server never became healthy; 4 the vLLM server failed (it could not
  start, exited or timed out; for ``serve``, it died while serving);
- 5 no checkpoint where one was asked for, or a checkpoint source failed;
- ``doctor`` is a preflight: 3 when the env server it checks is not healthy,
  else 4 when no vLLM server can start here, else 2 when ``launch`` could
  not plan the job, else 5 when it would find no checkpoint where the disk
  alone decides, else 1 for anything else it finds unusable, 0 when
  everything is;
- 130 on Ctrl-C (SIGINT) and 143 on SIGTERM, whenever it arrives (while
  starting, serving or tearing down; ``python -m verirl`` and the ``verirl``
  script handle SIGTERM from their first line, see `verirl.__main__`);
  a second SIGTERM during the teardown is ignored, so the teardown completes;
- ``launch`` exits with its command's code (127 when it cannot be run, 128+N
  when it died of signal N): the command runs in a process group of its own
  (so it cannot read a terminal's stdin), each SIGTERM/Ctrl-C is passed on to
  that group once, and it gets ``--shutdown-timeout`` seconds before SIGKILL
  (then 137; a Ctrl-C after the first signal SIGKILLs at once, a second
  SIGTERM is ignored); a signal before the
  command started gives 143/130 and the command never runs. If the vLLM
  server dies while the command runs (exits, or answers no ``/health`` for
  ``--vllm-unresponsive-timeout`` seconds), the command gets SIGTERM the same
  way and ``launch`` exits 4, whatever the command's code.
"""

from __future__ import annotations

import argparse
import contextlib
import contextvars
import functools
import ipaddress
import json
import logging
import os
import re
import shlex
import signal
import socket
import sys
import threading
import urllib.parse
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import Any, NoReturn

from verirl import __version__
from verirl import _defaults as defaults
from verirl._cli_output import (
    STDERR,
    STDOUT,
    abandoned_pipes_to_devnull,
    command_word,
    decide_json,
    signal_message,
    stdout_to_stderr,
    wants_json,
    write_document,
)
from verirl._fs import escape_bytes, printable, quoted
from verirl._net import url_host
from verirl._secrets import (
    HIDDEN,
    hub_token_in_use,
    known_secrets,
    redact_and_scrub,
    redact_argv,
    redact_message,
    redact_text,
    scrub,
    scrub_all,
    secrets_in_environ,
    shown_command,
    shown_line,
    taken_out,
)
from verirl._settings import Settings, split_args, split_command
from verirl._signals import SIGTERM_POLICY, exit_on_sigterm, sigterm_pending
from verirl._validate import check_port, check_seconds, parse_int, parse_seconds
from verirl.checkpoints import RESUME_ENV_VAR
from verirl.envserver import HttpEnvServerProbe
from verirl.errors import (
    CheckpointNotFoundError,
    CheckpointSourceError,
    ConfigError,
    EnvServerUnavailable,
    PortInUseError,
    VeriRLError,
    VLLMServerError,
)
from verirl.runtime import TrainingRuntime, resolver_from_settings, topology_from_settings
from verirl.server.args import own_flag, own_flag_reason
from verirl.server.child_env import map_visible_devices
from verirl.server.launch import CLI_COMMAND_HINT, COMMAND_HINT
from verirl.topology import MODES, VLLMTopology

__all__ = ["EXIT_CODES", "GRPO_KWARGS_VARIABLE", "build_parser", "main"]

log = logging.getLogger("verirl")

GRPO_KWARGS_VARIABLE = "VERIRL_GRPO_KWARGS"
VLLM_URL_VARIABLE = "VERIRL_VLLM_URL"

LAUNCH_GRACE = defaults.SHUTDOWN_TIMEOUT
"""Seconds ``launch`` gives its command after passing SIGTERM/SIGINT on, before SIGKILL.

Under the 30 s that Kubernetes (``terminationGracePeriodSeconds``' default)
and Modal give a preempted container: the command's last checkpoint must be
written, and verirl's own teardown done, before the platform's SIGKILL.
"""
SHUTDOWN_TIMEOUT_VARIABLE = "VERIRL_SHUTDOWN_TIMEOUT"

_POLL_INTERVAL = 0.5

EXIT_OK = 0
EXIT_ERROR = 1
EXIT_CONFIG = 2
EXIT_ENV_SERVER = 3
EXIT_VLLM = 4
EXIT_CHECKPOINT = 5

EXIT_CODES: dict[type[BaseException], int] = {
    ConfigError: EXIT_CONFIG,
    EnvServerUnavailable: EXIT_ENV_SERVER,
    VLLMServerError: EXIT_VLLM,
    CheckpointNotFoundError: EXIT_CHECKPOINT,
    CheckpointSourceError: EXIT_CHECKPOINT,
}


def _exit_code(exc: BaseException) -> int:
    for kind, code in EXIT_CODES.items():
        if isinstance(exc, kind):
            return code
    return EXIT_ERROR


# -- argument types: syntax only (argparse names the flag); ranges are checked later


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


def _download_folder_error(args: argparse.Namespace, exc: ConfigError) -> ConfigError:
    """``exc`` about the Hub download folder, named as such, with what it was made from.

    The user gave ``--output-dir`` (or its variable), or nothing: the folder is
    verirl's, under it or in the current folder.
    """
    variable = Settings.variable("output_dir")
    given = getattr(args, "output_dir", None)
    if given is not None:
        where = f"verirl's, under --output-dir={quoted(given)}"
    elif os.environ.get(variable, "").strip():
        where = f"verirl's, under {variable}={quoted(os.environ[variable])}"
    else:
        where = "verirl's, in the current folder (no --output-dir given)"
    return ConfigError.invalid(
        "the Hub download folder", exc.value, f"{exc.reason}; the folder is {where}"
    )


def _derived_error(args: argparse.Namespace, exc: ConfigError) -> ConfigError | None:
    """``exc`` about a path verirl made from what the user gave, named as that path; else None."""
    field = exc.field or ""
    if not exc.reason:
        return None
    if field == "download_dir":
        return _download_folder_error(args, exc)
    if field in ("log_dir", "vllm_log_dir", "--log-dir", Settings.variable("vllm_log_dir")):
        return _log_file_error(args, exc)
    return None


def _log_file_error(args: argparse.Namespace, exc: ConfigError) -> ConfigError | None:
    """``exc`` about the log file verirl names in the folder given, named as that file.

    ``None`` when the error is about the folder itself (the value given).
    """
    variable = Settings.variable("vllm_log_dir")
    given, name = getattr(args, "log_dir", None), "--log-dir"
    if given is None:
        given, name = os.environ.get(variable, "").strip() or None, variable
    if given is None or not isinstance(exc.value, str):
        return None
    # The error shows its path printable (a non-UTF-8 name escaped): compared the same way
    folder = printable(os.path.normpath(os.path.expanduser(given)))  # noqa: PTH111 - a str
    value = os.path.normpath(exc.value)
    if value == folder or os.path.dirname(value) != folder:  # noqa: PTH120 - the folder itself
        return None
    return ConfigError.invalid(
        "the vLLM server's log file", exc.value, f"{exc.reason}; it is in {name}={quoted(given)}"
    )


def _flag_error(args: argparse.Namespace, exc: ConfigError) -> ConfigError:
    """``exc`` naming the flag the value came from, rather than the library's field."""
    field = exc.field or ""
    derived = _derived_error(args, exc)
    if derived is not None:
        return derived
    if field == "url":  # the env server URL: a positional of wait-env, a flag elsewhere
        flag, dest = ("url", "url") if args.cmd == "wait-env" else ("--env-url", "env_url")
    else:
        dest, flag = _FLAGS.get(field, ("", ""))
    if dest and getattr(args, dest, None) is not None:
        return exc.renamed(flag)
    variable = _variable_of(dest)
    if variable is not None and os.environ.get(variable, "").strip():  # given by its variable
        return exc.renamed(variable)
    if field == "log_path" and exc.reason:  # no flag, no variable: verirl's default folder
        return ConfigError.invalid(
            "the vLLM server's log file",
            exc.value,
            f"{exc.reason}; it is in verirl's default log folder: choose another with "
            f"--log-dir or {Settings.variable('vllm_log_dir')}",
        )
    # A value that is missing altogether: name the flag beside its variable.
    required = _REQUIRED.get(field)
    blank = exc.value is None or (isinstance(exc.value, str) and not exc.value.strip())
    if required is None or not blank or not hasattr(args, required[0]):
        return exc
    message, state = str(exc), None
    # the library's "VERIRL_GPU_COUNT=None (unset; …): why"
    prefix = f"{field}={quoted(exc.value)} ("
    if message.startswith(prefix):
        inner, found, _ = message[len(prefix) :].partition("): ")
        state = f"is {inner}" if found else None
    reason = (exc.reason or "").removesuffix("; set it")
    if field == "VERIRL_MODEL" or not reason:
        reason = "the vLLM server needs a model" if field == "VERIRL_MODEL" else "required"
    return _unset(field, reason, state=state)


def _refuse_unused(args: argparse.Namespace) -> None:
    """A flag that the layout would ignore is an error, not a silent no-op.

    Whatever chose the layout: flags (``--vllm-host``, ``--mode colocate``), a
    variable (``VERIRL_VLLM_MODE=colocate``) or auto mode (one GPU colocates:
    ``--gpus 1 --vllm-port 9000`` is refused). Only flags are refused: a
    variable may be set for the whole job.
    """
    if getattr(args, "vllm_host", None) is not None:
        why = "with --vllm-host, vLLM runs on another machine and nothing starts here"
        unused: tuple[str, ...] = ("model", "vllm_command", "vllm_args", "log_dir", "vllm_gpus")
    elif getattr(args, "mode", None) == "colocate":
        why = "with --mode colocate, vLLM runs inside the training processes and no server starts"
        unused = ("model", "vllm_command", "vllm_args", "log_dir", "vllm_port",
                  "vllm_startup_timeout", "vllm_unresponsive_timeout")  # fmt: skip
    else:
        unused, why = (), ""
    if not unused:  # --mode server too: VERIRL_VLLM_HOST may still put vLLM elsewhere
        unused, why = _unused_by_layout(args)
    for dest in unused:
        value = getattr(args, dest, None)
        if value is not None:
            # Server flags and commands may hold an --api-key.
            shown = HIDDEN if dest == "vllm_args" else shown_command(value)
            raise ConfigError.invalid(_flag(dest), shown, f"not used: {why}")
    _refuse_without_what_they_tune(args)


_TUNERS = (
    # settings that tune something → (the setting that gives that something, what)
    ("hub_revision", "hub_repo_id", "a Hub repo"),
    ("hub_endpoint", "hub_repo_id", "a Hub repo"),
    ("env_timeout", "env_url", "an env server"),
)


def _refuse_without_what_they_tune(args: argparse.Namespace) -> None:
    """A flag that tunes a part the job does not have (no Hub repo, no env server) is an error."""
    for tuner, field, what in _TUNERS:
        dest, flag = _FLAGS[tuner]
        owner, owner_flag = _FLAGS[field]
        value = getattr(args, dest, None)
        if value is None or getattr(args, owner, None) is not None:
            continue
        variable = Settings.variable(field)
        if os.environ.get(variable, "").strip():
            continue
        why = f"not used without {what}: pass {owner_flag} or set {variable}"
        shown = value if isinstance(value, float) else redact_text(str(value))  # a URL's password
        if isinstance(shown, str) and dest == "hub_endpoint":  # may hold the Hub token: hidden
            shown = scrub(shown, hub_token_in_use(None))
        raise ConfigError.invalid(flag, shown, why)


_SERVER_ONLY = ("model", "vllm_command", "vllm_args", "log_dir", "vllm_port",
                "vllm_startup_timeout", "vllm_unresponsive_timeout")  # fmt: skip


def _plan(args: argparse.Namespace) -> VLLMTopology:
    """The layout the topology flags (and the variables under them) give."""
    return topology_from_settings(
        gpu_count=args.gpus,
        max_model_len=args.max_model_len,
        mode=args.mode,
        vllm_gpus=args.vllm_gpus,
        vllm_port=args.vllm_port,
        vllm_remote_host=args.vllm_host,
    )


class _InUserWords(logging.Filter):
    """Log records of the layout that name a library field, naming the flag or variable instead.

    ``max_model_len=20000 is not used`` (colocate's cap) reads as the user set
    it: ``--max-model-len=20000`` or ``VERIRL_MAX_MODEL_LEN=20000``.
    """

    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__()
        if getattr(args, "max_model_len", None) is not None:
            self.source = "--max-model-len"
        else:
            self.source = Settings.variable("max_model_len")
        gpus = "--vllm-gpus" if getattr(args, "vllm_gpus", None) is not None else None
        self.words = {
            "max_model_len=%d": f"{self.source}=%d",
            # a dedicated node's idle GPUs: serve's flags (it is the only command with them)
            "choose a tensor-parallel and a data-parallel size whose product": (
                "choose --tensor-parallel-size and --data-parallel-size so that their product"
            ),
            "leave the vLLM GPU count unset": (
                f"leave {gpus or Settings.variable('vllm_gpus')} unset"
            ),
        }

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.msg, str):
            for library, user in self.words.items():
                record.msg = record.msg.replace(library, user)
        return True


def _drop_record(record: logging.LogRecord) -> bool:
    """A logging filter that lets nothing through."""
    del record
    return False


def _unused_by_layout(args: argparse.Namespace) -> tuple[tuple[str, ...], str]:
    """The flags given that the layout chosen without flags (auto, a variable) would ignore.

    Only computed when such a flag is given: the layout may detect the GPUs.
    """
    if not any(getattr(args, dest, None) is not None for dest in (*_SERVER_ONLY, "vllm_gpus")):
        return (), ""
    # The command plans again and logs what the plan says (a cap, idle GPUs): once.
    topology_log = logging.getLogger("verirl.topology")
    topology_log.addFilter(_drop_record)
    try:
        topology = _plan(args)
    finally:
        topology_log.removeFilter(_drop_record)
    if topology.remote_host is not None:  # VERIRL_VLLM_HOST
        variable = Settings.variable("vllm_remote_host")
        why = f"with {variable} set, vLLM runs on another machine and nothing starts here"
        return ("model", "vllm_command", "vllm_args", "log_dir", "vllm_gpus"), why
    if topology.mode != "colocate":
        return (), ""
    variable = Settings.variable("mode")
    if args.mode is None and Settings.from_environ().mode == "colocate":
        chosen = f"{variable}=colocate"
    else:
        chosen = f"auto mode with {topology.gpu_count} GPU(s)"
    why = (
        f"the layout is colocate ({chosen}): vLLM runs inside the training processes and no "
        "server starts (a server needs 2 or more GPUs, or --mode server)"
    )
    return _SERVER_ONLY, why


# -- argument groups shared by several commands


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
    _add_setting(group, "mode", choices=MODES)
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


def _runtime_from_args(args: argparse.Namespace) -> TrainingRuntime:
    return TrainingRuntime.from_settings(**_settings_from_args(args))


def _settings_from_args(args: argparse.Namespace) -> dict[str, Any]:
    """`TrainingRuntime.from_settings`'s arguments as the flags give them (``None``: not given)."""
    raw_command = getattr(args, "vllm_command", None)
    command = split_command("--vllm-command", raw_command) if raw_command is not None else None
    if command is not None and not command:
        raise ConfigError.invalid("--vllm-command", shown_command(raw_command), "must not be empty")
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


def _emit(args: argparse.Namespace, data: dict[str, object], text: str) -> None:
    """The command's result on stdout: ``text``, or with ``--json`` the one JSON document.

    With ``--json``, a run prints exactly one document, whatever happens: a
    second one (an error after a result) is not printed (see `main`).
    """
    if args.json:
        _emit_json(args, data)
    else:
        STDOUT.write(_for_stdout(text + "\n"))


def _emit_json(
    args: argparse.Namespace,
    data: dict[str, object],
    *,
    indent: int | None = 2,
    final: bool = True,
) -> None:
    if getattr(args, "json_emitted", False):
        return
    args.json_emitted = True
    write_document(_document_for_stdout(data), indent=indent, final=final)


def _error_document(code: int, message: str) -> dict[str, object]:
    """The ``--json`` document of a run that failed: ``{"error": {"code": N, "message": M}}``."""
    return {"error": {"code": code, "message": _hidden(message)}}


# -- commands


def cmd_plan(args: argparse.Namespace) -> int:
    """Print the topology and GRPOConfig kwargs for a GPU count."""
    _refuse_unused(args)
    topology = _plan(args)
    data: dict[str, object] = {
        "mode": topology.mode,
        "gpu_count": topology.gpu_count,
        "training_devices": list(topology.training_devices),
        "vllm_devices": list(topology.vllm_devices),
        "server_url": topology.server_url,
        "grpo_kwargs": topology.grpo_kwargs(),
    }
    if topology.is_local_server and args.model:
        data["serve_args"] = topology.serve_args(args.model)
    text = topology.describe() + "\n" + json.dumps(topology.grpo_kwargs(), sort_keys=True)
    _emit(args, data, text)
    return EXIT_OK


def cmd_wait_env(args: argparse.Namespace) -> int:
    """Wait for the env server's health; exit 0 when healthy, 3 with the reason otherwise."""
    probe = HttpEnvServerProbe(args.url, health_path=args.health_path)
    try:
        probe.wait(args.timeout)
    except EnvServerUnavailable as exc:
        message = f"not healthy: {exc}"
        _emit(args, {"healthy": False, "url": exc.url, "elapsed": exc.elapsed,
                     "last_error": exc.last_error,
                     **_error_document(EXIT_ENV_SERVER, str(exc))}, message)  # fmt: skip
        return EXIT_ENV_SERVER
    _emit(args, {"healthy": True, "url": probe.url}, f"healthy: {probe.url}")
    return EXIT_OK


def cmd_resume(args: argparse.Namespace) -> int:
    """Print the checkpoint path to resume from (nothing for a fresh start)."""
    _refuse_unused(args)
    resolver = resolver_from_settings(
        output_dir=args.output_dir,
        hub_repo_id=args.hub_repo,
        hub_endpoint=args.hub_endpoint,
        hub_revision=args.hub_revision,
    )
    request = args.resume if args.resume is not None else Settings.from_environ().resume_from
    try:
        path = resolver.resolve(request)
    except ConfigError as exc:  # 'auto' with nowhere to look
        if exc.field != "request" or args.resume is not None:
            raise
        raise exc.renamed(RESUME_ENV_VAR) from None
    _emit(args, {"resume_from_checkpoint": path}, path or "")
    return EXIT_OK


def _wait_while(alive: Callable[[], bool]) -> None:
    """Block, interruptibly, while ``alive()``: SIGTERM (`SystemExit`) and Ctrl-C end it."""
    pause = threading.Event()
    while alive():
        pause.wait(_POLL_INTERVAL)


def _exit_if_sigterm_was_lost() -> None:
    """Exit 143 if a SIGTERM came but its `SystemExit` never arrived.

    ``compile()`` (a lazy import with no cached bytecode) can swallow the
    exception a signal handler raises; the policy fires once, so without this
    check such a SIGTERM would be lost for good.
    """
    if sigterm_pending():
        raise SystemExit(128 + signal.SIGTERM)


_NOT_SERVES = ("env_url", "env_timeout", "output_dir", "hub_repo_id", "hub_endpoint",
               "hub_revision", "resume_from")  # fmt: skip
"""Settings of the whole job that serve has no use for: no env-server wait, no resume.

Set in a job's shared environment (a multi-node job's vLLM node), they made
serve wait for the env server and download checkpoints, and end 3 or 5.
"""


def _serve_environ(args: argparse.Namespace) -> dict[str, str]:
    """The environment serve reads: the job's, less what is for the training side."""
    unread = [Settings.variable(name) for name in _NOT_SERVES]
    given = [name for name in unread if os.environ.get(name, "").strip()]
    if given:
        log.info("%s: for the training side, serve does not read them", ", ".join(given))
    remote = Settings.variable("vllm_remote_host")
    if args.dedicated and args.vllm_host is None and os.environ.get(remote, "").strip():
        # Set for the whole job, it names this node to the trainers: here it is not an error.
        log.info("%s is for the training nodes: serve --dedicated does not read it", remote)
        unread.append(remote)
    return {name: value for name, value in os.environ.items() if name not in unread}


def cmd_serve(args: argparse.Namespace) -> int:
    """Run the vLLM server in the foreground until Ctrl-C (130) or SIGTERM (143); 4 if it dies."""
    # What serve cannot do without comes first: the model (the GPU count may be detected).
    if args.model is None and not os.environ.get(Settings.variable("model"), "").strip():
        raise _unset(Settings.variable("model"), "the vLLM server needs a model")
    environ = _serve_environ(args)
    runtime = TrainingRuntime.from_settings(**_settings_from_args(args), environ=environ)
    topology = runtime.topology
    if topology.remote_host is not None:
        flag = (
            "--vllm-host" if args.vllm_host is not None else Settings.variable("vllm_remote_host")
        )
        raise ConfigError.invalid(
            flag, redact_text(topology.remote_host), "serve starts a local server"
        )
    if not topology.is_local_server:
        reason = (
            "serve needs a local server-mode topology: 2 or more GPUs, mode auto or server "
            "(or --dedicated on a node that only serves)"
        )
        settings = Settings.from_environ()
        if args.mode is not None:
            raise ConfigError.invalid("--mode", args.mode, reason)
        if settings.mode == "colocate":
            raise ConfigError.invalid(Settings.variable("mode"), "colocate", reason)
        if args.gpus is not None:
            raise ConfigError.invalid("--gpus", args.gpus, reason)
        if settings.gpu_count is not None:
            raise ConfigError.invalid(Settings.variable("gpu_count"), settings.gpu_count, reason)
        count = topology.gpu_count
        raise _unset(Settings.variable("gpu_count"), f"{count} GPU(s) detected, but {reason}")
    public = _public_address(topology.host)
    if public is not None:
        log.warning(
            "the vLLM server binds %s port %d: its API has no authentication, so anyone who "
            "can reach it can generate and change its weights; keep it on a private network",
            f"[{topology.host}]" if ":" in topology.host else topology.host,
            topology.port,
        )
    with runtime as session:
        server = session.server
        _announce_ready(args, runtime, session.server_url, public)
        # Ends only by the server dying: SIGTERM raises SystemExit(143) from the one policy
        # and Ctrl-C KeyboardInterrupt, both unwinding the runtime, which stops the server.
        _wait_while(lambda: server is not None and server.running and not sigterm_pending())
        _exit_if_sigterm_was_lost()
        tail = "" if server is None else server.log_tail()
        log.error("the vLLM server exited on its own\n%s", tail.rstrip())
        return EXIT_VLLM


def _announce_ready(
    args: argparse.Namespace, runtime: TrainingRuntime, url: str | None, public: str | None
) -> None:
    """Print serve's ready line(s); with ``--json``, one document on one line (for ``head -1``)."""
    topology = runtime.topology
    lines = [f"vLLM server ready at {url} ({topology.describe()})"]
    ready: dict[str, object] = {"ready": True, "server_url": url, "topology": topology.describe()}
    if public is not None:
        lines.append(
            f"trainers on other nodes: --vllm-host {public} --vllm-port {topology.port} "
            f"(http://{url_host(public)}:{topology.port})"
        )
        ready["vllm_host"], ready["vllm_port"] = public, topology.port
    if args.json:
        _emit_json(args, ready, indent=None, final=False)  # a signal ends the server after it
    else:
        STDOUT.write(_for_stdout("\n".join(lines) + "\n"))


def _public_address(host: str) -> str | None:
    """The address other machines reach a server bound to ``host`` at; None for loopback."""
    bare = host.strip("[]")
    if bare.lower() == "localhost":
        return None
    try:
        address = ipaddress.ip_address(bare)
    except ValueError:
        return host  # a host name: what the user chose to bind is what others use
    if address.is_loopback:
        return None
    if address.is_unspecified:  # 0.0.0.0 or ::, every interface: this machine's name
        return socket.gethostname()
    return bare


_COLOCATE_UNUSED = ("vllm_port", "vllm_command", "vllm_args", "vllm_log_dir",
                    "vllm_startup_timeout", "vllm_unresponsive_timeout")  # fmt: skip
_REMOTE_UNUSED = ("vllm_command", "vllm_args", "vllm_log_dir", "vllm_gpus")


def _training_environment(
    runtime: TrainingRuntime,
    resume: str | None,
    url: str | None,
    flags: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """What the command runs with: the caller's environment, with this run's values on top.

    Every variable launch exports describes this run: one the layout does not
    use (``VERIRL_VLLM_URL`` and the server's settings in colocate mode, how
    to start a server when it runs elsewhere or runs already) is removed, and
    one a flag overrode (``flags``: `_flag_variables`) holds the flag's value,
    never passed on stale from the caller's environment. The server launch
    started is, to the command, a remote one (``VERIRL_VLLM_HOST``): a
    ``TrainingRuntime.from_settings()`` there plans the same run.
    """
    from verirl.server.process import MARKER_VAR  # noqa: PLC0415 - psutil only once launch runs

    env = {**os.environ, **(flags or {})}
    env.pop(MARKER_VAR, None)  # a server's mark: on the command, launch would never signal it
    topology = runtime.topology
    unused: tuple[str, ...] = _REMOTE_UNUSED if topology.mode == "server" else ()
    if topology.mode == "colocate":
        unused = _COLOCATE_UNUSED
    for field in unused:  # settings of a server this layout never starts here, or started
        env.pop(Settings.variable(field), None)
    if topology.mode == "server" and topology.remote_host is None and url is not None:
        # The server runs: to the command it is a remote one. A from_settings() there (each
        # rank of a torchrun under launch) attaches to it, never plans another on its GPUs.
        host = urllib.parse.urlsplit(url).hostname
        if host:
            env[Settings.variable("vllm_remote_host")] = host
            env[Settings.variable("vllm_port")] = str(topology.port)
    if Settings.variable("max_model_len") in env:  # the length used: colocate caps it
        env[Settings.variable("max_model_len")] = str(topology.max_model_len)
    if topology.remote_host is None:  # vLLM is elsewhere: the GPUs are the launcher's to hand out
        env["CUDA_VISIBLE_DEVICES"] = map_visible_devices(
            topology.training_devices, env.get("CUDA_VISIBLE_DEVICES")
        )
        if Settings.variable("gpu_count") in env:  # the GPUs the command sees, not the machine's
            env[Settings.variable("gpu_count")] = str(len(topology.training_devices))
    env[RESUME_ENV_VAR] = resume or ""
    env[GRPO_KWARGS_VARIABLE] = json.dumps(topology.grpo_kwargs(), sort_keys=True)
    if url is not None:
        env[VLLM_URL_VARIABLE] = url
    else:  # colocate: no server, so no URL (a caller's would point at another job's)
        env.pop(VLLM_URL_VARIABLE, None)
    return env


def _launch_grace(args: argparse.Namespace) -> float:
    """``--shutdown-timeout``, else ``VERIRL_SHUTDOWN_TIMEOUT``, else `LAUNCH_GRACE`."""
    if args.shutdown_timeout is not None:
        return check_seconds("--shutdown-timeout", args.shutdown_timeout)
    raw = os.environ.get(SHUTDOWN_TIMEOUT_VARIABLE, "")
    if not raw.strip():
        return LAUNCH_GRACE
    return parse_seconds(SHUTDOWN_TIMEOUT_VARIABLE, raw)


def _launch_prechecks(args: argparse.Namespace) -> None:
    """The checks launch makes before it plans (doctor makes them too): variables, flags.

    A flag doctor was given (``--vllm-port``) that launch would refuse as unused
    by the layout is refused here as well.
    """
    _launch_grace(args)
    _vllm_args(args)
    _refuse_unused(args)


def cmd_launch(args: argparse.Namespace) -> int:
    """The whole lifecycle around a training command."""
    command = list(args.command)
    if command[:1] == ["--"]:
        command = command[1:]
    if not command:
        raise ConfigError.invalid("COMMAND", command, "give the training command after --")
    shown = redact_argv(command, secrets=secrets_in_environ(os.environ))  # never its secrets
    if any("\x00" in arg for arg in command):
        raise ConfigError.invalid("COMMAND", shown, "must not contain a null byte")
    if not command[0]:
        raise ConfigError.invalid("COMMAND", shown, "its program name must not be empty")
    grace = _launch_grace(args)
    _refuse_unused(args)
    from verirl._supervise import mark_this_launch, run_command  # noqa: PLC0415 - psutil

    mark_this_launch()  # the vLLM server started here is known as this launch's
    given = _settings_from_args(args)  # split and checked once, for the runtime and the command
    runtime = TrainingRuntime.from_settings(**given)
    with runtime as session:
        env = _training_environment(
            runtime,
            session.resume_from_checkpoint,
            session.server_url,
            _flag_variables(args, given),
        )
        visible = env.get("CUDA_VISIBLE_DEVICES")
        gpus = f"GPUs {visible or '-'}"
        if runtime.topology.remote_host is not None:
            gpus = f"the GPUs as launched (CUDA_VISIBLE_DEVICES={visible or 'unset'})"
        log.info(
            "running %s on %s (resume: %s)",
            printable(shlex.join(shown)),
            gpus,
            session.resume_from_checkpoint or "fresh start",
        )
        _exit_if_sigterm_was_lost()  # never start the command after a SIGTERM
        # The watchdog's VLLMServerExited interrupts this: the command gets SIGTERM, then exit 4.
        # Once the command has ended or is being stopped, a server dying fails nothing.
        code = run_command(
            command,
            env,
            grace,
            ending=runtime.stop_watchdog,
            cannot_run=lambda why: setattr(args, "final_message", why),
        )
        runtime.stop_watchdog()  # the command has ended: a server dying now fails nothing
    log.info("training command exited with %d; everything torn down", code)
    return code


def _settings_but_refused() -> tuple[Settings, list[ConfigError]]:
    """The settings of the variables, those refused left out; and the refusals, in order."""
    environ = dict(os.environ)
    refused: list[ConfigError] = []
    while True:
        try:
            return Settings.from_environ(environ), refused
        except ConfigError as exc:  # noqa: PERF203 - one variable at a time, each named
            if exc.field not in environ:
                raise
            refused.append(exc)
            del environ[exc.field]


def cmd_doctor(args: argparse.Namespace) -> int:
    """A table of what this machine has for a GRPO job; non-zero when something is not usable.

    3: the env server it checks is not healthy; else 4: no vLLM server can start
    here (no launch possible, or its port in use); else 2: launch would refuse
    the settings; else 5: launch would find no checkpoint (``latest`` with no
    source); else 1 (torch fails to load, the Hub token cannot be looked up).
    """
    # A variable launch would refuse is a problem of the table (launch's exit 2), not the end of
    # it: the env server and the rest are still checked, the table read without that variable.
    settings, refused = _settings_but_refused()
    vllm_port = settings.vllm_port or defaults.VLLM_PORT
    if args.vllm_port is not None:
        vllm_port = check_port("--vllm-port", args.vllm_port)
    from_flag = args.env_url is not None
    env_url = args.env_url if from_flag else settings.env_url
    probe = None
    if env_url is not None:
        try:
            probe = HttpEnvServerProbe(env_url, request_timeout=2.0)
        except ConfigError as exc:
            if from_flag:  # the flag is doctor's own input: a usage error
                raise exc.renamed("--env-url") from exc
            refused.append(exc.renamed(Settings.variable("env_url")))  # launch's, one problem
    from verirl._doctor import examine  # noqa: PLC0415 - loads what it reports on

    # launch with no flags but the ones doctor shares with it (its checks, its words)
    as_launch = build_parser().parse_args(["launch", "--", "true"])
    as_launch.vllm_port, as_launch.env_url = args.vllm_port, args.env_url
    as_launch.cmd, as_launch.json = args.cmd, args.json

    rows, problems = examine(
        vllm_port=vllm_port,
        probe=probe,
        hub_token=settings.hub_token,
        vllm_command=settings.vllm_command,
        vllm_remote_host=settings.vllm_remote_host,
        # in the words of a launch given no flags, after launch's own checks of the variables
        explain=functools.partial(_in_cli_words, as_launch),
        precheck=functools.partial(_launch_prechecks, as_launch),
        given={  # launch --vllm-port P --env-url U
            **({} if args.vllm_port is None else {"vllm_port": vllm_port}),
            **({"env_url": env_url} if from_flag else {}),
        },
        refusals=refused,
    )
    width = max(len(name) for name, _ in rows)
    text = "\n".join(f"{name.ljust(width)}  {value}" for name, value in rows)
    data: dict[str, object] = dict(rows)
    code = problems[0][0] if problems else EXIT_OK
    if problems:
        data.update(_error_document(code, "; ".join(what for _, what in problems)))
    _emit(args, data, text)
    for _, what in problems:  # a preflight: what is not usable, and the code it ends with
        log.error("not usable: %s", what)
    return code


# -- parser and entry point


_PARSE_OUTPUT: contextvars.ContextVar[list[tuple[str, str]] | None] = contextvars.ContextVar(
    "verirl_parse_output", default=None
)
"""While `main` parses: what the parser would print, (text, "stdout"|"stderr"|"version")."""

_EXPECTED_ONE = re.compile(r"argument (-\S+?)(?:/\S+)?: expected one argument")


class _Store(argparse._StoreAction):  # noqa: SLF001 - argparse's own "store", with a record
    """argparse's ``store`` that notes a flag given again (`_REPEATED`): the last one counts."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        given: set[str] = namespace.__dict__.setdefault(_GIVEN, set())
        if self.dest in given and option_string is not None:
            repeated: list[str] = namespace.__dict__.setdefault(_REPEATED, [])
            name = self.option_strings[-1]
            if name not in repeated:
                repeated.append(name)
        given.add(self.dest)
        super().__call__(parser, namespace, values, option_string)


_GIVEN = "given_flags"
"""The namespace's record of the flags that stored a value, by dest."""

_REPEATED = "repeated_flags"
"""The namespace's list of the flags given more than once (each by its long name)."""


class _Parser(argparse.ArgumentParser):
    """argparse with a one-line usage error (exit 2): ``verirl plan: error: argument --gpus: …``.

    What it prints goes through the command line's channels (a closed or
    abandoned stdout/stderr fails nothing), or to `main`, which turns it into
    the one JSON document with ``--json``. A flag given twice keeps argparse's
    rule (the last one counts: a wrapper's defaults, then the user's), but is
    noted for a warning (`_warn_repeated`).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:  # noqa: ANN401 - argparse's own
        super().__init__(*args, **kwargs)
        self.register("action", None, _Store)  # argument groups share this registry
        self.register("action", "store", _Store)

    def error(self, message: str) -> NoReturn:
        # It quotes what was typed: --api-key=V, a URL's password, a name that is not UTF-8.
        # Captured, the message is hidden whole later, once the run's secrets are known
        # (`_hidden`): redacted here first, a key like 'ab:KEY@host' would show as '***@host'.
        message = escape_bytes(message)
        if _PARSE_OUTPUT.get() is None:
            message = redact_message(message)
        match = _EXPECTED_ONE.fullmatch(message)
        if match:  # the value started with "-", so argparse took it for a flag
            message += f" (a value that starts with '-' goes after '=': {match[1]}=VALUE)"
        self.exit(EXIT_CONFIG, f"{self.prog}: error: {message} (see {self.prog} --help)\n")

    def exit(self, status: int = 0, message: str | None = None) -> NoReturn:
        if message:
            self._out(message, "stderr")
        raise SystemExit(status)

    def print_help(self, file: object = None) -> None:  # noqa: ARG002 - always stdout
        self._out(self.format_help(), "stdout")

    def print_usage(self, file: object = None) -> None:  # noqa: ARG002 - always stdout
        self._out(self.format_usage(), "stdout")

    def _print_message(self, message: str, file: object = None) -> None:
        if message:
            self._out(message, "stdout" if file is not None and file is sys.stdout else "stderr")

    @staticmethod
    def _out(text: str, channel: str) -> None:
        captured = _PARSE_OUTPUT.get()
        if captured is not None:
            captured.append((text, channel))
        else:
            (STDERR if channel == "stderr" else STDOUT).write(text)


class _Version(argparse.Action):
    """``--version``: the version on stdout (with ``--json``: ``{"version": …}``), exit 0."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS,
                 default: str = argparse.SUPPRESS, help: str | None = None) -> None:  # noqa: A002  # fmt: skip
        super().__init__(option_strings, dest, nargs=0, default=default, help=help)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,  # noqa: ARG002
                 values: object, option_string: str | None = None) -> None:  # noqa: ARG002  # fmt: skip
        _Parser._out(f"verirl {__version__}\n", "version")  # noqa: SLF001
        parser.exit()


EPILOG = """\
Exit codes:
  0    success                    3    env server never healthy
  1    any other verirl error     4    vLLM server failed (serve: it died)
  2    bad usage or configuration 5    checkpoint not found or unreadable
  130  Ctrl-C (SIGINT)            143  SIGTERM, whenever it arrives
  launch: its command's code (127: cannot run it; 128+N: killed by signal N);
  SIGTERM/Ctrl-C is passed on once to the command's process group (which cannot
  read the terminal's stdin); SIGKILL after --shutdown-timeout or a 2nd Ctrl-C;
  4 if the vLLM server died while it ran (the command got SIGTERM the same way).
  doctor: 3 env server not healthy, 4 no vLLM server can start here,
  2 launch could not plan the job, 5 no checkpoint it would resume, 1 other.

-v/-q/--json go before or after COMMAND. A setting not given as a flag comes
from its VERIRL_* variable (named in the command's --help)."""


def _add_output_args(parser: argparse.ArgumentParser, prefix: str = "") -> None:
    """-v/-q/--json; the top-level parser stores them under other names (they add up)."""
    parser.add_argument(
        "-v", "--verbose", action="count", default=0, dest=f"{prefix}verbose",
        help="more log output (debug)",
    )  # fmt: skip
    parser.add_argument(
        "-q", "--quiet", action="count", default=0, dest=f"{prefix}quiet",
        help="less log output (-q: warnings, -qq: errors only; -v and -q cancel out)",
    )  # fmt: skip
    parser.add_argument(
        "--json", action="store_true", dest=f"{prefix}json",
        help="machine-readable output on stdout",
    )  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    """The argument parser for ``verirl`` and its commands."""
    common = _Parser(add_help=False)
    _add_output_args(common)

    parser = _Parser(
        prog="verirl",
        description="Start, resume and tear down GRPO jobs (TRL + vLLM + a reward env server).",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action=_Version, help="print the version and exit")
    _add_output_args(parser, "top_")
    sub = parser.add_subparsers(dest="cmd", required=True, metavar="COMMAND")

    def add(
        name: str, func: Callable[[argparse.Namespace], int], help_text: str
    ) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text, description=help_text, parents=[common])
        p.set_defaults(func=func)
        return p

    p = add("plan", cmd_plan, "Show the GPU topology and GRPOConfig kwargs.")
    _add_topology_args(p)
    p.add_argument("--model", help="also print the vLLM server's flags for this model")

    p = add("wait-env", cmd_wait_env, "Wait until the env server answers healthy.")
    p.add_argument("url", help="env server base URL, e.g. http://127.0.0.1:8000")
    p.add_argument("--timeout", type=_ascii_seconds, default=300.0, help="seconds (default: 300)")
    p.add_argument("--health-path", default="/health", help="default: /health")

    p = add("resume", cmd_resume, "Print the checkpoint to resume from (empty: fresh start).")
    _add_checkpoint_args(p)

    p = add("serve", cmd_serve, "Run the vLLM server your TRL expects until Ctrl-C/SIGTERM.")
    _add_topology_args(p)
    _add_server_args(p)
    group = p.add_argument_group("serving node")
    group.add_argument(
        "--host",
        help="address to bind (default: 127.0.0.1); another address, e.g. 0.0.0.0, lets "
        "other machines in, with a warning: vLLM's API has no authentication",
    )
    group.add_argument(
        "--dedicated",
        action="store_true",
        default=None,
        help="this node only serves: vLLM takes every GPU (or --vllm-gpus of them), "
        "nothing trains here (the vLLM node of a multi-node job)",
    )
    group.add_argument(
        "--tensor-parallel-size", type=_ascii_int,
        help="vLLM's tensor parallel size (default: vLLM GPUs / data parallel size)",
    )  # fmt: skip
    group.add_argument(
        "--data-parallel-size", type=_ascii_int,
        help="vLLM's data parallel size: engine replicas (default: 1)",
    )  # fmt: skip

    p = add("launch", cmd_launch, "Run the whole start-up, then COMMAND, then tear down.")
    _add_topology_args(p)
    _add_server_args(p)
    _add_checkpoint_args(p)
    _add_setting(p, "env_url")
    _add_setting(p, "env_timeout", type=_ascii_seconds)
    p.add_argument(
        "--shutdown-timeout",
        type=_ascii_seconds,
        help="on SIGTERM/Ctrl-C, seconds the command gets to exit after the signal is "
        "passed on (once, to its process group), before SIGKILL; a Ctrl-C after it SIGKILLs "
        f"at once (${SHUTDOWN_TIMEOUT_VARIABLE}; default: {LAUNCH_GRACE:g}, "
        "under the 30 s Kubernetes and Modal give)",
    )
    _add_setting(p, "vllm_unresponsive_timeout", type=_ascii_seconds)
    p.add_argument("command", nargs=argparse.REMAINDER, metavar="-- COMMAND ...")

    p = add("doctor", cmd_doctor, "Show what this machine has for a GRPO job.")
    _add_setting(p, "env_url", lead="env server to check")
    _add_setting(p, "vllm_port", lead="vLLM port to check", type=_ascii_int)
    return parser


_RUN_SECRETS: list[str] = []
"""This run's secrets a message may quote unnamed (`known_secrets`: ``HF_TOKEN``, ``*_API_KEY``
values, the saved Hub token), read once when the command line starts (`_configure_logging`)."""


def _hidden(text: str) -> str:
    """``text`` as the command line shows it, with what it may quote of a credential hidden.

    Credentials it names (`redact_message`), and this run's secrets
    (`_RUN_SECRETS`: in a URL the user built with one).
    """
    return redact_and_scrub(text, _RUN_SECRETS, HIDDEN)


def _for_stdout(text: str) -> str:
    """``text`` for stdout: this run's secrets (`_RUN_SECRETS`) hidden, nothing else changed.

    Not `_hidden`'s patterns: programs read stdout (``$(verirl resume)``), and
    a path that only looks like ``token=…`` must come out as it is. A saved
    Hub login in a URL the user built with it is hidden here as on stderr.
    """
    return scrub_all(text, _RUN_SECRETS, HIDDEN)


def _document_for_stdout(data: object) -> object:
    """``data`` with `_for_stdout` applied to every text in it, keys included."""
    if isinstance(data, str):
        return _for_stdout(data)
    if isinstance(data, dict):
        return {_document_for_stdout(k): _document_for_stdout(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [_document_for_stdout(item) for item in data]
    return data


def _read_run_secrets() -> None:
    """Fill `_RUN_SECRETS` (once a run: before anything is shown)."""
    try:
        _RUN_SECRETS[:] = known_secrets()
    except Exception:  # noqa: BLE001 - reading them must never stop the command line
        _RUN_SECRETS[:] = secrets_in_environ(os.environ)


class _StderrHandler(logging.Handler):
    """Log lines to stderr through `STDERR`: a closed or abandoned stderr fails nothing.

    A credential a line quotes is hidden (`_hidden`), whichever module logged it.
    """

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = _hidden(escape_bytes(self.format(record)))
        except Exception:  # noqa: BLE001 - logging's own contract: never raise from emit
            self.handleError(record)
            return
        STDERR.write(text + "\n")


def _configure_logging(verbosity: int) -> Callable[[], None]:
    """Send verirl's logs to stderr; return a function that undoes it."""
    level = {-1: logging.WARNING, 0: logging.INFO}.get(verbosity, logging.DEBUG)
    if verbosity < -1:
        level = logging.ERROR
    _read_run_secrets()
    handler = _StderrHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger("verirl")
    saved = (root.handlers[:], root.level, root.propagate)
    root.handlers[:] = [handler]
    root.setLevel(level)
    root.propagate = False

    def restore() -> None:
        root.handlers[:], root.level, root.propagate = saved

    return restore


@contextlib.contextmanager
def _owning_sigterm() -> Iterator[None]:
    """Hold the one SIGTERM policy for a command that tears down (serve, launch).

    ``verirl`` is the program here, not a library inside one: a Python-level
    handler inherited from the interpreter's start-up (``verirl.__main__``'s,
    or coverage's) is set aside while the command runs, so SIGTERM always tears
    down and exits 143, and put back afterwards. The swaps go from one handler
    to the other, never through the default, so no SIGTERM ever finds none
    (the policy is counted first, the inherited handler comes back first). An
    inherited ``SIG_IGN`` is kept (the parent meant it).
    """
    previous = signal.getsignal(signal.SIGTERM)
    on_main = threading.current_thread() is threading.main_thread()
    set_aside = on_main and callable(previous) and previous != SIGTERM_POLICY.handle
    if set_aside:
        log.debug("setting SIGTERM handler %r aside while the command runs", previous)
    with exit_on_sigterm():  # over a handler, counted without installing anything
        if set_aside:
            signal.signal(signal.SIGTERM, SIGTERM_POLICY.handle)
        try:
            _exit_if_sigterm_was_lost()  # e.g. while verirl was importing
            yield
        finally:
            if set_aside:
                signal.signal(signal.SIGTERM, previous)


def _in_cli_words(args: argparse.Namespace, exc: VeriRLError) -> str:
    """``exc`` as `main` reports it: flags and variables, not the library's fields."""
    if isinstance(exc, ConfigError):
        exc = _flag_error(args, exc)
    return _message(args, exc)


def _message(args: argparse.Namespace, exc: VeriRLError) -> str:
    """The one line reported for ``exc``: in the command line's words (flags, variables)."""
    message = str(exc)
    # The library's hints name keyword arguments; here they are flags and variables.
    # serve has no colocate mode: its node trains nothing only with --dedicated
    layout = "--dedicated (a node that only serves)" if args.cmd == "serve" else "--mode colocate"
    message = message.replace(COMMAND_HINT, CLI_COMMAND_HINT).replace(
        "use mode='colocate'", f"use {layout}"
    )
    message = message.replace(
        "pass token= instead", "set HF_TOKEN instead (or log in with hf auth login)"
    )
    message = message.replace(
        "(give an output directory or a Hub repo)", f"(configure one with {_CONFIGURE_A_SOURCE})"
    )
    # The Hub download folder's errors say what it was made from (`_download_folder_error`)
    for library in ("under output_dir=", "(no output_dir given)", "separate output_dir per"):
        message = message.replace(library, library.replace("output_dir", "--output-dir"))
    if isinstance(exc, VLLMServerError) and message.startswith("command="):
        source = "--vllm-command" if getattr(args, "vllm_command", None) is not None else None
        source = source or Settings.variable("vllm_command")
        message = source + message.removeprefix("command")  # the program could not be run
    if message.endswith("set MASTER_PORT or the server's port to another"):
        variable = Settings.variable("vllm_port")
        given = getattr(args, "vllm_port", None) is None and os.environ.get(variable, "").strip()
        port = variable if given else "--vllm-port"
        advice = f"or {port} to another"
        if "is TRL's" in message:  # the group port: no setting of verirl's moves it
            advice = "to another"
        message = message.removesuffix("or the server's port to another") + advice
    if isinstance(exc, PortInUseError) and message.startswith(f"port={exc.port}"):
        message = _port_source(args, exc.port) + message.removeprefix(f"port={exc.port}")
    if isinstance(exc, (CheckpointNotFoundError, CheckpointSourceError)):
        source = _resume_source(args)  # the request is quoted as shown (a URL's password hidden)
        if source is not None:
            message = _ASKED.sub(f"checkpoint for {source}=", message, count=1)
    if isinstance(exc, CheckpointNotFoundError) and not exc.searched:
        message += f"; configure one with {_CONFIGURE_A_SOURCE}, or resume from a path"
    return message


_ASKED = re.compile(r"(?<=^no )checkpoint for (?=['\"])|(?<=^no complete )checkpoint for (?=['\"])")
"""Where a checkpoint error quotes the request (`CheckpointNotFoundError`, the sources' errors)."""


def _resume_source(args: argparse.Namespace) -> str | None:
    """Where the checkpoint asked for came from: ``--resume``, else its variable, else None."""
    if getattr(args, "resume", None) is not None:
        return "--resume"
    if RESUME_ENV_VAR in os.environ:
        return RESUME_ENV_VAR
    return None


def _port_source(args: argparse.Namespace, port: int) -> str:
    """Where the vLLM port came from, as the user gave it: the flag, the variable, the default."""
    variable = Settings.variable("vllm_port")
    if getattr(args, "vllm_port", None) is not None:
        return f"--vllm-port={port}"
    if os.environ.get(variable, "").strip():
        return f"{variable}={port}"
    return f"the vLLM port {port} (the default; choose another with --vllm-port or {variable})"


_CONFIGURE_A_SOURCE = (
    "--output-dir/VERIRL_OUTPUT_DIR (local checkpoints) or --hub-repo/VERIRL_HUB_REPO_ID"
)


def _join_dash_values(argv: Sequence[str]) -> list[str]:
    """``--vllm-args --enforce-eager`` as ``--vllm-args=--enforce-eager`` (before any ``--``).

    argparse takes a value that starts with ``-`` for a flag; the values of
    ``--vllm-args`` are flags by nature.
    """
    joined: list[str] = []
    index = 0
    while index < len(argv):
        arg = argv[index]
        if arg == "--":
            joined += argv[index:]
            break
        following = argv[index + 1] if index + 1 < len(argv) else None
        if (
            arg == "--vllm-args"
            and following is not None
            and following.startswith("-")
            and following != "--"  # the command's separator: the value was forgotten
        ):
            joined.append(f"{arg}={following}")
            index += 2
            continue
        joined.append(arg)
        index += 1
    return joined


def _refuse_a_split_vllm_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """``--vllm-args --dtype float32 -- COMMAND``: a usage error, not ``float32 -- COMMAND`` run.

    ``--vllm-args`` takes one value; the words after it (its value's other
    words, or verirl's own flags) up to the ``--`` were taken for the command,
    run after the whole server start-up, and the server failed first (exit 4).
    So a value of one word that is a flag (``--vllm-args --dtype`` or
    ``--vllm-args=--dtype``), with a command that does not start at the ``--``
    but holds one, is that mistake, or a command given without ``--``: either
    way ``--`` just before the command says which. A value of several words
    was given whole: the words after it are the command. (A secret's flag
    alone: `_refuse_a_lone_secret_flag`.) Nothing given is echoed but through
    `redact_argv`.
    """
    command = getattr(args, "command", None) or []
    flag = str(getattr(args, "vllm_args", None) or "").strip()
    if not flag.startswith("-") or any(char.isspace() for char in flag):
        return  # none, or given whole
    target = _subcommand_parser(parser, args.cmd)
    if not command or command[0] == "--" or "--" not in command:
        return
    words = command[: command.index("--")]
    own = next(
        (i for i, word in enumerate(words) if _option(target, word.partition("=")[0]) is not None),
        len(words),
    )
    try:
        line = shlex.join([*shlex.split(flag), *words[:own]])
        example = shlex.quote(redact_argv([line])[0])  # the line's secrets hidden in it
    except ValueError:  # an unbalanced quote: no example that a shell would give back as it is
        example = "'...'"
    theirs = f" with verirl's own {shown_line(words[own:])} before it" if own < len(words) else ""
    target.error(
        "argument --vllm-args: it takes one value, and the words after it, before '--', "
        "would be taken for the command: put '--' just before the command; if those words are "
        f"the server's, give its whole value in one word, --vllm-args={printable(example)}"
        f"{theirs}"
    )


def _refuse_a_lone_secret_flag(parser: argparse.ArgumentParser, argv: Sequence[str]) -> None:
    """``--vllm-args --api-key KEY``: a usage error before the parse, the key never shown.

    ``--vllm-args`` takes one value; a secret's flag alone there, or last in it
    (``--vllm-args='--enforce-eager --api-key' KEY``), left its value to the
    next word: launch's command (its program), or, for serve, an
    "unrecognized argument" that argparse's error quoted. However spelled
    (``=`` or not, abbreviated), before the command's ``--``. Nothing of the
    value is shown but that flag's name.
    """
    target = _subcommand_parser(parser, command_word(argv))
    given = [(arg, next_word, rest) for arg, found, next_word, rest in _own_flags(parser, argv)
             if found is not None and found.dest == "vllm_args"]  # fmt: skip
    for arg, next_word, rest in given[-1:]:  # argparse keeps the last one only
        flag = _last_secret_flag(arg.partition("=")[2] if "=" in arg else next_word or "")
        if flag is not None and _first_loose_word(parser, target, rest) is not None:
            shown = printable(flag)  # quoted: the redaction of the message keeps its next word
            target.error(
                f"argument --vllm-args: its last flag, '{shown}', takes a value, and the word "
                "after it (or after the verirl flags that follow it) would be taken for another "
                "argument: give the flag and its value in "
                f"the one --vllm-args value, as in --vllm-args='{shown} VALUE' (a flag that "
                "takes none: put '--' just before the command)"
            )


def _first_loose_word(
    parser: argparse.ArgumentParser, target: argparse.ArgumentParser, words: Sequence[str]
) -> str | None:
    """The first of ``words`` that is neither verirl's flag nor such a flag's value.

    ``None`` when ``--`` or the end comes first. Such a word after a lone
    secret's flag is where its value went (``--vllm-args=--hf-token -v KEY``:
    KEY would be the command), whatever verirl flags stand between.
    """
    index = 0
    while index < len(words):
        word = words[index]
        index += 1
        if word == "--":
            return None
        if not _is_a_flag_of(parser, target, word):
            return word
        name, equals, _ = word.partition("=")
        found = _option(target, name) or _option(parser, name)
        if found is not None and found.nargs != 0 and not equals:
            index += 1  # its value, whatever it looks like
    return None


def _is_a_flag_of(
    parser: argparse.ArgumentParser, target: argparse.ArgumentParser, word: str
) -> bool:
    """Whether ``word`` is ``--`` or one of verirl's own flags (``-vv`` too), not a value.

    A key may start with ``-``: anything else is a word the user gave.
    """
    if word == "--":
        return True
    name = word.partition("=")[0]
    if name.startswith("--"):
        return (_option(target, name) or _option(parser, name)) is not None
    letters = name[1:]
    short = _short_letters(parser, target)
    return name.startswith("-") and bool(letters) and all(c in short for c in letters)


def _short_letters(parser: argparse.ArgumentParser, target: argparse.ArgumentParser) -> set[str]:
    """The letters of verirl's one-letter flags (``v`` of ``-v``), the subcommand's too."""
    return {
        name[1]
        for p in (target, parser)
        for name in p._option_string_actions  # noqa: SLF001 - argparse keeps them only here
        if name[:1] == "-" and name[1:2] not in {"", "-"} and not name[2:]
    }


def _last_secret_flag(value: str) -> str | None:
    """``value``'s last word if it is a secret's flag with no value of its own, else ``None``.

    Split as the server's arguments are; ``--api-key`` and ``--api-key=`` alike.
    (A value with no ``-`` holds no flag: not split, which takes long on a long one.)
    """
    if "-" not in value:
        return None
    try:
        words = shlex.split(value)
    except ValueError:  # an unbalanced quote: the words as written, their quotes let go
        words = [bare for word in value.split() if (bare := word.strip("'\"\\"))]
    flag, _, given = (words[-1] if words else "").partition("=")
    return flag if flag.startswith("-") and not given and _hides_its_value(flag) else None


def _hides_its_value(flag: str) -> bool:
    """Whether ``flag`` holds a secret: `redact_argv` hides the word after it."""
    probe = [flag, "verirl-probe-value"]
    return redact_argv(probe) != probe


def _refuse_dashes_as_a_value(parser: argparse.ArgumentParser, argv: Sequence[str]) -> None:
    """``--flag=--`` (before the command's ``--``) is a usage error naming the flag.

    argparse drops a ``--`` from an option's values, so the flag got an empty
    list where a string or a number belongs: a traceback, or a value of ``[]``
    shown to the user, or a flag silently ignored.
    """
    target = _subcommand_parser(parser, command_word(argv))
    for arg, found, _, _ in _own_flags(parser, argv):
        flag, equals, value = arg.partition("=")
        takes_one = found is not None and found.nargs != 0
        if flag.startswith("--") and equals and value == "--" and takes_one:  # not the command's
            target.error(f"argument {flag}: expected one argument, not '--'")


def _own_flags(
    parser: argparse.ArgumentParser, argv: Sequence[str]
) -> Iterator[tuple[str, argparse.Action | None, str | None, Sequence[str]]]:
    """Each flag-like word of ``argv`` before the training command, with what surrounds it.

    The word, verirl's action for it (``None``: not verirl's), its value given
    as the next word (``None``: with ``=``, none, or not verirl's), and the
    words after all that. The walk stops at ``--`` and
    where the training command begins (its first word after the subcommand's);
    a value is stepped over, whatever it looks like.
    """
    command = command_word(argv)
    target = _subcommand_parser(parser, command)
    takes_a_command = any(a.nargs == argparse.REMAINDER for a in target._actions)  # noqa: SLF001
    seen_command_word = False
    index = 0
    while index < len(argv):
        arg = argv[index]
        index += 1
        if arg == "--":
            return
        if not arg.startswith("-"):
            if seen_command_word and takes_a_command:
                return  # the training command begins: what follows is its own
            seen_command_word = seen_command_word or arg == command
            continue
        name, equals, _ = arg.partition("=")
        found = _option(target, name) or _option(parser, name)
        value = None
        if found is not None and found.nargs != 0 and not equals:
            value = argv[index] if index < len(argv) else None
            index += 1  # its value, whatever it looks like
        yield arg, found, value, argv[index:]


def _subcommand_parser(
    parser: argparse.ArgumentParser, command: str | None
) -> argparse.ArgumentParser:
    """The parser of ``command`` (``parser`` itself for ``None`` or an unknown one)."""
    for action in parser._actions:  # noqa: SLF001 - argparse keeps its subparsers only here
        if isinstance(action, argparse._SubParsersAction) and command is not None:  # noqa: SLF001
            found = action.choices.get(command)
            if isinstance(found, argparse.ArgumentParser):
                return found
    return parser


def _warn_repeated(args: argparse.Namespace) -> None:
    """A WARNING for each flag given more than once (never its values: one may be a secret)."""
    for flag in getattr(args, _REPEATED, ()):
        hint = " (put every vLLM flag in one --vllm-args='...')" if flag == "--vllm-args" else ""
        log.warning("%s was given more than once: only the last one counts%s", flag, hint)


def _parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """``parser.parse_args(argv)``; help, version and usage errors printed, then `SystemExit`.

    With ``--json``, what they print becomes the run's one JSON document:
    ``{"help": TEXT}``, ``{"version": V}`` or the error document (exit 2).
    """
    captured: list[tuple[str, str]] = []
    token = _PARSE_OUTPUT.set(captured)
    try:
        _refuse_a_lone_secret_flag(parser, argv)
        try:
            _refuse_dashes_as_a_value(parser, argv)
            args = parser.parse_args(argv)
        except SystemExit as first:
            joined = _join_dash_values(argv)
            if first.code != EXIT_CONFIG or joined == argv:
                raise
            captured.clear()
            args = parser.parse_args(joined)
        _refuse_a_split_vllm_args(parser, args)
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else EXIT_ERROR
        launch = command_word(argv) == "launch"
        json_wanted = wants_json(argv, takes_value=functools.partial(_takes_value, parser))
        _print_parse_output(
            captured,
            code,
            json_wanted=json_wanted,
            launch=launch,
            hidden=[*_after_secret_flags(parser, argv), *_taken_by_redaction(argv)],
        )
        raise SystemExit(code) from None
    finally:
        _PARSE_OUTPUT.reset(token)
    return args


def _takes_value(parser: argparse.ArgumentParser, command: str | None, option: str) -> bool:
    """Whether ``option`` of ``command`` (``None``: verirl's own, before it) takes a value."""
    found = _option(_subcommand_parser(parser, command), option)
    return found is not None and found.nargs != 0


def _option(target: argparse.ArgumentParser, option: str) -> argparse.Action | None:
    """``target``'s action for ``option``, spelled whole or as an abbreviation argparse takes."""
    options = target._option_string_actions  # noqa: SLF001 - argparse keeps them only here
    found = options.get(option)
    if found is None and option.startswith("--"):
        matches = {id(a): a for name, a in options.items() if name.startswith(option)}
        found = next(iter(matches.values())) if len(matches) == 1 else None
    return found


def _taken_by_redaction(argv: Sequence[str]) -> list[str]:
    """What `redact_argv` hides of ``argv``'s words (``curl -u u:KEY``), for a usage error.

    argparse quotes the words it refused as they are; the message's own rules
    see no tool there (``verirl plan curl -u u:KEY``: "unrecognized arguments").
    """
    taken: list[str] = []
    for word, shown in zip(argv, redact_argv(argv), strict=True):
        if word != shown:  # each part hidden on its own: what lies between them stays readable
            taken += _hidden_parts(word, shown) or [taken_out(word, shown)]
    return taken


def _hidden_parts(word: str, shown: str) -> list[str]:
    """The parts of ``word`` that `HIDDEN` replaced in ``shown``; [] when they cannot be told.

    What lies between the markers is found again in ``word``, in order (a line
    that redaction quoted anew may not be: then [] and the caller hides more).
    """
    segments = shown.split(HIDDEN)
    if not word.startswith(segments[0]) or not word.endswith(segments[-1]):
        return []
    parts: list[str] = []
    at, end = len(segments[0]), len(word) - len(segments[-1])
    for segment in segments[1:-1]:
        found = word.find(segment, at, end) if segment else at
        if found < 0:
            return []
        parts.append(word[at:found])
        at = found + len(segment)
    parts.append(word[at:end])
    return [part for part in parts if part]


def _after_secret_flags(parser: argparse.ArgumentParser, argv: Sequence[str]) -> list[str]:
    """The words of ``argv`` that may be a secret's value left on its own, to hide.

    After a word (or a ``--flag=`` value) whose last word is a secret's flag
    without its value (`_last_secret_flag`): every word but ``--`` and the
    names of verirl's own flags (``-vv`` too: `_is_a_flag_of`), which stay
    readable. Their values are hidden (``--tensor-parallel-size KEY``: vLLM
    has that flag too), given as the next word or after ``=`` (``-v=KEY``).
    A usage error may quote any of them (argparse's "unrecognized arguments:
    KEY", "invalid choice: 'KEY'"), however the mistake was spelled. A word
    that starts with one ``-`` is hidden with the tails argparse may quote of
    it (`_quotable_tails`: ``-vKEY``, "ignored explicit argument 'KEY'").
    """
    hidden: list[str] = []
    target = _subcommand_parser(parser, command_word(argv))
    letters = _short_letters(parser, target)
    for index, arg in enumerate(argv):
        value = arg.partition("=")[2] if arg.startswith("--") and "=" in arg else arg
        if _last_secret_flag(value) is None and _last_secret_flag(arg) is None:
            continue
        for word in argv[index + 1 :]:
            if _is_a_flag_of(parser, target, word):  # "--" too, whose value is ""
                name, _, value = word.partition("=")
                if name.startswith("--"):
                    hidden.append(value)
                else:  # '-v=hf_KEY': argparse may take '-h' with 'f_KEY'
                    hidden.extend(_quotable_tails(value, letters))
                continue
            hidden.append(word)
            if word.startswith("-") and not word.startswith("--"):
                hidden.extend(_quotable_tails(word[1:], letters))
        break  # every later word is walked: a later secret's flag adds nothing
    return hidden


def _quotable_tails(text: str, letters: set[str]) -> list[str]:
    """The tails of ``text`` argparse may quote after a short flag, ``text`` itself first.

    It takes each leading letter that is a short flag of verirl's (``-vq…``)
    and quotes what follows where that run ends ("ignored explicit argument
    'KEY'"): the tails about there and after the first few letters; never
    every tail, which would hide the endings of ordinary words and cost time
    in the value's length squared.
    """
    run = 0
    while run < len(text) and text[run] in letters:
        run += 1
    starts = {*range(min(run, 8)), run - 1, run, run + 1}
    return [text[start:] for start in sorted(starts) if 0 <= start < len(text)]


_SEE_HELP = re.compile(r" \(see verirl(?: [a-z-]+)? --help\)\n\Z")
"""The hint `_Parser.error` ends a usage error with."""


def _print_parse_output(
    captured: list[tuple[str, str]],
    code: int,
    *,
    json_wanted: bool,
    launch: bool = False,
    hidden: Sequence[str] = (),
) -> None:
    _read_run_secrets()
    _RUN_SECRETS.extend(word for word in hidden if word.strip() and word != "--")
    errors = "".join(text for text, channel in captured if channel == "stderr")
    hint = _SEE_HELP.search(errors)  # ours: no value of a flag the message ends with
    errors = _hidden(errors[: hint.start()]) + hint[0] if hint else _hidden(errors)
    if errors:
        STDERR.write(errors)
    out = _for_stdout("".join(text for text, channel in captured if channel != "stderr"))
    if not json_wanted:
        if out:
            STDOUT.write(out)
        return
    document: dict[str, object]
    if code != EXIT_OK:
        document = _error_document(code, errors.strip() or "usage error")
        if launch:  # launch's documents always carry its exit code
            document["exit_code"] = code
    elif any(channel == "version" for _, channel in captured):
        document = {"version": __version__}
    else:
        document = {"help": out}
    write_document(document)


def _final_document(args: argparse.Namespace, code: int, message: str) -> None:
    """The ``--json`` document of a run that printed none yet (`_emit_json` keeps it to one)."""
    if code == EXIT_OK:
        _emit_json(args, {"exit_code": code})
        return
    document = _error_document(code, message or signal_message(code))
    _emit_json(args, {"exit_code": code, **document} if args.cmd == "launch" else document)


SIGNALLED = (128 + signal.SIGINT, 128 + signal.SIGTERM)
"""The exit codes of a run a signal ended."""


def _signal_said(args: argparse.Namespace, code: int) -> str:
    """The line a signal that ended the run is said in on stderr ("" if none: not one).

    serve and launch said what they got and did about it, as they went.
    """
    if code not in SIGNALLED or args.cmd in {"serve", "launch"}:
        return ""
    message = signal_message(code)
    log.error("%s", message)
    return message


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the process exit code.

    ``--help``, ``--version`` and a usage error raise `SystemExit` (as argparse
    does) after printing. With ``--json``, stdout carries exactly one JSON
    document on every path: the command's result, or
    ``{"error": {"code": N, "message": M}}`` (``launch``: ``{"exit_code": N}``,
    with the error when N is not 0, and its command's stdout sent to stderr).
    """
    parser = build_parser()
    args = _parse(parser, list(sys.argv[1:] if argv is None else argv))
    # -v/-q/--json before the command count as much as after it.
    args.verbose += args.top_verbose
    args.quiet += args.top_quiet
    args.json = args.json or args.top_json
    decide_json(args.json)
    args.json_emitted = False
    restore_logging = _configure_logging(args.verbose - args.quiet)
    _warn_repeated(args)
    in_user_words = _InUserWords(args)
    logging.getLogger("verirl.topology").addFilter(in_user_words)
    message = ""
    try:
        try:
            with contextlib.ExitStack() as stack:
                if args.cmd in ("serve", "launch"):
                    stack.enter_context(_owning_sigterm())
                if args.cmd == "launch":  # the command must not fail on a pipe nobody reads
                    stack.enter_context(abandoned_pipes_to_devnull())
                if args.cmd == "launch" and args.json:  # the command's output is not the document
                    stack.enter_context(stdout_to_stderr())
                code: int = args.func(args)
        except VeriRLError as exc:
            message = _in_cli_words(args, exc)
            log.error("%s", message)  # noqa: TRY400 - the message, not a traceback
            code = _exit_code(exc)
        except KeyboardInterrupt:
            code = 130
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else EXIT_ERROR
        except Exception as exc:
            if args.json:  # a bug: its traceback follows on stderr, the document comes first
                _emit_json(args, _error_document(EXIT_ERROR, f"unexpected {type(exc).__name__}"))
            raise
        message = message or _signal_said(args, code)
        if args.json:
            _final_document(args, code, message or getattr(args, "final_message", ""))
    finally:
        logging.getLogger("verirl.topology").removeFilter(in_user_words)
        restore_logging()
    return code

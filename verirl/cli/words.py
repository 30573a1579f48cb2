"""Errors and log lines in the user's words: the flag or variable a value came from.

Also the refusals of flags the layout would ignore, or that tune a part the
job does not have.
"""

from __future__ import annotations

import argparse
import logging
import os
import re

from verirl._fs import printable, quoted
from verirl._hidden import HIDDEN
from verirl._hub_token import hub_token_in_use
from verirl._secrets import redact_text, scrub, shown_command
from verirl._settings import Settings
from verirl.checkpoints import RESUME_ENV_VAR
from verirl.cli.flags import _FLAGS, _REQUIRED, _flag, _unset, _variable_of
from verirl.errors import (
    CheckpointNotFoundError,
    CheckpointSourceError,
    ConfigError,
    PortInUseError,
    VeriRLError,
    VLLMServerError,
)
from verirl.runtime import topology_from_settings
from verirl.server.launch import CLI_COMMAND_HINT, COMMAND_HINT
from verirl.topology import VLLMTopology


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

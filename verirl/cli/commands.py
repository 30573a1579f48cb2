"""The ``verirl`` commands: plan, wait-env, resume, serve, launch, doctor."""

from __future__ import annotations

import argparse
import contextlib
import functools
import ipaddress
import json
import logging
import os
import shlex
import signal
import socket
import threading
import urllib.parse
from collections.abc import Callable, Iterator, Mapping

from verirl import _defaults as defaults
from verirl._cli_output import STDOUT
from verirl._fs import printable
from verirl._net import url_host
from verirl._secrets import redact_argv, redact_text, secrets_in_environ
from verirl._settings import Read, Settings
from verirl._signals import SIGTERM_POLICY, exit_on_sigterm, sigterm_pending
from verirl._validate import check_port, check_seconds, parse_seconds
from verirl.checkpoints import RESUME_ENV_VAR
from verirl.cli.codes import (
    _POLL_INTERVAL,
    EXIT_ENV_SERVER,
    EXIT_OK,
    EXIT_VLLM,
    GRPO_KWARGS_VARIABLE,
    LAUNCH_GRACE,
    SHUTDOWN_TIMEOUT_VARIABLE,
    VLLM_URL_VARIABLE,
)
from verirl.cli.flags import _flag_variables, _settings_from_args, _unset, _vllm_args
from verirl.cli.output import _emit, _emit_json, _error_document, _for_stdout
from verirl.cli.words import _in_cli_words, _plan, _refuse_unused
from verirl.envserver import HttpEnvServerProbe
from verirl.errors import ConfigError, EnvServerUnavailable
from verirl.runtime import TrainingRuntime, resolver_from_settings
from verirl.server.child_env import map_visible_devices

__all__ = ["cmd_doctor", "cmd_launch", "cmd_plan", "cmd_resume", "cmd_serve", "cmd_wait_env"]

log = logging.getLogger("verirl")


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
    if topology.is_local_server and args.model is not None:
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
    # read as from_settings reads it: the flag checked by the variable's rule
    given = {"resume_from": args.resume}
    request = Read(Settings.from_environ(), given, os.environ).text("resume_from")
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
               "hub_revision", "resume_from", "checkpoint_wait_timeout",
               "vllm_failure_grace")  # fmt: skip
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
        settings = Settings.from_environ(environ)  # what serve reads, as from_settings did
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
    from verirl.cli.parser import build_parser  # noqa: PLC0415 - the parser runs the commands

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

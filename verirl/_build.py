"""The job's components built from its settings: the plan, the checkpoint sources, the server.

What `TrainingRuntime.from_settings`, `topology_from_settings` and
`resolver_from_settings` share: each value read once (an argument over its
variable, or the typed `Settings`), every error named by the setting it came
from (`verirl._settings.Read`).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from verirl import _defaults as defaults
from verirl._fs import quoted
from verirl._gpus import check_visible_gpus, detect_gpu_count
from verirl._hidden import HIDDEN
from verirl._hub_token import implicit_hub_token, tokens_to_hide
from verirl._secrets import scrub_config_error, scrub_exception, shown_command
from verirl._settings import Read, Settings, command_problem
from verirl._this_host import _check_env_url_port, check_master_port
from verirl._validate import (
    MAX_GPUS,
    MAX_LENGTH,
    MAX_PORT,
    check_environ,
    check_seconds,
)
from verirl.checkpoints import (
    AUTO,
    CheckpointResolver,
    CheckpointSource,
    HubCheckpointSource,
    LocalCheckpointSource,
)
from verirl.checkpoints.download_dir import FolderName
from verirl.checkpoints.model import resume_request
from verirl.checkpoints.node_share import (
    CheckpointResolving,
)
from verirl.checkpoints.resolver import NO_SOURCE_FOR_AUTO
from verirl.distenv import DistributedEnv, avoided_ports
from verirl.envserver import HttpEnvServerProbe
from verirl.errors import (
    ConfigError,
)
from verirl.server.fields import to_extra_args
from verirl.server.handle import ServerFactory, ServerHandle
from verirl.server.watchdog import (
    UNRESPONSIVE_TIMEOUT,
)
from verirl.topology import MODES, VLLMTopology

__all__ = [
    "HUB_DOWNLOAD_FOLDER",
    "resolver_from_settings",
    "runtime_arguments",
    "token_hidden",
    "topology_from_settings",
]


HUB_DOWNLOAD_FOLDER = "_verirl-hub-download"
"""Where, in the output directory, a Hub checkpoint is downloaded to.

The leading ``_``: Trainer's Hub pushes upload ``output_dir`` except ``_*`` and
``checkpoint-*``, so a resumed job does not push the copy it downloaded back.
"""


def _default_server_factory(
    model: str | None,
    *,
    command: Sequence[str] | None = None,
    extra_args: Sequence[str] = (),
    log_dir: str | None = None,
    model_field: str = "model",
    startup_timeout: float | None = None,
    shutdown_timeout: float | None = None,
) -> ServerFactory:
    """`VLLMServer.from_topology`, with each of the other arguments that is given."""

    def build(topology: VLLMTopology) -> ServerHandle:
        if model is None:
            raise ConfigError.invalid(model_field, model, "is required to start a vLLM server")
        overrides: dict[str, object] = {}
        if command is not None:
            overrides["command"] = command
        if extra_args:
            overrides["extra_args"] = tuple(extra_args)
        if log_dir is not None:  # a folder that must exist at start: never made, never a file
            overrides["log_dir"] = log_dir
        if startup_timeout is not None:
            overrides["startup_timeout"] = startup_timeout
        if shutdown_timeout is not None:
            overrides["shutdown_timeout"] = shutdown_timeout
        from verirl.vllm_server import VLLMServer  # noqa: PLC0415 - psutil and requests, when used

        return VLLMServer.from_topology(topology, model=model, **overrides)

    return build


_PLAN_FIELDS = {"gpu_count": "gpu_count", "max_model_len": "max_model_len", "mode": "mode",
                "vllm_gpus": "vllm_gpus", "tensor_parallel_size": "vllm_gpus",
                "port": "vllm_port", "remote_host": "vllm_remote_host"}  # fmt: skip


# Arguments of from_settings with no variable (a serving node's choices, made explicitly).
_SERVING = {"host": "vllm_bind_host",
            "tensor_parallel_size": "vllm_tensor_parallel_size",
            "data_parallel_size": "vllm_data_parallel_size",
            "dedicated": "vllm_dedicated"}  # fmt: skip


def _plan(read: Read) -> VLLMTopology:
    count = read.integer("gpu_count", MAX_GPUS)
    length = read.integer("max_model_len", MAX_LENGTH) or defaults.MAX_MODEL_LEN
    gpus = read.integer("vllm_gpus", MAX_GPUS)
    port = read.integer("vllm_port", MAX_PORT) or defaults.VLLM_PORT
    mode = read.text("mode") or defaults.MODE
    remote = read.text("vllm_remote_host")
    if mode not in MODES:
        raise ConfigError.invalid("mode", mode, f"must be one of {', '.join(MODES)}")
    if count is None:
        count = detect_gpu_count(environ=read.environ)
        if count < 1:
            visible = read.environ.get("CUDA_VISIBLE_DEVICES")
            where = f"CUDA_VISIBLE_DEVICES={quoted(visible)}" if visible is not None else "torch"
            raise read.unset_gpu_count(f"no GPU was detected ({where}); set it")
    else:  # given: never a plan for GPUs that CUDA_VISIBLE_DEVICES hides
        check_visible_gpus(count, read.environ, field=read.name("gpu_count") or "gpu_count")
    given = {key: name for key, name in _SERVING.items() if read.given.get(name) is not None}
    serving = {key: read.given[name] for key, name in given.items()}
    try:
        with read.naming({**_PLAN_FIELDS, **given}):
            return VLLMTopology.plan(
                count, max_model_len=length, mode=mode, vllm_gpus=gpus, port=port,
                remote_host=remote, **serving,  # type: ignore[arg-type]
            )  # fmt: skip
    except ConfigError as exc:
        if exc.field == "gpu_count" and read.name("gpu_count") is None:  # detected
            reason = (exc.reason or str(exc)) + _inherited(read, "VERIRL_GPU_COUNT")
            raise read.unset_gpu_count(reason, count) from exc
        alone = {"vllm_remote_host", "vllm_port", "max_model_len"}
        named = {read.name(field) for field in alone} | alone | {"remote_host", "port", "host"}
        if exc.field in named | {"vllm_bind_host"}:
            raise  # about this one value (its form, a reserved port): nothing else weighed in
        note = _inherited(read, exc.field)
        if not note:
            raise
        extended = None if exc.reason is None else exc.reason + note
        raise ConfigError(
            f"{exc}{note}", field=exc.field, value=exc.value, reason=extended
        ) from exc


def _inherited(read: Read, named: str | None) -> str:
    """The plan's other values that came from variables, for an error about a combination.

    The error names one setting; the others it was weighed against may come
    from the environment, where the user would not look for them.
    """
    fields = ("gpu_count", "vllm_gpus", "mode", "max_model_len", "vllm_port", "vllm_remote_host")
    inherited = [
        f"{variable}={quoted(getattr(read.settings, field))}"
        for field in fields
        if (variable := read.name(field)) not in (None, field, named)
    ]
    return f" (from the environment: {', '.join(inherited)})" if inherited else ""


def topology_from_settings(
    settings: Settings | None = None,
    /,
    *,
    gpu_count: int | None = None,
    max_model_len: int | None = None,
    mode: str | None = None,
    vllm_gpus: int | None = None,
    vllm_port: int | None = None,
    vllm_remote_host: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> VLLMTopology:
    """The `VLLMTopology` of `TrainingRuntime.from_settings`, and nothing else.

    ``settings``, the arguments and ``environ`` as there; the fields of
    ``settings`` that do not plan the topology are not looked at.
    """
    given = {"gpu_count": gpu_count, "max_model_len": max_model_len, "mode": mode,
             "vllm_gpus": vllm_gpus, "vllm_port": vllm_port,
             "vllm_remote_host": vllm_remote_host}  # fmt: skip
    with token_hidden(settings, given, environ):
        return _plan(_read(settings, given, environ))


def _read(
    settings: Settings | None, given: Mapping[str, object], environ: Mapping[str, str] | None
) -> Read:
    """The values to build from: the arguments over the variables, or the typed settings.

    With ``settings``, its values join the arguments and no variable is read
    (a value is named by its field); a setting given both ways is refused,
    since which one was meant cannot be known.
    """
    env = os.environ if environ is None else check_environ(environ)
    if settings is None:
        return Read(Settings.from_environ(env), given, env)
    given_settings: object = settings  # typed, but a caller's value
    if not isinstance(given_settings, Settings):
        reason = "must be a verirl.Settings (Settings.from_environ() reads one)"
        raise ConfigError.invalid("settings", type(given_settings).__name__, reason)
    merged = dict(given)
    for field in attrs.fields(Settings):
        value = getattr(settings, field.name)
        if value is None or field.name not in given:
            continue
        if given[field.name] is not None:
            reason = "is given both in settings and as an argument: give it once"
            raise Read(settings, given, env).refusal(field.name, given[field.name], reason)
        merged[field.name] = resume_request(value) if field.name == "resume_from" else value
    return Read(Settings(), merged, env, typed=True)


def _resolver(read: Read) -> CheckpointResolver:
    folder = read.text("output_dir")
    repo = read.text("hub_repo_id")
    sources: list[CheckpointSource] = []
    if folder is not None:
        with read.naming("output_dir"):
            sources.append(LocalCheckpointSource(folder))
    if repo is not None:
        # download_dir is a folder verirl made from output_dir: its errors say so (origin)
        fields = {"repo_id": "hub_repo_id", "token": "hub_token", "revision": "hub_revision",
                  "endpoint": "hub_endpoint"}  # fmt: skip
        token = read.text("hub_token")
        with read.naming(fields):
            hub = HubCheckpointSource(
                repo,
                download_dir=os.path.join(folder or ".", HUB_DOWNLOAD_FOLDER),  # noqa: PTH118
                download_dir_origin=_download_dir_origin(read, folder),
                token=token,
                revision=read.text("hub_revision"),
                endpoint=read.text("hub_endpoint"),
            )
        if not token:  # refused now, as HF_TOKEN is, not when the Hub is first asked
            implicit_hub_token()
        sources.append(hub)
    return CheckpointResolver(sources)


def _download_dir_origin(read: Read, folder: str | None) -> str:
    """What the Hub download folder was made from, in the words the caller used."""
    name = read.name("output_dir")
    if folder is None or name is None:
        return "in the current folder (no output_dir given)"
    return f"under {name}={quoted(folder)}"


def resolver_from_settings(
    settings: Settings | None = None,
    /,
    *,
    output_dir: str | None = None,
    hub_repo_id: str | None = None,
    hub_token: str | None = None,
    hub_endpoint: str | None = None,
    hub_revision: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> CheckpointResolver:
    """Local checkpoints in ``output_dir`` first, then the Hub repo (downloaded beside them).

    Reads ``VERIRL_OUTPUT_DIR``, ``VERIRL_HUB_REPO_ID``, ``HF_TOKEN``,
    ``VERIRL_HUB_ENDPOINT`` and ``VERIRL_HUB_REVISION`` for arguments left
    ``None``. With neither a folder nor a repo the resolver has no sources:
    explicit paths still work, ``"latest"`` finds nothing. With a repo and no
    token, the one huggingface_hub would send is checked here
    (`verirl._hub_token.implicit_hub_token`): a `ConfigError` naming where it is.
    ``settings`` as in `TrainingRuntime.from_settings`: then no variable is read.
    """
    given = {"output_dir": output_dir, "hub_repo_id": hub_repo_id, "hub_token": hub_token,
             "hub_endpoint": hub_endpoint, "hub_revision": hub_revision}  # fmt: skip
    with token_hidden(settings, given, environ):
        return _resolver(_read(settings, given, environ))


def _check_command(command: object) -> tuple[str, ...]:
    """An argv given as an argument, checked as VERIRL_VLLM_COMMAND's words are."""
    reason = "must be a sequence of strings (the argv)"
    if isinstance(command, (str, bytes)) or not isinstance(command, Sequence):
        raise ConfigError.invalid("vllm_command", shown_command(command), reason)
    argv = tuple(command)
    if not all(isinstance(arg, str) for arg in argv):
        raise ConfigError.invalid("vllm_command", shown_command(command), reason)
    problem = command_problem(argv)
    if problem is not None:
        raise ConfigError.invalid("vllm_command", shown_command(command), problem)
    return argv


def _check_args(args: object) -> tuple[str, ...]:
    if isinstance(args, (str, bytes)):
        raise ConfigError.invalid(
            "vllm_args", HIDDEN, "must be a sequence of strings, not one string"
        )
    if not isinstance(args, Sequence):
        raise ConfigError.invalid("vllm_args", type(args).__name__, "must be a sequence of strings")
    return tuple(args)


def _requested(request: str | None) -> bool:
    """Whether ``request`` asks for a checkpoint (``None`` and blank mean a fresh start)."""
    return request is not None and bool(request.strip())


def _download_dir(resolver: object) -> tuple[Path, FolderName] | None:
    """The first Hub-like source's ``download_dir``, where a node's ranks meet, and its name."""
    for source in getattr(resolver, "sources", ()):
        folder = getattr(source, "download_dir", None)
        if isinstance(folder, Path):
            name = getattr(source, "_folder_name", None)
            return folder, name if isinstance(name, FolderName) else FolderName()
    return None


def _is_auto(request: str | None) -> bool:
    return isinstance(request, str) and request.strip() == AUTO


def _has_sources(resolver: CheckpointResolving | None) -> bool:
    """Whether ``resolver`` may find something: a resolver of ours with no sources cannot."""
    if resolver is None:
        return False
    return not isinstance(resolver, CheckpointResolver) or bool(resolver.sources)


@contextlib.contextmanager
def token_hidden(
    settings: object, given: Mapping[str, object], environ: Mapping[str, str] | None
) -> Iterator[None]:
    """Every refusal while building scrubbed of the Hub token, wherever it stands.

    The token given (argument or typed field), the one ``HF_TOKEN`` gives in
    ``environ``, and the one huggingface_hub finds itself: a variable is read,
    and an argv or a timeout checked, apart from the token, and may show it (a
    proxy URL, a command word). The error's cause chain is scrubbed too, and the
    unscrubbed error is not kept as its context: a traceback shows neither.
    """
    try:
        yield
    except ConfigError as exc:
        failure = exc
    else:
        return
    given_token = given.get("hub_token") or getattr(settings, "hub_token", None)
    tokens = tokens_to_hide(os.environ if environ is None else environ, given_token)
    if not tokens:
        raise failure
    scrubbed = failure
    for token in tokens:  # longest first: a token inside a longer one leaves no tail
        scrubbed = scrub_config_error(scrubbed, token)
        scrub_exception(failure, token)  # its chain, shown under the new error
    raise scrubbed from failure.__cause__


def runtime_arguments(
    settings: Settings | None, given: Mapping[str, Any], environ: Mapping[str, str] | None
) -> tuple[VLLMTopology, dict[str, Any], dict[str, str]]:
    """`TrainingRuntime.from_settings`'s work: the topology and the runtime's other arguments.

    Also the names the runtime's start-time errors use for the settings they
    concern (a ``log_dir`` gone by ``start()`` is named as the user gave it).
    """
    with token_hidden(settings, given, environ):
        return _runtime_arguments(settings, given, environ)


def _runtime_arguments(
    settings: Settings | None, given: Mapping[str, Any], environ: Mapping[str, str] | None
) -> tuple[VLLMTopology, dict[str, Any], dict[str, str]]:
    read = _read(settings, given, environ)
    env = read.environ
    given = dict(read.given)  # with the settings' values
    topology = _plan(read)
    url = read.text("env_url")
    probe = None
    if url is not None:
        with read.naming({"url": "env_url"}):
            probe = HttpEnvServerProbe(url)
    command, args = _server_argv(read)
    log_dir = read.text("vllm_log_dir")
    if log_dir is not None and not os.path.isdir(log_dir):  # noqa: PTH112
        name = read.name("vllm_log_dir") or "vllm_log_dir"
        raise ConfigError.invalid(name, log_dir, "must be an existing directory")
    request = read.text("resume_from")
    resolver = _resolver(read)
    if _is_auto(request) and not resolver.sources:
        name = read.name("resume_from") or "resume_from"
        raise ConfigError.invalid(name, request, NO_SOURCE_FOR_AUTO)
    model = read.text("model")
    timeout = given["env_timeout"]
    if timeout is None:
        timeout = read.settings.env_timeout
    unresponsive = given["vllm_unresponsive_timeout"]
    if unresponsive is None:
        unresponsive = read.settings.vllm_unresponsive_timeout
    if given["vllm_startup_timeout"] is not None:
        startup = check_seconds(
            "vllm_startup_timeout", given["vllm_startup_timeout"], positive=True
        )
    else:
        startup = read.settings.vllm_startup_timeout or defaults.VLLM_STARTUP_TIMEOUT
    dist = DistributedEnv.single_node(environ=env, avoid_ports=avoided_ports(topology.port))
    check_master_port(topology, dist, read.name("vllm_port"))
    if url is not None:
        _check_env_url_port(topology, url, read.name("env_url") or "env_url")
    arguments: dict[str, Any] = {
        "model": model,
        "env_probe": probe,
        "checkpoints": resolver if resolver.sources or _requested(request) else None,
        "resume_from": request,
        "dist_env": dist,
        "server_factory": _default_server_factory(
            model,
            command=command,
            extra_args=args,
            log_dir=log_dir,
            model_field=read.name("model") or read.unset_name("model"),
            startup_timeout=startup,
            shutdown_timeout=_seconds(read, "vllm_shutdown_timeout"),
        ),
        "env_timeout": defaults.ENV_TIMEOUT if timeout is None else timeout,
        "remote_server_timeout": startup,
        "vllm_unresponsive_timeout": (
            UNRESPONSIVE_TIMEOUT if unresponsive is None else unresponsive
        ),
    }
    for field in ("vllm_failure_grace", "checkpoint_wait_timeout"):
        seconds = _seconds(read, field, positive=field == "checkpoint_wait_timeout")
        if seconds is not None:  # else the runtime's own default, the setting's
            arguments[field] = seconds
    start_names = (
        {} if log_dir is None else {"log_dir": read.name("vllm_log_dir") or "vllm_log_dir"}
    )
    return topology, arguments, start_names


def _seconds(read: Read, field: str, *, positive: bool = False) -> float | None:
    """A seconds setting: the argument, checked under its name, else the variable's value."""
    given = read.given.get(field)
    if given is None:
        return getattr(read.settings, field)  # type: ignore[no-any-return]
    return check_seconds(field, given, positive=positive)


def _server_argv(read: Read) -> tuple[tuple[str, ...] | None, tuple[str, ...]]:
    """The server's command and extra flags, each checked now, not at the server's start."""
    command = read.given["vllm_command"]
    command = read.settings.vllm_command if command is None else _check_command(command)
    args = read.given["vllm_args"]
    args = (read.settings.vllm_args or ()) if args is None else _check_args(args)
    with read.naming({"extra_args": "vllm_args"}):
        try:
            to_extra_args(args)  # a flag verirl sets itself (--port), a null byte
        except ConfigError as exc:  # errors never echo the server flags (an --api-key)
            field, reason = exc.field or "extra_args", exc.reason or "is refused"
            raise ConfigError.invalid(field, HIDDEN, reason) from exc.__cause__
    return command, args

"""`TrainingRuntime`: every start-up phase of a GRPO job, in the right order, at once.

The old helper ran the phases one after another: wait for the env server,
then start vLLM, then download a checkpoint. Each takes tens of seconds to
minutes on a real job, so here they run concurrently and start-up takes about
as long as the slowest one. Any phase failing tears down what was started and
raises that phase's own error; leaving the ``with`` block stops the server.
"""

from __future__ import annotations

import logging
import os
import queue
import shlex
import threading
import time
import types
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from typing import Protocol, TypeVar, runtime_checkable

import attrs

from verirl._secrets import HIDDEN, redact_url
from verirl._signals import SIGTERM_POLICY
from verirl._validate import (
    MAX_GPUS,
    MAX_LENGTH,
    MAX_PORT,
    check_environ,
    check_int,
    check_seconds,
    check_text,
    has_control_chars,
    parse_int,
    parse_seconds,
)
from verirl.checkpoints import (
    RESUME_ENV_VAR,
    CheckpointResolver,
    CheckpointSource,
    HubCheckpointSource,
    LocalCheckpointSource,
)
from verirl.distenv import DistributedEnv
from verirl.envserver import EnvServerProbe, HttpEnvServerProbe
from verirl.errors import ConfigError, EnvServerUnavailable, VLLMServerUnavailable
from verirl.topology import MODES, VLLMTopology, detect_gpu_count
from verirl.vllm_server import VLLMServer

__all__ = [
    "CheckpointResolving",
    "PhaseTiming",
    "RuntimeSession",
    "ServerFactory",
    "ServerHandle",
    "TrainingRuntime",
    "resolver_from_settings",
    "topology_from_settings",
]

log = logging.getLogger(__name__)

_T = TypeVar("_T")


@runtime_checkable
class ServerHandle(Protocol):
    """What the runtime needs of a vLLM server: `verirl.VLLMServer` or `fakes.FakeVLLMServer`."""

    @property
    def base_url(self) -> str:
        """``http://host:port`` of the running server."""
        ...

    def start(self) -> None:
        """Launch and block until healthy; raise on failure, leaving nothing behind."""
        ...

    def stop(self) -> None:
        """Tear down; idempotent, and safe to call while `start` runs in another thread."""
        ...


ServerFactory = Callable[[VLLMTopology], ServerHandle]
"""Builds the server for a local server-mode topology."""


class CheckpointResolving(Protocol):
    """What the runtime needs of a `verirl.CheckpointResolver`."""

    def resolve(self, request: str | None) -> str | None:
        """The local path to resume from, or ``None`` for a fresh start."""
        ...


@attrs.frozen
class PhaseTiming:
    """When a start-up phase ran, in seconds since the runtime started."""

    name: str
    start: float
    end: float

    @property
    def duration(self) -> float:
        """Seconds the phase took."""
        return self.end - self.start


@attrs.frozen
class RuntimeSession:
    """Everything a training script needs once the runtime is up."""

    topology: VLLMTopology
    grpo_kwargs: Mapping[str, object]
    resume_from_checkpoint: str | None
    server: ServerHandle | None
    server_url: str | None
    dist_env: DistributedEnv
    timings: tuple[PhaseTiming, ...]
    total: float

    @property
    def training_devices(self) -> tuple[int, ...]:
        """GPU indices (as this process sees them) that training should use."""
        return self.topology.training_devices

    def timeline(self) -> str:
        """One line: each phase's window and the total, e.g. for logs."""
        parts = [f"{t.name} {t.start:.2f}-{t.end:.2f}s" for t in self.timings]
        return "start-up timeline: " + " · ".join([*parts, f"ready at {self.total:.2f}s"])


def _default_server_factory(
    model: str | None,
    *,
    command: Sequence[str] | None = None,
    extra_args: Sequence[str] = (),
    log_dir: str | None = None,
    model_field: str = "model",
) -> ServerFactory:
    """`VLLMServer.from_topology`, with ``command``, ``extra_args`` and ``log_dir`` when given."""

    def build(topology: VLLMTopology) -> ServerHandle:
        if model is None:
            raise ConfigError.invalid(model_field, model, "is required to start a vLLM server")
        overrides: dict[str, object] = {}
        if command is not None:
            overrides["command"] = command
        if extra_args:
            overrides["extra_args"] = tuple(extra_args)
        if log_dir is not None:
            overrides["log_path"] = log_dir
        return VLLMServer.from_topology(topology, model=model, **overrides)

    return build


_SECRET_VARIABLES = frozenset({"HF_TOKEN"})


@attrs.frozen
class _Settings:
    """Reads settings: an explicit argument wins, else its environment variable.

    A bad value read from a variable raises `ConfigError` naming the variable,
    so a user knows which one to fix; numbers must be written in ASCII digits.
    """

    environ: Mapping[str, str] = attrs.field(converter=check_environ)

    def raw(self, name: str) -> str | None:
        """The variable's value, ``None`` when unset; a non-string is a `ConfigError`."""
        if name not in self.environ:
            return None
        raw: object = self.environ[name]
        if not isinstance(raw, str):
            shown = "<hidden>" if name in _SECRET_VARIABLES else raw
            raise ConfigError.invalid(name, shown, "must be a string")
        return raw

    def text(
        self, value: str | os.PathLike[str] | None, name: str, field: str | None = None
    ) -> str | None:
        """``value`` if given (a string or path, named ``field`` if not), else the variable."""
        if value is not None:
            given: object = os.fspath(value) if isinstance(value, os.PathLike) else value
            if not isinstance(given, str):
                shown = "<hidden>" if name in _SECRET_VARIABLES else value
                arg = field or name.removeprefix("VERIRL_").lower()
                raise ConfigError.invalid(arg, shown, "must be a string")
            return given
        raw = (self.raw(name) or "").strip()
        if has_control_chars(raw):
            shown = "<hidden>" if name in _SECRET_VARIABLES else redact_url(raw)
            raise ConfigError.invalid(name, shown, "must not contain control characters")
        return raw or None

    def integer(
        self, value: int | None, name: str, minimum: int, maximum: int | None = None
    ) -> int | None:
        if value is not None:
            return check_int(name.removeprefix("VERIRL_").lower(), value, minimum, maximum)
        raw = self.raw(name)
        if raw is None or not raw.strip():
            return None
        return parse_int(name, raw, minimum, maximum)

    def seconds(self, value: float | None, name: str) -> float | None:
        if value is not None:
            return value
        raw = self.raw(name)
        if raw is None or not raw.strip():
            return None
        return parse_seconds(name, raw)

    def checked(self, value: object, name: str, field: str, build: Callable[[], _T]) -> _T:
        """``build()``; its `ConfigError` names ``field`` (an argument) or ``name`` (a variable)."""
        try:
            return build()
        except ConfigError as exc:
            raise exc.renamed(field if value is not None else name) from exc


def topology_from_settings(
    *,
    gpu_count: int | None = None,
    max_model_len: int | None = None,
    mode: str | None = None,
    vllm_gpus: int | None = None,
    vllm_port: int | None = None,
    vllm_remote_host: str | None = None,
    environ: Mapping[str, str] | None = None,
) -> VLLMTopology:
    """The `VLLMTopology` of `TrainingRuntime.from_settings`, and nothing else."""
    read = _Settings(os.environ if environ is None else environ)
    count = read.integer(gpu_count, "VERIRL_GPU_COUNT", 1, MAX_GPUS)
    if count is None:
        count = detect_gpu_count(environ=read.environ)
        if count < 1:
            visible = read.raw("CUDA_VISIBLE_DEVICES")
            where = f"CUDA_VISIBLE_DEVICES={visible!r}" if visible is not None else "torch"
            raise ConfigError.invalid(
                "VERIRL_GPU_COUNT", None, f"is unset and no GPU was detected ({where}); set it"
            )
    chosen_mode = read.text(mode, "VERIRL_VLLM_MODE", "mode") or "auto"
    length = read.integer(max_model_len, "VERIRL_MAX_MODEL_LEN", 1, MAX_LENGTH) or 8192
    gpus = read.integer(vllm_gpus, "VERIRL_VLLM_GPUS", 1, MAX_GPUS)
    port = read.integer(vllm_port, "VERIRL_VLLM_PORT", 1, MAX_PORT) or 8001
    remote = read.text(vllm_remote_host, "VERIRL_VLLM_HOST", "vllm_remote_host")
    if chosen_mode not in MODES:
        field = "mode" if mode is not None else "VERIRL_VLLM_MODE"
        raise ConfigError.invalid(field, chosen_mode, f"must be one of {', '.join(MODES)}")
    # A plan error names what the value came from: the argument or the variable.
    sources = {
        "gpu_count": (gpu_count, "gpu_count", "VERIRL_GPU_COUNT"),
        "max_model_len": (max_model_len, "max_model_len", "VERIRL_MAX_MODEL_LEN"),
        "mode": (mode, "mode", "VERIRL_VLLM_MODE"),
        "vllm_gpus": (vllm_gpus, "vllm_gpus", "VERIRL_VLLM_GPUS"),
        "tensor_parallel_size": (vllm_gpus, "vllm_gpus", "VERIRL_VLLM_GPUS"),  # derived
        "port": (vllm_port, "vllm_port", "VERIRL_VLLM_PORT"),
        "remote_host": (vllm_remote_host, "vllm_remote_host", "VERIRL_VLLM_HOST"),
    }
    try:
        return VLLMTopology.plan(
            count,
            max_model_len=length,
            mode=chosen_mode,
            vllm_gpus=gpus,
            port=port,
            remote_host=remote,
        )
    except ConfigError as exc:
        if exc.field not in sources:
            raise
        given, argument, name = sources[exc.field]
        if given is not None:
            raise exc.renamed(argument) from exc
        if read.raw(name) is not None:
            raise exc.renamed(name) from exc
        if exc.field == "gpu_count":  # detected
            reason = exc.reason or str(exc)
            raise ConfigError(
                f"VERIRL_GPU_COUNT=None (unset; {count} GPU(s) detected): {reason}",
                field="VERIRL_GPU_COUNT",
                value=None,
                reason=reason,
            ) from exc
        raise


def resolver_from_settings(
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
    explicit paths still work, ``"latest"`` finds nothing.
    """
    read = _Settings(os.environ if environ is None else environ)
    folder = read.text(output_dir, "VERIRL_OUTPUT_DIR")
    repo = read.text(hub_repo_id, "VERIRL_HUB_REPO_ID")
    sources: list[CheckpointSource] = []
    if folder is not None:
        try:
            sources.append(LocalCheckpointSource(folder))
        except ConfigError as exc:
            raise exc.renamed(
                "output_dir" if output_dir is not None else "VERIRL_OUTPUT_DIR"
            ) from exc
    if repo is not None:
        download_dir = os.path.join(folder or ".", "verirl-hub-download")  # noqa: PTH118
        token = read.text(hub_token, "HF_TOKEN", "hub_token")
        revision = read.text(hub_revision, "VERIRL_HUB_REVISION")
        endpoint = read.text(hub_endpoint, "VERIRL_HUB_ENDPOINT")
        try:
            hub = HubCheckpointSource(
                repo, download_dir=download_dir, token=token, revision=revision, endpoint=endpoint
            )
        except ConfigError as exc:
            given, argument, name = {
                "repo_id": (hub_repo_id, "hub_repo_id", "VERIRL_HUB_REPO_ID"),
                "token": (hub_token, "hub_token", "HF_TOKEN"),
                "revision": (hub_revision, "hub_revision", "VERIRL_HUB_REVISION"),
                "endpoint": (hub_endpoint, "hub_endpoint", "VERIRL_HUB_ENDPOINT"),
                "download_dir": (output_dir, "output_dir", "VERIRL_OUTPUT_DIR"),
            }.get(exc.field or "", (None, "", ""))
            if not name:
                raise
            raise exc.renamed(argument if given is not None else name) from exc
        sources.append(hub)
    return CheckpointResolver(sources)


@attrs.frozen
class _Outcome:
    name: str
    start: float
    end: float
    value: object = None
    error: BaseException | None = None


def split_command(field: str, command: str) -> list[str]:
    """``shlex.split(command)``; an unbalanced quote is a `ConfigError` naming ``field``."""
    try:
        argv = shlex.split(command)
    except ValueError as exc:
        raise ConfigError.invalid(field, command, f"cannot be split like a shell: {exc}") from None
    if any("\x00" in arg for arg in argv):
        raise ConfigError.invalid(field, command, "must not contain a null byte")
    return argv


def split_args(field: str, args: str) -> list[str]:
    """`split_command` for server flags, whose errors never show them (an ``--api-key``)."""
    try:
        return split_command(field, args)
    except ConfigError as exc:
        raise ConfigError.invalid(field, HIDDEN, exc.reason or "cannot be split") from None


def _check_command(command: object) -> list[str]:
    reason = "must be a non-empty sequence of strings (the argv)"
    if isinstance(command, (str, bytes)) or not isinstance(command, Sequence):
        raise ConfigError.invalid("vllm_command", command, reason)
    argv = list(command)
    if not argv or not all(isinstance(arg, str) and arg and "\x00" not in arg for arg in argv):
        raise ConfigError.invalid("vllm_command", command, reason)
    return argv


def _requested(request: str | None) -> bool:
    """Whether ``request`` asks for a checkpoint (``None`` and blank mean a fresh start)."""
    return request is not None and bool(request.strip())


@attrs.define
class TrainingRuntime:
    """The facade: distributed env, vLLM server, env-server wait and checkpoint, together.

    Assemble it from components (dependency injection: tests pass fakes) or
    with `from_settings`. ``with runtime as session:`` (or `start` / `stop`):

    1. applies the distributed env before anything can touch CUDA;
    2. starts the vLLM server when the topology is in local server mode and
       this is local rank 0; other local ranks, and remote topologies, wait
       for that server's health instead;
    3. at the same time waits for the env server and resolves (and fetches)
       the checkpoint to resume from;
    4. returns a `RuntimeSession` with the GRPO kwargs, the checkpoint path,
       the server handle and per-phase timings (also logged as one line).

    Any phase failing stops the server (if started) and raises that phase's
    error. From `start` to `stop` it holds the one SIGTERM policy
    (`verirl._signals`): started in the main thread with SIGTERM at its
    default, SIGTERM (what Modal and Kubernetes send on preemption) becomes
    `SystemExit(143)` once, so the ``with`` block unwinds and the server goes;
    a handler the program installed (a save-on-preemption callback) or
    ``SIG_IGN`` is kept and is what runs.
    """

    topology: VLLMTopology
    model: str | None = attrs.field(default=None, kw_only=True)
    env_probe: EnvServerProbe | None = attrs.field(default=None, kw_only=True)
    checkpoints: CheckpointResolving | None = attrs.field(default=None, kw_only=True)
    resume_from: str | None = attrs.field(default=None, kw_only=True)
    dist_env: DistributedEnv | None = attrs.field(default=None, kw_only=True)
    server_factory: ServerFactory | None = attrs.field(default=None, kw_only=True)
    env_timeout: float = attrs.field(default=600.0, kw_only=True)
    server_timeout: float = attrs.field(default=900.0, kw_only=True)
    environ: MutableMapping[str, str] | None = attrs.field(default=None, kw_only=True, repr=False)
    _server: ServerHandle | None = attrs.field(default=None, init=False, repr=False)
    _session: RuntimeSession | None = attrs.field(default=None, init=False, repr=False)
    _started: bool = attrs.field(default=False, init=False, repr=False)
    _holds_sigterm: bool = attrs.field(default=False, init=False, repr=False)

    def __attrs_post_init__(self) -> None:
        check_seconds("env_timeout", self.env_timeout)
        check_seconds("server_timeout", self.server_timeout, positive=True)
        if self.environ is not None:
            check_environ(self.environ, mutable=True)
        if self.model is not None:
            check_text("model", self.model, "a non-empty model id or path")
        if self.resume_from is not None and not isinstance(self.resume_from, str):
            raise ConfigError.invalid(
                "resume_from", self.resume_from, "must be a string ('latest' or a path) or None"
            )

    @classmethod
    def from_settings(
        cls,
        *,
        env_url: str | None = None,
        model: str | None = None,
        max_model_len: int | None = None,
        output_dir: str | None = None,
        hub_repo_id: str | None = None,
        hub_token: str | None = None,
        hub_endpoint: str | None = None,
        hub_revision: str | None = None,
        gpu_count: int | None = None,
        mode: str | None = None,
        vllm_gpus: int | None = None,
        vllm_port: int | None = None,
        vllm_remote_host: str | None = None,
        vllm_command: Sequence[str] | None = None,
        vllm_args: Sequence[str] | None = None,
        vllm_log_dir: str | None = None,
        resume_from: str | None = None,
        env_timeout: float | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> TrainingRuntime:
        """Build the real components from plain settings, falling back to environment variables.

        Each argument left ``None`` is read from its variable (see the README's
        table): ``VERIRL_ENV_SERVER_URL``, ``VERIRL_MODEL``,
        ``VERIRL_MAX_MODEL_LEN`` (default 8192), ``VERIRL_OUTPUT_DIR``,
        ``VERIRL_HUB_REPO_ID``, ``HF_TOKEN``, ``VERIRL_HUB_ENDPOINT``,
        ``VERIRL_HUB_REVISION``, ``VERIRL_GPU_COUNT`` (default: detected),
        ``VERIRL_VLLM_MODE``, ``VERIRL_VLLM_GPUS``, ``VERIRL_VLLM_PORT`` (8001),
        ``VERIRL_VLLM_HOST`` (a remote vLLM host), ``VERIRL_VLLM_COMMAND``,
        ``VERIRL_VLLM_ARGS`` (more server flags, split like a shell),
        ``VERIRL_VLLM_LOG_DIR`` (default: a new temporary folder),
        ``VERIRL_RESUME_FROM_CHECKPOINT`` and ``VERIRL_ENV_TIMEOUT`` (600).
        A bad value from a variable is a `ConfigError` naming the variable.
        """
        read = _Settings(os.environ if environ is None else environ)
        topology = topology_from_settings(
            gpu_count=gpu_count,
            max_model_len=max_model_len,
            mode=mode,
            vllm_gpus=vllm_gpus,
            vllm_port=vllm_port,
            vllm_remote_host=vllm_remote_host,
            environ=read.environ,
        )
        model_arg_given = model is not None
        model = read.text(model, "VERIRL_MODEL")
        url = read.text(env_url, "VERIRL_ENV_SERVER_URL", "env_url")
        probe = None
        if url is not None:
            probe = read.checked(
                env_url, "VERIRL_ENV_SERVER_URL", "env_url", lambda: HttpEnvServerProbe(url)
            )
        if vllm_command is None:
            raw_command = read.text(None, "VERIRL_VLLM_COMMAND")
            vllm_command = (
                split_command("VERIRL_VLLM_COMMAND", raw_command) if raw_command else None
            )
            if vllm_command is not None and not vllm_command:
                raise ConfigError.invalid("VERIRL_VLLM_COMMAND", raw_command, "must not be empty")
        else:
            vllm_command = _check_command(vllm_command)
        if vllm_args is None:
            raw_args = read.text(None, "VERIRL_VLLM_ARGS")
            vllm_args = split_args("VERIRL_VLLM_ARGS", raw_args) if raw_args else []
        elif isinstance(vllm_args, (str, bytes)):
            raise ConfigError.invalid(
                "vllm_args", HIDDEN, "must be a sequence of strings, not one string"
            )
        elif not isinstance(vllm_args, Sequence):
            raise ConfigError.invalid(
                "vllm_args", type(vllm_args).__name__, "must be a sequence of strings"
            )
        log_dir = read.text(vllm_log_dir, "VERIRL_VLLM_LOG_DIR")
        if log_dir is not None and not os.path.isdir(log_dir):  # noqa: PTH112
            field = "vllm_log_dir" if vllm_log_dir is not None else "VERIRL_VLLM_LOG_DIR"
            raise ConfigError.invalid(field, log_dir, "must be an existing directory")
        timeout = read.seconds(env_timeout, "VERIRL_ENV_TIMEOUT")
        request = read.text(resume_from, RESUME_ENV_VAR, "resume_from")
        resolver = resolver_from_settings(
            output_dir=output_dir,
            hub_repo_id=hub_repo_id,
            hub_token=hub_token,
            hub_endpoint=hub_endpoint,
            hub_revision=hub_revision,
            environ=read.environ,
        )
        return cls(
            topology,
            model=model,
            env_probe=probe,
            checkpoints=resolver if resolver.sources or _requested(request) else None,
            resume_from=request,
            server_factory=_default_server_factory(
                model,
                command=vllm_command,
                extra_args=vllm_args,
                log_dir=log_dir,
                model_field="model" if model_arg_given else "VERIRL_MODEL",
            ),
            env_timeout=600.0 if timeout is None else timeout,
        )

    @property
    def session(self) -> RuntimeSession | None:
        """The running session, or ``None`` before `start` / after `stop`."""
        return self._session

    @property
    def starts_server(self) -> bool:
        """Whether this process would launch the vLLM server (local server mode, local rank 0)."""
        dist = self.dist_env
        return self.topology.is_local_server and (dist is None or dist.is_local_main)

    def start(self) -> RuntimeSession:
        """Run every start-up phase; return the session or raise the first phase error."""
        if self._started:
            msg = "TrainingRuntime is already started; stop() it first"
            raise RuntimeError(msg)
        self._started = True
        origin = time.monotonic()
        environ = os.environ if self.environ is None else self.environ
        try:
            dist = self.dist_env or DistributedEnv.single_node(environ=environ)
            self.dist_env = dist
            dist.apply(environ)
        except BaseException:
            self._started = False
            raise
        dist_phase = PhaseTiming("dist-env", 0.0, time.monotonic() - origin)
        try:
            # Held from the main thread (where Python runs handlers) until stop(): the
            # phases, the server's start included, run on worker threads.
            self._holds_sigterm = SIGTERM_POLICY.acquire()
            outcomes = self._run_phases(origin)
        except BaseException:
            self.stop()
            raise
        resume = next((o.value for o in outcomes if o.name == "checkpoint"), None)
        server_url = self._server.base_url if self._server else self.topology.server_url
        session = RuntimeSession(
            topology=self.topology,
            grpo_kwargs=types.MappingProxyType(self.topology.grpo_kwargs()),
            resume_from_checkpoint=resume if isinstance(resume, str) else None,
            server=self._server,
            server_url=server_url,
            dist_env=dist,
            timings=(dist_phase, *(PhaseTiming(o.name, o.start, o.end) for o in outcomes)),
            total=time.monotonic() - origin,
        )
        self._session = session
        log.info("%s", session.timeline())
        return session

    def _phases(self) -> dict[str, Callable[[], object]]:
        phases: dict[str, Callable[[], object]] = {}
        topology = self.topology
        if self.starts_server:
            factory = self.server_factory or _default_server_factory(self.model)
            server = factory(topology)
            self._server = server
            log.info("starting vLLM server: %s", topology.describe())
            phases["vllm"] = server.start
        elif topology.mode == "server" and topology.server_url is not None:
            url = topology.server_url
            log.info("waiting for the vLLM server at %s (started elsewhere)", url)
            probe = HttpEnvServerProbe(url, health_path="/health")

            def wait_for_server() -> None:
                try:
                    probe.wait(self.server_timeout)
                except EnvServerUnavailable as exc:
                    raise VLLMServerUnavailable(exc.url, exc.elapsed, exc.last_error) from exc

            phases["vllm-wait"] = wait_for_server
        if self.env_probe is not None:
            env_probe = self.env_probe
            phases["env"] = lambda: env_probe.wait(self.env_timeout)
        if self.checkpoints is not None or _requested(self.resume_from):
            # A request is never dropped: without a resolver an explicit path is still
            # checked, and "latest" fails with "no sources configured".
            resolver = self.checkpoints or CheckpointResolver([])
            phases["checkpoint"] = lambda: resolver.resolve(self.resume_from)
        return phases

    def _run_phases(self, origin: float) -> list[_Outcome]:
        """Run the phases in threads; return their outcomes or raise the first failure."""
        phases = self._phases()
        done: queue.Queue[_Outcome] = queue.Queue()

        def run(name: str, job: Callable[[], object]) -> None:
            start = time.monotonic() - origin
            try:
                value = job()
            except BaseException as exc:  # noqa: BLE001 - handed to the main thread
                done.put(_Outcome(name, start, time.monotonic() - origin, error=exc))
            else:
                done.put(_Outcome(name, start, time.monotonic() - origin, value=value))

        threads = {
            name: threading.Thread(target=run, args=(name, job), name=f"verirl-{name}", daemon=True)
            for name, job in phases.items()
        }
        for thread in threads.values():
            thread.start()
        outcomes: list[_Outcome] = []
        try:
            while len(outcomes) < len(threads):
                outcome = done.get()
                if outcome.error is not None:
                    log.error("start-up phase %r failed: %s", outcome.name, outcome.error)
                    raise outcome.error  # noqa: TRY301 - re-raised in the caller thread as is
                log.info(
                    "start-up phase %r done in %.2fs", outcome.name, outcome.end - outcome.start
                )
                outcomes.append(outcome)
        except BaseException:
            self._abort_server(threads.get("vllm"))
            raise
        order = list(phases)
        return sorted(outcomes, key=lambda o: order.index(o.name))

    def _abort_server(self, thread: threading.Thread | None) -> None:
        """Stop a server whose start may still be running in ``thread``, and wait for it."""
        server = self._server
        if server is None or thread is None:
            return
        deadline = time.monotonic() + 30.0
        while thread.is_alive() and time.monotonic() < deadline:
            server.stop()  # makes a running start() fail fast; repeated in case it was early
            thread.join(timeout=0.5)
        server.stop()

    def stop(self) -> None:
        """Stop the server (if this runtime started one) and release the SIGTERM policy.

        Idempotent: the policy is released exactly once per `start`.
        """
        server, self._server = self._server, None
        self._session = None
        try:
            if server is not None:
                server.stop()
        finally:
            held, self._holds_sigterm = self._holds_sigterm, False
            self._started = False
            if held:
                SIGTERM_POLICY.release()

    def __enter__(self) -> RuntimeSession:
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

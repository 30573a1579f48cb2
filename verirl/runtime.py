"""`TrainingRuntime`: every start-up phase of a GRPO job, in the right order, at once.

The old helper ran the phases one after another: wait for the env server,
then start vLLM, then download a checkpoint. Each takes tens of seconds to
minutes on a real job, so here they run concurrently and start-up takes about
as long as the slowest one. Any phase failing tears down what was started and
raises that phase's own error; leaving the ``with`` block stops the server.
"""

from __future__ import annotations

import concurrent.futures
import logging
import os
import threading
import time
import types
import warnings
from collections.abc import Mapping, MutableMapping, Sequence
from typing import Any

import attrs

from verirl import _defaults as defaults
from verirl._build import (
    _default_server_factory,
    _download_dir,
    _has_sources,
    _is_auto,
    _requested,
    resolver_from_settings,
    runtime_arguments,
    token_hidden,
    topology_from_settings,
)
from verirl._gpus import check_visible_gpus
from verirl._phases import Phases, PhaseTiming
from verirl._settings import Settings
from verirl._signals import (
    SIGTERM_POLICY,
    interrupted_twice,
    must_not_raise,
    raise_interruption_behind,
)
from verirl._this_host import _check_env_url_port, check_master_port
from verirl._validate import (
    check_environ,
    check_seconds,
    check_text,
)
from verirl.checkpoints import (
    AUTO,
    CheckpointResolver,
)
from verirl.checkpoints.model import RESUME_KEYWORDS, resume_request
from verirl.checkpoints.node_share import (
    NODE_WAIT_TIMEOUT,
    CheckpointResolving,
    NodeSharedResolver,
    attempt_key,
)
from verirl.checkpoints.resolver import NO_SOURCE_FOR_AUTO
from verirl.distenv import DistributedEnv, avoided_ports
from verirl.envserver import EnvServerProbe, HttpEnvServerProbe
from verirl.errors import (
    CheckpointNotFoundError,
    ConfigError,
    EnvServerUnavailable,
    VeriRLError,
    VLLMServerError,
    VLLMServerUnavailable,
)
from verirl.server.child import set_death_signal
from verirl.server.handle import ServerFactory, ServerHandle, checked_handle
from verirl.server.watchdog import (
    SAVE_GRACE,
    UNRESPONSIVE_TIMEOUT,
    ServerWatchdog,
    interrupt_main,
)
from verirl.topology import VLLMTopology

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

_STOPPED_WHILE_STARTING = (
    "TrainingRuntime.stop() was called while it started; what it started is stopped"
)
START_CANCEL_TIMEOUT = 60.0
"""Seconds to wait for a server's `start` to return after `stop` cancelled it."""
VLLM_STARTUP_TIMEOUT = defaults.VLLM_STARTUP_TIMEOUT
"""Seconds a vLLM server may take to become healthy, by default (``vllm_startup_timeout``).

A first start downloads the weights, loads them onto the GPUs and captures
CUDA graphs: 600 s (`verirl.VLLMServer`'s own default) was too short for a 70B
model (`verirl._defaults`). It also bounds the wait for a server started elsewhere
(`TrainingRuntime.remote_server_timeout`: local rank 0's, or a vLLM node's),
which includes that server's own start.
"""
LAUNCHER_DEATH_SIGNAL = 9  # SIGKILL: a rank blocked in a collective never runs a Python handler
"""What a rank gets when its torchrun agent dies (`TrainingRuntime.die_with_launcher`)."""


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


def _die_with_parent() -> None:
    """Have the kernel SIGKILL this process when its parent (the launcher's agent) dies."""
    if set_death_signal(LAUNCHER_DEATH_SIGNAL):
        log.debug("this rank dies with its launcher (pid %d)", os.getppid())


@attrs.define(eq=False)
class _Teardown:
    """One `TrainingRuntime.stop`'s claim on the teardown: its thread, what it stops, its end.

    Made before the stop takes anything, and stored on the runtime in one
    statement: the ``finally`` that follows can then always tell whether this
    stop holds the teardown, wherever a signal's exception interrupted it.
    """

    thread: int
    server: ServerHandle | None = None
    watchdog: ServerWatchdog | None = None
    session: RuntimeSession | None = None
    ended: threading.Event = attrs.field(factory=threading.Event)
    stopped: bool = False
    """Set once the watchdog's stop, then the server's, returned."""
    torn_down: bool = False
    """Set as ``ended`` is: whether the server was stopped, or handed back to the runtime."""


def _wait_for(claim: _Teardown) -> None:
    """Wait for another thread's stop; a Ctrl-C here cuts its grace short, as it would there."""
    try:
        claim.ended.wait()  # as long as that stop: the server's own stop is bounded
    except BaseException as error:
        cut = getattr(claim.server, "cut_stop_short", None)
        if callable(cut):
            cut()
        raise_interruption_behind(error)  # Event.wait: where CPython can replace it
        raise


@attrs.define
class TrainingRuntime:
    """The facade: distributed env, vLLM server, env-server wait and checkpoint, together.

    Assemble it from components (dependency injection: tests pass fakes) or
    with `from_settings`. ``with runtime as session:`` (or `start` / `stop`):

    1. applies the distributed env before anything can touch CUDA;
    2. starts the vLLM server when the topology is in local server mode and
       this is local rank 0; other local ranks, and remote topologies, wait
       (up to ``remote_server_timeout`` seconds) for that server's health instead;
    3. at the same time waits for the env server and resolves (and fetches)
       the checkpoint to resume from;
    4. returns a `RuntimeSession` with the GRPO kwargs, the checkpoint path,
       the server handle and per-phase timings (also logged as one line).

    Under a launcher with several ranks per node (``LOCAL_WORLD_SIZE`` > 1),
    node-wide work is done once per node, by local rank 0: it alone waits for
    the env server (the others meet it at the trainer's first collective), and
    with a Hub source it alone resolves and downloads the checkpoint, while
    the other local ranks wait (up to ``checkpoint_wait_timeout`` seconds) for
    its choice and get the same path (`verirl.checkpoints.node_share`). Every rank that
    does not own the server waits for its health itself. Under torchrun
    (``TORCHELASTIC_RUN_ID`` set) each rank also asks the kernel to SIGKILL it
    when its agent dies (``die_with_launcher``), since torchrun starts ranks in
    sessions of their own and a killed agent would leave them running.

    Any phase failing stops the server (if started) and raises that phase's
    error. From `start` to `stop` it holds the one SIGTERM policy
    (`verirl._signals`): started in the main thread with SIGTERM at its
    default, SIGTERM (what Modal and Kubernetes send on preemption) becomes
    `SystemExit(143)` once, so the ``with`` block unwinds and the server goes;
    a handler the program installed (a save-on-preemption callback) or
    ``SIG_IGN`` is kept and is what runs.

    While the session runs, a watchdog (`verirl.server.watchdog`) watches the vLLM
    server: its exit (when this process started it) and its ``/health``,
    which must answer within ``vllm_unresponsive_timeout`` seconds (0: exit
    only); other ranks and remote topologies watch the health the same way.
    On death it logs an ERROR with the exit status and the server's last log
    lines, asks a training loop listening for stop requests
    (`PreemptionCallback`) to save and stop, and after ``vllm_failure_grace``
    seconds (at once without a listener) interrupts the main thread with
    `VLLMServerExited` (`VLLMServerUnresponsive` for a hung server) through
    the SIGTERM policy, so the ``with`` block unwinds with it.

    ``server_timeout=`` is the deprecated name of ``remote_server_timeout``.
    """

    topology: VLLMTopology
    model: str | None = attrs.field(default=None, kw_only=True)
    env_probe: EnvServerProbe | None = attrs.field(default=None, kw_only=True)
    checkpoints: CheckpointResolving | None = attrs.field(default=None, kw_only=True)
    # A path-like is a path, never a keyword: kept as text that reads as that path.
    resume_from: str | None = attrs.field(default=None, kw_only=True, converter=resume_request)
    dist_env: DistributedEnv | None = attrs.field(default=None, kw_only=True)
    server_factory: ServerFactory | None = attrs.field(default=None, kw_only=True)
    env_timeout: float = attrs.field(default=defaults.ENV_TIMEOUT, kw_only=True)
    remote_server_timeout: float = attrs.field(default=VLLM_STARTUP_TIMEOUT, kw_only=True)
    checkpoint_wait_timeout: float = attrs.field(default=NODE_WAIT_TIMEOUT, kw_only=True)
    die_with_launcher: bool = attrs.field(default=True, kw_only=True)
    vllm_unresponsive_timeout: float = attrs.field(default=UNRESPONSIVE_TIMEOUT, kw_only=True)
    vllm_failure_grace: float = attrs.field(default=SAVE_GRACE, kw_only=True)
    environ: MutableMapping[str, str] | None = attrs.field(default=None, kw_only=True, repr=False)
    _deprecated_server_timeout: float | None = attrs.field(
        default=None, kw_only=True, alias="server_timeout", repr=False
    )
    _server: ServerHandle | None = attrs.field(default=None, init=False, repr=False)
    _session: RuntimeSession | None = attrs.field(default=None, init=False, repr=False)
    _started: bool = attrs.field(default=False, init=False, repr=False)
    _start_claim: object = attrs.field(default=None, init=False, repr=False)  # the last start()
    _watchdog: ServerWatchdog | None = attrs.field(default=None, init=False, repr=False)
    _failure_taken: bool = attrs.field(default=False, init=False, repr=False)
    # start() and stop() from several threads: the state below changes under this lock.
    _lock: threading.RLock = attrs.field(factory=threading.RLock, init=False, repr=False)
    _phases: Phases | None = attrs.field(default=None, init=False, repr=False)
    _starting: bool = attrs.field(default=False, init=False, repr=False)
    _stop_requested: bool = attrs.field(default=False, init=False, repr=False)
    # The stop tearing down: another stop waits for it (`_Teardown`).
    _claim: _Teardown | None = attrs.field(default=None, init=False, repr=False)
    # The server's start-time ConfigError fields → the settings they came from (from_settings).
    _start_names: Mapping[str, str] = attrs.field(factory=dict, init=False, repr=False)

    def __attrs_post_init__(self) -> None:
        check_seconds("env_timeout", self.env_timeout)
        check_seconds("vllm_unresponsive_timeout", self.vllm_unresponsive_timeout)
        check_seconds("vllm_failure_grace", self.vllm_failure_grace)
        if self._deprecated_server_timeout is not None:
            warnings.warn(
                "TrainingRuntime(server_timeout=...) is deprecated: "
                "use remote_server_timeout=... (the same seconds)",
                DeprecationWarning,
                stacklevel=3,
            )
            self.remote_server_timeout = check_seconds(
                "server_timeout", self._deprecated_server_timeout, positive=True
            )
        check_seconds("remote_server_timeout", self.remote_server_timeout, positive=True)
        check_seconds("checkpoint_wait_timeout", self.checkpoint_wait_timeout, positive=True)
        if not isinstance(self.die_with_launcher, bool):
            raise ConfigError.invalid(
                "die_with_launcher", self.die_with_launcher, "must be True or False"
            )
        if self.environ is not None:
            check_environ(self.environ, mutable=True)
        if self.model is not None:
            check_text("model", self.model, "a non-empty model id or path")
        if self.resume_from is not None and not isinstance(self.resume_from, str):
            raise ConfigError.invalid(
                "resume_from",
                self.resume_from,
                "must be a string ('latest', 'auto' or a path) or None",
            )
        if _is_auto(self.resume_from) and not _has_sources(self.checkpoints):
            raise ConfigError.invalid("resume_from", self.resume_from, NO_SOURCE_FOR_AUTO)

    @property
    def server_timeout(self) -> float:
        """Deprecated: `remote_server_timeout`."""
        warnings.warn(
            "TrainingRuntime.server_timeout is deprecated: use remote_server_timeout",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.remote_server_timeout

    @classmethod
    def from_settings(
        cls,
        settings: Settings | None = None,
        /,
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
        vllm_bind_host: str | None = None,
        vllm_tensor_parallel_size: int | None = None,
        vllm_data_parallel_size: int | None = None,
        vllm_dedicated: bool | None = None,
        resume_from: str | os.PathLike[str] | None = None,
        env_timeout: float | None = None,
        vllm_startup_timeout: float | None = None,
        vllm_unresponsive_timeout: float | None = None,
        vllm_shutdown_timeout: float | None = None,
        vllm_failure_grace: float | None = None,
        checkpoint_wait_timeout: float | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> TrainingRuntime:
        """Build the real components from the job's settings.

        ``settings`` (a `verirl.Settings`, e.g. ``Settings.from_environ()``
        with a field changed by ``attrs.evolve``) gives every setting at once,
        and no ``VERIRL_*`` variable is read: a value is named by its field in
        errors. Without it, each argument left ``None`` is read from its
        variable by `verirl.Settings` (the README's table lists them with
        their defaults); a bad value from a variable is a `ConfigError` naming
        the variable. A setting given both ways is a `ConfigError`.
        ``environ`` (default ``os.environ``) is where the variables, the
        launcher's distributed settings and ``CUDA_VISIBLE_DEVICES`` are read from.
        ``vllm_bind_host``, ``vllm_tensor_parallel_size``,
        ``vllm_data_parallel_size`` and ``vllm_dedicated`` (a node that only
        serves: see `VLLMTopology.plan`'s ``dedicated``) have no variable: a
        server reachable from other machines is chosen explicitly.
        ``vllm_startup_timeout`` (default `VLLM_STARTUP_TIMEOUT`, 900 s) is both
        the local server's ``startup_timeout`` and ``remote_server_timeout``,
        the wait for a server started elsewhere.
        """
        given: dict[str, Any] = {
            "env_url": env_url, "model": model, "max_model_len": max_model_len,
            "output_dir": output_dir, "hub_repo_id": hub_repo_id, "hub_token": hub_token,
            "hub_endpoint": hub_endpoint, "hub_revision": hub_revision,
            "gpu_count": gpu_count, "mode": mode, "vllm_gpus": vllm_gpus,
            "vllm_port": vllm_port, "vllm_remote_host": vllm_remote_host,
            "vllm_log_dir": vllm_log_dir, "resume_from": resume_request(resume_from),
            "vllm_bind_host": vllm_bind_host,
            "vllm_tensor_parallel_size": vllm_tensor_parallel_size,
            "vllm_data_parallel_size": vllm_data_parallel_size,
            "vllm_dedicated": vllm_dedicated, "vllm_args": vllm_args,
            "vllm_command": vllm_command, "env_timeout": env_timeout,
            "vllm_startup_timeout": vllm_startup_timeout,
            "vllm_unresponsive_timeout": vllm_unresponsive_timeout,
            "vllm_shutdown_timeout": vllm_shutdown_timeout,
            "vllm_failure_grace": vllm_failure_grace,
            "checkpoint_wait_timeout": checkpoint_wait_timeout,
        }  # fmt: skip
        with token_hidden(settings, given, environ):  # the runtime checks its timeouts too
            topology, arguments, start_names = runtime_arguments(settings, given, environ)
            runtime = cls(topology, **arguments)
        runtime._start_names = start_names  # a folder gone by start() named as the user gave it
        return runtime

    @property
    def session(self) -> RuntimeSession | None:
        """The running session, or ``None`` before `start` / after `stop`."""
        return self._session

    @property
    def starts_server(self) -> bool:
        """Whether this process would launch the vLLM server (local server mode, local rank 0)."""
        dist = self.dist_env
        return self.topology.is_local_server and (dist is None or dist.is_local_main)

    def refuse_unfindable(self) -> None:
        """`CheckpointNotFoundError` now when ``resume_from`` asks for a checkpoint no source has.

        ``"latest"`` with no source configured can never be found: `start`
        checks it before anything starts (no server launched only to be torn
        down), and ``verirl doctor`` reports it as the exit 5 launch would end with.
        """
        request = self.resume_from.strip() if isinstance(self.resume_from, str) else None
        if request in RESUME_KEYWORDS - {AUTO} and not _has_sources(self.checkpoints):
            raise CheckpointNotFoundError(request, ())

    def start(self) -> RuntimeSession:
        """Run every start-up phase; return the session or raise the first phase error."""
        self.refuse_unfindable()
        # A topology planned by hand: what from_settings checks (VLLMTopology.plan(3) under
        # CUDA_VISIBLE_DEVICES="" handed out GPUs 0-2).
        environ = os.environ if self.environ is None else self.environ
        check_visible_gpus(self.topology.gpu_count, environ, field="gpu_count")
        url = getattr(self.env_probe, "url", None)  # a test's fake may have none
        if isinstance(url, str):  # a runtime built by hand: what from_settings checks
            _check_env_url_port(self.topology, url, "env_probe")
        mine = object()  # this start's claim: stored in one statement, inside the try
        server_start: concurrent.futures.Future[None] | None = None
        phases: Phases | None = None
        try:
            self._claim_start(mine)
            origin = time.monotonic()
            dist = self._apply_dist_env()
            timings = [PhaseTiming("dist-env", 0.0, time.monotonic() - origin)]
            # Held from the main thread (where Python runs handlers) until stop(): the
            # phases, the server's start included, run on worker threads.
            SIGTERM_POLICY.acquire(self)
            phases = Phases(origin)
            with self._lock:
                self._refuse_if_stopped()
                self._phases = phases
                self._server = self._build_server()
            server_start, checkpoint = self._submit_phases(phases, dist)
            timings += phases.wait()  # every phase, or the first failure's error
            with self._lock:
                self._refuse_if_stopped()  # a stop() as the last phase ended
                self._phases = None
                self._starting = False
                self._open_session(dist, origin, timings, checkpoint)
                assert self._session is not None  # noqa: S101 - set just above
                return self._session
        except BaseException as error:
            # Every phase runs on daemon threads (the Hub download's too): a signal that
            # ends the program is never held up by one, and a program that catches it
            # goes on as it likes.
            if self._start_claim is mine:  # not another start's: "already started"
                with self._lock:
                    self._phases = None
                    self._starting = False
                if server_start is None and phases is not None:  # interrupted as it was handed
                    server_start = phases.started("vllm")  # over: its phase knows it
                self._cancel_server_start(server_start)
                self.stop()
            raise_interruption_behind(error)
            raise

    def _claim_start(self, mine: object) -> None:
        """Mark the runtime started by the start ``mine``; `RuntimeError` if it is already."""
        with self._lock:
            if self._started:
                msg = "TrainingRuntime is already started; stop() it first"
                raise RuntimeError(msg)
            self._start_claim = mine  # first: from here, the start's except undoes the rest
            self._started = self._starting = True
            self._failure_taken = self._stop_requested = False

    def _submit_phases(
        self, phases: Phases, dist: DistributedEnv
    ) -> tuple[
        concurrent.futures.Future[None] | None, concurrent.futures.Future[str | None] | None
    ]:
        """Start every phase this process runs; the server's start and the checkpoint's futures."""
        server_start = checkpoint = None
        if self._server is not None:
            server_start = phases.submit("vllm", self._start_server, self._server)
        if self._waits_for_server_elsewhere:
            phases.submit("vllm-wait", self._wait_for_server_elsewhere)
        if self.env_probe is not None:
            if dist.is_local_main:
                phases.submit("env", self.env_probe.wait, self.env_timeout)
            else:
                log.info("local rank %d leaves the env-server wait to local rank 0",
                         dist.local_rank)  # fmt: skip
        if self.checkpoints is not None or _requested(self.resume_from):
            # A request is never dropped: without a resolver an explicit path is still
            # checked, and "latest" fails with "no sources configured".
            resolver = self._node_shared(self.checkpoints or CheckpointResolver([]), dist)
            checkpoint = phases.submit("checkpoint", resolver.resolve, self.resume_from)
        return server_start, checkpoint

    def _refuse_if_stopped(self) -> None:
        if self._stop_requested:
            raise VeriRLError(_STOPPED_WHILE_STARTING)

    def _open_session(
        self,
        dist: DistributedEnv,
        origin: float,
        timings: list[PhaseTiming],
        checkpoint: concurrent.futures.Future[str | None] | None,
    ) -> None:
        """The session of a start every phase of which succeeded; the watchdog on its server."""
        self._session = RuntimeSession(
            topology=self.topology,
            grpo_kwargs=types.MappingProxyType(self.topology.grpo_kwargs()),
            resume_from_checkpoint=checkpoint.result() if checkpoint else None,
            server=self._server,
            server_url=self._server.base_url if self._server else self.topology.server_url,
            dist_env=dist,
            timings=tuple(timings),
            total=time.monotonic() - origin,
        )
        log.info("%s", self._session.timeline())
        self._watch_server()

    def _apply_dist_env(self) -> DistributedEnv:
        """Fill in and apply the single-node distributed variables (a launcher's win)."""
        environ = os.environ if self.environ is None else self.environ
        dist = self.dist_env or DistributedEnv.single_node(
            environ=environ, avoid_ports=avoided_ports(self.topology.port)
        )
        check_master_port(self.topology, dist)
        self.dist_env = dist
        dist.apply(environ)
        if self.die_with_launcher and environ.get("TORCHELASTIC_RUN_ID"):
            _die_with_parent()
        return dist

    def _node_shared(
        self, resolver: CheckpointResolving, dist: DistributedEnv
    ) -> CheckpointResolving:
        """``resolver``, or its one-per-node wrapper when several local ranks share a Hub cache."""
        found = _download_dir(resolver)
        if found is None or dist.local_world_size <= 1 or not _requested(self.resume_from):
            return resolver  # a fresh start asks nothing of the Hub: nothing to share
        folder, name = found
        environ = os.environ if self.environ is None else self.environ
        # What verirl filled in (a free MASTER_PORT) differs between the ranks: not the attempt's.
        given = {name: value for name, value in environ.items() if name not in dist.defaulted}
        return NodeSharedResolver(
            resolver,
            folder,
            attempt_key(given, folder=folder, request=self.resume_from),
            leader=dist.is_local_main,
            timeout=self.checkpoint_wait_timeout,
            name=name,
        )

    def _start_server(self, server: ServerHandle) -> None:
        """``server.start()``; a `ConfigError` about a setting names the setting it came from."""
        try:
            server.start()
        except ConfigError as exc:
            name = self._start_names.get(exc.field or "")
            if name is None:
                raise
            raise exc.renamed(name) from exc

    def _build_server(self) -> ServerHandle | None:
        """The server this process launches, or ``None`` when it launches none."""
        if not self.starts_server:
            return None
        factory = self.server_factory or _default_server_factory(self.model)
        server = checked_handle(factory(self.topology))
        log.info("starting vLLM server: %s", self.topology.describe())
        return server

    @property
    def _waits_for_server_elsewhere(self) -> bool:
        """Server mode, started by local rank 0 or on a remote host rather than here."""
        topology = self.topology
        return not self.starts_server and topology.mode == "server" and bool(topology.server_url)

    def _wait_for_server_elsewhere(self) -> None:
        url = str(self.topology.server_url)
        log.info("waiting for the vLLM server at %s (started elsewhere)", url)
        try:
            probe = HttpEnvServerProbe(url, health_path="/health", label="vLLM server")
            probe.wait(self.remote_server_timeout)
        except EnvServerUnavailable as exc:
            raise VLLMServerUnavailable(exc.url, exc.elapsed, exc.last_error) from exc

    def _cancel_server_start(self, start: concurrent.futures.Future[None] | None) -> None:
        """Stop a server whose start may still run, and wait (bounded) for that start to end.

        `ServerHandle.stop` makes a `start` in progress fail fast; a start not
        yet begun is cancelled and never runs.
        """
        server = self._server
        if server is None or start is None or start.cancel():
            return
        server.stop()
        done, _ = concurrent.futures.wait([start], timeout=START_CANCEL_TIMEOUT)
        if not done:
            log.warning(
                "the vLLM server's start() still runs %gs after stop(); not waiting longer",
                START_CANCEL_TIMEOUT,
            )

    def _watch_server(self) -> None:
        """Start the watchdog on our server, or on the one started elsewhere (server mode)."""
        server = self._server
        if server is not None:
            url: str | None = server.base_url
        elif self._waits_for_server_elsewhere:
            url = self.topology.server_url
        else:
            return  # colocate: vLLM runs inside the trainer
        held = SIGTERM_POLICY.holds(self)
        self._watchdog = ServerWatchdog(
            server,
            url,
            unresponsive_timeout=self.vllm_unresponsive_timeout,
            save_grace=self.vllm_failure_grace,
            interrupt=lambda error: interrupt_main(error, held=held),
        )
        self._watchdog.start()

    def stop_watchdog(self) -> VLLMServerError | None:
        """Stop watching the server (before stopping it on purpose); return the death it saw.

        `stop` does this first; ``verirl launch`` calls it as soon as its
        command has ended, so that a server dying after that cannot turn a
        finished job into a failed one. An interrupt the watchdog sent that
        the main thread has not handled yet is taken back.
        """
        failure = self._stop_watching(self._watchdog)
        self._failure_taken = True  # the caller has it: leaving the block does not raise it
        return failure

    @staticmethod
    def _stop_watching(watchdog: ServerWatchdog | None) -> VLLMServerError | None:
        if watchdog is None:
            return None
        watchdog.stop()
        failure = watchdog.failure
        if failure is not None:
            SIGTERM_POLICY.withdraw(failure)
        return failure

    def stop(self) -> None:
        """Stop the watchdog and the server (if this runtime started one), release the policy.

        Idempotent: the policy is released exactly once per `start`, by the
        stop that tears down; a stop from another thread meanwhile returns
        when that teardown has ended, or, when a Ctrl-C cut it short before the
        server was stopped, does the teardown itself (one from the same thread,
        a signal handler's, returns at once). Called from another thread while `start` runs,
        it stops the server's start and ends the start's wait at once;
        `start` then tears everything down and raises (`VLLMServerError` when
        the server's start was cut short, else `VeriRLError`).
        """
        while self._stop_once():
            pass  # the teardown waited for was cut short: this stop does it

    def _stop_at_once(self) -> None:
        """After a signal cut the block's `stop` short: the rest of it now, the server SIGKILLed.

        Interrupted before it held the server, that stop left it running for
        a later one; the block is not left with it (a second signal, or two
        at once, asks for a teardown without the grace, not for none).
        """
        if self._server is not None:
            self._server.cut_stop_short()
        self.stop()

    def _stop_once(self) -> bool:
        """`stop`'s one go; ``True``: the other thread's teardown it waited for left the server."""
        mine = _Teardown(threading.get_ident())
        try:
            with self._lock:
                starting = self._starting
                phases = self._phases
                claim = self._claim
                if starting:  # a start in progress (another thread): it tears down and raises
                    self._stop_requested = True
                    server = self._server
                elif claim is None:
                    mine.server, mine.watchdog, mine.session = (
                        self._server,
                        self._watchdog,
                        self._session,
                    )
                    self._claim = mine  # the one store: from here, the finally below tears down
                    self._server = self._watchdog = self._session = None
            if starting:
                if phases is not None:
                    phases.cancel(VeriRLError(_STOPPED_WHILE_STARTING))
                if server is not None:
                    server.stop()  # its start() ends promptly, and nothing of it is left
            elif claim is not None and claim.thread != threading.get_ident():
                _wait_for(claim)
                return not claim.torn_down and self._claim is not claim
        finally:
            if self._claim is mine:
                try:
                    self._tear_down(mine)
                finally:
                    if self._claim is mine:  # its release interrupted: ended as it got
                        self._release(mine, torn_down=mine.stopped)
        return False

    def _tear_down(self, claim: _Teardown) -> None:
        """`stop`'s work, by the one stop that holds ``claim``.

        The runtime lets go of its server only once the server's `stop` has
        returned: interrupted before (a second Ctrl-C), the runtime keeps it,
        and the next `stop` tries again, as the server's own does.
        """
        try:
            try:
                self._stop_watching(claim.watchdog)  # first: stopping the server is no death
            finally:
                if claim.watchdog is not None:
                    claim.watchdog.stop()  # again (quick): a Ctrl-C may have cut the first short
                if claim.server is not None:
                    claim.server.stop()
                claim.stopped = True  # no call: the stop's own finally reads it too
            if claim.watchdog is not None:
                claim.watchdog.join(1.0)  # a daemon that never acts now: no need to wait
        finally:
            self._release(claim, torn_down=claim.stopped)

    def _release(self, claim: _Teardown, *, torn_down: bool) -> None:
        """End ``claim``: the runtime stopped (``torn_down``), or as before the stop began.

        The claim is let go last: a Ctrl-C before leaves it to the stop's
        ``finally``, which ends it again. Other stops waiting on the claim
        return, whatever interrupts this.
        """
        try:
            with self._lock:
                if self._claim is not claim:
                    return
                if torn_down:  # what a Ctrl-C right after the claim's store left here, too
                    self._server = self._watchdog = self._session = None
                    self._started = False
                    SIGTERM_POLICY.release(self)
                else:  # a later stop() does the whole teardown
                    self._server, self._watchdog = claim.server, claim.watchdog
                    self._session = claim.session
                claim.torn_down = torn_down
                self._claim = None
        finally:
            claim.ended.set()

    def __enter__(self) -> RuntimeSession:
        return self.start()

    @must_not_raise
    def __exit__(self, exc_type: object, exc: BaseException | None, *_: object) -> None:
        """`stop`; then the server's death, if the block ended normally after it.

        The watchdog interrupts the block once; code that catches every
        ``Exception`` (a retry wrapper around a generation call) swallows it,
        and the block would end as if training had succeeded with a dead
        server. Unless `stop_watchdog` handed that failure to the caller, it
        is raised here.
        """
        watchdog = self._watchdog
        try:
            if interrupted_twice(exc):  # two signals at once: the server goes without its grace
                self._stop_at_once()
            else:
                self.stop()
        except BaseException:
            self._stop_at_once()
            raise
        failure = watchdog.failure if watchdog is not None else None
        if exc_type is None and failure is not None and not self._failure_taken:
            raise failure

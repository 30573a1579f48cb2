"""Run the vLLM server TRL expects for the length of a ``with`` block; leave no process behind.

::

    from verirl import VLLMServer

    with VLLMServer("Qwen/Qwen3-0.6B", devices=(1,), max_model_len=4096) as server:
        trainer.train()  # GRPOConfig(vllm_server_port=server.port, ...)

What runs is what the installed TRL would run (see `VLLMServer.launch_plan`):
with TRL 1.x, vLLM's own OpenAI-compatible server with the flags TRL's
``build_command`` adds and ``VLLM_SERVER_DEV_MODE=1``; with TRL 0.2x,
``trl vllm-serve``; with ``command=``, that program.

`VLLMServer.start` (what ``with`` calls) refuses a port that is already bound,
launches the server in its own session with a scrubbed environment, its output
in a log file, and waits until ``GET /health`` answers 200 from a socket that
the server's own process tree listens on (not from another server that bound
the port meanwhile). `VLLMServer.stop`
(what leaving the block calls, whatever the reason) sends SIGTERM to the
server's process group and to every descendant that left it, waits up to
``shutdown_timeout`` and SIGKILLs what is left.

If the trainer dies first, the server goes too: on Linux the child asks the
kernel for SIGTERM when its parent dies (``PR_SET_PDEATHSIG``), which covers a
SIGKILLed trainer, and while a server runs a SIGTERM sent to the trainer (a
preemption) raises ``SystemExit(143)`` in the main thread so that the ``with``
block unwinds and the full teardown runs (the one policy of `verirl._signals`:
a handler the program installed is kept, and is what runs).

This module decides what runs and drives its life cycle; each generic piece
lives in the private module named after it: spawning, the death signal and
the process tree in `verirl.server.process`, the readiness wait in
`verirl.server.readiness` (over `verirl._http`'s one health GET), the child's
environment in `verirl.server.child_env`, the log file in `verirl.server.log`,
the port check and connect host in `verirl._net`, the checks of the
constructor's arguments in `verirl.server.fields`.
"""

from __future__ import annotations

import errno
import logging
import os
import subprocess
import threading
import types
import uuid
from collections.abc import Iterable, Mapping, Sequence  # noqa: F401 - Iterable: see below
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

import attrs

from verirl import _defaults as defaults
from verirl._fs import printable, quoted, shortened
from verirl._hidden import HIDDEN
from verirl._net import check_port_free, url_host
from verirl._secrets import known_secrets, redact_argv, redact_text, scrub_all, secrets_in_environ
from verirl._signals import interrupted_twice, must_not_raise, raise_interruption_behind
from verirl.errors import (
    ConfigError,
    VLLMServerError,
    VLLMServerExited,
    VLLMStartupTimeout,
)
from verirl.server.args import serve_args_of
from verirl.server.child import popen_in_session, spawn
from verirl.server.child_env import (
    vllm_child_environ,
)
from verirl.server.fields import (
    to_command,
    to_devices,
    to_env,
    to_extra_args,
    to_log_dir,
    to_log_path,
    v_bool,
    v_count,
    v_fraction,
    v_host,
    v_max_model_len,
    v_model,
    v_port,
    v_seconds,
)
from verirl.server.launch import (
    COMMAND_HINT,
    INSTALL_HINT,
    LaunchPlan,
    import_trl_serve,
    plan_launch,
    vllm_distribution,
)
from verirl.server.log import open_server_log
from verirl.server.log_check import check_server_log
from verirl.server.log_folder import log_file_name
from verirl.server.log_tail import LOG_TAIL_LINES, KeptLog, check_lines, read_log_tail
from verirl.server.process import MARKER_VAR, ProcessTree, Run, forget_at_exit, stop_at_exit
from verirl.server.readiness import (
    ServerExitedError,
    StartCancelledError,
    UnprovableError,
    wait_for_health,
)
from verirl.topology import ServerTopology, check_local_server

if TYPE_CHECKING:
    from typing_extensions import Self

# Iterable is imported for the converters' parameter types, which attrs writes into
# __init__'s annotations: typing.get_type_hints(VLLMServer) resolves them here.

__all__ = ["VLLMServer"]

log = logging.getLogger("verirl.vllm_server")  # the component's logger, which users filter on

_CANCELLED = "stop() was called while the vLLM server was starting; it was stopped"


# ---------------------------------------------------------------- the server


@attrs.define(eq=False, repr=False)
class VLLMServer:
    """The vLLM server as a context manager: started healthy, stopped with its whole tree.

    Arguments mirror ``trl vllm-serve``'s flags (see `vllm_serve_args`), plus:

    - ``devices``: GPU indices *as this process numbers them* (mapped through
      the parent's ``CUDA_VISIBLE_DEVICES``);
    - ``command``: the program to run instead of the one the installed TRL
      expects (see `launch_plan`), followed by the same flags, e.g.
      ``[sys.executable, "-m", "fakes.vllm_serve"]``;
    - ``env``: variables added to the inherited (scrubbed) environment; see
      `vllm_child_environ`;
    - ``log_path``: where stdout and stderr go. An existing file is appended
      to, never truncated; a directory gets ``vllm-serve-<port>.log`` (one
      spelled with a trailing slash is made if missing; one that was a
      directory when the server was made must still be one at start, else a
      `ConfigError`); ``None`` means that file in this user's
      ``verirl-vllm-<uid>`` temp folder (`default_log_dir`, kept, so the log
      outlives a failure, made again if removed). It must be a regular file
      verirl can read back;
    - ``log_dir``: instead of ``log_path``, a folder that must exist at start,
      which gets ``vllm-serve-<port>.log``: never made, never taken for a file
      (a folder removed meanwhile is a `ConfigError` naming ``log_dir``);
    - ``startup_timeout`` / ``shutdown_timeout``: seconds to become healthy /
      to stop after SIGTERM before SIGKILL;
    - ``progress_interval``: seconds between "still starting" log lines;
    - ``handle_sigterm``: while running, turn the trainer's SIGTERM into
      ``SystemExit(143)`` so the ``with`` block unwinds (main thread only,
      and only when SIGTERM has no handler yet).

    Every argument is checked here and a bad one raises `ConfigError`. Failing
    to start raises `PortInUseError` (nothing spawned), `VLLMServerExited` or
    `VLLMStartupTimeout` (both after the process tree is gone), or
    `VLLMServerError` (no launch command).
    """

    model: str = attrs.field(validator=v_model)
    port: int = attrs.field(default=defaults.VLLM_PORT, kw_only=True, validator=v_port)
    host: str = attrs.field(default="127.0.0.1", kw_only=True, validator=v_host)
    devices: tuple[int, ...] = attrs.field(default=(1,), kw_only=True, converter=to_devices)
    max_model_len: int | None = attrs.field(default=None, kw_only=True, validator=v_max_model_len)
    gpu_memory_utilization: float = attrs.field(
        default=defaults.SERVER_MEMORY, kw_only=True, validator=v_fraction
    )
    tensor_parallel_size: int = attrs.field(default=1, kw_only=True, validator=v_count)
    data_parallel_size: int = attrs.field(default=1, kw_only=True, validator=v_count)
    extra_args: tuple[str, ...] = attrs.field(default=(), kw_only=True, converter=to_extra_args)
    command: tuple[str, ...] | None = attrs.field(default=None, kw_only=True, converter=to_command)
    env: Mapping[str, str] = attrs.field(default=None, kw_only=True, converter=to_env, repr=False)
    _log_path: Path | None = attrs.field(
        default=None, kw_only=True, converter=to_log_path, alias="log_path"
    )
    log_dir: Path | None = attrs.field(default=None, kw_only=True, converter=to_log_dir)
    startup_timeout: float = attrs.field(
        default=defaults.SERVER_STARTUP_TIMEOUT, kw_only=True, validator=v_seconds
    )
    shutdown_timeout: float = attrs.field(
        default=defaults.SERVER_SHUTDOWN_TIMEOUT, kw_only=True, validator=v_seconds
    )
    progress_interval: float = attrs.field(default=30.0, kw_only=True, validator=v_seconds)
    handle_sigterm: bool = attrs.field(default=True, kw_only=True, validator=v_bool)

    _tree: ProcessTree | None = attrs.field(default=None, init=False, repr=False)
    _argv: tuple[str, ...] | None = attrs.field(default=None, init=False, repr=False)
    _active_log: Path | None = attrs.field(default=None, init=False, repr=False)
    _log_offset: int = attrs.field(default=0, init=False, repr=False)
    _kept_log: KeptLog | None = attrs.field(default=None, init=False, repr=False)
    _run: Run | None = attrs.field(default=None, init=False, repr=False)
    _owner: int = attrs.field(factory=os.getpid, init=False, repr=False)
    _lock: threading.RLock = attrs.field(factory=threading.RLock, init=False, repr=False)
    _starts: set[str] = attrs.field(factory=set, init=False, repr=False)  # markers of starts
    _cancel: threading.Event = attrs.field(factory=threading.Event, init=False, repr=False)
    _starts_lock: threading.RLock = attrs.field(factory=threading.RLock, init=False, repr=False)
    """Guards ``_starts`` and the setting of ``_cancel``: held for an instant, never over a wait.

    Reentrant: a signal handler that calls `stop` runs on the thread that may hold it.
    """

    def __attrs_post_init__(self) -> None:
        if self.log_dir is not None and self._log_path is not None:
            raise ConfigError.invalid(
                "log_dir", str(self.log_dir), "give log_dir or log_path, not both"
            )
        wanted = self.tensor_parallel_size * self.data_parallel_size
        if len(self.devices) < wanted:
            log.warning(
                "devices=%s has %d GPU(s) but tensor_parallel_size * data_parallel_size = %d",
                self.devices,
                len(self.devices),
                wanted,
            )

    @classmethod
    def from_topology(
        cls,
        topology: ServerTopology,
        *,
        model: str,
        **overrides: Any,  # noqa: ANN401 - forwarded to the constructor, which checks them
    ) -> Self:
        """A server for ``topology``'s vLLM GPUs, host, port and flags; ``overrides`` win.

        A topology that runs no local server (colocate mode, or vLLM on a
        remote host) is a `ConfigError`.
        """
        check_local_server(topology)
        settings: dict[str, Any] = {
            "devices": topology.vllm_devices,
            "host": topology.host,
            "port": topology.port,
            "max_model_len": topology.max_model_len,
            "gpu_memory_utilization": topology.gpu_memory_utilization,
            "tensor_parallel_size": topology.tensor_parallel_size,
            "data_parallel_size": topology.data_parallel_size,
        }
        settings.update(overrides)
        return cls(model, **settings)

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(model={quoted(self.model)}, base_url={quoted(self.base_url)}, "
            f"devices={quoted(self.devices)}, running={self.running}, pid={self.pid}, "
            f"log_path={quoted(None if self.log_path is None else str(self.log_path))})"
        )

    # ------------------------------------------------------------ properties

    @property
    def base_url(self) -> str:
        """``http://host:port`` (a wildcard host is reached over loopback)."""
        return f"http://{url_host(self.host)}:{self.port}"

    @property
    def pid(self) -> int | None:
        """The server process id while started, else ``None``."""
        tree = self._tree
        return None if tree is None else tree.pid

    @property
    def running(self) -> bool:
        """Started, and the server process has not exited."""
        tree = self._tree
        return tree is not None and not tree.exited()

    @property
    def returncode(self) -> int | None:
        """The server process's exit status once it exited (negative: its signal), else ``None``."""
        tree = self._tree
        return None if tree is None else tree.exit_status()

    @property
    def log_path(self) -> Path | None:
        """The log file of the current (or last) run; the requested path before the first."""
        if self._active_log is None and self.log_dir is not None:
            return Path(self.log_dir) / log_file_name(self.port)
        return self._active_log or self._log_path

    @property
    def serve_args(self) -> tuple[str, ...]:
        """The flags after the command: ``--model M --host H --port P ...`` then ``extra_args``."""
        return tuple(serve_args_of(self.model, self, self.extra_args))

    def launch_plan(self) -> LaunchPlan:
        """What `start` runs, and why: the argv, the variables it adds, the kind of launch.

        Without ``command``: vLLM's own server as the installed TRL 1.x runs it
        (``trl.scripts.vllm_serve.build_command``, ``VLLM_SERVER_DEV_MODE=1``), or
        ``trl vllm-serve`` with a TRL that has no ``build_command``. Spawns
        nothing; raises `VLLMServerError` when neither can run.
        """
        own: dict[str, object] = {
            "model": self.model,
            "host": self.host,
            "port": self.port,
            "tensor_parallel_size": self.tensor_parallel_size,
            "data_parallel_size": self.data_parallel_size,
            "gpu_memory_utilization": self.gpu_memory_utilization,
        }
        if self.max_model_len is not None:
            own["max_model_len"] = self.max_model_len
        return plan_launch(
            self.serve_args,
            command=self.command,
            environ=os.environ,
            trl=None if self.command is not None else import_trl_serve(),
            vllm=None if self.command is not None else vllm_distribution(),
            own=own,
        )

    @property
    def argv(self) -> tuple[str, ...] | None:
        """The full command line of the current (or last) launch, ``None`` before one."""
        return self._argv

    def log_tail(self, lines: int = LOG_TAIL_LINES) -> str:
        """The last ``lines`` lines this run wrote to its log ("" before a run, or for 0).

        Read from the file the server was given, even after a rotation moved
        or deleted its name. Never blocks and never raises for the file's sake
        (see `read_log_tail`); ``lines`` that is not an integer >= 0 is a `ConfigError`.
        """
        check_lines(lines)
        if self._active_log is None:
            return ""
        tail = read_log_tail(
            self._kept_log or self._active_log, lines=lines, start=self._log_offset
        )
        return _hide_secrets(tail, self._argv or (), self.env)

    # ------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Launch the server and return once ``GET /health`` answers 200 from it.

        Checks come first and spawn nothing: the launch command, the GPU
        mapping, the port, the log file. From the spawn on, any failure or
        interruption (an exception, Ctrl-C, SIGTERM as ``SystemExit``), at any
        point until this returns, stops the whole process tree before the
        exception propagates. `stop` may be called from another thread
        meanwhile: the start then ends promptly with `VLLMServerError`, no
        process left, and this server refuses to start again.
        """
        run = Run(marker=uuid.uuid4().hex)
        try:  # from before the count: an interruption anywhere after it uncounts this start
            with self._lock, self._starts_lock:
                self._refuse_if_cancelled(again=True)
                self._starts.add(run.marker)
            with self._lock:
                tree = self._launch(run)
                if self._cancel.is_set():  # a stop() during the spawn found no tree to stop
                    tree.stopping.set()
            # Wait outside the lock, so that stop() from another thread can cancel the start.
            self._wait_until_ready(tree)
            self._end_start(run)
        except BaseException as error:
            self._abandon(run)
            raise_interruption_behind(error)
            raise
        finally:
            with self._starts_lock:
                self._starts.discard(run.marker)  # none if it was never counted

    def _end_start(self, run: Run) -> None:
        """The start is over: a `stop` from now on is an ordinary one; one that came raises."""
        with self._starts_lock:
            self._starts.discard(run.marker)
            cancelled = self._cancel.is_set()
        if cancelled:  # a stop() came as the server got ready: it stops the server
            self._stop()
            raise VLLMServerError(_CANCELLED)

    def stop(self) -> None:
        """Stop the server and everything it started; safe to call any number of times.

        SIGTERM to the process group and to descendants that left it, up to
        ``shutdown_timeout`` seconds for all of them to exit, then SIGKILL to
        whatever is left (pids checked against their creation time), then the
        server is reaped. Interrupted (Ctrl-C), it SIGKILLs the tree at once
        and waits for it (bounded) before re-raising. The server is forgotten
        only once every process of it is gone: if one may have survived, the
        next call (``__exit__``, another `stop`, or the exit hook) tries again.

        Called while a `start` runs in another thread, it cancels that start
        (which raises `VLLMServerError`) for good: this server will not start
        again. A `stop` that returns before `start` is called cancels nothing.
        """
        with self._starts_lock:  # not the server's lock: a start may hold it while it launches
            if self._starts:
                self._cancel.set()
        self._stop()

    def _stop(self) -> None:
        """`stop`, without cancelling a start: what a start's own failure path calls.

        Interrupted (a Ctrl-C) while another thread's stop runs the grace, it
        cuts that grace short (SIGKILL now), as a Ctrl-C in that thread would;
        interrupted in its own, the next stop of this run SIGKILLs at once, as
        this one would have. The lock is taken by ``with``, whose ``__enter__``
        no signal can part from its block: a Ctrl-C right after an ``acquire``
        call returned left the lock held for good, and every other thread's
        stop waited for it.
        """
        try:
            with self._lock:
                self._stop_held()
        except BaseException as error:
            self.cut_stop_short()
            raise_interruption_behind(error)
            raise

    def _stop_held(self) -> None:
        """`_stop`'s work, under the server's lock."""
        tree = self._tree
        if tree is None:
            return
        tree.stopping.set()  # a start() waiting in another thread gives up
        if os.getpid() != self._owner:
            self._forget(release=False)  # a forked copy: the server is the parent's
            return
        try:
            gone = tree.take_down(self.shutdown_timeout, self._active_log)
        except BaseException:
            if tree.gone(rescan=False):
                self._forget()
            raise
        if gone:
            self._forget()

    def cut_stop_short(self) -> None:
        """End the grace of a `stop` under way in another thread, or about to be: SIGKILL then.

        What a Ctrl-C in a thread that waits for that stop does (a second
        Ctrl-C skips the grace, whichever thread runs it). The other thread
        may not have begun its `stop` yet (`verirl.TrainingRuntime` stops its
        watchdog first): this run's next `stop` is cut short too. Nothing,
        when the server is not running.
        """
        tree = self._tree
        if tree is not None:
            tree.cut_short.set()

    def __enter__(self) -> Self:
        self.start()
        return self

    @must_not_raise
    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: types.TracebackType | None,
    ) -> None:
        try:
            if interrupted_twice(exc):  # two signals at once: what a second one asks for, now
                self.cut_stop_short()
            self.stop()
        except BaseException:
            # A signal cut the stop short (a second one, or two at once): what it asks for is
            # a SIGKILL now, not a server left to the exit hook once the block is left.
            self.cut_stop_short()
            self.stop()
            raise

    # ------------------------------------------------------------ internals

    def _launch(self, run: Run) -> ProcessTree:
        """Check, open the log, spawn and adopt the child (under the lock); ``run`` records it."""
        if self._tree is not None and self._tree.stopping.is_set():
            self._stop()  # an interrupted stop: finish it first
        previous = self._tree
        if previous is not None and previous.stopping.is_set():
            raise VLLMServerError(
                f"processes of the previous vLLM server on port {self.port} survive "
                f"SIGKILL (pid {previous.pid}); it cannot be started again"
            )
        if previous is not None:
            raise VLLMServerError(f"the vLLM server on port {self.port} is already started")
        plan = self.launch_plan()
        argv = plan.argv
        environ = vllm_child_environ(os.environ, devices=self.devices, env={**plan.env, **self.env})
        environ[MARKER_VAR] = run.marker
        check_port_free(self.host, self.port)
        self._refuse_if_cancelled()  # the last moment before anything is made
        log_file = self._open_log(argv)
        try:
            if self.handle_sigterm:
                run.hold_sigterm()

            def job() -> subprocess.Popen[bytes]:
                run.popen = popen_in_session(argv, environ, log_file)
                return run.popen

            try:
                popen = spawn(job)
            except OSError as exc:
                if run.popen is not None:
                    raise
                why = exc.strerror or exc
                if exc.errno == errno.E2BIG:  # the kernel's bound, whatever the program
                    msg = (
                        f"the vLLM server's command line and environment are too long to start "
                        f"it ({why}): {_longest_part(argv, environ)}"
                    )
                elif plan.kind == "command":
                    program = redact_argv([argv[0]])[0]  # a NAME=secret word as the program
                    msg = f"command={quoted(program)}: cannot be started ({why})"
                else:  # the program TRL's launch found: the installation is at fault
                    msg = (
                        f"cannot start {quoted(argv[0])} ({why}); reinstall TRL and vLLM "
                        f"(`{INSTALL_HINT} --force-reinstall`), or {COMMAND_HINT}"
                    )
                raise VLLMServerError(msg) from exc
        finally:
            log_file.close()
        tree = self._adopt(run, argv)
        log.info(
            "started vLLM server (pid %d, GPUs %s) for %s at %s; log: %s; launch: %s",
            popen.pid,
            environ["CUDA_VISIBLE_DEVICES"],
            printable(self.model),
            self.base_url,
            None if self._active_log is None else printable(self._active_log),
            plan.reason,
        )
        return tree

    def _adopt(self, run: Run, argv: tuple[str, ...] | None) -> ProcessTree:
        """Remember ``run``'s child as this server's, so that `stop` and the exit hook reach it."""
        if run.tree is not None:
            return run.tree
        if run.popen is None:  # pragma: no cover - only called once a child exists
            msg = "no child process to adopt"
            raise AssertionError(msg)
        stop_at_exit(self)
        tree = ProcessTree(run.popen, run.marker)
        self._owner = os.getpid()
        if argv is not None:
            self._argv = argv
        self._run = run
        self._tree = tree
        run.tree = tree
        return tree

    def _abandon(self, run: Run) -> None:
        """After a failed or interrupted `start`: stop whatever ``run`` spawned, release SIGTERM."""
        with self._lock:
            if run.popen is not None and run.tree is None:
                self._adopt(run, None)  # spawned but not yet remembered
            tree = run.tree
            if tree is not None and tree is self._tree and not tree.stopping.is_set():
                self._stop()
            elif tree is None or tree is not self._tree:
                run.release_sigterm()

    def _refuse_if_cancelled(self, *, again: bool = False) -> None:
        if not self._cancel.is_set():
            return
        if again:
            raise VLLMServerError(
                f"{_CANCELLED}; a VLLMServer whose start was cancelled cannot be started "
                "again: make a new one"
            )
        raise VLLMServerError(_CANCELLED)

    def _forget(self, *, release: bool = True) -> None:
        """The server is gone: drop, once, this run's hold on SIGTERM, then the tree.

        In that order: interrupted before the tree is dropped, the next `stop`
        finds the tree gone and comes here again (a release is done once).
        """
        run = self._run
        if run is not None and release:  # a forked copy holds nothing (reset_after_fork)
            run.release_sigterm()
        self._tree = None
        self._run = None
        forget_at_exit(self)

    def check_log(self) -> None:
        """What `start` would refuse about the log, as a `ConfigError`, found without writing.

        A preflight (``verirl doctor``): see `verirl.server.log_check.check_server_log`.
        """
        if self.log_dir is not None:
            check_server_log(self.log_dir, port=self.port, field="log_dir")
        else:
            check_server_log(self._log_path, port=self.port)

    def _open_log(self, argv: tuple[str, ...]) -> BinaryIO:
        """Open this run's log (see `open_server_log`), remember where the run starts."""
        if self.log_dir is not None:
            opened = open_server_log(self.log_dir, port=self.port, argv=argv, field="log_dir")
        else:
            opened = open_server_log(self._log_path, port=self.port, argv=argv)
        try:
            reader = KeptLog(opened.handle)
        except BaseException:
            opened.handle.close()
            raise
        kept, self._kept_log = self._kept_log, reader
        if kept is not None:
            kept.close()
        self._active_log = opened.path
        self._log_offset = opened.offset
        return opened.handle

    def _wait_until_ready(self, tree: ProcessTree) -> None:
        """Return once our server answers 200; else stop it and raise why not."""
        # vLLM serves /health and redirects /health/ to it; TRL 0.2x's server the other
        # way round. requests follows the redirect, so one path suits both.
        url = f"{self.base_url}/health"
        try:
            result = wait_for_health(
                tree,
                url,
                self.port,
                timeout=self.startup_timeout,
                progress=self._log_progress,
                progress_every=self.progress_interval,
                log_path=self._kept_log or self._active_log,
                log_offset=self._log_offset,
            )
        except UnprovableError:
            self._stop()
            raise VLLMServerError(
                f"{url} answered 200, but whether from the vLLM server we started cannot be "
                "told: this system denies reading its sockets (psutil AccessDenied)"
            ) from None
        except (ServerExitedError, StartCancelledError):
            cancelled = self._cancel.is_set() or tree.stopping.is_set()
            self._stop()
            if cancelled:
                raise VLLMServerError(_CANCELLED) from None
            raise VLLMServerExited(
                tree.popen.returncode, self.log_tail(), str(self._active_log)
            ) from None
        if result.ready and self._cancel.is_set():  # stop() came as the server got ready
            self._stop()
            raise VLLMServerError(_CANCELLED)
        if not result.ready:
            self._stop()
            raise VLLMStartupTimeout(self.startup_timeout, self.log_tail(), str(self._active_log))
        tree.ready = True
        log.info("vLLM server at %s is ready after %.1fs", self.base_url, result.elapsed)

    def _log_progress(self, elapsed: float, last_error: str | None) -> None:
        last_line = printable(self.log_tail(lines=1).strip())  # never a terminal's control
        log.info(
            "vLLM server at %s not ready after %.0fs (%s); last log line: %s",
            self.base_url,
            elapsed,
            last_error,
            last_line or "(none yet)",
        )


def _hide_secrets(text: str, argv: Sequence[str], env: Mapping[str, str]) -> str:
    """``text`` (the server's own log) with the secrets verirl knows of hidden.

    vLLM logs its arguments at start-up (``non-default args: {... 'api_key':
    [...]}``) and a failing program may print its environment: every value
    `redact_argv` hides in the server's command line, the secret variables of
    this process and of the server's ``env``, and the saved Hub login are
    replaced wherever they appear, and URL passwords and credentials as
    `redact_text` hides them.
    """
    secrets = set(known_secrets()) | set(secrets_in_environ(env))
    for word, shown in zip(argv, redact_argv(argv), strict=True):
        if word != shown:
            secrets.add(word)
            _, equals, value = word.partition("=")
            if equals and value:
                secrets.add(value)
    # A secret shorter than 4 characters would hide ordinary words.
    text = scrub_all(text, (s for s in secrets if len(s) >= 4), HIDDEN)  # noqa: PLR2004
    return "\n".join(redact_text(line) for line in text.split("\n"))


def _longest_part(argv: Sequence[str], environ: Mapping[str, str]) -> str:
    """What makes a command too long to start (E2BIG), named, never shown: a value may be secret.

    The kernel refuses one string over 128 KiB (`_MAX_STRING`), or all of
    them together, with a pointer each, over its bound: the string over the
    first is named; else the counts and the total.
    """
    sizes = [(name, len(os.fsencode(f"{name}={value}")) + 1) for name, value in environ.items()]
    args = [len(os.fsencode(arg)) + 1 for arg in argv]
    total = sum(size for _, size in sizes) + sum(args) + _POINTER * (len(sizes) + len(args))
    name, size = max(sizes, key=lambda part: part[1], default=("", 0))
    place = max(range(len(args)), key=args.__getitem__, default=0)
    if name == "CUDA_VISIBLE_DEVICES" and size > _MAX_STRING:
        gpus = len(environ["CUDA_VISIBLE_DEVICES"].split(","))
        return f"its CUDA_VISIBLE_DEVICES lists {gpus} GPUs; use fewer"
    if size > _MAX_STRING and size >= max(args, default=0):
        shown = shortened(printable(name), 80)
        why = f"over the {_MAX_STRING} one may be; shorten it"
        return f"the variable {shown} is {size} bytes, {why}"
    if args and args[place] > _MAX_STRING:
        return (
            f"argument {place} of the command is {args[place]} bytes, over the {_MAX_STRING} "
            "one may be; shorten it"
        )
    return (
        f"{len(args)} arguments and {len(sizes)} variables, {total} bytes in all with the "
        "kernel's pointers; shorten the command line or the environment"
    )


_MAX_STRING = 32 * 4096
"""The longest string the kernel takes in a command line or an environment (``MAX_ARG_STRLEN``)."""

_POINTER = 8
"""Bytes the kernel counts for each string besides its own (a pointer to it)."""

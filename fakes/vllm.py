"""`FakeVLLMServer`: a `verirl.ServerHandle` that stands in for `verirl.VLLMServer`, no process.

For unit tests of code that starts a vLLM server (an adapter, the runtime)::

    from fakes import FakeVLLMServer

    server = FakeVLLMServer("m", startup_delay=0.2)
    with server:
        assert server.running
    assert (server.starts, server.stops) == (1, 1)

    broken = FakeVLLMServer("m", fail_with=VLLMServerExited(1, "CUDA out of memory"))
    with pytest.raises(VLLMServerExited):
        broken.start()

It stands beside `VLLMServer`, as httpx's ``MockTransport`` stands beside
``BaseTransport``: its own class implementing the same `verirl.ServerHandle`
(``base_url``, ``start``, ``stop``, ``running``, ``pid``, ``returncode``,
``log_path``, ``log_tail()``, ``check_log()``, ``cut_stop_short()``) plus the
settings. It takes
`VLLMServer`'s arguments and checks them by building the `VLLMServer` they
describe, which spawns nothing until started (and this one never is): so the
same `ConfigError`, the same ``serve_args``, the same ``from_topology``.

A fake runs once, like a thread: `stop` ends it for good, and a later `start`
is refused with `VLLMServerError`. `stop` from another thread during the
``startup_delay`` cancels the start at once (`start` then raises
`VLLMServerError`, as `VLLMServer.start` does), so a caller that aborts a start
in progress is tested against the behaviour of the real server.

With ``serve_http=True`` it also serves, on ``host:port`` and in this process,
the HTTP API of ``python -m fakes.vllm_serve`` started with those
``serve_args``: by default vLLM's server as TRL 1.x launches it, enough for
TRL's real ``VLLMClient`` (generation, ``/server_info``, weight-transfer calls
recorded at ``GET /verirl/calls/``); with ``protocol="trl-legacy"``, TRL 0.2x's
``trl vllm-serve``. Its environment is what `VLLMServer` gives its child
(``os.environ``, ``VLLM_SERVER_DEV_MODE=1``, then ``env``), so the dev-mode
endpoints answer unless ``env={"VLLM_SERVER_DEV_MODE": "0"}``. When a real
process is wanted, run ``python -m fakes.vllm_serve`` under `VLLMServer`
instead::

    with FakeVLLMServer("m", port=8123, serve_http=True) as server:
        client = VLLMClient(base_url=server.base_url)  # trl.generation.vllm_client
        client.generate(["Hello"], n=2, max_tokens=8)
"""

from __future__ import annotations

import errno
import math
import os
import threading
import time
import types
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fakes._http import serve_in_background, stop_serving
from verirl import (
    ConfigError,
    PortInUseError,
    VLLMServer,
    VLLMServerError,
    VLLMServerExited,
)
from verirl.topology import ServerTopology

if TYPE_CHECKING:
    import http.server

    from typing_extensions import Self

__all__ = ["FakeVLLMServer"]


_PROTOCOLS = ("vllm", "trl-legacy")
_DEV_MODE_VAR = "VLLM_SERVER_DEV_MODE"
_LOG_TAIL_LINES = 40
_KNOBS = ("fail_with", "startup_delay", "serve_http", "protocol", "clock", "sleep")

# The life of a fake: IDLE -> STARTING -> RUNNING -> STOPPED; a failed start goes back to IDLE.
_IDLE, _STARTING, _RUNNING, _STOPPED = "idle", "starting", "running", "stopped"


def _check_delay(value: object) -> float:
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not math.isfinite(value)
        or value < 0
    ):
        raise ConfigError.invalid("startup_delay", value, "must be a finite number of seconds >= 0")
    return float(value)


def _check_protocol(value: object) -> str:
    if value not in _PROTOCOLS:
        raise ConfigError.invalid("protocol", value, "must be 'vllm' or 'trl-legacy'")
    return str(value)


class FakeVLLMServer:
    """A scripted vLLM server: `VLLMServer`'s constructor, no child process.

    Scripting knobs (keyword-only; every other argument is `VLLMServer`'s):

    - ``fail_with``: an exception `start` raises (every time) after
      ``startup_delay``, as a real server that failed and was cleaned up;
    - ``startup_delay``: seconds `start` blocks before it is "ready"; `stop`
      from another thread cuts it short;
    - ``serve_http``: bind ``host:port`` and serve the fake server's HTTP API
      (see `fakes.vllm_serve`) while running;
    - ``protocol``: ``"vllm"`` (default: vLLM's server, as TRL 1.x runs it) or
      ``"trl-legacy"`` (TRL 0.2x's ``trl vllm-serve``), what ``serve_http``
      speaks;
    - ``clock``: time source for the records (default: monotonic);
    - ``sleep``: called with ``startup_delay`` instead of waiting for real (a
      fake clock's, to run instantly); a `stop` meanwhile takes effect when it
      returns.

    Records: ``starts`` (starts attempted, failed and cancelled ones included;
    not refused ones), ``stops`` (stops that ended a run or a start in
    progress: at most one), ``started_at`` / ``ready_at`` / ``stopped_at``
    (``clock()`` readings). ``pid`` is always ``None``: there is no process to
    signal. ``log_path`` is the requested path (``None`` by default, no temp
    file); when given, one line per event is appended to it. ``log_tail()``
    gives the same lines, kept in memory.
    """

    def __init__(
        self,
        model: str,
        *,
        fail_with: BaseException | None = None,
        startup_delay: float = 0.0,
        serve_http: bool = False,
        protocol: str = "vllm",
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] | None = None,
        **server_args: Any,  # noqa: ANN401 - VLLMServer's arguments, which it checks
    ) -> None:
        self._init(
            VLLMServer(model, **server_args),
            fail_with=fail_with,
            startup_delay=startup_delay,
            serve_http=serve_http,
            protocol=protocol,
            clock=clock,
            sleep=sleep,
        )

    def _init(
        self,
        spec: VLLMServer,
        *,
        fail_with: BaseException | None = None,
        startup_delay: float = 0.0,
        serve_http: bool = False,
        protocol: str = "vllm",
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], None] | None = None,
    ) -> None:
        self._spec = spec  # the real server these settings describe; never started
        self.fail_with = fail_with
        self.startup_delay = _check_delay(startup_delay)
        self.serve_http = bool(serve_http)
        self.protocol = _check_protocol(protocol)
        self.clock = clock
        self.sleep = sleep
        self.starts = 0
        self.stops = 0
        self.started_at: float | None = None
        self.ready_at: float | None = None
        self.stopped_at: float | None = None
        self._state = _IDLE
        self._lock = threading.Lock()
        self._cancelled = threading.Event()
        self._lines: list[str] = []
        self._httpd: http.server.ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    @classmethod
    def from_topology(
        cls,
        topology: ServerTopology,
        *,
        model: str,
        **overrides: Any,  # noqa: ANN401 - the knobs, then VLLMServer's arguments
    ) -> Self:
        """A fake for ``topology``'s local server, as `VLLMServer.from_topology` builds it.

        ``overrides`` holds the scripting knobs and any `VLLMServer` argument;
        a topology that runs no local server is a `ConfigError`.
        """
        knobs = {name: overrides.pop(name) for name in _KNOBS if name in overrides}
        fake = cls.__new__(cls)
        spec = VLLMServer.from_topology(topology, model=model, **overrides)
        fake._init(spec, **knobs)  # noqa: SLF001 - this class's own initialiser
        return fake

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(model={self.model!r}, base_url={self.base_url!r}, "
            f"devices={self.devices!r}, running={self.running}, pid=None, "
            f"log_path={None if self.log_path is None else str(self.log_path)!r})"
        )

    # ------------------------------------------------------------ VLLMServer's settings

    @property
    def model(self) -> str:
        """The model the server would serve."""
        return self._spec.model

    @property
    def host(self) -> str:
        """The address the server binds."""
        return self._spec.host

    @property
    def port(self) -> int:
        """The port the server binds."""
        return self._spec.port

    @property
    def devices(self) -> tuple[int, ...]:
        """GPU indices, as this process numbers them."""
        return self._spec.devices

    @property
    def max_model_len(self) -> int | None:
        """The ``--max-model-len`` flag, if set."""
        return self._spec.max_model_len

    @property
    def gpu_memory_utilization(self) -> float:
        """The ``--gpu-memory-utilization`` flag."""
        return self._spec.gpu_memory_utilization

    @property
    def tensor_parallel_size(self) -> int:
        """The ``--tensor-parallel-size`` flag."""
        return self._spec.tensor_parallel_size

    @property
    def data_parallel_size(self) -> int:
        """The ``--data-parallel-size`` flag."""
        return self._spec.data_parallel_size

    @property
    def extra_args(self) -> tuple[str, ...]:
        """Flags after the others."""
        return self._spec.extra_args

    @property
    def command(self) -> tuple[str, ...] | None:
        """The program `VLLMServer` would run instead of TRL's choice, if given."""
        return self._spec.command

    @property
    def env(self) -> Mapping[str, str]:
        """Variables added to the server's environment."""
        return self._spec.env

    @property
    def startup_timeout(self) -> float:
        """`VLLMServer`'s ``startup_timeout`` (the fake's start takes ``startup_delay``)."""
        return self._spec.startup_timeout

    @property
    def shutdown_timeout(self) -> float:
        """`VLLMServer`'s ``shutdown_timeout`` (the fake stops at once)."""
        return self._spec.shutdown_timeout

    @property
    def serve_args(self) -> tuple[str, ...]:
        """The flags after the command, exactly as `VLLMServer` builds them."""
        return self._spec.serve_args

    @property
    def base_url(self) -> str:
        """``http://host:port`` (a wildcard host is reached over loopback), as `VLLMServer`'s."""
        return self._spec.base_url

    # ------------------------------------------------------------ state

    @property
    def pid(self) -> int | None:
        """Always ``None``: the fake has no process."""
        return None

    @property
    def running(self) -> bool:
        """Between a successful `start` and `stop`."""
        return self._state == _RUNNING

    @property
    def returncode(self) -> int | None:
        """Always ``None``: the fake has no process to exit."""
        return None

    @property
    def log_path(self) -> Path | None:
        """The requested ``log_path`` (the fake makes no temp files)."""
        return self._spec.log_path

    def check_log(self) -> None:
        """What `VLLMServer.check_log` would refuse about the log (doctor's preflight)."""
        self._spec.check_log()

    def log_tail(self, lines: int = _LOG_TAIL_LINES) -> str:
        """The last ``lines`` lines of what this fake logged ("" before a start)."""
        kept = self._lines[-lines:] if lines > 0 else []
        return "".join(f"{line}\n" for line in kept)

    # ------------------------------------------------------------ lifecycle

    def start(self) -> None:
        """Count the start, wait ``startup_delay``, then raise ``fail_with`` or become ready.

        Raises `VLLMServerError` if the fake is running or starting already, if
        it was stopped before (a fake runs once), or if `stop` is called while
        it waits.
        """
        with self._lock:
            if self._state in (_STARTING, _RUNNING):
                raise VLLMServerError(f"the vLLM server on port {self.port} is already started")
            if self._state == _STOPPED:
                raise VLLMServerError(
                    f"the fake vLLM server on port {self.port} was stopped and cannot be "
                    "started again; make a new FakeVLLMServer"
                )
            self._state = _STARTING
            self.starts += 1
        try:
            self.started_at = self.clock()
            self._note(f"start: {' '.join(self.serve_args)}")
            self._wait(self.startup_delay)
        except BaseException:
            self._give_up()
            raise
        with self._lock:
            if self._state == _STOPPED:  # stop() was called meanwhile and counted it
                raise VLLMServerError(
                    "stop() was called while the fake vLLM server was starting; it was stopped"
                )
            if self.fail_with is not None:
                self._state = _IDLE
                self._note(f"failed: {type(self.fail_with).__name__}")
                raise self.fail_with
            # As with the real server: once serving, a failure or Ctrl-C before start()
            # returns stops serving again, since no `__exit__` will run.
            try:
                if self.serve_http:
                    self._serve()
                self.ready_at = self.clock()
            except BaseException:
                self._stop_serving()
                self._state = _IDLE
                raise
            self._state = _RUNNING

    def stop(self) -> None:
        """End the run, or cancel a start in progress; safe to call any number of times.

        Before any start (or after only failed ones) there is nothing to stop and
        nothing changes, as with `VLLMServer`.
        """
        with self._lock:
            if self._state in (_IDLE, _STOPPED):
                return
            if self._state == _STARTING:
                self._cancelled.set()  # start() wakes up and raises
            else:
                self._stop_serving()  # interrupted, the fake still counts as running: stop() again
            self._state = _STOPPED
            self.stops += 1
            self.stopped_at = self.clock()
            self._note("stop")

    def cut_stop_short(self) -> None:
        """Nothing to cut short: the fake's `stop` has no grace."""

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: types.TracebackType | None,
    ) -> None:
        self.stop()

    # ------------------------------------------------------------ internals

    def _wait(self, seconds: float) -> None:
        if not seconds:
            return
        if self.sleep is None:
            self._cancelled.wait(seconds)  # returns at once when stop() is called
        else:
            self.sleep(seconds)

    def _give_up(self) -> None:
        """An interrupted wait: back to idle, unless stop() already ended the fake."""
        with self._lock:
            if self._state == _STARTING:
                self._state = _IDLE

    def _stop_serving(self) -> None:
        stop_serving(self._httpd, self._thread)
        self._httpd = None
        self._thread = None

    def _serve(self) -> None:
        # Imported here: `import fakes` must not load the module that
        # `python -m fakes.vllm_serve` runs as __main__ (runpy warns otherwise).
        from fakes.vllm_serve import (  # noqa: PLC0415
            UsageError,
            dev_mode_from_environ,
            make_http_server,
            parse_args,
        )

        # What VLLMServer's child would see; a bad flag or variable is a server that exits.
        environ = {**os.environ, _DEV_MODE_VAR: "1", **self.env}
        try:
            args = parse_args(self.serve_args, raise_errors=True)
            dev_mode = dev_mode_from_environ(environ)
        except UsageError as exc:
            raise self._exited(2, f"error: {exc}") from None
        except ValueError as exc:
            raise self._exited(2, f"error: {exc}") from None
        try:
            self._httpd = make_http_server(
                self.host,
                self.port,
                args=args,
                protocol=self.protocol,
                dev_mode=dev_mode,
                environ=environ,
            )
        except OSError as exc:
            if exc.errno == errno.EADDRINUSE:
                raise PortInUseError(self.port, self.host) from None
            raise
        self._thread = serve_in_background(self._httpd, f"fake-vllm-{self.port}")

    def _exited(self, code: int, message: str) -> VLLMServerExited:
        self._note(message)
        log_path = self.log_path
        return VLLMServerExited(code, f"{message}\n", None if log_path is None else str(log_path))

    def _note(self, message: str) -> None:
        line = f"fake vLLM server {message}"
        self._lines.append(line)
        log_path = self.log_path
        if log_path is not None:
            with log_path.open("a", encoding="utf-8") as handle:
                handle.write(f"{line}\n")

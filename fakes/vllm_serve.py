"""A stand-in for ``trl vllm-serve``: same flags, same health endpoints, real workers, no GPU.

Run it wherever a test would run ``trl vllm-serve``::

    python -m fakes.vllm_serve --model Qwen/Qwen3-0.6B --host 127.0.0.1 --port 8001

or hand it to `verirl.VLLMServer`::

    import sys
    from verirl import VLLMServer

    with VLLMServer("m", command=[sys.executable, "-m", "fakes.vllm_serve"]) as server:
        ...  # GET {server.base_url}/health/ answers 200 {"status": "ok"}

It accepts every flag of trl's ``vllm-serve`` (underscore and dash spellings),
starts ``tensor_parallel_size * data_parallel_size`` real worker processes the
way vLLM starts its engine workers, binds the port only once "loaded" (so the
port refuses connections until then, as with real vLLM), and serves:

- ``GET /health/`` → 200 ``{"status": "ok"}`` (what trl's ``VLLMClient`` checks);
- ``GET /get_world_size/`` → ``{"world_size": tp * dp}``;
- ``GET /get_tensor_parallel_size/`` → ``{"tensor_parallel_size": tp}`` (older trl);
- ``GET /verirl/argv/``, ``/verirl/args/``, ``/verirl/workers/`` → its argv, parsed
  flags and worker pids; ``GET /verirl/env/`` → its environment, answered to
  loopback clients only (it may hold tokens).

On SIGTERM or SIGINT it shuts down like uvicorn: stops serving, terminates
its workers, waits for them and exits 0. Its workers also die with it (they
set ``PR_SET_PDEATHSIG`` on Linux) unless told otherwise.

Behaviour knobs are environment variables, so ``VLLMServer(env=...)`` can set
them:

``FAKE_VLLM_STARTUP_DELAY``
    seconds of "model loading" after the workers start and before the port is
    bound.
``FAKE_VLLM_LOAD_UNTIL``
    a file path: "loading" goes on (after ``FAKE_VLLM_STARTUP_DELAY``) until
    that file exists, so a test decides exactly when the port is bound.
``FAKE_VLLM_CRASH``
    ``"code:message"``: once the workers are up, write ``message`` to stderr
    and exit with ``code``, without stopping the workers (a crash).
``FAKE_VLLM_IGNORE_SIGTERM``
    ``1``: the server and its workers ignore SIGTERM; only SIGKILL stops them.
``FAKE_VLLM_WORKER_NEW_SESSION``
    ``1``: each worker calls ``setsid()``, leaving the server's process group
    (so a group-wide signal misses it).
``FAKE_VLLM_ORPHAN_WORKERS``
    ``1``: workers do not die with the server (no death signal), like engine
    workers that outlive a killed API server and keep their GPU.
``FAKE_VLLM_SHUTDOWN_DELAY``
    seconds a graceful shutdown takes before the server exits.

Every worker logs ``Started worker process [PID]`` and the server logs
``Started server process [PID]``, so tests can find the pids in the log even
when the server never got as far as answering HTTP.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import ctypes.util
import functools
import http.server
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, NoReturn

__all__ = [
    "FakeVLLMKnobs",
    "ServeArgs",
    "build_parser",
    "main",
    "make_http_server",
    "parse_args",
]

_WORKER_FLAG = "--verirl-worker"
_WORKER_READY_TIMEOUT = 30.0
_WORKER_STOP_TIMEOUT = 5.0
_PR_SET_PDEATHSIG = 1
_LOOPBACK = ("127.0.0.1", "::1", "::ffff:127.0.0.1")
_QUIET_LEVELS = ("warning", "error", "critical")


def _str2bool(value: str) -> bool:
    """Parse a boolean the way transformers' ``HfArgumentParser`` does."""
    lowered = value.lower()
    if lowered in ("yes", "true", "t", "y", "1"):
        return True
    if lowered in ("no", "false", "f", "n", "0"):
        return False
    msg = f"Truthy value expected: got {value!r}; expected yes/no, true/false, t/f, y/n or 1/0"
    raise argparse.ArgumentTypeError(msg)


@dataclass(frozen=True)
class ServeArgs:
    """The flags of ``trl vllm-serve`` (its ``ScriptArguments``), with trl's defaults."""

    model: str
    revision: str | None = None
    tensor_parallel_size: int = 1
    data_parallel_size: int = 1
    host: str = "0.0.0.0"
    port: int = 8000
    gpu_memory_utilization: float = 0.9
    dtype: str = "auto"
    max_model_len: int | None = None
    enable_prefix_caching: bool | None = None
    enforce_eager: bool | None = None
    kv_cache_dtype: str = "auto"
    trust_remote_code: bool = False
    log_level: str = "info"
    vllm_model_impl: str = "vllm"
    distributed_executor_backend: str | None = None

    @property
    def world_size(self) -> int:
        """How many workers the server runs: tensor × data parallel size."""
        return self.tensor_parallel_size * self.data_parallel_size


def build_parser() -> argparse.ArgumentParser:
    """An argparse parser for trl's flags, each under both ``--a_b`` and ``--a-b``.

    Boolean flags behave as in ``HfArgumentParser``: ``--enforce_eager`` alone
    means true, ``--enforce_eager false`` means false.
    """
    parser = argparse.ArgumentParser(
        prog="python -m fakes.vllm_serve",
        description="Fake `trl vllm-serve` for tests: no GPU, no model, real processes.",
    )

    def add(name: str, **kwargs: Any) -> None:  # noqa: ANN401 - argparse's own signature
        spellings = [f"--{name}"]
        if "_" in name:
            spellings.append(f"--{name.replace('_', '-')}")
        parser.add_argument(*spellings, dest=name, **kwargs)

    def add_bool(name: str, default: bool | None) -> None:
        add(name, type=_str2bool, nargs="?", const=True, default=default, metavar="BOOL")

    add("model", required=True, help="model name or path")
    add("revision", default=None)
    add("tensor_parallel_size", type=int, default=1)
    add("data_parallel_size", type=int, default=1)
    add("host", default="0.0.0.0", help="address to bind (trl's default: 0.0.0.0)")
    add("port", type=int, default=8000)
    add("gpu_memory_utilization", type=float, default=0.9)
    add("dtype", default="auto")
    add("max_model_len", type=int, default=None)
    add_bool("enable_prefix_caching", None)
    add_bool("enforce_eager", None)
    add("kv_cache_dtype", default="auto")
    add_bool("trust_remote_code", default=False)
    add("log_level", default="info")
    add("vllm_model_impl", default="vllm")
    add("distributed_executor_backend", default=None)
    return parser


def parse_args(argv: Sequence[str] | None = None) -> ServeArgs:
    """Parse ``trl vllm-serve`` flags; unknown flags exit with status 2, as argparse does."""
    namespace = build_parser().parse_args(None if argv is None else list(argv))
    return ServeArgs(**vars(namespace))


@dataclass(frozen=True)
class FakeVLLMKnobs:
    """The ``FAKE_VLLM_*`` environment variables, parsed (see the module docstring)."""

    startup_delay: float = 0.0
    crash_code: int | None = None
    crash_message: str = ""
    ignore_sigterm: bool = False
    worker_new_session: bool = False
    orphan_workers: bool = False
    shutdown_delay: float = 0.0
    load_until: str = ""

    @classmethod
    def from_environ(cls, environ: Mapping[str, str]) -> FakeVLLMKnobs:
        """Read the knobs; a malformed value raises ``ValueError`` naming the variable."""

        def number(name: str) -> float:
            raw = environ.get(name, "").strip()
            try:
                return float(raw) if raw else 0.0
            except ValueError:
                msg = f"{name}={raw!r}: must be a number of seconds"
                raise ValueError(msg) from None

        def flag(name: str) -> bool:
            return environ.get(name, "").strip().lower() in ("1", "true", "yes", "on")

        crash_code: int | None = None
        crash_message = ""
        crash = environ.get("FAKE_VLLM_CRASH", "").strip()
        if crash:
            code, _, crash_message = crash.partition(":")
            try:
                crash_code = int(code)
            except ValueError:
                msg = f"FAKE_VLLM_CRASH={crash!r}: must look like 'code:message'"
                raise ValueError(msg) from None
        return cls(
            startup_delay=number("FAKE_VLLM_STARTUP_DELAY"),
            crash_code=crash_code,
            crash_message=crash_message,
            ignore_sigterm=flag("FAKE_VLLM_IGNORE_SIGTERM"),
            worker_new_session=flag("FAKE_VLLM_WORKER_NEW_SESSION"),
            orphan_workers=flag("FAKE_VLLM_ORPHAN_WORKERS"),
            shutdown_delay=number("FAKE_VLLM_SHUTDOWN_DELAY"),
            load_until=environ.get("FAKE_VLLM_LOAD_UNTIL", ""),
        )


# ------------------------------------------------------------------ logging


def _log(message: str, level: str = "INFO") -> None:
    """A vLLM-looking log line on stdout (which `verirl.VLLMServer` sends to its log file)."""
    stamp = time.strftime("%m-%d %H:%M:%S")
    print(f"{level} {stamp} [fake_vllm_serve] {message}", flush=True)  # noqa: T201 - a program's log


def _uvicorn(message: str) -> None:
    print(f"INFO:     {message}", flush=True)  # noqa: T201 - a program's log


# ------------------------------------------------------------------ HTTP


class _HTTPServer(http.server.ThreadingHTTPServer):
    daemon_threads = True
    routes: dict[str, Callable[[], object]]
    private_routes: frozenset[str]
    access_log: bool


class _HTTPServerV6(_HTTPServer):
    address_family = socket.AF_INET6


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _HTTPServer
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002, ANN401
        """Silence http.server's own stderr lines; `_access` writes uvicorn-style ones."""

    def _access(self, status: int, reason: str) -> None:
        if self.server.access_log:
            host, port = self.client_address[:2]
            _uvicorn(f'{host}:{port} - "{self.command} {self.path} HTTP/1.1" {status} {reason}')

    def _reply(self, status: int, reason: str, body: object) -> None:
        data = json.dumps(body).encode()
        self.send_response(status, reason)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        self._access(status, reason)

    def do_GET(self) -> None:
        path = self.path.split("?", 1)[0]
        route = self.server.routes.get(path)
        if route is None:
            self._reply(404, "Not Found", {"detail": "Not Found"})
        elif path in self.server.private_routes and self.client_address[0] not in _LOOPBACK:
            self._reply(403, "Forbidden", {"detail": "loopback clients only"})
        else:
            self._reply(200, "OK", route())


def _constant(body: object) -> object:
    return body


def make_http_server(
    host: str,
    port: int,
    *,
    world_size: int,
    tensor_parallel_size: int | None = None,
    extra_routes: Mapping[str, Callable[[], object]] | None = None,
    private_routes: Sequence[str] = (),
    access_log: bool = False,
) -> http.server.ThreadingHTTPServer:
    """Bind a threaded HTTP server with trl's read-only endpoints; the caller serves it.

    ``/health/`` and ``/get_world_size/`` answer as trl's server does (with and
    without the trailing slash). ``extra_routes`` maps more GET paths to
    functions returning a JSON-able body; ``private_routes`` among them answer
    only loopback clients. Raises ``OSError`` if the address is taken.
    """
    tp = world_size if tensor_parallel_size is None else tensor_parallel_size
    routes: dict[str, Callable[[], object]] = {}
    for path, body in (
        ("/health", {"status": "ok"}),
        ("/get_world_size", {"world_size": world_size}),
        ("/get_tensor_parallel_size", {"tensor_parallel_size": tp}),
    ):
        routes[path] = routes[path + "/"] = functools.partial(_constant, body)
    routes.update(extra_routes or {})
    server_class = _HTTPServerV6 if ":" in host else _HTTPServer
    httpd = server_class((host, port), _Handler)
    httpd.routes = routes
    httpd.private_routes = frozenset(private_routes)
    httpd.access_log = access_log
    return httpd


# ------------------------------------------------------------------ processes


def _set_death_signal(sig: int, expected_parent: int) -> None:
    """Ask Linux to send ``sig`` when the parent dies; exit now if it already has."""
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(ctypes.util.find_library("c"), use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, sig, 0, 0, 0)
    if os.getppid() != expected_parent:
        os._exit(1)


class _Shutdown(BaseException):
    """Raised by the SIGTERM/SIGINT handler to unwind into the graceful shutdown."""


def _install_shutdown_handlers(ignore_sigterm: bool) -> None:
    def on_signal(signum: int, _frame: object) -> NoReturn:
        # A second signal during shutdown is ignored: the first one is being handled.
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        _uvicorn(f"Received {signal.Signals(signum).name}; shutting down")
        raise _Shutdown

    signal.signal(signal.SIGTERM, signal.SIG_IGN if ignore_sigterm else on_signal)
    signal.signal(signal.SIGINT, on_signal)


def _start_workers(count: int) -> list[subprocess.Popen[bytes]]:
    """Start ``count`` worker processes and wait until each has set itself up."""
    read_fd, write_fd = os.pipe()
    workers: list[subprocess.Popen[bytes]] = []
    try:
        for rank in range(count):
            argv = [sys.executable, str(Path(__file__).resolve()), _WORKER_FLAG, str(rank)]
            argv += [str(write_fd), str(os.getpid())]
            workers.append(subprocess.Popen(argv, pass_fds=(write_fd,)))
        os.close(write_fd)
        write_fd = -1
        _await_workers(read_fd, count)
    except BaseException:
        _stop_workers(workers)
        raise
    finally:
        os.close(read_fd)
        if write_fd >= 0:
            os.close(write_fd)
    return workers


def _await_workers(read_fd: int, count: int) -> None:
    """Read one byte per worker from the pipe they were handed; fail if they never come."""
    ready = 0
    deadline = time.monotonic() + _WORKER_READY_TIMEOUT
    while ready < count:
        left = deadline - time.monotonic()
        readable, _, _ = select.select([read_fd], [], [], max(left, 0.0))
        chunk = os.read(read_fd, 64) if readable else b""
        if not chunk:
            msg = f"only {ready} of {count} workers started"
            raise RuntimeError(msg)
        ready += len(chunk)


def _stop_workers(workers: Sequence[subprocess.Popen[bytes]]) -> None:
    for worker in workers:
        if worker.poll() is None:
            worker.terminate()
    for worker in workers:
        try:
            worker.wait(timeout=_WORKER_STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            worker.kill()
            worker.wait()
        _log(f"Worker process [{worker.pid}] exited with {worker.returncode}")


def _worker_main(argv: Sequence[str]) -> int:
    """One engine worker: announce itself, then idle until signalled."""
    rank, ready_fd, parent = (int(value) for value in argv)
    knobs = FakeVLLMKnobs.from_environ(os.environ)
    if not knobs.orphan_workers:
        _set_death_signal(signal.SIGTERM, parent)
    if knobs.worker_new_session:
        os.setsid()
    signal.signal(signal.SIGTERM, signal.SIG_IGN if knobs.ignore_sigterm else signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the server coordinates Ctrl-C
    cuda = os.environ.get("CUDA_VISIBLE_DEVICES", "<unset>")
    _log(f"Started worker process [{os.getpid()}] rank={rank} CUDA_VISIBLE_DEVICES={cuda}")
    os.write(ready_fd, b"1")
    os.close(ready_fd)
    while True:
        time.sleep(3600)


def _load_until(path: str) -> None:
    """Keep "loading" until ``path`` exists (no-op for ``""``); a signal still ends it."""
    delay = 0.005
    while path and not Path(path).exists():
        time.sleep(delay)
        delay = min(delay * 2, 0.05)


def _serve_main(args: ServeArgs, argv: Sequence[str]) -> int:
    knobs = FakeVLLMKnobs.from_environ(os.environ)
    _install_shutdown_handlers(knobs.ignore_sigterm)
    _log("vLLM API server version 0.0.0+fake (verirl fakes.vllm_serve: no GPU, no model)")
    _log(f"Started server process [{os.getpid()}]")
    _log(f"non-default args: {json.dumps(asdict(args))}")
    workers: list[subprocess.Popen[bytes]] = []
    httpd: http.server.ThreadingHTTPServer | None = None
    thread: threading.Thread | None = None
    try:
        workers = _start_workers(args.world_size)
        if knobs.crash_code is not None:
            print(knobs.crash_message, file=sys.stderr, flush=True)  # noqa: T201 - a program's log
            return knobs.crash_code  # a crash: the workers are left to fend for themselves
        _log(f"Loading model {args.model} (fake: {knobs.startup_delay:g}s)")
        time.sleep(knobs.startup_delay)
        _load_until(knobs.load_until)
        _log("Model loading took 0.00 GiB and 0.000000 seconds")
        try:
            httpd = make_http_server(
                args.host,
                args.port,
                world_size=args.world_size,
                tensor_parallel_size=args.tensor_parallel_size,
                extra_routes={
                    "/verirl/argv/": lambda: {"argv": list(argv)},
                    "/verirl/args/": lambda: asdict(args),
                    "/verirl/workers/": lambda: {"pids": [w.pid for w in workers]},
                    "/verirl/env/": lambda: {"env": dict(os.environ)},
                },
                private_routes=("/verirl/env/",),
                access_log=args.log_level.lower() not in _QUIET_LEVELS,
            )
        except OSError as exc:
            print(  # noqa: T201 - a program's log
                f"ERROR:    [Errno {exc.errno}] error while attempting to bind on address "
                f"({args.host!r}, {args.port}): {exc.strerror}",
                file=sys.stderr,
                flush=True,
            )
            return 1
        thread = threading.Thread(
            target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )
        thread.start()
        _uvicorn("Waiting for application startup.")
        _uvicorn("Application startup complete.")
        _uvicorn(f"Uvicorn running on http://{args.host}:{args.port} (Press CTRL+C to quit)")
        while True:
            time.sleep(3600)
    except _Shutdown:
        _uvicorn("Shutting down")
        with contextlib.suppress(_Shutdown):  # a signal that raced the handler's SIG_IGN
            if httpd is not None:
                httpd.shutdown()
                httpd.server_close()
            if thread is not None:
                thread.join(timeout=_WORKER_STOP_TIMEOUT)
            _stop_workers(workers)
            time.sleep(knobs.shutdown_delay)
        _uvicorn(f"Finished server process [{os.getpid()}]")
        return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the fake server (or, internally, one of its workers); return the exit status."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == [_WORKER_FLAG]:
        return _worker_main(args[1:])
    return _serve_main(parse_args(args), args)


if __name__ == "__main__":
    sys.exit(main())

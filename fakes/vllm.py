"""`FakeVLLMServer`: `verirl.VLLMServer`'s interface with no process at all.

For unit tests of code that starts a vLLM server (an adapter, the runtime)::

    from fakes import FakeVLLMServer

    server = FakeVLLMServer("m", startup_delay=0.2)
    with server:
        assert server.running
    assert (server.starts, server.stops) == (1, 1)

    broken = FakeVLLMServer("m", fail_with=VLLMServerExited(1, "CUDA out of memory"))
    with pytest.raises(VLLMServerExited):
        broken.start()

It subclasses `VLLMServer`, so it takes the same arguments, checks them the
same way (`ConfigError`), builds the same ``serve_args`` and has the same
``from_topology``; only `start` and `stop` differ. With ``serve_http=True`` it
also serves, on ``host:port`` and in this process, the HTTP API of
``python -m fakes.vllm_serve`` started with those ``serve_args``: by default
vLLM's server as TRL 1.x launches it, enough for TRL's real ``VLLMClient``
(generation, ``/server_info``, weight-transfer calls recorded at
``GET /verirl/calls/``); with ``protocol="trl-legacy"``, TRL 0.2x's
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
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import attrs

from fakes._http import serve_in_background, stop_serving
from verirl._validate import check_number
from verirl.errors import ConfigError, PortInUseError, VLLMServerError, VLLMServerExited
from verirl.vllm_server import VLLMServer

if TYPE_CHECKING:
    import http.server

__all__ = ["FakeVLLMServer"]


_PROTOCOLS = ("vllm", "trl-legacy")
_DEV_MODE_VAR = "VLLM_SERVER_DEV_MODE"


def _v_delay(_: object, attribute: attrs.Attribute[float], value: object) -> None:
    check_number(attribute.name, value, non_negative=True)


def _v_protocol(_: object, attribute: attrs.Attribute[str], value: object) -> None:
    if value not in _PROTOCOLS:
        raise ConfigError.invalid(attribute.name, value, "must be 'vllm' or 'trl-legacy'")


@attrs.define(eq=False, repr=False)
class FakeVLLMServer(VLLMServer):
    """A scripted vLLM server: same constructor as `VLLMServer`, no child process.

    Scripting knobs (keyword-only):

    - ``fail_with``: an exception `start` raises (every time) after
      ``startup_delay``, as a real server that failed and was cleaned up;
    - ``startup_delay``: seconds `start` blocks before it is "ready", through
      ``sleep`` (inject a fake clock's sleep to run instantly);
    - ``serve_http``: bind ``host:port`` and serve the fake server's HTTP API
      (see `fakes.vllm_serve`) while running;
    - ``protocol``: ``"vllm"`` (default: vLLM's server, as TRL 1.x runs it) or
      ``"trl-legacy"`` (TRL 0.2x's ``trl vllm-serve``), what ``serve_http``
      speaks;
    - ``clock`` / ``sleep``: time source and sleeper (default: monotonic, real).

    Records: ``starts`` (starts attempted, failed ones included; not a refused
    second start of a running fake), ``stops`` (effective stops, so a
    second `stop` does not count), ``started_at`` / ``ready_at`` /
    ``stopped_at`` (``clock()`` readings of the last run). ``pid`` is always
    ``None``: there is no process to signal. ``log_path`` is the requested
    path (``None`` by default, no temp file); when given, one line per
    start/stop is appended to it.
    """

    fail_with: BaseException | None = attrs.field(default=None, kw_only=True)
    startup_delay: float = attrs.field(default=0.0, kw_only=True, validator=_v_delay)
    serve_http: bool = attrs.field(default=False, kw_only=True)
    protocol: str = attrs.field(default="vllm", kw_only=True, validator=_v_protocol)
    clock: Callable[[], float] = attrs.field(default=time.monotonic, kw_only=True, repr=False)
    sleep: Callable[[float], None] = attrs.field(default=time.sleep, kw_only=True, repr=False)
    starts: int = attrs.field(default=0, init=False)
    stops: int = attrs.field(default=0, init=False)
    started_at: float | None = attrs.field(default=None, init=False)
    ready_at: float | None = attrs.field(default=None, init=False)
    stopped_at: float | None = attrs.field(default=None, init=False)
    _fake_running: bool = attrs.field(default=False, init=False, repr=False)
    _httpd: http.server.ThreadingHTTPServer | None = attrs.field(
        default=None, init=False, repr=False
    )
    _thread: threading.Thread | None = attrs.field(default=None, init=False, repr=False)

    @property
    def pid(self) -> int | None:
        """Always ``None``: the fake has no process."""
        return None

    @property
    def running(self) -> bool:
        """Between a successful `start` and `stop`."""
        return self._fake_running

    @property
    def log_path(self) -> Path | None:
        """The requested ``log_path`` (the fake makes no temp files)."""
        return self._log_path

    def start(self) -> None:
        """Count the start, wait ``startup_delay``, then raise ``fail_with`` or become ready."""
        if self._fake_running:
            raise VLLMServerError(f"the vLLM server on port {self.port} is already started")
        self.starts += 1
        self.started_at = self.clock()
        self._note(f"start: {' '.join(self.serve_args)}")
        if self.startup_delay:
            self.sleep(self.startup_delay)
        if self.fail_with is not None:
            self._note(f"failed: {type(self.fail_with).__name__}")
            raise self.fail_with
        # As with the real server: once serving, a failure or Ctrl-C before start() returns
        # stops serving again, since no `__exit__` will run.
        try:
            if self.serve_http:
                self._serve()
            self.ready_at = self.clock()
            self._fake_running = True
        except BaseException:
            self._stop_serving()
            raise

    def stop(self) -> None:
        """Stop (counted once per run); safe to call any number of times."""
        if not self._fake_running:
            return
        self._stop_serving()  # interrupted, the fake still counts as running: stop() again
        self._fake_running = False
        self.stops += 1
        self.stopped_at = self.clock()
        self._note("stop")

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
            raise VLLMServerExited(2, f"error: {exc}") from None
        except ValueError as exc:
            raise VLLMServerExited(2, f"error: {exc}") from None
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

    def _note(self, message: str) -> None:
        if self._log_path is not None:
            with self._log_path.open("a", encoding="utf-8") as handle:
                handle.write(f"fake vLLM server {message}\n")

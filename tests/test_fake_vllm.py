"""The shipped vLLM fakes: the `fakes.vllm_serve` program and the in-process `FakeVLLMServer`."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time

import attrs
import psutil
import pytest
import requests

from _support import FakeClock, alive, unshared_port
from fakes.vllm import FakeVLLMServer
from fakes.vllm_serve import FakeVLLMKnobs, ServeArgs, parse_args
from verirl._serve_args import vllm_serve_args
from verirl.errors import ConfigError, PortInUseError, VLLMServerError, VLLMServerExited
from verirl.runtime import ServerHandle
from verirl.vllm_server import VLLMServer

FAKE = (sys.executable, "-m", "fakes.vllm_serve")


def gone_within(processes, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while any(alive(p) for p in processes):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.01)
    return True


# ---------------------------------------------------------------- argument parsing

FLAGS = {
    "model": ("Qwen/Qwen3-0.6B", "Qwen/Qwen3-0.6B"),
    "revision": ("main", "main"),
    "tensor_parallel_size": ("2", 2),
    "data_parallel_size": ("3", 3),
    "host": ("127.0.0.1", "127.0.0.1"),
    "port": ("8123", 8123),
    "gpu_memory_utilization": ("0.85", 0.85),
    "dtype": ("bfloat16", "bfloat16"),
    "max_model_len": ("4096", 4096),
    "enable_prefix_caching": ("true", True),
    "enforce_eager": ("false", False),
    "kv_cache_dtype": ("fp8", "fp8"),
    "trust_remote_code": ("True", True),
    "log_level": ("debug", "debug"),
    "vllm_model_impl": ("transformers", "transformers"),
    "distributed_executor_backend": ("mp", "mp"),
}


@pytest.mark.parametrize("spelling", ["underscore", "dash"])
def test_every_trl_flag_parses_in_both_spellings(spelling):
    argv = []
    for name, (raw, _) in FLAGS.items():
        flag = name if spelling == "underscore" else name.replace("_", "-")
        argv += [f"--{flag}", raw]
    args = parse_args(argv)
    assert {name: getattr(args, name) for name in FLAGS} == {
        name: value for name, (_, value) in FLAGS.items()
    }
    assert args.world_size == 6


def test_defaults_are_trls():
    args = parse_args(["--model", "m"])
    assert args == ServeArgs(model="m")
    assert (args.host, args.port, args.tensor_parallel_size) == ("0.0.0.0", 8000, 1)
    assert (args.enforce_eager, args.enable_prefix_caching, args.trust_remote_code) == (
        None,
        None,
        False,
    )


def test_boolean_flags_alone_mean_true():
    args = parse_args(["--model", "m", "--enforce-eager", "--trust_remote_code"])
    assert (args.enforce_eager, args.trust_remote_code) == (True, True)


def test_what_verirl_builds_parses():
    argv = vllm_serve_args(
        "m",
        host="127.0.0.1",
        port=9,
        gpu_memory_utilization=0.5,
        max_model_len=1024,
        tensor_parallel_size=2,
        data_parallel_size=2,
        extra_args=["--enforce-eager", "True"],
    )
    args = parse_args(argv)
    assert (args.port, args.max_model_len, args.world_size, args.enforce_eager) == (
        9,
        1024,
        4,
        True,
    )


@pytest.mark.parametrize(
    "argv",
    [
        [],  # --model is required
        ["--model", "m", "--no-such-flag", "1"],
        ["--model", "m", "--port", "eighty"],
        ["--model", "m", "--enforce_eager", "maybe"],
    ],
)
def test_bad_arguments_exit_with_status_2(argv, capsys):
    with pytest.raises(SystemExit) as info:
        parse_args(argv)
    assert info.value.code == 2
    assert "usage:" in capsys.readouterr().err


def test_knobs_from_the_environment():
    knobs = FakeVLLMKnobs.from_environ(
        {
            "FAKE_VLLM_STARTUP_DELAY": "1.5",
            "FAKE_VLLM_CRASH": "3:CUDA out of memory: tried: 2 GiB",
            "FAKE_VLLM_IGNORE_SIGTERM": "1",
            "FAKE_VLLM_WORKER_NEW_SESSION": "true",
            "FAKE_VLLM_ORPHAN_WORKERS": "0",
            "FAKE_VLLM_SHUTDOWN_DELAY": "0.25",
            "FAKE_VLLM_LOAD_UNTIL": "/tmp/go",
        }
    )
    assert knobs == FakeVLLMKnobs(
        startup_delay=1.5,
        crash_code=3,
        crash_message="CUDA out of memory: tried: 2 GiB",
        ignore_sigterm=True,
        worker_new_session=True,
        orphan_workers=False,
        shutdown_delay=0.25,
        load_until="/tmp/go",
    )
    assert FakeVLLMKnobs.from_environ({}) == FakeVLLMKnobs()


@pytest.mark.parametrize(
    ("name", "value"),
    [("FAKE_VLLM_STARTUP_DELAY", "soon"), ("FAKE_VLLM_CRASH", "boom")],
)
def test_malformed_knobs_name_the_variable(name, value):
    with pytest.raises(ValueError, match=name):
        FakeVLLMKnobs.from_environ({name: value})


# ---------------------------------------------------------------- the program on its own


@pytest.fixture
def run_fake(tmp_path):
    """Start the fake program directly (own session, output to a file); kill its group after."""
    started: list[subprocess.Popen[bytes]] = []

    def run(*flags: str, env: dict[str, str] | None = None) -> subprocess.Popen[bytes]:
        log = (tmp_path / f"fake-{len(started)}.log").open("wb")
        with log:
            proc = subprocess.Popen(
                [*FAKE, *flags],
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, **(env or {})},
                start_new_session=True,
            )
        started.append(proc)
        return proc

    yield run
    for proc in started:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def wait_healthy(base_url: str, proc: subprocess.Popen[bytes], timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, "the fake server exited"
        try:
            if requests.get(base_url + "/health/", timeout=1).status_code == 200:
                return
        except requests.ConnectionError:
            time.sleep(0.02)
    pytest.fail("the fake server never became healthy")


def test_program_serves_trls_endpoints_and_stops_its_workers_on_sigterm(run_fake):
    port = unshared_port()
    proc = run_fake(
        "--model", "m", "--host", "127.0.0.1", "--port", str(port),
        "--tensor_parallel_size", "2", "--data-parallel-size", "2",
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    wait_healthy(base, proc)
    assert requests.get(base + "/health/", timeout=5).json() == {"status": "ok"}
    assert requests.get(base + "/health", timeout=5).json() == {"status": "ok"}
    assert requests.get(base + "/get_world_size/", timeout=5).json() == {"world_size": 4}
    assert requests.get(base + "/get_tensor_parallel_size/", timeout=5).json() == {
        "tensor_parallel_size": 2
    }
    assert requests.get(base + "/nope/", timeout=5).status_code == 404
    assert "PATH" in requests.get(base + "/verirl/env/", timeout=5).json()["env"]
    pids = requests.get(base + "/verirl/workers/", timeout=5).json()["pids"]
    workers = [psutil.Process(pid) for pid in pids]
    assert len(workers) == 4
    assert all(w.ppid() == proc.pid for w in workers)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=10) == 0
    assert gone_within(workers, timeout=30)


def test_program_crash_knob_exits_with_the_code_and_workers_die_with_it(run_fake, tmp_path):
    port = unshared_port()
    proc = run_fake(
        "--model", "m", "--port", str(port), "--tensor-parallel-size", "2",
        env={"FAKE_VLLM_CRASH": "7:RuntimeError: engine core failed"},
    )  # fmt: skip
    assert proc.wait(timeout=20) == 7
    log = (tmp_path / "fake-0.log").read_text()
    assert "RuntimeError: engine core failed" in log
    pids = [int(pid) for pid in re.findall(r"Started worker process \[(\d+)\]", log)]
    assert len(pids) == 2
    workers = []
    for pid in pids:
        try:
            workers.append(psutil.Process(pid))
        except psutil.NoSuchProcess:
            continue
    assert gone_within(workers, timeout=10)  # the death signal took them down


def test_program_load_until_knob_binds_the_port_only_once_the_file_exists(run_fake, tmp_path):
    port = unshared_port()
    go = tmp_path / "go"
    log = tmp_path / "fake-0.log"
    proc = run_fake("--model", "m", "--port", str(port), env={"FAKE_VLLM_LOAD_UNTIL": str(go)})
    deadline = time.monotonic() + 60
    while "Loading model m" not in log.read_text() and time.monotonic() < deadline:
        assert proc.poll() is None, "the fake server exited"
        time.sleep(0.01)
    with pytest.raises(requests.ConnectionError):
        requests.get(f"http://127.0.0.1:{port}/health/", timeout=5)
    go.touch()
    wait_healthy(f"http://127.0.0.1:{port}", proc, timeout=60)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 0


# ---------------------------------------------------------------- FakeVLLMServer


def test_fake_server_records_its_lifecycle():
    clock = FakeClock()
    server = FakeVLLMServer("m", startup_delay=2.5, clock=clock, sleep=clock.sleep)
    assert (server.starts, server.stops, server.running, server.pid) == (0, 0, False, None)
    with server as entered:
        assert entered is server
        assert server.running
        assert server.pid is None
        assert (server.started_at, server.ready_at) == (100.0, 102.5)
        with pytest.raises(VLLMServerError, match="already started"):
            server.start()
    server.stop()
    assert (server.starts, server.stops, server.running) == (1, 1, False)
    assert clock.sleeps == [2.5]
    assert server.stopped_at == 102.5


def test_fake_server_startup_delay_blocks_for_real_by_default():
    server = FakeVLLMServer("m", startup_delay=0.2)
    started = time.monotonic()
    server.start()
    assert time.monotonic() - started >= 0.2
    assert server.ready_at is not None
    assert server.started_at is not None
    assert server.ready_at - server.started_at >= 0.2
    server.stop()


def test_fake_server_fail_with_is_raised_by_every_start():
    error = VLLMServerExited(1, "CUDA out of memory\n")
    server = FakeVLLMServer("m", fail_with=error)
    for _ in range(2):
        with pytest.raises(VLLMServerExited) as info, server:
            pytest.fail("the block must not run")
        assert info.value is error
    assert (server.starts, server.stops, server.running) == (2, 0, False)


def test_fake_server_checks_arguments_like_the_real_one():
    with pytest.raises(ConfigError) as info:
        FakeVLLMServer("m", port=0)
    assert info.value.field == "port"
    with pytest.raises(ConfigError, match="startup_delay"):
        FakeVLLMServer("m", startup_delay=-1)
    fake = FakeVLLMServer("m", port=9, max_model_len=64, tensor_parallel_size=2, devices=(0, 1))
    real = VLLMServer("m", port=9, max_model_len=64, tensor_parallel_size=2, devices=(0, 1))
    assert fake.serve_args == real.serve_args
    assert fake.base_url == real.base_url
    assert isinstance(fake, VLLMServer)
    assert isinstance(fake, ServerHandle)
    assert isinstance(real, ServerHandle)


@attrs.frozen
class StandInTopology:
    mode: str = "server"
    is_local_server: bool = True
    vllm_devices: tuple[int, ...] = (3,)
    host: str = "127.0.0.1"
    port: int = 8555
    max_model_len: int = 2048
    gpu_memory_utilization: float = 0.7
    tensor_parallel_size: int = 1
    data_parallel_size: int = 1


def test_fake_server_from_topology():
    server = FakeVLLMServer.from_topology(StandInTopology(), model="m", startup_delay=0.0)
    assert isinstance(server, FakeVLLMServer)
    assert (server.devices, server.port, server.max_model_len) == ((3,), 8555, 2048)
    with pytest.raises(ConfigError, match="colocate"):
        FakeVLLMServer.from_topology(
            StandInTopology(mode="colocate", is_local_server=False), model="m"
        )


def test_fake_server_can_answer_health_on_loopback():
    server = FakeVLLMServer("m", port=unshared_port(), serve_http=True, tensor_parallel_size=2)
    with server:
        assert requests.get(server.base_url + "/health/", timeout=5).json() == {"status": "ok"}
        world = requests.get(server.base_url + "/get_world_size/", timeout=5).json()
        assert world == {"world_size": 2}
    with pytest.raises(requests.ConnectionError):
        requests.get(server.base_url + "/health/", timeout=5)


def test_fake_server_reports_a_taken_port():
    with socket.create_server(("127.0.0.1", 0)) as holder:
        server = FakeVLLMServer("m", port=holder.getsockname()[1], serve_http=True)
        with pytest.raises(PortInUseError):
            server.start()
    assert not server.running


def test_fake_server_appends_to_a_given_log(tmp_path):
    log_path = tmp_path / "fake.log"
    log_path.write_text("earlier\n")
    with FakeVLLMServer("m", log_path=log_path) as server:
        assert server.log_path == log_path
    lines = log_path.read_text().splitlines()
    assert lines[0] == "earlier"
    assert lines[1].startswith("fake vLLM server start: --model m")
    assert lines[2] == "fake vLLM server stop"


def test_fake_server_interrupted_after_serving_stops_serving():
    readings: list[float] = []

    def clock() -> float:  # the second reading (ready_at) is where Ctrl-C lands
        readings.append(100.0)
        if len(readings) == 2:
            raise KeyboardInterrupt
        return 100.0

    server = FakeVLLMServer("m", port=unshared_port(), serve_http=True, clock=clock)
    try:
        with pytest.raises(KeyboardInterrupt):
            server.start()
        assert not server.running
        with pytest.raises(requests.ConnectionError):
            requests.get(server.base_url + "/health/", timeout=5)
    finally:
        server.stop()

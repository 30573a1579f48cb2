"""The shipped vLLM fakes: the `fakes.vllm_serve` program and the in-process `FakeVLLMServer`.

The HTTP API is checked with plain `requests` against real loopback servers,
both the program (a subprocess, with its workers) and `FakeVLLMServer`
(``serve_http=True``), in vLLM's protocol (the default, with and without
``VLLM_SERVER_DEV_MODE=1``) and in TRL 0.2x's (``trl-legacy``).
"""

from __future__ import annotations

import hashlib
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time

import attrs
import psutil
import pytest
import requests

from _support import FakeClock, alive, unshared_port
from fakes._http import (
    MAX_CONNECTIONS,
    Response,
    bind_json_server,
    serve_in_background,
    stop_serving,
)
from fakes.vllm import FakeVLLMServer
from fakes.vllm_serve import (
    FakeVLLMKnobs,
    ServeArgs,
    dev_mode_from_environ,
    make_http_server,
    parse_args,
)
from verirl import ServerHandle
from verirl.errors import ConfigError, PortInUseError, VLLMServerError, VLLMServerExited
from verirl.server.args import vllm_serve_args
from verirl.vllm_server import VLLMServer

FAKE = (sys.executable, "-m", "fakes.vllm_serve")
MODEL = "fake/model"
MAX_MODEL_LEN = 512


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
    "weight_transfer_config": ('{"backend": "ipc"}', {"backend": "ipc"}),
    "logprobs_mode": ("raw_logprobs", "raw_logprobs"),
    "max_logprobs": ("20", 20),
    "enable_scale_out": ("false", False),
    "uvicorn_log_level": ("warning", "warning"),
    "fake_protocol": ("trl-legacy", "trl-legacy"),
}


@pytest.mark.parametrize("spelling", ["underscore", "dash"])
def test_every_flag_parses_in_both_spellings(spelling):
    argv = []
    for name, (raw, _) in FLAGS.items():
        flag = name if spelling == "underscore" else name.replace("_", "-")
        argv += [f"--{flag}", raw]
    argv += ["--served-model-name" if spelling == "dash" else "--served_model_name", "a", "b"]
    args = parse_args(argv)
    assert {name: getattr(args, name) for name in FLAGS} == {
        name: value for name, (_, value) in FLAGS.items()
    }
    assert args.world_size == 6
    assert args.served_names == ("a", "b")


def test_defaults_are_trls_and_the_vllm_flags_trl_1x_adds():
    args = parse_args(["--model", "m"])
    assert args == ServeArgs(model="m")
    assert (args.host, args.port, args.tensor_parallel_size) == ("0.0.0.0", 8000, 1)
    assert (args.enforce_eager, args.enable_prefix_caching, args.trust_remote_code) == (
        None,
        None,
        False,
    )
    assert args.weight_transfer_config == {"backend": "nccl"}
    assert (args.logprobs_mode, args.max_logprobs, args.enable_scale_out) == (
        "processed_logprobs",
        -1,
        True,
    )
    assert (args.served_names, args.fake_protocol, args.uvicorn_log_level) == (("m",), None, None)


def test_boolean_flags_alone_mean_true_and_no_flags_false():
    args = parse_args(["--model", "m", "--enforce-eager", "--trust_remote_code"])
    assert (args.enforce_eager, args.trust_remote_code) == (True, True)
    args = parse_args(["--model", "m", "--no-enforce-eager", "--no-enable-scale-out"])
    assert (args.enforce_eager, args.enable_scale_out) == (False, False)


def test_what_trl_1x_build_command_runs_parses():
    # trl 1.16's build_command, minus `python -m vllm.entrypoints.cli.main`.
    argv = [
        "serve", "m", "--host", "0.0.0.0", "--port", "8000", "--tensor-parallel-size", "2",
        "--data-parallel-size", "2", "--gpu-memory-utilization", "0.9", "--dtype", "auto",
        "--kv-cache-dtype", "auto", "--model-impl", "transformers", "--uvicorn-log-level", "info",
        "--revision", "main", "--max-model-len", "1024", "--enable-prefix-caching",
        "--enforce-eager", "--trust-remote-code", "--distributed-executor-backend", "mp",
        "--enable-scale-out", "--weight-transfer-config", '{"backend": "nccl"}',
        "--logprobs-mode", "processed_logprobs", "--max-logprobs", "-1",
    ]  # fmt: skip
    args = parse_args(argv)
    assert (args.model, args.world_size, args.vllm_model_impl, args.max_model_len) == (
        "m",
        4,
        "transformers",
        1024,
    )
    assert (args.enforce_eager, args.enable_prefix_caching, args.trust_remote_code) == (
        True,
        True,
        True,
    )
    assert parse_args(["m", "--model", "other"]).model == "m"  # the positional wins, as in vLLM


def test_weight_transfer_config_null_means_none():
    assert (
        parse_args(["--model", "m", "--weight-transfer-config", "null"]).weight_transfer_config
        is None
    )


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
    ("argv", "message"),
    [
        ([], "--model"),  # --model is required
        (["serve"], "--model"),
        (["--model", "m", "--no-such-flag", "1"], "--no-such-flag"),
        (["--model", "m", "--port", "eighty"], "--port"),
        (["--model", "m", "--enforce_eager", "maybe"], "--enforce_eager"),
        (["--model", "m", "--weight-transfer-config", "[1]"], "--weight-transfer-config"),
        (["--model", "m", "--weight-transfer-config", "{"], "--weight-transfer-config"),
        (["--model", "m", "--logprobs-mode", "logits"], "--logprobs-mode"),
        (["--model", "m", "--fake-protocol", "grpc"], "--fake-protocol"),
    ],
)
def test_bad_arguments_exit_with_status_2_naming_the_flag(argv, message, capsys):
    with pytest.raises(SystemExit) as info:
        parse_args(argv)
    assert info.value.code == 2
    err = capsys.readouterr().err
    assert "usage:" in err
    assert message in err


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
            "FAKE_VLLM_PROTOCOL": "trl-legacy",
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
        protocol="trl-legacy",
    )
    assert FakeVLLMKnobs.from_environ({}) == FakeVLLMKnobs()
    assert FakeVLLMKnobs().protocol == "vllm"


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("FAKE_VLLM_STARTUP_DELAY", "soon"),
        ("FAKE_VLLM_CRASH", "boom"),
        ("FAKE_VLLM_PROTOCOL", "grpc"),
    ],
)
def test_malformed_knobs_name_the_variable_and_the_value(name, value):
    with pytest.raises(ValueError, match=f"{name}='{value}'"):
        FakeVLLMKnobs.from_environ({name: value})


@pytest.mark.parametrize(
    ("value", "expected"), [(None, False), ("", False), ("0", False), ("1", True), (" 2 ", True)]
)
def test_dev_mode_is_read_as_vllm_reads_it(value, expected):
    environ = {} if value is None else {"VLLM_SERVER_DEV_MODE": value}
    assert dev_mode_from_environ(environ) is expected


def test_a_dev_mode_that_is_not_an_integer_names_the_variable():
    with pytest.raises(ValueError, match="VLLM_SERVER_DEV_MODE='yes'"):
        dev_mode_from_environ({"VLLM_SERVER_DEV_MODE": "yes"})


# ---------------------------------------------------------------- the program on its own


def program_env(env: dict[str, str] | None = None, unset: tuple[str, ...] = ()) -> dict[str, str]:
    """The test's environment without the fake's knobs, then ``env``."""
    base = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith("FAKE_VLLM_") and name != "VLLM_SERVER_DEV_MODE"
    }
    merged = {**base, **(env or {})}
    for name in unset:
        merged.pop(name, None)
    return merged


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
                env=program_env(env),
                start_new_session=True,
            )
        started.append(proc)
        return proc

    yield run
    for proc in started:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


def wait_healthy(
    base_url: str, proc: subprocess.Popen[bytes], timeout: float = 20, path: str = "/health"
) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, "the fake server exited"
        try:
            if requests.get(base_url + path, timeout=1).status_code == 200:
                return
        except requests.ConnectionError:
            time.sleep(0.02)
    pytest.fail("the fake server never became healthy")


def stop(proc: subprocess.Popen[bytes]) -> int:
    proc.send_signal(signal.SIGTERM)
    return proc.wait(timeout=30)


def test_program_serves_vllms_endpoints_and_stops_its_workers_on_sigterm(run_fake, tmp_path):
    port = unshared_port()
    proc = run_fake(
        "--model", "m", "--host", "127.0.0.1", "--port", str(port),
        "--tensor_parallel_size", "2", "--data-parallel-size", "2",
        env={"VLLM_SERVER_DEV_MODE": "1"},
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    wait_healthy(base, proc)
    health = requests.get(base + "/health", timeout=5)
    assert (health.status_code, health.content) == (200, b"")
    assert requests.get(base + "/health/", timeout=5).url == base + "/health"  # via a 307
    assert requests.get(base + "/get_world_size", timeout=5).json() == {"world_size": 4}
    assert requests.get(base + "/v1/models", timeout=5).json()["data"][0]["id"] == "m"
    assert requests.get(base + "/nope/", timeout=5).status_code == 404
    assert "PATH" in requests.get(base + "/verirl/env/", timeout=5).json()["env"]
    assert requests.get(base + "/verirl/argv/", timeout=5).json()["argv"][:2] == ["--model", "m"]
    assert requests.get(base + "/verirl/args/", timeout=5).json()["model"] == "m"
    pids = requests.get(base + "/verirl/workers/", timeout=5).json()["pids"]
    workers = [psutil.Process(pid) for pid in pids]
    assert len(workers) == 4
    assert all(w.ppid() == proc.pid for w in workers)
    assert stop(proc) == 0
    assert gone_within(workers, timeout=30)
    log = (tmp_path / "fake-0.log").read_text()
    assert "INFO:     Application startup complete." in log
    assert f"INFO:     Uvicorn running on http://127.0.0.1:{port} (Press CTRL+C to quit)" in log
    assert re.search(r'INFO:     127\.0\.0\.1:\d+ - "GET /get_world_size HTTP/1\.1" 200 OK', log)
    assert "fake protocol: vllm; VLLM_SERVER_DEV_MODE=1" in log


def test_program_without_dev_mode_hides_the_dev_endpoints(run_fake):
    port = unshared_port()
    proc = run_fake("--model", "m", "--port", str(port), "--uvicorn-log-level", "warning")
    base = f"http://127.0.0.1:{port}"
    wait_healthy(base, proc)
    for path in ("/server_info", "/get_world_size", "/get_world_size/", "/is_paused"):
        assert requests.get(base + path, timeout=5).json() == {"detail": "Not Found"}, path
    for path in ("/reset_prefix_cache", "/start_weight_update", "/init_weight_transfer_engine"):
        assert requests.post(base + path, json={}, timeout=5).status_code == 404, path
    completion = requests.post(base + "/v1/completions", json={"prompt": "hi"}, timeout=5)
    assert completion.status_code == 200
    assert stop(proc) == 0


@pytest.mark.parametrize(
    ("flags", "env"),
    [
        (("--fake-protocol", "trl-legacy"), {}),
        ((), {"FAKE_VLLM_PROTOCOL": "trl-legacy"}),
    ],
    ids=["flag", "knob"],
)
def test_program_speaks_the_legacy_trl_protocol_when_asked(run_fake, flags, env):
    port = unshared_port()
    proc = run_fake(
        "--model", "m", "--port", str(port), "--tensor-parallel-size", "2", *flags, env=env
    )
    base = f"http://127.0.0.1:{port}"
    wait_healthy(base, proc, path="/health/")
    assert_legacy_protocol(base, world_size=2, tensor_parallel_size=2)
    assert stop(proc) == 0


def test_the_protocol_flag_wins_over_the_knob(run_fake):
    port = unshared_port()
    proc = run_fake(
        "--model", "m", "--port", str(port), "--fake-protocol", "vllm",
        env={"FAKE_VLLM_PROTOCOL": "trl-legacy"},
    )  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    wait_healthy(base, proc)
    assert requests.get(base + "/health", timeout=5, allow_redirects=False).status_code == 200
    assert stop(proc) == 0


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"FAKE_VLLM_PROTOCOL": "grpc"}, "FAKE_VLLM_PROTOCOL='grpc'"),
        ({"VLLM_SERVER_DEV_MODE": "yes"}, "VLLM_SERVER_DEV_MODE='yes'"),
        ({"FAKE_VLLM_STARTUP_DELAY": "soon"}, "FAKE_VLLM_STARTUP_DELAY='soon'"),
    ],
)
def test_program_refuses_a_malformed_variable_naming_it(run_fake, tmp_path, env, message):
    proc = run_fake("--model", "m", "--port", str(unshared_port()), env=env)
    assert proc.wait(timeout=20) == 2
    log = (tmp_path / "fake-0.log").read_text()
    assert f"error: {message}" in log
    assert "Started worker process" not in log


@pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="the workers' death signal is Linux's prctl"
)
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
        requests.get(f"http://127.0.0.1:{port}/health", timeout=5)
    go.touch()
    wait_healthy(f"http://127.0.0.1:{port}", proc, timeout=60)
    assert stop(proc) == 0


def test_program_reports_a_taken_port(run_fake, tmp_path):
    with socket.create_server(("127.0.0.1", 0)) as holder:
        proc = run_fake(
            "--model", "m", "--host", "127.0.0.1", "--port", str(holder.getsockname()[1])
        )
        assert proc.wait(timeout=20) == 1
    assert "error while attempting to bind on address" in (tmp_path / "fake-0.log").read_text()


def non_loopback_address() -> str | None:
    """An address of this machine other than loopback (the one a default route would use)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))  # TEST-NET-1: no packet is sent
        except OSError:
            return None
        address = probe.getsockname()[0]
    return None if address.startswith("127.") or address == "0.0.0.0" else address


def test_program_env_route_answers_loopback_clients_only(run_fake):
    address = non_loopback_address()
    if address is None:
        pytest.skip("this machine has no non-loopback IPv4 address")
    port = unshared_port()
    proc = run_fake("--model", "m", "--host", "0.0.0.0", "--port", str(port))
    wait_healthy(f"http://127.0.0.1:{port}", proc)
    remote = requests.get(f"http://{address}:{port}/verirl/env/", timeout=5)
    assert (remote.status_code, remote.json()) == (403, {"detail": "loopback clients only"})
    assert requests.get(f"http://{address}:{port}/verirl/argv/", timeout=5).status_code == 200
    assert stop(proc) == 0


# ---------------------------------------------------------------- the HTTP API, both ways


@pytest.fixture(scope="module")
def program_server(tmp_path_factory) -> str:
    """The program in dev mode, tp=2, two served names; one per module (it keeps state)."""
    port = unshared_port()
    log = tmp_path_factory.mktemp("program") / "fake.log"
    argv = [
        *FAKE,
        "--model",
        MODEL,
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--tensor-parallel-size",
        "2",
        "--max-model-len",
        str(MAX_MODEL_LEN),
        "--served-model-name",
        MODEL,
        "alias",
        "--uvicorn-log-level",
        "warning",
    ]
    with log.open("wb") as out:
        proc = subprocess.Popen(
            argv,
            stdout=out,
            stderr=subprocess.STDOUT,
            env=program_env({"VLLM_SERVER_DEV_MODE": "1"}),
            start_new_session=True,
        )
    base = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(base, proc)
        yield base
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


@pytest.fixture(scope="module")
def in_process_server() -> str:
    """`FakeVLLMServer` with the same flags (its dev mode is on, as under VLLMServer)."""
    server = FakeVLLMServer(
        MODEL,
        port=unshared_port(),
        serve_http=True,
        tensor_parallel_size=2,
        devices=(0, 1),
        max_model_len=MAX_MODEL_LEN,
        extra_args=("--served-model-name", MODEL, "alias"),
    )
    with server:
        yield server.base_url


@pytest.fixture(scope="module", params=["program", "in-process"])
def base(request) -> str:
    """The base URL of a dev-mode fake: the program, then `FakeVLLMServer`."""
    return request.getfixturevalue(f"{request.param.replace('-', '_')}_server")


def post(base: str, path: str, body: object = None, **kwargs) -> requests.Response:
    return requests.post(base + path, json=body, timeout=30, **kwargs)


def ok(response: requests.Response):
    assert response.status_code == 200, response.text
    return response.json()


def vllm_error(response: requests.Response, status: int, kind: str = "BadRequestError") -> dict:
    assert response.status_code == status, response.text
    body = response.json()
    assert set(body) == {"error"}
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert (error["type"], error["code"]) == (kind, status)
    return error


def complete(base: str, **body) -> dict:
    return ok(post(base, "/v1/completions", {"model": MODEL, **body}))


def test_health_and_starlettes_trailing_slash_redirect(base):
    health = requests.get(base + "/health", timeout=5)
    assert (health.status_code, health.content) == (200, b"")
    assert "content-type" not in health.headers
    redirect = requests.get(base + "/health/", timeout=5, allow_redirects=False)
    assert (redirect.status_code, redirect.headers["location"]) == (307, base + "/health")
    with_query = requests.get(
        base + "/get_world_size/?include_dp=false", timeout=5, allow_redirects=False
    )
    assert with_query.headers["location"] == base + "/get_world_size?include_dp=false"


def test_unknown_paths_and_methods_answer_like_starlette(base):
    missing = requests.get(base + "/nope", timeout=5)
    assert (missing.status_code, missing.json()) == (404, {"detail": "Not Found"})
    assert requests.get(base + "/", timeout=5).status_code == 404
    wrong = requests.get(base + "/v1/completions", timeout=5)
    assert (wrong.status_code, wrong.json()) == (405, {"detail": "Method Not Allowed"})
    assert wrong.headers["allow"] == "POST"
    assert requests.post(base + "/health", timeout=5).headers["allow"] == "GET"
    head = requests.head(base + "/health", timeout=5)
    assert (head.status_code, head.content) == (405, b"")  # vLLM registers GET only
    assert requests.delete(base + "/v1/models", timeout=5).status_code == 405


def test_models_version_and_world_size(base):
    models = ok(requests.get(base + "/v1/models", timeout=5))
    assert models["object"] == "list"
    assert [entry["id"] for entry in models["data"]] == [MODEL, "alias"]
    entry = models["data"][0]
    assert (entry["object"], entry["owned_by"], entry["root"], entry["parent"]) == (
        "model",
        "vllm",
        MODEL,
        None,
    )
    assert entry["max_model_len"] == MAX_MODEL_LEN
    assert entry["permission"][0]["object"] == "model_permission"
    assert ok(requests.get(base + "/version", timeout=5)) == {"version": "0.0.0+fake"}
    assert ok(requests.get(base + "/get_world_size", timeout=5)) == {"world_size": 2}
    assert ok(requests.get(base + "/get_world_size?include_dp=false", timeout=5)) == {
        "world_size": 2
    }
    bad = requests.get(base + "/get_world_size?include_dp=maybe", timeout=5)
    assert vllm_error(bad, 400, "Bad Request")["param"] == "query.include_dp"


def test_server_info_shows_the_config_trl_reads(base):
    info = ok(requests.get(base + "/server_info", params={"config_format": "json"}, timeout=5))
    assert set(info) == {"vllm_config", "vllm_env", "system_env"}
    config = info["vllm_config"]
    assert config["weight_transfer_config"] == {"backend": "nccl"}
    assert config["parallel_config"]["tensor_parallel_size"] == 2
    assert config["model_config"]["served_model_name"] == [MODEL, "alias"]
    assert config["model_config"]["max_model_len"] == MAX_MODEL_LEN
    assert config["model_config"]["logprobs_mode"] == "processed_logprobs"
    assert info["vllm_env"]["VLLM_SERVER_DEV_MODE"] == "1"
    text = ok(requests.get(base + "/server_info", timeout=5))["vllm_config"]
    assert isinstance(text, str)
    assert "weight_transfer_config={'backend': 'nccl'}" in text
    bad = requests.get(base + "/server_info?config_format=yaml", timeout=5)
    assert vllm_error(bad, 400, "Bad Request")["param"] == "query.config_format"


def test_completions_text_prompts_n_choices_prompt_major(base):
    reply = complete(
        base, prompt=["module adder", "the fox"], n=2, max_tokens=5, return_token_ids=True
    )
    assert reply["object"] == "text_completion"
    assert reply["id"].startswith("cmpl-")
    assert reply["model"] == MODEL
    choices = reply["choices"]
    assert [choice["index"] for choice in choices] == [0, 1, 2, 3]
    assert [choice["prompt_token_ids"] for choice in choices] == [
        list(b"module adder"),
        list(b"module adder"),
        list(b"the fox"),
        list(b"the fox"),
    ]
    for choice in choices:
        assert len(choice["token_ids"]) == 5
        assert all(0 <= token < 256 for token in choice["token_ids"])
        assert choice["text"] == bytes(choice["token_ids"]).decode("utf-8", "replace")
        assert (choice["logprobs"], choice["prompt_logprobs"]) == (None, None)
        assert (choice["finish_reason"], choice["stop_reason"]) == ("length", None)
    assert choices[0]["token_ids"] != choices[1]["token_ids"]  # n samples differ
    assert reply["usage"] == {
        "prompt_tokens": 12 + 7,
        "total_tokens": 12 + 7 + 20,
        "completion_tokens": 20,
        "prompt_tokens_details": None,
        "completion_tokens_details": None,
    }
    again = complete(
        base, prompt=["module adder", "the fox"], n=2, max_tokens=5, return_token_ids=True
    )
    assert [c["token_ids"] for c in again["choices"]] == [c["token_ids"] for c in choices]
    reseeded = complete(base, prompt="module adder", max_tokens=5, return_token_ids=True, seed=7)
    assert reseeded["choices"][0]["token_ids"] != choices[0]["token_ids"]
    plain = complete(base, prompt="module adder", model=None)
    assert plain["usage"]["completion_tokens"] == 16  # the default max_tokens
    assert (plain["choices"][0]["token_ids"], plain["choices"][0]["prompt_token_ids"]) == (
        None,
        None,
    )
    assert complete(base, prompt="hi", model="alias")["model"] == "alias"


@pytest.mark.parametrize(
    "prompt", [[5, 6, 7], [[5, 6, 7]], [[5, 6, 7], [200_000, 8]]], ids=["ids", "lists", "two"]
)
def test_completions_token_id_prompts(base, prompt):
    reply = complete(base, prompt=prompt, max_tokens=3, return_token_ids=True)
    expected = [prompt] if isinstance(prompt[0], int) else prompt
    assert [choice["prompt_token_ids"] for choice in reply["choices"]] == expected
    assert all(len(choice["token_ids"]) == 3 for choice in reply["choices"])


def test_completions_logprobs_the_sampled_token_and_k_others(base):
    reply = complete(
        base,
        prompt=["ab", "cd"],
        n=2,
        max_tokens=4,
        logprobs=3,
        return_token_ids=True,
        return_tokens_as_token_ids=True,
    )
    for choice in reply["choices"]:
        logprobs = choice["logprobs"]
        assert set(logprobs) == {"text_offset", "token_logprobs", "tokens", "top_logprobs"}
        assert logprobs["tokens"] == [f"token_id:{token}" for token in choice["token_ids"]]
        assert logprobs["text_offset"][0] == 0
        for token, logprob, top in zip(
            logprobs["tokens"], logprobs["token_logprobs"], logprobs["top_logprobs"], strict=True
        ):
            assert len(top) == 4
            assert next(iter(top)) == token  # the sampled token first, as vLLM lists it
            assert top[token] == logprob
            assert all(value < 0 for value in top.values())
            assert all(re.fullmatch(r"token_id:\d+", key) for key in top)
    zero = complete(base, prompt="ab", max_tokens=4, logprobs=0, return_tokens_as_token_ids=True)
    assert all(len(top) == 1 for top in zero["choices"][0]["logprobs"]["top_logprobs"])
    everything = complete(base, prompt="ab", max_tokens=1, logprobs=-1)["choices"][0]
    assert len(everything["logprobs"]["top_logprobs"][0]) <= 256  # text keys may collide
    text = complete(base, prompt="ab", max_tokens=4, logprobs=1)["choices"][0]["logprobs"]
    assert text["text_offset"] == [sum(map(len, text["tokens"][:i])) for i in range(4)]


def test_prompt_logprobs_rank_the_actual_token_and_agree_with_generation(base):
    generated = complete(
        base, prompt="module adder", max_tokens=6, logprobs=2, return_token_ids=True
    )["choices"][0]
    prompt, completion = generated["prompt_token_ids"], generated["token_ids"]
    scored = complete(base, prompt=[prompt + completion], max_tokens=1, prompt_logprobs=3)
    positions = scored["choices"][0]["prompt_logprobs"]
    assert len(positions) == len(prompt) + len(completion)
    assert positions[0] is None
    sequence = prompt + completion
    for index, position in enumerate(positions[1:], start=1):
        assert str(sequence[index]) in position
        assert len(position) == 4
        ranked = sorted(position.values(), key=lambda entry: entry["rank"])
        assert [entry["rank"] for entry in ranked][:3] == [1, 2, 3]
        values = [entry["logprob"] for entry in ranked]
        assert values == sorted(values, reverse=True)
        assert all(value < 0 for value in values)
        assert all(set(entry) == {"logprob", "rank", "decoded_token"} for entry in ranked)
    # The prompt logprobs of prompt + completion are the logprobs it was generated with.
    for offset, token in enumerate(completion):
        logprob = generated["logprobs"]["token_logprobs"][offset]
        assert positions[len(prompt) + offset][str(token)]["logprob"] == pytest.approx(logprob)
    assert (scored["choices"][0]["token_ids"], scored["choices"][0]["prompt_token_ids"]) == (
        None,
        None,
    )


def test_greedy_sampling_takes_the_best_token(base):
    choice = complete(base, prompt="greedy", max_tokens=8, temperature=0, logprobs=2)["choices"][0]
    for logprob, top in zip(
        choice["logprobs"]["token_logprobs"], choice["logprobs"]["top_logprobs"], strict=True
    ):
        assert logprob == max(top.values())


def test_chat_completions(base):
    messages = [{"role": "user", "content": "hi"}]
    body = {
        "model": MODEL,
        "messages": messages,
        "n": 2,
        "max_tokens": 3,
        "logprobs": True,
        "top_logprobs": 2,
        "return_token_ids": True,
        "return_tokens_as_token_ids": True,
    }
    reply = ok(post(base, "/v1/chat/completions", body))
    assert (reply["object"], reply["model"]) == ("chat.completion", MODEL)
    assert reply["prompt_token_ids"] == list(b"<|user|>\nhi\n<|assistant|>\n")
    assert [choice["index"] for choice in reply["choices"]] == [0, 1]
    for choice in reply["choices"]:
        assert choice["message"]["role"] == "assistant"
        assert choice["message"]["content"] == bytes(choice["token_ids"]).decode("utf-8", "replace")
        assert len(choice["token_ids"]) == 3
        for token, entry in zip(choice["token_ids"], choice["logprobs"]["content"], strict=True):
            assert set(entry) == {"token", "logprob", "bytes", "top_logprobs"}
            assert entry["token"] == f"token_id:{token}"
            assert entry["logprob"] < 0
            assert entry["bytes"] == (list(chr(token).encode()) if token < 128 else [])
            assert len(entry["top_logprobs"]) == 2  # the first top_logprobs: sampled first
            assert entry["top_logprobs"][0]["token"] == entry["token"]
            assert entry["top_logprobs"][0]["bytes"] == list(entry["token"].encode())
    none = ok(post(base, "/v1/chat/completions", {**body, "logprobs": False, "top_logprobs": None}))
    assert none["choices"][0]["logprobs"] is None
    assert none["choices"][0]["token_ids"] == reply["choices"][0]["token_ids"]
    zero = ok(post(base, "/v1/chat/completions", {**body, "top_logprobs": 0}))
    assert zero["choices"][0]["logprobs"]["content"][0]["top_logprobs"] == []
    bare = ok(post(base, "/v1/chat/completions", {"messages": messages}))
    assert (bare["prompt_token_ids"], bare["choices"][0]["token_ids"]) == (None, None)
    assert bare["usage"]["completion_tokens"] == 16
    parts = [{"type": "text", "text": "h"}, {"type": "text", "text": "i"}]
    split = ok(
        post(
            base, "/v1/chat/completions", {**body, "messages": [{"role": "user", "content": parts}]}
        )
    )
    assert split["prompt_token_ids"] == reply["prompt_token_ids"]


PNG = (
    "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAgAAAAICAIAAABLbSncAAAADElEQVR4nGNgGB4AAADIAAGt"
    "QHYiAAAAAElFTkSuQmCC"
)


def image_message(url: str = PNG) -> list[dict]:
    return [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": url}}]}]


def test_render_gives_token_ids_and_fake_features_for_images(base):
    text = ok(
        post(base, "/v1/chat/completions/render", {"messages": [{"role": "user", "content": "hi"}]})
    )
    assert text["token_ids"] == list(b"<|user|>\nhi\n<|assistant|>\n")
    assert text["features"] is None
    assert (text["output_mode"], text["model"]) == ("tokens", MODEL)
    reply = ok(
        post(
            base,
            "/v1/chat/completions/render",
            {"model": MODEL, "messages": image_message(), "max_tokens": 1},
        )
    )
    assert reply["sampling_params"]["max_tokens"] == 1
    features = reply["features"]
    digest = hashlib.sha256(PNG.encode()).hexdigest()
    assert features["mm_hashes"] == {"image": [digest]}
    assert features["mm_placeholders"] == {"image": [{"offset": 9, "length": 7}]}
    assert bytes(reply["token_ids"][9:16]) == b"<image>"
    assert features["mm_metadata"] is None
    assert len(features["kwargs_data"]["image"]) == 1
    again = ok(post(base, "/v1/chat/completions/render", {"messages": image_message()}))
    assert again["features"] == features
    other = ok(post(base, "/v1/chat/completions/render", {"messages": image_message(PNG + "A")}))
    assert other["features"]["mm_hashes"] != features["mm_hashes"]


def test_generate_from_token_ids_and_features(base):
    render = ok(post(base, "/v1/chat/completions/render", {"messages": image_message()}))
    body = {
        "request_id": "r1",
        "model": MODEL,
        "token_ids": render["token_ids"],
        "features": render["features"],
        "sampling_params": {"max_tokens": 3, "logprobs": 2, "n": 2, "output_kind": 2},
    }
    reply = ok(post(base, "/inference/v1/generate", body))
    assert (reply["request_id"], reply["output_mode"]) == ("generate-tokens-r1", "tokens")
    assert (reply["prompt_token_ids"], reply["mm_placeholders"]) == (None, None)
    assert [choice["index"] for choice in reply["choices"]] == [0, 1]
    for choice in reply["choices"]:
        assert len(choice["token_ids"]) == 3
        assert choice["weight_versions"] == [{"version": "default", "start": 0, "end": 3}]
        for token, entry in zip(choice["token_ids"], choice["logprobs"]["content"], strict=True):
            assert entry["token_id"] == token
            assert "token" not in entry  # vLLM 0.32's shape, not the OpenAI one
            assert entry["rank"] >= 1
            assert len(entry["top_logprobs"]) == 2
            assert entry["top_logprobs"][0]["token_id"] == token
            assert set(entry["top_logprobs"][1]) == {"token_id", "logprob", "rank"}
    # render + generate is the chat: the image hashes steer the same way.
    chat = ok(
        post(
            base,
            "/v1/chat/completions",
            {"messages": image_message(), "n": 2, "max_tokens": 3, "return_token_ids": True},
        )
    )
    assert [c["token_ids"] for c in chat["choices"]] == [c["token_ids"] for c in reply["choices"]]
    plain = ok(
        post(
            base,
            "/inference/v1/generate",
            {"token_ids": render["token_ids"], "sampling_params": {"max_tokens": 3}},
        )
    )
    assert plain["choices"][0]["token_ids"] != reply["choices"][0]["token_ids"]
    assert plain["choices"][0]["logprobs"] is None
    echoed = ok(post(base, "/inference/v1/generate", {**body, "return_token_ids": True}))
    assert echoed["prompt_token_ids"] == render["token_ids"]
    assert echoed["mm_placeholders"] == render["features"]["mm_placeholders"]
    zero = ok(post(base, "/inference/v1/generate", {**body, "sampling_params": {"logprobs": 0}}))
    assert len(zero["choices"][0]["token_ids"]) == 16
    assert len(zero["choices"][0]["logprobs"]["content"][0]["top_logprobs"]) == 1
    text = ok(post(base, "/inference/v1/generate", {**body, "output_mode": "text"}))
    choice = text["choices"][0]
    assert choice["text"] == bytes(choice["token_ids"]).decode("utf-8", "replace")
    assert set(choice["logprobs"]["content"][0]) == {"token", "logprob", "bytes", "top_logprobs"}


@pytest.mark.parametrize(
    ("features", "message"),
    [
        (
            {
                "mm_hashes": {"image": ["a"]},
                "mm_placeholders": {"image": [{"offset": 20, "length": 7}]},
            },
            "within the token_ids",
        ),
        (
            {
                "mm_hashes": {"image": ["a"]},
                "mm_placeholders": {"video": [{"offset": 0, "length": 1}]},
            },
            "same modalities",
        ),
        (
            {
                "mm_hashes": {"image": ["a", "b"]},
                "mm_placeholders": {"image": [{"offset": 0, "length": 1}]},
            },
            "same length",
        ),
        (
            {
                "mm_hashes": {"image": ["a", "b"]},
                "mm_placeholders": {
                    "image": [{"offset": 0, "length": 4}, {"offset": 2, "length": 1}]
                },
            },
            "non-overlapping",
        ),
        (
            {
                "mm_hashes": {"image": ["a"]},
                "mm_placeholders": {"image": [{"offset": 0, "length": 1}]},
                "kwargs_data": {"image": []},
            },
            "kwargs_data",
        ),
        (
            {
                "mm_hashes": {"image": ["a"]},
                "mm_placeholders": {"image": [{"offset": -1, "length": 1}]},
            },
            "mm_placeholders",
        ),
        ({"mm_hashes": {"image": [1]}, "mm_placeholders": {"image": []}}, "mm_hashes"),
        ("features", "dictionary"),
    ],
)
def test_generate_checks_features_as_vllm_does(base, features, message):
    body = {"token_ids": list(range(10)), "features": features, "sampling_params": {}}
    error = vllm_error(post(base, "/inference/v1/generate", body), 400, "Bad Request")
    assert message in error["message"]


def test_reset_prefix_cache(base):
    assert ok(post(base, "/reset_prefix_cache")) == {"success": True}
    assert ok(post(base, "/reset_prefix_cache?reset_running_requests=true")) == {"success": True}
    assert requests.get(base + "/reset_prefix_cache", timeout=5).status_code == 405


def calls_since(base: str, start: int) -> list[dict]:
    return ok(requests.get(base + "/verirl/calls/", timeout=5))["calls"][start:]


def calls_now(base: str) -> int:
    return len(ok(requests.get(base + "/verirl/calls/", timeout=5))["calls"])


def test_weight_transfer_calls_are_checked_and_recorded(base):
    start = calls_now(base)
    init_info = {
        "master_address": "10.0.0.1",
        "master_port": 51216,
        "rank_offset": 1,
        "world_size": 3,
    }
    update_info = {"names": ["w"], "dtype_names": ["bfloat16"], "shapes": [[2, 2]]}
    assert ok(post(base, "/init_weight_transfer_engine", {"init_info": init_info})) == {
        "message": "Weight transfer initialized"
    }
    assert ok(post(base, "/start_weight_update", {})) == {"message": "Weight update started"}
    assert ok(post(base, "/update_weights", {"update_info": update_info})) == {
        "message": "Weights updated"
    }
    assert ok(post(base, "/update_weights", {"update_info": [update_info]})) == {
        "message": "Weights updated"
    }
    assert ok(post(base, "/finish_weight_update", {"weight_version": "step-1"})) == {
        "message": "Weight update finished"
    }
    assert ok(requests.get(base + "/weight_info", timeout=5)) == {"weight_version": "step-1"}
    generated = ok(
        post(
            base, "/inference/v1/generate", {"token_ids": [1], "sampling_params": {"max_tokens": 2}}
        )
    )
    assert generated["choices"][0]["weight_versions"][0]["version"] == "step-1"
    assert ok(post(base, "/shutdown_weight_transfer_engine")) == {
        "message": "Weight transfer shut down"
    }
    calls = calls_since(base, start)
    assert [(call["method"], call["path"], call["status"]) for call in calls] == [
        ("POST", "/init_weight_transfer_engine", 200),
        ("POST", "/start_weight_update", 200),
        ("POST", "/update_weights", 200),
        ("POST", "/update_weights", 200),
        ("POST", "/finish_weight_update", 200),
        ("POST", "/shutdown_weight_transfer_engine", 200),
    ]
    assert calls[0]["body"] == {"init_info": init_info}
    assert calls[2]["body"] == {"update_info": update_info}
    assert calls[5]["body"] is None
    assert requests.get(base + "/verirl/calls", timeout=5).url == base + "/verirl/calls/"


def test_big_bodies_are_recorded_by_their_size_only(base):
    start = calls_now(base)
    ok(post(base, "/start_weight_update"))
    ok(post(base, "/update_weights", {"update_info": {"names": ["w"] * 20_000}}))
    ok(post(base, "/finish_weight_update", {}))
    update = calls_since(base, start)[1]
    assert update["path"] == "/update_weights"
    assert update["body"] is None
    assert update["body_bytes"] > 64 * 1024


def test_weight_updates_out_of_order_are_vllms_500s(base):
    start = calls_now(base)
    update = {"update_info": {"names": []}}
    error = vllm_error(post(base, "/update_weights", update), 500, "InternalServerError")
    assert "start_weight_update must be called before update_weights." in error["message"]
    error = vllm_error(post(base, "/finish_weight_update", {}), 500, "InternalServerError")
    assert "without a matching start_weight_update" in error["message"]
    ok(post(base, "/start_weight_update", data=b"{not json"))  # vLLM reads no body here
    error = vllm_error(post(base, "/start_weight_update"), 500, "InternalServerError")
    assert "already active" in error["message"]
    vllm_error(post(base, "/finish_weight_update", {"weight_version": 5}), 400, "Bad Request")
    ok(post(base, "/finish_weight_update", {}))
    assert [call["status"] for call in calls_since(base, start)] == [500, 500, 200, 500, 400, 200]


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        ("/init_weight_transfer_engine", {}, "body.init_info"),
        ("/init_weight_transfer_engine", {"init_info": 3}, "body.init_info"),
        ("/init_weight_transfer_engine", [1], "body"),
        ("/update_weights", {}, "body.update_info"),
        ("/update_weights", {"update_info": 5}, "body.update_info"),
        ("/update_weights", {"update_info": [5]}, "body.update_info"),
    ],
)
def test_weight_transfer_bodies_are_checked(base, path, body, param):
    assert vllm_error(post(base, path, body), 400, "Bad Request")["param"] == param


def test_pause_and_resume(base):
    assert ok(post(base, "/pause?mode=keep")) == {"status": "paused"}
    assert ok(requests.get(base + "/is_paused", timeout=5)) == {"is_paused": True}
    assert ok(post(base, "/resume")) == {"status": "resumed"}
    assert ok(requests.get(base + "/is_paused", timeout=5)) == {"is_paused": False}
    assert vllm_error(post(base, "/pause?mode=later"), 400, "Bad Request")["param"] == "query.mode"


@pytest.mark.parametrize(
    ("path", "body", "status", "kind", "needle"),
    [
        (
            "/v1/completions",
            {"prompt": "hi", "model": "other"},
            404,
            "NotFoundError",
            "The model `other` does not exist. Valid aliases: fake/model, alias.",
        ),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "x"}], "model": "x"},
            404,
            "NotFoundError",
            "does not exist",
        ),
        (
            "/v1/chat/completions/render",
            {"messages": [], "model": "x"},
            404,
            "NotFoundError",
            "does not exist",
        ),
        (
            "/inference/v1/generate",
            {"token_ids": [1], "sampling_params": {}, "model": "x"},
            404,
            "NotFoundError",
            "does not exist",
        ),
        (
            "/v1/completions",
            {"prompt": "hi", "max_tokens": -1},
            400,
            "BadRequestError",
            "max_tokens must be at least 1, got -1. (parameter=max_tokens, value=-1)",
        ),
        (
            "/v1/completions",
            {"prompt": "hi", "max_tokens": 0},
            400,
            "BadRequestError",
            "max_tokens must be at least 1",
        ),
        (
            "/v1/completions",
            {"prompt": "hi", "max_tokens": MAX_MODEL_LEN + 1},
            400,
            "BadRequestError",
            "cannot be greater than max_model_len=512",
        ),
        (
            "/v1/completions",
            {"prompt": "hi", "n": 0},
            400,
            "BadRequestError",
            "n must be at least 1, got 0.",
        ),
        (
            "/v1/completions",
            {"prompt": "hi", "n": 2, "temperature": 0},
            400,
            "BadRequestError",
            "greedy sampling",
        ),
        (
            "/v1/completions",
            {"prompt": "hi", "temperature": -1},
            400,
            "BadRequestError",
            "temperature must be non-negative",
        ),
        (
            "/v1/completions",
            {"prompt": "hi", "n": 1000, "max_tokens": 512},
            400,
            "BadRequestError",
            "at most 500000",
        ),
        (
            "/v1/completions",
            {"prompt": "hi", "n": 4, "max_tokens": 512, "logprobs": -1},
            400,
            "BadRequestError",
            "at most 500000",
        ),
        (
            "/v1/completions",
            {"prompt": "hi", "logprobs": -2},
            400,
            "BadRequestError",
            "`logprobs` must be a positive value or -1.",
        ),
        (
            "/v1/completions",
            {"prompt": "hi", "prompt_logprobs": -2},
            400,
            "BadRequestError",
            "`prompt_logprobs` must be",
        ),
        (
            "/v1/completions",
            {"prompt": "hi", "stream": True},
            400,
            "BadRequestError",
            "does not stream",
        ),
        ("/v1/completions", {}, 400, "BadRequestError", "Either prompt or prompt_embeds"),
        (
            "/v1/completions",
            {"prompt": ""},
            400,
            "BadRequestError",
            "Either prompt or prompt_embeds",
        ),
        (
            "/v1/completions",
            {"prompt": []},
            400,
            "BadRequestError",
            "You must pass at least one prompt",
        ),
        (
            "/v1/completions",
            {"prompt": [""]},
            400,
            "BadRequestError",
            "The decoder prompt cannot be empty",
        ),
        (
            "/v1/completions",
            {"prompt": [[]]},
            400,
            "BadRequestError",
            "The decoder prompt cannot be empty",
        ),
        (
            "/v1/completions",
            {"prompt": [[1 << 18]]},
            400,
            "BadRequestError",
            "Token id 262144 is out of vocabulary",
        ),
        ("/v1/completions", {"prompt": [[-1]]}, 400, "Bad Request", "greater_than_equal"),
        ("/v1/completions", {"prompt": ["a", [1]]}, 400, "Bad Request", "body.prompt"),
        ("/v1/completions", {"prompt": 5}, 400, "Bad Request", "string_type"),
        ("/v1/completions", {"prompt": "hi", "max_tokens": "x"}, 400, "Bad Request", "int_parsing"),
        ("/v1/completions", {"prompt": "hi", "n": 1.5}, 400, "Bad Request", "int_from_float"),
        ("/v1/completions", {"prompt": "hi", "n": True}, 400, "Bad Request", "int_type"),
        ("/v1/completions", {"prompt": "hi", "seed": "x"}, 400, "Bad Request", "body.seed"),
        (
            "/v1/completions",
            {"prompt": "hi", "temperature": "hot"},
            400,
            "Bad Request",
            "body.temperature",
        ),
        (
            "/v1/completions",
            {"prompt": "hi", "return_token_ids": "yes"},
            400,
            "Bad Request",
            "bool_type",
        ),
        ("/v1/completions", {"prompt": "hi", "model": 5}, 400, "Bad Request", "body.model"),
        ("/v1/completions", [1, 2], 400, "Bad Request", "model_attributes_type"),
        ("/v1/chat/completions", {}, 400, "Bad Request", "body.messages"),
        ("/v1/chat/completions", {"messages": "hi"}, 400, "Bad Request", "list_type"),
        ("/v1/chat/completions", {"messages": []}, 400, "BadRequestError", "empty conversation"),
        (
            "/v1/chat/completions",
            {"messages": [{"content": "x"}]},
            400,
            "Bad Request",
            "body.messages.0.role",
        ),
        ("/v1/chat/completions", {"messages": ["x"]}, 400, "Bad Request", "body.messages.0"),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": 5}]},
            400,
            "Bad Request",
            "body.messages.0.content",
        ),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": [{"type": "bogus"}]}]},
            400,
            "BadRequestError",
            "Unsupported chat content part type: 'bogus'",
        ),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": [{"type": "text", "text": 1}]}]},
            400,
            "Bad Request",
            "text",
        ),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
            400,
            "Bad Request",
            "image_url.url",
        ),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": ["x"]}]},
            400,
            "Bad Request",
            "content",
        ),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "u", "content": "x"}], "top_logprobs": 2},
            400,
            "BadRequestError",
            "when using `top_logprobs`, `logprobs` must be set to true.",
        ),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "u", "content": "x"}], "logprobs": True, "top_logprobs": -2},
            400,
            "BadRequestError",
            "`top_logprobs` must be a positive value or -1.",
        ),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "u", "content": "x"}], "stream": True},
            400,
            "BadRequestError",
            "does not stream",
        ),
        (
            "/v1/chat/completions",
            {"messages": [{"role": "u", "content": "x"}], "max_completion_tokens": 0},
            400,
            "BadRequestError",
            "max_tokens must be at least 1",
        ),
        ("/v1/chat/completions/render", {}, 400, "Bad Request", "body.messages"),
        ("/inference/v1/generate", {"sampling_params": {}}, 400, "Bad Request", "body.token_ids"),
        (
            "/inference/v1/generate",
            {"token_ids": 5, "sampling_params": {}},
            400,
            "Bad Request",
            "list_type",
        ),
        (
            "/inference/v1/generate",
            {"token_ids": [], "sampling_params": {}},
            400,
            "Bad Request",
            "too_short",
        ),
        ("/inference/v1/generate", {"token_ids": [1]}, 400, "Bad Request", "body.sampling_params"),
        (
            "/inference/v1/generate",
            {"token_ids": [1], "sampling_params": 5},
            400,
            "Bad Request",
            "dict_type",
        ),
        (
            "/inference/v1/generate",
            {"token_ids": [1], "sampling_params": {"n": 0}},
            400,
            "BadRequestError",
            "n must be at least 1",
        ),
        (
            "/inference/v1/generate",
            {"token_ids": [1], "sampling_params": {"max_tokens": "x"}},
            400,
            "Bad Request",
            "body.sampling_params.max_tokens",
        ),
        (
            "/inference/v1/generate",
            {"token_ids": [1], "sampling_params": {}, "output_mode": "json"},
            400,
            "Bad Request",
            "output_mode",
        ),
        (
            "/inference/v1/generate",
            {"token_ids": [1], "sampling_params": {}, "stream": True},
            400,
            "BadRequestError",
            "does not stream",
        ),
    ],
)
def test_bad_requests_answer_in_vllms_error_shape(base, path, body, status, kind, needle):  # noqa: PLR0917
    assert needle in vllm_error(post(base, path, body), status, kind)["message"]


def test_malformed_bodies(base):
    broken = post(
        base, "/v1/completions", data=b"{not json", headers={"Content-Type": "application/json"}
    )
    assert "json_invalid" in vllm_error(broken, 400, "Bad Request")["message"]
    texty = post(
        base, "/v1/completions", data=b'{"prompt": "hi"}', headers={"Content-Type": "text/plain"}
    )
    assert "Unsupported Media Type" in vllm_error(texty, 400, "Bad Request")["message"]
    empty = post(base, "/v1/completions", data=b"", headers={"Content-Type": "application/json"})
    assert vllm_error(empty, 400, "Bad Request")["param"] == "body"
    charset = post(
        base,
        "/v1/completions",
        data=b'{"prompt": "hi"}',
        headers={"Content-Type": "application/json; charset=utf-8"},
    )
    assert charset.status_code == 200
    nested = post(
        base, "/v1/completions", data=b"[" * 100_000, headers={"Content-Type": "application/json"}
    )
    vllm_error(nested, 400, "Bad Request")
    digits = post(
        base,
        "/v1/completions",
        data=b'{"n": ' + b"9" * 10_000 + b"}",
        headers={"Content-Type": "application/json"},
    )
    vllm_error(digits, 400, "Bad Request")
    binary = post(
        base,
        "/v1/completions",
        data=bytes(range(256)),
        headers={"Content-Type": "application/json"},
    )
    vllm_error(binary, 400, "Bad Request")
    surrogate = post(
        base,
        "/v1/completions",
        data=b'{"prompt": "hi", "model": "\\ud800"}',
        headers={"Content-Type": "application/json"},
    )
    assert "does not exist" in vllm_error(surrogate, 404, "NotFoundError")["message"]
    huge = post(base, "/v1/completions", {"prompt": "hi", "max_tokens": 10**400})
    assert "cannot be greater than max_model_len" in vllm_error(huge, 400)["message"]
    infinite = post(
        base,
        "/v1/completions",
        data=b'{"prompt": "hi", "temperature": 1e999}',
        headers={"Content-Type": "application/json"},
    )
    vllm_error(infinite, 400, "Bad Request")
    assert requests.get(base + "/health", timeout=5).status_code == 200  # still serving


def raw_http(base: str, request: bytes) -> bytes:
    """Send ``request`` as is; read until the server closes the connection."""
    host, port = base.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(request)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks)


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        (b"Content-Length: 5000000\r\n", b"413 "),  # reason phrase: 3.13 renamed it
        (b"Content-Length: 12abc\r\n", b"400 Bad Request"),
        (b"Content-Length: -1\r\n", b"400 Bad Request"),
        (b"Transfer-Encoding: chunked\r\n", b"411 Length Required"),
    ],
    ids=["too-large", "garbage-length", "negative-length", "chunked"],
)
def test_bodies_are_bounded(base, headers, status):
    request = b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
    reply = raw_http(base, request + headers + b"\r\n")
    assert reply.startswith(b"HTTP/1.1 " + status)
    assert b"connection: close" in reply.lower()
    assert requests.get(base + "/health", timeout=5).status_code == 200


def test_a_client_that_hangs_up_mid_body_costs_nothing(base):
    request = b'POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{"pro'
    host, port = base.removeprefix("http://").rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(request)
        sock.shutdown(socket.SHUT_WR)
        assert sock.recv(65536).startswith(b"HTTP/1.1 400")
    assert requests.get(base + "/health", timeout=5).status_code == 200


def test_a_redirect_without_a_host_header_names_the_servers_address(base):
    reply = raw_http(base, b"GET /health/ HTTP/1.0\r\n\r\n")
    assert reply.startswith(b"HTTP/1.1 307")
    assert f"location: {base}/health".encode() in reply.lower()


def test_keep_alive_connections_serve_many_requests(base):
    with requests.Session() as session:
        for _ in range(5):
            assert session.post(base + "/v1/completions", json={"prompt": "x"}, timeout=5).ok
            assert session.get(base + "/nope", timeout=5).status_code == 404


# ---------------------------------------------------------------- dev mode, scale-out, protocol


def assert_legacy_protocol(base: str, *, world_size: int, tensor_parallel_size: int) -> None:
    health = requests.get(base + "/health/", timeout=5)
    assert (health.status_code, health.json()) == (200, {"status": "ok"})
    redirect = requests.get(base + "/health", timeout=5, allow_redirects=False)
    assert (redirect.status_code, redirect.headers["location"]) == (307, base + "/health/")
    assert requests.get(base + "/get_world_size/", timeout=5).json() == {"world_size": world_size}
    assert requests.get(base + "/get_tensor_parallel_size/", timeout=5).json() == {
        "tensor_parallel_size": tensor_parallel_size
    }
    assert requests.get(base + "/v1/models", timeout=5).json() == {"detail": "Not Found"}
    assert requests.get(base + "/verirl/calls/", timeout=5).json() == {"calls": []}


def test_fake_server_speaks_the_legacy_protocol_when_asked():
    server = FakeVLLMServer(
        "m",
        port=unshared_port(),
        serve_http=True,
        protocol="trl-legacy",
        tensor_parallel_size=2,
        devices=(0, 1),
    )
    with server:
        assert_legacy_protocol(server.base_url, world_size=2, tensor_parallel_size=2)


def test_fake_server_rejects_an_unknown_protocol():
    with pytest.raises(ConfigError) as info:
        FakeVLLMServer("m", protocol="grpc")
    assert (info.value.field, info.value.value) == ("protocol", "grpc")
    assert "protocol='grpc'" in str(info.value)


@pytest.mark.parametrize("value", ["0", ""])
def test_fake_server_without_dev_mode_hides_the_dev_endpoints(value):
    server = FakeVLLMServer(
        "m", port=unshared_port(), serve_http=True, env={"VLLM_SERVER_DEV_MODE": value}
    )
    with server:
        base = server.base_url
        for path in ("/server_info", "/get_world_size", "/weight_info", "/is_paused"):
            assert requests.get(base + path, timeout=5).status_code == 404, path
        for path in ("/reset_prefix_cache", "/finish_weight_update", "/update_weights", "/pause"):
            assert requests.post(base + path, json={}, timeout=5).status_code == 404, path
        assert requests.get(base + "/health", timeout=5).status_code == 200
        assert ok(post(base, "/v1/completions", {"prompt": "hi", "max_tokens": 2}))["model"] == "m"


def test_fake_server_without_scale_out_refuses_render_and_generate():
    server = FakeVLLMServer(
        "m", port=unshared_port(), serve_http=True, extra_args=("--no-enable-scale-out",)
    )
    with server:
        for path in ("/v1/chat/completions/render", "/inference/v1/generate"):
            error = vllm_error(post(server.base_url, path, {}), 403, "PermissionDeniedError")
            assert "--enable-scale-out" in error["message"]


def test_fake_server_without_weight_transfer_reports_none_and_refuses_init():
    server = FakeVLLMServer(
        "m",
        port=unshared_port(),
        serve_http=True,
        extra_args=("--weight-transfer-config", "null", "--max-logprobs", "5"),
    )
    with server:
        base = server.base_url
        info = ok(requests.get(base + "/server_info?config_format=json", timeout=5))
        assert info["vllm_config"]["weight_transfer_config"] is None
        error = vllm_error(
            post(base, "/init_weight_transfer_engine", {"init_info": {}}),
            500,
            "InternalServerError",
        )
        assert "--weight-transfer-config" in error["message"]
        error = vllm_error(post(base, "/v1/completions", {"prompt": "a", "logprobs": 6}), 400)
        assert error["message"] == (
            "Requested sample logprobs of 6, which is greater than max allowed: 5 "
            "(parameter=logprobs, value=6)"
        )
        error = vllm_error(
            post(base, "/v1/completions", {"prompt": "a", "prompt_logprobs": -1}), 400
        )
        assert "Requested prompt logprobs of 262144" in error["message"]
        error = vllm_error(
            post(
                base,
                "/v1/chat/completions",
                {"messages": [{"role": "u", "content": "x"}], "logprobs": True, "top_logprobs": 6},
            ),
            400,
        )
        assert "greater than max allowed: 5" in error["message"]


@pytest.mark.parametrize(
    ("kwargs", "code", "needle"),
    [
        ({"extra_args": ("--no-such-flag",)}, 2, "unrecognized arguments: --no-such-flag"),
        ({"env": {"VLLM_SERVER_DEV_MODE": "on"}}, 2, "VLLM_SERVER_DEV_MODE='on'"),
    ],
)
def test_fake_server_with_a_bad_flag_or_variable_exits_like_the_program(kwargs, code, needle):
    server = FakeVLLMServer("m", port=unshared_port(), serve_http=True, **kwargs)
    with pytest.raises(VLLMServerExited) as info:
        server.start()
    assert info.value.returncode == code
    assert needle in info.value.log_tail
    assert not server.running


def test_make_http_server_alone_keeps_its_old_signature():
    port = unshared_port()
    httpd = make_http_server("127.0.0.1", port, world_size=4)
    thread = serve_in_background(httpd, "plain")
    try:
        base = f"http://127.0.0.1:{port}"
        assert requests.get(base + "/health", timeout=5).status_code == 200
        assert requests.get(base + "/get_world_size", timeout=5).status_code == 404  # no dev mode
        assert ok(requests.get(base + "/v1/models", timeout=5))["data"][0]["id"] == "fake/model"
    finally:
        stop_serving(httpd, thread)
    port = unshared_port()
    httpd = make_http_server(
        "127.0.0.1",
        port,
        world_size=4,
        tensor_parallel_size=2,
        dev_mode=True,
        protocol="trl-legacy",
    )
    thread = serve_in_background(httpd, "legacy")
    try:
        assert_legacy_protocol(f"http://127.0.0.1:{port}", world_size=4, tensor_parallel_size=2)
    finally:
        stop_serving(httpd, thread)


@pytest.mark.parametrize(
    ("kwargs", "needle"),
    [
        ({"protocol": "grpc"}, "protocol='grpc'"),
        ({"world_size": 3, "tensor_parallel_size": 2}, "not a multiple"),
        ({"world_size": 2, "args": ServeArgs(model="m")}, "either args"),
    ],
)
def test_make_http_server_refuses_bad_arguments(kwargs, needle):
    with pytest.raises(ValueError, match=needle):
        make_http_server("127.0.0.1", unshared_port(), **kwargs)


def test_a_handler_bug_is_a_500_not_a_dead_server():
    def broken(_request):
        raise RuntimeError("bug")

    port = unshared_port()
    lines: list[str] = []
    routes = {
        "/boom": {"GET": broken},
        "/fine": {"GET": lambda _request: Response(200, {"a": "é"})},
    }
    httpd = bind_json_server("127.0.0.1", port, routes, max_body=10, access_log=lines.append)
    thread = serve_in_background(httpd, "broken")
    try:
        base = f"http://127.0.0.1:{port}"
        boom = requests.get(base + "/boom", timeout=5)
        assert (boom.status_code, boom.json()) == (500, {"detail": "Internal Server Error"})
        fine = requests.get(base + "/fine", timeout=5)
        assert (fine.content, fine.json()) == ('{"a":"é"}'.encode(), {"a": "é"})
    finally:
        stop_serving(httpd, thread)
    # each line is written once its response is sent: /fine's may come before /boom's
    boom_line = r'127\.0\.0\.1:\d+ - "GET /boom HTTP/1\.1" 500 Internal Server Error'
    assert [line for line in lines if re.fullmatch(boom_line, line)], lines


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
    settings = ("model", "host", "port", "devices", "max_model_len", "tensor_parallel_size")
    assert [getattr(fake, name) for name in settings] == [getattr(real, name) for name in settings]


def test_fake_server_stands_beside_the_real_one_not_inside_it():
    """Like httpx's MockTransport beside BaseTransport: the same interface, its own class."""
    fake = FakeVLLMServer("m")
    assert not isinstance(fake, VLLMServer)
    assert VLLMServer not in type(fake).__mro__
    assert isinstance(fake, ServerHandle)
    assert isinstance(VLLMServer("m"), ServerHandle)
    assert "FakeVLLMServer(model='m'" in repr(fake)


@pytest.mark.parametrize("kind", ["missing folder", "folder as file"])
def test_fake_check_log_refuses_what_the_real_one_refuses(tmp_path, kind):
    """``verirl doctor``'s preflight, through the fake, in the real server's words."""
    if kind == "missing folder":
        where = {"log_dir": str(tmp_path / "no-such-folder")}
    else:
        (tmp_path / "a-file").write_text("x")
        where = {"log_path": tmp_path / "a-file" / "server.log"}
    errors = []
    for server in (FakeVLLMServer("m", port=9, **where), VLLMServer("m", port=9, **where)):
        with pytest.raises(ConfigError) as info:
            server.check_log()
        errors.append((info.value.field, str(info.value)))
    assert errors[0] == errors[1]
    fine = {"log_path": tmp_path / "server.log"}
    FakeVLLMServer("m", **fine).check_log()
    assert not (tmp_path / "server.log").exists()  # looked at, not written


def test_fake_server_has_no_process_and_no_grace():
    fake = FakeVLLMServer("m")
    with fake:
        assert (fake.pid, fake.returncode) == (None, None)
        fake.cut_stop_short()  # nothing to cut: stop still ends it, once
    assert (fake.running, fake.stops) == (False, 1)


def test_fake_server_refuses_an_unknown_argument():
    with pytest.raises(TypeError, match="no_such_argument"):
        FakeVLLMServer("m", no_such_argument=1)


def test_stop_from_another_thread_cancels_a_start_in_progress():
    port = unshared_port()
    waiting = threading.Event()

    def clock() -> float:  # read as start() begins, just before its delay
        waiting.set()
        return time.monotonic()

    server = FakeVLLMServer("m", port=port, serve_http=True, startup_delay=600, clock=clock)
    errors: list[BaseException] = []

    def start() -> None:
        try:
            server.start()
        except BaseException as exc:  # noqa: BLE001 - handed to the test thread
            errors.append(exc)

    thread = threading.Thread(target=start, name="fake-start")
    thread.start()
    try:
        assert waiting.wait(timeout=30)
        asked = time.monotonic()
        server.stop()
        thread.join(timeout=30)
        assert not thread.is_alive()
        assert time.monotonic() - asked < 10  # not the 600 s delay
    finally:
        server.stop()
        thread.join(timeout=30)
    (error,) = errors
    assert type(error) is VLLMServerError
    assert "stop() was called while the fake vLLM server was starting" in str(error)
    assert (server.starts, server.stops, server.running, server.ready_at) == (1, 1, False, None)
    with pytest.raises(requests.ConnectionError):  # it never served
        requests.get(f"http://127.0.0.1:{port}/health", timeout=5)


def test_a_stop_during_an_injected_sleep_takes_effect_when_it_returns():
    clock = FakeClock()

    def sleep(seconds: float) -> None:
        clock.sleep(seconds)
        server.stop()  # as another thread's stop() would, while start() waits

    server = FakeVLLMServer("m", startup_delay=3.0, clock=clock, sleep=sleep)
    with pytest.raises(VLLMServerError, match="stop\\(\\) was called while"):
        server.start()
    assert (server.starts, server.stops, server.stopped_at) == (1, 1, 103.0)
    assert not server.running


def test_stop_is_idempotent_and_a_stopped_fake_cannot_start_again():
    server = FakeVLLMServer("m")
    server.stop()  # before any start: nothing to stop, as with VLLMServer
    assert (server.starts, server.stops) == (0, 0)
    with server:
        assert server.running
    for _ in range(3):
        server.stop()
    assert (server.starts, server.stops, server.running) == (1, 1, False)
    with pytest.raises(VLLMServerError, match="stopped and cannot be started again"):
        server.start()
    assert (server.starts, server.running) == (1, False)


def test_a_failed_start_leaves_the_fake_startable_and_stop_a_no_op():
    error = VLLMServerExited(1, "CUDA out of memory\n")
    server = FakeVLLMServer("m", fail_with=error)
    with pytest.raises(VLLMServerExited):
        server.start()
    server.stop()
    assert server.stops == 0
    server.fail_with = None
    with server:
        assert server.running
    assert (server.starts, server.stops) == (2, 1)


def test_fake_server_log_tail_is_what_it_logged():
    server = FakeVLLMServer("m", port=9)
    assert server.log_tail() == ""
    with server:
        pass
    assert server.log_tail() == (
        f"fake vLLM server start: {' '.join(server.serve_args)}\nfake vLLM server stop\n"
    )
    assert server.log_tail(lines=1) == "fake vLLM server stop\n"
    assert server.log_tail(lines=0) == ""


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
        assert requests.get(server.base_url + "/health", timeout=5).status_code == 200
        world = requests.get(server.base_url + "/get_world_size", timeout=5).json()
        assert world == {"world_size": 2}
    with pytest.raises(requests.ConnectionError):
        requests.get(server.base_url + "/health", timeout=5)


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
            requests.get(server.base_url + "/health", timeout=5)
    finally:
        server.stop()


def test_connections_beyond_the_cap_are_closed_at_once_not_left_waiting(base):
    host, port = base.removeprefix("http://").rsplit(":", 1)
    held = [socket.create_connection((host, int(port)), timeout=10) for _ in range(MAX_CONNECTIONS)]
    try:
        with socket.create_connection((host, int(port)), timeout=10) as extra:
            assert extra.recv(1) == b""  # closed by the server: no thread for it
    finally:
        for sock in held:
            sock.close()
    deadline = time.monotonic() + 10  # the held connections' threads see EOF and free the slots
    while True:
        try:
            if requests.get(base + "/health", timeout=5).status_code == 200:
                break
        except requests.ConnectionError:
            pass
        assert time.monotonic() < deadline, "the server did not recover its slots"
        time.sleep(0.01)


def test_recorded_bodies_are_kept_as_bytes_and_parsed_when_read(base):
    nested = b"[" + b"{}," * 20000 + b"{}]"  # 60 KB that parses into 20,000 dicts
    post(base, "/reset_prefix_cache", data=nested, headers={"Content-Type": "application/json"})
    (call,) = [c for c in requests.get(base + "/verirl/calls/", timeout=10).json()["calls"]
               if c["body_bytes"] == len(nested)]  # fmt: skip
    assert len(call["body"]) == 20001
    query = "&".join(f"k{i}={'v' * 1000}" for i in range(40))
    requests.post(base + "/reset_prefix_cache?" + query, timeout=10)
    last = requests.get(base + "/verirl/calls/", timeout=10).json()["calls"][-1]
    assert len(last["query"]) <= 16
    assert all(len(value) <= 256 for value in last["query"].values())

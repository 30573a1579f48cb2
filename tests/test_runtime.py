from __future__ import annotations

import logging
import os
import signal
import threading

import pytest

from _support import Recorder, master_port_beside
from fakes import FakeCheckpointSource, FakeEnvServer, FakeEnvServerProbe
from verirl import (
    CheckpointNotFoundError,
    CheckpointResolver,
    ConfigError,
    DistributedEnv,
    EnvServerUnavailable,
    ServerHandle,
    TrainingRuntime,
    VLLMServerError,
    VLLMServerExited,
    VLLMServerUnavailable,
    VLLMTopology,
    find_free_port,
)
from verirl.distenv import avoided_ports

DELAY = 0.5


def runtime(
    gpus: int = 2,
    *,
    environ: dict[str, str] | None = None,
    topology: VLLMTopology | None = None,
    **kwargs,
) -> TrainingRuntime:
    env = {} if environ is None else environ
    kwargs.setdefault("server_factory", Recorder())
    topology = topology or VLLMTopology.plan(gpus, max_model_len=4096, port=find_free_port())
    return TrainingRuntime(
        topology,
        environ=env,
        dist_env=DistributedEnv.single_node(environ=env, master_port=master_port_beside(topology)),
        **kwargs,
    )


def test_session_carries_everything_and_stop_stops_the_server():
    factory = Recorder()
    source = FakeCheckpointSource(steps=[10, 20])
    probe = FakeEnvServerProbe()
    env: dict[str, str] = {}
    rt = runtime(
        environ=env,
        server_factory=factory,
        env_probe=probe,
        checkpoints=CheckpointResolver([source]),
        resume_from="latest",
    )
    with rt as session:
        (server,) = factory.servers
        assert server.running
        assert session.server is server
        assert session.server_url == server.base_url
        assert session.resume_from_checkpoint == "/fake/checkpoint-20"
        assert session.grpo_kwargs["vllm_mode"] == "server"
        assert session.training_devices == (0,)
        assert env["MASTER_ADDR"] == "127.0.0.1"  # dist env applied to the given environ
        assert [t.name for t in session.timings] == ["dist-env", "vllm", "env", "checkpoint"]
        assert probe.waits == [600.0]
        assert rt.session is session
    assert not server.running
    assert server.stops == 1
    assert rt.session is None


def test_phases_overlap_so_start_up_is_about_the_slowest_phase(caplog):
    caplog.set_level(logging.INFO, logger="verirl.runtime")
    factory = Recorder(startup_delay=DELAY)
    rt = runtime(
        server_factory=factory,
        env_probe=FakeEnvServerProbe(wait_delay=DELAY),
        checkpoints=CheckpointResolver([FakeCheckpointSource(steps=[5], fetch_delay=DELAY)]),
        resume_from="latest",
    )
    with rt as session:
        pass
    # Sequential would be 3 * DELAY; overlapped is DELAY plus thread overhead.
    assert DELAY <= session.total < 2.2 * DELAY
    starts = [t.start for t in session.timings[1:]]
    assert max(starts) - min(starts) < DELAY / 2
    assert "start-up timeline:" in caplog.text
    assert "ready at" in session.timeline()


@pytest.mark.parametrize("failing", ["env", "checkpoint"])
def test_a_failing_phase_tears_down_the_server_and_raises_its_error(failing):
    factory = Recorder(startup_delay=0.05)
    probe = FakeEnvServerProbe(ready_after_checks=None if failing == "env" else 0)
    source = FakeCheckpointSource(steps=[] if failing == "checkpoint" else [1])
    rt = runtime(
        server_factory=factory,
        env_probe=probe,
        env_timeout=0,
        checkpoints=CheckpointResolver([source]),
        resume_from="latest",
    )
    expected = EnvServerUnavailable if failing == "env" else CheckpointNotFoundError
    with pytest.raises(expected):
        rt.start()
    (server,) = factory.servers
    assert not server.running
    assert rt.session is None


def test_phase_failing_while_server_still_starts_waits_for_it_and_stops_it():
    factory = Recorder(startup_delay=DELAY)
    rt = runtime(server_factory=factory, env_probe=FakeEnvServerProbe(ready_after_checks=None))
    with pytest.raises(EnvServerUnavailable):
        rt.start()
    (server,) = factory.servers
    assert server.starts == 1
    assert not server.running  # its start finished and it was stopped afterwards
    assert server.stops == 1


class _ThreeMembers:
    """A server handle of a user's own, with only what ServerHandle once declared."""

    base_url = "http://127.0.0.1:1"

    def __init__(self) -> None:
        self.started = False

    def start(self) -> None:
        self.started = True

    def stop(self) -> None:
        pass


def test_a_server_handle_lacking_members_is_refused_before_it_starts():
    """One without ``running`` could never be seen to die: refused, naming what it lacks."""
    built: list[_ThreeMembers] = []

    def factory(topology: VLLMTopology) -> ServerHandle:
        built.append(_ThreeMembers())
        return built[-1]  # type: ignore[return-value]

    rt = runtime(server_factory=factory, env_probe=FakeEnvServerProbe())
    with pytest.raises(ConfigError) as info:
        rt.start()
    assert info.value.field == "server_factory"
    assert str(info.value).startswith(
        "server_factory built a _ThreeMembers, which lacks pid, running, returncode, "
        "log_path, log_tail, cut_stop_short, check_log; a ServerHandle has all of "
    )
    (handle,) = built
    assert not handle.started
    assert rt.session is None


def test_server_failure_is_raised_as_is(caplog):
    boom = VLLMServerExited(1, "CUDA out of memory")
    rt = runtime(server_factory=Recorder(fail_with=boom), env_probe=FakeEnvServerProbe())
    with caplog.at_level(logging.DEBUG, logger="verirl"), pytest.raises(VLLMServerExited) as info:
        rt.start()
    assert info.value is boom
    # Raised, not also logged as an error: whoever catches it reports it once (the CLI does).
    assert "CUDA out of memory" not in caplog.text
    assert not [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert "start-up phase 'vllm' failed at" in caplog.text


def test_exception_in_the_block_propagates_and_stops_the_server():
    factory = Recorder()
    rt = runtime(server_factory=factory)
    with pytest.raises(ZeroDivisionError), rt:
        _ = 1 / 0
    assert factory.servers[0].stops == 1


def test_start_twice_is_an_error():
    rt = runtime()
    rt.start()
    try:
        with pytest.raises(RuntimeError, match="already started"):
            rt.start()
    finally:
        rt.stop()
    rt.stop()  # idempotent


def test_colocate_starts_nothing():
    factory = Recorder()
    with runtime(1, server_factory=factory) as session:
        assert session.server is None
        assert session.server_url is None
        assert session.grpo_kwargs["vllm_mode"] == "colocate"
    assert factory.servers == []


def test_rank_above_zero_never_starts_a_server_and_waits_for_rank_zeros():
    launcher = {"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2",
                "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}  # fmt: skip
    factory = Recorder()
    with FakeEnvServer(ready_after=0.2, health_path="/health") as rank0_server:
        port = int(rank0_server.url.rsplit(":", 1)[1])
        topology = VLLMTopology.plan(2, max_model_len=4096, port=port)
        rt = TrainingRuntime(
            topology,
            environ=dict(launcher),
            dist_env=DistributedEnv.single_node(environ=launcher),
            server_factory=factory,
        )
        assert not rt.starts_server
        with rt as session:
            assert session.server is None
            assert session.server_url == f"http://127.0.0.1:{port}"
            assert [t.name for t in session.timings] == ["dist-env", "vllm-wait"]
        assert rank0_server.requests >= 1
        assert rank0_server.paths[-1] == "/health"
    assert factory.servers == []


def test_rank_above_zero_times_out_when_no_server_appears():
    launcher = {"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2",
                "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}  # fmt: skip
    factory = Recorder()
    rt = TrainingRuntime(
        VLLMTopology.plan(2, max_model_len=64, port=find_free_port()),
        environ=dict(launcher),
        dist_env=DistributedEnv.single_node(environ=launcher),
        server_factory=factory,
        remote_server_timeout=0.2,
    )
    with pytest.raises(VLLMServerUnavailable, match="connection refused") as info:
        rt.start()
    assert isinstance(info.value, VLLMServerError)
    assert info.value.url == rt.topology.server_url
    assert factory.servers == []


def test_remote_topology_starts_nothing_and_waits_for_the_remote_health(caplog):
    caplog.set_level("INFO", logger="verirl")
    factory = Recorder()
    with FakeEnvServer(health_path="/health") as remote:
        url = remote.url
        port = int(url.rsplit(":", 1)[1])
        topology = VLLMTopology.plan(4, max_model_len=64, remote_host="127.0.0.1", port=port)
        with runtime(topology=topology, server_factory=factory) as session:
            assert session.server is None
            assert session.training_devices == (0, 1, 2, 3)
        assert remote.requests >= 1
    assert factory.servers == []
    assert f"for vLLM server {url}/health" in caplog.text  # not "for env server"
    assert "env server" not in caplog.text


def test_sigterm_during_the_block_becomes_system_exit_and_tears_down(default_sigterm):
    factory = Recorder()
    previous = signal.getsignal(signal.SIGTERM)
    rt = runtime(server_factory=factory)

    def body() -> None:
        with rt:
            os.kill(os.getpid(), signal.SIGTERM)
            threading.Event().wait(5)  # the handler raises before this returns

    with pytest.raises(SystemExit) as info:
        body()
    assert info.value.code == 143
    assert factory.servers[0].stops == 1
    assert signal.getsignal(signal.SIGTERM) is previous


def test_sigint_during_the_block_tears_down_as_sigterm_does(default_sigterm):
    """Modal's preemption (SIGINT, a KeyboardInterrupt in the main thread), used in-process."""
    factory = Recorder()
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    rt = runtime(server_factory=factory)

    def body() -> None:
        with rt:
            os.kill(os.getpid(), signal.SIGINT)
            threading.Event().wait(5)  # the handler raises before this returns

    try:
        with pytest.raises(KeyboardInterrupt):
            body()
    finally:
        signal.signal(signal.SIGINT, previous)
    assert factory.servers[0].stops == 1
    assert rt.session is None
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL  # the policy was released


def test_default_factory_needs_a_model():
    port = find_free_port()
    rt = TrainingRuntime(
        VLLMTopology.plan(2, max_model_len=64, port=port),
        environ={},
        dist_env=DistributedEnv.single_node(environ={}, avoid_ports=avoided_ports(port)),
    )
    with pytest.raises(ConfigError, match="model"):
        rt.start()


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [({"env_timeout": -1}, "env_timeout"), ({"remote_server_timeout": 0}, "remote_server_timeout"),
     ({"model": ""}, "model")],
)  # fmt: skip
def test_bad_runtime_arguments(kwargs, field):
    with pytest.raises(ConfigError, match=rf"^{field}="):
        TrainingRuntime(VLLMTopology.plan(1, max_model_len=64), **kwargs)


# -- from_settings


def test_from_settings_reads_the_environment(tmp_path):
    environ = {
        "VERIRL_ENV_SERVER_URL": "http://127.0.0.1:9",
        "VERIRL_MODEL": "org/model",
        "VERIRL_MAX_MODEL_LEN": "2048",
        "VERIRL_OUTPUT_DIR": str(tmp_path),
        "VERIRL_GPU_COUNT": "4",
        "VERIRL_VLLM_PORT": "8123",
        "VERIRL_VLLM_GPUS": "2",
        "VERIRL_RESUME_FROM_CHECKPOINT": "latest",
        "VERIRL_ENV_TIMEOUT": "12.5",
        "VERIRL_VLLM_COMMAND": "python -m fakes.vllm_serve",
    }
    rt = TrainingRuntime.from_settings(environ=environ)
    assert rt.model == "org/model"
    assert rt.topology.vllm_devices == (2, 3)
    assert rt.topology.port == 8123
    assert rt.topology.max_model_len == 2048
    assert rt.resume_from == "latest"
    assert rt.env_timeout == 12.5
    assert rt.env_probe is not None
    assert rt.env_probe.url == "http://127.0.0.1:9"
    assert rt.checkpoints is not None
    assert rt.server_factory is not None
    server = rt.server_factory(rt.topology)
    assert server.command == ("python", "-m", "fakes.vllm_serve")
    assert server.devices == (2, 3)


def test_from_settings_bad_arguments_name_the_argument():
    with pytest.raises(ConfigError, match=r"^mode="):
        TrainingRuntime.from_settings(gpu_count=2, mode="both", environ={})
    with pytest.raises(ConfigError, match=r"^env_url="):
        TrainingRuntime.from_settings(gpu_count=2, env_url="env:8000", environ={})


def test_from_settings_arguments_win_over_the_environment():
    rt = TrainingRuntime.from_settings(
        gpu_count=1, max_model_len=100, environ={"VERIRL_GPU_COUNT": "8", "VERIRL_MODEL": "x"}
    )
    assert rt.topology.mode == "colocate"
    assert rt.topology.max_model_len == 100
    assert rt.env_probe is None
    assert rt.checkpoints is None


def test_from_settings_remote_host_and_hub(tmp_path):
    rt = TrainingRuntime.from_settings(
        gpu_count=2,
        vllm_remote_host="vllm-node",
        output_dir=str(tmp_path),
        hub_repo_id="org/run",
        hub_token="hf_secret_token",
        environ={},
    )
    assert rt.topology.remote_host == "vllm-node"
    assert rt.topology.training_devices == (0, 1)
    assert "hf_secret_token" not in repr(rt)


@pytest.mark.parametrize(
    ("environ", "field"),
    [
        ({"VERIRL_GPU_COUNT": "two"}, "VERIRL_GPU_COUNT"),
        ({"VERIRL_GPU_COUNT": "0"}, "VERIRL_GPU_COUNT"),
        ({"VERIRL_GPU_COUNT": "2", "VERIRL_VLLM_PORT": "-1"}, "VERIRL_VLLM_PORT"),
        ({"VERIRL_GPU_COUNT": "2", "VERIRL_ENV_TIMEOUT": "soon"}, "VERIRL_ENV_TIMEOUT"),
        ({"VERIRL_GPU_COUNT": "2", "VERIRL_ENV_SERVER_URL": "env:8000"}, "VERIRL_ENV_SERVER_URL"),
        ({"VERIRL_GPU_COUNT": "2", "VERIRL_VLLM_MODE": "both"}, "VERIRL_VLLM_MODE"),
        ({"VERIRL_GPU_COUNT": "2", "VERIRL_VLLM_LOG_DIR": "/nonexistent"}, "VERIRL_VLLM_LOG_DIR"),
    ],
)
def test_from_settings_bad_values_name_the_variable(environ, field):
    with pytest.raises(ConfigError, match=rf"^{field}="):
        TrainingRuntime.from_settings(environ=environ)


def test_timings_are_ordered_and_non_negative():
    with runtime(env_probe=FakeEnvServerProbe()) as session:
        for timing in session.timings:
            assert 0 <= timing.start <= timing.end <= session.total
            assert timing.duration >= 0

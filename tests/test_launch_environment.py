"""Class: what ``verirl launch``'s command inherits. Every variable it exports describes this run.

Swept over the layouts (colocate, a local server, a remote server) and over
whatever stale value the caller's environment holds for each exported
variable (`CUDA_VISIBLE_DEVICES`, ``VERIRL_RESUME_FROM_CHECKPOINT``,
``VERIRL_GRPO_KWARGS``, ``VERIRL_VLLM_URL``, a vLLM server's marker, which
would make launch take the command's processes for a server's and never
signal them): the command sees the run's
value, or nothing where the layout sets none, never the caller's. And the
ports verirl picks never equal each other: ``MASTER_PORT`` (a free port) is
never the vLLM port, and the vLLM port is never TRL's weight-sync group port.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from _support import clear_verirl_env
from verirl import ConfigError, TrainingRuntime, VLLMTopology
from verirl._settings import Settings
from verirl.cli.commands import _training_environment
from verirl.distenv import DistributedEnv, avoided_ports
from verirl.topology import TRL_GROUP_PORT

EXPORTED = ("CUDA_VISIBLE_DEVICES", "VERIRL_RESUME_FROM_CHECKPOINT", "VERIRL_GRPO_KWARGS",
            "VERIRL_VLLM_URL", "VERIRL_VLLM_SERVER_MARKER")  # fmt: skip
LAYOUTS = {
    "colocate": {"gpu_count": 1},
    "local-server": {"gpu_count": 2},
    "remote-server": {"gpu_count": 2, "vllm_remote_host": "10.1.2.3"},
}
stale = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=20)


def _exported(layout: str, caller: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> dict:
    for name in EXPORTED:
        monkeypatch.delenv(name, raising=False)
    for name, value in caller.items():
        monkeypatch.setenv(name, value)
    runtime = TrainingRuntime.from_settings(**LAYOUTS[layout], environ={})
    url = runtime.topology.server_url
    env = _training_environment(runtime, None, url)
    return {name: env.get(name) for name in EXPORTED if name != "CUDA_VISIBLE_DEVICES"}


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
@settings(
    max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(values=st.fixed_dictionaries({}, optional=dict.fromkeys(EXPORTED[1:], stale)))
def test_no_exported_variable_is_the_callers_stale_value(monkeypatch, layout, values):
    with monkeypatch.context() as patch:
        clean = _exported(layout, {}, patch)
    with monkeypatch.context() as patch:
        dirty = _exported(layout, values, patch)
    assert dirty == clean  # what the run says, whatever the caller had
    if layout == "colocate":
        assert dirty["VERIRL_VLLM_URL"] is None  # no server: no URL at all
    else:
        assert (
            dirty["VERIRL_VLLM_URL"]
            == TrainingRuntime.from_settings(**LAYOUTS[layout], environ={}).topology.server_url
        )


def test_launch_in_colocate_mode_passes_on_no_stale_server_url(tmp_path, monkeypatch):
    clear_verirl_env(monkeypatch, tmp_path)
    out = tmp_path / "seen.json"
    script = tmp_path / "train.py"
    script.write_text(
        textwrap.dedent(f"""
        import json, os
        names = {EXPORTED!r}
        json.dump({{n: os.environ.get(n) for n in names}}, open({str(out)!r}, "w"))
    """)
    )
    env = {**os.environ, "VERIRL_VLLM_URL": "http://other-job:8001",
           "VERIRL_GRPO_KWARGS": '{"vllm_mode": "server"}',
           "VERIRL_RESUME_FROM_CHECKPOINT": "", "CUDA_VISIBLE_DEVICES": "3,5"}  # fmt: skip
    result = subprocess.run(
        [sys.executable, "-m", "verirl", "launch", "--gpus", "1", "--", sys.executable,
         str(script)], env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    seen = json.loads(out.read_text())
    assert seen["VERIRL_VLLM_URL"] is None, seen
    assert json.loads(seen["VERIRL_GRPO_KWARGS"])["vllm_mode"] == "colocate"
    assert seen["CUDA_VISIBLE_DEVICES"] == "3"
    assert seen["VERIRL_RESUME_FROM_CHECKPOINT"] == ""


def test_a_flag_wins_over_the_callers_variable_in_what_the_command_sees(tmp_path, monkeypatch):
    """``VERIRL_*`` that a launch flag overrode reach the command with the flag's value."""
    clear_verirl_env(monkeypatch, tmp_path)
    out = tmp_path / "seen.json"
    script = tmp_path / "train.py"
    names = ("VERIRL_GPU_COUNT", "VERIRL_MAX_MODEL_LEN", "VERIRL_VLLM_MODE",
             "VERIRL_OUTPUT_DIR", "VERIRL_SHUTDOWN_TIMEOUT", "VERIRL_VLLM_STARTUP_TIMEOUT",
             "VERIRL_HUB_REVISION")  # fmt: skip
    script.write_text(
        f"import json, os; json.dump({{n: os.environ.get(n) for n in {names!r}}}, "
        f"open({str(out)!r}, 'w'))"
    )
    caller = {"VERIRL_GPU_COUNT": "4", "VERIRL_MAX_MODEL_LEN": "4096", "VERIRL_VLLM_MODE": "auto",
              "VERIRL_OUTPUT_DIR": str(tmp_path / "stale"), "VERIRL_SHUTDOWN_TIMEOUT": "30",
              "VERIRL_VLLM_STARTUP_TIMEOUT": "700", "VERIRL_HUB_REVISION": "kept"}  # fmt: skip
    run = tmp_path / "run"
    result = subprocess.run(
        [sys.executable, "-m", "verirl", "launch", "--gpus", "1", "--max-model-len", "2048",
         "--mode", "colocate", "--output-dir", str(run), "--shutdown-timeout", "+0.7e1",
         "--", sys.executable, str(script)],
        env={**os.environ, **caller}, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert json.loads(out.read_text()) == {
        "VERIRL_GPU_COUNT": "1", "VERIRL_MAX_MODEL_LEN": "2048", "VERIRL_VLLM_MODE": "colocate",
        "VERIRL_OUTPUT_DIR": str(run), "VERIRL_SHUTDOWN_TIMEOUT": "7.0",  # a number, not +0.7e1
        "VERIRL_VLLM_STARTUP_TIMEOUT": None,  # colocate: no server, none of its settings
        "VERIRL_HUB_REVISION": "kept",
    }  # fmt: skip


SERVER_SETTINGS = {"VERIRL_VLLM_PORT": "9000", "VERIRL_VLLM_COMMAND": "false",
                   "VERIRL_VLLM_ARGS": "--enforce-eager", "VERIRL_VLLM_LOG_DIR": "/nonexistent",
                   "VERIRL_VLLM_STARTUP_TIMEOUT": "5", "VERIRL_VLLM_UNRESPONSIVE_TIMEOUT": "5",
                   "VERIRL_VLLM_GPUS": "1"}  # fmt: skip


@pytest.mark.parametrize(
    ("layout", "gone"),
    [("colocate", {"VERIRL_VLLM_PORT", "VERIRL_VLLM_COMMAND", "VERIRL_VLLM_ARGS",
                   "VERIRL_VLLM_LOG_DIR", "VERIRL_VLLM_STARTUP_TIMEOUT",
                   "VERIRL_VLLM_UNRESPONSIVE_TIMEOUT"}),
     ("remote-server", {"VERIRL_VLLM_COMMAND", "VERIRL_VLLM_ARGS", "VERIRL_VLLM_LOG_DIR",
                        "VERIRL_VLLM_GPUS"})],
)  # fmt: skip
def test_settings_of_a_server_the_layout_never_starts_here_are_not_passed_on(
    monkeypatch, layout, gone
):
    for name, value in SERVER_SETTINGS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("VERIRL_VLLM_LOG_DIR")  # an existing folder is checked at configuration
    runtime = TrainingRuntime.from_settings(**LAYOUTS[layout], environ={})
    env = _training_environment(runtime, None, runtime.topology.server_url)
    for name in SERVER_SETTINGS:
        if name in gone:
            assert name not in env, name
        elif name in os.environ:
            assert env[name] == os.environ[name], name  # still this run's


@pytest.mark.parametrize("port_of", ["vllm", "group"])
def test_a_callers_master_port_on_a_port_of_the_local_server_is_refused(port_of):
    """torchrun's ``--master-port 8001`` and a server on 8001: a ConfigError naming both."""
    port = 9100 if port_of == "vllm" else TRL_GROUP_PORT
    environ = {"MASTER_PORT": str(port), "VERIRL_VLLM_PORT": "9100"}
    with pytest.raises(ConfigError, match=rf"^MASTER_PORT='{port}': is .*{port}"):
        TrainingRuntime.from_settings(gpu_count=2, environ=environ)
    topology = VLLMTopology.plan(2, max_model_len=1024, port=9100)

    def never(_topology: VLLMTopology) -> None:
        raise AssertionError("a server was started")

    runtime = TrainingRuntime(topology, environ=dict(environ), server_factory=never)
    with pytest.raises(ConfigError, match=r"^MASTER_PORT="):
        runtime.start()
    # no server here (colocate, or a remote one): nothing of ours listens on that port
    assert TrainingRuntime.from_settings(gpu_count=1, environ=environ).dist_env is not None
    remote = {**environ, "VERIRL_VLLM_HOST": "10.1.2.3"}
    assert TrainingRuntime.from_settings(gpu_count=2, environ=remote).dist_env is not None


def test_launch_refuses_a_master_port_on_the_servers_port(tmp_path, monkeypatch):
    clear_verirl_env(monkeypatch, tmp_path)
    result = subprocess.run(
        [sys.executable, "-m", "verirl", "launch", "--gpus", "2", "--vllm-port", "9100",
         "--model", "m", "--", "true"],
        env={**os.environ, "MASTER_PORT": "9100"}, capture_output=True, text=True, timeout=120,
        check=False,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert "MASTER_PORT='9100': is the vLLM server's port" in result.stderr


@settings(max_examples=40, deadline=None)
@given(port=st.integers(1, 65535))
def test_a_free_master_port_is_never_the_vllm_port(port):
    avoid = avoided_ports(port)
    assert {port, 8000, 8001, TRL_GROUP_PORT} <= avoid
    dist = DistributedEnv.single_node(environ={}, avoid_ports=avoid)
    assert int(dist.variables["MASTER_PORT"]) not in avoid


def test_the_runtime_picks_master_port_away_from_its_vllm_port():
    for port in (8002, 29500, 40000):
        runtime = TrainingRuntime.from_settings(gpu_count=2, vllm_port=port, environ={})
        assert runtime.dist_env is not None
        assert int(runtime.dist_env.variables["MASTER_PORT"]) not in (port, TRL_GROUP_PORT)


@pytest.mark.parametrize("layout", ["local-server", "remote-server"])
def test_the_vllm_port_is_never_trls_group_port(layout):
    kwargs = {k: v for k, v in LAYOUTS[layout].items() if k != "gpu_count"}
    with pytest.raises(ConfigError, match=r"^port=51216: is TRL's weight-sync group port"):
        VLLMTopology.plan(2, max_model_len=1024, port=TRL_GROUP_PORT,
                          remote_host=kwargs.get("vllm_remote_host"))  # fmt: skip
    with pytest.raises(ConfigError, match=r"^VERIRL_VLLM_PORT='?51216'?: is TRL's"):
        TrainingRuntime.from_settings(**LAYOUTS[layout], environ={"VERIRL_VLLM_PORT": "51216"})


def test_colocate_mode_leaves_the_group_port_alone():
    topology = VLLMTopology.plan(1, max_model_len=1024, port=TRL_GROUP_PORT)
    assert topology.mode == "colocate"  # no server, no port of ours


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_the_max_model_length_exported_is_the_one_the_run_uses(monkeypatch, layout):
    monkeypatch.setenv("VERIRL_MAX_MODEL_LEN", "32768")
    runtime = TrainingRuntime.from_settings(**LAYOUTS[layout])
    env = _training_environment(runtime, None, runtime.topology.server_url)
    used = runtime.topology.grpo_kwargs()
    (length,) = (value for name, value in used.items() if name.startswith("vllm_max_model_len"))
    assert env["VERIRL_MAX_MODEL_LEN"] == str(length)
    assert length == (8192 if layout == "colocate" else 32768)


@pytest.mark.parametrize("layout", ["colocate", "local-server"])
def test_the_gpu_count_exported_is_the_commands_gpus(monkeypatch, layout):
    # the command sees only its training GPUs: the machine's count contradicted them
    monkeypatch.setenv("VERIRL_GPU_COUNT", str(LAYOUTS[layout]["gpu_count"]))
    runtime = TrainingRuntime.from_settings(**LAYOUTS[layout])
    env = _training_environment(runtime, None, runtime.topology.server_url)
    visible = env["CUDA_VISIBLE_DEVICES"].split(",")
    assert (
        env["VERIRL_GPU_COUNT"] == str(len(visible)) == str(len(runtime.topology.training_devices))
    )


@pytest.mark.parametrize("layout", sorted(LAYOUTS))
def test_a_runtime_the_command_builds_from_what_launch_exports_plans_the_same_run(
    monkeypatch, layout
):
    """``TrainingRuntime.from_settings()`` in the command (each rank of a torchrun under
    launch): the same TRL arguments, and never a second server (it planned colocate on the
    training GPU, or a server on the port launch's server holds)."""
    for name, value in SERVER_SETTINGS.items():  # all of them: how to start this run's server
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("VERIRL_VLLM_LOG_DIR")  # an existing folder is checked at configuration
    monkeypatch.setenv("VERIRL_MODEL", "m")
    for name, value in LAYOUTS[layout].items():  # as launch's flags reach the command
        monkeypatch.setenv(Settings.variable(name), str(value))
    runtime = TrainingRuntime.from_settings()
    env = _training_environment(runtime, None, runtime.topology.server_url)
    inner = TrainingRuntime.from_settings(environ=env)
    assert inner.topology.grpo_kwargs() == json.loads(env["VERIRL_GRPO_KWARGS"])
    assert inner.topology.server_url == runtime.topology.server_url
    starts_one = inner.topology.mode == "server" and inner.topology.remote_host is None
    assert not starts_one, inner.topology  # launch's own server is the run's one


def test_a_command_under_launch_attaches_its_runtime_to_launchs_server(tmp_path, monkeypatch):
    clear_verirl_env(monkeypatch, tmp_path)
    out = tmp_path / "seen.json"
    script = tmp_path / "train.py"
    script.write_text(
        textwrap.dedent(f"""
        import json, os
        from verirl import TrainingRuntime
        with TrainingRuntime.from_settings() as session:
            json.dump({{"kwargs": dict(session.grpo_kwargs), "server": session.server is None,
                       "exported": json.loads(os.environ["VERIRL_GRPO_KWARGS"])}},
                      open({str(out)!r}, "w"))
    """)
    )
    from _support import unshared_port

    port = unshared_port()
    result = subprocess.run(
        [sys.executable, "-m", "verirl", "launch", "--gpus", "2", "--model", "m",
         "--vllm-port", str(port), "--vllm-command", f"{sys.executable} -m fakes.vllm_serve",
         "--log-dir", str(tmp_path), "--", sys.executable, str(script)],
        capture_output=True, text=True, timeout=180, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    seen = json.loads(out.read_text())
    assert seen["kwargs"] == seen["exported"], seen
    assert seen["kwargs"]["vllm_server_port"] == port
    assert seen["server"], seen  # it started none of its own

"""from_settings with hostile values: one ConfigError naming the variable (or argument)."""

from __future__ import annotations

import math
import sys
from collections import UserList
from pathlib import Path

import attrs
import pytest

from verirl import (
    ConfigError,
    Settings,
    TrainingRuntime,
    VLLMServer,
    VLLMTopology,
    resolver_from_settings,
    topology_from_settings,
)
from verirl._fs import quoted

INTEGER_VARIABLES = ["VERIRL_GPU_COUNT", "VERIRL_MAX_MODEL_LEN", "VERIRL_VLLM_GPUS",
                     "VERIRL_VLLM_PORT"]  # fmt: skip
HOSTILE_INTEGERS = ["1_0", "\u0663", "\uff13", "3.0", "1e3", "nan", "inf", "-1", "0x10",
                    "99999999999999999999", "9" * 5000, "\x01", "4\x00"]  # fmt: skip


@pytest.mark.parametrize("value", HOSTILE_INTEGERS)
@pytest.mark.parametrize("name", INTEGER_VARIABLES)
def test_integer_variables_take_ascii_digits_in_range_only(name, value):
    environ = {"VERIRL_GPU_COUNT": "4", name: value}
    with pytest.raises(ConfigError, match=rf"^{name}=") as info:
        TrainingRuntime.from_settings(environ=environ)
    assert info.value.field == name


@pytest.mark.parametrize(
    ("name", "value"),
    [("VERIRL_VLLM_PORT", "70000"), ("VERIRL_GPU_COUNT", "70000"),
     ("VERIRL_MAX_MODEL_LEN", str(2**40)), ("VERIRL_VLLM_GPUS", "100000"),
     ("VERIRL_VLLM_HOST", "http://x"), ("VERIRL_VLLM_HOST", "x:8001"),
     ("VERIRL_VLLM_HOST", "[::1]"), ("VERIRL_VLLM_MODE", "colocate\x00")],
)  # fmt: skip
def test_range_and_plan_errors_name_the_variable(name, value):
    environ = {"VERIRL_GPU_COUNT": "4", name: value}
    with pytest.raises(ConfigError, match=rf"^{name}=") as info:
        topology_from_settings(environ=environ)
    assert info.value.field == name
    assert quoted(value) in str(info.value)


@pytest.mark.parametrize("value", ["nan", "inf", "-inf", "-1", "1e400", "1_0", "\u0663", "1e30",
                                   "soon", "\x00"])  # fmt: skip
def test_env_timeout_variable_must_be_finite_ascii_seconds(value):
    environ = {"VERIRL_GPU_COUNT": "1", "VERIRL_ENV_TIMEOUT": value}
    with pytest.raises(ConfigError, match=r"^VERIRL_ENV_TIMEOUT=") as info:
        TrainingRuntime.from_settings(environ=environ)
    assert info.value.field == "VERIRL_ENV_TIMEOUT"


@pytest.mark.parametrize("value", [math.nan, math.inf, -1.0, 1e30, 10**400])
def test_env_timeout_argument_is_checked_under_its_name(value):
    with pytest.raises(ConfigError, match=r"^env_timeout="):
        TrainingRuntime.from_settings(gpu_count=1, env_timeout=value, environ={})


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"env_timeout": math.inf}, "env_timeout"), ({"env_timeout": math.nan}, "env_timeout"),
    ({"remote_server_timeout": math.inf}, "remote_server_timeout"),
    ({"remote_server_timeout": 1e30}, "remote_server_timeout"),
    ({"environ": ["A=1"]}, "environ"), ({"resume_from": 5}, "resume_from"),
])  # fmt: skip
def test_runtime_arguments_are_finite_and_typed(kwargs, field):
    with pytest.raises(ConfigError, match=rf"^{field}="):
        TrainingRuntime(VLLMTopology.plan(1, max_model_len=64), **kwargs)


@pytest.mark.parametrize("gpus", [10**30, 2**16 + 1])
def test_huge_gpu_count_argument(gpus):
    with pytest.raises(ConfigError, match=r"^gpu_count="):
        TrainingRuntime.from_settings(gpu_count=gpus, environ={})


def test_vllm_command_variable_with_an_unbalanced_quote_names_the_variable():
    environ = {"VERIRL_GPU_COUNT": "2", "VERIRL_VLLM_COMMAND": "'x"}
    with pytest.raises(ConfigError, match=r"^VERIRL_VLLM_COMMAND="):
        TrainingRuntime.from_settings(environ=environ)


@pytest.mark.parametrize("command", ["python -m x", [], [""], [1], None.__class__])
def test_vllm_command_argument_must_be_an_argv(command):
    with pytest.raises(ConfigError, match=r"^vllm_command="):
        TrainingRuntime.from_settings(gpu_count=2, vllm_command=command, environ={})


@pytest.mark.parametrize("environ", [["VERIRL_GPU_COUNT=1"], "x", 5])
def test_environ_must_be_a_mapping(environ):
    with pytest.raises(ConfigError, match=r"^environ="):
        TrainingRuntime.from_settings(environ=environ)
    with pytest.raises(ConfigError, match=r"^environ="):
        resolver_from_settings(environ=environ)


@pytest.mark.parametrize("name", ["VERIRL_GPU_COUNT", "VERIRL_MODEL", "VERIRL_ENV_TIMEOUT"])
def test_environ_values_must_be_text(name):
    with pytest.raises(ConfigError, match=rf"^{name}="):
        TrainingRuntime.from_settings(environ={"VERIRL_GPU_COUNT": "1", name: 3})


def test_a_secret_variable_is_never_shown():
    token = "hf_secret\x01value"
    with pytest.raises(ConfigError, match=r"^HF_TOKEN=") as info:
        resolver_from_settings(environ={"VERIRL_HUB_REPO_ID": "org/run", "HF_TOKEN": token})
    assert "secret" not in str(info.value)
    with pytest.raises(ConfigError, match=r"^HF_TOKEN=") as info:
        resolver_from_settings(environ={"VERIRL_HUB_REPO_ID": "org/run", "HF_TOKEN": 12345})
    assert "12345" not in str(info.value)


@pytest.mark.parametrize(("name", "value"), [("VERIRL_HUB_REPO_ID", "not a repo"),
                                             ("VERIRL_HUB_REVISION", "\x07")])  # fmt: skip
def test_checkpoint_settings_name_the_variable(tmp_path, name, value):
    environ = {"VERIRL_OUTPUT_DIR": str(tmp_path), "VERIRL_HUB_REPO_ID": "org/run", name: value}
    with pytest.raises(ConfigError, match=rf"^{name}="):
        resolver_from_settings(environ=environ)


def test_blank_variables_are_unset():
    environ = dict.fromkeys([*INTEGER_VARIABLES, "VERIRL_ENV_TIMEOUT", "VERIRL_MODEL"], "  ")
    environ["VERIRL_GPU_COUNT"] = "2"
    rt = TrainingRuntime.from_settings(environ=environ)
    assert rt.topology.port == 8001
    assert rt.env_timeout == 600.0


# -- the vLLM start-up bound: the local server's startup_timeout and the wait for a remote one


def _startup_bounds(runtime: TrainingRuntime) -> tuple[float, float]:
    """The built (never started) server's ``startup_timeout`` and ``remote_server_timeout``."""
    assert runtime.server_factory is not None
    server = runtime.server_factory(runtime.topology)
    assert isinstance(server, VLLMServer)
    return server.startup_timeout, runtime.remote_server_timeout


@pytest.mark.parametrize(
    ("argument", "variable", "expected"),
    [(None, None, 900.0), (1800, None, 1800.0), (None, "2400.5", 2400.5), (30.0, "2400", 30.0),
     (None, "  ", 900.0)],
)  # fmt: skip
def test_vllm_startup_timeout_reaches_the_server_and_the_remote_wait(argument, variable, expected):
    environ = {"VERIRL_GPU_COUNT": "2", "VERIRL_MODEL": "m"}
    if variable is not None:
        environ["VERIRL_VLLM_STARTUP_TIMEOUT"] = variable
    runtime = TrainingRuntime.from_settings(vllm_startup_timeout=argument, environ=environ)
    assert _startup_bounds(runtime) == (expected, expected)


def test_vllm_startup_timeout_bounds_the_wait_for_a_remote_server():
    runtime = TrainingRuntime.from_settings(
        gpu_count=2, vllm_remote_host="vllm-node", vllm_startup_timeout=42, environ={}
    )
    assert not runtime.starts_server
    assert runtime.remote_server_timeout == 42.0


def test_vllm_servers_own_default_stays_600_seconds():
    assert VLLMServer("m").startup_timeout == 600.0
    assert TrainingRuntime(VLLMTopology.plan(2, max_model_len=64)).remote_server_timeout == 900.0


@pytest.mark.parametrize("value", [0, 0.0, -1, math.nan, math.inf, -math.inf, 1e30, 10**400,
                                   "900", True, None.__class__])  # fmt: skip
def test_vllm_startup_timeout_argument_must_be_positive_and_finite(value):
    with pytest.raises(ConfigError, match=r"^vllm_startup_timeout=") as info:
        TrainingRuntime.from_settings(gpu_count=2, vllm_startup_timeout=value, environ={})
    assert info.value.field == "vllm_startup_timeout"


@pytest.mark.parametrize("value", ["0", "0.0", "-1", "nan", "inf", "-inf", "1e30", "soon", "1_0",
                                   "\u0663", "\x00"])  # fmt: skip
def test_vllm_startup_timeout_variable_must_be_positive_and_finite(value):
    environ = {"VERIRL_GPU_COUNT": "2", "VERIRL_VLLM_STARTUP_TIMEOUT": value}
    with pytest.raises(ConfigError, match=r"^VERIRL_VLLM_STARTUP_TIMEOUT=") as info:
        TrainingRuntime.from_settings(environ=environ)
    assert info.value.field == "VERIRL_VLLM_STARTUP_TIMEOUT"
    assert quoted(value) in str(info.value)


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "[::1]", "0.0.0.0"])
@pytest.mark.parametrize("port", [9100, 51216], ids=["vLLM port", "TRL group port"])
def test_an_env_url_where_the_local_vllm_server_listens_is_refused(host, port):
    """verirl's own vLLM server would answer the env wait's /health."""
    url = f"http://{host}:{port}/"
    with pytest.raises(ConfigError, match=rf"^env_url=.*is on .*port \({port}\)"):
        TrainingRuntime.from_settings(gpu_count=2, model="m", vllm_port=9100, env_url=url,
                                      environ={})  # fmt: skip
    environ = {"VERIRL_ENV_SERVER_URL": url, "VERIRL_GPU_COUNT": "2", "VERIRL_MODEL": "m",
               "VERIRL_VLLM_PORT": "9100"}  # fmt: skip
    with pytest.raises(ConfigError, match=r"^VERIRL_ENV_SERVER_URL="):
        TrainingRuntime.from_settings(environ=environ)


@pytest.mark.parametrize(
    ("url", "settings"),
    [
        ("http://127.0.0.1:9100", {"gpu_count": 1}),  # colocate: no server listens here
        ("http://127.0.0.1:9101", {"gpu_count": 2, "model": "m"}),
        ("http://env-host:9100", {"gpu_count": 2, "model": "m"}),  # another machine
        ("http://127.0.0.1:9100", {"gpu_count": 2, "vllm_remote_host": "vllm-node"}),
    ],
)
def test_an_env_url_elsewhere_is_fine(url, settings):
    TrainingRuntime.from_settings(vllm_port=9100, env_url=url, environ={}, **settings)


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "::1"])
def test_an_env_url_where_a_vllm_server_of_this_host_named_as_remote_listens_is_refused(host):
    """``--vllm-host 127.0.0.1`` (``verirl serve`` beside the job) answers /health too."""
    url = "http://127.0.0.1:9100/"
    with pytest.raises(ConfigError, match=rf"^env_url=.*on this host \({host}\)"):
        TrainingRuntime.from_settings(gpu_count=2, vllm_remote_host=host, vllm_port=9100,
                                      env_url=url, environ={})  # fmt: skip


@pytest.mark.parametrize("port", [9100, 51216], ids=["vLLM port", "TRL group port"])
def test_a_hand_built_runtime_refuses_an_env_probe_where_its_server_listens(port, tmp_path):
    """What from_settings refuses, start() refuses too, before anything starts."""
    from verirl import HttpEnvServerProbe

    topology = VLLMTopology.plan(2, max_model_len=1024, port=9100)
    probe = HttpEnvServerProbe(f"http://user:s3cr3tpass@localhost:{port}")
    built: list[object] = []
    runtime = TrainingRuntime(topology, model="m", env_probe=probe, environ={}, env_timeout=2.0,
                              server_factory=built.append)  # fmt: skip
    with pytest.raises(ConfigError, match=r"^env_probe=.*is on .*port") as err:
        runtime.start()
    assert "s3cr3tpass" not in str(err.value)
    assert built == []
    assert runtime.session is None


@pytest.mark.parametrize("kind", ["Mock", "MagicMock", "autospec"])
def test_a_mock_env_probe_is_taken_beside_a_server_of_this_host(kind):
    """Components are injected: a test's mock probe has no URL the port check could parse."""
    from unittest import mock

    from fakes import FakeVLLMServer
    from verirl import EnvServerProbe

    probe = {
        "Mock": lambda: mock.Mock(spec=EnvServerProbe),
        "MagicMock": mock.MagicMock,
        "autospec": lambda: mock.create_autospec(EnvServerProbe, instance=True),
    }[kind]()
    topology = VLLMTopology.plan(2, max_model_len=1024, port=9100)  # a server on this host
    runtime = TrainingRuntime(
        topology, model="m", environ={}, env_probe=probe,
        server_factory=lambda t: FakeVLLMServer.from_topology(t, model="m", startup_delay=0.0),
    )  # fmt: skip
    with runtime as session:
        assert session.server is not None
    probe.wait.assert_called_once()


@pytest.mark.parametrize(
    ("variable", "value"),
    [("VERIRL_VLLM_HOST", "0x7f000001"), ("VERIRL_VLLM_HOST", "a b"),
     ("VERIRL_VLLM_PORT", "51216")],
)  # fmt: skip
def test_an_error_about_one_value_does_not_list_the_other_variables(variable, value):
    environ = {"VERIRL_GPU_COUNT": "2", "VERIRL_MAX_MODEL_LEN": "4096", variable: value}
    with pytest.raises(ConfigError, match=rf"^{variable}=") as err:
        TrainingRuntime.from_settings(model="m", environ=environ)
    assert "from the environment" not in str(err.value)
    assert "VERIRL_GPU_COUNT" not in str(err.value)


def test_an_error_about_a_combination_lists_the_variables_weighed():
    environ = {"VERIRL_GPU_COUNT": "2", "VERIRL_VLLM_GPUS": "2"}
    with pytest.raises(ConfigError, match=r"\(from the environment: VERIRL_VLLM_GPUS=2\)"):
        TrainingRuntime.from_settings(mode="server", model="m", environ=environ)


# The typed form: from_settings(Settings(...)) (issue 27)

SETTINGS_ENVIRON = {
    # every one of these would change the runtime if it were read
    "VERIRL_GPU_COUNT": "4", "VERIRL_VLLM_PORT": "9000", "VERIRL_MODEL": "from-variable",
    "VERIRL_VLLM_STARTUP_TIMEOUT": "77", "VERIRL_ENV_TIMEOUT": "5",
}  # fmt: skip


def test_typed_settings_give_every_value_and_no_variable_is_read(tmp_path):
    settings = Settings(
        gpu_count=2, vllm_port=9123, model="m", output_dir=str(tmp_path),
        vllm_startup_timeout=1800.0, env_timeout=12.0, vllm_command=("prog", "-x"),
    )  # fmt: skip
    runtime = TrainingRuntime.from_settings(settings, environ=SETTINGS_ENVIRON)
    assert (runtime.topology.gpu_count, runtime.topology.port) == (2, 9123)
    assert runtime.env_timeout == 12.0
    assert _startup_bounds(runtime) == (1800.0, 1800.0)
    assert runtime.server_factory is not None
    server = runtime.server_factory(runtime.topology)
    assert isinstance(server, VLLMServer)
    assert server.model == "m"
    assert list(server.command or ())[:2] == ["prog", "-x"]
    assert runtime.checkpoints is not None


def test_typed_settings_read_from_the_environment_plan_as_the_variables_do():
    environ = {"VERIRL_GPU_COUNT": "4", "VERIRL_VLLM_GPUS": "2", "VERIRL_VLLM_PORT": "9000",
               "VERIRL_MODEL": "m", "VERIRL_MAX_MODEL_LEN": "4096"}  # fmt: skip
    typed = TrainingRuntime.from_settings(Settings.from_environ(environ), environ={})
    keywords = TrainingRuntime.from_settings(environ=environ)
    assert typed.topology == keywords.topology
    changed = attrs.evolve(Settings.from_environ(environ), vllm_port=9100)
    assert TrainingRuntime.from_settings(changed, environ={}).topology.port == 9100


def test_a_bad_typed_value_is_named_by_its_field():
    with pytest.raises(ConfigError, match=r"^vllm_port=70000") as info:
        TrainingRuntime.from_settings(Settings(gpu_count=2, vllm_port=70000), environ={})
    assert info.value.field == "vllm_port"
    with pytest.raises(ConfigError) as info:
        TrainingRuntime.from_settings(Settings(gpu_count=1, output_dir="a\x01b"), environ={})
    assert info.value.field == "output_dir"


def test_an_unset_typed_gpu_count_is_named_by_its_field():
    """No GPU detected and none given: the field is named, not a variable nobody read."""
    with pytest.raises(ConfigError, match=r"^gpu_count=None \(unset") as info:
        TrainingRuntime.from_settings(Settings(), environ={"CUDA_VISIBLE_DEVICES": ""})
    assert info.value.field == "gpu_count"
    assert "VERIRL_GPU_COUNT" not in str(info.value)


@pytest.mark.parametrize(("field", "value"), [("vllm_port", 9100), ("hub_token", "hf_secret123")])
def test_a_setting_given_both_typed_and_as_an_argument_is_refused(field, value):
    settings = Settings(gpu_count=1, hub_repo_id="a/b", **{field: value})
    with pytest.raises(ConfigError, match="given both in settings and as an argument") as info:
        TrainingRuntime.from_settings(settings, **{field: value}, environ={})
    assert info.value.field == field
    assert "hf_secret123" not in str(info.value)


@pytest.mark.parametrize("settings", [{"vllm_port": 9000}, "VERIRL_VLLM_PORT=9000", 1])
def test_settings_must_be_a_settings(settings):
    with pytest.raises(ConfigError, match=r"^settings=.*must be a verirl.Settings") as info:
        TrainingRuntime.from_settings(settings, environ={})
    assert info.value.field == "settings"


def test_topology_and_resolver_take_typed_settings_too(tmp_path):
    settings = Settings(gpu_count=2, vllm_port=9124, output_dir=str(tmp_path), model="m")
    assert topology_from_settings(settings, environ=SETTINGS_ENVIRON).port == 9124
    (tmp_path / "checkpoint-7").mkdir()
    (tmp_path / "checkpoint-7" / "trainer_state.json").write_text("{}")
    resolver = resolver_from_settings(settings, environ={"VERIRL_OUTPUT_DIR": "/nonexistent"})
    assert resolver.resolve("latest") == str(tmp_path / "checkpoint-7")


# Every component's timeouts are settings (issue 27): the server's grace after SIGTERM, the
# watchdog's save grace, the local ranks' wait for rank 0's checkpoint.


def _shutdown_timeout(runtime: TrainingRuntime) -> float:
    assert runtime.server_factory is not None
    server = runtime.server_factory(runtime.topology)
    assert isinstance(server, VLLMServer)
    return server.shutdown_timeout


def _reached(runtime: TrainingRuntime) -> tuple[float, float, float]:
    return (
        _shutdown_timeout(runtime),
        runtime.vllm_failure_grace,
        runtime.checkpoint_wait_timeout,
    )


def test_the_component_timeouts_default_to_the_components_own():
    runtime = TrainingRuntime.from_settings(gpu_count=2, model="m", environ={})
    assert _reached(runtime) == (
        VLLMServer("m").shutdown_timeout,
        TrainingRuntime(VLLMTopology.plan(1, max_model_len=64)).vllm_failure_grace,
        TrainingRuntime(VLLMTopology.plan(1, max_model_len=64)).checkpoint_wait_timeout,
    )
    assert _reached(runtime) == (30.0, 120.0, 3600.0)


@pytest.mark.parametrize("door", ["argument", "variable", "typed"])
def test_the_component_timeouts_reach_the_components(door):
    values = {"vllm_shutdown_timeout": 7.5, "vllm_failure_grace": 0.0,
              "checkpoint_wait_timeout": 90.0}  # fmt: skip
    environ = {"VERIRL_GPU_COUNT": "2", "VERIRL_MODEL": "m"}
    if door == "argument":
        runtime = TrainingRuntime.from_settings(**values, environ=environ)
    elif door == "variable":
        environ.update({Settings.variable(field): str(value) for field, value in values.items()})
        runtime = TrainingRuntime.from_settings(environ=environ)
    else:
        runtime = TrainingRuntime.from_settings(
            Settings(gpu_count=2, model="m", **values), environ={}
        )
    assert _reached(runtime) == (7.5, 0.0, 90.0)


@pytest.mark.parametrize(
    ("field", "value"),
    [("vllm_shutdown_timeout", "-1"), ("vllm_shutdown_timeout", "nan"),
     ("vllm_failure_grace", "inf"), ("vllm_failure_grace", "soon"),
     ("checkpoint_wait_timeout", "0"), ("checkpoint_wait_timeout", "1e30")],
)  # fmt: skip
def test_a_bad_component_timeout_is_named_by_where_it_came_from(field, value):
    variable = Settings.variable(field)
    environ = {"VERIRL_GPU_COUNT": "2", "VERIRL_MODEL": "m", variable: value}
    with pytest.raises(ConfigError, match=rf"^{variable}=") as info:
        TrainingRuntime.from_settings(environ=environ)
    assert info.value.field == variable
    as_number = float(value) if value != "soon" else value
    with pytest.raises(ConfigError, match=rf"^{field}=") as info:
        TrainingRuntime.from_settings(gpu_count=2, model="m", environ={}, **{field: as_number})
    assert info.value.field == field


@pytest.mark.parametrize(
    ("field", "value", "secret"),
    [("vllm_args", ("--api-key", "S3CRETPASS"), "S3CRETPASS"),
     ("vllm_command", ("vllm", "serve", "--api-key", "S3CRETPASS"), "S3CRETPASS"),
     ("env_url", "http://user:S3CRETPASS@envhost:8000", "S3CRETPASS"),
     ("hub_endpoint", "https://user:S3CRETPASS@mirror.example", "S3CRETPASS"),
     ("hub_token", "hf_S3CRETPASS", "S3CRETPASS")],
)  # fmt: skip
def test_a_setting_given_both_ways_never_shows_its_secret(field, value, secret):
    """The both-ways refusal showed server flags, commands and URL passwords (review 25): each
    field is shown there as every other error shows it."""
    settings = Settings(gpu_count=2, model="m", hub_repo_id="a/b", **{field: value})
    with pytest.raises(ConfigError, match="given both") as info:
        TrainingRuntime.from_settings(settings, environ={}, **{field: value})
    assert info.value.field == field
    assert secret not in str(info.value)
    assert secret not in repr(info.value.value)


# Review 26: secrets through every door, a token read as HF_TOKEN is

PATH_WORD_COMMAND = [sys.executable, Path("serve.py"), "--api-key", "SEKRIT-KEY-123"]


@pytest.mark.parametrize("door", ["argument", "typed", "both"])
def test_an_api_key_after_a_word_that_is_not_text_is_hidden(door):
    """A Path word (subprocess takes one) made the whole argv shown as it was (review 26)."""
    environ = {"VERIRL_GPU_COUNT": "2", "VERIRL_MODEL": "m"}
    given: dict[str, object] = {"vllm_command": PATH_WORD_COMMAND, "environ": environ}
    typed = None
    if door != "argument":
        command = PATH_WORD_COMMAND if door == "typed" else ("x",)
        typed = Settings(gpu_count=2, model="m", vllm_command=command)
        given = {"environ": {}} if door == "typed" else {**given, "environ": {}}
    with pytest.raises(ConfigError) as info:
        TrainingRuntime.from_settings(typed, **given)
    for shown in (str(info.value), repr(info.value.value), repr(info.value)):
        assert "SEKRIT-KEY-123" not in shown
    assert "SEKRIT-KEY-123" not in repr(Settings(vllm_command=PATH_WORD_COMMAND))


def test_the_hub_token_in_an_endpoint_is_hidden_by_every_refusal(monkeypatch):
    token = "tokSEKRIT0123456789abcdef"
    monkeypatch.setenv("HF_TOKEN", token)
    endpoint = f"https://mirror.example/{token}/\x01"
    with pytest.raises(ConfigError) as info:
        resolver_from_settings(hub_repo_id="o/r", hub_endpoint=endpoint)
    assert token not in str(info.value)
    assert token not in repr(info.value.value)
    typed = Settings(hub_repo_id="o/r", hub_token=token, hub_endpoint="https://mirror.example")
    with pytest.raises(ConfigError, match="given both") as info:
        resolver_from_settings(typed, hub_endpoint=f"https://mirror.example/{token}", environ={})
    assert token not in str(info.value)
    assert token not in repr(info.value.value)


@pytest.mark.parametrize("door", ["argument", "typed", "variable"])
def test_a_hub_token_with_a_line_end_is_read_as_hf_token_is(door, tmp_path):
    """A token read from a file keeps its newline: HF_TOKEN drops it, so does every door."""
    token = "hf_" + "a" * 34
    environ = {}
    if door == "variable":
        environ["HF_TOKEN"] = token + "\n"
        resolver = resolver_from_settings(hub_repo_id="o/r", output_dir=str(tmp_path),
                                          environ=environ)  # fmt: skip
    elif door == "argument":
        resolver = resolver_from_settings(hub_repo_id="o/r", output_dir=str(tmp_path),
                                          hub_token=token + "\r\n", environ=environ)  # fmt: skip
    else:
        typed = Settings(hub_repo_id="o/r", output_dir=str(tmp_path), hub_token=token + "\n")
        resolver = resolver_from_settings(typed, environ=environ)
    hub = resolver.sources[-1]
    assert hub._token == token


# Review 27: an argument read as its variable is; any argv shape redacted


@pytest.mark.parametrize("door", ["argument", "typed", "variable"])
def test_an_argument_with_a_line_end_reads_as_its_variable(door, tmp_path):
    """``output_dir="/ckpts\\n"`` looked in a folder named with the line end, so ``auto`` started
    fresh where the variable resumed (review 27): blanks around a text value are not part of it
    through any door."""
    (tmp_path / "checkpoint-5").mkdir()
    (tmp_path / "checkpoint-5" / "trainer_state.json").write_text('{"global_step": 5}')
    values = {"output_dir": f"{tmp_path}\n", "model": " m\u2028", "mode": " server ",
              "hub_revision": "main\r\n", "resume_from": "auto\n"}  # fmt: skip
    environ = {"VERIRL_GPU_COUNT": "2", "VERIRL_HUB_REPO_ID": "a/b"}
    if door == "argument":
        runtime = TrainingRuntime.from_settings(**values, environ=environ)
    elif door == "typed":
        runtime = TrainingRuntime.from_settings(
            Settings(gpu_count=2, hub_repo_id="a/b", **values), environ={}
        )
    else:
        environ.update({Settings.variable(field): value for field, value in values.items()})
        runtime = TrainingRuntime.from_settings(environ=environ)
    assert runtime.model == "m"
    assert runtime.topology.mode == "server"
    assert runtime.checkpoints is not None
    assert runtime.checkpoints.resolve(runtime.resume_from) == str(tmp_path / "checkpoint-5")


def test_a_path_object_is_a_path_as_it_is(tmp_path):
    """Blanks are dropped from text, never from a path object: ``Path("run ")`` is that folder."""
    folder = tmp_path / "run "
    (folder / "checkpoint-2").mkdir(parents=True)
    (folder / "checkpoint-2" / "trainer_state.json").write_text('{"global_step": 2}')
    runtime = TrainingRuntime.from_settings(gpu_count=1, output_dir=folder, environ={})
    assert runtime.checkpoints is not None
    assert runtime.checkpoints.resolve("latest") == str(folder / "checkpoint-2")


@pytest.mark.parametrize(
    "command",
    [UserList(["python", "-m", "srv", "--api-key", "sk-SECRETVALUE123456", ""]),
     ["python", b"--api-key", "sk-SECRETVALUE123456"],
     ("python", "--api-key", "sk-SECRETVALUE123456", "")],
    ids=["UserList", "bytes-word", "tuple"],
)  # fmt: skip
def test_an_argv_of_any_shape_is_redacted_when_refused(command):
    with pytest.raises(ConfigError) as info:
        TrainingRuntime.from_settings(gpu_count=2, model="m", vllm_command=command, environ={})
    for shown in (str(info.value), repr(info.value.value)):
        assert "SECRETVALUE" not in shown
    assert "SECRETVALUE" not in repr(Settings(vllm_command=command, vllm_args=command))


def test_a_url_given_as_bytes_never_keeps_its_password():
    with pytest.raises(ConfigError) as info:
        TrainingRuntime.from_settings(gpu_count=1, env_url=b"https://user:PASSWORD9@h/", environ={})
    assert "PASSWORD9" not in str(info.value)
    assert "PASSWORD9" not in repr(info.value.value)


# Review 28: the given token hidden in every refusal and repr; bytes words; server flags


TOKEN = "Zq9xWv7uTs5rQp3oNm1lKj"  # no hf_ shape: hidden because it is the token, not by pattern


@pytest.mark.parametrize(
    ("environ", "given"),
    [({"VERIRL_HUB_ENDPOINT": f"https://proxy.example/{TOKEN}/\x01"}, {}),
     ({"VERIRL_VLLM_COMMAND": f"prog {TOKEN} ''"}, {}),
     ({}, {"vllm_command": ["prog", TOKEN, ""]})],
    ids=["endpoint-variable", "command-variable", "command-argument"],
)  # fmt: skip
def test_the_hub_token_given_as_an_argument_is_hidden_in_every_refusal(environ, given):
    environ = {"VERIRL_GPU_COUNT": "2", "VERIRL_MODEL": "m", **environ}
    typed = Settings(hub_repo_id="o/r", hub_token=TOKEN, gpu_count=2, model="m")
    keywords = {"hub_repo_id": "o/r", "hub_token": TOKEN}
    doors = [(None, keywords), (typed, {})] if given else [(None, keywords)]  # typed: no variable
    for settings, more in doors:
        with pytest.raises(ConfigError) as info:
            TrainingRuntime.from_settings(settings, environ=environ, **more, **given)
        assert TOKEN not in str(info.value)
        assert TOKEN not in repr(info.value.value)


def test_the_settings_repr_hides_the_token_inside_other_values():
    settings = Settings(hub_token=TOKEN, hub_endpoint=f"https://proxy.example/{TOKEN}",
                        vllm_command=("prog", TOKEN))  # fmt: skip
    assert TOKEN not in repr(settings)
    assert TOKEN not in str(settings)


@pytest.mark.parametrize("field", ["vllm_args", "vllm_command"])
def test_a_bytes_flag_word_never_shows_the_value_after_it(field):
    words = ["prog", b"--api-key", "S3cretValue1234567"]
    given = {field: words[1:] if field == "vllm_args" else words}
    with pytest.raises(ConfigError) as info:
        TrainingRuntime.from_settings(gpu_count=2, model="m", environ={}, **given)
    assert "S3cretValue1234567" not in str(info.value) + repr(info.value.value)
    for server_field in ("command", "extra_args"):
        with pytest.raises(ConfigError) as info:
            VLLMServer("m", **{server_field: words})
        assert "S3cretValue1234567" not in str(info.value) + repr(info.value.value)


def test_a_refused_server_flag_list_is_never_echoed():
    """The README: errors never echo extra_args (a redacted list showed the others' values)."""
    flags = ["--middleware", "x:SECRETMIDDLE", "--port", "1"]
    with pytest.raises(ConfigError) as info:
        TrainingRuntime.from_settings(gpu_count=2, model="m", vllm_args=flags, environ={})
    assert info.value.field == "vllm_args"
    assert "SECRETMIDDLE" not in str(info.value) + repr(info.value.value)


# Review 29: the token scrubbed from the whole error, whichever source gives it


@pytest.mark.parametrize("source", ["argument", "HF_TOKEN"])
@pytest.mark.parametrize(
    "given",
    [{"env_url": f"proxy.local/{TOKEN}"}, {"hub_revision": f"{TOKEN}.lock"},
     {"env_timeout": TOKEN}, {"vllm_unresponsive_timeout": [TOKEN]},
     {"vllm_command": ["python", Path(f"/tmp/{TOKEN}"), ""]}],
    ids=["env_url", "hub_revision", "env_timeout", "unresponsive", "command-path"],
)  # fmt: skip
def test_no_part_of_a_refusal_shows_the_hub_token(source, given):
    import traceback

    environ = {"HF_TOKEN": TOKEN} if source == "HF_TOKEN" else {}
    token = {"hub_token": TOKEN} if source == "argument" else {}
    with pytest.raises(ConfigError) as info:
        TrainingRuntime.from_settings(
            gpu_count=2, model="m", hub_repo_id="a/b", environ=environ, **token, **given
        )
    shown = "".join(traceback.format_exception(info.value))
    for text in (shown, str(info.value), repr(info.value.value)):
        assert TOKEN not in text


@pytest.mark.parametrize("value", [b"http://user:PW9@h:9/", 123, ["h"]])
def test_the_settings_repr_takes_any_value_in_a_url_field(value):
    shown = repr(Settings(env_url=value, hub_endpoint=value, vllm_remote_host=value))
    assert "PW9" not in shown


# Review 30: every *_from_settings hides the token, in the whole chain, the longest whole

LONG = "tokSECRETabcdefghijklmnop1234"


def test_topology_from_settings_hides_a_token_from_hf_token():
    environ = {"HF_TOKEN": LONG, "VERIRL_VLLM_MODE": LONG}
    for settings in (None, Settings(hub_token=LONG, mode=LONG)):
        with pytest.raises(ConfigError) as info:
            topology_from_settings(settings, environ=environ if settings is None else {})
        assert LONG not in str(info.value)
        assert LONG not in repr(info.value.value)


def test_no_error_in_the_chain_keeps_the_token_in_its_value():
    with pytest.raises(ConfigError) as info:
        resolver_from_settings(environ={"HF_TOKEN": LONG, "VERIRL_HUB_REVISION": f"{LONG}.lock",
                                        "VERIRL_HUB_REPO_ID": "a/b"})  # fmt: skip
    seen: list[BaseException] = []
    error: BaseException | None = info.value
    while error is not None and error not in seen:
        seen.append(error)
        for kept in (str(error), repr(getattr(error, "value", None)), getattr(error, "reason", "")):
            assert LONG not in str(kept)
        error = error.__cause__ or error.__context__


def test_a_token_inside_a_longer_one_hides_the_longer_one_whole():
    with pytest.raises(ConfigError) as info:
        TrainingRuntime.from_settings(
            hub_token=LONG[:17], gpu_count=2, environ={"HF_TOKEN": LONG, "VERIRL_VLLM_MODE": LONG}
        )
    assert LONG[17:] not in str(info.value)

"""Settings: one reader of the VERIRL_* variables, matching the README and from_settings."""

from __future__ import annotations

import inspect
import os
import re
import sys
import warnings
from pathlib import Path

import attrs
import pytest

from verirl import ConfigError, TrainingRuntime, VLLMTopology, topology_from_settings
from verirl._fs import quoted
from verirl._settings import Settings

README = Path(__file__).resolve().parent.parent / "README.md"


def readme_settings_table() -> dict[str, tuple[str, str]]:
    """variable → (argument, default) from the README's settings table."""
    text = README.read_text()
    start = text.index("| variable | argument | meaning | default |")
    rows = {}
    for line in text[start:].splitlines()[2:]:
        if not line.startswith("|"):
            break
        cells = [cell.strip() for cell in line.strip("|").split("|")]
        variable, argument, _meaning, default = cells
        rows[variable.strip("`")] = (argument.strip("`"), default)
    return rows


def test_readme_table_lists_exactly_the_settings_with_their_defaults():
    expected = {
        field.metadata["variable"]: (field.name, field.metadata["default"])
        for field in attrs.fields(Settings)
    }
    assert readme_settings_table() == expected


# A serving node's choices: explicit arguments (serve's flags), never read from a variable.
SERVING_ONLY = {"vllm_bind_host", "vllm_tensor_parallel_size", "vllm_data_parallel_size",
                "vllm_dedicated"}  # fmt: skip


def test_from_settings_takes_one_argument_per_setting():
    parameters = set(inspect.signature(TrainingRuntime.from_settings).parameters) - {
        "environ",
        "settings",
    }
    assert parameters - SERVING_ONLY == set(attrs.fields_dict(Settings))
    assert not SERVING_ONLY & set(attrs.fields_dict(Settings))


def test_from_environ_parses_every_variable():
    environ = {
        "VERIRL_ENV_SERVER_URL": " http://env:8000 ",
        "VERIRL_ENV_TIMEOUT": "12.5",
        "VERIRL_MAX_MODEL_LEN": "2048",
        "VERIRL_GPU_COUNT": "4",
        "VERIRL_VLLM_MODE": "server",
        "VERIRL_VLLM_PORT": "8123",
        "VERIRL_VLLM_COMMAND": "python -m 'fakes.vllm_serve'",
        "VERIRL_VLLM_ARGS": "--enforce-eager --dtype float32",
        "HF_TOKEN": "hf_secret",
        "UNRELATED": "\x00",
    }
    settings = Settings.from_environ(environ)
    assert settings.env_url == "http://env:8000"
    assert settings.env_timeout == 12.5
    assert settings.max_model_len == 2048
    assert settings.gpu_count == 4
    assert settings.mode == "server"
    assert settings.vllm_port == 8123
    assert settings.vllm_command == ("python", "-m", "fakes.vllm_serve")
    assert settings.vllm_args == ("--enforce-eager", "--dtype", "float32")
    assert settings.hub_token == "hf_secret"
    assert "hf_secret" not in repr(settings)
    assert settings.model is None


def test_blank_is_unset():
    environ = dict.fromkeys(Settings.variables().values(), " \t")
    assert Settings.from_environ(environ) == Settings()


@pytest.mark.parametrize(
    ("variable", "value"),
    [("VERIRL_GPU_COUNT", "two"), ("VERIRL_VLLM_PORT", "70000"), ("VERIRL_ENV_TIMEOUT", "nan"),
     ("VERIRL_VLLM_MODE", "both"), ("VERIRL_MODEL", "m\x07"), ("VERIRL_VLLM_COMMAND", "'x")],
)  # fmt: skip
def test_a_bad_value_names_the_variable_and_shows_the_value(variable, value):
    with pytest.raises(ConfigError, match=rf"^{variable}=") as info:
        Settings.from_environ({variable: value})
    assert info.value.field == variable
    assert quoted(value) in str(info.value)


def test_a_bad_token_is_never_shown():
    with pytest.raises(ConfigError, match=r"^HF_TOKEN=") as info:
        Settings.from_environ({"HF_TOKEN": "hf_secret\x01"})
    assert "secret" not in str(info.value)


@pytest.mark.parametrize(
    "raw", ["hf_Wrapped\nToken123\n", "hf_Wrapped\r\nToken123", " hf_WrappedToken123 "]
)
def test_a_token_is_read_as_huggingface_hub_reads_it(raw):
    # huggingface_hub drops every CR and LF of HF_TOKEN (a token wrapped over lines) and sends it
    from huggingface_hub.utils._auth import _clean_token  # type: ignore[attr-defined]

    assert Settings.from_environ({"HF_TOKEN": raw}).hub_token == _clean_token(raw)


@pytest.fixture
def no_torch(monkeypatch):
    """GPUs counted from CUDA_VISIBLE_DEVICES, as on a machine without torch."""
    monkeypatch.setitem(sys.modules, "torch", None)


@pytest.mark.parametrize("value", ["", "  "])
def test_a_blank_gpu_count_is_unset_and_shown_as_given(no_torch, value):
    topology = topology_from_settings(
        environ={"VERIRL_GPU_COUNT": value, "CUDA_VISIBLE_DEVICES": "0,1,2"}
    )
    assert topology.gpu_count == 3  # detected, as when unset
    with pytest.raises(ConfigError, match=r"^VERIRL_GPU_COUNT=") as info:
        topology_from_settings(environ={"VERIRL_GPU_COUNT": value, "CUDA_VISIBLE_DEVICES": "-1"})
    assert f"VERIRL_GPU_COUNT={value!r} (blank" in str(info.value)
    assert info.value.value == value


def test_an_unset_gpu_count_with_no_gpu_says_to_set_it(no_torch):
    with pytest.raises(ConfigError, match=r"^VERIRL_GPU_COUNT=None \(unset") as info:
        topology_from_settings(environ={"CUDA_VISIBLE_DEVICES": "-1"})
    assert "set it" in str(info.value)


@pytest.mark.parametrize(
    ("kwargs", "environ", "prefix"),
    [({"gpu_count": 1}, {"VERIRL_GPU_COUNT": "4"}, "gpu_count=1: "),
     ({}, {"VERIRL_GPU_COUNT": "1"}, "VERIRL_GPU_COUNT=1: "),
     ({}, {"CUDA_VISIBLE_DEVICES": "0"}, "VERIRL_GPU_COUNT=None (unset; 1 GPU(s) detected): ")],
)  # fmt: skip
def test_a_plan_error_names_where_the_gpu_count_came_from(no_torch, kwargs, environ, prefix):
    with pytest.raises(ConfigError) as info:
        topology_from_settings(mode="server", **kwargs, environ=environ)
    assert str(info.value).startswith(prefix)


def test_from_settings_reads_the_launcher_from_environ_too():
    launcher = {"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2",
                "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}  # fmt: skip
    launcher["VERIRL_GPU_COUNT"] = "2"
    rt = TrainingRuntime.from_settings(environ=launcher)
    assert rt.dist_env is not None
    assert rt.dist_env.rank == 1
    assert rt.dist_env.variables["MASTER_ADDR"] == "10.0.0.1"
    assert not rt.starts_server  # local rank 1 waits for local rank 0's server


def test_from_settings_names_a_bad_launcher_variable():
    with pytest.raises(ConfigError, match=r"^RANK="):
        TrainingRuntime.from_settings(environ={"VERIRL_GPU_COUNT": "2", "RANK": "x"})


def test_server_timeout_is_a_deprecated_alias_of_remote_server_timeout():
    topology = VLLMTopology.plan(1, max_model_len=64)
    with pytest.deprecated_call(match="remote_server_timeout"):
        rt = TrainingRuntime(topology, server_timeout=12.0)
    assert rt.remote_server_timeout == 12.0
    with pytest.deprecated_call(match="remote_server_timeout"):
        assert rt.server_timeout == 12.0
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert TrainingRuntime(topology).remote_server_timeout == 900.0


def test_a_bad_deprecated_server_timeout_names_it():
    topology = VLLMTopology.plan(1, max_model_len=64)
    with (
        pytest.deprecated_call(),
        pytest.raises(ConfigError, match=r"^server_timeout="),
    ):
        TrainingRuntime(topology, server_timeout=0)


def test_variable_names_match_the_readme_wording():
    assert Settings.variable("gpu_count") == "VERIRL_GPU_COUNT"
    assert all(re.fullmatch(r"(VERIRL_[A-Z_]+|HF_TOKEN)", v) for v in Settings.variables().values())


# Settings read as text (not numbers, not server flags): each door applies the variable's rule.
TEXT_SETTINGS = [
    field.name
    for field in attrs.fields(Settings)
    if field.type not in ("int | None", "float | None")
    and field.name not in ("vllm_args", "vllm_command")  # argv: any word exec takes
]


@pytest.mark.parametrize("door", ["argument", "variable"])
@pytest.mark.parametrize("field", TEXT_SETTINGS)
def test_a_control_character_is_refused_whichever_door_it_comes_through(field, door):
    """A value the variable refuses is refused as a `from_settings` argument too (and so as a
    flag, which is one): ``--output-dir $'a\\x01b'`` was taken, its variable refused (issue 27)."""
    value = "a\x01b"
    environ = {"VERIRL_GPU_COUNT": "2", "VERIRL_MODEL": "m", "VERIRL_HUB_REPO_ID": "a/b"}
    given: dict[str, object] = {}
    if door == "variable":
        environ[Settings.variable(field)] = value
    else:
        given[field] = [value] if field == "vllm_command" else value
    with pytest.raises(ConfigError) as caught:
        TrainingRuntime.from_settings(environ=environ, **given)
    name = field if door == "argument" else Settings.variable(field)
    assert caught.value.field == name
    assert caught.value.reason == "must not contain control characters"
    if field == "hub_token":
        assert value not in str(caught.value)


@pytest.mark.parametrize("value", ["auto\r", "latest\n", " auto \r\n"])
def test_blanks_around_a_flag_are_not_part_of_it_as_for_its_variable(value, tmp_path, capsys):
    """A value read from a file keeps its line end (``read -r``, a Windows editor): the flag reads
    it as its variable does, not as a control character (review 24, a regression of e147e57)."""
    from _support import run_cli

    (tmp_path / "checkpoint-3").mkdir()
    (tmp_path / "checkpoint-3" / "trainer_state.json").write_text('{"global_step": 3}')
    assert run_cli(["resume", "--output-dir", str(tmp_path), "--resume", value]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "checkpoint-3")
    runtime = TrainingRuntime.from_settings(
        gpu_count=1, output_dir=str(tmp_path), resume_from=value, environ={}
    )
    assert runtime.resume_from == value.strip()  # as VERIRL_RESUME_FROM_CHECKPOINT is read


MULTI_LINE = ("python3", "-c", "import sys\nprint(sys.argv)")


@pytest.mark.parametrize("door", ["argument", "variable", "typed"])
def test_a_command_word_may_hold_a_line_break_as_exec_takes_it(door):
    """``python -c`` with a program of several lines is an argv exec runs: no door refuses it
    (review 24: e147e57 refused it as a control character in two doors of three)."""
    environ = {"VERIRL_GPU_COUNT": "2", "VERIRL_MODEL": "m"}
    if door == "argument":
        runtime = TrainingRuntime.from_settings(vllm_command=MULTI_LINE, environ=environ)
    elif door == "variable":
        environ["VERIRL_VLLM_COMMAND"] = "python3 -c 'import sys\nprint(sys.argv)'\n  "
        runtime = TrainingRuntime.from_settings(environ=environ)
    else:
        typed = Settings(gpu_count=2, model="m", vllm_command=MULTI_LINE)
        runtime = TrainingRuntime.from_settings(typed, environ={})
    assert runtime.server_factory is not None
    assert tuple(runtime.server_factory(runtime.topology).command or ())[:3] == MULTI_LINE


@pytest.mark.parametrize("door", ["argument", "variable", "flag"])
def test_an_empty_command_word_is_named_where_it_was_given(door, capsys, monkeypatch):
    """``--served-model-name ''`` in VERIRL_VLLM_COMMAND named an internal ``command=`` field and
    said 'non-empty list' of a list that was not empty (review 24)."""
    from _support import run_cli

    reason = "must not hold an empty argument ('')"
    line = "prog --served-model-name ''"
    if door == "flag":
        for name in [name for name in os.environ if name.startswith("VERIRL_")]:
            monkeypatch.delenv(name)
        argv = ["plan", "--gpus", "2", "--model", "m", "--vllm-command", line]
        assert run_cli(["serve", *argv[1:]]) == 2
        assert f"--vllm-command=['prog', '--served-model-name', '']: {reason}" in (
            capsys.readouterr().err
        )
        return
    environ = {"VERIRL_GPU_COUNT": "2", "VERIRL_MODEL": "m"}
    given = {}
    if door == "variable":
        environ["VERIRL_VLLM_COMMAND"] = line
    else:
        given["vllm_command"] = ["prog", "--served-model-name", ""]
    with pytest.raises(ConfigError) as info:
        TrainingRuntime.from_settings(environ=environ, **given)
    assert info.value.field == ("vllm_command" if door == "argument" else "VERIRL_VLLM_COMMAND")
    assert info.value.reason == reason


@pytest.mark.parametrize("variable", ["VERIRL_VLLM_MODE", "VERIRL_GPU_COUNT", "VERIRL_OUTPUT_DIR"])
def test_from_environ_hides_the_hub_token_in_any_refused_variable(variable):
    """Only an endpoint's refusal was scrubbed (review 30): any value may hold the token."""
    token = "tokSECRETabcdefghijklmnop1234"
    value = f"/ck/{token}\x01" if variable == "VERIRL_OUTPUT_DIR" else token
    with pytest.raises(ConfigError) as info:
        Settings.from_environ({"HF_TOKEN": token, variable: value})
    assert token not in str(info.value)
    assert token not in repr(info.value.value)

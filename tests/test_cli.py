from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import urllib.request
from pathlib import Path

import psutil
import pytest

from _support import nothing_listens
from fakes import FakeEnvServer, FakeVLLMServer
from verirl import find_free_port
from verirl.cli import main
from verirl.cli.commands import _public_address

ROOT = Path(__file__).resolve().parent.parent


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 60):
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "verirl", *args],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=timeout,
        check=False,
    )


@pytest.fixture
def clean_env(monkeypatch):
    for name in list(os.environ):
        if name.startswith("VERIRL_") or name in ("CUDA_VISIBLE_DEVICES", "HF_TOKEN"):
            monkeypatch.delenv(name)


# -- help and exit codes


@pytest.mark.parametrize("command", ["plan", "wait-env", "resume", "serve", "launch", "doctor"])
def test_every_command_has_help(command, capsys):
    with pytest.raises(SystemExit) as info:
        main([command, "--help"])
    assert info.value.code == 0
    assert "usage: verirl" in capsys.readouterr().out


def test_top_level_help_lists_exit_codes(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    out = capsys.readouterr().out
    assert "Exit codes" in out
    assert "launch" in out


def test_version():
    result = run_cli("--version")
    assert result.returncode == 0
    assert result.stdout.startswith("verirl ")


def test_no_command_is_a_usage_error(capsys):
    with pytest.raises(SystemExit) as info:
        main([])
    assert info.value.code == 2


# -- plan


@pytest.mark.parametrize("value", [None, "", "  "])
def test_plan_with_no_gpu_count_and_none_detected_names_the_flag(value, capsys, clean_env,
                                                                 monkeypatch):  # fmt: skip
    monkeypatch.setitem(sys.modules, "torch", None)  # count CUDA_VISIBLE_DEVICES, as without torch
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "-1")
    if value is not None:
        monkeypatch.setenv("VERIRL_GPU_COUNT", value)
    assert main(["plan"]) == 2
    err = capsys.readouterr().err
    state = "unset" if value is None else "blank"
    assert f"--gpus not given and VERIRL_GPU_COUNT is {state}: no GPU was detected" in err


def test_plan_json(capsys, clean_env):
    assert main(["plan", "--gpus", "4", "--vllm-gpus", "2", "--json", "--model", "m"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["mode"] == "server"
    assert data["training_devices"] == [0, 1]
    assert data["vllm_devices"] == [2, 3]
    assert data["grpo_kwargs"]["vllm_server_port"] == 8001
    assert data["serve_args"][:2] == ["--model", "m"]


def test_plan_text_and_bad_gpu_count(capsys, clean_env):
    assert main(["plan", "--gpus", "1"]) == 0
    assert capsys.readouterr().out.startswith("colocate:")
    assert main(["plan", "--gpus", "0"]) == 2


def test_plan_reads_gpu_count_from_the_environment(capsys, clean_env, monkeypatch):
    monkeypatch.setenv("VERIRL_GPU_COUNT", "3")
    assert main(["plan", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["gpu_count"] == 3


# -- wait-env


def test_wait_env_healthy_and_unhealthy(capsys):
    with FakeEnvServer(ready_after=0.1) as server:
        assert main(["wait-env", server.url, "--timeout", "5"]) == 0
        assert "healthy" in capsys.readouterr().out
    with FakeEnvServer(ready_after=None) as server:
        assert main(["wait-env", server.url, "--timeout", "1", "--json"]) == 3
        data = json.loads(capsys.readouterr().out)
        assert data["healthy"] is False
        assert data["last_error"] == "HTTP 503"


@pytest.mark.parametrize("command", ["wait-env", "doctor"])
def test_a_url_password_is_never_printed(capsys, clean_env, command, monkeypatch):
    # A launch that can happen here (no trl/vllm in this suite), so that doctor finds no problem.
    monkeypatch.setenv("VERIRL_VLLM_COMMAND", f"{sys.executable} -m fakes.vllm_serve")
    monkeypatch.setenv("VERIRL_GPU_COUNT", "1")  # no GPU here: a count to plan for
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    with FakeEnvServer() as server:
        url = server.url.replace("http://", "http://user:pa55word@")
        args = ["wait-env", url, "--timeout", "30"] if command == "wait-env" else ["doctor"]
        if command == "doctor":
            args += ["--env-url", url]
        for extra in ([], ["--json"]):
            assert main([*args, *extra]) == 0
            captured = capsys.readouterr()
            assert "healthy" in captured.out
            assert "pa55word" not in captured.out + captured.err
            assert "***@" in captured.out


def test_wait_env_bad_url_is_a_config_error():
    result = run_cli("wait-env", "localhost:8000")
    assert result.returncode == 2
    assert "url='localhost:8000'" in result.stderr


# -- resume


def write_checkpoint(root: Path, step: int, *, complete: bool = True) -> Path:
    path = root / f"checkpoint-{step}"
    path.mkdir(parents=True)
    if complete:
        (path / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    return path


def test_resume_prints_the_newest_complete_checkpoint(tmp_path, capsys, clean_env):
    write_checkpoint(tmp_path, 10)
    write_checkpoint(tmp_path, 20, complete=False)
    assert main(["resume", "--output-dir", str(tmp_path), "--resume", "latest"]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "checkpoint-10")
    assert (tmp_path / "checkpoint-20").is_dir()  # the partial one is left alone


def test_resume_fresh_start_prints_nothing(tmp_path, capsys, clean_env):
    write_checkpoint(tmp_path, 10)
    assert main(["resume", "--output-dir", str(tmp_path)]) == 0
    assert capsys.readouterr().out == "\n"
    assert main(["resume", "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"resume_from_checkpoint": None}


def test_resume_from_the_environment_and_not_found(tmp_path, capsys, clean_env, monkeypatch):
    monkeypatch.setenv("VERIRL_RESUME_FROM_CHECKPOINT", "latest")
    monkeypatch.setenv("VERIRL_OUTPUT_DIR", str(tmp_path))
    assert main(["resume"]) == 5
    assert main(["resume", "--resume", str(tmp_path)]) == 0
    assert capsys.readouterr().out.strip().endswith(str(tmp_path))


def test_resume_latest_without_any_source_is_not_found(clean_env, capsys):
    assert main(["resume", "--resume", "latest"]) == 5
    assert "no sources configured" in capsys.readouterr().err


def test_resume_missing_explicit_path_is_not_found(tmp_path, clean_env):
    assert main(["resume", "--resume", str(tmp_path / "nope")]) == 5


def test_resume_blank_is_a_fresh_start(capsys, clean_env):
    assert main(["resume", "--resume", "   "]) == 0
    assert capsys.readouterr().out == "\n"


def test_resume_ignores_settings_it_does_not_use(tmp_path, capsys, clean_env, monkeypatch):
    """A job configured for `launch` (server mode, env URL) can still ask what to resume."""
    write_checkpoint(tmp_path, 7)
    monkeypatch.setenv("VERIRL_VLLM_MODE", "server")
    monkeypatch.setenv("VERIRL_ENV_SERVER_URL", "not-a-url")
    assert main(["resume", "--output-dir", str(tmp_path), "--resume", "latest"]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "checkpoint-7")


def test_resume_explicit_path_without_sources(tmp_path, capsys, clean_env):
    assert main(["resume", "--resume", str(tmp_path)]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path)


# -- doctor


def test_doctor_reports_without_leaking_the_token(capsys, clean_env, monkeypatch, tmp_path):
    from huggingface_hub import constants

    # No saved login of this machine's user: the token file huggingface_hub reads is empty here.
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "token"))
    monkeypatch.delenv("HUGGING_FACE_HUB_TOKEN", raising=False)
    monkeypatch.setenv("HF_TOKEN", "hf_supersecret")
    monkeypatch.setenv("VERIRL_GPU_COUNT", "2")  # server mode: a server to launch here
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    with FakeEnvServer() as server:
        url = server.url
        # This suite's interpreter has neither trl nor vllm: no vLLM launch is possible (4).
        assert main(["doctor", "--env-url", url, "--json"]) == 4
    out = capsys.readouterr().out
    data = json.loads(out)
    assert data["error"]["code"] == 4
    assert data["error"]["message"].startswith("vLLM launch: cannot start")
    assert data["Hub token"] == "set (HF_TOKEN)"
    assert data[f"env server {url}"] == "healthy"
    assert data["python"].startswith(".".join(map(str, sys.version_info[:2])))
    assert {"trl", "vllm", "torch", "GPUs visible"} <= set(data)
    # This suite's interpreter has neither trl nor vllm: doctor says what is missing.
    assert data["vllm"] == "missing"
    assert data["vLLM launch"].startswith("cannot start: cannot find the `trl` command")
    assert "`pip install trl vllm`" in data["vLLM launch"]
    assert "verirl[" not in data["vLLM launch"]  # no such package on PyPI
    assert data["vLLM launch"].endswith(
        "or pass --vllm-command 'PROGRAM ARGS' (or set VERIRL_VLLM_COMMAND)"
    )
    assert "hf_supersecret" not in out
    monkeypatch.delenv("HF_TOKEN")
    assert main(["doctor", "--env-url", url]) == 3  # the env server is gone: that decides
    text = capsys.readouterr().out
    assert "NOT reachable" in text
    assert "not set" in text


# -- launch


def training_script(tmp_path: Path, body: str) -> Path:
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(body))
    return script


def test_launch_exports_the_plan_and_exits_with_the_commands_code(tmp_path, clean_env):
    out = tmp_path / "seen.json"
    script = training_script(
        tmp_path,
        f"""
        import json, os, sys
        keys = ("CUDA_VISIBLE_DEVICES", "VERIRL_RESUME_FROM_CHECKPOINT", "VERIRL_GRPO_KWARGS",
                "MASTER_PORT", "RANK")
        json.dump({{k: os.environ.get(k) for k in keys}}, open({str(out)!r}, "w"))
        sys.exit(7)
    """,
    )
    write_checkpoint(tmp_path / "ckpt", 30)
    result = run_cli(
        "launch", "--gpus", "1", "--output-dir", str(tmp_path / "ckpt"), "--resume", "latest",
        "--", sys.executable, str(script),
    )  # fmt: skip
    assert result.returncode == 7, result.stderr
    seen = json.loads(out.read_text())
    assert seen["CUDA_VISIBLE_DEVICES"] == "0"
    assert seen["VERIRL_RESUME_FROM_CHECKPOINT"] == str(tmp_path / "ckpt" / "checkpoint-30")
    assert json.loads(seen["VERIRL_GRPO_KWARGS"])["vllm_mode"] == "colocate"
    assert seen["RANK"] == "0"
    assert seen["MASTER_PORT"].isdigit()
    assert "start-up timeline" in result.stderr


def test_launch_without_a_command_is_a_usage_error(clean_env):
    assert main(["launch", "--gpus", "1"]) == 2
    assert main(["launch", "--gpus", "1", "--"]) == 2


def test_launch_missing_program_exits_127(clean_env):
    assert main(["launch", "--gpus", "1", "--", "/nonexistent/trainer"]) == 127


def test_launch_json_of_a_missing_program_says_why_and_hides_its_secrets(clean_env, capsys):
    argv = ["launch", "--json", "--gpus", "1", "--", "/nonexistent/trainer", "--token=s3cr3tvalue"]
    assert main(argv) == 127
    out, err = capsys.readouterr()
    document = json.loads(out)
    assert document["exit_code"] == 127
    assert document["error"]["code"] == 127
    assert "cannot run /nonexistent/trainer" in document["error"]["message"]
    assert "No such file or directory" in document["error"]["message"]
    assert "s3cr3tvalue" not in out + err


def test_launch_env_server_down_fails_before_running_the_command(tmp_path, clean_env):
    marker = tmp_path / "ran"
    with FakeEnvServer(ready_after=None) as server:
        code = main([
            "launch", "--gpus", "1", "--env-url", server.url, "--env-timeout", "0.2",
            "--", sys.executable, "-c", f"open({str(marker)!r}, 'w')",
        ])  # fmt: skip
    assert code == 3
    assert not marker.exists()


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_launch_forwards_signals_to_the_command(tmp_path, sig, clean_env):
    ready = tmp_path / "ready"
    got = tmp_path / "got"
    script = training_script(
        tmp_path,
        f"""
        import signal, sys, threading
        def handler(signum, frame):
            open({str(got)!r}, "w").write(str(signum))
            sys.exit(42)
        signal.signal(signal.SIGTERM, handler)
        signal.signal(signal.SIGINT, handler)
        open({str(ready)!r}, "w").close()
        threading.Event().wait(60)
    """,
    )
    command = [sys.executable, "-m", "verirl", "launch", "--gpus", "1", "--"]
    proc = subprocess.Popen(
        [*command, sys.executable, str(script)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        deadline = psutil.time.monotonic() + 30
        while not ready.exists():
            assert proc.poll() is None, proc.communicate()
            assert psutil.time.monotonic() < deadline
            psutil.wait_procs([], timeout=0.02)
        trainer = psutil.Process(proc.pid).children()
        proc.send_signal(sig)
        try:
            _, stderr = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            state = {p.pid: p.status() if p.is_running() else "gone" for p in trainer}
            pytest.fail(f"launch still running 60 s after {sig!r}; got={got.exists()}, {state}")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 42, stderr
    assert got.read_text() == str(int(sig))
    assert f"passed {sig.name} on to the training command" in stderr


def test_launch_with_the_fake_vllm_server_end_to_end(tmp_path, clean_env):
    port = find_free_port()
    out = tmp_path / "seen.json"
    script = training_script(
        tmp_path,
        f"""
        import json, os, urllib.request
        url = os.environ["VERIRL_VLLM_URL"]
        with urllib.request.urlopen(url + "/health") as r:
            status = r.status
        json.dump({{"status": status, "url": url,
                    "cvd": os.environ["CUDA_VISIBLE_DEVICES"]}}, open({str(out)!r}, "w"))
    """,
    )
    result = run_cli(
        "launch", "--gpus", "3", "--model", "m", "--vllm-port", str(port),
        "--vllm-command", f"{sys.executable} -m fakes.vllm_serve", "--log-dir", str(tmp_path),
        "--", sys.executable, str(script),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    seen = json.loads(out.read_text())
    assert seen == {"status": 200, "url": f"http://127.0.0.1:{port}", "cvd": "0,1"}
    assert nothing_listens(port)  # the server is gone
    log = (tmp_path / f"vllm-serve-{port}.log").read_text()
    assert "Uvicorn running" in log
    assert "RuntimeWarning" not in log  # `import fakes` must not preload the program module


def test_serve_requires_a_server_topology(clean_env):
    assert main(["serve", "--gpus", "1", "--model", "m"]) == 2


@contextlib.contextmanager
def verirl_serve(log_dir: Path, *extra: str):
    """`verirl serve` on the fake program, in a subprocess, once it says it is ready."""
    port = find_free_port()
    command = [sys.executable, "-m", "verirl", "serve", "--gpus", "2", "--model", "m",
               "--vllm-port", str(port), "--vllm-command", f"{sys.executable} -m fakes.vllm_serve",
               "--log-dir", str(log_dir), *extra]  # fmt: skip
    with subprocess.Popen(
        command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    ) as proc:
        try:
            assert proc.stdout is not None
            assert "vLLM server ready" in proc.stdout.readline()
            yield proc, port
            proc.wait(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_serve_runs_until_a_signal_then_tears_down(tmp_path, sig, code, clean_env):
    with verirl_serve(tmp_path) as (proc, port):
        children = psutil.Process(proc.pid).children(recursive=True)
        assert children
        proc.send_signal(sig)
    assert proc.returncode == code
    _, alive = psutil.wait_procs(children, timeout=5)
    assert not alive
    assert nothing_listens(port)
    log = (tmp_path / f"vllm-serve-{port}.log").read_text()
    assert "Uvicorn running" in log
    assert "RuntimeWarning" not in log  # `import fakes` must not preload the program module


def test_serve_exits_4_when_its_server_dies(tmp_path, clean_env):
    with verirl_serve(tmp_path) as (proc, port):
        (server,) = psutil.Process(proc.pid).children()
        server.kill()
    assert proc.returncode == 4
    assert nothing_listens(port)


def test_training_command_dies_with_a_sigkilled_launch(tmp_path, clean_env):
    pid_file = tmp_path / "pid"
    script = training_script(
        tmp_path,
        f"""
        import os, threading
        open({str(pid_file)!r}, "w").write(str(os.getpid()))
        threading.Event().wait(60)
    """,
    )
    command = [sys.executable, "-m", "verirl", "launch", "--gpus", "1", "--"]
    with subprocess.Popen([*command, sys.executable, str(script)]) as proc:
        try:
            deadline = psutil.time.monotonic() + 30
            while not pid_file.exists() or not pid_file.read_text():
                assert proc.poll() is None
                assert psutil.time.monotonic() < deadline
                psutil.wait_procs([], timeout=0.02)
            trainer = psutil.Process(int(pid_file.read_text()))
            proc.kill()
        finally:
            proc.wait()
    _, alive = psutil.wait_procs([trainer], timeout=10)
    assert not alive


def test_module_entry_point():
    result = subprocess.run(
        [sys.executable, "-m", "verirl", "plan", "--gpus", "2", "--json"],
        capture_output=True, text=True, check=False, cwd=ROOT, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0
    assert json.loads(result.stdout)["mode"] == "server"


# -- a resume request is never dropped (launch and resume agree)


@pytest.mark.parametrize("request_", ["latest", "last-checkpoint", "missing"])
def test_launch_resume_without_sources_fails_like_resume(tmp_path, request_, clean_env):
    marker = tmp_path / "ran"
    wanted = str(tmp_path / "x" / "checkpoint-10") if request_ == "missing" else request_
    command = [sys.executable, "-c", f"open({str(marker)!r}, 'w')"]
    launched = run_cli("launch", "--gpus", "1", "--resume", wanted, "--", *command)
    resumed = run_cli("resume", "--resume", wanted)
    assert launched.returncode == resumed.returncode == 5, launched.stderr
    assert not marker.exists()
    assert "Traceback" not in launched.stderr
    expected = "no sources configured" if request_ != "missing" else "checkpoint-10"
    assert expected in launched.stderr
    assert expected in resumed.stderr


def test_launch_resume_from_the_variable_without_sources_fails(tmp_path, clean_env):
    marker = tmp_path / "ran"
    result = run_cli(
        "launch", "--gpus", "1", "--", sys.executable, "-c", f"open({str(marker)!r}, 'w')",
        env={"VERIRL_RESUME_FROM_CHECKPOINT": "latest"},
    )  # fmt: skip
    assert result.returncode == 5, result.stderr
    assert not marker.exists()


def test_launch_explicit_checkpoint_without_sources_is_passed_on(tmp_path, clean_env):
    checkpoint = write_checkpoint(tmp_path / "elsewhere", 10)
    out = tmp_path / "seen"
    script = training_script(
        tmp_path,
        f"""
        import os
        open({str(out)!r}, "w").write(os.environ["VERIRL_RESUME_FROM_CHECKPOINT"])
    """,
    )
    result = run_cli(
        "launch", "--gpus", "1", "--resume", str(checkpoint), "--", sys.executable, str(script)
    )
    assert result.returncode == 0, result.stderr
    assert out.read_text() == str(checkpoint)


# -- launch: one SIGTERM policy, bounded grace, nothing left running


def wait_for(condition, proc: subprocess.Popen[str], what: str, timeout: float = 60) -> None:
    deadline = psutil.time.monotonic() + timeout
    while not condition():
        assert proc.poll() is None, (what, proc.communicate())
        assert psutil.time.monotonic() < deadline, f"timed out waiting for {what}"
        psutil.wait_procs([], timeout=0.02)


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_launch_signal_before_the_command_starts_never_runs_it(tmp_path, sig, code, clean_env):
    marker = tmp_path / "ran"
    with FakeEnvServer(ready_after=None) as env_server:
        proc = subprocess.Popen(
            [sys.executable, "-m", "verirl", "launch", "--gpus", "1", "--env-url", env_server.url,
             "--env-timeout", "120", "--", sys.executable, "-c", f"open({str(marker)!r}, 'w')"],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            wait_for(lambda: env_server.requests >= 1, proc, "the env server wait")
            proc.send_signal(sig)
            _, stderr = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    assert proc.returncode == code, stderr
    assert not marker.exists()
    assert "Traceback" not in stderr


@pytest.mark.parametrize(
    ("grace_args", "grace_env"),
    [(["--shutdown-timeout", "1"], {}), ([], {"VERIRL_SHUTDOWN_TIMEOUT": "1"})],
    ids=["flag", "variable"],
)
def test_launch_kills_a_command_that_ignores_sigterm_after_the_grace(
    tmp_path, clean_env, grace_args, grace_env
):
    pid_file = tmp_path / "pid"
    script = training_script(
        tmp_path,
        f"""
        import os, signal, threading
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        open({str(pid_file)!r}, "w").write(str(os.getpid()))
        threading.Event().wait(120)
    """,
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "verirl", "launch", "--gpus", "1", *grace_args,
         "--", sys.executable, str(script)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env={**os.environ, **grace_env},
    )  # fmt: skip
    try:
        wait_for(lambda: pid_file.exists() and pid_file.read_text(), proc, "the command")
        trainer = psutil.Process(int(pid_file.read_text()))
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 128 + signal.SIGKILL, stderr
    _, alive = psutil.wait_procs([trainer], timeout=10)
    assert not alive
    assert "SIGKILL in 1s" in stderr
    assert "SIGKILL" in stderr


@pytest.mark.parametrize(
    ("first", "second"),
    [
        (signal.SIGINT, signal.SIGTERM),
        (signal.SIGINT, signal.SIGINT),
        (signal.SIGTERM, signal.SIGINT),
    ],
)
def test_a_second_signal_during_the_grace_kills_the_command_at_once(
    tmp_path, first, second, clean_env
):
    pid_file, got = tmp_path / "pid", tmp_path / "got"
    script = training_script(
        tmp_path,
        f"""
        import os, signal, threading
        def note(signum, _frame):
            open({str(got)!r}, "a").write(f"{{signum}}\\n")
        signal.signal(signal.SIGTERM, note)
        signal.signal(signal.SIGINT, note)
        open({str(pid_file)!r}, "w").write(str(os.getpid()))
        threading.Event().wait(300)
    """,
    )
    log = tmp_path / "stderr"
    # `python -m verirl`, with every thread's stack dumped on SIGUSR1: a launch that does not
    # end says where it waits (this case failed once under load, on 3.10, unexplained).
    program = ("import faulthandler, signal, sys; faulthandler.register(signal.SIGUSR1, "
               "all_threads=True); from verirl.__main__ import run; sys.exit(run())")  # fmt: skip
    with log.open("w") as sink:  # a file, not a pipe: an orphan holding it cannot hang us
        proc = subprocess.Popen(
            [sys.executable, "-c", program, "launch", "--gpus", "1", "--shutdown-timeout", "300",
             "--", sys.executable, str(script)],
            stdout=subprocess.DEVNULL, stderr=sink,
        )  # fmt: skip
    try:
        wait_for(lambda: pid_file.exists() and pid_file.read_text(), proc, "the command")
        trainer = psutil.Process(int(pid_file.read_text()))
        proc.send_signal(first)
        wait_for(lambda: got.exists() and got.read_text(), proc, "the forwarded signal")
        proc.send_signal(second)
        try:
            proc.wait(timeout=120)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGUSR1)
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
            pytest.fail(f"launch still runs 120 s after the second signal:\n{log.read_text()}")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    stderr = log.read_text()
    _, alive = psutil.wait_procs([trainer], timeout=10)
    assert not alive, stderr
    assert proc.returncode == 128 + signal.SIGKILL, stderr
    assert "interrupted again" in stderr


@pytest.mark.parametrize("command", ["serve", "launch"])
def test_a_handler_inherited_from_start_up_does_not_change_the_cli(tmp_path, command, clean_env):
    """`verirl` is the program: SIGTERM still tears down and exits 143 (coverage installs one)."""
    ready = tmp_path / "ready"
    wrapper = tmp_path / "wrapper.py"
    wrapper.write_text(
        textwrap.dedent("""
        import signal, sys
        signal.signal(signal.SIGTERM, lambda *_: None)
        from verirl.cli import main
        from verirl.cli.commands import _public_address
        sys.exit(main(sys.argv[1:]))
    """)
    )
    port = find_free_port()
    if command == "serve":
        args = ["serve", "--gpus", "2", "--model", "m", "--vllm-port", str(port),
                "--vllm-command", f"{sys.executable} -m fakes.vllm_serve",
                "--log-dir", str(tmp_path)]  # fmt: skip
    else:
        body = f"import threading; open({str(ready)!r}, 'w'); threading.Event().wait(120)"
        args = ["launch", "--gpus", "1", "--", sys.executable, "-c", body]
    proc = subprocess.Popen(
        [sys.executable, str(wrapper), *args],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        if command == "serve":
            assert proc.stdout is not None
            assert "vLLM server ready" in proc.stdout.readline()
        else:
            wait_for(ready.exists, proc, "the command")
        children = psutil.Process(proc.pid).children(recursive=True)
        proc.send_signal(signal.SIGTERM)
        _, stderr = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 143, stderr
    _, alive = psutil.wait_procs(children, timeout=10)
    assert not alive
    assert nothing_listens(port)


def test_serve_on_a_dedicated_node_open_to_other_machines(tmp_path, clean_env):
    """The vLLM node of a multi-node job: every GPU serves, the bind is public, with a warning."""
    with verirl_serve(tmp_path, "--dedicated", "--host", "0.0.0.0") as (proc, port):
        assert proc.stdout is not None
        hint = proc.stdout.readline()
        assert hint == (
            f"trainers on other nodes: --vllm-host {socket.gethostname()} --vllm-port {port} "
            f"(http://{socket.gethostname()}:{port})\n"
        )
        url = f"http://127.0.0.1:{port}/get_world_size?include_dp=false"
        with urllib.request.urlopen(url, timeout=5) as reply:  # both GPUs serve: tp 2
            assert json.load(reply) == {"world_size": 2}
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 143
    assert f"the vLLM server binds 0.0.0.0 port {port}: its API has no authentication" in err
    assert "dedicated vLLM node (nothing trains here) · vLLM on GPUs 0,1 (tp 2 × dp 1" in err
    assert nothing_listens(port)


def test_serve_dedicated_starts_under_the_job_wide_vllm_host_variable(
    tmp_path, clean_env, monkeypatch
):
    """The README exports VERIRL_VLLM_HOST for the whole job: on the vLLM node it names that very
    node, so serve --dedicated does not read it (a variable is never refused for a layout)."""
    monkeypatch.setenv("VERIRL_VLLM_HOST", "vllm-node")
    with verirl_serve(tmp_path, "--dedicated") as (proc, port):
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=30)
    assert proc.returncode == 143, err
    assert "VERIRL_VLLM_HOST is for the training nodes: serve --dedicated does not read it" in err
    assert "dedicated vLLM node (nothing trains here)" in err
    assert nothing_listens(port)


@pytest.mark.parametrize(
    ("argv", "named"),
    [(["--dedicated", "--vllm-host", "vllm-node"], "--vllm-host='vllm-node'"),
     ([], "VERIRL_VLLM_HOST='vllm-node'")],
)  # fmt: skip
def test_serve_refuses_a_remote_host_it_was_asked_to_use(
    argv, named, clean_env, monkeypatch, capsys
):
    """An explicit --vllm-host, or the variable on a node that also trains: serve would start
    nothing, so it is refused, naming where the host came from."""
    monkeypatch.setenv("VERIRL_VLLM_HOST", "vllm-node")
    code = main(["serve", "--model", "m", "--gpus", "2", *argv])
    assert code == 2
    err = capsys.readouterr().err
    assert named in err


@pytest.mark.parametrize("host", ["127.0.0.1", "localhost", "::1", "[::1]"])
def test_only_a_loopback_bind_needs_no_address_for_other_machines(host):
    assert _public_address(host) is None
    assert _public_address("10.1.2.3") == "10.1.2.3"
    assert _public_address("vllm-node") == "vllm-node"
    assert _public_address("::") == socket.gethostname()


@pytest.mark.parametrize("visible", [None, "4,5,6,7"])
def test_launch_with_a_remote_vllm_leaves_the_gpus_to_the_launcher(
    tmp_path, clean_env, monkeypatch, visible
):
    """On a training node of a multi-node job the launcher (torchrun) hands out the GPUs."""
    if visible is not None:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    port = find_free_port()
    out = tmp_path / "seen.json"
    script = training_script(
        tmp_path,
        f"""
        import json, os
        json.dump({{"cvd": os.environ.get("CUDA_VISIBLE_DEVICES"),
                    "url": os.environ["VERIRL_VLLM_URL"]}}, open({str(out)!r}, "w"))
    """,
    )
    with FakeVLLMServer("m", port=port, serve_http=True) as remote:
        result = run_cli(
            "launch", "--gpus", "4", "--vllm-host", "127.0.0.1", "--vllm-port", str(port),
            "--", sys.executable, str(script),
        )  # fmt: skip
        assert remote.base_url == f"http://127.0.0.1:{port}"
    assert result.returncode == 0, result.stderr
    assert json.loads(out.read_text()) == {"cvd": visible, "url": f"http://127.0.0.1:{port}"}
    assert "as launched" in result.stderr


def test_the_launch_grace_is_25_seconds_unless_a_flag_or_variable_says_otherwise(monkeypatch):
    """Under the 30 s Kubernetes and Modal give a preempted container."""
    from verirl.cli import build_parser
    from verirl.cli.commands import _launch_grace

    monkeypatch.delenv("VERIRL_SHUTDOWN_TIMEOUT", raising=False)
    parse = build_parser().parse_args
    assert _launch_grace(parse(["launch", "--", "true"])) == 25.0
    monkeypatch.setenv("VERIRL_SHUTDOWN_TIMEOUT", "12.5")
    assert _launch_grace(parse(["launch", "--", "true"])) == 12.5
    assert _launch_grace(parse(["launch", "--shutdown-timeout", "3", "--", "true"])) == 3.0
    monkeypatch.setenv("VERIRL_SHUTDOWN_TIMEOUT", " ")
    assert _launch_grace(parse(["launch", "--", "true"])) == 25.0


@pytest.mark.parametrize(
    ("command", "flag", "value"),
    [("plan", "--model", "m"), ("plan", "--vllm-gpus", "1"), ("launch", "--model", "m"),
     ("launch", "--vllm-command", "vllm serve"), ("launch", "--vllm-gpus", "1"),
     ("launch", "--log-dir", "/tmp")],
)  # fmt: skip
@pytest.mark.usefixtures("clean_env")
def test_mode_server_with_a_remote_host_variable_still_refuses_the_local_server_s_flags(
    command, flag, value, monkeypatch, capsys
):
    """VERIRL_VLLM_HOST puts vLLM on another machine even with --mode server: the flags of a
    local server are refused as they are without --mode, never silently ignored."""
    monkeypatch.setenv("VERIRL_VLLM_HOST", "vllm-node")
    tail = ["--", "true"] if command == "launch" else []
    assert main([command, "--gpus", "2", "--mode", "server", flag, value, *tail]) == 2
    err = capsys.readouterr().err
    assert f"{flag}=" in err
    assert "not used: with VERIRL_VLLM_HOST set, vLLM runs on another machine" in err

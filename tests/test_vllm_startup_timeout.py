"""``--vllm-startup-timeout`` / ``VERIRL_VLLM_STARTUP_TIMEOUT``: a server still loading fails fast.

A first start of a 70B model downloads and loads for longer than the old fixed
600 s, so the bound is a setting (900 s by default). These tests run
``python -m verirl`` on the fake server program kept "loading"
(``FAKE_VLLM_LOAD_UNTIL`` naming a file that never appears) under a bound of a
second or two: exit 4 soon after, the server's log tail on stderr, the
training command never run, nothing left running.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from _support import SESSION_VAR, leftovers, nothing_listens, session_processes, unshared_port

BOUND = 5.0  # the fake server must print its loading line within it, on a loaded machine too
SLACK = 10.0
"""Seconds on top of the bound for Python's start-up and the teardown on a loaded machine."""


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in list(os.environ):
        if name.startswith("VERIRL_") or name in ("CUDA_VISIBLE_DEVICES", "HF_TOKEN"):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)


def verirl(*argv: str, env: dict[str, str] | None = None) -> tuple[int, str, float]:
    """Run ``python -m verirl ARGV``; its exit code, stderr and how long it took."""
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "verirl", *argv],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **(env or {})},
        timeout=120,
        check=False,
    )
    return result.returncode, result.stderr, time.monotonic() - started


def loading_server(tmp_path: Path, port: int) -> tuple[list[str], dict[str, str]]:
    """Flags and variables for the fake server, "loading the model" until the test ends."""
    flags = ["--gpus", "2", "--model", "m", "--vllm-port", str(port),
             "--vllm-command", f"{sys.executable} -m fakes.vllm_serve",
             "--log-dir", str(tmp_path)]  # fmt: skip
    return flags, {"FAKE_VLLM_LOAD_UNTIL": str(tmp_path / "never")}


@pytest.mark.parametrize("how", ["flag", "variable"])
@pytest.mark.parametrize("command", ["launch", "serve"])
def test_a_server_still_loading_after_the_bound_exits_4_with_its_log_and_nothing_left(
    tmp_path: Path, clean_env: None, command: str, how: str
) -> None:
    tag = os.environ[SESSION_VAR]
    before = session_processes(tag)
    port = unshared_port()
    flags, env = loading_server(tmp_path, port)
    if how == "flag":
        flags += ["--vllm-startup-timeout", f"{BOUND:g}"]
    else:
        env["VERIRL_VLLM_STARTUP_TIMEOUT"] = f"{BOUND:g}"
    marker = tmp_path / "ran"
    tail = (
        ["--", sys.executable, "-c", f"open({str(marker)!r}, 'w')"] if command == "launch" else []
    )
    code, stderr, took = verirl(command, *flags, *tail, env=env)
    assert code == 4, stderr
    assert BOUND <= took < BOUND + SLACK, (took, stderr)
    assert f"vLLM server not healthy after {BOUND:.1f}s and was stopped" in stderr
    assert "Loading model m (fake: 0s)" in stderr  # the last lines of the server's log
    assert "Traceback" not in stderr
    assert not marker.exists()  # the training command never ran
    assert not leftovers(tag, before, grace=5.0)
    assert nothing_listens(port)


def test_a_remote_server_nobody_answers_for_is_waited_for_only_the_bound(
    tmp_path: Path, clean_env: None
) -> None:
    port = unshared_port()
    assert nothing_listens(port)
    marker = tmp_path / "ran"
    code, stderr, took = verirl(
        "launch", "--gpus", "2", "--vllm-host", "127.0.0.1", "--vllm-port", str(port),
        "--vllm-startup-timeout", "1",
        "--", sys.executable, "-c", f"open({str(marker)!r}, 'w')",
    )  # fmt: skip
    assert code == 4, stderr
    assert 1.0 <= took < 1.0 + SLACK, (took, stderr)
    assert f"http://127.0.0.1:{port}" in stderr
    assert "Traceback" not in stderr
    assert not marker.exists()

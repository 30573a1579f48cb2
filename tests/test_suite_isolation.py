"""The suite's leftover-process check blames only processes this test session started.

Another checkout's job on the same machine (a verirl server carrying the
marker variable, started by someone else) must not fail our run; a process we
started and orphaned must.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import psutil

from _support import (
    SESSION_VAR,
    alive,
    descendants,
    describe,
    kill_all,
    leftovers,
    session_processes,
    still_alive,
    tagged_processes,
)
from verirl import _procfs
from verirl.server.process import MARKER_VAR

pytest_plugins = ["pytester"]

TESTS = Path(__file__).resolve().parent

# Started with our stdin pipe, the grandchild lives until the pipe closes: an
# event, not a sleep, ends it, and it ends even if this process is killed.
_DETACH = (
    "import subprocess, sys\n"
    "child = subprocess.Popen([sys.executable, '-c', 'import sys; sys.stdin.read()'])\n"
    "print(child.pid, flush=True)\n"
)


@contextmanager
def orphan(env: dict[str, str]) -> Iterator[psutil.Process]:
    """A process re-parented away from us (as a server's orphaned worker is), stopped after."""
    helper = subprocess.Popen(
        [sys.executable, "-c", _DETACH],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        env=env,
    )
    assert helper.stdin is not None
    assert helper.stdout is not None
    proc = None
    try:
        proc = psutil.Process(int(helper.stdout.readline()))
        assert helper.wait(timeout=60) == 0
        yield proc
    finally:
        helper.stdin.close()
        helper.stdout.close()
        helper.wait(timeout=60)
        if proc is not None:
            assert still_alive([proc], timeout=60) == []


def our_env(**extra: str) -> dict[str, str]:
    return {**os.environ, **extra}


def foreign_env(**extra: str) -> dict[str, str]:
    env = {name: value for name, value in os.environ.items() if name != SESSION_VAR}
    return {**env, **extra}


def test_this_session_has_a_tag():
    assert len(os.environ[SESSION_VAR]) == 32


def test_a_foreign_marked_process_without_a_tag_is_not_blamed():
    tag = os.environ[SESSION_VAR]
    before = session_processes(tag)
    with orphan(foreign_env(**{MARKER_VAR: "another-checkout"})) as proc:
        assert proc not in descendants()  # as another job's process would be
        assert (_procfs.environ(proc.pid) or {})[MARKER_VAR] == "another-checkout"
        assert proc not in tagged_processes(tag)
        assert leftovers(tag, before, grace=0) == []


def test_a_foreign_marked_process_with_another_sessions_tag_is_not_blamed():
    tag = os.environ[SESSION_VAR]
    before = session_processes(tag)
    env = foreign_env(**{MARKER_VAR: "x", SESSION_VAR: "another-session"})
    with orphan(env) as proc:
        assert (_procfs.environ(proc.pid) or {})[SESSION_VAR] == "another-session"
        assert proc not in tagged_processes(tag)
        assert leftovers(tag, before, grace=0) == []


def test_an_orphan_carrying_our_tag_is_found_wherever_it_was_reparented():
    tag = os.environ[SESSION_VAR]
    before = session_processes(tag)
    with orphan(our_env(**{MARKER_VAR: "ours"})) as proc:
        assert proc not in descendants()
        assert proc in tagged_processes(tag)
        assert leftovers(tag, before, grace=0) == [proc]
        text = describe(proc)
        assert str(proc.pid) in text
        assert "sys.stdin.read()" in text
        assert f"{MARKER_VAR}=ours" in text
    assert not alive(proc)


def test_a_child_started_with_a_scrubbed_environment_is_found_as_a_descendant():
    tag = os.environ[SESSION_VAR]
    before = session_processes(tag)
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"],
        stdin=subprocess.PIPE,
        env=foreign_env(),
    )
    assert child.stdin is not None
    try:
        proc = psutil.Process(child.pid)
        assert proc not in tagged_processes(tag)
        assert leftovers(tag, before, grace=0) == [proc]
    finally:
        child.stdin.close()
        child.wait(timeout=60)


def test_a_process_that_goes_within_the_grace_period_is_not_a_leftover():
    tag = os.environ[SESSION_VAR]
    before = session_processes(tag)
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE
    )
    assert child.stdin is not None
    child.stdin.close()  # it is on its way out; the check waits for it instead of blaming it
    try:
        assert leftovers(tag, before, grace=60) == []
    finally:
        child.wait(timeout=60)


def _processes_running(token: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter():
        try:
            if token.encode() in _procfs.read(proc.pid, "cmdline") and alive(proc):
                found.append(proc)
        except (OSError, psutil.Error):
            continue
    return found


def test_a_run_blames_the_test_that_leaked_and_spares_another_jobs_server(pytester):
    """The suite's own conftest in a fresh pytest run, with a foreign marked process around."""
    support = (TESTS / "_support.py").read_text()
    fast = support.replace("LEFTOVER_GRACE = 15.0", "LEFTOVER_GRACE = 0.5")
    assert fast != support
    pytester.makepyfile(_support=fast)
    pytester.makeconftest((TESTS / "conftest.py").read_text())
    token = f"leaked-{uuid.uuid4().hex}"
    leaked = f"import time; time.sleep(600)  # {token}"
    detach = f"import subprocess, sys; subprocess.Popen([sys.executable, '-c', {leaked!r}])"
    pytester.makepyfile(
        test_user=f"""
        import subprocess, sys

        def test_clean():
            subprocess.run([sys.executable, "-c", "pass"], check=True)

        def test_leaks():
            # The child exits at once, orphaning its own: only the tag can find that one.
            subprocess.run([sys.executable, "-c", {detach!r}], check=True)
        """
    )
    try:
        with orphan(foreign_env(**{MARKER_VAR: "another-job"})) as foreign:
            result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
            assert alive(foreign)  # the run neither blamed nor killed it
        survivors = _processes_running(token)
    finally:
        kill_all(_processes_running(token))
    assert survivors == []  # the check killed what it reported
    result.assert_outcomes(passed=2, errors=1)
    text = result.stdout.str()
    assert "processes left behind by test_user.py::test_leaks (now killed)" in text
    assert token in text
    assert "another-job" not in text


def test_the_suite_sees_none_of_the_developers_hub_token_or_home(pytester, tmp_path, monkeypatch):
    """A token in the developer's shell, file or saved login never reaches a test; nor HF_HOME.

    huggingface_hub reads them when it is imported: the suite's conftest gives
    the run an HF_HOME of its own first (its xdist workers share it), and
    removes it at the end.
    """
    pytester.makepyfile(_support=(TESTS / "_support.py").read_text())
    pytester.makeconftest((TESTS / "conftest.py").read_text())
    developer = tmp_path / "developer-hf-home"
    developer.mkdir()
    (developer / "token").write_text("hf_saved_login_of_the_developer", encoding="utf-8")
    token_file = tmp_path / "elsewhere-token"
    token_file.write_text("hf_token_path_of_the_developer", encoding="utf-8")
    monkeypatch.setenv("HF_HOME", str(developer))
    monkeypatch.setenv("HF_TOKEN_PATH", str(token_file))
    monkeypatch.setenv("HF_TOKEN", "hf_shell_token_of_the_developer")
    monkeypatch.setenv("HUGGING_FACE_HUB_TOKEN", "hf_old_shell_token_of_the_developer")
    # An OIDC exchange the developer set up (get_token raised), and the staging Hub's token
    # under HOME (review round 38, R-F5).
    monkeypatch.setenv("HF_OIDC_RESOURCE", "developer/repo")
    monkeypatch.setenv("HF_OIDC_ID_TOKEN", "hf_oidc_id_token_of_the_developer")
    monkeypatch.setenv("HUGGINGFACE_CO_STAGING", "1")
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.setenv("TRANSFORMERS_OFFLINE", "1")  # the fake Hub refused (round 39, S-F4)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)  # nox's, kept: not the developer's
    staging = tmp_path / ".cache" / "huggingface_staging"
    staging.mkdir(parents=True)
    (staging / "token").write_text("hf_staging_token_of_the_developer", encoding="utf-8")
    monkeypatch.delenv("VERIRL_TESTS_HF_HOME", raising=False)  # this run's own, not ours
    homes = tmp_path / "homes"
    homes.mkdir()
    pytester.makepyfile(
        test_user=f"""
        import os, pathlib, uuid
        import huggingface_hub
        from huggingface_hub import constants

        def _check():
            assert huggingface_hub.get_token() is None
            assert constants.HF_HUB_OFFLINE is False
            assert constants.HF_HOME == os.environ["HF_HOME"] != {str(developer)!r}
            assert not constants.HF_TOKEN_PATH.startswith({str(tmp_path)!r})
            (pathlib.Path({str(homes)!r}) / uuid.uuid4().hex).write_text(constants.HF_HOME)

        def test_one():
            _check()

        def test_two():
            _check()
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider", "-n", "2")
    result.assert_outcomes(passed=2)
    seen = {path.read_text() for path in homes.iterdir()}
    assert len(seen) == 1  # both workers: the controller's
    assert not Path(seen.pop()).exists()  # removed at the end of the run

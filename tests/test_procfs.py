"""verirl._procfs: /proc read right for a Zl process (main thread ended, others running).

Real Zl processes throughout (`_support.ZlProcess`): psutil reads such a
process as a zombie with no environment; verirl must read it as alive, with
its environment, command line and children.
"""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from _support import SESSION_VAR, ZlProcess, alive, describe, tagged_processes
from verirl import _procfs

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="/proc is Linux's")


@pytest.fixture
def zl(tmp_path: Path) -> Iterator[ZlProcess]:
    process = ZlProcess(tmp_path, env={**os.environ, "ZL_PROBE": "here"}, forks=1)
    yield process
    process.close()


def test_a_zl_process_is_one_psutil_misreads(zl: ZlProcess) -> None:
    """The premise: psutil sees a zombie with nothing to read; /proc's main thread alike."""
    process = psutil.Process(zl.pid)
    assert process.status() == psutil.STATUS_ZOMBIE
    with pytest.raises(psutil.ZombieProcess):
        process.environ()
    assert not Path(f"/proc/{zl.pid}/cmdline").read_bytes()
    assert not Path(f"/proc/{zl.pid}/task/{zl.pid}/children").read_bytes()


def test_a_zl_process_is_running_with_its_state_and_start(zl: ZlProcess) -> None:
    assert _procfs.proc_state(zl.pid) == "Z"
    assert _procfs.threads_run(zl.pid)
    assert _procfs.running(zl.pid)
    fields = _procfs.stat_fields(zl.pid)
    assert fields is not None
    assert int(fields[1]) == os.getpid()  # its parent
    assert _procfs.start_time(zl.pid) == int(fields[_procfs.STARTTIME])


def test_a_zl_processs_environment_and_command_line_are_read_through_a_live_thread(
    zl: ZlProcess,
) -> None:
    environ = _procfs.environ(zl.pid)
    assert environ is not None
    assert environ["ZL_PROBE"] == "here"
    assert environ[SESSION_VAR] == os.environ[SESSION_VAR]
    argv = _procfs.read(zl.pid, "cmdline").split(b"\0")
    assert argv[1].endswith(b"zl.py")


def test_a_zl_processs_children_are_those_of_every_thread(zl: ZlProcess) -> None:
    # one forked by the ended main thread (now a live thread's), one by the live thread
    assert sorted(_procfs.children(zl.pid)) == sorted(zl.children)


def test_the_leak_check_sees_a_zl_leftover(zl: ZlProcess) -> None:
    process = psutil.Process(zl.pid)
    assert alive(process)
    assert process in tagged_processes(os.environ[SESSION_VAR])
    assert "zl.py" in describe(process)


def test_a_killed_zl_process_has_ended(tmp_path: Path) -> None:
    zl = ZlProcess(tmp_path)
    try:
        os.kill(zl.pid, 9)
        deadline = time.monotonic() + 30
        while _procfs.threads_run(zl.pid) and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not _procfs.running(zl.pid)  # a zombie until reaped: ended
        assert not _procfs.threads_run(zl.pid)
    finally:
        zl.close()
    assert not _procfs.running(zl.pid)
    assert _procfs.environ(zl.pid) is None
    assert _procfs.children(zl.pid) == []
    assert _procfs.stat_fields(zl.pid) is None
    assert _procfs.proc_state(zl.pid) == ""
    with pytest.raises(OSError):
        _procfs.read(zl.pid, "environ")


def test_a_real_zombie_has_ended_and_reads_empty() -> None:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    try:
        deadline = time.monotonic() + 30
        while _procfs.proc_state(child.pid) != "Z" and time.monotonic() < deadline:
            time.sleep(0.01)
        assert not _procfs.running(child.pid)
        assert not _procfs.environ(child.pid)  # empty or unreadable, never a live one's
    finally:
        child.wait()


@contextlib.contextmanager
def _waiting_child(*args: str, env: dict[str, str]) -> Iterator[subprocess.Popen[bytes]]:
    """A Python process that waits on its stdin, with ``args`` and ``env``; ended on exit."""
    child = subprocess.Popen(
        [sys.executable, "-c", "import sys; sys.stdin.read()", *args],
        stdin=subprocess.PIPE,
        env=env,
    )
    try:
        yield child
    finally:
        assert child.stdin is not None
        child.stdin.close()
        child.wait()


def test_a_plain_process_reads_as_it_is() -> None:
    marker = uuid.uuid4().hex
    with _waiting_child(env={**os.environ, "ZL_PROBE": marker}) as child:
        assert _procfs.running(child.pid)
        assert not _procfs.threads_run(child.pid)
        assert _procfs.proc_state(child.pid) in {"R", "S", "D"}
        assert (_procfs.environ(child.pid) or {})["ZL_PROBE"] == marker
        assert _procfs.children(os.getpid()).count(child.pid) == 1
        assert _procfs.environ(os.getpid()) is not None


def test_a_process_read_the_moment_it_started_reads_its_new_program() -> None:
    # Popen returns while execve is still laying out the new program: environ
    # and cmdline read empty then (most starts on 3.10 and 3.13 here).
    for _ in range(40):
        marker = uuid.uuid4().hex
        with _waiting_child(marker, env={**os.environ, "ZL_PROBE": marker}) as child:
            assert (_procfs.environ(child.pid) or {}).get("ZL_PROBE") == marker
            assert _procfs.read(child.pid, "cmdline").split(b"\0")[-2] == marker.encode()


def test_a_process_started_without_variables_reads_empty_once_started() -> None:
    for _ in range(10):
        with _waiting_child(env={}) as child:
            assert _procfs.environ(child.pid) == {}
            assert _procfs.read(child.pid, "cmdline")

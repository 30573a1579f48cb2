"""Class 6: a process launch's signal could miss gets it all the same, and exactly once.

Launch passed SIGTERM/SIGINT on process by process, after a look at the
process table, the command last. A process forked after the look but before
its parent got the signal (a pool starting its workers as the preemption
comes) missed it, ran on while its parent waited for it, and the grace ended
in a SIGKILL (exit 137, no checkpoint); a look again during the grace still
missed one forked between launch listing the parent's children and signalling
the parent. Launch now signals the command's group with one ``killpg``, which
no fork races. A process forked after its parent got the signal (a helper
the parent's handler starts to save) is the parent's to stop, and a program
that took the signal and exec'd its save got it once: launch leaves both
alone.

Real processes throughout; recorder programs append each signal they get,
with their pid, to a file.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from _support import clear_verirl_env, end_launch, naming
from verirl import _supervise

DEADLINE = 30.0
"""Seconds any one awaited event may take (a loaded CI machine starts Pythons slowly)."""

GRACE = 25.0
"""launch's grace: a process that missed the signal holds the command past it (exit 137)."""

# The command: on the signal, after a moment, starts a helper to save, and waits for it.
SAVES_WITH_A_HELPER = """
import os, signal, subprocess, sys, time
record, ready, helper, delay = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
got = []
signal.signal(signal.SIGTERM, lambda signum, _frame: got.append(signum))
with open(ready, "w") as sink:
    sink.write("ready")
end = time.monotonic() + 60
while not got and time.monotonic() < end:
    time.sleep(0.001)
time.sleep(delay)
sys.exit(subprocess.run([sys.executable, helper, record], check=False).returncode)
"""

# The command: runs a program that, on the signal, execs its save (a shell's `trap "exec …"`),
# started as a program of its own or forked (a subshell, a fork-start worker).
PARENT_OF_AN_EXECER = """
import os, runpy, signal, subprocess, sys
record, ready, execer, helper, how = sys.argv[1:6]
signal.signal(signal.SIGTERM, lambda _signum, _frame: None)
if how == "exec":
    sys.exit(subprocess.run([sys.executable, execer, record, ready, helper]).returncode)
child = os.fork()
if child == 0:
    sys.argv = [execer, record, ready, helper]
    runpy.run_path(execer, run_name="__main__")
    os._exit(3)
sys.exit(os.waitstatus_to_exitcode(os.waitpid(child, 0)[1]))
"""

EXECER = """
import os, signal, sys, time
record, ready, helper = sys.argv[1:4]
signal.signal(signal.SIGTERM, lambda *_: os.execv(sys.executable, [sys.executable, helper, record]))
with open(ready, "w") as sink:
    sink.write("ready")
time.sleep(60)
"""

HELPER = """
import os, signal, sys, time
record = sys.argv[1]

def note(signum, _frame):
    with open(record, "a") as sink:
        sink.write(f"{os.getpid()} {signal.Signals(signum).name} helper\\n")

signal.signal(signal.SIGTERM, note)
time.sleep(1.5)  # the save
with open(record, "a") as sink:
    sink.write(f"{os.getpid()} saved helper\\n")
"""


class Scene:
    """``verirl launch --gpus 1`` (no server) running one of the programs above."""

    def __init__(self, tmp_path: Path, program: str, *extra: str) -> None:
        self.tmp_path = tmp_path
        self.record = tmp_path / "record"
        self.ready = tmp_path / "ready"
        self.stderr_path = tmp_path / "launch.err"
        script = tmp_path / "command.py"
        script.write_text(textwrap.dedent(program))
        argv = [sys.executable, "-m", "verirl", "launch", "--gpus", "1",
                "--shutdown-timeout", f"{GRACE:g}", "--",
                sys.executable, str(script), str(self.record), str(self.ready), *extra]  # fmt: skip
        with self.stderr_path.open("w") as sink:
            self.proc = subprocess.Popen(
                argv, stdout=subprocess.DEVNULL, stderr=sink, start_new_session=True
            )

    @property
    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def lines(self) -> list[list[str]]:
        text = self.record.read_text() if self.record.exists() else ""
        return [line.split() for line in text.splitlines()]

    def signal_when_ready(self, sig: signal.Signals) -> int:
        deadline = time.monotonic() + DEADLINE
        while not self.ready.exists():
            assert self.proc.poll() is None, self.stderr
            assert time.monotonic() < deadline, f"the command never got ready: {self.stderr}"
            psutil.wait_procs([], timeout=0.02)
        self.proc.send_signal(sig)
        return self.proc.wait(timeout=GRACE + DEADLINE)

    def close(self) -> None:
        end_launch(self.proc, naming(str(self.tmp_path)))


@pytest.fixture
def scenes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., Scene]]:
    clear_verirl_env(monkeypatch, tmp_path)
    started: list[Scene] = []

    def start(program: str, *extra: str) -> Scene:
        scene = Scene(tmp_path, program, *extra)
        started.append(scene)
        return scene

    yield start
    for scene in started:
        scene.close()


@pytest.mark.parametrize("delay", [0, 0.3], ids=["at-once", "later"])
def test_a_helper_started_after_the_signal_is_left_to_its_parent(
    scenes: Callable[..., Scene], tmp_path: Path, delay: float
) -> None:
    helper = tmp_path / "helper.py"
    helper.write_text(textwrap.dedent(HELPER))
    scene = scenes(SAVES_WITH_A_HELPER, str(helper), str(delay))
    code = scene.signal_when_ready(signal.SIGTERM)
    assert [line[1:] for line in scene.lines()] == [["saved", "helper"]], scene.stderr
    assert code == 0, scene.stderr
    assert not naming(str(tmp_path))


@pytest.mark.parametrize("how", ["exec", "fork"])
def test_a_program_that_execs_its_save_on_the_signal_gets_it_once(
    scenes: Callable[..., Scene], tmp_path: Path, how: str
) -> None:
    helper, execer = tmp_path / "helper.py", tmp_path / "execer.py"
    helper.write_text(textwrap.dedent(HELPER))
    execer.write_text(textwrap.dedent(EXECER))
    scene = scenes(PARENT_OF_AN_EXECER, str(execer), str(helper), how)
    code = scene.signal_when_ready(signal.SIGTERM)
    # its own program took the signal: the save it exec'd is not sent it again
    assert [line[1:] for line in scene.lines()] == [["saved", "helper"]], scene.stderr
    assert code == 0, scene.stderr
    assert not naming(str(tmp_path))


# A command that forks a worker each time it is asked (a line on stdin); workers record.
POOL = """
import os, signal, sys, time
record, where = sys.argv[1], sys.argv[2]  # the workers' group: the pool's, or a session of its own
got = []
signal.signal(signal.SIGTERM, lambda signum, _frame: got.append(signum))
workers = []
for line in sys.stdin:
    ready, told = os.pipe()
    worker = os.fork()
    if worker == 0:
        def note(signum, _frame):
            with open(record, "a") as sink:
                sink.write(f"{os.getpid()} {signal.Signals(signum).name} worker\\n")
            os._exit(0)
        signal.signal(signal.SIGTERM, note)
        if where == "session":
            os.setsid()
        os.write(told, b"x")  # its own handler is in place
        time.sleep(120)
        os._exit(3)
    os.close(told)
    os.read(ready, 1)
    os.close(ready)
    workers.append(worker)
    print(worker, flush=True)
for worker in workers:  # the pool's join
    os.waitpid(worker, 0)
sys.exit(0)
"""


class Pool:
    """POOL started in a session of its own; forks a worker when asked."""

    def __init__(self, record: Path, where: str = "group") -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", textwrap.dedent(POOL), str(record), where],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True,
        )  # fmt: skip
        assert self.proc.stdin is not None
        assert self.proc.stdout is not None
        self.stdin, self.stdout = self.proc.stdin, self.proc.stdout
        self.workers: list[int] = []

    def fork_one(self) -> None:
        self.stdin.write(b"fork\n")
        self.stdin.flush()
        self.workers.append(int(self.stdout.readline()))

    def fork_the_last(self) -> None:
        self.fork_one()
        self.stdin.close()  # the pool has its workers: it joins them once they end

    def close(self) -> None:
        for pid in [*self.workers, self.proc.pid]:
            try:
                psutil.Process(pid).kill()
            except psutil.Error:
                continue
        if not self.stdin.closed:
            self.stdin.close()
        self.stdout.close()
        self.proc.wait()


def _fork_before_the_command_is_signalled(pool: Pool, monkeypatch: pytest.MonkeyPatch) -> None:
    """The pool forks its last worker right before launch's SIGTERM to it (or its group)."""
    for name in ("kill", "killpg"):
        real = getattr(os, name)

        def signalling(pid: int, signum: int, real: Callable[[int, int], None] = real) -> None:
            if pid == pool.proc.pid and signum == signal.SIGTERM and not pool.stdin.closed:
                pool.fork_the_last()
            real(pid, signum)

        monkeypatch.setattr(os, name, signalling)


@pytest.mark.parametrize(
    ("when", "where"),
    [
        ("after-the-look", "group"),
        ("before-the-signal", "group"),
        # outside the group the killpg does not reach it: launch lists the children of the
        # group's processes just before it, and signals one it missed during the grace
        ("after-the-look", "session"),
    ],
)
def test_a_worker_forked_before_its_parent_got_the_signal_gets_it_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, when: str, where: str
) -> None:
    """A worker is forked right after `signal_once`'s look, or right before the command is
    signalled (after launch listed the command's children: a pool forking back to back), in
    the pool's group or in a session of its own."""
    record = tmp_path / "record"
    since = time.time() - 1
    pool = Pool(record, where)
    try:
        pool.fork_one()
        command = _supervise._Command(pool.proc, "no-marker", since)
        looks = []
        real_collect = command.collect

        def collect() -> list[psutil.Process]:
            found = real_collect()
            if not looks:  # the first look, in signal_once
                looks.append(found)
                if when == "after-the-look":
                    pool.fork_the_last()
            return found

        monkeypatch.setattr(command, "collect", collect)
        if when == "before-the-signal":
            _fork_before_the_command_is_signalled(pool, monkeypatch)
        started = time.monotonic()
        code = _supervise._stop_command(pool.proc, signal.SIGTERM, GRACE, command)
        took = time.monotonic() - started
        monkeypatch.undo()
        assert [process.pid for process in looks[0]] == pool.workers[:1]  # the look missed one
        got = sorted(line[0] for line in (text.split() for text in record.read_text().splitlines()))
        assert got == sorted(map(str, pool.workers))  # each worker once
        assert code == 0  # the pool joined its workers and exited: no SIGKILL
        assert took < GRACE
    finally:
        pool.close()

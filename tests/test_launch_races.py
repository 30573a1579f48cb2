"""Class: the command's descendants, at awkward moments. Each process gets a signal once.

The sweep in ``test_launch_descendants`` places one process in each shape;
these place processes that change while launch passes the signal on:

- a command forking every few milliseconds (a child forked between launch's
  look and its signal must not get the signal twice),
- children that leave the group as the signal lands (``setsid`` in the handler),
- a child in a session of its own under a parent that ignores SIGTERM, with a
  ``TORCHELASTIC_RUN_ID`` launch itself inherited (launch is not torchrun's
  agent, so the child is not torchrun's rank and must get the signal),
- a daemon that changes its pid faster than a look at the process table.

Real processes: ``python -m verirl launch --gpus 1`` (no server) and programs
that append ``pid signal`` to a file for each signal they get.
"""

from __future__ import annotations

import collections
import contextlib
import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from _support import (
    clear_verirl_env,
    duplicate_window,
    end_launch,
    naming,
    still_alive,
    unshared_port,
)

DEADLINE = 30.0
"""Seconds any one awaited event may take (a loaded CI machine starts Pythons slowly)."""

FORKER = """
import os, signal, sys, threading, time
record, armed = sys.argv[1], sys.argv[2]

def noted(signum, _frame):
    with open(record, "a") as sink:
        sink.write(f"{os.getpid()} {signum}\\n")
    # The youngest (forked while launch looked) outlive the others, so that a duplicate sent
    # once those are gone still finds them; it interrupts the sleep and is noted too.
    time.sleep(max(0.3, 3.0 - 30 * (time.monotonic() - born)))
    os._exit(0)

signal.signal(signal.SIGTERM, lambda *_: os._exit(0))  # the parent leaves its children behind
end, forks = time.monotonic() + 60, 0
while time.monotonic() < end:
    if os.fork() == 0:
        born = time.monotonic()
        signal.signal(signal.SIGTERM, noted)
        threading.Event().wait(0.3)
        os._exit(0)
    forks += 1
    if forks == 200:
        open(armed, "w").close()
    try:
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    except ChildProcessError:
        pass
    time.sleep(0.003)
"""

LEAVER = """
import os, signal, sys, threading
record, armed = sys.argv[1], sys.argv[2]

def leave(signum, _frame):
    try:
        os.setsid()  # out of the command's group as the signal lands
    except PermissionError:  # a second signal: out already
        pass
    with open(record, "a") as sink:
        sink.write(f"{os.getpid()} {signum}\\n")

signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
for child in range(5):
    if os.fork() == 0:
        signal.signal(signal.SIGTERM, leave)
        open(f"{armed}.{child}", "w").close()
        threading.Event().wait(3.0)
        os._exit(0)
while not all(os.path.exists(f"{armed}.{child}") for child in range(5)):
    threading.Event().wait(0.01)
open(armed, "w").close()
threading.Event().wait(60)
"""

IGNORING_PARENT = """
import os, signal, subprocess, sys, threading
record, armed = sys.argv[1], sys.argv[2]
signal.signal(signal.SIGTERM, signal.SIG_IGN)  # passes nothing on
child = subprocess.Popen([sys.executable, "-c", f'''
import os, signal, sys, threading
def noted(signum, _frame):
    with open({record!r}, "a") as sink:
        sink.write(f"{{os.getpid()}} {{signum}}\\\\n")
    sys.exit(0)
signal.signal(signal.SIGTERM, noted)
open({armed!r}, "w").close()
threading.Event().wait(60)
'''], start_new_session=True)
child.wait()
"""

HOPPER = """
import os, signal, sys, time
record = sys.argv[1]
signal.signal(signal.SIGTERM, signal.SIG_IGN)
if os.fork() != 0:
    os._exit(0)  # the command exits at once; the daemon goes on
end = time.monotonic() + 60
while time.monotonic() < end:
    if os.fork() != 0:
        os._exit(0)  # a new pid at every hop, reparented to launch
    os.setsid()
    with open(record, "a") as sink:  # a sign of life at each hop
        sink.write(f"{os.getpid()} 0\\n")
    time.sleep(0.005)
"""


HEADLESS = """
import ctypes, os, signal, subprocess, sys, threading
record, armed = sys.argv[1], sys.argv[2]
if len(sys.argv) == 3:  # the command: starts the headless process, then exits at once
    subprocess.Popen([sys.executable, __file__, record, armed, "child"])
    while not os.path.exists(armed):
        threading.Event().wait(0.01)
    sys.exit(0)

def note():  # in a thread: the main thread is gone (the process shows as a zombie, "Zl")
    while True:
        signum = signal.sigwait({signal.SIGTERM, signal.SIGINT})
        with open(record, "a") as sink:
            sink.write(f"{os.getpid()} {signum}\\n")

signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
threading.Thread(target=note).start()
open(armed, "w").close()
ctypes.CDLL(None).pthread_exit(None)  # the main thread ends; the process goes on
"""


REMARKED = """
import os, signal, subprocess, sys, threading
record, armed = sys.argv[1], sys.argv[2]
if len(sys.argv) == 3:  # the command: a daemon with a marker of its own making, then exit
    env = {**os.environ, "VERIRL_LAUNCH_MARKER": os.environ["REMARK"]}
    subprocess.Popen([sys.executable, __file__, record, armed, "daemon"], env=env,
                     start_new_session=True)
    while not os.path.exists(armed):
        threading.Event().wait(0.01)
    sys.exit(0)

def noted(signum, _frame):
    with open(record, "a") as sink:
        sink.write(f"{os.getpid()} {signum}\\n")
    sys.exit(0)

signal.signal(signal.SIGTERM, noted)
open(armed, "w").close()
threading.Event().wait(60)
"""


class Race:
    """One ``verirl launch`` of one of the programs above."""

    def __init__(self, tmp_path: Path, program: str, grace: float, env: dict[str, str]) -> None:
        self.tmp_path = tmp_path
        self.script = tmp_path / "program.py"
        self.script.write_text(textwrap.dedent(program))
        self.record = tmp_path / "signals"
        self.armed = tmp_path / "armed"
        self.stderr_path = tmp_path / "launch.err"
        argv = [sys.executable, "-m", "verirl", "launch", "--gpus", "1",
                "--shutdown-timeout", f"{grace:g}", "--",
                sys.executable, str(self.script), str(self.record), str(self.armed)]  # fmt: skip
        with self.stderr_path.open("w") as sink:
            self.proc = subprocess.Popen(
                argv,
                stdout=subprocess.DEVNULL,
                stderr=sink,
                start_new_session=True,
                env={**os.environ, **env},
            )

    @property
    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def wait_armed(self) -> None:
        deadline = time.monotonic() + DEADLINE
        while not self.armed.exists():
            assert self.proc.poll() is None, self.stderr
            assert time.monotonic() < deadline, f"the program never got set up: {self.stderr}"
            psutil.wait_procs([], timeout=0.01)

    def signalled(self) -> collections.Counter[int]:
        """How many signals each pid recorded."""
        lines = self.record.read_text().split("\n") if self.record.exists() else []
        return collections.Counter(int(line.split()[0]) for line in lines if line.strip())

    def survivors(self) -> list[psutil.Process]:
        """The programs' processes (the script's path in their command line) running now."""
        return naming(str(self.tmp_path))  # a Zl process's too

    def close(self) -> None:
        for _ in range(50):  # a hopper's pid changes: kill until none is left
            left = self.survivors()
            if not left:
                break
            end_launch(self.proc, left)
        end_launch(self.proc, [])


@pytest.fixture
def races(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., Race]]:
    clear_verirl_env(monkeypatch, tmp_path)
    started: list[Race] = []

    def start(program: str, *, grace: float = 10, env: dict[str, str] | None = None) -> Race:
        race = Race(tmp_path, program, grace, env or {})
        started.append(race)
        return race

    yield start
    for race in started:
        race.close()


def test_a_child_forked_as_the_signal_is_passed_on_gets_it_once(races) -> None:
    race = races(FORKER)
    race.wait_armed()
    race.proc.send_signal(signal.SIGTERM)
    assert race.proc.wait(timeout=DEADLINE * 2) == 0, race.stderr  # the forker's own exit
    counts = race.signalled()
    assert counts, race.stderr  # its children got it (from launch: the forker passes nothing on)
    assert [pid for pid, count in counts.items() if count > 1] == [], counts


def test_a_child_leaving_the_group_as_the_signal_lands_gets_it_once(races) -> None:
    race = races(LEAVER)
    race.wait_armed()
    race.proc.send_signal(signal.SIGTERM)
    assert race.proc.wait(timeout=DEADLINE * 2) == 0, race.stderr
    counts = race.signalled()
    assert len(counts) == 5, (counts, race.stderr)
    assert set(counts.values()) == {1}, counts


def test_an_inherited_torchelastic_run_id_does_not_make_launch_leave_the_signal_to_a_parent(
    races,
) -> None:
    # launch run under torchrun (or with a stale variable): the command's child in a session of
    # its own is no rank of a torchrun inside the command, and its parent passes nothing on
    env = {"TORCHELASTIC_RUN_ID": "outer-job", "TORCHELASTIC_ERROR_FILE": "/tmp/outer/error.json"}
    race = races(IGNORING_PARENT, grace=20, env=env)
    race.wait_armed()
    race.proc.send_signal(signal.SIGTERM)
    assert race.proc.wait(timeout=DEADLINE * 2) == 0, race.stderr  # not SIGKILLed after the grace
    assert list(race.signalled().values()) == [1], race.stderr
    assert "SIGKILL" not in race.stderr.split("passed SIGTERM on")[-1].replace("SIGKILL in", "")


def test_a_daemon_changing_its_pid_faster_than_a_look_does_not_outlive_launch(races) -> None:
    race = races(HOPPER, grace=1)
    assert race.proc.wait(timeout=DEADLINE * 2) == 0, race.stderr
    # one, or two when the look lands mid-hop (the parent has forked, not yet exited)
    assert re.search(r"left [12] process\(es\) running", race.stderr), race.stderr
    # a look at the process table can miss it (that is the point): its signs of life must stop
    hops = race.record.stat().st_size
    psutil.wait_procs([], timeout=0.5)  # a hundred hops, were it alive
    assert race.record.stat().st_size == hops, race.stderr
    assert race.survivors() == [], race.stderr


SERVER = """
import os, signal, sys, time
record, armed = sys.argv[1], sys.argv[2]  # then the flags verirl gives a server: ignored

def noted(signum, _frame):
    with open(record, "a") as sink:
        sink.write(f"{os.getpid()} {signum}\\n")
    time.sleep(DUPLICATE_WINDOW)  # a duplicate sent meanwhile interrupts it and is noted too
    os._exit(0)

signal.signal(signal.SIGTERM, noted)
signal.signal(signal.SIGINT, noted)
open(armed, "w").close()
time.sleep(120)  # never ready: the inner launch is still starting it
""".replace("DUPLICATE_WINDOW", repr(duplicate_window()))


def test_a_nested_launchs_server_starting_gets_the_signal_once(tmp_path, monkeypatch) -> None:
    # The outer launch's command is an inner launch whose vLLM server is still starting (no
    # command of its own yet): the inner launch stops its server; the outer must leave it be.
    clear_verirl_env(monkeypatch, tmp_path)
    script = tmp_path / "server.py"
    script.write_text(textwrap.dedent(SERVER))
    record, armed = tmp_path / "signals", tmp_path / "armed"
    server = f"{sys.executable} {script} {record} {armed}"
    launch = [sys.executable, "-m", "verirl", "launch", "--shutdown-timeout", "10"]
    argv = [*launch, "--gpus", "1", "--", "env", "CUDA_VISIBLE_DEVICES=0,1",
            *launch, "--gpus", "2", "--model", "m", "--vllm-command", server,
            "--vllm-port", str(unshared_port()), "--", sys.executable, "-c", "pass"]  # fmt: skip
    stderr = tmp_path / "launch.err"
    with stderr.open("w") as sink:
        proc = subprocess.Popen(
            argv, stdout=subprocess.DEVNULL, stderr=sink, start_new_session=True
        )
    try:
        deadline = time.monotonic() + DEADLINE
        while not armed.exists():
            assert proc.poll() is None, stderr.read_text()
            assert time.monotonic() < deadline, stderr.read_text()
            psutil.wait_procs([], timeout=0.01)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=DEADLINE * 2) == 143, stderr.read_text()
    finally:
        end_launch(proc, [])
    counts = collections.Counter(int(line.split()[0]) for line in record.read_text().splitlines())
    assert list(counts.values()) == [1], (counts, stderr.read_text())


def test_a_process_whose_main_thread_ended_is_signalled_once_and_ended(races) -> None:
    race = races(HEADLESS, grace=1)
    try:
        assert race.proc.wait(timeout=DEADLINE * 2) == 0, race.stderr
        assert "left 1 process(es) running" in race.stderr, race.stderr
        counts = race.signalled()
        assert list(counts.values()) == [1], race.stderr  # SIGTERM once, then SIGKILL
        (headless,) = counts
        assert not Path(f"/proc/{headless}").exists(), race.stderr  # zombie-like, yet alive
    finally:  # killed by pid too, should it have survived
        for pid in race.signalled():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


HELPER = """
import os, signal, sys, threading
record = sys.argv[1]

def noted(signum, _frame):
    with open(record, "a") as sink:
        sink.write(f"{os.getpid()} {signum}\\n")
    os._exit(0)

signal.signal(signal.SIGTERM, noted)
signal.signal(signal.SIGINT, noted)
open(record + ".ready", "w").close()
threading.Event().wait(120)
"""


ZL_HELPER = """
import ctypes, os, signal, sys, threading, time
# HELPER with its main thread ended (pthread_exit) while a thread waits for the signal: a Zl
# process, whose environment (the server's marker, launch's) reads only through that thread.
record = sys.argv[1]
stopping = {signal.SIGINT, signal.SIGTERM}
signal.pthread_sigmask(signal.SIG_BLOCK, stopping)
me = os.getpid()

def noted():
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # until the main thread has ended
        with open(f"/proc/{me}/task/{me}/stat", "rb") as stat:
            if stat.read().rsplit(b")", 1)[1].split()[0] == b"Z":
                break
        time.sleep(0.005)
    open(record + ".ready", "w").close()
    signum = signal.sigwait(stopping)
    with open(record, "a") as sink:
        sink.write(f"{me} {signum}\\n")
    os._exit(0)

threading.Thread(target=noted).start()
ctypes.CDLL(None).pthread_exit(None)
"""


@pytest.mark.parametrize("helper", [HELPER, ZL_HELPER], ids=["plain", "main-thread-ended"])
def test_a_process_the_server_orphans_after_the_command_started_is_not_the_commands(
    tmp_path, monkeypatch, helper
) -> None:
    # The vLLM server launch started leaves a helper orphaned (reparented to launch, the
    # subreaper) while the command runs: it is the server's, stopped with the server. Also
    # when its main thread has ended (Zl): its markers are read through its live thread.
    clear_verirl_env(monkeypatch, tmp_path)
    (tmp_path / "helper.py").write_text(textwrap.dedent(helper))
    record = tmp_path / "helper-signals"
    go = tmp_path / "go"
    py = sys.executable
    server = (  # the server's child, a subshell, starts the helper once the command runs, exits
        f"sh -c '(while [ ! -e {go} ]; do sleep 0.05; done; {py} {tmp_path / 'helper.py'} "
        f'{record} &) & exec {py} -m fakes.vllm_serve "$@"\' server'
    )
    command = (
        f"import pathlib, threading; pathlib.Path({str(go)!r}).touch(); ready = "
        f"pathlib.Path({str(record)!r} + '.ready')\n"
        "while not ready.exists(): threading.Event().wait(0.02)"
    )
    argv = [py, "-m", "verirl", "launch", "--gpus", "2", "--model", "m", "--vllm-command", server,
            "--vllm-port", str(unshared_port()), "--shutdown-timeout", "5", "--", py, "-c",
            command]  # fmt: skip
    done = subprocess.run(argv, capture_output=True, text=True, timeout=DEADLINE * 3, check=False)
    try:
        assert done.returncode == 0, done.stderr
        assert "left" not in done.stderr, done.stderr  # not blamed on the command
        assert (tmp_path / "helper-signals.ready").exists()
        helpers = [int(line.split()[0]) for line in record.read_text().splitlines()]
        assert len(helpers) == 1, done.stderr  # one signal, from the server's teardown
        assert _gone(helpers[0]), done.stderr
    finally:
        for process in naming(str(tmp_path)):
            with contextlib.suppress(psutil.Error):
                process.kill()


def _gone(pid: int) -> bool:
    """Whether ``pid`` has ended within `DEADLINE` (a zombie no one reaps counts as ended)."""
    try:
        return still_alive([psutil.Process(pid)], timeout=DEADLINE) == []
    except psutil.NoSuchProcess:
        return True


@pytest.mark.parametrize(
    "remark", ["", "stale", "1-0123456789abcdef"], ids=["blank", "changed", "another launch's"]
)
def test_a_daemon_that_rewrote_its_launch_marker_does_not_outlive_launch(races, remark) -> None:
    """Only launch's exact markers make a process launch's own (its server's): a daemon of the
    command with a blank, changed or foreign marker is still the command's."""
    race = races(REMARKED, grace=10, env={"REMARK": remark})
    assert race.proc.wait(timeout=DEADLINE * 2) == 0, race.stderr
    assert list(race.signalled().values()) == [1], race.stderr
    assert "left 1 process(es) running" in race.stderr, race.stderr
    assert not race.survivors(), race.stderr


SIGNAL_AS_THE_COMMAND_STARTS = """
import os, signal, sys, time
from verirl import _supervise

ready = sys.argv[1]
original = _supervise._start

def start_then_signal(command, env, started):
    child = original(command, env, started)
    deadline = time.monotonic() + 30
    while not os.path.exists(ready) and time.monotonic() < deadline:
        time.sleep(0.01)
    os.kill(os.getpid(), signal.SIGTERM)  # lands before launch has recorded the command
    return child

_supervise._start = start_then_signal
signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
daemon = (
    "import os, sys, time; open(sys.argv[1] + '.tmp', 'w').write(str(os.getpid())); "
    "os.rename(sys.argv[1] + '.tmp', sys.argv[1]); time.sleep(300)"
)
script = 'setsid "$0" -c "$1" "$2" </dev/null >/dev/null 2>&1 & exec sleep 300'
command = ["/bin/sh", "-c", script, sys.executable, daemon, ready]
try:
    code = _supervise.run_command(command, dict(os.environ), 10.0)
except SystemExit as exc:
    code = exc.code
print("code", code, flush=True)
"""


def test_a_signal_as_the_command_starts_still_reaches_a_daemon_it_started(tmp_path):
    """A signal while the command is being started is raised once the child exists; stopping
    the command then must know it as launch does (its marker, its start time), or a daemon it
    had already started in a session of its own was never signalled and outlived launch."""
    ready = tmp_path / "daemon.pid"
    done = subprocess.run(
        [sys.executable, "-c", SIGNAL_AS_THE_COMMAND_STARTS, str(ready)],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    try:
        daemon = [psutil.Process(int(ready.read_text()))]
    except psutil.NoSuchProcess:
        daemon = []  # gone already
    try:
        assert done.stdout.strip() == "code 143", done.stderr[-3000:]
        assert not still_alive(daemon, timeout=5), "the daemon outlived launch"
    finally:
        for process in daemon:
            with contextlib.suppress(psutil.Error):
                process.kill()


def test_a_ctrl_c_at_any_point_of_the_forwarding_s_set_up_or_end_drops_no_later_signal():
    """A Ctrl-C as a forwarding handler had been set, before it was noted, or in the middle of
    putting the old ones back, left verirl's handler installed on a dead forwarding: a later
    SIGQUIT/SIGUSR1/... was queued nowhere (the process neither ended nor passed it on), the
    next command's forwarding did not take over, and the wake pipe leaked (review round 30,
    H-F7). At every point: each handler left is the default or a closed forwarding's (which
    acts as the default), the next forwarding takes over and gives the default back, and no
    descriptor is left open."""
    from _support import codes_of, interrupted_at_point
    from verirl._signals import TERMINATING
    from verirl._supervise import _Forwarding, run_command
    from verirl.server import child as _child
    from verirl.server.child import child_subreaper

    # The subreaper's own helpers too: a Ctrl-C in the one that puts it back, before its
    # system call, left it on (review round 38, R-F4).
    codes = codes_of(run_command, _Forwarding.__init__, _Forwarding.install, _Forwarding.close,
                     _child.set_child_subreaper, _child.child_subreaper,
                     _child._prctl)  # fmt: skip
    originally = {signum: signal.getsignal(signum) for signum in TERMINATING}
    subreaper = child_subreaper()
    ours = [signum for signum, handler in originally.items() if handler == signal.SIG_DFL]
    command = [sys.executable, "-c", ""]

    def run() -> None:
        run_command(command, dict(os.environ), 0.5)

    points = interrupted_at_point(codes, None, run)
    assert points > len(ours) * 2
    descriptors = {entry.name for entry in Path("/proc/self/fd").iterdir()}
    for point in range(1, points + 1):
        interrupted_at_point(codes, point, run)
        # Set before its try, the subreaper stayed: orphans of later tests came back to us.
        assert child_subreaper() == subreaper, point
        for signum in ours:
            handler = signal.getsignal(signum)
            owner = getattr(handler, "__self__", None)
            stale = isinstance(owner, _Forwarding) and owner.closed
            assert handler == signal.SIG_DFL or stale, (point, signum, handler)
        forwarding = _Forwarding()
        forwarding.install()
        taken = [signal.getsignal(signum) == forwarding._handle for signum in ours]
        forwarding.close()
        assert all(taken), point
        assert all(signal.getsignal(signum) == signal.SIG_DFL for signum in ours), point
        left = {entry.name for entry in Path("/proc/self/fd").iterdir()} - descriptors
        assert len(left) <= 2, (point, left)  # os.pipe()'s return: the one point it cannot close
        descriptors |= left


@pytest.mark.parametrize("before", ["default", "as_sigterm"])
def test_a_closed_forwarding_s_handler_left_installed_acts_as_the_one_it_replaced(before):
    """What a close cut short leaves (see above): a SIGUSR1 then ends the process as it would
    have without it, by the signal itself or, under the CLI's as_sigterm, as a SIGTERM."""
    script = textwrap.dedent(
        f"""
        import os, signal
        from verirl._signals import as_sigterm
        from verirl._supervise import _Forwarding

        if {before!r} == "as_sigterm":
            signal.signal(signal.SIGUSR1, as_sigterm)
        forwarding = _Forwarding()
        forwarding.install()
        forwarding.closed = True  # its close cut short before it put the handler back
        os.kill(os.getpid(), signal.SIGUSR1)
        print("still running")
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, check=False
    )
    assert "still running" not in result.stdout, result
    expected = -signal.SIGUSR1 if before == "default" else -signal.SIGTERM
    assert result.returncode == expected, result

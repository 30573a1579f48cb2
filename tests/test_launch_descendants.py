"""Class: the command's descendants. Nothing the command started outlives ``verirl launch``.

Swept over every way a process of the command can stand relative to it:

- in its process group (a shell's background job),
- in a session of its own and orphaned (a daemon: double fork + ``setsid``),
- in a session of its own under a parent that passes signals on (torchrun
  starts its ranks with ``start_new_session=True`` and ``TORCHELASTIC_RUN_ID``
  and forwards to them),
- in a session of its own under a parent that does not pass it on
  (``sh -c 'setsid python …'``: sh dies of SIGTERM, waits through SIGINT),
- under a nested ``verirl launch`` (in the inner launch's group, outside the
  outer one's: the inner launch passes the signal on, the outer must not),

and over every way launch ends: the command exits on its own, or launch gets
SIGTERM or SIGINT. Each process of the command must get a signal sent to
launch exactly once (a second SIGINT means "skip the checkpoint" to
`PreemptionCallback`), and none may run once launch has returned.

Real processes throughout: ``python -m verirl launch`` with ``--gpus 1``
(colocate: no server) and recorder programs that append each signal they get
to a file.
"""

from __future__ import annotations

import contextlib
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from _support import clear_verirl_env, duplicate_window, end_launch, naming, still_alive

DEADLINE = 30.0
"""Seconds any one awaited event may take (a loaded CI machine starts Pythons slowly)."""

DUPLICATE_WINDOW = duplicate_window()

RECORDER = """
import os, signal, sys, threading
record, ready = sys.argv[1], sys.argv[2]
got = threading.Event()

def note(signum, _frame):
    with open(record, "a") as sink:
        sink.write(signal.Signals(signum).name + "\\n")
    got.set()

signal.signal(signal.SIGINT, note)
signal.signal(signal.SIGTERM, note)
# started with both blocked (by MIDDLE's "spawn"): a signal that came meanwhile is noted now
signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})
with open(ready + ".tmp", "w") as sink:
    sink.write(f"{os.getpid()} {os.getsid(0)} {os.getpgrp()}")
os.replace(ready + ".tmp", ready)
got.wait(300)
# Stay after the first signal while launch still looks, so that a duplicate is counted.
threading.Event().wait(DUPLICATE_WINDOW)
sys.exit(0)
""".replace("DUPLICATE_WINDOW", repr(DUPLICATE_WINDOW))

ZL_RECORDER = """
import ctypes, os, signal, sys, threading, time
# RECORDER with its main thread ended (pthread_exit) while a thread records: a Zl process,
# which psutil reads as a zombie with no environment.
record, ready = sys.argv[1], sys.argv[2]
stopping = {signal.SIGINT, signal.SIGTERM}
signal.pthread_sigmask(signal.SIG_BLOCK, stopping)
me = os.getpid()

def note():
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:  # until the main thread has ended
        with open(f"/proc/{me}/task/{me}/stat", "rb") as stat:
            if stat.read().rsplit(b")", 1)[1].split()[0] == b"Z":
                break
        time.sleep(0.005)
    with open(ready + ".tmp", "w") as sink:
        sink.write(f"{me} {os.getsid(0)} {os.getpgrp()}")
    os.replace(ready + ".tmp", ready)
    signum = signal.sigwait(stopping)
    until = time.monotonic() + DUPLICATE_WINDOW  # while launch still looks: noted too
    while signum is not None:
        with open(record, "a") as sink:
            sink.write(signal.Signals(signum).name + "\\n")
        info = signal.sigtimedwait(stopping, max(until - time.monotonic(), 0))
        signum = None if info is None else info.si_signo
    os._exit(0)

threading.Thread(target=note).start()
ctypes.CDLL(None).pthread_exit(None)
""".replace("DUPLICATE_WINDOW", repr(DUPLICATE_WINDOW))

DAEMONIZE = """
import os, sys
# The classic daemon: fork, setsid, fork again; the middle process exits.
middle = os.fork()
if middle == 0:
    os.setsid()
    if os.fork() == 0:
        # "-clean": the daemon also drops its environment (launch's marker with it)
        env = {} if sys.argv[1].endswith("-clean") else os.environ
        os.execve(sys.executable, [sys.executable, *sys.argv[2:]], env)
    os._exit(0)
os.waitpid(middle, 0)
import threading, time
if sys.argv[1].startswith("wait"):
    threading.Event().wait(300)
ready, deadline = sys.argv[-1], time.monotonic() + 60
while not os.path.exists(ready) and time.monotonic() < deadline:  # the daemon is set up
    threading.Event().wait(0.01)
"""

FORWARDER = """
import os, signal, subprocess, sys
# What torchrun's agent does: each rank in a session of its own (with torchrun's
# variables), signals forwarded to it.
env = {**os.environ, "TORCHELASTIC_RUN_ID": "fake-run"}
rank = subprocess.Popen([sys.executable, *sys.argv[1:]], start_new_session=True, env=env)

def forward(signum, _frame):
    rank.send_signal(signum)

signal.signal(signal.SIGINT, forward)
signal.signal(signal.SIGTERM, forward)
sys.exit(rank.wait())
"""

MIDDLE = """
import os, signal, subprocess, sys, threading, time
# A job of the command, in its group, that starts the recorder in a group of its own
# (setpgid, not setsid) with an empty environment: outside the command's group, no
# marker, and not an orphan while this middle process lives.
mode, armed, recorder = sys.argv[1], sys.argv[2], sys.argv[3:]

def start():
    group_of_its_own = "import os, sys; os.setpgid(0, 0); os.execv(sys.argv[1], sys.argv[1:])"
    subprocess.Popen([sys.executable, "-c", group_of_its_own, sys.executable, *recorder], env={})
    ready, deadline = recorder[-1], time.monotonic() + 600  # launch's grace ends it sooner
    while not os.path.exists(ready) and time.monotonic() < deadline:
        threading.Event().wait(0.01)

def spawn(_signum, _frame):
    # blocked in the recorder until its handlers are set
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    start()
    os._exit(0)

if mode == "ignore":  # ignores SIGTERM and SIGINT: SIGKILL alone ends it
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    start()
elif mode == "die":  # dies of the signal at once, its child orphaned then
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # sh started it ignoring SIGINT
    start()
else:  # "spawn": on the signal, starts the recorder, then exits
    signal.signal(signal.SIGTERM, spawn)
    signal.signal(signal.SIGINT, spawn)
open(armed, "w").close()
threading.Event().wait(300)
"""


class Scene:
    """One ``verirl launch`` of a command that starts a recorder somewhere below it."""

    def __init__(self, tmp_path: Path, shape: str, grace: float = 20) -> None:
        for name, text in (("recorder", RECORDER), ("daemonize", DAEMONIZE),
                           ("forwarder", FORWARDER), ("middle", MIDDLE),
                           ("zl_recorder", ZL_RECORDER)):  # fmt: skip
            (tmp_path / f"{name}.py").write_text(textwrap.dedent(text))
        self.tmp_path = tmp_path
        self.grace = grace
        self.record = tmp_path / "signals"
        self.ready = tmp_path / "ready"
        self.armed = tmp_path / "armed"
        self.stderr_path = tmp_path / "launch.err"
        recorder = [str(tmp_path / "recorder.py"), str(self.record), str(self.ready)]
        zl_recorder = [str(tmp_path / "zl_recorder.py"), str(self.record), str(self.ready)]
        py = sys.executable
        wait_ready = (
            f"i=0; while [ ! -e {self.ready} ] && [ $i -lt 6000 ]; do sleep 0.01; i=$((i+1)); done"
        )
        commands = {
            # the command exits at once, its daemon lives on
            "daemon-exits": [py, str(tmp_path / "daemonize.py"), "exit", *recorder],
            # the command keeps running, its daemon (orphaned, own session) too
            "daemon-waits": [py, str(tmp_path / "daemonize.py"), "wait", *recorder],
            # both again, with a daemon that dropped its environment (no marker to find)
            "clean-daemon-exits": [py, str(tmp_path / "daemonize.py"), "exit-clean", *recorder],
            "clean-daemon-waits": [py, str(tmp_path / "daemonize.py"), "wait-clean", *recorder],
            # a background job that dropped its environment: still in the command's group
            "clean-background": [
                "sh",
                "-c",
                f"env -i {py} {' '.join(recorder)} & {wait_ready}; exit 0",
            ],
            # a background job in the command's group, left behind when sh exits
            "background": ["sh", "-c", f"{py} {' '.join(recorder)} & {wait_ready}; exit 0"],
            # torchrun's shape: the parent forwards to a rank in its own session
            "forwarder": [py, str(tmp_path / "forwarder.py"), *recorder],
            # a parent that dies of the signal without passing it on
            "setsid-under-sh": ["sh", "-c", f"setsid {py} {' '.join(recorder)}; exit $?"],
        }
        wait_armed = (
            f"i=0; while [ ! -e {self.armed} ] && [ $i -lt 6000 ]; do sleep 0.01; i=$((i+1)); done"
        )
        for mode in ("ignore", "die", "spawn"):
            middle = f"{py} {tmp_path / 'middle.py'} {mode} {self.armed} {' '.join(recorder)}"
            # the middle is a background job left running when the command exits ...
            commands[f"{mode}-middle-exits"] = ["sh", "-c", f"{middle} & {wait_armed}; exit 0"]
            # ... or an orphan of a subshell (adopted by launch) while the command runs
            commands[f"{mode}-middle-waits"] = [
                "sh",
                "-c",
                f"({middle} &); {wait_armed}; exec sleep 300",
            ]
        launch = [py, "-m", "verirl", "launch", "--gpus", "1", "--shutdown-timeout", f"{grace:g}"]
        launch.append("--")
        # a launch inside launch: the recorder in the inner launch's command group
        commands["nested-launch"] = [*launch, py, *recorder]
        # both again with a recorder whose main thread has ended (Zl): its environment (torchrun's
        # variables, the launch markers) reads only through its live thread
        commands["zl-forwarder"] = [py, str(tmp_path / "forwarder.py"), *zl_recorder]
        commands["zl-nested-launch"] = [*launch, py, *zl_recorder]
        # ... or the middle's child of the inner launch's command (its own group, no marker)
        for mode in ("ignore", "die"):
            commands[f"nested-{mode}-middle-waits"] = [*launch, *commands[f"{mode}-middle-waits"]]
        argv = [*launch, *commands[shape]]
        with self.stderr_path.open("w") as sink:  # a file: an orphan holding a pipe cannot hang us
            self.proc = subprocess.Popen(
                argv, stdout=subprocess.DEVNULL, stderr=sink, start_new_session=True
            )
        self.recorder: psutil.Process | None = None

    @property
    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def signals(self) -> list[str]:
        return self.record.read_text().split() if self.record.exists() else []

    def wait_for(self, condition: Callable[[], object], what: str) -> None:
        deadline = time.monotonic() + DEADLINE
        while not condition():
            assert time.monotonic() < deadline, f"timed out waiting for {what}: {self.stderr}"
            psutil.wait_procs([], timeout=0.02)

    def signal_once_armed(self, sig: signal.Signals) -> int:
        """Send ``sig`` to launch once the middle process is set up; launch's exit code."""
        self.wait_for(self.armed.exists, "the middle process")
        self.proc.send_signal(sig)
        return self.proc.wait(timeout=self.grace + DEADLINE * 3)

    def wait_for_recorder(self) -> tuple[int, int]:
        """The recorder's session and group, once it has its handlers."""
        self.wait_for(self.ready.exists, "the recorder")
        pid, session, group = map(int, self.ready.read_text().split())
        with contextlib.suppress(psutil.Error):
            self.recorder = psutil.Process(pid)
        return session, group

    def survivors(self, timeout: float) -> list[psutil.Process]:
        """The scene's processes (``tmp_path`` in their command line) alive after ``timeout`` s."""
        deadline = time.monotonic() + timeout
        while True:
            left = naming(str(self.tmp_path))  # a Zl process's too
            if not left or time.monotonic() >= deadline:
                return left
            psutil.wait_procs([], timeout=0.05)

    def close(self) -> None:
        if self.recorder is not None:
            with contextlib.suppress(psutil.Error):
                self.recorder.kill()
        end_launch(self.proc, self.survivors(timeout=0))
        if self.recorder is not None:
            still_alive([self.recorder], timeout=10)


@pytest.fixture
def scenes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., Scene]]:
    clear_verirl_env(monkeypatch, tmp_path)
    started: list[Scene] = []

    def start(shape: str, grace: float = 20) -> Scene:
        scene = Scene(tmp_path, shape, grace)
        started.append(scene)
        return scene

    yield start
    for scene in started:
        scene.close()


@pytest.mark.parametrize(
    "shape", ["daemon-exits", "background", "clean-daemon-exits", "clean-background"]
)
def test_what_the_command_leaves_running_does_not_outlive_launch(
    scenes: Callable[[str], Scene], shape: str
) -> None:
    scene = scenes(shape)
    scene.wait_for_recorder()
    assert scene.recorder is not None
    code = scene.proc.wait(timeout=DEADLINE * 2)
    assert code == 0, scene.stderr  # the command's own code
    assert not still_alive([scene.recorder], timeout=1), scene.stderr
    assert scene.signals() == ["SIGTERM"], scene.stderr  # asked once, before any SIGKILL
    assert "left 1 process(es) running" in scene.stderr


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
@pytest.mark.parametrize(
    "shape", ["daemon-waits", "forwarder", "setsid-under-sh", "clean-daemon-waits"]
)
def test_a_signal_reaches_a_process_outside_the_group_exactly_once(
    scenes: Callable[[str], Scene], shape: str, sig: signal.Signals
) -> None:
    scene = scenes(shape)
    session, _ = scene.wait_for_recorder()
    assert scene.recorder is not None
    assert session != scene.proc.pid  # it left launch's session (and the command's group)
    scene.proc.send_signal(sig)  # kill -TERM <pid>, as Kubernetes signals a container
    code = scene.proc.wait(timeout=DEADLINE * 2)
    assert not still_alive([scene.recorder], timeout=1), scene.stderr
    assert scene.signals() == [sig.name], scene.stderr  # once: not lost, not doubled
    assert code in _launch_codes(shape, sig), scene.stderr
    assert "outlived" not in scene.stderr  # it exited of the signal, within the grace


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_signal_reaches_the_command_of_a_nested_launch_exactly_once(
    scenes: Callable[[str], Scene], sig: signal.Signals
) -> None:
    scene = scenes("nested-launch")
    _, group = scene.wait_for_recorder()
    assert scene.recorder is not None
    inner = psutil.Process(scene.proc.pid).children()  # the inner launch
    assert len(inner) == 1
    assert group not in (scene.proc.pid, inner[0].pid)  # outside both launches' groups
    scene.proc.send_signal(sig)
    code = scene.proc.wait(timeout=DEADLINE * 2)
    assert not still_alive([scene.recorder, *inner], timeout=1), scene.stderr
    assert scene.signals() == [sig.name], scene.stderr  # from the inner launch alone
    assert code in _launch_codes("nested-launch", sig), scene.stderr
    assert "outlived" not in scene.stderr


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
@pytest.mark.parametrize("shape", ["zl-forwarder", "zl-nested-launch"])
def test_a_signal_reaches_a_process_whose_main_thread_ended_exactly_once(
    scenes: Callable[[str], Scene], shape: str, sig: signal.Signals
) -> None:
    """Its parent (torchrun's agent, an inner launch) passes the signal on: launch must read
    the environment that says so through a live thread, or the process gets it twice."""
    scene = scenes(shape)
    scene.wait_for_recorder()
    assert scene.recorder is not None
    assert scene.recorder.status() == psutil.STATUS_ZOMBIE  # to psutil; alive all the same
    scene.proc.send_signal(sig)
    code = scene.proc.wait(timeout=DEADLINE * 2)
    assert not still_alive([scene.recorder], timeout=1), scene.stderr
    assert scene.signals() == [sig.name], scene.stderr  # once: not lost, not doubled
    assert code in _launch_codes(shape, sig), scene.stderr
    assert "outlived" not in scene.stderr


def _launch_codes(shape: str, sig: signal.Signals) -> set[int]:
    """launch's exit code: its command's, which dies of the signal unless the shape says not.

    A forwarder passes the signal on and exits with its rank's 0, an inner launch with its
    recorder's 0. sh waits through SIGINT for its ``setsid`` child, which records it and
    exits 0; dash then exits of the SIGINT it had, bash (as ``/bin/sh``) with the child's 0.
    """
    if shape in ("forwarder", "zl-forwarder", "nested-launch", "zl-nested-launch"):
        return {0}
    if shape == "setsid-under-sh" and sig == signal.SIGINT:
        return {0, 128 + sig}
    return {128 + sig}


MIDDLES = ["ignore", "die", "spawn"]
"""How the middle process meets SIGTERM/SIGINT: ignores it (and outlives the grace), dies of
it (its child is adopted by launch then), or starts its child only then and exits."""


def _grace(middle: str) -> float:
    """Short where the middle outlives it anyway; long where nothing should.

    Longer than every wait of the test: the "spawn" recorder starts only after the signal (two
    Python start-ups), and a 20 s grace made a stalled machine read as "the recorder never ran"
    (seen once in CI); now a stall only makes the test slower.
    """
    return 4 if middle == "ignore" else DEADLINE * 4


@pytest.mark.parametrize("middle", MIDDLES)
def test_a_child_in_its_own_group_without_environment_under_a_leftover_gets_sigterm_once(
    scenes: Callable[..., Scene], middle: str
) -> None:
    scene = scenes(f"{middle}-middle-exits", _grace(middle))
    code = scene.proc.wait(timeout=scene.grace + DEADLINE * 3)
    assert code == 0, scene.stderr  # the command's own code
    assert scene.ready.exists(), scene.stderr  # the recorder ran
    assert not scene.survivors(timeout=1), scene.stderr
    assert scene.signals() == ["SIGTERM"], scene.stderr  # asked once, before any SIGKILL
    assert "left" in scene.stderr
    # SIGKILL only when a process really outlived the grace: the middle that ignores SIGTERM
    assert ("outlived" in scene.stderr) == (middle == "ignore"), scene.stderr


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
@pytest.mark.parametrize("middle", MIDDLES)
def test_a_signal_reaches_a_child_in_its_own_group_without_environment_exactly_once(
    scenes: Callable[..., Scene], middle: str, sig: signal.Signals
) -> None:
    scene = scenes(f"{middle}-middle-waits", _grace(middle))
    code = scene.signal_once_armed(sig)
    assert scene.ready.exists(), scene.stderr  # the recorder ran
    assert not scene.survivors(timeout=1), scene.stderr
    assert scene.signals() == [sig.name], scene.stderr  # once: not lost, not doubled
    assert code in _launch_codes(f"{middle}-middle-waits", sig), scene.stderr
    assert ("outlived" in scene.stderr) == (middle == "ignore"), scene.stderr


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
@pytest.mark.parametrize("middle", ["ignore", "die"])
def test_a_signal_reaches_an_unmarked_child_under_a_nested_launch_exactly_once(
    scenes: Callable[..., Scene], middle: str, sig: signal.Signals
) -> None:
    scene = scenes(f"nested-{middle}-middle-waits", _grace(middle))
    scene.signal_once_armed(sig)
    assert not scene.survivors(timeout=1), scene.stderr
    # from the inner launch alone, which finds it below its command's job
    assert scene.signals() == [sig.name], scene.stderr


# Run as pid 1 of a pid namespace of its own, where the test chooses the next pid: the
# command ends and is reaped, and a stranger's process group then gets the command's pid.
REUSED_GROUP_ID = """
import os, signal, subprocess, sys, time
import psutil
from verirl import _supervise

since = time.time() - 1
command_process = subprocess.Popen(
    [sys.executable, "-c", "import sys; sys.stdin.read()"],
    stdin=subprocess.PIPE, start_new_session=True,
)
command = _supervise._Command(command_process, "no-marker", since)
command.collect()
command_process.stdin.close()
command_process.wait(timeout=30)
with open("/proc/sys/kernel/ns_last_pid", "w") as last:
    last.write(str(command_process.pid - 1))
stranger = subprocess.Popen(["sh", "-c", "sleep 60 & echo $!; wait"], stdout=subprocess.PIPE,
                            start_new_session=True)
member = int(stranger.stdout.readline())
assert stranger.pid == command_process.pid, (stranger.pid, command_process.pid)
assert os.getpgid(member) == command_process.pid
command.others[stranger.pid] = psutil.Process(stranger.pid).create_time()
found = [process.pid for process in command.collect()]
command.kill()
try:
    alive = psutil.Process(member).status() != psutil.STATUS_ZOMBIE
except psutil.NoSuchProcess:  # killed, and reaped by its shell
    alive = False
print(member in found, alive, flush=True)
"""


UNSHARE = shutil.which("unshare") or "unshare"


def test_a_group_id_reused_after_the_command_is_reaped_is_not_the_command_s(
    tmp_path: Path,
) -> None:
    """Once the command is reaped and its group empty, the kernel may give its pid to a new
    process, leader of a group of its own: launch neither finds nor kills that group's members
    (it SIGKILLed the group by id). A pid namespace of the test's own lets it choose the pid."""
    program = tmp_path / "reuse.py"
    program.write_text(REUSED_GROUP_ID)
    result = subprocess.run(
        [UNSHARE, "--pid", "--fork", "--mount-proc", sys.executable, str(program)],
        capture_output=True,
        text=True,
        timeout=DEADLINE,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False", "True"]  # not found, still running


FORKER = """
import os, signal, sys, time
signal.signal(signal.SIGTERM, signal.SIG_IGN)
signal.signal(signal.SIGINT, signal.SIG_IGN)
tag, ready = sys.argv[1], sys.argv[2]
if os.fork():
    os._exit(0)
os.setsid()  # a daemon that ignores the signal and keeps starting workers, each its own session
open(ready, "w").close()
for _ in range(3000):
    if os.fork() == 0:
        os.setsid()
        os.execvp("sleep", [tag, "120"])
    time.sleep(0.002)
"""


def test_the_final_sigkill_goes_on_until_nothing_new_turns_up(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After the grace, launch SIGKILLs, waits for what it killed to die, looks again and kills
    what is new, until nothing is: a daemon forking workers in sessions of their own as launch
    kills leaves none behind (review of d20181f: a name clash ended the kill after one round,
    silently, and left 11 to 83 workers running)."""
    clear_verirl_env(monkeypatch, tmp_path)
    tag = f"verirl-forker-{tmp_path.name}"
    forker, ready = tmp_path / "forker.py", tmp_path / "ready"
    forker.write_text(FORKER)
    script = f"trap '' TERM INT; {sys.executable} {forker} {tag} {ready}; while :; do sleep 1; done"
    launch = subprocess.Popen(
        [sys.executable, "-m", "verirl", "launch", "--gpus", "1", "--shutdown-timeout", "1",
         "--", "sh", "-c", script],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + DEADLINE
        while not ready.exists() and launch.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)
        assert ready.exists(), launch.stderr.read().decode() if launch.poll() is not None else ""
        time.sleep(0.3)  # workers are being forked as the signal comes
        launch.send_signal(signal.SIGTERM)
        _, err = launch.communicate(timeout=DEADLINE)
        assert launch.returncode == 128 + signal.SIGKILL, err.decode()  # the command's code
        assert still_alive(naming(tag), timeout=0.5) == []
    finally:
        end_launch(launch, naming(tag))

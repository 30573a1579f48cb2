"""``verirl launch`` passes each SIGINT/SIGTERM on to its command exactly once.

A second SIGINT means "out now, skip the checkpoint" to `PreemptionCallback`,
so a Ctrl-C (the terminal signals launch's whole process group) or a platform's
preemption (Modal: SIGINT, Kubernetes: SIGTERM, to launch alone) must reach
the training command once, and reach every process of a ``sh -c`` wrapper as
it would from a terminal. Real processes throughout: ``python -m verirl
launch`` runs a command that appends every signal it gets to a file, and exits
``128 + N`` for the first one once the test releases it (SIGUSR1), so that a
duplicate sent after the first one still finds it alive and is counted.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import psutil
import pytest

from _support import clear_verirl_env, end_launch, still_alive, unshared_port
from verirl._supervise import _stop_command

DEADLINE = 30.0
"""Seconds any one awaited event may take (a loaded CI machine starts Pythons slowly)."""

RECORDER = """
import os, signal, sys
record, ready = sys.argv[1], sys.argv[2]
first = []
release_r, release_w = os.pipe()

def note(signum, _frame):
    with open(record, "a") as sink:
        sink.write(signal.Signals(signum).name + "\\n")
    first.append(signum)

def release(_signum, _frame):
    os.write(release_w, b"x")

signal.signal(signal.SIGINT, note)
signal.signal(signal.SIGTERM, note)
signal.signal(signal.SIGUSR1, release)
with open(ready + ".tmp", "w") as sink:
    sink.write(f"{os.getpid()} {os.getppid()} {os.getpgrp()}")
os.replace(ready + ".tmp", ready)
os.read(release_r, 1)  # a signal interrupts it, runs its handler, and the read goes on
sys.exit(128 + first[0] if first else 0)
"""


class Launch:
    """``verirl launch`` of the recorder in a session of its own, as a terminal job would be."""

    def __init__(
        self,
        tmp_path: Path,
        *,
        wrapped: bool = False,
        left_behind: bool = False,
        flags: tuple[str, ...] = (),
        prelude: str = "",
    ):
        script = tmp_path / "recorder.py"
        script.write_text(textwrap.dedent(RECORDER))
        self.record = tmp_path / "signals"
        self.ready = tmp_path / "ready"
        self.stderr_path = tmp_path / "launch.err"
        command = [sys.executable, str(script), str(self.record), str(self.ready)]
        if wrapped:  # sh stays between launch and python (a last command would be exec'd)
            command = ["sh", "-c", f"{shlex.join(command)}; exit $?"]
        if left_behind:  # the command exits 3 once the recorder it leaves running is ready
            ready = shlex.quote(str(self.ready))
            wait = f"until [ -e {ready} ]; do sleep 0.01; done"
            command = ["sh", "-c", f"{shlex.join(command)} & {wait}; exit 3"]
        program = ["-m", "verirl"]
        if prelude:  # run first, in launch's own process
            program = [
                "-c",
                f"{prelude}\nimport sys\nfrom verirl.__main__ import run\nsys.exit(run())",
            ]
        argv = [sys.executable, *program, "launch", "--gpus", "1", *flags, "--", *command]
        with self.stderr_path.open("w") as sink:  # a file: an orphan holding a pipe cannot hang us
            self.proc = subprocess.Popen(
                argv, stdout=subprocess.DEVNULL, stderr=sink, start_new_session=True
            )
        self.command: list[psutil.Process] = []

    @property
    def stderr(self) -> str:
        return self.stderr_path.read_text()

    def signals(self) -> list[str]:
        return self.record.read_text().split() if self.record.exists() else []

    def wait_for(self, condition: Callable[[], object], what: str) -> None:
        deadline = time.monotonic() + DEADLINE
        while not condition():
            assert self.proc.poll() is None, (what, self.proc.returncode, self.stderr)
            assert time.monotonic() < deadline, f"timed out waiting for {what}: {self.stderr}"
            psutil.wait_procs([], timeout=0.02)

    def wait_until_running(self) -> tuple[int, int, int]:
        """The recorder's pid, parent pid and process group, once it has its handlers."""
        self.wait_for(self.ready.exists, "the command")
        pid, ppid, pgid = map(int, self.ready.read_text().split())
        self.command = [psutil.Process(pid)]
        if ppid != self.proc.pid and psutil.pid_exists(ppid):
            self.command.append(psutil.Process(ppid))  # the sh wrapper
        return pid, ppid, pgid

    def wait_until_passed_on(self) -> None:
        """The recorder got a signal, and launch has logged passing it on (SIGKILL in ...)."""
        self.wait_for(self.signals, "the signal to reach the command")
        self.wait_for(lambda: "SIGKILL in" in self.stderr, "launch to pass the signal on")

    def release(self) -> int:
        """Let the recorder exit; launch's exit code."""
        self.command[0].send_signal(signal.SIGUSR1)
        return self.proc.wait(timeout=DEADLINE)

    def close(self) -> None:
        end_launch(self.proc, self.command)
        still_alive(self.command, timeout=10)


@pytest.fixture
def launches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[Launch]]:
    clear_verirl_env(monkeypatch, tmp_path)
    started: list[Launch] = []
    yield started
    for launch in started:
        launch.close()


def _send(launch: Launch, sig: signal.Signals, target: str) -> None:
    if target == "group":  # what a terminal's Ctrl-C does: every process of launch's group
        os.killpg(launch.proc.pid, sig)
    else:  # kill -INT <pid>, as Modal and Kubernetes signal a container's main process
        launch.proc.send_signal(sig)


@pytest.mark.parametrize("target", ["group", "pid"])
@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_the_command_gets_each_signal_exactly_once(
    tmp_path: Path, launches: list[Launch], sig: signal.Signals, target: str
) -> None:
    launch = Launch(tmp_path)
    launches.append(launch)
    pid, ppid, pgid = launch.wait_until_running()
    session = os.getsid(pid)
    _send(launch, sig, target)
    launch.wait_until_passed_on()
    code = launch.release()
    assert launch.signals() == [sig.name], launch.stderr
    assert code == 128 + sig, launch.stderr
    assert "Traceback" not in launch.stderr
    assert ppid == launch.proc.pid
    assert pgid == pid != launch.proc.pid  # a group of its own (launch leads its session's)
    assert session == launch.proc.pid  # in launch's session: the terminal stays its terminal


@pytest.mark.parametrize("target", ["group", "pid"])
def test_a_shell_wrappers_python_gets_the_signal_exactly_once(
    tmp_path: Path, launches: list[Launch], target: str
) -> None:
    launch = Launch(tmp_path, wrapped=True)
    launches.append(launch)
    _, ppid, _ = launch.wait_until_running()
    assert ppid != launch.proc.pid  # sh is in between
    _send(launch, signal.SIGINT, target)
    launch.wait_until_passed_on()
    code = launch.release()
    assert launch.signals() == ["SIGINT"], launch.stderr
    assert code == 130, launch.stderr
    assert not still_alive(launch.command, timeout=10)


def test_a_shell_wrapper_that_dies_of_sigterm_still_lets_its_python_finish_within_the_grace(
    tmp_path: Path, launches: list[Launch]
) -> None:
    """Kubernetes' SIGTERM kills a plain ``sh`` at once: launch waits for its python too."""
    launch = Launch(tmp_path, wrapped=True)
    launches.append(launch)
    launch.wait_until_running()
    shell = launch.command[1]
    launch.proc.send_signal(signal.SIGTERM)
    launch.wait_until_passed_on()
    assert not still_alive([shell], timeout=DEADLINE)  # sh (no trap) died of it
    assert launch.proc.poll() is None, launch.stderr  # launch waits for the python saving
    code = launch.release()
    assert launch.signals() == ["SIGTERM"], launch.stderr
    assert code == 143, launch.stderr
    assert not still_alive(launch.command, timeout=10)


@pytest.mark.parametrize("target", ["group", "pid"])
def test_a_second_sigint_in_the_grace_kills_the_whole_command_at_once(
    tmp_path: Path, launches: list[Launch], target: str
) -> None:
    launch = Launch(tmp_path, wrapped=True, flags=("--shutdown-timeout", "300"))
    launches.append(launch)
    launch.wait_until_running()
    _send(launch, signal.SIGINT, target)
    launch.wait_until_passed_on()
    _send(launch, signal.SIGINT, target)  # the recorder is still "saving": not released
    second = time.monotonic()
    code = launch.proc.wait(timeout=DEADLINE)
    assert time.monotonic() - second < 10, launch.stderr  # not the 300 s grace
    assert code == 128 + signal.SIGKILL, launch.stderr
    assert "interrupted again" in launch.stderr
    assert not still_alive(launch.command, timeout=10), launch.stderr  # sh and python
    assert launch.signals() == ["SIGINT"], launch.stderr


DROPPED_IN_DEL = """
import pathlib, time
from verirl import _supervise

_sleep = time.sleep


class _SleepsWhenCollected:
    def __init__(self, seconds):
        self.seconds = seconds

    def __del__(self):
        pathlib.Path({waiting!r}).touch()
        _sleep(max(self.seconds, 1.0))


class _Time:
    monotonic = staticmethod(time.monotonic)
    time = staticmethod(time.time)

    @staticmethod
    def sleep(seconds):
        _SleepsWhenCollected(seconds)


_supervise.time = _Time
"""
"""Launch's grace waits inside a ``__del__``, where CPython drops what a signal handler raises.

Any collection in launch's main thread can run a finalizer as the signal is
checked ("Exception ignored in ..."): the wait spends nearly all its time in
one here (the test signals it once ``waiting`` exists), so the second signal's
exception is dropped as it would be.
"""


@pytest.mark.parametrize("second", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_second_signal_whose_exception_is_dropped_still_ends_the_grace(
    tmp_path: Path, launches: list[Launch], second: signal.Signals
) -> None:
    waiting = tmp_path / "waiting"
    prelude = DROPPED_IN_DEL.format(waiting=str(waiting))
    launch = Launch(tmp_path, flags=("--shutdown-timeout", "300"), prelude=prelude)
    launches.append(launch)
    launch.wait_until_running()
    launch.proc.send_signal(signal.SIGINT)
    launch.wait_until_passed_on()
    launch.wait_for(waiting.exists, "launch to wait inside a __del__")
    launch.proc.send_signal(second)  # the recorder is still "saving": not released
    code = launch.proc.wait(timeout=DEADLINE)  # not the 300 s grace
    assert code == 128 + signal.SIGKILL, launch.stderr
    assert "interrupted again" in launch.stderr
    assert not still_alive(launch.command, timeout=10), launch.stderr
    assert launch.signals() == ["SIGINT"], launch.stderr


def test_what_stays_in_the_group_after_the_grace_is_sigkilled(
    tmp_path: Path, launches: list[Launch]
) -> None:
    """sh dies of SIGTERM at once; its python saves for longer than the grace: SIGKILL."""
    launch = Launch(tmp_path, wrapped=True, flags=("--shutdown-timeout", "1"))
    launches.append(launch)
    launch.wait_until_running()
    launch.proc.send_signal(signal.SIGTERM)
    code = launch.proc.wait(timeout=DEADLINE)  # the recorder is never released
    assert code == 143, launch.stderr  # sh's own code: it died of SIGTERM
    assert "outlived its 1s grace: sending SIGKILL" in launch.stderr
    assert not still_alive(launch.command, timeout=10), launch.stderr
    assert launch.signals() == ["SIGTERM"], launch.stderr


def test_a_hang_up_is_taken_for_a_sigterm_and_passed_on_once(
    tmp_path: Path, launches: list[Launch]
) -> None:
    # a closed terminal or a dropped ssh: by default SIGHUP killed launch with no teardown
    launch = Launch(tmp_path)
    launches.append(launch)
    launch.wait_until_running()
    launch.proc.send_signal(signal.SIGHUP)
    launch.wait_until_passed_on()
    code = launch.release()
    assert launch.signals() == ["SIGTERM"], launch.stderr
    assert code == 128 + signal.SIGTERM, launch.stderr
    assert "Traceback" not in launch.stderr


def test_a_command_that_left_its_process_group_is_still_signalled() -> None:
    # Started without a group of its own: no process group has its pid as id.
    with subprocess.Popen(
        [sys.executable, "-c", "import threading; threading.Event().wait(60)"]
    ) as child:
        assert _stop_command(child, signal.SIGTERM, grace=DEADLINE) == -signal.SIGTERM
    done = subprocess.Popen([sys.executable, "-c", "pass"])
    assert done.wait(timeout=DEADLINE) == 0
    assert _stop_command(done, signal.SIGTERM, grace=DEADLINE) == 0  # ended already: no signal


def test_a_second_sigterm_in_the_grace_is_ignored_and_not_passed_on(
    tmp_path: Path, launches: list[Launch]
) -> None:
    """The one SIGTERM policy: a second SIGTERM lets the save in progress finish."""
    launch = Launch(tmp_path, flags=("--shutdown-timeout", "300"))
    launches.append(launch)
    launch.wait_until_running()
    launch.proc.send_signal(signal.SIGTERM)
    launch.wait_until_passed_on()
    launch.proc.send_signal(signal.SIGTERM)
    launch.wait_for(lambda: "SIGTERM received again" in launch.stderr, "the second SIGTERM")
    code = launch.release()
    assert code == 143, launch.stderr
    assert launch.signals() == ["SIGTERM"], launch.stderr


ANOTHER_THREAD_TAKES_IT = """
import signal, sys, threading, time
from pathlib import Path
started = Path(sys.argv[1])

def take_it():  # the kernel may hand a process-directed signal to any thread
    deadline = time.monotonic() + 60
    while not started.exists() and time.monotonic() < deadline:
        time.sleep(0.01)
    signal.pthread_kill(threading.get_ident(), signal.SIGTERM)

threading.Thread(target=take_it, daemon=True).start()
sys.argv = ["verirl", "launch", "--gpus", "1", "--mode", "colocate", "--shutdown-timeout", "20",
            "--", sys.executable, "-c",
            f"import pathlib, time; pathlib.Path({str(started)!r}).touch(); time.sleep(120)"]
from verirl.__main__ import run
sys.exit(run())
"""


def test_a_sigterm_another_thread_of_launch_takes_is_still_passed_on(tmp_path: Path) -> None:
    """Python runs the handler in the main thread, which waits for the command: not forever."""
    started = tmp_path / "started"
    begun = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-c", ANOTHER_THREAD_TAKES_IT, str(started)],
        capture_output=True, text=True, timeout=110, check=False,
    )  # fmt: skip
    took = time.monotonic() - begun
    assert result.returncode == 143, result.stderr[-2000:]
    assert started.exists()
    assert took < 60, (took, result.stderr[-2000:])  # the command sleeps 120 s unless signalled
    assert "passed SIGTERM on to the training command" in result.stderr


def test_a_sigterm_while_what_the_command_left_has_its_grace_lets_that_grace_run(
    tmp_path: Path, launches: list[Launch]
) -> None:
    """The leftovers have their SIGTERM already: a preemption now neither kills them nor
    changes launch's exit code, which stays the command's."""
    launch = Launch(tmp_path, left_behind=True, flags=("--shutdown-timeout", "300"))
    launches.append(launch)
    launch.wait_until_running()
    launch.wait_for(launch.signals, "the leftover to get its SIGTERM")
    launch.wait_for(lambda: "left 1 process(es) running" in launch.stderr, "launch's report")
    launch.proc.send_signal(signal.SIGTERM)
    launch.wait_for(lambda: "its grace goes on" in launch.stderr, "launch to note the SIGTERM")
    assert launch.command[0].is_running(), launch.stderr
    code = launch.release()
    assert code == 3, launch.stderr
    assert launch.signals() == ["SIGTERM"], launch.stderr
    assert "SIGKILL to" not in launch.stderr


def test_a_ctrl_c_while_what_the_command_left_has_its_grace_kills_it_and_keeps_the_code(
    tmp_path: Path, launches: list[Launch]
) -> None:
    launch = Launch(tmp_path, left_behind=True, flags=("--shutdown-timeout", "300"))
    launches.append(launch)
    launch.wait_until_running()
    launch.wait_for(lambda: "left 1 process(es) running" in launch.stderr, "launch's report")
    launch.wait_for(launch.signals, "the leftover to get its SIGTERM")
    launch.proc.send_signal(signal.SIGINT)
    code = launch.proc.wait(timeout=DEADLINE)
    assert code == 3, launch.stderr
    assert "interrupted: sending SIGKILL to what the training command left" in launch.stderr
    assert not still_alive(launch.command, timeout=10), launch.stderr
    assert launch.signals() == ["SIGTERM"], launch.stderr


CTRL_C_IN_DEL = """
import os, signal, sys, threading, time
from verirl.__main__ import _unraisable
sys.unraisablehook = _unraisable(sys.unraisablehook)


class SleepsWhenCollected:
    def __del__(self):
        threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGINT)).start()
        time.sleep(30)  # the SIGINT ends it, and its KeyboardInterrupt is dropped


try:
    SleepsWhenCollected()
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        time.sleep(0.01)
    print("lost")
except KeyboardInterrupt:
    print("raised")
"""


def test_a_ctrl_c_dropped_in_a_finalizer_is_raised_again_where_it_can_be() -> None:
    """`verirl.__main__`'s unraisable hook sends it again: not into the hook, where it is lost."""
    result = subprocess.run(
        [sys.executable, "-c", CTRL_C_IN_DEL], capture_output=True, text=True, timeout=60,
        check=False,
    )  # fmt: skip
    assert result.stdout.split() == ["raised"], result.stderr
    assert "Exception ignored" not in result.stderr


SELECT_IN_DEL = """
import pathlib, select as _select, types
from verirl import _supervise


class _SelectsWhenCollected:
    def __init__(self, args):
        self.args = args

    def __del__(self):
        pathlib.Path({waiting!r}).touch()
        _select.select(*self.args)


def _select_in_del(*args):
    _SelectsWhenCollected(args)
    return [], [], []


_supervise.select = types.SimpleNamespace(select=_select_in_del)
"""
"""Launch waits for its command inside a ``__del__``, where CPython drops a handler's exception."""


def test_a_sigterm_whose_exit_python_dropped_still_reaches_the_command(
    tmp_path: Path, launches: list[Launch]
) -> None:
    """The unraisable hook keeps the SIGTERM's SystemExit; launch's next wake-up raises it."""
    waiting = tmp_path / "waiting"
    prelude = SELECT_IN_DEL.format(waiting=str(waiting))
    launch = Launch(tmp_path, flags=("--shutdown-timeout", "300"), prelude=prelude)
    launches.append(launch)
    launch.wait_until_running()
    launch.wait_for(waiting.exists, "launch to wait inside a __del__")
    launch.proc.send_signal(signal.SIGTERM)
    launch.wait_until_passed_on()
    assert launch.release() == 143, launch.stderr
    assert launch.signals() == ["SIGTERM"], launch.stderr


PHASES_WAIT_IN_DEL = """
import concurrent.futures, os, signal, sys, threading, time, types
from verirl import _phases
from verirl.__main__ import _unraisable
from verirl._signals import exit_on_sigterm

sys.unraisablehook = _unraisable(sys.unraisablehook)
signal.signal(signal.SIGTERM, signal.SIG_DFL)  # as verirl.__main__ sets coverage's handler aside
_wait = concurrent.futures.wait


_timer = threading.Timer(0.2, os.kill, (os.getpid(), signal.SIGTERM))


class _WaitsWhenCollected:
    def __init__(self, args, kwargs):
        self.args, self.kwargs = args, kwargs

    def __del__(self):
        if not _timer.is_alive() and not _timer.finished.is_set():  # one SIGTERM, in here
            _timer.start()
        _wait(*self.args, **self.kwargs)


def _wait_in_del(*args, **kwargs):
    _WaitsWhenCollected(args, kwargs)
    return set(), set(args[0])


futures = types.SimpleNamespace(wait=_wait_in_del, Future=concurrent.futures.Future)
_phases.concurrent = types.SimpleNamespace(futures=futures)
with exit_on_sigterm():
    phases = _phases.Phases(time.monotonic())
    phases.submit("slow", time.sleep, 30)
    begun = time.monotonic()
    try:
        phases.wait()
    except SystemExit as exc:
        print("exit", exc.code, round(time.monotonic() - begun), flush=True)
"""


def test_a_sigterm_whose_exit_python_dropped_still_ends_the_start_up_wait() -> None:
    result = subprocess.run(
        [sys.executable, "-c", PHASES_WAIT_IN_DEL], capture_output=True, text=True, timeout=60,
        check=False,
    )  # fmt: skip
    assert result.stdout.split() == ["exit", "143", "0"], (result.returncode, result.stderr)
    assert result.returncode == 0, result.stderr


SIGNAL_RECORDING_SERVER = """
import http.server, os, signal, sys, threading, time
port = int(sys.argv[sys.argv.index("--port") + 1])
record = sys.argv[1]
got = []
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})  # for every thread

def note():  # each signal with its sender's pid: the kernel's death signal names the dead parent
    while True:
        info = signal.sigwaitinfo({signal.SIGTERM, signal.SIGINT})
        with open(record, "a") as sink:
            sink.write(f"{signal.Signals(info.si_signo).name} {info.si_pid}\\n")
        got.append(info.si_signo)

threading.Thread(target=note, daemon=True).start()

class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass

server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Health)
threading.Thread(target=server.serve_forever, daemon=True).start()
while not got:
    time.sleep(0.01)
time.sleep(1.0)  # a graceful shutdown takes a while: a second signal would land now
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_vllm_server_that_serve_runs_inside_the_command_gets_one_signal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sig: signal.Signals
) -> None:
    """serve stops its own server on the signal: launch leaves the server to it."""
    clear_verirl_env(monkeypatch, tmp_path)
    server = tmp_path / "server.py"
    server.write_text(SIGNAL_RECORDING_SERVER)
    record, port = tmp_path / "signals", unshared_port()
    (tmp_path / "logs").mkdir()
    serve = shlex.join([
        sys.executable, "-m", "verirl", "serve", "--gpus", "2", "--model", "m",
        "--vllm-port", str(port), "--log-dir", str(tmp_path / "logs"),
        "--vllm-command", shlex.join([sys.executable, str(server), str(record)]),
    ])  # fmt: skip
    with (tmp_path / "launch.err").open("w") as sink:
        launch = subprocess.Popen(
            [sys.executable, "-m", "verirl", "launch", "--gpus", "1", "--", "sh", "-c",
             f"unset CUDA_VISIBLE_DEVICES; exec {serve}"],
            stdout=subprocess.DEVNULL, stderr=sink, start_new_session=True,
        )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while "is ready after" not in (tmp_path / "launch.err").read_text():
            assert launch.poll() is None, (tmp_path / "launch.err").read_text()
            assert time.monotonic() < deadline, (tmp_path / "launch.err").read_text()
            psutil.wait_procs([], timeout=0.05)
        launch.send_signal(sig)
        launch.wait(timeout=60)
    finally:
        if launch.poll() is None:
            os.killpg(launch.pid, signal.SIGKILL)
            launch.wait()
    lines = record.read_text().splitlines() if record.exists() else []
    assert len(lines) == 1, (lines, (tmp_path / "launch.err").read_text())


def test_a_dropped_second_ctrl_c_has_one_effect_and_launchs_server_shuts_down_whole(
    tmp_path: Path, launches: list[Launch], monkeypatch: pytest.MonkeyPatch
) -> None:
    """The grace's event took the Ctrl-C in: the hook must not send it again into the teardown."""
    monkeypatch.setenv("FAKE_VLLM_SHUTDOWN_DELAY", "2")
    waiting, port = tmp_path / "waiting", unshared_port()
    flags = ("--shutdown-timeout", "300", "--gpus", "2", "--model", "m",
             "--vllm-port", str(port), "--vllm-command", f"{sys.executable} -m fakes.vllm_serve",
             "--log-dir", str(tmp_path))  # fmt: skip
    launch = Launch(tmp_path, flags=flags, prelude=DROPPED_IN_DEL.format(waiting=str(waiting)))
    launches.append(launch)
    launch.wait_until_running()
    launch.proc.send_signal(signal.SIGINT)
    launch.wait_until_passed_on()
    launch.wait_for(waiting.exists, "launch to wait inside a __del__")
    launch.proc.send_signal(signal.SIGINT)
    code = launch.proc.wait(timeout=DEADLINE)
    assert code == 128 + signal.SIGKILL, launch.stderr  # the command's, not 130
    assert "everything torn down" in launch.stderr
    server_log = (tmp_path / f"vllm-serve-{port}.log").read_text()
    assert "Finished server process" in server_log, server_log[-2000:]


OWNER_KILLED = """
import os, signal, sys
from verirl import VLLMServer

server_script, record, port = sys.argv[1], sys.argv[2], int(sys.argv[3])
server = VLLMServer("m", port=port, devices=(0,), startup_timeout=60,
                    command=[sys.executable, server_script, record])
server.start()
os.kill(os.getpid(), signal.SIGKILL)  # as the OOM killer would: no teardown of its own
"""


def test_a_server_whose_owner_died_gets_only_the_kernels_death_signal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """launch finds the server among the command's leftovers: it has had its SIGTERM."""
    clear_verirl_env(monkeypatch, tmp_path)
    server, owner = tmp_path / "server.py", tmp_path / "owner.py"
    server.write_text(SIGNAL_RECORDING_SERVER)
    owner.write_text(OWNER_KILLED)
    record = tmp_path / "signals"
    with (tmp_path / "launch.err").open("w") as sink:
        launch = subprocess.Popen(
            [sys.executable, "-m", "verirl", "launch", "--gpus", "1", "--shutdown-timeout", "20",
             "--", sys.executable, str(owner), str(server), str(record), str(unshared_port())],
            stdout=subprocess.DEVNULL, stderr=sink,
        )  # fmt: skip
    try:
        code = launch.wait(timeout=120)
    finally:
        if launch.poll() is None:
            launch.kill()
            launch.wait()
    stderr = (tmp_path / "launch.err").read_text()
    assert code == 128 + signal.SIGKILL, stderr
    senders = [int(line.split()[1]) for line in record.read_text().splitlines()]
    # The kernel may send the death signal more than once (at each reparenting as the dead
    # owner's threads exit): none of them is launch's.
    assert senders, stderr
    assert launch.pid not in senders, (senders, stderr)


SAVER = """
import os, signal, sys, threading
record, ready = sys.argv[1], sys.argv[2]
def save(signum, _frame):
    with open(record, "a") as sink:
        sink.write(signal.Signals(signum).name + "\\n")
    sys.exit(0)  # saved: exits of its own
signal.signal(signal.SIGTERM, save)
signal.signal(signal.SIGINT, save)
open(ready, "w").close()
threading.Event().wait(300)
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_stopped_command_is_woken_to_act_on_the_signal_within_the_grace(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sig: signal.Signals
) -> None:
    """A command stopped (SIGSTOP, or SIGTTIN for a read from the terminal) saves all the
    same: it got the signal and SIGCONT, not the whole grace and then SIGKILL."""
    clear_verirl_env(monkeypatch, tmp_path)
    script, record, ready = tmp_path / "saver.py", tmp_path / "signals", tmp_path / "ready"
    script.write_text(textwrap.dedent(SAVER))
    with (tmp_path / "launch.err").open("w") as sink:
        launch = subprocess.Popen(
            [sys.executable, "-m", "verirl", "launch", "--gpus", "1", "--shutdown-timeout",
             "600", "--", sys.executable, str(script), str(record), str(ready)],
            stdout=subprocess.DEVNULL, stderr=sink,
        )  # fmt: skip
    command: list[psutil.Process] = []
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert launch.poll() is None, (tmp_path / "launch.err").read_text()
            assert time.monotonic() < deadline, "the command never got ready"
            psutil.wait_procs([], timeout=0.02)
        command += psutil.Process(launch.pid).children()
        (saver,) = command
        saver.suspend()  # SIGSTOP
        while saver.status() != psutil.STATUS_STOPPED:
            assert time.monotonic() < deadline, "SIGSTOP never stopped the command"
            psutil.wait_procs([], timeout=0.01)
        launch.send_signal(sig)
        code = launch.wait(timeout=120)  # far less than the grace
    finally:
        for process in [launch, *command]:
            with contextlib.suppress(psutil.Error, OSError):
                process.kill()
    stderr = (tmp_path / "launch.err").read_text()
    assert record.read_text().split() == [sig.name], stderr
    assert "outlived" not in stderr, stderr
    assert code in (0, 128 + sig), stderr


TWO_IN_DEL = """
import signal, sys, time
from verirl.__main__ import _unraisable
from verirl._signals import SIGTERM_POLICY, raise_if_dropped
sys.unraisablehook = _unraisable(sys.unraisablehook)
signal.signal(signal.SIGINT, signal.default_int_handler)
signal.signal(signal.SIGTERM, signal.SIG_DFL)  # coverage's own handler out of the way


class DroppedWhenCollected:
    def __del__(self):
        try:
            SIGTERM_POLICY.handle(signal.SIGTERM, sys._getframe())  # SystemExit(143), fired
        finally:
            raise KeyboardInterrupt  # a Ctrl-C whose handler ran as that exit unwound


came = []
with SIGTERM_POLICY.held():
    DroppedWhenCollected()
    deadline = time.monotonic() + 5
    while len(came) < 2 and time.monotonic() < deadline:
        try:
            time.sleep(0.01)
            raise_if_dropped()
        except BaseException as exc:
            came.append(type(exc).__name__)
print(came)
"""


def test_two_signals_dropped_together_in_a_finalizer_are_both_raised_again() -> None:
    """The unraisable hook reads the whole chain (review of 07089a3, finding 4).

    It saw only the Ctrl-C and sent it again; the SIGTERM's exit under it was
    lost with the policy already fired, and launch passed on SIGINT alone.
    """
    result = subprocess.run(
        [sys.executable, "-c", TWO_IN_DEL], capture_output=True, text=True, timeout=60,
        check=False,
    )  # fmt: skip
    assert result.stdout.split("\n")[0] == "['SystemExit', 'KeyboardInterrupt']", result.stderr
    assert "Exception ignored" not in result.stderr


DROPPED_WHILE_HANDLING = """
import os, signal, sys, time
from verirl import _signals
from verirl.__main__ import _unraisable
from verirl._signals import raise_if_dropped
sys.unraisablehook = _unraisable(sys.unraisablehook)
signal.signal(signal.SIGTERM, signal.SIG_DFL)  # coverage's own handler out of the way
ctrl_c = []
signal.signal(signal.SIGINT, lambda *_: ctrl_c.append("SIGINT"))
_signals._PROGRAM_RECEIVED.append(signal.SIGTERM)  # a SIGTERM came: its exit may be lost


class Raises:
    def __init__(self, error):
        self.error = error

    def __del__(self):
        raise self.error


again = []
try:
    raise KeyboardInterrupt  # the Ctrl-C the program handles
except KeyboardInterrupt:
    Raises(SystemExit(143))  # dropped: its context is the live Ctrl-C, not a dropped one
    until = time.monotonic() + 0.5
    while time.monotonic() < until:
        time.sleep(0.01)
try:
    raise SystemExit(143)
except SystemExit as live:
    Raises(KeyboardInterrupt())
    try:
        raise_if_dropped()  # the first finalizer's SystemExit, kept
    except SystemExit as exc:
        again.append(exc is live)
    try:
        raise_if_dropped()  # nothing more: the live one was never dropped
    except SystemExit as exc:
        again.append(exc is live)
    until = time.monotonic() + 0.5
    while time.monotonic() < until:
        time.sleep(0.01)
print(ctrl_c, again)
"""


def test_the_exception_a_program_handles_is_not_taken_for_a_dropped_one() -> None:
    """The hook's walk stops at the live exception (review of 137b3de).

    A finalizer's exception has the exception being handled as its context:
    walking into it sent a ghost Ctrl-C, and raised the live SIGTERM again.
    """
    result = subprocess.run(
        [sys.executable, "-c", DROPPED_WHILE_HANDLING], capture_output=True, text=True,
        timeout=60, check=False,
    )  # fmt: skip
    # one Ctrl-C: the second finalizer's own, sent again; the live exit is not raised again
    assert result.stdout.split("\n")[0] == "['SIGINT'] [False]", result.stderr

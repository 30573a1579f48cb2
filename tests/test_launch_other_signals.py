"""Every other signal whose default ends a process (SIGUSR1, SIGQUIT, ...) while verirl runs.

``verirl launch`` installed handlers for SIGINT, SIGTERM and SIGHUP only: a
SIGUSR1 (SLURM's ``--signal=USR1@60``) or a SIGQUIT killed launch on the
spot, its command got no signal from it (the kernel's death signal alone,
sometimes twice), and a daemon of the command ran on. Now, while the command
runs, launch passes such a signal on to each process of the command once per
arrival and goes on, ending with the command's code; before the command
starts, and in every other command (``serve``), it is a SIGTERM: the teardown,
exit 143, and no vLLM server left behind.

Real processes throughout: ``python -m verirl launch`` of a recorder that
appends each signal it gets (with its pid) to a file and daemonizes a copy of
itself (fork, ``setsid``, fork) in a session of its own.
"""

from __future__ import annotations

import contextlib
import json
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

from _support import clear_verirl_env, end_launch, kill_all, naming, still_alive, unshared_port

ROOT = Path(__file__).resolve().parents[1]
"""This checkout: its ``verirl`` is the one the processes run (not another editable install)."""
DEADLINE = 30.0
"""Seconds any one awaited event may take (a loaded CI machine starts Pythons slowly)."""

RECORDER = """
import os, signal, sys, threading, time
record, ready, role = sys.argv[1], sys.argv[2], sys.argv[3]
stop = threading.Event()
NAMES = ("SIGINT", "SIGTERM", "SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGALRM")

def note(signum, _frame):
    with open(record, "a") as sink:
        sink.write(f"{os.getpid()} {signal.Signals(signum).name}\\n")
    if signum == signal.SIGINT or (signum == signal.SIGTERM and not role.endswith("slow")):
        stop.set()  # "-slow": a SIGTERM is a preemption to save through, a SIGINT ends it

for name in NAMES:
    signal.signal(getattr(signal, name), note)
signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT, signal.SIGTERM})
if role.startswith("command"):  # the classic daemon: fork, setsid, fork; the middle exits
    middle = os.fork()
    if middle == 0:
        os.setsid()
        if os.fork() == 0:
            daemon = [sys.executable, __file__, record, ready + ".daemon", "daemon" + role[7:]]
            os.execv(sys.executable, daemon)
        os._exit(0)
    os.waitpid(middle, 0)
    deadline = time.monotonic() + 60
    while not os.path.exists(ready + ".daemon") and time.monotonic() < deadline:
        time.sleep(0.01)
    if role == "command-dies":  # the signal's default: the command dies of it
        for name in NAMES[2:]:
            signal.signal(getattr(signal, name), signal.SIG_DFL)
with open(ready + ".tmp", "w") as sink:
    sink.write(str(os.getpid()))
os.replace(ready + ".tmp", ready)
stop.wait(300)
sys.exit(7 if role.startswith("command") else 0)
"""


def _clear_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """`clear_verirl_env`, and this checkout first on the processes' ``PYTHONPATH``."""
    clear_verirl_env(monkeypatch, tmp_path)
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    )


class Launch:
    """``verirl launch`` of the recorder, in a session of its own."""

    def __init__(self, tmp_path: Path, role: str, *, nested: bool = False) -> None:
        self.tmp_path = tmp_path
        script = tmp_path / "recorder.py"
        script.write_text(textwrap.dedent(RECORDER))
        self.record = tmp_path / "signals"
        self.ready = tmp_path / "ready"
        self.stderr_path = tmp_path / "launch.err"
        launch = [
            sys.executable,
            "-m",
            "verirl",
            "launch",
            "--gpus",
            "1",
            "--shutdown-timeout",
            "20",
        ]
        if nested:  # the recorder in the inner launch's command: the inner one passes it on
            launch = [*launch, "--", *launch]
        argv = [*launch, "--", sys.executable, str(script), str(self.record), str(self.ready), role]
        with self.stderr_path.open("w") as sink:  # a file: an orphan holding a pipe cannot hang us
            self.proc = subprocess.Popen(
                argv, stdout=subprocess.DEVNULL, stderr=sink, start_new_session=True
            )
        self.command = 0
        self.daemon = 0

    @property
    def stderr(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def got(self, pid: int) -> list[str]:
        """The signals process ``pid`` recorded, in order."""
        if not self.record.exists():
            return []
        lines = [line.split() for line in self.record.read_text().splitlines()]
        return [name for who, name in lines if int(who) == pid]

    def wait_for(self, condition: Callable[[], object], what: str) -> None:
        deadline = time.monotonic() + DEADLINE
        while not condition():
            assert self.proc.poll() is None, (what, self.proc.returncode, self.stderr)
            assert time.monotonic() < deadline, f"timed out waiting for {what}: {self.stderr}"
            psutil.wait_procs([], timeout=0.02)

    def wait_until_running(self) -> None:
        """The command and its daemon both have their handlers."""
        self.wait_for(self.ready.exists, "the command")
        self.command = int(self.ready.read_text())
        self.daemon = int(Path(f"{self.ready}.daemon").read_text())
        assert os.getsid(self.daemon) != os.getsid(self.command)  # a session of its own

    def close(self) -> None:
        left = naming(str(self.tmp_path))
        end_launch(self.proc, left)
        still_alive(left, timeout=10)


@pytest.fixture
def launches(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Callable[..., Launch]]:
    _clear_env(monkeypatch, tmp_path)
    started: list[Launch] = []

    def start(role: str, *, nested: bool = False) -> Launch:
        launch = Launch(tmp_path, role, nested=nested)
        started.append(launch)
        return launch

    yield start
    for launch in started:
        launch.close()


@pytest.mark.parametrize(
    "sig", [signal.SIGUSR1, signal.SIGQUIT, signal.SIGUSR2, signal.SIGALRM], ids=lambda s: s.name
)
def test_a_signal_to_launch_reaches_each_process_of_the_command_once_per_arrival(
    launches: Callable[..., Launch], sig: signal.Signals
) -> None:
    launch = launches("command")
    launch.wait_until_running()
    for count in (1, 2):  # two arrivals: each passed on once
        launch.proc.send_signal(sig)
        for pid in (launch.command, launch.daemon):
            launch.wait_for(
                lambda pid=pid, count=count: launch.got(pid).count(sig.name) >= count,
                f"{sig.name} #{count} to reach {pid}",
            )
        assert launch.proc.poll() is None, launch.stderr  # launch goes on
    os.kill(launch.command, signal.SIGTERM)  # the command exits on its own (7) ...
    code = launch.proc.wait(timeout=DEADLINE * 2)
    assert code == 7, launch.stderr  # ... and launch with its code
    assert launch.got(launch.command) == [sig.name, sig.name, "SIGTERM"], launch.stderr
    # the daemon: each signal once, then SIGTERM once as what the command left running
    assert launch.got(launch.daemon) == [sig.name, sig.name, "SIGTERM"], launch.stderr
    assert not naming(str(launch.tmp_path)), launch.stderr  # nothing outlives launch


def test_a_signal_to_an_outer_launch_reaches_a_nested_launchs_command_once(
    launches: Callable[..., Launch],
) -> None:
    launch = launches("command", nested=True)
    launch.wait_until_running()
    launch.proc.send_signal(signal.SIGUSR1)
    for pid in (launch.command, launch.daemon):
        launch.wait_for(lambda pid=pid: "SIGUSR1" in launch.got(pid), f"SIGUSR1 to reach {pid}")
    assert launch.proc.poll() is None, launch.stderr
    os.kill(launch.command, signal.SIGTERM)  # the inner command exits 7, so do both launches
    code = launch.proc.wait(timeout=DEADLINE * 2)
    assert code == 7, launch.stderr
    # once: from the inner launch alone (the outer one leaves them to it)
    assert launch.got(launch.command) == ["SIGUSR1", "SIGTERM"], launch.stderr
    assert launch.got(launch.daemon) == ["SIGUSR1", "SIGTERM"], launch.stderr
    assert not naming(str(launch.tmp_path)), launch.stderr


def test_a_signal_during_a_sigterm_grace_is_passed_on_once_and_the_grace_goes_on(
    launches: Callable[..., Launch],
) -> None:
    launch = launches("command-slow")  # saves through SIGTERM; a SIGINT ends it
    launch.wait_until_running()
    launch.proc.send_signal(signal.SIGTERM)  # a preemption: the grace begins
    for pid in (launch.command, launch.daemon):
        launch.wait_for(lambda pid=pid: "SIGTERM" in launch.got(pid), f"SIGTERM to reach {pid}")
    launch.proc.send_signal(signal.SIGUSR1)
    for pid in (launch.command, launch.daemon):
        launch.wait_for(lambda pid=pid: "SIGUSR1" in launch.got(pid), f"SIGUSR1 to reach {pid}")
    assert launch.proc.poll() is None, launch.stderr  # the grace goes on
    for pid in (launch.daemon, launch.command):  # the save is done
        os.kill(pid, signal.SIGINT)
    code = launch.proc.wait(timeout=DEADLINE * 2)
    assert code == 7, launch.stderr  # the command's code, as after any signal passed on
    assert launch.got(launch.command) == ["SIGTERM", "SIGUSR1", "SIGINT"], launch.stderr
    assert launch.got(launch.daemon) == ["SIGTERM", "SIGUSR1", "SIGINT"], launch.stderr
    assert "outlived" not in launch.stderr
    assert not naming(str(launch.tmp_path)), launch.stderr


def test_a_signal_sent_with_a_preemption_reaches_the_command_once(
    launches: Callable[..., Launch],
) -> None:
    """SLURM's USR1 and a SIGTERM at once: both reach every process of the command, once.

    The SIGTERM's exception once landed in the look at the process table that
    was passing the USR1 on, and the USR1, already taken off the queue, was
    lost (review of 07089a3: 5 runs in 6 on 3.11). Which of the two the
    command sees first is the kernel's choice (each may go to another thread).
    """
    launch = launches("command-slow")  # saves through SIGTERM; a SIGINT ends it
    launch.wait_until_running()
    launch.proc.send_signal(signal.SIGUSR1)
    launch.proc.send_signal(signal.SIGTERM)
    both = {"SIGUSR1", "SIGTERM"}
    for pid in (launch.command, launch.daemon):
        launch.wait_for(lambda pid=pid: both <= set(launch.got(pid)), f"both to reach {pid}")
    for pid in (launch.daemon, launch.command):  # the save is done
        os.kill(pid, signal.SIGINT)
    code = launch.proc.wait(timeout=DEADLINE * 2)
    assert code == 7, launch.stderr
    for pid in (launch.command, launch.daemon):
        assert sorted(launch.got(pid)) == ["SIGINT", "SIGTERM", "SIGUSR1"], launch.stderr
    assert not naming(str(launch.tmp_path)), launch.stderr


def test_signals_to_pass_on_stay_queued_when_the_look_is_interrupted():
    """A Ctrl-C in the look at the process table loses none of the signals queued."""
    from verirl._supervise import _Command, _Forwarding

    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    forwarding = _Forwarding()
    try:

        class Interrupted(_Command):
            def collect(self):
                raise KeyboardInterrupt

        command = Interrupted(child, "no-marker", time.time())
        command.forwarding = forwarding
        forwarding._handle(signal.SIGUSR1, None)
        forwarding._handle(signal.SIGQUIT, None)
        with pytest.raises(KeyboardInterrupt):
            command.forward_queued()
        assert forwarding.take() == [signal.SIGUSR1, signal.SIGQUIT]
    finally:
        forwarding.close()
        child.kill()
        child.wait()


def test_a_command_that_dies_of_the_signal_gives_its_code_and_leaves_nothing(
    launches: Callable[..., Launch],
) -> None:
    launch = launches("command-dies")
    launch.wait_until_running()
    launch.proc.send_signal(signal.SIGUSR1)
    code = launch.proc.wait(timeout=DEADLINE * 2)
    assert code == 128 + signal.SIGUSR1, launch.stderr  # the command's code, launch alive to see it
    assert launch.got(launch.command) == [], launch.stderr  # died of it, unrecorded
    assert launch.got(launch.daemon) == ["SIGUSR1", "SIGTERM"], launch.stderr
    assert not naming(str(launch.tmp_path)), launch.stderr


SERVER = """
import os, signal, sys, threading, time
# A vLLM server that never gets healthy: it notes that it runs, and each SIGTERM/SIGINT.
record, started = sys.argv[1], sys.argv[2]
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})
open(started, "w").close()
info = signal.sigwaitinfo({signal.SIGTERM, signal.SIGINT})
with open(record, "a") as sink:
    sink.write(signal.Signals(info.si_signo).name + "\\n")
"""

HEALTHY_SERVER = """
import http.server, os, signal, sys, threading
port = int(sys.argv[sys.argv.index("--port") + 1])
record = sys.argv[1]
signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM, signal.SIGINT})

class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass

server = http.server.ThreadingHTTPServer(("127.0.0.1", port), Health)
threading.Thread(target=server.serve_forever, daemon=True).start()
info = signal.sigwaitinfo({signal.SIGTERM, signal.SIGINT})
with open(record, "a") as sink:
    sink.write(f"{signal.Signals(info.si_signo).name} {info.si_pid}\\n")
"""


def _run_until(
    argv: list[str], stderr: Path, ready: Callable[[], bool], sig: signal.Signals
) -> tuple[int, int]:
    """Run ``argv`` until ``ready()``, send it ``sig``; its pid and exit code (always reaped)."""
    with stderr.open("w") as sink:
        proc = subprocess.Popen(
            argv, stdout=subprocess.DEVNULL, stderr=sink, start_new_session=True
        )
    try:
        deadline = time.monotonic() + 60
        while not ready():
            assert proc.poll() is None, stderr.read_text()
            assert time.monotonic() < deadline, stderr.read_text()
            psutil.wait_procs([], timeout=0.05)
        proc.send_signal(sig)
        return proc.pid, proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()


@pytest.mark.parametrize("sig", [signal.SIGUSR1, signal.SIGQUIT], ids=lambda s: s.name)
def test_a_signal_before_the_command_starts_ends_launch_as_sigterm_does(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sig: signal.Signals
) -> None:
    """During the wait for the vLLM server: exit 143, the server stopped, the command never run."""
    _clear_env(monkeypatch, tmp_path)
    server = tmp_path / "server.py"
    server.write_text(SERVER)
    record, started, ran = tmp_path / "signals", tmp_path / "started", tmp_path / "ran"
    (tmp_path / "logs").mkdir()
    argv = [
        sys.executable, "-m", "verirl", "launch", "--gpus", "2", "--model", "m",
        "--vllm-port", str(unshared_port()), "--log-dir", str(tmp_path / "logs"),
        "--vllm-command", shlex.join([sys.executable, str(server), str(record), str(started)]),
        "--", "touch", str(ran),
    ]  # fmt: skip
    try:
        _, code = _run_until(argv, tmp_path / "launch.err", started.exists, sig)
        assert code == 143, (tmp_path / "launch.err").read_text()
        assert not ran.exists()
        # the server was stopped (its SIGTERM noted), and nothing is left
        assert record.read_text().split() == ["SIGTERM"], (tmp_path / "launch.err").read_text()
        assert not still_alive(naming(str(tmp_path)), timeout=10)
    finally:
        kill_all(naming(str(tmp_path)))


@pytest.mark.parametrize("sig", [signal.SIGUSR1, signal.SIGQUIT], ids=lambda s: s.name)
def test_serve_takes_the_signal_for_a_sigterm_and_stops_its_server(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sig: signal.Signals
) -> None:
    _clear_env(monkeypatch, tmp_path)
    server = tmp_path / "server.py"
    server.write_text(HEALTHY_SERVER)
    record, err = tmp_path / "signals", tmp_path / "serve.err"
    (tmp_path / "logs").mkdir()
    argv = [
        sys.executable, "-m", "verirl", "serve", "--gpus", "2", "--model", "m",
        "--vllm-port", str(unshared_port()), "--log-dir", str(tmp_path / "logs"),
        "--vllm-command", shlex.join([sys.executable, str(server), str(record)]),
    ]  # fmt: skip
    try:
        pid, code = _run_until(argv, err, lambda: "is ready after" in err.read_text(), sig)
        assert code == 143, err.read_text()
        # one SIGTERM, from serve itself (not the kernel's death signal of a dead serve)
        assert record.read_text().split() == ["SIGTERM", str(pid)], err.read_text()
        assert not still_alive(naming(str(tmp_path)), timeout=10)
    finally:
        kill_all(naming(str(tmp_path)))


@pytest.mark.parametrize("sig", [signal.SIGUSR1, signal.SIGQUIT], ids=lambda s: s.name)
def test_any_other_command_takes_the_signal_for_a_sigterm(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, sig: signal.Signals
) -> None:
    """wait-env: 143 and the SIGTERM document at once (naming the signal), not a death by it."""
    _clear_env(monkeypatch, tmp_path)
    err, port = tmp_path / "wait-env.err", unshared_port()
    argv = [
        sys.executable, "-m", "verirl", "--json", "wait-env", f"http://127.0.0.1:{port}",
        "--timeout", "60",
    ]  # fmt: skip
    with err.open("w") as sink, (tmp_path / "out").open("w") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=sink, start_new_session=True)
    try:
        deadline = time.monotonic() + DEADLINE
        while "waiting up to" not in err.read_text():
            assert proc.poll() is None, err.read_text()
            assert time.monotonic() < deadline, err.read_text()
            psutil.wait_procs([], timeout=0.02)
        proc.send_signal(sig)
        code = proc.wait(timeout=DEADLINE)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert code == 143, err.read_text()
    assert json.loads((tmp_path / "out").read_text()) == {  # the signal named as it came
        "error": {"code": 143, "message": f"terminated ({sig.name}, taken for a SIGTERM)"}
    }


def test_forwarding_closed_never_touches_its_pipe_again():
    """close() drains before it closes: a number reused by another thread is never read."""
    from verirl._supervise import _Forwarding

    forwarding = _Forwarding()
    forwarding._handle(signal.SIGUSR1, None)  # one that came as the command ended
    forwarding.close()
    assert (forwarding.wake_read, forwarding.wake_write) == (-1, -1)
    read, write = os.pipe()  # likely the numbers the pipe had
    came: list[int] = []
    before = signal.getsignal(signal.SIGUSR2)
    forwarding.installed[signal.SIGUSR2] = lambda signum, _frame: came.append(signum)
    try:
        os.write(write, b"mine")
        # A late one, its handler left installed (a close cut short): nothing is written
        # anywhere; the handler it replaced takes it (review round 30, H-F7).
        forwarding._handle(signal.SIGUSR2, None)
        assert came == [signal.SIGUSR2]
        assert forwarding.take() == []
        assert os.read(read, 100) == b"mine"
    finally:
        signal.signal(signal.SIGUSR2, before)
        os.close(read)
        os.close(write)


def test_reaping_a_command_the_kernel_holds_ends_at_its_deadline(caplog):
    """A command SIGKILL cannot end (stuck in the kernel): launch logs it and goes, code 137.

    A live process stands in for it here: _reap's wait is what is bounded.
    """
    from verirl._supervise import _reap

    stuck = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        started = time.monotonic()
        assert _reap(stuck, timeout=0.3) == 128 + signal.SIGKILL
        assert time.monotonic() - started < 10
        assert f"(pid {stuck.pid}) survives SIGKILL" in caplog.text
    finally:
        stuck.kill()
        stuck.wait()
    done = subprocess.Popen([sys.executable, "-c", "raise SystemExit(3)"])
    assert _reap(done, timeout=30) == 3


SENT_AS_IT_RETURNS = """
import os, signal, subprocess, sys, time
from verirl._signals import SIGTERM_POLICY, as_sigterm
from verirl._supervise import _Command, _Forwarding

record = sys.argv[1]
child = subprocess.Popen(
    [sys.executable, "-c", sys.argv[2], record], preexec_fn=os.setpgrp  # leads a group
)
deadline = time.monotonic() + 30
while not os.path.exists(record + ".ready") and time.monotonic() < deadline:
    time.sleep(0.01)
os.setpgid(0, child.pid)  # this process joins it: the group's killpg lands here too
signal.signal(signal.SIGTERM, signal.SIG_DFL)  # coverage's own handler out of the way
signal.signal(signal.SIGUSR1, as_sigterm)  # here, the USR1 is an interruption, as it returns
forwarding = _Forwarding()
command = _Command(child, "no-marker", time.time())
command.forwarding = forwarding
came = []
try:
    with SIGTERM_POLICY.held():
        forwarding._handle(signal.SIGUSR1, None)
        for _ in range(2):
            try:
                command.forward_queued()
                until = time.monotonic() + 1  # a handler put off lands in this wait
                while time.monotonic() < until:
                    time.sleep(0.01)
            except SystemExit as exc:
                came.append(exc.code)
finally:
    forwarding.close()
    time.sleep(0.2)
    child.kill()
    child.wait()
print(came, open(record).read().split())
"""

RECORDS_USR1 = """
import signal, sys, time
record = sys.argv[1]
signal.signal(signal.SIGUSR1, lambda *_: open(record, "a").write("USR1\\n"))
open(record, "a").close()
open(record + ".ready", "w").close()
time.sleep(60)
"""


def test_an_interruption_as_a_send_returns_never_has_it_sent_twice(tmp_path):
    """The send and its record are one step (review of f27dfa5): none gets the signal twice.

    Here the group's ``killpg`` reaches this process too, whose handler makes
    the USR1 an interruption: it lands the moment the send returns, before the
    send was noted, and the next wait sent it to the group again.
    """
    done = subprocess.run(
        [sys.executable, "-c", SENT_AS_IT_RETURNS, str(tmp_path / "record"), RECORDS_USR1],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.stdout.strip() == "[143] ['USR1']", done.stderr

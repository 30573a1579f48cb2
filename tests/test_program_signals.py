"""``python -m verirl``: a SIGTERM or Ctrl-C at any moment of its start: 143/130, one document.

Two classes, each run as a real process:

- A SIGTERM whose ``SystemExit`` was lost (``compile()`` during an import with
  no cached bytecode, a finalizer, import machinery swallow it): every command,
  not only serve and launch, ends at once with 143 and the terminated document,
  rather than running to its end (wait-env its whole ``--timeout``) and exiting
  143 after its own document.
- A signal before `verirl.__main__.run` enters its ``try`` (while the module
  imports verirl, or as run prepares): 130 or 143 and one document, not a
  ``KeyboardInterrupt`` traceback or a death by signal.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from _support import clean_environ, nothing_listens, unshared_port

ROOT = Path(__file__).resolve().parents[1]
WAIT_ENV_TIMEOUT = 30.0
"""wait-env's ``--timeout``: the runs below must end long before it."""
BOUND = 15.0
"""Seconds a run may take at most (it takes a fraction of one; room for a loaded machine)."""

MESSAGE = {signal.SIGINT: "interrupted (SIGINT)", signal.SIGTERM: "terminated (SIGTERM)"}


def _environ(tmp_path: Path) -> dict[str, str]:
    return clean_environ(
        tmp_path, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])
    )


def _run(tmp_path: Path, script: str, *args: str) -> tuple[subprocess.CompletedProcess[str], float]:
    begun = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-c", script, *args], capture_output=True, text=True,
        env=_environ(tmp_path), cwd=ROOT, timeout=WAIT_ENV_TIMEOUT * 2, check=False,
    )  # fmt: skip
    return result, time.monotonic() - begun


def _assert_ended_by(
    result: subprocess.CompletedProcess[str], signum: int, sent: int | None = None
) -> None:
    """Exit ``128 + signum``, stdout exactly one document (the signal's), no traceback.

    ``sent``: the signal taken for ``signum`` (a SIGTERM), which the message names.
    """
    detail = (result.returncode, result.stdout, result.stderr[-3000:])
    assert result.returncode == 128 + signum, detail
    assert "Traceback" not in result.stderr, detail
    message = MESSAGE[signum]
    if sent is not None and sent != signum:
        message = f"terminated ({signal.Signals(sent).name}, taken for a SIGTERM)"
    assert json.loads(result.stdout) == {"error": {"code": 128 + signum, "message": message}}, (
        detail
    )


def _command(name: str, tmp_path: Path) -> list[str]:
    if name == "wait-env":
        port = unshared_port()
        assert nothing_listens(port)
        return ["wait-env", f"http://127.0.0.1:{port}", "--timeout", f"{WAIT_ENV_TIMEOUT:g}"]
    if name == "resume":
        out = tmp_path / "out"
        out.mkdir()
        return ["resume", "--output-dir", str(out)]
    return {"plan": ["plan", "--gpus", "2"], "doctor": ["doctor"]}[name]


# -- a SIGTERM whose SystemExit was lost

LOST = """
import signal, sys
import verirl.__main__ as program, verirl.cli.entry as cli
from verirl._signals import program_handler
when = sys.argv[1]
sys.argv = ["verirl", "--json", *sys.argv[2:]]

def lose_a_sigterm():
    try:
        program_handler(signal.SIGTERM, None)  # the handler runs ...
    except SystemExit:
        pass  # ... and compile() swallows its exit

if when == "while verirl imports":
    lose_a_sigterm()
else:  # "as the command starts": after the flags are parsed, past run's own check
    decide = cli.decide_json
    cli.decide_json = lambda wanted: decide(wanted) or lose_a_sigterm()
sys.exit(program.run())
"""


@pytest.mark.parametrize("when", ["while verirl imports", "as the command starts"])
@pytest.mark.parametrize("command", ["wait-env", "plan", "resume", "doctor"])
def test_a_sigterm_whose_exit_was_lost_ends_every_command_at_once(tmp_path, command, when):
    """Not after the command's own work and document: wait-env does not poll its --timeout."""
    result, took = _run(tmp_path, LOST, when, *_command(command, tmp_path))
    _assert_ended_by(result, signal.SIGTERM)
    assert took < BOUND < WAIT_ENV_TIMEOUT, took


# -- a signal before run() enters its try

START_UP = """
import os, runpy, sys
where, signum, how = sys.argv[1], int(sys.argv[2]), sys.argv[3]
sys.argv = ["verirl", "--json", "plan", "--gpus", "2"]

def send(*_):
    os.kill(os.getpid(), signum)

class SignalOnImport:  # the signal comes as the module `where` starts to be imported
    def find_spec(self, name, path=None, target=None):
        if name == where:
            sys.meta_path.remove(self)
            send()
        return None

if where == "reserve_standard_fds":  # run's first step
    import verirl._cli_fds as fds
    fds.reserve_standard_fds = send
else:
    sys.meta_path.insert(0, SignalOnImport())
if how == "python -m verirl":
    runpy.run_module("verirl", run_name="__main__", alter_sys=True)
else:  # the `verirl` script: imports the module, then calls run
    from verirl.__main__ import run
    sys.exit(run())
"""


@pytest.mark.parametrize(
    "signum",
    [signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGUSR1, signal.SIGQUIT],
    ids=["SIGINT", "SIGTERM", "SIGHUP", "SIGUSR1", "SIGQUIT"],
)
@pytest.mark.parametrize("how", ["python -m verirl", "verirl script"])
@pytest.mark.parametrize(
    "where",
    [
        "verirl._signals",  # imported by verirl.__main__ at module level
        "verirl._cli_output",  # imported by run, before it set its handler
        "reserve_standard_fds",  # run's first step, before it set its handler
    ],
)
def test_a_signal_before_run_takes_over_gives_its_code_and_one_document(
    tmp_path, where, how, signum
):
    """SIGUSR1 and SIGQUIT, which count as a SIGTERM, acted as their default until run had
    imported its modules (35-40 ms, where the README says 5-20: review round 28, A-F5)."""
    result, took = _run(tmp_path, START_UP, where, str(int(signum)), how)
    as_itself = signum in (signal.SIGINT, signal.SIGTERM)  # the others count as a SIGTERM
    _assert_ended_by(result, signum if as_itself else signal.SIGTERM, sent=signum)
    assert took < BOUND, took


def test_the_signals_noted_from_the_first_statements_are_those_that_count_as_a_sigterm(tmp_path):
    """`verirl.__main__` names them again (it must not import `verirl._signals` that early):
    the two lists are one, less the real-time signals (noted from `_prepare` on) and those
    Python ignores from its start (SIGXFSZ), which no handler is set for. In a process of its
    own: the import sets the program's handlers."""
    script = """
import signal
import socket
import verirl.__main__ as program
from verirl._signals import _REAL_TIME, TERMINATING

early = [int(s) for s in program._EARLY]
expected = set(TERMINATING) - set(_REAL_TIME) - {signal.SIGXFSZ}  # ignored by Python
print(len(set(early)) == len(early), set(early) == expected)
"""
    result, _ = _run(tmp_path, script)
    assert result.stdout.split() == ["True", "True"], (result.stdout, result.stderr)


def test_after_the_last_exit_hook_no_late_signal_can_end_the_process(tmp_path):
    """The interpreter then resets its handlers: a thread still running would take a signal
    and die of it (after a document that said 0). Each is ignored, process-wide, by then."""
    script = """
import atexit, signal, sys, threading
import verirl.__main__ as program

def after_the_last_hook():  # registered before run: runs after run's own last hook
    print([signal.getsignal(s) == signal.SIG_IGN for s in program._LATE])

atexit.register(after_the_last_hook)
threading.Thread(target=threading.Event().wait, daemon=True).start()  # a daemon, still running
sys.argv = ["verirl", "--json", "plan", "--gpus", "2"]
sys.exit(program.run())
"""
    result, _ = _run(tmp_path, script)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1] == str([True, True, True]), result.stdout


def test_importing_the_module_leaves_ctrl_c_and_sigterm_raising(tmp_path):
    """Only run keeps signals noted: a program that merely imports the module gets them raised."""
    script = """
import signal
import socket
import verirl.__main__
from verirl._signals import program_handler
assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
assert signal.getsignal(signal.SIGTERM) is program_handler
try:
    signal.raise_signal(signal.SIGINT)
    print("not raised")
except KeyboardInterrupt:
    print("raised")
"""
    result, _ = _run(tmp_path, script)
    assert result.stdout.split() == ["raised"], result.stderr


def test_the_program_s_ctrl_c_handler_is_python_s_own_minding_the_tracer_s_lock(tmp_path):
    """While a command runs, Ctrl-C is `program_interrupt`: a KeyboardInterrupt (exit 130), but
    never raised inside coverage's lock (`verirl._signals.in_tracers_lock`)."""
    script = """
import signal, sys
import verirl.__main__ as program
import verirl.cli
from verirl._signals import program_interrupt

def main(argv=None):
    print(signal.getsignal(signal.SIGINT) is program_interrupt, flush=True)
    signal.raise_signal(signal.SIGINT)
    return 0

verirl.cli.main = main
sys.argv = ["verirl", "plan", "--gpus", "2"]
sys.exit(program.run())
"""
    result, _ = _run(tmp_path, script)
    assert result.stdout.split() == ["True"], result.stderr
    assert result.returncode == 130, result.stderr


def _full_pipe() -> tuple[int, int]:
    """A pipe whose buffer is full, its writing end blocking: a reader that stopped reading."""
    read, write = os.pipe()
    os.set_blocking(write, False)
    with contextlib.suppress(BlockingIOError):
        while True:
            os.write(write, b"x" * 65536)
    os.set_blocking(write, True)
    return read, write


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_ends_launch_whose_stderr_reader_stopped_reading(tmp_path, signum):
    """stderr a full pipe nobody reads (a supervisor that reads it at the end): after a Ctrl-C
    the exit deadline's warning went to logging's last resort, which blocked on that pipe and
    held the lock the main thread's logging shutdown waited for: launch never ended (review
    round 28, A-F1). It ends, with the signal's code."""
    started = tmp_path / "started"
    # a command that writes nothing on the signal (a traceback would wait for that reader too)
    script = f'touch "{started}"; exec sleep 120'
    read, write = _full_pipe()
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "verirl", "launch", "--gpus", "1", "--mode", "colocate", "--",
             "sh", "-c", script],
            stdout=subprocess.PIPE, stderr=write, env=_environ(tmp_path), cwd=ROOT,
            start_new_session=True,
        )  # fmt: skip
        os.close(write)
        write = -1
        try:
            deadline = time.monotonic() + BOUND
            while not started.exists() and proc.poll() is None and time.monotonic() < deadline:
                threading.Event().wait(0.01)
            assert started.exists(), proc.poll()
            proc.send_signal(signum)
            assert proc.wait(timeout=BOUND) == 128 + signum
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
            proc.stdout.close()  # type: ignore[union-attr]
    finally:
        os.close(read)
        if write >= 0:
            os.close(write)


def test_the_exit_deadline_armed_once_the_exit_began_never_raises(tmp_path):
    """arm() had a branch for an exit under way, but from Python 3.12 on it then started its
    threads and raised ('can't create new thread at interpreter shutdown'), leaving an
    unstarted thread that made every later arm() a no-op (review round 30, G-F4). It arms
    the deadline where a thread can still start (3.10, 3.11), and only warns where not."""
    script = """
import sys, threading
from verirl import _signals

def late():
    try:
        _signals.arm_exit_deadline(3)
    except BaseException as exc:
        print("raised", type(exc).__name__, exc, flush=True)
    print("armed" if _signals._EXIT_DEADLINE._thread is not None else "not armed", flush=True)

holder = threading.Event()
threading.Thread(target=holder.wait, args=(8,), name="holds-the-exit").start()  # not a daemon
threading._register_atexit(late)
"""
    result, took = _run(tmp_path, script)
    assert "raised" not in result.stdout, result.stdout
    # Whether a thread can start in a threading exit hook depends on the version (3.12.1 not,
    # 3.13 and 3.11 yes): armed, the deadline ends it; not, it says so. Before 3.12 it can.
    if sys.version_info < (3, 12) or result.stdout.strip() == "armed":
        assert result.stdout.strip() == "armed", (result.stdout, result.stderr)
        assert result.returncode == 3, result.stderr
        assert took < BOUND, took
    else:
        assert result.stdout.strip() == "not armed", (result.stdout, result.stderr)
        assert "the exit deadline cannot be armed now" in result.stderr, result.stderr


def test_a_sigterm_the_policy_took_arms_the_exit_deadline(tmp_path):
    """serve and launch take SIGTERM through the policy, not the program's handler: no exit
    deadline was armed, so a thread left running held the exit (a stalled stderr's queue for
    5 s; any other for good), where the README promises the end 2 s after the main thread's."""
    script = """
import signal, sys, threading
import verirl.__main__ as program
import verirl.cli
from verirl._signals import SIGTERM_POLICY

def main(argv=None):
    threading.Thread(target=threading.Event().wait, name="never-ends").start()  # not a daemon
    try:
        with SIGTERM_POLICY.held():
            signal.signal(signal.SIGTERM, SIGTERM_POLICY.handle)  # as cli's _owning_sigterm
            signal.raise_signal(signal.SIGTERM)
    except SystemExit as exc:  # as cli's main: the policy's exit becomes the code returned
        return exc.code
    return 0

verirl.cli.main = main
sys.argv = ["verirl", "plan", "--gpus", "2"]
sys.exit(program.run())
"""
    result, took = _run(tmp_path, script)
    assert result.returncode == 143, result.stderr
    assert took < BOUND, took
    assert "still running 1.5s after the main thread ended on a signal" in result.stderr


@pytest.mark.parametrize(
    ("sent", "named"),
    [
        (signal.SIGHUP, "terminated (SIGHUP, taken for a SIGTERM)"),
        (signal.SIGUSR1, "terminated (SIGUSR1, taken for a SIGTERM)"),
        (signal.SIGTERM, "terminated (SIGTERM)"),
        (signal.SIGINT, "interrupted (SIGINT)"),
    ],
    ids=["SIGHUP", "SIGUSR1", "SIGTERM", "SIGINT"],
)
def test_the_signal_that_ended_a_command_is_named_as_sent_on_stderr_and_in_the_document(
    tmp_path, sent, named
):
    """Round 51: a hang-up ended wait-env with "terminated (SIGTERM)" in its document, and
    nothing at all on stderr (the README: the document's message is the one logged there)."""
    with contextlib.closing(socket.socket()) as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)  # accepts, never answers: wait-env waits
        url = f"http://127.0.0.1:{listener.getsockname()[1]}"
        process = subprocess.Popen(
            [sys.executable, "-m", "verirl", "wait-env", "--json", url, "--timeout",
             str(WAIT_ENV_TIMEOUT)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_environ(tmp_path),
            cwd=ROOT,
        )  # fmt: skip
        try:
            assert process.stderr is not None
            line = process.stderr.readline()  # "waiting up to 30s ...": it is in its wait
            assert "waiting up to" in line, line
            process.send_signal(sent)
            out, err = process.communicate(timeout=BOUND)
        finally:
            if process.poll() is None:
                process.kill()
                process.communicate()
    assert process.returncode == 128 + (signal.SIGINT if sent == signal.SIGINT else signal.SIGTERM)
    assert json.loads(out)["error"]["message"] == named
    assert [line for line in err.splitlines() if " ERROR " in line][-1].endswith(f": {named}")


LEFT_BY_A_CUT_TEARDOWN = """
import signal, threading
import verirl.__main__ as program
from verirl._signals import program_interrupt, program_note
from verirl._supervise import _noting
signal.signal(signal.SIGTERM, signal.SIG_DFL)  # coverage's own handler out of the way
left = _noting(threading.Event(), program_interrupt, absorb=False)
signal.signal(signal.SIGINT, left)  # a grace's, its restore cut short
program._note_signals()
print(signal.getsignal(signal.SIGINT) is program_note)
"""


def test_a_verirl_handler_left_on_ctrl_c_is_noting_once_the_command_returned(tmp_path):
    """A late Ctrl-C is noted, not raised out of run (review of 3420485: 3.10 can skip the
    cleanup of a ``with`` as a signal lands, leaving the grace's handler in place)."""
    done = subprocess.run(
        [sys.executable, "-c", LEFT_BY_A_CUT_TEARDOWN], capture_output=True, text=True,
        timeout=60, check=False, env=clean_environ(tmp_path),
    )  # fmt: skip
    assert done.stdout.strip() == "True", done.stderr

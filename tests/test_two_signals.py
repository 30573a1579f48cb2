"""Class: two handlers for one signal. Two signals that come together never undo a teardown.

When a first signal's handler raises, Python runs the second one's at the
next point it checks: as the first exception unwinds into ``Condition.wait``'s
``_acquire_restore`` (the lock left released: ``RuntimeError('release
unlocked lock')``, exit 1 with a traceback), or at the first line of a
``with`` block's ``__exit__`` (the teardown never begins: the block is left
with its vLLM server running). Driven here as a platform does it: two
``kill`` calls in a row, to ``verirl serve`` and to a program that holds a
`VLLMServer` or a `TrainingRuntime` in a ``with`` block, with the fake server.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from _support import clean_environ, master_port_avoiding, nothing_listens, unshared_port

FAKE_VLLM = [sys.executable, "-m", "fakes.vllm_serve"]
BAD_OUTPUT = ("Traceback", "RuntimeError", "Exception ignored")
PAIRS = [
    (signal.SIGINT, signal.SIGTERM),
    (signal.SIGTERM, signal.SIGINT),
    (signal.SIGHUP, signal.SIGINT),
    (signal.SIGINT, signal.SIGINT),
]
PAIR_IDS = ["INT+TERM", "TERM+INT", "HUP+INT", "INT+INT"]


def _both(pid: int, pair: tuple[signal.Signals, signal.Signals]) -> None:
    """The two signals back to back, as a platform's agent sends them."""
    for sig in pair:
        os.kill(pid, sig)


def _program(tmp_path: Path, program: str, *args: str, timeout: float = 60) -> Any:
    """``program`` run by this Python with ``args``; its completed process (text)."""
    return subprocess.run(
        [sys.executable, "-c", program, *args], capture_output=True, text=True,
        timeout=timeout, env=clean_environ(tmp_path), check=False,
    )  # fmt: skip


def _gone(processes: list[psutil.Process]) -> bool:
    _, alive = psutil.wait_procs(processes, timeout=15)
    return not alive


@pytest.mark.parametrize("pair", PAIRS, ids=PAIR_IDS)
def test_serve_given_two_signals_at_once_exits_by_the_first_with_its_server_gone(tmp_path, pair):
    port = unshared_port()
    argv = [sys.executable, "-m", "verirl", "serve", "--gpus", "2", "--model", "m",
            "--vllm-port", str(port), "--vllm-command", " ".join(FAKE_VLLM),
            "--log-dir", str(tmp_path)]  # fmt: skip
    with subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=clean_environ(tmp_path)
    ) as proc:
        try:
            assert proc.stdout is not None
            assert proc.stdout.readline().startswith(b"vLLM server ready")
            server = psutil.Process(proc.pid).children(recursive=True)
            _both(proc.pid, pair)
            _, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
    text = err.decode(errors="replace")
    # the code of the handler that ran first, not always the signal sent first: Python runs
    # pending handlers by signal number (SIGHUP counts as TERM)
    assert proc.returncode in (130, 143), text
    assert not [word for word in BAD_OUTPUT if word in text], text
    assert server
    assert _gone(server), text
    assert nothing_listens(port)


PROGRAM = """
import json, os, signal, subprocess, sys, threading, time
# The policy is under test, not a handler the program inherited (coverage's subprocess patch
# installs one, which the policy rightly keeps: SIGTERM would end the program there).
signal.signal(signal.SIGTERM, signal.SIG_DFL)
import psutil
from verirl import DistributedEnv, TrainingRuntime, VLLMServer, VLLMTopology

port, master, log_dir, holder, body, first, second = sys.argv[1:8]
command = (sys.executable, "-m", "fakes.vllm_serve")
make = lambda topology: VLLMServer.from_topology(
    topology, model="m", command=command, log_dir=log_dir, shutdown_timeout=20)
topology = VLLMTopology.plan(2, max_model_len=64, port=int(port))
if holder == "server":
    block = make(topology)
else:
    block = TrainingRuntime(topology, environ={}, server_factory=make,
        dist_env=DistributedEnv.single_node(environ={}, master_port=int(master)))
caught, server = [], []
try:
    with block:
        server[:] = [p.pid for p in psutil.Process().children(recursive=True)]
        subprocess.run(["sh", "-c", f"kill -{first} {os.getpid()}; kill -{second} {os.getpid()}"])
        if body == "sleep":
            time.sleep(60)  # the first handler raises as it returns, the second in __exit__
        else:
            threading.Event().wait(60)  # the second lands in Condition.wait's _acquire_restore
except BaseException as exc:
    while exc is not None:  # the chain, each exception with the one it was raised during
        caught.append(type(exc).__name__)
        exc = exc.__context__
def running(pid):
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False

# the server's processes only: the kill's sh may be left unreaped by the interrupted run()
left = [pid for pid in server if running(pid)]
print(json.dumps({"caught": caught, "server": server, "left": left}), flush=True)
"""


@pytest.mark.parametrize("pair", PAIRS[:2], ids=PAIR_IDS[:2])
@pytest.mark.parametrize("body", ["sleep", "event"])
@pytest.mark.parametrize("holder", ["server", "runtime"])
def test_a_with_block_left_on_two_signals_at_once_has_stopped_its_server(
    tmp_path, holder, body, pair
):
    """A program that catches the signal's exception goes on: never with a live server."""
    script = tmp_path / "program.py"
    script.write_text(textwrap.dedent(PROGRAM))
    port = unshared_port()
    master = master_port_avoiding(port)  # never the server's port: two picks can meet
    (tmp_path / "logs").mkdir()
    argv = [sys.executable, str(script), str(port), str(master), str(tmp_path / "logs"),
            holder, body, *(str(int(sig)) for sig in pair)]  # fmt: skip
    done = subprocess.run(
        argv,
        check=False,
        capture_output=True,
        timeout=120,
        env=clean_environ(tmp_path),
        cwd=Path.cwd(),
    )
    err = done.stderr.decode(errors="replace")
    assert done.returncode == 0, err
    report = json.loads(done.stdout)
    assert report["caught"][0] in ("KeyboardInterrupt", "SystemExit"), report
    assert "RuntimeError" not in report["caught"], report  # no 'release unlocked lock'
    assert report["server"], err
    assert report["left"] == [], err  # stopped inside the block's __exit__, not at exit
    assert nothing_listens(port)


HOLDER = """
import signal, sys, threading
record, ready = sys.argv[1], sys.argv[2]
def note(signum, _frame):
    with open(record, "a") as sink:
        sink.write(signal.Signals(signum).name + "\\n")
signal.signal(signal.SIGINT, note)
signal.signal(signal.SIGTERM, note)
open(ready, "w").close()
threading.Event().wait(300)  # saves for as long as it is let: the grace ends it
"""


@pytest.mark.parametrize("pair", PAIRS[:3], ids=PAIR_IDS[:3])  # two SIGINTs may merge into one
def test_launch_given_two_signals_at_once_sigkills_its_command_without_the_grace(tmp_path, pair):
    """A second signal SIGKILLs the command at once; one that came with the first does too.

    Seen: SIGTERM+SIGINT together, and launch passed SIGTERM on and waited the whole grace,
    the Ctrl-C lost: the second handler's exception had replaced the first's."""
    script, record, ready = tmp_path / "holder.py", tmp_path / "signals", tmp_path / "ready"
    script.write_text(textwrap.dedent(HOLDER))
    grace = 120
    argv = [sys.executable, "-m", "verirl", "launch", "--gpus", "1",
            "--shutdown-timeout", str(grace), "--",
            sys.executable, str(script), str(record), str(ready)]  # fmt: skip
    command: list[psutil.Process] = []
    with subprocess.Popen(
        argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=clean_environ(tmp_path)
    ) as proc:
        try:
            deadline = time.monotonic() + 60
            while not ready.exists():
                assert proc.poll() is None, "launch ended before its command was ready"
                assert time.monotonic() < deadline, "the command never got ready"
                psutil.wait_procs([], timeout=0.02)
            command += psutil.Process(proc.pid).children()
            _both(proc.pid, pair)
            _, err = proc.communicate(timeout=grace / 2)  # far less than the grace
        finally:
            for process in [proc, *command]:
                with contextlib.suppress(psutil.Error, OSError):
                    process.kill()
    text = err.decode(errors="replace")
    assert proc.returncode != 0, text
    assert not [word for word in BAD_OUTPUT if word in text], text
    assert "SIGKILL" in text, text
    got = record.read_text().split() if record.exists() else []
    assert len(got) == len(set(got)) <= 1, got  # the first at most, once; never the second
    assert _gone(command), text


NESTED = """
import dis, io, json, logging, signal, sys, threading, time
from verirl import _signals
from verirl._signals import SIGTERM_POLICY, as_sigterm, interruptions, program_handler
from verirl._signals import program_interrupt
from verirl._supervise import _Forwarding, _noting
from verirl.__main__ import _hang_up

logging.basicConfig(stream=io.StringIO(), level=logging.INFO)  # the handlers log, as they do
outer_name, inner_name = sys.argv[1:3]
expected = sys.argv[6].split(",")
outer, inner = signal.Signals[outer_name], signal.Signals[inner_name]
forwarding = _Forwarding()
handlers = {
    "policy": SIGTERM_POLICY.handle, "program": program_handler, "interrupt": program_interrupt,
    "as_sigterm": as_sigterm, "forwarding": forwarding._handle, "hang_up": _hang_up,
    "default": signal.default_int_handler,  # a library program's: Python's own, in C
}
noted = threading.Event()  # launch's grace: each handler wrapped to note what it raises
handlers["noting_policy"] = _noting(noted, SIGTERM_POLICY.handle, absorb=False)
handlers["noting_interrupt"] = _noting(noted, program_interrupt, absorb=False)
signal.signal(signal.SIGTERM, handlers[sys.argv[3]])
signal.signal(signal.SIGINT, handlers[sys.argv[4]])
if outer not in (signal.SIGTERM, signal.SIGINT):
    signal.signal(outer, handlers[sys.argv[5]])
OUTER = signal.getsignal(outer).__code__  # from the handler's first point to its last

def returns(frame, names={}):
    code = frame.f_code
    if code not in names:
        names[code] = {i.offset: i.opname for i in dis.get_instructions(code)}
    return names[code].get(frame.f_lasti, "").startswith("RETURN")

def once(point):
    '''The outer signal; the inner one sent at its handler's ``point``-th point. Points seen.'''
    seen, depth, sent = [0], [0], [False]
    def profile(frame, event, _arg):
        if frame.f_code is OUTER and event in ("call", "return"):
            depth[0] += 1 if event == "call" else -1
        if event == "return" and not returns(frame):
            return  # an exception unwinds it: no instruction runs, no handler with it
        if depth[0] and event in ("call", "c_return", "return") and not sent[0]:
            seen[0] += 1
            if seen[0] == point:  # the inner handler, called as Python calls it there
                sent[0] = True
                landed = frame.f_back if event == "return" else frame
                signal.getsignal(inner)(inner, landed)
    came = []
    names = lambda error: [signal.Signals(s).name for s in interruptions(error)]
    with SIGTERM_POLICY.held():
        sys.setprofile(profile)
        try:  # as Python calls a handler (3.10 profiles none it calls itself)
            signal.getsignal(outer)(outer, sys._getframe())
        except BaseException as exc:
            came += names(exc)
        finally:
            sys.setprofile(None)
        deadline = time.monotonic() + (10 if point else 0)
        while len(came) < len(expected) and time.monotonic() < deadline:  # one put off: later
            try:
                time.sleep(0.002)
            except BaseException as exc:
                came += names(exc)
    queued = [signal.Signals(s).name for s in forwarding.take()]
    with SIGTERM_POLICY.held():  # whatever happened, the next SIGTERM is handled at once
        try:
            _signals.SIGTERM_POLICY.handle(signal.SIGTERM, sys._getframe())
        except SystemExit:
            came += ["then"]
    return seen[0], came, queued, sent[0]

once(None)  # the first time takes more steps (caches filled, logging's first record)
points = once(None)[0]
results = [once(point)[1:] + (point,) for point in range(1, points + 1)]
print(json.dumps({"points": points, "results": results}))
"""

NESTING = [  # outer, inner, SIGTERM's handler, SIGINT's, the outer's own; what comes out
    ("SIGTERM", "SIGINT", "policy", "interrupt", None, ["SIGTERM", "SIGINT"], []),
    ("SIGINT", "SIGTERM", "policy", "interrupt", None, ["SIGINT", "SIGTERM"], []),
    ("SIGTERM", "SIGINT", "program", "interrupt", None, ["SIGTERM", "SIGINT"], []),
    ("SIGINT", "SIGTERM", "program", "interrupt", None, ["SIGINT", "SIGTERM"], []),
    ("SIGHUP", "SIGINT", "policy", "interrupt", "as_sigterm", ["SIGTERM", "SIGINT"], []),
    ("SIGUSR1", "SIGTERM", "policy", "interrupt", "forwarding", ["SIGTERM"], ["SIGUSR1"]),
    ("SIGHUP", "SIGINT", "program", "interrupt", "hang_up", ["SIGTERM", "SIGINT"], []),
    ("SIGTERM", "SIGINT", "noting_policy", "noting_interrupt", None, ["SIGTERM", "SIGINT"], []),
    ("SIGINT", "SIGTERM", "noting_policy", "noting_interrupt", None, ["SIGINT", "SIGTERM"], []),
    ("SIGHUP", "SIGTERM", "program", "interrupt", "as_sigterm", ["SIGTERM", "SIGTERM"], []),
    # A library program's Ctrl-C is Python's own handler, in C: it cannot wait, and takes the
    # SIGTERM's place (the with block is left all the same); nothing is left held back.
    ("SIGTERM", "SIGINT", "policy", "default", None, (["SIGINT"], ["SIGTERM", "SIGINT"]), []),
]


@pytest.mark.parametrize(
    "case", NESTING, ids=[f"{c[0]}-{c[1]}-{c[4] or c[2]}-{c[3]}" for c in NESTING]
)
def test_a_signal_that_comes_inside_another_s_handler_loses_neither(tmp_path, case):
    """Seen: SIGTERM then Ctrl-C, the Ctrl-C's handler run by Python inside the SIGTERM's as it
    logged, before it raised: launch saw the Ctrl-C alone and waited out the grace. The second
    signal is sent here at each point of the first one's handler, in a real program: both take
    effect, in order, the second a moment later."""
    outer, inner, term, interrupt, own, chain, queued = case
    chains = chain if isinstance(chain, tuple) else (chain,)  # those it may come out as
    given = [outer, inner, term, interrupt, own or "", ",".join(chains[0])]
    done = _program(tmp_path, NESTED, *given, timeout=120)
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["points"] > 10, report  # the handler's log, at least
    allowed = [[[*each, "then"], queued, True] for each in chains]
    wrong = [r for r in report["results"] if r[:3] not in allowed]
    assert not wrong, (len(wrong), report["points"], wrong[:5])


FORKED = """
import os, signal, sys, threading
from verirl._signals import program_interrupt, outside_tracers_lock

def fork():
    pid = os.fork()  # another thread's, while the main thread runs a handler
    if pid == 0:
        try:
            signal.raise_signal(signal.SIGINT)  # the child runs no handler: this one runs now
        except KeyboardInterrupt:
            os._exit(7)
        os._exit(1)
    _, status = os.waitpid(pid, 0)
    print(os.waitstatus_to_exitcode(status))

@outside_tracers_lock
def forking(signum, frame):
    thread = threading.Thread(target=fork)
    thread.start()
    thread.join()

signal.signal(signal.SIGINT, program_interrupt)
signal.signal(signal.SIGUSR1, forking)
signal.raise_signal(signal.SIGUSR1)
"""


def test_a_child_forked_while_a_handler_ran_handles_its_signals_at_once(tmp_path):
    """The running handler is the parent's: the child's own Ctrl-C is not held back for it."""
    done = _program(tmp_path, FORKED)
    assert (done.returncode, done.stdout.strip()) == (0, "7"), done.stderr


AGAIN_AS_IT_LOGS = """
import logging, os, signal, sys, threading
signal.signal(signal.SIGTERM, signal.SIG_DFL)  # coverage's handler aside: the policy is tested
from verirl import DistributedEnv, TrainingRuntime, VLLMTopology

class Again(logging.Handler):  # the second SIGTERM comes as the first one's handler logs
    def emit(self, record):
        if "SIGTERM received" in record.getMessage() and not sent:
            sent.append(1)
            os.kill(os.getpid(), signal.SIGTERM)

sent, got = [], []
logging.getLogger("verirl").addHandler(Again())
runtime = TrainingRuntime(VLLMTopology.plan(1, max_model_len=64), environ={},
    dist_env=DistributedEnv.single_node(environ={}, master_port=int(sys.argv[1])))
try:
    with runtime:  # colocate: no server, a teardown far shorter than any resend's delay
        os.kill(os.getpid(), signal.SIGTERM)
        threading.Event().wait(30)
except SystemExit as exc:
    print("caught", exc.code, flush=True)
if sys.argv[2] == "own":  # the program's own handler, once the block is left, gets nothing
    signal.signal(signal.SIGTERM, lambda *_: got.append("SIGTERM"))
threading.Event().wait(0.5)  # longer than any resend's delay
print("done", got, flush=True)
"""


@pytest.mark.parametrize("after", ["default", "own"])
def test_a_second_sigterm_inside_the_first_s_handler_is_ignored_not_sent_on(tmp_path, after):
    """Fire once: a second SIGTERM during the first one's teardown is ignored. Held back and
    sent again once the block had put the default back, it killed a program that had caught
    the first one's exit and gone on (review of 603bcd2)."""
    done = _program(tmp_path, AGAIN_AS_IT_LOGS, str(unshared_port()), after, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["caught 143", "done []"], done.stderr


SAVING = """
import os, signal, sys
from verirl._signals import as_sigterm, program_interrupt

SAVE = '''
def save(signum, frame):  # the program's own SIGTERM handler, which saves for long
    signal.getsignal(signal.SIGINT)(signal.SIGINT, sys._getframe())  # a Ctrl-C as it saves
    print("saved")
'''
where = {"program": "<string>",  # an installed package, where site-packages is in the stdlib's
         "package": os.path.join(os.path.dirname(os.__file__), "site-packages", "saver.py")}
exec(compile(SAVE, where[sys.argv[1]], "exec"))

signal.signal(signal.SIGINT, program_interrupt)
signal.signal(signal.SIGTERM, save)
try:
    as_sigterm(signal.SIGUSR1, sys._getframe())  # verirl's handler passes it the signal
except KeyboardInterrupt:
    print("interrupted")
"""


@pytest.mark.parametrize("where", ["program", "package"])
def test_a_ctrl_c_inside_a_program_s_handler_that_verirl_called_is_not_held(tmp_path, where):
    """Only verirl's own handler code holds a signal back: a program's handler that verirl
    passes a signal to (a save) is interrupted by a Ctrl-C as Python interrupts it, wherever
    its code lies (a conda or system Python keeps site-packages inside the stdlib's folder)."""
    done = _program(tmp_path, SAVING, where)
    assert (done.returncode, done.stdout.split()) == (0, ["interrupted"]), done.stderr


TRACED = """
import io, logging, os, signal, sys, sysconfig, types
from verirl._signals import SIGTERM_POLICY, interruptions, program_interrupt

logging.basicConfig(stream=io.StringIO(), level=logging.INFO)
TRACER = '''
def tracer(frame, event, arg):  # a Python tracer (coverage's PyTracer) in site-packages
    if event == "call" and frame.f_code.co_name == "getMessage" and not sent:
        sent.append(1)  # the Ctrl-C comes as the tracer runs, inside the SIGTERM's log
        signal.getsignal(signal.SIGINT)(signal.SIGINT, sys._getframe())
    return None
'''
sent = []
place = os.path.join(sysconfig.get_paths()["purelib"], "coverage", "pytracer.py")
exec(compile(TRACER, place, "exec"))
signal.signal(signal.SIGINT, program_interrupt)
with SIGTERM_POLICY.held():
    sys.settrace(tracer)
    try:
        SIGTERM_POLICY.handle(signal.SIGTERM, sys._getframe())
    except BaseException as exc:
        print([signal.Signals(s).name for s in interruptions(exc)])
    finally:
        sys.settrace(None)
"""


def test_a_ctrl_c_that_lands_in_a_tracer_inside_a_handler_is_held_all_the_same(tmp_path):
    """A tracer's frame (coverage's, a debugger's) between the handler and where the Ctrl-C
    landed is not a program's handler: the SIGTERM's exit is not lost to it."""
    done = _program(tmp_path, TRACED)
    assert (done.returncode, done.stdout.strip()) == (0, "['SIGTERM', 'SIGINT']"), done.stderr


SWAPPED = """
import signal, sys, threading, time, types
from verirl._signals import _GUARDS, program_handler, program_interrupt
from verirl._supervise import _grace_signals

signal.signal(signal.SIGINT, program_interrupt)
signal.signal(signal.SIGTERM, program_handler)
def profile(frame, event, _arg):  # the Ctrl-C lands as the SIGTERM's handler is entered
    if event == "call" and frame.f_code in _GUARDS and not sent:
        sent.append(1)
        signal.getsignal(signal.SIGINT)(signal.SIGINT, frame)
sent = []
sys.setprofile(profile)
try:
    signal.getsignal(signal.SIGTERM)(signal.SIGTERM, sys._getframe())
except SystemExit as exc:
    sys.setprofile(None)
    print("first", exc.code)
command = types.SimpleNamespace(interrupted=None)
start = time.monotonic()
try:
    with _grace_signals(command):  # launch's grace: its own handlers in place of those
        threading.Event().wait(30)
    print("grace waited out")
except KeyboardInterrupt:
    print("the Ctrl-C ended the grace", time.monotonic() - start < 20)
"""


def test_a_signal_sent_again_reaches_launch_s_grace_handlers(tmp_path):
    """A Ctrl-C put off as a handler began is sent again; launch's grace had put its own
    handlers in place meanwhile, and the Ctrl-C must still end the grace (review of f4ad54b)."""
    done = _program(tmp_path, SWAPPED, timeout=120)
    assert done.stdout.splitlines() == ["first 143", "the Ctrl-C ended the grace True"], (
        done.stdout + done.stderr
    )


AT_HAND_ON = """
import signal, sys
signal.signal(signal.SIGTERM, signal.SIG_DFL)  # coverage's handler aside: the policy's is tested
from verirl._signals import SIGTERM_POLICY, as_sigterm, hand_on, interruptions, program_interrupt

signal.signal(signal.SIGINT, program_interrupt)
signal.signal(signal.SIGHUP, as_sigterm)
def tracer(frame, event, arg):  # a Ctrl-C as hand_on is about to call SIGTERM's handler
    if frame.f_code is hand_on.__code__:
        if event == "line" and frame.f_locals.get("handing_on") is True and not sent:
            sent.append(1)
            signal.getsignal(signal.SIGINT)(signal.SIGINT, sys._getframe())
        return tracer
    return tracer if event == "call" else None
sent = []
with SIGTERM_POLICY.held():
    sys.settrace(tracer)
    try:
        signal.getsignal(signal.SIGHUP)(signal.SIGHUP, sys._getframe())
    except BaseException as exc:
        print([signal.Signals(s).name for s in interruptions(exc)], SIGTERM_POLICY.fired)
    finally:
        sys.settrace(None)
"""


def test_a_ctrl_c_as_verirl_hands_a_signal_on_is_held_for_that_signal(tmp_path):
    """Only inside the handler handed the signal does a Ctrl-C run at once: landing in
    hand_on itself (or a tracer on its lines) before the SIGTERM's handler ran, it lost the
    SIGTERM (review of afb755c)."""
    done = _program(tmp_path, AT_HAND_ON)
    assert (done.returncode, done.stdout.strip()) == (0, "['SIGTERM', 'SIGINT'] True"), (
        done.stdout + done.stderr
    )


WRITE_HELD = """
import os, signal, sys, threading, time
import verirl._cli_output as out
from verirl._signals import interruptions

def raising(exc):
    def handler(signum, frame):
        raise exc
    return handler

signal.signal(signal.SIGTERM, raising(SystemExit(143)))
signal.signal(signal.SIGINT, raising(KeyboardInterrupt()))
read, write = os.pipe()
os.set_blocking(write, False)
while True:  # the reader is behind: the pipe is full
    try:
        os.write(write, b"x" * 4096)
    except BlockingIOError:
        break

def later():
    time.sleep(0.2)  # the whole write waits for room
    os.kill(os.getpid(), signal.SIGTERM)
    os.kill(os.getpid(), signal.SIGINT)
    time.sleep(0.2)
    os.set_blocking(read, False)
    while True:
        try:
            if not os.read(read, 65536):
                break
        except BlockingIOError:
            time.sleep(0.01)

threading.Thread(target=later, daemon=True).start()
try:
    out._write_all(write, b'{"doc": 1}\\n', whole=True, within=None)
except BaseException as exc:
    print(sorted(signal.Signals(s).name for s in interruptions(exc)))
print(signal.getsignal(signal.SIGTERM).__name__, signal.getsignal(signal.SIGINT).__name__)
"""


def test_signals_held_during_a_whole_write_are_all_handled_after_it(tmp_path):
    """Each held signal's handler runs, even when the one before raised (review of 07089a3).

    SIGTERM and a Ctrl-C that came while ``serve --json`` waited to write its
    document were replayed in a plain loop: the first handler's exception
    ended it, and the Ctrl-C (which skips the server's grace) was lost.
    """
    done = _program(tmp_path, WRITE_HELD)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["['SIGINT', 'SIGTERM']", "handler handler"], done.stderr


HELD_THEN_CTRL_C = """
import signal, sys
import verirl._cli_output as out
from verirl._signals import handle_in_turn, interruptions, program_handler, program_interrupt

signal.signal(signal.SIGTERM, program_handler)
signal.signal(signal.SIGINT, program_interrupt)
def tracer(frame, event, arg):  # the Ctrl-C as the held SIGTERM was taken off, not yet handled
    if frame.f_code is handle_in_turn.__code__:
        local = frame.f_locals
        taken = [v for k, v in local.items() if k in ("held", "came") and isinstance(v, list)]
        if event == "line" and "signum" in local and taken == [[]] and not sent:
            sent.append(1)
            signal.getsignal(signal.SIGINT)(signal.SIGINT, sys._getframe())
        return tracer
    return tracer if event == "call" else None
sent = []
try:
    with out._signals_held():
        signal.raise_signal(signal.SIGTERM)  # held for the end of the write
        sys.settrace(tracer)
except BaseException as exc:
    sys.settrace(None)
    print(sent, [signal.Signals(s).name for s in interruptions(exc)])
"""


def test_a_ctrl_c_as_a_held_signal_is_handled_loses_neither(tmp_path):
    """A Ctrl-C landing as the signals held during a whole write are handled in turn, the
    SIGTERM taken off the list and its handler not called yet, lost the SIGTERM (review of
    3d89f08): the frame that handles them holds too."""
    done = _program(tmp_path, HELD_THEN_CTRL_C)
    assert (done.returncode, done.stdout.strip()) == (0, "[1] ['SIGTERM', 'SIGINT']"), (
        done.stdout + done.stderr
    )

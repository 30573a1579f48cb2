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
    assert proc.returncode in (130, 143), text  # the first signal's code (SIGHUP counts as TERM)
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

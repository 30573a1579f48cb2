"""verirl.server.process: the death signal and the exit status read without reaping (Linux)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pytest

from _support import ZL_PROGRAM, ZlProcess, alive, still_alive
from verirl.server import child as _child
from verirl.server.child import death_signal_preexec, popen_in_session, spawn
from verirl.server.process import MARKER_VAR, ProcessTree, _marked_processes

linux_only = pytest.mark.skipif(
    sys.platform != "linux", reason="PR_SET_PDEATHSIG and os.waitid(WNOWAIT) are Linux's"
)

CHILD_OF_A_DYING_PARENT = """
import os, sys, time
from verirl.server.child import death_signal_preexec, popen_in_session
child = popen_in_session(
    [sys.executable, "-c", "import time; time.sleep(60)"], dict(os.environ), sys.stdout.buffer
)
print(child.pid, flush=True)
time.sleep(60)
"""


def _gone(pid: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            if psutil.Process(pid).status() == psutil.STATUS_ZOMBIE:
                return True
        except psutil.NoSuchProcess:
            return True
        time.sleep(0.02)
    return False


@linux_only
def test_the_death_signal_takes_the_child_along_when_the_parent_is_killed():
    assert death_signal_preexec() is not None
    parent = subprocess.Popen(
        [sys.executable, "-c", CHILD_OF_A_DYING_PARENT], stdout=subprocess.PIPE, text=True
    )
    child = 0
    try:
        assert parent.stdout is not None
        child = int(parent.stdout.readline())
        assert psutil.pid_exists(child)
        parent.kill()
        parent.wait(timeout=10)
        assert _gone(child, timeout=10), "the child outlived its SIGKILLed parent"
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
        if parent.stdout is not None:
            parent.stdout.close()
        if child and not _gone(child, timeout=0):
            psutil.Process(child).kill()


@pytest.mark.parametrize("platform", ["darwin", "win32", "freebsd14"])
def test_no_death_signal_off_linux(monkeypatch, platform):
    """Only Linux has PR_SET_PDEATHSIG: elsewhere no preexec_fn, rather than a failing one."""
    _child._prctl.cache_clear()  # resolved once per process, on this machine's platform
    monkeypatch.setattr(sys, "platform", platform)
    try:
        assert death_signal_preexec() is None
    finally:
        _child._prctl.cache_clear()


@linux_only
def test_exit_status_is_read_without_reaping(tmp_path):
    with (tmp_path / "out.log").open("wb") as log:
        popen = spawn(
            lambda: popen_in_session([sys.executable, "-c", "raise SystemExit(3)"], os.environ, log)
        )
    tree = ProcessTree(popen, uuid.uuid4().hex)
    deadline = time.monotonic() + 30
    while tree.exit_status() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert tree.exit_status() == 3
    # Not reaped: the pid (the group id too) stays ours until we reap it.
    assert psutil.Process(popen.pid).status() == psutil.STATUS_ZOMBIE
    assert popen.returncode is None
    assert tree.gone(rescan=False)  # reaps
    assert popen.returncode == 3


@linux_only
def test_a_marked_process_whose_main_thread_ended_is_found(tmp_path):
    """A Zl process (main thread ended, others run) reads as a zombie with no environment to
    psutil; the marker search must still find it: it is alive and holds what it held."""
    marker = uuid.uuid4().hex
    zl = ZlProcess(tmp_path, env={**os.environ, MARKER_VAR: marker})
    try:
        found = [process.pid for process in _marked_processes(marker, time.time() - 60)]
        assert found == [zl.pid]
    finally:
        zl.close()


ORPHANING_SERVER = """
import os, sys, time
# A server whose worker leaves its session and is orphaned (to init): only the marker finds it.
zl_script, ready = sys.argv[1], sys.argv[2]
middle = os.fork()
if middle == 0:
    os.setsid()
    if os.fork() == 0:
        os.execv(sys.executable, [sys.executable, zl_script, ready, "0", "ignore-sigterm"])
    os._exit(0)
os.waitpid(middle, 0)
time.sleep(300)
"""


@linux_only
def test_an_orphaned_worker_whose_main_thread_ended_is_taken_down(tmp_path):
    """The worker ignores SIGTERM and runs on in a thread (Zl): found by the marker, seen alive
    through the grace, SIGKILLed."""
    (tmp_path / "zl.py").write_text(ZL_PROGRAM)
    ready = tmp_path / "ready"
    marker = uuid.uuid4().hex
    argv = [sys.executable, "-c", ORPHANING_SERVER, str(tmp_path / "zl.py"), str(ready)]
    with (tmp_path / "out.log").open("wb") as log:
        popen = spawn(lambda: popen_in_session(argv, {**os.environ, MARKER_VAR: marker}, log))
    tree = ProcessTree(popen, marker)
    worker = None
    try:
        deadline = time.monotonic() + 60
        while not ready.exists():
            assert time.monotonic() < deadline, Path(tmp_path / "out.log").read_text()
            time.sleep(0.01)
        worker = psutil.Process(int(ready.read_text().split()[0]))
        assert worker.ppid() != popen.pid  # orphaned: not the server's descendant any more
        assert tree.shutdown(0.5) is False  # it outlived SIGTERM: SIGKILL was needed
        assert not still_alive([worker], timeout=5)
    finally:
        tree.kill_now()
        if worker is not None and alive(worker):
            worker.kill()


A_LIBRARY_S_AT_FORK_HOOK_WAITS = """
import os, sys, threading
from verirl import _supervise
from verirl.server.child import popen_in_session, spawn

held = threading.Lock()
held.acquire()
# As huggingface_hub's hook closing its HTTP client, whose lock another thread held at the fork.
os.register_at_fork(after_in_child=held.acquire)
command = [sys.executable, "-c", "print('ran', flush=True)"]
if sys.argv[1] == "server":
    child = spawn(lambda: popen_in_session(command, dict(os.environ), sys.stdout.buffer))
else:
    child = spawn(lambda: _supervise._start(command, dict(os.environ), []))
print("exit", child.wait(timeout=30), flush=True)
"""


@linux_only
@pytest.mark.parametrize("which", ["server", "launch"])
def test_an_at_fork_hook_that_waits_in_the_child_does_not_stop_a_start(which):
    """No Python runs between the fork and the command's exec, so no library's at-fork hook can
    hang the child there (CI saw a server child stuck as a copy of the pytest worker)."""
    process = subprocess.Popen(
        [sys.executable, "-c", A_LIBRARY_S_AT_FORK_HOOK_WAITS, which],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    try:
        out, err = process.communicate(timeout=30)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)  # the stuck child is still in this group
        process.communicate()
        pytest.fail("the start hung: the forked child ran the at-fork hook")
    assert process.returncode == 0, err
    assert out.splitlines() == ["ran", "exit 0"], (out, err)


OPEN_FDS = """
import os
import shutil
import signal
def is_open(fd):
    try:
        os.fstat(fd)
    except OSError:
        return False
    return True
import sys
found = [fd for fd in range(3, 1024) if is_open(fd)]
with open(sys.argv[1], "w") as out:
    out.write(str(found))
"""


@pytest.mark.parametrize("which", ["server", "launch"])
def test_the_command_inherits_no_descriptor_of_ours(tmp_path, which):
    """The pipe that reports an exec failure is closed by the exec: a daemon the command leaves
    behind must not hold it (the parent would wait for its end)."""
    from verirl import _supervise

    command = [sys.executable, "-I", "-c", OPEN_FDS, str(tmp_path / "fds")]
    with (tmp_path / "out").open("wb") as out:
        if which == "server":
            child = spawn(lambda: popen_in_session(command, dict(os.environ), out))
        else:
            child = spawn(lambda: _supervise._start(command, dict(os.environ), []))
        assert child.wait(timeout=30) == 0
    assert (tmp_path / "fds").read_text() == "[]"


@pytest.mark.parametrize(
    ("program", "error"),
    [("/nonexistent/verirl-test-program", FileNotFoundError),
     ("{tmp}/not-executable", PermissionError),
     ("no-such-program-on-path-verirl", FileNotFoundError)],
)  # fmt: skip
def test_a_command_that_cannot_be_exec_d_raises_as_subprocess_does_and_leaves_no_child(
    tmp_path, program, error
):
    (tmp_path / "not-executable").write_text("#!/bin/sh\n")
    (tmp_path / "not-executable").chmod(0o644)
    program = program.format(tmp=tmp_path)
    with pytest.raises(error) as info:
        subprocess.Popen([program, "--flag"])  # what subprocess itself raises
    before = {child.pid for child in psutil.Process().children()}
    with (tmp_path / "out").open("wb") as out, pytest.raises(error) as info:
        spawn(lambda: popen_in_session([program, "--flag"], dict(os.environ), out))
    assert info.value.filename == program
    assert info.value.strerror
    left = [child for child in psutil.Process().children() if child.pid not in before]
    assert left == []
    assert (tmp_path / "out").read_bytes() == b""  # no traceback from the exec program


CLOSED_STDIO = """
import os, sys
from verirl.server.child import popen_in_session, spawn

result = open(sys.argv[1], "w")
log = open(sys.argv[2], "wb")
for fd in (0, 1, 2):
    os.close(fd)
command = [sys.executable, "-c", "print('to the log', flush=True)"]
child = spawn(lambda: popen_in_session(command, dict(os.environ), log))
result.write(f"exit {child.wait(timeout=30)}")
result.close()
"""


@linux_only
def test_a_parent_with_stdio_closed_still_starts_the_command_with_its_log(tmp_path):
    """With 0-2 closed the report pipe would get those numbers; the command's stdout and stderr
    (its log) must still be its log, and the start must still end."""
    done = subprocess.run(
        [sys.executable, "-c", CLOSED_STDIO, str(tmp_path / "result"), str(tmp_path / "log")],
        timeout=60, check=False, capture_output=True,
    )  # fmt: skip
    assert (tmp_path / "result").read_text() == "exit 0", done
    assert (tmp_path / "log").read_text() == "to the log\n"


@pytest.mark.parametrize(
    "locale",
    [{}, {"LANG": "C"}, {"LC_ALL": "C"}, {"LC_CTYPE": "C"},
     {"LC_CTYPE": "POSIX", "LANG": "C.UTF-8"}, {"LANG": "C.UTF-8"}, {"LC_CTYPE": "odd\udcff"}],
)  # fmt: skip
def test_the_command_gets_exactly_the_environment_and_arguments_given(tmp_path, locale):
    """Nothing the exec program's own start-up does reaches the command: Python's C-locale
    coercion sets LC_CTYPE=C.UTF-8 in its environment, and non-UTF-8 bytes must round-trip."""
    env = {"PATH": os.environ["PATH"], "ODD_BYTES": "caf\udce9", **locale}
    script = 'printf "%s\\0" "$@" > "$0.args"; env -0 > "$0.env"'
    argv = ["/bin/sh", "-c", script, str(tmp_path / "out"), "caf\udce9", "", "two words"]
    with (tmp_path / "log").open("wb") as log:
        child = spawn(lambda: popen_in_session(argv, env, log))
        assert child.wait(timeout=30) == 0
    got_env = dict(
        line.split(b"=", 1) for line in (tmp_path / "out.env").read_bytes().split(b"\0") if line
    )
    got_env.pop(b"PWD", None)  # the shell's own
    assert got_env == {os.fsencode(k): os.fsencode(v) for k, v in env.items()}
    assert (tmp_path / "out.args").read_bytes() == b"caf\xe9\0\0two words\0"


IGNORED = 'grep SigIgn /proc/$$/status > "$0"'


@linux_only
@pytest.mark.parametrize("ignored", [(), (signal.SIGINT,), (signal.SIGHUP, signal.SIGINT)])
def test_the_command_ignores_the_signals_a_subprocess_would(tmp_path, ignored):
    """A job started in the background by a shell ignores SIGINT, under nohup SIGHUP: the
    command inherits that as from subprocess.Popen, and nothing the exec program set."""
    before = {signum: signal.signal(signum, signal.SIG_IGN) for signum in ignored}
    try:
        plain = subprocess.Popen(["/bin/sh", "-c", IGNORED, str(tmp_path / "plain")])
        assert plain.wait(timeout=30) == 0
        with (tmp_path / "log").open("wb") as log:
            argv = ["/bin/sh", "-c", IGNORED, str(tmp_path / "ours")]
            child = spawn(lambda: popen_in_session(argv, dict(os.environ), log))
            assert child.wait(timeout=30) == 0
    finally:
        for signum, handler in before.items():
            signal.signal(signum, handler)
    # Signals 1-31 only: 32 and 33 are glibc's own (no program sets them) and read as ignored
    # or not depending on how the parent was started (a 3.13 Popen child shows 33 ignored).
    standard = (1 << 31) - 1
    ours = int((tmp_path / "ours").read_text().split()[1], 16) & standard
    assert ours == int((tmp_path / "plain").read_text().split()[1], 16) & standard
    for signum in (signal.SIGINT, signal.SIGHUP, signal.SIGPIPE, signal.SIGXFSZ):
        assert bool(ours & (1 << (signum - 1))) == (signum in ignored), signal.Signals(signum)


@pytest.mark.parametrize(
    ("argv", "errno_"), [(["true", "x" * 200_000], 7), ([""], 0)], ids=["too-long", "empty-name"]
)
def test_a_start_that_fails_before_the_exec_is_an_error_naming_the_command(tmp_path, argv, errno_):
    """Too long a command line names the command, not the Python that runs the exec program;
    any failure of that program before the exec is raised, never a start that looks fine."""
    before = {child.pid for child in psutil.Process().children()}
    with (tmp_path / "out").open("wb") as out, pytest.raises(OSError) as info:
        spawn(lambda: popen_in_session(argv, dict(os.environ), out))
    assert info.value.errno == errno_
    assert info.value.filename == argv[0]
    assert [c for c in psutil.Process().children() if c.pid not in before] == []
    assert (tmp_path / "out").read_bytes() == b""


@pytest.mark.parametrize("spawner", ["running", "the process's first"])
def test_a_ctrl_c_at_any_point_of_spawn_never_leaves_a_child_starting_after_it(
    monkeypatch, spawner
):
    """A Ctrl-C as the spawner's submit() returned (before spawn's wait began) escaped spawn at
    once, and the job started the command after: a child no one tracked, stopped or reaped
    (review round 30, H-F6). The spawner's queue was published before its thread started: a
    Ctrl-C in between (a process's first spawn) left a queue no one read, and every later
    spawn waited for good (round 31, J-F1). At every point of spawn: a job not begun never
    runs, one under way is waited for, and the next spawn ends."""
    import threading

    from _support import codes_of, interrupted_at_point
    from verirl.server.child import _Spawner, _wait_through, spawn

    codes = codes_of(spawn, _Spawner.submit, _wait_through)
    children: list[subprocess.Popen[bytes]] = []

    def job() -> subprocess.Popen[bytes]:
        child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
        children.append(child)
        return child

    def next_spawn(ended: threading.Event) -> None:
        spawn(lambda: subprocess.Popen([sys.executable, "-c", ""])).wait(10)
        ended.set()

    def spawner_for_this_point() -> None:
        if spawner != "running":
            monkeypatch.setattr(_child, "_SPAWNER", _Spawner())

    try:
        spawner_for_this_point()
        points = interrupted_at_point(codes, None, lambda: spawn(job))
        assert points > 3
        for point in range(1, points + 1):
            where = f"a Ctrl-C at point {point} of {points}"
            spawner_for_this_point()
            interrupted_at_point(codes, point, lambda: spawn(job))
            when_it_raised = [child.pid for child in children]
            ended = threading.Event()
            threading.Thread(target=next_spawn, args=(ended,), daemon=True).start()
            assert ended.wait(30), f"the spawn after {where} hangs"
            assert [child.pid for child in children] == when_it_raised, where
    finally:
        for child in children:
            child.kill()
            child.wait(10)


# pid 1 of a pid namespace of its own, where the test chooses the next pid: the server is
# stopped and reaped, then a stranger's process group gets the server's pid.
_REUSED_SERVER_GROUP = """
import os, signal, subprocess, sys, time
import psutil
from verirl.server.child import popen_in_session, spawn
from verirl.server.process import ProcessTree

with open(os.devnull, "wb") as log:
    popen = spawn(lambda: popen_in_session([sys.executable, "-c", "pass"], os.environ, log))
tree = ProcessTree(popen, "no-marker")
assert tree.shutdown(5.0)
assert popen.returncode is not None  # reaped
with open("/proc/sys/kernel/ns_last_pid", "w") as last:
    last.write(str(popen.pid - 1))
stranger = subprocess.Popen(["sh", "-c", "sleep 60 & echo $!; wait"], stdout=subprocess.PIPE,
                            start_new_session=True)
member = int(stranger.stdout.readline())
assert stranger.pid == popen.pid, (stranger.pid, popen.pid)
tree.shutdown(5.0)  # a second stop (the exit hook after the with block's)
def alive():
    try:
        return psutil.Process(member).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
deadline = time.monotonic() + 3  # a signal sent takes effect within it
while alive() and time.monotonic() < deadline:
    time.sleep(0.02)
print(alive(), flush=True)
"""


@linux_only
def test_a_second_stop_never_signals_a_group_that_took_the_reaped_server_s_pid(tmp_path):
    """A stop reaps the server; a later stop sent SIGTERM and SIGKILL to the server's pid as a
    group id, which the kernel may have given to a stranger's group meanwhile."""
    program = tmp_path / "reuse.py"
    program.write_text(_REUSED_SERVER_GROUP)
    unshare = shutil.which("unshare") or "unshare"
    result = subprocess.run(
        [unshare, "--pid", "--fork", "--mount-proc", sys.executable, str(program)],
        capture_output=True, text=True, timeout=60, check=False,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["True"]  # the stranger's member still runs

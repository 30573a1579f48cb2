"""The server's start: a child tied to our life, forked from one long-lived thread.

- **Death signal.** `start_child` has a child ask the kernel (Linux
  ``PR_SET_PDEATHSIG``) for SIGTERM when its parent dies, so even a SIGKILLed
  trainer takes its server along; the CLI's ``launch`` uses it too. It asks
  from a small ``python -I -S`` program that then execs the command, never
  from a ``preexec_fn``: that runs every library's at-fork hooks in the forked
  child of a threaded parent (huggingface_hub's closes its HTTP client), and
  one waiting on a lock another thread held at the fork hangs the child before
  it ever execs.
- **Spawner thread.** The kernel sends that signal when the *thread* that
  forked the child exits, so `spawn` forks from one long-lived daemon thread
  (reset in a forked child, which has none).
- **Subreaper.** `set_child_subreaper` makes orphaned descendants ours to reap.

`verirl.server.process` finds and takes down what was started. Its log
records go to the ``verirl.vllm_server`` logger: they are the server's.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import functools
import logging
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Collection, Mapping, Sequence
from concurrent.futures import Future
from concurrent.futures import wait as wait_futures
from typing import Any, BinaryIO

__all__ = [
    "child_subreaper",
    "death_signal_preexec",
    "popen_in_session",
    "set_child_subreaper",
    "set_death_signal",
    "spawn",
    "start_child",
]

log = logging.getLogger("verirl.vllm_server")

_KILL_WAIT = 5.0
_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36
_PR_GET_CHILD_SUBREAPER = 37


@functools.cache
def _prctl() -> Callable[..., int] | None:
    """The C library's ``prctl`` (Linux only), resolved in the parent, not the forked child."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        function = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong]
    function.restype = ctypes.c_int
    return function


def death_signal_preexec() -> Callable[[], None] | None:
    """A ``preexec_fn`` asking the kernel to SIGTERM the child when its parent dies.

    SIGTERM rather than SIGKILL, so that the server still stops its own
    workers. If the parent already died between fork and ``prctl`` (then
    ``getppid`` no longer names it), the child exits at once.
    """
    prctl = _prctl()
    if prctl is None:
        return None
    parent = os.getpid()
    sigterm = int(signal.SIGTERM)

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, sigterm, 0)
        if os.getppid() != parent:
            os._exit(1)

    return preexec


_EXEC_PROGRAM = """\
import os, signal, sys
if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # ours; an ignored one stays
    signal.signal(signal.SIGINT, signal.SIG_DFL)
for name in ("SIGPIPE", "SIGXFSZ"):
    if hasattr(signal, name):
        signal.signal(getattr(signal, name), signal.SIG_DFL)
parent, report, group = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3] == "1"
os.set_inheritable(report, False)
unblock = {int(number) for number in sys.argv[4].split(",") if number}
if sys.argv[5] == "-":  # Python's C locale coercion set LC_CTYPE for its children: undone
    os.environ.pop("LC_CTYPE", None)
else:
    os.environ["LC_CTYPE"] = sys.argv[5][1:]
argv = sys.argv[6:]
try:
    if group:
        os.setpgid(0, 0)
    if unblock:
        if hasattr(signal, "sigtimedwait"):
            while signal.sigtimedwait(unblock, 0) is not None:
                pass
        signal.pthread_sigmask(signal.SIG_UNBLOCK, unblock)
    if sys.platform.startswith("linux"):
        import ctypes
        ctypes.CDLL(None).prctl(1, int(signal.SIGTERM), 0)
    if os.getppid() != parent:
        os._exit(1)
    os.execvpe(argv[0], argv, os.environ)
except BaseException as exc:  # anything that stops the exec is the parent's error to raise
    number = getattr(exc, "errno", None) or 0
    told = getattr(exc, "strerror", None) or f"{type(exc).__name__}: {exc}"
    os.write(report, f"{number}:{told}".encode(errors="replace"))
os._exit(127)
"""
"""Run by ``python -I -S -c`` between the fork and the command: what a ``preexec_fn`` did.

Its arguments: the parent's pid, the report pipe, whether to make a group,
the signals to unblock (pending ones dropped first), ``LC_CTYPE`` as given
(``-`` for none, else ``=value``), then the command. It restores what its own
start-up changed (signal dispositions; ``LC_CTYPE``, which Python's C-locale
coercion sets in the environment), so the command starts as ``subprocess``
would start it; an ``exec`` failure is written to the report pipe (closed on
a successful ``exec``), as ``subprocess`` does.
"""


_EXEC_DEADLINE = 60.0
"""How long a child may take to reach its command's ``exec`` (a Python start-up)."""


def _exec_wrapper() -> str | None:
    """The Python that runs `_EXEC_PROGRAM`; ``None`` where none can (frozen, embedded)."""
    executable = sys.executable
    if not executable or getattr(sys, "frozen", False) or not os.access(executable, os.X_OK):
        return None
    return executable


def _popen_named(
    program: str,
    python: str,
    argv: list[str],
    **kwargs: Any,  # noqa: ANN401 - Popen's own
) -> subprocess.Popen[bytes]:
    """``Popen(argv)`` of the exec program; an error it raises about the command names ``program``.

    Too long an environment or command line (E2BIG) is the command's, not the Python's.
    """
    try:
        return subprocess.Popen(argv, **kwargs)
    except OSError as exc:
        if exc.errno == errno.E2BIG and exc.filename == python:
            raise OSError(exc.errno, exc.strerror, program) from None
        raise


def _above_stdio(fd: int) -> int:
    """``fd``, or a copy of it numbered 3 or more (the original closed).

    A closed stdin, stdout or stderr frees 0-2 for a new pipe; the child's own
    stdio would then replace (or be) the report pipe.
    """
    if fd > 2:  # noqa: PLR2004 - stderr's number
        return fd
    try:
        return fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 3)
    finally:
        os.close(fd)


def _read_report(fd: int, child: subprocess.Popen[bytes]) -> bytes:
    """What the exec program reported before its ``exec`` (empty once it exec'd), bounded."""
    import selectors  # noqa: PLC0415 - only on this path

    report = b""
    deadline = time.monotonic() + _EXEC_DEADLINE
    with selectors.DefaultSelector() as selector:
        selector.register(fd, selectors.EVENT_READ)
        while (left := deadline - time.monotonic()) > 0:
            if not selector.select(left):
                continue
            chunk = os.read(fd, 4096)
            if not chunk:
                return report
            report += chunk
    log.warning(
        "pid %d did not reach its command's exec within %.0fs; going on without knowing",
        child.pid,
        _EXEC_DEADLINE,
    )
    return report


def start_child(
    argv: Sequence[str],
    environ: Mapping[str, str],
    *,
    stdin: int | BinaryIO | None = None,
    stdout: int | BinaryIO | None = None,
    stderr: int | BinaryIO | None = None,
    new_session: bool = False,
    new_group: bool = False,
    unblock: Collection[int] = (),
) -> subprocess.Popen[bytes]:
    """Start ``argv`` tied to our life: SIGTERM when this process dies (Linux).

    ``new_group`` gives it a process group of its own, ``unblock`` the signals
    it must not inherit blocked (pending ones are dropped). Returns once the
    command is exec'd; a command that cannot be exec'd raises the `OSError`
    ``subprocess`` would. No Python runs in the forked child: see the module
    docstring. Call it inside a `spawn` job, so that the death signal watches
    the long-lived spawner thread.
    """
    if not argv:
        msg = "start_child: argv is empty"
        raise ValueError(msg)
    popen_args: dict[str, Any] = {
        "stdin": stdin,
        "stdout": stdout,
        "stderr": stderr,
        "env": environ,
        "start_new_session": new_session,
    }
    python = _exec_wrapper()
    if python is None:
        return _start_with_preexec(argv, popen_args, new_group=new_group, unblock=unblock)
    read_end, write_end = (_above_stdio(fd) for fd in os.pipe())
    try:
        try:
            child = _popen_named(argv[0], python,
                [python, "-I", "-S", "-c", _EXEC_PROGRAM, str(os.getpid()), str(write_end),
                 "1" if new_group else "0", ",".join(str(int(n)) for n in sorted(unblock)),
                 "-" if "LC_CTYPE" not in environ else f"={environ['LC_CTYPE']}", *argv],
                **popen_args, pass_fds=(write_end,),
            )  # fmt: skip
        finally:
            os.close(write_end)
        report = _read_report(read_end, child)
    finally:
        os.close(read_end)
    if not report:
        return child
    with contextlib.suppress(subprocess.TimeoutExpired):
        child.wait(_KILL_WAIT)
    for stream in (child.stdin, child.stdout, child.stderr):
        if stream is not None:  # pipes the caller asked for: never handed over
            stream.close()
    number, _, message = report.decode(errors="replace").partition(":")
    raise OSError(int(number) if number.isdigit() else 0, message, argv[0])


def _start_with_preexec(
    argv: Sequence[str], popen_args: dict[str, Any], *, new_group: bool, unblock: Collection[int]
) -> subprocess.Popen[bytes]:
    """`start_child` with no Python to run the exec program: a ``preexec_fn`` after all."""
    death_signal = death_signal_preexec()
    stopping = set(unblock)

    def preexec() -> None:
        if new_group:
            os.setpgid(0, 0)
        if stopping:
            if hasattr(signal, "sigtimedwait"):  # not on macOS
                while signal.sigtimedwait(stopping, 0) is not None:
                    pass
            signal.pthread_sigmask(signal.SIG_UNBLOCK, stopping)
        if death_signal is not None:
            death_signal()

    return subprocess.Popen(list(argv), **popen_args, preexec_fn=preexec)  # noqa: PLW1509 - only where no Python can run the exec program


def set_death_signal(signum: int) -> bool:
    """Ask the kernel to send ``signum`` to this process when its parent dies (Linux).

    False where ``prctl`` is unavailable or refused. (The signal comes when the
    parent *thread* that forked us exits; launchers fork from their main thread.)
    """
    prctl = _prctl()
    if prctl is None:
        return False
    return prctl(_PR_SET_PDEATHSIG, signum, 0) == 0


def set_child_subreaper(on: bool) -> bool | None:
    """Make this process the one its orphaned descendants are reparented to (Linux); or stop.

    Returns the setting it had before (to restore), ``None`` where ``prctl``
    is unavailable or refused. A descendant that left the command's group and
    session and cleared its environment (``setsid env -i …``) can then still be
    found: as a child of this process.
    """
    prctl = _prctl()
    before = child_subreaper()
    if prctl is None or before is None or prctl(_PR_SET_CHILD_SUBREAPER, int(on), 0) != 0:
        return None
    return before


def child_subreaper() -> bool | None:
    """Whether this process is a child subreaper (Linux); ``None`` where ``prctl`` cannot say."""
    prctl = _prctl()
    if prctl is None:
        return None
    value = ctypes.c_int(0)
    if prctl(_PR_GET_CHILD_SUBREAPER, ctypes.addressof(value), 0) != 0:
        return None
    return bool(value.value)


_Job = tuple[Callable[[], Any], Future[Any]]


class _Spawner:
    """Starts child processes from one long-lived daemon thread.

    Linux sends ``PR_SET_PDEATHSIG`` when the *thread* that forked the child
    exits, not the process. A server started from a short-lived thread (a
    thread pool overlapping startup with other work) would be killed as soon
    as that thread finished, so every spawn goes through this thread instead,
    which lives as long as the process.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._jobs: queue.SimpleQueue[_Job] | None = None

    def submit(
        self, job: Callable[[], subprocess.Popen[bytes]], future: Future[subprocess.Popen[bytes]]
    ) -> None:
        """Queue ``job``; ``future`` gets its outcome, or is skipped if cancelled before it runs."""
        with self._lock:
            if self._jobs is None:
                jobs: queue.SimpleQueue[_Job] = queue.SimpleQueue()
                thread = threading.Thread(
                    target=self._run, args=(jobs,), name="verirl-vllm-spawner", daemon=True
                )
                thread.start()
                self._jobs = jobs  # only once its thread runs: never a queue no one reads
            jobs = self._jobs
        jobs.put((job, future))

    @staticmethod
    def _run(jobs: queue.SimpleQueue[_Job]) -> None:
        while True:
            job, future = jobs.get()
            if not future.set_running_or_notify_cancel():
                continue
            try:
                result = job()
            except BaseException as exc:  # noqa: BLE001 - handed to the caller through the future
                future.set_exception(exc)
            else:
                future.set_result(result)

    def reset_after_fork(self) -> None:
        """A forked child has no spawner thread; start a fresh one on demand."""
        self._lock = threading.Lock()
        self._jobs = None


_SPAWNER = _Spawner()


def spawn(job: Callable[[], subprocess.Popen[bytes]]) -> subprocess.Popen[bytes]:
    """Run ``job`` on the spawner thread and return its result.

    Interrupted meanwhile (Ctrl-C, SIGTERM as ``SystemExit``), anywhere from
    its first statement on: a job not begun never runs, and one under way is
    waited for, then the interruption raised. The job records the child it
    started (see `Run`), so the caller's teardown can reach it; no child starts
    after `spawn` has raised.
    """
    future: Future[subprocess.Popen[bytes]] = Future()
    try:
        _SPAWNER.submit(job, future)
        wait_futures([future])
        return future.result()
    finally:
        if not future.cancel():  # under way or done: waited for, whatever comes meanwhile
            _wait_through(future)


def _wait_through(future: Future[Any]) -> None:
    """Wait for ``future``; an interruption meanwhile is raised once it is done."""
    interrupted: BaseException | None = None
    while not future.done():
        try:
            wait_futures([future])
        except BaseException as exc:  # noqa: BLE001, PERF203 - re-raised below, once it is done
            interrupted = interrupted or exc
    if interrupted is not None:
        raise interrupted


def popen_in_session(
    argv: Sequence[str], environ: Mapping[str, str], output: BinaryIO
) -> subprocess.Popen[bytes]:
    """Start ``argv`` in its own session, tied to our life, stdout and stderr to ``output``.

    Call it inside a `spawn` job, so that the death signal watches the
    long-lived spawner thread.
    """
    return start_child(
        argv,
        environ,
        stdin=subprocess.DEVNULL,
        stdout=output,
        stderr=subprocess.STDOUT,
        new_session=True,
    )

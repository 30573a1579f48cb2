"""The server's processes: started tied to our life, found, and taken down to the last one.

One concern, kept apart from `verirl.vllm_server` (which decides *what* runs and
*when* it is ready) because it is the part that must never leave a GPU held:

- **Start.** `verirl.server.child` starts the server tied to our life (the
  death signal, the spawner thread).
- **Process tree.** `ProcessTree` remembers the server, its group and every
  descendant, including workers that left the group (found by `MARKER_VAR` in
  their environment), and takes them all down: SIGTERM, a grace period,
  SIGKILL, reap.
- **Run record.** `Run` notes what one start holds (the SIGTERM policy) and
  spawned, as it happens, so that an interruption at any point finds it.
- **Exit hook.** A server still running when the interpreter exits is
  stopped then (`stop_at_exit`); a forked child forgets its parent's.

Its log records go to the ``verirl.vllm_server`` logger: they are the server's.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import signal
import subprocess
import threading
import time
from collections.abc import Iterator
from typing import Any, Protocol

import attrs
import psutil

from verirl import _procfs
from verirl._signals import SIGTERM_POLICY
from verirl.server.child import (
    _KILL_WAIT,
    _SPAWNER,
)

__all__ = [
    "MARKER_VAR",
    "ProcessTree",
    "Run",
    "Stoppable",
    "alive",
    "forget_at_exit",
    "stop_all_servers",
    "stop_at_exit",
]

log = logging.getLogger("verirl.vllm_server")

MARKER_VAR = "VERIRL_VLLM_SERVER_MARKER"
"""Set in every server's environment (inherited by its workers), so teardown finds orphans."""


# ---------------------------------------------------------------- the death signal


# ---------------------------------------------------------------- the spawner thread


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_SPAWNER.reset_after_fork)


@attrs.define(eq=False)
class Run:
    """One server start: what it holds and spawned, recorded as it happens.

    The spawner thread sets ``popen`` the moment the child exists, so an
    interruption at any point after the spawn still finds the child to stop.
    """

    marker: str
    popen: subprocess.Popen[bytes] | None = None
    tree: ProcessTree | None = None

    def hold_sigterm(self) -> None:
        """Hold `SIGTERM_POLICY` as this run (see `SigtermPolicy.acquire`'s ``holder``)."""
        SIGTERM_POLICY.acquire(self)

    def release_sigterm(self) -> None:
        """Release this run's hold on `SIGTERM_POLICY`, if it has one: at most once."""
        SIGTERM_POLICY.release(self)


# ---------------------------------------------------------------- stopped at exit


class Stoppable(Protocol):
    """What the exit hook stops: a server of this process."""

    def stop(self) -> None:
        """Stop, and everything started with it."""


_RUNNING: set[Stoppable] = set()


def stop_at_exit(server: Stoppable) -> None:
    """Stop ``server`` when the interpreter exits, unless `forget_at_exit` came first."""
    _RUNNING.add(server)


def forget_at_exit(server: Stoppable) -> None:
    """``server`` is gone: the exit hook has nothing to stop for it."""
    _RUNNING.discard(server)


def stop_all_servers() -> None:
    """Stop every server of this process not stopped yet (the exit hook; idempotent)."""
    for server in list(_RUNNING):
        try:
            server.stop()
        except Exception:  # noqa: PERF203 - one failing server must not keep the others running
            log.exception("stopping %r at exit failed", server)


def _forget_all_in_child() -> None:
    # A forked child does not inherit the servers: they are the parent's.
    _RUNNING.clear()


atexit.register(stop_all_servers)
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_all_in_child)


# ---------------------------------------------------------------- the process tree


def alive(process: psutil.Process) -> bool:
    """Whether ``process`` runs and is no zombie (an orphan's zombie may never be reaped).

    A process whose main thread has ended while others run (Zl) reads as a
    zombie to psutil, yet it is alive and may hold a GPU: `verirl._procfs` tells.
    """
    try:
        return process.is_running() and _procfs.running(process.pid)
    except psutil.NoSuchProcess:
        return False
    except psutil.Error:
        return True


def _tcp_connections(process: psutil.Process) -> list[Any]:
    """``process``'s TCP sockets (psutil >= 6 ``net_connections``, older ``connections``)."""
    method = getattr(process, "net_connections", None) or process.connections
    return list(method(kind="tcp"))


def _listening(connection: Any, port: int) -> bool:  # noqa: ANN401 - psutil's named tuples
    """Whether ``connection`` is a socket listening on ``port``."""
    address = connection.laddr
    return bool(connection.status == psutil.CONN_LISTEN and address and address.port == port)


def _marked_processes(marker: str, since: float) -> Iterator[psutil.Process]:
    """Processes created after ``since`` whose environment carries ``marker``.

    Every process the server starts inherits the marker, so this finds its
    workers even after they left its session and were orphaned. The
    environment is read through `verirl._procfs`: psutil's fails for a worker
    whose main thread has ended while its others run (Zl).
    """
    me = os.getpid()
    for process in psutil.process_iter():
        try:
            if process.pid == me or process.create_time() < since:
                continue
        except (psutil.Error, OSError):
            continue
        environ = _procfs.environ(process.pid)
        if environ is not None and environ.get(MARKER_VAR) == marker:
            yield process


@attrs.define(eq=False)
class ProcessTree:
    """The server process, its group, and every descendant ever seen."""

    popen: subprocess.Popen[bytes]
    marker: str
    leader: psutil.Process | None = attrs.field(default=None, init=False)
    since: float = attrs.field(default=0.0, init=False)
    seen: dict[int, psutil.Process] = attrs.field(factory=dict, init=False)
    stopping: threading.Event = attrs.field(factory=threading.Event, init=False)
    ready: bool = attrs.field(default=False, init=False)
    grace_ends: float | None = attrs.field(default=None, init=False)  # of the shutdown under way
    cut_short: threading.Event = attrs.field(factory=threading.Event, init=False)  # the grace's

    def __attrs_post_init__(self) -> None:
        try:
            self.leader = psutil.Process(self.popen.pid)
            self.since = self.leader.create_time() - 1.0
        except psutil.Error:
            self.since = time.time() - 60.0

    @property
    def pid(self) -> int:
        """The server process's id."""
        return self.popen.pid

    def exited(self) -> bool:
        """Whether the server process has exited, without reaping it."""
        return self.popen.returncode is not None or self.exit_status() is not None

    def exit_status(self) -> int | None:
        """The exit code (negative: killed by that signal) once exited, without reaping.

        Not reaping keeps the server's pid (which is also its group id)
        reserved, so a later ``killpg`` cannot reach an unrelated group that
        reused the number.
        """
        if self.popen.returncode is not None:
            return self.popen.returncode
        if hasattr(os, "waitid"):
            flags = os.WEXITED | os.WNOHANG | os.WNOWAIT
            try:
                info = os.waitid(os.P_PID, self.popen.pid, flags)
            except ChildProcessError:
                return self.popen.poll()
            if info is None:
                return None
            return info.si_status if info.si_code == os.CLD_EXITED else -info.si_status
        return self.popen.poll()

    def collect(self) -> None:
        """Remember current descendants and marked orphans (pid + creation time)."""
        found: list[psutil.Process] = []
        if self.leader is not None:
            with contextlib.suppress(psutil.Error):
                found += self.leader.children(recursive=True)
        found += [p for p in _marked_processes(self.marker, self.since) if p.pid != self.pid]
        for process in found:
            known = self.seen.get(process.pid)
            if known is None or not alive(known):
                self.seen[process.pid] = process

    def listens_on(self, port: int) -> bool | None:
        """Whether the server or a descendant has a TCP socket listening on ``port``.

        ``None`` when the system denies reading the sockets (then no proof
        either way). The port check before the spawn cannot rule out another
        server that binds later, so a 200 counts only with this proof.
        """
        members: list[psutil.Process] = []
        denied = False
        with contextlib.suppress(psutil.Error):
            leader = self.leader or psutil.Process(self.pid)
            members = [leader]
            # The leader holds the socket in vLLM and the fake alike: asking it first spares
            # the walk over every process on the machine that finding descendants costs.
            try:
                if any(_listening(c, port) for c in _tcp_connections(leader)):
                    return True
            except psutil.AccessDenied:
                denied = True
            members = [leader, *leader.children(recursive=True)]
        for process in members[1:]:
            try:
                if any(_listening(c, port) for c in _tcp_connections(process)):
                    return True
            except psutil.AccessDenied:  # noqa: PERF203 - one process at a time, few of them
                denied = True
            except psutil.Error:
                continue
        if not denied:
            return False
        try:  # another view: the system-wide table, which names each socket's process
            table = psutil.net_connections(kind="tcp")
        except (psutil.Error, OSError):
            return None
        pids = {process.pid for process in members}
        owners = {c.pid for c in table if _listening(c, port)}
        if owners & pids:
            return True
        return False if owners and None not in owners else None

    def signal_all(self, sig: int) -> None:
        """``sig`` to the group, and to each remembered descendant outside it.

        Once the server is reaped (`gone` reaps; a stop after a stop) its pid,
        the group's id, may name another group: then each remembered process
        gets it on its own, never the id.
        """
        grouped = self.popen.returncode is None
        if grouped:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, sig)
        for process in self.seen.values():
            if grouped and sig == signal.SIGTERM:
                with contextlib.suppress(OSError):
                    if os.getpgid(process.pid) == self.pid:
                        continue  # the group signal reached it
            with contextlib.suppress(psutil.Error):
                process.send_signal(sig)  # psutil refuses a pid that was reused

    def survivors(self) -> list[psutil.Process]:
        """The processes of the tree seen so far that are still alive."""
        return [process for process in self.seen.values() if alive(process)]

    def wait_gone(self, deadline: float, *, grace: bool = False) -> bool:
        """Wait until the server and every remembered descendant are gone; False at deadline.

        A ``grace`` ends early, False, once `cut_short` is set (a Ctrl-C in
        another thread that waits for this stop).
        """
        delay = 0.001
        while True:
            if self.exited() and not self.survivors():
                return True
            now = time.monotonic()
            if now >= deadline or (grace and self.cut_short.is_set()):
                return False
            if grace:
                self.cut_short.wait(min(delay, deadline - now))
            else:
                time.sleep(min(delay, deadline - now))
            delay = min(delay * 2, 0.02)

    def gone(self, *, rescan: bool) -> bool:
        """Whether the server and every descendant (rescanned first if asked) are gone; reaps."""
        if not self.exited():
            return False
        if rescan:
            with contextlib.suppress(psutil.Error, OSError):
                self.collect()
        if self.survivors():
            return False
        with contextlib.suppress(OSError):
            self.popen.poll()  # reap, now that nothing can reuse the group id against us
        return True

    def kill_now(self) -> None:
        """SIGKILL all that is found, wait (bounded) for it to go, reap; no OS error escapes.

        (Only those: a bug of verirl's must show, not leave a kill half done unseen.)
        """
        with contextlib.suppress(psutil.Error, OSError):
            self.collect()
            self.signal_all(signal.SIGKILL)
            # SIGKILL is delivered asynchronously; wait until the tree is really gone.
            self.wait_gone(time.monotonic() + _KILL_WAIT)
        with contextlib.suppress(subprocess.TimeoutExpired, OSError):
            self.popen.wait(timeout=_KILL_WAIT)

    def shutdown(self, grace: float) -> bool:
        """SIGTERM everything, ``grace`` seconds, SIGKILL the rest, reap. True if it was clean.

        Interrupted (a second Ctrl-C), it skips the grace, SIGKILLs at once,
        reaps and re-raises. One called during another (a ``stop()`` in a
        signal's handler) keeps the grace under way: it ends no later.
        """
        clean = False
        outer = self.grace_ends is None
        grace_ends = time.monotonic() + grace
        if self.grace_ends is not None:
            grace_ends = min(grace_ends, self.grace_ends)
        self.grace_ends = grace_ends
        try:
            self.collect()
            self.signal_all(signal.SIGTERM)
            self.signal_all(signal.SIGCONT)  # a stopped (hung, SIGSTOPped) process acts on it then
            clean = self.wait_gone(grace_ends, grace=True)
            if not clean and self.cut_short.is_set():
                log.warning("interrupted: sending SIGKILL to vLLM server pid %d", self.pid)
            elif not clean:
                log.warning(
                    "vLLM server pid %d still running %.1fs after SIGTERM; sending SIGKILL "
                    "(processes: %s)",
                    self.pid,
                    grace,
                    ", ".join(str(p.pid) for p in self.survivors()) or "the server itself",
                )
            # Always a last sweep: anything forked during the shutdown, or orphaned.
            self.collect()
            self.signal_all(signal.SIGKILL)
            if not self.wait_gone(time.monotonic() + _KILL_WAIT):
                log.error(
                    "processes of the vLLM server survive SIGKILL (stuck in the kernel?): %s",
                    ", ".join(str(p.pid) for p in self.survivors()),
                )
        except BaseException:
            self.kill_now()
            raise
        finally:
            if outer:
                self.grace_ends = None
            try:
                self.popen.wait(timeout=_KILL_WAIT)
            except subprocess.TimeoutExpired:
                log.exception("vLLM server pid %d could not be reaped", self.pid)
        return clean

    def take_down(self, grace: float, log_path: object) -> bool:
        """`shutdown`, with what happened logged; True once every process is gone.

        A server that had exited while in use (a crash) is reported first.
        Interrupted, it SIGKILLs everything at once and re-raises (`gone`
        tells then whether anything survived).
        """
        started = time.monotonic()
        try:
            status = self.exit_status()
            if status is not None and self.ready:
                log.warning(
                    "the vLLM server had already exited (code %s); see %s", status, log_path
                )
            clean = self.shutdown(grace)
        except BaseException:
            self.kill_now()
            if not self.gone(rescan=True):
                log.error(  # noqa: TRY400 - no traceback: the exception propagates
                    "stopping the vLLM server pid %d was interrupted and processes may "
                    "survive; stop() will try again",
                    self.pid,
                )
            raise
        if not self.gone(rescan=False):
            log.error(
                "processes of the vLLM server pid %d survive; stop() will try again: %s",
                self.pid,
                ", ".join(str(p.pid) for p in self.survivors()) or "the server itself",
            )
            return False
        log.info(
            "stopped vLLM server pid %d in %.2fs%s",
            self.pid,
            time.monotonic() - started,
            "" if clean else " (SIGKILL needed)",
        )
        return True

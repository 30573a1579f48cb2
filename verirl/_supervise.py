"""Run ``verirl launch``'s training command so that it never outlives the launcher.

**One signal, once.** The command runs in a process group of its own (in
launch's session, so it still writes to the terminal), and each SIGINT or
SIGTERM that launch receives is passed on to each of its processes exactly once.
From a terminal, Ctrl-C signals only launch's group, so the command does not
get a second copy straight from the terminal; a ``sh -c 'python train.py'``
wrapper's python gets it as it would from a terminal. That matters because
a second SIGINT means "out now, skip the checkpoint" to
`verirl.preemption.PreemptionCallback`. The price: the command is not in the
terminal's foreground group, so it cannot read the terminal's stdin (it would
be stopped with SIGTTIN), and the terminal's SIGTSTP (Ctrl-Z) and SIGQUIT reach
launch only (which passes SIGQUIT on, see below).

**Other signals: passed on, launch goes on.** Each other signal whose
default ends a process (`verirl._signals.TERMINATING`: SIGQUIT, SIGUSR1,
SIGUSR2, SIGALRM, ..., SLURM's ``--signal=USR1@60``) is, while the command
runs, passed on to each of its processes once per arrival (arrivals that
come before launch's handler runs are one: Python runs a handler once for
them, in signal-number order, even for the queued real-time ones), found as for
SIGTERM below (a daemon in a session of its own included), the command last;
there is no grace and no SIGKILL: launch waits on, and exits with the
command's code (128+N if it died of it). Left out: the processes an inner
launch passes it on to, a torchrun rank for SIGQUIT only (the one of them
torchrun's agent passes on), and a vLLM server's (its owner's to stop).
Before the command is started (the CLI's start-up: env wait, vLLM start,
resume) the CLI makes such a signal a SIGTERM (`verirl._signals.as_sigterm`):
exit 143, and the same teardown. Launch installs its handler only over the
default or the CLI's `as_sigterm` (an inherited ``SIG_IGN`` stays), on the
main thread; the handler only queues the signal and wakes the wait
(`_Forwarding`), which passes it on (`_Command.forward_queued`), during a
grace too. One that comes once the command and all it left are gone is
logged and dropped.

**Grace, then SIGKILL.** After passing a signal on, launch waits up to
``grace`` seconds for the command, and for what was in its group then (a
shell that dies of SIGTERM at once must not end the wait while its python
still saves), then SIGKILLs the group. A Ctrl-C after the first signal
SIGKILLs the group at once, and so does a SIGTERM after a Ctrl-C; a second
SIGTERM is ignored (the one SIGTERM policy fires once), so a save in progress
completes. The command also gets the death signal (SIGTERM when verirl dies).

**Nothing outlives launch.** Every process the command starts carries
`LAUNCH_MARKER_VAR` in its environment (inherited), so launch finds those that
left the group or the session (a daemon, torchrun's ranks) as well as its
descendants; launch is also a child subreaper (Linux) and checks the
command's process group, so a process that dropped its environment
(``env -i``, ``setsid env -i``) is still found, as a member of the group or as
an orphan reparented to launch; and every descendant of a process found
(a child that set up a group of its own and dropped its environment under a
parent that still lives) is found too. On a signal, each process of the
command gets it once, from launch: the command's process group with one
``killpg`` (the kernel delivers it to every member at one instant, so a child
its parent forks just then is not missed: a fork in flight is restarted, or
its child gets the signal too), then each process found outside the group,
one at a time. A member of the group found later got it from that ``killpg``,
or was forked after its parent got it and is that parent's to stop: launch
never signals a member again. Outside the group, a process that
a live process of the command passes it on to (should that one die without
passing it on, launch does) is left to it: a rank of
torchrun (``TORCHELASTIC_RUN_ID`` in its environment) while its parent lives,
as torchrun forwards the signal to the ranks it started in sessions of their
own, and a rank stops what it started; and a process of a nested ``verirl
launch`` (a marker after ours in its environment: the inner launch marks its
vLLM server too, from its start (`mark_this_launch`), or, for one that dropped
its environment, such a launch among its ancestors) while that inner launch
lives, as it passes the signal on to its own command the same way. Each
time all those signalled are gone within the grace, launch looks again: a
process found then outside the group (an orphan adopted once its parent died
of the signal, or one started since) gets the same signal once, from launch,
and the rest of the grace; a process that got it is never sent it again
(each is known by pid and creation time). Once the command's leader is
reaped, its group id could name another group: then each member too gets the
signal from launch, one at a time. After the grace, whatever is left
is SIGKILLed, and launch keeps looking (a few seconds at most) until a look
finds nothing new, as a killed parent's orphans are only reparented to launch
once it is gone. When the command exits on its own, what it left running
gets SIGTERM the same way, the grace, then SIGKILL; a SIGTERM to launch then
changes nothing (they have theirs), a Ctrl-C SIGKILLs them at once, and
launch's exit code stays the command's.

A known limit: launch cannot tell that some other parent passes signals on to
a child it started outside the group (in a session or group of its own), so
such a child gets the signal twice, once from launch and once from its
parent; only torchrun's ranks and a nested launch's command are recognised.
The members of the group found are read right before its ``killpg``, so one
that leaves the group on the signal (``setsid`` in its handler) is not sent
it again; one that leaves in the microseconds between that read and the
``killpg`` misses it, and one forked after launch's look that leaves the group
just after the signal (in its handler, or a pool's worker calling ``setsid``
as it starts) gets it twice: launch cannot tell whether such a child left
before the ``killpg`` (and missed it) or after, and sends it again rather
than leave it to the grace's SIGKILL. Reading its group right before the
``killpg`` to tell them apart was tried: a worker leaving between that read
and the ``killpg`` then missed it (9 of 60 runs of a pool forking every 2 ms,
exit 137), where sending it again gave a duplicate in about 1 of 20.

The server watchdog (`verirl.server.watchdog`) reaches the main thread here the
same way a SIGTERM does, as the policy's interrupt: its `VLLMServerError`
arrives in the wait for the command, which then gets SIGTERM and the grace
like on a preemption (so a trainer with a save-on-SIGTERM callback writes
its checkpoint), and the error propagates (``launch`` exits 4). Once the
command has exited or a signal is being passed on, the watchdog is stopped
(``ending``): a server dying during a grace does not cut it short.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import logging
import os
import secrets
import select
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from types import FrameType

import attrs
import psutil

from verirl import _procfs
from verirl._fs import printable
from verirl._phases import SIGNAL_CHECK
from verirl._secrets import redact_argv, secrets_in_environ, shown_line
from verirl._signals import (
    TERMINATING,
    as_sigterm,
    hand_on,
    interruptions,
    mark_noted,
    must_not_raise,
    outside_tracers_lock,
    put_back,
    raise_if_dropped,
    replacing,
)
from verirl.errors import VLLMServerError
from verirl.server.child import child_subreaper, set_child_subreaper, spawn, start_child
from verirl.server.process import MARKER_VAR, alive

__all__ = ["LAUNCH_MARKER_VAR", "mark_this_launch", "run_command"]

log = logging.getLogger(__name__)

_STOPPING = (signal.SIGINT, signal.SIGTERM)
_REAP_WAIT = 1.0
"""Seconds to wait for the adopted orphans launch signalled to end, to reap them."""
_KILL_WAIT = 3.0
"""Seconds the final SIGKILL looks again for processes of the command (orphans adopted late)."""
_QUIET_GAP = 0.005
"""Seconds between `_Command.quiet`'s two looks: longer than the blink of a fork."""


def _signal_name(signum: int) -> str:
    """``SIGUSR1``, or ``signal 40`` for a real-time one (no name of its own)."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


@must_not_raise
def _kill_noted(pid: int, signum: int, reached: set[int]) -> None:
    """``os.kill`` and ``pid`` noted in ``reached``, one step: a handler landing here waits.

    (`verirl._signals.must_not_raise`: its exception is raised a moment later,
    once the record is made.)
    """
    try:
        os.kill(pid, signum)
    finally:
        reached.add(pid)


@must_not_raise
def _killpg_noted(pgid: int, signum: int, arrival: _Arrival) -> None:
    """``os.killpg`` and its outcome noted in ``arrival``, one step (see `_kill_noted`)."""
    arrival.grouped = False
    os.killpg(pgid, signum)
    arrival.grouped = True


@attrs.define(eq=False)
class _Arrival:
    """One arrival of a signal to pass on, and how far passing it on got.

    Kept in the queue until passed on to every process: an interruption
    (SIGTERM's exception) in the middle of passing it on leaves it at the
    head with what it reached (the command itself among ``reached``), and
    the next wait goes on from there, so no process misses it and none gets
    it twice.
    """

    signum: int
    grouped: bool | None = None  # the group's ``killpg``: None before it was tried
    reached: set[int] = attrs.field(factory=set)  # pids it was sent to one by one


class _Forwarding:
    """While installed, each of `TERMINATING` that arrives is queued to be passed on.

    Its handler only queues the signal and wakes the wait for the command (a
    byte on a pipe): the work of passing it on (a look at the process table)
    is done by the waits (`_Command.forward_queued`), never inside a handler
    that could interrupt a look in progress. Installed over the default or
    the CLI's `as_sigterm` only: an inherited ``SIG_IGN`` or a program's own
    handler stays. Main thread only (elsewhere nothing is installed).
    """

    def __init__(self) -> None:
        self.queue: list[_Arrival] = []
        self.installed: dict[int, object] = {}
        self.closed = False
        wake = os.pipe()  # not inherited by the command (PEP 446)
        try:
            for fd in wake:
                os.set_blocking(fd, False)
        except BaseException:
            for fd in wake:
                os.close(fd)
            raise
        self.wake_read, self.wake_write = wake

    def install(self) -> None:
        """Ours over each of `TERMINATING` whose handler is the default or `as_sigterm`.

        What it replaces is noted first, then ours set: a Ctrl-C between the
        two leaves nothing `close` does not know. One left behind by an
        earlier forwarding whose `close` a Ctrl-C cut short counts as what it
        had replaced.
        """
        if threading.current_thread() is not threading.main_thread():
            return
        for signum in TERMINATING:
            with contextlib.suppress(OSError, ValueError):
                previous: object = signal.getsignal(signum)
                stale = getattr(previous, "__self__", None)
                if isinstance(stale, _Forwarding) and stale.closed:
                    previous = stale.installed.get(signum, signal.SIG_DFL)
                if previous == signal.SIG_DFL or previous is as_sigterm:
                    self.installed[signum] = previous
                    signal.signal(signum, self._handle)

    @outside_tracers_lock
    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.closed:  # left installed by a close a Ctrl-C cut short: what it replaced acts
            previous = self.installed.get(signum, signal.SIG_DFL)
            signal.signal(signum, previous)  # type: ignore[arg-type]
            if previous is as_sigterm:
                as_sigterm(signum, frame)
            else:
                signal.raise_signal(signum)  # the default: as if this handler had never been
            return
        self.queue.append(_Arrival(signum))
        if self.wake_write >= 0:
            with contextlib.suppress(OSError):
                os.write(self.wake_write, b"\0")

    def drain(self) -> None:
        """Empty the wake pipe (the queue says what came)."""
        if self.wake_read >= 0:
            with contextlib.suppress(OSError):
                while os.read(self.wake_read, 4096):
                    pass

    def take(self) -> list[int]:
        """The signals queued since the last call, in the order their handler ran; pipe drained."""
        self.drain()
        taken = []
        while self.queue:
            taken.append(self.queue.pop(0).signum)
        return taken

    def close(self) -> None:
        """The previous handlers back (where ours is still the one), the pipe closed.

        Closed first: a handler of ours that a Ctrl-C keeps from being put back
        acts as the one it replaced (`_handle`), and the next `install` takes
        its place.
        """
        self.closed = True
        for signum, previous in self.installed.items():
            with contextlib.suppress(OSError, ValueError, TypeError):
                if signal.getsignal(signum) == self._handle:
                    signal.signal(signum, previous)  # type: ignore[arg-type]
        left = self.take()  # before the pipe is closed: its numbers may be reused at once
        fds, self.wake_read, self.wake_write = (self.wake_read, self.wake_write), -1, -1
        for fd in fds:
            with contextlib.suppress(OSError):
                os.close(fd)
        for signum in left:
            log.info(
                "%s came once the training command was gone: nothing to pass it on to",
                _signal_name(signum),
            )


LAUNCH_MARKER_VAR = "VERIRL_LAUNCH_MARKER"
"""In the command's environment: comma-separated markers, one per enclosing ``verirl launch``."""


def _start(
    command: Sequence[str], env: dict[str, str], started: list[subprocess.Popen[bytes]]
) -> subprocess.Popen[bytes]:
    """Start the command (on the spawner thread); record it in ``started`` at once."""
    # ``_STOPPING`` is blocked from the fork on. A terminal's signal that came
    # before the child's own group reached launch as well, which passes it on
    # once the command is known: the child drops its own pending copy.
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, _STOPPING)  # the child inherits the mask
    try:
        child = start_child(command, env, new_group=True, unblock=_STOPPING)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
    started.append(child)
    return child


def _launch_pid(marker: str) -> int | None:
    """The pid of the ``verirl launch`` that made ``marker`` (``f"{pid}-{token}"``)."""
    pid, _, _ = marker.partition("-")
    return int(pid) if pid.isdigit() else None


def _markers(process: psutil.Process) -> list[str]:
    """The launch markers in ``process``'s environment, outermost first.

    Read through `verirl._procfs`: psutil's ``environ()`` fails for a process
    whose main thread has ended while others run (Zl), which is still ours.
    """
    environ = _procfs.environ(process.pid)
    value = "" if environ is None else environ.get(LAUNCH_MARKER_VAR, "")
    return value.split(",") if value else []


class _Command:
    """The training command and every process it started, found again at each step.

    Descendants are found through the process tree while their parents live,
    through `LAUNCH_MARKER_VAR` once orphaned (a daemon, a rank whose agent
    died), through the command's process group (a background job that cleared
    its environment), and as launch's own children that it did not start
    (``others``): launch is a child subreaper, so an orphan that left the group
    and cleared its environment is reparented to it. Each is remembered with
    its creation time, so a reused pid is never signalled.
    """

    def __init__(
        self,
        child: subprocess.Popen[bytes],
        marker: str,
        since: float,
        others: Mapping[int, float] | None = None,
        own: str = "",
    ) -> None:
        self.child = child
        self.marker = marker
        self.since = since
        self.others = dict(others or {})  # pid → creation time
        self.own = own  # launch's own markers: its server's processes carry exactly these
        self.seen: dict[int, psutil.Process] = {}
        self.pending: list[psutil.Process] = []  # left to a parent of the command to signal
        self.signum: int = signal.SIGTERM
        self.inner: set[int] = set()  # pids of nested launches, named in markers after ours
        self.signalled: set[psutil.Process] = set()  # got self.signum (or left to a forwarder)
        self.group_signalled = False  # the group got self.signum with one killpg
        # The children (pid, start time) of each process launch signalled, listed just before.
        self.children_then: set[tuple[int, int]] = set()
        self.interrupted: threading.Event | None = None  # set by `_grace_signals` during a grace
        self.forwarding: _Forwarding | None = None  # SIGQUIT, SIGUSR1, ... to pass on
        try:
            self.leader: psutil.Process | None = psutil.Process(child.pid)
        except psutil.Error:
            self.leader = None

    def collect(self) -> list[psutil.Process]:
        """The command's processes alive now (the command itself left out), remembered.

        Found: the members of the command's group, the orphans adopted by
        launch, the processes carrying the marker, and every descendant of
        those and of the command while it runs (a child that left the group
        and cleared its environment under a parent that is still alive).
        """
        me = os.getpid()
        found: dict[int, psutil.Process] = {}
        children: dict[int, list[psutil.Process]] = {}
        for process in psutil.process_iter():
            try:
                if process.pid == me or process.create_time() < self.since:
                    continue
                children.setdefault(process.ppid(), []).append(process)
            except (psutil.Error, OSError):
                continue
            if process.pid != self.child.pid and self._found(process, me):
                found[process.pid] = process
        roots = list(found)
        if self.leader is not None and self.child.returncode is None:
            roots.append(self.child.pid)
        self._add_descendants(found, roots, children)
        self._add_adopted_now(found, me)
        for process in found.values():
            known = self.seen.get(process.pid)
            if known is None or not alive(known):
                self.seen[process.pid] = process
        return [process for process in self.seen.values() if alive(process)]

    def _add_descendants(
        self,
        found: dict[int, psutil.Process],
        roots: list[int],
        children: dict[int, list[psutil.Process]],
    ) -> None:
        """Add to ``found`` the descendants of ``roots`` (pids), from one scan's ``children``."""
        while roots:
            for process in children.get(roots.pop(), ()):
                if process.pid not in found and process.pid != self.child.pid:
                    found[process.pid] = process
                    roots.append(process.pid)

    def _add_adopted_now(self, found: dict[int, psutil.Process], me: int) -> None:
        """Add launch's adopted orphans and their children, read at once from ``/proc``.

        The scan above takes a while; a daemon that changes its pid faster
        (fork, the parent exits) is missed by it, but each hop is reparented
        to launch (the subreaper), where this cheap second look finds it.
        """
        for pid in self._near(me):
            if pid in found or pid == self.child.pid:
                continue
            try:
                process = psutil.Process(pid)
                if process.create_time() >= self.since:
                    found[pid] = process
            except (psutil.Error, OSError):
                continue

    def _near(self, me: int) -> list[int]:
        """Launch's children and grandchildren, but for what it had before the command.

        An adopted orphan that ended is reaped here (it is launch's zombie).
        """
        children = [
            pid for pid in _children_of(me) if not self._other(pid) and not self._foreign(pid)
        ]
        for pid in children:
            if pid != self.child.pid:  # the command is reaped by its Popen
                with contextlib.suppress(OSError):
                    os.waitpid(pid, os.WNOHANG)
        return children + [grandchild for pid in children for grandchild in _children_of(pid)]

    def quiet(self) -> bool:
        """Whether no process runs near launch (`_near`), in two looks `_QUIET_GAP` s apart.

        A look at the whole process table takes longer than a daemon that
        changes its pid needs to move on, so an empty look does not prove
        that nothing is left; this one, cheap and repeated, does: such a
        daemon is always launch's child or grandchild (launch is the
        subreaper), alive before its parent exits.
        """
        me = os.getpid()
        for look in range(2):
            if look:
                time.sleep(_QUIET_GAP)
            if any(_running_pid(pid) for pid in self._near(me) if pid != self.child.pid):
                return False
        return True

    def _other(self, pid: int, process: psutil.Process | None = None) -> bool:
        """Whether ``pid`` is one of launch's processes from before the command (``others``).

        Those are launch's descendants then (the vLLM server and its workers),
        known by pid and creation time: one orphaned since (a worker of a
        server that crashed) is adopted by launch but is not the command's.
        """
        created = self.others.get(pid)
        if created is None:
            return False
        try:
            return (process or psutil.Process(pid)).create_time() == created
        except (psutil.Error, OSError):
            return True  # gone: nothing to find

    def _found(self, process: psutil.Process, me: int) -> bool:
        """Whether ``process`` is the command's: in its group, an adopted orphan, or marked."""
        if self.in_group(process) or self._adopted(process, me):
            self._note_inner_launches(_markers(process))
            return True
        return self._note_inner_launches(_markers(process))

    def _note_inner_launches(self, markers: list[str]) -> bool:
        """Whether ``markers`` carry ours; the launches named after it go to ``inner``."""
        if self.marker not in markers:
            return False
        for marker in markers[markers.index(self.marker) + 1 :]:
            pid = _launch_pid(marker)
            if pid is not None:
                self.inner.add(pid)
        return True

    def _adopted(self, process: psutil.Process, me: int) -> bool:
        """Whether ``process`` is an orphan of the command reparented to launch (the subreaper)."""
        try:
            parent = process.ppid()
        except (psutil.Error, OSError):
            return False
        return (
            parent == me
            and not self._other(process.pid, process)
            and not self._foreign(process.pid)
        )

    def _foreign(self, pid: int) -> bool:
        """Whether ``pid`` carries exactly launch's own markers (its server's, not the command's).

        Launch's vLLM server and what it starts carry launch's markers as
        they were when it started (`mark_this_launch`), also when started
        after the command (not in ``others``). Any other value (none, blank,
        changed, another launch's) may be the command's: a process of the
        command that rewrote its environment must not escape. Read through a
        live thread when the main one has ended (`verirl._procfs.read`).
        """
        if not self.own:
            return False
        try:
            environ = _procfs.read(pid, "environ")
        except OSError:
            return False
        prefix = LAUNCH_MARKER_VAR.encode() + b"="
        for entry in environ.split(b"\0"):
            if entry.startswith(prefix):
                return entry[len(prefix) :] == self.own.encode()
        return False

    def reap_adopted(self) -> None:
        """Reap the adopted orphans that have ended (each a zombie of launch's until then)."""
        me = os.getpid()
        adopted = [process for process in self.seen.values() if self._adopted(process, me)]
        with contextlib.suppress(psutil.Error, OSError):
            psutil.wait_procs(adopted, timeout=_REAP_WAIT)

    def in_group(self, process: psutil.Process) -> bool:
        """Whether ``process`` is in the command's process group.

        The group's id is the command's pid, which the kernel may give to a
        new process once the command is reaped and its group has emptied:
        from then on only a process already found as the command's counts
        (what it forks later is found as its descendant, or as an orphan
        launch adopted).
        """
        try:
            if os.getpgid(process.pid) != self.child.pid:
                return False
        except OSError:
            return False
        return self.child.returncode is None or self.seen.get(process.pid) == process

    def forward_queued(self) -> None:
        """Each signal of `TERMINATING` that arrived since (`_Forwarding`) passed on once.

        Each process of the command found now gets it once, from launch, as
        for SIGTERM (`signal_once`: the group with one ``killpg``, then each
        process outside it), but without touching the state of a grace in
        progress; and launch goes on waiting. Left out:
        a process that a live process of the command passes signals on to (an
        inner launch's, which passes these on too; a torchrun rank for SIGQUIT
        alone, the only one of them torchrun's agent passes on), and a vLLM
        server's processes (their owner decides: ``verirl serve`` stops it).

        An arrival leaves the queue only once passed on to all (`_Arrival`):
        an interruption meanwhile (SIGTERM's exception landing in the look at
        the process table) leaves it first in the queue, with what it reached,
        for the next wait to finish.
        """
        forwarding = self.forwarding
        if forwarding is None:
            return
        forwarding.drain()
        while forwarding.queue:
            self._pass_on(forwarding.queue[0], self.collect())
            forwarding.queue.pop(0)

    def _pass_on(self, arrival: _Arrival, processes: list[psutil.Process]) -> None:
        """`forward_queued`'s one arrival, to ``processes`` and the command, each once.

        Each send and its record in ``arrival`` are one step no handler splits
        (`_kill_noted`, `_killpg_noted`): an interruption right after a send
        would otherwise leave it unrecorded, and the next wait send it again.
        """
        signum = arrival.signum
        if arrival.grouped is None:
            self._group_once(arrival)
        for process in processes:
            if process.pid in arrival.reached:
                continue
            if self.in_group(process):
                if arrival.grouped:
                    continue
            elif self.forwarded_by_parent(
                process, torchrun=signum == getattr(signal, "SIGQUIT", None)
            ):
                continue
            if _ending(process) or _server_marker(process) or not alive(process):
                continue  # alive: psutil's check that the pid was not reused
            with contextlib.suppress(OSError):
                _kill_noted(process.pid, signum, arrival.reached)
        if not arrival.grouped and self.child.pid not in arrival.reached and not self.exited():
            with contextlib.suppress(OSError):  # not reaped: its pid is not reused
                _kill_noted(self.child.pid, signum, arrival.reached)
        log.warning(
            "passed %s on to the training command (pid %d) and its processes",
            _signal_name(signum),
            self.child.pid,
        )

    def _group_once(self, arrival: _Arrival) -> None:
        """`signal_group` for an arrival, the outcome noted with the send (`_killpg_noted`)."""
        if self.child.returncode is not None or not hasattr(os, "killpg"):
            arrival.grouped = False  # reaped: its pid may name another group now
            return
        try:
            _killpg_noted(self.child.pid, arrival.signum, arrival)
        except ProcessLookupError:
            pass
        except OSError as exc:
            log.warning("cannot signal the training command's group %d: %s", self.child.pid, exc)

    def forwarded_by_parent(self, process: psutil.Process, *, torchrun: bool = True) -> bool:
        """Whether a live process of the command passes signals on to ``process``.

        torchrun's agent does, to the ranks it starts in sessions of their
        own (``TORCHELASTIC_RUN_ID`` in their environment); a rank stops what
        it started itself (its data loader workers). A nested ``verirl
        launch`` does, to each process of its own command. A `VLLMServer`'s
        owner (``verirl serve``, a training script) stops its server. Any other process
        outside the group gets the signal from launch. The environment is
        read through `verirl._procfs` (a Zl process's too).
        """
        environ = _procfs.environ(process.pid)
        if environ is None:
            return False
        try:
            if (
                self._under_inner_launch(process, environ.get(LAUNCH_MARKER_VAR, ""))
                or self._server_owner_runs(process, environ.get(MARKER_VAR, ""))
                or self._below_inner_launch(process)
            ):
                return True
            parent = process.ppid()
            if not torchrun or not _started_by_torchrun_inside(environ):
                return False
        except (psutil.Error, OSError):
            return False
        return self._running(parent)

    def _under_inner_launch(self, process: psutil.Process, markers: str) -> bool:
        """Whether a live ``verirl launch`` inside ours runs ``process`` (and signals it).

        Each launch appends its marker, which starts with its pid, after those
        of the launches around it: a marker after ours names a launch that is
        a process of our command. It counts while it lives and predates
        ``process`` (a reused pid does not); any live one will do, as each
        launch passes the signal on to the next one in, or to the process
        itself once the ones between have died.
        """
        names = markers.split(",")
        if self.marker not in names:
            return False
        for marker in names[names.index(self.marker) + 1 :]:
            pid = _launch_pid(marker)
            if pid is None or pid == process.pid or not self._running(pid):
                continue
            inner = self.leader if pid == self.child.pid else self.seen[pid]
            with contextlib.suppress(psutil.Error, OSError):
                if inner is None or inner.create_time() <= process.create_time():
                    return True
        return False

    def _server_owner_runs(self, process: psutil.Process, marker: str) -> bool:
        """Whether ``process`` is of a verirl vLLM server whose owner is a live process of ours.

        The server and its workers carry the server's ``marker`` (`MARKER_VAR`);
        the first ancestor without it started the server, and stops all of it
        when it ends: serve tears down on a signal, and an owner that dies of
        one has the kernel send the server its death signal. A second signal
        from launch would cut the server's own shutdown short.
        """
        if not marker:
            return False
        for parent in _ancestors(process):
            environ = _procfs.environ(parent)
            if environ is not None and environ.get(MARKER_VAR) == marker:
                continue
            if not self._running(parent):
                return False
            owner = self.leader if parent == self.child.pid else self.seen[parent]
            return owner is None or owner.create_time() <= process.create_time()
        return False

    def _below_inner_launch(self, process: psutil.Process) -> bool:
        """Whether a live inner ``verirl launch`` is an ancestor of ``process`` (marked or not).

        That launch finds it (below its command, as its orphan, or below a
        process of its own command) and passes the signal on to it.
        """
        return any(parent in self.inner and _running_pid(parent) for parent in _ancestors(process))

    def _running(self, pid: int) -> bool:
        """Whether ``pid`` is a live process of the command: the command itself, or one found."""
        if pid == self.child.pid:
            return self.child.returncode is None and (self.leader is None or alive(self.leader))
        known = self.seen.get(pid)
        return known is not None and alive(known)

    def signal_once(self, signum: int) -> list[psutil.Process]:
        """``signum`` to each process of the command exactly once; what was found then.

        The group gets it with one ``killpg`` (`signal_group`), which no fork
        can race; each process found outside the group gets it from us, one
        by one, unless a live process of the command passes signals on to it
        (a torchrun rank, an inner launch's command). What is forked later
        outside the group is found by `catch_up` and `signal_new`.
        """
        processes = self.collect()
        self.signum = signum
        self.pending = []
        self.signalled = set()
        self.children_then = set()
        members = [process for process in processes if self.in_group(process)]
        # Their children, listed right before: one forked since the look that left the group
        # (a worker in a session of its own) is not reached by the killpg; `catch_up` sends it.
        listed = [child for pid in (self.child.pid, *(p.pid for p in members))
                  for child in _children_of(pid)]  # fmt: skip
        self.group_signalled = self.signal_group(signum)
        if self.group_signalled:  # got it: one that leaves the group on it is not sent it again
            self.signalled.update(members)
            self._note_children(listed)
        self._deliver(processes)
        if not self.group_signalled:
            self._signal_command(signum)
        self._wake(processes)
        return processes

    def _wake(self, processes: list[psutil.Process]) -> None:
        """SIGCONT to the group and to each process found, after the signal.

        A stopped process (SIGSTOP, or SIGTTIN for a read from the terminal)
        acts on the signal only once it runs: else it would save nothing and
        sit out the grace until SIGKILL. A vLLM server's teardown does the same.
        """
        grouped = self.child.returncode is None and hasattr(os, "killpg")
        if grouped:
            with contextlib.suppress(OSError):
                os.killpg(self.child.pid, signal.SIGCONT)
        for process in processes:
            if not (grouped and self.in_group(process)):
                with contextlib.suppress(psutil.Error):
                    process.send_signal(signal.SIGCONT)

    def signal_group(self, signum: int) -> bool:
        """``signum`` to the command's process group at once; False when launch must go one by one.

        While the command is not reaped its pid cannot be reused, so the group
        id names its group. Once reaped (or on a platform without process
        groups), launch signals each member on its own.
        """
        arrival = _Arrival(signum)
        self._group_once(arrival)
        return bool(arrival.grouped)

    def catch_up(self) -> list[psutil.Process]:
        """The signal, now, to each process that missed it since it was passed on; those found.

        A child its parent already had when launch signalled the parent, but
        that launch's look came too early for (a pool starting its workers
        while launch went through the tree), would run on while its parent
        waits for it, until the grace's SIGKILL. A process forked after its
        parent got the signal (a helper the parent's handler starts to save)
        is that parent's to stop.
        """
        missed = [
            process
            for process in self.collect()
            if process not in self.signalled and _identity(process.pid) in self.children_then
        ]
        self._deliver(missed)
        return missed

    def _note_children(self, listed: list[int]) -> None:
        """Remember the children listed just before launch signalled their parent.

        Only the list is read before the signal (one read, so that a child
        forked meanwhile is rarely left out); which process each is (its
        start time) is read after.
        """
        for child in listed:
            identity = _identity(child)
            if identity is not None:
                self.children_then.add(identity)

    def signal_new(self) -> list[psutil.Process]:
        """The signal passed on, once, to each process found since; all alive now.

        A process found late (an orphan adopted once its parent died of the
        signal, one started since) gets it from us, in the group or not,
        unless a live process of the command passes it on; one that got it
        already does not get it again.
        """
        processes = self.collect()
        self._deliver(processes)
        return processes

    def _deliver(self, processes: list[psutil.Process]) -> None:
        """The signal to each of ``processes`` not given it yet, unless a forwarder passes it.

        After the group's ``killpg`` a member got it then, or was forked after
        its parent got it: launch leaves it to that parent.
        """
        for process in processes:
            if process in self.signalled:  # pid and creation time: a reused pid is another
                continue
            if self.group_signalled and self.in_group(process):
                self.signalled.add(process)
                continue
            self.signalled.add(process)
            if not self.in_group(process) and self.forwarded_by_parent(process):
                self.pending.append(process)
                continue
            if _ending(process):  # ended since the look: it would never handle the signal
                continue
            if _server_marker(process):  # a verirl server whose owner died: the kernel's
                continue  # death signal has reached it (a live owner's is pending, above)
            self._send(process)

    def _send(self, process: psutil.Process) -> None:
        """``self.signum`` to ``process``, noted with the children it had then."""
        listed = _children_of(process.pid)
        with contextlib.suppress(psutil.Error):
            process.send_signal(self.signum)  # psutil refuses a pid that was reused
        self._note_children(listed)

    def _signal_command(self, signum: int, *, note: bool = True) -> None:
        """``signum`` to the command itself, unless it has exited (its pid is not reused then).

        With ``note``, its children then are remembered for `catch_up`.
        """
        if self.exited():
            return
        listed = _children_of(self.child.pid) if note else []
        try:
            os.kill(self.child.pid, signum)
        except ProcessLookupError:
            pass
        except OSError as exc:
            log.warning("cannot signal the training command (pid %d): %s", self.child.pid, exc)
        self._note_children(listed)

    def pass_to_orphans(self) -> None:
        """The signal to each process left to a forwarder that died without passing it on.

        A forwarder (torchrun, an inner launch) waits for what it signalled
        before it exits; one that dies at once (``sh`` without a trap) never
        passed it.
        """
        for process in list(self.pending):
            if _ending(process):
                self.pending.remove(process)
            elif not self.forwarded_by_parent(process):
                self.pending.remove(process)
                if _server_marker(process):  # its owner died: the kernel's death signal came
                    continue
                with contextlib.suppress(psutil.Error):
                    process.send_signal(self.signum)

    def kill(self) -> None:
        """SIGKILL the group and every process of the command found, until none is new.

        A killed parent's orphans are reparented to launch only once it is
        gone, so after each round launch waits for what it killed to die (at
        most `_KILL_WAIT` s in all), looks again, and kills what is new.
        """
        if self.child.returncode is None:  # once reaped, its group's id may name another group
            with contextlib.suppress(OSError):
                os.killpg(self.child.pid, signal.SIGKILL)
            with contextlib.suppress(OSError):
                self.child.kill()
        deadline = time.monotonic() + _KILL_WAIT
        killed: set[psutil.Process] = set()
        with contextlib.suppress(psutil.Error, OSError):  # not a bug of ours: it would show
            for round_ in itertools.count():
                fresh = [process for process in self.collect() if process not in killed]
                if not fresh and round_ and (self.quiet() or time.monotonic() >= deadline):
                    return
                for process in fresh:
                    killed.add(process)
                    with contextlib.suppress(psutil.Error):
                        process.kill()
                if not self._wait_killed(killed, deadline):
                    return

    def _wait_killed(self, killed: Collection[psutil.Process], deadline: float) -> bool:
        """Wait for the command and ``killed`` to die (zombies count); False at ``deadline``.

        Launch's own children among them (adopted orphans) are reaped; the
        command is left unreaped (`_reap` reads its exit status).
        """
        while True:
            living = [process for process in killed if alive(process)]
            if not living and self.exited():
                return True
            left = deadline - time.monotonic()
            if left <= 0:
                return False
            if living:  # short steps: psutil waits on another's zombie until its timeout
                with contextlib.suppress(psutil.Error, OSError):
                    psutil.wait_procs(living, timeout=min(left, 0.05))
            else:  # the command alone, SIGKILLed: gone within milliseconds
                time.sleep(min(left, 0.005))

    def exited(self) -> bool:
        """Whether the command itself has exited, without reaping it (its pid is the group id)."""
        if self.child.returncode is not None:
            return True
        if not hasattr(os, "waitid"):
            return self.child.poll() is not None
        try:
            info = os.waitid(os.P_PID, self.child.pid, os.WEXITED | os.WNOHANG | os.WNOWAIT)
        except ChildProcessError:
            return self.child.poll() is not None
        return info is not None

    def wait_exited(self) -> None:
        """Block until the command exits, leaving it unreaped; a signal's handler runs meanwhile.

        A wait with no timeout would hold a signal that another thread took, or
        that came just before the wait began, until the command ends (see
        `SIGNAL_CHECK`): launch would pass a preemption on only when it no
        longer matters. So the wait wakes every `SIGNAL_CHECK` seconds, and at
        once when the command exits (its pidfd becomes readable, on Linux), or
        when a signal to pass on arrives (`forward_queued`).
        """
        pidfd = None
        with contextlib.suppress(AttributeError, OSError):
            pidfd = os.pidfd_open(self.child.pid)
        wake = [] if self.forwarding is None else [self.forwarding.wake_read]
        try:
            self.forward_queued()  # what came while the command was being started
            while not self.exited():
                if pidfd is not None or wake:
                    select.select(
                        [*wake, *([] if pidfd is None else [pidfd])], [], [], SIGNAL_CHECK
                    )
                else:
                    threading.Event().wait(SIGNAL_CHECK)
                raise_if_dropped()  # a SIGTERM whose SystemExit Python dropped
                self.forward_queued()  # SIGQUIT, SIGUSR1, ...: passed on, the wait goes on
        finally:
            if pidfd is not None:
                os.close(pidfd)

    def wait_gone(self, processes: list[psutil.Process], deadline: float) -> bool:
        """Wait until the command and ``processes`` are gone; False at the deadline.

        Meanwhile launch looks for processes that missed the signal
        (`catch_up`), soon after it went out and then less often.
        """
        delay = 0.001
        processes = list(processes)
        gap = _FIRST_CATCH_UP
        look = time.monotonic() + gap
        while not self.exited() or any(alive(process) for process in processes):
            if self.interrupted is not None and self.interrupted.is_set():
                raise KeyboardInterrupt  # its handler's own exception was lost
            self.pass_to_orphans()
            self.forward_queued()  # a SIGUSR1 during a grace: passed on too
            now = time.monotonic()
            if now >= deadline:
                return False
            if now >= look and self.children_then:  # none: nothing could have missed it
                processes += self.catch_up()
                gap = min(gap * 2, _MAX_CATCH_UP)
                look = time.monotonic() + gap
            time.sleep(min(delay, deadline - now))  # a signal interrupts it: "interrupted again"
            delay = min(delay * 2, 0.05)
        return True

    def wait_rounds(self, processes: list[psutil.Process], deadline: float) -> bool:
        """Wait until the command and all its processes are gone; False at the deadline.

        Each time those awaited are gone, launch looks again: a process found
        then gets the signal once (`signal_new`), and the wait goes on.
        """
        while self.wait_gone(processes, deadline):
            processes = self.signal_new()
            if not processes:
                if self.quiet():
                    return True
                if time.monotonic() >= deadline:  # something near launch that no look finds
                    return False
        return False


def _ending(process: psutil.Process) -> bool:
    """Whether ``process`` has ended or is ending (a zombie, or its memory already released)."""
    if not alive(process):
        return True
    if _procfs.threads_run(process.pid):  # its main thread ended, others run
        return False
    try:
        return not _procfs.read(process.pid, "cmdline")
    except OSError:
        return not alive(process)


_FIRST_CATCH_UP = 0.02
_MAX_CATCH_UP = 1.0


def _identity(pid: int) -> tuple[int, int] | None:
    """``pid`` with its start time: which process it is (None when it is gone)."""
    start = _procfs.start_time(pid)
    return None if start is None else (pid, start)


def _ancestors(process: psutil.Process) -> Iterator[int]:
    """The pids above ``process``, nearest first, up to launch itself or init (256 at most).

    Read as the walk goes: a process that ends meanwhile ends the walk.
    """
    me = os.getpid()
    pid = process.pid
    for _ in range(256):  # a bound, should the tree change under the walk
        fields = _procfs.stat_fields(pid)
        if fields is None:
            return
        pid = int(fields[1])
        if pid in (me, 0, 1):
            return
        yield pid


def _children_of(pid: int) -> list[int]:
    """The children of ``pid``, of every thread, read from ``/proc`` at once ([] if none)."""
    return _procfs.children(pid)


def _server_marker(process: psutil.Process) -> bool:
    """Whether ``process`` belongs to a verirl vLLM server (carries `MARKER_VAR`)."""
    environ = _procfs.environ(process.pid)
    return bool(environ and environ.get(MARKER_VAR))


def _running_pid(pid: int) -> bool:
    """Whether ``pid`` is a process that has not ended (a zombie has, a Zl one has not)."""
    return _procfs.running(pid)


def _started_by_torchrun_inside(environ: Mapping[str, str]) -> bool:
    """Whether ``environ`` is a rank's that a torchrun agent of the command started.

    The agent gives each rank an error file of its own
    (``TORCHELASTIC_ERROR_FILE``) and the run's ``TORCHELASTIC_RUN_ID``; a
    value launch itself has (launch run by torchrun, or a stale variable) was
    inherited, not set by an agent inside the command.
    """
    if "TORCHELASTIC_RUN_ID" not in environ:
        return False
    error_file = environ.get("TORCHELASTIC_ERROR_FILE")
    if error_file:  # blank when the agent logs to /dev/null
        return error_file != os.environ.get("TORCHELASTIC_ERROR_FILE")
    return environ["TORCHELASTIC_RUN_ID"] != os.environ.get("TORCHELASTIC_RUN_ID")


def _tracker(child: subprocess.Popen[bytes]) -> _Command:
    """A `_Command` for a child started without a marker (nothing found by environment)."""
    return _Command(child, f"untracked-{secrets.token_hex(8)}", time.time())


def _stop_command(
    child: subprocess.Popen[bytes],
    signum: int,
    grace: float,
    command: _Command | None = None,
    ending: Callable[[], object] | None = None,
    *,
    again: bool = False,
) -> int:
    """Pass ``signum`` on to each process of the command once, wait ``grace`` s, then SIGKILL.

    ``ending`` (the runtime's ``stop_watchdog``) is called first: while the
    command saves, a vLLM server that dies (a platform's SIGTERM reaches it
    too) must not cut the grace short; a `VLLMServerError` that was already
    on its way is logged, and the wait goes on. A further signal at any point
    (a second Ctrl-C, SIGTERM after a Ctrl-C) SIGKILLs the group at once: the
    ``finally`` sees to it even when that signal lands between two statements
    here. ``again``: that further signal came with the first (`interruptions`), so SIGKILL now.
    """
    tracked = command or _tracker(child)
    stopped = False
    try:
        try:
            if again:
                _call_ending(ending)
                log.warning("interrupted twice at once: sending SIGKILL to the training command")
            else:
                stopped = _pass_and_wait(tracked, child, signum, grace, ending)
        except subprocess.TimeoutExpired:
            log.warning("the training command outlived its %gs grace: sending SIGKILL", grace)
        except (KeyboardInterrupt, SystemExit):  # a second Ctrl-C, or SIGTERM after a Ctrl-C
            log.warning("interrupted again: sending SIGKILL to the training command")
    finally:
        if not stopped:
            tracked.kill()
    return _reap(child)


def _pass_and_wait(
    tracked: _Command,
    child: subprocess.Popen[bytes],
    signum: int,
    grace: float,
    ending: Callable[[], object] | None,
) -> bool:
    """`_stop_command`'s grace: True once the command and its processes are gone."""
    _call_ending(ending)
    if tracked.exited() and not tracked.collect():  # it ended as the signal came
        return True
    tracked.forward_queued()  # a SIGUSR1 that came just before: passed on first, in order
    deadline = time.monotonic() + grace
    processes = tracked.signal_once(signum)
    log.warning(
        "passed %s on to the training command (pid %d) and its processes; SIGKILL in %gs",
        signal.Signals(signum).name,
        child.pid,
        grace,
    )
    # a process found meanwhile (an orphan adopted as its parent died) gets it once too
    with _grace_signals(tracked):
        if not _wait_through_server_failure(tracked, processes, deadline):
            raise subprocess.TimeoutExpired(child.args, grace)
    return True


@contextlib.contextmanager
def _grace_signals(command: _Command, *, absorb_sigterm: bool = False) -> Iterator[None]:
    """While in the block, ``command.interrupted`` is set when SIGINT or SIGTERM interrupts.

    The handler in place still runs, and its KeyboardInterrupt or SystemExit
    ends the grace; but CPython drops an exception a handler raises while a
    ``__del__`` or a weakref callback runs ("Exception ignored in"): the
    grace's wait checks the event too, so a second signal is never lost that
    way. With ``absorb_sigterm``, a SIGTERM's SystemExit is logged instead
    (the handler still notes the signal): what the command left running gets
    SIGTERM from launch anyway. A handler that raises something else (the
    watchdog's error, which the grace carries on through) or nothing sets no
    event. Only the main thread can set handlers; elsewhere the block runs as
    is.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    noted = threading.Event()
    installed: dict[int, tuple[_Handler, _Handler]] = {}
    command.interrupted = noted
    try:
        for signum in (signal.SIGINT, signal.SIGTERM):
            previous = signal.getsignal(signum)
            if not callable(previous):  # SIG_IGN stays ignored, SIG_DFL ends the process anyway
                continue
            absorb = absorb_sigterm and signum == signal.SIGTERM
            wrapped = _noting(noted, previous, absorb=absorb)
            installed[signum] = (previous, wrapped)  # first: a signal after it finds it put back
            signal.signal(signum, wrapped)
        yield
    finally:
        command.interrupted = None
        # each handler ours replaced back, where ours is still the one
        put_back((n, previous, replacing(ours)) for n, (previous, ours) in installed.items())


_Handler = Callable[[int, FrameType | None], object]


def _noting(noted: threading.Event, previous: _Handler, *, absorb: bool) -> _Handler:
    """A handler that runs ``previous``, noting (or, ``absorb``, logging) what it raises."""

    @outside_tracers_lock  # a signal inside it waits its turn, as inside the one it wraps
    def noting(signum: int, frame: FrameType | None) -> None:
        try:
            hand_on(previous, signum, frame)
        except (KeyboardInterrupt, SystemExit) as exc:
            if absorb and isinstance(exc, SystemExit):
                mark_noted(exc)
                log.warning(
                    "SIGTERM received: the training command has exited, and what it left "
                    "running gets SIGTERM from launch; its grace goes on"
                )
                return
            noted.set()
            mark_noted(exc)  # dropped or not, it has had its effect: never sent or raised again
            raise

    return noting


def _call_ending(ending: Callable[[], object] | None) -> None:
    """Call ``ending``; its failure is logged (the command must still be stopped)."""
    if ending is None:
        return
    try:
        ending()
    except Exception:
        log.exception("stopping the server watchdog failed")


def _wait_through_server_failure(
    tracked: _Command, processes: list[psutil.Process], deadline: float
) -> bool:
    """`_Command.wait_rounds`, carried on through a `VLLMServerError` raised meanwhile.

    The watchdog is stopped before a grace begins, but its interrupt may
    already be on its way: the command saving its checkpoint still gets the
    whole grace.
    """
    while True:
        try:
            return tracked.wait_rounds(processes, deadline)
        except VLLMServerError as exc:  # noqa: PERF203 - resumes the wait
            log.warning(
                "the vLLM server failed while the training command had its grace (%s); "
                "the grace goes on",
                exc,
            )
            processes = tracked.collect()


def _kill_command(child: subprocess.Popen[bytes], command: _Command | None = None) -> None:
    """SIGKILL the command's process group, the command, and whatever else of it is found."""
    (command or _tracker(child)).kill()


REAP_TIMEOUT = 60.0
"""Seconds `_reap` waits for a SIGKILLed command: one stuck in the kernel (a hung file system
or driver) survives SIGKILL until the kernel lets it go, and launch must end all the same."""


def _reap(child: subprocess.Popen[bytes], timeout: float = REAP_TIMEOUT) -> int:
    """Wait for an exited or SIGKILLed command, up to ``timeout`` s; a signal cannot cut it short.

    Past the deadline the command is left to the kernel, logged, and counted
    as killed (137).
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            return child.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:  # noqa: PERF203 - once, at the deadline
            break
        except (KeyboardInterrupt, SystemExit):
            continue
    code = child.poll()
    if code is not None:
        return code
    log.error(
        "the training command (pid %d) survives SIGKILL after %gs, stuck in the kernel "
        "(a hung file system or driver?): launch ends without it",
        child.pid,
        timeout,
    )
    return 128 + signal.SIGKILL


def _end_leftovers(command: _Command, grace: float) -> None:
    """The command exited on its own: SIGTERM what it left running, ``grace`` s, then SIGKILL.

    Those processes get their SIGTERM from launch in any case, so a SIGTERM
    to launch meanwhile (a preemption) changes nothing: it is logged and the
    grace goes on (`_grace_signals`, over the whole of it, so that it
    cannot land between two steps). A Ctrl-C SIGKILLs them at once. Either
    way launch's exit code stays the command's.
    """
    done = False
    try:
        with _grace_signals(command, absorb_sigterm=True):
            left = _look_for_leftovers(command, time.monotonic() + grace)
            if not left:
                done = True
                return
            log.warning(
                "the training command left %d process(es) running (pids %s): "
                "SIGTERM, SIGKILL in %gs",
                len(left),
                ", ".join(str(process.pid) for process in left),
                grace,
            )
            deadline = time.monotonic() + grace
            processes = command.signal_once(signal.SIGTERM)
            done = _wait_through_server_failure(command, processes, deadline)
        if not done:
            log.warning("processes of the training command outlived the grace: sending SIGKILL")
    except KeyboardInterrupt:
        log.warning("interrupted: sending SIGKILL to what the training command left running")
    finally:
        if not done:
            command.kill()


def _look_for_leftovers(command: _Command, until: float) -> list[psutil.Process]:
    """What the exited command left running (a pid that changes is looked for until ``until``)."""
    command.forward_queued()
    left = command.collect()
    while not left and not command.quiet() and time.monotonic() < until:
        left = command.collect()
    return left


def mark_this_launch() -> None:
    """Append a marker of this launch to `LAUNCH_MARKER_VAR` in ``os.environ``, for what it starts.

    The vLLM server a nested ``verirl launch`` starts, before its command,
    then carries the inner launch's marker after the outer one's: the outer
    launch leaves signalling it to the inner one, as it does for the inner
    command's processes (`run_command` appends a marker of its own for those).
    """
    outer = os.environ.get(LAUNCH_MARKER_VAR, "")
    marker = f"{os.getpid()}-{secrets.token_hex(8)}"
    os.environ[LAUNCH_MARKER_VAR] = f"{outer},{marker}" if outer else marker


def run_command(
    command: Sequence[str],
    env: dict[str, str],
    grace: float,
    *,
    ending: Callable[[], object] | None = None,
    cannot_run: Callable[[str], object] | None = None,
) -> int:
    """Run ``command``; return its exit code (128+N when it died of signal N, 127: cannot run it).

    SIGQUIT, SIGUSR1 and the other signals of `verirl._signals.TERMINATING`
    that arrive meanwhile are passed on to each process of the command once
    per arrival, and the call goes on (see the module docstring).

    The command runs in a process group of its own (see the module
    docstring). SIGTERM (the one policy's `SystemExit`) or Ctrl-C while it
    runs is passed on to each of its processes once, with ``grace`` seconds
    to exit before SIGKILL. It is started from verirl's spawner thread with
    both signals blocked there: one arriving meanwhile is handled once the
    command is known, and passed on to it. The command gets SIGTERM from the
    kernel if verirl itself dies. Whatever interrupts verirl here, nothing the
    command started outlives this call (see `LAUNCH_MARKER_VAR`). A
    `VLLMServerError` raised here (the watchdog's interrupt) stops the
    command as SIGTERM does, then propagates. ``ending`` (``verirl launch``
    passes the runtime's ``stop_watchdog``) is called as soon as the command
    has exited or a signal is being passed on to it: a server failing after
    that must not cut short the grace of the command or of what it left.
    ``cannot_run`` gets the logged message (redacted) when the command
    cannot be started: 127 alone does not say why (a shell returns it too).
    """
    marker = f"{os.getpid()}-{secrets.token_hex(8)}"
    outer = env.get(LAUNCH_MARKER_VAR, "")
    env = {**env, LAUNCH_MARKER_VAR: f"{outer},{marker}" if outer else marker}
    since = time.time() - 1.0  # creation times are rounded: a second's margin
    started: list[subprocess.Popen[bytes]] = []
    tracked: list[_Command] = []
    subreaper = child_subreaper()  # read first: what the finally puts back, wherever cut short
    forwarding: _Forwarding | None = None
    try:
        if subreaper is not None:
            set_child_subreaper(True)
        forwarding = _Forwarding()
        forwarding.install()
        return _run(
            command,
            env,
            grace,
            marker=marker,
            own=outer,
            since=since,
            started=started,
            tracked=tracked,
            ending=ending,
            cannot_run=cannot_run,
            forwarding=forwarding,
        )
    finally:
        try:  # each step whatever cuts the one before short
            if forwarding is not None:
                forwarding.closed = True  # no call: its handlers act as the default from here on
                forwarding.close()
        finally:
            interrupted: BaseException | None = None
            while subreaper is not None:  # again until done: left on, orphans are never reaped
                try:
                    set_child_subreaper(subreaper)
                except BaseException as exc:  # noqa: BLE001 - raised below, once it is back
                    interrupted = interrupted or exc
                    continue
                break
            try:
                if tracked:
                    tracked[0].reap_adopted()
            finally:
                if interrupted is not None:
                    raise interrupted


def _run(
    command: Sequence[str],
    env: dict[str, str],
    grace: float,
    *,
    marker: str,
    own: str,
    since: float,
    started: list[subprocess.Popen[bytes]],
    tracked: list[_Command],
    ending: Callable[[], object] | None,
    cannot_run: Callable[[str], object] | None,
    forwarding: _Forwarding,
) -> int:
    """`run_command`'s body, with launch a child subreaper."""
    others: dict[int, float] = {}
    with contextlib.suppress(psutil.Error):
        for process in psutil.Process().children(recursive=True):
            with contextlib.suppress(psutil.Error):
                others[process.pid] = process.create_time()

    made = functools.partial(
        _tracked, marker=marker, since=since, others=others, own=own, forwarding=forwarding
    )
    known = functools.partial(_known, tracked, started, made)
    try:
        try:
            try:
                child = spawn(functools.partial(_start, command, env, started))
            except (OSError, subprocess.SubprocessError) as exc:
                secrets_ = secrets_in_environ(env)
                shown = shown_line(command, secrets=secrets_)
                # The command is shown redacted; an OSError's own text would repeat argv[0].
                strerror = exc.strerror if isinstance(exc, OSError) else None
                why = printable(redact_argv([strerror or str(exc)], secrets=secrets_)[0])
                log.error("cannot run %s: %s", shown, why)  # noqa: TRY400 - no traceback for a missing program
                if cannot_run is not None:
                    cannot_run(f"cannot run {shown}: {why}")
                return 127
            tracker = known() or made(child)  # ``started`` holds the child: known() is it
            tracker.wait_exited()
            _call_ending(ending)
            _end_leftovers(tracker, grace)
            code = _reap(child)
        except VLLMServerError:
            if not started:
                raise
            log.error("stopping the training command: the vLLM server it uses failed")  # noqa: TRY400 - logged by the watchdog
            code = _stop_command(started[0], signal.SIGTERM, grace, known(), ending)
            log.info(
                "the training command exited with %d after the vLLM server failed", _code(code)
            )
            raise
        except (SystemExit, KeyboardInterrupt) as exc:
            if not started:
                raise  # it never ran
            # two at once: the second's handler raised over the first
            came = interruptions(exc) or [
                signal.SIGTERM if isinstance(exc, SystemExit) else signal.SIGINT
            ]
            code = _stop_command(started[0], came[0], grace, known(), ending, again=len(came) > 1)
    except BaseException:
        if started and (started[0].returncode is None or tracked):
            _kill_command(started[0], known())
            _reap(started[0])
        raise
    return _code(code)


def _tracked(
    child: subprocess.Popen[bytes],
    *,
    marker: str,
    since: float,
    others: Mapping[int, float],
    own: str,
    forwarding: _Forwarding,
) -> _Command:
    """The `_Command` of ``child``: found by ``marker``, started after ``since``."""
    command = _Command(child, marker, since, others, own=own)
    command.forwarding = forwarding
    return command


def _known(
    tracked: list[_Command],
    started: list[subprocess.Popen[bytes]],
    make: Callable[[subprocess.Popen[bytes]], _Command],
) -> _Command | None:
    """The command as tracked; made now if an interruption came before it was recorded.

    A signal during the start is raised once the child exists (see `spawn`):
    stopping the command needs its marker and start time, or a daemon it
    forked already would not be found.
    """
    if not tracked and started:
        tracked.append(make(started[0]))
    return _first(tracked)


def _first(tracked: list[_Command]) -> _Command | None:
    return tracked[0] if tracked else None


def _code(code: int) -> int:
    """A shell's exit code: 128+N for a command that died of signal N."""
    return 128 - code if code < 0 else code

"""Run ``verirl launch``'s training command so that it never outlives the launcher.

**One signal, once.** The command runs in a process group of its own (in
launch's session, so it still writes to the terminal), and each SIGINT or
SIGTERM that launch receives is passed on to that whole group exactly once.
From a terminal, Ctrl-C signals only launch's group, so the command does not
get a second copy straight from the terminal; a ``sh -c 'python train.py'``
wrapper's python gets it as it would from a terminal. That matters because
a second SIGINT means "out now, skip the checkpoint" to
`verirl.preemption.PreemptionCallback`. The price: the command is not in the
terminal's foreground group, so it cannot read the terminal's stdin (it would
be stopped with SIGTTIN), and the terminal's SIGTSTP (Ctrl-Z) and SIGQUIT reach
launch only.

**Grace, then SIGKILL.** After passing a signal on, launch waits up to
``grace`` seconds for the command, and for what was in its group then (a
shell that dies of SIGTERM at once must not end the wait while its python
still saves), then SIGKILLs the group. A Ctrl-C after the first signal
SIGKILLs the group at once, and so does a SIGTERM after a Ctrl-C; a second
SIGTERM is ignored (the one SIGTERM policy fires once), so a save in progress
completes. The command also gets the death signal (SIGTERM when verirl dies).

The server watchdog (`verirl._watchdog`) reaches the main thread here the
same way a SIGTERM does, as the policy's interrupt: its `VLLMServerError`
arrives in the wait for the command, which then gets SIGTERM and the grace
like on a preemption (so a trainer with a save-on-SIGTERM callback writes
its checkpoint), and the error propagates (``launch`` exits 4).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import shlex
import signal
import subprocess
import time
from collections.abc import Callable, Collection, Sequence

import psutil

from verirl._process import death_signal_preexec, spawn
from verirl._secrets import redact_argv, secrets_in_environ
from verirl.errors import VLLMServerError

__all__ = ["run_command"]

log = logging.getLogger(__name__)

_STOPPING = (signal.SIGINT, signal.SIGTERM)


def _child_preexec(stopping: Collection[int]) -> Callable[[], None]:
    """The command's ``preexec_fn``: a group of its own, ``stopping`` unblocked, death signal.

    ``stopping`` is blocked from the fork on. A terminal's signal that came
    before ``setpgid`` reached launch as well, which passes it on once the
    command is known: the child's own copy is dropped here (``sigtimedwait``
    takes a pending signal without running a handler).
    """
    death_signal = death_signal_preexec()

    def preexec() -> None:
        os.setpgid(0, 0)
        if hasattr(signal, "sigtimedwait"):  # not on macOS
            while signal.sigtimedwait(stopping, 0) is not None:
                pass
        signal.pthread_sigmask(signal.SIG_UNBLOCK, stopping)
        if death_signal is not None:
            death_signal()

    return preexec


def _start(
    command: Sequence[str], env: dict[str, str], started: list[subprocess.Popen[bytes]]
) -> subprocess.Popen[bytes]:
    """Start the command (on the spawner thread); record it in ``started`` at once."""
    preexec = _child_preexec(_STOPPING)
    blocked = signal.pthread_sigmask(signal.SIG_BLOCK, _STOPPING)  # the child inherits the mask
    try:
        child = subprocess.Popen(list(command), env=env, preexec_fn=preexec)  # noqa: PLW1509 - setpgid, sigmask, prctl, getppid only
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, blocked)
    started.append(child)
    return child


def _group_members(child: subprocess.Popen[bytes]) -> list[psutil.Process]:
    """The command's descendants still in its process group (a wrapper's python)."""
    try:
        descendants = psutil.Process(child.pid).children(recursive=True)
    except psutil.Error:
        return []
    members = []
    for process in descendants:
        with contextlib.suppress(OSError):
            if os.getpgid(process.pid) == child.pid:
                members.append(process)
    return members


def _alive(process: psutil.Process) -> bool:
    """Running and not a zombie (an orphan's zombie may never be reaped in a container)."""
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
    except psutil.Error:
        return True


def _wait_gone(processes: list[psutil.Process], deadline: float) -> bool:
    """Wait until none of ``processes`` runs (they are not our children); False at deadline."""
    delay = 0.001
    while any(_alive(process) for process in processes):
        now = time.monotonic()
        if now >= deadline:
            return False
        time.sleep(min(delay, deadline - now))  # a signal interrupts it: "interrupted again"
        delay = min(delay * 2, 0.05)
    return True


def _signal_group(child: subprocess.Popen[bytes], signum: int) -> None:
    """``signum`` to the command's process group (to the command alone if it left it)."""
    try:
        os.killpg(child.pid, signum)
    except ProcessLookupError:
        with contextlib.suppress(OSError):
            child.send_signal(signum)
    except OSError as exc:
        log.warning("cannot signal the training command's process group %d: %s", child.pid, exc)


def _stop_command(child: subprocess.Popen[bytes], signum: int, grace: float) -> int:
    """Pass ``signum`` on to the command's group once, wait ``grace`` seconds, then SIGKILL it.

    A further signal at any point (a second Ctrl-C, SIGTERM after a Ctrl-C)
    SIGKILLs the group at once: the ``finally`` sees to it even when that
    signal lands between two statements here.
    """
    if child.returncode is not None:  # it ended as the signal came
        return child.returncode
    stopped = False
    try:
        try:
            deadline = time.monotonic() + grace
            members = _group_members(child)
            _signal_group(child, signum)
            log.warning(
                "passed %s on to the training command (pid %d) and its process group; "
                "SIGKILL in %gs",
                signal.Signals(signum).name,
                child.pid,
                grace,
            )
            code = child.wait(timeout=grace)
            if not _wait_gone(members, deadline):
                raise subprocess.TimeoutExpired(child.args, grace)  # noqa: TRY301 - handled below
            stopped = True
        except subprocess.TimeoutExpired:
            log.warning("the training command outlived its %gs grace: sending SIGKILL", grace)
        except (KeyboardInterrupt, SystemExit):  # a second Ctrl-C, or SIGTERM after a Ctrl-C
            log.warning("interrupted again: sending SIGKILL to the training command")
    finally:
        if not stopped:
            _kill_command(child)
    return code if stopped else _reap(child)


def _kill_command(child: subprocess.Popen[bytes]) -> None:
    """SIGKILL the command's process group, and the command itself should it have left it."""
    with contextlib.suppress(OSError):
        os.killpg(child.pid, signal.SIGKILL)
    with contextlib.suppress(OSError):
        child.kill()


def _reap(child: subprocess.Popen[bytes]) -> int:
    """Wait for a SIGKILLed command; a signal meanwhile cannot stop a reap that is quick."""
    while True:
        try:
            return child.wait()
        except (KeyboardInterrupt, SystemExit):  # noqa: PERF203
            continue


def run_command(command: Sequence[str], env: dict[str, str], grace: float) -> int:
    """Run ``command``; return its exit code (128+N when it died of signal N).

    The command runs in a process group of its own (see the module
    docstring). SIGTERM (the one policy's `SystemExit`) or Ctrl-C while it
    runs is passed on to that group once, with ``grace`` seconds to exit
    before SIGKILL. It is started from verirl's spawner thread with both
    signals blocked there: one arriving meanwhile is handled once the command
    is known, and passed on to it. The command gets SIGTERM from the kernel
    if verirl itself dies. Whatever interrupts verirl here, the command never
    outlives this call. A `VLLMServerError` raised here (the watchdog's
    interrupt) stops the command as SIGTERM does, then propagates.
    """
    started: list[subprocess.Popen[bytes]] = []
    try:
        try:
            try:
                child = spawn(functools.partial(_start, command, env, started))
            except (OSError, subprocess.SubprocessError) as exc:
                secrets = secrets_in_environ(env)
                shown = shlex.join(redact_argv(command, secrets=secrets))
                # The command is shown redacted; an OSError's own text would repeat argv[0].
                strerror = exc.strerror if isinstance(exc, OSError) else None
                (why,) = redact_argv([strerror or str(exc)], secrets=secrets)
                log.error("cannot run %s: %s", shown, why)  # noqa: TRY400 - no traceback for a missing program
                return 127
            code = child.wait()
        except VLLMServerError:
            if not started:
                raise
            log.error("stopping the training command: the vLLM server it uses failed")  # noqa: TRY400 - logged by the watchdog
            code = _stop_command(started[0], signal.SIGTERM, grace)
            log.info(
                "the training command exited with %d after the vLLM server failed", _code(code)
            )
            raise
        except (SystemExit, KeyboardInterrupt) as exc:
            if not started:
                raise  # it never ran
            signum = signal.SIGINT if isinstance(exc, KeyboardInterrupt) else signal.SIGTERM
            code = _stop_command(started[0], signum, grace)
    except BaseException:
        if started and started[0].returncode is None:
            _kill_command(started[0])
            _reap(started[0])
        raise
    return _code(code)


def _code(code: int) -> int:
    """A shell's exit code: 128+N for a command that died of signal N."""
    return 128 - code if code < 0 else code

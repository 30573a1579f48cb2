"""Run ``verirl launch``'s training command so that it never outlives the launcher.

SIGTERM (the one policy's `SystemExit`) or Ctrl-C while it runs is passed
on to it, with a grace period before SIGKILL; a second signal SIGKILLs it at
once. The command also gets the death signal (SIGTERM when verirl dies).

The server watchdog (`verirl._watchdog`) reaches the main thread here the
same way a SIGTERM does, as the policy's interrupt: its `VLLMServerError`
arrives in the wait for the command, which then gets SIGTERM and the grace
like on a preemption (so a trainer with a save-on-SIGTERM callback writes
its checkpoint), and the error propagates (``launch`` exits 4).
"""

from __future__ import annotations

import contextlib
import logging
import shlex
import signal
import subprocess
from collections.abc import Callable, Collection, Sequence

from verirl._process import death_signal_preexec
from verirl.errors import VLLMServerError

__all__ = ["run_command"]

log = logging.getLogger(__name__)


def _child_preexec(unblock: Collection[int]) -> Callable[[], None]:
    """The command's ``preexec_fn``: unblock ``unblock`` and ask for the death signal."""
    death_signal = death_signal_preexec()

    def preexec() -> None:
        signal.pthread_sigmask(signal.SIG_UNBLOCK, unblock)
        if death_signal is not None:
            death_signal()

    return preexec


def _stop_command(child: subprocess.Popen[bytes], signum: int, grace: float) -> int:
    """Forward ``signum`` to the command, wait ``grace`` seconds, then SIGKILL it.

    A further signal at any point (a second Ctrl-C, SIGTERM after a Ctrl-C)
    SIGKILLs it at once: the ``finally`` sees to it even when that signal
    lands between two statements here.
    """
    stopped = False
    try:
        try:
            log.warning(
                "forwarding signal %d to the training command (pid %d); SIGKILL in %gs",
                signum,
                child.pid,
                grace,
            )
            child.send_signal(signum)
            code = child.wait(timeout=grace)
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

    SIGTERM (the one policy's `SystemExit`) or Ctrl-C while it runs is
    forwarded to it, with ``grace`` seconds to exit before SIGKILL. Both
    signals are blocked while it is spawned, so one arriving then is delivered
    once the command is known; the command unblocks them, and gets SIGTERM
    from the kernel if verirl itself dies. Whatever interrupts verirl here,
    the command never outlives this call. A `VLLMServerError` raised here (the
    watchdog's interrupt) stops the command as SIGTERM does, then propagates.
    """
    stopping = (signal.SIGINT, signal.SIGTERM)
    child: subprocess.Popen[bytes] | None = None
    try:
        try:
            preexec = _child_preexec(stopping)
            signal.pthread_sigmask(signal.SIG_BLOCK, stopping)
            try:
                child = subprocess.Popen(list(command), env=env, preexec_fn=preexec)  # noqa: PLW1509 - sigmask, prctl, getppid only
            except OSError as exc:
                log.error("cannot run %s: %s", shlex.join(command), exc)  # noqa: TRY400 - no traceback for a missing program
                return 127
            finally:
                signal.pthread_sigmask(signal.SIG_UNBLOCK, stopping)
            code = child.wait()
        except VLLMServerError:
            if child is None:
                raise
            log.error("stopping the training command: the vLLM server it uses failed")  # noqa: TRY400 - logged by the watchdog
            code = _stop_command(child, signal.SIGTERM, grace)
            log.info(
                "the training command exited with %d after the vLLM server failed", _code(code)
            )
            raise
        except (SystemExit, KeyboardInterrupt) as exc:
            if child is None:
                raise
            signum = signal.SIGINT if isinstance(exc, KeyboardInterrupt) else signal.SIGTERM
            code = _stop_command(child, signum, grace)
    except BaseException:
        if child is not None and child.returncode is None:
            _kill_command(child)
            _reap(child)
        raise
    return _code(code)


def _code(code: int) -> int:
    """A shell's exit code: 128+N for a command that died of signal N."""
    return 128 - code if code < 0 else code

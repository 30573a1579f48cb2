"""The one SIGTERM policy: a preemption unwinds the ``with`` block so teardown runs.

Cloud schedulers (Modal, Kubernetes, SLURM) preempt a job with SIGTERM and
SIGKILL it a grace period later. Python's default for SIGTERM kills the
process at once, skipping every ``finally`` and ``__exit__``, so a vLLM
server would be left to the death signal alone. While verirl holds a server
or a runtime, SIGTERM instead raises ``SystemExit(143)`` in the main thread.

The rules, in one place for `verirl.VLLMServer`, `verirl.TrainingRuntime` and
the CLI:

- **Keep an existing handler.** The handler is installed only over the
  default disposition; a handler the program installed (a save-on-preemption
  callback) or ``SIG_IGN`` is left alone, and is what runs on SIGTERM.
- **Main thread only.** Python runs handlers in the main thread; from any
  other thread `SigtermPolicy.acquire` counts nothing and installs nothing.
- **Fire once.** The first SIGTERM raises; one arriving during the teardown
  it started is logged and ignored, so the teardown is not cut short.
- **Restore on exit, nest safely.** Holders are counted; the default comes
  back when the last one releases, and only if our handler is still the one
  installed (a handler installed meanwhile by the program stays).
- **Interrupt through it.** A watchdog thread that must end the ``with``
  block (the vLLM server died) calls `SigtermPolicy.interrupt` with its
  error: a SIGTERM is sent to the main thread only (``pthread_kill``, so a
  blocking sleep or socket read there ends at once) and the handler raises
  that error instead of ``SystemExit(143)``. It counts as the one firing: a
  real SIGTERM afterwards is ignored like any second one. Only while our
  handler is the one installed: verirl never takes over a program's handler.
- **One owner at a time, no swallowing.** A handler that takes SIGTERM over
  from the policy for a while (`verirl.preemption.PreemptionCallback`, which
  waits for a step end) registers with `SigtermPolicy.cooperate`: an
  interrupt then goes to it like to the policy's own handler, and it claims
  the interrupt first (`SigtermPolicy.take_interrupt`) and raises its error at
  once, so a loop that never reaches a step end still unwinds within the
  watchdog's grace.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import types
from collections.abc import Callable, Iterator

__all__ = [
    "SIGTERM_POLICY",
    "SigtermPolicy",
    "exit_on_sigterm",
    "program_handler",
    "program_note",
    "program_received",
    "sigterm_pending",
]

log = logging.getLogger("verirl.signals")


class SigtermPolicy:
    """Reference-counted ``SIGTERM → SystemExit(143)`` while held (see the module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.RLock()  # the handler may run while the main thread holds it
        self._users = 0
        self._installed = False
        self._fired = False
        self._cause: BaseException | None = None
        self._interrupt_sent = False
        self._cooperating: list[Callable[[int, types.FrameType | None], object]] = []

    @property
    def active(self) -> bool:
        """Whether our handler is installed now (False when the program's own one is kept)."""
        return self._installed and signal.getsignal(signal.SIGTERM) == self.handle

    @property
    def fired(self) -> bool:
        """Whether a SIGTERM was turned into ``SystemExit`` since the first holder acquired."""
        return self._fired

    def handle(self, signum: int, _frame: types.FrameType | None) -> None:
        """The handler: raise ``SystemExit(128 + signum)`` once; act as the default if unheld.

        After `interrupt`, the SIGTERM it sent raises the interrupt's error
        instead (or nothing, once `withdraw` took the error back).
        """
        ours, cause = self.take_interrupt()
        if ours and cause is None:
            log.debug("an interrupt withdrawn or outlived by its holder; SIGTERM ignored")
            return
        if cause is not None:
            raise cause
        if self._users == 0:
            # Released off the main thread, so the handler could not be removed: be the default.
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)
            return
        if self._fired:
            log.warning("SIGTERM received again while tearing down; ignored")
            return
        self._fired = True
        log.warning("SIGTERM received: exiting so that the vLLM server is stopped first")
        raise SystemExit(128 + signum)

    def take_interrupt(self) -> tuple[bool, BaseException | None]:
        """For a SIGTERM handler: whether this SIGTERM is an `interrupt`'s, and its error.

        The error is ``None`` when the interrupt was withdrawn or its holder
        released the policy meanwhile (the SIGTERM is then to be ignored).
        Handing the error out counts as the policy's one firing.
        """
        with self._lock:
            sent, cause = self._interrupt_sent, self._cause
            self._interrupt_sent = False
            self._cause = None
            if not sent:
                return False, None
            if cause is None or self._users == 0:
                return True, None
            self._fired = True
            return True, cause

    def cooperate(
        self, handler: Callable[[int, types.FrameType | None], object]
    ) -> Callable[[], None]:
        """Let ``handler``, while it is SIGTERM's handler, receive `interrupt` like ours does.

        ``handler`` must call `take_interrupt` first thing and raise the error
        it gets. Returns the function that ends the arrangement (idempotent).
        """
        with self._lock:
            self._cooperating.append(handler)

        def remove() -> None:
            with self._lock:
                if handler in self._cooperating:
                    self._cooperating.remove(handler)

        return remove

    def _interruptible(self) -> bool:
        """Whether SIGTERM's handler now is ours (or the CLI's copy) or a cooperating one."""
        current = signal.getsignal(signal.SIGTERM)
        return current == self.handle or any(current == h for h in self._cooperating)

    def interrupt(self, error: BaseException) -> bool:
        """Raise ``error`` in the main thread, as a SIGTERM raises ``SystemExit``; from any thread.

        Returns False, doing nothing, unless the policy is held, its handler
        (or a `cooperate`-ing one) is the one installed, and it has not fired
        yet (a SIGTERM or an earlier interrupt is already unwinding the main
        thread then).
        """
        with self._lock:
            ours = self._interruptible()
            if not self._users or not ours or self._fired or self._interrupt_sent:
                return False
            self._cause = error
            self._interrupt_sent = True
        main = threading.main_thread().ident
        if main is None:  # pragma: no cover - the main thread always has an ident
            return False
        signal.pthread_kill(main, signal.SIGTERM)
        return True

    def withdraw(self, error: BaseException) -> bool:
        """Take back an `interrupt` whose SIGTERM has not been handled yet; True if it was.

        The runtime calls this once it stops normally, so a watchdog firing
        at that very moment cannot cut its teardown short: the late SIGTERM
        is then ignored.
        """
        with self._lock:
            if self._interrupt_sent and self._cause is error:
                self._cause = None
                return True
            return False

    def note_fired(self) -> None:
        """A SIGTERM was handled by the program's handler, which now unwinds: fire no more.

        `verirl.preemption.PreemptionCallback` takes SIGTERM over from this
        policy while training runs and gives it back before exiting 143; a
        second SIGTERM during the teardown that follows is then ignored, as if
        this policy had fired.
        """
        with self._lock:
            if self._users:
                self._fired = True

    def acquire(self) -> bool:
        """Count a holder and install the handler if SIGTERM has the default. True if counted."""
        if threading.current_thread() is not threading.main_thread():
            log.debug("not in the main thread: SIGTERM is left as it is")
            return False
        with self._lock:
            if self._users == 0:
                current = signal.getsignal(signal.SIGTERM)
                self._installed = False
                self._fired = False
                self._cause = None
                self._interrupt_sent = False
                if current == self.handle:
                    self._installed = True
                elif current == signal.SIG_DFL:
                    try:
                        signal.signal(signal.SIGTERM, self.handle)
                    except ValueError:  # not the main interpreter
                        return False
                    self._installed = True
                else:
                    log.debug("SIGTERM already has a handler (%r); leaving it", current)
            self._users += 1
        return True

    def release(self) -> None:
        """Uncount a holder; after the last one, put the default back if ours is still there."""
        with self._lock:
            self._users = max(self._users - 1, 0)
            if self._users or not self._installed:
                return
            on_main = threading.current_thread() is threading.main_thread()
            if on_main and signal.getsignal(signal.SIGTERM) == self.handle:
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                self._installed = False

    @contextlib.contextmanager
    def held(self) -> Iterator[bool]:
        """Hold the policy for a ``with`` block; yields whether this holder was counted."""
        counted = self.acquire()
        try:
            yield counted
        finally:
            if counted:
                self.release()

    def reset_after_fork(self) -> None:
        """A forked child holds nothing; its copy of the handler acts as the default."""
        self._lock = threading.RLock()  # the handler may run while the main thread holds it
        self._users = 0
        self._fired = False
        self._cause = None
        self._interrupt_sent = False


SIGTERM_POLICY = SigtermPolicy()
"""The process-wide policy every verirl component uses."""


def exit_on_sigterm() -> contextlib.AbstractContextManager[bool]:
    """Hold `SIGTERM_POLICY` for a ``with`` block; yields whether this holder was counted."""
    return SIGTERM_POLICY.held()


_PROGRAM_RECEIVED: list[int] = []


def program_handler(signum: int, _frame: types.FrameType | None) -> None:
    """The ``verirl`` program's own SIGTERM handler (`verirl.__main__`): exit ``128 + signum``.

    It also notes the signal (`program_received`): ``compile()``, run by an
    import with no cached bytecode (``PYTHONDONTWRITEBYTECODE``), can swallow
    the ``SystemExit`` a handler raises, and the exit code must not depend on that.
    """
    _PROGRAM_RECEIVED.append(signum)
    raise SystemExit(128 + signum)


def program_note(signum: int, _frame: types.FrameType | None) -> None:
    """`program_handler` once the command has returned: note the signal, raise nothing.

    The program is already on its way out; a ``SystemExit`` now would only cut
    short the last teardown and print a traceback from an exit hook.
    """
    _PROGRAM_RECEIVED.append(signum)


def program_received() -> int | None:
    """The first signal `program_handler` received, or ``None``."""
    return _PROGRAM_RECEIVED[0] if _PROGRAM_RECEIVED else None


def sigterm_pending() -> bool:
    """Whether a SIGTERM came, to the held policy or to `program_handler` (its exit may be lost)."""
    return SIGTERM_POLICY.fired or bool(_PROGRAM_RECEIVED)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=SIGTERM_POLICY.reset_after_fork)

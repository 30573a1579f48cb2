"""`PreemptionCallback`: on a preemption signal, finish the step, save a checkpoint, stop, exit.

transformers' Trainer ignores preemption: a preempted job dies where it
stands and loses every step since its last save (up to ``save_steps - 1``).
With ``callbacks=[PreemptionCallback()]`` the step in flight finishes,
Trainer writes a complete checkpoint at that step and stops, and the process
ends the way the platform reads as "preempted, retry me"; the retry
(``verirl launch --resume auto``, ``TrainingRuntime`` with ``auto``) resumes at
that very step.

Which signal depends on the platform: Kubernetes, SLURM (``--signal``) and
``verirl launch`` send SIGTERM; Modal sends **SIGINT** (a ``KeyboardInterrupt``
in the function body's main thread) and SIGKILLs 30 s later; a person at a
terminal presses Ctrl-C. Both are handled by default (``signals=``).

How the process ends after the save (``exit_code``, default: by the signal):

- SIGTERM: ``SystemExit(143)``; another signal N: ``SystemExit(128 + N)``;
- SIGINT: the ``KeyboardInterrupt`` Python would have raised, only later, so
  the process ends as Ctrl-C ends it (Python re-raises SIGINT on its way out: a
  shell shows 130, ``Popen.returncode`` is -2), and Modal's runtime reads it as
  the preemption (it retries the input; a function that returned would count
  as done);
- ``exit_code=N``: ``SystemExit(N)`` for every signal; ``exit_code=None``:
  ``train()`` returns (check `stopped_at`).

A second signal while stopping: a second **SIGINT** means "out now" (a person
pressing Ctrl-C twice): ``KeyboardInterrupt`` at once, wherever the main
thread is, the save included. The checkpoint folder being written carries
transformers' ``checkpoint-is-incomplete.txt`` sentinel from before the save
until Trainer's ``on_save`` (after ``trainer_state.json``), so a save cut
short, by that or by a SIGKILL, never counts as complete. Any other second
signal is ignored, so that the save completes.

This module imports transformers (the callback subclasses its
``TrainerCallback``), so `verirl` imports it only on first use of
``verirl.PreemptionCallback``; ``import verirl`` stays free of it.

Rules, on top of the one SIGTERM policy (`verirl._signals`):

- Each handler is installed at ``on_train_begin`` over the default
  disposition (for SIGINT also Python's ``default_int_handler``), over
  verirl's own policy handler (a `TrainingRuntime` or `VLLMServer` started
  earlier) or over transformers' JIT-checkpoint handler
  (``enable_jit_checkpoint=True``, which this callback replaces, saying so
  once in the log), never over a handler the program set, nor ``SIG_IGN``;
  it is put back at ``on_train_end``. In a thread other than the main one no
  handler can be installed: only stop requests work there; nor put back: a
  handler closed there stays until the main thread gives it back, passing
  signals on meanwhile, and still raises the watchdog's interrupt.
- A stop request (`verirl._stop.STOP_REQUESTS`, e.g. the vLLM server
  exiting) stops training the same way; the request's error is raised after
  the save instead of the exit.
- Every rank stops at the same step: the flag is agreed across ranks (an
  all-reduce of one integer) at each step end, or ranks would deadlock.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import types
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, Final

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from verirl._fs import printable, quoted, write_new_file
from verirl._signals import (
    SIGTERM_POLICY,
    jit_chain,
    jit_checkpoint_manager,
    leave_in_place,
    outside_tracers_lock,
    pass_to,
    stand_in_for,
)
from verirl._stop import STOP_REQUESTS
from verirl._validate import check_int
from verirl.checkpoints.model import INCOMPLETE_MARKER, read_trainer_state
from verirl.errors import CheckpointSourceError, ConfigError

__all__ = ["BY_SIGNAL", "PREEMPTION_EXIT_CODE", "PREEMPTION_SIGNALS", "PreemptionCallback"]

log = logging.getLogger(__name__)

PREEMPTION_EXIT_CODE = 143
"""128 + SIGTERM: what orchestrators read as "terminated", so they retry rather than finish."""
PREEMPTION_SIGNALS: Final = (signal.SIGTERM, signal.SIGINT)
"""The signals handled by default: Kubernetes/SLURM/``verirl launch`` (SIGTERM), Modal (SIGINT)."""


class _BySignal:
    """The type of `BY_SIGNAL`."""

    def __repr__(self) -> str:
        return "BY_SIGNAL"


BY_SIGNAL: Final = _BySignal()
"""``exit_code``'s default: end as the signal would have (143 for SIGTERM, 130 for SIGINT)."""

_Handler = Callable[[int, types.FrameType | None], Any] | int | signal.Handlers | None
_UNCATCHABLE = frozenset({signal.SIGKILL, signal.SIGSTOP})

# Re-entrant: a signal handler (`PreemptionCallback._on_signal`) takes it, and may run on the
# main thread while that thread holds it. Each section below is one list call or a snapshot,
# so a handler run in its middle sees and leaves whole lists.
_ACTIVE_LOCK = threading.RLock()
_ACTIVE: list[PreemptionCallback] = []  # at most one: the callback now in charge
_STALE: list[PreemptionCallback] = []  # closed off the main thread, their handlers still set


def _forget_the_parent_s_training() -> None:
    """In a forked child: the parent's callbacks train nothing here.

    Their handlers, copied in, stand in for what they replaced (`leave_in_place`),
    so that a holder in the child (its own server) takes SIGTERM over as from the default.
    """
    global _ACTIVE_LOCK  # noqa: PLW0603 - a lock held at the fork stays held in the child
    _ACTIVE_LOCK = threading.RLock()
    for callback in [*_ACTIVE, *_STALE]:
        for signum, replaced in list(callback._previous.items()):  # noqa: SLF001 - same module
            spent = jit_checkpoint_manager(replaced) is not None
            leave_in_place(signum, callback._on_signal, signal.SIG_DFL if spent else replaced)  # noqa: SLF001
    _ACTIVE.clear()
    _STALE.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_the_parent_s_training)


def _check_signals(value: object) -> tuple[signal.Signals, ...]:
    """``signals=``: distinct catchable signals (ints or `signal.Signals`), else `ConfigError`."""
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise ConfigError.invalid("signals", value, "must be a sequence of signals")
    found: list[signal.Signals] = []
    for item in value:
        if isinstance(item, bool) or not isinstance(item, int):
            raise ConfigError.invalid("signals", value, f"{quoted(item)} is not a signal number")
        try:
            signum = signal.Signals(item)
        except ValueError:
            raise ConfigError.invalid("signals", value, f"{quoted(item)} is not a signal") from None
        if signum in _UNCATCHABLE:
            raise ConfigError.invalid("signals", value, f"{signum.name} cannot be caught")
        if signum not in found:
            found.append(signum)
    return tuple(found)


def _name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def _is_default(signum: int, handler: _Handler) -> bool:
    """Whether ``handler`` is what the process would have without anyone's choice."""
    if handler == signal.SIG_DFL:
        return True
    return signum == signal.SIGINT and handler is signal.default_int_handler


class PreemptionCallback(TrainerCallback):  # type: ignore[misc]  # transformers is untyped here
    """Save a checkpoint at the step where a preemption signal (or a stop request) came, then exit.

    ``signals`` (default SIGTERM and SIGINT) are the signals that mean
    preemption; ``exit_code`` how the process ends after the save: by default
    as the signal would have (``SystemExit(143)`` for SIGTERM,
    ``KeyboardInterrupt``, exit 130, for SIGINT), an int for
    ``SystemExit(exit_code)`` whatever the signal, ``None`` to return from
    ``trainer.train()`` (check `stopped_at`). Only one callback acts at a
    time: a newer one, from a second ``train()`` or a second trainer, takes
    over from the older.
    """

    def __init__(
        self,
        *,
        signals: Iterable[int] = PREEMPTION_SIGNALS,
        exit_code: int | _BySignal | None = BY_SIGNAL,
    ) -> None:
        if exit_code is not None and exit_code is not BY_SIGNAL:
            check_int("exit_code", exit_code, 1, 255)
        self._signals = _check_signals(signals)
        self._exit_code = exit_code
        self._lock = threading.RLock()  # `_on_request` may run on the main thread, a handler too
        self._requested = threading.Event()
        self._error: BaseException | None = None
        self._signalled: int | None = None  # the first preemption signal of this train()
        self._stopping = False
        self._stopped_at: int | None = None
        self._active = False
        self._stale: set[int] = set()  # handlers to give back, from the main thread
        self._previous: dict[int, _Handler] = {}  # signal -> the handler ours replaced
        self._pid = os.getpid()  # the process whose training this is (`_on_signal`)
        self._jit_set_aside = False
        self._marker: Path | None = None  # the sentinel this callback wrote before its save
        self._remove_listener: Callable[[], None] | None = None
        self._remove_cooperation: Callable[[], None] | None = None

    def __repr__(self) -> str:
        names = ", ".join(signum.name for signum in self._signals)
        return f"PreemptionCallback(signals=({names}), exit_code={quoted(self._exit_code)})"

    @property
    def signals(self) -> tuple[signal.Signals, ...]:
        """The signals this callback treats as a preemption."""
        return self._signals

    @property
    def exit_code(self) -> int | None:
        """The status after a SIGTERM stop (``None``: no exit); see the class for other signals."""
        if isinstance(self._exit_code, _BySignal):
            return PREEMPTION_EXIT_CODE
        return self._exit_code

    @property
    def stop_requested(self) -> bool:
        """Whether a preemption signal or a stop request came in this ``train()`` (this rank)."""
        return self._requested.is_set()

    @property
    def stopped_at(self) -> int | None:
        """The global step training stopped (and saved) at, or ``None`` if it did not stop early."""
        return self._stopped_at

    # -- Trainer events

    def on_train_begin(
        self,
        args: TrainingArguments,  # noqa: ARG002 - Trainer passes these by name
        state: TrainerState,  # noqa: ARG002
        control: TrainerControl,  # noqa: ARG002
        **_: object,
    ) -> None:
        """Take charge: listen for stop requests and install the signal handlers."""
        with _ACTIVE_LOCK:
            older = [callback for callback in _ACTIVE if callback is not self]
            _ACTIVE[:] = []
        for callback in older:
            log.warning("a newer PreemptionCallback takes over from %r", callback)
            callback.close()
        self._reset()
        with _ACTIVE_LOCK:
            _ACTIVE.append(self)
        self._active = True
        SIGTERM_POLICY.went_on()  # an earlier stop's exit was caught: the program trains again
        STOP_REQUESTS.reset()
        self._remove_listener = STOP_REQUESTS.listen(self._on_request)
        self._install()

    def on_step_end(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **_: object
    ) -> None:
        """At a step boundary agreed by every rank: save here and stop."""
        if self._active and not self._stopping and self._agree(args):
            self._stop(state.global_step, "saving a checkpoint at this step and stopping")
            control.should_save = True
            control.should_training_stop = True
            control.should_evaluate = False  # time the grace period does not have
            self._mark_incomplete(args, state.global_step)

    def on_save(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **_: object
    ) -> None:
        """After Trainer's save: the checkpoint is complete (or, mid-save, the one to stop at)."""
        if self._marker is not None:
            self._unmark()
            return
        if self._active and not self._stopping and self._agree(args):
            self._stop(state.global_step, "the checkpoint just saved is at this step; stopping")
            control.should_training_stop = True

    def on_train_end(
        self,
        args: TrainingArguments,
        state: TrainerState,
        control: TrainerControl,  # noqa: ARG002 - Trainer passes it by name
        **_: object,
    ) -> None:
        """Give the signals back; after a stop, raise the request's error, or end as configured."""
        if not self._active:
            return
        stopped = self._stopping or self._agree(args)  # a signal after the last step's end
        signalled, error = self._signalled, self._error
        # Ending by SystemExit after a signal: ours stays on SIGTERM (it ignores any further
        # SIGTERM, e.g. torchrun's to the other ranks) until the process is gone, rather than
        # the default's sudden death; a program that catches the exit and goes on gets it back
        # from the next holder (`leave_in_place`). Not after a Ctrl-C's KeyboardInterrupt, often
        # caught (a notebook) with the process going on. SIGINT goes back at once: a second
        # Ctrl-C during the teardown means "out now".
        by_interrupt = not isinstance(self._exit_code, int) and signalled == signal.SIGINT
        ending = stopped and error is None and self._exit_code is not None and not by_interrupt
        self._deactivate(keep={signal.SIGTERM} if ending else set())
        if not stopped:
            return
        if self._stopped_at is None:
            self._stopped_at = state.global_step
        if state.is_world_process_zero:
            _report(args.output_dir, self._stopped_at)
        if error is not None:
            log.warning("training stopped for %s: raising it", type(error).__name__)
            raise error
        if self._exit_code is None:
            return
        exits = isinstance(self._exit_code, int) or signalled != signal.SIGINT
        if signalled is not None and exits:
            # a SIGTERM during verirl's teardown is ignored as the SystemExit unwinds; not after
            # a Ctrl-C's KeyboardInterrupt (often caught, the process going on), where it acts
            SIGTERM_POLICY.note_fired()
        if isinstance(self._exit_code, int):
            code = self._exit_code
        elif signalled == signal.SIGINT:
            log.warning(
                "raising KeyboardInterrupt (exit 130), as SIGINT would have, so that the "
                "platform retries the job"
            )
            raise KeyboardInterrupt
        else:
            code = PREEMPTION_EXIT_CODE if signalled is None else 128 + signalled
        log.warning("exiting with %d so that the orchestrator retries the job", code)
        raise SystemExit(code)

    def close(self) -> None:
        """Stop listening and put the previous signal handlers back; idempotent.

        Called by ``on_train_end``; call it yourself only if ``train()`` raised
        and the process goes on (otherwise a signal would wait for a step end
        that never comes).
        """
        self._deactivate(keep=set())

    # -- internals

    def _deactivate(self, *, keep: set[int]) -> None:
        self._active = False
        # One list call, not check-then-remove: a handler run in between may remove it first.
        with _ACTIVE_LOCK, contextlib.suppress(ValueError):
            _ACTIVE.remove(self)
        remove, self._remove_listener = self._remove_listener, None
        if remove is not None:
            remove()
        kept = self._uninstall(keep)  # SIGTERM given back: it stops cooperating with the policy
        if kept:
            self._requested.set()  # the handlers left in place now only log and ignore

    def _reset(self) -> None:
        self._requested.clear()
        self._error = None
        self._signalled = None
        self._stopping = False
        self._stopped_at = None
        self._marker = None

    def _install(self) -> None:
        if not self._signals:
            return
        self._pid = os.getpid()
        if threading.current_thread() is not threading.main_thread():
            log.warning(
                "training runs outside the main thread: %s left as they are (Python runs signal "
                "handlers in the main thread only); verirl's stop requests still apply",
                "/".join(signum.name for signum in self._signals),
            )
            return
        with _ACTIVE_LOCK:
            stale = list(_STALE)
        for callback in stale:  # a handler left by a callback closed off the main thread
            callback._give_back(set(callback._stale))  # noqa: SLF001 - the same class
        for signum in self._signals:
            # an older callback's handler left in place as its exit ended the process, which
            # went on (the exit caught): what it stood in for is what is replaced
            current = stand_in_for(signum, signal.getsignal(signum))
            jit = signum == signal.SIGTERM and jit_checkpoint_manager(current) is not None
            if jit:
                jit_chain(current)  # noted: the policy lends to it while held
            ours = signum == signal.SIGTERM and current == SIGTERM_POLICY.handle
            if not (_is_default(signum, current) or ours or jit):
                log.warning(
                    "%s already has a handler the program set (%r): left in place, so %s will "
                    "not save a checkpoint; verirl's stop requests still apply",
                    signum.name,
                    current,
                    signum.name,
                )
                continue
            self._previous[signum] = current  # first: a signal once ours is in finds it noted
            try:
                signal.signal(signum, self._on_signal)
            except ValueError:  # not the main interpreter
                del self._previous[signum]
                log.warning("cannot install a %s handler here; left as it is", signum.name)
                continue
            if signum == signal.SIGTERM:
                # The watchdog's interrupt (after vllm_failure_grace) comes to this handler now.
                self._stop_cooperating()
                self._remove_cooperation = SIGTERM_POLICY.cooperate(self._on_signal)
            if jit:
                self._jit_set_aside = True
                log.info(
                    "SIGTERM: PreemptionCallback takes over from transformers' JIT checkpoint "
                    "(enable_jit_checkpoint=True), which will not run: the step in flight "
                    "finishes and every rank saves at the same step"
                )
            log.debug(
                "%s now saves a checkpoint at the next step end (was %r)", signum.name, current
            )

    def _interrupt_taken(self) -> tuple[bool, BaseException | None]:
        """Whether a SIGTERM is the watchdog's interrupt, and the error to raise for it.

        Its error comes with the callback deactivated; none (taken back meanwhile):
        the SIGTERM is ignored.
        """
        sent, cause = SIGTERM_POLICY.take_interrupt()
        if not sent:
            return False, None
        if cause is None:
            log.debug("an interrupt taken back meanwhile: SIGTERM ignored")
            return True, None
        log.error(
            "training did not stop at a step end in time after %s: raising it now",
            type(cause).__name__,
        )
        if self._stale:  # on the main thread now: they can go back
            self._give_back(set(self._stale))
        self._deactivate(keep=set())
        return True, cause

    @outside_tracers_lock
    def _as_before_in_a_child(self, signum: int, frame: types.FrameType | None) -> None:
        """A process forked from the training's (a reward pool's worker): no training to stop.

        The signal goes where it went before ours, the default (a worker that
        ``terminate()`` must end, or a pool's exit waits for it for good); the
        child's own policy's interrupt raises its error there.
        """
        sent, cause = (False, None)
        if signum == signal.SIGTERM:
            sent, cause = SIGTERM_POLICY.take_interrupt()
        previous = stand_in_for(signum, self._previous.get(signum, signal.SIG_DFL))
        if previous == self._on_signal or jit_checkpoint_manager(previous) is not None:
            previous = signal.SIG_DFL  # nothing of the parent's training is this process's
        signal.signal(signum, previous)
        if cause is not None:
            raise cause
        if not sent:
            pass_to(previous, signum, frame)

    def _uninstall(self, keep: set[int]) -> bool:
        """Put back each handler ours replaced, except those in ``keep``; True if any kept.

        Off the main thread no handler can be set: those to give back are
        marked stale, and given back from the main thread, by the next
        callback's install or by the first such signal (which then goes where
        it would have gone without us). A SIGTERM handler still installed,
        stale or kept, keeps cooperating with the policy, so that the
        watchdog's interrupt still reaches it (see `_on_signal`).
        """
        if threading.current_thread() is not threading.main_thread():
            stale = {signum for signum in self._previous if signum not in keep}
            with _ACTIVE_LOCK:
                self._stale |= stale
                if self._stale and self not in _STALE:
                    _STALE.append(self)
            return any(signum in keep for signum in self._previous)
        kept = False
        for signum, previous in list(self._previous.items()):
            current = signal.getsignal(signum)
            # Kept only over a default (or the JIT handler, which put its default back itself).
            jit = jit_checkpoint_manager(previous)
            replaceable = _is_default(signum, previous) or jit is not None
            here = stand_in_for(signum, current)  # an older callback's kept one: what it stands for
            if (
                signum in keep
                and replaceable
                and (current in (self._on_signal, previous) or _is_default(signum, here))
            ):
                # What ours stands in for: the default, never a finished trainer's JIT handler
                # (its callback put back its own original, which is what is here then).
                standing = here if current != self._on_signal else previous
                if jit_checkpoint_manager(standing) is not None:
                    standing = signal.SIG_DFL
                leave_in_place(signum, self._on_signal, standing)  # first: it may be taken over
                if current != self._on_signal:
                    signal.signal(signum, self._on_signal)
                kept = True
                continue
            # Put back first, forget after: a handler run in between (a second Ctrl-C) gives
            # back all ours it still finds, and its exception ends this loop where it is.
            if current == self._on_signal:
                signal.signal(signum, previous)
            elif stand_in_for(signum, current) is not current:
                # An older callback's, left in place, that a JIT checkpoint put back as its
                # original: what it stands in for goes back instead.
                signal.signal(signum, stand_in_for(signum, current))
            self._previous.pop(signum, None)
        self._cooperate_while_installed()
        if not kept:  # a JIT checkpoint's callback may have put back a handler that never exits
            SIGTERM_POLICY.reclaim()
        return kept

    def _give_back(self, signals: set[int]) -> dict[int, _Handler]:
        """From the main thread: put back the stale handlers of ``signals``; those put back."""
        given: dict[int, _Handler] = {}
        for signum in signals:
            # Put back first, forget after: a signal handled in between still finds the handler
            # ours replaced (popped first, it would find none and act as the default).
            previous = self._previous.get(signum, signal.SIG_DFL)
            if signal.getsignal(signum) == self._on_signal:
                signal.signal(signum, previous)
            self._previous.pop(signum, None)
            given[signum] = previous
        with _ACTIVE_LOCK:
            self._stale -= signals
            if not self._stale:
                with contextlib.suppress(ValueError):  # a handler run in between removed it
                    _STALE.remove(self)
        self._cooperate_while_installed()
        return given

    def _pass_on_stale(self, signum: int, frame: types.FrameType | None) -> None:
        """A signal to a handler closed off the main thread: on to where it goes now.

        To the callback in charge if it takes that signal (one whose training
        runs in a thread has no handler of its own), else to the handler ours
        replaced, as if ours had been given back in time.
        """
        with _ACTIVE_LOCK:
            active = next((each for each in _ACTIVE if signum in each.signals), None)
        if active is not None and active is not self:
            active._on_signal(signum, frame)  # noqa: SLF001 - the same class
            return
        previous = self._give_back({signum})[signum]
        log.info("%s: this PreemptionCallback was closed; passed on to %r", _name(signum), previous)
        pass_to(previous, signum, frame)  # a program's own: interrupted as Python does

    def _out_now(self, first: int) -> None:
        """A second Ctrl-C while stopping: out now, without waiting for the checkpoint."""
        log.warning(
            "SIGINT %s while stopping: stopping now, without waiting for the "
            "checkpoint (a save cut short stays marked %s)",
            "again" if first == signal.SIGINT else f"after {_name(first)}",
            INCOMPLETE_MARKER,
        )
        self._active = False
        self._uninstall(set())
        if first != signal.SIGINT:  # as at the train's end: a later SIGTERM is ignored
            SIGTERM_POLICY.note_fired()  # (after a Ctrl-C stop, none was marked)
        raise KeyboardInterrupt

    def _to_newer(self, signum: int, frame: types.FrameType | None) -> bool:
        """A signal to ours, kept past its training's end: to a newer callback that takes it.

        One whose training runs in a thread has no handler of its own; without
        this, ours would ignore the signal as a repeat. True if passed on.
        """
        with _ACTIVE_LOCK:
            active = next((each for each in _ACTIVE if signum in each.signals), None)
        if active is None or active is self:
            return False
        active._on_signal(signum, frame)  # noqa: SLF001 - the same class
        return True

    def _stop_cooperating(self) -> None:
        remove, self._remove_cooperation = self._remove_cooperation, None
        if remove is not None:
            remove()

    def _cooperate_while_installed(self) -> None:
        """End the cooperation with the policy once our SIGTERM handler is given back, not before.

        A handler left in place (stale, or kept on the way out) that stopped
        cooperating would make the watchdog's interrupt a plain SIGTERM.
        """
        if signal.SIGTERM not in self._previous:
            self._stop_cooperating()

    @outside_tracers_lock
    def _on_signal(self, signum: int, _frame: types.FrameType | None) -> None:
        if os.getpid() != self._pid:
            self._as_before_in_a_child(signum, _frame)
            return
        # Before any routing, a stale handler's included: the watchdog's interrupt is not a
        # preemption, and is never swallowed nor passed on as a plain SIGTERM.
        if signum == signal.SIGTERM:
            taken, cause = self._interrupt_taken()
            if cause is not None:
                raise cause
            if taken:
                return
        if signum in self._stale:
            self._pass_on_stale(signum, _frame)
            return
        if not self._active and signum in self._previous and self._to_newer(signum, _frame):
            return
        name = _name(signum)
        if self._signalled is not None:
            if signum == signal.SIGINT:
                self._out_now(self._signalled)
            log.warning("%s again while stopping: ignored, so that the save completes", name)
            return
        self._signalled = signum
        if self._requested.is_set():
            log.warning("%s while already stopping: the save goes on", name)
            return
        self._requested.set()
        who = (
            " (PreemptionCallback handles it; transformers' JIT checkpoint is set aside)"
            if self._jit_set_aside and signum == signal.SIGTERM
            else ""
        )
        log.warning(
            "%s%s: finishing the step in flight, then saving a checkpoint and stopping", name, who
        )

    def _on_request(self, error: BaseException) -> None:
        with self._lock:
            if self._requested.is_set():
                return
            self._error = error
            self._requested.set()
        log.warning("stop requested (%s): stopping at the end of this step", type(error).__name__)

    def _agree(self, args: TrainingArguments) -> bool:
        """Whether any rank wants to stop: one all-reduce (MAX) of one integer per call."""
        wanted = self._requested.is_set()
        import torch  # noqa: PLC0415 - transformers already imported it
        import torch.distributed as dist  # noqa: PLC0415

        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
            return wanted
        flag = torch.tensor([int(wanted)], dtype=torch.int32, device=args.device)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        return bool(flag.item())

    def _stop(self, step: int, what: str) -> None:
        self._stopping = True
        self._stopped_at = step
        log.warning("stop at step %d: %s", step, what)

    def _mark_incomplete(self, args: TrainingArguments, step: int) -> None:
        """Put the sentinel in the folder Trainer is about to save to, on the saving process.

        Until `on_save` removes it, the folder counts as incomplete, so a save
        cut short (a second Ctrl-C, the platform's SIGKILL) is never resumed from.
        """
        if not getattr(args, "should_save", True):
            return
        marker = Path(args.output_dir or ".") / f"checkpoint-{step}" / INCOMPLETE_MARKER
        try:
            if os.path.lexists(marker):
                return  # someone else's (a JIT save in progress): not ours to remove
            marker.parent.mkdir(parents=True, exist_ok=True)
            # A new file, never written through a symlink put there meanwhile.
            write_new_file(marker, f"verirl: checkpoint of step {step} being saved\n")
        except OSError as exc:
            log.warning(
                "cannot mark %s as being saved (%s): going on", printable(marker.parent), exc
            )
            return
        self._marker = marker

    def _unmark(self) -> None:
        marker, self._marker = self._marker, None
        if marker is not None:
            with contextlib.suppress(FileNotFoundError):
                marker.unlink()


def _report(output_dir: str | None, step: int) -> None:
    """Log where the checkpoint of ``step`` is, and whether it is complete."""
    folder = os.path.join(output_dir or ".", f"checkpoint-{step}")  # noqa: PTH118
    try:
        state, why = read_trainer_state(folder)
    except CheckpointSourceError as exc:  # there, but unreadable: said, never raised on the way out
        state, why = None, str(exc)
    if state is None:
        log.error(
            "training stopped at step %d, but %s is not complete: %s", step, printable(folder), why
        )
    else:
        log.warning("training stopped at step %d; checkpoint: %s", step, printable(folder))

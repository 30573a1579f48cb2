"""`PreemptionCallback`: on SIGTERM, finish the step, save a checkpoint, stop, exit 143.

transformers' Trainer ignores SIGTERM: a preempted job dies where it stands
and loses every step since its last save (up to ``save_steps - 1``). With
``callbacks=[PreemptionCallback()]`` the step in flight finishes, Trainer
writes a complete checkpoint at that step and stops, and the process exits
with 143 so the orchestrator sees a preemption and retries; the retry
(``verirl launch --resume auto``) resumes at that very step.

This module imports transformers (the callback subclasses its
``TrainerCallback``), so it is not re-exported from `verirl`, whose import
stays free of it: ``from verirl.preemption import PreemptionCallback``.

Rules, on top of the one SIGTERM policy (`verirl._signals`):

- The handler is installed at ``on_train_begin`` over the default
  disposition or over verirl's own policy handler (a `TrainingRuntime` or
  `VLLMServer` started earlier), never over a handler the program set, nor
  ``SIG_IGN``; it is put back at ``on_train_end``. In a thread other than the
  main one no handler can be installed: only stop requests work there.
- A stop request (`verirl._stop.STOP_REQUESTS`, e.g. the vLLM server
  exiting) stops training the same way; the request's error is raised after
  the save instead of the exit.
- Every rank stops at the same step: the flag is agreed across ranks (an
  all-reduce of one integer) at each step end, or ranks would deadlock.
- A second SIGTERM while stopping is ignored, so the save completes.
"""

from __future__ import annotations

import logging
import os
import signal
import threading
import types
from collections.abc import Callable
from typing import Any

from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments

from verirl._checkpoint import read_trainer_state
from verirl._signals import SIGTERM_POLICY
from verirl._stop import STOP_REQUESTS
from verirl._validate import check_int

__all__ = ["PREEMPTION_EXIT_CODE", "PreemptionCallback"]

log = logging.getLogger(__name__)

PREEMPTION_EXIT_CODE = 143
"""128 + SIGTERM: what orchestrators read as "terminated", so they retry rather than finish."""

_Handler = Callable[[int, types.FrameType | None], Any] | int | signal.Handlers | None

_ACTIVE_LOCK = threading.Lock()
_ACTIVE: list[PreemptionCallback] = []  # at most one: the callback now in charge


class PreemptionCallback(TrainerCallback):  # type: ignore[misc]  # transformers is untyped here
    """Save a checkpoint at the step where SIGTERM (or a stop request) came, then exit.

    ``exit_code`` (default 143) is the status the process exits with after a
    SIGTERM stop; ``None`` returns from ``trainer.train()`` instead (check
    `stopped_at`). Only one callback acts at a time: a newer one, from a
    second ``train()`` or a second trainer, takes over from the older.
    """

    def __init__(self, *, exit_code: int | None = PREEMPTION_EXIT_CODE) -> None:
        if exit_code is not None:
            check_int("exit_code", exit_code, 1, 255)
        self._exit_code = exit_code
        self._lock = threading.Lock()
        self._requested = threading.Event()
        self._error: BaseException | None = None
        self._signalled = False
        self._stopping = False
        self._stopped_at: int | None = None
        self._active = False
        self._previous: _Handler = None
        self._installed = False
        self._remove_listener: Callable[[], None] | None = None

    def __repr__(self) -> str:
        return f"PreemptionCallback(exit_code={self._exit_code!r})"

    @property
    def exit_code(self) -> int | None:
        """The status the process exits with after a SIGTERM stop (``None``: no exit)."""
        return self._exit_code

    @property
    def stop_requested(self) -> bool:
        """Whether SIGTERM or a stop request came during this ``train()`` (on this rank)."""
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
        """Take charge: listen for stop requests and install the SIGTERM handler."""
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

    def on_save(
        self, args: TrainingArguments, state: TrainerState, control: TrainerControl, **_: object
    ) -> None:
        """A stop that came during a regular save: the checkpoint just written is the one."""
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
        """Give SIGTERM back; after a stop, raise the stop request's error or exit 143."""
        if not self._active:
            return
        stopped = self._stopping or self._agree(args)  # a SIGTERM after the last step's end
        signalled, error = self._signalled, self._error
        exits = stopped and error is None and self._exit_code is not None
        # Exiting after a SIGTERM: ours stays (it ignores any further SIGTERM, e.g. torchrun's
        # to the other ranks) until the process is gone, rather than the default's sudden death.
        self._deactivate(keep_handler=exits and self._previous == signal.SIG_DFL)
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
        if signalled:
            SIGTERM_POLICY.note_fired()  # a second SIGTERM during verirl's teardown is ignored
        log.warning("exiting with %d so that the orchestrator retries the job", self._exit_code)
        raise SystemExit(self._exit_code)

    def close(self) -> None:
        """Stop listening and put the previous SIGTERM handler back; idempotent.

        Called by ``on_train_end``; call it yourself only if ``train()`` raised
        and the process goes on (otherwise SIGTERM would wait for a step end
        that never comes).
        """
        self._deactivate(keep_handler=False)

    # -- internals

    def _deactivate(self, *, keep_handler: bool) -> None:
        self._active = False
        with _ACTIVE_LOCK:
            if self in _ACTIVE:
                _ACTIVE.remove(self)
        remove, self._remove_listener = self._remove_listener, None
        if remove is not None:
            remove()
        if keep_handler:
            self._requested.set()  # the handler now only logs and ignores
        else:
            self._uninstall()

    def _reset(self) -> None:
        self._requested.clear()
        self._error = None
        self._signalled = False
        self._stopping = False
        self._stopped_at = None

    def _install(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            log.warning(
                "training runs outside the main thread: SIGTERM is left as it is (Python runs "
                "signal handlers in the main thread only); verirl's stop requests still apply"
            )
            return
        current = signal.getsignal(signal.SIGTERM)
        if current not in (signal.SIG_DFL, SIGTERM_POLICY.handle):
            log.warning(
                "SIGTERM already has a handler the program set (%r): left in place, so a SIGTERM "
                "will not save a checkpoint; verirl's stop requests still apply",
                current,
            )
            return
        try:
            signal.signal(signal.SIGTERM, self._on_sigterm)
        except ValueError:  # not the main interpreter
            log.warning("cannot install a SIGTERM handler here; SIGTERM is left as it is")
            return
        self._previous, self._installed = current, True
        log.debug("SIGTERM now saves a checkpoint at the next step end (was %r)", current)

    def _uninstall(self) -> None:
        if not self._installed or threading.current_thread() is not threading.main_thread():
            return
        self._installed = False
        if signal.getsignal(signal.SIGTERM) == self._on_sigterm:
            signal.signal(signal.SIGTERM, self._previous)

    def _on_sigterm(self, signum: int, _frame: types.FrameType | None) -> None:
        if self._requested.is_set():
            log.warning(
                "signal %d again while stopping: ignored, so that the save completes", signum
            )
            return
        self._signalled = True
        self._requested.set()
        log.warning(
            "signal %d: finishing the step in flight, then saving a checkpoint and stopping", signum
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


def _report(output_dir: str | None, step: int) -> None:
    """Log where the checkpoint of ``step`` is, and whether it is complete."""
    folder = os.path.join(output_dir or ".", f"checkpoint-{step}")  # noqa: PTH118
    state, why = read_trainer_state(folder)
    if state is None:
        log.error("training stopped at step %d, but %s is not complete: %s", step, folder, why)
    else:
        log.warning("training stopped at step %d; checkpoint: %s", step, folder)

"""Two handlers for one signal: no mechanism ever swallows another's SIGTERM (issue 26, class 11c).

verirl has several mechanisms for SIGTERM: the one policy (`verirl._signals`),
`PreemptionCallback`'s handler (which takes SIGTERM over while training runs
and waits for a step end), and the watchdog's interrupt (a SIGTERM to the main
thread once ``vllm_failure_grace`` is spent). Whoever owns SIGTERM when the
watchdog fires, the main thread must unwind with the server's error within the
grace plus a bound: also when training never reaches a step end, and also while
a preemption's save is already under way. Real signals, a real watchdog thread;
the dead server is a stand-in whose process "exited" (what the watchdog polls).
"""

from __future__ import annotations

import signal
import threading
import time

import attrs
import pytest
from transformers import TrainerControl, TrainerState, TrainingArguments

from verirl._signals import SIGTERM_POLICY
from verirl._stop import STOP_REQUESTS
from verirl.errors import VLLMServerExited
from verirl.preemption import PreemptionCallback
from verirl.server.watchdog import ServerWatchdog, interrupt_main

GRACE = 0.3
BOUND = 5.0  # the interrupt itself takes milliseconds; room for a loaded machine
STUCK = 30.0  # how long the "training loop" would block if nothing unwound it


@attrs.define
class _DeadServer:
    """What the watchdog reads of a server whose process exited (killed by the OOM killer)."""

    running: bool = False
    returncode: int = -9
    pid: int = 4242
    log_path: str | None = None

    def log_tail(self) -> str:
        return "CUDA out of memory\n"


@pytest.fixture
def default_sigint():
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.fixture
def trainer_objects(tmp_path, default_sigterm, default_sigint):
    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none")
    yield args, TrainerState(), TrainerControl()
    STOP_REQUESTS.reset()


def _watchdog() -> ServerWatchdog:
    return ServerWatchdog(
        _DeadServer(),
        None,
        save_grace=GRACE,
        interrupt=lambda error: interrupt_main(error, held=True),
    )


def _stuck_until_interrupted(watchdog: ServerWatchdog) -> float:
    """Block the main thread as a loop stuck in a collective does; return when it was unwound."""
    started = time.monotonic()  # before the watchdog can act: it starts below
    watchdog.start()
    try:
        with pytest.raises(VLLMServerExited) as caught:
            threading.Event().wait(STUCK)
    finally:
        watchdog.stop()
        watchdog.join(5)
    assert caught.value.returncode == -9
    return time.monotonic() - started


@pytest.mark.parametrize("preempted_first", [False, True], ids=["no-signal", "preempted-first"])
def test_the_watchdogs_interrupt_is_never_swallowed_by_the_callback(
    trainer_objects, preempted_first
):
    """The callback owns SIGTERM and never reaches a step end: the error still unwinds."""
    args, state, control = trainer_objects
    with SIGTERM_POLICY.held():  # as TrainingRuntime holds it
        callback = PreemptionCallback()
        callback.on_train_begin(args, state, control)
        try:
            if preempted_first:  # a preemption whose save never ends (stuck in a collective)
                signal.raise_signal(signal.SIGTERM)
                assert callback.stop_requested
            took = _stuck_until_interrupted(_watchdog())
        finally:
            callback.close()
        assert took < GRACE + BOUND, took
        # The callback gave SIGTERM back; the policy counts the interrupt as its one firing.
        assert signal.getsignal(signal.SIGTERM) == SIGTERM_POLICY.handle
        assert SIGTERM_POLICY.fired
        signal.raise_signal(signal.SIGTERM)  # during the teardown: ignored
        assert not STOP_REQUESTS.listening
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


def test_a_callback_that_left_sigterm_alone_still_lets_the_policy_interrupt(trainer_objects):
    args, state, control = trainer_objects
    with SIGTERM_POLICY.held():
        callback = PreemptionCallback(signals=(signal.SIGINT,))
        callback.on_train_begin(args, state, control)
        try:
            took = _stuck_until_interrupted(_watchdog())
        finally:
            callback.close()
        assert took < GRACE + BOUND, took


def test_an_interrupt_taken_back_is_ignored_by_the_callback_and_training_goes_on(trainer_objects):
    """The runtime stopping normally withdraws a late interrupt: no error, no stop."""
    args, state, control = trainer_objects
    with SIGTERM_POLICY.held():
        callback = PreemptionCallback()
        callback.on_train_begin(args, state, control)
        try:
            error = VLLMServerExited(-9, "")
            blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
            try:
                assert SIGTERM_POLICY.interrupt(error)  # sent, held pending by the mask
                assert SIGTERM_POLICY.withdraw(error)
            finally:
                signal.pthread_sigmask(signal.SIG_SETMASK, blocked)  # delivered here: ignored
            assert not callback.stop_requested
            assert not SIGTERM_POLICY.fired
        finally:
            callback.close()

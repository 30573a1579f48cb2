"""`PreemptionCallback` in-process, driven through Trainer's own event objects.

Real `TrainingArguments`, `TrainerState` and `TrainerControl`, the events
called in Trainer's order; SIGTERM is a real signal to this process.
"""

from __future__ import annotations

import os
import signal
import threading

import pytest
from transformers import TrainerControl, TrainerState, TrainingArguments

from verirl._signals import SIGTERM_POLICY
from verirl._stop import STOP_REQUESTS
from verirl.errors import ConfigError, VLLMServerExited
from verirl.preemption import PreemptionCallback


@pytest.fixture
def trainer_objects(tmp_path, default_sigterm):
    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none")
    return args, TrainerState(), TrainerControl()


def _step(callback, args, state, control):
    state.global_step += 1
    callback.on_step_end(args, state, control)


def test_sigterm_finishes_the_step_saves_stops_and_exits_143(trainer_objects):
    args, state, control = trainer_objects
    callback = PreemptionCallback()
    callback.on_train_begin(args, state, control)
    _step(callback, args, state, control)
    assert not control.should_training_stop
    os.kill(os.getpid(), signal.SIGTERM)  # no exit here: only a flag
    assert callback.stop_requested
    _step(callback, args, state, control)
    assert (control.should_save, control.should_training_stop) == (True, True)
    assert callback.stopped_at == 2
    with pytest.raises(SystemExit) as info:
        callback.on_train_end(args, state, control)
    assert info.value.code == 143
    assert not STOP_REQUESTS.listening


def test_a_handler_the_program_set_is_kept(trainer_objects):
    args, state, control = trainer_objects
    seen: list[int] = []
    signal.signal(signal.SIGTERM, lambda signum, _frame: seen.append(signum))
    callback = PreemptionCallback()
    callback.on_train_begin(args, state, control)
    os.kill(os.getpid(), signal.SIGTERM)
    assert seen == [signal.SIGTERM]
    assert not callback.stop_requested
    _step(callback, args, state, control)
    assert not control.should_training_stop
    callback.on_train_end(args, state, control)  # nothing to stop for: returns


def test_it_takes_over_from_the_runtime_policy_and_gives_it_back_fired(trainer_objects):
    args, state, control = trainer_objects
    with SIGTERM_POLICY.held():
        assert signal.getsignal(signal.SIGTERM) == SIGTERM_POLICY.handle
        callback = PreemptionCallback()
        callback.on_train_begin(args, state, control)
        os.kill(os.getpid(), signal.SIGTERM)  # no SystemExit mid-step
        _step(callback, args, state, control)
        with pytest.raises(SystemExit):
            callback.on_train_end(args, state, control)
        assert signal.getsignal(signal.SIGTERM) == SIGTERM_POLICY.handle
        os.kill(os.getpid(), signal.SIGTERM)  # during the teardown: ignored, fire once
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


def test_a_stop_request_from_another_thread_stops_and_its_error_is_raised(trainer_objects):
    args, state, control = trainer_objects
    callback = PreemptionCallback(exit_code=None)
    callback.on_train_begin(args, state, control)
    error = VLLMServerExited(-9, "killed")
    asked = threading.Thread(target=lambda: STOP_REQUESTS.request(error))
    asked.start()
    asked.join(10)
    _step(callback, args, state, control)
    assert control.should_training_stop
    with pytest.raises(VLLMServerExited) as info:
        callback.on_train_end(args, state, control)
    assert info.value is error
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


def test_outside_the_main_thread_sigterm_is_left_alone_but_requests_work(trainer_objects):
    args, state, control = trainer_objects
    callback = PreemptionCallback(exit_code=None)
    begun = threading.Thread(target=callback.on_train_begin, args=(args, state, control))
    begun.start()
    begun.join(10)
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    assert STOP_REQUESTS.request(VLLMServerExited(1, ""))
    callback.close()
    assert not STOP_REQUESTS.listening


def test_a_newer_callback_takes_over_and_the_older_does_nothing(trainer_objects):
    args, state, control = trainer_objects
    older, newer = PreemptionCallback(), PreemptionCallback(exit_code=None)
    older.on_train_begin(args, state, control)
    newer.on_train_begin(args, state, control)
    os.kill(os.getpid(), signal.SIGTERM)
    assert newer.stop_requested
    assert not older.stop_requested
    older.on_train_end(args, state, control)  # inactive: neither raises nor restores
    _step(newer, args, state, control)
    newer.on_train_end(args, state, control)
    assert newer.stopped_at == 1
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


@pytest.mark.parametrize("code", [0, 256, "143", True, 1.5])
def test_a_bad_exit_code_is_a_config_error_naming_it(code):
    with pytest.raises(ConfigError, match=r"^exit_code="):
        PreemptionCallback(exit_code=code)

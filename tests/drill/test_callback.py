"""`PreemptionCallback` in-process, driven through Trainer's own event objects.

Real `TrainingArguments`, `TrainerState` and `TrainerControl`, the events
called in Trainer's order; SIGTERM and SIGINT are real signals to this process.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from transformers import TrainerControl, TrainerState, TrainingArguments

from verirl._signals import SIGTERM_POLICY
from verirl._stop import STOP_REQUESTS
from verirl.checkpoints import INCOMPLETE_MARKER, LocalCheckpointSource
from verirl.errors import ConfigError, VLLMServerExited
from verirl.preemption import PreemptionCallback


@pytest.fixture
def default_sigint():
    """Python's own SIGINT handler (KeyboardInterrupt), put back afterwards whatever happened."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


@pytest.fixture
def trainer_objects(tmp_path, default_sigterm, default_sigint):
    args = TrainingArguments(output_dir=str(tmp_path), use_cpu=True, report_to="none")
    return args, TrainerState(), TrainerControl()


def _handlers():
    return signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT)


_DEFAULTS = (signal.SIG_DFL, signal.default_int_handler)


def _save(callback, args, state, control, *, complete=True):
    """What Trainer does after a step end that asked for a save: write the folder, on_save."""
    folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "trainer_state.json").write_text(f'{{"global_step": {state.global_step}}}')
    if complete:
        callback.on_save(args, state, control)


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


def _in_thread(function, *args):
    thread = threading.Thread(target=function, args=args)
    thread.start()
    thread.join(10)
    assert not thread.is_alive()


def test_a_newer_callback_in_a_thread_gets_the_signal_the_older_one_still_receives(
    trainer_objects,
):
    args, state, control = trainer_objects
    older, newer = PreemptionCallback(), PreemptionCallback(exit_code=None)
    older.on_train_begin(args, state, control)  # main thread: its handlers are set
    _in_thread(newer.on_train_begin, args, state, control)  # takes over; can set none
    os.kill(os.getpid(), signal.SIGTERM)
    assert newer.stop_requested  # not swallowed by the older one's handler
    assert not older.stop_requested
    _in_thread(_step, newer, args, state, control)
    assert control.should_save
    _in_thread(newer.on_train_end, args, state, control)
    assert newer.stopped_at == 1


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_after_train_ended_in_a_thread_a_signal_ends_the_process_as_without_the_callback(
    tmp_path, sig
):
    # the handlers could not be given back from that thread: the signal must not be swallowed
    script = tmp_path / "ended.py"
    script.write_text(
        "import os, signal, threading, types\n"
        "from transformers import TrainerControl, TrainerState, TrainingArguments\n"
        "from verirl.preemption import PreemptionCallback\n"
        f"args = TrainingArguments(output_dir={str(tmp_path)!r}, use_cpu=True, report_to='none')\n"
        "state, control = TrainerState(), TrainerControl()\n"
        "callback = PreemptionCallback()\n"
        "callback.on_train_begin(args, state, control)\n"
        "ended = threading.Thread(target=callback.on_train_end, args=(args, state, control))\n"
        "ended.start(); ended.join()\n"
        f"os.kill(os.getpid(), {int(sig)})\n"
        "threading.Event().wait(30)\n"
        "print('still running after the signal')\n"
    )
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=120, check=False
    )
    # SIGTERM's default action; SIGINT's KeyboardInterrupt, which Python ends with by SIGINT
    assert done.returncode == -sig, done.stdout + done.stderr


@pytest.mark.parametrize("code", [0, 256, "143", True, 1.5])
def test_a_bad_exit_code_is_a_config_error_naming_it(code):
    with pytest.raises(ConfigError, match=r"^exit_code="):
        PreemptionCallback(exit_code=code)


def test_sigint_finishes_the_step_saves_stops_and_raises_keyboard_interrupt(trainer_objects):
    """Modal's preemption: SIGINT. The KeyboardInterrupt comes after the save, not mid-step."""
    args, state, control = trainer_objects
    callback = PreemptionCallback()
    callback.on_train_begin(args, state, control)
    assert _handlers() == (callback._on_signal, callback._on_signal)
    _step(callback, args, state, control)
    os.kill(os.getpid(), signal.SIGINT)  # no KeyboardInterrupt here: only a flag
    assert callback.stop_requested
    _step(callback, args, state, control)
    assert (control.should_save, control.should_training_stop) == (True, True)
    assert callback.stopped_at == 2
    _save(callback, args, state, control)
    with pytest.raises(KeyboardInterrupt):
        callback.on_train_end(args, state, control)
    assert LocalCheckpointSource(args.output_dir).latest().step == 2
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler  # Ctrl-C: out now
    assert not STOP_REQUESTS.listening


def test_the_checkpoint_being_saved_counts_as_incomplete_until_on_save(trainer_objects):
    args, state, control = trainer_objects
    callback = PreemptionCallback()
    callback.on_train_begin(args, state, control)
    os.kill(os.getpid(), signal.SIGINT)
    _step(callback, args, state, control)
    marker = Path(args.output_dir) / "checkpoint-1" / INCOMPLETE_MARKER
    assert marker.exists()
    _save(callback, args, state, control, complete=False)  # cut short before on_save
    assert LocalCheckpointSource(args.output_dir).latest() is None  # the state parses: marker
    callback.on_save(args, state, control)
    assert not marker.exists()
    assert LocalCheckpointSource(args.output_dir).latest().step == 1
    with pytest.raises(KeyboardInterrupt):
        callback.on_train_end(args, state, control)


def test_a_marker_someone_else_wrote_is_left_to_them(trainer_objects):
    args, state, control = trainer_objects
    theirs = Path(args.output_dir) / "checkpoint-1" / INCOMPLETE_MARKER
    theirs.parent.mkdir(parents=True)
    theirs.write_text("a JIT save in progress")
    callback = PreemptionCallback(exit_code=None)
    callback.on_train_begin(args, state, control)
    os.kill(os.getpid(), signal.SIGTERM)
    _step(callback, args, state, control)
    _save(callback, args, state, control)
    callback.on_train_end(args, state, control)
    assert theirs.exists()


def test_a_second_sigint_while_stopping_raises_at_once_and_gives_the_handlers_back(
    trainer_objects,
):
    args, state, control = trainer_objects
    callback = PreemptionCallback()
    callback.on_train_begin(args, state, control)
    os.kill(os.getpid(), signal.SIGINT)
    _step(callback, args, state, control)  # the stop: the save is about to begin
    with pytest.raises(KeyboardInterrupt):
        os.kill(os.getpid(), signal.SIGINT)  # a person pressing Ctrl-C twice wants out
    assert _handlers() == _DEFAULTS
    _save(callback, args, state, control, complete=False)  # the half-written folder
    assert (Path(args.output_dir) / "checkpoint-1" / INCOMPLETE_MARKER).exists()
    assert LocalCheckpointSource(args.output_dir).latest() is None


def test_a_sigterm_after_the_out_now_ctrl_c_is_ignored_as_after_any_stop(trainer_objects, caplog):
    """SIGTERM, then Ctrl-C while saving: out now; a later SIGTERM (torchrun's) fires nothing.

    The out-now branch gave the runtime's policy back unfired, so that SIGTERM
    raised SystemExit(143) in the teardown (review of 07089a3, finding 5).
    """
    args, state, control = trainer_objects
    with SIGTERM_POLICY.held():
        callback = PreemptionCallback()
        callback.on_train_begin(args, state, control)
        os.kill(os.getpid(), signal.SIGTERM)
        _step(callback, args, state, control)  # the stop: the save is about to begin
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
        assert signal.getsignal(signal.SIGTERM) == SIGTERM_POLICY.handle
        os.kill(os.getpid(), signal.SIGTERM)  # during the teardown: ignored, fire once
    assert "SIGINT after SIGTERM while stopping: stopping now" in caplog.text
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


@pytest.mark.parametrize(("first", "second"), [(signal.SIGINT, signal.SIGTERM),
                                               (signal.SIGTERM, signal.SIGTERM)])  # fmt: skip
def test_a_second_sigterm_while_stopping_is_ignored(trainer_objects, caplog, first, second):
    args, state, control = trainer_objects
    callback = PreemptionCallback(exit_code=None)
    callback.on_train_begin(args, state, control)
    os.kill(os.getpid(), first)
    _step(callback, args, state, control)
    os.kill(os.getpid(), second)  # neither raises nor kills
    assert "again while stopping: ignored" in caplog.text
    _save(callback, args, state, control)
    callback.on_train_end(args, state, control)
    assert callback.stopped_at == 1
    assert _handlers() == _DEFAULTS


def test_signals_chooses_which_signals_mean_preemption(trainer_objects):
    args, state, control = trainer_objects
    callback = PreemptionCallback(signals=[signal.SIGTERM])
    assert callback.signals == (signal.SIGTERM,)
    callback.on_train_begin(args, state, control)
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
    with pytest.raises(KeyboardInterrupt):
        os.kill(os.getpid(), signal.SIGINT)  # Python's own: at once
    assert not callback.stop_requested
    callback.close()
    assert _handlers() == _DEFAULTS


def test_another_signal_exits_with_128_plus_its_number(trainer_objects):
    """SLURM's --signal=USR1@60, say: the exit code tells which signal it was."""
    args, state, control = trainer_objects
    previous = signal.signal(signal.SIGUSR1, signal.SIG_DFL)
    try:
        callback = PreemptionCallback(signals=(signal.SIGUSR1,))
        callback.on_train_begin(args, state, control)
        os.kill(os.getpid(), signal.SIGUSR1)
        _step(callback, args, state, control)
        _save(callback, args, state, control)
        with pytest.raises(SystemExit) as info:
            callback.on_train_end(args, state, control)
        assert info.value.code == 128 + signal.SIGUSR1
        assert signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL
    finally:
        signal.signal(signal.SIGUSR1, previous)


@pytest.mark.parametrize(("exit_code", "raised"), [(75, SystemExit), (None, None)])
def test_an_explicit_exit_code_applies_to_sigint_too(trainer_objects, exit_code, raised):
    args, state, control = trainer_objects
    callback = PreemptionCallback(exit_code=exit_code)
    callback.on_train_begin(args, state, control)
    os.kill(os.getpid(), signal.SIGINT)
    _step(callback, args, state, control)
    _save(callback, args, state, control)
    if raised is None:
        callback.on_train_end(args, state, control)
    else:
        with pytest.raises(raised) as info:
            callback.on_train_end(args, state, control)
        assert info.value.code == exit_code
    assert callback.stopped_at == 1
    if raised is None:
        assert _handlers() == _DEFAULTS
    else:  # on the way out, a further SIGTERM (torchrun's, say) is ignored; Ctrl-C is not
        assert _handlers() == (callback._on_signal, signal.default_int_handler)


def test_a_sigint_handler_the_program_set_is_kept(trainer_objects, caplog):
    args, state, control = trainer_objects
    seen: list[int] = []
    signal.signal(signal.SIGINT, lambda signum, _frame: seen.append(signum))
    callback = PreemptionCallback()
    callback.on_train_begin(args, state, control)
    assert signal.getsignal(signal.SIGTERM) == callback._on_signal
    os.kill(os.getpid(), signal.SIGINT)
    assert seen == [signal.SIGINT]
    assert not callback.stop_requested
    assert "SIGINT already has a handler the program set" in caplog.text
    callback.close()
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


@pytest.mark.parametrize(
    "signals",
    ["SIGTERM", [signal.SIGKILL], [signal.SIGSTOP], [0], [True], [15.0], [10**6], 15, None],
)
def test_bad_signals_are_a_config_error_naming_them(signals):
    with pytest.raises(ConfigError, match=r"^signals="):
        PreemptionCallback(signals=signals)


def test_the_repr_names_the_signals_and_the_exit():
    assert repr(PreemptionCallback()) == (
        "PreemptionCallback(signals=(SIGTERM, SIGINT), exit_code=BY_SIGNAL)"
    )
    assert PreemptionCallback().exit_code == 143
    assert PreemptionCallback(exit_code=None).exit_code is None


_FIRING = (
    "import os, signal, sys\n"
    "from transformers import TrainerControl, TrainerState, TrainingArguments\n"
    "import verirl.preemption as preemption\n"
    "from verirl._signals import SIGTERM_POLICY\n"
    "from verirl._stop import STOP_REQUESTS\n"
    "from verirl.errors import VLLMServerExited\n"
    "from verirl.preemption import PreemptionCallback\n"
    "args = TrainingArguments(output_dir=sys.argv[1], use_cpu=True, report_to='none')\n"
    "state, control = TrainerState(), TrainerControl()\n"
    "error = VLLMServerExited(-9, 'tail')\n"
    "signal.signal(signal.SIGTERM, signal.SIG_DFL)\n"
)


def _run_script(tmp_path, body):
    """Run ``body`` after `_FIRING` apart, so that a deadlock fails the test, not hangs it."""
    script = tmp_path / "firing.py"
    script.write_text(_FIRING + body)
    try:
        return subprocess.run(
            [sys.executable, str(script), str(tmp_path)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
    except subprocess.TimeoutExpired:
        pytest.fail("deadlock: a signal handler waited for a lock the main thread holds")


def test_the_watchdogs_interrupt_while_the_main_thread_holds_the_callbacks_lock(tmp_path):
    # The interrupt (a SIGTERM to the main thread) comes while close() is inside the lock that
    # its handler takes too: it must raise the server's error, every handler given back.
    done = _run_script(
        tmp_path,
        "class Firing:\n"
        "    def __init__(self, lock):\n"
        "        self.lock, self.armed = lock, True\n"
        "    def __enter__(self):\n"
        "        self.lock.__enter__()\n"
        "        if self.armed:\n"
        "            self.armed = False\n"
        "            try:\n"
        "                assert SIGTERM_POLICY.interrupt(error)  # handled here, the lock held\n"
        "            except BaseException:\n"
        "                self.lock.__exit__(None, None, None)\n"
        "                raise\n"
        "        return self\n"
        "    def __exit__(self, *exc):\n"
        "        return self.lock.__exit__(*exc)\n"
        "with SIGTERM_POLICY.held():\n"
        "    callback = PreemptionCallback()\n"
        "    callback.on_train_begin(args, state, control)\n"
        "    preemption._ACTIVE_LOCK = Firing(preemption._ACTIVE_LOCK)\n"
        "    try:\n"
        "        callback.close()\n"
        "    except VLLMServerExited:\n"
        "        print('raised')\n"
        "    print(signal.getsignal(signal.SIGTERM) == SIGTERM_POLICY.handle,\n"
        "          signal.getsignal(signal.SIGINT) is signal.default_int_handler,\n"
        "          preemption._ACTIVE, STOP_REQUESTS.listening)\n",
    )
    assert (done.returncode, done.stdout) == (0, "raised\nTrue True [] False\n"), done.stderr


def test_a_signal_while_a_stale_handler_is_given_back_goes_where_it_would_have(tmp_path):
    # A callback closed in a thread left its SIGTERM handler (over the runtime's policy); the
    # next callback gives it back from the main thread, and a SIGTERM comes in the middle of
    # that: it must reach the policy (SystemExit 143), not the default (the process killed).
    done = _run_script(
        tmp_path,
        "import threading\n"
        "class Firing(dict):\n"
        "    armed = True\n"
        "    def _fire(self):\n"
        "        if Firing.armed:\n"
        "            Firing.armed = False\n"
        "            os.kill(os.getpid(), signal.SIGTERM)  # handled here, mid-give-back\n"
        "    def get(self, *a):\n"
        "        value = super().get(*a)\n"
        "        self._fire()\n"
        "        return value\n"
        "    def pop(self, *a):\n"
        "        value = super().pop(*a)\n"
        "        self._fire()\n"
        "        return value\n"
        "with SIGTERM_POLICY.held():\n"
        "    older = PreemptionCallback(signals=[signal.SIGTERM])\n"
        "    older.on_train_begin(args, state, control)\n"
        "    ended = threading.Thread(target=older.close)\n"
        "    ended.start(); ended.join()\n"
        "    older._previous = Firing(older._previous)\n"
        "    newer = PreemptionCallback(signals=[signal.SIGINT])\n"
        "    try:\n"
        "        newer.on_train_begin(args, state, control)\n"
        "    except SystemExit as exc:\n"
        "        print('exit', exc.code)\n"
        "    print(signal.getsignal(signal.SIGTERM) == SIGTERM_POLICY.handle)\n",
    )
    assert (done.returncode, done.stdout) == (0, "exit 143\nTrue\n"), done.stderr


@pytest.mark.parametrize("left_by", ["takeover", "ended"])
def test_a_handler_left_by_a_takeover_in_a_thread_still_takes_the_watchdogs_interrupt(
    tmp_path, left_by
):
    # A callback closed in a thread (a newer one took over there, or its train() ended there)
    # leaves its handlers in place, stale. The watchdog's interrupt, sent when training did not
    # stop by itself, must still unwind the main thread with the server's error: not be taken
    # for a preemption (the loop never stops), nor passed on to the policy as a plain SIGTERM.
    leave = {
        "takeover": "newer = PreemptionCallback(exit_code=None)\n"
        "    ended = threading.Thread(target=newer.on_train_begin, args=trainer)\n",
        "ended": "ended = threading.Thread(target=older.on_train_end, args=trainer)\n",
    }[left_by]
    done = _run_script(
        tmp_path,
        "import threading\n"
        "from verirl.server.watchdog import interrupt_main\n"
        "with SIGTERM_POLICY.held():\n"
        "    older = PreemptionCallback()\n"
        "    older.on_train_begin(args, state, control)\n"
        "    trainer = (args, state, control)\n"
        f"    {leave}"
        "    ended.start(); ended.join()\n"
        "    assert signal.getsignal(signal.SIGTERM) == older._on_signal  # stale, left in place\n"
        "    fire = lambda: interrupt_main(error, held=True)  # the watchdog's, after the grace\n"
        "    watchdog = threading.Thread(target=fire)\n"
        "    try:\n"
        "        watchdog.start()\n"
        "        threading.Event().wait(20)  # a loop stuck in a collective\n"
        "        print('not interrupted')\n"
        "    except VLLMServerExited as exc:\n"
        "        print('raised', exc is error)\n"
        "    except SystemExit as exc:\n"
        "        print('exit', exc.code)\n"
        "    watchdog.join()\n"
        "    print(signal.getsignal(signal.SIGTERM) == SIGTERM_POLICY.handle,\n"
        "          signal.getsignal(signal.SIGINT) is signal.default_int_handler,\n"
        "          SIGTERM_POLICY.fired, preemption._STALE)\n",
    )
    assert (done.returncode, done.stdout) == (0, "raised True\nTrue True True []\n"), done.stderr


def test_an_interrupt_taken_back_is_ignored_by_a_stale_handler_not_passed_on(trainer_objects):
    # The runtime stopping normally withdraws a late interrupt: the stale handler it reaches
    # must not pass it on to the callback in charge as a preemption.
    args, state, control = trainer_objects
    with SIGTERM_POLICY.held():
        older, newer = PreemptionCallback(), PreemptionCallback(exit_code=None)
        older.on_train_begin(args, state, control)
        _in_thread(newer.on_train_begin, args, state, control)  # older's handlers left, stale
        try:
            error = VLLMServerExited(-9, "")
            blocked = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})
            try:
                assert SIGTERM_POLICY.interrupt(error)  # the stale handler still cooperates
                assert SIGTERM_POLICY.withdraw(error)
            finally:
                signal.pthread_sigmask(signal.SIG_SETMASK, blocked)  # delivered here: ignored
            assert not newer.stop_requested
            assert not SIGTERM_POLICY.fired
            os.kill(os.getpid(), signal.SIGTERM)  # a real preemption still goes to the newer one
            assert newer.stop_requested
        finally:
            _in_thread(newer.close)
            older._give_back(set(older._stale))
        assert signal.getsignal(signal.SIGTERM) == SIGTERM_POLICY.handle
        assert older._on_signal not in SIGTERM_POLICY._cooperating


def _interrupted(error):
    """The watchdog's interrupt, then a main thread stuck as in a collective."""
    assert SIGTERM_POLICY.interrupt(error)
    threading.Event().wait(10)


def test_a_stale_handler_given_back_by_a_newer_callback_stops_cooperating(trainer_objects):
    args, state, control = trainer_objects
    with SIGTERM_POLICY.held():
        older, newer = PreemptionCallback(), PreemptionCallback(exit_code=None)
        older.on_train_begin(args, state, control)
        _in_thread(older.close)  # stale, still cooperating: its handler is still SIGTERM's
        assert older._on_signal in SIGTERM_POLICY._cooperating
        newer.on_train_begin(args, state, control)  # main thread: gives the stale ones back
        try:
            assert older._on_signal not in SIGTERM_POLICY._cooperating
            assert newer._on_signal in SIGTERM_POLICY._cooperating
            with pytest.raises(VLLMServerExited):
                _interrupted(VLLMServerExited(-9, ""))
        finally:
            newer.close()
        assert newer._on_signal not in SIGTERM_POLICY._cooperating
        assert signal.getsignal(signal.SIGTERM) == SIGTERM_POLICY.handle


def _stopped_by(signum, args, state, control):
    """A callback that stopped training on ``signum`` and ended: what on_train_end raised."""
    callback = PreemptionCallback()
    callback.on_train_begin(args, state, control)
    _step(callback, args, state, control)
    os.kill(os.getpid(), signum)
    _step(callback, args, state, control)
    _save(callback, args, state, control)
    with pytest.raises((SystemExit, KeyboardInterrupt)) as info:
        callback.on_train_end(args, state, control)
    return info.value


def test_a_ctrl_c_stop_the_program_caught_gives_sigterm_back(trainer_objects):
    """A KeyboardInterrupt out of train() is often caught (a notebook) and the process goes
    on: SIGTERM is the default again, and a second trainer's callback stops on it (review of
    b946ae2: the first one's handler stayed, and ignored every later SIGTERM)."""
    args, state, control = trainer_objects
    assert isinstance(_stopped_by(signal.SIGINT, args, state, control), KeyboardInterrupt)
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    second = PreemptionCallback()
    second.on_train_begin(args, state, control)
    assert signal.getsignal(signal.SIGTERM) == second._on_signal
    _step(second, args, state, control)
    os.kill(os.getpid(), signal.SIGTERM)
    _step(second, args, state, control)
    assert second.stopped_at == state.global_step
    with pytest.raises(SystemExit) as info:
        second.on_train_end(args, state, control)
    assert info.value.code == 143


def test_after_a_sigterm_exit_the_program_caught_the_next_holder_takes_sigterm_over(
    trainer_objects,
):
    """After a SIGTERM stop the callback's handler stays while the exit ends the process (a
    further SIGTERM is ignored); a program that caught the exit and went on is not locked out:
    a newer callback, or the policy of a later server, takes SIGTERM over (review of b946ae2)."""
    args, state, control = trainer_objects
    first = _stopped_by(signal.SIGTERM, args, state, control)
    assert isinstance(first, SystemExit)
    assert first.code == 143
    kept = signal.getsignal(signal.SIGTERM)
    assert kept != signal.SIG_DFL  # ignores a further SIGTERM while the process ends
    with SIGTERM_POLICY.held():
        assert SIGTERM_POLICY.active
        with pytest.raises(SystemExit):
            os.kill(os.getpid(), signal.SIGTERM)
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    signal.signal(signal.SIGTERM, kept)  # left in place again: now a newer callback
    second = PreemptionCallback()
    second.on_train_begin(args, state, control)
    assert signal.getsignal(signal.SIGTERM) == second._on_signal
    second.close()
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL

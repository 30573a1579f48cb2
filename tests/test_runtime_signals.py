"""TrainingRuntime follows the one SIGTERM policy: keep a program's handler, default only."""

from __future__ import annotations

import signal
import subprocess
import sys
import threading

import pytest

from _support import Recorder, master_port_beside
from fakes import FakeEnvServerProbe
from verirl import (
    DistributedEnv,
    EnvServerUnavailable,
    TrainingRuntime,
    VLLMTopology,
    find_free_port,
)
from verirl._signals import SIGTERM_POLICY, exit_on_sigterm


def runtime(**kwargs) -> TrainingRuntime:
    env: dict[str, str] = {}
    kwargs.setdefault("server_factory", Recorder())
    topology = VLLMTopology.plan(2, max_model_len=64, port=find_free_port())
    return TrainingRuntime(
        topology,
        environ=env,
        dist_env=DistributedEnv.single_node(environ=env, master_port=master_port_beside(topology)),
        **kwargs,
    )


def test_sigterm_over_the_default_unwinds_the_block_once(default_sigterm):
    factory = Recorder()
    rt = runtime(server_factory=factory)
    active: list[bool] = []

    def body() -> None:
        with rt:
            active.append(SIGTERM_POLICY.active)
            signal.raise_signal(signal.SIGTERM)

    with pytest.raises(SystemExit) as info:
        body()
    assert active == [True]
    assert info.value.code == 143
    assert factory.servers[0].stops == 1
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


def test_a_handler_of_the_program_is_kept_and_is_what_runs(default_sigterm):
    calls: list[int] = []

    def save_on_preemption(signum, _frame):
        calls.append(signum)

    signal.signal(signal.SIGTERM, save_on_preemption)
    factory = Recorder()
    with runtime(server_factory=factory):
        assert signal.getsignal(signal.SIGTERM) is save_on_preemption
        signal.raise_signal(signal.SIGTERM)  # no SystemExit: the program's handler ran
        assert calls == [signal.SIGTERM]
        assert factory.servers[0].running
    assert signal.getsignal(signal.SIGTERM) is save_on_preemption
    assert factory.servers[0].stops == 1


def test_sig_ign_is_kept(default_sigterm):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    with runtime():
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_IGN
        signal.raise_signal(signal.SIGTERM)  # ignored: still here
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_IGN


def test_released_exactly_once_when_start_fails(default_sigterm):
    with exit_on_sigterm():
        rt = runtime(env_probe=FakeEnvServerProbe(ready_after_checks=None), env_timeout=0)
        with pytest.raises(EnvServerUnavailable):
            rt.start()
        rt.stop()  # a second stop must not release the outer holder's count
        assert SIGTERM_POLICY.active  # the outer holder still holds it
        with pytest.raises(SystemExit):
            signal.raise_signal(signal.SIGTERM)
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


def test_released_exactly_once_after_stop_twice(default_sigterm):
    with exit_on_sigterm():
        rt = runtime()
        rt.start()
        rt.stop()
        rt.stop()
        assert SIGTERM_POLICY.active
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


def test_started_off_the_main_thread_leaves_sigterm_alone(default_sigterm):
    seen: list[object] = []

    def body() -> None:
        with runtime():
            seen.append(signal.getsignal(signal.SIGTERM))

    thread = threading.Thread(target=body)
    thread.start()
    thread.join()
    assert seen == [signal.SIG_DFL]
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


SLOW_START = """
import signal, threading
# The runtime's own policy is under test, not a handler the program inherited
# (coverage's subprocess patch installs one, which the policy rightly keeps).
signal.signal(signal.SIGTERM, signal.SIG_DFL)
from verirl import DistributedEnv, TrainingRuntime, VLLMTopology

class SlowProbe:
    url = "http://127.0.0.1:9"

    def check(self):
        return False

    def wait(self, timeout):
        print("waiting", flush=True)
        threading.Event().wait(timeout)

env = {}
TrainingRuntime(
    VLLMTopology.plan(1, max_model_len=64),
    environ=env,
    dist_env=DistributedEnv.single_node(environ=env, master_port=%d),
    env_probe=SlowProbe(),
    env_timeout=120,
).start()
"""


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, -signal.SIGINT),
                                              (signal.SIGTERM, 143)])  # fmt: skip
def test_a_signal_during_start_exits_at_once_despite_a_phase_still_waiting(signum, code):
    """The phases' threads are daemons: a 120 s env wait does not hold the exit."""
    script = SLOW_START % find_free_port()
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        assert proc.stdout.readline() == "waiting\n"
        proc.send_signal(signum)
        assert proc.wait(timeout=20) == code
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if proc.stdout is not None:
            proc.stdout.close()


SIGNALLED_OFF_THE_MAIN_THREAD = SLOW_START.replace(
    'print("waiting", flush=True)',
    "threading.Event().wait(1)  # the main thread blocks in its wait meanwhile\n"
    "        signal.pthread_kill(threading.get_ident(), SIGNUM)  # handled here, not in main",
).replace("import signal, threading", "import signal, threading\nSIGNUM = %d")


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, -signal.SIGINT),
                                              (signal.SIGTERM, 143)])  # fmt: skip
def test_a_signal_another_thread_catches_during_start_still_ends_it(signum, code):
    """A process-wide signal the kernel hands to a phase's thread, not to the waiting main one.

    The C-level handler then only marks Python's handler as due; a main thread
    blocked on a lock without a timeout would run it when the phase ends (here
    after 120 s). The start-up wait wakes often enough to run it at once.
    """
    script = SIGNALLED_OFF_THE_MAIN_THREAD % (signum, find_free_port())
    proc = subprocess.Popen([sys.executable, "-c", script])
    try:
        assert proc.wait(timeout=20) == code
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _lock_error_over(interruption: BaseException) -> RuntimeError:
    """What CPython 3.10's Condition.wait raises when a handler's exception cut it short."""
    error = RuntimeError("release unlocked lock")
    error.__context__ = interruption
    return error


@pytest.mark.parametrize("interruption", [SystemExit(143), KeyboardInterrupt()])
def test_an_interruption_cpython_3_10_turned_into_a_lock_error_ends_start_as_itself(
    interruption, monkeypatch
):
    """On 3.10 a SIGTERM landing in Thread.start's Condition.wait exited 1 with 'release unlocked
    lock' instead of 143 (a CI run, test_a_signal_during_start_exits_at_once_despite_a_phase_
    still_waiting): start() raises the interruption the lock error replaced."""
    from verirl._signals import raise_interruption_behind

    def cut_short(*_args: object) -> None:
        raise _lock_error_over(interruption)

    monkeypatch.setattr(TrainingRuntime, "_submit_phases", cut_short)
    env: dict[str, str] = {}
    runtime = TrainingRuntime(
        VLLMTopology.plan(1, max_model_len=64), environ=env,
        dist_env=DistributedEnv.single_node(environ=env, master_port=find_free_port()),
    )  # fmt: skip
    with pytest.raises(type(interruption)) as info:
        runtime.start()
    assert info.value is interruption
    assert raise_interruption_behind(RuntimeError("release unlocked lock")) is None
    assert raise_interruption_behind(_lock_error_over(ValueError("x"))) is None


def test_a_wait_for_another_stop_cut_by_that_lock_error_raises_the_interruption():
    """The same shape where a stop waits for another thread's (Event.wait)."""
    import types

    from verirl.runtime import _wait_for

    interruption = SystemExit(143)

    class Ended:
        def wait(self) -> None:
            raise _lock_error_over(interruption)

    with pytest.raises(SystemExit) as info:
        _wait_for(types.SimpleNamespace(ended=Ended(), server=None))  # type: ignore[arg-type]
    assert info.value is interruption

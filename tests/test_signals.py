"""The one SIGTERM policy: keep a handler, install over the default only, fire once, nest."""

from __future__ import annotations

import functools
import importlib.util
import signal
import sys
import threading
import time
import types
from collections.abc import Callable
from typing import Any

import pytest

from verirl._signals import SigtermPolicy


def test_installed_over_the_default_raises_once_and_restores(default_sigterm):
    policy = SigtermPolicy()
    with policy.held() as counted:
        assert counted
        assert policy.active
        with pytest.raises(SystemExit) as info:
            signal.raise_signal(signal.SIGTERM)
        assert info.value.code == 128 + signal.SIGTERM
        assert policy.fired
        signal.raise_signal(signal.SIGTERM)  # again during the teardown: ignored
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


def test_a_handler_of_the_program_is_kept_and_is_what_runs(default_sigterm):
    calls: list[int] = []

    def mine(signum, _frame):
        calls.append(signum)

    signal.signal(signal.SIGTERM, mine)
    policy = SigtermPolicy()
    with policy.held():
        assert not policy.active
        signal.raise_signal(signal.SIGTERM)  # no SystemExit: the program's handler ran
        assert calls == [signal.SIGTERM]
    assert signal.getsignal(signal.SIGTERM) is mine


def test_sig_ign_is_kept(default_sigterm):
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    policy = SigtermPolicy()
    with policy.held():
        assert signal.getsignal(signal.SIGTERM) == signal.SIG_IGN
        signal.raise_signal(signal.SIGTERM)
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_IGN


def test_nested_holders_restore_after_the_last_one(default_sigterm):
    policy = SigtermPolicy()
    with policy.held():
        with policy.held():
            assert policy.active
        assert policy.active  # the outer holder still needs it
        with pytest.raises(SystemExit):
            signal.raise_signal(signal.SIGTERM)
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


def test_each_outermost_hold_fires_afresh(default_sigterm):
    policy = SigtermPolicy()
    for _ in range(2):
        with policy.held(), pytest.raises(SystemExit):
            signal.raise_signal(signal.SIGTERM)


def test_a_handler_installed_inside_the_block_is_left_in_place(default_sigterm):
    def mine(_signum, _frame):
        pass

    policy = SigtermPolicy()
    with policy.held():
        signal.signal(signal.SIGTERM, mine)
    assert signal.getsignal(signal.SIGTERM) is mine


def test_another_thread_neither_counts_nor_installs(default_sigterm):
    policy = SigtermPolicy()
    counted: list[bool] = []

    def hold():
        with policy.held() as was_counted:
            counted.append(was_counted)

    thread = threading.Thread(target=hold)
    thread.start()
    thread.join()
    assert counted == [False]
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL


# -- the program's SIGTERM whose SystemExit never reached the main thread


@pytest.fixture
def program_state(monkeypatch):
    """`program_handler`'s notes, fresh for the test and gone after it."""
    from verirl import _cli_document, _signals

    monkeypatch.setattr(_signals, "_PROGRAM_RECEIVED", [])
    monkeypatch.setattr(_signals, "_UNARRIVED", [])
    monkeypatch.setattr(_signals, "_DROPPED", [])
    monkeypatch.setattr(_cli_document, "_WRITTEN", [])


def _lose_a_sigterm() -> None:
    from verirl._signals import program_handler

    with pytest.raises(SystemExit):
        program_handler(signal.SIGTERM, None)  # swallowed, as compile() swallows it


def test_a_lost_sigterm_is_raised_by_the_next_main_thread_wait_once(program_state):
    from verirl._signals import raise_if_dropped

    _lose_a_sigterm()
    with pytest.raises(SystemExit) as info:
        raise_if_dropped()
    assert info.value.code == 128 + signal.SIGTERM
    raise_if_dropped()  # once: it has arrived now


def test_a_lost_sigterm_is_left_to_the_main_thread(program_state):
    from verirl._signals import raise_if_dropped

    _lose_a_sigterm()
    errors: list[BaseException] = []

    def wait_in_a_phase():
        try:
            raise_if_dropped()
        except BaseException as exc:  # noqa: BLE001 - what the thread would have raised
            errors.append(exc)

    thread = threading.Thread(target=wait_in_a_phase)
    thread.start()
    thread.join()
    assert errors == []
    with pytest.raises(SystemExit):
        raise_if_dropped()


def test_a_sigterm_exit_on_its_way_out_is_not_raised_again(program_state):
    """A wait in a ``finally`` the exit unwinds through cuts no teardown short."""
    from verirl._signals import program_handler, raise_if_dropped

    def fail() -> None:
        raise ValueError

    def command() -> None:
        try:
            program_handler(signal.SIGTERM, None)
        finally:
            raise_if_dropped()  # the teardown's wait: nothing, the exit is under way
            try:
                fail()  # handled inside the teardown: the exit is still under way
            except ValueError:
                raise_if_dropped()

    with pytest.raises(SystemExit) as info:
        command()
    assert info.value.__context__ is None  # the handler's own exit, nothing raised over it


def test_no_wait_raises_a_sigterm_that_arrived(program_state):
    from verirl._signals import program_exit_arrived, raise_if_dropped

    _lose_a_sigterm()
    program_exit_arrived()  # the program caught it (python -m verirl, as the command returned)
    raise_if_dropped()


def test_after_a_lost_sigterm_only_its_own_document_is_written(program_state, capsys):
    from verirl._cli_document import document_written, write_document
    from verirl._signals import raise_if_dropped

    _lose_a_sigterm()
    with pytest.raises(SystemExit) as info:
        write_document({"healthy": True})
    assert info.value.code == 128 + signal.SIGTERM
    assert not document_written()
    assert capsys.readouterr().out == ""
    _lose_a_sigterm()
    terminated = {"error": {"code": 143, "message": "terminated (SIGTERM)"}}
    write_document(terminated)
    assert capsys.readouterr().out.strip().startswith("{")
    raise_if_dropped()  # the document said it: arrived


def test_a_signal_in_the_trace_function_s_own_lock_is_handled_a_moment_later():
    """coverage's tracer calls ``lock_data`` from C with no ``finally``: SystemExit raised there
    left the lock held, and ``verirl serve`` under coverage hung after "SIGTERM received"."""
    import threading

    from verirl._signals import handle_later, in_tracers_lock

    frames = []

    class Tracer:  # coverage's shape: the trace function carries the collector's lock methods
        def __call__(self, *_trace_event):
            return None

        def lock_data(self):
            frames.append(sys._getframe())

        def unlock_data(self):
            frames.append(sys._getframe())

    tracer = Tracer()
    tracer.lock_data()
    tracer.unlock_data()
    assert [in_tracers_lock(frame, tracer) for frame in frames] == [True, True]
    assert not in_tracers_lock(sys._getframe(), tracer)
    assert not in_tracers_lock(frames[0], object())  # no tracer, or one without such a lock
    got = threading.Event()
    previous = signal.signal(signal.SIGUSR2, lambda *_: got.set())
    try:
        handle_later(signal.SIGUSR2)
        deadline = time.monotonic() + 10
        while not got.is_set() and time.monotonic() < deadline:
            got.wait(0.01)  # the handler runs in the main thread, between these waits
        assert got.is_set()
    finally:
        signal.signal(signal.SIGUSR2, previous)


def _in_the_tracers_lock() -> tuple[Any, types.FrameType]:
    """A trace function of coverage's shape (see above) and a frame of its ``lock_data``."""
    frames = []

    class Tracer:
        def __call__(self, *_trace_event):
            return None

        def lock_data(self):
            frames.append(sys._getframe())

    tracer = Tracer()
    tracer.lock_data()
    return tracer, frames[0]


def _handled_in_the_tracers_lock(
    handler: Callable[[int, types.FrameType | None], object], signum: int
) -> None:
    """``handler(signum, frame)`` as when the signal lands in coverage's lock, its tracer set."""
    tracer, frame = _in_the_tracers_lock()
    previous = sys.gettrace()
    sys.settrace(tracer)
    try:
        handler(signum, frame)
    finally:
        sys.settrace(previous)


def _waited(event: threading.Event) -> bool:
    """Whether ``event`` is set within 10 s (a signal's handler runs between the waits)."""
    deadline = time.monotonic() + 10
    while not event.is_set() and time.monotonic() < deadline:
        event.wait(0.01)
    return event.is_set()


def test_the_program_s_ctrl_c_in_the_trace_function_s_own_lock_is_raised_a_moment_later():
    """As for SIGTERM: Python's own KeyboardInterrupt raised in coverage's ``lock_data`` left the
    lock held; the ``verirl`` program's Ctrl-C handler sends it again a moment later."""
    import threading

    from verirl._signals import program_interrupt

    got = threading.Event()
    previous = signal.signal(signal.SIGINT, lambda *_: got.set())
    try:
        _handled_in_the_tracers_lock(program_interrupt, signal.SIGINT)  # nothing raised now
        assert _waited(got)  # sent again, to the handler in place then
    finally:
        signal.signal(signal.SIGINT, previous)
    with pytest.raises(KeyboardInterrupt):
        program_interrupt(signal.SIGINT, sys._getframe())


def test_a_signal_made_a_sigterm_in_the_trace_function_s_own_lock_is_handled_a_moment_later():
    """SIGUSR1, SIGQUIT, SIGHUP are made a SIGTERM by `as_sigterm`: SIGTERM's handler runs inside
    it and sees its frame, not coverage's lock it landed in; the SystemExit then left the lock
    held (``serve`` under coverage hung after SIGUSR1 in CI, on 3.10)."""
    import threading

    from verirl._signals import as_sigterm

    again, terms = threading.Event(), []
    previous_usr2 = signal.signal(signal.SIGUSR2, lambda *_: again.set())
    previous_term = signal.signal(signal.SIGTERM, lambda signum, _frame: terms.append(signum))
    try:
        _handled_in_the_tracers_lock(as_sigterm, signal.SIGUSR2)  # no SIGTERM now
        assert terms == []
        assert _waited(again)  # its own signal, sent again
        as_sigterm(signal.SIGUSR2, sys._getframe())  # elsewhere: a SIGTERM at once
        assert terms == [signal.SIGTERM]
    finally:
        signal.signal(signal.SIGUSR2, previous_usr2)
        signal.signal(signal.SIGTERM, previous_term)


_RAISING_HANDLERS = {
    "as_sigterm": (signal.SIGUSR2, None),
    "program_handler": (signal.SIGTERM, SystemExit),
    "program_interrupt": (signal.SIGINT, KeyboardInterrupt),
    "policy": (signal.SIGTERM, SystemExit),
    "hang_up": (signal.SIGHUP, None),
}


def _raising_handler(name: str) -> Callable[[int, types.FrameType | None], object]:
    from verirl import _signals

    # Importing the program's module sets its handlers: this process keeps its own.
    handlers = {signum: signal.getsignal(signum) for signum in signal.valid_signals()}
    try:
        import verirl.__main__ as program
    finally:
        for signum, handler in handlers.items():
            if handler is not None and signal.getsignal(signum) != handler:
                signal.signal(signum, handler)

    if name == "policy":
        policy = SigtermPolicy()
        policy._anonymous = 1  # held, without installing it: its raise is what is checked
        return policy.handle
    if name == "hang_up":
        return program._hang_up
    return getattr(_signals, name)


@pytest.mark.parametrize("name", sorted(_RAISING_HANDLERS))
def test_each_raising_handler_waits_out_the_tracer_s_lock_and_raises_elsewhere(name, program_state):
    """Every handler verirl installs that raises, in coverage's lock: nothing now, its signal
    again a moment later; elsewhere its exception (or a SIGTERM, for those made one)."""
    signum, raised = _RAISING_HANDLERS[name]
    handler = _raising_handler(name)
    again, terms = threading.Event(), []
    previous = signal.signal(signum, lambda *_: again.set())
    previous_term = signal.getsignal(signal.SIGTERM)
    if raised is None:
        signal.signal(signal.SIGTERM, lambda number, _frame: terms.append(number))
    try:
        _handled_in_the_tracers_lock(handler, signum)
        assert terms == []
        assert _waited(again)
        if raised is None:
            handler(signum, sys._getframe())
            assert terms == [signal.SIGTERM]
        else:
            with pytest.raises(raised):
                handler(signum, sys._getframe())
    finally:
        signal.signal(signum, previous)
        signal.signal(signal.SIGTERM, previous_term)


def test_no_handler_in_verirl_raises_without_the_tracer_s_lock_guard():
    """The class, swept in the source: a function taking (signum, frame) that raises, raises a
    signal or calls Python's Ctrl-C handler is made with `outside_tracers_lock` (one that was
    not, ``as_sigterm``, hung ``serve`` under coverage), or passes its frame on to one that is."""
    import ast
    from pathlib import Path

    import verirl

    passes_the_frame_on = {"noting", "_hang_up"}  # they call a guarded handler with the frame
    found, unguarded = [], []
    for path in sorted(Path(verirl.__file__).parent.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.FunctionDef):
                continue
            names = [argument.arg for argument in node.args.args]
            if names[-2:] not in (["signum", "frame"], ["signum", "_frame"], ["_signum", "_frame"]):
                continue
            body = list(ast.walk(node))
            raises = any(isinstance(part, ast.Raise) for part in body) or any(
                isinstance(part, ast.Attribute)
                and part.attr in ("raise_signal", "default_int_handler")
                for part in body
            )
            if not raises:
                continue
            found.append(node.name)
            guarded = any(
                isinstance(decorator, ast.Name) and decorator.id == "outside_tracers_lock"
                for decorator in node.decorator_list
            )
            if not guarded and node.name not in passes_the_frame_on:
                unguarded.append(f"{path.name}:{node.lineno} {node.name}")
    assert unguarded == []
    assert {"as_sigterm", "handle", "program_handler", "program_interrupt", "_on_signal"} <= set(
        found
    )


def test_coverage_s_lock_is_recognised_whatever_its_tracer(tmp_path):
    """With coverage's Python tracer (COVERAGE_CORE=pytrace) the trace function is a bound
    method, its lock on the object behind it; under sys.monitoring there is none: the check
    knew only the C tracer's shape (review round 28, A-F3). coverage's own lock methods, in
    its collector, are recognised by themselves; and a bound tracer's object is looked at."""
    from verirl._signals import in_tracers_lock

    package = tmp_path / "coverage"
    package.mkdir()
    (package / "collector.py").write_text(
        "import sys\n"
        "class Collector:\n"
        "    def lock_data(self):\n"
        "        return sys._getframe()\n"
        "    def unlock_data(self):\n"
        "        return sys._getframe()\n"
        "    def other(self):\n"
        "        return sys._getframe()\n"
    )
    # Loaded under a name of its own: the running coverage's modules are left alone.
    spec = importlib.util.spec_from_file_location("standin_collector", package / "collector.py")
    assert spec is not None
    assert spec.loader is not None
    standin = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(standin)

    collector = standin.Collector()
    assert in_tracers_lock(collector.lock_data(), object())  # no tracer of that shape needed
    assert in_tracers_lock(collector.unlock_data(), object())
    assert not in_tracers_lock(collector.other(), object())

    frames = []

    class PyTracer:  # coverage's Python tracer: the trace function is its bound ``_trace``
        def __init__(self) -> None:
            self.lock_data = self._lock

        def _lock(self) -> None:
            frames.append(sys._getframe())

        def _trace(self, *_event: object) -> None:
            return None

    tracer = PyTracer()
    tracer.lock_data()
    assert in_tracers_lock(frames[0], tracer._trace)
    assert not in_tracers_lock(sys._getframe(), tracer._trace)


def _chain(body: Callable[[], object]) -> BaseException:
    try:
        body()
    except BaseException as exc:  # noqa: BLE001 - the chain is what is looked at
        return exc
    raise AssertionError("nothing raised")


def _ctrl_c() -> None:
    raise KeyboardInterrupt  # as Python's SIGINT handler raises it: no arguments


def _sigterm() -> None:
    sys.exit(128 + signal.SIGTERM)  # the SIGTERM policy's


def _then(first: Callable[[], object], second: Callable[[], object]) -> Callable[[], None]:
    def body() -> None:
        try:
            first()
        except BaseException:  # noqa: BLE001 - the second comes while the first is handled
            second()

    return body


class _Aborted(Exception):
    pass


def _wrapped(first: Callable[[], object], how: str) -> Callable[[], None]:
    def body() -> None:
        try:
            first()
        except BaseException as exc:
            if how == "from e":
                raise _Aborted from exc
            raise _Aborted from None

    return body


@pytest.mark.parametrize(
    ("body", "twice"),
    [
        (_then(_sigterm, _ctrl_c), True),  # two at once: the Ctrl-C raised as the exit unwound
        (_then(_ctrl_c, _sigterm), True),
        (_then(_ctrl_c, _ctrl_c), True),  # a second Ctrl-C during the program's own save
        (_then(_wrapped(_ctrl_c, "from e"), _sigterm), True),  # followed through ``from e``
        (_ctrl_c, False),
        (_sigterm, False),
        (_then(_ctrl_c, lambda: sys.exit(1)), False),  # the program's exit after one
        (_then(_sigterm, _sigterm), False),  # sys.exit(e.code): a second SIGTERM raises nothing
        (_then(_ctrl_c, lambda: _raise(KeyboardInterrupt("by user"))), False),  # its own
        (_then(_wrapped(_ctrl_c, "from None"), _ctrl_c), False),  # set aside, then one
        # the program's own exit of a signal's code (SIGUSR1's, a hang-up's): verirl raises 143
        *((_then(_ctrl_c, functools.partial(sys.exit, code)), False) for code in (129, 138, 192)),
    ],
    ids=[
        "term-int",
        "int-term",
        "int-int",
        "from-e-term",
        "int",
        "term",
        "int-exit1",
        "term-term",
        "int-own",
        "from-none-int",
        "int-exit129",
        "int-exit138",
        "int-exit192",
    ],
)
def test_two_interruptions_are_told_from_a_program_s_own_re_raise(body, twice):
    """What skips a server's grace as a block is left (review of 3c697a9)."""
    from verirl._signals import interrupted_twice

    assert interrupted_twice(_chain(body)) is twice


def _raise(error: BaseException) -> None:
    raise error


PUT_OFF_THEN_NOTED = """
import os, signal, sys, time
from verirl._signals import program_handler, program_note, program_received
from verirl._supervise import _kill_noted
signal.signal(signal.SIGTERM, program_handler)
_kill_noted(os.getpid(), signal.SIGTERM, set())  # lands where no handler raises: put off
signal.signal(signal.SIGTERM, program_note)  # what the CLI sets once its command returned
deadline = time.monotonic() + 5
while program_received() is None and time.monotonic() < deadline:
    time.sleep(0.01)
print(program_received())
"""


def test_a_signal_put_off_is_noted_by_the_handler_that_only_notes(tmp_path):
    """Sent again to `program_note`, which took over meanwhile: noted, not dropped (3c697a9)."""
    import subprocess

    done = subprocess.run(
        [sys.executable, "-c", PUT_OFF_THEN_NOTED], capture_output=True, text=True, timeout=60,
        check=False,
    )  # fmt: skip
    assert done.stdout.strip() == str(int(signal.SIGTERM)), done.stderr


def test_handlers_are_put_back_without_a_python_frame_a_handler_could_land_in():
    """Only frames below `put_back`'s own, which holds what lands (review of 3420485).

    ``signal.signal`` and ``getsignal`` are Python wrappers over C, through
    `enum`: a handler landing in one of their frames raised in the middle of
    putting the handlers back, and left one of verirl's installed for good.
    Launch's grace and a whole write put theirs back through it.
    """
    from verirl._signals import put_back, replacing

    def ours(_signum: int, _frame: object) -> None:
        pass

    def previous(_signum: int, _frame: object) -> None:  # only a function is ever replaced
        pass

    calls: list[str] = []

    def profile(frame: types.FrameType, event: str, _arg: object) -> None:
        if event == "call":
            above = frame
            while above is not None and above.f_code is not put_back.__code__:
                above = above.f_back
            if above is not frame:  # put_back itself, or what it calls
                calls.append(f"{frame.f_code.co_filename}:{frame.f_code.co_name}")

    before = signal.getsignal(signal.SIGUSR2)
    signal.signal(signal.SIGUSR2, ours)
    try:
        sys.setprofile(profile)
        try:
            put_back([(signal.SIGUSR2, previous, replacing(ours))])
        finally:
            sys.setprofile(None)
        assert signal.getsignal(signal.SIGUSR2) is previous
    finally:
        signal.signal(signal.SIGUSR2, before)
    wrappers = [call for call in calls if call.split(":")[0].endswith(("signal.py", "enum.py"))]
    assert wrappers == []
    assert calls, "the profile saw put_back's own calls (the check of what is in place)"


def test_an_interruption_behind_the_lock_error_keeps_what_it_was_raised_during():
    """3.10's lock error stands for a Ctrl-C that came as a SIGTERM's exit unwound: the
    Ctrl-C raised in its place keeps the exit as its context (review of 3d89f08)."""
    from verirl._signals import interruptions, raise_interruption_behind

    def unwinding() -> None:
        try:
            try:
                raise SystemExit(143)
            finally:
                try:
                    raise KeyboardInterrupt
                finally:
                    raise RuntimeError("release unlocked lock")  # as CPython raises it
        except RuntimeError as error:
            raise_interruption_behind(error)
            raise

    with pytest.raises(KeyboardInterrupt) as caught:
        unwinding()
    assert [signal.Signals(s).name for s in interruptions(caught.value)] == ["SIGTERM", "SIGINT"]


@pytest.mark.parametrize(
    ("body", "came"),
    [
        (_then(_sigterm, _ctrl_c), ["SIGTERM", "SIGINT"]),
        (_then(_ctrl_c, lambda: sys.exit(1)), ["SIGINT"]),  # the program's own exit after one
        (_then(_ctrl_c, lambda: _raise(KeyboardInterrupt("by user"))), ["SIGINT"]),
        (_then(_wrapped(_ctrl_c, "from e"), _sigterm), ["SIGINT", "SIGTERM"]),
        (_then(_wrapped(_ctrl_c, "from None"), _sigterm), ["SIGTERM"]),
        (lambda: sys.exit(128 + signal.SIGUSR1), []),  # a program's own, in its handler
    ],
    ids=["term-int", "int-exit1", "int-own", "from-e", "from-none", "usr1-exit"],
)
def test_the_signals_an_exception_stands_for_are_read_as_a_traceback_shows_them(body, came):
    """`interruptions` (launch's reading of what came) walks the chain as `interrupted_twice`
    does: a program's own exit is no SIGTERM, ``from e`` is followed (review of 3d89f08)."""
    from verirl._signals import interruptions

    assert [signal.Signals(s).name for s in interruptions(_chain(body))] == came


def test_a_training_started_off_the_main_code_does_not_rearm_the_policy(default_sigterm):
    """`went_on` (a new training) re-arms a fired policy only from the main thread with nothing
    unwinding there: a training in a worker thread, or one started from a teardown's ``except``,
    re-armed it while the first exit unwound, and a second SIGTERM SIGKILLed the server
    (review of 09d6f75)."""
    policy = SigtermPolicy()
    with policy.held():
        with pytest.raises(SystemExit):
            signal.raise_signal(signal.SIGTERM)
        worker = threading.Thread(target=policy.went_on)
        worker.start()
        worker.join()
        assert policy.fired
        _went_on_while_an_exit_unwinds(policy)
        assert policy.fired
        policy.went_on()  # the main code, nothing unwinding: the program went on
        assert not policy.fired


def _went_on_while_an_exit_unwinds(policy: SigtermPolicy) -> None:
    try:
        sys.exit(143)
    except SystemExit:
        policy.went_on()


@pytest.mark.parametrize("enabled", [True, False])
def test_current_frames_runs_with_the_collector_off_and_puts_it_back(monkeypatch, enabled):
    """CPython gh-106883 (before 3.11.9 and 3.12.3): a collection inside sys._current_frames()
    deadlocks against a thread that is ending; verirl calls it with the collector off, as the
    fixed CPython does, and leaves the collector as it found it (a test's run hung on 3.11.7)."""
    import gc

    from verirl import _signals

    seen: list[bool] = []

    def frames() -> dict[int, object]:
        seen.append(gc.isenabled())
        return {}

    monkeypatch.setattr(_signals.sys, "_current_frames", frames)
    was = gc.isenabled()
    try:
        (gc.enable if enabled else gc.disable)()
        assert _signals.current_frames() == {}
        assert seen == [False]
        assert gc.isenabled() is enabled
    finally:
        (gc.enable if was else gc.disable)()


def test_current_frames_from_several_threads_never_runs_with_the_collector_on(monkeypatch):
    """One call's end must not turn the collector back on under another's (review 29)."""
    import gc
    import threading

    from verirl import _signals

    on: list[bool] = []
    real = _signals.sys._current_frames

    def frames() -> dict[int, object]:
        on.append(gc.isenabled())
        return real()

    monkeypatch.setattr(_signals.sys, "_current_frames", frames)

    def calls() -> None:
        for _ in range(2000):
            _signals.current_frames()

    threads = [threading.Thread(target=calls) for _ in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=60)
    assert len(on) == 6000
    assert not any(on)
    assert gc.isenabled()

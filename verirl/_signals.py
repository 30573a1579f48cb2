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
  it started is logged and ignored, so the teardown is not cut short. That
  holds while the policy is held, also when the program caught the exit: a
  teardown on the normal path (``verirl launch`` after its command's exit)
  cannot be told from a program that went on. A new training is such a sign
  (`SigtermPolicy.went_on`): the policy is armed again.
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
- **One handler at a time.** A signal whose handler Python would run inside
  another verirl handler (it came as that one logged, before it raised) is
  held by that one and handled as it ends: two signals sent together both
  take effect, in the order their handlers ran (`outside_tracers_lock`).
  That is not always the order they were sent in: CPython runs the handlers
  of signals pending at one moment in signal-number order (SIGINT's before
  SIGTERM's), and the kernel may hand each to another thread. So which of
  two at once gives the exit code is not promised; that both act is.
- **One owner at a time, no swallowing.** A handler that takes SIGTERM over
  from the policy for a while (`verirl.preemption.PreemptionCallback`, which
  waits for a step end) registers with `SigtermPolicy.cooperate`: an
  interrupt then goes to it like to the policy's own handler, and it claims
  the interrupt first (`SigtermPolicy.take_interrupt`) and raises its error at
  once, so a loop that never reaches a step end still unwinds within the
  watchdog's grace.
"""

from __future__ import annotations

import _signal  # type: ignore[import-not-found]  # signal's C half (see put_back)
import contextlib
import functools
import gc
import logging
import os
import signal
import sys
import threading
import types
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar, cast

__all__ = [
    "EXIT_GRACE",
    "SIGTERM_POLICY",
    "TERMINATING",
    "SigtermPolicy",
    "arm_exit_deadline",
    "as_sigterm",
    "current_frames",
    "ending_signal_name",
    "exception_chain",
    "exit_on_sigterm",
    "hand_on",
    "handle_in_turn",
    "in_a_spot_that_must_not_raise",
    "interrupted_twice",
    "interruptions",
    "is_verirl_handler",
    "leave_in_place",
    "mark_noted",
    "must_not_raise",
    "note_dropped",
    "noted",
    "notes_only",
    "outside_tracers_lock",
    "program_exit_arrived",
    "program_handler",
    "program_interrupt",
    "program_note",
    "program_received",
    "put_back",
    "raise_if_dropped",
    "raise_if_lost",
    "raise_interruption_behind",
    "replacing",
    "signal_name",
    "signal_of",
    "sigterm_lost",
    "sigterm_pending",
    "stand_in_for",
    "taken_for_sigterm",
]

log = logging.getLogger("verirl.signals")

_TERMINATING_NAMES = (
    "SIGQUIT SIGUSR1 SIGUSR2 SIGALRM SIGVTALRM SIGPROF SIGXCPU SIGXFSZ SIGPWR SIGSTKFLT SIGIO"
)
_REAL_TIME = range(getattr(signal, "SIGRTMIN", 0), getattr(signal, "SIGRTMAX", -1) + 1)
TERMINATING: tuple[int, ...] = (
    *(getattr(signal, name) for name in _TERMINATING_NAMES.split() if hasattr(signal, name)),
    *_REAL_TIME,
)
"""The catchable, asynchronous signals whose default ends the process, but SIGINT/TERM/HUP.

Those three have a policy of their own. Left out as well: the signals whose
default is to ignore (SIGCHLD, SIGWINCH, SIGCONT, SIGURG), SIGPIPE (which
Python ignores from its start), and the fault signals (SIGSEGV, SIGBUS,
SIGFPE, SIGILL, SIGABRT, SIGTRAP, SIGSYS), which must keep killing a process
that really faulted. The CLI makes each a SIGTERM (`as_sigterm`) where its
disposition is the default, and ``verirl launch`` passes each on to its
command while it runs (`verirl._supervise`). SIGXFSZ is ignored by Python
from its start, so it stays ignored.
"""


_Raising = TypeVar("_Raising", bound=Callable[..., None])


def outside_tracers_lock(handler: _Raising) -> _Raising:
    """``handler``, run only where its exception cannot land in the tracer's lock.

    ``handler`` is a function or method whose last two arguments are the
    signal and the frame (`in_tracers_lock` looks at that frame). Every
    verirl handler that raises (``SystemExit``, ``KeyboardInterrupt``, a
    watchdog's error) is made with it, so that none can forget the check: one
    that did (``as_sigterm``) hung ``serve`` under coverage. There the signal
    is sent again a moment later (`handle_later`) and nothing runs now.

    A signal whose handler Python runs inside another verirl handler's own
    code (it came as that one logged, before it raised) is held by that one
    and handled as it ends, its exception raised during the first one's
    (`_held_by_a_running_handler`): it would otherwise be raised in place of
    the first one's, and the first signal be lost (a SIGTERM and a Ctrl-C
    sent together made ``verirl launch`` wait out the whole grace). What is
    held is a local of the holding frame: it cannot outlive it.
    """

    @functools.wraps(handler)
    def guarded(*args: object) -> None:
        held: list[int] | None = []  # signals that came inside this handler (`_HELD`)
        signum, frame = cast("int", args[-2]), cast("types.FrameType | None", args[-1])
        try:
            if _held_by_a_running_handler(signum, frame):
                return
            if in_tracers_lock(frame) or in_a_spot_that_must_not_raise(frame):
                handle_later(signum)
                return
            handler(*args)
        finally:
            came, held = held, None  # from here on one that comes is sent again later
            handle_in_turn(came, frame)

    _GUARDS.add(cast("types.FunctionType", guarded).__code__)
    _HOLDERS.add(cast("types.FunctionType", guarded).__code__)
    return cast("_Raising", guarded)


_GUARDS: set[types.CodeType] = set()
"""The code of `outside_tracers_lock`'s wrapper (one for all the handlers made with it)."""

_HOLDERS: set[types.CodeType] = set()
"""The code of the frames whose `_HELD` local, while a list, takes a signal landing inside them.

The wrapper of verirl's handlers, `handle_in_turn` and `put_back`: a verirl
handler whose signal lands in one (or below it) appends its signal there
instead of raising, and the frame handles it as it ends; once its local is
``None`` (it is ending), the signal is sent again a moment later.
"""

_HELD = "held"
"""A holding frame's local (`_HOLDERS`) that takes the signals which came inside it."""


def hand_on(
    handler: Callable[[int, types.FrameType | None], object],
    signum: int,
    frame: types.FrameType | None,
) -> None:
    """Call ``handler`` (a program's, maybe) for ``signum`` from a verirl handler, as Python would.

    While it runs, a signal landing inside it (a program's save) is handled
    where it lands, as Python handles it, not held for the verirl handler
    around it (`_held_by_a_running_handler`).
    """
    handing_on = True
    try:
        handler(signum, frame)
    finally:
        handing_on = False  # noqa: F841 - read from outside (`_HANDING_ON`)


def pass_to(
    disposition: Callable[[int, types.FrameType | None], object] | int | signal.Handlers | None,
    signum: int,
    frame: types.FrameType | None,
) -> None:
    """Give ``signum`` to ``disposition``, just set again, as it would have had it.

    A handler is called (`hand_on`); the default's action is taken (the
    signal sent again, to it now); an ignored signal is dropped.
    """
    if callable(disposition):
        hand_on(disposition, signum, frame)
    elif disposition == signal.SIG_DFL:
        os.kill(os.getpid(), signum)


_HANDING_ON = "handing_on"
"""`hand_on`'s local, true while the handler it was given runs."""


def _held_by_a_running_handler(signum: int, frame: types.FrameType | None) -> bool:
    """Whether ``signum``, landed in ``frame``, came inside a verirl handler: then it is held.

    The frames from ``frame`` up are those running now: a wrapper among them
    is a handler not done yet, and the nearest that takes signals in holds
    it; one only beginning or ending has it sent again a moment later
    (`handle_later`). Not so inside a handler of the program's that verirl
    passed a signal to (`hand_on`: a save), nor for a handler called by
    another one, given the frame that one landed in, below both: those run
    at once.
    """
    passed = False  # a wrapper only beginning or ending
    below: types.FrameType | None = None
    while frame is not None:
        code = frame.f_code
        if code in _HOLDERS:
            held = frame.f_locals.get(_HELD)
            if isinstance(held, list):
                held.append(signum)
                return True
            passed = True
        elif code is hand_on.__code__ and _in_a_programs_handler(frame, below):
            break
        below, frame = frame, frame.f_back
    if passed:
        handle_later(signum)
    return passed


def _in_a_programs_handler(frame: types.FrameType, below: types.FrameType | None) -> bool:
    """Whether ``below`` is a handler of the program's that `hand_on`'s ``frame`` runs.

    Not `hand_on` itself, nor a tracer called on its lines, nor a verirl
    handler it runs (that one holds what comes inside it).
    """
    local = frame.f_locals
    if below is None or local.get(_HANDING_ON) is not True:
        return False
    handler = local.get("handler")
    if is_verirl_handler(handler):
        return False
    code = _code_of(handler)
    return code is None or below.f_code is code  # not a function: taken for the program's


def handle_in_turn(held: list[int] | None, frame: types.FrameType | None) -> None:
    """The handlers of the signals ``held``, in turn, as Python calls them, in ``frame``.

    Called as the holding code ends: raised or not, its exception is the
    context of theirs (`interruptions` sees both, in order), and each one's
    is that of the next: one that raises never keeps the others from
    running. A signal whose handler is no longer a function is passed over,
    as Python passes it over. This frame holds too (`_HOLDERS`): a signal
    landing in it, between two of them, joins ``held`` and waits its turn;
    one is taken off the list only as its handler is called.
    """
    try:
        if held:
            signum = held[0]
            handler = _signal.getsignal(signum)
            del held[0]
            if callable(handler):
                hand_on(handler, signum, frame)
    finally:
        came, held = held, None  # from here on one that comes is sent again later
        if came:
            handle_in_turn(came, frame)


_HOLDERS.add(handle_in_turn.__code__)

_Handler = Callable[[int, "types.FrameType | None"], object]


def put_back(
    changes: Iterable[tuple[int, _Handler | int, Callable[[object], bool] | None]],
    held: list[int] | None = None,
) -> None:
    """Set each signal's handler in one step, then handle the signals ``held`` in turn.

    ``changes``: (signal, handler, ``over``); with ``over``, the handler is set
    only where ``over(current handler)`` is true (ours still the one, say).
    A verirl handler whose signal lands in this step is held (with ``held``:
    a whole write's signals, handled after, `handle_in_turn`) or sent again a
    moment later, never raised in the middle: that would leave some
    handlers unset for good. `signal`'s C functions, not its Python wrappers,
    whose frames (and `enum`'s) would hold nothing.
    """
    try:
        for number, handler, over in changes:
            if over is None or over(_signal.getsignal(number)):
                _signal.signal(number, int(handler) if isinstance(handler, int) else handler)
    finally:
        came, held = held, None  # from here on one that comes is sent again later
        handle_in_turn(came, None)


_HOLDERS.add(put_back.__code__)


def replacing(*handlers: object) -> Callable[[object], bool]:
    """`put_back`'s ``over``: whether the current handler is one of ``handlers``."""
    return lambda current: any(current == handler for handler in handlers)


_MUST_NOT_RAISE: set[types.CodeType] = {
    # Raised at its entry (a second signal's handler, run as the first one's exception
    # unwinds a wait), the lock is left released: Event.wait's ``with`` then raises
    # RuntimeError('release unlocked lock') in the interruption's place.
    threading.Condition._acquire_restore.__code__,  # type: ignore[attr-defined]  # noqa: SLF001
    # Raised at its entry, the lock is left held: the next wait or set() on it hangs.
    threading.Condition.__exit__.__code__,
}


def must_not_raise(function: _Raising) -> _Raising:
    """Mark ``function`` (an ``__exit__`` that tears down) as a spot no handler raises in.

    A handler whose signal lands right there, as a first signal's exception
    unwinds into it, would end the teardown before it began (a ``with
    VLLMServer(...)`` block left with its server running): it is handled a
    moment later instead (`handle_later`), inside the teardown, which a
    second signal cuts short as documented.
    """
    _MUST_NOT_RAISE.add(function.__code__)
    return function


_NOT_WHILE_UNWINDING: set[types.CodeType] = {
    # 3.10 runs a pending handler in these frames themselves as an exception unwinds them:
    # in Condition.wait's ``finally`` before _acquire_restore is called (the lock left
    # released), in Event.wait's ``with`` before Condition.__exit__ is (the lock left held).
    threading.Condition.wait.__code__,
    threading.Event.wait.__code__,
}


def in_a_spot_that_must_not_raise(frame: types.FrameType | None) -> bool:
    """Whether a handler's exception must not be raised in ``frame`` now.

    ``frame`` is one of `_MUST_NOT_RAISE`'s functions (`must_not_raise`), or a
    wait of `_NOT_WHILE_UNWINDING` that the exception being handled unwinds.
    A handler that interrupts such a wait itself runs: nothing unwinds it then.
    """
    if frame is None:
        return False
    if frame.f_code in _MUST_NOT_RAISE:
        return True
    return frame.f_code in _NOT_WHILE_UNWINDING and _unwinding_through(frame)


def _unwinding_through(frame: types.FrameType) -> bool:
    """Whether the exception being handled has ``frame`` in its traceback (it unwinds it)."""
    error = sys.exc_info()[1]
    trace = error.__traceback__ if error is not None else None
    while trace is not None:
        if trace.tb_frame is frame:
            return True
        trace = trace.tb_next
    return False


@outside_tracers_lock
def as_sigterm(_signum: int, _frame: types.FrameType | None) -> None:
    """A handler that makes its signal a SIGTERM to this thread: SIGTERM's policy then acts.

    The CLI's handler for each of `TERMINATING` (SIGQUIT, SIGUSR1, ...): by
    default such a signal killed verirl on the spot, with no teardown, and
    left its vLLM server to the death signal and a launch's command to run on.
    Whatever handles SIGTERM now (the program's handler, the policy's, a
    noting one during teardown) is called as Python calls a handler, given
    the frame this one landed in: it looks there itself for the tracer's
    lock (`in_tracers_lock`), and runs at once (a signal sent instead would
    come inside this handler, and wait for it: `outside_tracers_lock`). At
    SIGTERM's default, the process ends of a SIGTERM.
    """
    handler = signal.getsignal(signal.SIGTERM)
    with taken_for_sigterm(_signum):
        if callable(handler):  # as Python calls it, where this one landed
            hand_on(handler, signal.SIGTERM, _frame)
        elif handler != signal.SIG_IGN:  # the default: the process ends of it
            signal.raise_signal(signal.SIGTERM)


@contextlib.contextmanager
def taken_for_sigterm(signum: int) -> Iterator[None]:
    """Inside the block a SIGTERM handled is ``signum`` taken for one (`signal_name` says so)."""
    _TAKEN_FOR_SIGTERM.append(signum)
    try:
        yield
    finally:
        _TAKEN_FOR_SIGTERM.pop()


_TAKEN_FOR_SIGTERM: list[int] = []
"""While `as_sigterm` raises its SIGTERM: the signal that was taken for it (SIGHUP, ...)."""

_FIRST_NAMES: list[str] = []
"""How the first signal that ended the run is named (`signal_name`), once it was handled."""


def signal_name(signum: int) -> str:
    """How to name ``signum``, being handled now: ``SIGHUP, taken for a SIGTERM`` from `as_sigterm`.

    The first one named is what `ending_signal_name` tells later.
    """
    name = signal.Signals(signum).name
    if signum == signal.SIGTERM and _TAKEN_FOR_SIGTERM and _TAKEN_FOR_SIGTERM[-1] != signum:
        name = f"{signal.Signals(_TAKEN_FOR_SIGTERM[-1]).name}, taken for a SIGTERM"
    if not _FIRST_NAMES:
        _FIRST_NAMES.append(name)
    return name


def ending_signal_name(code: int) -> str:
    """How the signal that ended the run with exit ``code`` (130, 143) is named."""
    if code == 128 + signal.SIGTERM and _FIRST_NAMES and "SIGTERM" in _FIRST_NAMES[0]:
        return _FIRST_NAMES[0]
    return signal.Signals(code - 128).name


_JIT_MODULE = "transformers.trainer_jit_checkpoint"
_JIT_ORIGINAL = "_original_sigterm_handler"  # what its callback puts back as training ends
_JIT_HANDLER = "_sigterm_handler"  # the handler it sets as its Trainer is built


def jit_checkpoint_manager(handler: object) -> object | None:
    """The JIT-checkpoint manager of transformers if ``handler`` is its SIGTERM handler, else None.

    ``enable_jit_checkpoint=True`` sets it as a Trainer is built, and its
    callback puts back the handler it replaced when training ends.
    """
    owner: object = getattr(handler, "__self__", None)
    if owner is not None and type(owner).__module__ == _JIT_MODULE:
        return owner
    return None


_JIT_SEEN: weakref.WeakSet[object] = weakref.WeakSet()
"""Every JIT-checkpoint manager verirl saw the handler of: the policy lends to each (`_install`)."""


def jit_trained(manager: object, *, ending: bool = False) -> bool:
    """Whether the Trainer of a JIT ``manager`` has trained: begun, and not training now.

    Its handler is then spent: transformers sets it once, as the Trainer is
    built, and only its first training saves on it; after it, the handler
    starts a timer for a checkpoint no training takes. Before and during
    that training it is live. "Now" is read from the main thread's stack,
    not from ``is_in_train``, which a train() ended by an exception (a
    stop's exit, an interrupt, a second Ctrl-C) leaves set for good.
    ``ending``: the training on the stack is ending (its callback's end).
    """
    trainer = getattr(manager, "trainer", None)
    begun = bool(getattr(getattr(trainer, "state", None), "max_steps", 0))
    return begun and (ending or not _training_now(trainer))


_TRAINING_FRAMES = frozenset({"train", "_inner_training_loop"})


def current_frames() -> dict[int, types.FrameType]:
    """``sys._current_frames()``, with the garbage collector off while it runs.

    Before Python 3.11.9 and 3.12.3 (CPython gh-106883) it holds the
    interpreter's thread-list lock while it makes frame objects: a collection
    they start can run a weakref callback that lets go of the GIL (a socket's
    close), a thread that is ending takes the GIL and waits for that lock, and
    the two wait for each other for good. Off as CPython's own fix turns it off;
    one call at a time, so that one call's end never turns it back on under
    another's.
    """
    with _FRAMES_LOCK:
        enabled = gc.isenabled()
        gc.disable()
        try:
            return sys._current_frames()  # noqa: SLF001 - the stacks, read only
        finally:
            if enabled:
                gc.enable()


_FRAMES_LOCK = threading.RLock()  # re-entered by a signal handler that runs inside a call


def _training_now(trainer: object) -> bool:
    """Whether ``trainer``'s train() is on the main thread's stack, short of its end.

    Its callbacks' ``on_train_end`` on the stack above it is its end: the JIT
    callback put its handler's original back there, the training goes no further.
    """
    if threading.current_thread() is threading.main_thread():
        frame: types.FrameType | None = sys._getframe()  # noqa: SLF001 - the stack, read only
    else:
        frame = current_frames().get(threading.main_thread().ident or 0)
    callbacks = getattr(trainer, "callback_handler", None)
    while frame is not None:
        code = frame.f_code
        if code.co_varnames[:1] == ("self",):
            if code.co_name == "on_train_end" and frame.f_locals.get("self") is callbacks:
                return False
            if code.co_name in _TRAINING_FRAMES and frame.f_locals.get("self") is trainer:
                return True
        frame = frame.f_back
    return False


def jit_chain(handler: object, *, ending: bool = False) -> tuple[object | None, object]:
    """Through ``handler``'s JIT managers: the first live handler (or None), and the bottom.

    Each manager puts back what SIGTERM had when its Trainer was built: an
    older one's handler, a handler verirl left in place (read as what it
    stands in for), the default or a program's own, which is the bottom.
    Every manager found is noted (`_JIT_SEEN`). ``ending``: see `jit_trained`.
    """
    managers: list[object] = []
    live: object | None = None
    under = stand_in_for(signal.SIGTERM, handler)
    manager = jit_checkpoint_manager(under)
    while manager is not None and manager not in managers:
        managers.append(manager)
        if live is None and not jit_trained(manager, ending=ending):
            live = under
        under = stand_in_for(signal.SIGTERM, getattr(manager, _JIT_ORIGINAL, None))
        manager = jit_checkpoint_manager(under)
    _JIT_SEEN.update(managers)
    return live, under


class SigtermPolicy:
    """Reference-counted ``SIGTERM → SystemExit(143)`` while held (see the module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.RLock()  # the handler may run while the main thread holds it
        self._anonymous = 0  # holders that keep their own count (`held`)
        self._holders: dict[int, object] = {}  # id → holder, for `acquire(holder)`
        self._installed = False
        # JIT managers that put ours back (`_lend`): id -> (the manager, the manager of the
        # handler it had recorded, or None for the default)
        self._lent: dict[int, tuple[weakref.ref[object], weakref.ref[object] | None]] = {}
        self._set_aside: weakref.ref[object] | None = None  # a JIT handler ours replaced
        self._pid = os.getpid()  # the process whose handlers these are
        self._fired = False
        self._cause: BaseException | None = None
        self._interrupt_sent = False
        self._cooperating: list[Callable[[int, types.FrameType | None], object]] = []

    @property
    def _users(self) -> int:
        return self._anonymous + len(self._holders)

    def holds(self, holder: object) -> bool:
        """Whether ``holder`` holds the policy (`acquire` with it, not released yet)."""
        return id(holder) in self._holders

    @property
    def active(self) -> bool:
        """Whether our handler is installed now (False when the program's own one is kept)."""
        return self._installed and signal.getsignal(signal.SIGTERM) == self.handle

    @property
    def fired(self) -> bool:
        """Whether a SIGTERM was turned into ``SystemExit`` since the first holder acquired."""
        return self._fired

    @outside_tracers_lock
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
            # Released off the main thread, so the handler could not be removed: be what it
            # would have given back (a set-aside JIT handler whose Trainer is yet to train),
            # else the default.
            due = self._due(self._set_aside) if os.getpid() == self._pid else signal.SIG_DFL
            self._set_aside, self._lent = None, {}
            signal.signal(signum, due)
            pass_to(due, signum, _frame)
            return
        if self._fired:
            log.warning("SIGTERM received again while tearing down; ignored")
            return
        self._fired = True
        name, _, taken = signal_name(signum).partition(", ")
        log.warning("%s received%s: exiting so that the vLLM server is stopped first",
                    name, f" ({taken})" if taken else "")  # fmt: skip
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

    def went_on(self) -> None:
        """The program went on after a firing's exit was caught: a SIGTERM fires again.

        Fire once holds while the firing's exit unwinds the teardown, which
        cannot always be told from a program that caught it and went on; a
        new training (`verirl.preemption.PreemptionCallback`'s start) can: the
        policy is armed again, for SIGTERM and for the watchdog's interrupt.
        Only from the main thread with no exception being handled there: a
        training started in another thread, or from a ``finally`` or an
        ``except`` of the teardown, says nothing of the main thread's exit.
        """
        if threading.current_thread() is not threading.main_thread() or sys.exc_info()[1]:
            return
        with self._lock:
            self._fired = False

    def acquire(self, holder: object = None) -> bool:
        """Count a holder and install the handler if SIGTERM has the default. True if counted.

        With ``holder``, the count is that object's, made in one store and
        undone by ``release(holder)`` (a no-op when it holds nothing): a caller
        interrupted between this call and noting its result still releases
        exactly what it holds. Without, the caller keeps the count itself.
        """
        if threading.current_thread() is not threading.main_thread():
            log.debug("not in the main thread: SIGTERM is left as it is")
            return False
        with self._lock:
            if holder is not None and self.holds(holder):
                return True
            first = self._users == 0
            # Counted before anything is installed, and marked installed before it is: a
            # Ctrl-C between any two steps leaves what `release` undoes.
            if holder is None:
                self._anonymous += 1
            else:
                self._holders[id(holder)] = holder
            if first and not self._install():
                self.release(holder)
                return False
        return True

    def _install(self) -> bool:
        """The first holder's: our handler over the default; False where none can be set.

        Over transformers' JIT-checkpoint handlers too, which the default is
        under (a Trainer built before this holder): the policy wins while it
        is held. The handler set aside, and what each JIT manager puts back
        when its training ends (`_lend`), are given back at the last release
        while its Trainer is yet to train.
        """
        current = signal.getsignal(signal.SIGTERM)
        self._installed = False
        self._fired = False
        self._cause = None
        self._interrupt_sent = False
        self._pid = os.getpid()
        _, under = jit_chain(current)
        if current == self.handle:
            self._installed = True
        elif under in (signal.SIG_DFL, self.handle):  # the default under whatever is there
            top = jit_checkpoint_manager(stand_in_for(signal.SIGTERM, current))
            self._set_aside = None if top is None else weakref.ref(top)
            self._installed = True
            try:
                signal.signal(signal.SIGTERM, self.handle)
            except ValueError:  # not the main interpreter
                self._installed = False
                return False
        else:
            log.debug("SIGTERM already has a handler (%r); leaving it", current)
        if self._installed:
            self._lend()
        return True

    def _lend(self) -> None:
        """Ours as what each JIT manager puts back when its training ends, while held.

        transformers' callback puts back the handler it found as its Trainer
        was built, also inside a held block. Where the default is under it,
        ours goes there instead; what was there is noted, for `release`. A
        program's own handler under it stays what is put back.
        """
        for manager in list(_JIT_SEEN):
            original = getattr(manager, _JIT_ORIGINAL, None)
            lent = self._lent.get(id(manager))
            if original == self.handle and lent is not None and lent[0]() is manager:
                continue  # lent already
            _, under = jit_chain(original)
            if under not in (signal.SIG_DFL, self.handle):
                continue
            older = jit_checkpoint_manager(stand_in_for(signal.SIGTERM, original))
            setattr(manager, _JIT_ORIGINAL, self.handle)
            self._lent[id(manager)] = (
                weakref.ref(manager),
                None if older is None else weakref.ref(older),
            )

    def _due(self, manager_ref: weakref.ref[object] | None) -> _Handler | signal.Handlers:
        """What SIGTERM should have once released, from ``manager_ref`` down its chain.

        The handler of the first Trainer still to train, else the default.
        """
        manager = None if manager_ref is None else manager_ref()
        seen: set[int] = set()
        while manager is not None and id(manager) not in seen:
            seen.add(id(manager))
            if not jit_trained(manager):
                return cast("_Handler", getattr(manager, _JIT_HANDLER))
            entry = self._lent.get(id(manager))
            older = entry[1] if entry is not None and entry[0]() is manager else None
            manager = None if older is None else older()
        return signal.SIG_DFL

    def reclaim(self, *, ending: bool = True) -> None:
        """After a training ended (from the main thread): held, SIGTERM is ours again.

        `verirl.preemption.PreemptionCallback` calls it as it gives SIGTERM
        back: a JIT checkpoint's callback may have put back the default, a
        trained Trainer's handler or one verirl left in place, none of which
        exits while a server or a runtime is held. A live JIT handler and a
        program's own handler are left. ``ending``: the training on the
        stack is ending, its handler spent (`jit_trained`).
        """
        if threading.current_thread() is not threading.main_thread():
            return
        with self._lock:
            current = signal.getsignal(signal.SIGTERM)
            if not self._users or current == self.handle:
                return
            live, under = jit_chain(current, ending=ending)
            if live is not None or under not in (signal.SIG_DFL, self.handle):
                return
            with contextlib.suppress(ValueError):  # not the main interpreter
                signal.signal(signal.SIGTERM, self.handle)
                self._installed = True
                self._lend()

    def release(self, holder: object = None) -> None:
        """Uncount a holder; after the last one, put the default back if ours is still there.

        ``holder``: the one given to `acquire`; nothing happens when it holds nothing.
        """
        with self._lock:
            if holder is None:
                self._anonymous = max(self._anonymous - 1, 0)
            elif self._holders.pop(id(holder), None) is None:
                return
            if self._users or not self._installed:
                return
            for ref, older in list(self._lent.values()):  # what each put back before ours
                manager = ref()
                if manager is not None and getattr(manager, _JIT_ORIGINAL, None) == self.handle:
                    setattr(manager, _JIT_ORIGINAL, self._due(older))
            if threading.current_thread() is not threading.main_thread():
                return  # ours stays, and acts as what it would give back (`handle`)
            due = self._due(self._set_aside)
            self._set_aside, self._lent = None, {}
            current = signal.getsignal(signal.SIGTERM)
            if current == self.handle or self._stale_jit(current):
                signal.signal(signal.SIGTERM, due)
                self._installed = False

    def _stale_jit(self, handler: object) -> bool:
        """Whether ``handler`` is a trained Trainer's JIT handler over the default (or ours)."""
        if jit_checkpoint_manager(handler) is None:
            return False
        live, under = jit_chain(handler)
        return live is None and under in (signal.SIG_DFL, self.handle)

    @contextlib.contextmanager
    def held(self) -> Iterator[bool]:
        """Hold the policy for a ``with`` block; yields whether this holder was counted."""
        token = object()
        try:
            yield self.acquire(token)
        finally:
            self.release(token)

    def reset_after_fork(self) -> None:
        """A forked child holds nothing; its copy of the handler acts as the default.

        Nothing set aside or lent in the parent is the child's to give back:
        a pool worker forked during training must end on SIGTERM.
        """
        self._lock = threading.RLock()  # the handler may run while the main thread holds it
        self._anonymous = 0
        self._holders = {}
        self._fired = False
        self._cause = None
        self._interrupt_sent = False
        self._set_aside = None
        self._lent = {}
        self._cooperating = []  # the parent's trainings' handlers: none trains here
        _JIT_SEEN.clear()


SIGTERM_POLICY = SigtermPolicy()
"""The process-wide policy every verirl component uses."""


_LEFT_IN_PLACE: dict[int, tuple[object, object]] = {}
_Disposition = TypeVar("_Disposition")


def leave_in_place(signum: int, handler: object, previous: object) -> None:
    """Note that verirl's ``handler`` stays on ``signum`` past its owner, in ``previous``'s stead.

    `verirl.preemption.PreemptionCallback` leaves its SIGTERM handler (which
    ignores a further SIGTERM) while its ``SystemExit(143)`` ends the process.
    A program that catches the exit and goes on must not be left with it: the
    next holder (the policy, a newer callback) takes ``previous`` for what it
    finds (`stand_in_for`).
    """
    _LEFT_IN_PLACE[signum] = (handler, previous)


def stand_in_for(signum: int, current: _Disposition) -> _Disposition:
    """What ``current`` stands for on ``signum``: ``previous`` if left in place, else itself."""
    left = _LEFT_IN_PLACE.get(signum)
    if left is not None and left[0] == current:
        return cast("_Disposition", left[1])
    return current


def exit_on_sigterm() -> contextlib.AbstractContextManager[bool]:
    """Hold `SIGTERM_POLICY` for a ``with`` block; yields whether this holder was counted."""
    return SIGTERM_POLICY.held()


_PROGRAM_RECEIVED: list[int] = []


@outside_tracers_lock
def program_handler(signum: int, _frame: types.FrameType | None) -> None:
    """The ``verirl`` program's own SIGTERM handler (`verirl.__main__`): exit ``128 + signum``.

    It also notes the signal (`program_received`): ``compile()``, run by an
    import with no cached bytecode (``PYTHONDONTWRITEBYTECODE``), can swallow
    the ``SystemExit`` a handler raises, and the exit code must not depend on that;
    nor may the command run on: until the exit is seen to arrive, the main
    thread's next wait raises it again (`raise_if_dropped`).
    """
    _PROGRAM_RECEIVED.append(signum)
    signal_name(signum)
    _UNARRIVED[:] = [signum]
    raise SystemExit(128 + signum)


@outside_tracers_lock
def program_interrupt(signum: int, frame: types.FrameType | None) -> None:
    """The ``verirl`` program's Ctrl-C handler: Python's own ``KeyboardInterrupt``.

    Unless it lands in the trace function's own lock, where the exception
    would leave that lock held (`in_tracers_lock`): it is handled a moment later.
    """
    signal.default_int_handler(signum, frame)


def in_tracers_lock(frame: types.FrameType | None, tracer: object = None) -> bool:
    """Whether ``frame`` is the trace function's own lock (coverage's ``lock_data``).

    A handler's exception raised there leaves that lock held (the tracer
    calls it from C, with no ``finally``), and the next traced call in any
    thread waits for it forever: a ``verirl serve`` under coverage hung so
    after "SIGTERM received". The signal is then handled a moment later.
    ``tracer``: the trace function (default: this thread's, ``sys.gettrace()``).
    """
    if frame is None:
        return False
    if frame.f_code.co_name in _LOCKS and frame.f_code.co_filename.endswith(_COLLECTOR):
        return True  # coverage's own, whatever its core: its C, Python or sys.monitoring tracer
    tracer = sys.gettrace() if tracer is None else tracer
    for owner in (tracer, getattr(tracer, "__self__", None)):  # a tracer, or its bound method
        for name in _LOCKS:
            method = getattr(owner, name, None)
            code = getattr(getattr(method, "__func__", None), "__code__", None)
            if code is not None and frame.f_code is code:
                return True
    return False


_LOCKS = ("lock_data", "unlock_data")
_COLLECTOR = os.path.join("coverage", "collector.py")  # noqa: PTH118 - a suffix, not a path


HANDLE_LATER_AFTER = 0.01
"""Seconds after which a signal that could not be handled where it landed is sent again."""


def handle_later(signum: int) -> None:
    """Send ``signum`` to this process again in `HANDLE_LATER_AFTER` s, from a daemon thread.

    Only if its handler then is the one now or another of verirl's (launch's
    grace swaps them): one put back meanwhile (the default, as a ``with``
    block ended) or a program's own must not get it.
    """
    timer = threading.Timer(
        HANDLE_LATER_AFTER, _send_again, args=(signum, signal.getsignal(signum))
    )
    timer.daemon = True
    with contextlib.suppress(RuntimeError):  # the exit began (3.12+: no thread starts): it ends
        timer.start()


def _send_again(signum: int, handler: object) -> None:
    now = signal.getsignal(signum)
    if now != handler and not is_verirl_handler(now) and _code_of(now) not in _QUIET:
        # the default back, or a program's own
        log.debug("signal %d's handler changed before it was handled: not sent again", signum)
        return
    os.kill(os.getpid(), signum)


_QUIET: set[types.CodeType] = set()
"""The code of verirl's handlers that only note a signal (`notes_only`): a signal put off
(`handle_later`) is sent again to them too, to be noted, never dropped."""


def notes_only(handler: _Raising) -> _Raising:
    """Mark ``handler`` as one of verirl's that notes its signal and raises nothing.

    A signal put off for a moment (`handle_later`) is sent again when such a
    handler has taken over meanwhile (the CLI's once its command returned, a
    whole write's holding one): it is noted there, not lost.
    """
    _QUIET.add(cast("types.FunctionType", handler).__code__)
    return handler


def is_verirl_handler(handler: object) -> bool:
    """Whether ``handler`` is one of verirl's own (`outside_tracers_lock`'s), never a program's.

    A function or a method.
    """
    return _code_of(handler) in _GUARDS


def _code_of(handler: object) -> types.CodeType | None:
    """The code a handler (a function or a method) runs; ``None`` for another callable."""
    return getattr(getattr(handler, "__func__", handler), "__code__", None)


_UNARRIVED: list[int] = []
"""The signal `program_handler` raised for, until its exit is seen to reach the main thread.

Seen: a wait raised it again (`raise_if_lost`), the run's document says so
(`verirl._cli_document.write_document`), or the program caught it
(`program_exit_arrived`).
"""


def program_exit_arrived() -> None:
    """The program caught its signal's exit (or is past caring): no wait raises it again."""
    _UNARRIVED.clear()


def sigterm_lost() -> int | None:
    """The exit code of a SIGTERM whose ``SystemExit`` never reached the main thread, else None.

    `program_handler` raised it while verirl imported or a command ran, and
    something swallowed it (``compile()``, a finalizer, import machinery): the
    command would run to its end and then exit 143 anyway. ``None`` off the
    main thread, and while a ``SystemExit`` of that code unwinds the main
    thread (a ``finally`` or ``__exit__`` on its way out: the exit is on its way).
    """
    if not _UNARRIVED or threading.current_thread() is not threading.main_thread():
        return None
    code = 128 + _UNARRIVED[0]
    return None if _unwinding(code) else code


def _unwinding(code: int) -> bool:
    """Whether a ``SystemExit(code)`` is being handled in this thread, or caused the one that is."""
    return any(
        isinstance(error, SystemExit) and error.code == code
        for error in exception_chain(sys.exc_info()[1])
    )


def raise_if_lost() -> None:
    """Raise the exit of a SIGTERM whose ``SystemExit`` was lost (`sigterm_lost`), once."""
    code = sigterm_lost()
    if code is not None:
        _UNARRIVED.clear()
        raise SystemExit(code)


@notes_only
def program_note(signum: int, _frame: types.FrameType | None) -> None:
    """`program_handler` once the command has returned: note the signal, raise nothing.

    The program is already on its way out; a ``SystemExit`` now would only cut
    short the last teardown and print a traceback from an exit hook.
    """
    _PROGRAM_RECEIVED.append(signum)
    signal_name(signum)  # a hang-up now is named as one in what the exit says


def program_received() -> int | None:
    """The first signal `program_handler` received, or ``None``."""
    return _PROGRAM_RECEIVED[0] if _PROGRAM_RECEIVED else None


_DROPPED: list[SystemExit] = []
_NOTED = "_verirl_noted"


def mark_noted(error: BaseException) -> None:
    """Mark a signal's exception as taken in by a wait that watches for it (launch's grace).

    Should Python drop it, the unraisable hook neither keeps it nor sends the
    signal again: it has had its one effect.
    """
    setattr(error, _NOTED, True)


def noted(error: BaseException) -> bool:
    """Whether `mark_noted` marked ``error``."""
    return bool(getattr(error, _NOTED, False))


def note_dropped(error: SystemExit) -> None:
    """Keep a SIGTERM's ``SystemExit`` that Python dropped, for `raise_if_dropped` to raise.

    A handler runs between any two bytecodes, also in a ``__del__`` or a
    weakref callback, where its exception is printed and dropped
    (``verirl.__main__``'s unraisable hook calls this then). The policy has
    fired: a second SIGTERM would not raise again, so the waits raise this one.
    """
    _DROPPED[:] = [error]


def raise_if_dropped() -> None:
    """In the main thread, raise a SIGTERM's exit that never arrived there, once; else nothing.

    The ``SystemExit`` Python dropped (`note_dropped`), or that of a SIGTERM
    `program_handler` received whose exception was swallowed (`raise_if_lost`).
    Each wait of the main thread that wakes to let a handler run
    (`verirl._phases.SIGNAL_CHECK`, `verirl._poll.poll`) calls this, and
    ``python -m verirl`` before the command starts: a command never runs to its
    end (wait-env its whole ``--timeout``) after a SIGTERM. Off the main thread
    (a start-up phase's poll), nothing: the main thread's own waits raise it.
    """
    if threading.current_thread() is not threading.main_thread():
        return
    if _DROPPED:
        _UNARRIVED.clear()  # the exit raised now is the one it stands for
        raise _DROPPED.pop()
    raise_if_lost()


def sigterm_pending() -> bool:
    """Whether a SIGTERM came, to the held policy or to `program_handler` (its exit may be lost)."""
    return SIGTERM_POLICY.fired or bool(_PROGRAM_RECEIVED)


EXIT_GRACE = 2.0
"""Seconds after which the process ends once its main thread has ended after a signal.

The threads still running get all but its last `LAST_WORDS_WAIT` seconds (1.5 s):
those are the deadline's own, to say why it ends the process.

Python joins every non-daemon thread before it exits: a ``ThreadPoolExecutor``'s
workers (a Hub download's, huggingface_hub's own) would hold a preempted
process until their download ends, past the platform's grace and into its
SIGKILL. After `arm_exit_deadline`, the process ends this long after its main
thread did, whatever still runs."""


class _ExitDeadline:
    """One daemon thread: once the interpreter starts to exit, wait `EXIT_GRACE`, then end it.

    "Starts to exit" is the first of `threading`'s exit hooks, which run before
    it joins any thread: ours is registered after ``concurrent.futures``' (that
    joins its pools' workers), so it runs first.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._exiting = threading.Event()
        self._code = 0
        self._signum: int | None = None
        self._grace = EXIT_GRACE
        self._speak = threading.Event()  # the words' thread says them once this is set
        self._said = threading.Event()
        self._said_after = 0.0

    def arm(self, *, code: int = 0, signum: int | None = None, grace: float = EXIT_GRACE) -> None:
        """Arm it (the code and signal: the last call's), before the exit begins.

        From Python 3.12 on no thread can be started once it began: then this
        only warns that it cannot be armed.
        """
        with self._lock:
            self._code, self._signum, self._grace = code, signum, grace
            if self._thread is not None:
                return
            with contextlib.suppress(RuntimeError):  # exiting (its import adds a hook): no pool
                import concurrent.futures.thread  # noqa: F401, PLC0415 - its exit hook first
            register = getattr(threading, "_register_atexit", None)
            if register is None:  # pragma: no cover - every supported Python has it
                return
            try:
                register(self._exiting.set)
            except RuntimeError:  # already exiting: no hook can be added
                self._exiting.set()
            # Both started now: from 3.12 on, no thread can be started once the exit began.
            words = threading.Thread(target=self._say, name="verirl-exit-words", daemon=True)
            deadline = threading.Thread(target=self._run, name="verirl-exit-deadline", daemon=True)
            try:
                words.start()
                deadline.start()
            except RuntimeError as exc:
                log.warning("the exit deadline cannot be armed now (%s)", exc)
                return
            self._thread = deadline

    def _say(self) -> None:
        self._speak.wait()
        try:
            _last_words(self._said_after)
        finally:
            self._said.set()

    def _run(self) -> None:
        self._exiting.wait()
        with self._lock:
            grace = self._grace
        # The process normally exits meanwhile, this thread with it. The last words may block
        # (a stderr whose reader stopped reading; logging's handler lock, held by the main
        # thread's exit): said from a thread of their own, awaited within the grace only.
        waited = max(grace - LAST_WORDS_WAIT, 0.0)
        threading.Event().wait(waited)
        with self._lock:
            code, signum = self._code, self._signum
        self._said_after = waited
        self._speak.set()
        self._said.wait(grace - waited)  # the words, within the grace (a write may block)
        if signum is not None and _default_disposition(signum):
            os.kill(os.getpid(), signum)  # die of it, as Python does after a KeyboardInterrupt
        os._exit(code)

    def reset_after_fork(self) -> None:
        self._lock = threading.Lock()
        self._thread = None
        self._exiting = threading.Event()
        self._speak = threading.Event()
        self._said = threading.Event()


LAST_WORDS_WAIT = 0.5
"""Seconds of the exit's grace left for its warning and the streams' flush (`_ExitDeadline`)."""


def _last_words(grace: float) -> None:
    """The exit deadline's warning, and what stdout and stderr still buffer, written."""
    log.warning(
        "still running %gs after the main thread ended on a signal (threads: %s): "
        "exiting without waiting for them",
        grace,
        ", ".join(thread.name for thread in threading.enumerate()),
    )
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError, AttributeError):  # closed or replaced
            stream.flush()


def _default_disposition(signum: int) -> bool:
    """Put ``signum`` back to its default from any thread; False where that cannot be done.

    libc's ``signal``: Python's refuses to run off the main thread.
    """
    import ctypes  # noqa: PLC0415 - only on the way out

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.signal.argtypes = [ctypes.c_int, ctypes.c_void_p]
        libc.signal.restype = ctypes.c_void_p
    except (OSError, AttributeError):
        return False
    failed = ctypes.c_void_p(-1).value  # SIG_ERR
    return bool(libc.signal(signum, None) != failed)  # None: SIG_DFL, 0


_EXIT_DEADLINE = _ExitDeadline()


def arm_exit_deadline(error: BaseException | int, *, grace: float = EXIT_GRACE) -> None:
    """End the process `EXIT_GRACE` seconds after its main thread ends, whatever threads remain.

    For a process unwinding on a signal (``error`` is its ``SystemExit`` or
    ``KeyboardInterrupt``, or the exit status): an exit code of ``SystemExit``
    is kept, a ``KeyboardInterrupt`` ends by SIGINT as Python's own exit does.
    The last call wins. A main thread that goes on (the exception was caught)
    is never cut short: nothing happens until it ends.
    """
    if isinstance(error, KeyboardInterrupt):
        _EXIT_DEADLINE.arm(code=130, signum=signal.SIGINT, grace=grace)
    elif isinstance(error, SystemExit):
        code = error.code
        status = code if isinstance(code, int) else (0 if code is None else 1)
        _EXIT_DEADLINE.arm(code=status, grace=grace)
    elif isinstance(error, int):
        _EXIT_DEADLINE.arm(code=error, grace=grace)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=SIGTERM_POLICY.reset_after_fork)
    os.register_at_fork(after_in_child=_EXIT_DEADLINE.reset_after_fork)


def raise_interruption_behind(error: BaseException) -> None:
    """Raise the interruption ``error`` stands for, if it is CPython 3.10's lock error.

    On 3.10, a signal handler that raises (Ctrl-C's ``KeyboardInterrupt``,
    the SIGTERM policy's ``SystemExit(143)``) inside ``Condition.wait``'s
    Python ``_acquire_restore`` (``Thread.start``, ``Event.wait``) leaves the
    lock released; the ``with`` around it then raises ``RuntimeError('release
    unlocked lock')`` in the interruption's place, and the program exits 1
    with a traceback instead of 143 or Ctrl-C's code. Otherwise: nothing. The
    interruption keeps what it was raised during (a first signal's exit).
    """
    interruption = error.__context__
    if (
        type(error) is RuntimeError
        and str(error) == "release unlocked lock"
        and isinstance(interruption, (KeyboardInterrupt, SystemExit))
    ):
        context = interruption.__context__
        try:
            raise interruption
        finally:
            interruption.__context__ = context  # raised in ``error``'s handling: it took that


def exception_chain(
    error: BaseException | None, *, until: BaseException | None = None
) -> Iterator[BaseException]:
    """``error`` and the exceptions it was raised during or from, newest first.

    As a traceback shows them: ``raise ... from e`` leads to ``e``; what
    ``raise ... from None`` set aside is not followed. Each once (a cycle
    ends the walk), and the walk stops before ``until`` (the exception the
    program is handling, say). Every walk of a signal's exceptions goes so.
    """
    seen: set[int] = set()
    while error is not None and error is not until and id(error) not in seen:
        seen.add(id(error))
        yield error
        if error.__cause__ is not None:
            error = error.__cause__
        elif error.__suppress_context__:
            return
        else:
            error = error.__context__


def signal_of(error: BaseException) -> int | None:
    """The signal ``error`` is the exception of: SIGINT, SIGTERM, or None.

    A ``KeyboardInterrupt()`` without arguments is a Ctrl-C (Python's
    handler raises it so); ``SystemExit(143)`` is SIGTERM's, the only exit
    verirl's handlers raise (a hang-up, or one of `TERMINATING`, is handed
    on to SIGTERM's handler). A program's own is no signal: ``sys.exit(1)``,
    ``sys.exit(138)`` in its SIGUSR1 handler, ``raise KeyboardInterrupt("...")``.
    """
    if isinstance(error, KeyboardInterrupt):
        return None if error.args else signal.SIGINT
    exiting = isinstance(error, SystemExit) and error.code == 128 + signal.SIGTERM
    return signal.SIGTERM if exiting else None


def interruptions(error: BaseException) -> list[int]:
    """The signals ``error`` and the interruptions it was raised during stand for, oldest first.

    Each of `exception_chain` that is a signal's (`signal_of`). Two signals
    that come together leave two here: the second one's handler raised as
    the first one's exception unwound, and a wait that sees only the newest
    would take the pair for one.
    """
    found = [signal_of(current) for current in exception_chain(error)]
    return [signum for signum in found[::-1] if signum is not None]


def interrupted_twice(error: BaseException | None) -> bool:
    """Whether ``error`` stands for two interruptions: two Ctrl-Cs, or a Ctrl-C and a SIGTERM.

    A block left on them tears down without the grace, as on a second
    Ctrl-C. Counted as `interruptions` finds them, each Ctrl-C, and the
    exits of SIGTERM once (a second SIGTERM raises nothing). A program's own
    exception is no signal: ``sys.exit(1)`` in its ``except
    KeyboardInterrupt``, ``sys.exit(e.code)`` in its ``except SystemExit``
    (the same exit twice), ``raise KeyboardInterrupt("...")``; nor is what
    ``raise ... from None`` set aside. ``raise Aborted(...) from e`` is
    followed to ``e``.
    """
    if error is None:
        return False
    came = interruptions(error)
    return came.count(signal.SIGINT) + (signal.SIGTERM in came) > 1

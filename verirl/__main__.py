"""``python -m verirl`` and the ``verirl`` script: the command line, SIGTERM handled from line one.

SIGTERM exits 143 and Ctrl-C 130 whenever they arrive, also while verirl is
still importing (before `verirl.cli` holds the one SIGTERM policy for serve
and launch) and after a command has torn down: a job stopped at any moment
gets the code its scheduler expects, and with ``--json`` its one document. From
this module's first statements until `run` enters its ``try``, both signals
are only noted, and `run` raises them there. What is left, where a signal
still acts as Python's default (SIGTERM a death by signal, Ctrl-C a
``KeyboardInterrupt`` traceback): the interpreter's own start-up, the import
of the ``verirl`` package itself (its ``__init__``, which imports next to
nothing) and of ``_signal`` (built in); and for the ``verirl`` script, the few
statements between its import of this module and its call of `run` (where
SIGTERM exits 143 but writes no document, and Ctrl-C is a traceback).

Each other signal whose default ends the process (SIGQUIT, SIGUSR1, ...:
`verirl._signals.TERMINATING`) counts as a SIGTERM (143, the teardown, no
vLLM server left), noted as one from this module's first statements like
SIGTERM itself (the real-time ones from `_prepare` on); ``verirl launch``
passes it on to its command instead while that runs.

An inherited ``SIG_IGN`` is left as it is; a handler set by the interpreter's
start-up (coverage's) is set aside, as `verirl.cli` does for serve and launch.
"""

from __future__ import annotations

# First, before any other import: the built-in half of `signal`, which costs nothing to
# import (`signal` itself takes a millisecond or two), and only what notes a signal.
_signal = __import__("_signal")
_NOTED: list[int] = []
"""SIGINT, SIGTERM and SIGHUP as they came before `run` took over; it raises the first one."""


def _note_start_up(signum: int, _frame: object) -> None:
    """SIGINT's, SIGTERM's, SIGHUP's (and `_EARLY`'s) handler while this module imports: noted."""
    _NOTED.append(signum)


_EARLY_NAMES = ("SIGQUIT", "SIGUSR1", "SIGUSR2", "SIGALRM", "SIGVTALRM", "SIGPROF", "SIGXCPU",
                "SIGPWR", "SIGSTKFLT", "SIGIO")  # fmt: skip
_EARLY = tuple(getattr(_signal, name) for name in _EARLY_NAMES if hasattr(_signal, name))
"""The other signals that end a process by default (`verirl._signals.TERMINATING`, the
real-time ones aside; a test holds the two lists to one): a SIGTERM from `_prepare` on, noted
as one until then."""


try:
    _previous = _signal.getsignal(_signal.SIGTERM)  # a start-up's handler (coverage's): set aside
    if _previous == _signal.SIG_DFL or callable(_previous):
        _signal.signal(_signal.SIGTERM, _note_start_up)
    if _signal.getsignal(_signal.SIGINT) is _signal.default_int_handler:  # not nohup's SIG_IGN
        _signal.signal(_signal.SIGINT, _note_start_up)
    if hasattr(_signal, "SIGHUP") and _signal.getsignal(_signal.SIGHUP) == _signal.SIG_DFL:
        _signal.signal(_signal.SIGHUP, _note_start_up)  # a hang-up is a SIGTERM (`_hang_up`)
    if _previous == _signal.SIG_DFL or callable(_previous):  # SIGTERM is ours: so are they
        for _early in _EARLY:
            if _signal.getsignal(_early) == _signal.SIG_DFL:  # an inherited SIG_IGN stays
                _signal.signal(_early, _note_start_up)
except ValueError:  # imported off the main thread: no handler can be set there
    pass

import atexit  # noqa: E402 - after the handlers above
import contextlib  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
from collections.abc import Callable  # noqa: E402
from types import FrameType  # noqa: E402
from typing import Any  # noqa: E402

from verirl._signals import (  # noqa: E402
    SIGTERM_POLICY,
    TERMINATING,
    arm_exit_deadline,
    as_sigterm,
    exception_chain,
    is_verirl_handler,
    note_dropped,
    noted,
    outside_tracers_lock,
    program_exit_arrived,
    program_handler,
    program_interrupt,
    program_note,
    program_received,
    put_back,
    raise_if_dropped,
    replacing,
    signal_of,
    sigterm_pending,
    taken_for_sigterm,
)

__all__ = ["run"]

_CTRL_C = 128 + signal.SIGINT


def _unraisable(default: Callable[[Any], object]) -> Callable[[Any], object]:
    """A ``sys.unraisablehook`` for a signal's exception raised where Python ignores it.

    A handler runs between any two bytecodes, also inside a weakref callback
    or ``__del__``, where its ``SystemExit``/``KeyboardInterrupt`` is printed
    as "Exception ignored" and dropped. SIGTERM's is kept (`note_dropped`),
    and the main thread's next wait raises it: nothing to print. A lost Ctrl-C is
    sent again, to land where it can be raised: from another thread, since a
    signal sent here would be handled, and dropped, in this very hook.
    Two that came at once are one chain (a Ctrl-C raised as SIGTERM's
    exit unwound): each of them is kept or sent again, down to the exception
    the program was handling, which was not dropped. Anything else:
    ``default``.
    """

    def hook(unraisable: Any) -> object:  # noqa: ANN401 - sys.UnraisableHookArgs
        error = unraisable.exc_value
        if not isinstance(error, (KeyboardInterrupt, SystemExit)):
            return default(unraisable)
        live = sys.exc_info()[1]  # what the program handles now: the context, never dropped
        ctrl_c = False
        kept = False
        for exc in reversed(list(exception_chain(error, until=live))):  # oldest first
            came = signal_of(exc)
            if came is None or noted(exc):
                continue  # noted: a wait watching for the signal has it already (launch's grace)
            if isinstance(exc, SystemExit) and sigterm_pending():
                note_dropped(exc)  # the next wait raises it
                kept = True
            elif came == signal.SIGINT:
                ctrl_c = True
        if ctrl_c:
            threading.Thread(target=_ctrl_c_again, name="verirl-ctrl-c-again", daemon=True).start()
            return None  # returns long before the thread's SIGINT comes (_CTRL_C_AGAIN)
        if kept or noted(error):
            return None
        return default(unraisable)

    return hook


_CTRL_C_AGAIN = 0.05
"""Seconds between a dropped Ctrl-C and the SIGINT sent again, time for the hook to return."""


def _ctrl_c_again() -> None:
    """SIGINT to the main thread, `_CTRL_C_AGAIN` s later, sent from another one (`_unraisable`)."""
    threading.Event().wait(_CTRL_C_AGAIN)
    main = threading.main_thread().ident
    with contextlib.suppress(OSError, ValueError):
        if main is not None:
            signal.pthread_kill(main, signal.SIGINT)


def run() -> int:
    """Run `verirl.cli.main` with SIGTERM and Ctrl-C turned into exit codes 143 and 130.

    A closed stdin, stdout or stderr gets ``/dev/null`` first, so that no file
    verirl opens, and no child it starts, takes that descriptor for one of them.
    A signal noted while this module imported is raised first thing, and a
    SIGTERM whose exit verirl's import swallowed before the command starts.
    Once the command has returned, both signals are noted rather than raised
    (the teardown finishes, the code says what came, unless a ``--json``
    document already stated it), and a ``--json`` run a signal ended before
    its document was written still gets one.
    """
    try:  # the first statement: from the module's noting handlers straight into the try
        try:
            _take_over()  # from the noting handlers to the raising ones, and what came meanwhile
            _prepare()
            from verirl.cli import main  # noqa: PLC0415 - after the handler: importing takes time

            raise_if_dropped()  # a SIGTERM whose exit the import swallowed: run no command
            code = main()
        except (KeyboardInterrupt, SystemExit) as error:
            code = _signal_code(error)
        finally:
            _note_signals()
    except (KeyboardInterrupt, SystemExit) as error:  # as the command returned, before the note
        code = _signal_code(error)
        _note_signals()
    process = sys.modules.get("verirl.server.process")
    if process is not None:  # what the exit hook would stop, stopped while signals are noted
        process.stop_all_servers()
    received = program_received()  # its SystemExit may have been swallowed (see the handler)
    stated = _stated()
    if stated is not None:  # the --json document said it: a later signal does not change it
        code = stated
    elif received is not None:
        code = 128 + received
    if code in (_CTRL_C, 128 + signal.SIGTERM):
        from verirl._cli_document import signal_document  # noqa: PLC0415 - imported by now, or quickly

        signal_document(sys.argv[1:], code)
    if received is not None or code == _CTRL_C or SIGTERM_POLICY.fired:
        arm_exit_deadline(code)  # a signal: no thread may hold the exit (a stalled stderr's)
    _EXIT_CODE[:] = [code]
    return code


_OURS = [_signal.getsignal(_signal.SIGTERM) is _note_start_up]
"""Whether SIGTERM is the program's to handle (not an inherited ``SIG_IGN``): `_prepare` decides."""


def _take_over() -> None:
    """Put the program's raising handlers in place of `_note_start_up`; raise a noted signal.

    SIGTERM gets `program_handler` (its ``SystemExit`` says 143 even if it is
    swallowed), Ctrl-C `program_interrupt` (Python's ``KeyboardInterrupt``). A
    SIGTERM noted while this module imported is raised as `program_handler`
    raises it; else a Ctrl-C.
    """
    _raising_handlers(as_sigterm)
    with contextlib.suppress(ValueError):  # off the main thread: nothing was installed
        put_back([(signal.SIGINT, program_interrupt, replacing(signal.default_int_handler))])
    came, _NOTED[:] = _NOTED[:], []
    first = next((signum for signum in came if signum != signal.SIGINT), None)
    if first is not None:  # SIGTERM, or one that counts as it (named as it came)
        with taken_for_sigterm(first):
            program_handler(signal.SIGTERM, None)
    if came:
        raise KeyboardInterrupt


def _raising_handlers(early: Callable[[int, FrameType | None], None] | None = None) -> None:
    """`_note_start_up`, where installed, replaced by `program_handler` and Ctrl-C's default.

    ``early``: the handler of `_EARLY`'s signals in `run` (`as_sigterm`); after
    a mere import (``None``) they get their default back.
    """
    noting = replacing(_note_start_up)
    changes: list[tuple[int, Callable[[int, FrameType | None], object] | int, Any]] = [
        (signal.SIGINT, signal.default_int_handler, noting),
        (signal.SIGTERM, program_handler, noting),
    ]
    if _SIGHUP is not None:
        changes.append((_SIGHUP, _hang_up, noting))
    # ``early``, in run: a SIGTERM; after a mere import, the default. In run, one whose
    # default the script's import put back gets it too: `_prepare`'s rule.
    over = noting if early is None or not _OURS[0] else replacing(_note_start_up, signal.SIG_DFL)
    changes += [(signum, signal.SIG_DFL if early is None else early, over) for signum in _EARLY]
    with contextlib.suppress(ValueError):  # off the main thread: nothing was installed
        put_back(changes)


def _prepare() -> None:
    """Standard descriptors, the last exit hook, SIGTERM and SIGHUP handlers, unraisable hook.

    Each other signal whose default ends the process (`verirl._signals.TERMINATING`:
    SIGQUIT, SIGUSR1, SIGUSR2, SIGALRM, ...) is made a SIGTERM (`as_sigterm`),
    where its disposition is the default and SIGTERM is the program's: every
    command tears down (its vLLM server with it) and exits 143, where it died
    on the spot before. ``verirl launch`` passes them on to its command instead
    while the command runs (`verirl._supervise`).
    """
    from verirl._cli_fds import reserve_standard_fds  # noqa: PLC0415 - inside the try
    from verirl._cli_output import STDERR  # noqa: PLC0415

    reserve_standard_fds()
    STDERR.in_background()  # a reader of stderr that stops reading holds up no command
    atexit.register(_late_signal_exit)  # registered first, so it runs after every later hook
    previous = signal.getsignal(signal.SIGTERM)
    # SIG_IGN was inherited and is meant; a Python-level handler can only have been set by
    # this interpreter's own start-up (coverage's patch, say): the program sets it aside.
    ours = previous == signal.SIG_DFL or callable(previous)
    if ours:
        default = replacing(signal.SIG_DFL)  # an inherited SIG_IGN stays (nohup's SIGHUP)
        put_back(
            [
                (signal.SIGTERM, program_handler, None),
                *(() if _SIGHUP is None else ((_SIGHUP, _hang_up, default),)),
                # SIGQUIT, SIGUSR1, ...: a SIGTERM (launch passes them on)
                *((signum, as_sigterm, default) for signum in TERMINATING),
            ]
        )
    _OURS[:] = [ours]
    sys.unraisablehook = _unraisable(sys.unraisablehook)


@outside_tracers_lock
def _hang_up(signum: int, frame: FrameType | None) -> None:
    """A hang-up (a closed terminal, a dropped ssh) is a SIGTERM: the same teardown, code 143.

    By default it killed the program on the spot: no teardown, and what the
    command started outside its process group ran on. Made as each raising
    handler is (`outside_tracers_lock`): a Ctrl-C that comes inside it waits
    for the SIGTERM it raises.
    """
    as_sigterm(signum, frame)


_EXIT_CODE: list[int] = []
_SIGHUP: int | None = getattr(signal, "SIGHUP", None)
_LATE = tuple(s for s in (signal.SIGINT, signal.SIGTERM, _SIGHUP) if s is not None)
_LATE_AS_SIGTERM = (*(() if _SIGHUP is None else (_SIGHUP,)), *TERMINATING)
"""Those noted at the end as a SIGTERM: a hang-up, and each of `TERMINATING` (`as_sigterm`)."""


def _stated() -> int | None:
    """The exit code the run's final ``--json`` document stated, if one was written."""
    document = sys.modules.get("verirl._cli_document")
    return None if document is None else document.final_code()


def _late_signal_exit() -> None:
    """The last exit hook: a SIGTERM or Ctrl-C that came after `run` returned still sets the code.

    The interpreter's exit (joining threads, other exit hooks) takes time, and
    the signals are only noted by then (a hang-up counts as a SIGTERM). After
    this hook they are ignored, process-wide (and so are those of
    `verirl._signals.TERMINATING` made a SIGTERM, each noted as one): the interpreter resets its
    handlers to the default as it finishes, and a thread still running (a
    daemon's) would otherwise take one and end the process by signal, after
    the ``--json`` document gave another code.
    """
    ours = tuple(s for s in TERMINATING if signal.getsignal(s) is as_sigterm)
    with contextlib.suppress(OSError, ValueError):
        signal.pthread_sigmask(signal.SIG_BLOCK, (*_LATE, *ours))
    pending = signal.sigpending() if hasattr(signal, "sigpending") else set()
    received = program_received()
    late = received
    if late is None:
        late = next((s for s in (*_LATE, *ours) if s in pending), None)
    if late is not None and late in _LATE_AS_SIGTERM:
        late = signal.SIGTERM
    for signum in (*_LATE, *ours):
        with contextlib.suppress(OSError, ValueError):
            signal.signal(signum, signal.SIG_IGN)
    if late is None or not _EXIT_CODE or _EXIT_CODE[0] == 128 + late or _stated() is not None:
        return
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError, AttributeError):
            stream.flush()
    os._exit(128 + late)


def _signal_code(error: KeyboardInterrupt | SystemExit) -> int:
    """The exit code of a signal's exception; any other ``SystemExit`` (argparse's) goes on."""
    if isinstance(error, KeyboardInterrupt):
        return _CTRL_C
    received = program_received()  # the handler's, while importing or parsing
    if received is None:  # help, version, a usage error: argparse's own exit
        raise error
    return 128 + received


def _note_signals() -> None:
    """From here on a SIGTERM (when it is ours) and a Ctrl-C are noted, never raised.

    The teardown must finish; a ``KeyboardInterrupt`` now would escape `run`
    and end the process by SIGINT instead of with exit code 130. An ignored
    SIGINT (``nohup``) stays ignored. A SIGTERM's exit that never arrived is
    past raising: the exit code says it.
    """
    # A verirl handler left on SIGINT by a teardown a signal cut short (3.10 can skip a with's
    # cleanup) is no program's: it goes too.
    sigint_ours = replacing(signal.default_int_handler, _note_start_up, program_interrupt)
    put_back(
        [
            *(((signal.SIGTERM, program_note, None),) if _OURS[0] else ()),
            (signal.SIGINT, program_note, lambda now: sigint_ours(now) or is_verirl_handler(now)),
        ]
    )
    program_exit_arrived()


if __name__ == "__main__":  # python -m verirl: the noting handlers stay until run's try
    sys.exit(run())
# Imported (by the ``verirl`` script, or a test): the import is over, and signals are raised
# again, as the program raises them; `run` raises those noted meanwhile.
_raising_handlers()

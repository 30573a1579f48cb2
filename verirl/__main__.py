"""``python -m verirl`` and the ``verirl`` script: the command line, SIGTERM handled from line one.

SIGTERM exits 143 and Ctrl-C 130 whenever they arrive, also while verirl is
still importing (before `verirl.cli` holds the one SIGTERM policy for serve
and launch) and after a command has torn down: a job stopped at any moment
gets the code its scheduler expects (only a SIGTERM during the interpreter's
own start-up, before this module runs, is still a death by signal). An
inherited ``SIG_IGN`` is left as it is; a handler set by the interpreter's
start-up (coverage's) is set aside, as `verirl.cli` does for serve and launch.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable
from typing import Any

from verirl._signals import (
    arm_exit_deadline,
    program_handler,
    program_note,
    program_received,
    sigterm_pending,
)

__all__ = ["run"]

_CTRL_C = 128 + signal.SIGINT


def _unraisable(default: Callable[[Any], object]) -> Callable[[Any], object]:
    """A ``sys.unraisablehook`` for a signal's exception raised where Python ignores it.

    A handler runs between any two bytecodes, also inside a weakref callback
    or ``__del__``, where its ``SystemExit``/``KeyboardInterrupt`` is printed
    as "Exception ignored" and dropped. SIGTERM was noted (`sigterm_pending`),
    and serve and launch act on the note: nothing to print. A lost Ctrl-C is
    sent again, to land where it can be raised. Anything else: ``default``.
    """

    def hook(unraisable: Any) -> object:  # noqa: ANN401 - sys.UnraisableHookArgs
        error = unraisable.exc_value
        if isinstance(error, SystemExit) and sigterm_pending():
            return None
        if isinstance(error, KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)
            return None
        return default(unraisable)

    return hook


def run() -> int:
    """Run `verirl.cli.main` with SIGTERM and Ctrl-C turned into exit codes 143 and 130.

    A closed stdin, stdout or stderr gets ``/dev/null`` first, so that no file
    verirl opens, and no child it starts, takes that descriptor for one of them.
    """
    from verirl._cli_output import reserve_standard_fds  # noqa: PLC0415 - the standard library only

    reserve_standard_fds()
    previous = signal.getsignal(signal.SIGTERM)
    # SIG_IGN was inherited and is meant; a Python-level handler can only have been set by
    # this interpreter's own start-up (coverage's patch, say): the program sets it aside.
    ours = previous == signal.SIG_DFL or callable(previous)
    if ours:
        signal.signal(signal.SIGTERM, program_handler)
    sys.unraisablehook = _unraisable(sys.unraisablehook)
    try:
        from verirl.cli import main  # noqa: PLC0415 - after the handler: importing takes time

        code = main()
    except KeyboardInterrupt:
        code = _CTRL_C
    finally:
        if ours:  # from here on a SIGTERM is noted, never raised: the teardown must finish
            signal.signal(signal.SIGTERM, program_note)
    process = sys.modules.get("verirl._process")
    if process is not None:  # what the exit hook would stop, stopped while signals are noted
        process.stop_all_servers()
    received = program_received()  # its SystemExit may have been swallowed (see the handler)
    code = code if received is None else 128 + received
    if received is not None or code == _CTRL_C:  # a signal: no pool's thread may hold the exit
        arm_exit_deadline(code)
    return code


if __name__ == "__main__":
    sys.exit(run())

"""``python -m verirl`` and the ``verirl`` script: the command line, SIGTERM handled from line one.

SIGTERM exits 143 and Ctrl-C 130 whenever they arrive, also while verirl is
still importing (before `verirl.cli` holds the one SIGTERM policy for serve
and launch) and after a command has torn down: a job stopped at any moment
gets the code its scheduler expects (only a SIGTERM during the interpreter's
own start-up, before this module runs, is still a death by signal). A SIGTERM
handler or ``SIG_IGN`` inherited from the parent is left as it is.
"""

from __future__ import annotations

import signal
import sys

from verirl._signals import program_handler, program_note, program_received

__all__ = ["run"]


def run() -> int:
    """Run `verirl.cli.main` with SIGTERM and Ctrl-C turned into exit codes 143 and 130."""
    ours = signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    if ours:
        signal.signal(signal.SIGTERM, program_handler)
    try:
        from verirl.cli import main  # noqa: PLC0415 - after the handler: importing takes time

        code = main()
    except KeyboardInterrupt:
        code = 130
    finally:
        if ours:  # from here on a SIGTERM is noted, never raised: the teardown must finish
            signal.signal(signal.SIGTERM, program_note)
    process = sys.modules.get("verirl._process")
    if process is not None:  # what the exit hook would stop, stopped while signals are noted
        process.stop_all_servers()
    received = program_received()  # its SystemExit may have been swallowed (see the handler)
    return code if received is None else 128 + received


if __name__ == "__main__":
    sys.exit(run())

"""`main`: parse, run the command, map its outcome to an exit code, print once."""

from __future__ import annotations

import contextlib
import logging
import sys
from collections.abc import Sequence

from verirl._cli_document import decide_json
from verirl._cli_fds import abandoned_pipes_to_devnull, stdout_to_stderr
from verirl.cli.argv import _parse, _warn_repeated
from verirl.cli.codes import EXIT_ERROR, _exit_code
from verirl.cli.commands import _owning_sigterm
from verirl.cli.flags import read_setting_flags
from verirl.cli.output import (
    _configure_logging,
    _emit_json,
    _error_document,
    _final_document,
    _signal_said,
)
from verirl.cli.parser import build_parser
from verirl.cli.words import _in_cli_words, _InUserWords
from verirl.errors import VeriRLError

__all__ = ["main"]

log = logging.getLogger("verirl")


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the process exit code.

    ``--help``, ``--version`` and a usage error raise `SystemExit` (as argparse
    does) after printing. With ``--json``, stdout carries exactly one JSON
    document on every path: the command's result, or
    ``{"error": {"code": N, "message": M}}`` (``launch``: ``{"exit_code": N}``,
    with the error when N is not 0, and its command's stdout sent to stderr).
    """
    parser = build_parser()
    args = _parse(parser, list(sys.argv[1:] if argv is None else argv))
    # -v/-q/--json before the command count as much as after it.
    args.verbose += args.top_verbose
    args.quiet += args.top_quiet
    args.json = args.json or args.top_json
    decide_json(args.json)
    args.json_emitted = False
    restore_logging = _configure_logging(args.verbose - args.quiet)
    _warn_repeated(args)
    in_user_words = _InUserWords(args)
    logging.getLogger("verirl.topology").addFilter(in_user_words)
    message = ""
    try:
        try:
            with contextlib.ExitStack() as stack:
                read_setting_flags(args)
                if args.cmd in ("serve", "launch"):
                    stack.enter_context(_owning_sigterm())
                if args.cmd == "launch":  # the command must not fail on a pipe nobody reads
                    stack.enter_context(abandoned_pipes_to_devnull())
                if args.cmd == "launch" and args.json:  # the command's output is not the document
                    stack.enter_context(stdout_to_stderr())
                code: int = args.func(args)
        except VeriRLError as exc:
            message = _in_cli_words(args, exc)
            log.error("%s", message)  # noqa: TRY400 - the message, not a traceback
            code = _exit_code(exc)
        except KeyboardInterrupt:
            code = 130
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else EXIT_ERROR
        except Exception as exc:
            if args.json:  # a bug: its traceback follows on stderr, the document comes first
                _emit_json(args, _error_document(EXIT_ERROR, f"unexpected {type(exc).__name__}"))
            raise
        message = message or _signal_said(args, code)
        if args.json:
            _final_document(args, code, message or getattr(args, "final_message", ""))
    finally:
        logging.getLogger("verirl.topology").removeFilter(in_user_words)
        restore_logging()
    return code

"""What a command prints: its result or its one ``--json`` document, and its log on stderr.

No credential reaches either (`verirl._secrets`).
"""

from __future__ import annotations

import argparse
import logging
import os
from collections.abc import Callable

from verirl._cli_document import signal_message, write_document
from verirl._cli_output import STDERR, STDOUT
from verirl._fs import escape_bytes
from verirl._hidden import HIDDEN
from verirl._secrets import known_secrets, redact_and_scrub, scrub_all, secrets_in_environ
from verirl.cli.codes import EXIT_OK, SIGNALLED

log = logging.getLogger("verirl")


def _emit(args: argparse.Namespace, data: dict[str, object], text: str) -> None:
    """The command's result on stdout: ``text``, or with ``--json`` the one JSON document.

    With ``--json``, a run prints exactly one document, whatever happens: a
    second one (an error after a result) is not printed (see `main`).
    """
    if args.json:
        _emit_json(args, data)
    else:
        STDOUT.write(_for_stdout(text + "\n"))


def _emit_json(
    args: argparse.Namespace,
    data: dict[str, object],
    *,
    indent: int | None = 2,
    final: bool = True,
) -> None:
    if getattr(args, "json_emitted", False):
        return
    args.json_emitted = True
    write_document(_document_for_stdout(data), indent=indent, final=final)


def _error_document(code: int, message: str) -> dict[str, object]:
    """The ``--json`` document of a run that failed: ``{"error": {"code": N, "message": M}}``."""
    return {"error": {"code": code, "message": _hidden(message)}}


_RUN_SECRETS: list[str] = []
"""This run's secrets a message may quote unnamed (`known_secrets`: ``HF_TOKEN``, ``*_API_KEY``
values, the saved Hub token), read once when the command line starts (`_configure_logging`)."""


def _hidden(text: str) -> str:
    """``text`` as the command line shows it, with what it may quote of a credential hidden.

    Credentials it names (`redact_message`), and this run's secrets
    (`_RUN_SECRETS`: in a URL the user built with one).
    """
    return redact_and_scrub(text, _RUN_SECRETS, HIDDEN)


def _for_stdout(text: str) -> str:
    """``text`` for stdout: this run's secrets (`_RUN_SECRETS`) hidden, nothing else changed.

    Not `_hidden`'s patterns: programs read stdout (``$(verirl resume)``), and
    a path that only looks like ``token=…`` must come out as it is. A saved
    Hub login in a URL the user built with it is hidden here as on stderr.
    """
    return scrub_all(text, _RUN_SECRETS, HIDDEN)


def _document_for_stdout(data: object) -> object:
    """``data`` with `_for_stdout` applied to every text in it, keys included."""
    if isinstance(data, str):
        return _for_stdout(data)
    if isinstance(data, dict):
        return {_document_for_stdout(k): _document_for_stdout(v) for k, v in data.items()}
    if isinstance(data, (list, tuple)):
        return [_document_for_stdout(item) for item in data]
    return data


def _read_run_secrets() -> None:
    """Fill `_RUN_SECRETS` (once a run: before anything is shown)."""
    try:
        _RUN_SECRETS[:] = known_secrets()
    except Exception:  # noqa: BLE001 - reading them must never stop the command line
        _RUN_SECRETS[:] = secrets_in_environ(os.environ)


class _StderrHandler(logging.Handler):
    """Log lines to stderr through `STDERR`: a closed or abandoned stderr fails nothing.

    A credential a line quotes is hidden (`_hidden`), whichever module logged it.
    """

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = _hidden(escape_bytes(self.format(record)))
        except Exception:  # noqa: BLE001 - logging's own contract: never raise from emit
            self.handleError(record)
            return
        STDERR.write(text + "\n")


def _configure_logging(verbosity: int) -> Callable[[], None]:
    """Send verirl's logs to stderr; return a function that undoes it."""
    level = {-1: logging.WARNING, 0: logging.INFO}.get(verbosity, logging.DEBUG)
    if verbosity < -1:
        level = logging.ERROR
    _read_run_secrets()
    handler = _StderrHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger("verirl")
    saved = (root.handlers[:], root.level, root.propagate)
    root.handlers[:] = [handler]
    root.setLevel(level)
    root.propagate = False

    def restore() -> None:
        root.handlers[:], root.level, root.propagate = saved

    return restore


def _final_document(args: argparse.Namespace, code: int, message: str) -> None:
    """The ``--json`` document of a run that printed none yet (`_emit_json` keeps it to one)."""
    if code == EXIT_OK:
        _emit_json(args, {"exit_code": code})
        return
    document = _error_document(code, message or signal_message(code))
    _emit_json(args, {"exit_code": code, **document} if args.cmd == "launch" else document)


def _signal_said(args: argparse.Namespace, code: int) -> str:
    """The line a signal that ended the run is said in on stderr ("" if none: not one).

    serve and launch said what they got and did about it, as they went.
    """
    if code not in SIGNALLED or args.cmd in {"serve", "launch"}:
        return ""
    message = signal_message(code)
    log.error("%s", message)
    return message

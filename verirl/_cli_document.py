"""The run's one ``--json`` document: written whole, once, stating the exit code the run ends with.

``verirl.cli`` writes it for a command; ``python -m verirl`` writes it for a run
that a signal ended before the command could (`signal_document`), and
`wants_json` reads ``--json`` from the raw command line for that case.
"""

from __future__ import annotations

import json
import re
import signal
from collections.abc import Callable, Sequence

from verirl._cli_output import (
    FINISH_AFTER_SIGNAL,
    STDOUT,
    forget_whole_write,
    whole_write_left,
)
from verirl._signals import (
    ending_signal_name,
    program_exit_arrived,
    raise_if_lost,
    sigterm_lost,
)

__all__ = [
    "SIGNAL_MESSAGES",
    "command_word",
    "decide_json",
    "document_written",
    "final_code",
    "json_text",
    "signal_document",
    "signal_message",
    "wants_json",
    "write_document",
]


def json_text(data: object, *, indent: int | None = 2) -> str:
    """One JSON document, keys sorted, ending in a newline."""
    return json.dumps(data, indent=indent, sort_keys=True) + "\n"


_WRITTEN: list[bool] = []


_FINAL: list[int] = []
"""The exit code the final document stated (see `write_document`)."""


def write_document(data: object, *, indent: int | None = 2, final: bool = True) -> None:
    """Write the run's ``--json`` document to stdout and note that it was written.

    A ``final`` document states the run's exit code (`final_code`): a signal
    that comes after it no longer changes that code (`verirl.__main__`).
    ``serve``'s ready document is not final: a signal ends the server after it.

    After a SIGTERM whose ``SystemExit`` never reached the main thread
    (`verirl._signals.sigterm_lost`), the run exits 143 whatever the command
    did: unless ``data`` already is that error's document, the exit is raised
    here instead, before anything is written, so that the run's one document
    (`signal_document`'s) says what its exit code says.
    """
    lost = sigterm_lost()
    if lost is not None:
        if _error_code(data) != lost:
            raise_if_lost()
        program_exit_arrived()  # the document says so: no later wait raises it
    text = json_text(data, indent=indent)
    forget_whole_write()
    try:
        _WRITTEN.append(True)
        if final:
            _FINAL[:] = [_stated_code(data)]
        # A document that reports a signal is written after it: within a bound, like the rest.
        signalled = _stated_code(data) in SIGNAL_MESSAGES
        STDOUT.write(text, whole=True, within=FINISH_AFTER_SIGNAL if signalled else None)
    except BaseException:
        # A signal before the document went out whole (it came before the write began, or the
        # reader took no more within FINISH_AFTER_SIGNAL): the document states nothing.
        left = whole_write_left()
        if left is None or left[1]:
            _FINAL.clear()  # the signal's code is the run's
            if left is None or left[0] == left[1]:  # none of it went: the error document may
                _WRITTEN.clear()
        raise


def _stated_code(data: object) -> int:
    """The exit code a final document states: ``exit_code``, else ``error.code``, else 0."""
    stated = data.get("exit_code") if isinstance(data, dict) else None
    if stated is None:
        stated = _error_code(data)
    return stated if isinstance(stated, int) else 0


def final_code() -> int | None:
    """The exit code the run's final ``--json`` document states; ``None`` before one is written."""
    return _FINAL[0] if _FINAL else None


def _error_code(data: object) -> object:
    """The ``error.code`` of a document, ``None`` if it has none."""
    error = data.get("error") if isinstance(data, dict) else None
    return error.get("code") if isinstance(error, dict) else None


def document_written() -> bool:
    """Whether this process wrote a ``--json`` document (`write_document`)."""
    return bool(_WRITTEN)


_FLAGS = frozenset({"-h", "--help", "-v", "--verbose", "-q", "--quiet", "--json", "--version",
                    "--dedicated"})  # fmt: skip
"""verirl's options that take no value (`wants_json`'s guess when no parser is at hand)."""


def _guess_takes_value(command: str | None, option: str) -> bool:  # noqa: ARG001 - same shape
    return option not in _FLAGS and not re.fullmatch(r"-[vqh]+", option)


def wants_json(
    argv: Sequence[str], *, takes_value: Callable[[str | None, str], bool] | None = None
) -> bool:
    """Whether ``--json`` (or an abbreviation argparse takes) is one of verirl's own options.

    Not an option's value (``--vllm-args --json``), nor a word of launch's
    command (everything from its first word on, or after ``--``).
    ``takes_value(command, option)`` says whether an option of ``command``
    (``None``: before the command) takes a value; without it, every option
    but verirl's few flags is taken to.
    """
    takes = takes_value or _guess_takes_value
    command: str | None = None
    skip = False
    previous = ""
    for arg in argv:
        if skip:
            skip = False
            # argparse takes a word like an option for one, not a value (``--model --json``:
            # "expected one argument"), but after --vllm-args (``_join_dash_values`` joins them).
            if not _READ_AS_OPTION.fullmatch(arg) or previous == "--vllm-args":
                continue
        if arg == "--":
            break
        if arg == "-" or not arg.startswith("-"):
            if command is None:
                command = arg
            elif command == "launch":
                break  # the training command's own words
            continue
        name, equals, _ = arg.partition("=")
        if name.startswith("--j") and "--json".startswith(
            name
        ):  # "--json=1" too: an error, in JSON
            return True
        skip = not equals and takes(command, name)
        previous = name
    return False


# A word argparse reads as an option wherever it stands: a dash, then no negative number and
# no space (argparse's own rules for an unknown "-x"; verirl has no negative-number options).
_READ_AS_OPTION = re.compile(r"-(?!\d+$|\d*\.\d+$)[^ ]+", re.DOTALL)


SIGNAL_MESSAGES = {
    128 + signal.SIGINT: "interrupted (SIGINT)",
    128 + signal.SIGTERM: "terminated (SIGTERM)",
}


def signal_message(code: int) -> str:
    """What ended a run with exit ``code``: ``terminated (SIGHUP, taken for a SIGTERM)``, ...."""
    if code not in SIGNAL_MESSAGES:
        return f"exit code {code}"
    verb = "interrupted" if code == 128 + signal.SIGINT else "terminated"
    return f"{verb} ({ending_signal_name(code)})"


_DECIDED: list[bool] = []


def decide_json(wanted: bool) -> None:
    """Note what the parsed command line said of ``--json`` (a command's own ``--json`` is not)."""
    _DECIDED[:] = [wanted]


def command_word(argv: Sequence[str]) -> str | None:
    """The subcommand: the first word of ``argv`` not an option (top-level flags take no value)."""
    return next((arg for arg in argv if not arg.startswith("-")), None)


def signal_document(argv: Sequence[str], code: int) -> None:
    """The ``--json`` document of a run a signal ended before the command wrote one.

    A SIGTERM or Ctrl-C while verirl is still importing or parsing its flags
    ends the run before `verirl.cli` can write the document: ``python -m
    verirl`` writes it here, so that ``--json`` still means one document.
    """
    wanted = _DECIDED[0] if _DECIDED else wants_json(argv)
    left = whole_write_left()
    if document_written() or not wanted or (left is not None and left[1]):
        return  # written, not wanted, or stdout's reader took nothing within the bound
    document: dict[str, object] = {"error": {"code": code, "message": signal_message(code)}}
    if command_word(argv) == "launch":
        document["exit_code"] = code
    write_document(document)

"""The command line's two output channels, which never fail the command they serve.

A command's stdout or stderr may be closed (``verirl plan >&-``: Python sets
``sys.stdout`` to ``None``), set to ``None`` on purpose (pythonw, some
supervisors) or a pipe whose reader went away (``verirl serve | head -1``).
None of that is the command's business: it goes on with its job and ends
with its documented exit code. A write that fails marks the channel gone
(later writes are dropped) and points its descriptor at ``/dev/null``, so
that the interpreter's own flush at exit cannot fail either (which would
print "Exception ignored … BrokenPipeError" and turn the exit code into 120).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import select
import signal
import sys
from collections.abc import Callable, Iterator, Sequence
from typing import TextIO

from verirl._signals import program_exit_arrived, raise_if_lost, sigterm_lost

__all__ = [
    "STDERR",
    "STDOUT",
    "Channel",
    "abandoned_pipes_to_devnull",
    "command_word",
    "decide_json",
    "document_written",
    "json_text",
    "reserve_standard_fds",
    "signal_document",
    "stdout_to_stderr",
    "wants_json",
    "write_document",
]


class Channel:
    """``sys.stdout`` or ``sys.stderr``, looked up at each write, whose failures are absorbed."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._failed: TextIO | None = None  # the stream that failed (a test may swap in another)

    @property
    def stream(self) -> TextIO | None:
        """The stream a write would go to now, ``None`` when there is none or it failed."""
        stream: TextIO | None = getattr(sys, self._name, None)
        if stream is None or stream is self._failed:
            return None
        return stream

    def write(self, text: str) -> bool:
        """Write ``text`` and flush; False (and nothing raised) when the channel is gone."""
        stream = self.stream
        if stream is None:
            return False
        try:
            try:
                stream.write(text)
            except UnicodeEncodeError:  # a path of bytes that are not UTF-8: written as those bytes
                stream.flush()
                _write_bytes(stream, text)
            stream.flush()
        except UnicodeError:  # not the channel's fault: it stays
            return False
        except (OSError, ValueError, AttributeError):  # closed, broken pipe, no buffer
            self._abandon(stream)
            return False
        return True

    def flush(self) -> None:
        """Flush whatever the stream buffers; a failure abandons it like a failed write."""
        stream = self.stream
        if stream is None:
            return
        try:
            stream.flush()
        except (OSError, ValueError, AttributeError):
            self._abandon(stream)

    def _abandon(self, stream: TextIO) -> None:
        self._failed = stream
        try:
            fd = stream.fileno()
        except (OSError, ValueError, AttributeError):
            return
        # What the stream still buffers now goes to /dev/null at exit instead of failing.
        with contextlib.suppress(OSError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            try:
                os.dup2(devnull, fd)
            finally:
                os.close(devnull)


def _write_bytes(stream: TextIO, text: str) -> None:
    """``text`` as the bytes it stands for (``os.fsencode``), escaped where it stands for none."""
    try:
        data = os.fsencode(text)
    except UnicodeEncodeError:
        data = text.encode("utf-8", "backslashreplace")
    buffer = getattr(stream, "buffer", None)
    if buffer is None:  # a text-only stream (a test's StringIO): the escaped text
        stream.write(data.decode("utf-8", "backslashreplace"))
    else:
        buffer.write(data)


STDOUT = Channel("stdout")
STDERR = Channel("stderr")


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
    _WRITTEN.append(True)
    if final:
        _FINAL[:] = [_stated_code(data)]
    STDOUT.write(json_text(data, indent=indent))


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
    if document_written() or not wanted:
        return
    document: dict[str, object] = {
        "error": {"code": code, "message": SIGNAL_MESSAGES.get(code, f"exit code {code}")}
    }
    if command_word(argv) == "launch":
        document["exit_code"] = code
    write_document(document)


def reserve_standard_fds() -> None:
    """Open ``/dev/null`` on any of the descriptors 0, 1, 2 that is closed.

    Otherwise the next file or socket opened would get that number, and a
    child (the vLLM server, ``launch``'s command) would take it for its
    stdin, stdout or stderr.
    """
    for fd in (0, 1, 2):
        _reserve(fd)


def _reserve(fd: int) -> None:
    try:
        os.fstat(fd)
    except OSError:
        with contextlib.suppress(OSError):
            opened = os.open(os.devnull, os.O_RDWR)  # the lowest free number: ``fd`` (0-2 in turn)
            if opened != fd:
                os.dup2(opened, fd)
                os.close(opened)
            os.set_inheritable(fd, True)  # noqa: FBT003 - a child started here must find it open too


def _writable(fd: int) -> bool:
    """Whether ``fd`` is open for writing and, if a pipe or socket, someone still reads it."""
    try:
        mode = fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE
    except OSError:
        return False
    return mode in (os.O_WRONLY, os.O_RDWR) and not _reader_gone(fd)


def _reader_gone(fd: int) -> bool:
    """Whether ``fd`` is a pipe or socket whose reading end has gone (a write would be EPIPE)."""
    if not hasattr(select, "poll"):
        return False
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    try:
        events = poller.poll(0)
    except OSError:
        return False
    return any(event & (select.POLLERR | select.POLLHUP) for _, event in events)


@contextlib.contextmanager
def abandoned_pipes_to_devnull() -> Iterator[None]:
    """Inside the block, descriptors 1 and 2 that are pipes nobody reads any more write to null.

    ``launch``'s command inherits them: a pipe whose reader has gone (``verirl
    launch … | head -1`` after ``head`` ended, a supervisor that closed its
    end) would fail its first write (or kill it by SIGPIPE), and a training
    run must not end because its output had no reader. Restored after.
    """
    saved: list[tuple[int, int]] = []
    try:
        for fd in (1, 2):
            if not _reader_gone(fd):
                continue
            with contextlib.suppress(OSError):
                kept = os.dup(fd)
                devnull = os.open(os.devnull, os.O_WRONLY)
                try:
                    os.dup2(devnull, fd)
                finally:
                    os.close(devnull)
                saved.append((fd, kept))
        yield
    finally:
        for fd, kept in saved:
            with contextlib.suppress(OSError):
                os.dup2(kept, fd)
            os.close(kept)


@contextlib.contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """Send what goes to descriptor 1 (children included) to descriptor 2 inside the block.

    ``launch --json``: the training command's own output must not mix with the
    one JSON document on stdout. Nothing is changed when either descriptor is
    unusable. A descriptor 2 that cannot be written (``2</dev/null``, a pipe
    whose reader has gone) gets the command's output to ``/dev/null`` instead:
    the command must not fail on it (nor die of SIGPIPE).
    """
    STDOUT.flush()
    try:
        saved = os.dup(1)
    except OSError:
        yield
        return
    try:
        if _writable(2):
            os.dup2(2, 1)
        else:
            devnull = os.open(os.devnull, os.O_WRONLY)
            try:
                os.dup2(devnull, 1)
            finally:
                os.close(devnull)
    except OSError:
        os.close(saved)
        yield
        return
    try:
        yield
    finally:
        STDOUT.flush()
        with contextlib.suppress(OSError):
            os.dup2(saved, 1)
        os.close(saved)

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

import atexit
import contextlib
import errno
import fcntl
import json
import math
import os
import queue
import re
import select
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from types import FrameType
from typing import TextIO

from verirl._fs import stdout_kept_in
from verirl._signals import (
    ending_signal_name,
    notes_only,
    program_exit_arrived,
    put_back,
    raise_if_lost,
    replacing,
    sigterm_lost,
)

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
    "signal_message",
    "stdout_to_stderr",
    "wants_json",
    "write_document",
]


class Channel:
    """``sys.stdout`` or ``sys.stderr``, looked up at each write, whose failures are absorbed."""

    def __init__(self, name: str) -> None:
        self._name = name
        self._failed: TextIO | None = None  # the stream that failed (a test may swap in another)
        self._backlog: _Backlog | None = None

    @property
    def stream(self) -> TextIO | None:
        """The stream a write would go to now, ``None`` when there is none or it failed."""
        stream: TextIO | None = getattr(sys, self._name, None)
        if stream is None or stream is self._failed:
            return None
        return stream

    def write(self, text: str, *, whole: bool = False, within: float | None = None) -> bool:
        """Write ``text`` and flush; False (and nothing raised) when the channel is gone.

        Written to the descriptor, past what the stream buffered: a pipe left
        non-blocking (a shared one: node, ssh, CI runners) whose reader is
        behind is waited for (up to `NONBLOCKING_WAIT` s), not taken for gone.
        With ``whole``, a signal whose handler raises (SIGTERM's SystemExit,
        Ctrl-C's KeyboardInterrupt) in the middle of the write does not cut
        it: the rest is written (within `FINISH_AFTER_SIGNAL` s), then the
        exception is raised (`whole_write_left` says how much did not go out).
        ``within``: give up after that many seconds (a write after a signal).
        In the background (`in_background`), a write that is not ``whole`` is
        queued and returns at once.
        """
        stream = self.stream
        if stream is None:
            return False
        try:
            data = _encoded(stream, text)
            try:
                fd = stream.fileno()
            except (OSError, ValueError, AttributeError):  # a text-only stream (a test's StringIO)
                stream.write(data.decode(_encoding(stream), "backslashreplace"))
                stream.flush()
                return True
            if self._backlog is not None and not whole:
                self._backlog.put(stream, fd, data)
                return True
            self.drain(within if within is not None else NONBLOCKING_WAIT)  # the order stays
            if self is not STDERR:  # lines logged before it come before it (``2>&1``)
                STDERR.drain(ORDER_WAIT)
            stream.flush()  # what it buffered first: the order stays
            _write_all(fd, data, whole=whole, within=within)
        except UnicodeError:  # not the channel's fault: it stays
            return False
        except (OSError, ValueError, AttributeError):  # closed, broken pipe, no buffer
            self._abandon(stream)
            return False
        return True

    def in_background(self) -> None:
        """From now on, writes that are not ``whole`` go out from a thread of their own.

        A reader that stops reading (a full pipe: a supervisor that reads
        stderr only at the end, a stopped ``less``) then blocks that thread
        and nothing else: the command goes on, a signal's handler that logs
        still raises at once, and lines beyond `BACKLOG_LINES` (a reader far behind) are dropped
        (and counted, in a line of their own once the reader reads again).
        `drain` waits for what is queued, within a bound; so does the exit.
        """
        if self._backlog is None:
            self._backlog = _Backlog(self._write_queued, self._name)
            atexit.register(self.drain, FINISH_AFTER_SIGNAL, at_exit=True)

    def queued_file(self) -> _QueuedFile | None:
        """A file for writers that take one (a progress bar), writing through this channel.

        ``None`` unless the channel is in the background: the writer's own
        stream is as good then.
        """
        return None if self._backlog is None else _QueuedFile(self)

    def drain(self, within: float, *, at_exit: bool = False) -> bool:
        """Wait up to ``within`` s for the queued writes to go out; False if some did not.

        A wait that gave up makes the next ones return at once (until a write
        goes out), except the exit's: the run's last lines get their bound.
        """
        return self._backlog is None or self._backlog.drain(within, at_exit=at_exit)

    def _write_queued(self, stream: TextIO, fd: int, data: bytes) -> None:
        """A queued write, on the backlog's thread (a blocking one may wait there for good)."""
        if self.stream is not stream:  # abandoned meanwhile, or swapped out
            return
        try:
            stream.flush()
            _write_plainly(fd, data)
        except (OSError, ValueError, AttributeError):
            self._abandon(stream)

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


class _QueuedFile:
    """``write`` and ``flush`` of a text file, through a `Channel` in the background."""

    encoding = "utf-8"

    def __init__(self, channel: Channel) -> None:
        self._channel = channel

    def write(self, text: str) -> int:
        self._channel.write(text)
        return len(text)

    def flush(self) -> None:
        """Nothing to do: each write is queued whole."""

    def isatty(self) -> bool:
        stream = self._channel.stream
        try:
            return stream is not None and stream.isatty()
        except (OSError, ValueError):
            return False


class _Backlog:
    """The writes a `Channel` in the background has queued, and the thread that makes them.

    `queue.SimpleQueue.put` may be called from a signal's handler that
    interrupted another ``put``: a line logged there is queued too.
    """

    def __init__(self, write: Callable[[TextIO, int, bytes], None], name: str) -> None:
        self._write = write
        self._name = name
        self.reset()
        if hasattr(os, "register_at_fork"):  # a forked child has the queue, not the thread
            os.register_at_fork(after_in_child=self.reset)

    def reset(self) -> None:
        """Nothing queued, no thread: at the start, and in a child forked from this process."""
        self._queue: queue.SimpleQueue[tuple[TextIO, int, bytes] | threading.Event] = (
            queue.SimpleQueue()
        )
        self._dropped = 0
        self._thread: threading.Thread | None = None
        self._starting = threading.RLock()  # a handler's write may interrupt a start
        self._launching = False
        self.stalled = False  # a drain gave up: the next ones do not wait until a write is done

    def put(self, stream: TextIO, fd: int, data: bytes) -> None:
        if self._queue.qsize() >= BACKLOG_LINES:
            self._dropped += 1
            return
        self._queue.put((stream, fd, data))
        self._start()

    def drain(self, within: float, *, at_exit: bool = False) -> bool:
        if self._thread is None:
            if self._queue.empty():
                return True
            self._start()  # a Ctrl-C cut a start short: what it left queued goes out now
            if self._thread is None:  # no thread can start: the caller wrote it, or none did
                return self._queue.empty()
        done = threading.Event()
        self._queue.put(done)  # after everything queued before it
        if self.stalled and not at_exit:
            return done.is_set()
        drained = done.wait(max(within, 0))
        self.stalled = not drained
        return drained

    def _start(self) -> None:
        """Start the writing thread, once.

        The lock is taken by ``with``: a Ctrl-C right after an ``acquire``
        call returned left it held for good, and no thread ever wrote the
        queue. A handler's write that interrupts a start in this thread finds
        it under way and leaves it to that start.
        """
        if self._has_thread():
            return
        with self._starting:
            if self._has_thread() or self._launching:  # started meanwhile, or being started
                return
            try:
                self._launching = True
                thread = threading.Thread(target=self._run, name="verirl-stderr", daemon=True)
                self._thread = thread
                try:
                    thread.start()
                except RuntimeError:  # the interpreter's exit began (3.12+: no thread starts)
                    self._write_here()
            finally:
                self._launching = False
                if self._thread is not None and self._thread.ident is None:
                    self._thread = None  # interrupted before it started: the next write will

    def _has_thread(self) -> bool:
        return self._thread is not None

    def _write_here(self) -> None:
        """What is queued, written by the caller: no thread can be started to write it."""
        while True:
            try:
                item = self._queue.get_nowait()
            except queue.Empty:
                return
            self._take(item)

    def _run(self) -> None:
        while True:
            self._take(self._queue.get())

    def _take(self, item: tuple[TextIO, int, bytes] | threading.Event) -> None:
        """One queued item: a drain's event set, or a write (after a note of lines dropped)."""
        if isinstance(item, threading.Event):
            item.set()
            return
        stream, fd, data = item
        dropped, self._dropped = self._dropped, 0
        if dropped:
            note = f"verirl: {dropped} line(s) not written: {self._name} was read too slowly\n"
            self._write(stream, fd, note.encode())
        self._write(stream, fd, data)
        self.stalled = False


BACKLOG_LINES = 100_000

ORDER_WAIT = 1.0
"""Seconds a write to stdout waits for stderr's queued lines, which came first, to go out."""
"""Writes a `Channel` in the background holds for a reader that stopped reading; then it drops."""

NONBLOCKING_WAIT = 300.0
"""Seconds a write waits for the reader of a non-blocking pipe to make room, before giving up."""

FINISH_AFTER_SIGNAL = 5.0
"""Seconds a whole write (`Channel.write`) goes on after a signal interrupted it."""

_PIPE_BUF = 4096  # a write this long to a pipe with room goes through whole, without blocking


def _encoding(stream: TextIO) -> str:
    return getattr(stream, "encoding", None) or "utf-8"


def _encoded(stream: TextIO, text: str) -> bytes:
    """``text`` as the stream encodes it; a name of bytes that are not UTF-8 as those bytes."""
    try:
        return text.encode(_encoding(stream), getattr(stream, "errors", None) or "strict")
    except UnicodeEncodeError:
        try:
            return os.fsencode(text)
        except UnicodeEncodeError:
            return text.encode("utf-8", "backslashreplace")


def _write_all(fd: int, data: bytes, *, whole: bool, within: float | None) -> None:
    """Write ``data`` to ``fd`` (see `Channel.write`'s ``whole`` and ``within``)."""
    if not whole:
        _write_plainly(fd, data)
        return
    _LEFT[:] = [len(data), len(data)]
    with _signals_held() as held:
        view = memoryview(data)
        deadline = None if within is None else time.monotonic() + within
        waiting_since = time.monotonic()
        finishing = False
        while view:
            now = time.monotonic()
            if held and not finishing:  # a signal came: the rest gets FINISH_AFTER_SIGNAL
                finishing = True
                deadline = min(deadline or math.inf, now + FINISH_AFTER_SIGNAL)
            limit = deadline if deadline is not None else waiting_since + NONBLOCKING_WAIT
            if now >= limit:
                if deadline is None:
                    raise BlockingIOError(errno.EAGAIN, "the reader took nothing")
                break
            if not _room_by(fd, min(limit, now + _SIGNAL_LOOK)):
                continue
            try:
                written = os.write(fd, view[:_PIPE_BUF])  # with room: it does not block
            except BlockingIOError:  # another writer took the room
                written = 0
            view = view[written:]
            _LEFT[1:] = [len(view)]
            if written:
                waiting_since = time.monotonic()


def _write_plainly(fd: int, data: bytes) -> None:
    """Write ``data`` to ``fd``; a non-blocking pipe that is full is waited for."""
    view = memoryview(data)
    while view:
        try:
            view = view[os.write(fd, view) :]
        except BlockingIOError:  # noqa: PERF203 - a reader behind: wait for room
            if not _room_by(fd, time.monotonic() + NONBLOCKING_WAIT):
                raise


_SIGNAL_LOOK = 0.1  # how often a whole write's wait for room looks for a signal held


@contextlib.contextmanager
def _signals_held() -> Iterator[list[int]]:
    """Inside the block, SIGINT, SIGTERM and SIGHUP are noted, not handled; handled after it.

    A handler's exception (SystemExit, KeyboardInterrupt) raised between
    ``os.write`` returning and its count being noted would have bytes written
    twice; and Python runs handlers in the main thread whichever thread the
    kernel gave the signal to, so blocking signals (``pthread_sigmask``) does
    not keep them out. The list yielded gets each signal number as it comes.
    Only the main thread can set handlers; elsewhere the block runs as is.
    """
    held: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield held
        return
    saved: dict[int, Callable[[int, FrameType | None], object]] = {}
    hold = _holding(held)
    try:
        for signum in _STOPPING:
            previous = signal.getsignal(signum)
            if callable(previous):  # SIG_DFL and SIG_IGN stay as they are
                saved[signum] = previous
                signal.signal(signum, hold)
        yield held
    finally:
        # their exceptions (SystemExit, KeyboardInterrupt) go on
        put_back([(number, handler, replacing(hold)) for number, handler in saved.items()], held)


def _holding(held: list[int]) -> Callable[[int, FrameType | None], None]:
    """The handler that holds each signal in ``held``, raising nothing (`notes_only`)."""

    @notes_only
    def hold(number: int, _frame: FrameType | None) -> None:
        held.append(number)

    return hold


_STOPPING = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


_LEFT: list[int] = []  # the last whole write's length, and what of it is not written yet


def whole_write_left() -> tuple[int, int] | None:
    """The last whole write (`Channel.write`): its length and the bytes it did not write."""
    return (_LEFT[0], _LEFT[1]) if _LEFT else None


def _room_by(fd: int, deadline: float) -> bool:
    """Wait until a write to ``fd`` would not block, or ``deadline``; False at the deadline.

    A pipe whose reader went away (``POLLERR``) or a closed descriptor
    counts as ready: the write then fails at once, as it should.
    """
    poller = select.poll()
    poller.register(fd, select.POLLOUT)
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        if poller.poll(max(1, math.ceil(left * 1000))):
            return True


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
    text = json_text(data, indent=indent)
    _LEFT.clear()
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
    """Whether ``fd`` is open for writing and, if a pipe or socket, someone still reads it.

    A write of nothing fails where every write would (``/dev/full``: ENOSPC).
    """
    try:
        mode = fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_ACCMODE
    except OSError:
        return False
    if mode not in (os.O_WRONLY, os.O_RDWR) or _reader_gone(fd):
        return False
    if os.isatty(fd):  # a write, even of nothing, stops a background job under ``stty tostop``
        return True
    try:
        os.write(fd, b"")
    except BlockingIOError:  # a reader behind: it is there
        return True
    except OSError:
        return False
    return True


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
    """Inside the block, descriptors 1 and 2 that no write can reach write to null.

    ``launch``'s command inherits them: a pipe whose reader has gone (``verirl
    launch … | head -1`` after ``head`` ended, a supervisor that closed its
    end) would fail its first write (or kill it by SIGPIPE), as would a full
    device (``>/dev/full``) or a descriptor open for reading only; and a
    training run must not end because its output had nowhere to go (as under
    ``--json``: `stdout_to_stderr`). Restored after.
    """
    saved: list[tuple[int, int]] = []
    try:
        for fd in (1, 2):
            if _writable(fd):
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
        with stdout_kept_in(saved):  # a server log there is still this program's stdout
            yield
    finally:
        STDOUT.flush()
        with contextlib.suppress(OSError):
            os.dup2(saved, 1)
        os.close(saved)

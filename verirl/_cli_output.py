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
import math
import os
import queue
import select
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from types import FrameType
from typing import TextIO

from verirl._signals import (
    notes_only,
    put_back,
    replacing,
)

__all__ = [
    "FINISH_AFTER_SIGNAL",
    "STDERR",
    "STDOUT",
    "Channel",
    "forget_whole_write",
    "whole_write_left",
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


def forget_whole_write() -> None:
    """Start a new whole write's account (`whole_write_left` says ``None`` until it begins)."""
    _LEFT.clear()


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

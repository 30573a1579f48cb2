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
import json
import os
import sys
from collections.abc import Iterator
from typing import TextIO

__all__ = ["STDERR", "STDOUT", "Channel", "json_text", "reserve_standard_fds", "stdout_to_stderr"]


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


@contextlib.contextmanager
def stdout_to_stderr() -> Iterator[None]:
    """Send what goes to descriptor 1 (children included) to descriptor 2 inside the block.

    ``launch --json``: the training command's own output must not mix with the
    one JSON document on stdout. Nothing is changed when either descriptor is
    unusable.
    """
    STDOUT.flush()
    try:
        saved = os.dup(1)
    except OSError:
        yield
        return
    try:
        os.dup2(2, 1)
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

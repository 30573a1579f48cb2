"""The tail of the vLLM server's log: the last lines of one run, as an error quotes them.

Read from where the run began (never an earlier run's lines) through a
`KeptLog` handle or a path, at most `LOG_TAIL_LINES` lines of the last
``_LOG_TAIL_BYTES``, never blocking on a FIFO; trailing blank output and a
cut terminal sequence are dropped, so that what is quoted is what a person
would have seen.
"""

from __future__ import annotations

import contextlib
import os
import re
import stat
from pathlib import Path
from typing import BinaryIO

from verirl.errors import ConfigError

__all__ = ["LOG_TAIL_LINES", "KeptLog", "check_lines", "read_log_tail", "read_regular"]

LOG_TAIL_LINES = 40
"""Lines of the log an error quotes."""
_LOG_TAIL_BYTES = 64 * 1024


class KeptLog:
    """A reading handle on the file a run's server writes to, kept for its tail.

    The path is only where the file was: a rotation (renamed, or deleted and
    made again) leaves the server writing to the old file, whose lines say
    why it died. Reading through this handle (a duplicate of the one the
    server was given) sees exactly what the server wrote, wherever the name
    went. Closed by `close` or when dropped; never inherited by a child.
    """

    __slots__ = ("fd",)

    def __init__(self, handle: BinaryIO) -> None:
        self.fd: int | None = os.dup(handle.fileno())

    def close(self) -> None:
        """Close the handle (again: nothing)."""
        fd, self.fd = self.fd, None
        if fd is not None:
            with contextlib.suppress(OSError):
                os.close(fd)

    def __del__(self) -> None:
        self.close()


def read_regular(path: Path | str | KeptLog, start: int, limit: int) -> tuple[int, bytes] | None:
    """``(size, bytes)``: up to ``limit`` bytes of the regular file ``path`` from ``start``.

    ``None`` when it is missing, unreadable or not a regular file (never
    blocks on a FIFO), or a closed `KeptLog`. A ``start`` past the end (the
    file was truncated or replaced) reads nothing; the size tells.
    """
    if isinstance(path, KeptLog):
        kept = path.fd
        if kept is None:
            return None
        return _read_open(kept, start, limit)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        return _read_open(fd, start, limit)
    finally:
        os.close(fd)


def _read_open(fd: int, start: int, limit: int) -> tuple[int, bytes] | None:
    """`read_regular` of the open ``fd``, which stays open."""
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            return None
        if start >= info.st_size:
            return info.st_size, b""
        return info.st_size, os.pread(fd, min(limit, info.st_size - start), start)
    except OSError:
        return None


def check_lines(lines: object) -> int:
    """``log_tail``'s ``lines``: an integer >= 0, else `ConfigError` naming it."""
    if isinstance(lines, bool) or not isinstance(lines, int) or lines < 0:
        raise ConfigError.invalid("lines", lines, "must be an integer >= 0")
    return lines


def read_log_tail(
    path: Path | str | KeptLog, *, lines: int = LOG_TAIL_LINES, start: int = 0
) -> str:
    """The last ``lines`` lines of the log at ``path`` from byte offset ``start`` ("" if none).

    ``path`` may be a `KeptLog`: the file the server writes to, wherever its name went.

    Blank lines (nothing but whitespace and terminal control sequences:
    spaces, tabs, a progress bar's carriage returns and its erase-line) at
    the end are no part of the tail, however many: they
    are read past, backwards, up to `_BLANK_LIMIT` bytes; a log whose last
    `_BLANK_LIMIT` bytes are all blank (with more of the run before them) has
    a tail that says so. Of what ends with the last line that is not blank,
    at most the last 64 KiB are read: a line cut by that window is dropped,
    unless it is the only one (a last line longer than the window), which is
    kept, cut, after ``…``. A ``start`` past the end of the file (truncated,
    or replaced by a rotation) reads the tail of what is there now. Never
    blocks, never raises: a FIFO, a folder or an unreadable file has no tail.
    """
    if check_lines(lines) == 0:
        return ""
    probe = read_regular(path, 0, 0)
    if probe is None:
        return ""
    size = probe[0]
    if start > size:  # truncated or replaced since the run began: what is there is its
        start = 0
    end = _content_end(path, start, size)
    if end is None:
        return f"\u2026 (the last {_BLANK_LIMIT // _MIB} MiB of the server log are blank)\n"
    begin = max(start, end - _LOG_TAIL_BYTES)
    before = 1 if begin > start else 0  # the byte before the window: does a line end there?
    read = read_regular(path, begin - before, end - begin + before)
    if read is None:
        return ""
    cut = bool(before) and read[1][:1] != b"\n"
    text = read[1][before:].decode("utf-8", errors="replace")
    kept = text.splitlines()
    while kept and not _visible_rstrip(kept[-1]):  # trailing blank lines say nothing of why
        kept.pop()
    if cut and kept:  # the first line was cut by the byte window
        # Dropped only when a line with something in it follows; else it is the tail, cut.
        kept = kept[1:] if len(kept) > 1 else ["\u2026" + kept[0]]
    return "\n".join(kept[-lines:]) + ("\n" if kept else "")


def _visible_rstrip(text: str) -> str:
    """``text`` without what ends it unseen: whitespace and terminal control sequences.

    A progress bar's erase-line or cursor-up sequence alone on a line is as
    blank as a carriage return. Read back from the end once (a pattern
    anchored at the end is tried at every character: quadratic on a log).
    """
    text = text.rstrip()
    end = len(text)
    while end:
        char = text[end - 1]
        if char.isspace() or char == "\x1b":
            end -= 1
        elif char in _CSI_FINAL and (begin := _csi_start(text, end - 1)) is not None:
            end = begin
        elif char in _FE and text[end - 2 : end - 1] == "\x1b":
            end -= 2
        else:
            break
    return text[:end]


def _csi_start(text: str, final: int) -> int | None:
    """Where the CSI sequence (ESC [ parameters intermediates final) ending at ``final`` starts."""
    at = final
    while at and text[at - 1] in _CSI_INTERMEDIATE:
        at -= 1
    while at and text[at - 1] in _CSI_PARAMETER:
        at -= 1
    return at - 2 if text[max(0, at - 2) : at] == "\x1b[" else None


_CSI_FINAL = frozenset(map(chr, range(0x40, 0x7F)))
_CSI_INTERMEDIATE = frozenset(map(chr, range(0x20, 0x30)))
_CSI_PARAMETER = frozenset(map(chr, range(0x30, 0x40)))
_FE = _CSI_FINAL.intersection(map(chr, range(0x40, 0x60))) - {"["}
"""A two-character escape's second (ESC then one of these; ``[`` begins a CSI instead)."""
_MIB = 1024 * 1024
_CUT_SEQUENCE = 256
"""Characters at a piece's start, none a line break, that may end a control sequence begun below."""
_CUT_TAIL = re.compile(r"\[?[0-?]*[ -/]*[@-~]")
"""The end of a control sequence whose start lies below what is read (past the 4 MiB looked at)."""
_BLANK_LIMIT = 4 * _MIB
"""Bytes of blank lines at a log's end read past for its tail, at most: a log that ends in
gigabytes of them costs a start no more than this."""


_BLANK_CHUNK = 64 * 1024
"""Bytes read at a time, backwards, looking for the last line that is not blank."""
_CONTINUATION = range(0x80, 0xC0)
"""The bytes that continue a UTF-8 character (never begin one)."""
_LINE_BREAKS = "\n\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"
"""Where `str.splitlines` ends a line (all of them whitespace)."""


def _first_break(text: str) -> int | None:
    """Where the first line of ``text`` ends (None: it does not end in it)."""
    found = [at for at in map(text.find, _LINE_BREAKS) if at >= 0]
    return min(found) if found else None


def _content_end(path: Path | str | KeptLog, start: int, size: int) -> int | None:
    """Where the tail's window ends: after the last line in ``[start, size)`` that is not blank.

    That line's end (before its line break), or right after its last visible
    character when its trailing whitespace alone would fill the window;
    ``start`` when every line there is blank; None when the last `_BLANK_LIMIT`
    bytes are, with more of the run before them. Blank is as `read_log_tail`
    tells it: decoded, a line `str.strip` leaves empty. Read backwards in
    `_BLANK_CHUNK` pieces; a character a piece's start cuts is read with the
    piece below (one the limit cuts is not blank: the window shows it whole).
    A file that changed meanwhile ends at ``size``, as before.
    """
    floor = max(start, size - _BLANK_LIMIT)
    high = size
    line_end = size  # where the line ends that the part above ``high`` begins in
    carry = b""  # the bytes above ``high`` that end a character begun below it
    while high > floor:
        low = max(floor, high - _BLANK_CHUNK)
        read = read_regular(path, low, high - low)
        if read is None or len(read[1]) != high - low:
            return size
        data = read[1] + carry
        split = 0
        if low > floor:  # continuation bytes: a character that begins below ``low``
            while split < min(3, len(data)) and data[split] in _CONTINUATION:
                split += 1
        carry, data = data[:split], data[split:]  # read with the piece below
        top = low + split + len(data)
        text = data.decode("utf-8", errors="replace")
        shown = _visible_rstrip(text)
        rest = text[len(shown) :]  # whitespace and controls: encoded again, the bytes read
        below = low > floor or (floor > start and _CUT_TAIL.fullmatch(shown) is not None)
        whole = not below or len(shown) > _CUT_SEQUENCE or _first_break(shown) is not None
        if shown and whole:
            content_end = top - len(rest.encode())
            at = _first_break(rest)
            end = line_end if at is None else top - len(rest[at:].encode())
            return end if end - content_end < _LOG_TAIL_BYTES else content_end
        if shown:  # maybe the end of a control sequence the piece's start cut: read it whole
            carry += data[: len(data) - len(rest.encode())]
        at = _first_break(rest)
        if at is not None:
            line_end = top - len(rest[at:].encode())
        high = low
    return start if floor == start else None

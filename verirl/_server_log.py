"""The vLLM server's log file: where it goes, the header of each run, and its tail.

The server writes stdout and stderr to one file that outlives a failure, so
that `VLLMServerExited` and `VLLMStartupTimeout` can quote the lines that
explain it. A run appends to the file (never truncates it) after a header
line with its command line, secrets hidden, and its tail is read from where
that run began, never from an earlier run's lines.
"""

from __future__ import annotations

import os
import shlex
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import BinaryIO

import attrs

from verirl._launch import redact_argv
from verirl.errors import ConfigError

__all__ = ["LOG_TAIL_LINES", "OpenedLog", "open_server_log", "read_log_tail"]

LOG_TAIL_LINES = 40
"""Lines of the log an error quotes."""

_LOG_TAIL_BYTES = 64 * 1024


@attrs.frozen
class OpenedLog:
    """A run's log: the open handle (the child's stdout), its path, where the run begins."""

    handle: BinaryIO
    path: Path
    offset: int


def _log_file(requested: Path | None, port: int) -> Path:
    try:
        if requested is None:
            return Path(tempfile.mkdtemp(prefix="verirl-vllm-")) / f"vllm-serve-{port}.log"
        if requested.is_dir():
            return requested / f"vllm-serve-{port}.log"
    except OSError as exc:
        raise ConfigError.invalid(
            "log_path", requested, f"no log file can be made ({exc.strerror or exc})"
        ) from None
    return requested


def open_server_log(requested: Path | None, *, port: int, argv: Sequence[str]) -> OpenedLog:
    """Open the log for appending and write the run's header line.

    ``requested`` is ``VLLMServer``'s ``log_path``: a file, a directory (which
    gets ``vllm-serve-<port>.log``) or ``None`` (a fresh ``verirl-vllm-*``
    temp directory, left in place). Unbuffered, so that a write that fails (a
    full disk) fails here; the handle is closed before the `ConfigError`
    naming ``log_path`` is raised.
    """
    path = _log_file(requested, port)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        handle = path.open("ab", buffering=0)
    except OSError as exc:
        raise ConfigError.invalid(
            "log_path", str(path), f"cannot be opened for appending ({exc.strerror or exc})"
        ) from None
    try:
        stamp = time.strftime("%Y-%m-%d %H:%M:%S")
        handle.write(f"--- verirl {stamp}: {shlex.join(redact_argv(argv))}\n".encode())
        offset = handle.tell()
    except OSError as exc:
        handle.close()
        raise ConfigError.invalid(
            "log_path", str(path), f"cannot be written ({exc.strerror or exc})"
        ) from None
    except BaseException:
        handle.close()
        raise
    return OpenedLog(handle=handle, path=path, offset=offset)


def read_log_tail(path: Path | str, *, lines: int = LOG_TAIL_LINES, start: int = 0) -> str:
    """The last ``lines`` lines of the log at ``path`` from byte offset ``start`` ("" if none)."""
    try:
        with Path(path).open("rb") as handle:
            size = handle.seek(0, os.SEEK_END)
            begin = max(start, size - _LOG_TAIL_BYTES)
            handle.seek(begin)
            data = handle.read()
    except OSError:
        return ""
    text = data.decode("utf-8", errors="replace")
    kept = text.splitlines()
    if begin > start and kept:  # the first line was cut by the byte window
        kept = kept[1:]
    return "\n".join(kept[-lines:]) + ("\n" if kept else "")

"""A Hub repo's listing read as untrusted content: names, sizes, pages, folders."""

from __future__ import annotations

import bisect
import time
from collections.abc import Collection, Iterator, Mapping
from pathlib import PureWindowsPath

from verirl._fs import quoted
from verirl.checkpoints.download_record import MARKER, FileEntry
from verirl.checkpoints.model import (
    INCOMPLETE_MARKER,
    TRAINER_STATE,
    incomplete_marker_reason,
    shorten,
)

_MAX_TREE_PAGES = 10_000  # 10 million files at the Hub's 1000 a page


_MAX_FILE_SIZE = 1 << 50  # a PiB: a listed size beyond it is not a file anyone uploaded


def _listed_incomplete(folder: str, files: Mapping[str, object]) -> str | None:
    """Why the listed ``folder`` is not a complete checkpoint, or None when it is.

    The same rule as `read_trainer_state`, on names: a ``trainer_state.json``,
    and no `INCOMPLETE_MARKER` (an upload of a folder whose save never ended).
    """
    if f"{folder}/{INCOMPLETE_MARKER}" in files:
        return incomplete_marker_reason()
    if f"{folder}/{TRAINER_STATE}" not in files:
        return f"no {TRAINER_STATE} (probably an interrupted upload)"
    return None


_NAME_MAX = 255
"""The longest file name (in bytes) a Linux file system takes: a longer one cannot be written."""


_HF_RECORD_SUFFIX = ".metadata"  # huggingface_hub keeps <name>.metadata per file it downloads


def _safe_repo_path(path: str) -> bool:
    """Whether ``path`` stays inside its folder when joined to a local directory, and can be.

    What huggingface_hub refuses to download (a drive part such as ``c:x``,
    checked on every system) or cannot name (its ``<name>.metadata`` record
    over the file name limit) is not safe either.
    """
    parts = path.split("/")
    try:
        path.encode("utf-8")  # a lone surrogate from JSON names no file the OS can make
    except UnicodeEncodeError:
        return False
    return (
        all(part not in ("", ".", "..") and len(part.encode()) <= _NAME_MAX for part in parts)
        and len(parts[-1].encode()) <= _NAME_MAX - len(_HF_RECORD_SUFFIX)
        and not any(PureWindowsPath(part).drive for part in parts)
        and "\\" not in path
        and "\0" not in path
        and parts[1:2] != [MARKER]  # verirl's marker sits at the folder's top
    )


def _folders_of(
    entries: list[dict[str, object]],
) -> tuple[dict[str, dict[str, FileEntry]], dict[str, str]]:
    """The listing's files by top-level folder, and why each folder that cannot be used cannot."""
    folders: dict[str, dict[str, FileEntry]] = {}
    unusable: dict[str, str] = {}
    for entry in entries:
        path, size = entry.get("path"), entry.get("size")
        if entry.get("type") != "file" or not isinstance(path, str) or "/" not in path:
            continue
        folder = path.split("/", 1)[0]
        if not _safe_repo_path(path):
            unusable.setdefault(
                folder, f"a file path that is not safe to download ({shorten(quoted(path))})"
            )
            continue
        if isinstance(size, bool) or not isinstance(size, int) or not 0 <= size <= _MAX_FILE_SIZE:
            unusable.setdefault(
                folder, f"{shorten(path)} has no usable size ({shorten(quoted(size))})"
            )
            continue
        lfs = entry.get("lfs")
        lfs_sha = lfs.get("sha256") if isinstance(lfs, dict) else None
        oid = str(lfs_sha or entry.get("oid") or "")
        folders.setdefault(folder, {})[path] = FileEntry(size, oid)
    for folder, files in folders.items():
        clash = _file_and_folder(files)
        if clash is not None:  # no download can make both
            unusable.setdefault(folder, f"{shorten(quoted(clash))} both as a file and as a folder")
    return folders, unusable


def _file_and_folder(paths: Collection[str]) -> str | None:
    """A path in ``paths`` that is also a folder of another one, or ``None``.

    In sorted order, the paths below ``f/`` follow the smallest one at or
    after ``f/`` at once: one look each (a deep path made every prefix cost).
    """
    ordered = sorted(paths)
    for path in ordered:
        below = path + "/"
        index = bisect.bisect_left(ordered, below)
        if index < len(ordered) and ordered[index].startswith(below):
            return path
    return None


_MAX_PAGE_BYTES = 64 << 20
"""A tree listing page larger than this is no listing (the Hub's pages are a few hundred KB)."""


def _read_within(chunks: Iterator[bytes], deadline: float, timeout: float) -> bytes:
    """The body ``chunks`` make, all of it by ``deadline`` (`TimeoutError` otherwise).

    The client's own timeout bounds each read; a server that sends a byte
    now and then would hold the listing for as long as it likes.
    """
    body = bytearray()
    for chunk in chunks:
        body += chunk
        if time.monotonic() > deadline:
            raise TimeoutError(f"the tree listing page did not arrive within {timeout:g}s")
        if len(body) > _MAX_PAGE_BYTES:
            raise ValueError(f"the tree listing page is over {_MAX_PAGE_BYTES >> 20} MiB")
    return bytes(body)

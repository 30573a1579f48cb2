"""What a download is checked against: the listing it came from, and the record verirl keeps in it.

`RemoteFolder` is one folder as a Hub listing described it; the marker
(`MARKER`) is verirl's record in a folder it downloaded: which repo, commit
and files, so that a later run can tell its own download (which it may
replace) from the user's files (never touched). `mismatch` says why a folder
on disk does not hold what the listing says.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path

import attrs

from verirl._fs import lstat_kind, printable, read_capped, write_new_file
from verirl.checkpoints.model import read_trainer_state, unreadable

__all__ = ["MARKER", "FileEntry", "RemoteFolder", "mismatch", "read_marker", "write_marker"]

MARKER = ".verirl-download.json"
"""The record verirl writes into each folder it downloaded (no repo file may be named so)."""
_MAX_MARKER_BYTES = 16 << 20


@attrs.frozen
class FileEntry:
    """One file of a listing: its size and its content id (LFS sha256, else the git blob id)."""

    size: int
    oid: str


@attrs.frozen
class RemoteFolder:
    """A checkpoint folder as one listing of ``repo_id`` at ``commit`` described it.

    ``files`` maps repo paths (``checkpoint-30/model.safetensors``) to entries;
    ``origin`` is the source's description, for messages.
    """

    origin: str
    repo_id: str
    commit: str
    name: str
    step: int
    files: Mapping[str, FileEntry]

    @property
    def expected(self) -> dict[str, FileEntry]:
        """``files`` keyed by their path inside the folder."""
        return {path.split("/", 1)[1]: entry for path, entry in self.files.items()}


def read_marker(folder: Path) -> Mapping[str, object] | None:
    """The record verirl keeps in a folder it downloaded, or None (not ours).

    No marker, a symlink in its place (never followed: a marker verirl writes
    is a regular file), or content that is not verirl's record: None. A
    marker that is there but cannot be read (an I/O error, a directory or a
    FIFO in its place): `CheckpointSourceError`, since whether the folder may
    be replaced cannot be told.
    """
    path = folder / MARKER
    try:
        if lstat_kind(path) in (None, "symlink"):
            return None
        data = json.loads(read_capped(path, _MAX_MARKER_BYTES, follow_symlinks=False))
    except (ValueError, RecursionError):
        return None
    except OSError as exc:
        raise unreadable(path, exc) from exc
    if not isinstance(data, dict) or not isinstance(data.get("files"), dict):
        return None
    return data


def write_marker(folder: Path, remote: RemoteFolder) -> None:
    """Write verirl's record of ``remote`` into ``folder``, its fresh download."""
    record = {
        "written_by": "verirl",
        "repo_id": remote.repo_id,
        "commit": remote.commit,
        "files": {
            name: {"size": e.size, "oid": e.oid} for name, e in sorted(remote.expected.items())
        },
    }
    # A new file, never through a symlink (the folder is verirl's fresh download).
    write_new_file(folder / MARKER, json.dumps(record, indent=1) + "\n")


def mismatch(
    folder: Path, expected: Mapping[str, FileEntry], marker: Mapping[str, object] | None
) -> str | None:
    """Why ``folder`` does not hold ``expected`` (sizes, and ids when we recorded them), or None.

    Nothing is followed: a symlink where a file or a folder on the way to one
    belongs is a mismatch. What cannot be read is a `CheckpointSourceError`.
    """
    recorded = marker.get("files") if marker is not None else None
    for name, entry in sorted(expected.items()):
        path = folder / name
        try:
            kinds = [lstat_kind(folder / parent) for parent in _parents(name)]
            info = path.lstat()
        except (FileNotFoundError, NotADirectoryError):
            return f"{printable(name)} is missing"
        except OSError as exc:
            raise unreadable(path, exc) from exc
        if any(kind != "dir" for kind in kinds):
            return f"a folder on the way to {printable(name)} is not a directory"
        if lstat_kind(path) != "file":
            return f"{printable(name)} is not a regular file"
        if info.st_size != entry.size:
            return f"{printable(name)} has {info.st_size} bytes, the listing says {entry.size}"
        if isinstance(recorded, dict):
            seen = recorded.get(name)
            if not isinstance(seen, dict) or seen.get("oid") != entry.oid:
                return f"{printable(name)} changed on the Hub"
    state, why = read_trainer_state(folder)
    return why if state is None else None


def _parents(name: str) -> list[str]:
    """The folders on the way to ``name`` (``a/b/c`` -> ``a``, ``a/b``)."""
    parts = name.split("/")
    return ["/".join(parts[:i]) for i in range(1, len(parts))]

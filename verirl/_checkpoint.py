"""What a checkpoint is: the `Checkpoint` value, the `CheckpointSource` protocol, completeness.

Trainer writes ``trainer_state.json`` last, so a ``checkpoint-N`` folder
without a readable one is the leftover of a job killed while saving; one that
still holds ``checkpoint-is-incomplete.txt`` (`INCOMPLETE_MARKER`, the sentinel
transformers' JIT checkpoint and `verirl.preemption.PreemptionCallback` keep
there while they save) was killed after that file but before the save ended.
`read_trainer_state` is the one test of completeness every source uses; the
sources (`verirl._local_source`, `verirl._hub_source`) and the resolver
(`verirl.checkpoints`) build on this module and on nothing of each other's.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol, runtime_checkable

import attrs

from verirl._fs import FileRefusedError, expand_user, read_capped
from verirl._validate import check_int
from verirl.errors import ConfigError

__all__ = [
    "INCOMPLETE_MARKER",
    "LAST_CHECKPOINT",
    "MAX_TRAINER_STATE_BYTES",
    "TRAINER_STATE",
    "Checkpoint",
    "CheckpointSource",
    "check_origin",
    "checkpoint_step",
    "global_step",
    "incomplete_marker_reason",
    "read_trainer_state",
    "user_directory",
]

TRAINER_STATE = "trainer_state.json"
LAST_CHECKPOINT = "last-checkpoint"
INCOMPLETE_MARKER = "checkpoint-is-incomplete.txt"
"""transformers' JIT-checkpoint sentinel: present while a save is in progress, removed after."""
MAX_TRAINER_STATE_BYTES = 64 << 20
"""A ``trainer_state.json`` larger than this is not read (Trainer's are kilobytes to megabytes)."""
# ASCII digits only: str.isdigit and \d also accept e.g. Arabic-Indic digits.
_CHECKPOINT_NAME = re.compile(r"checkpoint-([0-9]+)", re.ASCII)


def checkpoint_step(name: str) -> int | None:
    """Step of a strict ``checkpoint-N`` name, else None (``tmp-checkpoint-5``, ``x.bak``)."""
    match = _CHECKPOINT_NAME.fullmatch(name)
    return int(match.group(1)) if match else None


def read_trainer_state(  # noqa: PLR0911 - one return per way the file can be unusable
    folder: str | os.PathLike[str],
) -> tuple[dict[str, object] | None, str]:
    """Read ``folder/trainer_state.json``: ``(state, "")``, or ``(None, why it is unusable)``.

    A checkpoint is complete exactly when this returns a state: Trainer writes
    the file last, so its absence (or a torn write) marks an interrupted save,
    and so does `INCOMPLETE_MARKER` beside it (a save that wrote the state but
    was killed before it ended: transformers removes the marker last).
    """
    try:
        marked = os.path.lexists(Path(folder) / INCOMPLETE_MARKER)
    except (OSError, ValueError):
        marked = False
    if marked:
        return None, incomplete_marker_reason()
    path = Path(folder) / TRAINER_STATE
    try:
        # Never a FIFO or device (it would hang), never more than the cap.
        text = read_capped(path, MAX_TRAINER_STATE_BYTES).decode("utf-8")
    except FileNotFoundError:
        return None, f"no {TRAINER_STATE}"
    except FileRefusedError as exc:
        return None, str(exc)
    except (OSError, UnicodeDecodeError) as exc:
        return None, f"{TRAINER_STATE} is unreadable ({type(exc).__name__}: {exc})"
    try:
        state = json.loads(text)
    except RecursionError:
        return None, f"{TRAINER_STATE} is nested too deeply to be a Trainer state"
    except ValueError as exc:
        return None, f"{TRAINER_STATE} is not valid JSON ({exc})"
    if not isinstance(state, dict):
        return None, f"{TRAINER_STATE} is not a JSON object"
    return state, ""


def incomplete_marker_reason() -> str:
    """Why a folder holding `INCOMPLETE_MARKER` is not a complete checkpoint."""
    return f"{INCOMPLETE_MARKER} is present (the save that wrote it never finished)"


def global_step(state: Mapping[str, object]) -> int | None:
    """A Trainer state's ``global_step`` when it is an int >= 0, else None."""
    step = state.get("global_step")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        return None
    return step


def _path_text(value: str | os.PathLike[str]) -> str:
    """A checkpoint's path as text; path-likes are accepted."""
    raw: object = value
    if isinstance(raw, os.PathLike):
        raw = os.fspath(raw)
    if not isinstance(raw, str) or not raw:
        raise ConfigError.invalid("path", value, "must be a non-empty string or path")
    return raw


@attrs.frozen
class Checkpoint:
    """A checkpoint a source knows about.

    ``path`` is a local directory for local sources and a folder name in the
    repo (``checkpoint-30``, ``last-checkpoint``) for the Hub; ``source`` says
    where, for messages (``local:/x/out``, ``hub:org/run@main``). Turn it into
    a local directory with the source's `CheckpointSource.fetch`.
    """

    step: int
    path: str = attrs.field(converter=_path_text)
    source: str

    def __attrs_post_init__(self) -> None:
        check_int("step", self.step, 0)
        value: object = self.source
        if not isinstance(value, str) or not value:
            raise ConfigError.invalid("source", value, "must be a non-empty string")


@runtime_checkable
class CheckpointSource(Protocol):
    """A place checkpoints may be: a local output directory, a Hub repo, a test double.

    Only `latest` and `fetch` are required. A ``description`` string (where the
    source looks), when present, is used in messages; verirl's sources have one.
    """

    def latest(self) -> Checkpoint | None:
        """The newest complete checkpoint, or None; reads metadata only, no big download.

        Raises `CheckpointSourceError` when the source cannot be read.
        """
        ...

    def fetch(self, checkpoint: Checkpoint) -> Path:
        """Make ``checkpoint`` (from `latest`) available as a local directory and return it."""
        ...


def check_origin(description: str, checkpoint: Checkpoint) -> None:
    """Refuse to fetch a ``checkpoint`` that another source (not ``description``) found."""
    if checkpoint.source != description:
        raise ConfigError.invalid(
            "checkpoint",
            checkpoint,
            f"comes from {checkpoint.source!r}, not from {description!r}",
        )


def user_directory(field: str, value: object) -> Path:
    """A directory path from a user: ``~`` expanded, and one the OS can use, else `ConfigError`.

    The directory need not exist yet (a first run creates or finds it later).
    """
    raw: object = value
    if isinstance(raw, os.PathLike):
        try:
            raw = os.fspath(raw)
        except (TypeError, ValueError) as exc:
            raise ConfigError.invalid(field, value, f"is not a usable path ({exc})") from None
    if not isinstance(raw, str) or not raw.strip():
        raise ConfigError.invalid(field, value, "must be a non-empty path (str or os.PathLike)")
    if "\0" in raw:
        raise ConfigError.invalid(field, value, "contains a NUL character")
    expanded = expand_user(raw)
    if expanded is None:
        raise ConfigError.invalid(field, value, "cannot expand '~': no such user or no home")
    path = Path(expanded)
    try:
        path.stat()
    except (FileNotFoundError, NotADirectoryError):
        pass
    except OSError as exc:
        raise ConfigError.invalid(field, value, f"cannot be used ({exc.strerror})") from None
    return path

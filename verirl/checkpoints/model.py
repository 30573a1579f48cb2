"""What a checkpoint is: the `Checkpoint` value, the `CheckpointSource` protocol, completeness.

Trainer writes ``trainer_state.json`` last, so a ``checkpoint-N`` folder
without one (or with a torn one) is the leftover of a job killed while saving;
one that still holds ``checkpoint-is-incomplete.txt`` (`INCOMPLETE_MARKER`, the sentinel
transformers' JIT checkpoint and `verirl.preemption.PreemptionCallback` keep
there while they save) was killed after that file but before the save ended.
A state file that is there but cannot be read (an I/O error, a directory or a
FIFO in its place, a broken symlink) is no interrupted save: it is an error,
never a reason to skip the folder, since skipping the newest checkpoint under
``auto`` turns a resumable job into a fresh start that overwrites it.
`read_trainer_state` is the one test of completeness every source uses; the
sources (`verirl.checkpoints.local`, `verirl.checkpoints.hub`) and the resolver
(`verirl.checkpoints`) build on this module and on nothing of each other's.
"""

from __future__ import annotations

import errno
import json
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Protocol, runtime_checkable

import attrs

from verirl._fs import expand_user, printable, quoted, read_capped
from verirl._validate import check_int
from verirl.errors import CheckpointSourceError, ConfigError

__all__ = [
    "AUTO",
    "INCOMPLETE_MARKER",
    "LAST_CHECKPOINT",
    "MAX_STEP",
    "MAX_TRAINER_STATE_BYTES",
    "RESUME_KEYWORDS",
    "TRAINER_STATE",
    "Checkpoint",
    "CheckpointSource",
    "absurd_step_reason",
    "check_encodes",
    "check_origin",
    "checkpoint_step",
    "global_step",
    "incomplete_marker_reason",
    "path_request",
    "read_trainer_state",
    "resume_request",
    "shorten",
    "unreadable",
    "user_directory",
]

TRAINER_STATE = "trainer_state.json"
LAST_CHECKPOINT = "last-checkpoint"
INCOMPLETE_MARKER = "checkpoint-is-incomplete.txt"
"""transformers' JIT-checkpoint sentinel: present while a save is in progress, removed after."""
MAX_TRAINER_STATE_BYTES = 64 << 20
"""A ``trainer_state.json`` larger than this is not read (Trainer's are kilobytes to megabytes)."""
AUTO = "auto"
"""The request for "the newest complete checkpoint if there is one, else a fresh start"."""
RESUME_KEYWORDS = frozenset({"latest", LAST_CHECKPOINT, AUTO})
"""The words a resume request given as text may be; a path-like is never one of them."""
MAX_STEP = 2**63 - 1
"""The largest step a checkpoint may have (Trainer counts in a 64-bit integer); beyond: absurd."""
# ASCII digits only: str.isdigit and \d also accept e.g. Arabic-Indic digits.
_CHECKPOINT_NAME = re.compile(r"checkpoint-([0-9]+)", re.ASCII)
_SHOWN = 80


def checkpoint_step(name: str) -> int | None:
    """Step of a strict ``checkpoint-N`` name, else None (``tmp-checkpoint-5``, ``x.bak``).

    A step beyond `MAX_STEP` (``checkpoint-99999999999999999999``) is None too:
    no run got there, and the digits are never all converted (Python refuses
    to turn more than 4300 of them into an int). `absurd_step_reason` says so.
    """
    match = _CHECKPOINT_NAME.fullmatch(name)
    if match is None or absurd_step_reason(name) is not None:
        return None
    return int(match.group(1))


def absurd_step_reason(name: str) -> str | None:
    """Why a ``checkpoint-N`` name is skipped although it matches: a step beyond `MAX_STEP`."""
    match = _CHECKPOINT_NAME.fullmatch(name)
    if match is None:
        return None
    digits = match.group(1).lstrip("0")
    if len(digits) <= len(str(MAX_STEP)) and int(digits or "0") <= MAX_STEP:
        return None
    return f"its step has {len(digits)} digits, beyond any training run's (at most {MAX_STEP})"


def shorten(text: str, limit: int = _SHOWN) -> str:
    """``text`` for a message: shown as it can be (`printable`) and cut to ``limit`` characters."""
    shown = printable(text)
    return shown if len(shown) <= limit else f"{shown[: limit - 3]}..."


def unreadable(path: str | os.PathLike[str], exc: OSError) -> CheckpointSourceError:
    """The error for a checkpoint file or folder that is there but cannot be read."""
    why = exc.strerror or str(exc) or type(exc).__name__
    msg = (
        f"cannot read {printable(path)} ({type(exc).__name__}: {printable(why)}); an unreadable "
        "checkpoint is not an interrupted save, so it is neither skipped nor resumed from: fix "
        "its permissions or storage, or move the folder away"
    )
    return CheckpointSourceError(msg, checkpoint_unreadable=True)


def read_trainer_state(folder: str | os.PathLike[str]) -> tuple[dict[str, object] | None, str]:
    """Read ``folder/trainer_state.json``: ``(state, "")``, or ``(None, why it is incomplete)``.

    A checkpoint is complete exactly when this returns a state. Incomplete,
    as an interrupted save leaves a folder: no ``trainer_state.json`` (Trainer
    writes it last), one that is not a JSON object (a torn write: invalid
    JSON, not UTF-8, nested too deeply), or `INCOMPLETE_MARKER` beside it (a
    save that wrote the state but was killed before it ended: transformers
    removes the marker last).

    Raises `CheckpointSourceError` (``__cause__``: the `OSError`) when the
    folder or the file is there but cannot be read: an I/O or permission
    error, a directory, FIFO or device in the file's place (never opened: it
    could hang), a symlink that cannot be followed, a file larger than
    `MAX_TRAINER_STATE_BYTES`. Those say nothing about the save, and skipping
    them could throw away the newest checkpoint.
    """
    if _marked_incomplete(Path(folder)):
        return None, incomplete_marker_reason()
    data = _state_bytes(Path(folder) / TRAINER_STATE)
    if data is None:
        return None, f"no {TRAINER_STATE}"
    try:
        state = json.loads(data.decode("utf-8"))
    except RecursionError:
        return None, f"{TRAINER_STATE} is nested too deeply to be a Trainer state"
    except ValueError as exc:  # a torn write: invalid JSON, or bytes that are not UTF-8
        return None, f"{TRAINER_STATE} is not valid JSON ({_json_problem(exc)})"
    if not isinstance(state, dict):
        return None, f"{TRAINER_STATE} is not a JSON object"
    return state, ""


def _json_problem(exc: ValueError) -> str:
    if isinstance(exc, UnicodeDecodeError):
        return f"not UTF-8: {exc.reason} at byte {exc.start}"
    return shorten(str(exc), 200)


def _marked_incomplete(folder: Path) -> bool:
    """Whether `INCOMPLETE_MARKER` is in ``folder`` (whatever it is); unreadable: an error."""
    marker = folder / INCOMPLETE_MARKER
    try:
        marker.lstat()
    except FileNotFoundError:
        return False
    except OSError as exc:
        raise unreadable(marker, exc) from exc
    return True


def _state_bytes(path: Path) -> bytes | None:
    """The bytes of the state file ``path``, None when there is none; unreadable: an error."""
    try:
        # Never a FIFO or device (it would hang), never more than the cap.
        return read_capped(path, MAX_TRAINER_STATE_BYTES)
    except FileNotFoundError as exc:
        if not os.path.lexists(path):
            return None
        dangling = FileNotFoundError(errno.ENOENT, "a symlink to nothing", os.fspath(path))
        raise unreadable(path, dangling) from exc
    except OSError as exc:
        raise unreadable(path, exc) from exc


def incomplete_marker_reason() -> str:
    """Why a folder holding `INCOMPLETE_MARKER` is not a complete checkpoint."""
    return f"{INCOMPLETE_MARKER} is present (the save that wrote it never finished)"


def global_step(state: Mapping[str, object]) -> int | None:
    """A Trainer state's ``global_step`` when it is an int from 0 to `MAX_STEP`, else None."""
    step = state.get("global_step")
    if isinstance(step, bool) or not isinstance(step, int) or not 0 <= step <= MAX_STEP:
        return None
    return step


def path_request(field: str, value: os.PathLike[str], *, found: bool = False) -> str:
    """A path-like resume request as text that every reader takes for that path.

    A path is never a keyword: ``Path("latest")`` is the folder called
    ``latest``, not the newest checkpoint. As text it would be the keyword, so
    a relative path that reads as one (or starts with whitespace) gets a
    leading ``./``, and one ending in whitespace (which a request loses to
    `str.strip`) a trailing ``/``: the same directory, spelled unambiguously.
    Anything else is returned as `os.fspath` gives it (``~`` is expanded later,
    as for any path), except a directory ``found`` on disk (a resolver's
    answer, ``~`` already expanded), where a leading ``~`` is a folder of that
    name and gets a leading ``./`` too. A path-like that is not a non-empty str
    path is a `ConfigError` naming ``field``.
    """
    try:
        text: object = os.fspath(value)
    except TypeError as exc:
        raise ConfigError.invalid(field, value, f"is not a usable path ({exc})") from None
    if not isinstance(text, str) or not text:
        raise ConfigError.invalid(field, value, "must be a path-like of a non-empty str path")
    if text[0].isspace() or text.strip() in RESUME_KEYWORDS or (found and text[0] == "~"):
        text = os.path.join(os.curdir, text)  # noqa: PTH118 - a Path would drop the "./"
    if text[-1].isspace():
        text += os.sep
    return text


def resume_request(value: str | os.PathLike[str] | None) -> str | None:
    """A resume request as text: a path-like through `path_request`, anything else as given.

    What the runtime keeps and passes on (a converter: values of other types
    are left for the caller's check to refuse).
    """
    if isinstance(value, os.PathLike):
        return path_request("resume_from", value)
    return value


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
        check_int("step", self.step, 0, MAX_STEP)
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
            f"comes from {quoted(checkpoint.source)}, not from {quoted(description)}",
        )


def check_encodes(field: str, value: object, text: str) -> None:
    """`ConfigError` when ``text`` names no path the OS can make (a lone surrogate, from JSON)."""
    try:
        os.fsencode(text)
    except UnicodeEncodeError:
        raise ConfigError.invalid(
            field, value, "contains a character no file name can hold (a lone surrogate)"
        ) from None


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
    if not isinstance(raw, str):
        raise ConfigError.invalid(field, value, "must be a path (str or os.PathLike)")
    if not raw.strip():
        raise ConfigError.invalid(field, value, "is empty: give a folder's path")
    if "\0" in raw:
        raise ConfigError.invalid(field, value, "contains a NUL character")
    check_encodes(field, value, raw)
    expanded = expand_user(raw)
    if expanded is None:
        raise ConfigError.invalid(field, value, "cannot expand '~': no such user or no home")
    path = Path(expanded)
    try:
        path.stat()
    except (FileNotFoundError, NotADirectoryError):
        pass
    except OSError as exc:
        if exc.errno in _PATH_SHAPE_ERRORS:  # the name itself: the user's to fix
            raise ConfigError.invalid(field, value, f"cannot be used ({exc.strerror})") from None
        raise unreadable(path, exc) from exc  # permissions, I/O: a source error (exit 5)
    return path


# What a path's own spelling causes, whatever the disk holds.
_PATH_SHAPE_ERRORS = frozenset({errno.ENAMETOOLONG, errno.ELOOP, errno.EINVAL})

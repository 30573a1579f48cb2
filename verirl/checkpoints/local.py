"""`LocalCheckpointSource`: the ``checkpoint-N`` directories Trainer saved under its ``output_dir``.

Local checkpoints are read in place and never modified: an incomplete one
(an interrupted save) is skipped with a warning and left for the user; one
that cannot be read (or a root that exists but cannot be listed) is a
`CheckpointSourceError`, never taken for "no checkpoint".
Exported from `verirl.checkpoints` and `verirl`.
"""

from __future__ import annotations

import errno
import logging
import os
from pathlib import Path

import attrs

from verirl._fs import printable
from verirl.checkpoints.model import (
    Checkpoint,
    absurd_step_reason,
    check_origin,
    checkpoint_step,
    read_trainer_state,
    shorten,
    unreadable,
    user_directory,
)
from verirl.errors import CheckpointSourceError, ConfigError

__all__ = ["LocalCheckpointSource"]

log = logging.getLogger("verirl.checkpoints")  # the component's logger, which users filter on


def _root_path(value: str | os.PathLike[str]) -> Path:
    return user_directory("root", value)


@attrs.frozen
class LocalCheckpointSource:
    """The ``checkpoint-N`` directories under ``root`` (Trainer's ``output_dir``).

    Names must match ``checkpoint-<digits>`` exactly: files, ``tmp-checkpoint-*``
    (Trainer's staging folders) and anything else are ignored, and so are
    steps beyond `verirl.checkpoints.model.MAX_STEP` (with a warning). A missing
    ``root`` holds no checkpoints (a first run); a ``root`` that is a file is a
    `ConfigError`. Incomplete checkpoints are skipped with a warning and are
    never modified or deleted. What cannot be read (the root, a ``checkpoint-N``
    symlink that leads nowhere, a ``trainer_state.json`` that is a directory or
    gives an I/O error) is a `CheckpointSourceError`.
    """

    root: Path = attrs.field(converter=_root_path)

    def __attrs_post_init__(self) -> None:
        if self.root.exists() and not self.root.is_dir():
            raise ConfigError.invalid("root", str(self.root), "is not a directory")

    @property
    def description(self) -> str:
        r"""``local:<root>`` (bytes that are not UTF-8 shown as ``\xff``)."""
        return f"local:{printable(self.root)}"

    def latest(self) -> Checkpoint | None:
        """The complete ``checkpoint-N`` with the highest N, or None.

        Raises `CheckpointSourceError` for a folder newer than the one chosen
        that cannot be read: it may be the newest checkpoint.
        """
        for step, name, error in self._numbered_dirs():
            if error is not None:  # newer than any complete one: it may be the newest
                error.step = step
                raise error
            folder = self.root / name
            try:
                state, why = read_trainer_state(folder)
            except CheckpointSourceError as exc:
                if exc.checkpoint_unreadable and exc.step is None:
                    exc.step = step
                raise
            if state is None:
                log.warning(
                    "skipping incomplete checkpoint %s: %s (probably interrupted while saving; "
                    "left as it is)",
                    printable(folder),
                    why,
                )
                continue
            return Checkpoint(step, os.fspath(folder), self.description)
        return None

    def fetch(self, checkpoint: Checkpoint) -> Path:
        """Return the checkpoint's directory; nothing is copied."""
        check_origin(self.description, checkpoint)
        folder = Path(checkpoint.path)
        try:
            is_dir = folder.is_dir()
        except (OSError, ValueError):
            is_dir = False
        if not is_dir:
            cause = FileNotFoundError(
                errno.ENOENT, "checkpoint directory vanished", checkpoint.path
            )
            msg = f"{printable(checkpoint.path)} from {self.description} is no longer a directory"
            raise CheckpointSourceError(msg) from cause
        return folder

    def _numbered_dirs(self) -> list[tuple[int, str, CheckpointSourceError | None]]:
        """``(step, name, error)`` of each ``checkpoint-N`` directory, newest first.

        ``error``: the entry cannot be read (a dangling link, a loop); it
        matters only if no newer complete checkpoint is found.
        """
        found: list[tuple[int, str, CheckpointSourceError | None]] = []
        try:
            with os.scandir(self.root) as entries:
                for entry in entries:
                    step = checkpoint_step(entry.name)
                    if step is None:
                        self._warn_if_absurd(entry.name)
                        continue
                    try:
                        if _is_dir(entry):
                            found.append((step, entry.name, None))
                    except CheckpointSourceError as exc:
                        found.append((step, entry.name, exc))
        except FileNotFoundError as exc:
            broken = _broken_link_on_the_way(self.root)
            if broken is not None:
                dangling = FileNotFoundError(errno.ENOENT, "a symlink to nothing", broken)
                raise unreadable(broken, dangling) from exc
            log.debug("%s does not exist yet: no local checkpoints", printable(self.root))
            return []
        except CheckpointSourceError:
            raise
        except OSError as exc:
            why = printable(exc.strerror or str(exc))
            msg = f"cannot list {self.description}: {type(exc).__name__}: {why}"
            raise CheckpointSourceError(msg) from exc
        # On equal steps (checkpoint-7, checkpoint-007) the name decides.
        # On a tie a readable entry first: an unreadable one of its step hides nothing newer.
        return sorted(found, key=lambda item: (-item[0], item[2] is not None, item[1]))

    def _warn_if_absurd(self, name: str) -> None:
        reason = absurd_step_reason(name)
        if reason is not None:
            log.warning("ignoring %s in %s: %s", shorten(name), self.description, reason)


def _is_dir(entry: os.DirEntry[str]) -> bool:
    """Whether ``entry`` is a directory, following a symlink; a link that leads nowhere raises.

    A dangling ``checkpoint-N`` symlink (a volume not mounted) or a loop may
    hide the newest checkpoint: `CheckpointSourceError`, not "no checkpoint".
    """
    try:
        if entry.is_dir():  # follows symlinks: a linked checkpoint counts
            return True
        if entry.is_symlink():
            # A link to a file is fine (not a checkpoint); to nothing, or in a loop, is not.
            Path(entry.path).stat()
    except FileNotFoundError as exc:
        if not os.path.lexists(entry.path):
            return False  # removed while we looked
        dangling = FileNotFoundError(errno.ENOENT, "a symlink to nothing", entry.path)
        raise unreadable(entry.path, dangling) from exc
    except OSError as exc:
        raise unreadable(entry.path, exc) from exc
    return False


def _broken_link_on_the_way(root: Path) -> str | None:
    """The symlink that leads nowhere on the way to a missing ``root``, or None if none does.

    A missing root is a first run, unless it is missing because a symlink
    (``output_dir`` on a volume that is not mounted) points nowhere.
    """
    for path in (root, *root.absolute().parents):
        if os.path.lexists(path):
            return None if os.path.exists(path) else os.fspath(path)  # noqa: PTH110
    return None

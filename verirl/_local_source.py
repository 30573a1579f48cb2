"""`LocalCheckpointSource`: the ``checkpoint-N`` directories Trainer saved under its ``output_dir``.

Local checkpoints are read in place and never modified: an incomplete one
(an interrupted save) is skipped with a warning and left for the user.
Exported from `verirl.checkpoints` and `verirl`.
"""

from __future__ import annotations

import errno
import logging
import os
from pathlib import Path

import attrs

from verirl._checkpoint import (
    Checkpoint,
    check_origin,
    checkpoint_step,
    read_trainer_state,
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
    (Trainer's staging folders) and anything else are ignored. A missing
    ``root`` holds no checkpoints (a first run); a ``root`` that is a file is a
    `ConfigError`. Incomplete checkpoints are skipped with a warning and are
    never modified or deleted.
    """

    root: Path = attrs.field(converter=_root_path)

    def __attrs_post_init__(self) -> None:
        if self.root.exists() and not self.root.is_dir():
            raise ConfigError.invalid("root", str(self.root), "is not a directory")

    @property
    def description(self) -> str:
        """``local:<root>``."""
        return f"local:{self.root}"

    def latest(self) -> Checkpoint | None:
        """The complete ``checkpoint-N`` with the highest N, or None."""
        for step, name in self._numbered_dirs():
            folder = self.root / name
            state, why = read_trainer_state(folder)
            if state is None:
                log.warning(
                    "skipping incomplete checkpoint %s: %s (probably interrupted while saving; "
                    "left as it is)",
                    folder,
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
            msg = f"{checkpoint.path} from {self.description} is no longer a directory"
            raise CheckpointSourceError(msg) from cause
        return folder

    def _numbered_dirs(self) -> list[tuple[int, str]]:
        """``(step, name)`` of each ``checkpoint-N`` directory, newest first."""
        try:
            with os.scandir(self.root) as entries:
                found = []
                for entry in entries:
                    step = checkpoint_step(entry.name)
                    if step is not None and _is_dir(entry):
                        found.append((step, entry.name))
        except FileNotFoundError:
            log.debug("%s does not exist yet: no local checkpoints", self.root)
            return []
        except OSError as exc:
            msg = f"cannot list {self.description}: {type(exc).__name__}: {exc}"
            raise CheckpointSourceError(msg) from exc
        # On equal steps (checkpoint-7, checkpoint-007) the name decides.
        return sorted(found, key=lambda item: (-item[0], item[1]))


def _is_dir(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_dir()  # follows symlinks: a linked checkpoint counts
    except OSError:
        return False

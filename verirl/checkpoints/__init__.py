"""Pick the checkpoint to resume from after a preemption, locally or on the Hub.

`CheckpointResolver` turns a resume request (``None``, ``"latest"``, a path)
into a local directory: it asks each `CheckpointSource` for its newest
*complete* checkpoint (one whose ``trainer_state.json`` Trainer finished
writing), picks the newest over all of them, and fetches only that one. This
package is the component's public face: the value and the protocol live in
`verirl.checkpoints.model`, the sources in `verirl.checkpoints.local` and
`verirl.checkpoints.hub` (the Hub's download folder in ``download_dir``, one
download shared by a node's ranks in ``node_share``), the resolver in
`verirl.checkpoints.resolver`; the public names are importable from here::

    resolver = CheckpointResolver([
        LocalCheckpointSource("/x/out"),
        HubCheckpointSource("org/run", download_dir="/x/hub-download", token=token),
    ])
    resume_from = resolver.resolve_from_env()  # None, or a local directory
"""

from __future__ import annotations

from verirl.checkpoints.hub import HubCheckpointSource
from verirl.checkpoints.local import LocalCheckpointSource
from verirl.checkpoints.model import (
    AUTO,
    INCOMPLETE_MARKER,
    LAST_CHECKPOINT,
    MAX_TRAINER_STATE_BYTES,
    TRAINER_STATE,
    Checkpoint,
    CheckpointSource,
    read_trainer_state,
)
from verirl.checkpoints.resolver import RESUME_ENV_VAR, CheckpointResolver, describe_source

__all__ = [
    "AUTO",
    "INCOMPLETE_MARKER",
    "LAST_CHECKPOINT",
    "MAX_TRAINER_STATE_BYTES",
    "RESUME_ENV_VAR",
    "TRAINER_STATE",
    "Checkpoint",
    "CheckpointResolver",
    "CheckpointSource",
    "HubCheckpointSource",
    "LocalCheckpointSource",
    "describe_source",
    "read_trainer_state",
]

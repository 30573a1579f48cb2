"""`HubCheckpointSource`: the checkpoint folders of a Hugging Face Hub model repo.

The repo is listed once, pinned to one commit, and only the chosen folder is
downloaded (the old helper's ``snapshot_download(allow_patterns=...)`` fetched
every checkpoint's weights and optimizer state to use one). This module speaks
to the Hub through huggingface_hub, imported lazily so that ``import verirl``
stays light; what happens in ``download_dir`` is `verirl.checkpoints.download_dir`'s.
The token never appears in a repr, log line or error message. Exported from
`verirl.checkpoints` and `verirl`.
"""

from __future__ import annotations

import collections
import errno
import logging
import os
import tempfile
import threading
from collections.abc import Sequence
from concurrent.futures import as_completed
from concurrent.futures import wait as wait_futures
from pathlib import Path
from typing import TYPE_CHECKING

import attrs

from verirl._fs import quoted
from verirl._hub_token import (
    check_token,
    hub_offline,
    hub_token_in_use,
    hub_token_within,
    implicit_hub_token,
    implicit_token_disabled,
)
from verirl._phases import DaemonExecutor
from verirl._secrets import scrub, scrub_config_error, scrub_exception
from verirl._validate import check_int, check_number, check_seconds
from verirl.checkpoints.download_dir import FolderName, fetch_folder, human_size
from verirl.checkpoints.download_record import FileEntry, RemoteFolder
from verirl.checkpoints.hub_errors import (
    _REFUSALS,
    _answered_by_hub,
    _describe_hub_error,
    _local_failure,
    _look_up_hub_host,
    _refuse_offline,
    _repo_missing,
    _status_code,
)
from verirl.checkpoints.hub_listing import (
    _folders_of,
    _listed_incomplete,
)
from verirl.checkpoints.hub_names import (
    _check_endpoint,
    _check_repo_id,
    _check_revision,
    _commit_id,
    _endpoint_rstrip,
)
from verirl.checkpoints.hub_transfer import download_file, hub_api, hub_endpoint, list_tree
from verirl.checkpoints.model import (
    LAST_CHECKPOINT,
    MAX_TRAINER_STATE_BYTES,
    TRAINER_STATE,
    Checkpoint,
    absurd_step_reason,
    check_origin,
    checkpoint_step,
    global_step,
    read_trainer_state,
    shorten,
    user_directory,
)
from verirl.errors import CheckpointSourceError, ConfigError

if TYPE_CHECKING:
    from collections.abc import Mapping


__all__ = ["HubCheckpointSource"]

log = logging.getLogger("verirl.checkpoints")  # the component's logger, which users filter on
_DOWNLOADERS = DaemonExecutor()

_MAX_TIMEOUT = 24 * 3600.0


def _download_dir_path(value: str | os.PathLike[str]) -> Path:
    return user_directory("download_dir", value)


@attrs.frozen
class _Listing:
    """What one tree listing of the repo said: the commit, and each top-level folder's files."""

    commit: str
    folders: Mapping[str, Mapping[str, FileEntry]]
    unusable: Mapping[str, str] = attrs.field(factory=dict)
    """Folders left out of ``folders``, each with why: a file that cannot be downloaded safely."""


@attrs.define
class HubCheckpointSource:
    """The ``checkpoint-N/`` and ``last-checkpoint/`` folders of a Hugging Face Hub model repo.

    `latest` resolves ``revision`` to a commit, lists the repo once, reads steps
    from ``checkpoint-N`` folder names and, for ``last-checkpoint`` (Trainer's
    ``hub_strategy="checkpoint"``), from its ``trainer_state.json``
    ``global_step`` (one small download). A folder is complete when the listing
    has its ``trainer_state.json``.

    `fetch` downloads only that folder, pinned to the listed commit, into a
    staging folder inside ``download_dir``, checks every file's size against
    the listing, and only then renames it to ``download_dir/<folder>``: a
    download cut short never looks complete. A folder already there is reused
    when it matches the listing; otherwise it is replaced only if verirl
    downloaded it (it holds verirl's marker file and nothing else of yours).
    Anything else there, symlinks included, is never written to, followed or
    deleted. Concurrent fetches of one folder (threads or processes) take turns
    on a lock file in ``download_dir``; ``lock_timeout`` bounds the wait.
    ``download_dir`` itself may be a link to a folder (one put on another disk
    on purpose); a file there, or a link to nothing, is a `ConfigError`.
    ``download_dir_origin``: for a folder verirl made from another setting,
    what it was made from (``"under output_dir='out'"``); errors then call it
    the Hub download folder, never ``download_dir``, a field the user never gave.

    ``endpoint`` and ``token`` go to huggingface_hub as they are (``HF_ENDPOINT``
    is read when huggingface_hub is imported, so ``endpoint`` is how a mirror or
    a test server is reached); ``token=None`` lets huggingface_hub find one
    (``HF_TOKEN``, ``hf auth login``, an OIDC exchange with
    ``HF_OIDC_RESOURCE``), within ``timeout``. The token never appears in a repr, log
    line or error message (nor in `description`: an ``endpoint`` holding it
    shows ``<token>`` there), and one with whitespace, control or non-ASCII
    characters is a `ConfigError`: ``token=`` when the source is made, the one
    huggingface_hub finds itself before each use (`implicit_hub_token`: the
    error names where it is). ``HF_HUB_OFFLINE`` makes every call a
    `CheckpointSourceError`.
    ``timeout`` bounds each metadata request; ``max_workers`` files are
    downloaded at once. ``~`` in ``download_dir`` is expanded.
    """

    repo_id: str
    download_dir: Path = attrs.field(kw_only=True, converter=_download_dir_path)
    _token: str | None = attrs.field(
        kw_only=True, default=None, alias="token", repr=False, eq=False, converter=check_token
    )
    revision: str | None = attrs.field(kw_only=True, default=None)
    endpoint: str | None = attrs.field(kw_only=True, default=None, converter=_endpoint_rstrip)
    timeout: float = attrs.field(kw_only=True, default=30.0)
    max_workers: int = attrs.field(kw_only=True, default=8)
    lock_timeout: float = attrs.field(kw_only=True, default=3600.0)
    download_dir_origin: str | None = attrs.field(kw_only=True, default=None, repr=False)
    _listing: _Listing | None = attrs.field(init=False, default=None, repr=False, eq=False)

    def __attrs_post_init__(self) -> None:
        _check_repo_id(self.repo_id)
        _check_revision(self.revision)
        try:
            _check_endpoint(self.endpoint)
        except ConfigError as exc:  # an endpoint may hold the token: never shown
            raise scrub_config_error(exc, hub_token_in_use(self._token)) from None
        check_number("timeout", self.timeout, positive=True, at_most=_MAX_TIMEOUT)
        check_seconds("lock_timeout", self.lock_timeout)  # 0 (no waiting) up to MAX_SECONDS
        self._folder_name.check(self.download_dir)
        check_int("max_workers", self.max_workers, 1)

    def __repr__(self) -> str:
        shown = ", ".join(
            f"{field.name}={quoted(getattr(self, field.name))}"
            for field in attrs.fields(type(self))
            if field.repr
        )
        return self._shown(f"{type(self).__name__}({shown})")

    @property
    def description(self) -> str:
        """``hub:<repo_id>@<revision>``, plus `` via <endpoint>`` when one is set; for messages.

        The token in use is scrubbed from the endpoint (``<token>``): every
        message, log line and `Checkpoint` of this source carries it.
        """
        where = f"hub:{self.repo_id}@{self.revision or 'main'}"
        return f"{where} via {self._shown(self.endpoint)}" if self.endpoint else where

    def _shown(self, text: str) -> str:
        """``text`` without the token a request of this source carries (`hub_token_in_use`).

        Without ``token=`` and an endpoint, nothing of this source can hold the
        token huggingface_hub finds: it is not looked up.
        """
        if self._token is None and not self.endpoint:
            return text
        return scrub(text, hub_token_in_use(self._token))

    # ------------------------------------------------------------ protocol

    def latest(self) -> Checkpoint | None:
        """The newest complete checkpoint folder in the repo, or None; one listing.

        A checkpoint folder that cannot be downloaded safely (`_list`) and is
        newer than the one chosen is a `CheckpointSourceError`: it may hold
        the newest progress. ``last-checkpoint`` keeps its step in a file, so
        an unusable one is newer than anything, as far as can be known.
        """
        listing = self._list()
        if LAST_CHECKPOINT in listing.unusable:
            raise self._unusable(LAST_CHECKPOINT, listing.unusable[LAST_CHECKPOINT], None)
        numbered = sorted(
            (
                (step, folder)
                for folder in [*listing.folders, *listing.unusable]
                if (step := checkpoint_step(folder)) is not None
            ),
            # On a tie a usable folder first: an unusable one of its step hides nothing newer.
            key=lambda item: (-item[0], item[1] in listing.unusable, item[1]),
        )
        for folder in listing.folders:
            reason = absurd_step_reason(folder)
            if reason is not None:
                log.warning("ignoring %s in %s: %s", shorten(folder), self.description, reason)
        last_step = self._last_step_or_unusable(listing, numbered)
        best: Checkpoint | None = None
        for step, folder in numbered:
            if last_step is not None and (
                step < last_step or (step == last_step and folder in listing.unusable)
            ):
                break  # last-checkpoint is as new as what is left
            if folder in listing.unusable:  # newer than any complete one found so far
                raise self._unusable(folder, listing.unusable[folder], step)
            why = _listed_incomplete(folder, listing.folders[folder])
            if why is None:
                best = Checkpoint(step, folder, self.description)
                break
            log.warning(
                "skipping incomplete checkpoint %s in %s: %s", folder, self.description, why
            )
        # On a tie the numbered folder wins: it is not rewritten by later pushes.
        if last_step is not None and (best is None or last_step > best.step):
            best = Checkpoint(last_step, LAST_CHECKPOINT, self.description)
        log.debug("newest complete checkpoint in %s: %s", self.description, best)
        return best

    def _last_step_or_unusable(
        self, listing: _Listing, numbered: list[tuple[int, str]]
    ) -> int | None:
        """`_complete_last_step`; if it cannot be read, the newest unusable folder's error.

        The unusable folder was to be weighed against ``last-checkpoint``'s
        step: with that step unknown, it may be the newest checkpoint.
        """
        try:
            return self._complete_last_step(listing)
        except CheckpointSourceError as exc:
            for step, folder in numbered:
                if folder in listing.unusable:
                    raise self._unusable(folder, listing.unusable[folder], step) from exc
                if _listed_incomplete(folder, listing.folders[folder]) is None:
                    break  # a complete one comes first: the source's error stands
            raise

    def _complete_last_step(self, listing: _Listing) -> int | None:
        """The step of a complete ``last-checkpoint``; ``None`` when there is none (logged)."""
        last = listing.folders.get(LAST_CHECKPOINT)
        if last is None:
            return None
        why = _listed_incomplete(LAST_CHECKPOINT, last)
        if why is not None:
            log.warning("skipping incomplete %s in %s: %s", LAST_CHECKPOINT, self.description, why)
            return None
        return self._last_checkpoint_step(listing)

    def _unusable(self, folder: str, why: str, step: int | None) -> CheckpointSourceError:
        """The error for a checkpoint folder the listing shows but that cannot be fetched safely.

        It may be the newest checkpoint: passing over it (a fresh start, an
        older checkpoint) would overwrite the progress it holds.
        """
        msg = (
            f"cannot use {shorten(folder)} in {self.description}: the listing has {why}; a "
            "checkpoint that cannot be downloaded safely is not an interrupted save, so it is "
            "neither skipped nor resumed from: remove or repair it in the repo"
        )
        return CheckpointSourceError(msg, checkpoint_unreadable=True, step=step)

    def fetch(self, checkpoint: Checkpoint) -> Path:
        """Download only ``checkpoint``'s folder into ``download_dir``; return its local path."""
        check_origin(self.description, checkpoint)
        folder = checkpoint.path
        if folder != LAST_CHECKPOINT and checkpoint_step(folder) is None:
            raise ConfigError.invalid("checkpoint", checkpoint, "is not a checkpoint folder name")
        listing = self._listing if self._listing is not None else self._list()
        files = listing.folders.get(folder, {})
        if _listed_incomplete(folder, files) is not None:
            cause = FileNotFoundError(errno.ENOENT, "not in the repo listing", f"{folder}/")
            msg = f"{folder} is not (or no longer) a complete checkpoint in {self.description}"
            raise CheckpointSourceError(msg) from cause
        _refuse_offline("download from", self.description)
        remote = RemoteFolder(
            origin=self.description,
            repo_id=self.repo_id,
            commit=listing.commit,
            name=folder,
            step=checkpoint.step,
            files=files,
        )
        return fetch_folder(
            self.download_dir,
            remote,
            lock_timeout=self.lock_timeout,
            download=self._download_all,
            name=self._folder_name,
        )

    @property
    def _folder_name(self) -> FolderName:
        """What errors call ``download_dir``: see ``download_dir_origin``."""
        origin = self.download_dir_origin
        if origin is None:
            return FolderName()
        named = origin.split("=", 1)[0] if "=" in origin else ""
        setting = named.removeprefix("under ") if named.startswith("under ") else "output_dir"
        return FolderName("the Hub download folder", f"the folder is verirl's, {origin}", setting)

    # ------------------------------------------------------------ listing

    def _list(self) -> _Listing:
        """Resolve the revision to a commit and list the repo once, recursively.

        What the listing says is checked before anything is downloaded: a
        commit id that is not one is an error; a folder holding a path that
        would land outside it, or a file without a plausible size, is ignored
        with a warning (a download of it could not be verified).
        """
        _refuse_offline("list", self.description)
        try:
            token = self._request_token()
            api = hub_api(self.endpoint, token)
            _look_up_hub_host(api.endpoint, self.timeout)
            info = api.model_info(self.repo_id, revision=self.revision, timeout=self.timeout)
            commit = _commit_id(info.sha, self.revision)
            entries = list_tree(
                api.endpoint, self.repo_id, commit, token,
                timeout=self.timeout, description=self.description,
            )  # fmt: skip
        except (CheckpointSourceError, ConfigError):
            raise
        except Exception as exc:
            raise self._error("list", exc) from exc
        folders, unusable = _folders_of(entries)
        for folder, why in unusable.items():
            # A download would be written wherever the path points, or could not be checked.
            folders.pop(folder, None)
            if folder != LAST_CHECKPOINT and checkpoint_step(folder) is None:
                log.warning(
                    "ignoring %s in %s: the listing has %s", shorten(folder), self.description, why
                )
        listing = _Listing(commit=commit, folders=folders, unusable=unusable)
        log.debug(
            "%s is at commit %s; %d top-level folders", self.description, commit, len(folders)
        )
        self._listing = listing
        return listing

    def _last_checkpoint_step(self, listing: _Listing) -> int | None:
        """``global_step`` of ``last-checkpoint/trainer_state.json`` (a small download), or None.

        A state that is not a JSON object, or has no usable step, makes the
        folder incomplete (skipped with a warning). A download of another size
        than the listing's is a `CheckpointSourceError`: a mirror or proxy cut
        the body, and the checkpoint may well be the newest.
        """
        filename = f"{LAST_CHECKPOINT}/{TRAINER_STATE}"
        size = listing.folders[LAST_CHECKPOINT][filename].size
        if size > MAX_TRAINER_STATE_BYTES:  # not an interrupted save: never skipped
            why = f"a {TRAINER_STATE} of {human_size(size)}, too large to be a Trainer state"
            raise self._unusable(LAST_CHECKPOINT, why, None)
        token = self._request_token()  # its own errors (a bad token) as they are
        with tempfile.TemporaryDirectory(prefix="verirl-hub-") as tmp:
            try:
                got = self._download(filename, listing.commit, Path(tmp), token).stat().st_size
                # Unreadable once downloaded (an I/O error): an error, not "no checkpoint".
                state, why = read_trainer_state(Path(tmp) / LAST_CHECKPOINT)
            except Exception as exc:
                raise self._error(f"read {filename} from", exc, listed=True) from exc
        if got != size:  # a mirror or proxy cut the body short
            problem = f"{filename} has {got} bytes, the listing says {size}"
            msg = f"downloaded {filename} from {self.description} but it is unusable: {problem}"
            raise CheckpointSourceError(msg, checkpoint_unreadable=True) from ValueError(problem)
        if state is None:
            log.warning("skipping %s in %s: %s", LAST_CHECKPOINT, self.description, why)
            return None
        step = global_step(state)
        if step is None:
            log.warning(
                "skipping %s in %s: %s has no usable global_step (%s)",
                LAST_CHECKPOINT,
                self.description,
                TRAINER_STATE,
                shorten(quoted(state.get("global_step"))),
            )
        return step

    # ------------------------------------------------------------ transfers

    def _download_all(self, filenames: Sequence[str], commit: str, local_dir: Path) -> None:
        """Download ``filenames`` at ``commit`` into ``local_dir``, ``max_workers`` at once."""
        workers = max(1, min(self.max_workers, len(filenames)))
        try:
            token = self._request_token()
            _look_up_hub_host(hub_endpoint(self.endpoint), self.timeout)
        except ConfigError:
            raise
        except Exception as exc:
            raise self._error("download from", exc) from exc
        pending = collections.deque(filenames)
        stop = threading.Event()

        def drain() -> None:
            while not stop.is_set():
                try:
                    name = pending.popleft()
                except IndexError:
                    return
                self._download(name, commit, local_dir, token)

        # Daemon threads (a ThreadPoolExecutor's are joined at exit): a process
        # interrupted meanwhile (SIGTERM, Ctrl-C) never waits for a download to end.
        runners = [_DOWNLOADERS.submit(drain) for _ in range(workers)]
        try:
            for runner in as_completed(runners):
                runner.result()
        except Exception as exc:
            stop.set()
            wait_futures(runners)  # the requests in flight end, each within its timeout
            raise self._error("download from", exc, listed=True) from exc
        except BaseException:
            stop.set()  # no wait: the process's teardown bounds what is left
            raise

    def _download(self, filename: str, commit: str, local_dir: Path, token: str | bool) -> Path:
        return download_file(
            self.repo_id, filename, commit, local_dir, token,
            endpoint=self.endpoint, timeout=self.timeout,
        )  # fmt: skip

    def _request_token(self) -> str | bool:
        """The token requests send: ``token=``, else the one huggingface_hub finds; False: none.

        Found within ``timeout`` (`hub_token_within`: an OIDC exchange or an
        OAuth refresh has no deadline of its own) and checked as ``token=`` is
        (`implicit_hub_token`: a `ConfigError` naming where it is, never
        showing it). Passed on explicitly, so that huggingface_hub never looks
        again with no deadline; False when it would send none.
        """
        if self._token is not None:
            return self._token
        implicit_hub_token()
        if hub_offline() or implicit_token_disabled():
            return False
        try:
            return hub_token_within(self.timeout) or False
        except TimeoutError as exc:
            raise CheckpointSourceError(f"cannot reach {self.description}: {exc}") from exc

    # ------------------------------------------------------------ errors

    def _error(
        self, doing: str, exc: BaseException, *, listed: bool = False
    ) -> CheckpointSourceError:
        """A `CheckpointSourceError` for ``exc`` whose message names the repo, never the token.

        The token is also scrubbed from ``exc`` and its chain, which becomes the cause.
        ``listed``: the request was for a file of the listing, at its commit: a
        refusal of it (401, 403, 404, 410, 451) says a checkpoint is there but
        cannot be read (``checkpoint_unreadable``), not that the Hub is away; so
        does a file system error on this machine while writing it (a full disk,
        permissions, a read-only mount), which would stop any other download too.
        """
        # token=None: huggingface_hub sent the one it found (HF_TOKEN_PATH, the saved login).
        token = hub_token_in_use(self._token)
        scrub_exception(exc, token)
        message = f"cannot {doing} {self.description}: {_describe_hub_error(exc)}"
        refused = listed and (
            (_status_code(exc) in _REFUSALS and _answered_by_hub(exc, hub_endpoint(self.endpoint)))
            or _local_failure(exc)
        )
        return CheckpointSourceError(
            scrub(message, token), repo_missing=_repo_missing(exc), checkpoint_unreadable=refused
        )

"""Pick the checkpoint to resume from after a preemption, locally or on the Hub.

Trainer writes ``trainer_state.json`` last, so a ``checkpoint-N`` folder
without a readable one is the leftover of a job killed while saving. Resuming
from it crashes (transformers' ``get_last_checkpoint`` does not check), so
here such folders are skipped with a warning and never touched. A Hub source
lists the repo once and downloads only the checkpoint that was chosen, where
the old helper's ``snapshot_download(allow_patterns=["checkpoint-*/**", ...])``
downloaded every checkpoint (weights and optimizer state) to use one::

    resolver = CheckpointResolver([
        LocalCheckpointSource("/x/out"),
        HubCheckpointSource("org/run", download_dir="/x/hub-download", token=token),
    ])
    resume_from = resolver.resolve_from_env()  # None, or a local directory
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import re
import shutil
import tempfile
from collections.abc import Iterable, Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable
from urllib.parse import quote

import attrs

from verirl._fs import (
    OWNER_MARKER,
    FileRefusedError,
    expand_user,
    flock_with_deadline,
    lstat_kind,
    make_owned_dir,
    read_capped,
    read_owner_record,
)
from verirl._secrets import check_token, redact_url, scrub, scrub_exception
from verirl._validate import check_number, check_seconds
from verirl._version import __version__
from verirl.envserver import validate_http_url
from verirl.errors import CheckpointNotFoundError, CheckpointSourceError, ConfigError

if TYPE_CHECKING:
    from huggingface_hub import HfApi

__all__ = [
    "RESUME_ENV_VAR",
    "Checkpoint",
    "CheckpointResolver",
    "CheckpointSource",
    "HubCheckpointSource",
    "LocalCheckpointSource",
    "read_trainer_state",
]

log = logging.getLogger(__name__)

RESUME_ENV_VAR = "VERIRL_RESUME_FROM_CHECKPOINT"
"""The environment variable `CheckpointResolver.resolve_from_env` reads."""

TRAINER_STATE = "trainer_state.json"
LAST_CHECKPOINT = "last-checkpoint"
_LATEST_REQUESTS = frozenset({"latest", LAST_CHECKPOINT})
# ASCII digits only: str.isdigit and \d also accept e.g. Arabic-Indic digits.
_CHECKPOINT_NAME = re.compile(r"checkpoint-([0-9]+)", re.ASCII)
# A Hub repo id: "name" or "namespace/name", as huggingface_hub validates it.
_REPO_ID = re.compile(r"(?:[A-Za-z0-9][\w.-]*/)?[A-Za-z0-9][\w.-]*", re.ASCII)
_OFFLINE_ENV_VARS = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
_TRUE_VALUES = frozenset({"1", "ON", "YES", "TRUE"})
_KIB = 1024
_MAX_TREE_PAGES = 10_000  # 10 million files at the Hub's 1000 a page
_MAX_REPO_ID = 96  # the Hub's limit
_MAX_REVISION = 255  # longer than any git ref or commit id the Hub serves
_REVISION_BAD_CHARS = re.compile(r"[~^:?*\[\\]")
MAX_TRAINER_STATE_BYTES = 64 * _KIB * _KIB
"""A ``trainer_state.json`` larger than this is not read (Trainer's are kilobytes to megabytes)."""
_MAX_TIMEOUT = 24 * 3600.0
# Bookkeeping in download_dir, all of it verirl's own: a lock file per folder, a marker in
# each folder verirl downloaded, and staging folders that are renamed into place when complete.
_MARKER = ".verirl-download.json"
_MAX_MARKER_BYTES = 16 * _KIB * _KIB
_STAGING_PREFIX = ".verirl-tmp-"
_OLD_PREFIX = ".verirl-old-"


def _checkpoint_step(name: str) -> int | None:
    """Step of a strict ``checkpoint-N`` name, else None (``tmp-checkpoint-5``, ``x.bak``)."""
    match = _CHECKPOINT_NAME.fullmatch(name)
    return int(match.group(1)) if match else None


def read_trainer_state(  # noqa: PLR0911 - one return per way the file can be unusable
    folder: str | os.PathLike[str],
) -> tuple[dict[str, object] | None, str]:
    """Read ``folder/trainer_state.json``: ``(state, "")``, or ``(None, why it is unusable)``.

    A checkpoint is complete exactly when this returns a state: Trainer writes
    the file last, so its absence (or a torn write) marks an interrupted save.
    """
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


def _global_step(state: Mapping[str, object]) -> int | None:
    step = state.get("global_step")
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        return None
    return step


def _human_size(size: int) -> str:
    if size < _KIB:
        return f"{size} B"
    value, unit = size / _KIB, "KiB"
    for bigger in ("MiB", "GiB", "TiB"):
        if value < _KIB:
            break
        value, unit = value / _KIB, bigger
    return f"{value:.1f} {unit}"


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
        step: object = self.step
        if isinstance(step, bool) or not isinstance(step, int) or step < 0:
            raise ConfigError.invalid("step", step, "must be an int >= 0")
        for field in ("path", "source"):
            value: object = getattr(self, field)
            if not isinstance(value, str) or not value:
                raise ConfigError.invalid(field, value, "must be a non-empty string")


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


def _path(field: str, value: object) -> Path:
    """A directory path from a user: ``~`` expanded, and one the OS can use, else `ConfigError`."""
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
        pass  # created (or found empty) later
    except OSError as exc:
        raise ConfigError.invalid(field, value, f"cannot be used ({exc.strerror})") from None
    return path


def _root_path(value: str | os.PathLike[str]) -> Path:
    return _path("root", value)


def _download_dir_path(value: str | os.PathLike[str]) -> Path:
    return _path("download_dir", value)


def _check_source(
    source: LocalCheckpointSource | HubCheckpointSource, checkpoint: Checkpoint
) -> None:
    if checkpoint.source != source.description:
        raise ConfigError.invalid(
            "checkpoint",
            checkpoint,
            f"comes from {checkpoint.source!r}, not from {source.description!r}",
        )


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

    def _numbered_dirs(self) -> list[tuple[int, str]]:
        try:
            with os.scandir(self.root) as entries:
                found = []
                for entry in entries:
                    step = _checkpoint_step(entry.name)
                    if step is not None and _is_dir(entry):
                        found.append((step, entry.name))
        except FileNotFoundError:
            log.debug("%s does not exist yet: no local checkpoints", self.root)
            return []
        except OSError as exc:
            msg = f"cannot list {self.description}: {type(exc).__name__}: {exc}"
            raise CheckpointSourceError(msg) from exc
        # Newest first; on equal steps (checkpoint-7, checkpoint-007) the name decides.
        return sorted(found, key=lambda item: (-item[0], item[1]))

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
        _check_source(self, checkpoint)
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


def _is_dir(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_dir()  # follows symlinks: a linked checkpoint counts
    except OSError:
        return False


def _check_repo_id(value: object) -> None:
    if not isinstance(value, str) or not value:
        raise ConfigError.invalid("repo_id", value, "must be a non-empty 'namespace/name' string")
    if (
        len(value) > _MAX_REPO_ID
        or not _REPO_ID.fullmatch(value)
        or "--" in value
        or ".." in value
        or value.endswith((".", "-"))
    ):
        raise ConfigError.invalid("repo_id", value, "is not a valid Hub repo id ('namespace/name')")


def _check_revision(value: object) -> None:
    """A branch, tag, ``refs/pr/N`` or commit id: a name git itself would accept.

    Refused before any request: control characters, whitespace, ``..`` and
    the other path tricks ``git check-ref-format`` refuses, and names longer
    than `_MAX_REVISION`.
    """
    if value is None:
        return
    if not isinstance(value, str) or not value.strip():
        raise ConfigError.invalid("revision", value, "must be None or a non-empty string")
    if len(value) > _MAX_REVISION:
        raise ConfigError.invalid(
            "revision", value, f"is too long ({len(value)} characters, at most {_MAX_REVISION})"
        )
    bad = next((ch for ch in value if ch.isspace() or not ch.isprintable()), None)
    if bad is not None:
        raise ConfigError.invalid(
            "revision", value, f"must not contain whitespace or control characters ({bad!r})"
        )
    parts = value.split("/")
    if (
        _REVISION_BAD_CHARS.search(value)
        or ".." in value
        or "@{" in value
        or value.endswith((".", ".lock"))
        or any(not part or part.startswith(".") for part in parts)
    ):
        raise ConfigError.invalid(
            "revision",
            value,
            "is not a valid branch, tag or commit name (no '..', '~^:?*[\\', '@{', empty or "
            "'.'-led path parts, trailing '.' or '.lock')",
        )


def _check_endpoint(value: object) -> None:
    """An ``http(s)://host[:port][/path]`` URL; the message never shows a password in it."""
    if value is None:
        return
    if isinstance(value, str):
        # Any "@" counts as credentials (a password may hold "#", "?" or "/"),
        # and only the redacted form is ever shown.
        shown = redact_url(value)
        if shown != value:
            raise ConfigError.invalid(
                "endpoint", shown, "must not carry credentials; pass token= instead"
            )
        if "?" in value or "#" in value:
            raise ConfigError.invalid("endpoint", shown, "must not have a ?query or #fragment")
        if any(ch.isspace() or not ch.isprintable() for ch in value):
            raise ConfigError.invalid(
                "endpoint", shown, "must not contain whitespace or control characters"
            )
    validate_http_url("endpoint", value)


def _safe_repo_path(path: str) -> bool:
    """Whether ``path`` stays inside its folder when joined to a local directory."""
    parts = path.split("/")
    return (
        all(part not in ("", ".", "..") for part in parts)
        and "\\" not in path
        and "\0" not in path
        and parts[-1] != _MARKER
    )


def _empty_token_to_none(value: object) -> object:
    return None if value == "" else value


def _endpoint_rstrip(value: str | None) -> str | None:
    return value.rstrip("/") if isinstance(value, str) else value


def _hub_offline() -> bool:
    """Whether HF offline mode is on, as huggingface_hub saw it at import or the env says now."""
    if any(os.environ.get(name, "").upper() in _TRUE_VALUES for name in _OFFLINE_ENV_VARS):
        return True
    from huggingface_hub import constants  # noqa: PLC0415 - keep import verirl light

    return bool(constants.is_offline_mode())


@attrs.frozen
class _Entry:
    """One file of the listing: its size and its content id (LFS sha256, else the git blob id)."""

    size: int
    oid: str


@attrs.frozen
class _Listing:
    """What one tree listing of the repo said: the commit, and each top-level folder's files."""

    commit: str
    folders: Mapping[str, Mapping[str, _Entry]]


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

    ``endpoint`` and ``token`` go to huggingface_hub as they are (``HF_ENDPOINT``
    is read when huggingface_hub is imported, so ``endpoint`` is how a mirror or
    a test server is reached); ``token=None`` lets huggingface_hub find one
    (``HF_TOKEN``, ``hf auth login``). The token never appears in a repr, log
    line or error message, and one with whitespace or control characters is a
    `ConfigError`. ``HF_HUB_OFFLINE`` makes every call a `CheckpointSourceError`.
    ``timeout`` bounds each metadata request; ``max_workers`` files are
    downloaded at once. ``~`` in ``download_dir`` is expanded.
    """

    repo_id: str
    download_dir: Path = attrs.field(kw_only=True, converter=_download_dir_path)
    _token: str | None = attrs.field(
        kw_only=True,
        default=None,
        alias="token",
        repr=False,
        eq=False,
        converter=_empty_token_to_none,
    )
    revision: str | None = attrs.field(kw_only=True, default=None)
    endpoint: str | None = attrs.field(kw_only=True, default=None, converter=_endpoint_rstrip)
    timeout: float = attrs.field(kw_only=True, default=30.0)
    max_workers: int = attrs.field(kw_only=True, default=8)
    lock_timeout: float = attrs.field(kw_only=True, default=3600.0)
    _listing: _Listing | None = attrs.field(init=False, default=None, repr=False, eq=False)

    def __attrs_post_init__(self) -> None:
        self._token = check_token(self._token)
        _check_repo_id(self.repo_id)
        _check_revision(self.revision)
        _check_endpoint(self.endpoint)
        check_number("timeout", self.timeout, positive=True, at_most=_MAX_TIMEOUT)
        check_seconds("lock_timeout", self.lock_timeout)  # 0 (no waiting) up to MAX_SECONDS
        if self.download_dir.exists() and not self.download_dir.is_dir():
            raise ConfigError.invalid(
                "download_dir", str(self.download_dir), "exists and is not a directory"
            )
        workers: object = self.max_workers
        if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
            raise ConfigError.invalid("max_workers", workers, "must be an int >= 1")

    @property
    def description(self) -> str:
        """``hub:<repo_id>@<revision>``, plus `` via <endpoint>`` when one is set."""
        where = f"hub:{self.repo_id}@{self.revision or 'main'}"
        return f"{where} via {self.endpoint}" if self.endpoint else where

    # ------------------------------------------------------------ helpers

    def _error(self, doing: str, exc: BaseException) -> CheckpointSourceError:
        """A `CheckpointSourceError` for ``exc`` whose message names the repo, never the token.

        The token is also scrubbed from ``exc`` and its chain, which becomes the cause.
        """
        scrub_exception(exc, self._token)
        message = f"cannot {doing} {self.description}: {_describe_hub_error(exc)}"
        return CheckpointSourceError(scrub(message, self._token))

    def _refuse_offline(self, doing: str) -> None:
        if _hub_offline():
            from huggingface_hub.errors import OfflineModeIsEnabled  # noqa: PLC0415

            cause = OfflineModeIsEnabled("HF_HUB_OFFLINE is set")
            raise CheckpointSourceError(
                f"cannot {doing} {self.description}: Hugging Face Hub offline mode is on "
                "(HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE); unset it, or resume from a local "
                "checkpoint"
            ) from cause

    def _api(self) -> HfApi:
        from huggingface_hub import HfApi  # noqa: PLC0415

        return HfApi(
            endpoint=self.endpoint,
            token=self._token,
            library_name="verirl",
            library_version=__version__,
        )

    def _list(self) -> _Listing:
        """Resolve the revision to a commit and list the repo once, recursively."""
        self._refuse_offline("list")
        api = self._api()
        try:
            info = api.model_info(self.repo_id, revision=self.revision, timeout=self.timeout)
            commit = info.sha or self.revision or "main"
            entries = self._tree(api.endpoint, commit)
        except CheckpointSourceError:
            raise
        except Exception as exc:
            raise self._error("list", exc) from exc
        folders: dict[str, dict[str, _Entry]] = {}
        unsafe: dict[str, str] = {}
        for entry in entries:
            path, size = entry.get("path"), entry.get("size")
            if entry.get("type") != "file" or not isinstance(path, str) or "/" not in path:
                continue
            if not _safe_repo_path(path):
                unsafe.setdefault(path.split("/", 1)[0], path)
                continue
            lfs = entry.get("lfs")
            lfs_sha = lfs.get("sha256") if isinstance(lfs, dict) else None
            oid = str(lfs_sha or entry.get("oid") or "")
            if isinstance(size, bool) or not isinstance(size, int) or size < 0:
                raise CheckpointSourceError(
                    f"cannot list {self.description}: the listing gives {path} no usable size"
                ) from ValueError(size)
            folders.setdefault(path.split("/", 1)[0], {})[path] = _Entry(size, oid)
        for folder, path in unsafe.items():
            # A download would be written wherever the path points: the folder is unusable.
            folders.pop(folder, None)
            log.warning(
                "ignoring %s in %s: the listing has a file path that is not safe to download (%r)",
                folder,
                self.description,
                path,
            )
        listing = _Listing(commit=commit, folders=folders)
        log.debug(
            "%s is at commit %s; %d top-level folders", self.description, commit, len(folders)
        )
        self._listing = listing
        return listing

    def _tree(self, endpoint: str, commit: str) -> list[dict[str, object]]:
        """The recursive tree listing at ``commit``, every page within ``timeout``.

        `HfApi.list_repo_tree` takes no timeout, so the pages are fetched here
        with huggingface_hub's own session, headers and error mapping. A server
        that keeps sending "next" links is cut off after `_MAX_TREE_PAGES`.
        """
        from huggingface_hub import get_session, hf_raise_for_status  # noqa: PLC0415

        # Public and documented, but re-exported lazily, which mypy cannot see.
        from huggingface_hub.utils import build_hf_headers  # type: ignore[attr-defined]  # noqa: PLC0415

        headers = build_hf_headers(
            token=self._token, library_name="verirl", library_version=__version__
        )
        url: str | None = f"{endpoint}/api/models/{self.repo_id}/tree/{quote(commit, safe='')}"
        params: dict[str, str] | None = {"recursive": "true", "expand": "false"}
        entries: list[dict[str, object]] = []
        seen: set[str] = set()
        while url is not None:
            if url in seen or len(seen) >= _MAX_TREE_PAGES:
                msg = f"cannot list {self.description}: the tree listing does not end"
                raise CheckpointSourceError(msg) from ValueError(url)
            seen.add(url)
            response = get_session().get(url, headers=headers, params=params, timeout=self.timeout)
            hf_raise_for_status(response)
            page = response.json()
            if not isinstance(page, list):
                msg = f"cannot list {self.description}: the tree listing is not a JSON list"
                raise CheckpointSourceError(msg) from ValueError(type(page).__name__)
            entries += [entry for entry in page if isinstance(entry, dict)]
            url, params = response.links.get("next", {}).get("url"), None
        return entries

    def _download(self, filename: str, commit: str, local_dir: Path) -> Path:
        from huggingface_hub import hf_hub_download  # noqa: PLC0415

        path = hf_hub_download(
            self.repo_id,
            filename,
            revision=commit,
            local_dir=local_dir,
            # Keep everything under local_dir: huggingface_hub only reads this cache here,
            # and the global one (~/.cache/huggingface) stays untouched.
            cache_dir=local_dir / ".cache" / "huggingface" / "hub",
            endpoint=self.endpoint,
            token=self._token,
            etag_timeout=self.timeout,
            library_name="verirl",
        )
        return Path(path)

    def _last_checkpoint_step(self, listing: _Listing) -> int | None:
        """``global_step`` of ``last-checkpoint/trainer_state.json`` (a small download), or None."""
        filename = f"{LAST_CHECKPOINT}/{TRAINER_STATE}"
        size = listing.folders[LAST_CHECKPOINT][filename].size
        if size > MAX_TRAINER_STATE_BYTES:
            log.warning(
                "skipping %s in %s: its %s is too large to be a Trainer state (%s)",
                LAST_CHECKPOINT,
                self.description,
                TRAINER_STATE,
                _human_size(size),
            )
            return None
        with tempfile.TemporaryDirectory(prefix="verirl-hub-") as tmp:
            try:
                self._download(filename, listing.commit, Path(tmp))
            except Exception as exc:
                raise self._error(f"read {filename} from", exc) from exc
            state, why = read_trainer_state(Path(tmp) / LAST_CHECKPOINT)
        if state is None:
            log.warning("skipping %s in %s: %s", LAST_CHECKPOINT, self.description, why)
            return None
        step = _global_step(state)
        if step is None:
            log.warning(
                "skipping %s in %s: %s has no usable global_step (%r)",
                LAST_CHECKPOINT,
                self.description,
                TRAINER_STATE,
                state.get("global_step"),
            )
        return step

    # ------------------------------------------------------------ protocol

    def latest(self) -> Checkpoint | None:
        """The newest complete checkpoint folder in the repo, or None; one listing."""
        listing = self._list()
        best: Checkpoint | None = None
        numbered = sorted(
            (
                (step, folder)
                for folder in listing.folders
                if (step := _checkpoint_step(folder)) is not None
            ),
            key=lambda item: (-item[0], item[1]),
        )
        for step, folder in numbered:
            if f"{folder}/{TRAINER_STATE}" in listing.folders[folder]:
                best = Checkpoint(step, folder, self.description)
                break
            log.warning(
                "skipping incomplete checkpoint %s in %s: no %s (probably an interrupted upload)",
                folder,
                self.description,
                TRAINER_STATE,
            )
        last = listing.folders.get(LAST_CHECKPOINT)
        if last is not None:
            if f"{LAST_CHECKPOINT}/{TRAINER_STATE}" not in last:
                log.warning(
                    "skipping incomplete %s in %s: no %s",
                    LAST_CHECKPOINT,
                    self.description,
                    TRAINER_STATE,
                )
            else:
                step = self._last_checkpoint_step(listing)
                # On a tie the numbered folder wins: it is not rewritten by later pushes.
                if step is not None and (best is None or step > best.step):
                    best = Checkpoint(step, LAST_CHECKPOINT, self.description)
        log.debug("newest complete checkpoint in %s: %s", self.description, best)
        return best

    def fetch(self, checkpoint: Checkpoint) -> Path:
        """Download only ``checkpoint``'s folder into ``download_dir``; return its local path."""
        _check_source(self, checkpoint)
        folder = checkpoint.path
        if folder != LAST_CHECKPOINT and _checkpoint_step(folder) is None:
            raise ConfigError.invalid("checkpoint", checkpoint, "is not a checkpoint folder name")
        listing = self._listing if self._listing is not None else self._list()
        files = listing.folders.get(folder, {})
        if f"{folder}/{TRAINER_STATE}" not in files:
            cause = FileNotFoundError(errno.ENOENT, "not in the repo listing", f"{folder}/")
            msg = f"{folder} is not (or no longer) a complete checkpoint in {self.description}"
            raise CheckpointSourceError(msg) from cause
        self._refuse_offline("download from")
        root = self.download_dir
        try:
            root.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            msg = f"cannot create download_dir {root}: {type(exc).__name__}: {exc.strerror}"
            raise CheckpointSourceError(msg) from exc
        with self._folder_lock(root, folder):
            return self._fetch_locked(root, folder, checkpoint.step, listing.commit, files)

    # ------------------------------------------------------------ download_dir

    def _folder_lock(self, root: Path, folder: str) -> contextlib.AbstractContextManager[None]:
        lock = root / f".verirl-{folder}.lock"
        return _locked(lock, self.lock_timeout, f"another download of {folder} into {root}")

    def _fetch_locked(
        self, root: Path, folder: str, step: int, commit: str, files: Mapping[str, _Entry]
    ) -> Path:
        target = root / folder
        expected = {name.split("/", 1)[1]: entry for name, entry in files.items()}
        _remove_leftovers(root, folder)
        kind = lstat_kind(target)
        if kind in ("symlink", "file", "other"):
            what = "a symlink (never followed)" if kind == "symlink" else "not a directory"
            raise ConfigError.invalid(
                "download_dir",
                str(root),
                f"holds {folder}, which is {what} and which verirl did not download; refusing "
                "to overwrite it (use a dedicated download directory)",
            )
        if kind == "dir":
            marker = _read_marker(target)
            mismatch = _mismatch(target, expected, marker)
            if mismatch is None:
                log.info("%s already holds %s as listed; nothing to download", root, folder)
                _warn_about_strays(target, folder, expected)
                return target
            if marker is None:
                raise ConfigError.invalid(
                    "download_dir",
                    str(root),
                    f"already holds {folder}, which verirl did not download there ({mismatch}); "
                    "refusing to overwrite it (use a dedicated download directory, not the "
                    "training output_dir)",
                )
            strays = _strays(target, marker)
            if strays:
                raise ConfigError.invalid(
                    "download_dir",
                    str(root),
                    f"holds an outdated download of {folder} ({mismatch}) with files verirl did "
                    f"not download ({', '.join(strays[:10])}); refusing to replace it: move "
                    "those files away or delete the folder",
                )
            log.info("replacing the outdated download %s (%s)", target, mismatch)
        size = sum(entry.size for entry in expected.values())
        log.info(
            "downloading %s (step %d) from %s at commit %s: %d files, %s, into %s",
            folder,
            step,
            self.description,
            commit[:12],
            len(expected),
            _human_size(size),
            target,
        )
        staging = make_owned_dir(
            root,
            f"{_STAGING_PREFIX}{folder}-",
            {"kind": "staging", "folder": folder, "files": sorted(expected)},
        )
        try:
            self._download_all(sorted(files), commit, staging)
            fresh = staging / folder
            problem = _mismatch(fresh, expected, None)
            if problem is not None:
                msg = f"downloaded {folder} from {self.description} but it is unusable: {problem}"
                raise CheckpointSourceError(msg) from ValueError(problem)
            _write_marker(fresh, self.repo_id, commit, expected)
            _move_into_place(root, fresh, target, replace=kind == "dir")
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        log.info("downloaded %s (%s) to %s", folder, _human_size(size), target)
        return target

    def _download_all(self, filenames: list[str], commit: str, local_dir: Path) -> None:
        workers = max(1, min(self.max_workers, len(filenames)))
        with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="verirl-hub") as pool:
            futures = [pool.submit(self._download, name, commit, local_dir) for name in filenames]
            try:
                for future in futures:
                    future.result()
            except Exception as exc:
                pool.shutdown(wait=True, cancel_futures=True)
                raise self._error("download from", exc) from exc


@contextlib.contextmanager
def _locked(lock: Path, timeout: float, what: str) -> Iterator[None]:
    """`flock_with_deadline`, with its failures as `CheckpointSourceError`."""
    try:
        with flock_with_deadline(lock, timeout):
            yield
            return
    except TimeoutError as exc:
        msg = (
            f"gave up after waiting {timeout:g}s for {what} to finish (lock file {lock}); "
            "raise lock_timeout, or use a separate download_dir per job"
        )
        raise CheckpointSourceError(msg) from exc
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            msg = f"lock file {lock} is a symlink; refusing to follow it (remove it)"
        else:
            msg = f"cannot lock {lock}: {type(exc).__name__}: {exc.strerror or exc}"
        raise CheckpointSourceError(msg) from exc


def _remove_leftovers(root: Path, folder: str) -> None:
    """Delete ``folder``'s staging/old folders that a killed verirl left (the lock is ours now).

    Only a folder `make_owned_dir` made (a real directory with verirl's
    ownership marker, whose id is in its name) that holds nothing but what a
    download puts there goes. Anything else with such a name is a user's: it
    is left alone, with a warning.
    """
    prefixes = (f"{_STAGING_PREFIX}{folder}-", f"{_OLD_PREFIX}{folder}-")
    try:
        with os.scandir(root) as entries:
            candidates = sorted(Path(e.path) for e in entries if e.name.startswith(prefixes))
    except OSError as exc:
        msg = f"cannot list download_dir {root}: {type(exc).__name__}: {exc.strerror}"
        raise CheckpointSourceError(msg) from exc
    for path in candidates:
        prefix = next(p for p in prefixes if path.name.startswith(p))
        why = _not_a_leftover(path, prefix, folder)
        if why is None:
            log.info("removing %s, left by an interrupted download", path)
            shutil.rmtree(path, ignore_errors=True)  # never follows symlinks
        else:
            log.warning(
                "leaving %s alone: it is named like a folder of an interrupted verirl download, "
                "but %s; delete or move it yourself if you do not need it",
                path,
                why,
            )


def _not_a_leftover(path: Path, prefix: str, folder: str) -> str | None:
    """Why ``path`` is no staging/old folder of ``folder`` verirl may delete; None if it is."""
    record = read_owner_record(path, prefix)
    if isinstance(record, str):
        return record
    listed = record.get("files")
    if record.get("folder") != folder or not isinstance(listed, list):
        return f"its {OWNER_MARKER} is not about {folder}"
    files = {f"{folder}/{name}" for name in listed if isinstance(name, str)}
    files |= {OWNER_MARKER, f"{folder}/{_MARKER}"}
    parents = {
        "/".join(name.split("/")[:i]) for name in files for i in range(1, name.count("/") + 1)
    }
    cache = ".cache/huggingface"  # where huggingface_hub keeps a local_dir download's state
    try:
        for dirpath, dirnames, filenames in os.walk(path, followlinks=False):
            base = Path(dirpath)
            for name in [*dirnames, *filenames]:
                entry = base / name
                relative = entry.relative_to(path).as_posix()
                kind = lstat_kind(entry)
                in_cache = relative.startswith(f"{cache}/") or relative in (".cache", cache)
                if kind == "dir" and (relative in parents or in_cache):
                    continue
                if kind == "file" and (relative in files or relative.startswith(f"{cache}/")):
                    continue
                return f"it holds {relative!r}, which no download puts there"
    except OSError as exc:
        return f"it cannot be read ({type(exc).__name__}: {exc.strerror})"
    return None


def _read_marker(folder: Path) -> Mapping[str, object] | None:
    """The record verirl keeps in a folder it downloaded, or None (not ours, or unreadable)."""
    try:
        data = json.loads(read_capped(folder / _MARKER, _MAX_MARKER_BYTES, follow_symlinks=False))
    except (OSError, ValueError, RecursionError):
        return None
    if not isinstance(data, dict) or not isinstance(data.get("files"), dict):
        return None
    return data


def _write_marker(folder: Path, repo_id: str, commit: str, files: Mapping[str, _Entry]) -> None:
    record = {
        "written_by": "verirl",
        "repo_id": repo_id,
        "commit": commit,
        "files": {name: {"size": e.size, "oid": e.oid} for name, e in sorted(files.items())},
    }
    (folder / _MARKER).write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")


def _mismatch(
    folder: Path, expected: Mapping[str, _Entry], marker: Mapping[str, object] | None
) -> str | None:
    """Why ``folder`` does not hold ``expected`` (sizes, and ids when we recorded them), or None."""
    recorded = marker.get("files") if marker is not None else None
    for name, entry in sorted(expected.items()):
        path = folder / name
        try:
            info = path.lstat()
        except OSError:
            return f"{name} is missing"
        if lstat_kind(path) != "file":
            return f"{name} is not a regular file"
        if info.st_size != entry.size:
            return f"{name} has {info.st_size} bytes, the listing says {entry.size}"
        if isinstance(recorded, dict):
            seen = recorded.get(name)
            if not isinstance(seen, dict) or seen.get("oid") != entry.oid:
                return f"{name} changed on the Hub"
    state, why = read_trainer_state(folder)
    return why if state is None else None


def _files_in(folder: Path) -> list[str]:
    """Relative paths of everything but directories under ``folder``; symlinks are not followed."""
    found = []
    for dirpath, dirnames, filenames in os.walk(folder, followlinks=False):
        base = Path(dirpath)
        links = [d for d in dirnames if (base / d).is_symlink()]
        found += [(base / n).relative_to(folder).as_posix() for n in [*filenames, *links]]
    return sorted(found)


def _strays(folder: Path, marker: Mapping[str, object]) -> list[str]:
    recorded = marker.get("files")
    known = set(recorded) if isinstance(recorded, dict) else set()
    return [name for name in _files_in(folder) if name not in known and name != _MARKER]


def _move_into_place(root: Path, fresh: Path, target: Path, *, replace: bool) -> None:
    """Rename the verified download to ``target``; an old download of ours is removed after."""
    try:
        if replace:
            # rename() replaces an empty directory: the old folder goes aside in one step.
            # The old folder goes into a folder verirl owns first, so that a kill
            # before the end leaves only what the next run may safely delete.
            old = make_owned_dir(
                root,
                f"{_OLD_PREFIX}{target.name}-",
                {"kind": "old", "folder": target.name, "files": _files_in(target)},
            )
            target.rename(old / target.name)
            fresh.rename(target)
            shutil.rmtree(old, ignore_errors=True)
        elif lstat_kind(target) is not None:
            raise ConfigError.invalid(
                "download_dir",
                str(root),
                f"{target.name} appeared there during the download; refusing to overwrite it",
            )
        else:
            fresh.rename(target)  # fails rather than replace anything but an empty directory
    except OSError as exc:
        msg = f"cannot move the finished download into {target}: {type(exc).__name__}: {exc}"
        raise CheckpointSourceError(msg) from exc


def _warn_about_strays(target: Path, folder: str, files: Iterable[str]) -> None:
    """Warn about files in ``target`` the listed commit does not have (an older download's)."""
    expected = set(files) | {_MARKER}
    strays = [name for name in _files_in(target) if name not in expected]
    if strays:
        log.warning(
            "%s holds files the Hub's %s does not (from an earlier download?): %s",
            target,
            folder,
            ", ".join(strays[:10]) + (" ..." if len(strays) > 10 else ""),  # noqa: PLR2004
        )


def _describe_hub_error(exc: BaseException) -> str:
    """A short reason for a huggingface_hub / httpx failure, without request headers."""
    from huggingface_hub import errors  # noqa: PLC0415

    status = _status_code(exc)
    # Most specific first: GatedRepoError is a RepositoryNotFoundError, all are HfHubHTTPErrors.
    known: list[tuple[type[BaseException], str]] = [
        (errors.OfflineModeIsEnabled, "Hugging Face Hub offline mode is on (HF_HUB_OFFLINE)"),
        (errors.GatedRepoError, f"gated repository, the token has no access (HTTP {status})"),
        (
            errors.RepositoryNotFoundError,
            f"repository not found, or private and the token has no access (HTTP {status})",
        ),
        (errors.RevisionNotFoundError, f"revision not found (HTTP {status})"),
        (
            getattr(errors, "RemoteEntryNotFoundError", errors.EntryNotFoundError),
            f"file not found (HTTP {status})",
        ),
        (errors.HfHubHTTPError, f"HTTP {status}"),
    ]
    for kind, reason in known:
        if isinstance(exc, kind):
            return reason
    text = str(exc).strip()
    first_line = text.splitlines()[0] if text else ""
    return (f"{type(exc).__name__}: {first_line}" if first_line else type(exc).__name__)[:300]


def _status_code(exc: BaseException) -> int | None:
    response = getattr(exc, "response", None)
    status = getattr(response, "status_code", None)
    return status if isinstance(status, int) else None


def describe_source(source: object) -> str:
    """A source's ``description`` if it has one, else its repr; for messages."""
    description = getattr(source, "description", None)
    return description if isinstance(description, str) and description else repr(source)


def _check_sources(_inst: object, _attr: object, sources: tuple[object, ...]) -> None:
    for index, source in enumerate(sources):
        if not isinstance(source, CheckpointSource):
            raise ConfigError.invalid(
                f"sources[{index}]",
                source,
                "is not a CheckpointSource (it needs latest() and fetch())",
            )
    roots = {
        _resolved(s.root): s.description for s in sources if isinstance(s, LocalCheckpointSource)
    }
    for source in sources:
        if isinstance(source, HubCheckpointSource) and _resolved(source.download_dir) in roots:
            raise ConfigError.invalid(
                "sources",
                source.description,
                f"download_dir {source.download_dir} is the root of "
                f"{roots[_resolved(source.download_dir)]}; Hub downloads would land among (and "
                "could overwrite) local checkpoints, use a separate directory",
            )


def _resolved(path: Path) -> Path:
    # realpath, unlike Path.resolve() on Python < 3.13, does not raise on a symlink loop.
    return Path(os.path.realpath(path))


def _to_tuple(sources: Iterable[CheckpointSource]) -> tuple[CheckpointSource, ...]:
    value: object = sources
    if isinstance(value, (str, bytes, os.PathLike)) or not isinstance(value, Iterable):
        raise ConfigError.invalid(
            "sources",
            value,
            "must be a list of checkpoint sources (e.g. [LocalCheckpointSource(...)])",
        )
    return tuple(value)


@attrs.define
class CheckpointResolver:
    """Turn a resume request into a local checkpoint directory, or None for a fresh start.

    ``sources`` are searched in order; on equal steps the earlier one wins, so
    list local sources first and a checkpoint already on disk is never
    downloaded again. An empty list is allowed (explicit paths only).
    """

    _sources: tuple[CheckpointSource, ...] = attrs.field(
        alias="sources", converter=_to_tuple, validator=_check_sources
    )

    @property
    def sources(self) -> tuple[CheckpointSource, ...]:
        """The sources, in search order."""
        return self._sources

    def resolve(self, request: str | os.PathLike[str] | None) -> str | None:
        """Resolve ``request`` (see the table in the README).

        ``None`` or blank: None (fresh start). ``"latest"`` or ``"last-checkpoint"``:
        the newest complete checkpoint over all sources, fetched, as a local
        path; `CheckpointNotFoundError` when there is none, `CheckpointSourceError`
        when there is none and a source failed. Anything else: an existing
        directory, returned with ``~`` expanded (`CheckpointNotFoundError` otherwise).
        """
        given: object = request
        if isinstance(given, os.PathLike):
            given = os.fspath(given)
        if given is not None and not isinstance(given, str):
            raise ConfigError.invalid(
                "request", request, "must be None, 'latest', or a checkpoint path (str or PathLike)"
            )
        request = given
        if request is None or not request.strip():
            log.info("no checkpoint requested: starting fresh")
            return None
        request = request.strip()
        if request in _LATEST_REQUESTS:
            return self._resolve_latest(request)
        return _resolve_explicit(request)

    def resolve_from_env(self, environ: Mapping[str, str] | None = None) -> str | None:
        """`resolve` the value of ``VERIRL_RESUME_FROM_CHECKPOINT`` (unset: fresh start)."""
        env = os.environ if environ is None else environ
        if not isinstance(env, Mapping):
            raise ConfigError.invalid("environ", environ, "must be None or a mapping of str to str")
        value: object = env.get(RESUME_ENV_VAR)
        if value is not None and not isinstance(value, str):
            raise ConfigError.invalid(RESUME_ENV_VAR, value, "must be a string")
        log.debug("%s=%r", RESUME_ENV_VAR, value)
        return self.resolve(value)

    def _resolve_latest(self, request: str) -> str:
        found_all: list[tuple[Checkpoint, CheckpointSource]] = []
        failures: list[tuple[CheckpointSource, Exception]] = []
        for source in self._sources:
            try:
                found = source.latest()
            except (CheckpointSourceError, OSError) as exc:
                failures.append((source, exc))
                continue
            log.debug("%s: newest complete checkpoint %s", describe_source(source), found)
            if found is not None:
                found_all.append((found, source))
        searched = [describe_source(source) for source in self._sources]
        if not found_all:
            if failures:
                reasons = "; ".join(str(exc) for _, exc in failures)
                msg = (
                    f"no checkpoint for {request!r}: {len(failures)} of {len(searched)} "
                    f"source(s) could not be read ({reasons}); searched: {', '.join(searched)}"
                )
                raise CheckpointSourceError(msg) from _original(failures[0][1])
            raise CheckpointNotFoundError(request, searched)
        for failed, error in failures:
            log.warning(
                "ignoring checkpoint source %s, which could not be read (%s); it may hold a "
                "newer checkpoint than the one chosen",
                describe_source(failed),
                error,
            )
        # Newest first; sorted() is stable, so on a tie the earlier source comes first.
        candidates = sorted(found_all, key=lambda pair: -pair[0].step)
        fetch_errors: list[Exception] = []
        for checkpoint, source in candidates:
            log.info("newest complete checkpoint: step %d, %s", checkpoint.step, checkpoint.source)
            try:
                path = source.fetch(checkpoint)
            except (CheckpointSourceError, OSError) as exc:
                log.warning(
                    "could not fetch step %d from %s (%s); trying the next newest",
                    checkpoint.step,
                    describe_source(source),
                    exc,
                )
                fetch_errors.append(exc)
                continue
            log.info("resuming from %s (step %d)", path, checkpoint.step)
            return os.fspath(path)
        raise fetch_errors[0]


def _original(exc: BaseException) -> BaseException:
    """The error a source's `CheckpointSourceError` wraps (its ``__cause__``), else ``exc``."""
    if isinstance(exc, CheckpointSourceError) and exc.__cause__ is not None:
        return exc.__cause__
    return exc


def _resolve_explicit(request: str) -> str:
    expanded = expand_user(request)
    if expanded is None:  # ~nosuchuser/...
        raise CheckpointNotFoundError(request, [f"{request} (cannot expand '~': no such user)"])
    folder = Path(expanded)
    try:
        is_dir = folder.is_dir()
    except (OSError, ValueError):  # e.g. a name too long for the OS
        is_dir = False
    if not is_dir:
        raise CheckpointNotFoundError(request, [os.fspath(folder)])
    state, why = read_trainer_state(folder)
    if state is None:
        log.warning(
            "resuming from %s as asked, but it does not look like a complete Trainer "
            "checkpoint: %s",
            folder,
            why,
        )
    else:
        log.info("resuming from %s (explicit path)", folder)
    return os.fspath(folder)

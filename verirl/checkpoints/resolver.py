"""`CheckpointResolver`: which checkpoint to resume from, over every source, fetching one.

It turns a resume request (``None``, ``"latest"``, ``"auto"``, a path) into a
local directory: it asks each `CheckpointSource` for its newest *complete*
checkpoint (one whose ``trainer_state.json`` Trainer finished writing), picks
the newest over all of them, and fetches only that one. The package
`verirl.checkpoints` re-exports it with the value, the protocol and the sources.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping
from pathlib import Path

import attrs

from verirl._fs import expand_user, printable, quoted
from verirl.checkpoints.hub import HubCheckpointSource
from verirl.checkpoints.local import LocalCheckpointSource
from verirl.checkpoints.model import (
    AUTO,
    RESUME_KEYWORDS,
    Checkpoint,
    CheckpointSource,
    path_request,
    read_trainer_state,
)
from verirl.errors import CheckpointNotFoundError, CheckpointSourceError, ConfigError

__all__ = ["NO_SOURCE_FOR_AUTO", "RESUME_ENV_VAR", "CheckpointResolver", "describe_source"]

log = logging.getLogger("verirl.checkpoints")  # the component's logger, which users filter on

RESUME_ENV_VAR = "VERIRL_RESUME_FROM_CHECKPOINT"
"""The environment variable `CheckpointResolver.resolve_from_env` reads."""

_LATEST_REQUESTS = RESUME_KEYWORDS - {AUTO}
NO_SOURCE_FOR_AUTO = (
    "'auto' needs somewhere to look, and no checkpoint source is configured "
    "(give an output directory or a Hub repo)"
)


def describe_source(source: object) -> str:
    """A source's ``description`` if it has one, else its repr; for messages."""
    description = getattr(source, "description", None)
    return printable(description) if isinstance(description, str) and description else repr(source)


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
                f"download_dir {printable(source.download_dir)} is the root of "
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
        when there is none and a source failed. ``"auto"``: the same, but none
        found is a fresh start (``None``, logged at WARNING with the places
        searched); a failing source is still an error, and no sources at all is
        a `ConfigError`. Anything else: an existing directory, returned with
        ``~`` expanded (`CheckpointNotFoundError` otherwise).

        Only text is a keyword: a `pathlib.Path` or other path-like is always
        a path (``Path("latest")`` is the folder called ``latest``).
        """
        given: object = request
        if isinstance(given, os.PathLike):
            given = path_request("request", given)
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
            return self._resolve_latest(request, strict=True)
        if request == AUTO:
            if not self._sources:
                raise ConfigError.invalid("request", request, NO_SOURCE_FOR_AUTO)
            return self._resolve_latest(request, strict=False)
        return _resolve_explicit(request)

    def resolve_from_env(self, environ: Mapping[str, str] | None = None) -> str | None:
        """`resolve` the value of ``VERIRL_RESUME_FROM_CHECKPOINT`` (unset: fresh start)."""
        env = os.environ if environ is None else environ
        if not isinstance(env, Mapping):
            raise ConfigError.invalid("environ", environ, "must be None or a mapping of str to str")
        value: object = env.get(RESUME_ENV_VAR)
        if value is not None and not isinstance(value, str):
            raise ConfigError.invalid(RESUME_ENV_VAR, value, "must be a string")
        log.debug("%s=%s", RESUME_ENV_VAR, quoted(value))
        try:
            return self.resolve(value)
        except ConfigError as exc:
            raise (exc.renamed(RESUME_ENV_VAR) if exc.field == "request" else exc) from None

    def _resolve_latest(self, request: str, *, strict: bool) -> str | None:
        """The newest complete checkpoint, fetched; none found: an error if ``strict``, else None.

        A source that could not be read is never taken for an empty one: when
        no other source has a checkpoint, that is `CheckpointSourceError` even
        for ``auto`` (a fresh start would silently throw the run away). The one
        exception, for ``auto`` only: a Hub repository that does not exist
        (404; the first attempt of a job that creates it when it first pushes).
        """
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
        failures = _drop_missing_repos(request, failures, strict=strict)
        if not found_all:
            if failures:
                reasons = "; ".join(printable(str(exc)) for _, exc in failures)
                msg = (
                    f"no checkpoint for {quoted(request)}: {len(failures)} of {len(searched)} "
                    f"source(s) could not be read ({reasons}); searched: {', '.join(searched)}"
                )
                raise CheckpointSourceError(msg) from _original(failures[0][1])
            if not strict:
                log.warning(
                    "%s: no complete checkpoint yet, starting fresh; searched: %s",
                    quoted(request),
                    ", ".join(searched),
                )
                return None
            raise CheckpointNotFoundError(request, searched)
        _refuse_if_newer_may_hide(
            request, failures, searched, max(found.step for found, _ in found_all)
        )
        for failed, error in failures:
            log.warning(
                "ignoring checkpoint source %s, which could not be read (%s); it may hold a "
                "newer checkpoint than the one chosen",
                describe_source(failed),
                printable(str(error)),
            )
        # Newest first; sorted() is stable, so on a tie the earlier source comes first.
        return _fetch_newest(sorted(found_all, key=lambda pair: -pair[0].step))


def _fetch_newest(candidates: list[tuple[Checkpoint, CheckpointSource]]) -> str:
    """The path of the newest of ``candidates`` that can be fetched.

    A failure to fetch from elsewhere (the Hub away) moves on to the next
    newest, logged; a checkpoint that is there but refused for good
    (``checkpoint_unreadable``: the Hub refuses it, or the download folder on
    this machine cannot take it) ends it: an older one would overwrite it.
    """
    fetch_errors: list[Exception] = []
    refused: CheckpointSourceError | None = None  # the newest refused for good, and its step
    refused_step = -1
    for index, (checkpoint, source) in enumerate(candidates):
        if refused is not None and checkpoint.step < refused_step:
            raise refused  # the tie that could stand in for it failed too: never an older one
        log.info(
            "newest complete checkpoint: step %d, %s", checkpoint.step, printable(checkpoint.source)
        )
        try:
            path = source.fetch(checkpoint)
        except (CheckpointSourceError, OSError) as exc:
            if isinstance(exc, CheckpointSourceError) and exc.checkpoint_unreadable:
                if all(other.step < checkpoint.step for other, _ in candidates[index + 1 :]):
                    raise  # newer than any left: it may hold progress they would overwrite
                if refused is None:
                    refused, refused_step = exc, checkpoint.step
            following, where = (
                candidates[index + 1] if index + 1 < len(candidates) else (None, None)
            )
            if following is not None and where is not None and following.step >= refused_step:
                log.warning(
                    "could not fetch step %d from %s (%s); trying the next newest, step %d from %s",
                    checkpoint.step,
                    describe_source(source),
                    printable(str(exc)),
                    following.step,
                    describe_source(where),
                )
            fetch_errors.append(exc)
            continue
        log.info("resuming from %s (step %d)", printable(path), checkpoint.step)
        return path_request("request", path, found=True)  # handed on as text, read back as is
    raise fetch_errors[0]


def _refuse_if_newer_may_hide(
    request: str,
    failures: list[tuple[CheckpointSource, Exception]],
    searched: list[str],
    newest: int,
) -> None:
    """`CheckpointSourceError` when a failed source may hide a newer checkpoint than ``newest``."""
    hiding = [(source, exc) for source, exc in failures if _may_hide_newer(source, exc, newest)]
    if hiding:
        reasons = "; ".join(printable(str(exc)) for _, exc in hiding)
        msg = (
            f"no checkpoint for {quoted(request)}: {len(hiding)} source(s) may hold a newer "
            f"checkpoint than the one found, but could not be read ({reasons}); resuming "
            f"an older one would overwrite it; searched: {', '.join(searched)}"
        )
        raise CheckpointSourceError(msg) from _original(hiding[0][1])


def _may_hide_newer(source: CheckpointSource, exc: BaseException, newest: int) -> bool:
    """Whether a failed source's error may hide a newer checkpoint than step ``newest``.

    A local folder that cannot be listed, or a checkpoint that is there but
    cannot be read, anywhere: a training run's own disk, whose newest
    checkpoint would be overwritten by a resume from an older one. A
    checkpoint whose name gives a step no newer than ``newest`` hides
    nothing. A Hub that cannot be reached is only warned about (the local
    copy is the newer one as a rule, and the job should not wait for the Hub).
    """
    seen: BaseException | None = exc
    for _ in range(16):  # the cause chain, bounded
        if seen is None:
            return isinstance(source, LocalCheckpointSource)
        if isinstance(seen, CheckpointSourceError) and seen.checkpoint_unreadable:
            return seen.step is None or seen.step > newest
        seen = seen.__cause__ or seen.__context__
    return isinstance(source, LocalCheckpointSource)


def _drop_missing_repos(
    request: str, failures: list[tuple[CheckpointSource, Exception]], *, strict: bool
) -> list[tuple[CheckpointSource, Exception]]:
    """For ``auto``, ``failures`` without repositories that do not exist yet (logged)."""
    if strict:
        return failures
    kept = []
    for source, exc in failures:
        if isinstance(exc, CheckpointSourceError) and exc.repo_missing:
            log.warning(
                "%s: %s does not exist yet (%s); nothing was pushed there to resume from",
                quoted(request),
                describe_source(source),
                printable(str(exc)),
            )
        else:
            kept.append((source, exc))
    return kept


def _original(exc: BaseException) -> BaseException:
    """The error a source's `CheckpointSourceError` wraps (its ``__cause__``), else ``exc``."""
    if isinstance(exc, CheckpointSourceError) and exc.__cause__ is not None:
        return exc.__cause__
    return exc


_AS_PATH = "it is not 'latest', 'last-checkpoint', 'auto' or empty, so it is a path"


def _resolve_explicit(request: str) -> str:
    expanded = expand_user(request)
    if expanded is None:  # ~nosuchuser/...
        reason = f"{_AS_PATH}, and its '~' cannot be expanded (no such user)"
        raise CheckpointNotFoundError(request, [printable(request)], reason=reason)
    folder = Path(expanded)
    problem = _not_a_directory(folder)
    if problem is not None:
        where = os.path.abspath(folder)  # noqa: PTH100 - made absolute, no symlink resolved
        reason = f"{_AS_PATH}, and {printable(where)} {problem}"
        raise CheckpointNotFoundError(request, [printable(folder)], reason=reason)
    # An unreadable state is an error here too (CheckpointSourceError): Trainer could not load it.
    state, why = read_trainer_state(folder)
    if state is None:
        log.warning(
            "resuming from %s as asked, but it does not look like a complete Trainer "
            "checkpoint: %s",
            printable(folder),
            why,
        )
    else:
        log.info("resuming from %s (explicit path)", printable(folder))
    # Handed on as text (launch exports it): a folder named like a keyword, or "~", keeps its "./".
    return path_request("request", folder, found=True)


def _not_a_directory(folder: Path) -> str | None:
    """Why the explicit path ``folder`` is no directory to resume from, or None if it is one."""
    try:
        if folder.is_dir():
            return None
        if folder.exists():
            return "is not a directory"
        if os.path.lexists(folder):
            return "is a symlink that cannot be followed"
    except (OSError, ValueError) as exc:  # e.g. a name too long for the OS
        return f"cannot be used ({type(exc).__name__})"
    return "does not exist"

"""What a Hub repo id, revision and endpoint may be, checked before any request."""

from __future__ import annotations

import re

from verirl._fs import quoted
from verirl._secrets import redact_url
from verirl._url import validate_http_url
from verirl.checkpoints.model import shorten
from verirl.errors import ConfigError

# A Hub repo id: "name" or "namespace/name", as huggingface_hub validates it.
_REPO_ID = re.compile(r"(?:[A-Za-z0-9][\w.-]*/)?[A-Za-z0-9][\w.-]*", re.ASCII)


_MAX_REPO_ID = 96  # the Hub's limit


_MAX_REVISION = 255  # longer than any git ref or commit id the Hub serves


_REVISION_BAD_CHARS = re.compile(r"[~^:?*\[\\]")


# A commit id as the Hub gives it (git SHA-1, or SHA-256 for a repo that uses it).
_COMMIT_ID = re.compile(r"[0-9a-f]{40}|[0-9a-f]{64}", re.ASCII)


def _endpoint_rstrip(value: str | None) -> str | None:
    return value.rstrip("/") if isinstance(value, str) else value


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
    if not isinstance(value, str):
        raise ConfigError.invalid("revision", value, "must be a string (or None: main)")
    if not value.strip():
        raise ConfigError.invalid("revision", value, "is empty: give a branch, tag or commit id")
    if len(value) > _MAX_REVISION:
        raise ConfigError.invalid(
            "revision", value, f"is too long ({len(value)} characters, at most {_MAX_REVISION})"
        )
    bad = next((ch for ch in value if ch.isspace() or not ch.isprintable()), None)
    if bad is not None:
        raise ConfigError.invalid(
            "revision", value, f"must not contain whitespace or control characters ({quoted(bad)})"
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


def _commit_id(sha: object, revision: str | None) -> str:
    """The commit the Hub resolved the revision to; anything else there is a `ValueError`.

    It names the download's cache entries and goes into verirl's marker file,
    so only a real commit id will do (no path tricks from a hostile mirror).
    """
    if sha is None or sha == "":  # a mirror that does not say: pin to what was asked
        return revision or "main"
    if not isinstance(sha, str) or not _COMMIT_ID.fullmatch(sha):
        msg = f"the Hub answered with a commit id that is not one: {shorten(quoted(sha))}"
        raise ValueError(msg)
    return sha

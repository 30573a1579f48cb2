"""A failure of the Hub told apart: refused, missing, local (a full disk), or the network."""

from __future__ import annotations

import errno
from urllib.parse import urlsplit

from verirl._fs import shortened
from verirl._hub_token import hub_offline
from verirl.errors import CheckpointSourceError


def _look_up_hub_host(endpoint: str, timeout: float) -> None:
    """Look up the host the Hub's requests connect to within ``timeout`` seconds.

    huggingface_hub's client looks names up with no timeout, in a call a
    signal cannot interrupt: with a DNS server that never answers, the first
    Hub call would hang past ``timeout`` and hold off a SIGTERM. This lookup
    runs first, bounded and interruptible (`verirl._resolve.resolve`), and
    raises `LookupTimeoutError` or `socket.gaierror` as the request would
    have failed. Through a proxy (``HTTPS_PROXY``, ``ALL_PROXY``, not
    bypassed by ``NO_PROXY``) the proxy's host is the one looked up: the
    proxy resolves the endpoint. A URL that cannot be read is left to the
    client.
    """
    import urllib.request  # noqa: PLC0415 - only with a Hub source

    from verirl._resolve import resolve  # noqa: PLC0415

    parts = urlsplit(endpoint)
    try:
        host, port = parts.hostname, parts.port
        proxies = urllib.request.getproxies()
        proxy = proxies.get(parts.scheme) or proxies.get("all")
        if proxy and host and not urllib.request.proxy_bypass(host):
            via = urlsplit(proxy if "://" in proxy else f"http://{proxy}")
            parts, host, port = via, via.hostname, via.port
    except ValueError:  # a bad port: the client says so itself
        return
    if host:
        default_port = 443 if parts.scheme == "https" else 80
        resolve(host, port or default_port, timeout=timeout)


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
    return shortened(
        f"{type(exc).__name__}: {first_line}" if first_line else type(exc).__name__, 300
    )


def _repo_missing(exc: BaseException) -> bool:
    """The Hub said the repository does not exist: a 404, not a gated repo, not a 401.

    Without a token the Hub answers 401 for a private repository and for a
    missing one alike, so only a 404 counts.
    """
    from huggingface_hub import errors  # noqa: PLC0415

    return (
        isinstance(exc, errors.RepositoryNotFoundError)
        and not isinstance(exc, errors.GatedRepoError)
        and _status_code(exc) == 404  # noqa: PLR2004
    )


_REFUSALS = frozenset({401, 403, 404, 410, 451})


# What the download folder on this machine answers (not the network): it would
# stop any other download too, so an older checkpoint must not stand in.
_LOCAL_ERRNOS = frozenset(
    {
        errno.EACCES,
        errno.EDQUOT,
        errno.EFBIG,
        errno.EIO,
        errno.EISDIR,
        errno.ELOOP,
        errno.ENAMETOOLONG,
        errno.ENOSPC,
        errno.ENOTDIR,
        errno.EPERM,
        errno.EROFS,
    }
)


def _local_failure(exc: BaseException) -> bool:
    """Whether ``exc`` or its cause chain is a file system error on this machine.

    The walk stops at the first network error: a connect() a firewall refuses
    is EPERM or EACCES under httpx's ``ConnectError``, and that is the Hub
    away, not the download folder.
    """
    seen: BaseException | None = exc
    for _ in range(16):  # the chain, bounded
        if seen is None or _network_error(seen):
            return False
        if isinstance(seen, OSError) and seen.errno in _LOCAL_ERRNOS:
            return True
        seen = seen.__cause__ or seen.__context__
    return False


_NETWORK_MODULES = frozenset({"httpx", "httpcore", "requests", "urllib", "h", "ssl", "aiohttp"})


def _network_error(exc: BaseException) -> bool:
    """An error of the network stack (an HTTP client's, a socket's), whatever its errno."""
    if isinstance(exc, (ConnectionError, TimeoutError)):
        return True
    roots = (k.__module__.split(".")[0].rstrip("0123456789") for k in type(exc).__mro__)
    return any(root in _NETWORK_MODULES for root in roots)  # httpx2: huggingface_hub 2.x's


def _status_code(exc: BaseException) -> int | None:
    response = getattr(exc, "response", None)
    status = getattr(response, "status_code", None)
    return status if isinstance(status, int) else None


def _answered_by_hub(exc: BaseException, endpoint: str) -> bool:
    """Whether the refusal came from the Hub itself, not from where it redirected the body.

    A 403 from a storage URL the Hub redirected to is as a rule an expired
    signature (a slow transfer, a skewed clock): the Hub away, not a
    refusal. With no URL to tell, it counts as the Hub's.
    """
    url = getattr(getattr(exc, "response", None), "url", None)
    if url is None:
        return True
    try:
        where = urlsplit(str(url)).hostname
        hub = urlsplit(endpoint).hostname
    except Exception:  # noqa: BLE001 - cannot tell: the Hub's
        return True
    return where is None or hub is None or where == hub


def _refuse_offline(doing: str, description: str) -> None:
    """A `CheckpointSourceError` now if huggingface_hub's offline mode is on: no request made."""
    if hub_offline():
        from huggingface_hub.errors import OfflineModeIsEnabled  # noqa: PLC0415

        cause = OfflineModeIsEnabled("HF_HUB_OFFLINE is set")
        raise CheckpointSourceError(
            f"cannot {doing} {description}: Hugging Face Hub offline mode is on "
            "(HF_HUB_OFFLINE or TRANSFORMERS_OFFLINE); unset it, or resume from a local "
            "checkpoint"
        ) from cause

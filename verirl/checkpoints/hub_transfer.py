"""The Hub's two transfers: the tree listing at a commit and one file's download, each bounded.

huggingface_hub's ``list_repo_tree`` takes no timeout, so the listing's pages
are fetched here with its own session, headers and error mapping; a file is
downloaded with ``hf_hub_download`` under ``local_dir`` only, through a progress
bar that a closed or abandoned stderr cannot hang.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import quote

from verirl._secrets import redact_url
from verirl._version import __version__
from verirl.checkpoints.hub_listing import _MAX_TREE_PAGES, _read_within
from verirl.errors import CheckpointSourceError

if TYPE_CHECKING:
    from huggingface_hub import HfApi

__all__ = ["download_file", "hub_api", "hub_endpoint", "list_tree"]


def list_tree(
    endpoint: str,
    repo_id: str,
    commit: str,
    token: str | bool,
    *,
    timeout: float,
    description: str,
) -> list[dict[str, object]]:
    """The recursive tree listing at ``commit``, every page within ``timeout``.

    `HfApi.list_repo_tree` takes no timeout, so the pages are fetched here
    with huggingface_hub's own session, headers and error mapping. A server
    that keeps sending "next" links is cut off after `_MAX_TREE_PAGES`.
    Errors name the source by ``description``.
    """
    from huggingface_hub import get_session, hf_raise_for_status  # noqa: PLC0415

    # Public and documented, but re-exported lazily, which mypy cannot see.
    from huggingface_hub.utils import build_hf_headers  # type: ignore[attr-defined]  # noqa: PLC0415

    headers = build_hf_headers(token=token, library_name="verirl", library_version=__version__)
    url: str | None = f"{endpoint}/api/models/{repo_id}/tree/{quote(commit, safe='')}"
    params: dict[str, str] | None = {"recursive": "true", "expand": "false"}
    entries: list[dict[str, object]] = []
    seen: set[str] = set()
    while url is not None:
        if url in seen or len(seen) >= _MAX_TREE_PAGES:
            msg = f"cannot list {description}: the tree listing does not end"
            raise CheckpointSourceError(msg) from ValueError(redact_url(url))
        seen.add(url)
        deadline = time.monotonic() + timeout  # the whole page: a trickle is cut off too
        with get_session().stream(
            "GET", url, headers=headers, params=params, timeout=timeout
        ) as response:
            body = _read_within(response.iter_bytes(), deadline, timeout)
            hf_raise_for_status(response)
        page = json.loads(body)
        if not isinstance(page, list):
            msg = f"cannot list {description}: the tree listing is not a JSON list"
            raise CheckpointSourceError(msg) from ValueError(type(page).__name__)
        entries += [entry for entry in page if isinstance(entry, dict)]
        url, params = response.links.get("next", {}).get("url"), None
    return entries


def download_file(
    repo_id: str,
    filename: str,
    commit: str,
    local_dir: Path,
    token: str | bool,
    *,
    endpoint: str | None,
    timeout: float,
) -> Path:
    """Download ``filename`` of ``repo_id`` at ``commit`` into ``local_dir``; its path there."""
    from huggingface_hub import hf_hub_download  # noqa: PLC0415

    path = hf_hub_download(
        repo_id,
        filename,
        revision=commit,
        local_dir=local_dir,
        # Keep everything under local_dir: huggingface_hub only reads this cache here,
        # and the global one (~/.cache/huggingface) stays untouched.
        cache_dir=local_dir / ".cache" / "huggingface" / "hub",
        endpoint=endpoint,
        token=token,
        etag_timeout=timeout,
        library_name="verirl",
        tqdm_class=_progress_bar(),
    )
    return Path(path)


def _progress_bar() -> type | None:
    """huggingface_hub's progress bar, or a silent one when stderr cannot take it.

    With no stderr (``2>&-``, ``pythonw``) or a closed one, tqdm raises while
    it holds its class-wide lock, and every other download thread then waits
    on that lock forever: the download, and the process's exit, would hang.
    In the ``verirl`` program, the bar writes through its stderr channel
    (`verirl._cli_output`): a reader of stderr that stops reading holds up
    no download.
    """
    from verirl._cli_output import STDERR  # noqa: PLC0415 - the program's, when it runs

    queued = STDERR.queued_file()
    stream = sys.stderr
    usable = stream is not None and not getattr(stream, "closed", False)
    if usable and queued is None:
        return None  # huggingface_hub's own (and its HF_HUB_DISABLE_PROGRESS_BARS)
    from huggingface_hub.utils.tqdm import tqdm as hub_tqdm  # noqa: PLC0415

    if usable:

        class Queued(hub_tqdm):
            def __init__(self, *args: object, **kwargs: object) -> None:
                kwargs.setdefault("file", queued)
                super().__init__(*args, **kwargs)  # type: ignore[no-untyped-call]

        return Queued

    class Silent(hub_tqdm):
        def __init__(self, *args: object, **kwargs: object) -> None:
            kwargs["disable"] = True
            super().__init__(*args, **kwargs)  # type: ignore[no-untyped-call]

    return Silent


def hub_endpoint(endpoint: str | None) -> str:
    """The endpoint requests go to (``endpoint=``, else huggingface_hub's ``HF_ENDPOINT``)."""
    from huggingface_hub import constants  # noqa: PLC0415

    return endpoint or constants.ENDPOINT


def hub_api(endpoint: str | None, token: str | bool) -> HfApi:
    """huggingface_hub's client for ``endpoint`` (None: its default), sending ``token``."""
    from huggingface_hub import HfApi  # noqa: PLC0415

    return HfApi(
        endpoint=endpoint,
        token=token,
        library_name="verirl",
        library_version=__version__,
    )

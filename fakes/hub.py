"""A fake Hugging Face Hub: a real loopback HTTP server for the real huggingface_hub client.

huggingface_hub 1.x+ talks HTTP through its own client, which ``responses``
cannot intercept, so Hub code is tested here against a server that speaks the
part of the Hub's HTTP API the client uses to list and download a model repo:
``GET /api/models/{repo}[/revision/{rev}]`` (repo info with ``sha`` and
``siblings``), ``GET /api/models/{repo}/tree/{rev}[/{path}]`` (the paginated,
optionally recursive tree listing) and ``HEAD``/``GET /{repo}/resolve/{rev}/{path}``
(with ``X-Repo-Commit``, ``ETag`` and ``Content-Length``; no Xet headers, so
the client downloads over plain HTTP). Unknown repos, revisions and files get
the Hub's 404s (``X-Error-Code: RepoNotFound``, ``RevisionNotFound``,
``EntryNotFound``); `FakeHub.protect` makes a repo answer 401 to requests
without its token. It also takes pushes, as Trainer makes them with
``push_to_hub=True``: ``POST /api/repos/create`` (an empty repo holds
``.gitattributes``, as on the Hub; 409 if it exists), ``POST /api/validate-yaml``
(a README's metadata: always valid), ``POST
/api/models/{repo}/preupload/{rev}`` (every file "regular", so the client
sends it inline: no LFS or Xet) and ``POST /api/models/{repo}/commit/{rev}``
(the client's NDJSON: files added in base64, files and folders deleted).
Faults a real mirror or network shows can be injected per
file: `FakeHub.serve_instead` (a wrong body with headers that match it),
`FakeHub.fail_downloads` (an error status for the body) and `FakeHub.hold`
(the body waits until released, to catch a download in the middle). It counts
requests and the bytes of file bodies served::

    with serve_fake_hub() as hub:  # also keeps huggingface_hub off the network
        hub.add_checkpoint("org/run", "checkpoint-30", step=30, size=1_000)
        source = HubCheckpointSource("org/run", download_dir=tmp, endpoint=hub.endpoint)
        source.fetch(source.latest())
        assert hub.bytes_served == hub.folder_size("org/run", "checkpoint-30")

Pass ``endpoint=hub.endpoint`` explicitly: huggingface_hub reads ``HF_ENDPOINT``
only when it is imported.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import http.server
import io
import json
import logging
import socket
import threading
import time
from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, unquote, urlsplit

import attrs

from fakes._http import QuietHTTPServer, serve_in_background

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = ["FakeHub", "Hold", "isolated_hf_client", "serve_fake_hub"]

log = logging.getLogger(__name__)

_LOOPBACK_HOSTS = frozenset({"127.0.0.1", "localhost", "::1", "[::1]"})


def _git_blob_sha(data: bytes) -> str:
    """The id git (and the Hub's ``oid``/``ETag``) gives a file's content."""
    return hashlib.sha1(b"blob %d\0" % len(data) + data, usedforsecurity=False).hexdigest()


_LISTING = "\0tree"  # the key of a held tree listing; no file path contains NUL
_HOLD_LIMIT = 60.0  # a held body is served anyway after this long, so no test can hang on it
_MAX_BODY = 256 * 1024 * 1024  # a push bigger than this is refused (413), not read into memory
_GITATTRIBUTES = b"*.safetensors filter=lfs diff=lfs merge=lfs -text\n"  # what a new repo holds


@attrs.define
class Hold:
    """A file body held back by `FakeHub.hold`: ``arrived`` is set when a GET for it comes in."""

    arrived: threading.Event = attrs.field(factory=threading.Event)
    trickle: float = 0.0
    """Seconds between two bytes of the body (a Hub that keeps the connection busy) instead."""
    _released: threading.Event = attrs.field(factory=threading.Event, repr=False)

    def release(self) -> None:
        """Let held and later requests for the file through."""
        self._released.set()

    def wait_released(self) -> None:
        """Block a handler until `release` (or `_HOLD_LIMIT` seconds, whichever comes first)."""
        self.arrived.set()
        if not self.trickle:
            self._released.wait(_HOLD_LIMIT)

    def write(self, out: io.BufferedIOBase, body: bytes) -> None:
        """Write ``body`` a byte every `trickle` seconds, the rest at once after `release`."""
        deadline = time.monotonic() + _HOLD_LIMIT
        for index in range(len(body)):
            if self._released.is_set() or time.monotonic() > deadline:
                out.write(body[index:])
                return
            out.write(body[index : index + 1])
            out.flush()
            self._released.wait(self.trickle)


@attrs.frozen
class _Response:
    status: int
    headers: Mapping[str, str] = attrs.Factory(dict)
    body: bytes = b""
    counts_as_download: tuple[str, str] | None = None
    hold: Hold | None = None


def _json(status: int, payload: object, headers: Mapping[str, str] | None = None) -> _Response:
    body = json.dumps(payload).encode()
    return _Response(status, {"Content-Type": "application/json", **(headers or {})}, body)


def _error(status: int, code: str | None, message: str, **headers: str) -> _Response:
    extra = dict(headers)
    if code is not None:
        extra["X-Error-Code"] = code
    extra["X-Error-Message"] = message
    return _json(status, {"error": message}, extra)


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _HTTPServer
    protocol_version = "HTTP/1.1"
    # uvicorn, like most servers, sets TCP_NODELAY: without it a keep-alive answer written
    # in two parts waits ~40 ms for the client's delayed ACK.
    disable_nagle_algorithm = True
    timeout = 30  # a stuck client cannot hold a handler thread forever

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002, ANN401
        """Route the access log to logging instead of stderr."""
        log.debug("fake hub: " + format, *args)  # noqa: G003 - http.server's own format string

    def do_GET(self) -> None:
        self._serve("GET")

    def do_HEAD(self) -> None:
        self._serve("HEAD")

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length > _MAX_BODY:
            self.close_connection = True
            self._send(_error(413, None, f"body over {_MAX_BODY} bytes"), "POST")
            return
        self._serve("POST", self.rfile.read(length))

    def _serve(self, method: str, body: bytes = b"") -> None:
        response = self.server.hub._handle(  # noqa: SLF001
            method, self.path, self.headers.get("Authorization"), body
        )
        self._send(response, method)

    def _send(self, response: _Response, method: str) -> None:
        self.send_response(response.status)
        for name, value in response.headers.items():
            self.send_header(name, value)
        self.send_header("Content-Length", str(len(response.body)))
        if method == "GET" and response.hold is not None:
            response.hold.wait_released()
        self.end_headers()
        if method == "HEAD":
            return
        what, hub = response.counts_as_download, self.server.hub
        # Counted before the body goes out: a client that read it all must find it counted.
        if what is not None:
            hub._count_download(what, len(response.body))  # noqa: SLF001
        try:
            if response.hold is not None and response.hold.trickle:
                response.hold.write(self.wfile, response.body)
            else:
                self.wfile.write(response.body)
        except OSError:
            if what is not None:
                hub._uncount_download(what, len(response.body))  # noqa: SLF001
            raise


class _HTTPServer(QuietHTTPServer):
    """One daemon thread per connection, tracked so `FakeHub.close` can end and join them."""

    daemon_threads = True
    block_on_close = False  # the stdlib never joins daemon threads; close_connections does
    hub: FakeHub

    def __init__(self, address: tuple[str, int], hub: FakeHub) -> None:
        self.hub = hub
        self._connections: dict[socket.socket, threading.Thread] = {}
        self._connections_lock = threading.Lock()
        super().__init__(address, _Handler)

    def process_request(self, request: Any, client_address: Any) -> None:  # noqa: ANN401
        # Tracked here, in the serving thread, so that close_connections cannot miss one.
        thread = threading.Thread(
            target=self.process_request_thread,
            args=(request, client_address),
            name="fake-hub-connection",
            daemon=True,
        )
        with self._connections_lock:
            self._connections[request] = thread
        thread.start()

    def shutdown_request(self, request: Any) -> None:  # noqa: ANN401
        with self._connections_lock:
            self._connections.pop(request, None)
        super().shutdown_request(request)

    def close_connections(self) -> None:
        """End kept-alive connections so their handler threads return, and join those threads."""
        with self._connections_lock:
            connections = list(self._connections.items())
        for connection, _ in connections:
            with contextlib.suppress(OSError):
                connection.shutdown(socket.SHUT_RDWR)
        for _, thread in connections:
            thread.join()


@attrs.frozen
class _Commit:
    sha: str
    files: Mapping[str, bytes]


@attrs.define
class FakeHub:
    """A loopback Hub holding model repos in memory; use as a context manager.

    Repos appear when a file is added (`add_file`, `add_checkpoint`); every
    addition makes a new commit on its branch, and older commits stay readable
    by sha, as on the Hub. ``page_size`` is how many entries one tree-listing
    page holds (the Hub uses 1000), so pagination can be exercised.

    Counters: ``requests`` (``(method, path)`` pairs, path without query),
    ``downloads`` (``(repo_id, filename)`` of each file body served) and
    ``bytes_served`` (the sum of those bodies); `reset_counters` clears them.
    """

    host: str = "127.0.0.1"
    page_size: int = 1000
    _branches: dict[tuple[str, str], str] = attrs.field(factory=dict, init=False)
    _commits: dict[tuple[str, str], _Commit] = attrs.field(factory=dict, init=False)
    _tokens: dict[str, str] = attrs.field(factory=dict, init=False, repr=False)
    _instead: dict[tuple[str, str], bytes] = attrs.field(factory=dict, init=False, repr=False)
    _failing: dict[tuple[str, str], int] = attrs.field(factory=dict, init=False, repr=False)
    _holds: dict[tuple[str, str], Hold] = attrs.field(factory=dict, init=False, repr=False)
    _requests: list[tuple[str, str]] = attrs.field(factory=list, init=False)
    _downloads: list[tuple[str, str]] = attrs.field(factory=list, init=False)
    _bytes_served: int = attrs.field(default=0, init=False)
    _lock: threading.Condition = attrs.field(factory=threading.Condition, init=False, repr=False)
    _httpd: _HTTPServer | None = attrs.field(default=None, init=False, repr=False)
    _thread: threading.Thread | None = attrs.field(default=None, init=False, repr=False)

    # ------------------------------------------------------------ lifecycle

    def start(self) -> FakeHub:
        """Bind a free port on ``host`` and serve in a background thread."""
        if self._httpd is not None:
            msg = "FakeHub is already started"
            raise RuntimeError(msg)
        self._httpd = _HTTPServer((self.host, 0), self)
        self._thread = serve_in_background(self._httpd, "fake-hub")
        log.debug("fake hub serving at %s", self.endpoint)
        return self

    def close(self) -> None:
        """Stop serving, end open connections and join every thread; safe to call twice."""
        httpd, thread = self._httpd, self._thread
        self._httpd = self._thread = None
        if httpd is None:
            return
        with self._lock:
            holds = list(self._holds.values())
        for hold in holds:
            hold.release()
        httpd.shutdown()
        httpd.close_connections()
        httpd.server_close()
        if thread is not None:
            thread.join()

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def endpoint(self) -> str:
        """The URL to pass as ``endpoint=``, e.g. ``http://127.0.0.1:54321``."""
        if self._httpd is None:
            msg = "FakeHub is not started"
            raise RuntimeError(msg)
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self._httpd.server_address[1]}"

    # ------------------------------------------------------------ content

    def add_file(self, repo_id: str, path: str, data: bytes, revision: str = "main") -> str:
        """Commit ``data`` at ``path`` on branch ``revision`` of ``repo_id``; return the new sha."""
        if repo_id.count("/") != 1 or not all(repo_id.split("/")):
            msg = f"repo_id={repo_id!r}: the fake Hub wants 'namespace/name'"
            raise ValueError(msg)
        if not path or path.startswith("/") or path.endswith("/"):
            msg = f"path={path!r}: must be a relative file path"
            raise ValueError(msg)
        return self._commit_files(repo_id, revision, {path: bytes(data)})

    def _commit_files(
        self,
        repo_id: str,
        revision: str,
        added: Mapping[str, bytes],
        deleted: tuple[str, ...] = (),
    ) -> str:
        """Make one commit on ``revision``: ``added`` files, then ``deleted`` files and folders."""
        with self._lock:
            parent = self._branches.get((repo_id, revision))
            files = dict(self._commits[repo_id, parent].files) if parent else {}
            files.update(added)
            for gone in deleted:
                folder = gone.rstrip("/") + "/"
                files = {p: d for p, d in files.items() if p != gone and not p.startswith(folder)}
            change = "\0".join(f"{p}\0{_git_blob_sha(d)}" for p, d in sorted(added.items()))
            change += "\0-" + "\0".join(deleted)
            sha = hashlib.sha1(f"{parent}\0{change}".encode(), usedforsecurity=False).hexdigest()
            self._commits[repo_id, sha] = _Commit(sha, files)
            self._branches[repo_id, revision] = sha
        return sha

    def add_checkpoint(
        self,
        repo_id: str,
        folder: str,
        step: int,
        *,
        size: int = 1024,
        complete: bool = True,
        revision: str = "main",
    ) -> int:
        """Add a Trainer-shaped checkpoint folder; return its total size in bytes.

        ``model.safetensors`` has ``size`` bytes, ``optimizer.pt`` twice that
        (Adam keeps two moments), plus ``scheduler.pt``, ``rng_state.pth``,
        ``config.json`` and, when ``complete``, ``trainer_state.json`` with
        ``global_step`` = ``step`` (Trainer writes it last).
        """
        files = {
            "config.json": json.dumps({"model_type": "fake"}).encode(),
            "model.safetensors": _payload(f"{folder}/model", size),
            "optimizer.pt": _payload(f"{folder}/optimizer", 2 * size),
            "scheduler.pt": _payload(f"{folder}/scheduler", 64),
            "rng_state.pth": _payload(f"{folder}/rng", 128),
        }
        if complete:
            state = {"global_step": step, "epoch": step / 100, "log_history": []}
            files["trainer_state.json"] = json.dumps(state).encode()
        for name, data in files.items():
            self.add_file(repo_id, f"{folder}/{name}", data, revision)
        return sum(len(data) for data in files.values())

    def protect(self, repo_id: str, token: str) -> None:
        """Answer 401 to requests for ``repo_id`` without ``Authorization: Bearer <token>``."""
        with self._lock:
            self._tokens[repo_id] = token

    def serve_instead(self, repo_id: str, path: str, data: bytes) -> None:
        """Serve ``data`` as the body of ``path`` (any revision), with headers that match it.

        The listing still reports the committed file's size: a broken mirror or
        proxy that truncates bodies but sets ``Content-Length`` to what it sends.
        """
        with self._lock:
            self._instead[repo_id, path] = bytes(data)

    def fail_downloads(self, repo_id: str, path: str, status: int = 403) -> None:
        """Answer ``status`` to every GET of ``path``'s body (HEAD still succeeds); 0 heals it."""
        with self._lock:
            if status:
                self._failing[repo_id, path] = status
            else:
                self._failing.pop((repo_id, path), None)

    def hold(self, repo_id: str, path: str) -> Hold:
        """Hold GETs of ``path``'s body after the headers until the returned `Hold` is released.

        `close` releases every hold, and a held request goes through on its own
        after a minute, so a forgotten hold cannot hang a test run.
        """
        hold = Hold()
        with self._lock:
            self._holds[repo_id, path] = hold
        return hold

    def wait_for_requests(self, path_contains: str, count: int, timeout: float) -> bool:
        """Wait until ``count`` requests whose path contains ``path_contains`` came in."""
        with self._lock:
            return self._lock.wait_for(
                lambda: sum(path_contains in p for _, p in self._requests) >= count, timeout
            )

    def hold_listing(self, repo_id: str, *, trickle: float = 0.0) -> Hold:
        """Hold tree listings of ``repo_id`` (a Hub that stalls) until the `Hold` is released.

        With ``trickle``, the listing's body comes a byte every ``trickle``
        seconds instead (a Hub that never lets a read time out).
        """
        hold = Hold(trickle=trickle)
        with self._lock:
            self._holds[repo_id, _LISTING] = hold
        return hold

    def sha(self, repo_id: str, revision: str = "main") -> str:
        """The commit ``revision`` of ``repo_id`` points at."""
        with self._lock:
            return self._branches[repo_id, revision]

    def files(self, repo_id: str, revision: str = "main") -> dict[str, bytes]:
        """A copy of the files at ``revision``."""
        with self._lock:
            return dict(self._commits[repo_id, self._branches[repo_id, revision]].files)

    def folder_size(self, repo_id: str, folder: str, revision: str = "main") -> int:
        """Total bytes of the files under ``folder/`` at ``revision``."""
        prefix = folder.rstrip("/") + "/"
        return sum(
            len(data)
            for path, data in self.files(repo_id, revision).items()
            if path.startswith(prefix)
        )

    # ------------------------------------------------------------ counters

    @property
    def requests(self) -> list[tuple[str, str]]:
        """``(method, path)`` of every request so far (path without the query string)."""
        with self._lock:
            return list(self._requests)

    @property
    def downloads(self) -> list[tuple[str, str]]:
        """``(repo_id, filename)`` of every file body served so far."""
        with self._lock:
            return list(self._downloads)

    @property
    def bytes_served(self) -> int:
        """Bytes of file bodies served by ``GET .../resolve/...`` so far."""
        with self._lock:
            return self._bytes_served

    def reset_counters(self) -> None:
        """Forget the requests, downloads and bytes counted so far."""
        with self._lock:
            self._requests.clear()
            self._downloads.clear()
            self._bytes_served = 0

    def _count_download(self, what: tuple[str, str], size: int) -> None:
        with self._lock:
            self._downloads.append(what)
            self._bytes_served += size

    def _uncount_download(self, what: tuple[str, str], size: int) -> None:
        with self._lock:
            if what in self._downloads:  # not when reset_counters ran in between
                del self._downloads[len(self._downloads) - 1 - self._downloads[::-1].index(what)]
                self._bytes_served = max(0, self._bytes_served - size)

    # ------------------------------------------------------------ HTTP

    def _handle(
        self, method: str, raw_path: str, authorization: str | None, body: bytes = b""
    ) -> _Response:
        parts = urlsplit(raw_path)
        with self._lock:
            self._requests.append((method, parts.path))
            self._lock.notify_all()
        segments = [unquote(s) for s in parts.path.split("/")[1:]]
        if method == "POST" and segments == ["api", "repos", "create"]:
            return self._create_repo(authorization, body)
        if method == "POST" and segments == ["api", "validate-yaml"]:
            return _json(200, {"errors": [], "warnings": []})  # a README's metadata: any is fine
        if segments[:2] == ["api", "models"]:
            repo_id, rest = "/".join(segments[2:4]), segments[4:]
        elif len(segments) >= 5 and segments[2] == "resolve":  # noqa: PLR2004
            repo_id, rest = "/".join(segments[:2]), segments[2:]
        else:
            return _error(404, None, f"no such route on the fake Hub: {method} {parts.path}")
        denied = self._denied(repo_id, authorization)
        if denied is not None:
            return denied
        if method == "POST" and len(rest) >= 2 and rest[0] in ("preupload", "commit"):  # noqa: PLR2004
            return self._push(rest[0], repo_id, "/".join(rest[1:]), body)
        return self._route(method, parts.path, repo_id, rest, parse_qs(parts.query))

    def _route(
        self, method: str, path: str, repo_id: str, rest: list[str], query: dict[str, list[str]]
    ) -> _Response:
        kind = rest[0] if rest else ""
        if kind == "resolve":
            return self._resolve(method, repo_id, rest[1], "/".join(rest[2:]))
        if method == "GET" and not rest:
            return self._repo_info(repo_id, "main", query)
        if method == "GET" and kind == "revision" and len(rest) == 2:  # noqa: PLR2004
            return self._repo_info(repo_id, rest[1], query)
        if method == "GET" and kind == "tree" and len(rest) >= 2:  # noqa: PLR2004
            response = self._tree(path, repo_id, rest[1], "/".join(rest[2:]), query)
            with self._lock:
                hold = self._holds.get((repo_id, _LISTING))
            return attrs.evolve(response, hold=hold)
        return _error(404, None, f"no such route on the fake Hub: {method} {path}")

    def _denied(self, repo_id: str, authorization: str | None) -> _Response | None:
        with self._lock:
            token = self._tokens.get(repo_id)
            known = any(repo == repo_id for repo, _ in self._branches)
        if token is not None and authorization != f"Bearer {token}":
            if authorization:
                return _error(401, None, "Invalid credentials in Authorization header")
            return _error(401, "RepoNotFound", "Repository not found")
        if not known:
            return _error(404, "RepoNotFound", "Repository not found")
        return None

    def _commit(self, repo_id: str, revision: str) -> _Commit | None:
        with self._lock:
            sha = self._branches.get((repo_id, revision), revision)
            return self._commits.get((repo_id, sha))

    def _repo_info(self, repo_id: str, revision: str, query: dict[str, list[str]]) -> _Response:
        commit = self._commit(repo_id, revision)
        if commit is None:
            return _error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
        blobs = query.get("blobs", ["false"])[0].lower() == "true"
        siblings = [
            {"rfilename": path, "size": len(data), "blobId": _git_blob_sha(data)}
            if blobs
            else {"rfilename": path}
            for path, data in sorted(commit.files.items())
        ]
        with self._lock:
            private = repo_id in self._tokens
        info = {"_id": repo_id, "id": repo_id, "modelId": repo_id, "sha": commit.sha}
        return _json(200, {**info, "private": private, "tags": [], "siblings": siblings})

    def _tree(
        self, url_path: str, repo_id: str, revision: str, folder: str, query: dict[str, list[str]]
    ) -> _Response:
        commit = self._commit(repo_id, revision)
        if commit is None:
            return _error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
        recursive = query.get("recursive", ["false"])[0].lower() == "true"
        prefix = f"{folder}/" if folder else ""
        entries: dict[str, dict[str, object]] = {}
        for path, data in sorted(commit.files.items()):
            if not path.startswith(prefix):
                continue
            parts = path[len(prefix) :].split("/")
            # Every folder on the way down is an entry of its own, as on the Hub.
            depth = len(parts) if recursive else 1
            for i in range(1, min(depth, len(parts) - 1) + 1):
                name = prefix + "/".join(parts[:i])
                entries.setdefault(name, {"type": "directory", "oid": _git_blob_sha(name.encode())})
            if recursive or len(parts) == 1:
                entries[path] = {"type": "file", "oid": _git_blob_sha(data), "size": len(data)}
        if folder and not entries:
            return _error(404, "EntryNotFound", f"{folder} does not exist on {revision}")
        listing = [{**entry, "path": path} for path, entry in sorted(entries.items())]
        start = int(query.get("cursor", ["0"])[0])
        page = listing[start : start + self.page_size]
        headers: dict[str, str] = {}
        if start + self.page_size < len(listing):
            next_url = (
                f"{self.endpoint}{url_path}?recursive={str(recursive).lower()}"
                f"&expand=false&cursor={start + self.page_size}"
            )
            headers["Link"] = f'<{next_url}>; rel="next"'
        return _json(200, page, headers)

    def _resolve(self, method: str, repo_id: str, revision: str, filename: str) -> _Response:
        commit = self._commit(repo_id, revision)
        if commit is None:
            return _error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
        data = commit.files.get(filename)
        if data is None:
            return _error(
                404, "EntryNotFound", f"{filename} does not exist", **{"X-Repo-Commit": commit.sha}
            )
        with self._lock:
            failing = self._failing.get((repo_id, filename))
            hold = self._holds.get((repo_id, filename))
            data = self._instead.get((repo_id, filename), data)
        if failing is not None and method == "GET":
            return _error(failing, None, f"{filename}: injected failure")
        headers = {
            "Content-Type": "application/octet-stream",
            "X-Repo-Commit": commit.sha,
            "ETag": f'"{_git_blob_sha(data)}"',
            "Accept-Ranges": "none",
        }
        return _Response(200, headers, data, counts_as_download=(repo_id, filename), hold=hold)

    def _create_repo(self, authorization: str | None, body: bytes) -> _Response:
        if not (authorization or "").startswith("Bearer "):
            return _error(401, None, "Invalid username or password.")
        try:
            payload = json.loads(body)
            repo_id = f"{payload['organization']}/{payload['name']}"
        except (ValueError, KeyError, TypeError):
            return _error(400, None, "a JSON body with 'name' and 'organization' is required")
        url = f"{self.endpoint}/{repo_id}"
        with self._lock:
            token = self._tokens.get(repo_id)
            exists = any(repo == repo_id for repo, _ in self._branches)
        if token is not None and authorization != f"Bearer {token}":
            return _error(401, None, "Invalid credentials in Authorization header")
        if exists:
            return _json(409, {"error": "You already created this model repo", "url": url})
        self._commit_files(repo_id, "main", {".gitattributes": _GITATTRIBUTES})
        return _json(200, {"url": url, "name": repo_id, "id": repo_id})

    def _push(self, kind: str, repo_id: str, revision: str, body: bytes) -> _Response:
        commit = self._commit(repo_id, revision)
        if commit is None:
            return _error(404, "RevisionNotFound", f"Invalid rev id: {revision}")
        try:
            if kind == "preupload":
                files = [
                    {"path": f["path"], "uploadMode": "regular", "shouldIgnore": False,
                     "oid": _git_blob_sha(commit.files[f["path"]])
                     if f["path"] in commit.files else None}
                    for f in json.loads(body)["files"]
                ]  # fmt: skip
                return _json(200, {"files": files, "commitOid": commit.sha})
            added: dict[str, bytes] = {}
            deleted: list[str] = []
            for line in body.splitlines():
                item = json.loads(line)
                value = item["value"]
                if item["key"] == "file" and value.get("encoding") == "base64":
                    added[value["path"]] = base64.b64decode(value["content"], validate=True)
                elif item["key"] in ("deletedFile", "deletedFolder"):
                    deleted.append(value["path"])
                elif item["key"] != "header":
                    return _error(400, None, f"the fake Hub takes no {item['key']!r} operation")
        except (ValueError, KeyError, TypeError) as exc:
            return _error(400, None, f"malformed {kind} request: {exc}")
        sha = self._commit_files(repo_id, revision, added, tuple(deleted))
        url = f"{self.endpoint}/{repo_id}/commit/{sha}"
        return _json(200, {"success": True, "commitOid": sha, "commitUrl": url})


def _payload(seed: str, size: int) -> bytes:
    """``size`` bytes that differ per ``seed`` (so blobs differ), cheap to make."""
    block = hashlib.sha256(seed.encode()).digest()
    return (block * (size // len(block) + 1))[:size]


@contextlib.contextmanager
def isolated_hf_client() -> Iterator[None]:
    """Keep huggingface_hub off the network and away from the user's token, for tests.

    Inside the block huggingface_hub refuses any request to a non-loopback
    host (so huggingface.co is never contacted by mistake), sends no
    telemetry (which would also fetch an agent registry from huggingface.co)
    and uses no token it finds on the machine (only explicit ``token=``).
    On exit the settings are restored and huggingface_hub's pooled connections
    are closed. Only huggingface_hub's public client API is used: the guarded
    client is the one its factory makes (same event hooks, redirects and
    timeout) with the loopback check in front, and on exit the factory makes
    that client without the check again.
    """
    from huggingface_hub import close_session, constants, get_session, set_client_factory  # noqa: PLC0415

    def refuse_non_loopback(request: Any) -> None:  # noqa: ANN401 - an httpx request
        host = request.url.host
        if host not in _LOOPBACK_HOSTS:
            msg = f"isolated_hf_client: refusing a request to {request.url} (not loopback)"
            raise RuntimeError(msg)

    close_session()
    template = get_session()  # a client from the factory in place, to copy its settings

    def client_factory(*, guarded: bool) -> Any:  # noqa: ANN401 - an httpx client factory
        request_hooks = list(template.event_hooks["request"])
        if guarded:
            request_hooks.insert(0, refuse_non_loopback)
        hooks = {"request": request_hooks, "response": list(template.event_hooks["response"])}
        return lambda: type(template)(
            event_hooks=hooks, follow_redirects=template.follow_redirects, timeout=template.timeout
        )

    saved = (constants.HF_HUB_DISABLE_TELEMETRY, constants.HF_HUB_DISABLE_IMPLICIT_TOKEN)
    constants.HF_HUB_DISABLE_TELEMETRY = True
    constants.HF_HUB_DISABLE_IMPLICIT_TOKEN = True
    set_client_factory(client_factory(guarded=True))  # closes the template
    try:
        yield
    finally:
        set_client_factory(client_factory(guarded=False))  # closes the guarded client
        constants.HF_HUB_DISABLE_TELEMETRY, constants.HF_HUB_DISABLE_IMPLICIT_TOKEN = saved


@contextlib.contextmanager
def serve_fake_hub(*, page_size: int = 1000) -> Iterator[FakeHub]:
    """A started `FakeHub` inside `isolated_hf_client`; the body of a ``fake_hub`` fixture.

    Everything is torn down on exit: the client's connections, the server's
    socket and its threads. A pytest plugin exposes it as::

        @pytest.fixture
        def fake_hub() -> Iterator[FakeHub]:
            with serve_fake_hub() as hub:
                yield hub
    """
    with isolated_hf_client(), FakeHub(page_size=page_size) as hub:
        yield hub

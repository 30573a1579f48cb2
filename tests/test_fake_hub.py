"""FakeHub speaks enough of the Hub's HTTP API for the real huggingface_hub client."""

from __future__ import annotations

import http.client
import json
import socket
import struct
import threading
from pathlib import Path
from urllib.parse import urlsplit

import huggingface_hub
import pytest
from huggingface_hub import HfApi, constants, get_session, hf_hub_download, snapshot_download
from huggingface_hub.errors import (
    EntryNotFoundError,
    HfHubHTTPError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)
from huggingface_hub.hf_api import RepoFile, RepoFolder

from fakes.hub import FakeHub, isolated_hf_client, serve_fake_hub

REPO = "org/run"


def _threads() -> set[threading.Thread]:
    # tqdm's monitor is a process-wide helper tqdm keeps for its own bars.
    return {t for t in threading.enumerate() if t.name != "tqdm_monitor"}


@pytest.fixture
def hub():
    before = _threads()
    with serve_fake_hub(page_size=4) as fake:
        yield fake
    assert _threads() - before == set(), "FakeHub left threads behind"


def api(hub: FakeHub, token: str | None = None) -> HfApi:
    return HfApi(endpoint=hub.endpoint, token=token)


def test_repo_info_has_sha_and_siblings(hub):
    hub.add_file(REPO, "README.md", b"hello")
    sha = hub.add_file(REPO, "checkpoint-1/trainer_state.json", b"{}")
    info = api(hub).model_info(REPO)
    assert info.sha == sha == hub.sha(REPO)
    assert sorted(s.rfilename for s in info.siblings or []) == [
        "README.md",
        "checkpoint-1/trainer_state.json",
    ]
    assert api(hub).model_info(REPO, revision="main").sha == sha
    assert api(hub).model_info(REPO, revision=sha).sha == sha
    sizes = {
        s.rfilename: s.size for s in api(hub).model_info(REPO, files_metadata=True).siblings or []
    }
    assert sizes == {"README.md": 5, "checkpoint-1/trainer_state.json": 2}


def test_recursive_tree_listing_is_paginated_and_complete(hub):
    sizes = {}
    for step in (1, 2, 3):
        sizes.update(
            {
                f"checkpoint-{step}/{name}": len(data)
                for name, data in _files_of(hub, f"checkpoint-{step}", step).items()
            }
        )
    hub.add_file(REPO, "README.md", b"x" * 7)
    sizes["README.md"] = 7
    hub.reset_counters()
    entries = list(api(hub).list_repo_tree(REPO, recursive=True))
    files = {e.path: e.size for e in entries if isinstance(e, RepoFile)}
    folders = {e.path for e in entries if isinstance(e, RepoFolder)}
    assert files == sizes
    assert folders == {"checkpoint-1", "checkpoint-2", "checkpoint-3"}
    pages = [r for r in hub.requests if "/tree/" in r[1]]
    assert len(pages) == -(-len(entries) // 4) > 1  # page_size=4: the client followed the links


def test_non_recursive_and_sub_path_listing(hub):
    hub.add_file(REPO, "a/b/c.txt", b"c")
    hub.add_file(REPO, "a/d.txt", b"d")
    hub.add_file(REPO, "top.txt", b"t")
    top = {(type(e).__name__, e.path) for e in api(hub).list_repo_tree(REPO)}
    assert top == {("RepoFolder", "a"), ("RepoFile", "top.txt")}
    sub = {(type(e).__name__, e.path) for e in api(hub).list_repo_tree(REPO, path_in_repo="a")}
    assert sub == {("RepoFolder", "a/b"), ("RepoFile", "a/d.txt")}
    with pytest.raises(EntryNotFoundError):
        list(api(hub).list_repo_tree(REPO, path_in_repo="nope"))


def test_hf_hub_download_over_plain_http_counts_bytes(hub, tmp_path):
    data = b"\x00\x01" * 5000
    sha = hub.add_file(REPO, "checkpoint-1/model.safetensors", data)
    hub.reset_counters()
    path = hf_hub_download(
        REPO,
        "checkpoint-1/model.safetensors",
        endpoint=hub.endpoint,
        local_dir=tmp_path / "out",
        cache_dir=tmp_path / "cache",
    )
    assert Path(path).read_bytes() == data
    assert hub.bytes_served == len(data)
    assert hub.downloads == [(REPO, "checkpoint-1/model.safetensors")]
    assert hub.requests == [
        ("HEAD", f"/{REPO}/resolve/main/checkpoint-1/model.safetensors"),
        ("GET", f"/{REPO}/resolve/main/checkpoint-1/model.safetensors"),
    ]
    meta = huggingface_hub.get_hf_file_metadata(
        huggingface_hub.hf_hub_url(REPO, "checkpoint-1/model.safetensors", endpoint=hub.endpoint)
    )
    assert (meta.commit_hash, meta.size, meta.xet_file_data) == (sha, len(data), None)
    assert meta.etag is not None
    assert len(meta.etag) == 40


def test_snapshot_download_with_patterns(hub, tmp_path):
    for step in (1, 2):
        hub.add_checkpoint(REPO, f"checkpoint-{step}", step, size=100)
    hub.add_file(REPO, "README.md", b"readme")
    hub.reset_counters()
    snapshot_download(
        REPO,
        allow_patterns=["checkpoint-2/*"],
        endpoint=hub.endpoint,
        local_dir=tmp_path / "out",
        cache_dir=tmp_path / "cache",
    )
    assert hub.bytes_served == hub.folder_size(REPO, "checkpoint-2")
    assert {p for _, p in hub.downloads} == {
        p for p in hub.files(REPO) if p.startswith("checkpoint-2/")
    }
    state = json.loads((tmp_path / "out/checkpoint-2/trainer_state.json").read_text())
    assert state["global_step"] == 2


def test_unknown_repo_revision_and_file_are_the_hubs_404s(hub, tmp_path):
    hub.add_file(REPO, "a.txt", b"a")
    with pytest.raises(RepositoryNotFoundError) as repo_error:
        api(hub).model_info("org/missing")
    assert repo_error.value.response.status_code == 404
    with pytest.raises(RevisionNotFoundError):
        api(hub).model_info(REPO, revision="nope")
    with pytest.raises(EntryNotFoundError):
        hf_hub_download(
            REPO, "b.txt", endpoint=hub.endpoint, local_dir=tmp_path, cache_dir=tmp_path / "c"
        )


def test_protected_repo_wants_its_token(hub, tmp_path):
    hub.add_file(REPO, "a.txt", b"a")
    hub.protect(REPO, "hf_right")
    with pytest.raises(RepositoryNotFoundError) as missing:
        api(hub).model_info(REPO)
    assert missing.value.response.status_code == 401
    with pytest.raises(HfHubHTTPError) as wrong:
        api(hub, token="hf_wrong").model_info(REPO)
    assert wrong.value.response.status_code == 401
    assert api(hub, token="hf_right").model_info(REPO).private is True
    path = hf_hub_download(
        REPO,
        "a.txt",
        endpoint=hub.endpoint,
        token="hf_right",
        local_dir=tmp_path,
        cache_dir=tmp_path / "c",
    )
    assert Path(path).read_bytes() == b"a"


def test_old_commits_stay_readable_by_sha(hub):
    first = hub.add_file(REPO, "a.txt", b"1")
    second = hub.add_file(REPO, "a.txt", b"2")
    assert first != second
    assert api(hub).model_info(REPO, revision=first).sha == first
    assert [e.path for e in api(hub).list_repo_tree(REPO, revision=first)] == ["a.txt"]
    assert hub.files(REPO) == {"a.txt": b"2"}


def test_branches_are_separate(hub):
    hub.add_file(REPO, "a.txt", b"main")
    hub.add_file(REPO, "b.txt", b"dev", revision="dev")
    assert [e.path for e in api(hub).list_repo_tree(REPO, revision="dev")] == ["b.txt"]


def test_reset_counters(hub):
    hub.add_file(REPO, "a.txt", b"a")
    api(hub).model_info(REPO)
    assert hub.requests
    hub.reset_counters()
    assert (hub.requests, hub.downloads, hub.bytes_served) == ([], [], 0)


def test_unknown_route_is_404(hub):
    host, port = hub.endpoint.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(b"GET /nothing/here HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        reply = sock.makefile("rb").read()
    assert reply.startswith(b"HTTP/1.1 404")


@pytest.mark.parametrize(
    ("repo_id", "path"),
    [("norepo", "a.txt"), ("a/b/c", "a.txt"), (REPO, ""), (REPO, "/abs"), (REPO, "dir/")],
)
def test_add_file_rejects_bad_names(repo_id, path):
    with pytest.raises(ValueError, match=r"repo_id=|path="):
        FakeHub().add_file(repo_id, path, b"")


def test_close_frees_port_and_threads_and_is_idempotent():
    before = _threads()
    hub = FakeHub().start()
    port = int(hub.endpoint.rsplit(":", 1)[1])
    with pytest.raises(RuntimeError, match="already started"):
        hub.start()
    with isolated_hf_client():
        hub.add_file(REPO, "a.txt", b"a")
        HfApi(endpoint=hub.endpoint).model_info(REPO)  # leaves a kept-alive connection open
        hub.close()
    hub.close()
    assert _threads() - before == set()
    with pytest.raises(ConnectionRefusedError), socket.create_connection(("127.0.0.1", port)):
        pass
    with pytest.raises(RuntimeError, match="not started"):
        _ = hub.endpoint


def test_isolated_client_refuses_the_real_hub_and_restores_settings():
    saved = (constants.HF_HUB_DISABLE_TELEMETRY, constants.HF_HUB_DISABLE_IMPLICIT_TOKEN)
    with isolated_hf_client():
        assert constants.HF_HUB_DISABLE_TELEMETRY is True
        assert constants.HF_HUB_DISABLE_IMPLICIT_TOKEN is True
        with pytest.raises(RuntimeError, match="not loopback"):
            HfApi(endpoint="https://huggingface.co").model_info("openai-community/gpt2")
    assert saved == (constants.HF_HUB_DISABLE_TELEMETRY, constants.HF_HUB_DISABLE_IMPLICIT_TOKEN)


def test_isolated_client_leaves_huggingface_hubs_own_client_as_it_was():
    before = get_session()
    hooks = (list(before.event_hooks["request"]), list(before.event_hooks["response"]))
    with isolated_hf_client():
        inside = get_session()
        assert len(inside.event_hooks["request"]) == len(hooks[0]) + 1  # the loopback guard
        with isolated_hf_client():  # nested: the outer guard survives the inner block
            pass
        with pytest.raises(RuntimeError, match="not loopback"):
            get_session().get("https://huggingface.co/api/models/gpt2")
    after = get_session()
    assert after is not inside
    assert inside.is_closed
    assert (list(after.event_hooks["request"]), list(after.event_hooks["response"])) == hooks
    assert (after.follow_redirects, after.timeout) == (before.follow_redirects, before.timeout)


def _files_of(hub: FakeHub, folder: str, step: int) -> dict[str, bytes]:
    hub.add_checkpoint(REPO, folder, step, size=10)
    prefix = f"{folder}/"
    return {p[len(prefix) :]: d for p, d in hub.files(REPO).items() if p.startswith(prefix)}


def test_serve_instead_sends_a_body_with_headers_that_match_it(hub, tmp_path):
    hub.add_file(REPO, "a/model.bin", b"x" * 100)
    hub.serve_instead(REPO, "a/model.bin", b"short")
    tree = api(hub).list_repo_tree(REPO, recursive=True)
    listed = {e.path: e.size for e in tree if isinstance(e, RepoFile)}
    assert listed["a/model.bin"] == 100
    path = hf_hub_download(REPO, "a/model.bin", endpoint=hub.endpoint, local_dir=tmp_path)
    assert Path(path).read_bytes() == b"short"


def test_fail_downloads_fails_the_body_only_and_heals(hub, tmp_path):
    hub.add_file(REPO, "a/model.bin", b"x" * 10)
    hub.fail_downloads(REPO, "a/model.bin", 403)
    with pytest.raises(HfHubHTTPError) as info:
        hf_hub_download(REPO, "a/model.bin", endpoint=hub.endpoint, local_dir=tmp_path)
    assert info.value.response.status_code == 403
    assert ("HEAD", f"/{REPO}/resolve/main/a/model.bin") in hub.requests
    hub.fail_downloads(REPO, "a/model.bin", 0)
    path = hf_hub_download(REPO, "a/model.bin", endpoint=hub.endpoint, local_dir=tmp_path)
    assert Path(path).read_bytes() == b"x" * 10


def test_hold_catches_a_download_in_the_middle(hub, tmp_path):
    hub.add_file(REPO, "a/model.bin", b"x" * 10)
    hold = hub.hold(REPO, "a/model.bin")
    done = threading.Event()

    def download() -> None:
        hf_hub_download(REPO, "a/model.bin", endpoint=hub.endpoint, local_dir=tmp_path)
        done.set()

    thread = threading.Thread(target=download)
    thread.start()
    assert hold.arrived.wait(30)
    assert not done.is_set()
    assert hub.wait_for_requests("/resolve/", 2, timeout=30)  # HEAD, then the held GET
    hold.release()
    thread.join(30)
    assert done.is_set()


def test_hold_listing_and_close_releases_every_hold(tmp_path):
    with serve_fake_hub() as hub:
        hub.add_file(REPO, "a/b", b"x")
        hold = hub.hold_listing(REPO)
        errors: list[BaseException] = []

        def listing() -> None:
            try:
                list(api(hub).list_repo_tree(REPO, recursive=True))
            except Exception as exc:  # noqa: BLE001 - the server went away
                errors.append(exc)

        thread = threading.Thread(target=listing)
        thread.start()
        assert hold.arrived.wait(30)
    thread.join(30)  # close() released the held listing, so the client is not stuck
    assert not thread.is_alive()
    assert not hub.wait_for_requests("/nothing/", 1, timeout=0)


def _post(hub: FakeHub, path: str, body: bytes) -> tuple[int, bytes]:
    """A raw POST with a token (what huggingface_hub would never send): (status, body)."""
    headers = {"Authorization": "Bearer hf_x"}
    reply = get_session().post(f"{hub.endpoint}{path}", content=body, headers=headers)
    return reply.status_code, reply.content


def test_a_trainer_push_creates_the_repo_and_commits_the_checkpoint(hub, tmp_path):
    """What Trainer does with push_to_hub=True, hub_strategy="checkpoint", through HfApi."""
    folder = tmp_path / "checkpoint-3"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(bytes(range(256)) * 400)
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": 3}))
    client = api(hub, token="hf_x")
    url = client.create_repo(REPO, exist_ok=True)
    assert url.repo_id == REPO
    assert hub.files(REPO) == {".gitattributes": hub.files(REPO)[".gitattributes"]}  # empty
    assert client.create_repo(REPO, exist_ok=True).repo_id == REPO  # 409, taken as "exists"
    with pytest.raises(HfHubHTTPError) as conflict:
        client.create_repo(REPO)
    assert conflict.value.response.status_code == 409
    info = client.upload_folder(repo_id=REPO, folder_path=folder, path_in_repo="last-checkpoint")
    assert info.oid == hub.sha(REPO)
    files = hub.files(REPO)
    assert files["last-checkpoint/model.safetensors"] == bytes(range(256)) * 400
    assert json.loads(files["last-checkpoint/trainer_state.json"]) == {"global_step": 3}
    # Unchanged files are not sent again (the preupload answers their oid).
    before = hub.sha(REPO)
    client.upload_folder(repo_id=REPO, folder_path=folder, path_in_repo="last-checkpoint")
    assert hub.sha(REPO) == before
    client.delete_folder("last-checkpoint", repo_id=REPO)
    assert sorted(hub.files(REPO)) == [".gitattributes"]
    client.upload_file(path_or_fileobj=b"---\nlicense: mit\n---\n", path_in_repo="README.md",
                       repo_id=REPO)  # fmt: skip
    client.delete_file("README.md", repo_id=REPO)
    client.upload_file(path_or_fileobj=b"x", path_in_repo="a/b.txt", repo_id=REPO)
    client.delete_file("a/b.txt", repo_id=REPO)
    assert sorted(hub.files(REPO)) == [".gitattributes"]


def test_pushes_want_a_token_an_existing_repo_and_well_formed_bodies(hub):
    with pytest.raises(HfHubHTTPError) as anonymous:
        api(hub).create_repo(REPO)
    assert anonymous.value.response.status_code == 401
    hub.protect("org/private", "hf_right")
    with pytest.raises(HfHubHTTPError) as wrong:
        api(hub, token="hf_wrong").create_repo("org/private")
    assert wrong.value.response.status_code == 401
    with pytest.raises(RepositoryNotFoundError):
        api(hub, token="hf_x").upload_file(path_or_fileobj=b"x", path_in_repo="a", repo_id=REPO)
    assert _post(hub, "/api/repos/create", b"not json")[0] == 400
    api(hub, token="hf_x").create_repo(REPO)
    assert _post(hub, f"/api/models/{REPO}/commit/nope", b"")[0] == 404
    assert _post(hub, f"/api/models/{REPO}/preupload/main", b"{}")[0] == 400
    lfs = json.dumps({"key": "lfsFile", "value": {"path": "a", "algo": "sha256", "oid": "0"}})
    status, body = _post(hub, f"/api/models/{REPO}/commit/main", lfs.encode())
    assert (status, json.loads(body)["error"]) == (400, "the fake Hub takes no 'lfsFile' operation")
    host, port = hub.endpoint.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port))) as sock:
        sock.sendall(b"POST /api/repos/create HTTP/1.1\r\nHost: x\r\nContent-Length: 999999999999"
                     b"\r\nConnection: close\r\n\r\n")  # fmt: skip
        reply = sock.makefile("rb").read()
    assert reply.startswith(b"HTTP/1.1 413")


def test_a_download_the_client_read_whole_is_already_counted(hub):
    # Counted after the body was written, a download could read as uncounted to the client
    # that had just read it (seen once in CI): each read is checked the moment it ends.
    hub.add_file(REPO, "w.bin", b"w" * 100)
    hub.reset_counters()
    connection = http.client.HTTPConnection(urlsplit(hub.endpoint).netloc, timeout=10)
    try:
        for n in range(1, 301):
            connection.request("GET", f"/{REPO}/resolve/main/w.bin")
            assert connection.getresponse().read() == b"w" * 100
            assert hub.bytes_served == 100 * n
    finally:
        connection.close()


def test_a_client_that_hangs_up_mid_body_is_not_counted_or_printed(hub, capfd):
    hub.add_file(REPO, "big.bin", b"b" * (64 << 20))
    hub.reset_counters()
    address = urlsplit(hub.endpoint)
    with socket.create_connection((address.hostname, address.port), timeout=10) as raw:
        raw.sendall(f"GET /{REPO}/resolve/main/big.bin HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        assert raw.recv(1024).startswith(b"HTTP/1.1 200")
        raw.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    hub.close()  # joins the handler thread, which met the reset
    assert (hub.downloads, hub.bytes_served) == ([], 0)
    assert "Traceback" not in capfd.readouterr().err

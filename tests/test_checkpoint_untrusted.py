"""Issue 26, class 3: what the Hub, the download folder or a shared folder holds is untrusted.

Folder names and file contents from a Hub listing, the download folder or a
node's shared records (absurd step numbers, deep JSON, garbage bytes, a
symlink where a file or folder belongs, a lock file held or replaced, a
record that is not verirl's, a ``global_step`` that is a bool, float,
negative or huge) end in a verirl error or are skipped with a warning: never
a raw Python exception, never a write through a symlink or outside the folder.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import hashlib
import json
import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import attrs
import pytest
from hypothesis import given
from hypothesis import strategies as st

import verirl._fs
from _checkpoint_support import (
    REPO,
    SWEEP,
    isolated_hub,
    make_checkpoint,
    snapshot,
    warnings_of,
)
from fakes.hub import FakeHub
from verirl import (
    CheckpointResolver,
    CheckpointSourceError,
    ConfigError,
    HubCheckpointSource,
    LocalCheckpointSource,
    VeriRLError,
)
from verirl._fs import flock_with_deadline
from verirl.checkpoints.download_dir import fetch_folder
from verirl.checkpoints.download_record import FileEntry, RemoteFolder
from verirl.checkpoints.model import checkpoint_step
from verirl.checkpoints.node_share import NodeSharedResolver
from verirl.cli import main

MAX_STEP = 2**63 - 1  # Trainer counts steps in a 64-bit integer
TWENTY_NINES = "9" * 20


@pytest.fixture
def hub(tmp_path, monkeypatch):
    with isolated_hub(tmp_path, monkeypatch) as fake:
        yield fake


def hub_source(hub: FakeHub, tmp_path: Path) -> HubCheckpointSource:
    return HubCheckpointSource(REPO, download_dir=tmp_path / "dl", endpoint=hub.endpoint)


# ---------------------------------------------------------------- step numbers


@SWEEP
@given(
    name=st.one_of(
        st.integers(0, 2**70).map(lambda n: f"checkpoint-{n}"),
        st.integers(1, 6000).map(lambda k: "checkpoint-" + "9" * k),
        st.integers(1, 30).map(lambda k: "checkpoint-" + "0" * k + "7"),
        st.text(max_size=30),
    )
)
def test_a_folder_name_gives_a_plausible_step_or_none_never_an_exception(name):
    step = checkpoint_step(name)
    if step is not None:
        assert 0 <= step <= MAX_STEP
        assert int(name.removeprefix("checkpoint-")) == step


@pytest.mark.parametrize("digits", [20, 244], ids=["20-digits", "longest-name"])
def test_a_local_folder_with_an_absurd_step_is_skipped_with_a_warning(tmp_path, caplog, digits):
    make_checkpoint(tmp_path, "checkpoint-10")
    absurd = make_checkpoint(tmp_path, "checkpoint-" + "9" * digits, {"global_step": 1})
    before = snapshot(absurd)
    assert LocalCheckpointSource(tmp_path).latest().step == 10
    assert CheckpointResolver([LocalCheckpointSource(tmp_path)]).resolve("auto") == str(
        tmp_path / "checkpoint-10"
    )
    assert "beyond any training run" in warnings_of(caplog)
    assert snapshot(absurd) == before


def test_hub_folders_with_absurd_steps_are_skipped_with_a_warning(hub, tmp_path, caplog):
    hub.add_checkpoint(REPO, "checkpoint-10", 10)
    for name in (f"checkpoint-{TWENTY_NINES}", "checkpoint-" + "9" * 5000):
        hub.add_file(REPO, f"{name}/trainer_state.json", b'{"global_step": 1}')
    source = hub_source(hub, tmp_path)
    assert source.latest().step == 10
    assert "beyond any training run" in warnings_of(caplog)
    assert CheckpointResolver([source]).resolve("latest") == str(tmp_path / "dl/checkpoint-10")


@pytest.mark.parametrize(
    "content",
    [
        json.dumps({"global_step": True}).encode(),
        json.dumps({"global_step": 20.0}).encode(),
        json.dumps({"global_step": -20}).encode(),
        json.dumps({"global_step": 2**63}).encode(),
        json.dumps({"global_step": 10**30}).encode(),
        b'{"global_step": ' + b"9" * 5000 + b"}",
        b'{"global_step": 1e999}',
        b"[" * 100_000,
        b"\xff\xfe garbage \x00",
        b"null",
    ],
    ids=[
        "bool",
        "float",
        "negative",
        "2**63",
        "10**30",
        "5000-digits",
        "inf",
        "deep",
        "garbage",
        "null",
    ],
)
def test_a_hostile_last_checkpoint_state_is_skipped_with_a_warning(hub, tmp_path, caplog, content):
    hub.add_checkpoint(REPO, "checkpoint-10", 10)
    hub.add_checkpoint(REPO, "last-checkpoint", 20)
    hub.add_file(REPO, "last-checkpoint/trainer_state.json", content)
    assert hub_source(hub, tmp_path).latest().step == 10
    assert "last-checkpoint" in warnings_of(caplog)


@pytest.mark.parametrize("older", [True, False], ids=["beside-checkpoint-10", "alone"])
@pytest.mark.parametrize("served", ["empty", "valid-prefix", "cut", "longer"])
def test_a_body_of_last_checkpoints_state_unlike_the_listing_is_a_source_error(
    hub, tmp_path, served, older
):
    """A mirror or proxy that cuts the body (to JSON that still parses, too) is caught by its
    size: last-checkpoint may be the newest, so neither an older one nor a fresh start."""
    state = json.dumps({"global_step": 40, "epoch": 0.4, "log_history": []}).encode()
    if older:
        hub.add_checkpoint(REPO, "checkpoint-10", 10)
    hub.add_checkpoint(REPO, "last-checkpoint", 40)
    hub.add_file(REPO, "last-checkpoint/trainer_state.json", state)
    body = {"empty": b"", "valid-prefix": b'{"global_step": 4}', "cut": state[:10]}
    hub.serve_instead(REPO, "last-checkpoint/trainer_state.json", body.get(served, state + b"  "))
    for request in ("auto", "latest"):
        with pytest.raises(CheckpointSourceError, match=r"trainer_state\.json has \d+ bytes, the"):
            CheckpointResolver([hub_source(hub, tmp_path)]).resolve(request)
    assert not (tmp_path / "dl" / "checkpoint-10").exists()


# ---------------------------------------------------------------- what a listing says


def rewrite_listing(monkeypatch: pytest.MonkeyPatch, edit) -> None:
    """Have the fake Hub's tree listing pass through ``edit(entries) -> entries``."""
    original = FakeHub._tree

    def tree(self, *args, **kwargs):
        response = original(self, *args, **kwargs)
        if response.status != 200:
            return response
        return attrs.evolve(response, body=json.dumps(edit(json.loads(response.body))).encode())

    monkeypatch.setattr(FakeHub, "_tree", tree)


def rewrite_commit(monkeypatch: pytest.MonkeyPatch, sha: object) -> None:
    original = FakeHub._repo_info

    def repo_info(self, *args, **kwargs):
        response = original(self, *args, **kwargs)
        if response.status != 200:
            return response
        info = {**json.loads(response.body), "sha": sha}
        return attrs.evolve(response, body=json.dumps(info).encode())

    monkeypatch.setattr(FakeHub, "_repo_info", repo_info)


def outside(tmp_path: Path) -> set[str]:
    """Everything under ``tmp_path`` but the download folder and the fake system tmp."""
    return {
        os.fspath(p.relative_to(tmp_path))
        for p in tmp_path.rglob("*")
        if p.relative_to(tmp_path).parts[0] not in ("dl", "system-tmp")
    }


@pytest.mark.parametrize(
    "entry",
    [
        ("size", 10**400),
        ("size", 2**60),
        ("size", -1),
        ("size", True),
        ("size", "100"),
        ("size", None),
        ("size", 1.5),
        ("path", "checkpoint-30/\ud800.bin"),
        ("path", "checkpoint-30/" + "x" * 300),
        ("path", "checkpoint-30/a/../../../../escaped.bin"),
    ],
    ids=lambda entry: repr(entry)[:32],
)
@pytest.mark.parametrize("request_", ["latest", "auto"])
def test_a_newest_checkpoint_with_a_hostile_listing_entry_is_a_source_error(
    hub, tmp_path, monkeypatch, entry, request_
):
    """It may hold the newest progress: neither an older one nor a fresh start is resumed."""
    field, value = entry
    hub.add_checkpoint(REPO, "checkpoint-20", 20)
    hub.add_checkpoint(REPO, "checkpoint-30", 30)

    def edit(entries: list[dict[str, object]]) -> list[dict[str, object]]:
        for listed in entries:
            if listed.get("path") == "checkpoint-30/model.safetensors":
                listed[field] = value
        return entries

    rewrite_listing(monkeypatch, edit)
    before = outside(tmp_path)
    with pytest.raises(CheckpointSourceError, match="cannot use checkpoint-30 in hub:") as err:
        CheckpointResolver([hub_source(hub, tmp_path)]).resolve(request_)
    cause = err.value.__cause__
    assert isinstance(cause, CheckpointSourceError)
    assert cause.checkpoint_unreadable  # (what keeps another source's older one from being used)
    assert outside(tmp_path) == before
    assert not (tmp_path / "dl" / "checkpoint-20").exists()


def test_auto_with_its_only_checkpoint_unusable_is_a_source_error_not_a_fresh_start(hub, tmp_path):
    hub.add_checkpoint(REPO, "checkpoint-20", 20)
    hub.add_file(REPO, "checkpoint-20/sub/../../../escape.txt", b"x")
    with pytest.raises(CheckpointSourceError, match="cannot use checkpoint-20 in hub:"):
        CheckpointResolver([hub_source(hub, tmp_path)]).resolve("auto")
    assert not (tmp_path / "escape.txt").exists()


@pytest.mark.parametrize(
    ("folder", "resumed"),
    [("checkpoint-10", "checkpoint-20"), ("runs", "checkpoint-20"), ("last-checkpoint", None)],
)
def test_a_hostile_entry_elsewhere_is_passed_over_unless_it_may_be_newer(
    hub, tmp_path, folder, resumed
):
    """An older checkpoint or another folder is skipped; last-checkpoint's step is unknown."""
    hub.add_checkpoint(REPO, "checkpoint-20", 20)
    hub.add_file(REPO, f"{folder}/a/../../../escaped.bin", b"x")
    if resumed is None:
        with pytest.raises(CheckpointSourceError, match=f"cannot use {folder} in hub:"):
            CheckpointResolver([hub_source(hub, tmp_path)]).resolve("auto")
        return
    path = CheckpointResolver([hub_source(hub, tmp_path)]).resolve("auto")
    assert path == str(tmp_path / "dl" / resumed)
    assert not (tmp_path / "escaped.bin").exists()


@pytest.mark.parametrize(
    "sha", ["../../../../escaped", "a" * 40 + "/../x", 12345, ["x"], "main\x00"], ids=repr
)
def test_a_commit_id_that_is_not_one_is_a_source_error(hub, tmp_path, monkeypatch, sha):
    hub.add_checkpoint(REPO, "checkpoint-20", 20)
    rewrite_commit(monkeypatch, sha)
    before = outside(tmp_path)
    with pytest.raises(CheckpointSourceError):
        CheckpointResolver([hub_source(hub, tmp_path)]).resolve("latest")
    assert outside(tmp_path) == before


# ---------------------------------------------------------------- the download folder


def test_a_symlinked_folder_inside_a_users_folder_is_never_followed(hub, tmp_path):
    """Files reached through a symlinked subfolder are not the folder's: never reused."""
    hub.add_checkpoint(REPO, "checkpoint-20", 20)
    hub.add_file(REPO, "checkpoint-20/sub/extra.bin", b"12345")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "extra.bin").write_bytes(b"abcde")  # the size the listing says
    users = tmp_path / "dl" / "checkpoint-20"
    users.mkdir(parents=True)
    for path, data in hub.files(REPO).items():
        if path.startswith("checkpoint-20/") and not path.startswith("checkpoint-20/sub/"):
            (users / path.split("/", 1)[1]).write_bytes(data)
    (users / "sub").symlink_to(elsewhere, target_is_directory=True)
    before = snapshot(users)
    with pytest.raises(ConfigError, match="verirl did not download"):
        CheckpointResolver([hub_source(hub, tmp_path)]).resolve("latest")
    assert snapshot(users) == before
    assert (elsewhere / "extra.bin").read_bytes() == b"abcde"


@pytest.mark.parametrize(
    "marker",
    [
        b"[]",
        b"\xff\xfe garbage",
        b"[" * 100_000,
        json.dumps({"written_by": "verirl", "files": []}).encode(),
        json.dumps({"written_by": "verirl", "files": {"model.safetensors": 5}}).encode(),
        "symlink",
    ],
    ids=["list", "garbage", "deep", "files-a-list", "entry-not-an-object", "symlink"],
)
def test_a_hostile_download_marker_never_makes_a_folder_replaceable(hub, tmp_path, marker):
    hub.add_checkpoint(REPO, "checkpoint-20", 20)
    source = hub_source(hub, tmp_path)
    folder = Path(CheckpointResolver([source]).resolve("latest"))
    hub.add_file(REPO, "checkpoint-20/model.safetensors", b"a newer commit")
    (folder / "mine.txt").write_text("the user's")
    path = folder / ".verirl-download.json"
    path.unlink()
    if marker == "symlink":
        real = tmp_path / "real-marker.json"
        real.write_text(json.dumps({"written_by": "verirl", "files": {}}))
        path.symlink_to(real)
    else:
        path.write_bytes(marker)
    before = snapshot(folder)
    with pytest.raises(ConfigError, match="verirl did not download"):
        CheckpointResolver([hub_source(hub, tmp_path)]).resolve("latest")
    assert snapshot(folder) == before


# ---------------------------------------------------------------- locks, held or replaced


class WatchedFcntl(ModuleType):
    """`fcntl`, recording which file each refused lock attempt was on (the OS layer of `_fs`)."""

    def __init__(self) -> None:
        super().__init__("fcntl")
        self.blocked_on: list[int] = []
        self.changed = threading.Condition()

    def __getattr__(self, name: str) -> object:
        return getattr(fcntl, name)

    def flock(self, fd: int, operation: int) -> None:
        try:
            fcntl.flock(fd, operation)
        except BlockingIOError:
            with self.changed:
                self.blocked_on.append(os.fstat(fd).st_ino)
                self.changed.notify_all()
            raise


def test_a_waiter_never_holds_a_lock_file_that_was_replaced_meanwhile(tmp_path, monkeypatch):
    """A holds the lock; B waits on that file; it is replaced and C locks the new one.

    When A lets go, B must not go ahead on the old file while C holds the new one.
    """
    watched = WatchedFcntl()
    monkeypatch.setattr(verirl._fs, "fcntl", watched)
    lock = tmp_path / "x.lock"
    got, release = threading.Event(), threading.Event()

    def waiter() -> None:
        with flock_with_deadline(lock, 30):
            got.set()
            release.wait(30)

    with contextlib.ExitStack() as stack:
        stack.enter_context(flock_with_deadline(lock, 1))  # A
        old_ino = lock.stat().st_ino
        thread = threading.Thread(target=waiter)
        thread.start()
        with watched.changed:
            assert watched.changed.wait_for(lambda: old_ino in watched.blocked_on, 10)
        replacement = tmp_path / "x.lock.new"
        replacement.write_text("")
        replacement.replace(lock)
        new_ino = lock.stat().st_ino
        with flock_with_deadline(lock, 1):  # C
            stack.close()  # A lets go
            with watched.changed:
                watched.changed.wait_for(lambda: new_ino in watched.blocked_on or got.is_set(), 10)
            assert not got.is_set(), "B went ahead on the replaced lock file while C holds the new"
        assert got.wait(10)  # C let go: B's turn, on the file that is there
    release.set()
    thread.join(30)


class Slow:
    """A leader's resolver that answers once released."""

    def __init__(self, answer: str | None) -> None:
        self.answer = answer
        self.release = threading.Event()
        self.started = threading.Event()

    def resolve(self, _request: str | None) -> str | None:
        self.started.set()
        assert self.release.wait(timeout=30)
        return self.answer


def _follow_in_thread(follower: NodeSharedResolver) -> tuple[threading.Event, list[object]]:
    done = threading.Event()
    outcome: list[object] = []

    def run() -> None:
        try:
            outcome.append(follower.resolve("latest"))
        except BaseException as exc:  # noqa: BLE001 - reported by the test
            outcome.append(exc)
        done.set()

    threading.Thread(target=run, daemon=True).start()
    return done, outcome


@pytest.mark.parametrize("how", ["new-file", "removed", "symlink", "fifo"])
def test_a_lock_file_replaced_under_the_leader_is_no_sign_it_stopped(tmp_path, how):
    (tmp_path / "checkpoint-3").mkdir()  # a follower checks the folder is there
    slow = Slow(str(tmp_path / "checkpoint-3"))
    leader = NodeSharedResolver(slow, tmp_path, "k", leader=True, timeout=30)
    lead = threading.Thread(target=leader.resolve, args=("latest",))
    lead.start()
    lock = tmp_path / ".verirl-node-k.lock"
    try:
        assert slow.started.wait(10)
        lock.unlink()
        if how == "new-file":
            lock.write_text("")
        elif how == "symlink":
            lock.symlink_to(tmp_path / "elsewhere")
        elif how == "fifo":
            os.mkfifo(lock)
        follower = NodeSharedResolver(slow, tmp_path, "k", leader=False, timeout=30)
        done, outcome = _follow_in_thread(follower)
        assert not done.wait(0.5), f"the follower gave up: {outcome}"
        slow.release.set()
        assert done.wait(20)
        assert outcome == [str(tmp_path / "checkpoint-3")]
    finally:
        slow.release.set()
        if how == "fifo":  # a reader blocked in open() on the FIFO is let go
            with contextlib.suppress(OSError):
                os.close(os.open(lock, os.O_WRONLY | os.O_NONBLOCK))
        lead.join(30)
    assert not (tmp_path / "elsewhere").exists()


@pytest.mark.parametrize("how", ["held", "symlink", "directory", "fifo"])
def test_a_leader_whose_lock_is_held_or_not_a_file_fails_with_a_source_error(tmp_path, how):
    lock = tmp_path / ".verirl-node-k.lock"
    leader = NodeSharedResolver(Slow(None), tmp_path, "k", leader=True, timeout=0.3)
    with contextlib.ExitStack() as stack:
        if how == "held":
            stack.enter_context(flock_with_deadline(lock, 1))
        elif how == "symlink":
            lock.symlink_to(tmp_path / "elsewhere")
        elif how == "directory":
            lock.mkdir()
        else:
            os.mkfifo(lock)
        with pytest.raises(CheckpointSourceError, match="lock"):
            leader.resolve("latest")
    assert not (tmp_path / "elsewhere").exists()


def test_the_leader_never_writes_its_record_through_a_symlink(tmp_path):
    target = tmp_path / "users-file"
    target.write_text("mine")
    pid = os.getpid()
    names = [f".verirl-node-k.{suffix}" for suffix in ("json", "claim")]
    for name in [*names, *(f"{name}.{pid}.tmp" for name in names)]:
        (tmp_path / name).symlink_to(target)
    (tmp_path / "checkpoint-3").mkdir()  # a follower checks the folder is there
    slow = Slow(str(tmp_path / "checkpoint-3"))
    slow.release.set()
    assert NodeSharedResolver(slow, tmp_path, "k", leader=True).resolve("latest") == slow.answer
    assert target.read_text() == "mine"
    follower = NodeSharedResolver(slow, tmp_path, "k", leader=False, timeout=5)
    assert follower.resolve("latest") == slow.answer


@pytest.mark.parametrize(
    "record",
    [
        b"[" * 100_000,
        b"\xff\xfe garbage",
        b"[1, 2]",
        b'{"path": 5}',
        b'{"path": {"x": 1}}',
        b'{"error": "not-found", "searched": 5, "request": [1]}',
        b'{"error": "config", "field": 5, "message": 7}',
        b'{"error": {"x": 1}}',
        b"{}",
        "symlink",
    ],
    ids=[
        "deep",
        "garbage",
        "list",
        "path-int",
        "path-object",
        "not-found-odd",
        "config-odd",
        "error-object",
        "empty",
        "symlink",
    ],
)
def test_a_hostile_node_record_ends_in_a_verirl_error(tmp_path, record):
    path = tmp_path / ".verirl-node-k.json"
    if record == "symlink":
        elsewhere = tmp_path / "elsewhere.json"
        elsewhere.write_text(json.dumps({"path": "/etc"}))
        path.symlink_to(elsewhere)
    else:
        path.write_bytes(record)
    follower = NodeSharedResolver(Slow(None), tmp_path, "k", leader=False, timeout=5)
    with pytest.raises(VeriRLError):
        follower.resolve("latest")


@pytest.mark.parametrize(
    "claim",
    [b"[]", b'{"pid": 1}', b'{"pid": 1, "lock": {"dev": "x", "ino": true}}', b"[" * 100_000],
    ids=["list", "no-lock", "lock-odd", "deep"],
)
def test_a_claim_that_is_not_verirls_is_an_error_at_once(tmp_path, claim):
    (tmp_path / ".verirl-node-k.claim").write_bytes(claim)
    (tmp_path / ".verirl-node-k.lock").write_text("")
    follower = NodeSharedResolver(Slow(None), tmp_path, "k", leader=False, timeout=60)
    done, outcome = _follow_in_thread(follower)
    assert done.wait(20), "the follower kept waiting on a claim it cannot use"
    (error,) = outcome
    assert isinstance(error, CheckpointSourceError)
    assert ".verirl-node-k.claim" in str(error)


def test_a_flock_error_is_never_taken_for_a_free_lock(tmp_path, monkeypatch):
    """An OS error testing the leader's lock is an error, not "the leader stopped"."""

    class Failing(ModuleType):
        def __getattr__(self, name: str) -> object:
            return getattr(fcntl, name)

        def flock(self, fd: int, operation: int) -> None:
            if operation & fcntl.LOCK_SH:
                raise OSError(errno.EIO, os.strerror(errno.EIO))
            fcntl.flock(fd, operation)

    import verirl.checkpoints.node_share

    slow = Slow(None)
    leader = NodeSharedResolver(slow, tmp_path, "k", leader=True, timeout=30)
    lead = threading.Thread(target=leader.resolve, args=("latest",))
    lead.start()
    try:
        assert slow.started.wait(10)
        monkeypatch.setattr(verirl.checkpoints.node_share, "fcntl", Failing("fcntl"))
        follower = NodeSharedResolver(slow, tmp_path, "k", leader=False, timeout=30)
        with pytest.raises(CheckpointSourceError, match="lock"):
            follower.resolve("latest")
    finally:
        slow.release.set()
        lead.join(30)


@pytest.mark.parametrize("request_", ["latest", "auto"])
def test_a_path_listed_both_as_a_file_and_a_folder_makes_the_checkpoint_unreadable(
    hub, tmp_path, request_
):
    """No download can make both: an older local checkpoint is not resumed over it."""
    hub.add_checkpoint(REPO, "checkpoint-20", 20)
    hub.add_file(REPO, "checkpoint-20/a", b"x")
    hub.add_file(REPO, "checkpoint-20/a/b", b"y")
    make_checkpoint(tmp_path / "out", "checkpoint-10")
    sources = [LocalCheckpointSource(tmp_path / "out"), hub_source(hub, tmp_path)]
    with pytest.raises(CheckpointSourceError, match="both as a file and as a folder") as err:
        CheckpointResolver(sources).resolve(request_)
    assert isinstance(err.value.__cause__, CheckpointSourceError)
    assert err.value.__cause__.checkpoint_unreadable
    assert not (tmp_path / "dl" / "checkpoint-20").exists()


# ---------------------------------------------------------------- unusable, but older


def test_an_unusable_hub_checkpoint_older_than_a_local_one_hides_nothing(hub, tmp_path):
    hub.add_checkpoint(REPO, "checkpoint-3", 3)
    hub.add_checkpoint(REPO, "checkpoint-5", 5)
    hub.add_file(REPO, "checkpoint-5/a/../../escaped.bin", b"x")
    make_checkpoint(tmp_path / "out", "checkpoint-10")
    sources = [LocalCheckpointSource(tmp_path / "out"), hub_source(hub, tmp_path)]
    for request in ("auto", "latest"):
        assert CheckpointResolver(sources).resolve(request) == str(
            tmp_path / "out" / "checkpoint-10"
        )
    make_checkpoint(tmp_path / "older", "checkpoint-4")
    sources = [LocalCheckpointSource(tmp_path / "older"), hub_source(hub, tmp_path)]
    with pytest.raises(CheckpointSourceError, match="cannot use checkpoint-5"):
        CheckpointResolver(sources).resolve("auto")  # 5 may be newer than local 4


def test_a_complete_last_checkpoint_newer_than_an_unusable_numbered_one_is_resumed(hub, tmp_path):
    hub.add_checkpoint(REPO, "checkpoint-20", 20)
    hub.add_checkpoint(REPO, "checkpoint-30", 30)
    hub.add_file(REPO, "checkpoint-30/a/../../escaped.bin", b"x")
    hub.add_checkpoint(REPO, "last-checkpoint", 40)
    path = CheckpointResolver([hub_source(hub, tmp_path)]).resolve("latest")
    assert path == str(tmp_path / "dl" / "last-checkpoint")


def test_a_file_named_as_verirl_s_marker_below_a_checkpoint_s_top_is_harmless(hub, tmp_path):
    hub.add_checkpoint(REPO, "checkpoint-5", 5)
    hub.add_file(REPO, "checkpoint-5/sub/.verirl-download.json", b"{}")
    path = CheckpointResolver([hub_source(hub, tmp_path)]).resolve("auto")
    assert path == str(tmp_path / "dl" / "checkpoint-5")
    assert (
        tmp_path / "dl" / "checkpoint-5" / "sub" / ".verirl-download.json"
    ).read_bytes() == b"{}"


@pytest.mark.parametrize(("dangling", "outcome"), [("checkpoint-3", "checkpoint-10"),
                                                    ("checkpoint-12", None)])  # fmt: skip
def test_a_local_checkpoint_link_to_nothing_matters_only_if_newer(tmp_path, dangling, outcome):
    out = tmp_path / "out"
    make_checkpoint(out, "checkpoint-10")
    (out / dangling).symlink_to(tmp_path / "unmounted" / dangling)
    resolver = CheckpointResolver([LocalCheckpointSource(out)])
    if outcome is None:
        with pytest.raises(CheckpointSourceError, match="a symlink to nothing"):
            resolver.resolve("auto")
    else:
        assert resolver.resolve("auto") == str(out / outcome)


def test_an_unreadable_local_checkpoint_older_than_one_on_the_hub_hides_nothing(hub, tmp_path):
    hub.add_checkpoint(REPO, "checkpoint-20", 20)
    out = tmp_path / "out"
    make_checkpoint(out, "checkpoint-12")
    (out / "checkpoint-12" / "trainer_state.json").unlink()
    (out / "checkpoint-12" / "trainer_state.json").mkdir()  # read fails: EISDIR
    sources = [LocalCheckpointSource(out), hub_source(hub, tmp_path)]
    assert CheckpointResolver(sources).resolve("auto") == str(tmp_path / "dl" / "checkpoint-20")


def test_an_unusable_checkpoint_whose_rival_last_checkpoint_cannot_be_read_is_an_error(
    hub, tmp_path
):
    """last-checkpoint's step, to weigh the unusable one against, failed: it may be newest."""
    hub.add_checkpoint(REPO, "checkpoint-60", 60)
    hub.add_file(REPO, "checkpoint-60/a/../../x", b"x")
    hub.add_checkpoint(REPO, "last-checkpoint", 60)
    hub.fail_downloads(REPO, "last-checkpoint/trainer_state.json", 403)
    make_checkpoint(tmp_path / "out", "checkpoint-10")
    for request in ("auto", "latest"):
        sources = [LocalCheckpointSource(tmp_path / "out"), hub_source(hub, tmp_path)]
        with pytest.raises(CheckpointSourceError, match="cannot use checkpoint-60"):
            CheckpointResolver(sources).resolve(request)


def test_a_folder_named_as_verirl_s_marker_at_a_checkpoint_s_top_is_unusable(hub, tmp_path):
    hub.add_checkpoint(REPO, "checkpoint-60", 60)
    hub.add_file(REPO, "checkpoint-60/.verirl-download.json/x", b"{}")
    make_checkpoint(tmp_path / "out", "checkpoint-50")
    sources = [LocalCheckpointSource(tmp_path / "out"), hub_source(hub, tmp_path)]
    with pytest.raises(CheckpointSourceError, match="cannot use checkpoint-60"):
        CheckpointResolver(sources).resolve("auto")


def test_an_unusable_folder_of_the_same_step_as_a_complete_one_hides_nothing(hub, tmp_path):
    hub.add_checkpoint(REPO, "checkpoint-60", 60)
    hub.add_checkpoint(REPO, "checkpoint-060", 60)
    hub.add_file(REPO, "checkpoint-060/a/../../x", b"x")
    path = CheckpointResolver([hub_source(hub, tmp_path)]).resolve("auto")
    assert path == str(tmp_path / "dl" / "checkpoint-60")
    out = tmp_path / "out"
    make_checkpoint(out, "checkpoint-60")
    (out / "checkpoint-060").symlink_to(tmp_path / "unmounted")
    assert CheckpointResolver([LocalCheckpointSource(out)]).resolve("auto") == str(
        out / "checkpoint-60"
    )


@pytest.mark.parametrize("status", [401, 403, 404, 410])
@pytest.mark.parametrize(
    "failing", ["checkpoint-60/model.safetensors", "last-checkpoint/trainer_state.json"]
)
def test_a_newest_hub_checkpoint_refused_for_good_is_an_error_not_an_older_resume(
    hub, tmp_path, status, failing
):
    folder = failing.split("/", 1)[0]
    hub.add_checkpoint(REPO, folder, 60)
    hub.fail_downloads(REPO, failing, status)
    make_checkpoint(tmp_path / "out", "checkpoint-50")
    sources = [LocalCheckpointSource(tmp_path / "out"), hub_source(hub, tmp_path)]
    with pytest.raises(CheckpointSourceError, match=f"HTTP {status}|{status}") as err:
        CheckpointResolver(sources).resolve("auto")
    assert "checkpoint-50" not in str(err.value)


def test_a_newest_hub_checkpoint_the_hub_fails_to_serve_gives_way_to_the_next_newest(hub, tmp_path):
    """A 5xx is the Hub away (warned), not a checkpoint refused for good."""
    hub.add_checkpoint(REPO, "checkpoint-60", 60)
    hub.fail_downloads(REPO, "checkpoint-60/model.safetensors", 503)
    make_checkpoint(tmp_path / "out", "checkpoint-50")
    sources = [LocalCheckpointSource(tmp_path / "out"), hub_source(hub, tmp_path)]
    assert CheckpointResolver(sources).resolve("auto") == str(tmp_path / "out" / "checkpoint-50")


def test_a_refused_checkpoint_gives_way_to_a_readable_one_of_the_same_step(hub, tmp_path):
    hub.add_checkpoint(REPO, "checkpoint-30", 30)
    hub.fail_downloads(REPO, "checkpoint-30/trainer_state.json", 403)
    make_checkpoint(tmp_path / "out", "checkpoint-30")
    sources = [hub_source(hub, tmp_path), LocalCheckpointSource(tmp_path / "out")]  # Hub first
    assert CheckpointResolver(sources).resolve("latest") == str(tmp_path / "out" / "checkpoint-30")


@pytest.mark.parametrize(("where", "refused"), [("hub", True), ("storage", False), (None, True)])
def test_a_refusal_counts_as_the_hub_s_only_when_the_hub_answered_it(hub, tmp_path, where, refused):
    """A 403 from the storage the Hub redirects a body to is an expired signature, as a rule."""
    source = hub_source(hub, tmp_path)
    url = {"hub": f"{hub.endpoint}/org/run/resolve/abc/x", "storage": "https://cas-bridge.example/x",
           None: None}[where]  # fmt: skip

    class Refused(Exception):
        response = attrs.make_class(
            "Response", {"status_code": attrs.field(), "url": attrs.field()}
        )(403, url)

    error = source._error("download from", Refused("403"), listed=True)
    assert error.checkpoint_unreadable is refused


# ---------------------------------------------------------------- the download's lock file


def test_a_ctrl_c_at_any_point_of_taking_the_lock_leaves_it_free(tmp_path):
    """A Ctrl-C as the lock's taking returned (before the ``try`` that closes it) left the
    descriptor locked and unreachable: the node's lock, or a download's, held for the life of
    the process, other ranks waiting their whole deadline (review round 30, H-F8). At every
    point of taking, holding and letting go of it: the lock is free after."""
    from _support import codes_of, interrupted_at_point
    from verirl._fs import _acquire, _lock_if_free, same_file

    lock = tmp_path / ".verirl-x.lock"
    codes = codes_of(flock_with_deadline, _acquire, _lock_if_free, same_file)

    def take_and_let_go() -> None:
        with flock_with_deadline(lock, 5):
            pass

    points = interrupted_at_point(codes, None, take_and_let_go)
    assert points > 8
    for point in range(1, points + 1):
        interrupted_at_point(codes, point, take_and_let_go)
        fd = os.open(lock, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # BlockingIOError: still held
        except BlockingIOError:
            pytest.fail(f"the lock is still held after a Ctrl-C at point {point} of {points}")
        finally:
            os.close(fd)


@pytest.mark.parametrize("how", ["held", "symlink", "directory", "fifo", "socket"])
@pytest.mark.parametrize("request_", ["auto", "latest"])
def test_a_newest_checkpoint_whose_download_lock_is_unusable_is_never_replaced_by_an_older(
    hub, tmp_path, how, request_
):
    """A planted or held lock keeps verirl from the newest: no older checkpoint stands in."""
    hub.add_checkpoint(REPO, "checkpoint-20", 20)
    make_checkpoint(tmp_path / "out", "checkpoint-10")
    (tmp_path / "dl").mkdir()
    lock = tmp_path / "dl" / ".verirl-checkpoint-20.lock"
    victim = tmp_path / "victim"
    victim.write_text("mine\n")
    with contextlib.ExitStack() as stack:
        if how == "held":
            stack.enter_context(flock_with_deadline(lock, 0))
        elif how == "symlink":
            lock.symlink_to(victim)
        elif how == "directory":
            lock.mkdir()
        elif how == "socket":  # opening it is ENXIO
            listener = stack.enter_context(socket.socket(socket.AF_UNIX))
            listener.bind(str(lock))
        else:
            os.mkfifo(lock)
        source = HubCheckpointSource(
            REPO, download_dir=tmp_path / "dl", endpoint=hub.endpoint, lock_timeout=0.2
        )
        resolver = CheckpointResolver([LocalCheckpointSource(tmp_path / "out"), source])
        expected = CheckpointSourceError if how == "held" else ConfigError
        with pytest.raises(expected) as caught:
            resolver.resolve(request_)
    message = str(caught.value)
    assert ".verirl-checkpoint-20.lock" in message
    if how != "held":
        assert caught.value.field == "download_dir"
    assert victim.read_text() == "mine\n"
    assert not (tmp_path / "dl" / "checkpoint-20").exists()


_WRITE_LIMITED = """
import resource, signal, sys
from verirl import (
    CheckpointResolver, CheckpointSourceError, HubCheckpointSource, LocalCheckpointSource,
)

out, dl, endpoint, repo = sys.argv[1:5]
source = HubCheckpointSource(repo, download_dir=dl, endpoint=endpoint)
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit is EFBIG, not a kill
before = resource.getrlimit(resource.RLIMIT_FSIZE)
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, before[1]))
try:
    print("resumed", CheckpointResolver([LocalCheckpointSource(out), source]).resolve("auto"))
except CheckpointSourceError as exc:
    print("refused", exc.checkpoint_unreadable, exc.step, exc)
finally:  # coverage writes its data at exit
    resource.setrlimit(resource.RLIMIT_FSIZE, before)
"""


_FIREWALLED = """
import errno, os, socket, sys
from verirl import CheckpointResolver, HubCheckpointSource, LocalCheckpointSource
import verirl.checkpoints.hub as module

out, dl, endpoint, repo = sys.argv[1:5]
real_connect, blocked = socket.socket.connect, []

def connect(self, address):  # a firewall's REJECT: connect() fails with EPERM
    if blocked:
        raise PermissionError(errno.EPERM, os.strerror(errno.EPERM))
    return real_connect(self, address)

socket.socket.connect = connect
download_all = module.HubCheckpointSource._download_all

def after_the_listing(self, *args):
    blocked.append(True)
    import huggingface_hub
    huggingface_hub.close_session()  # no connection kept from the listing
    return download_all(self, *args)

module.HubCheckpointSource._download_all = after_the_listing
source = HubCheckpointSource(repo, download_dir=dl, endpoint=endpoint, timeout=5)
print("resumed", CheckpointResolver([LocalCheckpointSource(out), source]).resolve("auto"))
"""


def test_a_firewall_refusing_the_download_is_the_hub_away_not_the_download_folder(hub, tmp_path):
    """EPERM from connect() (an egress rule) under httpx's ConnectError: the next newest."""
    hub.add_checkpoint(REPO, "checkpoint-20", 20)
    make_checkpoint(tmp_path / "out", "checkpoint-10")
    args = [str(tmp_path / "out"), str(tmp_path / "dl"), hub.endpoint, REPO]
    done = subprocess.run(
        [sys.executable, "-c", _FIREWALLED, *args],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip() == f"resumed {tmp_path / 'out' / 'checkpoint-10'}"
    assert "trying the next newest, step 10" in done.stderr


@pytest.mark.parametrize("how", ["cannot-create", "cannot-write"])
def test_a_download_folder_that_cannot_take_the_newest_never_lets_an_older_stand_in(
    hub, tmp_path, how
):
    """What this machine's download folder answers (ENOTDIR, EFBIG) ends the resume, exit 5.

    The newest checkpoint is on the Hub; the same folder would refuse any
    other download too, so resuming the older local one would only overwrite
    the newer one's progress later.
    """
    hub.add_checkpoint(REPO, "checkpoint-20", 20, size=64 * 1024)
    make_checkpoint(tmp_path / "out", "checkpoint-10")
    if how == "cannot-create":
        (tmp_path / "a-file").write_text("mine\n")
        source = HubCheckpointSource(
            REPO, download_dir=tmp_path / "a-file" / "dl", endpoint=hub.endpoint
        )
        with pytest.raises(CheckpointSourceError) as caught:
            CheckpointResolver([LocalCheckpointSource(tmp_path / "out"), source]).resolve("auto")
        assert caught.value.checkpoint_unreadable
        assert caught.value.step == 20
        assert "cannot create download_dir" in str(caught.value)
        assert (tmp_path / "a-file").read_text() == "mine\n"
        return
    args = [str(tmp_path / "out"), str(tmp_path / "dl"), hub.endpoint, REPO]
    done = subprocess.run(
        [sys.executable, "-c", _WRITE_LIMITED, *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("refused True"), done.stdout + done.stderr
    assert "File too large" in done.stdout
    assert not (tmp_path / "dl" / "checkpoint-20").exists()


def test_a_download_folder_made_meanwhile_is_never_a_thing_in_the_way(tmp_path):
    """Threads resolving into one download folder at once: the check looked at the folder twice
    (is_dir, then its own kind), and one another thread made in between was "exists and is not
    a directory" (a fresh-clone CI on 1de38c0, test_threads_resolving_latest_into_one_...).
    Made at any point of the check (call, return: where a switch can come), it is no error."""
    import sys

    from verirl.checkpoints.download_dir import FolderName

    code = FolderName.check.__code__
    for point in range(1, 20):
        root = tmp_path / f"round-{point}" / "download"
        root.parent.mkdir()
        seen = [0]

        def profile(frame, event, _arg, root=root, point=point, seen=seen):
            ours = (
                frame.f_code is code
                if event in ("call", "c_return")
                else (
                    event == "return" and frame.f_back is not None and frame.f_back.f_code is code
                )
            )
            if ours:
                seen[0] += 1
                if seen[0] == point:
                    root.mkdir()  # another thread's download made it, just now

        previous = sys.getprofile()
        sys.setprofile(profile)
        try:
            FolderName().check(root)
        finally:
            sys.setprofile(previous)
        if seen[0] < point:
            break


# ---------------------------------------------------------------- deep nesting

DEPTHS = pytest.mark.parametrize("depth", [1500, 5000])
"""Past the recursion limit (os.walk on 3.10/3.11 and shutil.rmtree on 3.10-3.12 recurse), and
past what a path can reach (PATH_MAX): a nesting a user, or anything, made by changing into
each folder."""
STAGING, OLD = ".verirl-tmp-checkpoint-20-", ".verirl-old-checkpoint-20-"


@contextlib.contextmanager
def _inside(folder: Path) -> Iterator[None]:
    """The process's working directory is ``folder`` for the block (no other code runs then)."""
    before = Path.cwd()
    os.chdir(folder)
    try:
        yield
    finally:
        os.chdir(before)


def nest(folder: Path, depth: int) -> None:
    """``folder/d/d/.../d/f``, ``depth`` folders deep (``folder`` is made if missing)."""
    folder.mkdir(parents=True, exist_ok=True)
    with _inside(folder):
        for _ in range(depth):
            Path("d").mkdir()
            os.chdir("d")
        Path("f").write_text("the user's")


def nesting(folder: Path) -> int | None:
    """How deep `nest` made ``folder``'s ``f`` (never a path longer than a name); None if gone."""
    if not (folder / "d").is_dir():
        return None
    depth = 0
    with _inside(folder):
        while Path("d").is_dir() and not Path("d").is_symlink():
            os.chdir("d")
            depth += 1
        return depth if Path("f").read_text() == "the user's" else None


def remove_deep(top: Path) -> None:
    """Delete ``top`` at any depth: by changing into each folder, from a stack (no recursion,
    no path longer than a name): pytest's own clean-up (shutil.rmtree) recurses."""
    if not top.is_dir() or top.is_symlink():
        return
    with _inside(top):
        below: list[str] = []  # the folders entered, top's child first
        while True:
            names = list(Path().iterdir())  # relative: ``d``, not a path
            sub = next((n for n in names if n.is_dir() and not n.is_symlink()), None)
            if sub is not None:
                os.chdir(sub)
                below.append(sub.name)
                continue
            for name in names:
                name.unlink()
            if not below:
                break
            os.chdir("..")
            Path(below.pop()).rmdir()
    top.rmdir()


@pytest.fixture
def deep_dl(tmp_path):
    """``tmp_path / "dl"``, deleted at any depth at the end."""
    yield tmp_path / "dl"
    remove_deep(tmp_path / "dl")


def test_the_test_s_own_helpers_handle_any_depth(tmp_path):
    nest(tmp_path / "x", 5000)
    assert nesting(tmp_path / "x") == 5000
    remove_deep(tmp_path / "x")
    assert not (tmp_path / "x").exists()


@DEPTHS
def test_a_deep_nesting_in_a_download_that_is_reused_is_a_warning_or_a_source_error(
    hub, tmp_path, deep_dl, caplog, depth
):
    """Listed as a stray (a warning), or, deeper than a path reaches, unreadable: the folder
    named, never a RecursionError or a path thousands of characters long."""
    hub.add_checkpoint(REPO, "checkpoint-20", 20)
    folder = Path(CheckpointResolver([hub_source(hub, tmp_path)]).resolve("latest"))
    nest(folder, depth)
    if depth < 2000:
        assert CheckpointResolver([hub_source(hub, tmp_path)]).resolve("auto") == str(folder)
        assert "holds files the Hub's checkpoint-20 does not" in warnings_of(caplog)
    else:
        with pytest.raises(CheckpointSourceError, match=r"nested .* deep") as err:
            CheckpointResolver([hub_source(hub, tmp_path)]).resolve("auto")
        assert f"cannot read {folder} (" in str(err.value)
        assert "d/d/d" not in str(err.value)
    assert nesting(folder) == depth


@DEPTHS
def test_a_deep_nesting_in_an_outdated_download_is_never_replaced(hub, tmp_path, deep_dl, depth):
    hub.add_checkpoint(REPO, "checkpoint-20", 20)
    folder = Path(CheckpointResolver([hub_source(hub, tmp_path)]).resolve("latest"))
    nest(folder, depth)
    hub.add_file(REPO, "checkpoint-20/model.safetensors", b"a newer commit")
    expected: type[VeriRLError] = ConfigError if depth < 2000 else CheckpointSourceError
    with pytest.raises(expected, match=r"verirl did not download|nested .* deep"):
        CheckpointResolver([hub_source(hub, tmp_path)]).resolve("latest")
    assert nesting(folder) == depth


@pytest.mark.parametrize("prefix", [STAGING, OLD], ids=["staging", "old"])
@DEPTHS
def test_a_deep_leftover_of_an_interrupted_download_goes_or_stays_with_a_warning(
    hub, deep_dl, caplog, prefix, depth
):
    """In huggingface_hub's bookkeeping, where a leftover may hold anything: one a path can
    reach is deleted (iteratively), a deeper one is left alone with a warning."""
    hub.add_checkpoint(REPO, "checkpoint-20", 20)
    deep_dl.mkdir()
    kind = "staging" if prefix == STAGING else "old"
    leftover = verirl._fs.make_owned_dir(
        deep_dl, prefix, {"kind": kind, "folder": "checkpoint-20", "files": []}
    )
    nest(leftover / ".cache" / "huggingface" / "download", depth)
    path = CheckpointResolver([hub_source(hub, deep_dl.parent)]).resolve("auto")
    assert path == str(deep_dl / "checkpoint-20")
    if depth < 2000:
        assert not leftover.exists()
    else:
        assert nesting(leftover / ".cache" / "huggingface" / "download") == depth
        assert f"leaving {leftover} alone" in warnings_of(caplog)
        assert "nested" in warnings_of(caplog)


def _listed(name: str, data: bytes) -> FileEntry:
    return FileEntry(len(data), hashlib.sha256(data).hexdigest())


def _remote(files: dict[str, bytes]) -> RemoteFolder:
    listed = {f"checkpoint-20/{name}": _listed(name, data) for name, data in files.items()}
    return RemoteFolder("test", REPO, "a" * 40, "checkpoint-20", 20, listed)


def _writer(files: dict[str, bytes], depth: int = 0):
    """A ``download`` that writes ``files``; with ``depth``, bookkeeping nested that deep too."""

    def download(_paths, _commit, local_dir: Path) -> None:
        for name, data in files.items():
            path = local_dir / "checkpoint-20"
            for part in name.split("/"):  # one folder at a time (os.makedirs recurses)
                path.mkdir(exist_ok=True)
                path /= part
            path.write_bytes(data)
        if depth:
            nest(local_dir / ".cache" / "huggingface" / "download", depth)

    return download


@DEPTHS
def test_a_deep_staging_folder_is_deleted_without_a_recursion_error(tmp_path, deep_dl, depth):
    """What the download wrote into its staging folder, nested however deep."""
    files = {"trainer_state.json": b'{"global_step": 20}', "model.safetensors": b"weights"}
    folder = fetch_folder(deep_dl, _remote(files), lock_timeout=10, download=_writer(files, depth))
    assert folder == deep_dl / "checkpoint-20"
    assert (folder / "model.safetensors").read_bytes() == b"weights"
    if depth < 2000:
        assert sorted(p.name for p in deep_dl.iterdir()) == [
            ".verirl-checkpoint-20.lock",
            "checkpoint-20",
        ]


def test_an_outdated_download_with_deeply_nested_listed_files_is_replaced(tmp_path, deep_dl):
    """Its files are all the listing's (nothing of the user's): listed, moved aside, deleted."""
    deep = "/".join(["d"] * 1500) + "/f"
    files = {"trainer_state.json": b'{"global_step": 20}', deep: b"old"}
    fetch_folder(deep_dl, _remote(files), lock_timeout=10, download=_writer(files))
    newer = {**files, deep: b"newer"}
    folder = fetch_folder(deep_dl, _remote(newer), lock_timeout=10, download=_writer(newer))
    assert (folder / deep).read_bytes() == b"newer"
    assert sorted(p.name for p in deep_dl.iterdir()) == [
        ".verirl-checkpoint-20.lock",
        "checkpoint-20",
    ]


@DEPTHS
def test_resume_with_a_deep_nesting_in_its_download_folder_exits_cleanly(
    hub, tmp_path, capsys, depth
):
    """The reviewer's case: ``verirl --json resume`` printed "unexpected RecursionError"."""
    hub.add_checkpoint(REPO, "checkpoint-20", 20)
    out = tmp_path / "out"
    argv = ["--json", "resume", "--output-dir", str(out), "--hub-repo", REPO,
            "--hub-endpoint", hub.endpoint, "--resume", "auto"]  # fmt: skip
    try:
        assert main(argv) == 0
        folder = out / "_verirl-hub-download" / "checkpoint-20"
        nest(folder, depth)
        capsys.readouterr()
        code = main(argv)
        printed = capsys.readouterr().out
        assert "RecursionError" not in printed
        if depth < 2000:
            assert code == 0
            assert str(folder) in printed
        else:
            assert code == 5
            assert json.loads(printed)["error"]["code"] == 5
        assert nesting(folder) == depth
    finally:
        remove_deep(out)

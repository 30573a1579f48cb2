"""Resume from the newest complete checkpoint, locally or on the Hub, downloading only that one.

Local sources run on real directories; Hub sources run the real huggingface_hub
client against `fakes.hub.FakeHub`, a loopback server, never the network.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import attrs
import pytest
from huggingface_hub import constants, snapshot_download
from huggingface_hub.errors import HfHubHTTPError, OfflineModeIsEnabled, RepositoryNotFoundError
from hypothesis import given
from hypothesis import strategies as st

from _support import place_hub_token
from fakes.checkpoints import FakeCheckpointSource
from fakes.hub import FakeHub, serve_fake_hub
from verirl.checkpoints import (
    INCOMPLETE_MARKER,
    RESUME_ENV_VAR,
    Checkpoint,
    CheckpointResolver,
    CheckpointSource,
    HubCheckpointSource,
    LocalCheckpointSource,
    read_trainer_state,
)
from verirl.errors import CheckpointNotFoundError, CheckpointSourceError, ConfigError

REPO = "org/run"
SIZE = 100_000  # model.safetensors; optimizer.pt is twice that


# ---------------------------------------------------------------- helpers


def make_checkpoint(root: Path, name: str, state: object = "default", raw: bytes | None = None):
    """A Trainer-like folder; ``state=None`` leaves trainer_state.json out (interrupted save)."""
    folder = root / name
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(b"weights")
    (folder / "optimizer.pt").write_bytes(b"moments")
    if raw is not None:
        (folder / "trainer_state.json").write_bytes(raw)
    elif state == "default":
        step = int(name.rsplit("-", 1)[1]) if name[-1].isdigit() else 0
        (folder / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    elif state is not None:
        (folder / "trainer_state.json").write_text(json.dumps(state))
    return folder


def snapshot(folder: Path) -> dict[str, tuple[bytes, int]]:
    """Every file under ``folder`` with its bytes and mtime, to prove nothing was touched."""
    return {
        p.relative_to(folder).as_posix(): (p.read_bytes(), p.stat().st_mtime_ns)
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


def _threads() -> set[threading.Thread]:
    # tqdm's monitor is a process-wide helper tqdm keeps for huggingface_hub's progress bars.
    return {t for t in threading.enumerate() if t.name != "tqdm_monitor"}


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture
def hub(tmp_path, monkeypatch):
    """A FakeHub, with huggingface_hub kept off the network, the user's token and caches."""
    for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", RESUME_ENV_VAR):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    global_cache = tmp_path / "global-hf-cache"
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(global_cache))
    system_tmp = tmp_path / "system-tmp"
    system_tmp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(system_tmp))
    before = _threads()
    with serve_fake_hub() as fake:
        yield fake
    assert _threads() - before == set(), "threads left behind"
    assert list(system_tmp.iterdir()) == [], "temporary directories left behind"
    assert not global_cache.exists(), "wrote into the global huggingface_hub cache"


def hub_source(hub: FakeHub, tmp_path: Path, **kwargs) -> HubCheckpointSource:
    kwargs.setdefault("download_dir", tmp_path / "hub-download")
    kwargs.setdefault("endpoint", hub.endpoint)
    return HubCheckpointSource(REPO, **kwargs)


def files_under(hub: FakeHub, folder: str) -> set[str]:
    return {p for p in hub.files(REPO) if p.startswith(f"{folder}/")}


def warnings_of(caplog) -> str:
    return "\n".join(r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)


# ---------------------------------------------------------------- Checkpoint


def test_checkpoint_is_a_frozen_value():
    cp = Checkpoint(30, "/x/out/checkpoint-30", "local:/x/out")
    assert cp == Checkpoint(step=30, path="/x/out/checkpoint-30", source="local:/x/out")
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        cp.step = 31  # type: ignore[misc]


@pytest.mark.parametrize(
    ("args", "field"),
    [
        ((-1, "p", "s"), "step"),
        ((True, "p", "s"), "step"),
        ((1, "", "s"), "path"),
        ((1, "p", ""), "source"),
    ],
)
def test_checkpoint_validates(args, field):
    with pytest.raises(ConfigError, match=rf"^{field}="):
        Checkpoint(*args)


# ---------------------------------------------------------------- local source


def test_local_latest_is_the_highest_complete_step(tmp_path):
    for step in (5, 10, 200, 30):
        make_checkpoint(tmp_path, f"checkpoint-{step}")
    source = LocalCheckpointSource(tmp_path)
    assert source.latest() == Checkpoint(200, str(tmp_path / "checkpoint-200"), f"local:{tmp_path}")
    assert isinstance(source, CheckpointSource)


def test_local_names_are_strict(tmp_path):
    make_checkpoint(tmp_path, "checkpoint-5")
    for name in (
        "tmp-checkpoint-50",  # Trainer's staging folder
        "checkpoint-60.bak",
        "Checkpoint-70",
        "checkpoint-",
        "checkpoint--80",
        "checkpoint-x",
        "checkpoint-\u0669\u0669",  # Arabic-Indic digits match \d, not a Trainer name
        "run/checkpoint-90",
    ):
        make_checkpoint(tmp_path, name, state={"global_step": 99})
    (tmp_path / "checkpoint-100").write_text("a file, not a folder")
    assert LocalCheckpointSource(tmp_path).latest().step == 5


def test_local_follows_symlinked_checkpoints(tmp_path):
    real = make_checkpoint(tmp_path / "elsewhere", "checkpoint-7")
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "checkpoint-7").symlink_to(real, target_is_directory=True)
    assert LocalCheckpointSource(tmp_path / "out").latest().step == 7


@pytest.mark.parametrize(
    ("broken", "reason"),
    [
        ({"state": None}, "no trainer_state.json"),
        ({"raw": b'{"global_step": 3'}, "not valid JSON"),
        ({"raw": b""}, "not valid JSON"),
        ({"state": [1, 2]}, "not a JSON object"),
        ({"raw": b"\xff\xfe\x00"}, "not valid JSON (not UTF-8"),
    ],
)
def test_partial_newest_checkpoint_falls_back_and_is_left_alone(tmp_path, caplog, broken, reason):
    make_checkpoint(tmp_path, "checkpoint-10")
    partial = make_checkpoint(tmp_path, "checkpoint-20", **broken)
    before = snapshot(partial)
    assert LocalCheckpointSource(tmp_path).latest().step == 10
    assert snapshot(partial) == before
    warned = warnings_of(caplog)
    assert "checkpoint-20" in warned
    assert reason in warned


def test_only_incomplete_checkpoints_is_none(tmp_path, caplog):
    make_checkpoint(tmp_path, "checkpoint-10", state=None)
    assert LocalCheckpointSource(tmp_path).latest() is None
    assert (tmp_path / "checkpoint-10" / "model.safetensors").exists()
    assert "checkpoint-10" in warnings_of(caplog)


@pytest.mark.parametrize("marker_kind", ["file", "empty file", "directory", "dangling link"])
def test_a_folder_with_the_jit_sentinel_is_incomplete_and_left_alone(tmp_path, caplog, marker_kind):
    """transformers' JIT save writes trainer_state.json, then removes the sentinel: killed
    between the two, the state parses but the folder must not be resumed from."""
    make_checkpoint(tmp_path, "checkpoint-10")
    newest = make_checkpoint(tmp_path, "checkpoint-20")
    marker = newest / INCOMPLETE_MARKER
    if marker_kind == "file":
        marker.write_text("Checkpoint started at step 20 and in progress...")
    elif marker_kind == "empty file":
        marker.write_bytes(b"")
    elif marker_kind == "directory":
        marker.mkdir()
    else:
        marker.symlink_to(tmp_path / "nowhere")
    before = snapshot(newest)
    assert read_trainer_state(newest)[0] is None
    assert LocalCheckpointSource(tmp_path).latest().step == 10
    assert snapshot(newest) == before
    warned = warnings_of(caplog)
    assert "checkpoint-20" in warned
    assert f"{INCOMPLETE_MARKER} is present" in warned
    assert CheckpointResolver([LocalCheckpointSource(tmp_path)]).resolve("auto") == str(
        tmp_path / "checkpoint-10"
    )


def test_missing_root_has_no_checkpoints(tmp_path):
    assert LocalCheckpointSource(tmp_path / "not-yet").latest() is None


def test_root_that_is_a_file(tmp_path):
    (tmp_path / "out").write_text("x")
    with pytest.raises(ConfigError, match=r"^root=.*not a directory"):
        LocalCheckpointSource(tmp_path / "out")
    source = LocalCheckpointSource(tmp_path / "later")
    (tmp_path / "later").write_text("x")
    with pytest.raises(CheckpointSourceError, match="cannot list") as info:
        source.latest()
    assert isinstance(info.value.__cause__, NotADirectoryError)


def test_local_fetch_returns_the_directory_without_copying(tmp_path):
    make_checkpoint(tmp_path, "checkpoint-3")
    source = LocalCheckpointSource(tmp_path)
    cp = source.latest()
    assert source.fetch(cp) == tmp_path / "checkpoint-3"
    with pytest.raises(ConfigError, match=r"^checkpoint=.*comes from"):
        source.fetch(Checkpoint(3, str(tmp_path / "checkpoint-3"), "local:/elsewhere"))
    (tmp_path / "checkpoint-3" / "trainer_state.json").unlink()
    (tmp_path / "checkpoint-3" / "model.safetensors").unlink()
    (tmp_path / "checkpoint-3" / "optimizer.pt").unlink()
    (tmp_path / "checkpoint-3").rmdir()
    with pytest.raises(CheckpointSourceError, match="no longer a directory") as info:
        source.fetch(cp)
    assert isinstance(info.value.__cause__, FileNotFoundError)


def test_read_trainer_state(tmp_path):
    make_checkpoint(tmp_path, "checkpoint-4")
    assert read_trainer_state(tmp_path / "checkpoint-4") == ({"global_step": 4}, "")
    state, why = read_trainer_state(tmp_path)
    assert state is None
    assert "no trainer_state.json" in why


# ---------------------------------------------------------------- resolver, with fakes


@pytest.mark.parametrize("request_", [None, "", "   ", "\n"])
def test_no_request_is_a_fresh_start(request_):
    source = FakeCheckpointSource(steps=[10])
    assert CheckpointResolver([source]).resolve(request_) is None
    assert source.latest_calls == 0


@pytest.mark.parametrize("request_", ["latest", "last-checkpoint", " latest\n"])
def test_latest_is_the_newest_over_all_sources(request_):
    a = FakeCheckpointSource(steps=[10, 20], description="a", root="/a")
    b = FakeCheckpointSource(steps=[30], description="b", root="/b")
    c = FakeCheckpointSource(steps=[], description="c", root="/c")
    assert CheckpointResolver([a, b, c]).resolve(request_) == "/b/checkpoint-30"
    assert (a.fetched, b.fetched, c.fetched) == ([], [b.checkpoint(30)], [])


def test_ties_go_to_the_earlier_source():
    first = FakeCheckpointSource(steps=[30], description="first", root="/first")
    second = FakeCheckpointSource(steps=[30], description="second", root="/second")
    assert CheckpointResolver([first, second]).resolve("latest") == "/first/checkpoint-30"
    assert second.fetched == []
    assert CheckpointResolver([second, first]).resolve("latest") == "/second/checkpoint-30"


def test_nothing_found_names_every_place_searched():
    sources = [
        FakeCheckpointSource(description="local:/x/out"),
        FakeCheckpointSource(description="hub:o/r@main"),
    ]
    with pytest.raises(CheckpointNotFoundError) as info:
        CheckpointResolver(sources).resolve("latest")
    assert isinstance(info.value, FileNotFoundError)
    assert info.value.searched == ("local:/x/out", "hub:o/r@main")
    assert "local:/x/out" in str(info.value)
    assert "hub:o/r@main" in str(info.value)


def test_no_sources_is_allowed_for_explicit_paths(tmp_path):
    resolver = CheckpointResolver([])
    with pytest.raises(CheckpointNotFoundError, match="no sources configured"):
        resolver.resolve("latest")
    assert resolver.resolve(str(make_checkpoint(tmp_path, "checkpoint-1"))) == str(
        tmp_path / "checkpoint-1"
    )


@pytest.mark.parametrize(
    "error",
    [
        CheckpointSourceError("hub down"),
        PermissionError(13, "denied"),
        CheckpointNotFoundError("x", []),
    ],
)
def test_failing_source_is_a_warning_when_another_has_one(caplog, error):
    broken = FakeCheckpointSource(description="broken", error=error)
    ok = FakeCheckpointSource(steps=[5], description="ok")
    assert CheckpointResolver([broken, ok]).resolve("latest") == "/fake/checkpoint-5"
    assert "broken" in warnings_of(caplog)


def test_failing_source_is_an_error_when_none_has_one():
    cause = ConnectionRefusedError(111, "refused")
    wrapped = CheckpointSourceError("cannot list hub:o/r@main: refused")
    wrapped.__cause__ = cause
    sources = [
        FakeCheckpointSource(description="local"),
        FakeCheckpointSource(description="hub", error=wrapped),
    ]
    with pytest.raises(CheckpointSourceError) as info:
        CheckpointResolver(sources).resolve("latest")
    assert info.value.__cause__ is cause
    assert "cannot list hub:o/r@main" in str(info.value)
    assert "searched: local, hub" in str(info.value)


def test_unexpected_errors_are_not_swallowed():
    broken = FakeCheckpointSource(error=RuntimeError("bug"))
    with pytest.raises(RuntimeError, match="bug"):
        CheckpointResolver([broken, FakeCheckpointSource(steps=[1])]).resolve("latest")


def test_fetch_errors_propagate():
    source = FakeCheckpointSource(steps=[1], fetch_error=CheckpointSourceError("download failed"))
    with pytest.raises(CheckpointSourceError, match="download failed"):
        CheckpointResolver([source]).resolve("latest")


def test_explicit_path_must_be_an_existing_directory(tmp_path, caplog):
    folder = make_checkpoint(tmp_path, "checkpoint-8")
    source = FakeCheckpointSource(steps=[99])
    resolver = CheckpointResolver([source])
    assert resolver.resolve(str(folder)) == str(folder)
    assert source.latest_calls == 0
    with pytest.raises(CheckpointNotFoundError) as info:
        resolver.resolve(str(tmp_path / "checkpoint-9"))
    assert str(tmp_path / "checkpoint-9") in str(info.value)
    assert "so it is a path" in str(info.value)
    assert info.value.reason is not None
    assert info.value.reason.endswith(f"{tmp_path / 'checkpoint-9'} does not exist")
    assert info.value.searched == (str(tmp_path / "checkpoint-9"),)
    with pytest.raises(CheckpointNotFoundError) as info:
        resolver.resolve(str(folder / "trainer_state.json"))  # a file, not a directory
    assert str(info.value.reason).endswith("trainer_state.json is not a directory")
    partial = make_checkpoint(tmp_path, "checkpoint-12", state=None)
    assert resolver.resolve(str(partial)) == str(partial)
    assert "does not look like a complete" in warnings_of(caplog)


@pytest.mark.parametrize("value", ["none", "false", "0", "no", "None"])
def test_no_magic_words_besides_empty(value, tmp_path, monkeypatch):
    """Only unset/empty start fresh; anything else is a path, so typos fail loudly."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(CheckpointNotFoundError) as info:
        CheckpointResolver([FakeCheckpointSource(steps=[1])]).resolve(value)
    # Said plainly: the word was taken as a path (relative: shown absolute), which is missing.
    assert (
        f"no checkpoint for {value!r}: it is not 'latest', 'last-checkpoint', 'auto' or empty, so "
        in (str(info.value))
    )
    assert f"{tmp_path / value} does not exist; searched: {value}" in str(info.value)


def test_keyword_wins_over_a_directory_called_latest(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    make_checkpoint(tmp_path, "latest", state={"global_step": 1})
    resolver = CheckpointResolver([FakeCheckpointSource(steps=[2])])
    assert resolver.resolve("latest") == "/fake/checkpoint-2"
    # handed on as given, so that it is never read as the keyword again
    assert resolver.resolve("./latest") == "./latest"


def test_resolve_from_env(tmp_path, monkeypatch):
    resolver = CheckpointResolver([FakeCheckpointSource(steps=[4])])
    assert resolver.resolve_from_env({}) is None
    assert resolver.resolve_from_env({RESUME_ENV_VAR: "  "}) is None
    assert resolver.resolve_from_env({RESUME_ENV_VAR: " latest\n"}) == "/fake/checkpoint-4"
    folder = make_checkpoint(tmp_path, "checkpoint-1")
    assert resolver.resolve_from_env({RESUME_ENV_VAR: f"{folder} "}) == str(folder)
    monkeypatch.setenv(RESUME_ENV_VAR, "last-checkpoint")
    assert resolver.resolve_from_env() == "/fake/checkpoint-4"
    monkeypatch.delenv(RESUME_ENV_VAR)
    assert resolver.resolve_from_env() is None


def test_resolver_rejects_non_sources():
    with pytest.raises(ConfigError, match=r"^sources\[1\]="):
        CheckpointResolver([FakeCheckpointSource(), "/x/out"])  # type: ignore[list-item]


def test_resolver_refuses_downloads_into_the_local_root(tmp_path):
    local = LocalCheckpointSource(tmp_path / "out")
    hub = HubCheckpointSource(REPO, download_dir=tmp_path / "out/../out")
    with pytest.raises(ConfigError, match=r"^sources=.*download_dir.*local:"):
        CheckpointResolver([local, hub])
    CheckpointResolver([local, HubCheckpointSource(REPO, download_dir=tmp_path / "out" / "hub")])


def test_local_and_fake_sources_mix(tmp_path):
    make_checkpoint(tmp_path, "checkpoint-10")
    remote = FakeCheckpointSource(steps=[15], description="remote")
    assert (
        CheckpointResolver([LocalCheckpointSource(tmp_path), remote]).resolve("latest")
        == "/fake/checkpoint-15"
    )
    remote = FakeCheckpointSource(steps=[10], description="remote")
    assert CheckpointResolver([LocalCheckpointSource(tmp_path), remote]).resolve("latest") == str(
        tmp_path / "checkpoint-10"
    )
    assert remote.fetched == []


# ---------------------------------------------------------------- Hub source: construction


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"repo_id": ""}, "repo_id"),
        ({"repo_id": "a/b/c"}, "repo_id"),
        ({"repo_id": "a//b"}, "repo_id"),
        ({"repo_id": "a/b--c"}, "repo_id"),
        ({"repo_id": "org/" + "x" * 100}, "repo_id"),
        ({"repo_id": 7}, "repo_id"),
        ({"revision": ""}, "revision"),
        ({"endpoint": "huggingface.co"}, "endpoint"),
        ({"endpoint": "ftp://hub.example"}, "endpoint"),
        ({"endpoint": "https://user:pw@hub.example"}, "endpoint"),
        ({"timeout": 0}, "timeout"),
        ({"timeout": True}, "timeout"),
        ({"max_workers": 0}, "max_workers"),
        ({"download_dir": ""}, "download_dir"),
    ],
)
def test_hub_source_validates(tmp_path, kwargs, field):
    kwargs = {"repo_id": REPO, "download_dir": tmp_path, **kwargs}
    repo_id = kwargs.pop("repo_id")
    with pytest.raises(ConfigError, match=rf"^{field}="):
        HubCheckpointSource(repo_id, **kwargs)


def test_hub_source_download_dir_must_not_be_a_file(tmp_path):
    (tmp_path / "f").write_text("x")
    with pytest.raises(ConfigError, match=r"^download_dir="):
        HubCheckpointSource(REPO, download_dir=tmp_path / "f")


def test_hub_source_basics(tmp_path):
    source = HubCheckpointSource("gpt2", download_dir=tmp_path, token="", revision="v1")
    assert source.description == "hub:gpt2@v1"
    assert isinstance(source, CheckpointSource)
    source = HubCheckpointSource(REPO, download_dir=str(tmp_path), endpoint="http://h:1/")
    assert source.description == f"hub:{REPO}@main via http://h:1"
    assert source.download_dir == tmp_path


# ---------------------------------------------------------------- Hub source on FakeHub


def test_hub_latest_reads_steps_from_folder_names(hub, tmp_path):
    for step in (10, 20, 30):
        hub.add_checkpoint(REPO, f"checkpoint-{step}", step)
    hub.add_checkpoint(REPO, "tmp-checkpoint-40", 40)
    hub.add_file(REPO, "checkpoint-50", b"a file at the top, not a folder")
    hub.add_file(REPO, "model.safetensors", b"final weights")
    hub.reset_counters()
    source = hub_source(hub, tmp_path)
    assert source.latest() == Checkpoint(30, "checkpoint-30", source.description)
    assert hub.downloads == []  # metadata only
    assert [m for m, p in hub.requests if "/tree/" in p] == ["GET"]  # one listing


def test_hub_skips_an_incomplete_upload(hub, tmp_path, caplog):
    hub.add_checkpoint(REPO, "checkpoint-20", 20)
    hub.add_checkpoint(REPO, "checkpoint-30", 30, complete=False)
    source = hub_source(hub, tmp_path)
    assert source.latest().step == 20
    assert "checkpoint-30" in warnings_of(caplog)


@pytest.mark.parametrize("folder", ["checkpoint-30", "last-checkpoint"])
def test_hub_skips_an_upload_that_holds_the_jit_sentinel(hub, tmp_path, caplog, folder):
    hub.add_checkpoint(REPO, "checkpoint-20", 20)
    hub.add_checkpoint(REPO, folder, 30)
    hub.add_file(REPO, f"{folder}/{INCOMPLETE_MARKER}", b"in progress...")
    hub.reset_counters()
    source = hub_source(hub, tmp_path)
    assert source.latest().step == 20
    assert hub.downloads == []  # not even last-checkpoint's state is probed
    assert f"{INCOMPLETE_MARKER} is present" in warnings_of(caplog)
    with pytest.raises(CheckpointSourceError, match=r"not .*a complete checkpoint"):
        source.fetch(Checkpoint(30, folder, source.description))
    assert not (tmp_path / "hub-download" / folder).exists()


def test_hub_empty_repo_has_none(hub, tmp_path):
    hub.add_file(REPO, "README.md", b"nothing yet")
    assert hub_source(hub, tmp_path).latest() is None


def test_last_checkpoint_step_comes_from_global_step(hub, tmp_path):
    hub.add_checkpoint(REPO, "checkpoint-10", 10)
    hub.add_checkpoint(REPO, "last-checkpoint", 25)
    hub.reset_counters()
    source = hub_source(hub, tmp_path)
    assert source.latest() == Checkpoint(25, "last-checkpoint", source.description)
    assert hub.downloads == [(REPO, "last-checkpoint/trainer_state.json")]
    assert not (tmp_path / "hub-download").exists()  # the probe went to a temporary directory
    hub.reset_counters()
    path = source.fetch(source.latest())
    assert path == tmp_path / "hub-download" / "last-checkpoint"
    assert read_trainer_state(path)[0]["global_step"] == 25  # type: ignore[index]
    state_size = len(hub.files(REPO)["last-checkpoint/trainer_state.json"])
    assert hub.bytes_served == hub.folder_size(REPO, "last-checkpoint") + state_size


def test_numbered_checkpoint_wins_a_tie_with_last_checkpoint(hub, tmp_path):
    hub.add_checkpoint(REPO, "checkpoint-30", 30)
    hub.add_checkpoint(REPO, "last-checkpoint", 30)
    assert hub_source(hub, tmp_path).latest().path == "checkpoint-30"


@pytest.mark.parametrize(
    ("state", "why"),
    [
        ({"epoch": 1.0}, "global_step"),
        ({"global_step": "30"}, "global_step"),
        ([30], "JSON object"),
    ],
)
def test_last_checkpoint_without_usable_step_is_skipped(hub, tmp_path, caplog, state, why):
    hub.add_checkpoint(REPO, "checkpoint-10", 10)
    hub.add_checkpoint(REPO, "last-checkpoint", 99)
    hub.add_file(REPO, "last-checkpoint/trainer_state.json", json.dumps(state).encode())
    assert hub_source(hub, tmp_path).latest().step == 10
    assert "last-checkpoint" in warnings_of(caplog)
    assert why in warnings_of(caplog)


def test_incomplete_last_checkpoint_is_not_even_probed(hub, tmp_path, caplog):
    hub.add_checkpoint(REPO, "last-checkpoint", 99, complete=False)
    hub.reset_counters()
    assert hub_source(hub, tmp_path).latest() is None
    assert hub.downloads == []
    assert "last-checkpoint" in warnings_of(caplog)


def test_resume_downloads_only_the_newest_checkpoint(hub, tmp_path, caplog):
    """The issue's byte count: the old helper served ~3x what resuming needs."""
    sizes = {
        step: hub.add_checkpoint(REPO, f"checkpoint-{step}", step, size=SIZE)
        for step in (10, 20, 30)
    }
    hub.reset_counters()
    resolver = CheckpointResolver(
        [LocalCheckpointSource(tmp_path / "out"), hub_source(hub, tmp_path)]
    )
    path = resolver.resolve("latest")
    assert path == str(tmp_path / "hub-download" / "checkpoint-30")
    new_bytes = hub.bytes_served
    assert new_bytes == sizes[30] == hub.folder_size(REPO, "checkpoint-30")
    assert {p for _, p in hub.downloads} == files_under(hub, "checkpoint-30")
    assert not any("checkpoint-10" in p or "checkpoint-20" in p for _, p in hub.requests)
    assert snapshot(Path(path)).keys() == {
        p.split("/", 1)[1] for p in files_under(hub, "checkpoint-30")
    } | {".verirl-download.json"}  # verirl's marker: this folder is its download
    assert "293.2 KiB" in caplog.text  # what is fetched, and how big
    assert "6 files" in caplog.text

    hub.reset_counters()
    snapshot_download(  # the old helper's call
        REPO,
        allow_patterns=["last-checkpoint/**", "checkpoint-*/**"],
        endpoint=hub.endpoint,
        local_dir=tmp_path / "old",
        cache_dir=tmp_path / "old-cache",
    )
    old_bytes = hub.bytes_served
    assert old_bytes == sum(sizes.values())
    assert old_bytes / new_bytes == pytest.approx(3, rel=0.01)


def test_local_older_than_hub_fetches_the_hub_one(hub, tmp_path):
    local = make_checkpoint(tmp_path / "out", "checkpoint-20")
    before = snapshot(local)
    hub.add_checkpoint(REPO, "checkpoint-30", 30)
    resolver = CheckpointResolver(
        [LocalCheckpointSource(tmp_path / "out"), hub_source(hub, tmp_path)]
    )
    assert resolver.resolve("latest") == str(tmp_path / "hub-download" / "checkpoint-30")
    assert snapshot(local) == before
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["checkpoint-20"]


def test_local_as_new_as_hub_downloads_nothing(hub, tmp_path):
    make_checkpoint(tmp_path / "out", "checkpoint-30")
    hub.add_checkpoint(REPO, "checkpoint-30", 30)
    hub.reset_counters()
    resolver = CheckpointResolver(
        [LocalCheckpointSource(tmp_path / "out"), hub_source(hub, tmp_path)]
    )
    assert resolver.resolve("latest") == str(tmp_path / "out" / "checkpoint-30")
    assert hub.downloads == []
    assert not any("/resolve/" in p for _, p in hub.requests)
    assert not (tmp_path / "hub-download").exists()


def test_second_fetch_reuses_the_download(hub, tmp_path):
    hub.add_checkpoint(REPO, "checkpoint-30", 30)
    source = hub_source(hub, tmp_path)
    first = source.fetch(source.latest())
    hub.reset_counters()
    again = hub_source(hub, tmp_path)  # a new process after the next preemption
    assert again.fetch(again.latest()) == first
    assert hub.bytes_served == 0


def test_files_the_commit_does_not_have_are_reported_not_deleted(hub, tmp_path, caplog):
    hub.add_checkpoint(REPO, "checkpoint-30", 30)
    source = hub_source(hub, tmp_path)
    path = source.fetch(source.latest())
    (path / "optimizer.bin").write_bytes(b"left over from an older upload")
    assert hub_source(hub, tmp_path).fetch(source.latest()) == path
    assert (path / "optimizer.bin").exists()
    assert "optimizer.bin" in warnings_of(caplog)


def test_fetch_without_latest_lists_first(hub, tmp_path):
    hub.add_checkpoint(REPO, "checkpoint-30", 30)
    source = hub_source(hub, tmp_path)
    path = source.fetch(Checkpoint(30, "checkpoint-30", source.description))
    assert read_trainer_state(path)[0] == {"global_step": 30, "epoch": 0.3, "log_history": []}


def test_fetch_refuses_to_overwrite_a_folder_it_did_not_download(hub, tmp_path):
    hub.add_checkpoint(REPO, "checkpoint-30", 30)
    foreign = make_checkpoint(tmp_path / "hub-download", "checkpoint-30", state=None)
    before = snapshot(foreign)
    source = hub_source(hub, tmp_path)
    with pytest.raises(ConfigError, match=r"^download_dir=.*refusing to overwrite"):
        source.fetch(source.latest())
    assert snapshot(foreign) == before
    assert hub.downloads == []


def test_fetch_checks_what_it_is_given(hub, tmp_path):
    hub.add_checkpoint(REPO, "checkpoint-30", 30)
    source = hub_source(hub, tmp_path)
    with pytest.raises(ConfigError, match=r"^checkpoint=.*comes from"):
        source.fetch(Checkpoint(30, "checkpoint-30", "local:/x"))
    with pytest.raises(ConfigError, match=r"^checkpoint=.*folder name"):
        source.fetch(Checkpoint(30, "../etc", source.description))
    with pytest.raises(CheckpointSourceError, match="checkpoint-99 is not") as info:
        source.fetch(Checkpoint(99, "checkpoint-99", source.description))
    assert isinstance(info.value.__cause__, FileNotFoundError)


def test_fetch_failure_is_a_source_error(hub, tmp_path):
    hub.add_checkpoint(REPO, "checkpoint-30", 30)
    source = hub_source(hub, tmp_path, max_workers=2)
    cp = source.latest()
    hub.protect(REPO, "hf_now_private")
    with pytest.raises(CheckpointSourceError, match=f"cannot download from hub:{REPO}") as info:
        source.fetch(cp)
    assert info.value.__cause__ is not None


def test_hub_pagination_is_followed(tmp_path, monkeypatch):
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    with serve_fake_hub(page_size=3) as fake:
        for step in (10, 20, 30):
            fake.add_checkpoint(REPO, f"checkpoint-{step}", step)
        assert hub_source(fake, tmp_path).latest().step == 30
        assert len([p for _, p in fake.requests if "/tree/" in p]) > 1


def test_revision_is_passed_through(hub, tmp_path):
    hub.add_checkpoint(REPO, "checkpoint-10", 10, revision="run-b")
    hub.add_checkpoint(REPO, "checkpoint-30", 30)
    source = hub_source(hub, tmp_path, revision="run-b")
    assert source.latest() == Checkpoint(
        10, "checkpoint-10", f"hub:{REPO}@run-b via {hub.endpoint}"
    )
    assert source.fetch(source.latest()) == tmp_path / "hub-download" / "checkpoint-10"


@pytest.mark.parametrize(
    "revision",
    [
        "",
        "   ",
        "\x01",
        "main\x00",
        "\x00",
        "main\n",
        "ma in",
        "\t",
        "\x7f",
        "..",
        "../main",
        "refs/../main",
        "a..b",
        "/main",
        "main/",
        "refs//main",
        "refs/./main",
        ".hidden",
        "main.lock",
        "main@{1}",
        "main~1",
        "main^",
        "a:b",
        "a\\b",
        "a*",
        "a?",
        "a[b",
        "x" * 300,
        7,
    ],
)
def test_a_bad_revision_is_refused_before_any_request(hub, tmp_path, revision):
    hub.add_checkpoint(REPO, "checkpoint-10", 10)
    with pytest.raises(ConfigError, match=r"^revision=") as info:
        hub_source(hub, tmp_path, revision=revision)
    assert info.value.field == "revision"
    assert repr(revision)[:60] in str(info.value)
    assert hub.requests == []


@pytest.mark.parametrize(
    "revision", ["main", "v1.0", "refs/pr/1", "run-b_2", "feature/x.y", "a" * 40, "release@2"]
)
def test_a_good_revision_is_accepted(tmp_path, revision):
    assert HubCheckpointSource(REPO, download_dir=tmp_path, revision=revision).revision == revision


def test_token_is_sent(hub, tmp_path):
    hub.add_checkpoint(REPO, "checkpoint-30", 30)
    hub.protect(REPO, "hf_right_token")
    source = hub_source(hub, tmp_path, token="hf_right_token")
    assert source.fetch(source.latest()).name == "checkpoint-30"


# ---------------------------------------------------------------- failing Hub


def _break(kind: str, hub: FakeHub, tmp_path: Path) -> HubCheckpointSource:
    hub.add_checkpoint(REPO, "checkpoint-30", 30)
    if kind == "401 no token":
        hub.protect(REPO, "hf_needed")
        return hub_source(hub, tmp_path)
    if kind == "401 wrong token":
        hub.protect(REPO, "hf_needed")
        return hub_source(hub, tmp_path, token="hf_wrong")
    if kind == "404":
        return HubCheckpointSource(
            "org/missing", download_dir=tmp_path / "dl", endpoint=hub.endpoint
        )
    assert kind == "unreachable"
    return hub_source(hub, tmp_path, endpoint=f"http://127.0.0.1:{closed_port()}")


FAILURES = {
    "401 no token": RepositoryNotFoundError,
    "401 wrong token": HfHubHTTPError,
    "404": RepositoryNotFoundError,
    "unreachable": Exception,
}


@pytest.mark.parametrize("kind", FAILURES)
def test_failing_hub_with_a_local_checkpoint_warns_and_resumes_locally(hub, tmp_path, caplog, kind):
    source = _break(kind, hub, tmp_path)
    make_checkpoint(tmp_path / "out", "checkpoint-5")
    resolver = CheckpointResolver([LocalCheckpointSource(tmp_path / "out"), source])
    assert resolver.resolve("latest") == str(tmp_path / "out" / "checkpoint-5")
    warned = warnings_of(caplog)
    assert source.repo_id in warned
    assert "could not be read" in warned


@pytest.mark.parametrize("kind", FAILURES)
def test_failing_hub_alone_is_a_source_error_with_the_cause(hub, tmp_path, kind):
    source = _break(kind, hub, tmp_path)
    with pytest.raises(CheckpointSourceError) as direct:
        source.latest()
    assert isinstance(direct.value.__cause__, FAILURES[kind])
    assert source.repo_id in str(direct.value)
    resolver = CheckpointResolver([LocalCheckpointSource(tmp_path / "out"), source])
    with pytest.raises(CheckpointSourceError) as info:
        resolver.resolve("latest")
    assert isinstance(info.value.__cause__, FAILURES[kind])
    assert source.repo_id in str(info.value)
    assert f"local:{tmp_path / 'out'}" in str(info.value)


def test_unreachable_hub_says_so(hub, tmp_path):
    source = _break("unreachable", hub, tmp_path)
    with pytest.raises(CheckpointSourceError, match="ConnectError"):
        source.latest()


@pytest.mark.parametrize("how", ["env", "constant", "transformers-env"])
def test_offline_mode_is_honoured(hub, tmp_path, monkeypatch, caplog, how):
    hub.add_checkpoint(REPO, "checkpoint-30", 30)
    if how == "env":
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    elif how == "transformers-env":
        monkeypatch.setenv("TRANSFORMERS_OFFLINE", "yes")
    else:
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    hub.reset_counters()
    source = hub_source(hub, tmp_path)
    with pytest.raises(CheckpointSourceError, match="offline") as info:
        source.latest()
    assert isinstance(info.value.__cause__, OfflineModeIsEnabled)
    with pytest.raises(CheckpointSourceError, match="offline"):
        source.fetch(Checkpoint(30, "checkpoint-30", source.description))
    make_checkpoint(tmp_path / "out", "checkpoint-3")
    resolver = CheckpointResolver([LocalCheckpointSource(tmp_path / "out"), source])
    assert resolver.resolve("latest") == str(tmp_path / "out" / "checkpoint-3")
    assert "offline" in warnings_of(caplog)
    assert hub.requests == []


def test_the_token_never_leaks(hub, tmp_path, caplog):
    secret = "hf_SuperSecretToken1234567890"
    hub.add_checkpoint(REPO, "checkpoint-30", 30)
    hub.protect(REPO, "hf_the_real_one")
    source = hub_source(hub, tmp_path, token=secret)
    assert secret not in repr(source)
    with pytest.raises(CheckpointSourceError) as info:
        source.latest()
    assert "401" in str(info.value)
    assert REPO in str(info.value)
    make_checkpoint(tmp_path / "out", "checkpoint-1")
    CheckpointResolver([LocalCheckpointSource(tmp_path / "out"), source]).resolve("latest")
    with pytest.raises(CheckpointSourceError) as resolved:
        CheckpointResolver([source]).resolve("latest")
    for text in (str(info.value), str(resolved.value), caplog.text, repr(source), repr(info.value)):
        assert secret not in text
    assert caplog.records  # the check above looked at real log output


def test_the_token_never_leaks_when_it_works(hub, tmp_path, caplog):
    secret = "hf_AnotherSecretToken0987654321"
    hub.add_checkpoint(REPO, "checkpoint-30", 30)
    hub.protect(REPO, secret)
    source = hub_source(hub, tmp_path, token=secret)
    CheckpointResolver([source]).resolve("latest")
    assert "downloading checkpoint-30" in caplog.text
    assert secret not in caplog.text
    assert secret not in repr(source)


@pytest.fixture
def no_machine_token(monkeypatch, tmp_path):
    """No Hub token from this machine: no variable, and the token file in ``tmp_path``."""
    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_TOKEN_PATH", "HF_OIDC_RESOURCE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_IMPLICIT_TOKEN", False)
    path = tmp_path / "hf-home" / "token"
    path.parent.mkdir()
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(path))
    return path


@pytest.mark.parametrize(
    "bad",
    ["hf_TheRealToken12345\u00e967890", "hf_TheReal Token1234567890"],
    ids=["non-ASCII", "space"],
)
@pytest.mark.parametrize("where", ["HF_TOKEN_PATH", "saved login", "HUGGING_FACE_HUB_TOKEN"])
def test_a_token_huggingface_hub_finds_itself_is_checked_before_any_request(  # noqa: PLR0917
    hub, tmp_path, monkeypatch, no_machine_token, where, bad
):
    """token=None: the token huggingface_hub would send (a non-ASCII one fails encoding the
    header, quoting a character of it; one with a space is a 401) is refused as token= is, in a
    ConfigError that names where it is and shows none of it."""
    hub.add_checkpoint(REPO, "checkpoint-30", 30)
    hub.protect(REPO, "hf_TheRealToken1234567890")
    expected = place_hub_token(where, bad, tmp_path, no_machine_token, monkeypatch)
    source = hub_source(hub, tmp_path)
    make_checkpoint(tmp_path / "out", "checkpoint-1")
    resolver = CheckpointResolver([LocalCheckpointSource(tmp_path / "out"), source])
    hub.reset_counters()
    for attempt in (source.latest, lambda: resolver.resolve("latest")):
        with pytest.raises(ConfigError) as info:
            attempt()
        message = str(info.value)
        assert message.startswith(expected), message
        assert "RealToken" not in message
        assert "\u00e9" not in message
    assert hub.requests == []  # refused before the Hub was asked anything


@pytest.mark.parametrize("given", ["token=", "HF_TOKEN"])
def test_an_endpoint_holding_the_token_never_shows_it(hub, tmp_path, monkeypatch, caplog, given):
    """A source's description carries its endpoint into every message: scrubbed there too."""
    secret = "hf_EndpointSecretToken1234567"
    monkeypatch.delenv("HF_TOKEN", raising=False)
    if given == "HF_TOKEN":  # token=None: the one huggingface_hub finds is scrubbed
        monkeypatch.setenv("HF_TOKEN", secret)
    kwargs = {"token": secret} if given == "token=" else {}
    port = closed_port()
    source = hub_source(hub, tmp_path, endpoint=f"http://127.0.0.1:{port}/{secret}", **kwargs)
    assert source.endpoint == f"http://127.0.0.1:{port}/{secret}"  # sent as it was given
    assert source.description == f"hub:{REPO}@main via http://127.0.0.1:{port}/<token>"
    (tmp_path / "out").mkdir()
    resolver = CheckpointResolver([LocalCheckpointSource(tmp_path / "out"), source])
    with pytest.raises(CheckpointSourceError) as info:
        resolver.resolve("latest")
    message = str(info.value)
    assert "could not be read" in message
    assert f"searched: local:{tmp_path / 'out'}, hub:{REPO}@main via " in message
    assert message.count("<token>") == 2, message  # the source's reason, and where it searched
    make_checkpoint(tmp_path / "out", "checkpoint-1")
    assert resolver.resolve("latest") == str(tmp_path / "out" / "checkpoint-1")
    assert "ignoring checkpoint source hub:" in caplog.text  # the warning names it too
    for text in (message, repr(info.value), caplog.text, repr(source)):
        assert secret not in text


@pytest.mark.parametrize("given", ["token=", "HF_TOKEN"])
@pytest.mark.parametrize(
    ("endpoint", "why"),
    [
        ("http://127.0.0.1:1/?x={}", "must not have a ?query or #fragment"),
        ("http://127.0.0.1:1/#{}", "must not have a ?query or #fragment"),
        ("http://127.0.0.1:1/{} x", "must not contain whitespace or control characters"),
        ("http://127.0.0.1:1/{}\u00e9", "must not contain whitespace, control or non-ASCII"),
        ("ftp://127.0.0.1:1/{}", "must start with http:// or https://"),
    ],
)
def test_an_endpoint_refused_never_shows_the_token_in_it(
    tmp_path, monkeypatch, endpoint, why, given
):
    secret = "hf_EndpointSecretToken1234567"
    monkeypatch.delenv("HF_TOKEN", raising=False)
    if given == "HF_TOKEN":
        monkeypatch.setenv("HF_TOKEN", secret)
    kwargs = {"token": secret} if given == "token=" else {}
    with pytest.raises(ConfigError) as info:
        HubCheckpointSource(
            REPO, download_dir=tmp_path / "dl", endpoint=endpoint.format(secret), **kwargs
        )
    assert why in str(info.value)
    assert str(info.value).startswith("endpoint='"), str(info.value)
    assert "<token>" in str(info.value)
    assert info.value.field == "endpoint"
    for text in (str(info.value), repr(info.value.value), str(info.value.reason)):
        assert secret not in text


def test_import_verirl_checkpoints_does_not_import_huggingface_hub():
    code = (
        "import sys, verirl.checkpoints, fakes.hub, fakes.checkpoints; "
        "print('huggingface_hub' in sys.modules)"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert out.stdout.strip() == "False"


def test_examples_in_the_fake_source_docstring():
    local = FakeCheckpointSource(steps=[10, 20], description="fake:local")
    hub = FakeCheckpointSource(error=CheckpointSourceError("hub down"))
    assert CheckpointResolver([local, hub]).resolve("latest") == "/fake/checkpoint-20"
    assert local.fetched[0].step == 20
    assert os.fspath(local.fetch(local.checkpoint(10))) == "/fake/checkpoint-10"


# -- contract edges: minimal sources, fetch fallback, path-likes


class MinimalSource:
    """Only what the contract's protocol asks for: latest() and fetch()."""

    def __init__(self, step: int, path: Path) -> None:
        self.step = step
        self.path = path

    def latest(self) -> Checkpoint | None:
        return Checkpoint(self.step, self.path, "minimal")

    def fetch(self, checkpoint: Checkpoint) -> Path:
        return Path(checkpoint.path)


def test_a_source_with_only_latest_and_fetch_is_accepted(tmp_path):
    resolver = CheckpointResolver([MinimalSource(3, tmp_path)])
    assert resolver.resolve("latest") == str(tmp_path)


def test_a_failed_fetch_falls_back_to_the_next_newest(caplog):
    broken = FakeCheckpointSource(
        steps=[30], description="hub", fetch_error=CheckpointSourceError("download failed")
    )
    local = FakeCheckpointSource(steps=[20], description="local")
    assert CheckpointResolver([local, broken]).resolve("latest") == "/fake/checkpoint-20"
    assert [c.step for c in broken.fetched] == [30]
    assert "could not fetch step 30 from hub" in caplog.text


def test_when_every_fetch_fails_the_first_error_is_raised():
    first = CheckpointSourceError("first")
    a = FakeCheckpointSource(steps=[30], fetch_error=first)
    b = FakeCheckpointSource(steps=[20], fetch_error=CheckpointSourceError("second"))
    with pytest.raises(CheckpointSourceError) as info:
        CheckpointResolver([a, b]).resolve("latest")
    assert info.value is first


def test_path_likes_are_accepted(tmp_path):
    assert Checkpoint(1, tmp_path, "x").path == str(tmp_path)
    assert CheckpointResolver([]).resolve(tmp_path) == str(tmp_path)
    with pytest.raises(ConfigError, match="path"):
        Checkpoint(1, 5, "x")  # type: ignore[arg-type]


# ------------------------------------------------------- safety: nothing lost, nothing leaked


def test_a_folder_verirl_did_not_download_is_never_overwritten(hub, tmp_path):
    """Issue 9 item 2: ownership is per folder, not "download_dir/.cache exists"."""
    hub.add_checkpoint(REPO, "checkpoint-10", 10)
    source = hub_source(hub, tmp_path)
    source.fetch(source.latest())  # download_dir now holds a real download (and any caches)
    mine = make_checkpoint(tmp_path / "hub-download", "checkpoint-20")
    before = snapshot(mine)
    hub.add_checkpoint(REPO, "checkpoint-20", 20)
    hub.reset_counters()
    with pytest.raises(ConfigError, match=r"^download_dir=.*checkpoint-20.*refusing to overwrite"):
        CheckpointResolver([hub_source(hub, tmp_path)]).resolve("latest")
    assert snapshot(mine) == before
    assert hub.downloads == []


def test_a_symlinked_folder_in_download_dir_is_never_followed(hub, tmp_path):
    """Issue 9 item 3: dl/checkpoint-20 -> elsewhere must not receive the download."""
    hub.add_checkpoint(REPO, "checkpoint-10", 10)
    source = hub_source(hub, tmp_path)
    source.fetch(source.latest())
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "keep.txt").write_text("mine")
    (tmp_path / "hub-download" / "checkpoint-20").symlink_to(elsewhere, target_is_directory=True)
    hub.add_checkpoint(REPO, "checkpoint-20", 20)
    with pytest.raises(ConfigError, match=r"^download_dir=.*checkpoint-20.*symlink"):
        CheckpointResolver([hub_source(hub, tmp_path)]).resolve("latest")
    assert sorted(p.name for p in elsewhere.iterdir()) == ["keep.txt"]
    assert (tmp_path / "hub-download" / "checkpoint-20").is_symlink()


def test_a_symlink_to_a_matching_checkpoint_is_not_followed_either(hub, tmp_path):
    hub.add_checkpoint(REPO, "checkpoint-20", 20)
    source = hub_source(hub, tmp_path, download_dir=tmp_path / "first")
    real = source.fetch(source.latest())
    (tmp_path / "hub-download").mkdir()
    (tmp_path / "hub-download" / "checkpoint-20").symlink_to(real, target_is_directory=True)
    other = hub_source(hub, tmp_path)
    with pytest.raises(ConfigError, match="symlink"):
        other.fetch(other.latest())


@pytest.mark.parametrize("dangling", [True, False])
def test_a_symlinked_lock_file_is_never_followed(hub, tmp_path, dangling):
    hub.add_checkpoint(REPO, "checkpoint-20", 20)
    outside = tmp_path / "outside"
    outside.mkdir()
    if not dangling:
        (outside / "target").write_text("mine")
    download_dir = tmp_path / "hub-download"
    download_dir.mkdir()
    (download_dir / ".verirl-checkpoint-20.lock").symlink_to(outside / "target")
    source = hub_source(hub, tmp_path)
    with pytest.raises(ConfigError, match="symlink") as caught:  # as one in the folder's place
        source.fetch(source.latest())
    assert caught.value.field == "download_dir"
    assert [p.name for p in outside.iterdir()] == ([] if dangling else ["target"])
    assert not (download_dir / "checkpoint-20").exists()


def test_symlinks_that_look_like_staging_folders_are_left_alone(hub, tmp_path):
    hub.add_checkpoint(REPO, "checkpoint-20", 20)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("mine")
    download_dir = tmp_path / "hub-download"
    download_dir.mkdir()
    for prefix in (".verirl-tmp-", ".verirl-old-"):
        (download_dir / f"{prefix}checkpoint-20-x").symlink_to(outside, target_is_directory=True)
    source = hub_source(hub, tmp_path)
    assert source.fetch(source.latest()) == download_dir / "checkpoint-20"
    assert [p.name for p in outside.iterdir()] == ["keep.txt"]
    assert (download_dir / ".verirl-tmp-checkpoint-20-x").is_symlink()


@pytest.mark.parametrize(
    "name",
    [
        ".verirl-tmp-checkpoint-20-mywork",
        ".verirl-old-checkpoint-20-x",
        ".verirl-tmp-checkpoint-20-0123456789abcdef",
        ".verirl-old-checkpoint-20-0123456789abcdef",
    ],
)
def test_a_users_folder_named_like_a_staging_folder_is_never_deleted(hub, tmp_path, caplog, name):
    """Review finding: leftovers were matched by name alone, so a user's folder went."""
    hub.add_checkpoint(REPO, "checkpoint-20", 20)
    download_dir = tmp_path / "hub-download"
    download_dir.mkdir()
    (download_dir / name).mkdir()
    (download_dir / name / "precious.txt").write_text("x")
    path = CheckpointResolver([hub_source(hub, tmp_path)]).resolve("latest")
    assert path == str(download_dir / "checkpoint-20")
    assert (download_dir / name / "precious.txt").read_text() == "x"
    assert name in warnings_of(caplog)


def _owned_leftover(download_dir: Path, hub: FakeHub, tmp_path: Path) -> Path:
    """The staging folder a download killed midway leaves behind (a real one, from a process)."""
    hold = hub.hold(REPO, "checkpoint-20/optimizer.pt")
    proc = subprocess.Popen(
        [sys.executable, "-c", RESOLVE_IN_A_PROCESS, str(download_dir), hub.endpoint],
        env=_child_env(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert hold.arrived.wait(60), proc.communicate(timeout=60)
    finally:
        proc.kill()
        proc.communicate(timeout=60)
    hold.release()
    (leftover,) = download_dir.glob(".verirl-tmp-checkpoint-20-*")
    return leftover


@pytest.mark.parametrize("extra", ["file", "folder", "symlink", "in-checkpoint"])
def test_a_staging_folder_of_ours_holding_anything_else_is_left_alone(hub, tmp_path, caplog, extra):
    hub.add_checkpoint(REPO, "checkpoint-20", 20)
    download_dir = tmp_path / "hub-download"
    leftover = _owned_leftover(download_dir, hub, tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "keep.txt").write_text("mine")
    if extra == "file":
        (leftover / "precious.txt").write_text("x")
    elif extra == "folder":
        (leftover / "mine").mkdir()
        (leftover / "mine" / "precious.txt").write_text("x")
    elif extra == "symlink":
        (leftover / "checkpoint-20" / "link").symlink_to(outside, target_is_directory=True)
    else:
        (leftover / "checkpoint-20" / "precious.txt").write_text("x")
    before = sorted(p.relative_to(leftover).as_posix() for p in leftover.rglob("*"))
    path = CheckpointResolver([hub_source(hub, tmp_path)]).resolve("latest")
    assert read_trainer_state(Path(path))[0] is not None
    assert sorted(p.relative_to(leftover).as_posix() for p in leftover.rglob("*")) == before
    assert [p.name for p in outside.iterdir()] == ["keep.txt"]
    assert leftover.name in warnings_of(caplog)


def test_a_staging_folder_whose_marker_is_not_ours_is_left_alone(hub, tmp_path, caplog):
    hub.add_checkpoint(REPO, "checkpoint-20", 20)
    download_dir = tmp_path / "hub-download"
    leftover = _owned_leftover(download_dir, hub, tmp_path)
    renamed = leftover.with_name(".verirl-tmp-checkpoint-20-" + "0" * 32)
    leftover.rename(renamed)  # the marker's id no longer matches the folder's name
    path = CheckpointResolver([hub_source(hub, tmp_path)]).resolve("latest")
    assert read_trainer_state(Path(path))[0] is not None
    assert renamed.is_dir()
    assert renamed.name in warnings_of(caplog)


def test_a_symlinked_owner_marker_does_not_make_a_folder_ours(hub, tmp_path, caplog):
    hub.add_checkpoint(REPO, "checkpoint-20", 20)
    download_dir = tmp_path / "hub-download"
    leftover = _owned_leftover(download_dir, hub, tmp_path)
    (marker,) = [p for p in leftover.iterdir() if p.is_file()]
    real = tmp_path / "marker-copy"
    real.write_bytes(marker.read_bytes())
    marker.unlink()
    marker.symlink_to(real)
    CheckpointResolver([hub_source(hub, tmp_path)]).resolve("latest")
    assert leftover.is_dir()
    assert real.exists()
    assert leftover.name in warnings_of(caplog)


def test_a_download_that_fails_halfway_leaves_nothing_that_looks_complete(hub, tmp_path):
    """Issue 9 "also seen": trainer_state.json arrived, the weights did not."""
    hub.add_checkpoint(REPO, "checkpoint-30", 30)
    hub.fail_downloads(REPO, "checkpoint-30/model.safetensors")
    source = hub_source(hub, tmp_path)
    with pytest.raises(CheckpointSourceError, match="cannot download"):
        source.fetch(source.latest())
    download_dir = tmp_path / "hub-download"
    assert not (download_dir / "checkpoint-30").exists()
    assert LocalCheckpointSource(download_dir).latest() is None
    assert [p.name for p in download_dir.iterdir() if not p.name.endswith(".lock")] == []
    hub.fail_downloads(REPO, "checkpoint-30/model.safetensors", 0)
    path = source.fetch(source.latest())
    assert read_trainer_state(path)[0] is not None
    assert (path / "model.safetensors").stat().st_size == SIZE_DEFAULT


SIZE_DEFAULT = 1024  # FakeHub.add_checkpoint's default model size


def test_short_bodies_with_matching_headers_are_rejected(hub, tmp_path):
    hub.add_checkpoint(REPO, "checkpoint-30", 30)
    hub.serve_instead(REPO, "checkpoint-30/optimizer.pt", b"truncated")
    source = hub_source(hub, tmp_path)
    with pytest.raises(CheckpointSourceError, match=r"optimizer\.pt.*9 bytes.*2048") as info:
        source.fetch(source.latest())
    assert info.value.__cause__ is not None
    assert not (tmp_path / "hub-download" / "checkpoint-30").exists()


def test_a_download_killed_midway_is_redone_by_the_next_process(hub, tmp_path):
    """A preempted job's half download is ours: the restarted job replaces it and resumes."""
    hub.add_checkpoint(REPO, "checkpoint-30", 30)
    hold = hub.hold(REPO, "checkpoint-30/optimizer.pt")
    download_dir = tmp_path / "hub-download"
    proc = subprocess.Popen(
        [sys.executable, "-c", RESOLVE_IN_A_PROCESS, str(download_dir), hub.endpoint],
        env=_child_env(tmp_path),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert hold.arrived.wait(60), proc.communicate(timeout=60)
    finally:
        proc.kill()
        proc.communicate(timeout=60)
    hold.release()
    assert not (download_dir / "checkpoint-30").exists()
    path = CheckpointResolver([hub_source(hub, tmp_path)]).resolve("latest")
    assert read_trainer_state(path)[0] is not None
    assert sorted(p.name for p in download_dir.iterdir() if not p.name.endswith(".lock")) == [
        "checkpoint-30"
    ]


def test_an_outdated_download_of_ours_is_replaced(hub, tmp_path):
    hub.add_checkpoint(REPO, "last-checkpoint", 10)
    source = hub_source(hub, tmp_path)
    path = source.fetch(source.latest())
    hub.add_checkpoint(REPO, "last-checkpoint", 20)
    again = hub_source(hub, tmp_path)
    assert again.fetch(again.latest()) == path
    assert read_trainer_state(path)[0]["global_step"] == 20  # type: ignore[index]


def test_an_outdated_download_holding_user_files_is_not_replaced(hub, tmp_path):
    hub.add_checkpoint(REPO, "last-checkpoint", 10)
    source = hub_source(hub, tmp_path)
    path = source.fetch(source.latest())
    (path / "notes.txt").write_text("mine")
    hub.add_checkpoint(REPO, "last-checkpoint", 20)
    again = hub_source(hub, tmp_path)
    with pytest.raises(ConfigError, match=r"notes\.txt"):
        again.fetch(again.latest())
    assert (path / "notes.txt").read_text() == "mine"
    assert read_trainer_state(path)[0]["global_step"] == 10  # type: ignore[index]


def test_a_new_commit_elsewhere_in_the_repo_downloads_nothing_again(hub, tmp_path):
    hub.add_checkpoint(REPO, "checkpoint-30", 30)
    source = hub_source(hub, tmp_path)
    first = source.fetch(source.latest())
    hub.add_file(REPO, "README.md", b"a new commit that does not touch checkpoint-30")
    hub.reset_counters()
    again = hub_source(hub, tmp_path)
    assert again.fetch(again.latest()) == first
    assert hub.downloads == []


# -- tokens and credentials


@pytest.mark.parametrize(
    "token", ["hf_secret\n", "hf_secret\r\n", "hf_sec\x00ret", "hf secret", "\thf_secret", "hf_é"]
)
def test_a_token_with_whitespace_or_control_characters_is_refused_up_front(tmp_path, token):
    with pytest.raises(ConfigError, match=r"^token=") as info:
        HubCheckpointSource(REPO, download_dir=tmp_path, token=token)
    for text in (str(info.value), repr(info.value), repr(info.value.value)):
        assert "secret" not in text
        assert "hf_" not in text


@pytest.mark.parametrize("token", [0, 5, b"hf_secret", ["hf_secret"]])
def test_a_token_of_the_wrong_type_is_refused(tmp_path, token):
    with pytest.raises(ConfigError, match=r"^token=") as info:
        HubCheckpointSource(REPO, download_dir=tmp_path, token=token)
    assert "secret" not in str(info.value)


def test_every_form_of_the_token_is_scrubbed_from_messages(hub, tmp_path, caplog):
    secret = "hf_Sec/ret+Tok=en%1"
    hub.add_checkpoint(REPO, "checkpoint-30", 30)
    hub.protect(REPO, "hf_the_real_one")
    source = hub_source(hub, tmp_path, token=secret)
    forms = _token_forms(secret)
    for form in forms:
        error = source._error("list", RuntimeError(f"bad header {form!r} {form}"))
        assert not any(f in str(error) for f in forms), str(error)
    with pytest.raises(CheckpointSourceError) as info:
        source.latest()
    chain = []
    exc: BaseException | None = info.value
    while exc is not None:
        chain.append(f"{exc!s} {exc!r}")
        exc = exc.__cause__ or exc.__context__
    for text in [*chain, caplog.text]:
        assert not any(f in text for f in forms), text


def _token_forms(secret: str) -> list[str]:
    from urllib.parse import quote, quote_plus

    return [
        secret,
        repr(secret)[1:-1],
        repr(secret.encode())[2:-1],
        quote(secret, safe=""),
        quote_plus(secret),
        json.dumps(secret)[1:-1],
    ]


@pytest.mark.parametrize(
    "endpoint",
    [
        "https://user:hunter2@hub.example",
        "https://user:hunter2@hub.example/",
        "http://:hunter2@127.0.0.1:8080",
        "https://hunter2@hub.example",
        "https://user:hunter2@",
        "https://user:hunter2@[::1",
        # A password holding a character a URL parser splits on (review finding).
        "http://u:hunter2#pw@127.0.0.1:1",
        "http://u:hunter2?pw@127.0.0.1:1",
        "http://u:hunter2/pw@127.0.0.1:1",
        "http://u:hunter2@127.0.0.1:1/\x01",
        "http://u:hunter2@127.0.0.1:1/ x",
        "http://u:hunter2@127.0.0.1:1\x00",
    ],
)
def test_an_endpoint_password_never_reaches_a_message(tmp_path, endpoint):
    with pytest.raises(ConfigError, match=r"^endpoint=") as info:
        HubCheckpointSource(REPO, download_dir=tmp_path, endpoint=endpoint)
    for text in (str(info.value), repr(info.value), repr(info.value.value)):
        assert "hunter2" not in text


@pytest.mark.parametrize("endpoint", ["https://hub.example/?x=1", "https://hub.example/#frag"])
def test_an_endpoint_with_query_or_fragment_is_refused(tmp_path, endpoint):
    with pytest.raises(ConfigError, match=r"^endpoint="):
        HubCheckpointSource(REPO, download_dir=tmp_path, endpoint=endpoint)


# -- concurrency


RESOLVE_IN_A_PROCESS = """
import sys
from fakes.hub import isolated_hf_client
from verirl.checkpoints import CheckpointResolver, HubCheckpointSource
with isolated_hf_client():
    source = HubCheckpointSource("org/run", download_dir=sys.argv[1], endpoint=sys.argv[2])
    print(CheckpointResolver([source]).resolve("latest"))
"""


def _child_env(tmp_path: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING"))}
    env["HF_HOME"] = str(tmp_path / "child-hf-home")
    env["HF_HUB_DISABLE_TELEMETRY"] = "1"
    env["TMPDIR"] = str(tmp_path / "system-tmp")
    env["PYTHONPATH"] = os.pathsep.join([str(Path(__file__).parents[1]), env.get("PYTHONPATH", "")])
    return env


def test_threads_resolving_latest_into_one_download_dir(hub, tmp_path):
    """Issue 9 item 11: four threads, one download_dir, several rounds, every one succeeds."""
    hub.add_checkpoint(REPO, "checkpoint-30", 30, size=SIZE)
    for round_ in range(5):
        download_dir = tmp_path / f"round-{round_}"
        barrier = threading.Barrier(4)
        results: list[object] = [None] * 4

        def resolve(i: int, download_dir: Path = download_dir, barrier=barrier, results=results):
            source = hub_source(hub, tmp_path, download_dir=download_dir)
            barrier.wait(timeout=60)
            try:
                results[i] = CheckpointResolver([source]).resolve("latest")
            except Exception as exc:  # noqa: BLE001 - reported below
                results[i] = exc

        threads = [threading.Thread(target=resolve, args=(i,)) for i in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=120)
        assert results == [str(download_dir / "checkpoint-30")] * 4, results
        assert snapshot(download_dir / "checkpoint-30").keys() >= {
            p.split("/", 1)[1] for p in files_under(hub, "checkpoint-30")
        }


def test_processes_resolving_latest_into_one_download_dir(hub, tmp_path):
    hub.add_checkpoint(REPO, "checkpoint-30", 30, size=SIZE)
    for round_ in range(2):
        download_dir = tmp_path / f"round-{round_}"
        # The first download is held until every process has listed the repo, so they overlap.
        hold = hub.hold(REPO, "checkpoint-30/optimizer.pt")
        hub.reset_counters()
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", RESOLVE_IN_A_PROCESS, str(download_dir), hub.endpoint],
                env=_child_env(tmp_path),
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(3)
        ]
        try:
            assert hub.wait_for_requests("/tree/", 3, timeout=120)
        finally:
            hold.release()
        outputs = [proc.communicate(timeout=120) for proc in procs]
        for proc, (out, err) in zip(procs, outputs, strict=True):
            assert proc.returncode == 0, err
            assert out.strip() == str(download_dir / "checkpoint-30")
        assert read_trainer_state(download_dir / "checkpoint-30")[0] is not None


def test_waiting_for_another_download_has_a_deadline(hub, tmp_path):
    hub.add_checkpoint(REPO, "checkpoint-30", 30)
    hold = hub.hold(REPO, "checkpoint-30/optimizer.pt")
    first = hub_source(hub, tmp_path)
    result: list[object] = []
    thread = threading.Thread(target=lambda: result.append(first.fetch(first.latest())))
    thread.start()
    try:
        assert hold.arrived.wait(60)
        second = hub_source(hub, tmp_path, lock_timeout=0.2)
        with pytest.raises(CheckpointSourceError, match=r"another download of checkpoint-30"):
            second.fetch(second.latest())
    finally:
        hold.release()
        thread.join(timeout=60)
    assert result == [tmp_path / "hub-download" / "checkpoint-30"]


# -- ~ expansion


def test_tilde_is_expanded_for_local_roots_and_download_dirs(hub, tmp_path, monkeypatch):
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(tmp_path)
    make_checkpoint(home / "run", "checkpoint-5")
    local = LocalCheckpointSource("~/run")
    assert local.root == home / "run"
    assert local.latest().step == 5
    hub.add_checkpoint(REPO, "checkpoint-30", 30)
    source = HubCheckpointSource(REPO, download_dir="~/dl", endpoint=hub.endpoint)
    assert source.download_dir == home / "dl"
    assert CheckpointResolver([local, source]).resolve("latest") == str(home / "dl/checkpoint-30")
    assert not (tmp_path / "~").exists()
    assert CheckpointResolver([]).resolve("~/run/checkpoint-5") == str(home / "run/checkpoint-5")


def test_an_unknown_user_in_a_tilde_path_is_a_clear_error(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    user = "~verirl-no-such-user-x"
    with pytest.raises(CheckpointNotFoundError):
        CheckpointResolver([]).resolve(f"{user}/x")
    with pytest.raises(ConfigError, match=r"^root="):
        LocalCheckpointSource(f"{user}/run")
    with pytest.raises(ConfigError, match=r"^download_dir="):
        HubCheckpointSource(REPO, download_dir=f"{user}/dl")


# -- hostile trainer_state.json and bad arguments


def test_a_deeply_nested_trainer_state_is_incomplete_not_a_crash(tmp_path, caplog):
    make_checkpoint(tmp_path, "checkpoint-10")
    make_checkpoint(tmp_path, "checkpoint-20", raw=b"[" * 100_000)
    assert CheckpointResolver([LocalCheckpointSource(tmp_path)]).resolve("latest") == str(
        tmp_path / "checkpoint-10"
    )
    assert "nested too deeply" in warnings_of(caplog)


def test_a_fifo_named_trainer_state_does_not_hang_and_is_no_interrupted_save(tmp_path):
    make_checkpoint(tmp_path, "checkpoint-10")
    folder = make_checkpoint(tmp_path, "checkpoint-20", state=None)
    os.mkfifo(folder / "trainer_state.json")
    with pytest.raises(CheckpointSourceError, match="not a regular file"):
        LocalCheckpointSource(tmp_path).latest()


def test_a_huge_trainer_state_is_not_read_into_memory_nor_skipped(tmp_path):
    make_checkpoint(tmp_path, "checkpoint-10")
    folder = make_checkpoint(tmp_path, "checkpoint-20", state=None)
    with (folder / "trainer_state.json").open("wb") as f:
        f.truncate(10 * 1024**3)  # sparse: 10 GiB that take no disk
    with pytest.raises(CheckpointSourceError, match="too large"):
        LocalCheckpointSource(tmp_path).latest()


@pytest.mark.parametrize("request_", ["auto", "latest"])
def test_a_huge_last_checkpoint_state_on_the_hub_is_unreadable_never_skipped(
    hub, tmp_path, request_
):
    """Not downloaded, and not an interrupted save: an older checkpoint must not stand in."""
    from verirl.checkpoints import MAX_TRAINER_STATE_BYTES

    hub.add_checkpoint(REPO, "checkpoint-10", 10)
    hub.add_checkpoint(REPO, "last-checkpoint", 99)
    huge = b" " * MAX_TRAINER_STATE_BYTES + b"{}"
    hub.add_file(REPO, "last-checkpoint/trainer_state.json", huge)
    hub.reset_counters()
    resolver = CheckpointResolver([hub_source(hub, tmp_path)])
    with pytest.raises(CheckpointSourceError, match=r"last-checkpoint.*too large") as caught:
        resolver.resolve(request_)
    assert "neither skipped nor resumed from" in str(caught.value)
    assert hub.downloads == []


@pytest.mark.parametrize("request_", [5, 1.5, b"/x", ["latest"], object()])
def test_resolve_of_a_non_path_is_a_config_error(request_):
    with pytest.raises(ConfigError, match=r"^request="):
        CheckpointResolver([]).resolve(request_)  # type: ignore[arg-type]


@pytest.mark.parametrize("sources", [None, "abc", 5, b"x"])
def test_resolver_sources_must_be_a_collection_of_sources(sources):
    with pytest.raises(ConfigError, match=r"^sources"):
        CheckpointResolver(sources)  # type: ignore[arg-type]


def test_resolve_from_env_needs_a_mapping():
    with pytest.raises(ConfigError, match=r"^environ="):
        CheckpointResolver([]).resolve_from_env(5)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match=rf"^{RESUME_ENV_VAR}=5"):
        CheckpointResolver([]).resolve_from_env({RESUME_ENV_VAR: 5})  # type: ignore[dict-item]


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"repo_id": None}, "repo_id"),
        ({"repo_id": b"org/run"}, "repo_id"),
        ({"revision": 5}, "revision"),
        ({"endpoint": 5}, "endpoint"),
        ({"timeout": float("inf")}, "timeout"),
        ({"timeout": float("nan")}, "timeout"),
        ({"timeout": "5"}, "timeout"),
        ({"timeout": 1e30}, "timeout"),
        ({"lock_timeout": -1}, "lock_timeout"),
        ({"max_workers": "2"}, "max_workers"),
        ({"max_workers": 2.0}, "max_workers"),
        ({"download_dir": None}, "download_dir"),
        ({"download_dir": 5}, "download_dir"),
        ({"download_dir": "a\x00b"}, "download_dir"),
        ({"download_dir": "x" * 5000}, "download_dir"),
        ({"download_dir": b"/tmp/x"}, "download_dir"),
    ],
)
def test_hub_source_rejects_bad_values_with_config_errors(tmp_path, kwargs, field):
    kwargs = {"repo_id": REPO, "download_dir": tmp_path, **kwargs}
    repo_id = kwargs.pop("repo_id")
    with pytest.raises(ConfigError, match=rf"^{field}="):
        HubCheckpointSource(repo_id, **kwargs)


@pytest.mark.parametrize("root", [None, 5, "", "a\x00b", "x" * 5000, b"/tmp"])
def test_local_source_rejects_bad_roots(root):
    with pytest.raises(ConfigError, match=r"^root="):
        LocalCheckpointSource(root)  # type: ignore[arg-type]


@pytest.mark.parametrize("request_", ["a\x00b", "x" * 5000, "/" + "x/" * 3000])
def test_explicit_paths_the_os_refuses_are_not_found(request_):
    with pytest.raises(CheckpointNotFoundError):
        CheckpointResolver([]).resolve(request_)


# -- every network call has a deadline


def test_a_stalled_tree_listing_times_out(hub, tmp_path):
    hub.add_checkpoint(REPO, "checkpoint-30", 30)
    hold = hub.hold_listing(REPO)
    try:
        source = hub_source(hub, tmp_path, timeout=0.3)
        with pytest.raises(CheckpointSourceError, match=rf"cannot list hub:{REPO}.*Timeout"):
            source.latest()
        assert hold.arrived.is_set()
    finally:
        hold.release()
    assert hub_source(hub, tmp_path).latest().step == 30


def test_a_tree_listing_that_trickles_ends_within_the_timeout(hub, tmp_path):
    # each read gets a byte in time: only a deadline on the whole page ends it
    hub.add_checkpoint(REPO, "checkpoint-30", 30)
    hold = hub.hold_listing(REPO, trickle=0.05)
    try:
        source = hub_source(hub, tmp_path, timeout=0.5)
        started = time.monotonic()
        with pytest.raises(CheckpointSourceError, match=rf"cannot list hub:{REPO}.*within 0.5s"):
            source.latest()
        took = time.monotonic() - started
        assert hold.arrived.is_set()
    finally:
        hold.release()
    assert took < 30  # the page's bytes would take minutes at this pace
    assert hub_source(hub, tmp_path).latest().step == 30


@pytest.mark.parametrize(
    "bad",
    [
        "checkpoint-40/../../escaped.txt",
        "checkpoint-40/./x",
        "checkpoint-40/a//b",
        "checkpoint-40/..\\..\\x",
        "checkpoint-40/.verirl-download.json",
        "checkpoint-40/c:evil",  # huggingface_hub refuses a drive part on every system
        "checkpoint-40/sub/D:x",
        "checkpoint-40/" + "a" * 250,  # its .metadata record would be over the name limit
    ],
)
def test_a_listing_with_unsafe_paths_makes_that_folder_unusable(hub, tmp_path, bad):
    """Unusable, and maybe the newest: an error, not a resume from checkpoint-30 over it."""
    hub.add_checkpoint(REPO, "checkpoint-30", 30)
    hub.add_checkpoint(REPO, "checkpoint-40", 40)
    hub.add_file(REPO, bad, b"written wherever the path points")
    source = hub_source(hub, tmp_path)
    with pytest.raises(CheckpointSourceError, match=r"cannot use checkpoint-40 in hub:.*not safe"):
        source.latest()
    with pytest.raises(CheckpointSourceError, match="checkpoint-40 is not"):
        source.fetch(Checkpoint(40, "checkpoint-40", source.description))
    assert not (tmp_path / "escaped.txt").exists()


@given(
    st.lists(
        st.text(alphabet="ab:\\/.C ", min_size=1, max_size=6) | st.just("a" * 250),
        min_size=1,
        max_size=3,
    )
)
def test_every_path_huggingface_hub_refuses_to_download_is_unsafe(parts):
    """Contract: a name huggingface_hub's own check refuses is never handed to it."""
    from huggingface_hub._local_folder import _validate_relative_filename

    from verirl.checkpoints.hub_listing import _safe_repo_path

    path = "checkpoint-40/" + "/".join(parts)
    try:
        _validate_relative_filename(path)
    except ValueError:
        assert not _safe_repo_path(path), path


# -- 'auto': the same request for the first attempt and every retry


@pytest.mark.parametrize("request_", ["auto", " auto\n"])
def test_auto_is_the_newest_checkpoint_when_there_is_one(request_):
    a = FakeCheckpointSource(steps=[10], description="a", root="/a")
    b = FakeCheckpointSource(steps=[30], description="b", root="/b")
    assert CheckpointResolver([a, b]).resolve(request_) == "/b/checkpoint-30"
    assert b.fetched == [b.checkpoint(30)]


def test_auto_with_no_checkpoint_anywhere_is_a_fresh_start_logged_with_the_places(caplog):
    sources = [
        FakeCheckpointSource(description="local:/x/out"),
        FakeCheckpointSource(description="hub:o/r@main"),
    ]
    assert CheckpointResolver(sources).resolve("auto") is None
    assert (
        "'auto': no complete checkpoint yet, starting fresh; searched: local:/x/out, hub:o/r@main"
        in warnings_of(caplog)
    )


def test_auto_skips_an_incomplete_checkpoint_and_leaves_it(tmp_path):
    make_checkpoint(tmp_path, "checkpoint-1")
    torn = tmp_path / "checkpoint-2"
    torn.mkdir()
    (torn / "model.safetensors").write_bytes(b"half")
    resolver = CheckpointResolver([LocalCheckpointSource(tmp_path)])
    assert resolver.resolve("auto") == str(tmp_path / "checkpoint-1")
    assert [p.name for p in torn.iterdir()] == ["model.safetensors"]
    assert (torn / "model.safetensors").read_bytes() == b"half"


def test_auto_with_a_failing_source_and_nothing_elsewhere_is_an_error_not_a_fresh_start():
    """The Hub down is not "no checkpoint": a fresh start would throw the run away."""
    cause = ConnectionRefusedError(111, "refused")
    wrapped = CheckpointSourceError("cannot list hub:o/r@main: refused")
    wrapped.__cause__ = cause
    sources = [
        FakeCheckpointSource(description="local"),
        FakeCheckpointSource(description="hub", error=wrapped),
    ]
    with pytest.raises(CheckpointSourceError) as info:
        CheckpointResolver(sources).resolve("auto")
    assert info.value.__cause__ is cause
    assert "no checkpoint for 'auto'" in str(info.value)


def test_auto_with_a_failing_source_uses_another_sources_checkpoint(caplog):
    broken = FakeCheckpointSource(description="broken", error=CheckpointSourceError("hub down"))
    ok = FakeCheckpointSource(steps=[5], description="ok")
    assert CheckpointResolver([broken, ok]).resolve("auto") == "/fake/checkpoint-5"
    assert "broken" in warnings_of(caplog)


def test_auto_with_no_source_is_a_config_error_naming_the_request_or_the_variable():
    with pytest.raises(ConfigError, match=r"^request='auto': 'auto' needs somewhere to look"):
        CheckpointResolver([]).resolve("auto")
    with pytest.raises(ConfigError) as info:
        CheckpointResolver([]).resolve_from_env({"VERIRL_RESUME_FROM_CHECKPOINT": "auto"})
    assert info.value.field == "VERIRL_RESUME_FROM_CHECKPOINT"
    assert str(info.value).startswith("VERIRL_RESUME_FROM_CHECKPOINT='auto': ")


def test_auto_takes_a_hub_repo_that_does_not_exist_yet_for_an_empty_one(hub, tmp_path, caplog):
    """The first attempt of a job whose Trainer creates the repo when it first pushes."""
    missing = _break("404", hub, tmp_path)
    resolver = CheckpointResolver([LocalCheckpointSource(tmp_path / "out"), missing])
    assert resolver.resolve("auto") is None
    warned = warnings_of(caplog)
    assert f"'auto': hub:org/missing@main via {hub.endpoint} does not exist yet" in warned
    assert "starting fresh" in warned
    with pytest.raises(CheckpointSourceError, match="repository not found"):
        resolver.resolve("latest")  # latest stays strict


@pytest.mark.parametrize("kind", ["401 no token", "401 wrong token", "unreachable"])
def test_auto_never_takes_an_unreadable_hub_repo_for_an_empty_one(hub, tmp_path, kind):
    """Without a token the Hub answers 401 for a private repo and a missing one alike."""
    source = _break(kind, hub, tmp_path)
    resolver = CheckpointResolver([LocalCheckpointSource(tmp_path / "out"), source])
    with pytest.raises(CheckpointSourceError) as info:
        resolver.resolve("auto")
    assert not info.value.repo_missing


def test_a_tie_that_fails_after_an_unreadable_checkpoint_never_lets_an_older_one_in():
    """Step 10 is refused for good; the other step 10 fails to download: step 9 would overwrite."""
    refused = CheckpointSourceError("refused", checkpoint_unreadable=True)
    unreadable = FakeCheckpointSource(steps=[10], description="a", fetch_error=refused)
    away = FakeCheckpointSource(
        steps=[10], description="b", fetch_error=CheckpointSourceError("the Hub is away")
    )
    older = FakeCheckpointSource(steps=[9], description="c")
    with pytest.raises(CheckpointSourceError) as err:
        CheckpointResolver([unreadable, away, older]).resolve("latest")
    assert err.value is refused or err.value.__cause__ is refused
    assert older.fetched == []

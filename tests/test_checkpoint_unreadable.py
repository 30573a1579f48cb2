"""Issue 26, class 2: a checkpoint verirl cannot read is an error, never "no checkpoint".

An interrupted save leaves a folder without ``trainer_state.json``, with a
torn one, or with transformers' ``checkpoint-is-incomplete.txt``: incomplete,
skipped with a warning (``tests/test_checkpoints.py``). A file or folder that
is there but cannot be read (an I/O or permission error, a directory, FIFO or
symlink loop where a file belongs, a symlink that leads nowhere) says nothing
about the save: skipping it under ``auto`` would turn a resumable job into a
fresh start that overwrites it. It is a `CheckpointSourceError` (exit 5)
everywhere a source reads: the local source and its root, an explicit path,
the Hub's ``last-checkpoint`` probe, the download folder, the node records.

As root, permissions stop no read: the errors are made with real file kinds,
or injected into the `os` module of the one verirl module under test (its OS
layer), never into verirl's logic.
"""

from __future__ import annotations

import errno
import json
import os
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType

import pytest

import verirl._fs
import verirl.checkpoints.download_dir
from _checkpoint_support import (
    REPO,
    isolated_hub,
    make_checkpoint,
    snapshot,
    unencodable,
)
from _support import clean_environ
from verirl import (
    CheckpointResolver,
    CheckpointSourceError,
    HubCheckpointSource,
    LocalCheckpointSource,
)
from verirl.checkpoints.node_share import NodeSharedResolver
from verirl.cli import main


class InjectedOS(ModuleType):
    """The `os` module, but ``open`` fails with ``errno`` for the paths ``fails`` picks."""

    def __init__(self, fails: Callable[[str], bool], code: int) -> None:
        super().__init__("os")
        self._fails = fails
        self._code = code

    def __getattr__(self, name: str) -> object:
        return getattr(os, name)

    def open(self, path: object, flags: int, mode: int = 0o777, **kwargs: object) -> int:
        text = os.fspath(path)  # type: ignore[arg-type]
        if self._fails(text):
            raise OSError(self._code, os.strerror(self._code), text)
        return os.open(text, flags, mode, **kwargs)  # type: ignore[arg-type]


def inject_read_error(
    monkeypatch: pytest.MonkeyPatch, fails: Callable[[str], bool], code: int = errno.EIO
) -> None:
    """Make verirl's file reads (`verirl._fs`) fail with ``code`` for the paths ``fails`` picks."""
    monkeypatch.setattr(verirl._fs, "os", InjectedOS(fails, code))


def _state_dir(folder: Path, _monkeypatch: pytest.MonkeyPatch) -> None:
    (folder / "trainer_state.json").mkdir()


def _state_fifo(folder: Path, _monkeypatch: pytest.MonkeyPatch) -> None:
    os.mkfifo(folder / "trainer_state.json")


def _state_loop(folder: Path, _monkeypatch: pytest.MonkeyPatch) -> None:
    (folder / "trainer_state.json").symlink_to("trainer_state.json")


def _state_dangling(folder: Path, _monkeypatch: pytest.MonkeyPatch) -> None:
    (folder / "trainer_state.json").symlink_to(folder.parent / "unmounted" / "state.json")


def _state_eio(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": 20}))
    inject_read_error(monkeypatch, lambda path: path.startswith(str(folder)))


def _state_eacces(folder: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": 20}))
    inject_read_error(monkeypatch, lambda path: path.startswith(str(folder)), errno.EACCES)


UNREADABLE_STATES = {
    "state-is-a-directory": _state_dir,
    "state-is-a-fifo": _state_fifo,
    "state-is-a-symlink-loop": _state_loop,
    "state-is-a-symlink-to-nothing": _state_dangling,
    "state-read-EIO": _state_eio,
    "state-read-EACCES": _state_eacces,
}


def _folder_loop(root: Path) -> None:
    (root / "checkpoint-20").symlink_to("checkpoint-20")


def _folder_dangling(root: Path) -> None:
    (root / "checkpoint-20").symlink_to(root.parent / "unmounted-volume" / "checkpoint-20")


UNREADABLE_FOLDERS = {
    "folder-is-a-symlink-loop": _folder_loop,
    "folder-is-a-symlink-to-nothing": _folder_dangling,
}


@pytest.fixture
def clean_env(monkeypatch):
    for name in list(os.environ):
        if name.startswith("VERIRL_") or name == "HF_TOKEN":
            monkeypatch.delenv(name)


def _unreadable_root(tmp_path: Path, monkeypatch, make: str) -> Path:
    root = tmp_path / "out"
    make_checkpoint(root, "checkpoint-10")
    if make in UNREADABLE_FOLDERS:
        UNREADABLE_FOLDERS[make](root)
    else:
        UNREADABLE_STATES[make](make_checkpoint(root, "checkpoint-20", state=None), monkeypatch)
    return root


# ---------------------------------------------------------------- the local source


@pytest.mark.parametrize("make", [*UNREADABLE_STATES, *UNREADABLE_FOLDERS])
def test_an_unreadable_newest_checkpoint_is_a_source_error_never_skipped(
    tmp_path, monkeypatch, clean_env, capsys, make
):
    root = _unreadable_root(tmp_path, monkeypatch, make)
    before = snapshot(root)
    source = LocalCheckpointSource(root)
    with pytest.raises(CheckpointSourceError, match="checkpoint-20") as info:
        source.latest()
    assert "cannot read" in str(info.value)
    assert unencodable([str(info.value)]) == []
    for request in ("auto", "latest"):  # auto must not become a fresh start, nor latest step 10
        with pytest.raises(CheckpointSourceError, match="checkpoint-20"):
            CheckpointResolver([source]).resolve(request)
    assert main(["resume", "--output-dir", str(root), "--resume", "auto"]) == 5
    assert "checkpoint-20" in capsys.readouterr().err
    assert snapshot(root) == before  # nothing touched


@pytest.mark.parametrize("make", list(UNREADABLE_STATES))
def test_an_explicit_path_whose_state_cannot_be_read_is_an_error(tmp_path, monkeypatch, make):
    folder = make_checkpoint(tmp_path, "checkpoint-20", state=None)
    UNREADABLE_STATES[make](folder, monkeypatch)
    with pytest.raises(CheckpointSourceError, match="cannot read"):
        CheckpointResolver([]).resolve(str(folder))


def test_an_older_unreadable_checkpoint_is_never_read(tmp_path):
    """Only what is newer than the checkpoint chosen can hide a newer one."""
    make_checkpoint(tmp_path, "checkpoint-30")
    (make_checkpoint(tmp_path, "checkpoint-10", state=None) / "trainer_state.json").mkdir()
    assert LocalCheckpointSource(tmp_path).latest().step == 30


@pytest.mark.parametrize("depth", [0, 1], ids=["root", "a-folder-above-it"])
def test_a_root_behind_a_symlink_to_nothing_is_an_error_not_a_first_run(
    tmp_path, clean_env, capsys, depth
):
    """``output_dir`` on a volume that is not mounted: not "no checkpoints yet"."""
    link = tmp_path / "ckpt"
    link.symlink_to(tmp_path / "volume-not-mounted")
    root = link if depth == 0 else link / "run-1"
    source = LocalCheckpointSource(root)
    with pytest.raises(CheckpointSourceError, match="ckpt"):
        source.latest()
    with pytest.raises(CheckpointSourceError):
        CheckpointResolver([source]).resolve("auto")
    assert main(["resume", "--output-dir", str(root), "--resume", "auto"]) == 5
    assert LocalCheckpointSource(tmp_path / "first-run").latest() is None  # a missing one is fine


def test_a_root_whose_parent_cannot_be_searched_is_a_source_error(tmp_path):
    """``stat`` of the root is EACCES (a real one: root without DAC override): exit 5, not 2."""
    locked = tmp_path / "locked"
    root = locked / "out"
    make_checkpoint(root, "checkpoint-7")
    locked.chmod(0o700)
    os.chown(locked, 65534, 65534)  # nobody's
    without_override = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search"]
    try:
        done = subprocess.run(
            [*without_override, sys.executable, "-m", "verirl", "resume", "--output-dir",
             str(root), "--resume", "auto"],
            capture_output=True, text=True, timeout=120, check=False,
            env={**clean_environ(tmp_path), "PYTHONPATH": os.pathsep.join(sys.path)},
        )  # fmt: skip
    finally:
        os.chown(locked, os.getuid(), os.getgid())
        locked.chmod(0o755)
    assert done.returncode == 5, done.stderr
    assert "Permission denied" in done.stderr
    assert "cannot read" in done.stderr  # the source error, not "--output-dir=…: cannot be used"


# ---------------------------------------------------------------- the Hub source


@pytest.fixture
def hub(tmp_path, monkeypatch):
    with isolated_hub(tmp_path, monkeypatch) as fake:
        yield fake


def test_an_unreadable_last_checkpoint_probe_is_a_source_error(hub, tmp_path, monkeypatch):
    hub.add_checkpoint(REPO, "checkpoint-10", 10)
    hub.add_checkpoint(REPO, "last-checkpoint", 20)
    inject_read_error(monkeypatch, lambda path: path.endswith("last-checkpoint/trainer_state.json"))
    source = HubCheckpointSource(REPO, download_dir=tmp_path / "dl", endpoint=hub.endpoint)
    with pytest.raises(CheckpointSourceError, match=r"last-checkpoint/trainer_state\.json"):
        source.latest()
    with pytest.raises(CheckpointSourceError):
        CheckpointResolver([source]).resolve("auto")


def _downloaded(hub, tmp_path: Path) -> tuple[HubCheckpointSource, Path]:
    hub.add_checkpoint(REPO, "checkpoint-20", 20)
    source = HubCheckpointSource(REPO, download_dir=tmp_path / "dl", endpoint=hub.endpoint)
    folder = Path(CheckpointResolver([source]).resolve("latest"))
    assert folder == tmp_path / "dl" / "checkpoint-20"
    return source, folder


def test_an_unreadable_state_in_a_download_is_an_error_not_replaced(hub, tmp_path, monkeypatch):
    source, folder = _downloaded(hub, tmp_path)
    before = snapshot(folder)
    state = str(folder / "trainer_state.json")
    inject_read_error(monkeypatch, lambda path: path == state)
    with pytest.raises(CheckpointSourceError, match="cannot read"):
        CheckpointResolver([source]).resolve("latest")
    assert snapshot(folder) == before


def test_an_unreadable_download_marker_is_an_error(hub, tmp_path):
    _, folder = _downloaded(hub, tmp_path)
    hub.add_file(REPO, "checkpoint-20/model.safetensors", b"a newer commit")
    marker = folder / ".verirl-download.json"
    marker.unlink()
    marker.mkdir()
    before = snapshot(folder)
    fresh = HubCheckpointSource(REPO, download_dir=tmp_path / "dl", endpoint=hub.endpoint)
    with pytest.raises(CheckpointSourceError, match="cannot read"):
        CheckpointResolver([fresh]).resolve("latest")
    assert snapshot(folder) == before


class UnlistableWalk(ModuleType):
    """The `os` module, but `os.walk` cannot list folders named ``name`` (EIO)."""

    def __init__(self, name: str) -> None:
        super().__init__("os")
        self._name = name

    def __getattr__(self, attr: str) -> object:
        return getattr(os, attr)

    def walk(
        self,
        top: str | os.PathLike[str],
        topdown: bool = True,
        onerror: Callable[[OSError], object] | None = None,
        followlinks: bool = False,
    ) -> Iterator[tuple[str, list[str], list[str]]]:
        for dirpath, dirnames, filenames in os.walk(top, topdown, None, followlinks):
            if Path(dirpath).name == self._name:  # as os.walk does when scandir fails
                if onerror is not None:
                    onerror(OSError(errno.EIO, os.strerror(errno.EIO), dirpath))
                dirnames[:] = []
                continue
            yield dirpath, dirnames, filenames


def test_a_download_with_a_folder_that_cannot_be_listed_is_never_replaced(
    hub, tmp_path, monkeypatch
):
    """What cannot be listed may be the user's: an outdated download holding it stays."""
    _, folder = _downloaded(hub, tmp_path)
    (folder / "notes").mkdir()
    (folder / "notes" / "mine.txt").write_text("the user's")
    hub.add_file(REPO, "checkpoint-20/model.safetensors", b"a newer commit")
    monkeypatch.setattr(verirl.checkpoints.download_dir, "os", UnlistableWalk("notes"))
    fresh = HubCheckpointSource(REPO, download_dir=tmp_path / "dl", endpoint=hub.endpoint)
    with pytest.raises(CheckpointSourceError, match="notes"):
        CheckpointResolver([fresh]).resolve("latest")
    assert (folder / "notes" / "mine.txt").read_text() == "the user's"


# ---------------------------------------------------------------- the node records


class Never:
    """A leader's resolver that must not be reached."""

    def resolve(self, _request: str | None) -> str | None:
        raise AssertionError


@pytest.mark.parametrize("kind", ["directory", "fifo", "symlink-to-nothing"])
@pytest.mark.parametrize("suffix", [".json", ".claim"])
def test_an_unreadable_node_record_is_an_error_at_once(tmp_path, suffix, kind):
    path = tmp_path / f".verirl-node-k{suffix}"
    if kind == "directory":
        path.mkdir()
    elif kind == "fifo":
        os.mkfifo(path)
    else:
        path.symlink_to(tmp_path / "nowhere")
    follower = NodeSharedResolver(Never(), tmp_path, "k", leader=False, timeout=60)
    done = threading.Event()
    outcome: list[BaseException | None] = []

    def follow() -> None:
        try:
            follower.resolve("latest")
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 - reported below
            outcome.append(exc)
        done.set()

    threading.Thread(target=follow, daemon=True).start()
    assert done.wait(timeout=20), "the follower kept waiting on a record it cannot read"
    (error,) = outcome
    assert isinstance(error, CheckpointSourceError)
    assert "cannot read" in str(error)


@pytest.mark.parametrize("make", [*UNREADABLE_STATES, *UNREADABLE_FOLDERS])
def test_an_unreadable_local_checkpoint_is_never_passed_over_for_an_older_one_on_the_hub(
    hub, tmp_path, monkeypatch, clean_env, make
):
    """The local step 20 cannot be read, the Hub has step 5: resuming step 5 would overwrite
    the run's newer checkpoints, so it is a source error under auto and latest alike."""
    root = _unreadable_root(tmp_path, monkeypatch, make)
    before = snapshot(root)
    hub.add_checkpoint(REPO, "checkpoint-5", 5)
    hub_source = HubCheckpointSource(REPO, download_dir=tmp_path / "dl", endpoint=hub.endpoint)
    resolver = CheckpointResolver([LocalCheckpointSource(root), hub_source])
    for request in ("auto", "latest"):
        with pytest.raises(CheckpointSourceError, match="may hold a newer checkpoint") as info:
            resolver.resolve(request)
        assert "checkpoint-20" in str(info.value)
    assert not (tmp_path / "dl" / "checkpoint-5").exists()  # nothing fetched
    assert snapshot(root) == before

"""Helpers for the checkpoint sweeps (issue 26): folders, a fake Hub kept off everything, names.

Shared by ``test_checkpoint_paths.py``, ``test_checkpoint_unreadable.py`` and
``test_checkpoint_untrusted.py``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
from huggingface_hub import constants
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st

from fakes.hub import FakeHub, serve_fake_hub

REPO = "org/run"
RESUME_ENV_VAR = "VERIRL_RESUME_FROM_CHECKPOINT"

SWEEP = settings(
    max_examples=40,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
"""Few examples (the machine is shared), derandomized: a failure reproduces on every run."""


def make_checkpoint(root: Path, name: str, state: object = "default") -> Path:
    """A Trainer-like folder; ``state=None`` leaves trainer_state.json out (interrupted save)."""
    folder = root / name
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(b"weights")
    if state == "default":
        step = int(name.rsplit("-", 1)[1]) if name.rsplit("-", 1)[-1].isdigit() else 0
        (folder / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    elif state is not None:
        (folder / "trainer_state.json").write_text(json.dumps(state))
    return folder


def snapshot(folder: Path) -> dict[str, object]:
    """What is under ``folder`` (nothing followed): kinds, bytes, mtimes; to prove it untouched."""
    found: dict[str, object] = {}
    for dirpath, dirnames, filenames in os.walk(folder):
        for name in [*dirnames, *filenames]:
            path = Path(dirpath) / name
            info = path.lstat()
            body = path.read_bytes() if path.is_file() and not path.is_symlink() else None
            link = os.fspath(path.readlink()) if path.is_symlink() else None
            found[os.fspath(path.relative_to(folder))] = (
                info.st_mode,
                body,
                link,
                info.st_mtime_ns,
            )
    return found


def fresh_dir(parent: Path) -> Path:
    """A new empty directory under ``parent`` (one per hypothesis example)."""
    return Path(tempfile.mkdtemp(dir=parent))


def unencodable(texts: list[str]) -> list[str]:
    """Those of ``texts`` a UTF-8 log file, terminal or message could not hold."""
    bad = []
    for text in texts:
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            bad.append(text)
    return bad


def log_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    """verirl's log lines (huggingface_hub's and filelock's are not ours to check)."""
    return [r.getMessage() for r in caplog.records if r.name.split(".")[0] == "verirl"]


def warnings_of(caplog: pytest.LogCaptureFixture) -> str:
    return "\n".join(r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)


# Names as the OS hands them over: any bytes but "/" and NUL, decoded the way
# Python decodes file names (bytes that are not UTF-8 become surrogates).
_RAW_NAME = (
    st.binary(min_size=1, max_size=12)
    .filter(lambda raw: b"/" not in raw and b"\0" not in raw and raw not in (b".", b".."))
    .map(os.fsdecode)
)
NOT_UTF8_NAMES = _RAW_NAME.filter(lambda name: bool(unencodable([name])))
"""File names whose bytes are not UTF-8 (``os.fsdecode(b"\\xff")``)."""
NAMES = st.one_of(NOT_UTF8_NAMES, _RAW_NAME, st.sampled_from(["latest", "auto", "last-checkpoint"]))


class TextPath:
    """A minimal `os.PathLike` that is not a `pathlib.Path` (what third-party path types are)."""

    def __init__(self, path: object) -> None:
        self.path = path

    def __fspath__(self) -> object:
        return self.path

    def __repr__(self) -> str:
        return f"TextPath({self.path!r})"


def _threads() -> set[threading.Thread]:
    # tqdm's monitor is a process-wide helper tqdm keeps for huggingface_hub's progress bars.
    return {t for t in threading.enumerate() if t.name != "tqdm_monitor"}


@contextlib.contextmanager
def isolated_hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeHub]:
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

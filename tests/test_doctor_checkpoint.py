"""``verirl doctor`` ends on the checkpoint launch would end on, where the disk alone decides.

An explicit path that is no checkpoint folder, ``latest`` with only local
sources and no complete checkpoint in them, a local checkpoint that cannot be
read: launch exits 5 (`EXIT_CHECKPOINT`) on each, and doctor, its preflight,
must too, with launch's own message. ``auto`` with nothing found is a fresh
start for both. Doctor reads in place: it creates and downloads nothing, and
with a Hub source it asks the Hub nothing (launch alone does).

Both commands run through the real command line (`verirl.cli.main`, ``--json``).
"""

from __future__ import annotations

import json
import os
import sys

import pytest

from _checkpoint_support import make_checkpoint, snapshot
from _support import unshared_port, while_the_group_port_is_free
from verirl import find_free_port
from verirl.cli import main
from verirl.cli.codes import EXIT_CHECKPOINT

RESUME = "VERIRL_RESUME_FROM_CHECKPOINT"
PREFIX = "checkpoint: "


@pytest.fixture
def clean_env(monkeypatch, tmp_path):
    for name in list(os.environ):
        if name.startswith(("VERIRL_", "HF_")) or name in (
            "CUDA_VISIBLE_DEVICES",
            "HUGGING_FACE_HUB_TOKEN",
        ):
            monkeypatch.delenv(name)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # nothing here may reach a Hub
    monkeypatch.chdir(tmp_path)  # a relative path is resolved where both commands run


@pytest.fixture
def colocate(clean_env, monkeypatch):
    """One GPU: colocate mode, so no server starts and only the checkpoint can fail."""
    monkeypatch.setenv("VERIRL_GPU_COUNT", "1")


def run(capfd, command: str, *argv: str) -> tuple[int, dict[str, object]]:
    code = main([command, "--json", *argv])
    out = capfd.readouterr().out  # launch --json moves descriptor 1 aside: read the descriptors
    return code, json.loads(out)


def doctor(capfd) -> tuple[int, str | None]:
    """Doctor's exit code, and its checkpoint problem without the row's prefix (None if none)."""
    code, document = run(capfd, "doctor")
    error = document.get("error")
    if not isinstance(error, dict):
        return code, None
    assert error["code"] == code
    found = [part for part in str(error["message"]).split("; ") if part.startswith(PREFIX)]
    if not found:
        return code, None
    return code, str(error["message"])[str(error["message"]).index(PREFIX) + len(PREFIX) :]


def launch(capfd) -> tuple[int, str | None]:
    """Launch's exit code (its command exits 0), and its error message (None if none)."""
    code, document = run(capfd, "launch", "--", sys.executable, "-c", "pass")
    assert document["exit_code"] == code
    error = document.get("error")
    return code, str(error["message"]) if isinstance(error, dict) else None


def assert_doctor_says_what_launch_says(capfd, code: int) -> str | None:
    doctor_code, doctor_message = while_the_group_port_is_free(lambda: doctor(capfd))
    launch_code, launch_message = launch(capfd)
    assert (doctor_code, doctor_message) == (launch_code, launch_message)
    assert doctor_code == code
    return doctor_message


def test_a_missing_explicit_path_is_exit_5_in_launch_s_words(capfd, colocate, monkeypatch):
    monkeypatch.setenv(RESUME, "/nonexistent/verirl-checkpoint")
    message = assert_doctor_says_what_launch_says(capfd, EXIT_CHECKPOINT)
    assert message is not None
    assert "/nonexistent/verirl-checkpoint does not exist" in message


def test_a_missing_relative_path_is_exit_5(capfd, colocate, monkeypatch, tmp_path):
    monkeypatch.setenv(RESUME, "out/checkpoint-7")
    message = assert_doctor_says_what_launch_says(capfd, EXIT_CHECKPOINT)
    assert message is not None
    assert f"{tmp_path}/out/checkpoint-7 does not exist" in message


def test_an_explicit_path_that_is_a_file_is_exit_5(capfd, colocate, monkeypatch, tmp_path):
    (tmp_path / "weights.bin").write_bytes(b"not a folder")
    monkeypatch.setenv(RESUME, str(tmp_path / "weights.bin"))
    message = assert_doctor_says_what_launch_says(capfd, EXIT_CHECKPOINT)
    assert message is not None
    assert "is not a directory" in message


def test_an_explicit_checkpoint_that_cannot_be_read_is_exit_5(
    capfd, colocate, monkeypatch, tmp_path
):
    folder = make_checkpoint(tmp_path, "checkpoint-4", state=None)
    (folder / "trainer_state.json").mkdir()  # an I/O error where the state should be
    monkeypatch.setenv(RESUME, str(folder))
    assert assert_doctor_says_what_launch_says(capfd, EXIT_CHECKPOINT) is not None


@pytest.mark.parametrize("request_", ["latest", "last-checkpoint"])
def test_latest_in_an_empty_output_dir_is_exit_5(capfd, colocate, monkeypatch, tmp_path, request_):
    out = tmp_path / "out"
    out.mkdir()
    monkeypatch.setenv("VERIRL_OUTPUT_DIR", str(out))
    monkeypatch.setenv(RESUME, request_)
    message = assert_doctor_says_what_launch_says(capfd, EXIT_CHECKPOINT)
    assert message == f"no complete checkpoint for {RESUME}={request_!r}; searched: local:{out}"


def test_latest_in_a_missing_output_dir_is_exit_5_and_creates_nothing(
    capfd, colocate, monkeypatch, tmp_path
):
    out = tmp_path / "not-yet"
    monkeypatch.setenv("VERIRL_OUTPUT_DIR", str(out))
    monkeypatch.setenv(RESUME, "latest")
    assert doctor(capfd)[0] == EXIT_CHECKPOINT
    assert not out.exists()  # doctor made no folder
    assert_doctor_says_what_launch_says(capfd, EXIT_CHECKPOINT)


def test_latest_with_only_incomplete_checkpoints_is_exit_5_and_leaves_them(
    capfd, colocate, monkeypatch, tmp_path
):
    out = tmp_path / "out"
    make_checkpoint(out, "checkpoint-3", state=None)  # an interrupted save
    before = snapshot(out)
    monkeypatch.setenv("VERIRL_OUTPUT_DIR", str(out))
    monkeypatch.setenv(RESUME, "latest")
    assert doctor(capfd)[0] == EXIT_CHECKPOINT
    assert snapshot(out) == before
    assert_doctor_says_what_launch_says(capfd, EXIT_CHECKPOINT)


def test_latest_with_an_unreadable_newest_checkpoint_is_exit_5(
    capfd, colocate, monkeypatch, tmp_path
):
    out = tmp_path / "out"
    make_checkpoint(out, "checkpoint-2")
    (out / "checkpoint-9").symlink_to(tmp_path / "unmounted-volume")  # leads nowhere
    monkeypatch.setenv("VERIRL_OUTPUT_DIR", str(out))
    for request_ in ("latest", "auto"):  # a source that cannot be read is never "nothing found"
        monkeypatch.setenv(RESUME, request_)
        message = assert_doctor_says_what_launch_says(capfd, EXIT_CHECKPOINT)
        assert message is not None
        assert "checkpoint-9" in message


def test_auto_with_nothing_found_is_a_fresh_start(capfd, colocate, monkeypatch, tmp_path):
    out = tmp_path / "out"
    monkeypatch.setenv("VERIRL_OUTPUT_DIR", str(out))
    monkeypatch.setenv(RESUME, "auto")
    assert assert_doctor_says_what_launch_says(capfd, 0) is None
    assert not out.exists()


@pytest.mark.parametrize("request_", ["latest", "auto", "checkpoint"])
def test_a_complete_checkpoint_is_usable(capfd, colocate, monkeypatch, tmp_path, request_):
    out = tmp_path / "out"
    folder = make_checkpoint(out, "checkpoint-5")
    before = snapshot(out)
    monkeypatch.setenv("VERIRL_OUTPUT_DIR", str(out))
    monkeypatch.setenv(RESUME, str(folder) if request_ == "checkpoint" else request_)
    assert assert_doctor_says_what_launch_says(capfd, 0) is None
    assert snapshot(out) == before


def test_no_request_is_a_fresh_start(capfd, colocate, monkeypatch, tmp_path):
    monkeypatch.setenv("VERIRL_OUTPUT_DIR", str(tmp_path / "out"))
    monkeypatch.setenv(RESUME, "  ")
    assert assert_doctor_says_what_launch_says(capfd, 0) is None


def test_with_a_local_server_too(capfd, clean_env, monkeypatch, tmp_path):
    """The reviewer's case: server mode on 2 GPUs, a fake server launch, a missing path."""
    monkeypatch.setenv("VERIRL_GPU_COUNT", "2")
    monkeypatch.setenv("VERIRL_MODEL", "m")
    monkeypatch.setenv("VERIRL_VLLM_PORT", str(unshared_port()))
    monkeypatch.setenv("VERIRL_VLLM_COMMAND", f"{sys.executable} -m fakes.vllm_serve")
    monkeypatch.setenv(RESUME, "/nonexistent")
    message = assert_doctor_says_what_launch_says(capfd, EXIT_CHECKPOINT)
    assert message is not None
    assert "/nonexistent does not exist" in message
    out = tmp_path / "empty"
    out.mkdir()
    monkeypatch.setenv("VERIRL_OUTPUT_DIR", str(out))
    monkeypatch.setenv(RESUME, "latest")
    message = assert_doctor_says_what_launch_says(capfd, EXIT_CHECKPOINT)
    assert message == f"no complete checkpoint for {RESUME}='latest'; searched: local:{out}"


def test_a_hub_source_is_not_asked(capfd, colocate, monkeypatch, tmp_path):
    """With a Hub source, ``latest`` is launch's to resolve: doctor contacts no Hub."""
    out = tmp_path / "out"
    monkeypatch.setenv("VERIRL_OUTPUT_DIR", str(out))
    monkeypatch.setenv("VERIRL_HUB_REPO_ID", "org/run")
    monkeypatch.setenv("VERIRL_HUB_ENDPOINT", f"http://127.0.0.1:{find_free_port()}")  # closed
    monkeypatch.setenv(RESUME, "latest")
    code, message = doctor(capfd)
    assert (code, message) == (0, None)
    assert not out.exists()  # no download folder either
    # An explicit path is looked at where it is, Hub or not: the disk decides it.
    monkeypatch.setenv(RESUME, str(tmp_path / "gone"))
    code, message = doctor(capfd)
    assert code == EXIT_CHECKPOINT
    assert message is not None
    assert f"{tmp_path}/gone does not exist" in message
    assert not out.exists()


@pytest.mark.parametrize(
    "variables",
    [
        {"VERIRL_GPU_COUNT": "0"},
        {"VERIRL_GPU_COUNT": "abc", "VERIRL_VLLM_PORT": "abc"},
        {"VERIRL_VLLM_MODE": "both"},
    ],
)
def test_a_variable_launch_refuses_is_one_problem_of_the_table_not_its_end(
    capfd, clean_env, monkeypatch, variables
):
    """Round 51: doctor ended at the first bad variable (exit 2, the error alone): an env server
    that is down (exit 3 decides) was never checked. Now each refused variable is a problem of
    the whole table, in launch's words."""
    for name, value in variables.items():
        monkeypatch.setenv(name, value)
    url = f"http://127.0.0.1:{unshared_port()}"
    code, document = run(capfd, "doctor", "--env-url", url)
    assert code == 3, document
    assert document[f"env server {url}"] == "NOT reachable/healthy"
    message = str(document["error"]["message"])  # type: ignore[index]
    for name in variables:
        assert f"{name}=" in message, message


def test_an_env_server_url_launch_refuses_is_one_problem_of_the_table(
    capfd, clean_env, monkeypatch
):
    """Round 52: VERIRL_ENV_SERVER_URL='ftp://x' (refused by the probe, not by the settings)
    ended doctor with the error alone."""
    monkeypatch.setenv("VERIRL_GPU_COUNT", "1")
    monkeypatch.setenv("VERIRL_ENV_SERVER_URL", "ftp://x")
    code, document = run(capfd, "doctor")
    assert code == 2, document
    assert "python" in document  # the table
    assert "VERIRL_ENV_SERVER_URL='ftp://x'" in str(document["error"]["message"])  # type: ignore[index]

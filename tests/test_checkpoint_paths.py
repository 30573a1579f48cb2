"""Issue 26, class 1: paths versus keywords, and paths whose bytes are not UTF-8.

A `pathlib.Path` (any `os.PathLike`) is always a path, never the keyword
``latest``/``last-checkpoint``/``auto``, at every entry point that takes a
resume request or a folder; only text is a keyword (``--resume latest`` on the
command line, ``--resume ./latest`` the folder). Names the OS hands over as
bytes that are not UTF-8 (``os.fsdecode(b"\\xff")``) work everywhere, and every
log line and error message about them can be written to a UTF-8 stream.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path, PurePosixPath

import pytest
from hypothesis import given
from hypothesis import strategies as st

from _checkpoint_support import (
    NAMES,
    NOT_UTF8_NAMES,
    REPO,
    RESUME_ENV_VAR,
    SWEEP,
    TextPath,
    fresh_dir,
    isolated_hub,
    log_lines,
    make_checkpoint,
    unencodable,
)
from fakes.checkpoints import FakeCheckpointSource
from verirl import (
    CheckpointNotFoundError,
    CheckpointResolver,
    ConfigError,
    DistributedEnv,
    HubCheckpointSource,
    LocalCheckpointSource,
    TrainingRuntime,
    VLLMTopology,
    find_free_port,
)
from verirl.checkpoints.attempt import attempt_key
from verirl.checkpoints.node_share import NodeSharedResolver
from verirl.cli import main

KEYWORDS = ["latest", "last-checkpoint", "auto"]
DOT_LATEST, DOT_AUTO = f".{os.sep}latest", f".{os.sep}auto"  # a folder named like a keyword
SPACES = ["", " ", "\t", "\n"]
PATH_TYPES = [Path, PurePosixPath, TextPath]


@pytest.fixture(autouse=True)
def _third_party_logs_at_info(caplog):
    """filelock logs every lock path at DEBUG, a non-UTF-8 one included, and pytest-xdist
    cannot send such a string from its worker: its report would crash the run."""
    caplog.set_level(logging.INFO, logger="filelock")


@pytest.fixture
def clean_env(monkeypatch):
    """No verirl setting from the machine, and the distributed variables restored after."""
    for name in list(os.environ):
        if name.startswith("VERIRL_") or name in ("HF_TOKEN", "CUDA_VISIBLE_DEVICES"):
            monkeypatch.delenv(name)
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                 "MASTER_PORT", "TORCHELASTIC_RUN_ID"):  # fmt: skip
        monkeypatch.delenv(name, raising=False)


def colocated(**kwargs: object) -> TrainingRuntime:
    env: dict[str, str] = {}
    return TrainingRuntime(
        VLLMTopology.plan(1, max_model_len=64),
        environ=env,
        dist_env=DistributedEnv.single_node(environ=env, master_port=find_free_port()),
        **kwargs,  # type: ignore[arg-type]
    )


# ---------------------------------------------------------------- a path-like is a path


@SWEEP
@given(
    name=st.builds(
        "".join,
        st.tuples(st.sampled_from(SPACES), st.sampled_from(KEYWORDS), st.sampled_from(SPACES)),
    ),
    kind=st.sampled_from(PATH_TYPES),
)
def test_resolve_takes_a_path_like_named_like_a_keyword_for_that_folder(
    tmp_path, monkeypatch, name, kind
):
    monkeypatch.chdir(fresh_dir(tmp_path))
    make_checkpoint(Path.cwd(), name, {"global_step": 1})
    source = FakeCheckpointSource(steps=[2])
    for resolver in (CheckpointResolver([source]), CheckpointResolver([])):
        found = resolver.resolve(kind(name))
        assert found is not None
        assert Path(found).samefile(name)
        # Handed on as text (launch exports it), it still means that folder, not the keyword.
        assert resolver.resolve(found) == found
    assert source.fetched == []  # the keyword was never asked of a source


@pytest.mark.parametrize("kind", PATH_TYPES)
@pytest.mark.parametrize("word", KEYWORDS)
def test_a_path_like_keyword_with_no_such_folder_is_not_found_not_resolved(
    tmp_path, monkeypatch, kind, word
):
    monkeypatch.chdir(tmp_path)
    source = FakeCheckpointSource(steps=[2])
    with pytest.raises(CheckpointNotFoundError) as info:
        CheckpointResolver([source]).resolve(kind(word))
    assert "does not exist" in str(info.value)
    assert source.latest_calls == 0


@pytest.mark.parametrize("kind", PATH_TYPES)
def test_the_runtime_takes_a_path_like_resume_from_for_that_folder(
    tmp_path, monkeypatch, clean_env, kind
):
    monkeypatch.chdir(tmp_path)
    make_checkpoint(tmp_path, "latest", {"global_step": 1})
    make_checkpoint(tmp_path, "auto", {"global_step": 1})
    resolver = CheckpointResolver([FakeCheckpointSource(steps=[2])])
    with colocated(checkpoints=resolver, resume_from=kind("latest")) as session:
        assert session.resume_from_checkpoint == DOT_LATEST  # never the keyword
    with colocated(resume_from=kind("auto")) as session:  # no source: 'auto' would be refused
        assert session.resume_from_checkpoint == DOT_AUTO
    with colocated(checkpoints=resolver, resume_from="latest") as session:  # text: the keyword
        assert session.resume_from_checkpoint == "/fake/checkpoint-2"


@pytest.mark.parametrize("kind", PATH_TYPES)
def test_from_settings_takes_path_likes_as_paths(tmp_path, monkeypatch, clean_env, kind):
    monkeypatch.chdir(tmp_path)
    make_checkpoint(tmp_path / "auto", "checkpoint-3")  # an output_dir called "auto"
    make_checkpoint(tmp_path, "latest", {"global_step": 1})
    runtime = TrainingRuntime.from_settings(
        gpu_count=1, environ={}, output_dir=kind("auto"), resume_from=kind("latest")
    )
    with runtime as session:
        assert session.resume_from_checkpoint == DOT_LATEST
    runtime = TrainingRuntime.from_settings(
        gpu_count=1, environ={}, output_dir=kind("auto"), resume_from="latest"
    )
    with runtime as session:
        assert session.resume_from_checkpoint == str(Path("auto", "checkpoint-3"))
    # 'auto' as text with no source is refused; as a path it is the folder.
    with TrainingRuntime.from_settings(
        gpu_count=1, environ={}, resume_from=kind("auto")
    ) as session:
        assert session.resume_from_checkpoint == DOT_AUTO


@pytest.mark.parametrize(
    "bad", [TextPath(b"latest"), TextPath(5), TextPath(""), TextPath(None)], ids=repr
)
def test_a_path_like_that_gives_no_text_path_is_a_config_error_naming_the_field(bad, clean_env):
    with pytest.raises(ConfigError, match=r"^request=") as info:
        CheckpointResolver([]).resolve(bad)
    assert info.value.field == "request"
    with pytest.raises(ConfigError, match=r"^resume_from=") as info:
        colocated(resume_from=bad)
    with pytest.raises(ConfigError, match=r"^resume_from=") as info:
        TrainingRuntime.from_settings(gpu_count=1, environ={}, resume_from=bad)


def test_an_environment_value_that_is_a_path_object_is_refused_not_read_as_a_keyword():
    resolver = CheckpointResolver([FakeCheckpointSource(steps=[2])])
    with pytest.raises(ConfigError, match=rf"^{RESUME_ENV_VAR}="):
        resolver.resolve_from_env({RESUME_ENV_VAR: Path("latest")})  # type: ignore[dict-item]


def test_on_the_command_line_latest_is_the_keyword_and_dot_slash_latest_the_folder(
    tmp_path, monkeypatch, clean_env, capsys
):
    monkeypatch.chdir(tmp_path)
    make_checkpoint(tmp_path / "out", "checkpoint-4")
    make_checkpoint(tmp_path, "latest", {"global_step": 1})
    assert main(["resume", "--output-dir", "out", "--resume", "latest"]) == 0
    assert capsys.readouterr().out.strip() == str(Path("out", "checkpoint-4"))
    assert main(["resume", "--output-dir", "out", "--resume", "./latest"]) == 0
    printed = capsys.readouterr().out.strip()
    assert printed == DOT_LATEST  # what launch exports: read again, the folder
    assert main(["resume", "--output-dir", "out", "--resume", printed]) == 0
    assert capsys.readouterr().out.strip() == printed


# ---------------------------------------------------------------- names that are not UTF-8


@SWEEP
@given(root_name=NAMES, folder_name=NOT_UTF8_NAMES, kind=st.sampled_from([str, Path]))
def test_local_names_that_are_not_utf8_work_and_every_line_about_them_encodes(
    tmp_path, caplog, root_name, folder_name, kind
):
    caplog.clear()
    caplog.set_level(logging.DEBUG, logger="verirl")
    root = fresh_dir(tmp_path) / root_name
    newest = make_checkpoint(root, "checkpoint-5")
    make_checkpoint(root, "checkpoint-9", state=None)  # incomplete: a warning names it
    odd = make_checkpoint(root, folder_name, {"global_step": 1})
    source = LocalCheckpointSource(kind(root))
    resolver = CheckpointResolver([source])
    messages = []
    assert source.latest().path == str(newest)
    assert resolver.resolve("latest") == str(newest)
    assert resolver.resolve("auto") == str(newest)
    assert resolver.resolve(str(odd)) == str(odd)
    assert resolver.resolve(kind(odd)) == str(odd)
    make_checkpoint(odd, "checkpoint-1", state=None)
    assert resolver.resolve(odd / "checkpoint-1") == str(odd / "checkpoint-1")  # warned
    with pytest.raises(CheckpointNotFoundError) as info:
        resolver.resolve(kind(root / folder_name / "missing"))
    messages.append(str(info.value))
    with pytest.raises(CheckpointNotFoundError) as info:
        CheckpointResolver([LocalCheckpointSource(root / folder_name)]).resolve("latest")
    messages.append(str(info.value))
    assert unencodable(messages + log_lines(caplog)) == []
    assert any("checkpoint-9" in line for line in log_lines(caplog))


@SWEEP
@given(name=NOT_UTF8_NAMES)
def test_the_node_key_and_the_shared_record_take_names_that_are_not_utf8(tmp_path, name):
    folder = fresh_dir(tmp_path) / name
    chosen = str(folder / f"checkpoint-3{name}")
    Path(chosen).mkdir(parents=True)  # a follower checks the folder is there
    env = {"TORCHELASTIC_ERROR_FILE": f"/tmp/{name}/attempt_0/0/error.json"}
    key = attempt_key(env, folder=folder, request=chosen)
    assert key != attempt_key(env, folder=folder, request=chosen)  # a new resolution, a new key

    class Chooses:
        def resolve(self, _request: str | None) -> str | None:
            return chosen

    assert NodeSharedResolver(Chooses(), folder, key, leader=True).resolve(chosen) == chosen
    follower = NodeSharedResolver(Chooses(), folder, key, leader=False, timeout=5)
    assert follower.resolve(chosen) == chosen


def test_a_hub_download_into_a_folder_that_is_not_utf8(tmp_path, monkeypatch, caplog):
    caplog.set_level(logging.DEBUG, logger="verirl")
    with isolated_hub(tmp_path, monkeypatch) as hub:
        hub.add_checkpoint(REPO, "checkpoint-10", 10)
        hub.add_checkpoint(REPO, "last-checkpoint", 20)
        for name in (os.fsdecode(b"dl-\xff\xfe"), "auto", "latest"):
            download_dir = tmp_path / name
            source = HubCheckpointSource(REPO, download_dir=Path(name), endpoint=hub.endpoint)
            monkeypatch.chdir(tmp_path)
            path = CheckpointResolver([source]).resolve("latest")
            assert path == str(Path(name, "last-checkpoint"))
            marker = json.loads(
                (download_dir / "last-checkpoint/.verirl-download.json").read_text()
            )
            assert marker["repo_id"] == REPO
            assert CheckpointResolver([source]).resolve("latest") == path  # reused
    assert unencodable(log_lines(caplog)) == []


def test_resume_prints_a_path_that_is_not_utf8_as_its_bytes(tmp_path):
    """A strict UTF-8 stdout (a UTF-8 locale other than C.UTF-8) cannot print surrogates."""
    root = tmp_path / os.fsdecode(b"out-\xff")
    newest = make_checkpoint(root, "checkpoint-7")
    env = {**os.environ, "PYTHONIOENCODING": "utf-8:strict"}
    env = {k: v for k, v in env.items() if not k.startswith("VERIRL_")}
    for extra, expected in (
        ([], os.fsencode(newest) + b"\n"),
        (["--json"], None),
    ):
        result = subprocess.run(
            [sys.executable, "-m", "verirl", "resume", "--output-dir", str(root),
             "--resume", "latest", *extra],
            capture_output=True, env=env, timeout=60, check=False,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr.decode(errors="replace")
        assert b"Traceback" not in result.stderr
        if expected is not None:
            assert result.stdout == expected
        else:
            assert json.loads(result.stdout)["resume_from_checkpoint"] == str(newest)


LONE = "/tmp/verirl-x\ud800"  # a lone surrogate (from JSON): no file name holds it


@pytest.mark.parametrize(
    ("make", "field"),
    [
        (lambda: LocalCheckpointSource(LONE), "root"),
        (lambda: LocalCheckpointSource(Path(LONE)), "root"),
        (lambda: HubCheckpointSource("org/r", download_dir=LONE), "download_dir"),
        (lambda: TrainingRuntime.from_settings(gpu_count=1, output_dir=Path(LONE), environ={}),
         "output_dir"),
        (lambda: TrainingRuntime.from_settings(gpu_count=1, environ={"VERIRL_OUTPUT_DIR": LONE}),
         "VERIRL_OUTPUT_DIR"),
    ],
    ids=["local-str", "local-path", "hub-download-dir", "output-dir", "output-dir-variable"],
)  # fmt: skip
def test_a_path_no_file_name_can_hold_is_a_config_error_naming_the_field(make, field, clean_env):
    with pytest.raises(ConfigError) as info:
        make()
    assert info.value.field == field


@pytest.mark.parametrize("name", ["a\x00b", "new\nline", "esc\x1b[31mred"])
def test_a_path_with_control_characters_is_shown_escaped_in_the_error(name, tmp_path):
    # a raw NUL, new line or escape sequence would cut or forge a log line
    with pytest.raises(CheckpointNotFoundError) as info:
        CheckpointResolver([]).resolve(str(tmp_path / name))
    message = str(info.value)
    assert not any(char in message for char in "\x00\n\x1b")
    assert repr(name)[1:-1] in message


# ---------------------------------------------------------------- an answer read back as text

_LITERAL_ROOTS = ["~/runs/exp", "~root/runs", " sp", "\tlatest", "latest"]


@pytest.mark.parametrize("root", _LITERAL_ROOTS)
@pytest.mark.parametrize("how", ["latest", "explicit"])
def test_a_resolved_checkpoint_read_back_as_text_is_the_same_folder(
    tmp_path, monkeypatch, root, how
):
    """Launch exports the answer and the command resolves it again: it must name the same folder.

    A folder found on disk whose relative path starts with ``~`` (or white space) is
    that folder, not the home directory's (or a stripped name's).
    """
    monkeypatch.chdir(tmp_path)
    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    mine = make_checkpoint(tmp_path / root, "checkpoint-5")
    make_checkpoint(home / "runs" / "exp", "checkpoint-5")  # a decoy where "~" leads
    if root.strip() != root:
        make_checkpoint(tmp_path / root.strip(), "checkpoint-5")  # and where stripping leads
    if how == "latest":
        answer = CheckpointResolver([LocalCheckpointSource(f".{os.sep}{root}")]).resolve("latest")
    else:
        answer = CheckpointResolver([]).resolve(f".{os.sep}{root}{os.sep}checkpoint-5")
    assert answer is not None
    again = CheckpointResolver([]).resolve(answer)
    assert again is not None
    assert Path(again).samefile(mine), (answer, again)
    assert CheckpointResolver([]).resolve_from_env({RESUME_ENV_VAR: answer}) == again


# ---------------------------------------------------------------- one byte, one spelling

_XFF = os.fsdecode(b"x\xffy")


@pytest.mark.parametrize(
    "argv",
    [
        ["resume", "--resume", f"/nonexistent/{_XFF}"],
        ["resume", "--json", "--resume", f"/nonexistent/{_XFF}"],
        ["resume", f"/nonexistent/{_XFF}"],  # argparse's own "unrecognized arguments"
        ["plan", "--json", "--vllm-host", _XFF, "--gpus", "1"],
        ["plan", "--gpus", _XFF],
    ],
    ids=["resume", "resume-json", "argparse", "plan-host-json", "plan-gpus"],
)
def test_a_byte_that_is_not_utf8_is_written_one_way_in_every_message(argv, tmp_path):
    """``repr`` writes such a byte as ``\\udcff``, `printable` as ``\\xff``: only the latter."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("VERIRL_")}
    result = subprocess.run(
        [sys.executable, "-m", "verirl", *argv],
        capture_output=True, env=env, cwd=tmp_path, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode in (2, 5), result
    shown = result.stdout + result.stderr
    assert b"Traceback" not in shown
    assert b"\\udc" not in shown.replace(b"\\\\", b"/")
    assert b"x\\\\xffy" in result.stdout if "--json" in argv else b"x\\xffy" in result.stderr


def test_quoted_writes_escaped_bytes_as_printable_does_and_everything_else_as_repr():
    from verirl._fs import printable, quoted

    assert quoted(_XFF) == f"'{printable(_XFF)}'" == "'x\\xffy'"
    assert quoted((_XFF, 1)) == "('x\\xffy', 1)"
    assert quoted("\\" + _XFF) == "'\\\\x\\xffy'"  # a backslash, then the byte
    for text in ["plain", "it's", 'say "hi"', "\\udcff", "\\\\udcff", "x\ud800", "\n\x1b"]:
        assert quoted(text) == repr(text)  # a typed backslash-u is no byte

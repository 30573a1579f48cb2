"""The vLLM server's log file, swept over what a log path can be (issue 26, class 3).

Whatever ``log_path`` names (a FIFO, a folder spelled with a trailing slash, a
full disk, a device, bytes that are not UTF-8) and whatever the log holds (a
last line longer than the tail's window, zero lines asked for, a file cut
short, megabytes of blank lines at its end), `VLLMServer.start` never blocks
past its timeout, nothing is spawned for a path refused, and the tail that
says why a server died is not lost. ``doctor`` says of whatever is at the
log's path (a link to nowhere, to a folder, in a loop, a FIFO, a read-only
place, ...) what launch does, in its words.
Without ``log_path`` the log goes to one folder per user, appended to, so that
retries do not leave a temp folder each behind. A folder given as one (``log_dir``,
``vllm_log_dir``, ``--log-dir``, ``VERIRL_VLLM_LOG_DIR``, a ``log_path`` that was a
directory) stays a folder: removed before the start, it is an error naming where it
was given (the default folder is made again), never a file written at its path.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import socket
import stat
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from _checkpoint_support import log_lines, unencodable
from _support import clean_environ, unshared_port, while_the_group_port_is_free
from verirl.cli import main
from verirl.errors import ConfigError, VLLMServerExited
from verirl.runtime import TrainingRuntime
from verirl.server import log_check as _log_check
from verirl.server import log_folder as _log_folder
from verirl.server import log_tail as _log_tail
from verirl.server.log_tail import read_log_tail
from verirl.server.readiness import LogWatch
from verirl.vllm_server import VLLMServer

FAKE = (sys.executable, "-m", "fakes.vllm_serve")
BOUND = 10.0  # seconds any of this may take on a loaded machine; the blocking cases never end


@pytest.fixture
def servers() -> Iterator[Callable[..., VLLMServer]]:
    made: list[VLLMServer] = []

    def make(**kwargs: object) -> VLLMServer:
        kwargs.setdefault("port", unshared_port())
        kwargs.setdefault("command", FAKE)
        kwargs.setdefault("startup_timeout", 30.0)
        kwargs.setdefault("shutdown_timeout", 5.0)
        server = VLLMServer("fake/model", **kwargs)  # type: ignore[arg-type]
        made.append(server)
        return server

    yield make
    for server in made:
        server.stop()


def _in_thread(job: Callable[[], object], unblock: Callable[[], None]) -> list[object]:
    """Run ``job`` in a thread; [result] or [exception] if it ends within BOUND, else fail.

    A job that blocks is freed with ``unblock`` before the test fails, so that
    nothing it started outlives the test.
    """
    outcome: list[object] = []

    def run() -> None:
        try:
            outcome.append(job())
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            outcome.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(BOUND)
    if thread.is_alive():
        unblock()
        thread.join(BOUND)
        pytest.fail(f"blocked for more than {BOUND}s")
    return outcome


def _open_reader(fifo: Path) -> Callable[[], None]:
    def unblock() -> None:
        os.close(os.open(fifo, os.O_RDONLY | os.O_NONBLOCK))

    return unblock


def _open_writer(fifo: Path) -> Callable[[], None]:
    def unblock() -> None:
        os.close(os.open(fifo, os.O_WRONLY | os.O_NONBLOCK))

    return unblock


# ---------------------------------------------------------------- what log_path names


@pytest.mark.parametrize("where", ["file", "in-folder"])
def test_a_fifo_is_refused_at_once_with_nothing_spawned(tmp_path, servers, where):
    folder = tmp_path / "logs"
    folder.mkdir()
    port = unshared_port()
    fifo = folder / f"vllm-serve-{port}.log" if where == "in-folder" else tmp_path / "pipe"
    os.mkfifo(fifo)
    server = servers(port=port, log_path=folder if where == "in-folder" else fifo)

    def unblock() -> None:
        _open_reader(fifo)()
        server.stop()

    (outcome,) = _in_thread(server.start, unblock)
    assert isinstance(outcome, ConfigError), outcome
    assert outcome.field == "log_path"
    assert "FIFO" in str(outcome)
    assert server.pid is None


@pytest.mark.parametrize(
    ("spelling", "meant"),
    [("new/", "new"), ("new//", "new"), ("deep/er/", "deep/er"), ("new/.", "new"),
     ("new/./", "new"), ("new/sub/..", "new")],
)  # fmt: skip
def test_a_folder_spelled_with_a_trailing_slash_is_a_folder(tmp_path, servers, spelling, meant):
    requested = str(tmp_path) + os.sep + spelling
    server = servers(log_path=requested)
    with server:
        pass
    folder = tmp_path / meant
    assert folder.is_dir()
    assert server.log_path.resolve() == folder / f"vllm-serve-{server.port}.log"
    assert "Uvicorn running" in server.log_path.read_text()


def test_a_full_disk_is_a_clear_error_naming_log_path_with_nothing_spawned(servers):
    server = servers(log_path="/dev/full")
    with pytest.raises(ConfigError, match="No space left") as caught:
        server.start()
    assert caught.value.field == "log_path"
    assert server.pid is None


def test_a_log_that_cannot_be_appended_to_is_a_clear_error_naming_log_path(servers):
    server = servers(log_path="/proc/self/status")  # opens, but appending seeks: EINVAL
    with pytest.raises(ConfigError, match="cannot be opened for appending") as caught:
        server.start()
    assert caught.value.field == "log_path"
    assert server.pid is None


@pytest.mark.parametrize("kind", ["device", "socket", "folder-is-a-file"])
def test_what_is_no_regular_file_is_refused_naming_log_path(tmp_path, servers, kind):
    if kind == "device":
        path: str | Path = "/dev/null"  # the tail would be lost: refused rather than silent
    elif kind == "socket":
        path = tmp_path / "s"
        listener = socket.socket(socket.AF_UNIX)
        listener.bind(str(path))
        listener.close()
    else:
        (tmp_path / "plain").write_text("mine\n")
        path = str(tmp_path / "plain") + "/"  # asks for a folder where a file is
    server = servers(log_path=path)
    with pytest.raises(ConfigError) as caught:
        server.start()
    assert caught.value.field == "log_path"
    assert server.pid is None
    if kind == "folder-is-a-file":
        assert (tmp_path / "plain").read_text() == "mine\n"  # never overwritten


def test_a_log_that_is_not_utf8_still_explains_the_exit(tmp_path, servers):
    program = (
        "import sys, os; os.write(1, b'loading \\xff\\xfe\\xc3(\\n'); "
        "print('RuntimeError: CUDA out of memory', flush=True); sys.exit(3)"
    )
    server = servers(command=(sys.executable, "-c", program), log_path=tmp_path / "x.log")
    with pytest.raises(VLLMServerExited) as caught:
        server.start()
    tail = caught.value.log_tail
    assert "CUDA out of memory" in tail
    assert "\ufffd" in tail
    str(caught.value).encode("utf-8")  # a report can carry it


_ROTATIONS = {
    "renamed": "os.rename(log, log + '.1'); open(log, 'w').close()",
    "deleted": "os.unlink(log)",
    "replaced-by-a-folder": "os.unlink(log); os.mkdir(log)",
}


@pytest.mark.parametrize("rotation", sorted(_ROTATIONS))
def test_a_log_rotated_while_the_server_runs_still_explains_the_exit(tmp_path, servers, rotation):
    """logrotate (or a user) moves the log away: the server wrote its last words to the old file."""
    log = tmp_path / "x.log"
    program = (
        f"import os, sys; log = sys.argv[1]; print('loading', flush=True); "
        f"{_ROTATIONS[rotation]}; "
        "print('RuntimeError: CUDA out of memory', flush=True); sys.exit(3)"
    )
    server = servers(command=(sys.executable, "-c", program, str(log)), log_path=log)
    with pytest.raises(VLLMServerExited) as caught:
        server.start()
    assert "CUDA out of memory" in caught.value.log_tail
    assert "CUDA out of memory" in server.log_tail()
    assert "loading" in server.log_tail()


def test_a_later_run_reads_its_own_log_and_the_earlier_handle_is_closed(tmp_path, servers):
    program = "import sys; print('run', sys.argv[1], flush=True); sys.exit(3)"
    first = servers(command=(sys.executable, "-c", program, "one"), log_path=tmp_path / "a.log")
    with pytest.raises(VLLMServerExited):
        first.start()
    kept = first._kept_log
    assert kept is not None
    assert kept.fd is not None
    first.command = (sys.executable, "-c", program, "two")
    with pytest.raises(VLLMServerExited) as caught:
        first.start()
    assert kept.fd is None  # the first run's reading handle, closed
    assert "run two" in caught.value.log_tail
    assert "run one" not in caught.value.log_tail


@pytest.mark.parametrize("where", ["model", "extra_args", "command"])
def test_an_argv_that_is_not_utf8_starts_and_is_logged_as_utf8(tmp_path, where, caplog):
    caplog.set_level(logging.DEBUG, logger="verirl")
    raw = os.fsdecode(b"m\xff")  # a name from bytes that are not UTF-8 (surrogate-escaped)
    command = [sys.executable, "-c", "import sys; sys.exit(3)"]
    kwargs: dict[str, object] = {"extra_args": [f"--served-model-name={raw}"]}
    if where == "command":
        command.append(raw)
    if where != "extra_args":
        kwargs = {}
    server = VLLMServer(
        raw if where == "model" else "m", port=unshared_port(), command=command,
        log_path=tmp_path / "x.log", startup_timeout=30.0, **kwargs,  # type: ignore[arg-type]
    )  # fmt: skip
    try:
        with pytest.raises(VLLMServerExited):  # the program's own exit, not a UnicodeEncodeError
            server.start()
    finally:
        server.stop()
    assert b"m\\xff" in (tmp_path / "x.log").read_bytes().splitlines()[0]  # shown as \xff
    assert unencodable(log_lines(caplog)) == []  # verirl's own lines: UTF-8 they can be written
    caplog.clear()


# ---------------------------------------------------------------- reading the tail


def test_the_tail_of_a_fifo_is_empty_at_once(tmp_path):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    assert _in_thread(lambda: read_log_tail(fifo), _open_writer(fifo)) == [""]
    assert _in_thread(lambda: LogWatch(fifo).fired(), _open_writer(fifo)) == [False]


def test_a_running_servers_log_replaced_by_a_fifo_never_blocks_its_tail(tmp_path, servers):
    server = servers(log_path=tmp_path / "x.log")
    server.start()
    log = server.log_path
    assert log is not None
    log.unlink()
    os.mkfifo(log)
    [tail] = _in_thread(server.log_tail, _open_writer(log))
    assert "verirl fakes.vllm_serve" in str(tail)  # what the server wrote, where it went


def test_a_last_line_longer_than_the_window_is_kept_cut(tmp_path):
    path = tmp_path / "x.log"
    path.write_bytes(b"early\n" + b"x" * 200_000 + b"END")
    tail = read_log_tail(path, lines=3)
    assert tail.startswith("\u2026x")
    assert tail.endswith("xEND\n")
    assert len(tail) < 70_000


def test_a_log_cut_short_since_the_run_began_still_has_a_tail(tmp_path):
    path = tmp_path / "x.log"
    path.write_text("the server died: out of memory\n")
    assert read_log_tail(path, start=10_000) == "the server died: out of memory\n"


def test_a_long_last_line_followed_by_blank_lines_is_the_tail(tmp_path):
    """The line that says why the server died, longer than the window, then blank lines."""
    path = tmp_path / "x.log"
    path.write_text("A" * 100_000 + "\nERRORLINE-" + "B" * 70_000 + "\n\n\n")
    tail = read_log_tail(path)
    assert tail.startswith("\u2026")
    assert tail.endswith("B" * 100 + "\n")
    assert read_log_tail(path, lines=1) == tail


@pytest.mark.parametrize("lines", [-1, True, 2.5, "3", None])
def test_a_bad_number_of_lines_is_a_config_error_naming_it(tmp_path, lines):
    path = tmp_path / "x.log"
    path.write_text("a\n")
    with pytest.raises(ConfigError) as caught:
        read_log_tail(path, lines=lines)  # type: ignore[arg-type]
    assert caught.value.field == "lines"
    with pytest.raises(ConfigError):
        VLLMServer("m").log_tail(lines)  # type: ignore[arg-type]


_LINE = st.binary(max_size=300).map(lambda b: b.replace(b"\n", b""))


@settings(
    max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    before=st.lists(_LINE, max_size=5),
    run=st.lists(_LINE, max_size=60),
    last_newline=st.booleans(),
    lines=st.integers(min_value=0, max_value=80),
)
def test_the_tail_is_at_most_that_many_lines_of_this_run_and_always_shows(
    tmp_path, before, run, last_newline, lines
):
    path = tmp_path / "tail.log"
    earlier = b"".join(line + b"\n" for line in before)
    body = b"\n".join(run) + (b"\n" if last_newline and run else b"")
    path.write_bytes(earlier + body)
    tail = read_log_tail(path, lines=lines, start=len(earlier))
    tail.encode("utf-8")
    if lines == 0:
        assert tail == ""
        return
    assert tail.count("\n") <= lines
    shown = body.decode("utf-8", errors="replace").splitlines()
    while shown and not shown[-1].strip():  # trailing blank lines are no part of the tail
        shown.pop()
    expected = shown[-lines:]
    assert tail == ("\n".join(expected) + "\n" if expected else "")


# ---------------------------------------------------------------- the default folder


@pytest.fixture
def private_tmp(tmp_path, monkeypatch) -> Path:
    """This test's own temp directory, so that the per-user folder is this test's."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


def test_retries_without_log_path_append_to_one_file_in_one_folder(private_tmp, servers):
    port = unshared_port()
    paths = []
    for _ in range(3):  # a job and two retries
        server = servers(port=port, log_path=None)
        with server:
            paths.append(server.log_path)
    folder = private_tmp / f"verirl-vllm-{os.getuid()}"
    assert paths == [folder / f"vllm-serve-{port}.log"] * 3
    assert sorted(p.name for p in private_tmp.iterdir()) == [folder.name]
    assert folder.stat().st_mode & 0o777 == 0o700
    assert paths[0].read_text().count("--- verirl ") == 3  # appended, each run's header


@pytest.mark.parametrize("hijack", ["symlink", "group-writable"])
def test_a_default_folder_that_is_not_private_is_never_written_into(
    private_tmp, servers, hijack, caplog
):
    folder = private_tmp / f"verirl-vllm-{os.getuid()}"
    elsewhere = private_tmp / "elsewhere"
    elsewhere.mkdir()
    if hijack == "symlink":
        folder.symlink_to(elsewhere)
    else:
        folder.mkdir(mode=0o700)
        folder.chmod(0o770)
    server = servers(log_path=None)
    with server:
        pass
    assert server.log_path is not None
    assert server.log_path.parent.parent == private_tmp
    assert server.log_path.parent.name.startswith("verirl-vllm-")
    assert server.log_path.parent != folder
    assert list(elsewhere.iterdir()) == []
    if hijack == "group-writable":
        assert list(folder.iterdir()) == []
    assert "is not a private folder" in caplog.text


def test_a_default_folder_removed_as_it_is_resolved_is_made_again_private(
    private_tmp, servers, monkeypatch
):
    """The folder checked and the folder written into are one: removed between, made again."""
    resolve = _log_folder.default_log_dir
    removed: list[Path] = []

    def then_removed() -> Path:
        folder = resolve()
        if not removed:  # once: as if a temp cleaner ran right after the check
            folder.rmdir()
            removed.append(folder)
        return folder

    monkeypatch.setattr(_log_folder, "default_log_dir", then_removed)
    server = servers(log_path=None)
    with server:
        pass
    folder = private_tmp / f"verirl-vllm-{os.getuid()}"
    assert removed == [folder]
    assert server.log_path == folder / f"vllm-serve-{server.port}.log"
    assert folder.stat().st_mode & 0o777 == 0o700  # made again as verirl makes it
    assert "Uvicorn running" in server.log_path.read_text()


# ---------------------------------------------------------------- a folder given as one


@pytest.mark.parametrize("field", ["log_dir", "log_path"])
def test_a_log_folder_removed_before_start_is_an_error_never_a_file(tmp_path, servers, field):
    folder = tmp_path / "logs"
    folder.mkdir()
    server = servers(**{field: str(folder)})  # log_path: a directory when the server is made
    folder.rmdir()
    with pytest.raises(ConfigError) as caught:
        server.start()
    assert caught.value.field == field
    assert caught.value.value == str(folder)
    assert "must be an existing folder" in str(caught.value)
    assert not folder.exists()  # neither a file nor a folder made at that path
    assert server.pid is None


def test_a_log_dir_that_became_a_file_is_refused_and_left_alone(tmp_path, servers):
    folder = tmp_path / "logs"
    folder.mkdir()
    server = servers(log_dir=folder)
    folder.rmdir()
    folder.write_text("mine\n")
    with pytest.raises(ConfigError, match="must be a folder") as caught:
        server.start()
    assert caught.value.field == "log_dir"
    assert folder.read_text() == "mine\n"  # never written into
    assert server.pid is None


def test_a_log_dir_gets_the_per_port_file_and_excludes_log_path(tmp_path, servers):
    server = servers(log_dir=tmp_path)
    assert server.log_path == tmp_path / f"vllm-serve-{server.port}.log"
    with server:
        pass
    assert "Uvicorn running" in (tmp_path / f"vllm-serve-{server.port}.log").read_text()
    with pytest.raises(ConfigError, match="not both") as caught:
        VLLMServer("m", log_dir=tmp_path, log_path=tmp_path / "x.log")
    assert caught.value.field == "log_dir"


@pytest.mark.parametrize("source", ["argument", "variable"])
def test_a_runtimes_log_folder_removed_before_start_names_its_setting(tmp_path, source):
    folder = tmp_path / "logs"
    folder.mkdir()
    environ = {"VERIRL_VLLM_LOG_DIR": str(folder)} if source == "variable" else {}
    given = {"vllm_log_dir": str(folder)} if source == "argument" else {}
    runtime = TrainingRuntime.from_settings(
        gpu_count=2, model="fake/model", vllm_port=unshared_port(), vllm_command=FAKE,
        vllm_startup_timeout=30.0, environ=environ, **given,
    )  # fmt: skip
    folder.rmdir()  # between configuration and start
    try:
        with pytest.raises(ConfigError) as caught:
            runtime.start()
    finally:
        runtime.stop()
    name = "vllm_log_dir" if source == "argument" else "VERIRL_VLLM_LOG_DIR"
    assert caught.value.field == name
    assert str(caught.value).startswith(f"{name}={str(folder)!r}: must be an existing folder")
    assert not folder.exists()


def test_the_clis_log_dir_removed_before_start_names_the_flag(tmp_path, monkeypatch, capsys):
    folder = tmp_path / "logs"
    folder.mkdir()
    start = TrainingRuntime.start

    def removed_first(runtime: TrainingRuntime) -> object:
        folder.rmdir()  # after the flags were read and checked, before the server starts
        start(runtime)
        runtime.stop()  # started regardless: not left serving until a signal comes
        pytest.fail("the server started with its log folder gone")

    monkeypatch.setattr(TrainingRuntime, "start", removed_first)
    for name in [n for n in os.environ if n.startswith("VERIRL_")]:
        monkeypatch.delenv(name)
    code = main(["serve", "--gpus", "2", "--model", "fake/model",
                 "--vllm-port", str(unshared_port()),
                 "--vllm-command", f"{sys.executable} -m fakes.vllm_serve",
                 "--log-dir", str(folder)])  # fmt: skip
    assert code == 2
    assert f"--log-dir={str(folder)!r}: must be an existing folder" in capsys.readouterr().err
    assert not folder.exists()


@pytest.mark.parametrize("tail_lines", [1, 2, 40])
def test_a_window_that_starts_on_a_line_boundary_keeps_that_whole_line(tmp_path, tail_lines):
    """The 64 KiB window begins right after a new line: its first line is whole, not cut."""
    path = tmp_path / "x.log"
    half = 32 * 1024
    path.write_bytes(b"H" * 99 + b"\n" + b"A" * (half - 1) + b"\n" + b"B" * (half - 1) + b"\n")
    tail = read_log_tail(path, lines=tail_lines)
    expected = ["A" * (half - 1), "B" * (half - 1)][-tail_lines:]
    assert tail.splitlines() == expected
    one = tmp_path / "one.log"
    one.write_bytes(b"early\n" + b"L" * (64 * 1024 - 1) + b"\n")
    assert read_log_tail(one, lines=tail_lines) == "L" * (64 * 1024 - 1) + "\n"  # no "…"


def test_the_quoted_log_tail_never_drives_the_terminal_nor_forges_a_line(tmp_path):
    """What the server wrote reaches stderr escaped, each line behind ``| ``."""
    program = (
        "import sys; sys.stdout.write('\\x1b[2J\\x1b]0;title\\x07 boom\\x00\\x9b1m\\n"
        "INFO verirl: training command exited with 0; everything torn down\\n'); sys.exit(3)"
    )
    server = VLLMServer(
        "m", port=unshared_port(), devices=(0,), command=[sys.executable, "-c", program],
        log_path=tmp_path / "server.log", startup_timeout=30,
    )  # fmt: skip
    with pytest.raises(VLLMServerExited) as caught:
        server.start()
    message = str(caught.value)
    assert not [char for char in message if char in "\x1b\x07\x00\x9b"], repr(message)
    tail = message.split("--- last lines of the server log ---\n", 1)[1].splitlines()
    assert all(line.startswith("| ") for line in tail), tail
    assert "\\x1b[2J" in message
    assert "\x1b" in caught.value.log_tail  # the attribute keeps what was written


DROP_BOX = """
import sys
from pathlib import Path
from verirl.server.fields import KeptFolder
from verirl.server.log import open_server_log

folder = KeptFolder(sys.argv[1])
opened = open_server_log(folder, port=8001, argv=["vllm", "serve"], field="log_dir")
opened.handle.close()
print(opened.path)
"""


@pytest.mark.skipif(not hasattr(os, "O_PATH"), reason="O_PATH is Linux's")
def test_a_drop_box_log_folder_is_a_folder_to_log_into(tmp_path):
    """A folder where files can be made but not listed (1733, another user's): the log is made
    there. Root without DAC override stands for that user (see test_checkpoint_unreadable)."""
    box = tmp_path / "box"
    box.mkdir()
    os.chown(box, 65534, 65534)
    box.chmod(0o1733)
    without_override = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search"]
    done = subprocess.run(
        [*without_override, sys.executable, "-c", DROP_BOX, str(box)],
        capture_output=True, text=True, timeout=60, check=False,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == str(box / "vllm-serve-8001.log")
    assert (box / "vllm-serve-8001.log").read_text().startswith("--- verirl ")


@pytest.mark.parametrize("stream", ["stdout", "stderr"])
def test_a_log_path_that_is_the_program_s_own_output_file_is_refused(tmp_path, stream):
    """``log_path="/dev/stdout"`` with stdout a regular file was accepted: the server's lines went
    in among the program's own, which overwrote them."""
    script = (
        "import sys\n"
        "from verirl import ConfigError, VLLMServer\n"
        f"server = VLLMServer('m', port=1, devices=(0,), log_path='/dev/{stream}',\n"
        "                     command=(sys.executable, '-c', 'pass'))\n"
        "try:\n"
        "    server.start()\n"
        "except ConfigError as exc:\n"
        "    print(exc, file=sys.stderr if sys.argv[1] == 'stdout' else sys.stdout)\n"
        "finally:\n"
        "    server.stop()\n"
    )
    output = tmp_path / "output"
    with output.open("w") as sink:
        other = subprocess.run(
            [sys.executable, "-c", script, stream], text=True, timeout=60, check=False,
            **{stream: sink, "stdout" if stream == "stderr" else "stderr": subprocess.PIPE},
        )  # fmt: skip
    shown = other.stderr if stream == "stdout" else other.stdout
    refusal = f"log_path='/dev/{stream}': must be a file of its own: it is this program's {stream}"
    assert refusal in shown, (shown, output.read_text())


def test_a_log_that_took_a_closed_stdout_s_number_is_no_output_of_the_program(tmp_path):
    """A daemon started with stdout closed (``>&-``): its log file gets descriptor 1, and was
    then refused as "this program's stdout" (compared with itself)."""
    script = (
        "import sys\n"
        "from verirl.server.log import open_server_log\n"
        "opened = open_server_log(__import__('pathlib').Path(sys.argv[1]), port=1, argv=['x'])\n"
        "sys.stderr.write(f'fd {opened.handle.fileno()}\\n')\n"
    )
    log = tmp_path / "server.log"
    result = subprocess.run(
        ["/bin/sh", "-c", 'exec "$@" >&-', "sh", sys.executable, "-c", script, str(log)],
        capture_output=False, stderr=subprocess.PIPE, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stderr.strip() == "fd 1"  # the log took the closed stdout's number
    assert log.read_text().startswith("--- verirl ")


# ---------------------------------------------------------------- blank lines at the end


_OOM = "CUDA out of memory: tried to allocate 20 GiB"


@pytest.mark.parametrize(
    "blanks",
    [
        "' \\n' * 40000",  # 80 KB of lines of one space: more than the 64 KiB window
        "('\\r' + ' ' * 120 + '\\r\\n') * 2000",  # a progress bar's erase lines
        "' \\t\\r\\n\\x0b\\x0c' * 30000",  # every kind of blank
        "'\\n' * 3_000_000",  # 3 MB of empty lines
    ],
)
def test_blank_lines_at_the_end_of_the_log_never_hide_why_the_server_died(servers, blanks):
    """More than 64 KiB of blank lines after the line that says why: the tail was "" and the
    message said the log was empty (it held the line, 80 KB on)."""
    program = f"import sys; print({_OOM!r}); sys.stdout.write({blanks}); sys.exit(1)"
    server = servers(command=(sys.executable, "-c", program))
    with pytest.raises(VLLMServerExited) as caught:
        server.start()
    assert caught.value.log_tail.endswith(_OOM + "\n"), caught.value.log_tail[-200:]
    assert server.log_tail(1) == _OOM + "\n"
    message = str(caught.value)
    assert message.endswith(f"--- last lines of the server log ---\n| {_OOM}"), message[-300:]
    assert "empty" not in message


def test_a_last_line_whose_trailing_blanks_fill_the_window_is_shown_without_them(tmp_path):
    path = tmp_path / "x.log"
    path.write_bytes(b"loading\nERROR: died\t" + b" " * 70_000 + b"\r\n" + b" \n" * 50_000)
    assert read_log_tail(path) == "loading\nERROR: died\n"
    assert read_log_tail(path, lines=1) == "ERROR: died\n"


def test_a_log_ending_in_more_blanks_than_are_read_says_so_reading_a_bounded_amount(
    tmp_path, monkeypatch
):
    """Gigabytes of blank lines cannot stall a start: a few MiB are read, then the tail says that
    they are blank (never that the log is empty)."""
    path = tmp_path / "x.log"
    with path.open("wb") as log:
        log.write(f"{_OOM}\n".encode())
        for _ in range(40):
            log.write(b" \r\n" * (1 << 18))  # 30 MiB in all
    read: list[int] = []
    real = _log_tail.read_regular

    def counted(where: object, start: int, limit: int) -> tuple[int, bytes] | None:
        result = real(where, start, limit)  # type: ignore[arg-type]
        read.append(len(result[1]) if result else 0)
        return result

    monkeypatch.setattr(_log_tail, "read_regular", counted)
    tail = read_log_tail(path)
    assert tail == "\u2026 (the last 4 MiB of the server log are blank)\n"
    assert sum(read) <= 4 * 1024 * 1024 + 64 * 1024
    message = str(VLLMServerExited(1, tail, str(path)))
    assert "the last 4 MiB of the server log are blank" in message
    assert "empty" not in message
    assert "empty or blank" in str(VLLMServerExited(1, " \n", str(path)))  # never just "empty"


_UNSEEN = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b[@-Z\\-_]?")

_BLANK_PIECE = st.lists(
    st.sampled_from(
        [
            b" ",
            b"\t",
            b"\r",
            b"\n",
            b"\r\n",
            b"\x0b",
            b"\x0c",
            b"\xc2\x85",
            b"\x1b[2K",
            b"\x1b[A",
            b"\x1b[0m",
            b"\x1b[1;32m",
            b"\x1b",
        ]
    ),
    min_size=1,
    max_size=8,
).filter(lambda piece: any(brk in b"".join(piece) for brk in (b"\r", b"\n", b"\x0b")))


@settings(
    max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    run=st.lists(_LINE, max_size=60),
    piece=_BLANK_PIECE,
    times=st.integers(min_value=0, max_value=40_000),
    lines=st.integers(min_value=1, max_value=80),
)
def test_the_tail_is_the_last_lines_that_are_not_blank_however_many_blank_ones_follow(
    tmp_path, run, piece, times, lines
):
    path = tmp_path / "tail.log"
    earlier = b"--- verirl header\n"
    body = b"\n".join(run) + b"".join(piece) * times
    path.write_bytes(earlier + body)
    tail = read_log_tail(path, lines=lines, start=len(earlier))
    shown = body.decode("utf-8", errors="replace").splitlines()
    while shown and not _UNSEEN.sub("", shown[-1]).strip():  # terminal controls are unseen
        shown.pop()
    expected = shown[-lines:]
    assert tail == ("\n".join(expected) + "\n" if expected else "")


# ---------------------------------------------------------------- doctor says what launch does


_ENTRIES: dict[str, tuple[bool | None, tuple[tuple[str, ...], ...]]] = {
    "missing": (True, ()),
    "regular file": (True, (("write", "LOG"),)),
    "link to a file": (True, (("write", "place/f"), ("link", "LOG", "{place}/f"))),
    "link to nowhere, in a folder there": (True, (("link", "LOG", "{place}/made.log"),)),
    "relative link to nowhere": (True, (("link", "LOG", "../place/made.log"),)),
    "link to a link to nowhere": (
        True,
        (("link", "place/hop", "made.log"), ("link", "LOG", "{place}/hop")),
    ),
    "link into a missing folder": (False, (("link", "LOG", "{place}/missing/x.log"),)),
    "link to a folder": (False, (("link", "LOG", "{place}"),)),
    "link to itself": (False, (("link", "LOG", "{name}"),)),
    "links in a loop": (False, (("link", "logs/b", "{name}"), ("link", "LOG", "b"))),
    "link with a trailing slash": (False, (("link", "LOG", "{place}/new/"),)),
    "link to a file with a trailing slash": (
        False,
        (("write", "place/f"), ("link", "LOG", "{place}/f/")),
    ),
    "link through a file": (False, (("write", "place/f"), ("link", "LOG", "{place}/f/x.log"))),
    "link to a dot": (False, (("link", "LOG", "."),)),
    "link to a missing folder's dot-dot": (False, (("link", "LOG", "missing/.."),)),
    "link to the root": (False, (("link", "LOG", "/"),)),
    "40 links": (True, (("chain", "40"),)),
    "41 links": (False, (("chain", "41"),)),  # Linux follows 40
    "FIFO": (False, (("fifo", "LOG"),)),
    "link to a FIFO": (False, (("fifo", "place/p"), ("link", "LOG", "{place}/p"))),
    "folder": (False, (("mkdir", "LOG"),)),
    "socket": (False, (("socket", "LOG"),)),
    "link to /dev/null": (False, (("link", "LOG", "/dev/null"),)),
    "read-only file": (False, (("write", "LOG"), ("chmod", "LOG", "444"))),
    "read-only folder": (False, (("chmod", "logs", "555"),)),
    "link into a read-only folder": (
        False,
        (("chmod", "place", "555"), ("link", "LOG", "{place}/made.log")),
    ),
    "link into a folder it cannot search": (
        False,
        (("chmod", "place", "600"), ("link", "LOG", "{place}/made.log")),
    ),
    "full file system, nothing there": (False, ()),
    "read-only mount, nothing there": (False, ()),
    "read-only mount, a file": (False, (("write", "LOG"),)),
    "another user's file in a sticky folder": (  # fs.protected_regular decides
        None,
        (("chmod", "logs", "1777"), ("write", "LOG"), ("chown", "LOG"), ("chmod", "LOG", "666")),
    ),
}
"""Each kind of entry at the log's path: whether launch takes it (None: the machine's settings
say), and how it is made (``LOG``: the log's path; others under the test's folder)."""


def _put(steps: tuple[tuple[str, ...], ...], root: Path, log: Path) -> None:
    """Make an `_ENTRIES` entry: ``log`` in ``root/logs``, what it points to in ``root/place``."""
    for step, name, *rest in steps:
        path = log if name == "LOG" else root / name
        if step == "write":
            path.write_text("an earlier run\n")
        elif step == "link":
            path.symlink_to(rest[0].format(place=root / "place", name=log.name))
        elif step == "chain":  # the log, a link to a link ... (that many) to a file to make
            names = [log.name, *(f"link{n}" for n in range(1, int(name)))]
            for at, onward in zip(names, [*names[1:], "made.log"], strict=True):
                (log.parent / at).symlink_to(onward)
        elif step == "fifo":
            os.mkfifo(path)
        elif step == "mkdir":
            path.mkdir()
        elif step == "chmod":
            path.chmod(int(rest[0], 8))
        elif step == "chown":
            os.chown(path, 65534, 65534)
        else:  # a socket, bound by a relative name: a long temp path is too long for one
            here = Path.cwd()
            os.chdir(path.parent)
            try:
                listener = socket.socket(socket.AF_UNIX)
                listener.bind(path.name)
                listener.close()
            finally:
                os.chdir(here)


_AS_ROOT = hasattr(os, "geteuid") and os.geteuid() == 0


def _tree(root: Path) -> list[tuple[str, str, int, int]]:
    """Everything under ``root``: each entry's path, what it is, its size and mtime."""
    found = []
    for folder, names, files in os.walk(root):
        for name in sorted([*names, *files]):
            info = os.lstat(Path(folder) / name)
            kind = stat.filemode(info.st_mode)
            found.append((str(Path(folder) / name), kind, info.st_size, info.st_mtime_ns))
    return sorted(found)


@pytest.mark.parametrize("entry", sorted(_ENTRIES))
def test_doctor_says_of_whatever_is_at_the_log_s_path_what_launch_does(tmp_path, entry):
    """doctor passed a dangling link that launch refused ("cannot be opened ... (No such file or
    directory)"): its look followed the link and read "missing" as "launch makes it". Each kind
    of entry, through the real commands: doctor's exit code and words are launch's."""
    if entry.startswith(("read-only mount", "full")) and not (_AS_ROOT and shutil.which("unshare")):
        pytest.skip("a mount of the test's own needs root and unshare")
    if entry.startswith("another user's") and not _AS_ROOT:
        pytest.skip("a file of another user's needs root to make")
    port = str(unshared_port())
    logs, place = tmp_path / "logs", tmp_path / "place"
    logs.mkdir()
    place.mkdir()
    log = logs / f"vllm-serve-{port}.log"
    expected, steps = _ENTRIES[entry]
    _put(steps, tmp_path, log)
    environ = clean_environ(
        tmp_path, VERIRL_VLLM_COMMAND=f"{sys.executable} -m fakes.vllm_serve",
        VERIRL_GPU_COUNT="2", VERIRL_MODEL="m", VERIRL_VLLM_PORT=port,
        VERIRL_VLLM_LOG_DIR=str(logs), VERIRL_VLLM_STARTUP_TIMEOUT="60",
        PYTHONPATH=os.pathsep.join(sys.path),
    )  # fmt: skip
    wrap: list[str] = []
    if entry.startswith("read-only mount"):  # in a mount namespace of its own: gone with it
        remount = 'mount --bind "$0" "$0" && mount -o remount,bind,ro "$0" && exec "$@"'
        wrap = ["unshare", "-m", "sh", "-c", remount, str(logs)]
    if entry.startswith("full"):  # a 64 KiB file system, filled (round 51: doctor passed it)
        fill = (
            'mount -t tmpfs -o size=64k tmpfs "$0" && '
            '{ dd if=/dev/zero of="$0/fill" bs=4k 2>/dev/null; exec "$@"; }'
        )
        wrap = ["unshare", "-m", "sh", "-c", fill, str(logs)]
    if _AS_ROOT:  # root without DAC override stands for a user whom permissions bind
        wrap += ["setpriv", "--bounding-set", "-dac_override,-dac_read_search"]

    def verirl(*argv: str) -> subprocess.CompletedProcess[str]:
        return while_the_group_port_is_free(
            lambda: subprocess.run(
                [*wrap, sys.executable, "-m", "verirl", *argv],
                capture_output=True,
                text=True,
                env=environ,
                timeout=120,
                check=False,
            )
        )

    try:
        before = _tree(tmp_path)
        doctor = verirl("doctor")
        assert _tree(tmp_path) == before, "doctor made or changed something"
        launch = verirl("launch", "--", "true")
    finally:
        for folder in (logs, place):  # to be removed
            folder.chmod(0o755)
    assert launch.returncode in (0, 2), launch.stderr
    if expected is not None:
        assert launch.returncode == (0 if expected else 2), launch.stderr
    assert doctor.returncode == launch.returncode, (doctor.stderr, launch.stderr)
    if launch.returncode == 2:
        (refusal,) = [line for line in launch.stderr.splitlines() if " ERROR " in line]
        reason = refusal.split("ERROR verirl: ", 1)[1]
        assert str(logs) in reason, reason
        assert any(line.endswith(reason) for line in doctor.stderr.splitlines()), (
            reason,
            doctor.stderr,
        )


_JUDGE_BOTH = """
import json, sys
from pathlib import Path
from verirl.server.log import open_server_log
from verirl.server.log_check import check_server_log
from verirl.errors import ConfigError

said = []
for judge in (check_server_log, open_server_log):
    try:
        extra = {} if judge is check_server_log else {"argv": ["vllm", "serve"]}
        opened = judge(Path(sys.argv[1]), port=8001, **extra)
        if opened is not None:
            opened.handle.close()
        said.append(None)
    except ConfigError as exc:
        said.append(str(exc))
print(json.dumps(said))
"""


@pytest.mark.parametrize(
    "parent",
    ["missing", "missing, two deep", "a folder through a link", "a file", "a link to nowhere",
     "under a file", "a read-only folder", "missing, in a read-only folder"],
)  # fmt: skip
def test_a_log_path_s_folder_that_start_makes_is_judged_as_start_judges_it(tmp_path, parent):
    """``log_path``'s missing folder is made at start (``mkdir -p``): the preflight said nothing
    of one that could not be made (a file or a link to nowhere in its place)."""
    folder = tmp_path / "logs"
    if parent == "missing, two deep":
        folder = tmp_path / "deep" / "logs"
    elif parent == "a folder through a link":
        (tmp_path / "real").mkdir()
        folder.symlink_to(tmp_path / "real")
    elif parent == "a file":
        folder.write_text("mine\n")
    elif parent == "a link to nowhere":
        folder.symlink_to(tmp_path / "nowhere")
    elif parent == "under a file":
        (tmp_path / "plain").write_text("mine\n")
        folder = tmp_path / "plain" / "logs"
    elif parent == "a read-only folder":
        folder = tmp_path / "ro"
        folder.mkdir(mode=0o555)
    elif parent == "missing, in a read-only folder":
        (tmp_path / "ro").mkdir(mode=0o555)
        folder = tmp_path / "ro" / "a" / "logs"
    requested = folder / "server.log"
    wrap = ["setpriv", "--bounding-set", "-dac_override,-dac_read_search"] if _AS_ROOT else []
    try:
        done = subprocess.run(
            [*wrap, sys.executable, "-c", _JUDGE_BOTH, str(requested)],
            capture_output=True, text=True, timeout=60, check=False,
            env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
        )  # fmt: skip
    finally:
        if (tmp_path / "ro").exists():
            (tmp_path / "ro").chmod(0o755)
    assert done.returncode == 0, done.stderr
    doctor, launch = json.loads(done.stdout)
    assert doctor == launch
    accepted = parent in ("missing", "missing, two deep", "a folder through a link")
    assert (launch is None) == accepted, launch


@pytest.mark.parametrize("depth", [1, 600])
def test_doctor_judges_a_log_path_under_many_missing_folders_as_start_makes_them(tmp_path, depth):
    """start makes them all (``mkdir -p``); doctor's look walks them up without recursion."""
    path = tmp_path.joinpath(*["a"] * depth, "x.log")
    _log_check.check_server_log(path, port=8001)  # as start, which makes them: no error
    (tmp_path / "a").write_text("a file where the first folder goes")
    with pytest.raises(ConfigError, match="its folder cannot be made"):
        _log_check.check_server_log(path, port=8001)
    assert not (tmp_path / "a").is_dir()


@pytest.mark.parametrize("shift", range(8))
def test_a_control_sequence_cut_by_a_piece_read_backwards_is_still_blank(tmp_path, shift):
    """The tail is looked for backwards, 64 KiB at a time: an erase sequence a piece's start cut
    in two (``\\x1b[12;`` below, ``34H`` above) was taken for text, and the tail came out empty."""
    path = tmp_path / "x.log"
    blob = bytearray(b"REAL LAST LINE\n" + b"\r\n" * 300_000)
    sequence = b"\x1b[12;34H\r\n"
    for piece in range(1, 6):
        at = len(blob) - piece * _log_tail._BLANK_CHUNK - shift
        blob[at : at + len(sequence)] = sequence
    path.write_bytes(bytes(blob))
    assert read_log_tail(path, lines=1) == "REAL LAST LINE\n"


@pytest.mark.parametrize("json_flag", [[], ["--json"]], ids=["text", "json"])
@pytest.mark.parametrize("stream", ["stdout", "stderr"])
def test_launch_refuses_a_server_log_that_is_its_own_output_with_json_too(
    tmp_path, stream, json_flag
):
    """Round 50: ``launch --json`` sends its command's output to stderr by moving descriptor 1, so
    a log linked to the real stdout file was compared with stderr and accepted: the server's lines
    followed the JSON document. Refused either way, and named as the stream it is."""
    port = unshared_port()
    logs = tmp_path / "logs"
    logs.mkdir()
    output = tmp_path / "output"
    (logs / f"vllm-serve-{port}.log").symlink_to(output)
    argv = [sys.executable, "-m", "verirl", *json_flag, "launch", "--gpus", "2", "--model", "m",
            "--vllm-port", str(port), "--vllm-command", f"{sys.executable} -c pass",
            "--log-dir", str(logs), "--", "true"]  # fmt: skip
    other = "stderr" if stream == "stdout" else "stdout"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    with output.open("w") as sink:
        result = subprocess.run(
            argv, text=True, timeout=120, check=False, env=env,
            **{stream: sink, other: subprocess.PIPE},
        )  # fmt: skip
    assert result.returncode == 2
    said = (result.stdout if other == "stdout" else result.stderr) + output.read_text()
    assert f"must be a file of its own: it is this program's {stream}" in said, said
    if json_flag and stream == "stdout":
        document = json.loads(output.read_text())  # the one document, nothing after it
        assert document["exit_code"] == 2, document


def test_a_long_control_sequence_cut_by_a_piece_is_still_blank(tmp_path):
    """Round 51: a colour sequence of 40 characters, cut by a 64 KiB piece, was taken for text."""
    path = tmp_path / "x.log"
    sequence = b"\x1b[0;1;4;38;2;255;128;0;48;2;10;20;30m"
    path.write_bytes(b"REAL ERROR LINE\n" + sequence * 5000 + b"\n" * 26)
    assert read_log_tail(path, lines=3) == "REAL ERROR LINE\n"


def test_a_control_sequence_cut_where_the_blank_lines_read_end_is_still_blank(tmp_path):
    """Round 51: the 4 MiB looked at began inside an erase sequence; its end was shown."""
    path = tmp_path / "x.log"
    path.write_bytes(b"E\n" + b"\x1b[2K\r" * (8 * 1024 * 1024 // 5))
    assert read_log_tail(path, lines=3) == "\u2026 (the last 4 MiB of the server log are blank)\n"

"""The readiness wait watches the server's log: a ready line cuts the nap short, never more."""

from __future__ import annotations

import logging
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from _support import unshared_port
from verirl.errors import VLLMStartupTimeout
from verirl.server.readiness import FAST_BACKOFF, READY_LOG_LINES, LogWatch, Nap
from verirl.vllm_server import VLLMServer

FAKE = (sys.executable, "-m", "fakes.vllm_serve")


def append(path: Path, data: bytes) -> None:
    with path.open("ab") as handle:
        handle.write(data)


# ---------------------------------------------------------------- LogWatch


@pytest.mark.parametrize("line", READY_LOG_LINES)
def test_log_watch_fires_once_on_each_ready_line(tmp_path, line):
    log = tmp_path / "server.log"
    log.write_bytes(b"INFO Loading model\n")
    watch = LogWatch(log)
    assert not watch.fired()
    append(log, b"INFO:     " + line + b" (more)\n")
    assert watch.fired()
    assert not watch.fired(), "the same line fires once"
    append(log, b"INFO:     172.0.0.1 GET /health 200\n")
    assert not watch.fired()


def test_log_watch_finds_a_line_written_in_two_pieces(tmp_path):
    log = tmp_path / "server.log"
    log.write_bytes(b"")
    watch = LogWatch(log)
    append(log, b"INFO:     Uvicorn runn")
    assert not watch.fired()
    append(log, b"ing on http://127.0.0.1:8000\n")
    assert watch.fired()


def test_log_watch_ignores_what_came_before_its_offset(tmp_path):
    """An appended log holds earlier runs: their ready lines say nothing about this one."""
    log = tmp_path / "server.log"
    log.write_bytes(b"INFO:     Uvicorn running on http://127.0.0.1:8000\n--- verirl run 2\n")
    watch = LogWatch(log, offset=log.stat().st_size)
    assert not watch.fired()
    append(log, b"INFO:     Application startup complete.\n")
    assert watch.fired()


def test_log_watch_of_a_missing_or_unreadable_log_never_fires(tmp_path):
    assert not LogWatch(tmp_path / "absent.log").fired()
    folder = tmp_path / "a-folder"
    folder.mkdir()
    assert not LogWatch(folder).fired()


# ---------------------------------------------------------------- Nap


def nap_in_thread(nap: Nap, seconds: float) -> threading.Thread:
    thread = threading.Thread(target=nap, args=(seconds,))
    thread.start()
    return thread


def test_a_ready_line_ends_a_long_nap_and_later_naps_are_short(tmp_path):
    log = tmp_path / "server.log"
    log.write_bytes(b"")
    nap = Nap(threading.Event(), LogWatch(log))
    thread = nap_in_thread(nap, 600.0)
    append(log, b"INFO:     Uvicorn running on http://127.0.0.1:8000\n")
    thread.join(timeout=30)
    assert not thread.is_alive(), "the nap slept on after the ready line"
    # From then on the nap is at most the fast backoff's interval, whatever it is asked.
    started = time.monotonic()
    nap(600.0)
    assert time.monotonic() - started < 30
    assert nap.fast is not None
    assert FAST_BACKOFF.cap <= 0.1


def test_stop_ends_the_nap_and_other_lines_do_not(tmp_path):
    log = tmp_path / "server.log"
    log.write_bytes(b"")
    stopping = threading.Event()
    nap = Nap(stopping, LogWatch(log))
    thread = nap_in_thread(nap, 600.0)
    append(log, b"INFO Loading model weights took 0.01 GiB\n")
    thread.join(timeout=0.3)
    assert thread.is_alive(), "a line that does not say the server is up ended the nap"
    stopping.set()
    thread.join(timeout=30)
    assert not thread.is_alive()
    assert nap.fast is None


def test_a_nap_without_a_log_sleeps_its_time(tmp_path):
    nap = Nap(threading.Event(), None)
    started = time.monotonic()
    nap(0.05)
    assert time.monotonic() - started >= 0.05


# ---------------------------------------------------------------- VLLMServer


@pytest.fixture
def make_server(tmp_path):
    made: list[VLLMServer] = []

    def make(**kwargs: object) -> VLLMServer:
        kwargs.setdefault("port", unshared_port())
        kwargs.setdefault("command", FAKE)
        kwargs.setdefault("log_path", tmp_path / f"server-{len(made)}.log")
        kwargs.setdefault("shutdown_timeout", 5.0)
        server = VLLMServer("fake/model", **kwargs)  # type: ignore[arg-type]
        made.append(server)
        return server

    yield make
    for server in made:
        server.stop()


LOGS_FIRST = """
import http.server, sys, time
port = int(sys.argv[sys.argv.index("--port") + 1])
print("INFO:     Application startup complete.", flush=True)
print(f"INFO:     Uvicorn running on http://127.0.0.1:{port} (Press CTRL+C)", flush=True)
time.sleep(1.0)  # no probe can succeed before the line is in the log


class Health(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args):
        pass


http.server.HTTPServer(("127.0.0.1", port), Health).serve_forever()
"""


def test_the_server_is_probed_at_once_when_its_log_says_it_is_up(make_server, caplog, tmp_path):
    """A program that logs that it is up a second before it answers: the line wakes the wait.

    (The fake server answers as it logs, so there a scheduled probe may win the race with
    the 10 ms log watch on a loaded machine; here only the log can come first.)
    """
    caplog.set_level(logging.DEBUG, logger="verirl.vllm_server")
    program = tmp_path / "logs_first.py"
    program.write_text(LOGS_FIRST)
    server = make_server(command=(sys.executable, str(program)), startup_timeout=60.0)
    with server:
        assert server.running
    woken = [r for r in caplog.records if "logged that it is up" in r.getMessage()]
    assert len(woken) == 1


def test_a_ready_line_alone_never_makes_the_server_ready(make_server, tmp_path):
    """A program that logs uvicorn's lines but never answers /health times out."""
    liar = tmp_path / "liar.py"
    liar.write_text(
        textwrap.dedent(
            """
            import time
            print("INFO:     Application startup complete.", flush=True)
            print("INFO:     Uvicorn running on http://127.0.0.1:1 (Press CTRL+C)", flush=True)
            time.sleep(600)
            """
        )
    )
    server = make_server(command=(sys.executable, str(liar)), startup_timeout=1.5)
    with pytest.raises(VLLMStartupTimeout) as raised:
        server.start()
    assert "Uvicorn running on" in str(raised.value)
    assert not server.running

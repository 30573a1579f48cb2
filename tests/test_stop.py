"""The stop-request registry between verirl's watchdogs and a clean-stopping training loop."""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest

from verirl._stop import StopRequests
from verirl.errors import VLLMServerExited


def test_a_request_without_a_listener_is_refused():
    stops = StopRequests()
    assert stops.request(VLLMServerExited(-9, "tail")) is False
    assert stops.requested is None
    assert not stops.listening


def test_listeners_get_the_error_and_the_first_request_is_kept():
    stops = StopRequests()
    seen: list[BaseException] = []
    remove = stops.listen(seen.append)
    first, second = VLLMServerExited(-9, "a"), VLLMServerExited(1, "b")
    assert stops.listening
    assert stops.request(first) is True
    assert stops.request(second) is True
    assert seen == [first, second]
    assert stops.requested is first
    remove()
    remove()  # idempotent
    assert not stops.listening
    stops.reset()
    assert stops.requested is None


def test_a_failing_listener_does_not_stop_the_others(caplog):
    stops = StopRequests()
    seen: list[BaseException] = []

    def broken(_error: BaseException) -> None:
        raise RuntimeError("boom")

    stops.listen(broken)
    stops.listen(seen.append)
    error = VLLMServerExited(-9, "tail")
    assert stops.request(error) is True
    assert seen == [error]
    assert "a stop listener failed" in caplog.text


def test_requests_from_other_threads_reach_the_listener():
    stops = StopRequests()
    got = threading.Event()
    stops.listen(lambda _error: got.set())
    thread = threading.Thread(target=stops.request, args=(VLLMServerExited(-9, ""),))
    thread.start()
    thread.join(timeout=5)
    assert got.wait(timeout=5)


def test_a_signal_handler_may_remove_a_listener_while_the_main_thread_holds_the_lock(tmp_path):
    # PreemptionCallback's handler removes its listener; the main thread may be inside the
    # registry then (here: removing that same listener). A plain lock hangs: run it apart.
    script = tmp_path / "reentry.py"
    script.write_text(
        "import os, signal\n"
        "from verirl._stop import StopRequests\n"
        "stops = StopRequests()\n"
        "remove = stops.listen(print)\n"
        "class Firing:\n"
        "    def __init__(self, lock):\n"
        "        self.lock, self.armed = lock, True\n"
        "    def __enter__(self):\n"
        "        self.lock.__enter__()\n"
        "        if self.armed:\n"
        "            self.armed = False\n"
        "            os.kill(os.getpid(), signal.SIGUSR1)  # handled here, the lock held\n"
        "        return self\n"
        "    def __exit__(self, *exc):\n"
        "        return self.lock.__exit__(*exc)\n"
        "signal.signal(signal.SIGUSR1, lambda *_: remove())\n"
        "stops._lock = Firing(stops._lock)\n"
        "remove()\n"
        "print('listening' if stops.listening else 'removed')\n"
    )
    try:
        done = subprocess.run(
            [sys.executable, str(script)], capture_output=True, text=True, timeout=60, check=False
        )
    except subprocess.TimeoutExpired:
        pytest.fail("deadlock: the handler waited for the lock the main thread holds")
    assert (done.returncode, done.stdout) == (0, "removed\n"), done.stderr

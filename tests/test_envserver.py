from __future__ import annotations

import contextlib
import errno
import itertools
import logging
import socket
import time

import pytest
import requests
import responses

from _support import FakeClock
from fakes import FakeEnvServer, FakeEnvServerProbe
from verirl import Backoff, ConfigError, EnvServerProbe, EnvServerUnavailable, HttpEnvServerProbe
from verirl._poll import poll

URL = "http://env.test:8000"


def probe(clock: FakeClock, **kwargs) -> HttpEnvServerProbe:
    return HttpEnvServerProbe(URL, clock=clock, sleep=clock.sleep, **kwargs)


# -- construction


@pytest.mark.parametrize(
    "url",
    ["env.test:8000", "ftp://env.test", "http://", "http://:80/x", "", "http://h:99999", 8000],
)
def test_bad_url_is_config_error_naming_it(url):
    with pytest.raises(ConfigError, match=r"url=") as info:
        HttpEnvServerProbe(url)
    assert repr(url) in str(info.value)


@pytest.mark.parametrize(
    "url", ["http://u:SECRET\\PW9@127.0.0.1:1", "http://127.0.0.1:1\\x", "http://h\\@e/x"]
)
def test_a_backslash_is_refused_and_a_password_before_it_never_shown(url):
    # urllib3 ends the host at a backslash, urllib.parse does not: its error quoted the password
    with pytest.raises(ConfigError, match="backslash") as info:
        HttpEnvServerProbe(url)
    assert "SECRET" not in str(info.value)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"request_timeout": 0}, "request_timeout"),
        ({"request_timeout": -1.0}, "request_timeout"),
        ({"request_timeout": True}, "request_timeout"),
        ({"health_path": "health"}, "health_path"),
        ({"progress_every": 0}, "progress_every"),
    ],
)
def test_bad_options_are_config_errors(kwargs, field):
    with pytest.raises(ConfigError, match=rf"^{field}="):
        HttpEnvServerProbe(URL, **kwargs)


@pytest.mark.parametrize("timeout", [-1, "5", None, True])
def test_bad_wait_timeout(timeout):
    with pytest.raises(ConfigError, match=r"^timeout="):
        HttpEnvServerProbe(URL).wait(timeout)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [({"initial": 0}, "initial"), ({"factor": 0.5}, "factor"), ({"initial": 2, "cap": 1}, "cap")],
)
def test_bad_backoff(kwargs, field):
    with pytest.raises(ConfigError, match=rf"^{field}="):
        Backoff(**kwargs)


def test_real_and_fake_probes_satisfy_the_protocol():
    assert isinstance(HttpEnvServerProbe(URL), EnvServerProbe)
    assert isinstance(FakeEnvServerProbe(), EnvServerProbe)


def test_health_url_joins_path():
    assert HttpEnvServerProbe(URL + "/").health_url == URL + "/health"
    assert HttpEnvServerProbe(URL, health_path="/ready/").health_url == URL + "/ready/"
    assert HttpEnvServerProbe(URL + "/ping", health_path="").health_url == URL + "/ping"


# -- check(): one request, never raises


@responses.activate
def test_check_true_on_200_false_otherwise():
    responses.get(URL + "/health", status=200)
    responses.get(URL + "/health", status=503)
    responses.get(URL + "/health", body=requests.ConnectionError("Connection refused"))
    p = HttpEnvServerProbe(URL)
    assert p.check() is True
    assert p.check() is False
    assert p.check() is False


@responses.activate
def test_check_never_raises_even_on_unexpected_errors():
    responses.get(URL + "/health", body=RuntimeError("boom"))
    assert HttpEnvServerProbe(URL).check() is False


# -- wait(): deadline and backoff, on virtual time


@responses.activate
def test_wait_backs_off_exponentially_up_to_cap():
    clock = FakeClock()
    for _ in range(8):
        responses.get(URL + "/health", status=503)
    responses.get(URL + "/health", status=200)
    probe(clock, backoff=Backoff(initial=0.02, factor=2, cap=1.0)).wait(timeout=60)
    assert clock.sleeps == pytest.approx([0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.0, 1.0])
    assert len(responses.calls) == 9


@responses.activate
def test_default_wait_sends_at_most_five_requests_a_second_once_backed_off():
    """A shared reward server must not be hammered by a waiting job, nor noticed late."""
    clock = FakeClock()
    responses.get(URL + "/health", status=503)
    with pytest.raises(EnvServerUnavailable):
        probe(clock).wait(timeout=60)
    assert clock.sleeps[:4] == pytest.approx([0.02, 0.04, 0.08, 0.16])
    assert clock.sleeps[4:-1] == pytest.approx([0.2] * (len(clock.sleeps) - 5))
    assert 5 * 60 - 5 <= len(responses.calls) <= 5 * 60 + 5


@responses.activate
def test_wait_raises_with_url_elapsed_and_last_error():
    clock = FakeClock()
    responses.get(URL + "/health", status=503)
    with pytest.raises(EnvServerUnavailable) as info:
        probe(clock).wait(timeout=5)
    err = info.value
    assert err.url == URL
    assert err.last_error == "HTTP 503"
    assert err.elapsed == pytest.approx(5.0)
    assert isinstance(err, TimeoutError)
    # Sleeps never overshoot the deadline.
    assert sum(clock.sleeps) == pytest.approx(5.0)


@responses.activate
def test_wait_reports_connection_refused_and_timeouts():
    clock = FakeClock()
    refused = ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused")
    responses.get(URL + "/health", body=requests.ConnectionError(refused))
    with pytest.raises(EnvServerUnavailable, match="connection refused"):
        probe(clock).wait(timeout=1)
    responses.replace(responses.GET, URL + "/health", body=requests.ReadTimeout("read timed out"))
    with pytest.raises(EnvServerUnavailable, match="timed out"):
        probe(clock).wait(timeout=1)
    dns = socket.gaierror(socket.EAI_NONAME, "Name or service not known")
    responses.replace(responses.GET, URL + "/health", body=requests.ConnectionError(dns))
    with pytest.raises(EnvServerUnavailable, match="DNS lookup failed"):
        probe(clock).wait(timeout=1)
    # The text is never searched: only a refused connection is "connection refused".
    text_only = requests.ConnectionError("[Errno 111] Connection refused")
    responses.replace(responses.GET, URL + "/health", body=text_only)
    with pytest.raises(EnvServerUnavailable, match=r"connection error \(ConnectionError\)"):
        probe(clock).wait(timeout=1)
    responses.replace(responses.GET, URL + "/health", body=requests.TooManyRedirects("loop"))
    with pytest.raises(EnvServerUnavailable, match="TooManyRedirects"):
        probe(clock).wait(timeout=1)


@responses.activate
def test_wait_zero_timeout_tries_once():
    """One request, no sleep. Its budget is ~0 s of real time, so it may time out under load."""
    clock = FakeClock()
    responses.get(URL + "/health", status=200)
    with contextlib.suppress(EnvServerUnavailable):
        probe(clock).wait(timeout=0)
    assert len(responses.calls) == 1
    assert clock.sleeps == []


@responses.activate
def test_request_timeout_is_clipped_to_time_left():
    clock = FakeClock()
    seen: list[float] = []

    def callback(request):
        seen.append(request.req_kwargs["timeout"])
        clock.now += 0.7  # each request takes 0.7 s of virtual time
        return (503, {}, "")

    responses.add_callback(responses.GET, URL + "/health", callback=callback)
    with pytest.raises(EnvServerUnavailable):
        probe(clock, request_timeout=5.0).wait(timeout=2.0)
    assert seen[0] == pytest.approx(2.0)
    assert all(t <= 2.0 for t in seen)
    assert seen[-1] < seen[0]


@responses.activate
def test_progress_logged_at_most_every_interval(caplog):
    caplog.set_level(logging.INFO, logger="verirl.envserver")
    clock = FakeClock()
    responses.get(URL + "/health", status=503)
    with pytest.raises(EnvServerUnavailable):
        probe(clock, progress_every=10.0).wait(timeout=35)
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0].startswith("waiting up to 35s")
    still = [line for line in lines if line.startswith("still waiting")]
    assert 2 <= len(still) <= 3
    assert "HTTP 503" in still[0]


@responses.activate
def test_session_is_used_when_given():
    responses.get(URL + "/health", status=200)
    session = requests.Session()
    session.headers["X-Probe"] = "yes"
    with session:
        HttpEnvServerProbe(URL, session=session).wait(timeout=1)
    assert responses.calls[0].request.headers["X-Probe"] == "yes"


# -- real loopback servers


def test_wait_against_real_server_that_comes_up(caplog):
    caplog.set_level(logging.INFO, logger="verirl.envserver")
    with FakeEnvServer(ready_after=0.3) as server:
        HttpEnvServerProbe(server.url).wait(timeout=10)
        lag = time.monotonic() - (server.ready_at or 0)
        assert server.is_ready()
    # Noticed within one backoff step of the server turning healthy (cap 1 s).
    assert lag < 1.0
    assert any("healthy after" in r.getMessage() for r in caplog.records)


def test_wait_against_server_answering_500():
    with FakeEnvServer(ready_after=None, status_when_not_ready=500) as server:
        with pytest.raises(EnvServerUnavailable, match="HTTP 500"):
            # Long enough that a loaded machine still sees an answer, not only a time-out.
            HttpEnvServerProbe(server.url).wait(timeout=2.0)
        assert server.requests >= 3


def test_deadline_holds_when_server_accepts_but_never_answers():
    with FakeEnvServer(hang=True) as server:
        p = HttpEnvServerProbe(server.url, request_timeout=30.0)
        start = time.monotonic()
        with pytest.raises(EnvServerUnavailable) as info:
            p.wait(timeout=1.0)
        took = time.monotonic() - start
    assert info.value.last_error == "timed out"
    assert 1.0 <= took < 1.0 + 10  # the deadline, with room for a loaded machine; not 30 s


def test_refused_connection_against_closed_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    p = HttpEnvServerProbe(f"http://127.0.0.1:{port}")
    assert p.check() is False
    with pytest.raises(EnvServerUnavailable, match="connection refused"):
        p.wait(timeout=2.0)  # a 0.2 s whole-request budget can run out on a loaded machine


def test_fake_server_scripting():
    with FakeEnvServer(ready_after=None) as server:
        p = HttpEnvServerProbe(server.url)
        assert not p.check()
        server.set_ready()
        assert p.check()
        server.set_ready(False)
        assert not p.check()
        assert not HttpEnvServerProbe(server.url, health_path="/other").check()
        assert server.paths[-1] == "/other"
    with pytest.raises(RuntimeError, match="not started"):
        _ = server.url


# -- the shipped fake probe


def test_fake_probe_scripted_checks_and_waits():
    fake = FakeEnvServerProbe(ready_after_checks=2)
    assert [fake.check(), fake.check(), fake.check()] == [False, False, True]
    fake.wait(timeout=3)
    assert fake.waits == [3]


def test_fake_probe_never_ready():
    fake = FakeEnvServerProbe(ready_after_checks=None)
    assert not fake.check()
    with pytest.raises(EnvServerUnavailable, match="never ready"):
        fake.wait(timeout=0)


def test_fake_probe_delay_beyond_timeout_fails():
    fake = FakeEnvServerProbe(wait_delay=0.05)
    with pytest.raises(EnvServerUnavailable):
        fake.wait(timeout=0.01)
    start = time.monotonic()
    fake.wait(timeout=1)
    assert time.monotonic() - start >= 0.05


def test_poll_intervals_run_start_to_start_so_slow_answers_keep_the_schedule():
    """An attempt that takes 0.15 s of a 0.2 s interval leaves a 0.05 s sleep, never more."""
    clock = FakeClock()
    started: list[float] = []

    def slow_attempt(_time_left: float) -> str:
        started.append(clock.now)
        clock.now += 0.15
        return "HTTP 503"

    result = poll(
        slow_attempt,
        timeout=2.0,
        backoff=Backoff(initial=0.2, cap=0.2),
        clock=clock,
        sleep=clock.sleep,
    )
    assert not result.ready
    gaps = [later - earlier for earlier, later in itertools.pairwise(started)]
    assert gaps == pytest.approx([0.2] * len(gaps))
    assert clock.sleeps[:-1] == pytest.approx([0.05] * (len(clock.sleeps) - 1))


def test_poll_follows_an_attempt_slower_than_its_interval_at_once():
    clock = FakeClock()
    started: list[float] = []

    def slower_attempt(_time_left: float) -> str:
        started.append(clock.now)
        clock.now += 0.5
        return "timed out"

    poll(
        slower_attempt,
        timeout=2.0,
        backoff=Backoff(initial=0.2, cap=0.2),
        clock=clock,
        sleep=clock.sleep,
    )
    assert clock.sleeps == []
    assert started == pytest.approx([100.0, 100.5, 101.0, 101.5])


def test_poll_schedule_does_not_drift_with_late_wake_ups():
    """Each nap oversleeping by 10 ms does not push the next attempts later and later."""
    clock = FakeClock()
    started: list[float] = []

    def attempt(_time_left: float) -> str:
        started.append(clock.now)
        return "HTTP 503"

    def late_sleep(seconds: float) -> None:
        clock.sleep(seconds + 0.01)

    poll(attempt, timeout=2.0, backoff=Backoff(initial=0.2, cap=0.2), clock=clock, sleep=late_sleep)
    due = [100.0 + 0.2 * k for k in range(len(started))]
    assert all(0 <= s - d <= 0.0101 for s, d in zip(started, due, strict=True)), started

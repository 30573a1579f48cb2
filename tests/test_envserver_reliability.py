"""Regression tests for the env-server probe items of issue 9, on real loopback servers.

Proxies (item 9), a whole-request deadline (item 10), non-finite timeouts
(item 13), URL and option validation (items 14, 15), and URL credentials that
must never show up in a repr, a log line or an error.
"""

from __future__ import annotations

import io
import logging
import math
import ssl
import threading
import time
from collections.abc import Iterator

import pytest
import requests
import requests.adapters

from _support import FakeClock, LoopbackServer, loopback_server
from fakes import FakeEnvServer, FakeEnvServerProbe
from verirl import Backoff, ConfigError, EnvServerUnavailable, HttpEnvServerProbe
from verirl._http import deadline_session
from verirl._url import validate_http_url

SLACK = 5.0
"""What a loaded 2-core machine may add to a deadline in these tests."""

PROXY_VARS = ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")


# -- loopback helpers


@pytest.fixture
def proxy(monkeypatch) -> Iterator[LoopbackServer]:
    """A loopback "proxy" that records every request and answers 502."""
    with loopback_server(lambda _request: (502, {}, b"")) as server:
        yield server


def _use_proxy(monkeypatch, url: str, names=PROXY_VARS) -> None:
    for name in (*PROXY_VARS, "NO_PROXY", "no_proxy", "REQUEST_METHOD"):
        monkeypatch.delenv(name, raising=False)
    for name in names:
        monkeypatch.setenv(name, url)


# -- item 9: loopback never goes through a proxy


@pytest.mark.parametrize("host", ["127.0.0.1", "127.0.0.2", "localhost", "::1"])
@pytest.mark.parametrize("variable", ["HTTP_PROXY", "http_proxy", "ALL_PROXY", "all_proxy"])
def test_loopback_never_goes_through_the_environment_proxy(monkeypatch, proxy, host, variable):
    bind = "127.0.0.1" if host == "localhost" else host
    with FakeEnvServer(host=bind) as server:
        url = server.url.replace(bind, host) if host == "localhost" else server.url
        _use_proxy(monkeypatch, proxy.url, (variable,))
        probe = HttpEnvServerProbe(url)
        assert probe.check() is True
        probe.wait(timeout=5)
        assert server.requests == 2
    assert proxy.hits == []


def test_loopback_ignores_a_proxy_set_on_the_users_session(monkeypatch, proxy):
    _use_proxy(monkeypatch, proxy.url)
    with FakeEnvServer() as server, requests.Session() as session:
        session.proxies = {"http": proxy.url, "all": proxy.url}
        assert HttpEnvServerProbe(server.url, session=session).check() is True
    assert proxy.hits == []


@pytest.mark.parametrize("own_session", [False, True])
def test_a_redirect_between_loopback_hosts_does_not_go_through_the_proxy(
    monkeypatch, proxy, own_session
):
    with FakeEnvServer(health_path="/health/") as target:
        location = target.url.replace("127.0.0.1", "localhost") + "/health/"
        with loopback_server(lambda _request: (307, {"Location": location}, b"")) as redirector:
            _use_proxy(monkeypatch, proxy.url)
            session = requests.Session() if own_session else None
            try:
                assert HttpEnvServerProbe(redirector.url, session=session).check() is True
            finally:
                if session is not None:
                    session.close()
            assert redirector.hits == ["GET /health"]
        assert target.paths == ["/health/"]
    assert proxy.hits == []


def test_other_hosts_still_use_the_environment_proxy(monkeypatch):
    """The decision for non-loopback hosts: the environment's proxy is honoured."""
    with loopback_server(lambda _request: (200, {}, b"")) as healthy_proxy:
        _use_proxy(monkeypatch, healthy_proxy.url, ("HTTP_PROXY",))
        assert HttpEnvServerProbe("http://env.example:8000").check() is True
        assert healthy_proxy.hits == ["GET http://env.example:8000/health"]


# -- item 10: the deadline bounds the whole request


def test_trickling_server_cannot_hold_a_wait_past_its_deadline():
    with FakeEnvServer(trickle=0.2) as server:
        probe = HttpEnvServerProbe(server.url, request_timeout=30.0)
        start = time.monotonic()
        with pytest.raises(EnvServerUnavailable) as info:
            probe.wait(timeout=1.0)
        took = time.monotonic() - start
    assert info.value.last_error == "timed out"
    assert 1.0 <= took < 1.0 + SLACK


def test_trickling_server_cannot_hold_a_check_past_request_timeout():
    with FakeEnvServer(trickle=0.2) as server:
        start = time.monotonic()
        assert HttpEnvServerProbe(server.url, request_timeout=1.0).check() is False
        took = time.monotonic() - start
    assert took < 1.0 + SLACK


def test_trickling_server_that_finishes_in_time_is_healthy():
    with FakeEnvServer(trickle=0.001) as server:
        HttpEnvServerProbe(server.url).wait(timeout=30)


def test_with_the_users_session_a_late_answer_counts_as_timed_out():
    """The documented limit: a user's session bounds each read, and a late answer is not healthy."""
    with (
        FakeEnvServer(trickle=0.01) as server,
        requests.Session() as session,
        pytest.raises(EnvServerUnavailable) as info,
    ):
        HttpEnvServerProbe(server.url, session=session).wait(timeout=0.2)
    assert info.value.last_error == "timed out"


def test_probe_leaves_no_thread_behind():
    before = set(threading.enumerate())
    with FakeEnvServer(trickle=0.2) as server:
        with pytest.raises(EnvServerUnavailable):
            HttpEnvServerProbe(server.url).wait(timeout=0.3)
        mine = set(threading.enumerate()) - before
        assert all(
            t.name.startswith("fake-env-server") or "process_request" in t.name for t in mine
        )


# A self-signed certificate for localhost and 127.0.0.1, valid 2000-2100 (test data, no secret).
CERT = """-----BEGIN CERTIFICATE-----
MIIBZjCCAQ2gAwIBAgIBATAKBggqhkjOPQQDAjAUMRIwEAYDVQQDDAlsb2NhbGhv
c3QwIBcNMDAwMTAxMDAwMDAwWhgPMjEwMDAxMDEwMDAwMDBaMBQxEjAQBgNVBAMM
CWxvY2FsaG9zdDBZMBMGByqGSM49AgEGCCqGSM49AwEHA0IABEm/8I4j5PgSJcPe
YweZqnk8beYmPkS09xYMF/OHzICT/yefUGUEDRB8F+KRbcoNBXqwkrVYUtPPG2b5
UFljsQ2jTjBMMBoGA1UdEQQTMBGCCWxvY2FsaG9zdIcEfwAAATAPBgNVHRMBAf8E
BTADAQH/MB0GA1UdDgQWBBSHc8C5k9vY7/XCk4AXRbvVG+Y2qjAKBggqhkjOPQQD
AgNHADBEAiAJWDjDXGvGzZ7pm/mROSbElElQAlyVVjJGWZdMYAxODwIgJWCwIrwU
iHHTJZwKVEIlc1XiYPZmotHZUXDT3cRs3wk=
-----END CERTIFICATE-----
"""
KEY = """-----BEGIN PRIVATE KEY-----
MIGHAgEAMBMGByqGSM49AgEGCCqGSM49AwEHBG0wawIBAQQghRTSe38jPB5Dik/Q
BJOmqTSwkBcyM/tMFwRUUeTBDuqhRANCAARJv/COI+T4EiXD3mMHmap5PG3mJj5E
tPcWDBfzh8yAk/8nn1BlBA0QfBfikW3KDQV6sJK1WFLTzxtm+VBZY7EN
-----END PRIVATE KEY-----
"""


@pytest.fixture
def tls(tmp_path, monkeypatch) -> tuple[ssl.SSLContext, str]:
    """A server context for the test certificate, and the file a client trusts it from."""
    for name in ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"):  # they would beat session.verify
        monkeypatch.delenv(name, raising=False)
    cert, key = tmp_path / "cert.pem", tmp_path / "key.pem"
    cert.write_text(CERT)
    key.write_text(KEY)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    return context, str(cert)


def test_https_is_healthy_through_a_deadline_session(tls):
    context, cafile = tls
    with FakeEnvServer(ssl_context=context) as server, deadline_session() as session:
        session.verify = cafile
        HttpEnvServerProbe(server.url, session=session).wait(timeout=30)
        assert server.url.startswith("https://")


def test_trickling_https_server_cannot_hold_a_wait_past_its_deadline(tls):
    context, cafile = tls
    with FakeEnvServer(ssl_context=context, trickle=0.2) as server, deadline_session() as session:
        session.verify = cafile
        start = time.monotonic()
        with pytest.raises(EnvServerUnavailable) as info:
            HttpEnvServerProbe(server.url, session=session).wait(timeout=1.0)
        took = time.monotonic() - start
    assert info.value.last_error == "timed out"
    assert took < 1.0 + SLACK


# -- item 13: non-finite and absurd numbers


@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan, 1e30, 10**400, 86_400.5])
def test_request_timeout_must_be_finite_and_sane(value):
    with pytest.raises(ConfigError, match=r"^request_timeout=") as info:
        HttpEnvServerProbe("http://127.0.0.1:1", request_timeout=value)
    assert info.value.field == "request_timeout"


def test_largest_request_timeout_still_works():
    with FakeEnvServer() as server:
        assert HttpEnvServerProbe(server.url, request_timeout=86_400).check() is True


@pytest.mark.parametrize("value", [math.inf, math.nan, 1e30, -math.inf])
def test_wait_timeout_must_be_finite(value):
    with pytest.raises(ConfigError, match=r"^timeout="):
        HttpEnvServerProbe("http://127.0.0.1:1").wait(value)


@pytest.mark.parametrize("value", [math.inf, math.nan, 1e30])
def test_progress_every_must_be_finite(value):
    with pytest.raises(ConfigError, match=r"^progress_every="):
        HttpEnvServerProbe("http://127.0.0.1:1", progress_every=value)


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"initial": "x"}, "initial"),
        ({"initial": math.nan}, "initial"),
        ({"initial": math.inf}, "initial"),
        ({"initial": None}, "initial"),
        ({"factor": "2"}, "factor"),
        ({"factor": math.nan}, "factor"),
        ({"factor": math.inf}, "factor"),
        ({"cap": math.inf}, "cap"),
        ({"cap": math.nan}, "cap"),
        ({"cap": [1]}, "cap"),
        ({"initial": True}, "initial"),
    ],
)
def test_backoff_rejects_wrong_types_and_non_finite_numbers(kwargs, field):
    with pytest.raises(ConfigError, match=rf"^{field}=") as info:
        Backoff(**kwargs)
    assert info.value.field == field


# -- item 14: URLs


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:8000/?x=1",
        "http://127.0.0.1:8000/health?",
        "http://127.0.0.1:8000/#top",
        "http://127.0.0.1:8000#",
        " http://127.0.0.1:8000",
        "http://127.0.0.1:8000 ",
        "http://127.0.0.1 :8000",
        "http://127.0.0.1:8000/a b",
        "http://127.0.0.1:8000\n",
        "http://127.0.0.1:8000/\x00",
        "http://127.0.0.1\t:8000",
        "http://h\u00e9te:8000",
        "http://127.0.0.1:8000/\u00e9",
        "http://\u0663:8000",
        "http://h:0",
        "http://h:99999",
        "http://h:-1",
        "http://h:",
        "http://h:8_0",
        "http://h:\u0663",
        "http://[::1",
        "http://[zz]:80",
        "http://::1:80",
        "http://a..b:80",
        "http://.a:80",
        "http://a_b!:80",
        "http://@:80",
        "http:///x",
        "http:127.0.0.1:80",
        "https://",
    ],
)
def test_bad_urls_are_config_errors_naming_the_field(url):
    with pytest.raises(ConfigError, match=r"^url=") as info:
        HttpEnvServerProbe(url)
    assert info.value.field == "url"
    with pytest.raises(ConfigError, match=r"^endpoint="):
        validate_http_url("endpoint", url)


@pytest.mark.parametrize(
    "url",
    [
        "http://127.0.0.1:8000",
        "https://env.example/api/",
        "HTTP://Env.Example:80/x",
        "http://[::1]:8000",
        "http://env_server:8000",
        "http://localhost.:8000",
        "http://xn--bcher-kva.example",
        "http://user:pw@127.0.0.1:8000",
        "http://127.0.0.1:8000/a%20b;c=d@e",
    ],
)
def test_good_urls_are_kept(url):
    assert validate_http_url("url", url) == url


SECRET = "s3cr3t-pass"


def _leaks(text: str) -> bool:
    return SECRET in text or "s3cr3t" in text


@pytest.mark.parametrize(
    "url",
    [
        f"http://user:{SECRET}@h:99999",
        f"http://user:{SECRET}@h/?q",
        f"http://user:{SECRET}@[::1",
        f"http://user:{SECRET}@h\n",
        f"http://user:{SECRET}/x@h",
        f"http://{SECRET}@h:0",
        f"ftp://user:{SECRET}@h",
        f"http://u:{SECRET}#pw@127.0.0.1:1",
        f"http://u:{SECRET}@127.0.0.1:1/\x01",
        f"u:{SECRET}//x@h",
        f"ftp:{SECRET}//x@h:1",
    ],
)
def test_config_errors_never_show_a_url_password(url):
    with pytest.raises(ConfigError) as info:
        HttpEnvServerProbe(url)
    assert not _leaks(str(info.value))
    assert not _leaks(repr(info.value))
    assert not _leaks(repr(info.value.value))


def test_url_password_is_used_but_never_shown(caplog):
    caplog.set_level(logging.DEBUG)
    with FakeEnvServer(ready_after=None) as server:
        url = server.url.replace("http://", f"http://user:{SECRET}@")
        probe = HttpEnvServerProbe(url)
        assert not _leaks(repr(probe))
        assert not _leaks(probe.url)
        assert not _leaks(probe.health_url)
        assert probe.url == server.url.replace("http://", "http://***@")
        assert not probe.check()
        with pytest.raises(EnvServerUnavailable) as info:
            probe.wait(timeout=0.2)
        assert server.authorizations[-1] == "Basic dXNlcjpzM2NyM3QtcGFzcw=="  # user:s3cr3t-pass
    err = info.value
    for text in (str(err), repr(err), err.url, err.last_error or ""):
        assert not _leaks(text)
    for record in caplog.records:
        assert not _leaks(record.getMessage())
        assert not _leaks(record.exc_text or "")


def test_redact_url():
    from verirl._secrets import redact_url

    assert redact_url("http://u:p@h:1/x") == "http://***@h:1/x"
    assert redact_url("http://h:1/x@y") == "http://***@y"  # an @ anywhere: over-redact, never leak
    assert redact_url("http://u@h") == "http://***@h"
    assert redact_url("http://h") == "http://h"


# -- item 15: wrong types are ConfigErrors naming the field


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"backoff": "fast"}, "backoff"),
        ({"backoff": 1.0}, "backoff"),
        ({"backoff": None}, "backoff"),
        ({"session": "requests"}, "session"),
        ({"session": 5}, "session"),
        ({"session": requests.Session}, "session"),
        ({"health_path": "/he alth"}, "health_path"),
        ({"health_path": "/health\x00"}, "health_path"),
        ({"health_path": "/health\n"}, "health_path"),
        ({"health_path": "/health?full=1"}, "health_path"),
        ({"health_path": "/health#x"}, "health_path"),
        ({"health_path": "/h\u00e9alth"}, "health_path"),
        ({"health_path": 5}, "health_path"),
        ({"health_path": None}, "health_path"),
        ({"clock": "monotonic"}, "clock"),
        ({"sleep": 0.1}, "sleep"),
        ({"request_timeout": "5"}, "request_timeout"),
        ({"progress_every": None}, "progress_every"),
    ],
)
def test_wrong_option_types_are_config_errors(kwargs, field):
    with pytest.raises(ConfigError, match=rf"^{field}=") as info:
        HttpEnvServerProbe("http://127.0.0.1:1", **kwargs)
    assert info.value.field == field


class _BrokenAdapter(requests.adapters.BaseAdapter):
    """A transport that fails in a way requests does not expect."""

    def send(self, *_args: object, **_kwargs: object) -> requests.Response:
        raise RuntimeError("transport bug")

    def close(self) -> None:
        pass


def test_unexpected_transport_errors_never_escape_check_or_wait():
    with requests.Session() as session:
        session.mount("http://", _BrokenAdapter())
        probe = HttpEnvServerProbe("http://127.0.0.1:1", session=session)
        assert probe.check() is False
        with pytest.raises(EnvServerUnavailable) as info:
            probe.wait(timeout=0.1)
    assert "RuntimeError" in (info.value.last_error or "")


# -- the shipped fake probe follows the same contract


@pytest.mark.parametrize("timeout", [math.inf, math.nan, -1, "5", None])
def test_fake_probe_validates_wait_timeout_like_the_real_one(timeout):
    with pytest.raises(ConfigError, match=r"^timeout="):
        FakeEnvServerProbe().wait(timeout)


class _SlowToAnswer(requests.adapters.BaseAdapter):
    """A transport: HTTP 503 when given time to answer, a timeout when the budget is tiny."""

    def send(self, request, *_args, timeout=None, **_kwargs):
        budget = timeout[1] if isinstance(timeout, tuple) else timeout
        if budget is not None and budget < 0.05:
            raise requests.Timeout("read timed out")
        response = requests.Response()
        response.status_code = 503
        response.url = request.url
        response.raw = io.BytesIO(b"")
        response.request = request
        return response

    def close(self):
        pass


def test_a_last_request_cut_short_by_the_deadline_keeps_the_real_reason():
    clock = FakeClock()
    with requests.Session() as session:
        session.mount("http://", _SlowToAnswer())
        probe = HttpEnvServerProbe(
            "http://127.0.0.1:9/", session=session, clock=clock, sleep=clock.sleep
        )
        with pytest.raises(EnvServerUnavailable) as info:
            probe.wait(1.0)
    assert info.value.last_error == "HTTP 503"


@pytest.mark.parametrize(
    "userinfo", ["u:%E2%82%AC", "u:p%E2%82%ACss", "%E2%82%AC:pw", "u:%FF", "%F0%9F%94%91"]
)
def test_credentials_http_basic_auth_cannot_send_are_a_config_error_at_once(userinfo):
    """Percent-decoded outside Latin-1: every request would fail; nothing of them is shown."""
    url = f"http://{userinfo}@127.0.0.1:1/"
    with pytest.raises(ConfigError) as caught:
        HttpEnvServerProbe(url)
    message = str(caught.value)
    assert "HTTP basic auth cannot send" in message
    assert userinfo.split(":")[-1] not in message
    assert "\u20ac" not in message


def test_latin1_credentials_are_sent_as_requests_sends_them():
    with FakeEnvServer() as server:
        host = server.url.split("//", 1)[1]
        probe = HttpEnvServerProbe(f"http://u:p%C3%A9ss@{host}")
        assert probe.check()

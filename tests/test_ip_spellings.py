"""Hex, octal and short IPv4 spellings: refused as URL hosts, and seen as loopback.

A resolver reads ``0x7f000001``, ``0x7f.1``, ``0177.0.0.1``, ``017700000001``
and ``127.1`` as ``127.0.0.1`` (``inet_aton``), so a URL with such a host
reaches this machine. A validated URL must name its IPv4 host as a dotted
quad, so the loopback and same-port checks see the address that is reached;
those checks read the other spellings as loopback too, for URLs that were
never validated (a redirect's ``Location``).
"""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest

from _support import LoopbackServer, loopback_server
from fakes import FakeEnvServer
from verirl import ConfigError, HttpEnvServerProbe
from verirl._http import deadline_session, request_health
from verirl._this_host import _names_this_host
from verirl._url import is_loopback_host, validate_http_url
from verirl.checkpoints.hub import HubCheckpointSource
from verirl.runtime import TrainingRuntime

LOOPBACK_SPELLINGS = [
    "0x7f000001",
    "0X7F000001",
    "0x7f.1",
    "0x7f.0.0.1",
    "0177.0.0.1",
    "017700000001",
    "127.1",
    "2130706433",
    "0x7f.0x0.0x0.0x1",
]

PROXY_VARS = ("HTTP_PROXY", "http_proxy", "HTTPS_PROXY", "https_proxy", "ALL_PROXY", "all_proxy")


# -- validation: every URL host must be a dotted quad when it is an IPv4 address


@pytest.mark.parametrize("host", LOOPBACK_SPELLINGS)
def test_a_url_with_a_non_canonical_ipv4_host_is_refused_with_a_hint(host):
    url = f"http://{host}:8000/"
    with pytest.raises(ConfigError) as caught:
        validate_http_url("url", url)
    message = str(caught.value)
    assert caught.value.field == "url"
    assert message.startswith(f"url={url!r}:")
    assert f"invalid IPv4 address {host!r}" in message
    assert "dotted quad, e.g. '127.0.0.1'" in message


@pytest.mark.parametrize(
    ("host", "canonical"),
    [("0xa000001", "10.0.0.1"), ("012.0.0.1", "10.0.0.1"), ("10.1", "10.0.0.1"),
     ("0xc0.0xa8.1", "192.168.0.1")],
)  # fmt: skip
def test_the_hint_gives_the_address_the_spelling_reaches(host, canonical):
    with pytest.raises(ConfigError, match=rf"dotted quad, e\.g\. '{canonical}'"):
        validate_http_url("url", f"http://{host}/")


def test_a_trailing_dot_spelling_is_refused_too():
    with pytest.raises(ConfigError, match=r"invalid IPv4 address '0x7f000001\.'"):
        validate_http_url("url", "http://0x7f000001.:8000/")


def test_the_hint_never_shows_a_password():
    url = "http://user:s3cret@0x7f000001:8000/"
    with pytest.raises(ConfigError) as caught:
        validate_http_url("url", url)
    assert "s3cret" not in str(caught.value)
    assert "dotted quad, e.g. '127.0.0.1'" in str(caught.value)


@pytest.mark.parametrize(
    "host", ["127.0.0.1", "10.0.0.1", "dead.beef", "0xdead.beef", "cafe", "a0x1", "example.com"]
)
def test_dotted_quads_and_host_names_are_still_taken(host):
    url = f"http://{host}:8000/"
    assert validate_http_url("url", url) == url


@pytest.mark.parametrize("host", ["08.0.0.1", "1.2.3.256", "1.2.3.4.5"])
def test_numbers_no_resolver_reads_as_an_address_are_refused_without_a_hint(host):
    with pytest.raises(ConfigError, match="invalid IPv4 address") as caught:
        validate_http_url("url", f"http://{host}/")
    assert "dotted quad" not in str(caught.value)


@pytest.mark.parametrize("host", ["0x7f000001", "0x7f.1", "017700000001"])
def test_the_env_probe_refuses_the_spellings(host):
    with pytest.raises(ConfigError, match=rf"^url='http://{host}:8000': .*dotted quad"):
        HttpEnvServerProbe(f"http://{host}:8000")


def test_a_hub_endpoint_refuses_the_spellings(tmp_path: Path):
    with pytest.raises(ConfigError) as caught:
        HubCheckpointSource("org/repo", download_dir=tmp_path, endpoint="http://0x7f000001:9")
    assert caught.value.field == "endpoint"
    assert "dotted quad, e.g. '127.0.0.1'" in str(caught.value)


@pytest.mark.parametrize("host", ["0x7f000001", "0x7f.1", "0x7f.0.0.1", "017700000001"])
def test_an_env_url_on_the_vllm_port_in_another_spelling_is_refused(host):
    with pytest.raises(ConfigError) as caught:
        TrainingRuntime.from_settings(
            gpu_count=2, model="m", vllm_port=9100, env_url=f"http://{host}:9100/", environ={}
        )
    assert caught.value.field == "env_url"
    assert host in str(caught.value)
    assert "dotted quad, e.g. '127.0.0.1'" in str(caught.value)


# -- loopback: what the spellings reach


@pytest.mark.parametrize("host", LOOPBACK_SPELLINGS)
def test_the_spellings_are_loopback(host):
    assert is_loopback_host(host) is True
    assert is_loopback_host(host + ".") is True
    assert _names_this_host(host) is True


@pytest.mark.parametrize("host", ["0xa000001", "10.1", "0x7f000001x", "dead.beef", "0x", "x1"])
def test_other_spellings_are_not_loopback(host):
    assert is_loopback_host(host) is False
    assert _names_this_host(host) is False


def test_an_unspecified_address_spelled_short_names_this_host():
    assert _names_this_host("0") is True
    assert _names_this_host("0x0.0") is True
    assert is_loopback_host("0") is False


def _no_proxy_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in (*PROXY_VARS, "NO_PROXY", "no_proxy", "REQUEST_METHOD"):
        monkeypatch.delenv(name, raising=False)


def _serving(location: str) -> contextlib.AbstractContextManager[LoopbackServer]:
    """A loopback server that answers every request with a 307 to ``location``."""
    return loopback_server(lambda _request: (307, {"Location": location}, b""))


@pytest.mark.parametrize("own_proxies", [False, True])
@pytest.mark.parametrize("host", ["0x7f000001", "0x7f.1", "017700000001"])
def test_a_health_request_to_a_spelled_loopback_host_does_not_go_through_the_proxy(
    monkeypatch, host, own_proxies
):
    """`request_health` takes any URL it is given: its loopback test must know the spellings."""
    with FakeEnvServer() as target:
        port = target.url.rsplit(":", 1)[1]
        with _serving("http://unused.invalid/") as proxy:
            _no_proxy_settings(monkeypatch)
            monkeypatch.setenv("HTTP_PROXY", proxy.url)
            with deadline_session() as session:
                if own_proxies:
                    session.proxies = {"http": proxy.url, "all": proxy.url}
                assert request_health(session, f"http://{host}:{port}/health", 5.0) is None
            assert proxy.hits == []
        assert target.paths == ["/health"]


@pytest.mark.parametrize("host", ["0x7f000001", "0x7f.1", "017700000001"])
def test_a_redirect_to_a_spelled_loopback_host_does_not_go_through_the_proxy(monkeypatch, host):
    """The redirect's target is never validated: it must still be reached directly."""
    with FakeEnvServer(health_path="/health/") as target:
        port = target.url.rsplit(":", 1)[1]
        with _serving("http://unused.invalid/") as proxy:
            with _serving(f"http://{host}:{port}/health/") as redirector:
                _no_proxy_settings(monkeypatch)
                monkeypatch.setenv("HTTP_PROXY", proxy.url)
                assert HttpEnvServerProbe(redirector.url).check() is True
                assert redirector.hits == ["GET /health"]
            assert proxy.hits == []
        assert target.paths == ["/health/"]


@pytest.mark.parametrize("host", ["0x7f000001", "0x7f.1", "0177.0.0.1", "127.1", "2130706433"])
def test_a_host_field_refuses_an_unusual_ipv4_spelling_with_the_address(host):
    """``--vllm-host 0x7f000001`` reaches 127.0.0.1: the same-port checks must see that."""
    from verirl import ConfigError, VLLMTopology

    with pytest.raises(ConfigError, match=r"write it as '127\.0\.0\.1'") as err:
        VLLMTopology.plan(2, max_model_len=1024, remote_host=host)
    assert err.value.field == "remote_host"

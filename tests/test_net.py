"""verirl._net: the one connect host for a bind address, the one port-is-free check."""

from __future__ import annotations

import socket

import pytest

from verirl import VLLMServer, VLLMTopology
from verirl._net import check_port_free, connect_host, find_free_port, port_is_free, url_host
from verirl.errors import ConfigError, PortInUseError


def _has_ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as sock:
            sock.bind(("::1", 0))
    except OSError:
        return False
    return True


needs_ipv6 = pytest.mark.skipif(not _has_ipv6_loopback(), reason="no IPv6 loopback here")


@pytest.mark.parametrize(
    ("host", "expected"),
    [
        ("0.0.0.0", "127.0.0.1"),
        ("", "127.0.0.1"),
        ("::", "::1"),
        ("0:0:0:0:0:0:0:0", "::1"),
        ("127.0.0.1", "127.0.0.1"),
        ("::1", "::1"),
        ("10.1.2.3", "10.1.2.3"),
        ("fe80::1", "fe80::1"),
        ("vllm-node", "vllm-node"),
    ],
)
def test_connect_host_maps_a_wildcard_to_loopback_of_its_family(host, expected):
    assert connect_host(host) == expected


@pytest.mark.parametrize(
    ("host", "expected"),
    [("0.0.0.0", "127.0.0.1"), ("::", "[::1]"), ("fe80::1", "[fe80::1]"), ("node", "node")],
)
def test_url_host_brackets_ipv6(host, expected):
    assert url_host(host) == expected


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "127.0.0.1", "::1"])
def test_every_rank_reaches_the_server_at_the_same_url(host):
    """Rank 0 reads the server's base_url, the ranks above the topology's server_url."""
    topology = VLLMTopology.plan(2, max_model_len=64, host=host, port=8123)
    server = VLLMServer.from_topology(topology, model="m")
    assert server.base_url == topology.server_url
    assert topology.grpo_kwargs()["vllm_server_host"] == connect_host(host)


def test_a_listening_port_is_in_use_and_a_closed_one_free():
    with socket.create_server(("127.0.0.1", 0)) as holder:
        port = holder.getsockname()[1]
        with pytest.raises(PortInUseError) as info:
            check_port_free("127.0.0.1", port)
        assert info.value.port == port
        assert port_is_free(port) is False
    check_port_free("127.0.0.1", port)
    assert port_is_free(port) is True


def test_a_wildcard_listener_makes_the_loopback_port_in_use():
    with socket.create_server(("0.0.0.0", 0)) as holder:
        port = holder.getsockname()[1]
        assert not port_is_free(port, host="127.0.0.1")


def test_a_port_in_time_wait_counts_as_free():
    """A previous server's lingering connections must not block a restart (SO_REUSEADDR)."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]
        client = socket.create_connection(("127.0.0.1", port))
        accepted, _ = listener.accept()
        accepted.close()  # the server side closes first: its end lingers in TIME_WAIT
        client.close()
    assert port_is_free(port)


def test_a_host_that_is_not_this_machine_is_a_config_error():
    with pytest.raises(ConfigError, match=r"host='192\.0\.2\.1'.*not an address of this machine"):
        check_port_free("192.0.2.1", 8001)  # TEST-NET-1: never a local address
    with pytest.raises(ConfigError, match=r"host='no-such-host\.invalid'"):
        check_port_free("no-such-host.invalid", 8001)


def test_find_free_port_avoids_ports_and_finds_a_free_one():
    port = find_free_port(avoid=range(1, 1024))
    assert port >= 1024
    assert port_is_free(port)


@needs_ipv6
def test_find_free_port_on_ipv6_loopback():
    port = find_free_port(host="::1")
    assert port_is_free(port, host="::1")

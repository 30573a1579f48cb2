from __future__ import annotations

import pytest

from verirl import (
    CheckpointNotFoundError,
    CheckpointSourceError,
    ConfigError,
    EnvServerUnavailable,
    PortInUseError,
    VeriRLError,
    VLLMServerError,
    VLLMServerExited,
    VLLMServerUnavailable,
    VLLMServerUnresponsive,
    VLLMStartupTimeout,
)


@pytest.mark.parametrize(
    ("error", "bases"),
    [
        (ConfigError, (VeriRLError, ValueError)),
        (EnvServerUnavailable, (VeriRLError, TimeoutError)),
        (VLLMServerError, (VeriRLError, RuntimeError)),
        (PortInUseError, (VLLMServerError,)),
        (VLLMServerExited, (VLLMServerError,)),
        (VLLMStartupTimeout, (VLLMServerError, TimeoutError)),
        (VLLMServerUnavailable, (VLLMServerError, TimeoutError)),
        (VLLMServerUnresponsive, (VLLMServerExited, VLLMServerError)),
        (CheckpointNotFoundError, (VeriRLError, FileNotFoundError)),
        (CheckpointSourceError, (VeriRLError,)),
    ],
)
def test_tree(error, bases):
    for base in bases:  # each of them: issubclass with a tuple would mean "any of"
        assert issubclass(error, base), base


def test_every_error_is_drawn_in_the_module_docstring():
    import verirl.errors

    doc = verirl.errors.__doc__ or ""
    for name in verirl.errors.__all__:
        assert name in doc


def test_config_error_names_field_and_value():
    err = ConfigError.invalid("port", -1, "must be >= 1")
    assert str(err) == "port=-1: must be >= 1"
    assert (err.field, err.value) == ("port", -1)
    assert str(ConfigError("plain message")) == "plain message"


def test_env_server_unavailable_context():
    err = EnvServerUnavailable("http://h:1", 2.25, "HTTP 503")
    assert (err.url, err.elapsed, err.last_error) == ("http://h:1", 2.25, "HTTP 503")
    assert "http://h:1" in str(err)
    assert "2.2s" in str(err) or "2.3s" in str(err)
    assert "HTTP 503" in str(err)
    assert "none" in str(EnvServerUnavailable("http://h:1", 0.0, None))


def test_server_errors_carry_log_tail():
    exited = VLLMServerExited(3, "loading\nCUDA out of memory\n", "/tmp/x.log")
    assert exited.returncode == 3
    assert "CUDA out of memory" in str(exited)
    assert "/tmp/x.log" in str(exited)
    timeout = VLLMStartupTimeout(1.5, "")
    assert timeout.log_tail == ""
    assert "empty" in str(timeout)
    assert "1.5s" in str(timeout)
    port = PortInUseError(8001)
    assert port.port == 8001
    assert "8001" in str(port)


def test_checkpoint_not_found_names_places():
    err = CheckpointNotFoundError("latest", ["local:/out", "hub:org/repo"])
    assert err.searched == ("local:/out", "hub:org/repo")
    assert "local:/out" in str(err)
    assert "hub:org/repo" in str(err)
    assert "no sources" in str(CheckpointNotFoundError("latest", []))
    assert err.reason is None
    why = CheckpointNotFoundError("/x", ["/x"], reason="/x does not exist")
    assert str(why) == "no checkpoint for '/x': /x does not exist; searched: /x"
    assert (why.request, why.searched, why.reason) == ("/x", ("/x",), "/x does not exist")


def test_an_unresponsive_server_is_an_exited_one_with_where_and_why():
    err = VLLMServerUnresponsive(
        "http://h:1", 30.0, "timed out", log_tail="last line\n", log_path="/l.log"
    )
    assert isinstance(err, VLLMServerExited)
    assert (err.url, err.elapsed, err.last_error) == ("http://h:1", 30.0, "timed out")
    assert err.returncode is None
    assert str(err).startswith("vLLM server http://h:1 did not answer /health for 30.0s")
    assert "(last error: timed out); full log: /l.log" in str(err)
    assert str(err).endswith("last line")


def test_a_server_error_shows_its_log_path_escaped_and_hides_credentials():
    from verirl.errors import VLLMServerExited, VLLMServerUnresponsive, VLLMStartupTimeout

    path = "/tmp/e\x1b[31mX\nFAKE LINE/vllm.log"  # a control character would forge a log line
    tail = "--api-key SeCrEtK1\n"
    for error in (
        VLLMServerExited(3, tail, path),
        VLLMStartupTimeout(5.0, tail, path),
        VLLMServerUnresponsive("http://u:SeCrEtPw9@h:1", 1.0, "x", log_tail=tail, log_path=path),
    ):
        message = str(error)
        assert "\x1b" not in message
        assert "FAKE LINE" not in message.replace("\\nFAKE LINE", "")  # only escaped
        assert "SeCrEt" not in message, message

"""Redaction of credentials in user-given strings (`verirl._secrets`)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from _support import place_hub_token
from verirl._secrets import redact_argv, redact_message, redact_text, redact_url, shown_command
from verirl.errors import ConfigError

SECRET = "s3cretpw"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        # A password may hold any of the characters a URL parser splits on.
        ("http://u:s3cret#pw@127.0.0.1:1", "http://***@127.0.0.1:1"),
        ("http://u:s3cret?pw@127.0.0.1:1", "http://***@127.0.0.1:1"),
        ("http://u:s3cret/pw@127.0.0.1:1/x", "http://***@127.0.0.1:1/x"),
        ("https://u:s3cret@pw@h", "https://***@h"),
        ("http://u:s3cretpw@127.0.0.1:1/\x01", "http://***@127.0.0.1:1/\x01"),
        # Scheme-less values: a host, an address, anything a user typed.
        ("u:s3cretpw@h", "***@h"),
        ("u:s3cret#pw@h:8000", "***@h:8000"),
        ("//u:s3cretpw@h", "***@h"),
        # An @ in the path is redacted too: over-redaction beats a leak.
        ("http://h:1/x@y", "http://***@y"),
        # Nothing to redact.
        ("http://127.0.0.1:8000/health", "http://127.0.0.1:8000/health"),
        ("h:8000", "h:8000"),
        ("", ""),
    ],
)
def test_redact_text_cuts_everything_before_the_last_at(value: str, expected: str) -> None:
    assert redact_text(value) == expected
    assert redact_url(value) == expected


@pytest.mark.parametrize(
    "value",
    [
        "http://u:s3cretpw#x@h",
        "http://u:s3cretpw?x@h",
        "http://u:s3cretpw/x@h",
        "http://u:s3cretpw\\x@h",
        "http://u:s3cretpw[x@h",
        "http://u:s3cretpw@x@h",
        "http://u:s3cretpw%40x@h",
        "u:s3cretpw#@h",
        "http:/u:s3cretpw@h",
        "HTTP://u:s3cretpw@h",
        "ht tp://u:s3cretpw@h",
        "http://u:s3cretpw@h/\x01\x00",
    ],
)
def test_redact_text_never_shows_the_password(value: str) -> None:
    assert SECRET not in redact_text(value)
    assert SECRET not in repr(redact_text(value))
    assert SECRET not in redact_url(value)


# -- the token huggingface_hub finds itself (`implicit_hub_token`) -----------------------------

TOKEN = "hf_SECRETtokenValue0123456789"
# Each one is sent by huggingface_hub as it is (it drops newlines and surrounding spaces only):
# a non-ASCII character fails encoding the header, a space inside makes the Hub answer 401.
BAD_TOKENS = {"non-ASCII": "hf_SECRETtoken12345\u00e967890", "space": "hf_SECRET token1234567890"}


@pytest.fixture
def token_env(monkeypatch, tmp_path):
    """No token from this machine: no variable, the token file huggingface_hub reads in tmp_path."""
    from huggingface_hub import constants

    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_TOKEN_PATH", "HF_OIDC_RESOURCE",
                 "HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):  # fmt: skip
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf-home"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "HF_HUB_DISABLE_IMPLICIT_TOKEN", False)
    path = tmp_path / "hf-home" / "token"
    path.parent.mkdir()
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(path))
    return path


def _fragments(token: str) -> list[str]:
    """Pieces of ``token`` no message may show: its odd character, and its secret part."""
    return ["SECRET", *(char for char in token if not "!" <= char <= "~" and char != " ")]


@pytest.mark.parametrize("kind", sorted(BAD_TOKENS))
@pytest.mark.parametrize("source", ["HF_TOKEN_PATH", "saved login", "HUGGING_FACE_HUB_TOKEN"])
def test_a_token_huggingface_hub_finds_itself_is_checked_and_its_source_named(
    token_env, monkeypatch, tmp_path, source, kind
):
    from huggingface_hub import get_token

    from verirl._hub_token import implicit_hub_token

    token = BAD_TOKENS[kind]
    expected = place_hub_token(source, token, tmp_path, token_env, monkeypatch)
    assert get_token() == token  # what huggingface_hub would send
    with pytest.raises(ConfigError) as info:
        implicit_hub_token()
    message = str(info.value)
    assert message.startswith(expected), message
    assert "a token is printable ASCII without spaces" in message
    for fragment in _fragments(token):
        assert fragment not in message
        assert fragment not in repr(info.value.value)
    assert info.value.__cause__ is None
    assert info.value.__suppress_context__


def test_a_token_file_that_is_not_text_is_a_config_error_naming_it(token_env):
    from huggingface_hub import get_token

    from verirl._hub_token import implicit_hub_token

    token_env.write_bytes(b"hf_SECRETtoken12345\xe967890")  # Latin-1, not UTF-8
    with pytest.raises(UnicodeDecodeError):
        get_token()  # what a request would fail on, inside the Hub client
    with pytest.raises(ConfigError) as info:
        implicit_hub_token()
    message = str(info.value)
    assert message.startswith(f"HF_HOME='{token_env}': the Hub token file there is not text")
    assert "SECRET" not in message
    assert "0xe9" not in message


@pytest.mark.parametrize("source", ["HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "file", "none"])
def test_a_good_token_is_the_one_huggingface_hub_finds(token_env, monkeypatch, source):
    from huggingface_hub import get_token

    from verirl._hub_token import implicit_hub_token

    if source == "file":
        token_env.write_text(f"  {TOKEN}\r\n")  # huggingface_hub drops CR, LF and spaces around
    elif source != "none":
        monkeypatch.setenv(source, f"{TOKEN}\n")
    assert implicit_hub_token() == get_token() == (None if source == "none" else TOKEN)


@pytest.mark.parametrize("why", ["offline", "disabled"])
def test_a_token_huggingface_hub_does_not_send_is_not_checked(token_env, monkeypatch, why):
    from huggingface_hub import constants

    from verirl._hub_token import implicit_hub_token

    token_env.write_text(BAD_TOKENS["space"])
    if why == "offline":
        monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    else:
        monkeypatch.setattr(constants, "HF_HUB_DISABLE_IMPLICIT_TOKEN", True)
    assert implicit_hub_token() is None


def test_scrub_config_error_scrubs_message_value_and_reason():
    from verirl._secrets import scrub_config_error

    error = ConfigError.invalid("endpoint", f"http://h:1/?x={TOKEN}", f"bad {TOKEN}")
    scrubbed = scrub_config_error(error, TOKEN)
    assert (scrubbed.field, scrubbed.value, scrubbed.reason) == (
        "endpoint",
        "http://h:1/?x=<token>",
        "bad <token>",
    )
    assert str(scrubbed) == "endpoint='http://h:1/?x=<token>': bad <token>"


# -- the variables read as huggingface_hub reads them (contract: its own code decides) ---------

_TOKEN_VALUES = [None, "", " ", "\n", "tok_A\r\n", "tok_B"]


@pytest.mark.parametrize("hf_token", _TOKEN_VALUES)
@pytest.mark.parametrize("hub_token", _TOKEN_VALUES)
def test_the_token_variable_is_the_one_huggingface_hub_takes(token_env, monkeypatch, hf_token,
                                                             hub_token):  # fmt: skip
    from huggingface_hub.utils._auth import _get_token_from_environment

    from verirl._hub_token import token_variable

    for name, value in (("HF_TOKEN", hf_token), ("HUGGING_FACE_HUB_TOKEN", hub_token)):
        if value is not None:
            monkeypatch.setenv(name, value)
    found = token_variable(os.environ)
    assert (None if found is None else found[1]) == _get_token_from_environment()


def test_a_blank_hf_token_does_not_hide_a_token_file_huggingface_hub_would_block_on(
    token_env, monkeypatch
):
    """HF_TOKEN=" " wins over HUGGING_FACE_HUB_TOKEN and gives no token: the file is read."""
    from verirl._hub_token import implicit_hub_token

    monkeypatch.setenv("HF_TOKEN", " ")
    monkeypatch.setenv("HUGGING_FACE_HUB_TOKEN", TOKEN)
    os.mkfifo(token_env)
    with pytest.raises(ConfigError) as info:
        implicit_hub_token()  # (before: huggingface_hub blocked reading the FIFO)
    assert str(info.value).startswith(f"HF_HOME='{token_env}': the Hub token file there is a FIFO")


@pytest.mark.parametrize(
    ("variable", "value"),
    [("HF_TOKEN_PATH", ""), ("HF_TOKEN_PATH", "{tmp}/file/token"), ("HF_HOME", "{tmp}/file")],
    ids=["empty-token-path", "token-path-under-a-file", "hf-home-a-file"],
)
def test_a_token_path_huggingface_hub_cannot_read_is_a_config_error_naming_it(
    token_env, monkeypatch, tmp_path, variable, value
):
    from huggingface_hub import constants, get_token

    from verirl._hub_token import implicit_hub_token

    (tmp_path / "file").write_text("not a folder\n")
    monkeypatch.setenv(variable, value.format(tmp=tmp_path))
    default = str(Path(os.environ["HF_HOME"]) / "token")
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", os.environ.get("HF_TOKEN_PATH", default))
    with pytest.raises(OSError, match=r"Is a directory|Not a directory"):
        get_token()  # what every request would fail on, inside the Hub client
    with pytest.raises(ConfigError) as info:
        implicit_hub_token()
    assert info.value.field == variable


_OFFLINE_VALUES = [None, "", "0", "1", "yes"]
_OFFLINE_CASES = [(first, second) for first in _OFFLINE_VALUES for second in _OFFLINE_VALUES]
_HUB_OFFLINE_PROGRAM = """
import importlib, json, os, sys
from huggingface_hub import constants
answers = []
for first, second in json.loads(sys.argv[1]):
    for name, value in (("HF_HUB_OFFLINE", first), ("TRANSFORMERS_OFFLINE", second)):
        os.environ.pop(name, None)
        if value is not None:
            os.environ[name] = value
    answers.append(importlib.reload(constants).is_offline_mode())
print(json.dumps(answers))
"""


def test_offline_mode_is_read_as_huggingface_hub_reads_it(monkeypatch):
    """HF_HUB_OFFLINE=0 turns it off whatever TRANSFORMERS_OFFLINE says, as in huggingface_hub."""
    from huggingface_hub import constants

    from verirl._hub_token import hub_offline

    done = subprocess.run(
        [sys.executable, "-c", _HUB_OFFLINE_PROGRAM, json.dumps(_OFFLINE_CASES)],
        capture_output=True, text=True, check=True, timeout=120,
    )  # fmt: skip
    theirs = json.loads(done.stdout)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)  # what this process saw at import
    ours = []
    for first, second in _OFFLINE_CASES:
        for name, value in (("HF_HUB_OFFLINE", first), ("TRANSFORMERS_OFFLINE", second)):
            monkeypatch.delenv(name, raising=False)
            if value is not None:
                monkeypatch.setenv(name, value)
        ours.append(hub_offline())
    assert ours == theirs
    assert theirs[_OFFLINE_CASES.index(("0", "1"))] is False


# -- token sources that call the network: an OIDC exchange (HF_OIDC_RESOURCE) ----------------

_OIDC_PROGRAM = """
import sys, time
from verirl import CheckpointSourceError, ConfigError, HubCheckpointSource

started = time.monotonic()
try:
    HubCheckpointSource("org/run", endpoint=sys.argv[1], download_dir=sys.argv[2], timeout=1.0)
    print("made")
    HubCheckpointSource(
        "org/run", endpoint=sys.argv[3], download_dir=sys.argv[2], timeout=1.0
    ).latest()
except (CheckpointSourceError, ConfigError) as exc:
    print(type(exc).__name__, round(time.monotonic() - started), exc)
"""


def test_an_oidc_exchange_that_never_answers_is_bounded_by_the_source_s_timeout(tmp_path):
    """huggingface_hub exchanges an OIDC token with no deadline: verirl gives it ``timeout``.

    A bad endpoint is refused at once (its message is scrubbed without any
    exchange), and a listing whose token exchange hangs ends within the
    source's timeout with a message naming the exchange.
    """
    import socket

    with socket.create_server(("127.0.0.1", 0)) as never_answers:  # accepts, never answers
        hang = f"http://127.0.0.1:{never_answers.getsockname()[1]}"
        env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING"))}
        env |= {"HF_ENDPOINT": hang, "HF_OIDC_RESOURCE": "org/run",
                "HF_OIDC_ID_TOKEN": "eyJ.fake.id", "HF_HOME": str(tmp_path / "hf")}  # fmt: skip
        done = subprocess.run(
            [sys.executable, "-c", _OIDC_PROGRAM, "ftp://x", str(tmp_path / "dl"), hang],
            env=env, capture_output=True, text=True, timeout=30, check=False,
        )  # fmt: skip
        never_answers.settimeout(0)
        with pytest.raises(BlockingIOError):  # no exchange was tried (not timed: load varies)
            never_answers.accept()[0].close()
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.startswith("ConfigError "), done.stdout
    assert " endpoint='ftp://x': must start with http" in done.stdout, done.stdout
    done = None
    with socket.create_server(("127.0.0.1", 0)) as never_answers:
        hang = f"http://127.0.0.1:{never_answers.getsockname()[1]}"
        env["HF_ENDPOINT"] = hang
        done = subprocess.run(
            [sys.executable, "-c", _OIDC_PROGRAM, hang, str(tmp_path / "dl"), hang],
            env=env, capture_output=True, text=True, timeout=30, check=False,
        )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    assert lines[0] == "made"
    kind, seconds, message = lines[1].split(" ", 2)
    assert kind == "CheckpointSourceError"
    assert int(seconds) < 10
    assert "OIDC exchange: HF_OIDC_RESOURCE" in message
    assert "within 1s" in message


@pytest.mark.parametrize("why", ["oidc", "disabled"])
def test_a_token_file_huggingface_hub_never_reads_is_never_refused(token_env, monkeypatch, why):
    """With an OIDC exchange, or implicit tokens disabled, the token file is not read."""
    from huggingface_hub import constants
    from huggingface_hub.utils._headers import get_token_to_send

    from verirl._hub_token import implicit_hub_token, refuse_unreadable_token_file

    token_env.mkdir()  # huggingface_hub would fail reading it, were it read
    if why == "oidc":
        monkeypatch.setenv("HF_OIDC_RESOURCE", "org/run")
    else:
        monkeypatch.setattr(constants, "HF_HUB_DISABLE_IMPLICIT_TOKEN", True)
        assert get_token_to_send(None) is None  # contract: huggingface_hub reads nothing
    refuse_unreadable_token_file()
    assert implicit_hub_token() is None


@pytest.mark.parametrize(
    ("text", "secrets", "gone"),
    [
        (
            "invalid choice: 'ab:SEKRIT0k@abcdefgh'",
            ["ab:SEKRIT0k@abcdefgh"],
            ["SEKRIT0k", "abcdefgh"],
        ),
        ("x https://user0:PASSWORD9@host y", ["user0"], ["user0", "PASSWORD9"]),
        ("a hf_SEKRITxx_token=VALUE99 b", ["SEKRITxx"], ["SEKRITxx", "VALUE99"]),
        ("a SEKRIT0k\nkey0123456 b", ["SEKRIT0k\nkey0123456"], ["SEKRIT0k", "key0123456"]),
        ("--api-key=VALUE99 and 'KEYKEY99'", ["KEYKEY99"], ["VALUE99", "KEYKEY99"]),
        ("Authorization: Bearer hf_SEKRITSEKRIT99", ["hf_SEKRITSEKRIT99"], ["SEKRIT"]),
        ("x SEKRITXY@h:pw@hSEKRITXY@h:pw@hSEKRITXY@h", ["SEKRITXY@h"], ["SEKRIT", ":pw"]),
        ("x idden y", ["idden"], ["idden y", "<h<"]),
        ("Authorization: apikey-1a2b3c4d5e", ["apikey-1a2b3c4d5e"], ["apikey", "1a2b"]),
        ("api_key=token.abcdefgh", ["token.abcdefgh"], ["token", "abcdefgh"]),
        # a message cut at a length: the secret's start only
        ("GET https://user:hf_AbCdEfGhIjKl", ["hf_AbCdEfGhIjKlMnOpQrStUv"], ["AbCdEf"]),
    ],
)
def test_redact_and_scrub_hides_what_either_would(text, secrets, gone):
    """Either order alone let a part through (review rounds 40 and 41, T-F2 and U-F1); a
    second pass changes nothing (round 42: an alignment of the two wrote '<<hidden>idden>');
    an auth scheme's word that starts a secret, a secret cut short (round 43)."""
    from verirl._secrets import redact_and_scrub

    shown = redact_and_scrub(text, secrets)
    assert not [part for part in gone if part in shown], shown
    assert shown[:2] == text[:2], shown  # the rest stays
    assert "<<" not in shown, shown
    assert redact_and_scrub(shown, secrets) == shown


@pytest.mark.parametrize("kept", range(1, 25))  # the token: 25 characters
def test_a_message_cut_at_a_length_keeps_no_start_of_a_token(kept):
    """_http, _hub_source and envserver cut their reasons at 200 or 300 characters: cut inside
    a token, the start it kept was no whole form to scrub (review round 44, finding 1)."""
    from verirl._fs import shortened

    token = "hf_AbCdEfGhIjKlMnOpQrStUv"
    text = "x" * 10 + " ConnectionError: https://host/?t=" + token + " (more)"
    limit = text.index(token) + kept - 1
    cut = shortened(text, limit)
    assert len(cut) <= limit + 1
    assert cut.endswith("…")
    assert "AbCd" not in cut
    assert cut.startswith("x" * 10)


def test_a_nul_in_a_message_is_shown_escaped_not_as_hidden():
    from verirl._secrets import redact_and_scrub

    assert redact_and_scrub("a\0\0b", []) == "a\\x00\\x00b"


@pytest.mark.parametrize("password", ["S3crPwd0=", "mytoken=", "a=b", "api_key=", "pwd=x=y"])
@pytest.mark.parametrize(
    "redact",
    [
        redact_text,
        redact_url,
        redact_message,
        lambda text: " ".join(redact_argv(["curl", text])),
        lambda text: " ".join(redact_argv(["sh", "-c", f"curl {text} # don't"])),
        lambda text: str(shown_command(f"curl {text}")),
    ],
    ids=["text", "url", "message", "argv", "shell-line", "command"],
)
def test_a_url_password_that_reads_like_a_parameter_is_hidden(password, redact):
    """A URL password named like a secret parameter (``u:mypwd=@h``) was taken for one: its
    empty value was hidden with the ``@``, and the password was shown (found by hypothesis)."""
    shown = redact(f"http://u:{password}@h/x")
    assert password.split("=", 1)[0] not in shown, shown


@pytest.mark.parametrize(
    "redacted",
    [
        lambda: redact_message("token=ab:cd@SECRETTAIL"),
        lambda: redact_text("https://h/x?token=ab:cd@SECRETTAIL"),
        lambda: redact_message("password=x:@SECRETTAIL"),
        lambda: redact_message("X-Api-Key:abc@SECRETTAIL"),
        lambda: " ".join(redact_argv(["curl", "-H", "X-Api-Key:abc@SECRETTAIL"])),
        lambda: " ".join(redact_argv(["sh", "-c", "vllm --api-key=ab:cd@SECRETTAIL"])),
        lambda: " ".join(redact_argv(["curl", "https://h/x?token=ab:cd@SECRETTAIL"])),
        lambda: str(shown_command("vllm --api-key=ab:cd@SECRETTAIL 'unbalanced")),
        lambda: redact_message("export HF_TOKEN=xy:z@SECRETTAIL"),
        lambda: str(shown_command("curl 'https://h/x?token=ab:cd@SECRETTAIL'")),
    ],
    ids=[
        "key",
        "query",
        "password-key",
        "header",
        "header-arg",
        "flag-in-shell",
        "query-arg",
        "unbalanced",
        "export",
        "quoted-query",
    ],
)
def test_a_secret_holding_a_colon_and_an_at_is_hidden_whole(redacted):
    """A secret value with ``:`` and ``@`` in it (``token=ab:cd@TAIL``) is no URL credential:
    hiding user:password@ before the key passes left its tail shown (review of 3c5ba66)."""
    assert "SECRETTAIL" not in redacted()


HF_USER = "hf_" + "a" * 34


@pytest.mark.parametrize(
    "text",
    [
        f"https://{HF_USER}:SECRETPW@huggingface.co/org/repo",
        f"git clone https://{HF_USER}:SECRETPW@hf.co/x",
        f"{HF_USER}:SECRETPW@host",
        "\ue000 http://u:S3crPwd0=SECRETPW@h/x",
        "\ue000\ue001 http://u:api_key=SECRETPW@h/x",
        "\ue000 http://u:pwd=x=SECRETPW@h/x",
    ],
    ids=[
        "hub-user-url",
        "hub-user-command",
        "hub-user-bare",
        "shield-char",
        "two-shield-chars",
        "shield-char-two-equals",
    ],
)
@pytest.mark.parametrize(
    "redact",
    [redact_text, redact_message, lambda text: " ".join(redact_argv(["git", text]))],
    ids=["text", "message", "argv"],
)
def test_a_url_password_is_hidden_whatever_other_passes_did_around_it(text, redact):
    """A URL password behind a user another pass rewrote (a Hub token), or in a text that
    already holds the private-use character the shield was (review of 9dde7cb)."""
    assert "SECRETPW" not in redact(text)


def test_a_text_holding_every_shield_character_is_still_redacted():
    """Every private-use character in the text left no shield: a StopIteration escaped from an
    error's construction (review of 2724e76). The credential is then hidden outright."""
    text = "".join(map(chr, range(0xE000, 0xF900))) + " https://u:SECRETPW@h"
    assert "SECRETPW" not in redact_message(text)
    assert "SECRETPW" not in redact_text(text)


@pytest.mark.parametrize("blank", ["", " ", "\n"])
def test_a_blank_hub_token_argument_checks_the_token_sent_instead(token_env, tmp_path, blank):
    """A blank ``hub_token`` means none, as a blank HF_TOKEN does: the token huggingface_hub
    sends instead is checked up front for both (review 27: the argument skipped the check)."""
    from verirl import ConfigError, resolver_from_settings

    token_env.write_text("hf_abcdefgh ijklmnop\n")  # a space: no header can carry it
    for given in ({"hub_token": blank}, {}):
        environ = {} if given else {"HF_TOKEN": blank}
        with pytest.raises(ConfigError, match="contains U\\+0020"):
            resolver_from_settings(
                hub_repo_id="a/b", output_dir=str(tmp_path), environ=environ, **given
            )

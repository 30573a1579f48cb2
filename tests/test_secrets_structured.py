"""Class: secrets inside structured values on a logged command line.

vLLM takes credentials inside JSON (``--model-loader-extra-config``'s S3 keys,
``--hf-overrides``, ``--kv-transfer-config``), a header as ``NAME=VALUE``, a
list of keys under a plural flag (``--api-keys``). A secret-named key's value
is hidden wherever it stands (an argv word, a whole shell line, JSON with or
without spaces, nested) and nothing else changes: the line still shows the
structure that was run, quotes included.
"""

from __future__ import annotations

import json
import shlex

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from verirl._hidden import HIDDEN
from verirl._secrets import redact_argv, redact_text, shown_command, shown_line

S3_ID = "AKIAIOSFODNN7EXAMPLE"
S3_SECRET = "wJalrXUtnFEMIK7MDENGbPxRfiCYEXAMPLEKEY"
HF = "hf_abcdefghijklmnopqrstuvwx"
SK = "sk-live-0123456789abcdef"
AUTH = "abc123456789"
GOOG = "AIzaSyA1234567890abcdefghij"

# (flag, object, what the log must show instead): only the secret values become HIDDEN
SAMPLES = [
    (
        "--model-loader-extra-config",
        {"s3_access_key_id": S3_ID, "s3_secret_access_key": S3_SECRET, "s3_endpoint": "http://s3"},
        {"s3_access_key_id": HIDDEN, "s3_secret_access_key": HIDDEN, "s3_endpoint": "http://s3"},
    ),
    ("--hf-overrides", {"token": HF}, {"token": HIDDEN}),
    ("--config", {"api_key": SK, "model": "m"}, {"api_key": HIDDEN, "model": "m"}),
    (
        "--kv-transfer-config",
        {"kv_connector": "X", "kv_connector_extra_config": {"auth_token": AUTH}},
        {"kv_connector": "X", "kv_connector_extra_config": {"auth_token": HIDDEN}},
    ),
    (
        "--hf-overrides",
        {"headers": {"Authorization": f"Bearer {AUTH}"}, "credentials": {"password": SK},
         "api_keys": [SK, HF], "secretAccessKey": S3_SECRET, "rope_theta": 10000},
        {"headers": {"Authorization": HIDDEN}, "credentials": HIDDEN, "api_keys": HIDDEN,
         "secretAccessKey": HIDDEN, "rope_theta": 10000},
    ),
]  # fmt: skip
SECRETS = [S3_ID, S3_SECRET, HF, SK, AUTH, GOOG]
SEPARATORS = {"spaced": (", ", ": "), "compact": (",", ":")}


def _json(value: object, separators: tuple[str, str]) -> str:
    return json.dumps(value, separators=separators)


def _loads_hidden(text: str) -> object:
    """``text`` as JSON, a bare `HIDDEN` (an object or list hidden whole) read as the string."""
    return json.loads(
        text.replace(f": {HIDDEN}", f': "{HIDDEN}"').replace(f":{HIDDEN}", f':"{HIDDEN}"')
    )


def _assert_hidden(shown: str) -> None:
    for secret in SECRETS:
        assert secret not in shown, shown


@pytest.mark.parametrize("spacing", list(SEPARATORS))
@pytest.mark.parametrize(("flag", "value", "expected"), SAMPLES)
def test_a_secret_in_a_json_argument_is_hidden_and_the_json_kept(flag, value, expected, spacing):
    text = _json(value, SEPARATORS[spacing])
    for argv in (["vllm", "serve", "m", flag, text], ["python", "train.py", text]):
        shown = redact_argv(argv)
        _assert_hidden(shlex.join(shown))
        assert shown[:-1] == argv[:-1]
        assert _loads_hidden(shown[-1]) == expected  # what was run, secrets aside
        assert shlex.split(shown_line(argv)) == shown  # the log line reads back as those words


@pytest.mark.parametrize("spacing", list(SEPARATORS))
@pytest.mark.parametrize(("flag", "value", "expected"), SAMPLES)
def test_a_secret_in_json_inside_one_shell_line_is_hidden(flag, value, expected, spacing):
    line = shlex.join(["vllm", "serve", "m", flag, _json(value, SEPARATORS[spacing])])
    for shown in (
        shown_line(["sh", "-c", line]),
        shown_line(["sh", "-c", line + " # don't"]),  # quotes that do not balance
        shown_line(shlex.split(line)),  # --vllm-args, split as a shell does
        str(shown_command(line)),
        redact_text(f"vLLM exited: {line}"),
    ):
        _assert_hidden(shown)
        assert HIDDEN in shown
    words = shlex.split(shlex.split(shown_line(["sh", "-c", line]))[2])
    assert _loads_hidden(words[-1]) == expected


def test_json_without_spaces_keeps_its_quotes():
    text = '{"kv_connector":"X","kv_connector_extra_config":{"auth_token":"abc123456789"}}'
    expected = '{"kv_connector":"X","kv_connector_extra_config":{"auth_token":"<hidden>"}}'
    assert redact_argv(["--kv-transfer-config", text]) == ["--kv-transfer-config", expected]
    assert shown_line(["--kv-transfer-config", text]) == f"--kv-transfer-config '{expected}'"


def test_escaped_json_in_a_shell_line_is_hidden():
    line = 'vllm serve m --hf-overrides "{\\"token\\": \\"hf_abcdefghijklmnop\\"}" --port 1'
    for tail in ("", " # don't"):
        shown = shown_line(["sh", "-c", line + tail])
        assert "hf_abcdefghijklmnop" not in shown
        assert '\\"token\\": \\"<hidden>\\"' in shown


@pytest.mark.parametrize(
    "argv",
    [
        ["curl", "--header", f"X-Goog-Api-Key={GOOG}", "http://h/"],
        ["curl", f"--header=X-Goog-Api-Key={GOOG}", "http://h/"],
        ["curl", "-H", f"x-api-key={GOOG}", "http://h/"],
        ["curl", "-H", f"Authorization=Bearer {GOOG}", "http://h/"],
        ["sh", "-c", f"curl -H 'X-Goog-Api-Key={GOOG}' http://h/"],
        ["sh", "-c", f"curl -H 'X-Goog-Api-Key={GOOG}' http://h/ # don't"],
    ],
)
def test_a_header_given_as_name_equals_value_is_hidden(argv):
    shown = shown_line(argv)
    assert GOOG not in shown
    assert "key=<hidden>" in shown.lower() or "Authorization=Bearer <hidden>" in shown
    assert "http://h/" in shown


@pytest.mark.parametrize(
    "argv",
    [
        ["vllm", "serve", "m", "--api-keys", SK],
        ["vllm", "serve", "m", f"--api-keys={SK}"],
        ["vllm", "serve", "m", "--auth-tokens", SK],
        ["train", "--passwords", SK],
        ["sh", "-c", f"vllm serve m --api-keys {SK}"],
        ["env", f"API_KEYS={SK}", "vllm"],
    ],
)
def test_a_plural_secret_name_hides_its_value(argv):
    shown = shown_line(argv)
    assert SK not in shown
    assert HIDDEN in shown


def test_a_yaml_or_python_mapping_hides_its_secret_value():
    assert redact_text('token: "hf_abcdefgh"') == 'token: "<hidden>"'
    assert redact_text("{'api_key': 'sk-12345678', 'model': 'm'}") == (
        "{'api_key': '<hidden>', 'model': 'm'}"
    )
    assert redact_text("HF_TOKEN='hf_abcdefgh' python t.py") == "HF_TOKEN='<hidden>' python t.py"


def test_ordinary_structured_values_stay_readable():
    plain = ('{"max_tokens": 5, "num_tokens": 7, "tokenizer": "t", "keyboard": "k", '
             '"monkey": "m", "pad_token_id": 0, "max_num_batched_tokens": 8}')  # fmt: skip
    argv = ["vllm", "--hf-overrides", plain, "--max-num-batched-tokens", "8", "max_tokens=5",
            "keyboard=qwerty", "--output_dir=/data/trueskill-run", "--tokenizer", "t"]  # fmt: skip
    assert redact_argv(argv) == argv
    assert redact_argv(["sh", "-c", shlex.join(argv)]) == ["sh", "-c", shlex.join(argv)]
    code = "import os; key == 'x'; n = num_tokens"  # code, not settings: nothing hidden
    assert redact_argv(["python", "-c", code]) == ["python", "-c", code]


# ---------------------------------------------------------------- property

SECRET_KEYS = ["api_key", "s3_secret_access_key", "s3_access_key_id", "auth_token", "hf_token",
               "token", "password", "client_secret", "apiKey", "X-Goog-Api-Key", "api_keys",
               "Authorization", "refresh-token"]  # fmt: skip
PLAIN_KEYS = ["model", "max_tokens", "num_tokens", "tokenizer", "kv_connector", "keyboard",
              "monkey", "s3_endpoint", "pad_token_id", "revision", "extra_config"]  # fmt: skip
secret_value = st.text(
    st.sampled_from("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.~+/=:,{}"),
    min_size=8, max_size=30,
).map(lambda s: "S3cr" + s)  # fmt: skip
plain_value = st.integers(0, 2**32).map(lambda n: f"plain{n:x}v")
plain_object = st.recursive(
    st.dictionaries(st.sampled_from(PLAIN_KEYS), plain_value, min_size=1, max_size=3),
    lambda inner: st.dictionaries(st.sampled_from(PLAIN_KEYS), inner | plain_value, max_size=3),
    max_leaves=6,
)


@st.composite
def objects_with_a_secret(draw: st.DrawFn) -> tuple[dict[str, object], str]:
    """A JSON object with a secret-named key somewhere (nested or not), and the secret."""
    value = draw(secret_value)
    obj: dict[str, object] = draw(plain_object)
    place = obj
    for _ in range(draw(st.integers(0, 3))):
        inner = [v for v in place.values() if isinstance(v, dict)]
        if not inner:
            break
        place = draw(st.sampled_from(inner))
    place[draw(st.sampled_from(SECRET_KEYS))] = value
    return obj, value


def _leaves(value: object) -> list[str]:
    if isinstance(value, dict):
        return [leaf for item in value.values() for leaf in _leaves(item)]
    return [value] if isinstance(value, str) and value.startswith("plain") else []


@settings(max_examples=300, deadline=None)
@given(
    found=objects_with_a_secret(),
    spacing=st.sampled_from(list(SEPARATORS)),
    flag=st.sampled_from(["--model-loader-extra-config", "--hf-overrides", "--kv-transfer-config"]),
)
def test_a_secret_keys_value_never_shows_and_plain_values_do(found, spacing, flag):
    obj, secret = found
    text = _json(obj, SEPARATORS[spacing])
    line = shlex.join(["vllm", "serve", "m", flag, text])
    for shown in (
        shown_line(["vllm", "serve", "m", flag, text]),
        shown_line(["python", "train.py", text]),
        shown_line(["sh", "-c", line]),
        shown_line(["sh", "-c", line + " # don't"]),
        str(shown_command(line)),
    ):
        assert secret not in shown, (text, shown)
        for leaf in _leaves(obj):
            assert leaf in shown, (leaf, text, shown)
    word = redact_argv(["vllm", flag, text])[-1]
    assert json.loads(word) is not None  # still JSON: quotes and braces kept


# ---------------------------------------------------------------- hostile review round 13


@pytest.mark.parametrize(
    "arg",
    [
        '{"api_key":\n"SECRET-VALUE-1"}',  # a new line after the colon: valid JSON
        '{"api_key":\r\n  "SECRET-VALUE-1"}',
        '{"token":"<hidden>SECRET-VALUE-1"}',  # content that starts like a hidden value
        "Authorization: Bearer <hidden>SECRET-VALUE-1",
        "token =SECRET-VALUE-1",
        '{"pass":"SECRET-VALUE-1"}',
        '{"jwt":"SECRET-VALUE-1"}',
        '{"sig":"SECRET-VALUE-1"}',
        '{"passphrase":"SECRET-VALUE-1"}',
        '{"api_key_1":"SECRET-VALUE-1"}',
        '{"token2":"SECRET-VALUE-1"}',
    ],
    ids=repr,
)
def test_more_spellings_of_a_secret_key_hide_the_value(arg):
    shown = shown_line(["x", "--opt", arg])
    assert "SECRET-VALUE-1" not in shown
    assert HIDDEN in shown


@pytest.mark.parametrize(
    "arg",
    [
        '{"eos_token":"</s>","pad_token":"<pad>","bos_token":"<s>","unk_token":"<unk>"}',
        '{"num_keys":4}',
        "import os; key == 'x'",
        '{"code":"print(1)","session":"abc"}',
    ],
    ids=repr,
)
def test_a_tokenizers_special_tokens_and_counts_stay_readable(arg):
    assert shown_line(["x", arg]) == shlex.join(["x", arg])


def test_many_secret_keys_in_one_line_are_each_hidden():
    keys = 1000
    line = "{" + ",".join('"api_key":"v"' for _ in range(keys)) + "}"
    shown = shown_line(["x", "--opt", line])
    assert shown.count(HIDDEN) == keys
    assert '"v"' not in shown


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        (f"vllm serve m --api-key={SK} --port 9", "vllm serve m --api-key=<hidden> --port 9"),
        (f"vllm serve m --api-key '{SK}' --port 9", "vllm serve m --api-key '<hidden>' --port 9"),
        (f"run: --hf-token {HF}\n", "run: --hf-token <hidden>\n"),
        (f"api_key[0]={SK}", "api_key[0]=<hidden>"),
        (f"api_key[0]: {SK} x", "api_key[0]: <hidden> x"),
        (f"config:\n  api_key: |\n    {SK}\n", "config:\n  api_key: <hidden>\n"),
        (
            f"a:\n  password: >-\n    {SK}\n\n    {HF}\n  model: m\nend",
            "a:\n  password: <hidden>\n  model: m\nend",
        ),
    ],
)
def test_a_secret_in_free_text_a_subscript_or_a_yaml_block_is_hidden(text, shown):
    assert redact_text(text) == shown


@pytest.mark.parametrize(
    "text",
    [
        "--api-key --port 9",
        "--max-tokens 128 --tokenizer gpt2",
        "x[1]=2",
        "model: |\n  a plain block\nnext: 1",
    ],
)
def test_free_text_without_a_secret_value_is_unchanged(text):
    assert redact_text(text) == text

"""Class: secrets on command lines, in errors. A server command or its flags may carry an
``--api-key``: no error, log line or JSON document that shows them may show its value."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from verirl import (
    ConfigError,
    EnvServerUnavailable,
    HttpEnvServerProbe,
    Settings,
    TrainingRuntime,
    VLLMServer,
)
from verirl._hidden import HIDDEN
from verirl._secrets import (
    redact_argv,
    redact_message,
    redact_text,
    secrets_in_environ,
    shown_command,
    shown_line,
)
from verirl.cli import main

SECRET = "sk-SECRETvalue42"
COMMANDS = [
    f"python serve.py --api-key {SECRET}",
    f"python serve.py --api-key={SECRET}",
    f'serve --api-key {SECRET} "unbalanced',
    f"serve --api-key {SECRET} \x00",
    f"API_KEY={SECRET} serve",
]


@pytest.fixture
def no_settings(monkeypatch):
    for name in ("VERIRL_VLLM_COMMAND", "VERIRL_VLLM_ARGS", "VERIRL_GPU_COUNT", "VERIRL_MODEL",
                 "VERIRL_VLLM_HOST", "VERIRL_VLLM_MODE", "CUDA_VISIBLE_DEVICES"):  # fmt: skip
        monkeypatch.delenv(name, raising=False)


def _run(capsys, argv):
    code = main(argv)
    out, err = capsys.readouterr()
    assert SECRET not in out + err, (argv, out, err)
    return code, out, err


@pytest.mark.parametrize("command", COMMANDS)
@pytest.mark.parametrize(
    "argv",
    [
        ["launch", "--gpus", "1", "--vllm-command", "{c}", "--", "true"],  # unused in colocate
        ["launch", "--json", "--gpus", "1", "--vllm-command", "{c}", "--", "true"],
        ["serve", "--gpus", "2", "--model", "m", "--vllm-command", "{c}"],
        ["launch", "--gpus", "2", "--vllm-host", "h", "--vllm-command", "{c}", "--", "true"],
    ],
    ids=["launch-colocate", "launch-json", "serve", "launch-remote"],
)
def test_a_command_flag_never_shows_its_secret(capsys, no_settings, command, argv):
    code, out, _ = _run(capsys, [part.replace("{c}", command) for part in argv])
    if "\x00" in command or "unbalanced" in command or "colocate" in str(argv) or "h" in argv:
        assert code == 2
    if "--json" in argv:
        assert json.loads(out)["error"]["code"] == code


@pytest.mark.parametrize("command", [c for c in COMMANDS if "\x00" not in c])  # no env var has one
def test_the_command_variable_never_shows_its_secret(capsys, no_settings, monkeypatch, command):
    monkeypatch.setenv("VERIRL_VLLM_COMMAND", command)
    _run(capsys, ["serve", "--gpus", "2", "--model", "m", "--vllm-startup-timeout", "1"])
    _run(capsys, ["doctor"])
    _run(capsys, ["doctor", "--json"])
    if "unbalanced" in command:
        with pytest.raises(ConfigError) as caught:
            TrainingRuntime.from_settings(gpu_count=2, model="m")
        assert SECRET not in str(caught.value)
        assert SECRET not in repr(caught.value.value)


@pytest.mark.parametrize(
    "kwargs",
    [
        {"extra_args": ["--api-key", SECRET + "\x00"]},
        {"extra_args": ["--api-key", SECRET, 7]},
        {"extra_args": f"--api-key {SECRET}"},
        {"command": ["serve", "--api-key", SECRET + "\x00"]},
        {"command": ["serve", "--api-key", SECRET, ""]},
        {"command": f"serve --api-key {SECRET}"},
    ],
    ids=["args-null", "args-not-str", "args-one-string", "cmd-null", "cmd-empty", "cmd-string"],
)
def test_the_library_never_shows_a_secret_of_a_server_command(kwargs):
    with pytest.raises(ConfigError) as caught:
        VLLMServer("m", **kwargs)
    assert SECRET not in str(caught.value)
    assert SECRET not in repr(caught.value.value)


@pytest.mark.parametrize(
    "command", [["serve", "--api-key", SECRET, "\x00x"], f"x --token {SECRET}"]
)
def test_from_settings_never_shows_a_secret_of_vllm_command(no_settings, command):
    with pytest.raises(ConfigError) as caught:
        TrainingRuntime.from_settings(gpu_count=2, model="m", vllm_command=command)
    assert SECRET not in str(caught.value)


# ---------------------------------------------------------------- a hostile review's leaks
# Each of these reached a log line or an error before: an unbalanced quote in a shell line, an
# abbreviated secret flag (argparse takes --api-k for --api-key), an HTTP header's credential,
# a secret in a URL's query. Secrets are open-ended: a token's alphabet, any length.

token = st.text(
    st.sampled_from("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-_.~+/="),
    min_size=8, max_size=40,
).map(lambda s: "S3cr" + s)  # fmt: skip
SECRET_FLAGS = ["--api-key", "--hub-token", "--token", "--password", "--secret", "--access-token",
                "--api_key", "--hub_token", "--access_token"]  # fmt: skip
ABBREVIATIONS = sorted({flag[:end] for flag in SECRET_FLAGS for end in range(4, len(flag) + 1)})
PLAIN_FLAGS = ["--top-k", "--max-tokens", "--port", "--tokenizer", "--tokenizer-mode", "--seed",
               "--path", "--model", "--max-model-len", "--served-model-name", "--host"]  # fmt: skip
HEADERS = [
    "Authorization: Bearer {v}",
    "authorization:bearer {v}",
    "Authorization: Basic {v}",
    "AUTHORIZATION: Token {v}",
    "Proxy-Authorization: Bearer {v}",
    "Authorization: {v}",
    "X-Api-Key: {v}",
    "x-auth-token:{v}",
    "Private-Token: {v}",
]
QUERY_NAMES = ["token", "access_token", "api_key", "apikey", "key", "sig", "signature",
               "password", "secret", "auth", "client_secret", "X-Amz-Signature",
               "X-Amz-Credential", "X-Amz-Security-Token", "refresh_token", "id_token"]  # fmt: skip
UNBALANCED = [" # don't", ' "oops', " 'x", " it's", ' a"b']


def _shell_forms(value: str) -> list[str]:
    """Shell lines (``sh -c LINE``) that carry ``value`` in each way a secret travels."""
    return [
        f"true --api-key {value}",
        f"true --api-key={value}",
        f"HF_TOKEN={value} true",
        f"true --api-k {value}",
        f"true --hub_t={value}",
        f"curl -H 'Authorization: Bearer {value}' http://h/",
        f'curl -H "X-Api-Key: {value}" http://h/',
        f"curl 'http://h/x?a=1&token={value}'",
        f"curl http://u:{value}@h/x",
    ]


@settings(max_examples=300, deadline=None)
@example(value="S3cr000Pwd0=", form=8, tail=" # don't", head="")  # a password read as a key
@given(
    value=token,
    form=st.integers(0, 8),
    tail=st.sampled_from(UNBALANCED),
    head=st.sampled_from(["", "echo hi; ", "cd /x && "]),
)
def test_a_shell_line_whose_quotes_do_not_balance_never_shows_its_secret(value, form, tail, head):
    line = head + _shell_forms(value)[form] + tail
    with pytest.raises(ValueError):
        shlex.split(line)  # the case shlex cannot split
    for shown in (
        shlex.join(redact_argv(["sh", "-c", line])),
        shlex.join(redact_argv(["bash", "-lc", line, "--"])),
        " ".join(redact_argv([line])),
        str(shown_command(line)),
        str(shown_command(["sh", "-c", line])),
    ):
        assert value not in shown, (line, shown)
        assert HIDDEN in shown or "***@" in shown


@settings(max_examples=300, deadline=None)
@given(
    value=token,
    flag=st.sampled_from(ABBREVIATIONS),
    upper=st.booleans(),
    equals=st.booleans(),
    before=st.lists(st.sampled_from(["serve", "--port", "9", "-v", "--top-k", "5"]), max_size=4),
)
@example(value="S3cr0000/KEY", flag="--ac", upper=False, equals=False, before=[])  # seen in CI
def test_an_abbreviated_secret_flag_hides_its_value(value, flag, upper, equals, before):
    flag = flag.upper() if upper else flag
    words = [f"{flag}={value}"] if equals else [flag, value]
    argv = [*before, *words]
    shown = redact_argv(argv)
    assert value not in shlex.join(shown)
    assert shown[: len(before)] == before
    assert value not in str(shown_command(shlex.join(argv)))
    assert value not in shlex.join(redact_argv(["sh", "-c", shlex.join(argv)]))


def test_the_abbreviation_rule_hides_only_prefixes_of_secret_flags():
    # as written, a prefix of a secret flag, 4 characters or more (dashes included)
    for flag in ["--ap", "--api", "--api-k", "--hub-t", "--pass", "--acc", "--sec", "--api_k",
                 "--to", "--tok", "--toke"]:  # fmt: skip
        assert redact_argv([flag, "V4lue"]) == [flag, HIDDEN], flag
    # --tok also abbreviates --tokenizer (argparse: ambiguous where both exist): hidden anyway
    for flag in [*PLAIN_FLAGS, "--a", "--", "-t", "--tokenizer=x", "--api-server-count"]:
        assert redact_argv([flag, "V4lue"]) == [flag, "V4lue"], flag


@settings(max_examples=200, deadline=None)
@given(value=token, header=st.sampled_from(HEADERS), flag=st.sampled_from(["-H", "--header"]))
def test_a_header_credential_is_hidden(value, header, flag):
    text = header.format(v=value)
    for shown in (
        shlex.join(redact_argv(["curl", flag, text, "http://h/"])),
        shlex.join(redact_argv(["curl", f"{flag}={text}", "http://h/"])),
        shlex.join(redact_argv(["sh", "-c", shlex.join(["curl", flag, text, "http://h/"])])),
        shlex.join(redact_argv(["sh", "-c", f'curl {flag} "{text}" # don\'t'])),
        str(shown_command(f'curl {flag} "{text}" http://h/')),
        str(shown_command(f'curl {flag} "{text}')),
        redact_text(f"request failed: {text}"),
    ):
        assert value not in shown, shown
        assert HIDDEN in shown
    if " " in header.split(":", 1)[1].strip():  # the scheme stays: what kind of credential it was
        scheme = header.split(":", 1)[1].split()[0]
        assert scheme in redact_text(text)


@settings(max_examples=300, deadline=None)
@given(
    value=token,
    name=st.sampled_from(QUERY_NAMES),
    sep=st.sampled_from(["?", "#"]),
    before=st.lists(st.sampled_from(["a=1", "page=2", "x", "next=a?b"]), max_size=3),
    after=st.lists(st.sampled_from(["b=2", "format=json"]), max_size=2),
    userinfo=st.booleans(),
)
def test_a_secret_query_parameter_is_hidden(*, value, name, sep, before, after, userinfo):
    query = "&".join([*before, f"{name}={value}", *after])
    url = f"http://{'u:pw@' if userinfo else ''}127.0.0.1:1/x{sep}{query}"
    for shown in (
        redact_text(url),
        redact_text(f"GET {url} failed"),
        shlex.join(redact_argv(["curl", url])),
        shlex.join(redact_argv(["python", "t.py", f"--endpoint={url}"])),
        shlex.join(redact_argv(["sh", "-c", f"curl '{url}' # don't"])),
        str(shown_command(f"curl {shlex.quote(url)}")),
    ):
        assert value not in shown, shown
        assert f"{name}={HIDDEN}" in shown
    assert "u:pw" not in redact_text(url)  # the password goes too


def test_a_plain_query_stays_readable():
    assert redact_text("http://h:1/x?page=2&format=json") == "http://h:1/x?page=2&format=json"
    assert redact_text("Content-Type: application/json") == "Content-Type: application/json"
    assert redact_argv(["--tokenizer", "t", "--max-tokens", "9"]) == [
        "--tokenizer", "t", "--max-tokens", "9"]  # fmt: skip


LEAKY = "sk-LEAKYvalue77"
HUB_TOKEN = "hf_" + "AbCdEfGhIjKlMnOpQrStUvWxYz01234567"  # a Hub token's shape: hf_ and 34


@pytest.mark.parametrize(
    "extra_args",
    [
        ["--port", "9", f'sh -c "x --api-key {LEAKY} # don\'t"'],
        [f"x --api-key {LEAKY} # don't", 7],
        ["--api-k", LEAKY, 7],
        ["--hub-t", LEAKY, "\x00"],
        ["-H", f"Authorization: Bearer {LEAKY}", 7],
        [f"--url=http://h/?token={LEAKY}", 7],
    ],
    ids=["unbalanced-port", "unbalanced", "abbreviated", "abbreviated-null", "header", "query"],
)
def test_the_library_error_never_shows_these_secrets(extra_args):
    with pytest.raises(ConfigError) as caught:
        VLLMServer("m", extra_args=extra_args)
    assert LEAKY not in str(caught.value)
    assert LEAKY not in repr(caught.value.value)


@pytest.mark.parametrize(
    "argv",
    [
        ["wait-env", f"http://127.0.0.1:1/?token={LEAKY}"],
        ["wait-env", f"http://127.0.0.1:1/x?a=1&api_key={LEAKY}"],
        ["wait-env", f"http://127.0.0.1:1/#access_token={LEAKY}"],
        ["wait-env", "--json", f"http://127.0.0.1:1/?sig={LEAKY}"],
        ["launch", "--gpus", "1", "--env-url", f"http://127.0.0.1:1/?token={LEAKY}", "--", "true"],
        ["launch", "--gpus", "1", "--hub-endpoint", f"http://h/?token={LEAKY}", "--", "true"],
    ],
)
def test_a_url_error_never_shows_a_query_secret(capsys, no_settings, monkeypatch, argv):
    monkeypatch.delenv("VERIRL_HUB_REPO_ID", raising=False)
    code, out, err = _run_leaky(capsys, argv)
    assert code == 2
    assert HIDDEN in out + err


def _run_leaky(capsys, argv):
    code = main(argv)
    out, err = capsys.readouterr()
    assert LEAKY not in out + err, (argv, out, err)
    return code, out, err


def test_the_probe_never_shows_a_query_secret():
    with pytest.raises(ConfigError) as caught:
        HttpEnvServerProbe(f"http://127.0.0.1:1/?token={LEAKY}")
    assert LEAKY not in str(caught.value) + repr(caught.value.value)


@pytest.mark.parametrize(
    "command",
    [
        ["sh", "-c", f"true --api-key {LEAKY} # don't"],
        [sys.executable, "-c", "pass", "--api-k", LEAKY],
        [sys.executable, "-c", "pass", "-H", f"Authorization: Bearer {LEAKY}"],
        [sys.executable, "-c", "pass", f"http://h/x?token={LEAKY}"],
        [sys.executable, "-c", f"import os; os.environ['HF_TOKEN'] = '{LEAKY}'"],
        ["bash", "-c", f"HF_TOKEN+={LEAKY} true"],  # bash: dash has no +=
        ["echo", HUB_TOKEN],
        [sys.executable, "-c", f"h = {{'Authorization': f'Bearer {LEAKY}'}}"],
    ],
    ids=[
        "unbalanced",
        "abbreviated",
        "header",
        "query",
        "subscript",
        "append",
        "hub-token",
        "f-string",
    ],
)
def test_launch_running_line_never_shows_these_secrets(command):
    env = {k: v for k, v in os.environ.items() if not k.startswith("VERIRL_")}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    result = subprocess.run(
        [sys.executable, "-m", "verirl", "-v", "launch", "--gpus", "1", "--", *command],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert "running" in result.stderr, result.stderr
    assert LEAKY not in result.stderr + result.stdout
    assert HUB_TOKEN[3:] not in result.stderr  # echo's own output is stdout: the command's


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        (f"os.environ['HF_TOKEN']='{LEAKY}'", f"os.environ['HF_TOKEN']='{HIDDEN}'"),
        (f'os.environ["HF_TOKEN"] = "{LEAKY}"', f'os.environ["HF_TOKEN"] = "{HIDDEN}"'),
        (f"login(token='{HUB_TOKEN}') or login('{HUB_TOKEN}')",
         f"login(token='{HIDDEN}') or login('{HIDDEN}')"),
        (f"echo {HUB_TOKEN}", f"echo {HIDDEN}"),
        # a secret name keeps its secret whatever its subscript; spaces, += (review round 47)
        (f"credentials['openai']='{LEAKY}'", f"credentials['openai']='{HIDDEN}'"),
        (f"password['db']: '{LEAKY}' secret[x]: {LEAKY}",
         f"password['db']: '{HIDDEN}' secret[x]: {HIDDEN}"),
        (f"os.environ[ 'HF_TOKEN' ] = '{LEAKY}'", f"os.environ[ 'HF_TOKEN' ] = '{HIDDEN}'"),
        (f"os.environ['HF_TOKEN'] += '{LEAKY}'", f"os.environ['HF_TOKEN'] += '{HIDDEN}'"),
        (f"export HF_TOKEN+={LEAKY}", f"export HF_TOKEN+={HIDDEN}"),
        # a secret's name as a call's quoted argument, or csh's and fish's assignments
        (f"os.environ.get('HF_TOKEN', '{LEAKY}') or os.putenv(\"API_KEY\", \"{LEAKY}\")",
         f"os.environ.get('HF_TOKEN', '{HIDDEN}') or os.putenv(\"API_KEY\", \"{HIDDEN}\")"),
        (f"setenv HF_TOKEN {LEAKY}", f"setenv HF_TOKEN {HIDDEN}"),
        (f"set -gx HF_TOKEN '{LEAKY}'", f"set -gx HF_TOKEN '{HIDDEN}'"),
        # a Python string's prefix before the value (review round 48)
        (f"h={{'Authorization': f'Bearer {LEAKY}'}}", f"h={{'Authorization': f'{HIDDEN}'}}"),
        (f"os.environ.get('HF_TOKEN', f'{LEAKY}')", f"os.environ.get('HF_TOKEN', f'{HIDDEN}')"),
        # a secret named in one word
        (f"export PGPASSWORD={LEAKY} HFTOKEN={LEAKY}",
         f"export PGPASSWORD={HIDDEN} HFTOKEN={HIDDEN}"),
        # a Hub token right after an escape that ends in a digit
        (f"https://h/cb?state=%7B%22token%22%3A%22{HUB_TOKEN}%22%7D",
         f"https://h/cb?state=%7B%22token%22%3A%22{HIDDEN}%22%7D"),
        (f"echo \\x22{HUB_TOKEN}", f"echo \\x22{HIDDEN}"),
        # not a token: a short hf_ word, one inside another word, a subscript named otherwise
        ("hf_transfer hf_hub_download", "hf_transfer hf_hub_download"),
        (f"x{HUB_TOKEN}", f"x{HUB_TOKEN}"),
        ("cfg['tokenizer']='gpt2'", "cfg['tokenizer']='gpt2'"),
        ("d[key]='plain' counts[key]=1 cache[token]=abc a[i] += 2",
         "d[key]='plain' counts[key]=1 cache[token]=abc a[i] += 2"),
        ("d.get('model', 'gpt2'); set -x; setenv PATH /usr/bin",
         "d.get('model', 'gpt2'); set -x; setenv PATH /usr/bin"),
        ("print('token', 'saved to', path); getattr(cfg, 'key', 'x'); MAXTOKEN=5",
         "print('token', 'saved to', path); getattr(cfg, 'key', 'x'); MAXTOKEN=5"),
    ],
)  # fmt: skip
def test_a_secret_spelled_in_code_in_any_shell_or_like_a_hub_token_is_hidden(text, shown):
    assert redact_text(text) == shown
    assert redact_argv([sys.executable, "-c", text]) == [sys.executable, "-c", shown]


def test_an_appended_secret_assignment_is_hidden_like_an_assignment():
    assert redact_argv(["env", f"HF_TOKEN+={LEAKY}", "MODE+=fast", "x"]) == [
        "env", f"HF_TOKEN+={HIDDEN}", "MODE+=fast", "x"]  # fmt: skip


@pytest.mark.parametrize(
    ("argv", "shown"),
    [
        (["vllm", "serve", "m", "--api-key", "sk-first-AAAA", "sk-second-BBBB", "--port", "3"],
         ["vllm", "serve", "m", "--api-key", HIDDEN, HIDDEN, "--port", "3"]),
        (["x", "--api-key", "-sk-dash-AAAA", "sk-second-BBBB", "--port", "3"],
         ["x", "--api-key", HIDDEN, HIDDEN, "--port", "3"]),
        (["x", "--api-key=sk-first-AAAA", "plain"], ["x", f"--api-key={HIDDEN}", "plain"]),
    ],
)  # fmt: skip
def test_every_key_after_a_secret_flag_is_hidden_up_to_the_next_flag(argv, shown):
    # vLLM's --api-key takes several keys (nargs="+")
    assert redact_argv(argv) == shown
    line = shown_line(["bash", "-c", shlex.join(argv)])
    assert "sk-" not in line


PASSWORD = "SECRETPW9"


@pytest.mark.parametrize(
    "argv",
    [
        ["resume", "--resume", f"https://u:{PASSWORD}@host/ckpt"],
        ["resume", "--resume", f"http://host/c?token={PASSWORD}"],
        ["resume", "--output-dir", f"https://u:{PASSWORD}@host/x", "--resume", "latest"],
        ["resume", "--hub-repo", f"https://u:{PASSWORD}@host/x", "--resume", "latest"],
        ["resume", "--hub-repo", "org/r", "--hub-revision", f"x?token={PASSWORD}"],
        ["wait-env", "http://127.0.0.1:1", "--health-path", f"/h?token={PASSWORD}"],
        ["serve", "--gpus", "2", "--model", "m", "--log-dir", f"https://u:{PASSWORD}@h/"],
    ],
    ids=["resume-url", "resume-query", "output-dir", "hub-repo", "hub-revision", "health-path",
         "log-dir"],
)  # fmt: skip
@pytest.mark.parametrize("json_flag", [[], ["--json"]], ids=["text", "json"])
@pytest.mark.usefixtures("no_settings")
def test_a_credential_typed_into_any_value_never_shows(
    capsys, argv, json_flag, monkeypatch, tmp_path
):
    # every error quotes the value it refuses: the credential in it stays hidden
    monkeypatch.chdir(tmp_path)
    code = main([*json_flag, *argv])
    out, err = capsys.readouterr()
    assert code != 0
    assert PASSWORD not in out + err, (out, err)
    if json_flag:
        assert json.loads(out)["error"]["code"] == code


def test_a_launch_plans_repr_hides_every_secret():
    plan = VLLMServer(
        "m",
        command=["vllm", "serve", "--api-key", "SeCrEtCmd03"],
        extra_args=("--api-key", "SeCrEtArg04", "--hf-token=SeCrEtArg05"),
    ).launch_plan()
    for shown in (repr(plan), str(plan)):
        assert "SeCrEt" not in shown, shown
        assert "'--api-key', '<hidden>'" in shown


def test_personal_access_tokens_and_passphrases_are_hidden():
    argv = ["x", "--pat", "SeCrEt01", "--github-pat", "SeCrEt02", "--passphrase", "SeCrEt03",
            "--path", "/a", "--patience", "3"]  # fmt: skip
    assert redact_argv(argv) == ["x", "--pat", HIDDEN, "--github-pat", HIDDEN, "--passphrase",
                                 HIDDEN, "--path", "/a", "--patience", "3"]  # fmt: skip


def test_every_secret_word_a_url_parameter_hides_hides_a_flag_s_value_too():
    """--pwd, --jwt, --cookie, --sessionid, --session-id, --bearer, --signature: as ?pwd=V is."""
    from verirl._secrets import _PARAM_WORDS

    named = ["pwd", "jwt", "cookie", "sessionid", "session-id", "bearer", "signature"]
    argv = ["x"]
    for index, name in enumerate(named):
        argv += [f"--{name}", f"SeCrEt{index:02}"]
    for index, abbreviated in enumerate(["--cook", "--session-i", "--sessio", "--bear", "--signa"]):
        argv += [abbreviated, f"SeCrEtAbbreviated{index:02}"]  # as argparse takes them
    plain = ["--sessions-dir", "/r", "--code-dir", "/a", "--sig-figs", "3"]
    shown = redact_argv([*argv, *plain])
    assert not [word for word in shown if "SeCrEt" in word], shown
    assert shown[-6:] == plain  # ("--session" abbreviates --session-id: hidden, as --to is)
    # the parameter words a flag may carry too: none of them is shown in a flag
    flagged = {"session", "sid", "code", "sig", "pass"}  # plain data as flags (or abbreviations)
    assert set(named) - {"session-id", "signature"} <= _PARAM_WORDS - flagged


def test_the_working_directory_is_no_secret(monkeypatch):
    """``PWD`` names a folder: the values of secret-named variables leave it alone."""
    from verirl._secrets import secrets_in_environ

    monkeypatch.setenv("PWD", "/srv/project/run-7")
    assert "/srv/project/run-7" not in secrets_in_environ(os.environ)


@pytest.mark.parametrize("json_flag", [[], ["--json"]])
@pytest.mark.parametrize(
    "argv",
    [
        ["serve", "--gpus", "2", "--model", "m", "--api-key", SECRET],
        ["plan", "--gpus", "2", f"--api-key={SECRET}"],
        ["launch", f"--hf-token={SECRET}", "--", "true"],
        ["plan", "--gpus", f"http://u:{SECRET}@x"],
        ["plan", "--mode", f"http://u:{SECRET}@x"],
        ["wait-env", f"http://u:{SECRET}@x", "--timeout", f"https://:{SECRET}@y"],
    ],
    ids=[
        "unknown-flag",
        "unknown-flag-equals",
        "unknown-token-flag",
        "bad-int",
        "bad-choice",
        "bad-number",
    ],
)
def test_a_usage_error_never_shows_a_secret_that_was_typed(capsys, no_settings, argv, json_flag):
    """argparse quotes what it refused: the quote hides the secret like any message (a mode is
    refused by its setting's parser, as VERIRL_VLLM_MODE is: the same exit, the same rule)."""
    try:
        code = main([*json_flag, *argv])
    except SystemExit as caught:
        code = caught.code
    out, err = capsys.readouterr()
    assert SECRET not in out + err, (argv, out, err)
    assert code == 2
    if json_flag:
        assert json.loads(out)["error"]["code"] == 2
    assert "error" in (out + err).lower()


def test_the_settings_repr_never_shows_a_secret(monkeypatch, no_settings):
    """Every setting that can carry a credential (a URL, a command, flags) is shown redacted."""
    monkeypatch.setenv("VERIRL_ENV_SERVER_URL", f"http://u:{SECRET}@127.0.0.1:1")
    monkeypatch.setenv("VERIRL_HUB_ENDPOINT", f"https://:{SECRET}@hub.example/?token={SECRET}")
    monkeypatch.setenv("VERIRL_VLLM_COMMAND", f"srv --token {SECRET}")
    monkeypatch.setenv("VERIRL_VLLM_ARGS", f"--api-key {SECRET}")
    monkeypatch.setenv("HF_TOKEN", SECRET)
    settings = Settings.from_environ()
    assert settings.vllm_args == ("--api-key", SECRET)  # kept, only not shown
    shown = repr(settings) + str(settings)
    assert SECRET not in shown
    assert HIDDEN in shown


@pytest.mark.parametrize("quote", ["'", '"'])
@pytest.mark.parametrize("flag", ["--token ", "--api-key ", "--api-key=", "--hf-token "])
def test_an_unbalanced_quote_after_a_secret_flag_keeps_the_reason(capsys, no_settings, quote,
                                                                  flag):  # fmt: skip
    """The secret is hidden, and the reason (the quote that does not close) is still said."""
    command = f"srv {flag}{quote}{SECRET}"
    argv = ["--json", "launch", "--gpus", "2", "--model", "m", "--vllm-command", command]
    code, out, _ = _run(capsys, [*argv, "--", "true"])
    assert code == 2
    message = json.loads(out)["error"]["message"]
    assert message.startswith("--vllm-command=")
    assert message.endswith("cannot be split like a shell: No closing quotation"), message


@pytest.mark.parametrize("json_", [False, True], ids=["text", "json"])
@pytest.mark.parametrize(
    "where",
    ["http://127.0.0.1:{port}/{s}", "http://127.0.0.1:{port}/v1;{s}", "http://{s}.invalid:1/"],
    ids=["path", "path-parameter", "host"],
)
@pytest.mark.parametrize(
    "stored", ["{}", "{}\n", "  {} ", "{}\r\n"], ids=["as-is", "newline", "spaces", "crlf"]
)
def test_a_secret_variable_s_value_in_a_url_the_user_built_is_never_shown(
    capsys, no_settings, monkeypatch, *, json_, where, stored
):
    """``--env-url "http://h/$HF_TOKEN"``: no log line or document shows the variable's value,
    also when it is stored with white space around it, which huggingface_hub strips (a
    Kubernetes secret, an ``echo`` into a file) and an unquoted ``$HF_TOKEN`` drops."""
    from _support import unshared_port

    token = "hfSECRETvalue42abc"
    monkeypatch.setenv("HF_TOKEN", stored.format(token))
    url = where.format(port=unshared_port(), s=token)
    argv = ["launch", "--gpus", "1", "--env-url", url, "--env-timeout", "0.5", "--", "true"]
    code = main(["--json", *argv] if json_ else argv)
    out, err = capsys.readouterr()
    assert code == 3
    assert token not in out + err, (out, err)
    assert token.lower() not in (out + err).lower()
    assert HIDDEN in (json.loads(out)["error"]["message"] if json_ else err)


def test_a_probe_never_logs_a_secret_variable_s_value_in_its_url(monkeypatch, caplog):
    """In a program with its own log handlers: the probe's URLs hide the variable's value."""
    from _support import unshared_port

    token = "hfSECRETvalue42abc"
    monkeypatch.setenv("MY_API_KEY", token)
    caplog.set_level("DEBUG", logger="verirl")
    probe = HttpEnvServerProbe(f"http://127.0.0.1:{unshared_port()}/{token}")
    assert token not in probe.url + probe.health_url + repr(probe)
    with pytest.raises(EnvServerUnavailable) as caught:
        probe.wait(0.3)
    assert token not in caplog.text + str(caught.value)
    assert HIDDEN in caplog.text


@pytest.mark.parametrize(
    "line",
    [
        "cd /data && python train.py --model org/repo@main --lr 1e-4",
        "pip install org/pkg/sub@v1.2 && python x.py",
    ],
)
def test_a_shell_line_with_a_path_at_a_revision_is_shown_whole(line):
    """Its words judged each, then the line as a whole by its last @: all before it was lost."""
    assert shown_line(["bash", "-c", line]) == shlex.join(["bash", "-c", line])


@pytest.mark.parametrize(
    ("line", "shown"),
    [
        ("git clone https://u:pw@h/x && ls", "git clone https://***@h/x && ls"),
        ("x=(u:pw@h) y", "x=(***@h) y"),
        ("see //:pw@h and mailto:user:pw@host", "see //***@h and mailto:***@host"),
        ("git clone https://ghp_abc@github.com/o/r", "git clone https://***@github.com/o/r"),
        ("push to //tok(en)@h then to org/repo@main", "push to //***@h then to org/repo@main"),
    ],
)
def test_a_url_password_in_a_message_is_hidden_wherever_it_stands(line, shown):
    assert redact_message(line) == shown


# The rule as one regular expression (quadratic on long text: a reference for short text only).
_USERINFO_RULE = re.compile(
    r"(?:(?:(?<![^\s/@'\"<>()\[\]])[^\s/@'\"<>()\[\]]+|(?<=//)):[^\s/@'\"<>]*"  # "//:pw@" too
    r"|(?<=//)[^\s/@'\"<>]+)@"  # and "//user@": the user alone may be the token
)


@settings(max_examples=500, deadline=None)
@given(st.text(alphabet="ab:@/ ()[]'\"<>\t\nx.-_%=?&#", max_size=16))
def test_a_url_s_user_and_password_are_found_as_the_rule_finds_them(text):
    from verirl._secrets import _userinfo_spans

    assert list(_userinfo_spans(text)) == [m.span() for m in _USERINFO_RULE.finditer(text)]


@pytest.mark.parametrize(
    "argv",
    [
        # a line shlex does not split (a no-break space): judged as one value
        ["sh", "-c", f"git clone https://{LEAKY}@github.com/o/r\xa0&& make"],
        # a token before a path at a revision, with no scheme, or after //
        ["pip", "install", f"{LEAKY}@github.com/org/repo@v1"],
        ["git", "clone", f"//{LEAKY}@github.com/o/r"],
        ["x", f"./{LEAKY}@host", f"a/b@{LEAKY}@host"],
        # calls spelled with spaces, over lines, or as __setitem__
        [sys.executable, "-c", f"os.environ.get( 'HF_TOKEN' , '{LEAKY}')"],
        [sys.executable, "-c", f"os.environ.setdefault(\n    'HF_TOKEN',\n    '{LEAKY}',\n)"],
        [sys.executable, "-c", f"os.environ.__setitem__('HF_TOKEN', '{LEAKY}')"],
    ],
)
def test_what_round_49_found_shown_stays_hidden(argv):
    assert LEAKY not in shown_line(argv)
    assert not any(LEAKY in word for word in redact_argv(argv))


@pytest.mark.parametrize(
    ("argv", "shown"),
    [
        (["curl", "-u", f"me:{LEAKY}", "https://h"], ["curl", "-u", f"me:{HIDDEN}", "https://h"]),
        (["curl", f"-ume:{LEAKY}"], ["curl", f"-ume:{HIDDEN}"]),
        (["curl", f"--user=me:{LEAKY}"], ["curl", f"--user=me:{HIDDEN}"]),
        (["curl", "--proxy-user", f"me:{LEAKY}"], ["curl", "--proxy-user", f"me:{HIDDEN}"]),
        (["curl", "-u", "me", "https://h"], ["curl", "-u", "me", "https://h"]),  # curl asks
        (["docker", "login", "-u", "me", "-p", LEAKY, "r"],
         ["docker", "login", "-u", "me", "-p", HIDDEN, "r"]),
        (["podman", "login", f"-p{LEAKY}"], ["podman", "login", f"-p{HIDDEN}"]),
        (["docker", "run", "-p", "80:80", "img"], ["docker", "run", "-p", "80:80", "img"]),
        (["sshpass", "-p", LEAKY, "ssh", "h"], ["sshpass", "-p", HIDDEN, "ssh", "h"]),
        (["mysql", "-u", "root", f"-p{LEAKY}", "db"], ["mysql", "-u", "root", f"-p{HIDDEN}", "db"]),
        (["mysql", "-p", "db"], ["mysql", "-p", "db"]),  # mysql asks; db is the database
        (["wandb", "login", "--relogin", LEAKY], ["wandb", "login", "--relogin", HIDDEN]),
        (["wandb", "sync", "runs"], ["wandb", "sync", "runs"]),
        (["openssl", "enc", "-passin", f"pass:{LEAKY}", "-passout", "env:X"],
         ["openssl", "enc", "-passin", f"pass:{HIDDEN}", "-passout", "env:X"]),
        (["redis-cli", "-a", LEAKY], ["redis-cli", "-a", HIDDEN]),
        (["/usr/bin/curl", "-u", f"a:{LEAKY}"], ["/usr/bin/curl", "-u", f"a:{HIDDEN}"]),
    ],
)  # fmt: skip
def test_another_tool_s_secret_that_no_name_tells_is_hidden(argv, shown):
    """Round 48: a password passed positionally or by another tool's short flag."""
    assert redact_argv(argv) == shown


@pytest.mark.parametrize(
    "line",
    [
        f"docker login -p {LEAKY} reg && docker run -p 80:80 img",
        f"cd /x; curl -u me:{LEAKY} https://h | jq .",
        f"sshpass -p{LEAKY} ssh host make",
    ],
)
def test_another_tool_s_secret_in_a_shell_line_is_hidden(line):
    assert LEAKY not in shown_line(["bash", "-c", line])
    assert "80:80" in shown_line(["bash", "-c", line]) or "80:80" not in line


@pytest.mark.parametrize(
    ("name", "value", "hidden"),
    [
        ("HF_TOKEN_BACKUP", "hfbackupvalue1", True),
        ("OPENAI_API_KEY_PROD", "sk-prod-123456", True),
        ("HF_TOKEN_PATH", "/some/where/token", False),
        ("SSH_AUTH_SOCK", "/tmp/ssh-abc/agent.1", False),
        ("API_KEY_NAME", "my-key-name-x", False),
        ("DATABASE_URL", "postgres://me:Pa%40ssword9@db.example/app", True),
        ("REDIS_URL", "redis://cache.example:6379/0", False),
    ],
)
def test_a_secret_variable_with_a_qualifier_or_a_url_s_password_is_scrubbed(
    monkeypatch, name, value, hidden
):
    """Round 48: the environment scan took only names ending in a secret word, and no URL's
    password; a command line that expanded the variable showed it."""
    monkeypatch.setenv(name, value)
    password = value.partition("://")[2].partition("@")[0].partition(":")[2] or value
    shown = shown_line(["psql", f"--note={value}", password, password.replace("%40", "@")])
    assert (password not in shown) is hidden, shown


@pytest.mark.parametrize(
    "argv",
    [
        ["bash", "-c", f"python x.py --api-key\xa0{LEAKY}"],  # a no-break space
        ["x", f"--api-key\xa0{LEAKY}"],
        ["bash", "-c", f"cat > c.yaml <<EOF\napi_key:\n  {LEAKY}\nEOF"],  # YAML: the next line
        ["bash", "-c", f"cat > c.yaml <<EOF\napi_key:\r\n    {LEAKY}\r\nother: 1\nEOF"],
        [sys.executable, "-c", f"token = \u201c{LEAKY} x\u201d"],  # pasted typographic quotes
        ["x", "--config", f'{{"api_key": \u201c{LEAKY} x\u201d}}'],
        ["x", "--config", f"password: \u00ab{LEAKY} x\u00bb"],
    ],
)
def test_a_value_after_a_no_break_space_a_yaml_line_break_or_typographic_quotes_is_hidden(argv):
    """Round 48's shapes: each showed the value."""
    assert LEAKY not in shown_line(argv)
    assert not any(LEAKY in word for word in redact_argv(argv))


@pytest.mark.parametrize(
    "text",
    [f"python x.py --api-key \\\n  {LEAKY} --lr 1", f"run --token \\\r\n{LEAKY}",
     f"export HF_TOKEN=\\\n{LEAKY}", f'{{"api_key": \\\n  "{LEAKY}"}}'],
)  # fmt: skip
def test_a_value_after_a_line_continuation_is_hidden_in_a_message(text):
    """Round 48: the backslash was taken for the value, and the value on the next line shown."""
    assert LEAKY not in redact_message(text)


def test_a_yaml_key_with_its_value_on_no_line_below_keeps_the_next_key():
    assert redact_message("api_key:\nnext: 1") == "api_key:\nnext: 1"


BASH = shutil.which("bash") or "/bin/bash"


def _printf_q(*words: str) -> str:
    """What bash's ``printf '%q '`` makes of ``words``: a wrapper's way to build a shell line."""
    done = subprocess.run([BASH, "-c", 'printf "%q " "$@"', "bash", *words],
                          capture_output=True, text=True, timeout=30, check=True)  # fmt: skip
    return done.stdout


@pytest.mark.parametrize(
    "line",
    [
        shlex.join(["python3", "-c", f"from huggingface_hub import login; login(token='{LEAKY}')"])
        + "; exit 3",
        shlex.join(["python", "-c", f"import os; os.environ['HF_TOKEN']='{LEAKY}'"]),
        shlex.join(["python", "-c", f"import os; os.environ.update(HF_TOKEN='{LEAKY}')"]),
        shlex.join(["python", "-c", f"login(token = '{LEAKY}')"]),
        shlex.join(["sh", "-c", shlex.join(["python", "-c", f"login(token='{LEAKY}')"])]),
        "PRINTF_Q",
    ],
)
def test_a_secret_in_a_line_a_quoting_wrapper_built_is_hidden(line):
    """Round 50: quoted by ``shlex.join`` or ``printf %q``, the whole pass hid a wrong span
    (``'"'``) and the line then split into words that no longer looked like a secret's."""
    if line == "PRINTF_Q":
        line = _printf_q("python3", "t.py", "--config", f'{{"api_key": "{LEAKY}"}}') + "; exit 3"
    assert LEAKY not in shown_line(["sh", "-c", line])
    assert not any(LEAKY in word for word in redact_argv(["sh", "-c", line]))


def test_a_name_ending_in_pass_is_a_secret_s_as_in_a_key_or_a_query(monkeypatch):
    """Round 50: ``--db-pass V`` and ``$DB_PASS`` were shown; ``{"db_pass": V}``, ``?db_pass=V``
    and ``env DB_PASS=V`` were hidden. ``--passes`` (a compiler's) and ``--bypass`` stay shown."""
    monkeypatch.setenv("DB_PASS", LEAKY)
    shown = shown_line(["x", "--db-pass", "V4lue-one", "--db", LEAKY, "--passes", "instcombine",
                        "--bypass", "proxy"])  # fmt: skip
    assert "V4lue-one" not in shown
    assert LEAKY not in shown
    assert "--passes instcombine --bypass proxy" in shown


def test_a_usage_error_ends_with_its_hint_after_a_secret_flag_without_its_value(
    capsys, no_settings
):
    """Round 50: ``launch --api-key V -- true`` is "unrecognized arguments: --api-key" (V went to
    the command): the hint after it was taken for the key and hidden ("verirl --help)")."""
    with pytest.raises(SystemExit):
        main(["launch", "--gpus", "1", "--api-key", SECRET, "--", "true"])
    err = capsys.readouterr().err
    assert err.rstrip().endswith("(see verirl --help)"), err
    assert SECRET not in err


# Round 51A: what a review of the round-48 and round-50 redaction found.


@pytest.mark.parametrize(
    "argv",
    [
        ["bash", "-lc", f"x=$(sshpass -p {LEAKY} ssh h)"],
        ["bash", "-c", f"(curl -u u:{LEAKY})"],
        ["bash", "-c", f"`curl -u u:{LEAKY}`"],
        ["bash", "-c", f"true $(sshpass -p {LEAKY} ssh h); exit 3"],
        ["curl", "-sSu", f"user:{LEAKY}", "https://h"],
        ["curl", f"-sSuuser:{LEAKY}"],
        ["skopeo", "copy", "--src-creds", f"u:{LEAKY}", "a", "b"],
        ["bash", "-c", f"python t.py --password=correct\\ {LEAKY}\\ battery --port 8000"],
    ],
)
def test_a_tool_s_secret_in_a_substitution_a_flag_cluster_or_after_an_escaped_space_is_hidden(
    argv,
):
    assert LEAKY not in shown_line(argv)
    assert not any(LEAKY in word for word in redact_argv(argv))


@pytest.mark.parametrize(
    "text",
    [f"python t.py --password=correct\\ {LEAKY}\\ battery --port 8000",
     f"HF_TOKEN=abc\\ {LEAKY}\\ ghi next"],
)  # fmt: skip
def test_a_value_with_escaped_spaces_is_hidden_whole_in_a_message(text):
    assert LEAKY not in redact_message(text)


@pytest.mark.parametrize(
    "text",
    [
        "Could not read the Hub token:\n  /home/u/.cache/huggingface/token: no\nnext line",
        "Invalid API key:\n    check https://platform.example.com/account/api-keys\n",
    ],
)
def test_prose_ending_in_a_secret_word_keeps_the_lines_below(text):
    """Only a YAML key alone on its line has its value on the lines below."""
    assert text.splitlines()[1].strip().split(":")[0] in redact_message(text)


def test_the_environment_scan_takes_only_a_word_that_tells_which_after_a_secret_s_name():
    found = secrets_in_environ({
        "SECRETS_MOUNT": "/var/run/secrets", "SORT_KEY_ORDER": "ascending",
        "AUTH_METHOD": "password", "AUTH_BACKEND": "kerberos5", "KEY_STORE": "/etc/ssl/keystore",
        "HF_TOKEN_EXPIRATION": "2026-12-31", "HF_TOKEN_BACKUP": "backupvalue1",
        "REDIS_URL": "redis://:p@ssword99@cache:6379/0",
    })  # fmt: skip
    assert found == ["backupvalue1", "p@ssword99"]


@pytest.mark.parametrize(
    "argv",
    [["plan", "--gpus", "2", "curl", "-u", f"u:{SECRET}"],
     ["plan", "--gpus", "2", "sshpass", "-p", SECRET, "ssh"]],
)  # fmt: skip
@pytest.mark.parametrize("json_flag", [[], ["--json"]], ids=["text", "json"])
def test_a_usage_error_never_shows_another_tool_s_secret(capsys, no_settings, argv, json_flag):
    with pytest.raises(SystemExit):
        main([*json_flag, *argv])
    out, err = capsys.readouterr()
    assert SECRET not in out + err
    assert "unrecognized arguments" in out + err


def test_a_long_shell_line_is_never_split_by_shlex(monkeypatch):
    """Round 51 (high): the word-by-word check split the whole argument with shlex (quadratic on
    one long token: 150 s for 1 MB). Lines over the bound are split on white space."""
    from verirl import _secrets

    lengths: list[int] = []
    real = shlex.split

    def split(text: str, *args: object, **kwargs: object) -> list[str]:
        lengths.append(len(text))
        return real(text, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(_secrets.shlex, "split", split)
    for line in [
        "a b api_key: \u201c" + "x" * 200_000,
        "curl -H 'Authorization: Bearer " + "x" * 200_000 + "'",
    ]:
        assert "x" * 100 not in shown_line(["sh", "-c", line])
    assert max(lengths, default=0) <= _secrets._MAX_SHELL_LINE


# Round 52: what a review of round 51's fixes found.


@pytest.mark.parametrize(
    "argv",
    [
        ["curl", "-d", '{"a":1}', "-u", f"user:{LEAKY}", "http://h"],
        ["mysql", "-e", "select 1;", f"-p{LEAKY}"],
        ["sshpass", "-e", "foo)", "-p", LEAKY],
        ["bash", "-c", f"curl -H 'Accept: text/html;' -u user:{LEAKY} h"],
    ],
)
def test_a_tool_s_secret_after_a_value_ending_in_a_bracket_or_semicolon_is_hidden(argv):
    """Round 52 (high, a round-51 regression): any word ending in ; ) } | & ended the tool."""
    assert LEAKY not in shown_line(argv)


def test_secret_names_with_a_provider_or_base_after_them_are_scrubbed():
    """Round 52: the which-one allowlist let SECRET_KEY_BASE, API_KEY_OPENAI through."""
    found = secrets_in_environ({"SECRET_KEY_BASE": "s3cr3t-value-xyz",
                                "API_KEY_OPENAI": "sk-abcdefgh1",
                                "DB_URL": "mongodb://u:SECRETPASS@h?appName=me@host"})  # fmt: skip
    assert found == ["s3cr3t-value-xyz", "sk-abcdefgh1", "SECRETPASS"]


def test_escaped_json_after_a_secret_key_keeps_the_rest():
    """Round 52: an escape in a bare value took in everything up to the next space."""
    text = '{\\"env\\":\\"API_KEY=abc123\\",\\"model\\":\\"meta-llama/Llama-3\\"}'
    shown = redact_message(text)
    assert "abc123" not in shown
    assert "meta-llama/Llama-3" in shown


def test_a_usage_error_hides_only_the_secrets_of_a_refused_line(capsys, no_settings):
    """Round 52: all from the first hidden part to the last was hidden, its words everywhere."""
    line = "--api-key K1234567 --model meta-llama/Llama-3 --hf-token T1234567"
    with pytest.raises(SystemExit):
        main(["plan", "--bogus", line])
    err = capsys.readouterr().err
    assert "--model meta-llama/Llama-3" in err, err
    assert "K1234567" not in err
    assert "T1234567" not in err

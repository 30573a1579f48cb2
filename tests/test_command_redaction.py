"""Class: secrets on command lines. The training command is logged with the server's redaction.

Swept over every spelling a secret takes on a command line (``--api-key V``,
``--hub_token=V``, ``HF_TOKEN=V``, a URL's password, inside ``sh -c '…'``,
a secret variable's value expanded bare) with open-ended secrets, and over
every path that shows the command: the "running …" line at every level, the
"cannot run" line (exit 127) and the refusal of a null byte.
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from verirl import _secrets
from verirl._hidden import HIDDEN
from verirl._secrets import redact_argv
from verirl.cli import main
from verirl.server import launch as _launch

secret = st.text(st.characters(min_codepoint=0x21, max_codepoint=0x7E, exclude_characters="@"),
                 min_size=12, max_size=30).map(lambda s: "S3cr" + s)  # fmt: skip
FORMS = [
    lambda s: ["--api-key", s],
    lambda s: [f"--api-key={s}"],
    lambda s: ["--hub_token", s],
    lambda s: [f"--hf-token={s}"],
    lambda s: ["--wandb-api-key", s],
    lambda s: ["--password", s],
    lambda s: [f"HF_TOKEN={s}"],
    lambda s: [f"https://user:{s}@hub.example/x"],
    lambda s: ["sh", "-c", shlex.join(["python", "train.py", "--hub-token", s])],
    lambda s: ["sh", "-c", f"HF_TOKEN={shlex.quote(s)} python train.py"],
]


def test_the_server_and_launch_share_one_redaction():
    assert _launch.redact_argv is _secrets.redact_argv


@settings(max_examples=200, deadline=None)
@given(
    value=secret,
    form=st.sampled_from(range(len(FORMS))),
    before=st.lists(st.sampled_from(["python", "train.py", "--lr", "1e-5", "-v"]), max_size=3),
)
def test_no_spelling_of_a_secret_survives(value, form, before):
    argv = [*before, *FORMS[form](value)]
    shown = shlex.join(redact_argv(argv))
    assert value not in shown
    assert HIDDEN in shown or "***@" in shown


@settings(max_examples=100, deadline=None)
@given(value=secret)
def test_a_secret_variables_value_is_scrubbed_wherever_it_appears(value):
    shown = shlex.join(redact_argv(["python", "t.py", "--push", value], secrets=[value]))
    assert value not in shown


def run_launch(argv: list[str], env_extra: dict[str, str]) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("VERIRL_")}
    env.pop("CUDA_VISIBLE_DEVICES", None)
    return subprocess.run(
        [sys.executable, "-m", "verirl", "-v", "launch", "--gpus", "1", "--", *argv],
        env={**env, **env_extra}, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


TOKEN = "hf_S3cretTokenValue123456"


@pytest.mark.parametrize("form", range(len(FORMS)))
def test_the_running_line_hides_it(form):
    argv = [sys.executable, "-c", "pass", *FORMS[form](TOKEN)]
    if FORMS[form](TOKEN)[0] == "sh":
        argv = FORMS[form](TOKEN)
    result = run_launch(argv, {})
    assert "running" in result.stderr, result.stderr
    assert TOKEN not in result.stderr + result.stdout


def test_an_expanded_secret_variable_is_hidden():
    result = run_launch([sys.executable, "-c", "pass", "--push", TOKEN], {"HF_TOKEN": TOKEN})
    assert result.returncode == 0, result.stderr
    assert TOKEN not in result.stderr + result.stdout


def test_cannot_run_hides_it():
    result = run_launch(["/nonexistent/train", "--api-key", TOKEN, f"https://u:{TOKEN}@h/x"], {})
    assert result.returncode == 127, result.stderr
    assert "cannot run" in result.stderr
    assert TOKEN not in result.stderr + result.stdout


def test_the_null_byte_refusal_hides_it(capsys, monkeypatch):
    for name in [n for n in os.environ if n.startswith("VERIRL_")]:
        monkeypatch.delenv(name)
    code = main(["launch", "--gpus", "1", "--", "python", "--api-key", TOKEN, "bad\x00arg"])
    captured = capsys.readouterr()
    assert code == 2
    assert "COMMAND" in captured.err
    assert TOKEN not in captured.err + captured.out


def test_an_empty_program_name_is_refused_before_anything_starts(capsys, monkeypatch):
    """``launch -- ''`` is bad input (exit 2, naming COMMAND), like an empty --vllm-command."""
    for name in [n for n in os.environ if n.startswith("VERIRL_")]:
        monkeypatch.delenv(name)
    code = main(["launch", "--gpus", "1", "--", "", "--api-key", TOKEN])
    captured = capsys.readouterr()
    assert code == 2
    assert "COMMAND=" in captured.err
    assert "its program name must not be empty" in captured.err
    assert TOKEN not in captured.err + captured.out
    assert "Traceback" not in captured.err


@pytest.mark.parametrize("where", ["HF_HOME", "HF_TOKEN_PATH"])
def test_a_token_from_the_saved_login_is_hidden(tmp_path, where):
    # huggingface_hub sends it with no variable set: it is a secret the command line may carry
    home = tmp_path / "hf-home"
    home.mkdir()
    token_file = home / "token" if where == "HF_HOME" else tmp_path / "elsewhere"
    token_file.write_text(TOKEN + "\n")
    env = {"HF_HOME": str(home)} if where == "HF_HOME" else {"HF_TOKEN_PATH": str(token_file)}
    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN"):
        env[name] = ""
    ran = run_launch([sys.executable, "-c", "pass", "--push", TOKEN], env)
    cannot = run_launch(["/nonexistent/train", TOKEN], env)
    assert ran.returncode == 0, ran.stderr
    assert cannot.returncode == 127, cannot.stderr
    for result in (ran, cannot):
        assert HIDDEN in result.stderr, result.stderr
        assert TOKEN not in result.stderr + result.stdout


def test_a_token_file_that_is_a_fifo_does_not_block(tmp_path, monkeypatch):
    fifo = tmp_path / "token"
    os.mkfifo(fifo)
    monkeypatch.setenv("HF_TOKEN_PATH", str(fifo))
    assert _secrets.known_secrets({"HF_TOKEN_PATH": str(fifo)}) == []
    assert redact_argv(["python", "t.py"]) == ["python", "t.py"]


def test_the_server_log_hides_what_the_running_line_hides(tmp_path, monkeypatch):
    from verirl import VLLMServer, VLLMServerError

    monkeypatch.setenv("HF_TOKEN", TOKEN)
    server = VLLMServer(
        "m", port=_free_port(), command=["/bin/sh", "-c", "exit 1", TOKEN], log_dir=tmp_path,
        startup_timeout=60,
    )  # fmt: skip
    with pytest.raises(VLLMServerError) as raised:
        server.start()
    log_text = b"".join(path.read_bytes() for path in tmp_path.iterdir())
    assert b"--- verirl" in log_text
    assert TOKEN.encode() not in log_text
    assert TOKEN not in str(raised.value)


def _free_port() -> int:
    from _support import unshared_port

    return unshared_port()


def test_a_secret_variable_that_is_not_utf8_is_hidden_and_breaks_nothing():
    value = os.fsdecode(b"S3cretBytes\xff\xfe0123")
    argv = ["python", "t.py", "--push", value]
    shown = _secrets.shown_line(argv, secrets=_secrets.secrets_in_environ({"MY_API_KEY": value}))
    assert "S3cretBytes" not in shown
    shown.encode("utf-8")  # one line any UTF-8 log can hold
    result = run_launch([sys.executable, "-c", "pass"], {"MY_API_KEY": value})
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.parametrize(
    ("name", "value"),
    [("HF_HUB_DISABLE_IMPLICIT_TOKEN", "true"), ("OPENAI_API_KEY", "EMPTY"), ("X_TOKEN", "1")],
)
def test_a_secret_named_setting_does_not_hide_ordinary_words(name, value):
    argv = [sys.executable, "-c", "pass", "--bf16", "true", "--tag", "EMPTY", "--output_dir",
            "/data/trueskill-run"]  # fmt: skip
    assert _secrets.secrets_in_environ({name: value}) == []
    result = run_launch(argv, {name: value})
    assert result.returncode == 0, result.stderr
    assert "--bf16 true --tag EMPTY --output_dir /data/trueskill-run" in result.stderr


def test_the_saved_login_is_found_where_huggingface_hub_finds_it(tmp_path, monkeypatch):
    # XDG_CACHE_HOME set but empty: huggingface_hub uses it as given, a path relative to the cwd
    (tmp_path / "huggingface").mkdir()
    (tmp_path / "huggingface" / "token").write_text(TOKEN)
    monkeypatch.chdir(tmp_path)
    env = {"XDG_CACHE_HOME": "", "HOME": str(tmp_path / "home")}
    assert _secrets.known_secrets(env) == [TOKEN]
    check = "from huggingface_hub import get_token; import sys; sys.stdout.write(get_token() or '')"
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "HUGGING", "XDG_"))}
    found = subprocess.run(
        [sys.executable, "-c", check], env={**clean, **env}, capture_output=True, text=True,
        timeout=60, check=True, cwd=tmp_path,
    ).stdout  # fmt: skip
    assert found == TOKEN  # the same file as huggingface_hub's own

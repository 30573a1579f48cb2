"""``python -m verirl``: a SIGTERM or Ctrl-C at any moment of its start: 143/130, one document.

Run as real processes:

- A SIGTERM whose ``SystemExit`` was lost (``compile()`` during an import with
  no cached bytecode, a finalizer, import machinery swallow it): every command,
  not only serve and launch, ends at once with 143 and the terminated document,
  rather than running to its end (wait-env its whole ``--timeout``) and exiting
  143 after its own document.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from _support import nothing_listens, unshared_port

ROOT = Path(__file__).resolve().parents[1]
WAIT_ENV_TIMEOUT = 30.0
"""wait-env's ``--timeout``: the runs below must end long before it."""
BOUND = 15.0
"""Seconds a run may take at most (it takes a fraction of one; room for a loaded machine)."""

MESSAGE = {signal.SIGINT: "interrupted (SIGINT)", signal.SIGTERM: "terminated (SIGTERM)"}


def _environ(tmp_path: Path) -> dict[str, str]:
    env = {
        name: value
        for name, value in os.environ.items()
        if not name.startswith(("VERIRL_", "HF_", "HUGGING_FACE_"))
        and name not in ("CUDA_VISIBLE_DEVICES", "RANK", "LOCAL_RANK", "WORLD_SIZE")
    }
    env["HF_HOME"] = str(tmp_path / "hf-home")
    env["HF_HUB_OFFLINE"] = "1"
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    return env


def _run(tmp_path: Path, script: str, *args: str) -> tuple[subprocess.CompletedProcess[str], float]:
    begun = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-c", script, *args], capture_output=True, text=True,
        env=_environ(tmp_path), cwd=ROOT, timeout=WAIT_ENV_TIMEOUT * 2, check=False,
    )  # fmt: skip
    return result, time.monotonic() - begun


def _assert_ended_by(result: subprocess.CompletedProcess[str], signum: int) -> None:
    """Exit ``128 + signum``, stdout exactly one document (the signal's), no traceback."""
    detail = (result.returncode, result.stdout, result.stderr[-3000:])
    assert result.returncode == 128 + signum, detail
    assert "Traceback" not in result.stderr, detail
    assert json.loads(result.stdout) == {
        "error": {"code": 128 + signum, "message": MESSAGE[signum]}
    }, detail


def _command(name: str, tmp_path: Path) -> list[str]:
    if name == "wait-env":
        port = unshared_port()
        assert nothing_listens(port)
        return ["wait-env", f"http://127.0.0.1:{port}", "--timeout", f"{WAIT_ENV_TIMEOUT:g}"]
    if name == "resume":
        out = tmp_path / "out"
        out.mkdir()
        return ["resume", "--output-dir", str(out)]
    return {"plan": ["plan", "--gpus", "2"], "doctor": ["doctor"]}[name]


# -- a SIGTERM whose SystemExit was lost

LOST = """
import signal, sys
import verirl.__main__ as program, verirl.cli as cli
from verirl._signals import program_handler
when = sys.argv[1]
sys.argv = ["verirl", "--json", *sys.argv[2:]]

def lose_a_sigterm():
    try:
        program_handler(signal.SIGTERM, None)  # the handler runs ...
    except SystemExit:
        pass  # ... and compile() swallows its exit

if when == "while verirl imports":
    lose_a_sigterm()
else:  # "as the command starts": after the flags are parsed, past run's own check
    decide = cli.decide_json
    cli.decide_json = lambda wanted: decide(wanted) or lose_a_sigterm()
sys.exit(program.run())
"""


@pytest.mark.parametrize("when", ["while verirl imports", "as the command starts"])
@pytest.mark.parametrize("command", ["wait-env", "plan", "resume", "doctor"])
def test_a_sigterm_whose_exit_was_lost_ends_every_command_at_once(tmp_path, command, when):
    """Not after the command's own work and document: wait-env does not poll its --timeout."""
    result, took = _run(tmp_path, LOST, when, *_command(command, tmp_path))
    _assert_ended_by(result, signal.SIGTERM)
    assert took < BOUND < WAIT_ENV_TIMEOUT, took

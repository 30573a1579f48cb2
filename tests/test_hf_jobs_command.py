"""The Hugging Face Jobs commands we document, checked by huggingface_hub's own ``hf jobs run``.

``--dry-run`` parses the command exactly as a submission would and prints the
job's configuration without submitting anything (no token, no network).
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
IMAGE = "python:3.12"


def _commands(text: str) -> list[str]:
    """Each ``hf jobs run ...`` command line in ``text`` (code blocks), continuations joined."""
    joined = re.sub(r"\\{1,2}\n\s*", " ", text)  # `\` + newline, and a docstring's `\\`
    lines = re.finditer(r"^\s*(hf jobs run .*)$", joined, flags=re.MULTILINE)
    return [match.group(1).strip() for match in lines]


def _documented() -> list[tuple[str, str]]:
    found = []
    for path in (ROOT / "README.md", ROOT / "examples" / "hf_job.py"):
        found += [(path.name, command) for command in _commands(path.read_text())]
    return found


def test_the_readme_and_the_example_document_the_same_command():
    commands = {command for _, command in _documented()}
    assert len(commands) == 1, commands
    assert {name for name, _ in _documented()} == {"README.md", "hf_job.py"}


@pytest.mark.parametrize(
    ("where", "command"), _documented(), ids=[where for where, _ in _documented()]
)
def test_hf_jobs_run_accepts_it_with_attempts_and_auto_resume(where, command, tmp_path):
    hf = shutil.which("hf", path=str(Path(sys.executable).parent)) or shutil.which("hf")
    assert hf is not None, "huggingface_hub's hf command is not installed"
    argv = shlex.split(command.replace("<image>", IMAGE))
    assert argv[:3] == ["hf", "jobs", "run"]
    done = subprocess.run(
        [hf, "jobs", "run", "--dry-run", *argv[3:]],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=tmp_path,
        env={"PATH": str(Path(sys.executable).parent), "HOME": str(tmp_path),
             "HF_HOME": str(tmp_path / "hf"), "HF_HUB_OFFLINE": "1",
             "HF_HUB_DISABLE_TELEMETRY": "1"},
    )  # fmt: skip
    out = done.stdout
    assert done.returncode == 0, done.stdout + done.stderr
    assert "(dry run) Job not submitted." in out
    fields = dict(re.findall(r"^\s+(\w+)\s+(.*)$", out, flags=re.MULTILINE))
    assert fields["attempts"] == "3"  # the same command runs again after a preemption
    assert fields["image"] == IMAGE
    assert fields["command"].startswith("python examples/hf_job.py")
    assert "HF_TOKEN" in fields["secrets"]
    assert "VERIRL_HUB_REPO_ID=" in out
    # No "latest": the examples resume with auto, and latest fails the first attempt.
    assert "VERIRL_RESUME_FROM_CHECKPOINT=latest" not in out, where

"""The README's first command (`nox -s demo`) runs examples/demo.py; it must keep working."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

DEMO = Path(__file__).resolve().parent.parent / "examples" / "demo.py"


def test_demo_runs_end_to_end_and_downloads_only_the_chosen_checkpoint():
    result = subprocess.run(
        [sys.executable, str(DEMO)], capture_output=True, text=True, timeout=120, check=False
    )
    assert result.returncode == 0, result.stdout + result.stderr
    out = result.stdout
    assert "[train] resuming from" in out
    assert "checkpoint-20 (step 20)" in out
    assert "checkpoints written     : checkpoint-30" in out
    assert "ratio 1.00" in out
    assert "start-up timeline:" in result.stderr

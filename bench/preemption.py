"""Figure 8: steps lost per preemption, Trainer alone vs with `PreemptionCallback`.

Every run is the drill's real GRPOTrainer (CPU, tiny random model, no vLLM;
tests/drill/grpo_script.py) with ``save_steps=SAVE_STEPS``, signalled once
step ``PAUSE`` has ended (the script holds that step end until the signal
arrived, so the step is exact), with SIGTERM (Kubernetes, SLURM, ``verirl
launch``) and with SIGINT (Modal, Ctrl-C), one row each. Steps lost = steps
done at the signal minus the step of the newest complete checkpoint left
behind: what the retry redoes; "exit after" is the time from the signal to
the process's end (the save included). Needs trl (``nox -s bench`` and
``nox -s drill`` install it).
"""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import attrs

from verirl.checkpoints import LocalCheckpointSource

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "tests" / "drill" / "grpo_script.py"
TINY_MODEL_DIR = ROOT / "tests" / "engine"
SAVE_STEPS = 4
PAUSE = 7  # 3 steps after the last regular save, as an unlucky preemption would be
STEPS = 10
LIMIT = 300.0  # seconds for one run
MODULES = ("trl", "transformers", "datasets")
GOAL = "0 steps lost"


def case(signum: signal.Signals) -> str:
    """The row's case: which signal, when."""
    return f"steps lost per preemption (save_steps={SAVE_STEPS}, {signum.name} after step {PAUSE})"


@attrs.frozen
class Lost:
    """One run: the exit code, the newest complete checkpoint's step, steps lost, time to exit."""

    code: int
    kept: int | None
    lost: int
    exit_after: float


def missing() -> list[str]:
    """The modules this figure needs that are not installed."""
    return [name for name in MODULES if importlib.util.find_spec(name) is None]


def _wait_for_pause(events: Path, run: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + LIMIT
    tick = threading.Event()
    while time.monotonic() < deadline and run.poll() is None:
        if events.exists() and '"event": "paused"' in events.read_text():
            return
        tick.wait(0.05)
    msg = f"the training script never reached step {PAUSE} (exit {run.poll()})"
    raise RuntimeError(msg)


def preempt(model: Path, folder: Path, *, callback: bool, signum: signal.Signals) -> Lost:
    """Run the script, signal it after step `PAUSE`, and count what a retry would redo."""
    out, events = folder / "out", folder / "events.jsonl"
    argv = [sys.executable, str(SCRIPT), "--model", str(model), "--output-dir", str(out),
            "--events", str(events), "--max-steps", str(STEPS), "--pause-at", str(PAUSE),
            "--save-steps", str(SAVE_STEPS), *(() if callback else ("--no-callback",))]  # fmt: skip
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    env.pop("VERIRL_RESUME_FROM_CHECKPOINT", None)
    run = subprocess.Popen(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_for_pause(events, run)
        signalled = time.monotonic()
        run.send_signal(signum)
        code = run.wait(timeout=LIMIT)
        exit_after = time.monotonic() - signalled
    finally:
        if run.poll() is None:
            run.kill()
            run.wait()
    records = [json.loads(line) for line in events.read_text().splitlines()]
    done = max(record["step"] for record in records if record["event"] == "step")
    found = LocalCheckpointSource(out).latest()
    kept = None if found is None else found.step
    return Lost(128 - code if code < 0 else code, kept, done - (kept or 0), exit_after)


def build_model(folder: Path) -> Path:
    """The tiny random model of tests/engine, built offline."""
    sys.path.insert(0, str(TINY_MODEL_DIR))
    try:
        from tiny_model import build_tiny_model  # type: ignore[import-not-found]  # noqa: PLC0415
    finally:
        sys.path.remove(str(TINY_MODEL_DIR))
    return Path(build_tiny_model(folder))


def measure(scratch: Path) -> list[tuple[str, str, str, str, str, bool | None]]:
    """The table rows, SIGTERM then SIGINT: (case, verirl, baseline, ratio, goal, met)."""
    signals = (signal.SIGTERM, signal.SIGINT)
    absent = missing()
    if absent:
        why = f"not measured (no {', '.join(absent)})"
        return [(case(signum), why, "—", "—", GOAL, None) for signum in signals]
    model = build_model(scratch / "model")
    rows: list[tuple[str, str, str, str, str, bool | None]] = []
    for signum in signals:
        where = scratch / signum.name
        alone = preempt(model, where / "alone", callback=False, signum=signum)
        saved = preempt(model, where / "callback", callback=True, signum=signum)
        new = (
            f"{saved.lost} (checkpoint-{saved.kept} written at the {signum.name}, "
            f"exit {saved.code} {saved.exit_after:.2f}s after it)"
        )
        old = (
            f"{alone.lost} (newest checkpoint-{alone.kept}, killed: exit {alone.code} "
            f"{alone.exit_after:.2f}s after it)"
        )
        average = (SAVE_STEPS - 1) / 2
        old += f"; {average:g} on average with save_steps={SAVE_STEPS}"
        rows.append((case(signum), new, old, "—", GOAL, saved.lost == 0))
    return rows

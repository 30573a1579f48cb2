"""The "container" an example test runs an example in: the example as its platform runs it.

    python container.py --events FILE [--pause-at N] script EXAMPLE.py [ARGS ...]
    python container.py --events FILE [--pause-at N] modal EXAMPLE.py FUNCTION

``script`` runs the file as ``python EXAMPLE.py ARGS`` would (``__main__``);
``modal`` imports it and calls ``FUNCTION.local()`` through the real Modal
client, in this process, as a Modal container runs a function's body. The
example is not changed: before it runs, ``trl.GRPOTrainer`` (which the
examples import inside their functions) becomes a subclass that puts an
`Events` recorder first among the callbacks. It writes one JSON line per
event to ``--events`` (``train`` with the resume path, ``begin``, each
``step``, ``paused``, ``end``, and ``raised`` with what left the example),
and at step ``--pause-at`` it waits until the example's `PreemptionCallback`
has a stop request, so a signal lands at a known step: an event, not a sleep.
Whatever the example raises goes on out of this program, so the process
exits as the example's would (a ``KeyboardInterrupt``: killed by SIGINT).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import runpy
import sys
import threading
import time
from pathlib import Path
from typing import Any

PAUSE_LIMIT = 120.0  # seconds to wait at --pause-at for the stop request, then go on


class Recorder:
    """Appends events to a JSON-lines file, each flushed to disk before going on."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def write(self, **fields: object) -> None:
        record = {"pid": os.getpid(), "rank": int(os.environ.get("RANK", "0")), **fields}
        with self.path.open("a") as out:
            out.write(json.dumps(record) + "\n")
            out.flush()
            os.fsync(out.fileno())


def install_recorder(recorder: Recorder, pause_at: int) -> None:
    """Make ``trl.GRPOTrainer`` record its run and pause at ``pause_at``."""
    import trl
    from transformers import TrainerCallback

    class Events(TrainerCallback):  # type: ignore[misc]
        """First among the callbacks, so its hooks run before PreemptionCallback's."""

        def __init__(self) -> None:
            self.preemption: Any = None

        def on_train_begin(self, args, state, control, **_):  # noqa: ARG002
            recorder.write(event="begin", step=state.global_step)

        def on_step_end(self, args, state, control, **_):  # noqa: ARG002
            recorder.write(event="step", step=state.global_step)
            if state.global_step != pause_at or not state.is_world_process_zero:
                return
            recorder.write(event="paused", step=state.global_step)
            deadline = time.monotonic() + PAUSE_LIMIT
            tick = threading.Event()
            while time.monotonic() < deadline:
                if self.preemption is not None and self.preemption.stop_requested:
                    break
                tick.wait(0.02)  # the signal's handler (or its default action) runs in between
            recorder.write(event="unpaused", step=state.global_step)

        def on_train_end(self, args, state, control, **_):  # noqa: ARG002
            recorder.write(event="end", step=state.global_step)

    base = trl.GRPOTrainer

    class RecordedGRPOTrainer(base):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, callbacks: Any = None, **kwargs: Any) -> None:
            events = Events()
            super().__init__(*args, callbacks=[events, *(callbacks or [])], **kwargs)
            found = [
                callback for callback in self.callback_handler.callbacks
                if type(callback).__name__ == "PreemptionCallback"
            ]  # fmt: skip
            events.preemption = found[0] if found else None
            fields = ("output_dir", "max_steps", "save_steps", "use_vllm")
            config = {key: getattr(self.args, key) for key in fields}
            recorder.write(event="trainer", preemption_callback=bool(found), config=config)

        def train(self, resume_from_checkpoint: Any = None, **kwargs: Any) -> Any:
            recorder.write(event="train", resume=resume_from_checkpoint)
            return super().train(resume_from_checkpoint=resume_from_checkpoint, **kwargs)

    trl.GRPOTrainer = RecordedGRPOTrainer


def run_modal(example: Path, function: str) -> object:
    """``FUNCTION.local()`` of the Modal app in ``example``, as a container runs its body."""
    sys.path.insert(0, str(example.parent))
    spec = importlib.util.spec_from_file_location(example.stem, example)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[example.stem] = module
    spec.loader.exec_module(module)
    return getattr(module, function).local()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--events", type=Path, required=True)
    parser.add_argument("--pause-at", type=int, default=-1)
    parser.add_argument("how", choices=["script", "modal"])
    parser.add_argument("example", type=Path)
    parser.add_argument("rest", nargs=argparse.REMAINDER)
    args = parser.parse_args()

    recorder = Recorder(args.events)
    recorder.write(event="container", how=args.how)
    install_recorder(recorder, args.pause_at)
    try:
        if args.how == "modal":
            (function,) = args.rest
            result = run_modal(args.example, function)
        else:
            sys.argv = [str(args.example), *args.rest]
            sys.path.insert(0, str(args.example.parent))
            runpy.run_path(str(args.example), run_name="__main__")
            result = None
    except BaseException as exc:
        code = exc.code if isinstance(exc, SystemExit) else None
        recorder.write(event="raised", type=type(exc).__name__, code=code)
        raise
    recorder.write(event="returned", value=repr(result))


if __name__ == "__main__":
    main()

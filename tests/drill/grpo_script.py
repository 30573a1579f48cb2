"""The drill's training script: a real GRPOTrainer on CPU, tiny model, no vLLM.

Run by `verirl launch` (or torchrun) in the drill and the bench. It writes
one JSON line per event to ``--events`` (begin, each step end, pause, end,
with the rank), and at step ``--pause-at`` it waits for the stop request
(SIGTERM) to arrive, so the signal lands mid-run at a known step: an
event, not a sleep. Only rank 0 pauses: under torchrun the test signals
rank 0 alone, and the other ranks must stop at the same step by agreement.
``--no-callback`` runs Trainer alone (the baseline); ``--jit`` turns on
transformers' own ``enable_jit_checkpoint``. ``--hold-save S`` holds a save S
seconds before ``trainer_state.json`` (event "saving"), so that a second signal
lands mid-save; ``--hold-jit-save`` holds a JIT save forever after
``trainer_state.json``, before transformers removes its sentinel (event
"saved-state"), so that a SIGKILL lands between the two.
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
from pathlib import Path

from datasets import Dataset
from transformers import TrainerCallback
from trl import GRPOConfig, GRPOTrainer

from verirl.checkpoints import INCOMPLETE_MARKER
from verirl.preemption import BY_SIGNAL, PreemptionCallback

PAUSE_LIMIT = 120.0  # seconds to wait at --pause-at for the signal, then go on


def _reward(completions: list[object], **_: object) -> list[float]:
    return [float(len(str(completion))) for completion in completions]


class Events(TrainerCallback):  # type: ignore[misc]
    """Writes the run's events; listed before PreemptionCallback, so its hooks run first."""

    def __init__(self, path: Path, pause_at: int, preemption: PreemptionCallback | None) -> None:
        self.path = path
        self.pause_at = pause_at
        self.preemption = preemption
        self.then_pause = 0.0

    def write(self, state: object, **fields: object) -> None:  # noqa: ARG002 - the hooks' state
        rank = int(os.environ.get("RANK", "0"))
        record = {"pid": os.getpid(), "rank": rank, **fields}
        with self.path.open("a") as out:
            out.write(json.dumps(record) + "\n")
            out.flush()
            os.fsync(out.fileno())

    def on_train_begin(self, args, state, control, **_):  # noqa: ARG002
        resume = os.environ.get("VERIRL_RESUME_FROM_CHECKPOINT") or None
        self.write(state, event="begin", step=state.global_step, resume=resume)

    def on_step_end(self, args, state, control, **_):  # noqa: ARG002
        self.write(state, event="step", step=state.global_step)
        if state.global_step != self.pause_at or not state.is_world_process_zero:
            return  # only rank 0 pauses (and is signalled): the others must follow it
        self.write(state, event="paused", step=state.global_step)
        deadline = time.monotonic() + PAUSE_LIMIT
        tick = threading.Event()
        while time.monotonic() < deadline:
            if self.preemption is not None and self.preemption.stop_requested:
                break
            tick.wait(0.02)  # SIGTERM's handler (or its default action) runs in between
        self.write(state, event="unpaused", step=state.global_step)
        if self.then_pause:  # a second signal lands while the checkpoint is being written
            tick.wait(self.then_pause)

    def on_train_end(self, args, state, control, **_):  # noqa: ARG002
        signalled = self.preemption is not None and self.preemption.stop_requested
        self.write(state, event="end", step=state.global_step, signalled=signalled)


class HoldingTrainer(GRPOTrainer):  # type: ignore[misc]
    """GRPOTrainer whose saves can be held at a known point (see the module docstring)."""

    recorder: Events
    hold_save = 0.0
    hold_jit_save = False

    def _save_rng_state(self, output_dir):
        super()._save_rng_state(output_dir)
        if self.hold_save:  # the folder has weights and optimizer, not yet trainer_state.json
            self.recorder.write(self.state, event="saving", step=self.state.global_step)
            threading.Event().wait(self.hold_save)  # a second SIGINT raises out of here

    def _save_checkpoint(self, model, trial):
        super()._save_checkpoint(model, trial)
        folder = Path(self.args.output_dir) / f"checkpoint-{self.state.global_step}"
        if self.hold_jit_save and (folder / INCOMPLETE_MARKER).exists():
            self.recorder.write(self.state, event="saved-state", step=self.state.global_step)
            threading.Event().wait(PAUSE_LIMIT)  # the test SIGKILLs us here


def main() -> None:
    _train()
    _leave_the_process_group()


def _train() -> None:
    """Train; the trainer, and with it DDP's reducer, is garbage once this returns."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--model", required=True)
    parser.add_argument("--output-dir", required=True)
    parser.add_argument("--events", required=True, type=Path)
    parser.add_argument("--max-steps", type=int, default=6)
    parser.add_argument("--save-steps", type=int, default=1000)
    parser.add_argument("--pause-at", type=int, default=-1)
    parser.add_argument("--no-callback", action="store_true")
    parser.add_argument("--exit-code", default="by-signal")
    parser.add_argument("--then-pause", type=float, default=0.0)
    parser.add_argument("--jit", action="store_true")
    parser.add_argument("--hold-save", type=float, default=0.0)
    parser.add_argument("--hold-jit-save", action="store_true")
    args = parser.parse_args()

    exit_code = {"by-signal": BY_SIGNAL, "none": None}.get(args.exit_code, args.exit_code)
    if isinstance(exit_code, str):
        exit_code = int(exit_code)
    preemption = None if args.no_callback else PreemptionCallback(exit_code=exit_code)
    recorder = Events(args.events, args.pause_at, preemption)
    recorder.then_pause = args.then_pause
    callbacks: list[object] = [recorder]
    if preemption is not None:
        callbacks.append(preemption)
    config = GRPOConfig(
        output_dir=args.output_dir,
        use_cpu=True,
        bf16=False,
        max_steps=args.max_steps,
        save_strategy="steps",
        save_steps=args.save_steps,
        per_device_train_batch_size=2,
        num_generations=2,
        max_completion_length=4,
        learning_rate=1e-4,
        logging_steps=1,
        report_to="none",
        seed=0,
        dataloader_num_workers=0,
        ddp_backend="gloo" if int(os.environ.get("WORLD_SIZE", "1")) > 1 else None,
        enable_jit_checkpoint=args.jit,
    )
    prompts = ["module adder(input a", "the quick brown fox", "assign y =", "jumps over"] * 16
    trainer = HoldingTrainer(
        model=args.model,
        reward_funcs=_reward,
        args=config,
        train_dataset=Dataset.from_dict({"prompt": prompts}),
        callbacks=callbacks,
    )
    trainer.recorder = recorder
    trainer.hold_save = args.hold_save
    trainer.hold_jit_save = args.hold_jit_save
    resume = os.environ.get("VERIRL_RESUME_FROM_CHECKPOINT") or None
    try:
        trainer.train(resume_from_checkpoint=resume)
    except SystemExit as exc:  # PreemptionCallback's exit, recorded for the test
        recorder.write(trainer.state, event="exit", code=exc.code)
        raise
    except KeyboardInterrupt:  # its exit after a SIGINT (or a second SIGINT's, at once)
        recorder.write(trainer.state, event="exit", code="KeyboardInterrupt")
        raise


def _leave_the_process_group() -> None:
    """Tear gloo down before the interpreter does: left to exit, its threads can abort the rank.

    A rank that ended training normally then died of SIGABRT ("terminate
    called without an active exception") in a fresh-clone CI run, and
    torchrun reported the job failed. Trainer never destroys the group.

    The trainer goes first. DDP's reducer holds the group, and freeing it
    does not let go of the GIL (pytorch/pytorch#56297): were the reducer
    the group's last holder, the group's destructor would join a gloo
    thread that waits for the GIL to free a tensor, and the rank would hang
    (a fresh-clone CI run on bebc5aa). While the group is registered, the
    reducer is never its last holder; `destroy_process_group` lets go of it
    through torch's own binding, which releases the GIL first. A rank that
    stops by a signal (`SystemExit`) exits with the trainer still held: there
    what bounds the exit is launch's grace, after which it kills what is left.
    """
    import gc

    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    gc.collect()  # the trainer's reference cycles, the reducer with them
    # Checked, not assumed: a DDP model still held would free its reducer at exit, too late.
    left = sum(isinstance(thing, DistributedDataParallel) for thing in gc.get_objects())
    if left:
        raise SystemExit(f"{left} DistributedDataParallel model(s) outlived the trainer")
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()

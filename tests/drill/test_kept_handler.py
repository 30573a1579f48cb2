"""A SIGTERM handler `PreemptionCallback` leaves in place as its exit ends the process.

The program may catch that exit and go on (a second trainer, a server under
the SIGTERM policy): the handler must not outlive its purpose, with or
without transformers' JIT checkpoint (``enable_jit_checkpoint=True``, whose
callback runs before the user's and puts back its own original handler).
Real `transformers.Trainer` runs on CPU, each in a program of its own.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from drill_support import clean_env

PROGRAM = """
import os, signal, sys, tempfile, time
signal.signal(signal.SIGINT, signal.default_int_handler)
signal.signal(signal.SIGTERM, signal.SIG_DFL)
import torch
from transformers import Trainer, TrainerCallback, TrainingArguments
from verirl._signals import exit_on_sigterm
from verirl.preemption import PreemptionCallback

class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.w = torch.nn.Linear(2, 1)
    def forward(self, x, labels=None):
        return {"loss": ((self.w(x).squeeze(-1) - labels) ** 2).mean()}

class Data(torch.utils.data.Dataset):
    def __len__(self):
        return 64
    def __getitem__(self, i):
        return {"x": torch.ones(2), "labels": torch.tensor(1.0)}

class Preempt(TrainerCallback):
    def on_step_end(self, args, state, control, **kwargs):
        if state.global_step == 2:
            os.kill(os.getpid(), signal.SIGTERM)

def train(jit, preempt):
    args = TrainingArguments(
        output_dir=tempfile.mkdtemp(), use_cpu=True, report_to="none", max_steps=4,
        per_device_train_batch_size=2, save_strategy="no", enable_jit_checkpoint=jit,
        disable_tqdm=True, logging_strategy="no",
    )
    callbacks = [PreemptionCallback(), *([Preempt()] if preempt else [])]
    trainer = Trainer(model=Model(), args=args, train_dataset=Data(), callbacks=callbacks)
    try:
        trainer.train()
        print("returned")
    except SystemExit as exc:
        print("exit", exc.code)

train(sys.argv[1] == "jit", preempt=True)  # the exit is caught: the program goes on
if sys.argv[2] == "policy":
    with exit_on_sigterm():  # a server's or a runtime's SIGTERM policy
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(2)
            print("policy: SIGTERM ignored")
        except SystemExit as exc:
            print("policy", exc.code)
else:
    train(sys.argv[2] == "jit", preempt=False)  # a newer callback, a normal end
print("default", signal.getsignal(signal.SIGTERM) == signal.SIG_DFL)
"""


@pytest.mark.parametrize(
    ("first", "then", "said"),
    [
        (first, then, ["exit 143", "policy 143" if then == "policy" else "returned"])
        for first in ("jit", "plain")
        for then in ("policy", "jit", "plain")
    ],
    ids=lambda value: value if isinstance(value, str) else "",
)
def test_a_caught_preemption_exit_leaves_no_handler_that_ignores_sigterm(first, then, said):
    """After a SIGTERM stop whose exit the program caught, a later holder of SIGTERM (the
    policy of a server, a second trainer's callback) takes it over, and SIGTERM is the default
    once that one is done (review of 3e4cff1: with a JIT checkpoint on either trainer, SIGTERM
    was ignored for good)."""
    done = subprocess.run(
        [sys.executable, "-c", PROGRAM, first, then], capture_output=True, text=True,
        timeout=240, env=clean_env(), check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    lines = [line for line in done.stdout.splitlines() if not line.startswith("{")]  # metrics
    assert lines == [*said, "default True"], done.stdout + done.stderr[-3000:]

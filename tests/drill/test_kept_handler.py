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

HEADER = """
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

def make_trainer(callbacks, jit=False, max_steps=4):
    args = TrainingArguments(
        output_dir=tempfile.mkdtemp(), use_cpu=True, report_to="none", max_steps=max_steps,
        per_device_train_batch_size=2, save_strategy="no", enable_jit_checkpoint=jit,
        disable_tqdm=True, logging_strategy="no",
    )
    return Trainer(model=Model(), args=args, train_dataset=Data(), callbacks=callbacks)

"""

PROGRAM = (
    HEADER
    + """
def train(jit, preempt):
    trainer = make_trainer([PreemptionCallback(), *([Preempt()] if preempt else [])], jit=jit)
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
)


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


SCENES = (
    PROGRAM.split("first_jit", maxsplit=1)[0].split("train(sys.argv[1]", maxsplit=1)[0]
    + """
import threading
from verirl._signals import SIGTERM_POLICY

def train_caught(signum, jit=False, **kwargs):
    class Preempt(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            if state.global_step == 2:
                os.kill(os.getpid(), signum)
    trainer = make_trainer([PreemptionCallback(**kwargs), Preempt()], jit=jit)
    try:
        trainer.train()
        print("returned")
    except (SystemExit, KeyboardInterrupt) as exc:
        kept = signal.getsignal(signal.SIGTERM) != signal.SIG_DFL
        print(type(exc).__name__, "kept" if kept else "default")

def sigterm_now():
    try:
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(2)
        print("SIGTERM ignored")
    except SystemExit as exc:
        print("SIGTERM exit", exc.code)

scene = sys.argv[1]
def interrupted_training(jit=False):  # the watchdog interrupts it at step 2: its server died
    class Dies(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            if state.global_step == 2:
                error = RuntimeError("the vLLM server died")
                threading.Thread(target=SIGTERM_POLICY.interrupt, args=(error,)).start()
                time.sleep(5)
                print("interrupt dropped")
    trainer = make_trainer([PreemptionCallback(), Dies()], jit=jit)
    try:
        trainer.train()
        print("returned")
    except RuntimeError as exc:
        print("interrupt", exc)

def ctrl_c_twice(jit=False):  # the second one while stopping: out now
    class CtrlC(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            if state.global_step in (2, 3):
                os.kill(os.getpid(), signal.SIGINT)
    trainer = make_trainer([PreemptionCallback(), CtrlC()], jit=jit, max_steps=6)
    try:
        trainer.train()
        print("returned")
    except KeyboardInterrupt:
        print("KeyboardInterrupt")

if scene.startswith("held-ctrl-c-twice"):  # a notebook's kernel interrupted twice, server held
    with exit_on_sigterm():
        ctrl_c_twice(jit=scene.endswith("-jit"))
        sigterm_now()
    print("default", signal.getsignal(signal.SIGTERM) == signal.SIG_DFL)
elif scene == "interrupted-jit":  # a JIT trainer's train() ended by the watchdog's interrupt
    with exit_on_sigterm():
        interrupted_training(jit=True)
    print("default", signal.getsignal(signal.SIGTERM) == signal.SIG_DFL)
elif scene == "held-ctrl-c":  # a server's policy held from before; a Ctrl-C stop caught
    with exit_on_sigterm():
        train_caught(signal.SIGINT)
        sigterm_now()
    with exit_on_sigterm():
        train_caught(signal.SIGINT)
        interrupted_training()
elif scene.startswith("held-"):  # the same, an exit caught: the next training rearms it
    exit_code = {} if scene == "held-sigterm" else {"exit_code": 7}
    with exit_on_sigterm():
        train_caught(signal.SIGTERM if scene == "held-sigterm" else signal.SIGINT, **exit_code)
        interrupted_training()
elif scene == "thread":  # the next training runs in a thread: its callback has no handler
    train_caught(signal.SIGTERM)
    class Slow(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            time.sleep(0.3)
    done = []
    def second():
        callback = PreemptionCallback(exit_code=None)
        trainer = make_trainer([callback, Slow()], max_steps=40)
        trainer.train()
        done.append(callback.stopped_at)
    worker = threading.Thread(target=second)
    worker.start()
    time.sleep(3)
    os.kill(os.getpid(), signal.SIGTERM)
    worker.join()
    print("stopped at", "a step" if done and done[0] is not None and done[0] < 40 else done)
elif scene == "twice-jit":  # a second caught stop, of a trainer with a JIT checkpoint
    train_caught(signal.SIGTERM)
    train_caught(signal.SIGTERM, jit=True)
elif scene.startswith("jit-built-before"):  # its JIT handler set before the server's policy
    callbacks = [PreemptionCallback()] if scene.endswith("-preempt") else []
    # Two: an older trainer's JIT handler under this one's, put back as this one ends.
    older = make_trainer([], jit=True) if scene.endswith("-two") else None
    trainer = make_trainer(callbacks, jit=True)
    with exit_on_sigterm():
        if not scene.endswith("-released"):
            trainer.train()
            if older is not None:
                older.train()
            print("returned")
            sigterm_now()
    if scene.endswith("-released"):  # held and released before it trains
        trainer.train()
        print("returned")
    print("default", signal.getsignal(signal.SIGTERM) == signal.SIG_DFL)
elif scene == "jit-hold-in-training":  # a callback holds the policy a moment mid-training
    class HoldsAMoment(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            if state.global_step == 1:
                with exit_on_sigterm():
                    pass
            if state.global_step == 2:
                os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(1)  # JIT's 3 s timer comes before the end
    trainer = make_trainer([HoldsAMoment()], jit=True, max_steps=8)
    trainer.train()
    saved = any(name.startswith("checkpoint-") for name in os.listdir(trainer.args.output_dir))
    print("JIT checkpoint", saved)
elif scene == "jit-ctrl-c-held":  # no PreemptionCallback; a Ctrl-C a notebook catches
    class CtrlC(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            if state.global_step == 2:
                os.kill(os.getpid(), signal.SIGINT)
    trainer = make_trainer([CtrlC()], jit=True)
    with exit_on_sigterm():
        try:
            trainer.train()
        except KeyboardInterrupt:
            print("KeyboardInterrupt")
        sigterm_now()
    print("default", signal.getsignal(signal.SIGTERM) == signal.SIG_DFL)
elif scene in ("jit-fork", "fork-preempt"):  # a worker forked (a reward pool's) ends on a signal
    import multiprocessing
    def terminated_worker(signum=signal.SIGTERM):
        worker = multiprocessing.get_context("fork").Process(target=time.sleep, args=(30,))
        worker.start()
        time.sleep(0.5)
        os.kill(worker.pid, signum)
        worker.join(10)
        if worker.exitcode is None:
            worker.kill()
            worker.join()
        return worker.exitcode
    class ForksAWorker(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            if state.global_step == 2:
                print("worker during training", terminated_worker())
    if scene == "fork-preempt":  # forked during a PreemptionCallback training
        class ForksTwo(TrainerCallback):
            def on_step_end(self, args, state, control, **kw):
                if state.global_step == 2:
                    ended = terminated_worker(), terminated_worker(signal.SIGINT)
                    print("SIGTERM", ended[0], "SIGINT", ended[1])
        make_trainer([PreemptionCallback(), ForksTwo()]).train()
    else:
        trainer = make_trainer([ForksAWorker()], jit=True)
        with exit_on_sigterm():
            print("worker", terminated_worker())
            trainer.train()
elif scene == "fork-holds":  # a child forked in training runs a server of its own
    from verirl._stop import STOP_REQUESTS
    def in_child(body, signum):
        pid = os.fork()
        if pid == 0:
            signal.signal(signal.SIGINT, signal.default_int_handler)
            code = 0
            try:
                body()
            except SystemExit as exc:
                code = 100 + exc.code % 100
            except RuntimeError:
                code = 50
            os._exit(code)
        time.sleep(0.5)
        os.kill(pid, signum)
        return os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
    def holds():
        with exit_on_sigterm():
            time.sleep(10)
    def interrupted():
        with exit_on_sigterm():
            SIGTERM_POLICY.interrupt(RuntimeError("vLLM server died"))
            time.sleep(10)
    def listens():
        os._exit(7 if STOP_REQUESTS.listening else 0)
    class ForksAt2(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            if state.global_step == 2:
                print("held", in_child(holds, signal.SIGTERM), "interrupted",
                      in_child(interrupted, signal.SIGCONT), "listening",
                      in_child(listens, signal.SIGCONT))
    make_trainer([PreemptionCallback(), ForksAt2()]).train()
elif scene == "jit-hold-for-training":  # a callback holds the policy for the training only
    class ServerForTraining(TrainerCallback):
        def on_train_begin(self, args, state, control, **kw):
            self.hold = exit_on_sigterm()
            self.hold.__enter__()
        def on_train_end(self, args, state, control, **kw):
            self.hold.__exit__(None, None, None)
    make_trainer([ServerForTraining()], jit=True).train()
    print("default", signal.getsignal(signal.SIGTERM) == signal.SIG_DFL)
elif scene.startswith("jit-live-"):  # a JIT trainer that trains after the block keeps its JIT
    class Preempted(TrainerCallback):  # slow steps: JIT's 3 s timer comes before the end
        def on_step_end(self, args, state, control, **kw):
            if state.global_step == 1:
                os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(1)
    if scene == "jit-live-reclaimed":  # built inside; another training ends in the block
        with exit_on_sigterm():
            later = make_trainer([Preempted()], jit=True, max_steps=8)
            make_trainer([PreemptionCallback()]).train()
    elif scene == "jit-live-over-spent":  # set aside; a JIT trainer built inside left spent
        class CtrlC(TrainerCallback):
            def on_step_end(self, args, state, control, **kw):
                if state.global_step == 2:
                    os.kill(os.getpid(), signal.SIGINT)
        later = make_trainer([Preempted()], jit=True, max_steps=8)
        with exit_on_sigterm():
            try:
                make_trainer([CtrlC()], jit=True).train()
            except KeyboardInterrupt:
                print("KeyboardInterrupt")
    elif scene == "jit-live-released-off-main":  # the last holder released from a thread
        later = make_trainer([Preempted()], jit=True, max_steps=8)
        holder = object()
        SIGTERM_POLICY.acquire(holder)
        releasing = threading.Thread(target=SIGTERM_POLICY.release, args=(holder,))
        releasing.start()
        releasing.join()
    else:  # built before a newer one, which alone trains in the block
        later = make_trainer([Preempted()], jit=True, max_steps=8)
        newer = make_trainer([], jit=True)
        with exit_on_sigterm():
            newer.train()
    later.train()
    saved = any(name.startswith("checkpoint-") for name in os.listdir(later.args.output_dir))
    print("JIT checkpoint", saved)
else:  # JIT trainers whose callback puts back a handler that no longer exits (review of fbda37d)
    preempt = [PreemptionCallback()] if scene.endswith("-pc") else []
    if scene == "jit-two-holds":  # a notebook: the server started and stopped twice
        trainers = [make_trainer(preempt, jit=True)]
        with exit_on_sigterm():
            trainers[0].train()
    elif scene == "jit-trained-before-pc":  # its handler gone before any holder saw it
        trainers = [make_trainer(preempt, jit=True)]
        trainers[0].train()
    elif scene.startswith("jit-order"):  # two trainers, the older trains first
        trainers = [make_trainer([], jit=True)]
        if not scene.startswith("jit-order-inside"):
            trainers.append(make_trainer(preempt, jit=True))
    elif scene.startswith("jit-after-kept"):  # built over a caught stop's kept handler
        train_caught(signal.SIGTERM)
        trainers = [make_trainer(preempt, jit=True)]
    with exit_on_sigterm():
        if scene.startswith("jit-order-inside"):  # the newer one built inside, over the older's
            trainers.append(make_trainer(preempt, jit=True))
        for trainer in trainers:
            trainer.train()
        print("returned")
        sigterm_now()
    print("default", signal.getsignal(signal.SIGTERM) == signal.SIG_DFL)
"""
)


@pytest.mark.parametrize(
    ("scene", "said"),
    [
        # held: SIGTERM's handler is the policy's after the stop ("kept")
        (
            "held-ctrl-c",
            [
                "KeyboardInterrupt kept",
                "SIGTERM exit 143",
                "KeyboardInterrupt kept",
                "interrupt the vLLM server died",
            ],
        ),
        ("held-ctrl-c-twice", ["KeyboardInterrupt", "SIGTERM exit 143", "default True"]),
        ("held-ctrl-c-twice-jit", ["KeyboardInterrupt", "SIGTERM exit 143", "default True"]),
        ("interrupted-jit", ["interrupt the vLLM server died", "default True"]),
        ("held-sigterm", ["SystemExit kept", "interrupt the vLLM server died"]),
        ("held-exit-code", ["SystemExit kept", "interrupt the vLLM server died"]),
        ("thread", ["SystemExit kept", "stopped at a step"]),
        ("twice-jit", ["SystemExit kept", "SystemExit kept"]),
        ("jit-built-before", ["returned", "SIGTERM exit 143", "default True"]),
        ("jit-built-before-preempt", ["returned", "SIGTERM exit 143", "default True"]),
        ("jit-built-before-released", ["returned", "default True"]),
        ("jit-built-before-two", ["returned", "SIGTERM exit 143", "default True"]),
        ("jit-live-reclaimed", ["JIT checkpoint True"]),
        ("jit-hold-in-training", ["JIT checkpoint True"]),
        ("jit-hold-for-training", ["default True"]),
        ("jit-fork", ["worker -15", "worker during training -15"]),
        ("fork-preempt", ["SIGTERM -15 SIGINT 1"]),  # SIGINT: the KeyboardInterrupt it had
        ("fork-holds", ["held 143 interrupted 50 listening 0"]),
        ("jit-live-over-spent", ["KeyboardInterrupt", "JIT checkpoint True"]),
        ("jit-live-released-off-main", ["JIT checkpoint True"]),
        ("jit-ctrl-c-held", ["KeyboardInterrupt", "SIGTERM exit 143", "default True"]),
        ("jit-live-lent", ["JIT checkpoint True"]),
        *(
            (
                scene,
                [
                    *(kept or []),
                    "returned",
                    "SIGTERM exit 143" if kept is not None else "SIGTERM ignored",
                    "default True",
                ],
            )
            for scene, kept in [
                ("jit-two-holds", []),
                ("jit-trained-before-pc", []),
                ("jit-order", []),
                ("jit-order-pc", []),
                ("jit-order-inside-pc", []),
                ("jit-after-kept", ["SystemExit kept"]),
                ("jit-after-kept-pc", ["SystemExit kept"]),
            ]
        ),
    ],
    ids=lambda value: value if isinstance(value, str) else "",
)
def test_a_stop_s_exit_caught_leaves_sigterm_and_the_watchdog_working(scene, said):
    """The program catches a PreemptionCallback's exit and goes on (review of 5c784e0): with a
    policy held from before, after a Ctrl-C stop a later SIGTERM exits 143, and the next
    training after any stop takes the watchdog's interrupt (the policy stayed fired for as long
    as it was held, and ignored both); a next training in a thread stops on SIGTERM (the kept
    handler swallowed it); a second trainer's exit keeps its handler while it unwinds (with a
    JIT checkpoint it did not); a trainer with a JIT checkpoint built before the policy is held
    leaves SIGTERM exiting in the held block after it trained, and the default after (review of
    09d6f75: its callback put the default back inside the block); so do a trainer trained in an
    earlier held block, two trained oldest first, one built over a caught stop's kept handler, and
    with PreemptionCallback one never seen or built inside the block (review of fbda37d); a JIT
    trainer yet to train keeps its own handler for its training after the block (review of
    51889db: it was taken for a trained one's); one whose train() ended by an exception (out
    now, the watchdog's interrupt) counts as trained (review of 3c5ba66: as still training); a
    hold begun and ended during a JIT trainer's training leaves it its handler, and a JIT trainer
    whose train() a caught Ctrl-C ended leaves SIGTERM exiting in the block (review of 9dde7cb);
    a hold ended in the trainer's own on_train_end, a spent JIT handler over a set-aside live one,
    and a release from a thread leave each the right handler (review of 2724e76); a worker forked
    in the block ends on SIGTERM (review of 3d478f6: it took the parent's set-aside handler), and
    one forked during a PreemptionCallback training ends on SIGTERM and SIGINT (it waited for a
    step end that never came there); such a child holding a policy of its own exits 143 on
    SIGTERM, raises its own interrupt and inherits no stop listener (review of 1c1ce83)."""
    done = subprocess.run(
        [sys.executable, "-c", SCENES, scene], capture_output=True, text=True, timeout=240,
        env=clean_env(), check=False,
    )  # fmt: skip
    lines = [line for line in done.stdout.splitlines() if not line.startswith("{")]  # metrics
    assert (done.returncode, lines) == (0, said), done.stdout + done.stderr[-3000:]

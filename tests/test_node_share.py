"""One checkpoint choice per node: local rank 0 resolves and downloads, the other ranks wait.

The process tests start real rank processes (children of this test process,
as torchrun's agent starts a node's ranks) against a loopback fake Hub.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from fakes import FakeHub
from verirl import (
    CheckpointNotFoundError,
    CheckpointSourceError,
    DistributedEnv,
    HttpEnvServerProbe,
    TrainingRuntime,
    VLLMTopology,
    find_free_port,
)
from verirl.checkpoints.attempt import attempt_key
from verirl.checkpoints.node_share import NodeSharedResolver

REPO = "org/run"

RANK = textwrap.dedent(
    """
    import json, logging, os, sys, time
    from verirl import DistributedEnv, TrainingRuntime, VLLMTopology, resolver_from_settings
    from verirl.errors import VeriRLError

    logging.basicConfig(filename=sys.argv[5], level=logging.INFO)
    env = dict(os.environ)
    runtime = TrainingRuntime(
        VLLMTopology.plan(1, max_model_len=64),
        checkpoints=resolver_from_settings(
            output_dir=sys.argv[1], hub_repo_id=sys.argv[2], hub_endpoint=sys.argv[3], environ={}
        ),
        resume_from="latest",
        environ=env,
        dist_env=DistributedEnv.single_node(environ=env),
        checkpoint_wait_timeout=float(sys.argv[4]),
    )
    try:
        with runtime as session:
            print(json.dumps({"path": session.resume_from_checkpoint}), flush=True)
    except VeriRLError as exc:
        print(json.dumps({"error": type(exc).__name__, "message": str(exc)}), flush=True)
    # As a leader trains on: a rank that names the attempt after its first rank has
    # ended names another (see `_launch_attempt`). The test releases every rank at once.
    deadline = time.monotonic() + 120
    while not os.path.exists(sys.argv[6]) and time.monotonic() < deadline:
        time.sleep(0.02)
    """
)


def start_ranks(
    tmp_path: Path,
    hub: FakeHub,
    ranks: range,
    *,
    local_world: int = 4,
    timeout: float = 60,
    master: bool = True,
) -> list[subprocess.Popen[str]]:
    """The ranks, as a launcher starts them (``master``: with its MASTER_ADDR and MASTER_PORT)."""
    script = tmp_path / "rank.py"
    script.write_text(RANK)
    port = str(find_free_port())
    procs = []
    for local_rank in ranks:
        env = {
            **os.environ,
            "RANK": str(local_rank),
            "LOCAL_RANK": str(local_rank),
            "WORLD_SIZE": str(local_world),
            "LOCAL_WORLD_SIZE": str(local_world),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": port,
        }
        if not master:  # file:// or tcp:// rendezvous: verirl fills a free port in, per rank
            del env["MASTER_ADDR"], env["MASTER_PORT"]
        env.pop("TORCHELASTIC_RUN_ID", None)
        procs.append(
            subprocess.Popen(
                [
                    sys.executable,
                    str(script),
                    str(tmp_path / "out"),
                    REPO,
                    hub.endpoint,
                    str(timeout),
                    str(rank_log(tmp_path, local_rank)),
                    str(tmp_path / "release"),
                ],
                env=env,
                stdout=subprocess.PIPE,
                text=True,
            )
        )
    return procs


def rank_log(tmp_path: Path, local_rank: int) -> Path:
    """Where the rank process logs (verirl's INFO lines)."""
    return tmp_path / f"rank-{local_rank}.log"


def wait_until_following(tmp_path: Path, local_ranks: range, timeout: float = 120) -> None:
    """Until each of ``local_ranks`` waits for local rank 0 (so it knows the attempt's key)."""
    deadline = time.monotonic() + timeout
    for local_rank in local_ranks:
        log = rank_log(tmp_path, local_rank)
        while "waiting for local rank 0" not in (log.read_text() if log.exists() else ""):
            assert time.monotonic() < deadline, f"local rank {local_rank} never followed"
            time.sleep(0.05)


def results(
    tmp_path: Path, procs: list[subprocess.Popen[str]], first: int = 0
) -> list[dict[str, str]]:
    """Each rank's answer, once every follower waits for local rank 0 and all are released.

    ``procs`` are local ranks ``first``, ``first + 1``, …
    """
    wait_until_following(tmp_path, range(max(first, 1), first + len(procs)))
    (tmp_path / "release").touch()
    out = []
    for proc in procs:
        stdout, _ = proc.communicate(timeout=120)
        out.append(json.loads(stdout.strip().splitlines()[-1]))
    return out


def listings(hub: FakeHub) -> int:
    return sum("/tree/" in path for _, path in hub.requests)


def test_four_local_ranks_list_and_download_once_and_agree(tmp_path):
    with FakeHub() as hub:
        hub.add_checkpoint(REPO, "checkpoint-10", 10)
        hub.add_checkpoint(REPO, "checkpoint-20", 20, size=4096)
        answers = results(tmp_path, start_ranks(tmp_path, hub, range(4)))
        paths = {answer.get("path") for answer in answers}
        assert len(paths) == 1, answers
        (path,) = paths
        assert path is not None
        assert Path(path).name == "checkpoint-20"
        assert hub.bytes_served == hub.folder_size(REPO, "checkpoint-20")
        assert listings(hub) == 1  # only local rank 0 looked at the Hub
        assert len(hub.downloads) == len({name for _, name in hub.downloads})


def test_ranks_without_a_launchers_master_port_still_share_one_choice(tmp_path):
    """The port verirl fills in differs between the ranks: it is not part of the attempt's key."""
    with FakeHub() as hub:
        hub.add_checkpoint(REPO, "checkpoint-20", 20)
        out = results(
            tmp_path, start_ranks(tmp_path, hub, range(2), local_world=2, timeout=30, master=False)
        )
    paths = {result.get("path") for result in out}
    assert len(paths) == 1, out
    assert str(paths.pop()).endswith("checkpoint-20"), out


def test_local_rank_0_failing_fails_every_rank_with_its_reason(tmp_path):
    with FakeHub() as hub:
        hub.add_checkpoint(REPO, "checkpoint-10", 10, complete=False)
        answers = results(tmp_path, start_ranks(tmp_path, hub, range(3), local_world=3))
    assert {answer["error"] for answer in answers} == {"CheckpointNotFoundError"}
    assert len({answer["message"] for answer in answers}) == 1
    assert "no complete checkpoint for 'latest'" in answers[0]["message"]


def test_local_rank_0_killed_mid_download_fails_the_others_at_once(tmp_path):
    with FakeHub() as hub:
        hub.add_checkpoint(REPO, "checkpoint-10", 10, size=4096)
        hold = hub.hold(REPO, "checkpoint-10/model.safetensors")
        try:
            procs = start_ranks(tmp_path, hub, range(3), local_world=3, timeout=600)
            leader = procs[0]
            assert hub.wait_for_requests("checkpoint-10/model.safetensors", 1, timeout=60)
            # A rank that has not yet named the attempt when its first rank dies names
            # another, and waits for it to its deadline (see `_launch_attempt`).
            wait_until_following(tmp_path, range(1, 3))
            leader.send_signal(signal.SIGKILL)
            leader.communicate(timeout=30)
            answers = results(tmp_path, procs[1:], first=1)
        finally:
            hold.release()
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
                proc.communicate()
    for answer in answers:
        assert answer["error"] == "CheckpointSourceError"
        assert "local rank 0 stopped before it chose a checkpoint" in answer["message"]


# -- in one process: the record, the deadline, the key


class Slow:
    """A resolver that answers once released."""

    def __init__(self, answer: str | None) -> None:
        self.answer = answer
        self.release = threading.Event()
        self.calls = 0

    def resolve(self, _request: str | None) -> str | None:
        self.calls += 1
        assert self.release.wait(timeout=30)
        return self.answer


def test_followers_wait_for_the_leader_and_get_its_answer(tmp_path):
    (tmp_path / "checkpoint-3").mkdir()
    slow = Slow(str(tmp_path / "checkpoint-3"))
    key = "k-0"
    leader = NodeSharedResolver(slow, tmp_path, key, leader=True, timeout=30)
    follower = NodeSharedResolver(slow, tmp_path, key, leader=False, timeout=30)
    got: list[str | None] = []
    thread = threading.Thread(target=lambda: got.append(follower.resolve("latest")))
    thread.start()
    lead = threading.Thread(target=leader.resolve, args=("latest",))
    lead.start()
    thread.join(timeout=0.3)
    assert thread.is_alive()  # still waiting: the leader has not answered
    slow.release.set()
    lead.join(timeout=30)
    thread.join(timeout=30)
    assert got == [str(tmp_path / "checkpoint-3")]
    assert slow.calls == 1


def test_a_fresh_start_is_shared_too(tmp_path):
    slow = Slow(None)
    slow.release.set()
    assert NodeSharedResolver(slow, tmp_path, "k", leader=True).resolve(None) is None
    assert NodeSharedResolver(slow, tmp_path, "k", leader=False, timeout=5).resolve(None) is None
    assert slow.calls == 1


def test_a_follower_without_a_leader_gives_up_at_its_deadline(tmp_path):
    follower = NodeSharedResolver(Slow(None), tmp_path, "nobody", leader=False, timeout=0.3)
    with pytest.raises(CheckpointSourceError, match=r"did not choose a checkpoint within 0.3s"):
        follower.resolve("latest")


def test_a_garbled_record_is_an_error_naming_it(tmp_path):
    (tmp_path / ".verirl-node-k.json").write_text("[1, 2]")
    with pytest.raises(CheckpointSourceError, match="is not a JSON object"):
        NodeSharedResolver(Slow(None), tmp_path, "k", leader=False, timeout=5).resolve("latest")


@pytest.mark.parametrize(
    "path",
    ["\ud800", "/tmp/a\u0000b", "", "/nonexistent/checkpoint-9", 5, ["a"], {"p": 1}, True],
    ids=["lone-surrogate", "nul", "empty", "missing", "number", "list", "object", "bool"],
)
def test_a_record_naming_no_folder_this_rank_finds_is_an_error_naming_it(tmp_path, path):
    """The record is a file in a shared folder: a path no file name can hold (it crashed launch
    with a traceback), "" (read as a fresh start) or a folder that is not there is refused."""
    (tmp_path / ".verirl-node-k.json").write_text(json.dumps({"path": path}))
    with pytest.raises(CheckpointSourceError, match=r"\.verirl-node-k\.json") as info:
        NodeSharedResolver(Slow(None), tmp_path, "k", leader=False, timeout=5).resolve("latest")
    assert "local rank 0" in str(info.value)


def test_not_found_keeps_its_type_and_places(tmp_path):
    class Missing:
        def resolve(self, _request: str | None) -> str | None:
            raise CheckpointNotFoundError("latest", ["/a", "org/run"])

    with pytest.raises(CheckpointNotFoundError):
        NodeSharedResolver(Missing(), tmp_path, "k", leader=True).resolve("latest")
    with pytest.raises(CheckpointNotFoundError) as err:
        NodeSharedResolver(Missing(), tmp_path, "k", leader=False, timeout=5).resolve("latest")
    assert err.value.searched == ("/a", "org/run")


def test_each_resolution_in_a_process_gets_a_new_key(tmp_path):
    env = {"MASTER_ADDR": "n0", "MASTER_PORT": "29500"}
    first, second = attempt_key(env, folder=tmp_path), attempt_key(env, folder=tmp_path)
    assert first != second
    assert first.rsplit("-", 1)[0] == second.rsplit("-", 1)[0]
    other = attempt_key({**env, "TORCHELASTIC_RESTART_COUNT": "1"}, folder=tmp_path / "x")
    assert other.rsplit("-", 1)[0] != first.rsplit("-", 1)[0]


def test_the_key_differs_between_launchers(tmp_path):
    code = (
        "import sys; from pathlib import Path;"
        "from verirl.checkpoints.attempt import attempt_key;"
        "print(attempt_key({}, folder=Path(sys.argv[1])))"
    )

    def key_from_a_new_parent() -> str:
        # sh is the parent (the "launcher") of the Python that computes the key
        shell = subprocess.run(
            ["/bin/sh", "-c", 'exec "$0" -c "$1" "$2" & wait', sys.executable, code,
             str(tmp_path)],
            capture_output=True, text=True, check=True, timeout=60,
        )  # fmt: skip
        return shell.stdout.strip()

    assert key_from_a_new_parent() != key_from_a_new_parent()


SPAWN_RANK = """
import json, os, sys
from pathlib import Path
from verirl.checkpoints.attempt import attempt_key
from verirl.checkpoints.node_share import NodeSharedResolver

class Answer:
    def resolve(self, request):
        return os.environ["ANSWER"]

folder = Path(sys.argv[1])
key = attempt_key(os.environ, folder=folder, request="latest")
leader = os.environ["LOCAL_RANK"] == "0"
if not leader:
    Path(os.environ["WAITING"]).write_text(key)
shared = NodeSharedResolver(Answer(), folder, key, leader=leader, timeout=60)
print(json.dumps({"key": key, "path": shared.resolve("latest")}), flush=True)
if leader:  # a leader trains on: it runs until its parent says the attempt is over
    sys.stdin.read()
"""

SPAWN_LOOP = """
import json, os, subprocess, sys, time
from pathlib import Path
script, folder, waiting = sys.argv[1:4]
env = {**os.environ, "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29511"}
env.pop("TORCHELASTIC_ERROR_FILE", None)
if sys.argv[4:]:  # one left for good in the job's environment, or by an outer torchrun
    env["TORCHELASTIC_ERROR_FILE"] = sys.argv[4]

def rank(local_rank, answer):
    return subprocess.Popen(
        [sys.executable, script, folder], stdout=subprocess.PIPE, stdin=subprocess.PIPE, text=True,
        env={**env, "LOCAL_RANK": local_rank, "ANSWER": answer, "WAITING": waiting},
    )

def attempt(answer, follower_first):
    first = rank("1" if follower_first else "0", answer)
    if follower_first:  # the leader comes late: the follower polls with nothing new to read
        deadline = time.monotonic() + 60
        while not os.path.exists(waiting) and time.monotonic() < deadline:
            time.sleep(0.01)
    second = rank("0" if follower_first else "1", answer)
    leader, follower = (second, first) if follower_first else (first, second)
    out = [json.loads(p.communicate(timeout=60)[0]) for p in (follower, leader)]
    os.remove(waiting)
    return out[::-1]  # the leader's first

# the same parent starts the node's ranks twice: a retry loop around mp.spawn
print(json.dumps([attempt("checkpoint-10", False), attempt("checkpoint-30", True)]))
"""


@pytest.mark.parametrize("stale", [[], ["/x/err/attempt_0/0/error.json"]], ids=["", "stale"])
def test_a_retry_by_the_same_parent_never_reads_the_previous_attempts_answer(tmp_path, stale):
    """Attempt 1 chose checkpoint-10 and saved up to 30; attempt 2's ranks must all resume at 30.

    ``stale``: with a torchrun error file every rank of both attempts inherited as it is."""
    script = tmp_path / "rank.py"
    script.write_text(SPAWN_RANK)
    for chosen in ("checkpoint-10", "checkpoint-30"):  # a follower checks the folder is there
        (tmp_path / chosen).mkdir()
    loop = subprocess.run(
        [sys.executable, "-c", SPAWN_LOOP, str(script), str(tmp_path / "dl"),
         str(tmp_path / "waiting"), *stale],
        capture_output=True, text=True, timeout=180, check=False, cwd=tmp_path,
    )  # fmt: skip
    assert loop.returncode == 0, loop.stderr
    first, second = json.loads(loop.stdout)
    assert [rank["path"] for rank in first] == ["checkpoint-10", "checkpoint-10"], loop.stderr
    assert [rank["path"] for rank in second] == ["checkpoint-30", "checkpoint-30"], loop.stderr
    assert first[0]["key"] == first[1]["key"]
    assert second[0]["key"] == second[1]["key"] != first[0]["key"]


STEP_RANK = """
import os, sys, time
from pathlib import Path
from verirl.checkpoints.attempt import attempt_key

here, local_rank, ranks = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
(here / f"started-{local_rank}").touch()
deadline = time.monotonic() + 60  # every rank of the attempt runs, as after its imports
while len(list(here.glob("started-*"))) < ranks and time.monotonic() < deadline:
    time.sleep(0.01)
(here / f"key-{local_rank}").write_text(attempt_key(os.environ, folder=here))
while len(list(here.glob("key-*"))) < ranks and time.monotonic() < deadline:
    time.sleep(0.01)
"""


def _step_attempt(
    tmp_path: Path,
    name: str,
    env: dict[str, str],
    *,
    wrapped: bool,
    own: Callable[[str], dict[str, str]] = lambda _rank: {},
) -> set[str]:
    """Two local ranks, each behind its own shell when ``wrapped`` (srun's tasks through a
    wrapper script), each with ``own(local_rank)`` added; the set of keys they computed."""
    here = tmp_path / name
    here.mkdir()
    script = tmp_path / "step_rank.py"
    script.write_text(STEP_RANK)
    procs = []
    for local_rank in ("0", "1"):
        argv = [sys.executable, str(script), str(here), local_rank, "2"]
        if wrapped:
            argv = ["/bin/sh", "-c", '"$@"; exit $?', "sh", *argv]
        procs.append(subprocess.Popen(argv, env={**os.environ, **env, **own(local_rank)}))
    for proc in procs:
        assert proc.wait(timeout=120) == 0
    return {path.read_text() for path in here.glob("key-*")}


def test_the_ranks_of_an_srun_step_share_a_key_through_wrappers_and_a_retry_gets_another(
    tmp_path,
):
    step = {"SLURM_JOB_ID": "77", "SLURM_STEP_ID": "0", "LOCAL_WORLD_SIZE": "2"}
    first = _step_attempt(tmp_path, "first", step, wrapped=True)
    retry = _step_attempt(tmp_path, "retry", step, wrapped=True)  # a retry loop in the step
    assert len(first) == 1, first  # one key for the node's ranks
    assert len(retry) == 1, retry
    assert first != retry


def test_the_ranks_a_parent_starts_share_a_key_whatever_their_numbered_arguments(tmp_path):
    """``mp.spawn`` and DeepSpeed give each rank its own numbers on its command line."""
    here = tmp_path / "spawn"
    here.mkdir()
    script = tmp_path / "step_rank.py"
    script.write_text(STEP_RANK)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "PMIX_"))}
    env.pop("TORCHELASTIC_ERROR_FILE", None)
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                str(script),
                str(here),
                local_rank,
                "2",
                f"--local_rank={local_rank}",
                f"pipe_handle={7 + 4 * int(local_rank)}",
            ],
            env=env,
        )
        for local_rank in ("0", "1")
    ]
    for proc in procs:
        assert proc.wait(timeout=120) == 0
    keys = {path.read_text() for path in here.glob("key-*")}
    assert len(keys) == 1, keys


ZL_STEP_RANK = """
import ctypes, os, sys, threading, time
from pathlib import Path
from verirl.checkpoints.attempt import attempt_key

# STEP_RANK's work in a thread; in the ranks ZL_RANKS names, the main thread ends first (the
# rank shows as Zl)
here, local_rank, ranks = Path(sys.argv[1]), sys.argv[2], int(sys.argv[3])
zl = local_rank in os.environ["ZL_RANKS"].split(",")
me = os.getpid()

def work():
    deadline = time.monotonic() + 60
    while zl and time.monotonic() < deadline:  # until the main thread has ended
        stat = Path(f"/proc/{me}/task/{me}/stat").read_bytes()
        if stat.rsplit(b")", 1)[1].split()[0] == b"Z":
            break
        time.sleep(0.005)
    (here / f"started-{local_rank}").touch()
    while len(list(here.glob("started-*"))) < ranks and time.monotonic() < deadline:
        time.sleep(0.01)
    (here / f"key-{local_rank}").write_text(attempt_key(os.environ, folder=here))
    while len(list(here.glob("key-*"))) < ranks and time.monotonic() < deadline:
        time.sleep(0.01)

thread = threading.Thread(target=work)
thread.start()
if zl:
    ctypes.CDLL(None).pthread_exit(None)
thread.join()
"""


@pytest.mark.skipif(sys.platform != "linux", reason="a Zl process is Linux's")
@pytest.mark.parametrize("zl_ranks", [("0",), ("0", "1")], ids=["rank-0", "both"])
@pytest.mark.parametrize("scope", ["srun", "parent"])
def test_a_rank_whose_main_thread_ended_still_counts_for_the_key(tmp_path, scope, zl_ranks):
    """A rank whose main thread ended while its others train (Zl: /proc reads it as a zombie
    with an empty command line and environment) is alive: the ranks still share a key."""
    script = tmp_path / "zl_rank.py"
    script.write_text(ZL_STEP_RANK)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("SLURM_", "PMIX_"))}
    env.pop("TORCHELASTIC_ERROR_FILE", None)
    if scope == "srun":
        env.update({"SLURM_JOB_ID": "78", "SLURM_STEP_ID": "0", "LOCAL_WORLD_SIZE": "2"})
    env["ZL_RANKS"] = ",".join(zl_ranks)
    keys = []
    for attempt in ("first", "retry"):  # a retry gets another key: the first rank is another
        here = tmp_path / attempt
        here.mkdir()
        procs = []
        for local_rank in ("0", "1"):
            argv = [sys.executable, str(script), str(here), local_rank, "2"]
            procs.append(subprocess.Popen(argv, env=env))
        for proc in procs:
            assert proc.wait(timeout=120) == 0
        keys.append({path.read_text() for path in here.glob("key-*")})
    first, retry = keys
    assert len(first) == 1, first  # one key for the node's ranks
    assert len(retry) == 1, retry
    assert first != retry


# -- the runtime: which local ranks do node-wide work


def runtime_for(local_rank: int, tmp_path: Path, **kwargs: object) -> TrainingRuntime:
    env = {"RANK": str(local_rank), "LOCAL_RANK": str(local_rank), "WORLD_SIZE": "2",
           "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29999"}  # fmt: skip
    return TrainingRuntime(
        VLLMTopology.plan(1, max_model_len=64),
        environ=env,
        dist_env=DistributedEnv.single_node(environ=env),
        **kwargs,  # type: ignore[arg-type]
    )


def test_only_local_rank_0_waits_for_the_env_server(tmp_path):
    port = find_free_port()  # nothing listens: a rank that waited would time out
    probe = HttpEnvServerProbe(f"http://127.0.0.1:{port}")
    with runtime_for(1, tmp_path, env_probe=probe, env_timeout=0.5) as session:
        assert "env" not in {timing.name for timing in session.timings}
    with pytest.raises(Exception, match="not healthy"):
        runtime_for(0, tmp_path, env_probe=probe, env_timeout=0.5).start()


def test_bad_wait_and_launcher_settings_are_config_errors(tmp_path):
    with pytest.raises(ValueError, match="checkpoint_wait_timeout"):
        runtime_for(0, tmp_path, checkpoint_wait_timeout=0)
    with pytest.raises(ValueError, match="die_with_launcher"):
        runtime_for(0, tmp_path, die_with_launcher="yes")


def test_under_torchrun_the_key_follows_the_agents_attempt_folder_not_the_parent(tmp_path):
    """A wrapper per rank (a shell, ``verirl launch``) must not split a node's ranks; each
    rank has its own error file in the attempt's folder, which the next attempt changes."""
    run = "/tmp/torchelastic_ab12/none_x9"

    def files(attempt: str) -> Callable[[str], dict[str, str]]:
        return lambda rank: {"TORCHELASTIC_ERROR_FILE": f"{attempt}/{rank}/error.json"}

    env = {"LOCAL_WORLD_SIZE": "2"}
    first = _step_attempt(tmp_path, "a0", env, wrapped=True, own=files(f"{run}/attempt_0"))
    second = _step_attempt(tmp_path, "a1", env, wrapped=True, own=files(f"{run}/attempt_1"))
    other = _step_attempt(tmp_path, "b0", env, wrapped=True,
                          own=files("/tmp/torchelastic_cd34/none_y7/attempt_0"))  # fmt: skip
    assert len(first) == len(second) == len(other) == 1, (first, second, other)
    assert len(first | second | other) == 3


def test_a_stale_torchrun_error_file_never_gives_a_retry_the_previous_attempts_key(tmp_path):
    """Set for good in a job's environment, or inherited by a retry loop under one of
    torchrun's ranks: the same error file for every rank of both attempts."""
    env = {"LOCAL_WORLD_SIZE": "2", "TORCHELASTIC_ERROR_FILE": "/x/err/attempt_0/0/error.json"}
    first = _step_attempt(tmp_path, "first", env, wrapped=False)
    retry = _step_attempt(tmp_path, "retry", env, wrapped=False)
    assert len(first) == 1, first
    assert len(retry) == 1, retry
    assert first != retry


def test_the_request_is_part_of_the_key(tmp_path):
    env = {"TORCHELASTIC_ERROR_FILE": "/t/run/attempt_0/0/error.json"}
    latest = attempt_key(env, folder=tmp_path, request="latest")
    path = attempt_key(env, folder=tmp_path / "p", request="/x/checkpoint-3")
    assert latest.rsplit("-", 1)[0] != path.rsplit("-", 1)[0]


def test_a_fresh_start_on_a_node_writes_nothing_into_the_download_folder(tmp_path):
    from verirl import resolver_from_settings

    resolver = resolver_from_settings(
        output_dir=str(tmp_path / "out"), hub_repo_id="org/run", environ={}
    )
    for local_rank in (0, 1):
        with runtime_for(local_rank, tmp_path, checkpoints=resolver) as session:
            assert session.resume_from_checkpoint is None
    assert not (tmp_path / "out").exists()


def test_a_node_s_folder_errors_name_the_hub_download_folder_as_its_source_does(tmp_path):
    """The node's record folder is the Hub source's download folder: made from output_dir by
    from_settings, its errors said ``download_dir`` (the sweep of review round 28, B-F3)."""
    from verirl import TrainingRuntime
    from verirl.errors import CheckpointSourceError

    out = tmp_path / "out"
    runtime = TrainingRuntime.from_settings(
        gpu_count=1, model="m", output_dir=str(out), hub_repo_id="org/run",
        hub_token="hf_" + "x" * 20, resume_from="latest", environ={},
    )  # fmt: skip
    launcher = {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "2",
                "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"}  # fmt: skip
    dist = DistributedEnv.single_node(environ=launcher)
    assert runtime.checkpoints is not None
    shared = runtime._node_shared(runtime.checkpoints, dist)
    assert isinstance(shared, NodeSharedResolver)
    out.write_text("not a folder")  # the folder can no longer be made
    with pytest.raises(CheckpointSourceError) as info:
        shared.resolve("latest")
    message = str(info.value)
    assert "download_dir" not in message, message
    assert "cannot create the Hub download folder" in message, message
    assert message.endswith(f"the folder is verirl's, under output_dir={str(out)!r}"), message


def test_a_follower_s_timeout_names_the_setting_the_folder_came_from(tmp_path):
    """Its hint asked "is it running, with the same download_dir?" where the user gave only
    output_dir (review round 29, F4)."""
    from verirl.checkpoints.download_dir import FolderName
    from verirl.errors import CheckpointSourceError

    name = FolderName("the Hub download folder", "the folder is verirl's, under output_dir='o'",
                      "output_dir")  # fmt: skip
    follower = NodeSharedResolver(object(), tmp_path, "k", leader=False, timeout=0.2, name=name)  # type: ignore[arg-type]
    with pytest.raises(CheckpointSourceError) as info:
        follower.resolve("latest")
    message = str(info.value)
    assert "download_dir" not in message, message
    assert "with the same output_dir?" in message, message


def test_a_path_holding_the_word_download_dir_is_kept_as_it_is(tmp_path):
    """The hint's word was replaced everywhere in the message, paths included: an output
    folder named my_download_dir_runs was shown as my_output_dir_runs, a folder that does not
    exist (review round 30, G-F3). Only the hint changes."""
    from verirl._fs import printable
    from verirl.checkpoints.download_dir import FolderName
    from verirl.errors import CheckpointSourceError

    out = tmp_path / "my_download_dir_runs"
    folder = out / "_verirl-hub-download"
    folder.mkdir(parents=True)
    note = f"the folder is verirl's, under output_dir='{out}'"
    name = FolderName("the Hub download folder", note, "output_dir")
    follower = NodeSharedResolver(object(), folder, "k", leader=False, timeout=0.2, name=name)  # type: ignore[arg-type]
    with pytest.raises(CheckpointSourceError) as info:
        follower.resolve("latest")
    message = str(info.value)
    assert f"(nothing in {printable(folder)})" in message, message
    assert "with the same output_dir?" in message, message
    assert "output_dir_runs" not in message, message


# A Ctrl-C as os.scandir returns drops its iterator before ``with`` holds it: CPython closes it
# then (its last reference), with a ResourceWarning; nothing stays open.
@pytest.mark.filterwarnings("ignore::ResourceWarning")
def test_a_leader_interrupted_once_it_holds_the_lock_never_leaves_followers_waiting(tmp_path):
    """A Ctrl-C while the leader wrote its claim left no claim and no record: the followers
    waited out their whole deadline (an hour by default), and a partial ``.tmp`` file stayed
    (review round 30, H-F9). Nor may an error record replace an answer already written, as
    the lock is let go (round 32, K-F3). At every point of taking the lock, writing and
    letting go: once the claim is there, a record the followers read at once, the answer if
    it was written; and no partial file. (Before the claim, as for a leader that died then,
    they wait: nothing tells them it ever began.)"""
    from _support import codes_of, interrupted_at_point
    from verirl import _fs

    (tmp_path / "checkpoint-3").mkdir()
    codes = codes_of(NodeSharedResolver._lead, NodeSharedResolver._write,
                     _fs.flock_with_deadline, _fs._acquire, _fs._lock_if_free)  # fmt: skip
    chosen = str(tmp_path / "checkpoint-3")

    def lead(key: str, point: int | None) -> tuple[int, list[bool]]:
        slow = Slow(chosen)
        slow.release.set()
        leader = NodeSharedResolver(slow, tmp_path, key, leader=True, timeout=5)
        seen: list[bool] = []  # at the Ctrl-C: the claim there, the answer written

        def look() -> None:
            seen[:] = [leader._path(".claim").exists(), leader._read() == {"path": chosen}]

        return interrupted_at_point(codes, point, lambda: leader.resolve("latest"), look), seen

    points, _ = lead("k-count", None)
    assert points > 8
    for point in range(1, points + 1):
        key = f"k-{point}"
        _, (claimed, answered) = lead(key, point)
        assert not list(tmp_path.glob("*.tmp")), point
        if not claimed:
            continue
        follower = NodeSharedResolver(Slow(None), tmp_path, key, leader=False, timeout=3)
        try:
            got: object = follower.resolve("latest")
        except CheckpointSourceError as exc:  # the leader's "interrupted", read at once
            got = exc
        if answered:
            assert got == chosen, (point, str(got))
        waited_out = "did not choose a checkpoint within" in str(got)
        assert got == chosen or (isinstance(got, CheckpointSourceError) and not waited_out), (
            point,
            str(got),
        )


def test_a_leader_interrupted_while_another_holds_the_lock_writes_nothing(tmp_path):
    """A leader interrupted while it waited for a lock another process held wrote its
    "interrupted" under that one's key: the healthy leader's followers failed at once (review
    round 32, K-F2). It writes nothing: the key is the lock holder's."""
    import _thread

    from verirl._fs import flock_with_deadline

    waiter = NodeSharedResolver(Slow(None), tmp_path, "k", leader=True, timeout=30)
    with flock_with_deadline(waiter._path(".lock"), 5):  # the other leader, choosing
        timer = threading.Timer(0.5, _thread.interrupt_main)
        timer.start()
        try:
            with pytest.raises(KeyboardInterrupt):
                waiter.resolve("latest")
        finally:
            timer.cancel()
    assert not waiter._path(".json").exists()
    assert not waiter._path(".claim").exists()


@pytest.mark.parametrize("how", ["symlink", "directory"])
def test_a_lock_no_process_can_take_fails_the_followers_with_its_reason_at_once(tmp_path, how):
    """A leader that could not lock (its lock file a link or a folder) failed at once, but wrote
    no record since 6c65117: every other rank waited its whole deadline, then blamed the
    leader (review round 33, L-F3). Its reason is recorded: no process can hold that lock."""
    leader = NodeSharedResolver(Slow(None), tmp_path, "k", leader=True, timeout=5)
    lock = leader._path(".lock")
    if how == "symlink":
        lock.symlink_to(tmp_path / "elsewhere")
    else:
        lock.mkdir()
    with pytest.raises(CheckpointSourceError, match="cannot lock"):
        leader.resolve("latest")
    follower = NodeSharedResolver(Slow(None), tmp_path, "k", leader=False, timeout=30)
    started = time.monotonic()
    with pytest.raises(CheckpointSourceError, match="cannot lock"):
        follower.resolve("latest")
    assert time.monotonic() - started < 10


def test_a_lock_refused_to_this_process_alone_or_after_an_answer_writes_nothing(
    tmp_path, monkeypatch
):
    """A lock refused for a reason of this process's own (permissions: another user's leader
    may hold it), or one that cannot be taken once an answer is there: the error record went
    over the other leader's answer (review round 34, M-F4). Nothing is written then."""
    import contextlib

    from verirl.checkpoints import node_share as _node_share

    chosen = str(tmp_path / "checkpoint-3")
    (tmp_path / "checkpoint-3").mkdir()
    first = Slow(chosen)
    first.release.set()
    assert NodeSharedResolver(first, tmp_path, "k", leader=True, timeout=5).resolve("x") == chosen

    @contextlib.contextmanager
    def refused(_path: object, _timeout: float) -> Iterator[None]:
        raise PermissionError(13, "Permission denied")
        yield

    second = NodeSharedResolver(Slow(None), tmp_path, "k", leader=True, timeout=5)
    with monkeypatch.context() as patch:
        patch.setattr(_node_share, "flock_with_deadline", refused)
        with pytest.raises(CheckpointSourceError, match="cannot lock"):
            second.resolve("x")
    second._path(".lock").unlink()
    second._path(".lock").mkdir()  # no process can take it now, but an answer is there
    with pytest.raises(CheckpointSourceError, match="cannot lock"):
        second.resolve("x")
    follower = NodeSharedResolver(Slow(None), tmp_path, "k", leader=False, timeout=5)
    assert follower.resolve("x") == chosen


@pytest.mark.parametrize(
    ("error", "recorded"),
    [(OSError(errno.ENOLCK, "No locks available"), True),
     (PermissionError(errno.EACCES, "Permission denied"), False),
     (OSError(errno.EMFILE, "Too many open files"), False)],
)  # fmt: skip
def test_a_lock_no_process_can_take_is_recorded_one_refused_to_this_one_alone_is_not(
    tmp_path, monkeypatch, error, recorded
):
    """A file system without locks (ENOLCK: NFS with no lock manager) left the followers
    waiting their deadline (review round 35, N-F2); a failure that may be this process's
    alone (permissions, no descriptor left: round 36) leaves the lock perhaps another's,
    whose key it is not this leader's to write."""
    import contextlib

    from verirl.checkpoints import node_share as _node_share

    @contextlib.contextmanager
    def refused(_path: object, _timeout: float) -> Iterator[None]:
        raise error
        yield

    leader = NodeSharedResolver(Slow(None), tmp_path, "k", leader=True, timeout=5)
    monkeypatch.setattr(_node_share, "flock_with_deadline", refused)
    with pytest.raises(CheckpointSourceError, match="cannot lock"):
        leader.resolve("x")
    assert leader._path(".json").exists() is recorded


# STEP_RANK behind a retry wrapper with the rank's own command line (the same script).
SELF_WRAPPED_RANK = "import subprocess\n" + STEP_RANK.replace(
    '(here / f"started-',
    'if not os.environ.get("WRAPPED"):\n'
    "    env = {**os.environ, 'WRAPPED': '1'}\n"
    "    sys.exit(subprocess.call([sys.executable, *sys.argv], env=env))\n"
    '(here / f"started-',
    1,
)


@pytest.mark.parametrize("launcher", ["torchrun", "srun"])
def test_ranks_behind_wrappers_with_their_own_command_line_share_a_key(tmp_path, launcher):
    """Each rank sees the other's wrapper, older than both ranks: all must pick the same."""
    script = tmp_path / "step_rank.py"
    script.write_text(SELF_WRAPPED_RANK)
    here = tmp_path / "attempt"
    here.mkdir()
    env = {"LOCAL_WORLD_SIZE": "2"}
    if launcher == "srun":
        env |= {"SLURM_JOB_ID": "79", "SLURM_STEP_ID": "0"}
    procs = []
    for local_rank in ("0", "1"):
        own = {"TORCHELASTIC_ERROR_FILE": f"/tmp/te_x/run/attempt_0/{local_rank}/error.json"}
        child_env = {**os.environ, **env, **(own if launcher == "torchrun" else {})}
        child_env.pop("WRAPPED", None)
        argv = [sys.executable, str(script), str(here), local_rank, "2"]
        procs.append(subprocess.Popen(argv, env=child_env))
    for proc in procs:
        assert proc.wait(timeout=120) == 0
    keys = {path.read_text() for path in here.glob("key-*")}
    assert len(keys) == 1, keys

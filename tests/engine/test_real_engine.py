"""A real vLLM engine (CPU build, tiny model) under `VLLMServer`, with the installed TRL's client.

One server serves the module (readiness, generation, the fake-vs-real
contract); the other tests start their own, because what they check is how a
server ends.
"""

from __future__ import annotations

import json
import math
import os
import select
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import requests
from engine_support import (
    ENGINE_ENV,
    ENGINE_STARTUP_TIMEOUT,
    engine_server,
    fake_server,
    names,
    process_tree,
)
from tiny_model import MAX_MODEL_LEN, SERVE_ARGS
from trl.generation.vllm_client import VLLMClient

from _support import still_alive, unshared_port
from verirl import VLLMServer, VLLMServerExited

GONE_WITHIN = 10.0  # seconds for the engine tree to go once its holder is gone


@pytest.fixture(scope="module")
def served(
    tiny_model: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[VLLMServer, list[psutil.Process]]]:
    """The module's real server, and its process tree once ready.

    Leaving the block is the normal exit: afterwards no process of the tree
    may be alive (a zombie, which init reaps, counts as gone).
    """
    server = engine_server(tiny_model, tmp_path_factory.mktemp("engine-log"))
    with server:
        tree = process_tree(server.pid or 0)
        yield server, tree
    left = still_alive(tree, timeout=GONE_WITHIN)
    assert not left, f"alive after a normal exit: {names(left)}"


def test_the_default_launch_is_vllms_own_server_as_trl_builds_it(served):
    server, tree = served
    plan = server.launch_plan()
    assert plan.kind == "vllm"
    assert plan.env["VLLM_SERVER_DEV_MODE"] == "1"
    assert "--weight-transfer-config" in plan.argv  # a flag only TRL's build_command adds
    assert server.argv == plan.argv
    log = server.log_path.read_text(encoding="utf-8", errors="replace")
    assert "Application startup complete" in log
    # Neither trl's warning that `trl vllm-serve` is deprecated, nor vLLM's about an old module.
    assert "vllm-serve` is deprecated" not in log
    assert "api_server` command is deprecated" not in log
    assert "api_server` is deprecated" not in log
    assert len(tree) >= 3, names(tree)  # API server, EngineCore, at least one worker


def test_ready_means_health_answers_and_the_slash_form_redirects(served):
    server, _ = served
    assert server.running
    assert requests.get(server.base_url + "/health", timeout=10).status_code == 200
    slash = requests.get(server.base_url + "/health/", timeout=10, allow_redirects=False)
    assert slash.status_code == 307
    assert slash.headers["location"].endswith("/health")


def test_trls_client_generates_through_the_server(served):
    server, _ = served
    client = VLLMClient(base_url=server.base_url)
    out = client.generate(["module adder"], max_tokens=8, generation_kwargs={"ignore_eos": True})
    assert len(out["completion_ids"]) == 1
    assert len(out["completion_ids"][0]) == 8
    assert all(isinstance(token, int) for token in out["completion_ids"][0])
    assert len(out["logprobs"][0]) == 8
    assert all(lp[0] <= 0.0 for lp in out["logprobs"][0])


# ---------------------------------------------------------------- the contract


def signature(value: object) -> object:
    """The JSON type structure of ``value``: keys and element types, not lengths or values.

    Lists collapse to the set of their elements' signatures, so a list of
    top-k logprobs whose length varies by one (vLLM adds the sampled token
    when it is not among the top k) has one signature.
    """
    if isinstance(value, dict):
        return {key: signature(item) for key, item in sorted(value.items())}
    if isinstance(value, (list, tuple)):
        items = {json.dumps(signature(item), sort_keys=True) for item in value}
        return ["list", *sorted(items)]
    if isinstance(value, bool) or value is None:
        return type(value).__name__
    if isinstance(value, float) and math.isinf(value):
        return "float"
    return type(value).__name__


def lengths(out: dict[str, Any]) -> dict[str, object]:
    """The lengths that must agree exactly: sequences and tokens per sequence.

    Not the prompts': how many tokens a text prompt makes is the tokenizer's
    business (the fake counts bytes); token-id prompts are compared whole.
    """
    found: dict[str, object] = {}
    for key, value in out.items():
        if key == "prompt_ids":
            found[key] = len(value)
        elif isinstance(value, list):
            found[key] = [len(row) if isinstance(row, list) else None for row in value]
    return found


CALLS: dict[str, Callable[[VLLMClient], object]] = {
    "generate text n=2 k=2": lambda c: c.generate(
        ["module adder", "the fox"],
        n=2,
        max_tokens=4,
        logprobs=2,
        generation_kwargs={"ignore_eos": True},
    ),
    "generate ids, no logprobs": lambda c: c.generate(
        [[5, 6, 7]], max_tokens=3, logprobs=None, generation_kwargs={"ignore_eos": True}
    ),
    "generate k=0": lambda c: c.generate(
        ["module"], max_tokens=5, logprobs=0, generation_kwargs={"ignore_eos": True}
    ),
    "chat": lambda c: c.chat(
        [[{"role": "user", "content": "hi"}]],
        max_tokens=3,
        logprobs=1,
        generation_kwargs={"ignore_eos": True},
    ),
    "sequence logprobs": lambda c: c.get_sequence_logprobs([[5, 6, 7, 8, 9]], [2], top_logprobs=3),
    "world size": lambda c: c.get_world_size(),
    "weight transfer config": lambda c: c.get_server_info()["weight_transfer_config"],
    "reset prefix cache": lambda c: c.reset_prefix_cache(),
    "weight update bracket": lambda c: (c._start_weight_update(), c._finish_weight_update()),
}


def test_contract_the_fake_answers_trls_client_like_the_real_engine(served, tiny_model, tmp_path):
    real_server, _ = served
    real = VLLMClient(base_url=real_server.base_url)
    with fake_server(tiny_model, tmp_path) as fake_process:
        fake = VLLMClient(base_url=fake_process.base_url)
        assert fake.model == real.model == str(tiny_model)
        for name, call in CALLS.items():
            real_out, fake_out = call(real), call(fake)
            assert signature(fake_out) == signature(real_out), name
            if isinstance(real_out, dict):
                assert lengths(fake_out) == lengths(real_out), name  # type: ignore[arg-type]
            if name in ("world size", "weight transfer config"):
                assert fake_out == real_out, name
            if name == "generate ids, no logprobs":
                assert fake_out["prompt_ids"] == real_out["prompt_ids"] == [[5, 6, 7]]  # type: ignore[index]


def _token_key(key: str) -> bool:
    return key.startswith("token_id:") or key.isdigit()


def differences(fake: object, real: object, path: str = "") -> list[str]:
    """Where the fake's JSON has a key the real one lacks, or a value of another type."""
    if isinstance(fake, dict) and isinstance(real, dict):
        if fake and real and all(map(_token_key, [*fake, *real])):  # keyed by token: data
            return differences(next(iter(fake.values())), next(iter(real.values())), path + "{}")
        found = []
        for key, value in fake.items():
            if key not in real:
                found.append(f"{path}.{key}: only in the fake")
            else:
                found += differences(value, real[key], f"{path}.{key}")
        return found
    if isinstance(fake, list) and isinstance(real, list):
        if fake and real:
            return differences(fake[0], real[0], f"{path}[0]")
        return []
    if fake is None or real is None or type(fake) is type(real):
        return []
    return [f"{path}: {type(fake).__name__} in the fake, {type(real).__name__} in vLLM"]


RAW_REQUESTS = {
    "/v1/completions": {
        "prompt": ["module adder"],
        "max_tokens": 3,
        "logprobs": 1,
        "n": 2,
        "return_token_ids": True,
        "return_tokens_as_token_ids": True,
        "prompt_logprobs": 1,
        "ignore_eos": True,
    },
    "/v1/chat/completions": {
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 3,
        "logprobs": True,
        "top_logprobs": 2,
        "return_token_ids": True,
        "ignore_eos": True,
    },
    "/inference/v1/generate": {
        "request_id": "contract",
        "token_ids": [5, 6, 7],
        "sampling_params": {"max_tokens": 3, "logprobs": 1, "n": 2, "output_kind": 2},
    },
}


def test_contract_the_fakes_raw_answers_are_a_subset_of_vllms(served, tiny_model, tmp_path):
    real_server, _ = served
    with fake_server(tiny_model, tmp_path) as fake_process:
        for path, body in RAW_REQUESTS.items():
            request = {"model": str(tiny_model), **body}
            answers = [
                requests.post(server.base_url + path, json=request, timeout=60)
                for server in (real_server, fake_process)
            ]
            assert [answer.status_code for answer in answers] == [200, 200], path
            real_json, fake_json = (answer.json() for answer in answers)
            assert differences(fake_json, real_json, path) == []
        for path in ("/v1/models", "/get_world_size", "/health"):
            real_answer = requests.get(real_server.base_url + path, timeout=10)
            fake_answer = requests.get(fake_process.base_url + path, timeout=10)
            assert fake_answer.status_code == real_answer.status_code == 200, path
            if real_answer.content:
                assert differences(fake_answer.json(), real_answer.json(), path) == []
            else:
                assert not fake_answer.content, path


# ---------------------------------------------------------------- how a server ends


def test_an_exception_in_the_block_leaves_no_engine_process(tiny_model, tmp_path):
    tree: list[psutil.Process] = []

    def run() -> None:
        with engine_server(tiny_model, tmp_path) as server:
            tree.extend(process_tree(server.pid or 0))
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        run()
    assert len(tree) >= 3, names(tree)
    left = still_alive(tree, timeout=GONE_WITHIN)
    assert not left, f"alive after an exception: {names(left)}"


HOLDER = textwrap.dedent(
    """
    import json, sys, psutil
    from verirl import VLLMServer
    model, port, log_dir, args = sys.argv[1], int(sys.argv[2]), sys.argv[3], json.loads(sys.argv[4])
    server = VLLMServer(model, devices=(0,), port=port, log_path=log_dir, **args)
    server.start()
    root = psutil.Process(server.pid)
    print(json.dumps([root.pid, *(p.pid for p in root.children(recursive=True))]), flush=True)
    sys.stdin.read()
    """
)


def test_sigkill_of_the_process_holding_the_server_takes_the_engine_down(tiny_model, tmp_path):
    settings = {
        "max_model_len": MAX_MODEL_LEN,
        "extra_args": list(SERVE_ARGS),
        "env": ENGINE_ENV,
        "startup_timeout": 300.0,
    }
    argv = [sys.executable, "-c", HOLDER, str(tiny_model), str(unshared_port()), str(tmp_path)]
    holder = subprocess.Popen(
        [*argv, json.dumps(settings)], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        assert holder.stdout is not None
        ready, _, _ = select.select([holder.stdout], [], [], 360.0)
        line = holder.stdout.readline() if ready else b""
        assert line, f"the holder printed nothing (exit status {holder.poll()})"
        tree = [psutil.Process(pid) for pid in json.loads(line)]
        assert len(tree) >= 3, names(tree)
        holder.send_signal(signal.SIGKILL)
        holder.wait(timeout=10)
        left = still_alive(tree, timeout=GONE_WITHIN)
        assert not left, f"alive after SIGKILL of the holder: {names(left)}"
    finally:
        holder.kill()
        holder.wait()
        if holder.stdin is not None:
            holder.stdin.close()
        if holder.stdout is not None:
            holder.stdout.close()


def test_a_model_path_that_does_not_exist_is_server_exited_naming_it(tmp_path):
    missing = tmp_path / "no-such-model"
    server = engine_server(missing, tmp_path)
    started = time.monotonic()
    with pytest.raises(VLLMServerExited) as caught:
        server.start()
    assert str(missing) in caught.value.log_tail or "no-such-model" in caught.value.log_tail
    assert time.monotonic() - started < 300.0  # an exit, not the startup timeout
    assert not server.running


# ---------------------------------------------------------------- verirl launch


TRAINER = textwrap.dedent(
    """
    import json, os
    from trl.generation.vllm_client import VLLMClient
    client = VLLMClient(base_url=os.environ["VERIRL_VLLM_URL"])
    out = client.generate(["module adder"], max_tokens=6, generation_kwargs={"ignore_eos": True})
    kwargs = json.loads(os.environ["VERIRL_GRPO_KWARGS"])
    print("RESULT " + json.dumps({"ids": out["completion_ids"], "kwargs": kwargs}))
    """
)


def test_verirl_launch_end_to_end_with_the_real_server(tiny_model, tmp_path):
    port = unshared_port()
    script = tmp_path / "train.py"
    script.write_text(TRAINER, encoding="utf-8")
    argv = [
        sys.executable, "-m", "verirl", "launch", "--gpus", "2", "--model", str(tiny_model),
        "--max-model-len", str(MAX_MODEL_LEN), "--vllm-port", str(port),
        "--vllm-args", " ".join(SERVE_ARGS), "--log-dir", str(tmp_path),
        "--", sys.executable, str(script),
    ]  # fmt: skip
    env = {**os.environ, **ENGINE_ENV}
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=480, check=False)
    assert done.returncode == 0, done.stderr[-4000:]
    (line,) = [row for row in done.stdout.splitlines() if row.startswith("RESULT ")]
    result = json.loads(line.removeprefix("RESULT "))
    assert [len(ids) for ids in result["ids"]] == [6]
    assert result["kwargs"]["vllm_server_port"] == port
    with pytest.raises(requests.ConnectionError):
        requests.get(f"http://127.0.0.1:{port}/health", timeout=5)


WAITER = """
import os, signal, sys, threading
from pathlib import Path
marker = Path(sys.argv[1])
got = threading.Event()
signal.signal(signal.SIGTERM, lambda *_: got.set())
marker.write_text("running")
got.wait(300)
marker.write_text("sigterm" if got.is_set() else "timeout")
sys.exit(143)
"""


def test_launch_exits_4_within_seconds_when_the_engine_core_dies(tiny_model, tmp_path):
    """The real engine's EngineCore killed (an OOM): the command gets SIGTERM, launch exits 4."""
    port = unshared_port()
    script, marker = tmp_path / "wait.py", tmp_path / "marker"
    script.write_text(WAITER, encoding="utf-8")
    argv = [
        sys.executable, "-m", "verirl", "launch", "--gpus", "2", "--model", str(tiny_model),
        "--max-model-len", str(MAX_MODEL_LEN), "--vllm-port", str(port),
        "--vllm-args", " ".join(SERVE_ARGS), "--log-dir", str(tmp_path),
        "--", sys.executable, str(script), str(marker),
    ]  # fmt: skip
    launch = subprocess.Popen(argv, env={**os.environ, **ENGINE_ENV}, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + ENGINE_STARTUP_TIMEOUT
        while not marker.exists() and launch.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert marker.exists(), "the command never started"
        tree = list(psutil.Process(launch.pid).children(recursive=True))
        (core,) = [p for p in tree if "EngineCore" in " ".join([p.name(), *p.cmdline()])]
        killed = time.monotonic()
        core.kill()
        _, stderr = launch.communicate(timeout=120)
        elapsed = time.monotonic() - killed
    finally:
        if launch.poll() is None:
            launch.kill()
            launch.communicate()
    text = stderr.decode(errors="replace")
    assert launch.returncode == 4, text[-4000:]
    assert marker.read_text() == "sigterm"  # the command was told first
    assert elapsed < 15, (elapsed, text[-2000:])  # the watchdog, the command's exit, teardown
    assert still_alive(tree, timeout=10) == []
    with pytest.raises(requests.ConnectionError):
        requests.get(f"http://127.0.0.1:{port}/health", timeout=5)

"""TRL 1.x's real `VLLMClient` against the shipped fake vLLM server: every call that needs no NCCL.

The fake runs both ways: as a program under `verirl.VLLMServer` (``python -m
fakes.vllm_serve``, with its worker) and in this process as
`FakeVLLMServer(serve_http=True)`. No engine starts here, but ``VLLMClient``
refuses to exist unless vllm is importable, so these tests live with the
real-engine ones (``VERIRL_VLLM=1``, ``nox -s vllm``).
"""

from __future__ import annotations

import math
import sys
from collections.abc import Iterator
from typing import Any

import pytest
import requests
from PIL import Image
from trl.generation.vllm_client import VLLMClient

from _support import unshared_port
from fakes.vllm import FakeVLLMServer
from verirl import VLLMServer

MODEL = "fake/model"
FAKE_COMMAND = (sys.executable, "-m", "fakes.vllm_serve")
DEV_MODE = {"VLLM_SERVER_DEV_MODE": "1"}


@pytest.fixture(scope="module", params=["program", "in-process"])
def server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[VLLMServer]:
    """The fake: the program under `VLLMServer`, then `FakeVLLMServer`."""
    handle: VLLMServer
    if request.param == "program":
        handle = VLLMServer(
            MODEL,
            command=FAKE_COMMAND,
            devices=(0,),
            port=unshared_port(),
            env=DEV_MODE,
            log_path=tmp_path_factory.mktemp("fake-log") / "vllm.log",
            startup_timeout=60.0,
        )
    else:
        handle = FakeVLLMServer(MODEL, port=unshared_port(), serve_http=True)
    with handle:
        yield handle


@pytest.fixture(scope="module")
def client(server: VLLMServer) -> VLLMClient:
    """TRL's client; its constructor already checked ``/health`` and read ``/v1/models``."""
    return VLLMClient(base_url=server.base_url)


def recorded(server: VLLMServer) -> list[dict[str, Any]]:
    response = requests.get(server.base_url + "/verirl/calls/", timeout=5)
    response.raise_for_status()
    calls: list[dict[str, Any]] = response.json()["calls"]
    return calls


def check_logprobs(out: dict[str, Any], sequences: int, tokens: int, width: int) -> None:
    """``(sequences, tokens, width)`` logprobs, sorted, with the sampled token among them."""
    logprobs, token_ids = out["logprobs"], out["logprob_token_ids"]
    assert len(logprobs) == len(token_ids) == sequences
    for completion, rows, id_rows in zip(out["completion_ids"], logprobs, token_ids, strict=True):
        assert len(rows) == len(id_rows) == tokens
        for token, row, ids in zip(completion, rows, id_rows, strict=True):
            assert len(row) == len(ids) == width
            assert token in ids
            assert row == sorted(row, reverse=True)
            assert all(value < 0 for value in row)


def test_the_constructor_checks_health_and_reads_the_served_model(client: VLLMClient) -> None:
    assert client.model == MODEL
    client.check_server(total_timeout=5)


def test_server_info_and_world_size(client: VLLMClient) -> None:
    info = client.get_server_info()
    assert info["weight_transfer_config"] == {"backend": "nccl"}
    assert info["model_config"]["model"] == MODEL
    assert client.get_world_size() == 1


@pytest.mark.parametrize("logprobs", [None, 0, 2])
def test_generate_from_text_prompts(client: VLLMClient, logprobs: int | None) -> None:
    prompts = ["module adder", "the fox"]
    out = client.generate(prompts, n=3, max_tokens=4, logprobs=logprobs)
    assert out["prompt_ids"] == [list(prompt.encode()) for prompt in prompts]
    assert len(out["completion_ids"]) == len(prompts) * 3
    assert all(len(ids) == 4 for ids in out["completion_ids"])
    if logprobs is None:
        assert (out["logprobs"], out["logprob_token_ids"]) == (None, None)
    else:
        # vLLM lists the sampled token and `logprobs` others: k + 1 per position.
        check_logprobs(out, sequences=6, tokens=4, width=logprobs + 1)
    again = client.generate(prompts, n=3, max_tokens=4, logprobs=logprobs)
    assert again["completion_ids"] == out["completion_ids"]


def test_generate_from_token_ids(client: VLLMClient) -> None:
    prompts = [[5, 6, 7], [151_000, 8]]  # ids of a real tokenizer's size are accepted
    out = client.generate(prompts, n=2, max_tokens=3, logprobs=1)
    assert out["prompt_ids"] == prompts
    assert [len(ids) for ids in out["completion_ids"]] == [3, 3, 3, 3]
    check_logprobs(out, sequences=4, tokens=3, width=2)
    greedy = client.generate([[5, 6, 7]], max_tokens=5, temperature=0.0, logprobs=3)
    for ids, row in zip(greedy["completion_ids"][0], greedy["logprob_token_ids"][0], strict=True):
        assert ids == row[0]  # temperature 0: the best token every time


@pytest.mark.parametrize(("logprobs", "width"), [(None, None), (0, 1), (1, 1), (3, 3)])
def test_chat(client: VLLMClient, logprobs: int | None, width: int | None) -> None:
    conversations = [
        [{"role": "user", "content": "hi"}],
        [{"role": "system", "content": "be brief"}, {"role": "user", "content": "why?"}],
    ]
    out = client.chat(conversations, n=2, max_tokens=3, logprobs=logprobs)
    assert out["prompt_ids"][0] == list(b"<|user|>\nhi\n<|assistant|>\n")
    assert len(out["prompt_ids"]) == 2
    assert len(out["completion_ids"]) == 4
    assert all(len(ids) == 3 for ids in out["completion_ids"])
    if width is None:
        assert (out["logprobs"], out["logprob_token_ids"]) == (None, None)
    else:
        # vLLM's chat lists the first top_logprobs of (sampled, best others).
        check_logprobs(out, sequences=4, tokens=3, width=width)


def test_sequence_logprobs_score_a_completion_as_it_was_generated(client: VLLMClient) -> None:
    generated = client.generate(["module adder"], max_tokens=5, logprobs=0)
    prompt, completion = generated["prompt_ids"][0], generated["completion_ids"][0]
    scored = client.get_sequence_logprobs(
        [prompt + completion, [5, 6, 7, 8, 9]], [len(prompt), 2], top_logprobs=4
    )
    assert [len(rows) for rows in scored["logprobs"]] == [5, 3]
    assert all(len(row) == 4 for rows in scored["logprobs"] for row in rows)
    assert all(len(row) == 4 for rows in scored["logprob_token_ids"] for row in rows)
    assert scored["actual_token_ids"][0] == [[token] for token in completion]
    actual = [row[0] for row in scored["actual_logprobs"][0]]
    assert actual == pytest.approx([row[0] for row in generated["logprobs"][0]])
    for rows in scored["logprobs"]:
        for row in rows:
            assert row == sorted(row, reverse=True)
            assert not any(math.isinf(value) for value in row)


def test_image_features_then_generate_from_them(client: VLLMClient) -> None:
    red, blue = Image.new("RGB", (8, 8), "red"), Image.new("RGB", (8, 8), "blue")
    features = client.image_features([[red], None, [red, blue]])
    assert features[1] is None
    one, two = features[0], features[2]
    assert one is not None
    assert two is not None
    assert one["mm_placeholders"] == {"image": [{"offset": 9, "length": 7}]}
    assert len(two["mm_hashes"]["image"]) == 2
    assert two["mm_hashes"]["image"][0] == one["mm_hashes"]["image"][0]
    assert client.image_features([[red]]) == [one]  # deterministic
    prompts = [list(range(32))] * 3
    out = client.generate(prompts, features=features, n=2, max_tokens=3, logprobs=None)
    assert out["prompt_ids"] == prompts
    assert [len(ids) for ids in out["completion_ids"]] == [3] * 6
    assert out["logprobs"] is None
    assert out["completion_ids"][0] != out["completion_ids"][2]  # the image steers
    # vLLM 0.32 sends {"token_id", "logprob", "rank"} entries there, and TRL 1.16 reads
    # "token": it fails on the fake exactly as on the real server.
    with pytest.raises(KeyError, match="token"):
        client.generate(prompts, features=features, max_tokens=3, logprobs=0)


def test_reset_prefix_cache_is_recorded(client: VLLMClient, server: VLLMServer) -> None:
    start = len(recorded(server))
    client.reset_prefix_cache()
    assert [call["path"] for call in recorded(server)[start:]] == ["/reset_prefix_cache"]


def test_the_weight_transfer_calls_that_need_no_nccl_are_recorded(
    client: VLLMClient, server: VLLMServer
) -> None:
    start = len(recorded(server))
    init_info = {
        "master_address": "127.0.0.1",
        "master_port": 51216,
        "rank_offset": 1,
        "world_size": 2,
    }
    update_info = {"names": ["lm_head.weight"], "dtype_names": ["bfloat16"], "shapes": [[4, 8]]}
    assert client._post(
        f"{client.base_url}/init_weight_transfer_engine", json={"init_info": init_info}
    ) == {"message": "Weight transfer initialized"}
    client._start_weight_update()
    client._post(f"{client.base_url}/update_weights", json={"update_info": update_info})
    client._finish_weight_update()
    with client.weight_update():
        client._post(f"{client.base_url}/update_weights", json={"update_info": update_info})
    calls = recorded(server)[start:]
    assert [(call["path"], call["status"]) for call in calls] == [
        ("/init_weight_transfer_engine", 200),
        ("/start_weight_update", 200),
        ("/update_weights", 200),
        ("/finish_weight_update", 200),
        ("/start_weight_update", 200),
        ("/update_weights", 200),
        ("/finish_weight_update", 200),
    ]
    assert calls[0]["body"] == {"init_info": init_info}
    assert calls[2]["body"] == {"update_info": update_info}
    assert calls[1]["body"] == calls[3]["body"] == {}


def test_init_communicator_stops_before_nccl_on_a_cpu_device(client: VLLMClient) -> None:
    # TRL checks the server's weight transfer config and world size, then refuses a non-CUDA device.
    with pytest.raises(NotImplementedError, match="needs a CUDA device"):
        client.init_communicator(device="cpu")


def test_trls_guards_see_a_server_without_dev_mode_or_weight_transfer() -> None:
    no_dev = FakeVLLMServer(
        MODEL, port=unshared_port(), serve_http=True, env={"VLLM_SERVER_DEV_MODE": "0"}
    )
    with no_dev:
        client = VLLMClient(base_url=no_dev.base_url)
        with pytest.raises(RuntimeError, match="VLLM_SERVER_DEV_MODE=1"):
            client.get_server_info()
        assert len(client.generate(["x"], max_tokens=2)["completion_ids"][0]) == 2
    no_transfer = FakeVLLMServer(
        MODEL,
        port=unshared_port(),
        serve_http=True,
        extra_args=("--weight-transfer-config", "null"),
    )
    with no_transfer:
        client = VLLMClient(base_url=no_transfer.base_url)
        with pytest.raises(RuntimeError, match="no weight-transfer engine"):
            client.init_communicator(device="cpu")


def check_legacy(base_url: str) -> None:
    health = requests.get(base_url + "/health/", timeout=5)
    assert (health.status_code, health.json()) == (200, {"status": "ok"})
    redirect = requests.get(base_url + "/health", timeout=5, allow_redirects=False)
    assert (redirect.status_code, redirect.headers["location"]) == (307, base_url + "/health/")
    assert requests.get(base_url + "/get_world_size/", timeout=5).json() == {"world_size": 1}
    # TRL 1.x's client finds the server healthy (through the redirect) but no vLLM API.
    with pytest.raises(Exception, match="Request failed: 404"):
        VLLMClient(base_url=base_url)


def test_the_legacy_protocol_under_vllm_server(tmp_path) -> None:
    server = VLLMServer(
        MODEL,
        command=FAKE_COMMAND,
        devices=(0,),
        port=unshared_port(),
        env={**DEV_MODE, "FAKE_VLLM_PROTOCOL": "trl-legacy"},
        log_path=tmp_path / "vllm.log",
        startup_timeout=60.0,
    )
    with server:
        check_legacy(server.base_url)
    assert "fake protocol: trl-legacy" in (tmp_path / "vllm.log").read_text()


def test_the_legacy_protocol_in_process() -> None:
    with FakeVLLMServer(
        MODEL, port=unshared_port(), serve_http=True, protocol="trl-legacy"
    ) as server:
        check_legacy(server.base_url)

"""The shipped examples, first attempt and retry, on the fakes (`nox -s examples`).

Real GRPOTrainer runs on CPU with tests/engine's tiny random model (built
offline once per session) and a small prompt file; the vLLM server is the
fake program (``VERIRL_VLLM_COMMAND``), the Hub `fakes.hub.FakeHub`.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "engine"))
from tiny_model import build_tiny_model


def pytest_configure(config: pytest.Config) -> None:
    """Third-party warnings are not what these tests check; verirl's own stay errors."""
    for module in ("torch", "transformers", "trl", "accelerate", "datasets", "tokenizers",
                   "modal", "synchronicity", "grpc", "google"):  # fmt: skip
        for category in ("DeprecationWarning", "FutureWarning", "PendingDeprecationWarning"):
            config.addinivalue_line("filterwarnings", f"ignore::{category}:{module}(\\..*)?")


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny random model's folder (built offline, once)."""
    return build_tiny_model(tmp_path_factory.mktemp("tiny-model"))


@pytest.fixture(scope="session")
def prompts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A local dataset: 64 prompts as JSON lines, what ``--dataset FILE`` reads."""
    path = tmp_path_factory.mktemp("dataset") / "prompts.jsonl"
    lines = ["module adder(input a", "the quick brown fox", "assign y =", "jumps over"] * 16
    path.write_text("".join(json.dumps({"prompt": line}) + "\n" for line in lines))
    return path

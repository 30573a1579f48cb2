"""The preemption drill: real GRPOTrainer runs on CPU (`nox -s drill` installs trl).

The model is tests/engine's tiny random one, built offline once per session.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "engine"))
from tiny_model import build_tiny_model


def pytest_configure(config: pytest.Config) -> None:
    """Third-party warnings are not what these tests check; verirl's own stay errors."""
    for module in ("torch", "transformers", "trl", "accelerate", "datasets", "tokenizers"):
        for category in ("DeprecationWarning", "FutureWarning", "PendingDeprecationWarning"):
            config.addinivalue_line("filterwarnings", f"ignore::{category}:{module}(\\..*)?")


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny random model's folder (built offline, once)."""
    return build_tiny_model(tmp_path_factory.mktemp("tiny-model"))

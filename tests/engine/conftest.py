"""Real-engine tests: trl 1.x and vLLM's CPU build (`nox -s vllm` installs them).

The model is `tiny_model.build_tiny_model`'s, built once per session; every
server gets its own port outside the ephemeral range and its own log folder
(see `engine_support`).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from tiny_model import build_tiny_model


def pytest_configure(config: pytest.Config) -> None:
    """Third-party warnings are not what these tests check; verirl's own stay errors.

    trl warns about any vLLM newer than the range it was released against, and
    torch, transformers and vLLM raise deprecation warnings at import time.
    """
    config.addinivalue_line(
        "filterwarnings", "ignore:TRL currently supports vLLM versions:UserWarning"
    )
    for module in ("torch", "transformers", "trl", "vllm", "tokenizers"):
        for category in ("DeprecationWarning", "FutureWarning", "PendingDeprecationWarning"):
            config.addinivalue_line("filterwarnings", f"ignore::{category}:{module}(\\..*)?")


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The tiny random model's folder (built offline, once)."""
    return build_tiny_model(tmp_path_factory.mktemp("tiny-model"))

"""The public surface: complete, sorted, light to import."""

from __future__ import annotations

import ast
import inspect
import json
import subprocess
import sys
from pathlib import Path

import pytest

import fakes
import verirl

HEAVY = ("torch", "trl", "vllm", "transformers", "huggingface_hub")


@pytest.mark.parametrize("module", [verirl, fakes], ids=lambda m: m.__name__)
def test_all_is_sorted_and_unique(module):
    assert module.__all__ == sorted(set(module.__all__))


@pytest.mark.parametrize("module", [verirl, fakes], ids=lambda m: m.__name__)
def test_all_is_complete(module):
    """Every public name the package imports is exported, and every export exists."""
    tree = ast.parse(Path(inspect.getfile(module)).read_text())
    imported = {
        alias.asname or alias.name
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0
        if node.module.startswith(module.__name__)
        for alias in node.names
    }
    public = {name for name in imported if not name.startswith("_")}
    assert public <= set(module.__all__)
    for name in module.__all__:
        assert hasattr(module, name), name


def test_import_verirl_pulls_in_no_heavy_module():
    code = (
        "import sys, json; import verirl, verirl.cli; "
        f"print(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert json.loads(out.stdout) == []


def test_version_is_a_string():
    assert isinstance(verirl.__version__, str)
    assert verirl.__version__.count(".") >= 1

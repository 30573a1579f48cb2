"""The public surface: complete, sorted, light to import."""

from __future__ import annotations

import ast
import inspect
import json
import subprocess
import sys
import typing
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


def test_all_is_exactly_the_public_names():
    """httpx's exported-members test: ``__all__`` is every public name, sorted."""
    public = sorted(
        name
        for name, value in vars(verirl).items()
        if not name.startswith("_") and not inspect.ismodule(value) and name != "annotations"
    )
    assert verirl.__all__ == sorted([*public, "__version__"])


@pytest.mark.parametrize("name", verirl.__all__)
def test_each_exported_name_imports_from_verirl(name):
    namespace: dict[str, object] = {}
    exec(f"from verirl import {name}", namespace)  # noqa: S102 - the import statement is the test
    assert namespace[name] is getattr(verirl, name)


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


def _verirl_types(annotation: object, found: set[type]) -> None:
    if isinstance(annotation, type) and annotation.__module__.startswith("verirl"):
        found.add(annotation)
    for arg in typing.get_args(annotation):
        _verirl_types(arg, found)


def _signatures(obj: object) -> list[object]:
    """``obj`` itself (a function), or its ``__init__`` and public methods and properties."""
    if not inspect.isclass(obj):
        return [obj]
    members = []
    for name, member in vars(obj).items():
        if name.startswith("_") and name != "__init__":
            continue
        if isinstance(member, (classmethod, staticmethod)):
            member = member.__func__  # noqa: PLW2901
        if isinstance(member, property):
            member = member.fget  # noqa: PLW2901
        if inspect.isfunction(member):
            members.append(member)
    return members


def test_every_type_a_public_signature_names_is_exported():
    """httpx's rule: a user can import whatever a signature asks for, from `verirl`."""
    import requests

    if sys.version_info >= (3, 11):
        from typing import Self
    else:
        from typing_extensions import Self

    # Names the modules import for type checkers only (requests: not at import time).
    type_checking_only = {"Self": Self, "requests": requests}
    found: set[type] = set()
    for name in verirl.__all__:
        obj = getattr(verirl, name)
        if not (inspect.isclass(obj) or inspect.isfunction(obj)):
            continue
        for function in _signatures(obj):
            module = sys.modules[function.__module__]
            hints = typing.get_type_hints(function, globalns={**vars(module), **type_checking_only})
            for annotation in hints.values():
                _verirl_types(annotation, found)
    missing = sorted(t.__qualname__ for t in found if getattr(verirl, t.__name__, None) is not t)
    assert missing == []

"""The shipped fakes use only public names of verirl and of the libraries they stand in for.

A fake that reaches into ``verirl._*`` or ``huggingface_hub.utils._http``
breaks when those internals move, and tests that use it then test the
internals rather than the contract. Every module under ``fakes/`` is parsed
(imports inside functions and ``TYPE_CHECKING`` blocks included) and each
import from outside ``fakes`` must name public modules and public names; a
name taken from verirl must also be listed in its module's ``__all__``.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

FAKES = Path(__file__).resolve().parents[1] / "fakes"
MODULES = sorted(FAKES.rglob("*.py"))


def _private(part: str) -> bool:
    return part.startswith("_") and not (part.startswith("__") and part.endswith("__"))


def _imports(tree: ast.AST) -> list[tuple[int, str, str | None]]:
    """``(line, module, name)`` for each absolute import; ``name`` is ``None`` for ``import m``."""
    found: list[tuple[int, str, str | None]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.extend((node.lineno, alias.name, None) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module is not None:
            found.extend((node.lineno, node.module, alias.name) for alias in node.names)
    return found


def violations(source: str) -> list[str]:
    """What in ``source`` imports a private module or name from outside ``fakes``."""
    problems: list[str] = []
    for line, module, name in _imports(ast.parse(source)):
        top = module.split(".")[0]
        if top in {"fakes", "__future__"}:
            continue  # the fakes' own helpers (fakes._http) are theirs to share
        shown = module if name is None else f"{module}.{name}"
        if any(_private(part) for part in module.split(".")):
            problems.append(f"line {line}: {shown}: a private module")
        elif name is not None and _private(name):
            problems.append(f"line {line}: {shown}: a private name")
        elif top == "verirl" and name is not None and name != "*":
            public = getattr(importlib.import_module(module), "__all__", ())
            if name not in public:
                problems.append(f"line {line}: {shown}: not in {module}.__all__")
    return problems


def test_every_module_of_fakes_is_checked():
    names = {path.relative_to(FAKES).as_posix() for path in MODULES}
    assert {"__init__.py", "vllm.py", "hub.py", "envserver.py", "vllm_serve.py"} <= names


@pytest.mark.parametrize("path", MODULES, ids=lambda path: path.relative_to(FAKES).as_posix())
def test_fakes_import_only_public_names(path):
    assert violations(path.read_text(encoding="utf-8")) == []


@pytest.mark.parametrize(
    ("source", "problem"),
    [
        ("from verirl._validate import check_number", "verirl._validate.check_number: a private"),
        ("import verirl._procfs", "verirl._procfs: a private module"),
        ("from verirl import _version", "verirl._version: a private name"),
        ("from verirl.envserver import _url", "verirl.envserver._url: a private name"),
        ("from verirl.vllm_server import ProcessTree", "not in verirl.vllm_server.__all__"),
        (
            "def f():\n    from huggingface_hub.utils._http import default_client_factory\n",
            "huggingface_hub.utils._http.default_client_factory: a private module",
        ),
        (
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from verirl._poll import x\n",
            "verirl._poll.x: a private module",
        ),
    ],
)
def test_the_check_catches_private_imports(source, problem):
    (found,) = violations(source)
    assert problem in found


def test_the_check_lets_public_names_and_the_fakes_own_helpers_pass():
    source = (
        "from __future__ import annotations\n"
        "import huggingface_hub\n"
        "from huggingface_hub import HfApi\n"
        "from verirl import ConfigError, VLLMServer\n"
        "from verirl.envserver import check_wait_timeout\n"
        "from fakes._http import serve_in_background\n"
        "from .vllm import FakeVLLMServer\n"
    )
    assert violations(source) == []

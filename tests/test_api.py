"""The public surface: complete, sorted, light to import."""

from __future__ import annotations

import ast
import importlib
import importlib.util
import inspect
import json
import subprocess
import sys
import typing
from pathlib import Path

import pytest

import fakes
import verirl

HEAVY = (
    "torch",
    "trl",
    "vllm",
    "transformers",
    "huggingface_hub",
    "requests",
    "urllib3",
    "psutil",
)
"""Modules ``import verirl`` must not load: the ML stack, and what only some calls need."""

ROOT = Path(verirl.__file__).resolve().parents[1]


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
    # reachable, not in __all__ (see verirl)
    unlisted = {*getattr(module, "_OPTIONAL", ()), *getattr(module, "_UNLISTED", ())}
    public = {name for name in imported if not name.startswith("_")} - unlisted
    assert public <= set(module.__all__)
    for name in module.__all__:
        assert hasattr(module, name), name


def test_all_is_exactly_the_public_names():
    """httpx's exported-members test: ``__all__`` is every public name, sorted."""
    for name in verirl.__all__:
        getattr(verirl, name)  # the names are imported on first access
    public = sorted(
        name
        for name, value in vars(verirl).items()
        if not name.startswith("_")
        and not inspect.ismodule(value)
        and name not in ("annotations", "TYPE_CHECKING")
        and name not in verirl._UNLISTED  # reachable, cached once used (see below)
    )
    assert verirl.__all__ == sorted([*public, "__version__"])


@pytest.mark.parametrize("name", verirl.__all__)
def test_each_exported_name_imports_from_verirl(name):
    namespace: dict[str, object] = {}
    exec(f"from verirl import {name}", namespace)  # noqa: S102 - the import statement is the test
    assert namespace[name] is getattr(verirl, name)


def _fresh(code: str) -> object:
    """Run ``code`` in a fresh interpreter; what its last line of output holds, as JSON."""
    out = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
        cwd=ROOT,
    )
    return json.loads(out.stdout.splitlines()[-1])


def _heavy_after(code: str) -> object:
    return _fresh(
        f"{code}\nimport sys, json\nprint(json.dumps([m for m in {HEAVY!r} if m in sys.modules]))"
    )


def test_import_verirl_pulls_in_no_heavy_module():
    assert _heavy_after("import verirl, verirl.cli") == []


def test_import_verirl_imports_no_submodule_until_a_name_is_used():
    """The cost of ``import verirl`` is `verirl._version`; each name loads its own module."""
    code = (
        "import sys, json, verirl\n"
        "before = sorted(m for m in sys.modules if m.startswith('verirl'))\n"
        "verirl.VLLMTopology\n"
        "after = sorted(m for m in sys.modules if m.startswith('verirl'))\n"
        "print(json.dumps([before, 'verirl.vllm_server' in after, 'VLLMTopology' in vars(verirl)]))"
    )
    assert _fresh(code) == [["verirl", "verirl._version"], False, True]


@pytest.mark.parametrize(
    "code",
    [
        "import verirl.topology, verirl.distenv, verirl.errors",
        "import verirl.checkpoints, verirl.envserver, verirl.runtime",
        "import verirl; [getattr(verirl, n) for n in verirl.__all__ if n != 'VLLMServer']",
        "import verirl.cli; verirl.cli.main(['plan', '--gpus', '2', '--json'])",
        "import verirl.cli; verirl.cli.main(['plan', '--gpus', '1', '--model', 'm'])",
    ],
    ids=[
        "topology-distenv-errors",
        "checkpoints-envserver-runtime",
        "names-but-VLLMServer",
        "plan",
        "plan-1",
    ],
)
def test_light_paths_load_no_heavy_module(code):
    """requests, urllib3, psutil and huggingface_hub load with what uses them, not before.

    Of the public names only `VLLMServer` loads them (requests and psutil) at import:
    its module is imported to start a server, which needs both.
    """
    assert _heavy_after(code) == []


def test_every_name_resolves_in_a_fresh_interpreter():
    """Each name's lazy import works on its own, not only after the test session loaded it."""
    code = (
        "import json, verirl\n"
        "missing = [n for n in verirl.__all__ if getattr(verirl, n, None) is None]\n"
        "star = {}\n"
        "exec('from verirl import *', star)\n"
        "print(json.dumps([missing, sorted(set(star) - {'__builtins__'}), dir(verirl)]))"
    )
    missing, star, listed = _fresh(code)  # type: ignore[misc]
    assert missing == []
    assert star == sorted(verirl.__all__)
    assert listed == verirl.__all__


def test_each_name_comes_from_the_module_the_type_checking_block_names():
    """The lazy map and the imports type checkers read agree, name for name."""
    tree = ast.parse(Path(inspect.getfile(verirl)).read_text())
    (block,) = [
        node
        for node in tree.body
        if isinstance(node, ast.If)
        and isinstance(node.test, ast.Name)
        and node.test.id == "TYPE_CHECKING"
    ]
    declared = {}
    for node in block.body:
        assert isinstance(node, ast.ImportFrom)
        assert node.module is not None
        for alias in node.names:
            declared[alias.asname or alias.name] = node.module
    for name, module in verirl._OPTIONAL.items():
        assert declared.pop(name) == module
    unlisted = {name: declared.pop(name) for name in verirl._UNLISTED}
    assert sorted([*declared, "__version__"]) == verirl.__all__
    for name, module in {**declared, **unlisted}.items():
        assert getattr(verirl, name) is getattr(importlib.import_module(module), name), name


@pytest.mark.parametrize("name", sorted(verirl._UNLISTED))
def test_unlisted_names_stay_reachable_but_out_of_import_star(name):
    """Types only signatures name left ``__all__`` (issue 27); code using them still imports."""
    namespace: dict[str, object] = {}
    exec("from verirl import *", namespace)  # noqa: S102 - the import statement is the test
    assert name not in namespace
    exec(f"from verirl import {name}", namespace)  # noqa: S102
    assert namespace[name] is getattr(verirl, name)
    home = importlib.import_module(verirl._MODULE_OF[name])
    assert namespace[name] is getattr(home, name)


def test_the_top_level_lists_about_thirty_names():
    """Issue 27: the names the docs use, ``Settings`` among them, and few more."""
    assert len(verirl.__all__) <= 31
    assert "Settings" in verirl.__all__


def test_preemption_callback_is_reachable_but_needs_no_ml_stack_for_import_star():
    """`verirl.PreemptionCallback` loads transformers on first use; ``import *`` never does."""
    code = (
        "import json, sys, verirl\n"
        "star = {}\n"
        "exec('from verirl import *', star)\n"
        "try:\n"
        "    found = verirl.PreemptionCallback.__module__\n"
        "except ImportError as exc:\n"
        "    found = str(exc)\n"
        "print(json.dumps(['PreemptionCallback' in star, found]))"
    )
    in_star, found = _fresh(code)  # type: ignore[misc]
    assert in_star is False
    try:
        import transformers  # noqa: F401
    except ImportError:
        assert (
            found
            == "verirl.PreemptionCallback needs transformers: pip install trl (which installs it)"
        )
    else:
        assert found == "verirl.preemption"


def test_dir_lists_the_public_names():
    assert set(verirl.__all__) <= set(dir(verirl))


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match=r"^module 'verirl' has no attribute 'nope'$"):
        verirl.nope  # noqa: B018 - the attribute access is the test
    assert not hasattr(verirl, "VLLMTopologyy")
    with pytest.raises(ImportError, match="nope"):
        exec("from verirl import nope", {})  # noqa: S102 - the import statement is the test


def test_envserver_re_exports_http_names_on_access():
    """`verirl.envserver` re-exports `verirl._http`'s names without importing it up front."""
    import verirl._http
    import verirl.envserver

    for name in verirl.envserver.__all__:
        value = getattr(verirl.envserver, name)
        assert getattr(verirl._http, name, value) is value, name
    with pytest.raises(AttributeError, match=r"^module 'verirl.envserver' has no attribute 'x'$"):
        verirl.envserver.x  # noqa: B018 - the attribute access is the test


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


def _reexported(module: str) -> dict[str, str]:
    """The names ``module``'s source imports from other verirl modules, each with that module
    (read, not imported: `verirl.preemption` needs transformers)."""
    spec = importlib.util.find_spec(module)
    assert spec is not None, module
    assert spec.origin is not None, module
    names = {}
    for node in ast.parse(Path(spec.origin).read_text()).body:
        if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            for alias in node.names if node.module.startswith("verirl") else ():
                names[alias.asname or alias.name] = node.module
    return names


def test_tests_import_from_the_module_that_owns_a_name():
    """Issue 27: a test imports a public name, or the module that defines it, never a
    re-export (a public module that re-exports private helpers only for the tests)."""
    contract = {("verirl.vllm_server", "VLLMServer")}  # the DESIGN's public path for it
    found = []
    for path in sorted((ROOT / "tests").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if not (isinstance(node, ast.ImportFrom) and node.level == 0 and node.module):
                continue
            if node.module == "verirl" or not node.module.startswith("verirl."):
                continue
            reexported = _reexported(node.module)
            for alias in node.names:
                home = reexported.get(alias.name)
                # a package's own submodules are its house: verirl.checkpoints.Checkpoint
                if home is None or home.startswith(node.module + "."):
                    continue
                if (node.module, alias.name) not in contract:
                    found.append(f"{path.relative_to(ROOT)}: {alias.name} from {node.module}")
    assert found == []

"""The fixtures users get from the ``pytest11`` entry point, used as a user would."""

from __future__ import annotations

import importlib.metadata
import os
import subprocess
import sys
from pathlib import Path

import pytest

import verirl
from verirl import CheckpointResolver, HttpEnvServerProbe, HubCheckpointSource

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parents[1]
PLUGIN = "verirl.pytest_plugin"


@pytest.fixture
def same_verirl(monkeypatch):
    """Subprocesses import the verirl this run tests (a checkout, or the installed one)."""
    where = str(Path(verirl.__file__).resolve().parents[1])
    monkeypatch.setenv(
        "PYTHONPATH", os.pathsep.join(filter(None, [where, os.environ.get("PYTHONPATH")]))
    )


def test_fake_env_server_fixture(fake_env_server):
    HttpEnvServerProbe(fake_env_server.url).wait(timeout=60)  # returns at once; generous under load
    assert fake_env_server.requests == 1


def test_fake_vllm_command_fixture(fake_vllm_command):
    assert fake_vllm_command == [sys.executable, "-m", "fakes.vllm_serve"]


def test_fake_hub_fixture(fake_hub, tmp_path):
    fake_hub.add_checkpoint("org/run", "checkpoint-5", 5, size=100)
    source = HubCheckpointSource("org/run", download_dir=tmp_path, endpoint=fake_hub.endpoint)
    assert CheckpointResolver([source]).resolve("latest") == str(tmp_path / "checkpoint-5")


def test_fake_runtime_fixture(fake_runtime):
    with fake_runtime as session:
        assert session.resume_from_checkpoint == "/fake/checkpoint-10"
        assert session.server is not None
        assert session.grpo_kwargs["vllm_server_port"] == fake_runtime.topology.port
    assert session.server.stops == 1


def test_fake_runtime_s_server_stays_alive_for_the_watchdog(fake_runtime, caplog):
    """A test may hold the block longer than the watchdog's bound: the fake answers /health."""
    import threading

    import requests

    caplog.set_level("WARNING", logger="verirl")
    fake_runtime.vllm_unresponsive_timeout = 1.0
    with fake_runtime as session:
        assert session.server is not None
        answer = requests.get(f"{session.server.base_url}/health", timeout=5)
        assert answer.status_code == 200
        threading.Event().wait(2.5)  # past the bound: an unanswered /health would interrupt here
    assert "did not answer /health" not in caplog.text


def test_plugin_is_registered_for_a_fresh_pytest_run(pytester, same_verirl):
    """A user's suite sees the fixtures with no conftest, only the installed entry point."""
    pytester.makepyfile(
        """
        import requests
        def test_user(fake_env_server, fake_runtime):
            assert requests.get(fake_env_server.url + "/health", timeout=60).status_code == 200
            with fake_runtime as session:
                assert session.topology.mode == "server"
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=1)


def test_a_project_with_its_own_fakes_package_still_runs_pytest(pytester, same_verirl):
    """``fakes`` is a common name: the plugin must not import ours at start-up."""
    pytester.mkpydir("fakes").joinpath("__init__.py").write_text("MINE = True\n")
    pytester.makepyfile(
        """
        import fakes

        def test_theirs():
            assert fakes.MINE

        def test_our_command_fixture_needs_no_fakes(fake_vllm_command):
            assert fake_vllm_command[-1] == "fakes.vllm_serve"
        """
    )
    result = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(passed=2)


def test_the_old_plugin_module_still_offers_the_fixtures():
    import fakes.pytest_plugin
    import verirl.pytest_plugin

    for name in verirl.pytest_plugin.__all__:
        assert getattr(fakes.pytest_plugin, name) is getattr(verirl.pytest_plugin, name)


def test_the_entry_point_names_the_plugin_inside_verirl():
    """Installed, and as declared in pyproject.toml: not ``fakes.pytest_plugin`` (see above)."""
    (entry,) = [e for e in importlib.metadata.entry_points(group="pytest11") if e.name == "verirl"]
    assert entry.value == PLUGIN
    # tomllib is 3.11+; on 3.10, tomli (which coverage[toml] of the tests extra installs).
    tomllib = importlib.import_module("tomllib" if sys.version_info >= (3, 11) else "tomli")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert project["entry-points"]["pytest11"] == {"verirl": PLUGIN}


def test_the_plugin_imports_no_fakes_until_a_fixture_is_used(same_verirl):
    code = (
        "import sys, verirl\n"
        f"assert {PLUGIN!r} not in sys.modules, 'import verirl loaded the plugin'\n"
        f"import {PLUGIN}\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'fakes'))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert (result.returncode, result.stdout, result.stderr) == (0, "[]\n", "")

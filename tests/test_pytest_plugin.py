"""The fixtures users get from the ``pytest11`` entry point, used as a user would."""

from __future__ import annotations

import sys

from verirl import CheckpointResolver, HttpEnvServerProbe, HubCheckpointSource

pytest_plugins = ["pytester"]


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


def test_plugin_is_registered_for_a_fresh_pytest_run(pytester):
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


def test_a_project_with_its_own_fakes_package_still_runs_pytest(pytester):
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

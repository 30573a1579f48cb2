"""The pytest fixtures, under their old name: they live in `verirl.pytest_plugin`.

The ``pytest11`` entry point names `verirl.pytest_plugin`, so that a project
with its own ``fakes`` package can run pytest with verirl installed; this
module stays for suites that load it with ``-p fakes.pytest_plugin``.
"""

from __future__ import annotations

from verirl.pytest_plugin import fake_env_server, fake_hub, fake_runtime, fake_vllm_command

__all__ = ["fake_env_server", "fake_hub", "fake_runtime", "fake_vllm_command"]

"""Test doubles for verirl: GPU-free, network-free, and real where it matters.

Each fake implements the same interface as the verirl component it stands in
for, and is injected through the constructor::

    from fakes import FakeEnvServer
    from verirl import HttpEnvServerProbe

    with FakeEnvServer(ready_after=0.2) as env:
        HttpEnvServerProbe(env.url).wait(timeout=5)
"""

from __future__ import annotations

from fakes.envserver import FakeEnvServer, FakeEnvServerProbe

__all__ = ["FakeEnvServer", "FakeEnvServerProbe"]

"""`VLLMServer` and the names that come with it, at their public path.

The server lives in `verirl.server.server`; this module keeps
``from verirl.vllm_server import VLLMServer`` (and the rest of its
``__all__``) working for code written before the server subsystem got a
package of its own.
"""

from __future__ import annotations

from verirl.server.child import death_signal_preexec
from verirl.server.child_env import (
    SCRUBBED_ENV_PREFIXES,
    SCRUBBED_ENV_VARS,
    map_visible_devices,
    vllm_child_environ,
)
from verirl.server.launch import INSTALL_HINT, LaunchPlan, find_trl_command
from verirl.server.log_tail import read_log_tail
from verirl.server.process import MARKER_VAR
from verirl.server.server import VLLMServer
from verirl.topology import ServerTopology

__all__ = [
    "INSTALL_HINT",
    "MARKER_VAR",
    "SCRUBBED_ENV_PREFIXES",
    "SCRUBBED_ENV_VARS",
    "LaunchPlan",
    "ServerTopology",
    "VLLMServer",
    "death_signal_preexec",
    "find_trl_command",
    "map_visible_devices",
    "read_log_tail",
    "vllm_child_environ",
]

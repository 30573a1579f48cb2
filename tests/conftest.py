"""Suite-wide guards: no test may leave a child process behind.

Each pytest process (each xdist worker too) tags its environment with a fresh
`SESSION_VAR` at configure time; everything the suite starts inherits it.
After each test, and once more at the end of the session, any process carrying
our tag (wherever it was re-parented) or descending from us that was not there
before is reported with its command line and killed. Processes started by
another checkout or job on the same machine, even verirl servers carrying
`verirl.vllm_server.MARKER_VAR`, do not carry our tag and are left alone.
"""

from __future__ import annotations

import atexit
import importlib
import os
import shutil
import signal
import socket
import tempfile
import uuid
from collections.abc import Iterator

import psutil
import pytest

from _support import SESSION_VAR, describe, kill_all, leftovers, session_processes

_HF_HOME_VAR = "VERIRL_TESTS_HF_HOME"
"""Where the controlling pytest put the suite's own HF_HOME, for its xdist workers."""

_HUB_PREFIXES = ("HF_", "HUGGINGFACE_", "HUGGING_FACE_", "TRANSFORMERS_OFFLINE")
"""The developer's Hub settings (tokens, OIDC, staging, caches, endpoint, offline mode, which
huggingface_hub also reads from TRANSFORMERS_OFFLINE): none reach the suite."""
_KEPT = frozenset({"HF_HUB_OFFLINE"})
"""But the one nox sets for the sessions that must never reach the network (a developer's own
``HF_HUB_OFFLINE=1`` therefore still fails the fake Hub's tests)."""


def _hub_settings_of_the_suite() -> None:
    """The suite's own HF_HOME (empty, private to this run), and none of the developer's tokens.

    huggingface_hub reads them once, when it is imported (below): a token in the
    developer's shell, file or saved login would otherwise reach the in-process
    tests, and a bad one fails them. Each xdist worker takes its controller's.
    """
    for name in [name for name in os.environ if name.startswith(_HUB_PREFIXES)]:
        if name not in _KEPT:
            del os.environ[name]
    home = os.environ.get(_HF_HOME_VAR)
    if home is None:
        home = tempfile.mkdtemp(prefix="verirl-tests-hf-home-")
        atexit.register(shutil.rmtree, home, ignore_errors=True)
        os.environ[_HF_HOME_VAR] = home
    os.environ["HF_HOME"] = home


_TMP_VAR = "VERIRL_TESTS_TMPDIR"
"""Where the controlling pytest put the suite's own temp folder, for its xdist workers."""


def _temp_folder_of_the_suite() -> None:
    """A temp folder of this run's own (``TMPDIR``), removed when the run ends.

    What verirl puts in the system temp dir by design (the default server-log
    folder, ``<tmp>/verirl-vllm-<uid>``) and what the programs the tests start
    leave there (torch's caches) go there, not into the machine's. pytest's own
    ``tmp_path`` folders stay in the system temp dir, where a failed test's
    files can be looked at after the run.
    """
    folder = os.environ.get(_TMP_VAR)
    if folder is None:
        os.environ.setdefault("PYTEST_DEBUG_TEMPROOT", tempfile.gettempdir())
        folder = tempfile.mkdtemp(prefix="verirl-tests-tmp-")
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
        os.environ[_TMP_VAR] = folder
    os.environ["TMPDIR"] = folder
    tempfile.tempdir = None  # gettempdir() reads TMPDIR again


_hub_settings_of_the_suite()
_temp_folder_of_the_suite()
# huggingface_hub reads HF_HUB_OFFLINE once, when it is imported: imported here, before any
# test sets that variable, so that a test which does cannot leave the rest of its worker
# offline (a later test's fake Hub then refused as "offline mode is on").
importlib.import_module("huggingface_hub.constants")

# tests/compat needs the real trl (and torch); only `nox -s compat` installs them.
# tests/engine needs trl and a real vLLM engine (CPU build); only `nox -s vllm` installs them.
# tests/drill needs trl (real GRPOTrainer runs on CPU); only `nox -s drill` installs it.
# tests/multinode needs torch (gloo) and runs torchrun; only `nox -s multinode` installs it.
# tests/examples needs trl (GRPOTrainer runs on CPU) and modal; `nox -s examples` installs them.
collect_ignore = [
    folder
    for folder, variable in (
        ("compat", "VERIRL_COMPAT"),
        ("engine", "VERIRL_VLLM"),
        ("drill", "VERIRL_DRILL"),
        ("multinode", "VERIRL_MULTINODE"),
        ("examples", "VERIRL_EXAMPLES"),
    )
    if not os.environ.get(variable)
]

_TAG = uuid.uuid4().hex


DEFAULT_PORTS = (8000, 8001, 29500)
"""vLLM's, verirl's and torch.distributed's default ports.

Not TRL's weight-sync group port: verirl has no setting for it yet, so doctor
rightly reports it in use while another job holds it.
"""

_HELD: list[socket.socket] = []


def pytest_configure(config: pytest.Config) -> None:
    """Give this pytest process its own tag, inherited by every process it starts.

    The controlling process also holds each of `DEFAULT_PORTS` that is free, for
    the whole run, as another job on the machine might: a test that needs
    one free (rather than a port of its own) fails here, not on a shared box.
    """
    os.environ[SESSION_VAR] = _TAG
    if hasattr(config, "workerinput"):  # an xdist worker: its controller holds them
        return
    for port in DEFAULT_PORTS:
        holder = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            holder.bind(("127.0.0.1", port))
            holder.listen(1)
        except OSError:  # held by someone else already
            holder.close()
            continue
        _HELD.append(holder)


def pytest_unconfigure(config: pytest.Config) -> None:
    """Let the default ports go."""
    while _HELD:
        _HELD.pop().close()


def _check(before: set[psutil.Process], what: str) -> None:
    left = leftovers(_TAG, before)
    if left:
        lines = [describe(proc) for proc in left]
        kill_all(left)
        pytest.fail(f"processes left behind by {what} (now killed):\n" + "\n".join(lines))


@pytest.fixture(autouse=True, scope="session")
def _no_leftover_processes_after_the_session() -> Iterator[None]:
    """Catches what no single test owns (e.g. a process started between tests)."""
    before = session_processes(_TAG)
    yield
    _check(before, "the test session")


@pytest.fixture(autouse=True)
def _no_leftover_processes(request: pytest.FixtureRequest) -> Iterator[None]:
    """Fail the test that left a process running, naming each one."""
    before = session_processes(_TAG)
    yield
    _check(before, request.node.nodeid)


@pytest.fixture
def default_sigterm() -> Iterator[None]:
    """Act as a program with the default SIGTERM (coverage's `sigterm = true` installs one)."""
    previous = signal.signal(signal.SIGTERM, signal.SIG_DFL)
    yield
    signal.signal(signal.SIGTERM, previous)

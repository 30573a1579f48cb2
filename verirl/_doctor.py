"""``verirl doctor``'s table: what this machine has for a GRPO job.

Versions of the stack, what `VLLMServer` would launch, GPUs, whether the
ports are free, the env server's health and whether a Hub token is set
(never its value). Each row is a fact, read once; nothing is changed.

doctor is a preflight: `examine` also returns the problems, each with the
exit code the command that runs into it would end with (3: the env server is
not healthy; 4: no vLLM server can be started here (nothing to launch, or a
`VERIRL_VLLM_COMMAND` whose program is not there), or its port is taken; 2:
the job cannot be planned from the variables, as `TrainingRuntime.from_settings`
plans it for ``verirl launch``; 5: launch would find no checkpoint to resume
from, where that is known here without the Hub (``latest`` with no source, or
only local ones holding no complete checkpoint; an explicit path that is no
directory; a local checkpoint that cannot be read); 1: torch fails to load).
The layout's refusals are in the command line's words, as launch would print
them. In colocate mode no server starts here, so its launch and ports are not
checked. The Hub token is looked up the way huggingface_hub looks it up
(``HF_TOKEN``, ``HUGGING_FACE_HUB_TOKEN``, the file at ``HF_TOKEN_PATH``, else
``$HF_HOME/token`` written by ``hf auth login``), by huggingface_hub itself,
within a deadline; one it could not send is exit 2 ("Hub token unusable: …",
naming the variable or the file), as launch and resume refuse it. Doctor never
contacts the Hub about checkpoints.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
import shlex
import shutil
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from verirl._fs import printable
from verirl._gpus import detect_gpu_count
from verirl._hub_token import (
    TOKEN_SOURCES,
    check_token,
    hub_token_within,
    implicit_hub_token,
    implicit_token_disabled,
    refuse_unreadable_token_file,
    token_variable,
)
from verirl._net import port_is_free
from verirl._secrets import redact_argv, redact_text, scrub
from verirl._version import __version__
from verirl.distenv import DistributedEnv
from verirl.envserver import HttpEnvServerProbe
from verirl.errors import CheckpointNotFoundError, CheckpointSourceError, ConfigError, VeriRLError
from verirl.server.launch import CLI_COMMAND_HINT, COMMAND_HINT, vllm_distribution
from verirl.topology import TRL_GROUP_PORT
from verirl.vllm_server import VLLMServer

if TYPE_CHECKING:
    from verirl.runtime import TrainingRuntime

__all__ = ["EXIT_CHECKPOINT", "EXIT_CONFIG", "EXIT_ENV_SERVER", "EXIT_ERROR", "EXIT_VLLM",
           "examine", "hub_token_row", "machine_report"]  # fmt: skip

EXIT_ERROR, EXIT_CONFIG, EXIT_ENV_SERVER, EXIT_VLLM, EXIT_CHECKPOINT = 1, 2, 3, 4, 5
_PRIORITY = (EXIT_ENV_SERVER, EXIT_VLLM, EXIT_CONFIG, EXIT_CHECKPOINT, EXIT_ERROR)  # which decides
TOKEN_LOOKUP_TIMEOUT = 10.0
"""Seconds huggingface_hub may take to find the token (an OIDC exchange or an OAuth refresh)."""


def _version_of(distribution: str) -> str:
    if distribution == "vllm":
        found = vllm_distribution()
        if found is None:
            return "missing"
        return found.version if found.name == "vllm" else f"{found.version} ({found.name})"
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return "missing"


def _launch_row(
    vllm_command: Sequence[str] | None, remote_host: str | None, *, local: bool
) -> tuple[str, bool]:
    """What `VLLMServer` would run here, and why, or why it cannot; and whether it can."""
    if remote_host is not None:
        return f"not started here: vLLM runs on VERIRL_VLLM_HOST={redact_text(remote_host)}", True
    if not local:
        return "not started here: colocate mode (vLLM runs inside the trainer)", True
    if vllm_command is not None:
        shown = printable(shlex.join(redact_text(part) for part in redact_argv(vllm_command)))
        if shutil.which(vllm_command[0]) is None:  # what launch would fail on (exit 4)
            return f"cannot start: VERIRL_VLLM_COMMAND={shown}: its program is not found", False
        return f"command: VERIRL_VLLM_COMMAND={shown}", True
    try:
        plan = VLLMServer("MODEL").launch_plan()
    except VeriRLError as exc:  # in the command line's words: doctor is a command
        return f"cannot start: {str(exc).replace(COMMAND_HINT, CLI_COMMAND_HINT)}", False
    return f"{plan.kind}: {plan.reason}", True


def _layout(
    explain: Callable[[VeriRLError], str],
    precheck: Callable[[], object] | None,
    given: Mapping[str, Any],
) -> tuple[bool, list[tuple[int, str]]]:
    """Whether `launch`, as the variables set it, starts a vLLM server here; what it refuses.

    The runtime is built as ``verirl launch`` builds it from the variables
    (nothing is started), after ``precheck`` (the command line's own checks
    of the variables): colocate mode and a remote server start none here, so
    nothing about a server launch matters; a layout that cannot be planned
    is what launch would end on (exit 2), not the server launch after it, and
    a checkpoint request that launch's resolver, asked here as launch asks it
    (`_resolve_locally`), cannot answer is exit 5. ``explain`` puts an error
    in the words the caller would see it in.
    """
    from verirl.runtime import TrainingRuntime  # noqa: PLC0415

    try:
        if precheck is not None:
            precheck()
        runtime = TrainingRuntime.from_settings(**given)
    except ConfigError as exc:
        if exc.field in TOKEN_SOURCES:  # the Hub token, not the layout: planned without it
            return _local_without_hub(given), [(EXIT_CONFIG, _unusable_token(explain(exc)))]
        return False, [(EXIT_CONFIG, f"layout: {explain(exc)}")]
    except Exception:  # noqa: BLE001 - the rows below say what is wrong
        return True, []
    local = runtime.topology.is_local_server
    try:
        if runtime.starts_server and runtime.server_factory is not None:
            server = runtime.server_factory(runtime.topology)  # built, not started: no model is 2
            server.check_log()  # the log launch would open, looked at, not written
    except ConfigError as exc:
        return local, [(EXIT_CONFIG, f"vLLM server: {explain(exc)}")]
    except Exception:  # noqa: BLE001 - the launch row below says what is wrong
        return local, []
    return local, _checkpoint(runtime, explain)


def _local_without_hub(given: Mapping[str, Any]) -> bool:
    """Whether the layout launch plans (its Hub token aside) starts a vLLM server here."""
    from verirl.runtime import topology_from_settings  # noqa: PLC0415

    fields = ("gpu_count", "max_model_len", "mode", "vllm_gpus", "vllm_port", "vllm_remote_host")
    try:
        topology = topology_from_settings(**{name: given[name] for name in fields if name in given})
    except Exception:  # noqa: BLE001 - the launch row says what it can
        return False
    return topology.is_local_server


def _unusable_token(message: str) -> str:
    """The problem of a Hub token huggingface_hub could not send (it names where the token is)."""
    return f"Hub token unusable: {message}"


def _checkpoint(
    runtime: TrainingRuntime, explain: Callable[[VeriRLError], str]
) -> list[tuple[int, str]]:
    """What launch's checkpoint phase would end on, where the disk alone decides it."""
    try:
        runtime.refuse_unfindable()
        _resolve_locally(runtime.checkpoints, runtime.resume_from)
    except ConfigError as exc:  # a request launch's resolver refuses: exit 2, as launch ends
        return [(EXIT_CONFIG, f"checkpoint: {explain(exc)}")]
    except (CheckpointNotFoundError, CheckpointSourceError) as exc:
        return [(EXIT_CHECKPOINT, f"checkpoint: {explain(exc)}")]
    return []


def _resolve_locally(resolver: object, request: str | None) -> None:
    """Resolve ``request`` as launch's checkpoint phase would, where the disk alone decides.

    Launch's own resolver answers it: an explicit path is looked at where it
    is (no source is asked); ``latest`` and ``auto`` are resolved when every
    source is a local folder (read in place: nothing is downloaded, copied or
    created). With a Hub source, or a resolver not of verirl's making, nothing
    is asked here: the Hub is not contacted by doctor. Raises what launch
    would end on; ``auto`` with nothing found is a fresh start, no error.
    """
    from verirl.checkpoints import CheckpointResolver, LocalCheckpointSource  # noqa: PLC0415
    from verirl.checkpoints.model import RESUME_KEYWORDS  # noqa: PLC0415 - loaded when used

    if request is None or not request.strip():
        return  # a fresh start: launch resolves nothing
    if request.strip() not in RESUME_KEYWORDS:
        CheckpointResolver([]).resolve(request)  # a path: launch's resolver asks no source
        return
    if not isinstance(resolver, CheckpointResolver) or not resolver.sources:
        return  # no source: `refuse_unfindable` has said it
    if all(isinstance(source, LocalCheckpointSource) for source in resolver.sources):
        resolver.resolve(request)


def _sources_of(token: str) -> str:
    """Where huggingface_hub found ``token``: the variable, else the token file."""
    from huggingface_hub import constants  # noqa: PLC0415 - keep import verirl light

    found = token_variable(os.environ)  # the one huggingface_hub takes, cleaned as it does
    if found is not None and found[1] == token:
        return found[0]
    if os.environ.get("HF_OIDC_RESOURCE"):
        return "OIDC exchange (HF_OIDC_RESOURCE)"
    variable = "HF_TOKEN_PATH" if os.environ.get("HF_TOKEN_PATH") else "hf auth login"
    return f"the token file {constants.HF_TOKEN_PATH} ({variable})"


def hub_token_row(explicit: str | None = None) -> tuple[str, bool]:
    """Whether a Hub token is set and where from, never its value; and whether that is usable.

    ``explicit``: a token given to verirl itself (``HF_TOKEN``). Otherwise
    huggingface_hub's own ``get_token`` decides, on a thread, within
    `TOKEN_LOOKUP_TIMEOUT`. A token huggingface_hub could not send (a space,
    a control or a non-ASCII character; a token file that is not text, or one
    it would block on) is a `ConfigError` naming where it is, never showing it
    (`implicit_hub_token`), as launch and resume refuse it.
    """
    if explicit:
        try:
            check_token(explicit)
        except ConfigError as exc:
            raise exc.renamed("HF_TOKEN") from None
        return "set (HF_TOKEN)", True
    refuse_unreadable_token_file()  # huggingface_hub would block on it: the caller's problem row
    implicit_hub_token()  # one huggingface_hub could not send: the caller's problem row
    unsent = "not sent: HF_HUB_DISABLE_IMPLICIT_TOKEN is set (huggingface_hub reads no token)"
    try:
        token = hub_token_within(TOKEN_LOOKUP_TIMEOUT)
    except Exception as error:  # noqa: BLE001 - reported, not raised
        if implicit_token_disabled():  # get_token reads it; a request would not
            return unsent, True
        why = (
            f"did not answer within {TOKEN_LOOKUP_TIMEOUT:g} s"
            if isinstance(error, TimeoutError)
            else f"could not read it ({type(error).__name__})"
        )
        return f"unknown: huggingface_hub {why}", False
    if not token:
        return "not set", True
    row = f"set ({_sources_of(token)})"
    from huggingface_hub import constants  # noqa: PLC0415

    if constants.HF_HUB_DISABLE_IMPLICIT_TOKEN and not (os.environ.get("HF_TOKEN") or "").strip():
        row += ", but HF_HUB_DISABLE_IMPLICIT_TOKEN is set: huggingface_hub does not send it"
    return scrub(row, token), True


def _token(hub_token: str | None) -> tuple[str, list[tuple[int, str]]]:
    """The Hub token's row, and its problem.

    A token huggingface_hub could not send, or a token file it would block
    on, is launch's exit 2; a lookup that fails or does not answer, 1.
    """
    try:
        row, usable = hub_token_row(hub_token)
    except ConfigError as exc:
        return f"unusable: {exc}", [(EXIT_CONFIG, _unusable_token(str(exc)))]
    return row, [] if usable else [(EXIT_ERROR, f"Hub token lookup: {row}")]


def _unsaid(
    refusals: Sequence[VeriRLError],
    problems: Sequence[tuple[int, str]],
    explain: Callable[[VeriRLError], str],
) -> list[tuple[int, str]]:
    """The variables launch refuses (exit 2), read around by the caller, that no problem says."""
    said = [what for _, what in problems]
    found: list[tuple[int, str]] = []
    for refusal in refusals:
        what = explain(refusal)
        if not any(what in known for known in said):
            found.append((EXIT_CONFIG, what))
            said.append(what)
    return found


def examine(
    *,
    vllm_port: int,
    probe: HttpEnvServerProbe | None,
    hub_token: str | None,
    vllm_command: Sequence[str] | None = None,
    vllm_remote_host: str | None = None,
    explain: Callable[[VeriRLError], str] = str,
    precheck: Callable[[], object] | None = None,
    given: Mapping[str, Any] | None = None,
    refusals: Sequence[VeriRLError] = (),
) -> tuple[list[tuple[str, str]], list[tuple[int, str]]]:
    """The doctor's rows, (label, value), in the order printed; and the problems found.

    A problem is (exit code, what): the first of the codes in the order 3, 4,
    2, 5, 1 is doctor's exit code. ``explain`` and ``precheck``: see `_layout`;
    ``given``: `TrainingRuntime.from_settings`'s arguments a flag gave (the
    port checked), so that the plan is the one launch would make with it.
    """
    rows: list[tuple[str, str]] = [
        ("python", f"{platform.python_version()} ({sys.executable})"),
        ("verirl", __version__),
    ]
    problems: list[tuple[int, str]] = []
    rows += [(name, _version_of(name)) for name in ("trl", "vllm", "torch", "transformers")]
    local, refused = _layout(explain, precheck, given or {})
    problems += refused
    if any(what.startswith("layout: ") for _, what in refused):
        launch, usable = "unknown: launch and serve cannot plan the layout (below)", True
    else:
        launch, usable = _launch_row(vllm_command, vllm_remote_host, local=local)
    rows.append(("vLLM launch", launch))
    if not usable:
        problems.append((EXIT_VLLM, f"vLLM launch: {launch}"))
    try:
        gpus = str(detect_gpu_count())
    except ConfigError as exc:  # CUDA_VISIBLE_DEVICES that names no GPU: the variable's fault
        gpus = f"unknown: {exc}"
        problems.append((EXIT_ERROR, f"GPUs visible: {gpus}"))
    except Exception as exc:  # noqa: BLE001 - a broken torch install is a finding, not a crash
        gpus = f"unknown: torch failed to load ({type(exc).__name__}: {exc})"
        problems.append((EXIT_ERROR, f"GPUs visible: {gpus}"))
    rows.append(("GPUs visible", gpus))
    rows.append(
        ("CUDA_VISIBLE_DEVICES", printable(os.environ.get("CUDA_VISIBLE_DEVICES", "(unset)")))
    )
    for label, port in (("vLLM port", vllm_port), ("TRL group port", TRL_GROUP_PORT)):
        free = port_is_free(port)
        rows.append((f"{label} {port}", "free" if free else "IN USE"))
        if not free and local:
            problems.append((EXIT_VLLM, f"{label} {port} is in use"))
    if probe is not None:
        healthy = probe.check()
        rows.append((f"env server {probe.url}", "healthy" if healthy else "NOT reachable/healthy"))
        if not healthy:
            why = f"env server {probe.url} is not reachable/healthy (launch waits for it; serve "
            problems.append((EXIT_ENV_SERVER, why + "does not read it)"))
    else:
        rows.append(("env server", "(no --env-url / VERIRL_ENV_SERVER_URL)"))
    token_row, token_problems = _token(hub_token)
    rows.append(("Hub token", token_row))
    problems += [problem for problem in token_problems if problem not in problems]  # launch's too
    dist = DistributedEnv.single_node()
    rows.append(
        ("launcher", "none" if "RANK" in dist.defaulted else f"rank {dist.rank}/{dist.world_size}")
    )
    problems += _unsaid(refusals, problems, explain)
    problems.sort(key=lambda problem: _PRIORITY.index(problem[0]))
    return rows, problems


def machine_report(
    *, vllm_port: int, probe: HttpEnvServerProbe | None, hub_token: str | None
) -> list[tuple[str, str]]:
    """The doctor's rows, (label, value), in the order printed (`examine` without the problems)."""
    rows, _ = examine(vllm_port=vllm_port, probe=probe, hub_token=hub_token)
    return rows

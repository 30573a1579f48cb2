"""The argument parser of ``verirl`` and its commands, which records what it would print."""

from __future__ import annotations

import argparse
import contextvars
import re
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from verirl import __version__
from verirl._cli_output import STDERR, STDOUT
from verirl._fs import escape_bytes
from verirl._secrets import redact_message
from verirl.cli.codes import EXIT_CONFIG, LAUNCH_GRACE, SHUTDOWN_TIMEOUT_VARIABLE
from verirl.cli.commands import (
    cmd_doctor,
    cmd_launch,
    cmd_plan,
    cmd_resume,
    cmd_serve,
    cmd_wait_env,
)
from verirl.cli.flags import (
    _add_checkpoint_args,
    _add_server_args,
    _add_setting,
    _add_topology_args,
    _ascii_int,
    _ascii_seconds,
)

__all__ = ["EPILOG", "build_parser"]


_PARSE_OUTPUT: contextvars.ContextVar[list[tuple[str, str]] | None] = contextvars.ContextVar(
    "verirl_parse_output", default=None
)
"""While `main` parses: what the parser would print, (text, "stdout"|"stderr"|"version")."""
_EXPECTED_ONE = re.compile(r"argument (-\S+?)(?:/\S+)?: expected one argument")


class _Store(argparse._StoreAction):  # noqa: SLF001 - argparse's own "store", with a record
    """argparse's ``store`` that notes a flag given again (`_REPEATED`): the last one counts."""

    def __call__(
        self,
        parser: argparse.ArgumentParser,
        namespace: argparse.Namespace,
        values: str | Sequence[Any] | None,
        option_string: str | None = None,
    ) -> None:
        given: set[str] = namespace.__dict__.setdefault(_GIVEN, set())
        if self.dest in given and option_string is not None:
            repeated: list[str] = namespace.__dict__.setdefault(_REPEATED, [])
            name = self.option_strings[-1]
            if name not in repeated:
                repeated.append(name)
        given.add(self.dest)
        super().__call__(parser, namespace, values, option_string)


_GIVEN = "given_flags"
"""The namespace's record of the flags that stored a value, by dest."""
_REPEATED = "repeated_flags"
"""The namespace's list of the flags given more than once (each by its long name)."""


class _Parser(argparse.ArgumentParser):
    """argparse with a one-line usage error (exit 2): ``verirl plan: error: argument --gpus: …``.

    What it prints goes through the command line's channels (a closed or
    abandoned stdout/stderr fails nothing), or to `main`, which turns it into
    the one JSON document with ``--json``. A flag given twice keeps argparse's
    rule (the last one counts: a wrapper's defaults, then the user's), but is
    noted for a warning (`_warn_repeated`).
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:  # noqa: ANN401 - argparse's own
        super().__init__(*args, **kwargs)
        self.register("action", None, _Store)  # argument groups share this registry
        self.register("action", "store", _Store)

    def error(self, message: str) -> NoReturn:
        # It quotes what was typed: --api-key=V, a URL's password, a name that is not UTF-8.
        # Captured, the message is hidden whole later, once the run's secrets are known
        # (`_hidden`): redacted here first, a key like 'ab:KEY@host' would show as '***@host'.
        message = escape_bytes(message)
        if _PARSE_OUTPUT.get() is None:
            message = redact_message(message)
        match = _EXPECTED_ONE.fullmatch(message)
        if match:  # the value started with "-", so argparse took it for a flag
            message += f" (a value that starts with '-' goes after '=': {match[1]}=VALUE)"
        self.exit(EXIT_CONFIG, f"{self.prog}: error: {message} (see {self.prog} --help)\n")

    def exit(self, status: int = 0, message: str | None = None) -> NoReturn:
        if message:
            self._out(message, "stderr")
        raise SystemExit(status)

    def print_help(self, file: object = None) -> None:  # noqa: ARG002 - always stdout
        self._out(self.format_help(), "stdout")

    def print_usage(self, file: object = None) -> None:  # noqa: ARG002 - always stdout
        self._out(self.format_usage(), "stdout")

    def _print_message(self, message: str, file: object = None) -> None:
        if message:
            self._out(message, "stdout" if file is not None and file is sys.stdout else "stderr")

    @staticmethod
    def _out(text: str, channel: str) -> None:
        captured = _PARSE_OUTPUT.get()
        if captured is not None:
            captured.append((text, channel))
        else:
            (STDERR if channel == "stderr" else STDOUT).write(text)


class _Version(argparse.Action):
    """``--version``: the version on stdout (with ``--json``: ``{"version": …}``), exit 0."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS,
                 default: str = argparse.SUPPRESS, help: str | None = None) -> None:  # noqa: A002  # fmt: skip
        super().__init__(option_strings, dest, nargs=0, default=default, help=help)

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace,  # noqa: ARG002
                 values: object, option_string: str | None = None) -> None:  # noqa: ARG002  # fmt: skip
        _Parser._out(f"verirl {__version__}\n", "version")  # noqa: SLF001
        parser.exit()


EPILOG = """\
Exit codes:
  0    success                    3    env server never healthy
  1    any other verirl error     4    vLLM server failed (serve: it died)
  2    bad usage or configuration 5    checkpoint not found or unreadable
  130  Ctrl-C (SIGINT)            143  SIGTERM, whenever it arrives
  launch: its command's code (127: cannot run it; 128+N: killed by signal N);
  SIGTERM/Ctrl-C is passed on once to the command's process group (which cannot
  read the terminal's stdin); SIGKILL after --shutdown-timeout or a 2nd Ctrl-C;
  4 if the vLLM server died while it ran (the command got SIGTERM the same way).
  doctor: 3 env server not healthy, 4 no vLLM server can start here,
  2 launch could not plan the job, 5 no checkpoint it would resume, 1 other.

-v/-q/--json go before or after COMMAND. A setting not given as a flag comes
from its VERIRL_* variable (named in the command's --help)."""


def _add_output_args(parser: argparse.ArgumentParser, prefix: str = "") -> None:
    """-v/-q/--json; the top-level parser stores them under other names (they add up)."""
    parser.add_argument(
        "-v", "--verbose", action="count", default=0, dest=f"{prefix}verbose",
        help="more log output (debug)",
    )  # fmt: skip
    parser.add_argument(
        "-q", "--quiet", action="count", default=0, dest=f"{prefix}quiet",
        help="less log output (-q: warnings, -qq: errors only; -v and -q cancel out)",
    )  # fmt: skip
    parser.add_argument(
        "--json", action="store_true", dest=f"{prefix}json",
        help="machine-readable output on stdout",
    )  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    """The argument parser for ``verirl`` and its commands."""
    common = _Parser(add_help=False)
    _add_output_args(common)

    parser = _Parser(
        prog="verirl",
        description="Start, resume and tear down GRPO jobs (TRL + vLLM + a reward env server).",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action=_Version, help="print the version and exit")
    _add_output_args(parser, "top_")
    sub = parser.add_subparsers(dest="cmd", required=True, metavar="COMMAND")

    def add(
        name: str, func: Callable[[argparse.Namespace], int], help_text: str
    ) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help_text, description=help_text, parents=[common])
        p.set_defaults(func=func)
        return p

    p = add("plan", cmd_plan, "Show the GPU topology and GRPOConfig kwargs.")
    _add_topology_args(p)
    p.add_argument("--model", help="also print the vLLM server's flags for this model")

    p = add("wait-env", cmd_wait_env, "Wait until the env server answers healthy.")
    p.add_argument("url", help="env server base URL, e.g. http://127.0.0.1:8000")
    p.add_argument("--timeout", type=_ascii_seconds, default=300.0, help="seconds (default: 300)")
    p.add_argument("--health-path", default="/health", help="default: /health")

    p = add("resume", cmd_resume, "Print the checkpoint to resume from (empty: fresh start).")
    _add_checkpoint_args(p)

    p = add("serve", cmd_serve, "Run the vLLM server your TRL expects until Ctrl-C/SIGTERM.")
    _add_topology_args(p)
    _add_server_args(p)
    group = p.add_argument_group("serving node")
    group.add_argument(
        "--host",
        help="address to bind (default: 127.0.0.1); another address, e.g. 0.0.0.0, lets "
        "other machines in, with a warning: vLLM's API has no authentication",
    )
    group.add_argument(
        "--dedicated",
        action="store_true",
        default=None,
        help="this node only serves: vLLM takes every GPU (or --vllm-gpus of them), "
        "nothing trains here (the vLLM node of a multi-node job)",
    )
    group.add_argument(
        "--tensor-parallel-size", type=_ascii_int,
        help="vLLM's tensor parallel size (default: vLLM GPUs / data parallel size)",
    )  # fmt: skip
    group.add_argument(
        "--data-parallel-size", type=_ascii_int,
        help="vLLM's data parallel size: engine replicas (default: 1)",
    )  # fmt: skip

    p = add("launch", cmd_launch, "Run the whole start-up, then COMMAND, then tear down.")
    _add_topology_args(p)
    _add_server_args(p)
    _add_checkpoint_args(p)
    _add_setting(p, "env_url")
    _add_setting(p, "env_timeout", type=_ascii_seconds)
    p.add_argument(
        "--shutdown-timeout",
        type=_ascii_seconds,
        help="on SIGTERM/Ctrl-C, seconds the command gets to exit after the signal is "
        "passed on (once, to its process group), before SIGKILL; a Ctrl-C after it SIGKILLs "
        f"at once (${SHUTDOWN_TIMEOUT_VARIABLE}; default: {LAUNCH_GRACE:g}, "
        "under the 30 s Kubernetes and Modal give)",
    )
    _add_setting(p, "vllm_unresponsive_timeout", type=_ascii_seconds)
    p.add_argument("command", nargs=argparse.REMAINDER, metavar="-- COMMAND ...")

    p = add("doctor", cmd_doctor, "Show what this machine has for a GRPO job.")
    _add_setting(p, "env_url", lead="env server to check")
    _add_setting(p, "vllm_port", lead="vLLM port to check", type=_ascii_int)
    return parser

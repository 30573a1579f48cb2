"""The ``verirl`` command line: plan, wait-env, resume, serve, launch, doctor.

argparse, not click: it is in the standard library, so the core keeps its
four dependencies, and ``--help`` on every command comes for free.

Messages: every error is one line on stderr, printed once, naming the flag
(or the variable, when the value came from the environment) and the value;
a required value given neither way is asked for before anything else; a flag
that the layout chosen by other flags would ignore is an error, not a no-op.
``-v``/``-q``/``--json`` go before or after the command (counts add up).
With ``--json`` stdout carries exactly one JSON document on every path
(``{"error": {"code": N, "message": M}}`` for a failed run), and a closed,
``None`` or abandoned stdout/stderr never fails a command (`verirl._cli_output`).

Exit codes (`EXIT_CODES`; the parser's epilog and the README say the same):

- 0 success; 1 any other verirl error;
- 2 bad usage or configuration (argparse's usage error, `ConfigError`);
- 3 the env server never became healthy; 4 the vLLM server failed (it could not
  start, exited or timed out; for ``serve``, it died while serving);
- 5 no checkpoint where one was asked for, or a checkpoint source failed;
- ``doctor`` is a preflight: 3 when the env server it checks is not healthy,
  else 4 when no vLLM server can start here, else 2 when ``launch`` could
  not plan the job, else 5 when it would find no checkpoint where the disk
  alone decides, else 1 for anything else it finds unusable, 0 when
  everything is;
- 130 on Ctrl-C (SIGINT) and 143 on SIGTERM, whenever it arrives (while
  starting, serving or tearing down; ``python -m verirl`` and the ``verirl``
  script handle SIGTERM from their first line, see `verirl.__main__`);
  a second SIGTERM during the teardown is ignored, so the teardown completes;
- ``launch`` exits with its command's code (127 when it cannot be run, 128+N
  when it died of signal N): the command runs in a process group of its own
  (so it cannot read a terminal's stdin), each SIGTERM/Ctrl-C is passed on to
  that group once, and it gets ``--shutdown-timeout`` seconds before SIGKILL
  (then 137; a Ctrl-C after the first signal SIGKILLs at once, a second
  SIGTERM is ignored); a signal before the
  command started gives 143/130 and the command never runs. If the vLLM
  server dies while the command runs (exits, or answers no ``/health`` for
  ``--vllm-unresponsive-timeout`` seconds), the command gets SIGTERM the same
  way and ``launch`` exits 4, whatever the command's code.

The package: `verirl.cli.entry` (`main`), `verirl.cli.parser`, `verirl.cli.argv`
(the command line read before argparse), `verirl.cli.commands`, `verirl.cli.flags`
(each setting's flag), `verirl.cli.words` (errors in the user's words),
`verirl.cli.output`, `verirl.cli.codes`.
"""

from __future__ import annotations

from verirl.cli.codes import EXIT_CODES, GRPO_KWARGS_VARIABLE
from verirl.cli.entry import main
from verirl.cli.parser import build_parser

__all__ = ["EXIT_CODES", "GRPO_KWARGS_VARIABLE", "build_parser", "main"]

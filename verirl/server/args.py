"""The vLLM server's flags, built in one place for the topology and the server.

They are spelled as ``trl vllm-serve`` takes them: `verirl.VLLMServer` passes
them to ``trl vllm-serve`` (TRL 0.2x), to TRL's own parser (TRL 1.x, whose
``build_command`` makes vLLM's command line) or to ``command=``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol


def vllm_serve_args(
    model: str,
    *,
    host: str,
    port: int,
    gpu_memory_utilization: float,
    max_model_len: int | None = None,
    tensor_parallel_size: int = 1,
    data_parallel_size: int = 1,
    extra_args: Sequence[str] = (),
) -> list[str]:
    """Return the server's flags (dash spellings, which trl and vLLM accept)."""
    args = [
        "--model",
        model,
        "--host",
        host,
        "--port",
        str(port),
        "--gpu-memory-utilization",
        repr(float(gpu_memory_utilization)),
    ]
    if max_model_len is not None:
        args += ["--max-model-len", str(max_model_len)]
    args += [
        "--tensor-parallel-size",
        str(tensor_parallel_size),
        "--data-parallel-size",
        str(data_parallel_size),
    ]
    args += list(extra_args)
    return args


class ServerLayout(Protocol):
    """What the server's flags are made of: a topology's server, or a `verirl.VLLMServer`."""

    @property
    def host(self) -> str: ...  # noqa: D102 - named by the class docstring
    @property
    def port(self) -> int: ...  # noqa: D102 - named by the class docstring
    @property
    def gpu_memory_utilization(self) -> float: ...  # noqa: D102 - named by the class docstring
    @property
    def max_model_len(self) -> int | None: ...  # noqa: D102 - named by the class docstring
    @property
    def tensor_parallel_size(self) -> int: ...  # noqa: D102 - named by the class docstring
    @property
    def data_parallel_size(self) -> int: ...  # noqa: D102 - named by the class docstring


def serve_args_of(model: str, layout: ServerLayout, extra_args: Sequence[str] = ()) -> list[str]:
    """`vllm_serve_args` for ``layout``'s host, port, memory, length and parallel sizes."""
    return vllm_serve_args(
        model,
        host=layout.host,
        port=layout.port,
        gpu_memory_utilization=layout.gpu_memory_utilization,
        max_model_len=layout.max_model_len,
        tensor_parallel_size=layout.tensor_parallel_size,
        data_parallel_size=layout.data_parallel_size,
        extra_args=extra_args,
    )


OWN_FLAGS = (
    "--model",
    "--host",
    "--port",
    "--gpu-memory-utilization",
    "--max-model-len",
    "--tensor-parallel-size",
    "--data-parallel-size",
)
"""The flags `vllm_serve_args` sets: verirl waits on them, so extra flags must not change them."""

PLAN_FLAGS = {
    "--pipeline-parallel-size": "verirl plans the server's GPUs as tensor x data parallel",
    "--data-parallel-size-local": "verirl plans the server's GPUs as tensor x data parallel",
    "--uds": "the server would listen on a socket, not on the port verirl waits on",
    "--headless": "the server would run no API server, and verirl waits on its /health",
    "--ssl-keyfile": "the server would answer HTTPS only, and verirl waits on plain HTTP",
    "--ssl-certfile": "the server would answer HTTPS only, and verirl waits on plain HTTP",
}
"""Flags verirl does not set but that break its plan or its wait: refused like `OWN_FLAGS`."""

_OWN_SHORT = {  # vLLM's aliases
    "-tp": "--tensor-parallel-size",
    "-dp": "--data-parallel-size",
    "-pp": "--pipeline-parallel-size",
    "-dpl": "--data-parallel-size-local",
}


def own_flag_reason(flag: str) -> str:
    """Why `own_flag`'s ``flag`` is refused, for an error message."""
    return PLAN_FLAGS.get(flag, "verirl sets it itself and waits on it")


_MIN_ABBREVIATION = 3  # "--p": TRL's parser takes it for --port (its only flag in p)


def own_flag(extra_args: Sequence[str]) -> tuple[str, str] | None:
    """The first of ``extra_args`` setting one of `OWN_FLAGS`/`PLAN_FLAGS`: (as written, the flag).

    Spelled any way the servers' parsers take it: ``--port 9``, ``--port=9``,
    ``--max_model_len``, an abbreviation (``--po``), vLLM's ``-tp``/``-dp``.
    Decided on the words alone, so the answer is the same whether or not
    vLLM or TRL is installed.
    """
    for arg in extra_args:
        name = arg.split("=", 1)[0]
        if name in _OWN_SHORT:
            return name, _OWN_SHORT[name]
        if not name.startswith("--") or len(name) < _MIN_ABBREVIATION:
            continue
        spelled = "--" + name[2:].replace("_", "-")
        refused = (*OWN_FLAGS, *PLAN_FLAGS)
        exact = [flag for flag in refused if flag == spelled]
        matches = exact or [flag for flag in refused if flag.startswith(spelled)]
        if matches:
            return name, matches[0]
    return None

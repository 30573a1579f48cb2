"""The vLLM server's flags, built in one place for the topology and the server.

They are spelled as ``trl vllm-serve`` takes them: `verirl.VLLMServer` passes
them to ``trl vllm-serve`` (TRL 0.2x), to TRL's own parser (TRL 1.x, whose
``build_command`` makes vLLM's command line) or to ``command=``.
"""

from __future__ import annotations

from collections.abc import Sequence


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

"""`VLLMTopology.plan`'s arguments, each checked as it is set and named in its error.

The modes (`MODES`), one converter per field, and the derivation of the
parallel layout from what was given; `verirl.topology` lays the GPUs out
from them.
"""

from __future__ import annotations

from typing import Literal

import attrs

from verirl._validate import (
    MAX_GPUS,
    MAX_LENGTH,
    check_host,
    check_int,
    check_number,
    check_port,
    check_seconds,
)
from verirl.errors import ConfigError

__all__ = ["MODES", "Mode", "PlanInputs", "check_mode", "none_left_to_train"]

Mode = Literal["server", "colocate"]
MODES = ("auto", "server", "colocate")
"""The ``mode`` values `VLLMTopology.plan` takes (so do ``--mode`` and ``VERIRL_VLLM_MODE``)."""


# Converters of `VLLMTopology.plan`'s arguments: each checks one field and names it.


def _gpu_count(value: object) -> int:
    return check_int("gpu_count", value, 1, MAX_GPUS)


def _max_model_len(value: object) -> int:
    return check_int("max_model_len", value, 1, MAX_LENGTH)


def check_mode(field: str, value: object) -> str:
    """``value`` if it is one of `MODES`, else a `ConfigError` naming ``field``."""
    if value not in MODES:
        raise ConfigError.invalid(field, value, f"must be one of {', '.join(MODES)}")
    return str(value)


def _mode(value: object) -> str:
    return check_mode("mode", value)


def _data_parallel_size(value: object) -> int:
    return check_int("data_parallel_size", value, 1, MAX_GPUS)


def _tensor_parallel_size(value: object) -> int | None:
    return None if value is None else check_int("tensor_parallel_size", value, 1, MAX_GPUS)


def _vllm_gpus(value: object) -> int | None:
    return None if value is None else check_int("vllm_gpus", value, 1, MAX_GPUS)


def _port(value: object) -> int:
    return check_port("port", value)


def _host(value: object) -> str:
    return check_host("host", value)


def _remote_host(value: object) -> str | None:
    return None if value is None else check_host("remote_host", value)


def _server_timeout(value: object) -> float:
    return check_seconds("server_timeout", value, positive=True)


def _memory(value: object) -> float | None:
    if value is None:
        return None
    return check_number("gpu_memory_utilization", value, positive=True, at_most=1.0)


@attrs.frozen(kw_only=True)
class PlanInputs:
    """`VLLMTopology.plan`'s arguments, each checked as it is set (in this order)."""

    gpu_count: int = attrs.field(converter=_gpu_count)
    max_model_len: int = attrs.field(converter=_max_model_len)
    mode: str = attrs.field(converter=_mode)
    data_parallel_size: int = attrs.field(converter=_data_parallel_size)
    tensor_parallel_size: int | None = attrs.field(converter=_tensor_parallel_size)
    vllm_gpus: int | None = attrs.field(converter=_vllm_gpus)
    port: int = attrs.field(converter=_port)
    host: str = attrs.field(converter=_host)
    remote_host: str | None = attrs.field(converter=_remote_host)
    server_timeout: float = attrs.field(converter=_server_timeout)
    gpu_memory_utilization: float | None = attrs.field(converter=_memory)
    dedicated: bool = attrs.field(default=False)

    def parallel_layout(self) -> tuple[int, int]:
        """``(tensor_parallel_size, vllm_gpus)``, each derived from the other when unset.

        On a dedicated node vLLM's GPUs default to all of them.
        """
        dp = self.data_parallel_size
        tensor_parallel = self.tensor_parallel_size
        if tensor_parallel is None and self.vllm_gpus is None and self.dedicated:
            if self.gpu_count % dp:
                raise ConfigError.invalid(
                    "data_parallel_size", dp,
                    f"must divide the {self.gpu_count} GPU(s) of a dedicated vLLM node",
                )  # fmt: skip
            tensor_parallel = self.gpu_count // dp
        if tensor_parallel is None:
            if self.vllm_gpus is not None and self.vllm_gpus % dp:
                raise ConfigError.invalid(
                    "vllm_gpus",
                    self.vllm_gpus,
                    f"must be a multiple of the data-parallel size {dp}",
                )
            tensor_parallel = 1 if self.vllm_gpus is None else self.vllm_gpus // dp
        parallel = tensor_parallel * dp
        if self.vllm_gpus is not None and self.vllm_gpus != parallel:
            raise ConfigError.invalid(
                "vllm_gpus",
                self.vllm_gpus,
                f"must equal the tensor-parallel size times the data-parallel size "
                f"({tensor_parallel} x {dp} = {parallel})",
            )
        return tensor_parallel, parallel

    def chosen_mode(self) -> Mode:
        """``auto``: server with a remote host or two GPUs or more, else colocate."""
        if self.mode == "auto":
            two_or_more = self.gpu_count >= 2  # noqa: PLR2004 - one to train, one to serve
            return "server" if self.remote_host is not None or two_or_more else "colocate"
        return "server" if self.mode == "server" else "colocate"


def none_left_to_train(wanted: PlanInputs, tensor_parallel: int, vllm_gpus: int) -> ConfigError:
    """Server mode with every GPU for vLLM: the error names the setting that gave them.

    The GPU count, beside a vLLM GPU count given as such; the parallel size
    that made vLLM's count when none was.
    """
    dp = wanted.data_parallel_size
    advice = "server mode trains on at least one; use mode='colocate' or fewer vLLM GPUs"
    if wanted.vllm_gpus is None and (wanted.tensor_parallel_size is not None or dp > 1):
        field, value = (
            ("tensor_parallel_size", tensor_parallel)
            if wanted.tensor_parallel_size is not None
            else ("data_parallel_size", dp)
        )
        return ConfigError.invalid(
            field,
            value,
            f"gives vLLM {vllm_gpus} GPUs (tensor-parallel {tensor_parallel} x data-parallel "
            f"{dp}), leaving none of the {wanted.gpu_count} to train, and {advice}",
        )
    return ConfigError.invalid(
        "gpu_count",
        wanted.gpu_count,
        f"server mode needs more GPUs than the {vllm_gpus} given to vLLM (at least one must "
        "train); use mode='colocate' or fewer vLLM GPUs",
    )

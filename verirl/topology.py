"""Lay a machine's GPUs out between training and vLLM generation.

The old helper put vLLM on GPU 1 and training on GPU 0, leaving GPUs 2..N idle.
`VLLMTopology.plan` gives vLLM the last GPU(s) and training every other one, or
colocates both on a single GPU, and hands `trl.GRPOConfig` the matching
``vllm_*`` settings under the field names of the installed TRL.
"""

from __future__ import annotations

import importlib.metadata
import logging
import re
from typing import Literal, Protocol

import attrs

from verirl import _defaults as defaults
from verirl._fs import quoted
from verirl._gpus import check_visible_gpus, detect_gpu_count
from verirl._net import connect_host, url_host
from verirl._validate import (
    MAX_GPUS,
    MAX_LENGTH,
    check_host,
    check_int,
    check_number,
    check_port,
    check_seconds,
    check_text,
    has_control_chars,
)
from verirl.errors import ConfigError
from verirl.server.args import serve_args_of

__all__ = [
    "COLOCATE_MAX_MODEL_LEN",
    "MODES",
    "TRL_GROUP_PORT",
    "ServerTopology",
    "VLLMTopology",
    "check_local_server",
    "check_mode",
    "check_visible_gpus",
    "detect_gpu_count",
    "max_model_len_field",
]

log = logging.getLogger(__name__)

Mode = Literal["server", "colocate"]
MODES = ("auto", "server", "colocate")
"""The ``mode`` values `VLLMTopology.plan` takes (so do ``--mode`` and ``VERIRL_VLLM_MODE``)."""

COLOCATE_MAX_MODEL_LEN = 8192
"""Colocated vLLM shares the training GPU, so its KV cache length is capped here."""

TRL_GROUP_PORT = 51216
"""TRL's default ``vllm_group_port`` (the NCCL weight-sync group)."""


def _parse_version(version: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", version)[:3])


def max_model_len_field(trl_version: str | None = None) -> str:
    """The GRPOConfig field for vLLM's max length: ``vllm_max_model_length`` since TRL 0.26.

    Read from the installed distribution's metadata, so TRL is not imported.
    With no TRL installed the current spelling is used.
    """
    if trl_version is None:
        try:
            trl_version = importlib.metadata.version("trl")
        except importlib.metadata.PackageNotFoundError:
            return "vllm_max_model_length"
    if _parse_version(trl_version) < (0, 26):
        return "vllm_max_model_len"
    return "vllm_max_model_length"


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
class _PlanInputs:
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


def _none_left_to_train(wanted: _PlanInputs, tensor_parallel: int, vllm_gpus: int) -> ConfigError:
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


@attrs.frozen
class VLLMTopology:
    """Which local GPUs train, which serve vLLM, and how TRL reaches the server.

    Build it with `plan`. ``training_devices`` and ``vllm_devices`` are indices
    into the GPUs this process sees (the numbering torch uses). In colocate
    mode both are the same GPU(s); with a remote vLLM host ``vllm_devices`` is
    empty and training takes every local GPU.
    """

    mode: Mode
    gpu_count: int
    training_devices: tuple[int, ...]
    vllm_devices: tuple[int, ...]
    max_model_len: int
    gpu_memory_utilization: float
    tensor_parallel_size: int = 1
    data_parallel_size: int = 1
    host: str = "127.0.0.1"
    port: int = defaults.VLLM_PORT
    remote_host: str | None = None
    server_timeout: float = 240.0

    @classmethod
    def plan(
        cls,
        gpu_count: int,
        *,
        max_model_len: int,
        mode: str = defaults.MODE,
        vllm_gpus: int | None = None,
        tensor_parallel_size: int | None = None,
        data_parallel_size: int = 1,
        gpu_memory_utilization: float | None = None,
        host: str = "127.0.0.1",
        port: int = defaults.VLLM_PORT,
        remote_host: str | None = None,
        server_timeout: float = 240.0,
        dedicated: bool = False,
    ) -> VLLMTopology:
        """Plan the layout for ``gpu_count`` local GPUs.

        ``mode="auto"``: two or more GPUs → server mode with vLLM on the last
        ``vllm_gpus`` (default ``tensor_parallel_size * data_parallel_size``,
        i.e. one) and training on all the others; one GPU → colocate with half
        the memory and ``max_model_len`` capped at 8192. ``remote_host`` means
        vLLM runs elsewhere (multi-node): server mode, no local vLLM GPUs.
        ``dedicated=True`` plans a node that only serves (the vLLM node of a
        multi-node job): server mode, vLLM on the first ``vllm_gpus`` GPUs
        (default: all of them, ``tensor_parallel_size`` = GPUs /
        ``data_parallel_size``), nothing trains.
        Bad input raises `ConfigError` naming the field and value.
        """
        if not isinstance(dedicated, bool):
            raise ConfigError.invalid("dedicated", dedicated, "must be True or False")
        wanted = _PlanInputs(
            gpu_count=gpu_count,
            max_model_len=max_model_len,
            mode=mode,
            data_parallel_size=data_parallel_size,
            tensor_parallel_size=tensor_parallel_size,
            vllm_gpus=vllm_gpus,
            port=port,
            host=host,
            remote_host=remote_host,
            server_timeout=server_timeout,
            gpu_memory_utilization=gpu_memory_utilization,
            dedicated=dedicated,
        )
        tensor_parallel, serving_gpus = wanted.parallel_layout()
        if dedicated:
            return cls._dedicated(wanted, tensor_parallel, serving_gpus)
        if wanted.chosen_mode() == "colocate":
            return cls._colocate(wanted, tensor_parallel)
        return cls._server(wanted, tensor_parallel, serving_gpus)

    @classmethod
    def _colocate(cls, wanted: _PlanInputs, tensor_parallel: int) -> VLLMTopology:
        if wanted.remote_host is not None:
            raise ConfigError.invalid(
                "mode",
                wanted.mode,
                f"runs vLLM in-process, so a remote vLLM host ({wanted.remote_host}) "
                "cannot be used",
            )
        if wanted.data_parallel_size != 1:
            raise ConfigError.invalid(
                "data_parallel_size", wanted.data_parallel_size, "colocate mode supports only 1"
            )
        if tensor_parallel > wanted.gpu_count:
            raise ConfigError.invalid(
                "tensor_parallel_size",
                tensor_parallel,
                f"exceeds the {wanted.gpu_count} GPU(s) to colocate on",
            )
        all_gpus = tuple(range(wanted.gpu_count))
        if wanted.max_model_len > COLOCATE_MAX_MODEL_LEN:
            log.warning(
                "colocate mode caps vLLM's max model length at %d: max_model_len=%d is not used "
                "(vLLM shares the training GPU; use server mode, 2 or more GPUs, for longer)",
                COLOCATE_MAX_MODEL_LEN,
                wanted.max_model_len,
            )
        return cls(
            mode="colocate",
            gpu_count=wanted.gpu_count,
            training_devices=all_gpus,
            vllm_devices=all_gpus,
            max_model_len=min(wanted.max_model_len, COLOCATE_MAX_MODEL_LEN),
            gpu_memory_utilization=wanted.gpu_memory_utilization or defaults.COLOCATE_MEMORY,
            tensor_parallel_size=tensor_parallel,
            data_parallel_size=1,
            host=wanted.host,
            port=wanted.port,
            remote_host=None,
            server_timeout=wanted.server_timeout,
        )

    @classmethod
    def _dedicated(cls, wanted: _PlanInputs, tensor_parallel: int, vllm_gpus: int) -> VLLMTopology:
        if wanted.mode == "colocate":
            raise ConfigError.invalid(
                "mode", wanted.mode, "a dedicated vLLM node serves; colocate trains beside vLLM"
            )
        if wanted.remote_host is not None:
            raise ConfigError.invalid(
                "remote_host", wanted.remote_host, "a dedicated vLLM node runs the server itself"
            )
        if vllm_gpus > wanted.gpu_count:
            if wanted.vllm_gpus is None:  # tensor-parallel times data-parallel size, as given
                raise ConfigError.invalid(
                    "tensor_parallel_size",
                    tensor_parallel,
                    f"times the data-parallel size {wanted.data_parallel_size} is {vllm_gpus} "
                    f"GPUs, more than the node's {wanted.gpu_count}",
                )
            raise ConfigError.invalid(
                "vllm_gpus", vllm_gpus, f"exceeds the node's {wanted.gpu_count} GPU(s)"
            )
        if vllm_gpus < wanted.gpu_count:  # allowed (a GPU kept for something else), never silent
            log.warning(
                "this dedicated vLLM node serves on %d of its %d GPUs (tensor-parallel %d x "
                "data-parallel %d): GPUs %s stay idle, as nothing trains here; to serve on all "
                "of them, choose a tensor-parallel and a data-parallel size whose product is %d "
                "(and leave the vLLM GPU count unset)",
                vllm_gpus,
                wanted.gpu_count,
                tensor_parallel,
                wanted.data_parallel_size,
                ",".join(str(gpu) for gpu in range(vllm_gpus, wanted.gpu_count)),
                wanted.gpu_count,
            )
        return cls._server_mode(wanted, tensor_parallel, (), tuple(range(vllm_gpus)))

    @classmethod
    def _server(cls, wanted: _PlanInputs, tensor_parallel: int, vllm_gpus: int) -> VLLMTopology:
        all_gpus = tuple(range(wanted.gpu_count))
        training: tuple[int, ...] = all_gpus
        serving: tuple[int, ...] = ()
        if wanted.remote_host is None:
            if vllm_gpus >= wanted.gpu_count:
                raise _none_left_to_train(wanted, tensor_parallel, vllm_gpus)
            training, serving = all_gpus[:-vllm_gpus], all_gpus[-vllm_gpus:]
        return cls._server_mode(wanted, tensor_parallel, training, serving)

    @classmethod
    def _server_mode(
        cls,
        wanted: _PlanInputs,
        tensor_parallel: int,
        training: tuple[int, ...],
        serving: tuple[int, ...],
    ) -> VLLMTopology:
        if wanted.port == TRL_GROUP_PORT:
            raise ConfigError.invalid(
                "port",
                wanted.port,
                "is TRL's weight-sync group port (vllm_group_port) on the vLLM server's host; "
                "choose another port for the server",
            )
        return cls(
            mode="server",
            gpu_count=wanted.gpu_count,
            training_devices=training,
            vllm_devices=serving,
            max_model_len=wanted.max_model_len,
            gpu_memory_utilization=wanted.gpu_memory_utilization or defaults.SERVER_MEMORY,
            tensor_parallel_size=tensor_parallel,
            data_parallel_size=wanted.data_parallel_size,
            host=wanted.host,
            port=wanted.port,
            remote_host=wanted.remote_host,
            server_timeout=wanted.server_timeout,
        )

    @property
    def is_local_server(self) -> bool:
        """True when this machine must run the vLLM server itself."""
        return self.mode == "server" and self.remote_host is None

    @property
    def server_host(self) -> str:
        """The host the trainer connects to: the remote host, or the local bind address.

        A wildcard bind is reached over loopback of the same family, as
        `verirl.VLLMServer` itself does: ``0.0.0.0`` → ``127.0.0.1``, ``::`` → ``::1``.
        """
        if self.remote_host is not None:
            return self.remote_host
        return connect_host(self.host)

    @property
    def server_url(self) -> str | None:
        """``http://host:port`` of the vLLM server in server mode, else ``None``."""
        if self.mode != "server":
            return None
        return f"http://{url_host(self.server_host)}:{self.port}"

    def grpo_kwargs(self, *, trl_version: str | None = None) -> dict[str, object]:
        """Keyword arguments for `trl.GRPOConfig`, spelled as the installed TRL expects."""
        if self.mode == "colocate":
            return {
                "use_vllm": True,
                "vllm_mode": "colocate",
                "vllm_gpu_memory_utilization": self.gpu_memory_utilization,
                max_model_len_field(trl_version): self.max_model_len,
                "vllm_tensor_parallel_size": self.tensor_parallel_size,
            }
        return {
            "use_vllm": True,
            "vllm_mode": "server",
            "vllm_server_host": self.server_host,
            "vllm_server_port": self.port,
            "vllm_server_timeout": self.server_timeout,
            # Read by TRL only when colocating; kept so both modes state the length.
            max_model_len_field(trl_version): self.max_model_len,
        }

    def serve_args(self, model: str) -> list[str]:
        """The server's flags (``trl vllm-serve`` spelling) that start this topology's server."""
        if not self.is_local_server:
            raise ConfigError.invalid(
                "mode",
                self.mode if self.remote_host is None else f"server@{self.remote_host}",
                "only a local server-mode topology starts a vLLM server",
            )
        check_text("model", model, "a non-empty model id or path")
        if not model.strip() or has_control_chars(model):
            raise ConfigError.invalid(
                "model", model, "must be a model id or path, not blank, without control characters"
            )
        return serve_args_of(model, self)

    def describe(self) -> str:
        """One line for logs, e.g. ``server: train on GPUs 0,1,2 · vLLM on GPU 3 (…)``."""

        def gpus(devices: tuple[int, ...]) -> str:
            label = "GPU" if len(devices) == 1 else "GPUs"
            return f"{label} {','.join(map(str, devices))}"

        if self.mode == "colocate":
            return (
                f"colocate: train and vLLM share {gpus(self.training_devices)} "
                f"(vLLM memory {self.gpu_memory_utilization:.0%}, "
                f"max_model_len {self.max_model_len}, tp {self.tensor_parallel_size})"
            )
        if self.remote_host is not None:
            return (
                f"server: train on {gpus(self.training_devices)} · vLLM remote at {self.server_url}"
            )
        training = (
            f"train on {gpus(self.training_devices)}"
            if self.training_devices
            else ("dedicated vLLM node (nothing trains here)")
        )
        return (
            f"server: {training} · vLLM on {gpus(self.vllm_devices)} "
            f"(tp {self.tensor_parallel_size} × dp {self.data_parallel_size}, "
            f"memory {self.gpu_memory_utilization:.0%}, max_model_len {self.max_model_len}) "
            f"at {self.server_url}"
        )


class ServerTopology(Protocol):
    """What `VLLMServer.from_topology` reads; `verirl.VLLMTopology` provides it."""

    @property
    def mode(self) -> str:
        """``"server"`` or ``"colocate"``."""

    @property
    def is_local_server(self) -> bool:
        """Whether this machine runs the vLLM server itself."""

    @property
    def vllm_devices(self) -> tuple[int, ...]:
        """GPU indices (as this process numbers them) for vLLM."""

    @property
    def host(self) -> str:
        """Address the server binds."""

    @property
    def port(self) -> int:
        """Port the server binds."""

    @property
    def max_model_len(self) -> int:
        """The ``--max-model-len`` flag."""

    @property
    def gpu_memory_utilization(self) -> float:
        """The ``--gpu-memory-utilization`` flag."""

    @property
    def tensor_parallel_size(self) -> int:
        """The ``--tensor-parallel-size`` flag."""

    @property
    def data_parallel_size(self) -> int:
        """The ``--data-parallel-size`` flag."""


def check_local_server(topology: ServerTopology) -> None:
    """Raise `ConfigError` unless ``topology`` runs a vLLM server on this machine.

    In colocate mode TRL runs vLLM inside the trainer; with a remote host the
    server runs there.
    """
    if topology.is_local_server:
        return
    remote = getattr(topology, "remote_host", None)
    if remote:
        raise ConfigError.invalid(
            "topology.remote_host",
            remote,
            f"vLLM runs on that host (mode={quoted(topology.mode)}); no local server to start",
        )
    raise ConfigError.invalid(
        "topology.mode",
        topology.mode,
        "only server mode runs a local vLLM server "
        "(in colocate mode TRL runs vLLM inside the trainer)",
    )

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
from typing import Protocol

import attrs

from verirl import _defaults as defaults
from verirl._fs import quoted
from verirl._gpus import check_visible_gpus, detect_gpu_count
from verirl._net import connect_host, url_host
from verirl._plan_inputs import MODES, Mode, PlanInputs, check_mode, none_left_to_train
from verirl._validate import check_text, has_control_chars
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
        wanted = PlanInputs(
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
    def _colocate(cls, wanted: PlanInputs, tensor_parallel: int) -> VLLMTopology:
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
        # named as given: vllm_gpus is colocate's tensor parallel size
        given = "vllm_gpus" if wanted.tensor_parallel_size is None else "tensor_parallel_size"
        if tensor_parallel > wanted.gpu_count:
            raise ConfigError.invalid(
                given, tensor_parallel, f"exceeds the {wanted.gpu_count} GPU(s) to colocate on"
            )
        if wanted.gpu_count % tensor_parallel:  # TRL refuses it only once training started
            raise ConfigError.invalid(
                given,
                tensor_parallel,
                f"must divide the {wanted.gpu_count} training processes evenly (one per GPU): "
                "TRL groups them by it, each group running one vLLM",
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
    def _dedicated(cls, wanted: PlanInputs, tensor_parallel: int, vllm_gpus: int) -> VLLMTopology:
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
    def _server(cls, wanted: PlanInputs, tensor_parallel: int, vllm_gpus: int) -> VLLMTopology:
        all_gpus = tuple(range(wanted.gpu_count))
        training: tuple[int, ...] = all_gpus
        serving: tuple[int, ...] = ()
        if wanted.remote_host is None:
            if vllm_gpus >= wanted.gpu_count:
                raise none_left_to_train(wanted, tensor_parallel, vllm_gpus)
            training, serving = all_gpus[:-vllm_gpus], all_gpus[-vllm_gpus:]
        return cls._server_mode(wanted, tensor_parallel, training, serving)

    @classmethod
    def _server_mode(
        cls,
        wanted: PlanInputs,
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

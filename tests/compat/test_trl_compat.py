"""What verirl hands the real TRL is what TRL accepts (run by `nox -s compat`)."""

from __future__ import annotations

import dataclasses

import pytest
import trl
from trl.scripts.vllm_serve import ScriptArguments

from verirl import VLLMServer, VLLMTopology
from verirl.server.args import vllm_serve_args

# trl's own GRPOConfig sets a deprecated transformers field; not something verirl passes.
pytestmark = pytest.mark.filterwarnings(
    "ignore:`gradient_checkpointing` is deprecated:FutureWarning"
)

LAYOUTS = [
    pytest.param({"gpu_count": 1}, id="1gpu-colocate"),
    pytest.param({"gpu_count": 2}, id="2gpu-server"),
    pytest.param({"gpu_count": 8}, id="8gpu-server"),
    pytest.param(
        {"gpu_count": 8, "tensor_parallel_size": 2, "data_parallel_size": 2}, id="8gpu-tp2dp2"
    ),
    pytest.param(
        {"gpu_count": 4, "mode": "colocate", "tensor_parallel_size": 2}, id="4gpu-colocate"
    ),
    pytest.param({"gpu_count": 4, "remote_host": "vllm-node", "port": 9000}, id="remote"),
]


def parse_serve_args(args: list[str]) -> ScriptArguments:
    (parsed,) = trl.TrlParser(ScriptArguments).parse_args_and_config(args)
    return parsed


@pytest.mark.parametrize("layout", LAYOUTS)
def test_grpo_config_accepts_grpo_kwargs(layout, tmp_path):
    topology = VLLMTopology.plan(max_model_len=16384, **layout)
    kwargs = topology.grpo_kwargs()
    fields = {f.name for f in dataclasses.fields(trl.GRPOConfig)}
    assert set(kwargs) <= fields, set(kwargs) - fields
    config = trl.GRPOConfig(output_dir=str(tmp_path), use_cpu=True, bf16=False, **kwargs)
    for name, value in kwargs.items():
        assert getattr(config, name) == value, name


@pytest.mark.parametrize("layout", LAYOUTS[1:4])
def test_serve_args_parse_with_trls_own_parser(layout):
    topology = VLLMTopology.plan(max_model_len=4096, **layout)
    parsed = parse_serve_args(topology.serve_args("Qwen/Qwen3-0.6B"))
    assert parsed.model == "Qwen/Qwen3-0.6B"
    assert parsed.host == "127.0.0.1"
    assert parsed.port == 8001
    assert parsed.gpu_memory_utilization == topology.gpu_memory_utilization
    assert parsed.max_model_len == 4096
    assert parsed.tensor_parallel_size == topology.tensor_parallel_size
    assert parsed.data_parallel_size == topology.data_parallel_size


def test_extra_args_parse_too():
    args = vllm_serve_args(
        "m",
        host="0.0.0.0",
        port=8123,
        gpu_memory_utilization=0.85,
        extra_args=["--enforce-eager", "True", "--dtype", "bfloat16"],
    )
    parsed = parse_serve_args(args)
    assert (parsed.port, parsed.enforce_eager, parsed.dtype) == (8123, True, "bfloat16")
    assert parsed.max_model_len is None


def test_vllm_server_argv_parses_with_trls_own_parser():
    server = VLLMServer(
        "Qwen/Qwen3-0.6B",
        port=8123,
        devices=(2, 3),
        max_model_len=2048,
        gpu_memory_utilization=0.8,
        tensor_parallel_size=2,
        extra_args=("--enable-prefix-caching", "True"),
    )
    parsed = parse_serve_args(list(server.serve_args))
    assert (parsed.model, parsed.host, parsed.port) == ("Qwen/Qwen3-0.6B", "127.0.0.1", 8123)
    assert (parsed.max_model_len, parsed.tensor_parallel_size) == (2048, 2)
    assert parsed.gpu_memory_utilization == 0.8
    assert parsed.enable_prefix_caching is True


def test_the_default_launch_is_what_trls_build_command_builds():
    from trl.scripts.vllm_serve import build_command

    from verirl.server.launch import VLLMInstall, import_trl_serve, plan_launch

    server = VLLMServer(
        "Qwen/Qwen3-0.6B",
        port=8123,
        max_model_len=4096,
        tensor_parallel_size=2,
        extra_args=["--enforce_eager", "true", "--dtype", "bfloat16", "--served-model-name", "p"],
    )
    trl_serve = import_trl_serve()
    assert trl_serve is not None
    assert trl_serve.build_command is not None  # trl 1.x
    plan = plan_launch(
        server.serve_args,
        command=None,
        environ={},
        trl=trl_serve,
        vllm=VLLMInstall("vllm", "0.31.0"),
    )
    expected = ScriptArguments(
        model="Qwen/Qwen3-0.6B",
        host="127.0.0.1",
        port=8123,
        max_model_len=4096,
        tensor_parallel_size=2,
        gpu_memory_utilization=0.9,
        enforce_eager=True,
        dtype="bfloat16",
    )
    assert list(plan.argv) == build_command(expected, ["--served-model-name", "p"])
    assert plan.env["VLLM_SERVER_DEV_MODE"] == "1"


def test_the_default_launch_without_vllm_says_how_to_install_it():
    from verirl import VLLMServerError
    from verirl.server.launch import INSTALL_HINT

    with pytest.raises(VLLMServerError, match="vllm is not installed") as caught:
        VLLMServer("m").launch_plan()
    assert INSTALL_HINT in str(caught.value)


def _plan(server: VLLMServer, extra: tuple[str, ...] | list[str] = ()):
    """The launch plan through TRL's real parser; ``extra`` after the server's own flags.

    ``extra`` bypasses `VLLMServer`'s own check of ``extra_args`` (which refuses
    verirl's own flags first): what TRL's parser makes of them is checked too.
    """
    from verirl.server.launch import VLLMInstall, import_trl_serve, plan_launch

    return plan_launch(
        [*server.serve_args, *extra],
        command=None,
        environ={},
        trl=import_trl_serve(),
        vllm=VLLMInstall("vllm", "0.31.0"),
        own={"port": server.port, "model": server.model, "host": server.host},
    )


@pytest.mark.parametrize("extra", [["--po", "9999"], ["--mod", "x"], ["--port=9"]])
def test_trls_abbreviations_cannot_move_the_port_or_the_model(extra):
    from verirl import ConfigError

    with pytest.raises(ConfigError, match=r"^extra_args=.*which verirl sets itself"):
        VLLMServer("m", port=8123, extra_args=extra)  # refused before any parser runs
    with pytest.raises(ConfigError, match=r"pass (port|model)= instead"):
        _plan(VLLMServer("m", port=8123), extra)  # and by TRL's parser behind it


def test_trls_parser_prints_nothing_and_hides_the_flags(capsys):
    from verirl import ConfigError

    for extra in (["--help"], ["--api-key", "sk-SECRET123", "--port", "x"]):
        with pytest.raises(ConfigError) as caught:
            _plan(VLLMServer("m"), extra)
        assert "sk-SECRET123" not in str(caught.value)
    assert "invalid int value: 'x'" in str(caught.value)
    assert capsys.readouterr() == ("", "")


def test_plans_from_many_threads_leave_stderr_and_the_warnings_filters_alone():
    import sys
    import threading
    import warnings

    from verirl import ConfigError

    stderr, filters = sys.stderr, list(warnings.filters)
    errors: list[BaseException] = []

    def plan_some(index: int) -> None:
        extra = ["--port", "x"] if index % 2 else ["--enforce-eager"]
        for _ in range(5):
            try:
                _plan(VLLMServer("m", extra_args=extra))
            except ConfigError:
                pass
            except BaseException as exc:  # noqa: BLE001 - reported below
                errors.append(exc)

    threads = [threading.Thread(target=plan_some, args=(i,)) for i in range(16)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert errors == []
    assert sys.stderr is stderr
    assert warnings.filters == filters

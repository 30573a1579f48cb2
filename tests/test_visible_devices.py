"""Class: devices. ``CUDA_VISIBLE_DEVICES`` is read the way torch reads it, or refused.

torch (``torch.cuda._parse_visible_devices``, quoted below as the oracle from
torch 2.x's ``torch/cuda/__init__.py``) reads a list of ``GPU-``/``MIG-``
UUIDs, else ordinals read like ``strtoul`` (``1gpu2`` is 1), up to the first
entry that is not one; empty, ``-1`` first, or a repeated entry hide every
GPU. Swept with open-ended values over every place verirl reads it: the GPU
count detected without torch, the mapping of device indices for the vLLM
server and the training command, and a GPU count given (``--gpus``,
``VERIRL_GPU_COUNT``, ``gpu_count=``) that the variable hides, which is a
`ConfigError` naming both, never a plan for GPUs that are not there.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from verirl import ConfigError, TrainingRuntime, VLLMTopology, detect_gpu_count
from verirl.server.child_env import map_visible_devices, parse_visible_devices


def torch_parse(var: str) -> list[int] | list[str]:  # noqa: C901 - torch's own code
    """torch's ``_parse_visible_devices`` for ``CUDA_VISIBLE_DEVICES=var`` (CUDA, not ROCm)."""

    def _strtoul(s: str) -> int:
        if not s:
            return -1
        for idx, c in enumerate(s):
            if not (c.isdigit() or (idx == 0 and c in "+-")):
                break
            if idx + 1 == len(s):
                idx += 1  # noqa: PLW2901 - torch's own code, as it is
        return int(s[:idx]) if idx > 0 else -1

    def parse_list_with_prefix(lst: str, prefix: str) -> list[str]:
        rcs: list[str] = []
        for elem in lst.split(","):
            if elem in rcs:
                return []
            if not elem.startswith(prefix):
                break
            rcs.append(elem)
        return rcs

    if var.startswith("GPU-"):
        return parse_list_with_prefix(var, "GPU-")
    if var.startswith("MIG-"):
        return parse_list_with_prefix(var, "MIG-")
    rc: list[int] = []
    for elem in var.split(","):
        x = _strtoul(elem.strip())
        if x in rc:
            return []
        if x < 0:
            break
        rc.append(x)
    return rc


entry = st.one_of(
    st.integers(-2, 12).map(str),
    st.sampled_from(["", " 3", "1gpu2", "+1", "-0", "GPU-a", "GPU-b", "MIG-x", "x", "٣", "+"]),
    st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=4),
)
visible_values = st.lists(entry, max_size=6).map(",".join)


@settings(max_examples=300, deadline=None)
@given(value=visible_values)
def test_the_visible_gpus_are_torchs(value):
    try:
        expected: list[str] | None = [str(item) for item in torch_parse(value)]
    except ValueError:  # torch fails on it ("+")
        expected = None
    try:
        got = parse_visible_devices(value)
    except ConfigError as exc:  # only what torch fails on, or reads as non-ASCII digits
        field = exc.field
        assert field == "CUDA_VISIBLE_DEVICES"
        assert expected is None or not value.isascii(), (value, expected)
        return
    assert expected is not None, value
    assert list(got) == expected, value


@settings(max_examples=200, deadline=None)
@given(value=visible_values)
def test_the_count_without_torch_is_torchs(value, monkeypatch_module):
    try:
        expected = len(parse_visible_devices(value))
    except ConfigError:
        with pytest.raises(ConfigError, match=r"^CUDA_VISIBLE_DEVICES="):
            detect_gpu_count(environ={"CUDA_VISIBLE_DEVICES": value})
        return
    assert detect_gpu_count(environ={"CUDA_VISIBLE_DEVICES": value}) == expected


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(sys.modules, "torch", None)  # count as on a machine without torch
        yield patch


@pytest.mark.parametrize(
    ("visible", "devices", "child"),
    [("4,5,6,7", (1,), "5"), ("GPU-a,GPU-b", (1,), "GPU-b"), ("MIG-x", (0,), "MIG-x"),
     ("1gpu2,3", (0, 1), "1,3"), (" 2 , +4", (1,), "4"), ("0,-1,1", (0,), "0")],
)  # fmt: skip
def test_devices_index_the_gpus_torch_sees(visible, devices, child):
    assert map_visible_devices(devices, visible) == child


@pytest.mark.parametrize(
    ("visible", "device"),
    [("", 0), ("-1", 0), ("0,,1", 1), ("0,0", 0), ("GPU-a,GPU-a", 0), ("0,x,1", 1), ("2,-1,3", 1)],
)
def test_an_index_torch_does_not_see_is_refused(visible, device):
    with pytest.raises(ConfigError, match=r"CUDA_VISIBLE_DEVICES="):
        map_visible_devices((device,), visible)


HIDING = ["", "-1", "0,0", "0,,1", "GPU-a,x", "1,-1,2"]  # each hides the second GPU at least


@pytest.mark.parametrize("visible", HIDING)
def test_a_given_gpu_count_that_cuda_visible_devices_hides_is_refused(visible, monkeypatch_module):
    for kwargs, environ, name in (
        ({"gpu_count": 2}, {}, "gpu_count"),
        ({}, {"VERIRL_GPU_COUNT": "2"}, "VERIRL_GPU_COUNT"),
    ):
        with pytest.raises(ConfigError) as info:
            TrainingRuntime.from_settings(
                **kwargs, environ={**environ, "CUDA_VISIBLE_DEVICES": visible}
            )
        assert str(info.value).startswith(f"{name}="), info.value
        assert f"CUDA_VISIBLE_DEVICES={visible!r}" in str(info.value)


@pytest.mark.parametrize("visible", HIDING)
@pytest.mark.parametrize("mode", ["colocate", "server"])
@pytest.mark.parametrize("through", ["environ", "process"])
def test_a_runtime_of_a_topology_planned_by_hand_refuses_gpus_that_are_hidden(
    visible, mode, through, monkeypatch
):
    """``TrainingRuntime(VLLMTopology.plan(2))``: checked at start as from_settings checks,
    before anything starts (the server factory is never called)."""
    topology = VLLMTopology.plan(2, max_model_len=64, mode=mode)

    def never(_topology: VLLMTopology) -> None:
        raise AssertionError("a server was started")

    environ: dict[str, str] | None = {"CUDA_VISIBLE_DEVICES": visible}
    if through == "process":
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
        environ = None
    runtime = TrainingRuntime(topology, environ=environ, server_factory=never)
    with pytest.raises(ConfigError) as info:
        runtime.start()
    assert str(info.value).startswith("gpu_count=2:"), info.value
    assert f"CUDA_VISIBLE_DEVICES={visible!r}" in str(info.value)


@pytest.mark.parametrize("command", ["plan", "launch"])
@pytest.mark.parametrize("visible", ["", "0,0", "GPU-a,x"])
def test_the_cli_names_the_flag_and_the_variable(command, visible):
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("VERIRL_")}
    env["CUDA_VISIBLE_DEVICES"] = visible
    tail = ["--", sys.executable, "-c", "pass"] if command == "launch" else []
    result = subprocess.run(
        [sys.executable, "-m", "verirl", command, "--gpus", "2", *tail],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert "--gpus=2" in result.stderr
    assert f"CUDA_VISIBLE_DEVICES={visible!r}" in result.stderr


@pytest.mark.parametrize(("visible", "usable"), [("+", False), ("GPU-a,,x", True), ("0,0", False)])
def test_doctor_blames_the_variable_not_torch(visible, usable):
    import os

    env = {k: v for k, v in os.environ.items() if not k.startswith("VERIRL_")}
    env["CUDA_VISIBLE_DEVICES"] = visible
    result = subprocess.run(
        [sys.executable, "-m", "verirl", "doctor"],
        env=env, capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    # "GPU-a,,x" is one GPU as torch counts (up to the empty entry): colocate, usable as launch is
    assert (result.returncode == 0) == usable, result.stderr
    assert "torch failed to load" not in result.stdout + result.stderr
    assert f"CUDA_VISIBLE_DEVICES={visible!r}" in result.stderr

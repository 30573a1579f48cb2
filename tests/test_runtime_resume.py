"""A resume request is never dropped: not by from_settings, not by a hand-built runtime."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from _support import Recorder
from verirl import (
    CheckpointNotFoundError,
    ConfigError,
    DistributedEnv,
    TrainingRuntime,
    VLLMTopology,
    find_free_port,
)


def write_checkpoint(root: Path, step: int) -> Path:
    path = root / f"checkpoint-{step}"
    path.mkdir(parents=True)
    (path / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    return path


def colocated(**kwargs) -> TrainingRuntime:
    env: dict[str, str] = {}
    return TrainingRuntime(
        VLLMTopology.plan(1, max_model_len=64),
        environ=env,
        dist_env=DistributedEnv.single_node(environ=env, master_port=find_free_port()),
        **kwargs,
    )


@pytest.mark.parametrize("request_", ["latest", "last-checkpoint"])
def test_from_settings_latest_without_sources_is_not_found(request_):
    rt = TrainingRuntime.from_settings(gpu_count=1, resume_from=request_, environ={})
    with pytest.raises(CheckpointNotFoundError, match="no sources configured"):
        rt.start()
    assert rt.session is None


def test_from_settings_latest_from_the_variable_without_sources_is_not_found():
    environ = {"VERIRL_GPU_COUNT": "1", "VERIRL_RESUME_FROM_CHECKPOINT": "latest"}
    rt = TrainingRuntime.from_settings(environ=environ)
    with pytest.raises(CheckpointNotFoundError, match="no sources configured"):
        rt.start()


def test_from_settings_explicit_path_without_sources_is_passed_on(tmp_path):
    checkpoint = write_checkpoint(tmp_path, 10)
    rt = TrainingRuntime.from_settings(gpu_count=1, resume_from=str(checkpoint), environ={})
    with rt as session:
        assert session.resume_from_checkpoint == str(checkpoint)


def test_from_settings_missing_explicit_path_without_sources_is_not_found(tmp_path):
    rt = TrainingRuntime.from_settings(
        gpu_count=1, resume_from=str(tmp_path / "checkpoint-10"), environ={}
    )
    with pytest.raises(CheckpointNotFoundError, match="checkpoint-10"):
        rt.start()


def test_hand_built_runtime_without_a_resolver_keeps_the_request(tmp_path):
    checkpoint = write_checkpoint(tmp_path, 3)
    with colocated(resume_from=str(checkpoint)) as session:
        assert session.resume_from_checkpoint == str(checkpoint)
        assert "checkpoint" in [t.name for t in session.timings]
    with pytest.raises(CheckpointNotFoundError, match="no sources configured"):
        colocated(resume_from="latest").start()
    with pytest.raises(CheckpointNotFoundError):
        colocated(resume_from=str(tmp_path / "nope")).start()


def test_hand_built_runtime_blank_request_is_a_fresh_start():
    for blank in (None, "", "  "):
        with colocated(resume_from=blank) as session:
            assert session.resume_from_checkpoint is None


@pytest.mark.parametrize("bad", [5, b"latest", ["latest"]])
def test_resume_from_must_be_text(bad):
    with pytest.raises(ConfigError, match=r"^resume_from="):
        colocated(resume_from=bad)


@pytest.mark.parametrize("request_", ["latest", " last-checkpoint "])
def test_latest_without_sources_is_refused_before_anything_starts(request_):
    """No server is launched (minutes on a GPU) only to be torn down for a request no
    source can answer; the environment is not touched either."""
    factory = Recorder()
    env: dict[str, str] = {}
    rt = TrainingRuntime(
        VLLMTopology.plan(2, max_model_len=64, port=find_free_port()),
        environ=env,
        server_factory=factory,
        resume_from=request_,
    )
    with pytest.raises(CheckpointNotFoundError, match="no sources configured"):
        rt.refuse_unfindable()
    with pytest.raises(CheckpointNotFoundError, match="no sources configured"):
        rt.start()
    assert factory.servers == []
    assert env == {}
    assert rt.session is None

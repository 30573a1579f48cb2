from __future__ import annotations

import os
import socket

import pytest

from verirl import ConfigError, DistributedEnv, find_free_port
from verirl._fs import quoted

TORCHRUN = {
    "RANK": "3",
    "LOCAL_RANK": "1",
    "WORLD_SIZE": "8",
    "LOCAL_WORLD_SIZE": "4",
    "MASTER_ADDR": "node0",
    "MASTER_PORT": "29500",
}


def test_single_node_defaults():
    env = DistributedEnv.single_node(environ={})
    v = env.variables
    assert (v["RANK"], v["LOCAL_RANK"], v["WORLD_SIZE"]) == ("0", "0", "1")
    assert v["MASTER_ADDR"] == "127.0.0.1"
    assert v["PYTORCH_CUDA_ALLOC_CONF"] == "expandable_segments:True"
    assert 1 <= int(v["MASTER_PORT"]) <= 65535
    assert env.defaulted == set(v)
    assert (env.rank, env.local_rank, env.world_size, env.is_local_main) == (0, 0, 1, True)


def test_launcher_values_win():
    env = DistributedEnv.single_node(environ=dict(TORCHRUN), master_port=1234)
    for name, value in TORCHRUN.items():
        assert env.variables[name] == value
    assert "MASTER_PORT" not in env.defaulted
    assert env.defaulted == {"PYTORCH_CUDA_ALLOC_CONF"}
    assert (env.rank, env.local_rank, env.world_size, env.is_local_main) == (3, 1, 8, False)


@pytest.mark.parametrize("name", ["PYTORCH_CUDA_ALLOC_CONF", "PYTORCH_ALLOC_CONF"])
def test_user_allocator_config_is_kept(name):
    env = DistributedEnv.single_node(environ={name: "backend:cudaMallocAsync"})
    assert env.variables[name] == "backend:cudaMallocAsync"
    assert "PYTORCH_CUDA_ALLOC_CONF" not in env.defaulted


def test_master_port_is_free_and_differs_between_jobs():
    a = int(DistributedEnv.single_node(environ={}).variables["MASTER_PORT"])
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", a))  # it really is free
    ports = {int(DistributedEnv.single_node(environ={}).variables["MASTER_PORT"]) for _ in range(5)}
    assert len(ports) > 1


def test_master_port_explicit_and_avoided_ports():
    assert (
        DistributedEnv.single_node(environ={}, master_port=4321).variables["MASTER_PORT"] == "4321"
    )
    taken = find_free_port()
    assert find_free_port(avoid=range(1, taken + 1)) > taken


@pytest.mark.parametrize(
    ("environ", "field"),
    [
        ({"RANK": "x"}, "RANK"),
        ({"RANK": "-1"}, "RANK"),
        ({"WORLD_SIZE": "0"}, "WORLD_SIZE"),
        ({"RANK": "2", "WORLD_SIZE": "2"}, "RANK"),
        ({"RANK": "1"}, "RANK"),
        ({"LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "2"}, "LOCAL_RANK"),
        ({"MASTER_PORT": "99999"}, "MASTER_PORT"),
        ({"MASTER_PORT": "port"}, "MASTER_PORT"),
    ],
)
def test_inconsistent_launcher_values(environ, field):
    with pytest.raises(ConfigError) as info:
        DistributedEnv.single_node(environ=environ)
    assert info.value.field == field
    assert repr(environ[field]) in str(info.value)


@pytest.mark.parametrize("port", [0, 70000, "29500", True])
def test_bad_master_port_argument(port):
    with pytest.raises(ConfigError, match=r"^master_port="):
        DistributedEnv.single_node(environ={}, master_port=port)


def test_apply_writes_into_the_given_mapping_only():
    target: dict[str, str] = {"KEEP": "1"}
    before = dict(os.environ)
    env = DistributedEnv.single_node(environ={}, master_port=5555)
    env.apply(target)
    assert target["MASTER_PORT"] == "5555"
    assert target["KEEP"] == "1"
    assert dict(os.environ) == before


def test_apply_defaults_to_os_environ(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT", "MASTER_ADDR"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MASTER_ADDR", "somewhere")
    env = DistributedEnv.single_node(master_port=6000)
    monkeypatch.setenv("RANK", "0")  # registers RANK & co. for cleanup by monkeypatch
    for name in env.variables:
        monkeypatch.setenv(name, "placeholder")
    env.apply()
    assert os.environ["MASTER_PORT"] == "6000"
    assert os.environ["MASTER_ADDR"] == "127.0.0.1"  # no launcher: a stale address, overridden


def test_without_a_launcher_a_stale_address_and_torchruns_agent_variables_are_not_passed_on():
    stale = {"MASTER_ADDR": "10.9.9.9", "TORCHELASTIC_RUN_ID": "old-job",
             "TORCHELASTIC_RESTART_COUNT": "3", "ROLE_RANK": "0", "ROLE_WORLD_SIZE": "1",
             "GROUP_RANK": "0", "KEEP": "1"}  # fmt: skip
    env = DistributedEnv.single_node(environ=stale, master_port=6000)
    target = dict(stale)
    env.apply(target)
    assert target["MASTER_ADDR"] == "127.0.0.1"
    assert "MASTER_ADDR" in env.defaulted
    assert not [name for name in target if name.startswith(("TORCHELASTIC_", "ROLE_"))]
    assert target["GROUP_RANK"] == "0"
    assert target["KEEP"] == "1"


def test_a_launchers_address_and_agent_variables_are_kept():
    launcher = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1",
                "MASTER_ADDR": "10.9.9.9", "MASTER_PORT": "29555",
                "TORCHELASTIC_RUN_ID": "this-job", "ROLE_RANK": "0"}  # fmt: skip
    env = DistributedEnv.single_node(environ=launcher)
    target = dict(launcher)
    env.apply(target)
    assert target == launcher | {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}
    assert not env.removed


def test_variables_are_read_only():
    env = DistributedEnv.single_node(environ={})
    with pytest.raises(TypeError):
        env.variables["RANK"] = "1"  # type: ignore[index]


@pytest.mark.parametrize("missing", ["MASTER_ADDR", "MASTER_PORT"])
def test_multi_process_job_without_rendezvous_gets_defaults_and_a_warning(missing, caplog):
    environ = {k: v for k, v in TORCHRUN.items() if k != missing}
    env = DistributedEnv.single_node(environ=environ)
    assert env.defaulted == {missing, "PYTORCH_CUDA_ALLOC_CONF"}
    assert f"WORLD_SIZE=8 but {missing} is unset" in caplog.text


# -- hostile launcher values (issue 9, items 14 and 15)


@pytest.mark.parametrize(
    ("environ", "field"),
    [
        ({"LOCAL_RANK": "1"}, "LOCAL_RANK"),
        ({"LOCAL_RANK": "3", "RANK": "5", "WORLD_SIZE": "8"}, "LOCAL_RANK"),
        ({"LOCAL_WORLD_SIZE": "2"}, "LOCAL_WORLD_SIZE"),
        ({"LOCAL_WORLD_SIZE": "4", "WORLD_SIZE": "2"}, "LOCAL_WORLD_SIZE"),
        ({"RANK": "2", "LOCAL_RANK": "3", "WORLD_SIZE": "8", "LOCAL_WORLD_SIZE": "4"},
         "LOCAL_RANK"),
    ],
)  # fmt: skip
def test_inconsistent_local_values_name_the_variables(environ, field):
    with pytest.raises(ConfigError, match=rf"^{field}=") as info:
        DistributedEnv.single_node(environ=environ)
    assert info.value.field == field


def test_local_rank_without_local_world_size_names_both():
    with pytest.raises(ConfigError) as info:
        DistributedEnv.single_node(environ={"LOCAL_RANK": "1"})
    assert "LOCAL_WORLD_SIZE" in str(info.value)


@pytest.mark.parametrize("value", ["1_0", "\u0663", "1e3", " ", "", "0x1", "nan", "1.0", "10" * 30])
@pytest.mark.parametrize("name", ["RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE",
                                  "MASTER_PORT"])  # fmt: skip
def test_integers_are_ascii_digits_only(name, value):
    with pytest.raises(ConfigError, match=rf"^{name}=") as info:
        DistributedEnv.single_node(environ={name: value})
    assert quoted(value) in str(info.value)


def test_blanks_around_digits_are_fine():
    env = DistributedEnv.single_node(environ={"WORLD_SIZE": " 2\n", "RANK": "1"})
    assert env.world_size == 2


@pytest.mark.parametrize("value", [2**40, 10**30])
def test_huge_world_size_is_a_config_error(value):
    with pytest.raises(ConfigError, match=r"^WORLD_SIZE="):
        DistributedEnv.single_node(environ={"WORLD_SIZE": str(value)})


@pytest.mark.parametrize("avoid", [None, 5, "8001", [None], [1.5]])
def test_avoid_ports_must_be_a_collection_of_ports(avoid):
    with pytest.raises(ConfigError, match=r"^avoid_ports="):
        DistributedEnv.single_node(environ={}, avoid_ports=avoid)


@pytest.mark.parametrize("environ", [["RANK=0"], "RANK=0", 5])
def test_environ_must_be_a_mapping(environ):
    with pytest.raises(ConfigError, match=r"^environ="):
        DistributedEnv.single_node(environ=environ)


@pytest.mark.parametrize("value", [0, None, b"0", 1.0], ids=["int", "None", "bytes", "float"])
def test_environ_values_must_be_text(value):
    with pytest.raises(ConfigError, match=r"^RANK="):
        DistributedEnv.single_node(environ={"RANK": value, "WORLD_SIZE": "1"})


@pytest.mark.parametrize("port", [10**30, 0, 70000, "1", 1.5, True])
def test_master_port_argument_is_checked(port):
    with pytest.raises(ConfigError, match=r"^master_port="):
        DistributedEnv.single_node(environ={}, master_port=port)


# -- several nodes: torchrun's GROUP_RANK/GROUP_WORLD_SIZE, accelerate's NODE_RANK

NODE_1 = {  # torchrun --nnodes 2 --nproc-per-node 4, second node, its second rank
    "RANK": "5",
    "LOCAL_RANK": "1",
    "WORLD_SIZE": "8",
    "LOCAL_WORLD_SIZE": "4",
    "GROUP_RANK": "1",
    "GROUP_WORLD_SIZE": "2",
    "MASTER_ADDR": "node0",
    "MASTER_PORT": "29500",
}


def test_node_values_are_kept_and_read():
    env = DistributedEnv.single_node(environ=dict(NODE_1))
    for name, value in NODE_1.items():
        assert env.variables[name] == value
    assert (env.node_rank, env.local_world_size, env.is_local_main) == (1, 4, False)
    assert "GROUP_RANK" not in env.defaulted
    target: dict[str, str] = {}
    env.apply(target)
    assert target["GROUP_RANK"] == "1"


def test_node_rank_spelling_and_single_node_default():
    env = DistributedEnv.single_node(environ={**NODE_1, "NODE_RANK": "1"})
    assert env.node_rank == 1
    accelerate = {k: v for k, v in NODE_1.items() if not k.startswith("GROUP_")}
    assert DistributedEnv.single_node(environ={**accelerate, "NODE_RANK": "1"}).node_rank == 1
    alone = DistributedEnv.single_node(environ={})
    assert (alone.node_rank, alone.local_world_size) == (0, 1)
    assert "GROUP_RANK" not in alone.variables


@pytest.mark.parametrize(
    ("change", "field", "words"),
    [
        ({"RANK": "1"}, "RANK", "GROUP_RANK * LOCAL_WORLD_SIZE + LOCAL_RANK = 1 * 4 + 1 = 5"),
        ({"GROUP_RANK": "2"}, "GROUP_RANK", "must be < GROUP_WORLD_SIZE=2"),
        ({"NODE_RANK": "0"}, "NODE_RANK", "must equal GROUP_RANK=1"),
        ({"GROUP_WORLD_SIZE": "9"}, "GROUP_WORLD_SIZE", "must be <= WORLD_SIZE=8"),
        ({"GROUP_RANK": "x"}, "GROUP_RANK", "x"),
    ],
)
def test_inconsistent_node_values_name_the_variable(change, field, words):
    with pytest.raises(ConfigError) as err:
        DistributedEnv.single_node(environ={**NODE_1, **change})
    assert err.value.field == field
    assert words in str(err.value)


def test_node_rank_alone_is_checked_against_the_global_rank():
    accelerate = {k: v for k, v in NODE_1.items() if not k.startswith("GROUP_")}
    with pytest.raises(ConfigError, match="NODE_RANK \\* LOCAL_WORLD_SIZE"):
        DistributedEnv.single_node(environ={**accelerate, "NODE_RANK": "0"})


def test_nodes_with_different_rank_counts_are_not_second_guessed():
    # 3 ranks on node 0 and 2 on node 1: ranks 3 and 4 live on node 1.
    uneven = {**NODE_1, "RANK": "4", "WORLD_SIZE": "5", "LOCAL_WORLD_SIZE": "2"}
    assert DistributedEnv.single_node(environ=uneven).rank == 4


# -- one node: RANK is LOCAL_RANK (hostile review round 7, B2)


@pytest.mark.parametrize(
    "environ",
    [
        # a caller's stale RANK=3 on a 4-process node
        {"RANK": "3", "LOCAL_RANK": "0", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "4"},
        # torchrun's one node says so with GROUP_WORLD_SIZE=1
        {"RANK": "1", "LOCAL_RANK": "0", "WORLD_SIZE": "2", "GROUP_WORLD_SIZE": "1"},
    ],
    ids=["world-is-local-world", "one-group"],
)
def test_on_one_node_a_rank_other_than_the_local_rank_names_both(environ):
    with pytest.raises(ConfigError) as info:
        DistributedEnv.single_node(environ={**environ, "MASTER_PORT": "29500"})
    assert info.value.field == "RANK"
    assert f"RANK={environ['RANK']!r}" in str(info.value)
    assert f"LOCAL_RANK={environ['LOCAL_RANK']}" in str(info.value)


def test_on_one_node_matching_ranks_are_fine():
    node = {"RANK": "1", "LOCAL_RANK": "1", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"}
    assert DistributedEnv.single_node(environ={**node, "GROUP_WORLD_SIZE": "1"}).rank == 1


@pytest.mark.parametrize(
    ("environ", "ok"),
    [
        (
            {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2"},
            False,
        ),  # local rank 1 of node 1?
        ({"RANK": "1", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2"}, False),
        ({"RANK": "0", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2"}, True),  # 0 is local rank 0
        ({"RANK": "3", "WORLD_SIZE": "4"}, True),  # one rank a node (LOCAL_WORLD_SIZE=1)
    ],
)
def test_a_missing_local_rank_is_filled_only_where_it_can_be_told(environ, ok):
    """``LOCAL_RANK=0`` for a later rank of a multi-rank node would act as the node's first."""
    if ok:
        assert (
            DistributedEnv.single_node(environ={**environ, "MASTER_PORT": "29500"}).local_rank == 0
        )
        return
    with pytest.raises(ConfigError) as info:
        DistributedEnv.single_node(environ={**environ, "MASTER_PORT": "29500"})
    assert info.value.field == "RANK"
    assert "set LOCAL_RANK" in str(info.value)

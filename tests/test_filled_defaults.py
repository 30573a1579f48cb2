"""Class: defaults over inconsistent launcher values. Filling in never makes a refused combination.

For every subset of the launcher's rank variables that a launcher might set
(open-ended values), `DistributedEnv.single_node` either refuses them, or
returns variables that the same checks accept when given outright: the
result, fed back in as the launcher's, is accepted and unchanged. Where the
defaults would contradict what was given, the error names the variable left
unset.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from verirl import ConfigError, DistributedEnv

NAMES = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK",
         "GROUP_WORLD_SIZE")  # fmt: skip
launcher = st.fixed_dictionaries(
    {}, optional={name: st.integers(0, 9).map(str) for name in NAMES}
).map(lambda env: {**env, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500"})


@settings(max_examples=500, deadline=None)
@given(environ=launcher)
def test_what_is_filled_in_passes_the_checks_given_values_pass(environ):
    try:
        dist = DistributedEnv.single_node(environ=environ)
    except ConfigError:
        return
    again = DistributedEnv.single_node(environ=dict(dist.variables))  # as if all were given
    assert dict(again.variables) == dict(dist.variables)
    assert again.defaulted == frozenset()


@pytest.mark.parametrize(
    ("environ", "given", "unset"),
    [({"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "WORLD_SIZE": "2"}, "LOCAL_RANK", "RANK"),
     ({"RANK": "3", "WORLD_SIZE": "4", "GROUP_RANK": "1", "GROUP_WORLD_SIZE": "4"}, "RANK",
      "LOCAL_RANK"),
     ({"GROUP_RANK": "1"}, "GROUP_RANK", "WORLD_SIZE"),
     # one node (WORLD_SIZE == LOCAL_WORLD_SIZE, or torchrun's GROUP_WORLD_SIZE=1): RANK=1
     # against the LOCAL_RANK=0 filled in
     ({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"}, "RANK", "LOCAL_RANK"),
     ({"RANK": "1", "WORLD_SIZE": "2", "GROUP_WORLD_SIZE": "1"}, "RANK", "LOCAL_RANK")],
)  # fmt: skip
def test_a_contradicting_default_names_the_given_variable_and_the_unset_one(environ, given, unset):
    with pytest.raises(ConfigError) as info:
        DistributedEnv.single_node(environ={**environ, "MASTER_PORT": "29500"})
    assert info.value.field == given  # the user's words
    assert str(info.value).startswith(f"{given}={environ[given]!r}: contradicts")
    assert f"set {unset}" in str(info.value) or f" and {unset}" in str(info.value)


def test_on_one_node_a_filled_local_rank_is_named_with_the_given_rank():
    with pytest.raises(ConfigError) as info:
        DistributedEnv.single_node(
            environ={"RANK": "1", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "MASTER_PORT": "1"}
        )
    assert "RANK='1'" in str(info.value)
    assert "LOCAL_RANK=0" in str(info.value)


def test_the_default_a_launcher_value_contradicts_is_named_with_its_rule():
    """``GROUP_RANK=3`` alone: the rule broken is RANK's (filled as 0), and says so."""
    with pytest.raises(ConfigError) as caught:
        DistributedEnv.single_node(environ={"GROUP_RANK": "3"})
    message = str(caught.value)
    assert caught.value.field == "GROUP_RANK"
    assert "RANK='0': must be GROUP_RANK * LOCAL_WORLD_SIZE + LOCAL_RANK" in message

"""distribute: deterministic, proportional to capacity, overrides honoured, no replicas where there is no room."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st
from planning_data import cpu, h100

from inferfleet_operator.plan.pools import group_pools
from inferfleet_operator.plan.replicas import distribute, pool_capacity


def test_replicas_split_in_proportion_to_capacity():
    d = distribute(6, {"a": 8, "b": 4}, {})
    assert d.replicas == {"a": 4, "b": 2} and d.num_unplaced == 0


def test_remainders_go_to_the_largest_fraction_then_by_name():
    assert distribute(1, {"b": 4, "a": 4}, {}).replicas == {"a": 1, "b": 0}
    assert distribute(3, {"a": 1, "b": 3}, {}).replicas == {"a": 1, "b": 2}  # 0.75 vs 2.25: a has the larger fraction
    assert distribute(2, {"a": 1, "b": 3}, {}).replicas == {"a": 1, "b": 1}  # 0.5 vs 1.5: tie, by name


def test_overrides_are_honoured_and_the_rest_is_shared():
    d = distribute(10, {"a": 8, "b": 8, "c": 8}, {"a": 1})
    assert d.replicas["a"] == 1 and d.replicas["b"] + d.replicas["c"] == 9


def test_pools_without_capacity_get_none_even_when_overridden():
    d = distribute(4, {"full": 0, "room": 8}, {"full": 2})
    assert d.replicas == {"full": 0, "room": 2} and d.num_unplaced == 2


def test_replicas_beyond_all_capacity_are_reported_unplaced():
    d = distribute(20, {"a": 3, "b": 2}, {})
    assert d.replicas == {"a": 3, "b": 2} and d.num_unplaced == 15


@given(
    total=st.integers(0, 200),
    caps=st.dictionaries(st.sampled_from("abcdefg"), st.integers(0, 50), max_size=6),
    overrides=st.dictionaries(st.sampled_from("abcx"), st.integers(0, 20), max_size=3),
)
def test_distribution_invariants(total, caps, overrides):
    d = distribute(total, caps, overrides)
    assert set(d.replicas) == set(caps)
    assert all(0 <= d.replicas[n] <= caps[n] for n in caps)
    for name, wanted in overrides.items():
        if name in caps:
            assert d.replicas[name] == min(wanted, caps[name])
    assert d.replicas == distribute(total, dict(reversed(list(caps.items()))), overrides).replicas
    free = sum(c for n, c in caps.items() if n not in overrides)
    remaining = max(0, total - sum(v for n, v in overrides.items() if n in caps))
    assert sum(d.replicas[n] for n in caps if n not in overrides) == min(remaining, free)


def test_capacity_counts_whole_replicas_per_node():
    (pool,) = group_pools([h100("a", gpus=8), h100("b", gpus=3)])
    assert pool_capacity(pool, 2, "1") == 4 + 1
    assert pool_capacity(pool, 4, "1") == 2
    (cpu_pool,) = group_pools([cpu("c", cores=16)])
    assert pool_capacity(cpu_pool, 1, "4") == 4 and pool_capacity(cpu_pool, 1, "6000m") == 2

"""autoscaling.decide: the HPA formula and tolerance, missing metrics, building engines, capacity, min/max, stabilization."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from inferfleet_operator.api.types import AutoscalingSpec
from inferfleet_operator.plan import autoscaling as a
from inferfleet_operator.plan.autoscaling import History, PodMetrics, PoolLoad

NOW = datetime(2026, 12, 3, 12, 0, tzinfo=UTC)
WAITING = AutoscalingSpec(
    max_replicas=20, min_replicas=1, target_waiting_requests=2, scale_down_stabilization_seconds=60
)


def pods(*waiting, kv=None):
    return tuple(None if w is None else PodMetrics(waiting=w, kv_usage=kv) for w in waiting)


# (case, current, values, target, expected replicas)
FORMULA = [
    ("exactly on target keeps", 2, [2.0, 2.0], 2.0, 2),
    ("within the 10% band keeps (ratio 1.1)", 2, [2.2, 2.2], 2.0, 2),
    ("within the band below keeps (ratio 0.9)", 2, [1.8, 1.8], 2.0, 2),
    ("just past the band scales up: ceil(1.15 * 2)", 2, [2.3, 2.3], 2.0, 3),
    ("ceil(current * value / target)", 2, [6.0, 6.0], 2.0, 6),
    ("scale down: ceil(0.25 * 4)", 4, [0.5, 0.5, 0.5, 0.5], 2.0, 1),
    ("idle pods scale to ceil(0)=0 before the min clamp", 3, [0.0, 0.0, 0.0], 2.0, 0),
    ("missing pods count 0 on scale-up", 3, [6.0, None, None], 2.0, 3),
    ("missing pods damp a scale-up but still up", 2, [10.0, None], 2.0, 5),
    ("missing pods count as target on scale-down", 4, [0.0, None, None, None], 2.0, 3),
    ("missing pods that reverse the direction keep current", 2, [2.6, None], 2.0, 2),
    ("no pod answered keeps current", 3, [None, None, None], 2.0, 3),
]


@pytest.mark.parametrize("case, current, values, target, expected", FORMULA, ids=[f[0] for f in FORMULA])
def test_hpa_formula_tolerance_and_missing_metrics(case, current, values, target, expected):
    replicas, _ = a.replicas_for_metric(current, values, target)
    assert replicas == expected


# (case, spec, loads, expected desired per pool, expected reason per pool)
DECISIONS = [
    ("load over target scales up", WAITING, [PoolLoad("p", 1, 10, pods(6.0))], [3], [a.REASON_SCALED_UP]),
    ("within tolerance keeps", WAITING, [PoolLoad("p", 2, 10, pods(2.1, 2.0))], [2], [a.REASON_WITHIN_TOLERANCE]),
    ("capacity caps a scale-up", WAITING, [PoolLoad("p", 1, 2, pods(10.0))], [2], [a.REASON_CAPACITY]),
    (
        "max caps the service total",
        AutoscalingSpec(max_replicas=3, target_waiting_requests=2),
        [PoolLoad("p", 2, 10, pods(8.0, 8.0))],
        [3],
        [a.REASON_MAX],
    ),
    (
        "min lifts an idle service",
        AutoscalingSpec(max_replicas=5, min_replicas=2, target_waiting_requests=2, scale_down_stabilization_seconds=0),
        [PoolLoad("p", 3, 10, pods(0.0, 0.0, 0.0))],
        [2],
        [a.REASON_MIN],
    ),
    (
        "a building pool is never scaled",
        WAITING,
        [PoolLoad("p", 1, 10, pods(50.0), is_building=True)],
        [1],
        [a.REASON_ENGINE_BUILDING],
    ),
    ("no metrics keeps", WAITING, [PoolLoad("p", 2, 10, pods(None, None))], [2], [a.REASON_NO_METRICS]),
    (
        "pools decide apart",
        WAITING,
        [PoolLoad("busy", 1, 10, pods(8.0)), PoolLoad("calm", 2, 10, pods(2.0, 2.0))],
        [4, 2],
        [a.REASON_SCALED_UP, a.REASON_WITHIN_TOLERANCE],
    ),
    (
        "the shortfall under min goes to the pool with the most room",
        AutoscalingSpec(max_replicas=9, min_replicas=3, target_waiting_requests=2),
        [PoolLoad("small", 0, 1, ()), PoolLoad("big", 1, 8, pods(2.0))],
        [0, 3],
        [a.REASON_NO_METRICS, a.REASON_MIN],
    ),
    (
        "the excess over max comes off the largest pool",
        AutoscalingSpec(max_replicas=4, target_waiting_requests=1),
        [PoolLoad("x", 1, 10, pods(3.0)), PoolLoad("y", 1, 10, pods(2.0))],
        [2, 2],
        [a.REASON_MAX, a.REASON_SCALED_UP],
    ),
    (
        "kv usage drives when it asks for more than the queue",
        AutoscalingSpec(max_replicas=10, target_waiting_requests=4, target_kv_cache_usage_percent=50),
        [PoolLoad("p", 2, 10, pods(1.0, 1.0, kv=0.9))],
        [4],
        [a.REASON_SCALED_UP],
    ),
    (
        "a building pool is held out of the max cut",
        AutoscalingSpec(max_replicas=2, target_waiting_requests=1),
        [PoolLoad("b", 2, 10, pods(9.0, 9.0), is_building=True), PoolLoad("p", 1, 10, pods(1.0))],
        [2, 0],
        [a.REASON_ENGINE_BUILDING, a.REASON_MAX],
    ),
]


@pytest.mark.parametrize("case, spec, loads, desired, reasons", DECISIONS, ids=[d[0] for d in DECISIONS])
def test_decisions(case, spec, loads, desired, reasons):
    decisions = a.decide(spec, loads, History(), NOW)
    assert [d.desired for d in decisions] == desired
    assert [d.reason for d in decisions] == reasons


def test_the_metric_that_drove_a_decision_is_recorded():
    spec = AutoscalingSpec(max_replicas=10, target_waiting_requests=4, target_kv_cache_usage_percent=50)
    (d,) = a.decide(spec, [PoolLoad("p", 2, 10, pods(1.0, 1.0, kv=0.9))], History(), NOW)
    assert (d.metric, d.value, d.target) == (a.KV_USAGE, 0.9, 0.5)


def test_scale_down_waits_out_the_stabilization_window_and_scale_up_does_not():
    history = History()
    (up,) = a.decide(WAITING, [PoolLoad("p", 1, 10, pods(8.0))], history, NOW)
    assert up.desired == 4
    (held,) = a.decide(WAITING, [PoolLoad("p", 4, 10, pods(0.0, 0.0, 0.0, 0.0))], history, NOW + timedelta(seconds=30))
    assert (held.desired, held.reason) == (4, a.REASON_STABILIZING)
    (down,) = a.decide(WAITING, [PoolLoad("p", 4, 10, pods(0.0, 0.0, 0.0, 0.0))], history, NOW + timedelta(seconds=91))
    assert (down.desired, down.reason) == (1, a.REASON_MIN)  # the idle pool is 0 by the formula, 1 by minReplicas


def test_free_capacity_counts_gpus_other_services_hold_not_the_pool_size():
    assert a.free_capacity(pool_gpus=16, gpus_used_by_others=12, gpus_per_replica=2, pool_capacity=8) == 2
    assert a.free_capacity(pool_gpus=16, gpus_used_by_others=0, gpus_per_replica=2, pool_capacity=8) == 8
    assert a.free_capacity(pool_gpus=8, gpus_used_by_others=10, gpus_per_replica=1, pool_capacity=8) == 0

"""decide_pool: one row per branch of a pool's serving decision (paged, compiled, previous engine, fallback,
bridge, waiting, no replicas, no capacity)."""

from __future__ import annotations

import pytest

from inferfleet_operator.api import conditions as c
from inferfleet_operator.plan.pool_decision import decide_pool

# A compiled pool with 2 replicas whose engine "new" is building, no previous engine, fallback and bridge on.
BASE = dict(
    engine="Compiled",
    runtime="trt",
    paged_runtime="paged",
    num_replicas=2,
    capacity=4,
    capacity_message="no node has 1 allocatable nvidia.com/gpu",
    engine_key="new",
    build_state="Building",
    previous_key="",
    previous_state="Pending",
    fallback="Paged",
    bridge=True,
)

# (case, inputs over BASE, (reason, servingEngine, runtime, engine served, builds wanted, desiredReplicas))
ROWS = [
    ("paged pool", dict(engine="Paged", runtime="paged", engine_key=""),
     (c.REASON_SERVING_PAGED, "Paged", "paged", "", (), 2)),
    ("paged pool without replicas", dict(engine="Paged", runtime="paged", engine_key="", num_replicas=0),
     (c.REASON_NO_REPLICAS, "None", "paged", "", (), 0)),
    ("compiled pool without replicas builds nothing", dict(num_replicas=0, engine_key=""),
     (c.REASON_NO_REPLICAS, "None", None, "", (), 0)),
    ("compiled engine ready", dict(build_state="Ready"),
     (c.REASON_SERVING_COMPILED, "Compiled", "trt", "new", ("new",), 2)),
    ("previous engine serves while the new one builds", dict(previous_key="old", previous_state="Ready"),
     (c.REASON_SERVING_PREVIOUS_ENGINE, "Compiled", "trt", "old", ("new", "old"), 2)),
    ("previous engine not ready: bridge", dict(previous_key="old", previous_state="Building"),
     (c.REASON_BRIDGING, "Paged", "paged", "", ("new",), 2)),
    ("previous engine is the wanted one", dict(previous_key="new", previous_state="Building", bridge=False),
     (c.REASON_WAITING_FOR_BUILD, "None", None, "", ("new",), 2)),
    ("build failed: fallback to paged", dict(build_state="Failed"),
     (c.REASON_FALLBACK_PAGED, "Paged", "paged", "", ("new",), 2)),
    ("build failed, fallback without a paged runtime", dict(build_state="Failed", paged_runtime=None),
     (c.REASON_FALLBACK_PAGED, "None", None, "", ("new",), 0)),
    ("build failed, no fallback", dict(build_state="Failed", fallback="None"),
     (c.REASON_BUILD_FAILED_NO_FALLBACK, "None", None, "", ("new",), 2)),
    ("building: bridge with paged", dict(),
     (c.REASON_BRIDGING, "Paged", "paged", "", ("new",), 2)),
    ("building, bridge without a paged runtime", dict(paged_runtime=None),
     (c.REASON_BRIDGING, "None", None, "", ("new",), 0)),
    ("building, no bridge: wait", dict(bridge=False),
     (c.REASON_WAITING_FOR_BUILD, "None", None, "", ("new",), 2)),
    ("no node fits a replica", dict(capacity=0, num_replicas=0, engine_key=""),
     (c.REASON_NO_CAPACITY, "None", None, "", (), 0)),
]  # fmt: skip


@pytest.mark.parametrize("inputs, expected", [row[1:] for row in ROWS], ids=[row[0] for row in ROWS])
def test_each_branch_of_the_pool_decision(inputs, expected):
    decision = decide_pool(**(BASE | inputs))
    got = (
        decision.reason,
        decision.serving_engine,
        decision.runtime,
        decision.engine_key,
        decision.build_keys,
        decision.num_replicas,
    )
    assert got == expected


def test_no_capacity_says_why_and_keeps_what_was_decided():
    decision = decide_pool(**(BASE | dict(capacity=0, build_state="Ready")))
    assert decision.reason == c.REASON_NO_CAPACITY
    assert decision.message == BASE["capacity_message"]
    assert decision.engine_key == "new" and decision.has_deployment  # replicas assigned over capacity still run


def test_only_a_pool_with_a_runtime_and_replicas_gets_a_deployment():
    assert decide_pool(**BASE).has_deployment
    assert not decide_pool(**(BASE | dict(bridge=False))).has_deployment
    assert not decide_pool(**(BASE | dict(engine="Paged", runtime="paged", num_replicas=0))).has_deployment

"""decide: replicas per pool from the serving pods' load metrics, with the Kubernetes HPA formula, tolerance and
missing-metric rules, clamped by each pool's free capacity and the service's min/max, stabilized on the way down."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from inferfleet_operator.api.conditions import PlannedEvent, normal
from inferfleet_operator.api.quantity import to_int
from inferfleet_operator.api.types import AutoscalingSpec

TOLERANCE = 0.1  # the HPA's default: a usage ratio within 10% of 1 changes nothing
_EPSILON = 1e-9  # so that a ratio of exactly 1.1 (2.2 / 2 in floats: 1.1000000000000001) is inside the band

WAITING = "inferfleet:num_requests_waiting"
KV_USAGE = "inferfleet:kv_cache_usage_perc"

REASON_WITHIN_TOLERANCE = "WithinTolerance"
REASON_SCALED_UP = "ScaledUp"
REASON_SCALED_DOWN = "ScaledDown"
REASON_STABILIZING = "ScaleDownStabilizing"
REASON_ENGINE_BUILDING = "EngineBuilding"
REASON_NO_METRICS = "MetricsUnavailable"
REASON_CAPACITY = "CapacityLimited"
REASON_MIN = "MinReplicas"
REASON_MAX = "MaxReplicas"


@dataclass(frozen=True)
class PodMetrics:
    """What one serving pod's /metrics said; None for a value the pod did not export."""

    waiting: float | None = None  # queued requests
    kv_usage: float | None = None  # 0..1


@dataclass(frozen=True)
class PoolLoad:
    name: str
    current: int  # replicas the pool's Deployment asks for now
    capacity: int  # replicas the pool has free room for (its own replicas included)
    pods: tuple[PodMetrics | None, ...] = ()  # one per pod of the pool; None: the pod did not answer
    is_building: bool = False  # its engine is still building: never scaled


@dataclass(frozen=True)
class PoolDecision:
    name: str
    current: int
    desired: int
    reason: str
    metric: str = ""
    value: float | None = None  # the metric's average over the pods that answered
    target: float | None = None


@dataclass
class History:
    """Recommendations of the scale-down window, per pool, kept by the caller between decisions (like the HPA)."""

    recommendations: dict[str, list[tuple[datetime, int]]] = field(default_factory=dict)


def _targets(spec: AutoscalingSpec) -> list[tuple[str, float, str]]:
    """(metric, target per replica, PodMetrics field) for each target the spec sets."""
    out = []
    if spec.target_waiting_requests is not None:
        out.append((WAITING, float(spec.target_waiting_requests), "waiting"))
    if spec.target_kv_cache_usage_percent is not None:
        out.append((KV_USAGE, spec.target_kv_cache_usage_percent / 100, "kv_usage"))
    return out


def replicas_for_metric(current: int, values: list[float | None], target: float) -> tuple[int, float | None]:
    """The HPA's desired replicas for one metric: -> (replicas, average of the values present).

    ratio = average / target; within TOLERANCE of 1 the pool keeps `current`. Pods without a value
    count as 0 when scaling up and as exactly the target when scaling down (they damp the move), and
    when that flips the direction or lands within tolerance the pool keeps `current`."""
    present = [v for v in values if v is not None]
    if not present:
        return current, None
    average = sum(present) / len(present)
    ratio = average / target
    if abs(ratio - 1.0) <= TOLERANCE + _EPSILON:
        return current, average
    num_missing = len(values) - len(present)
    if num_missing == 0:
        return math.ceil(ratio * len(present)), average
    fill = 0.0 if ratio > 1.0 else target
    new_ratio = (sum(present) + fill * num_missing) / len(values) / target
    if abs(new_ratio - 1.0) <= TOLERANCE + _EPSILON or (new_ratio > 1.0) != (ratio > 1.0):
        return current, average
    return math.ceil(new_ratio * len(values)), average


def _pool_recommendation(spec: AutoscalingSpec, pool: PoolLoad) -> PoolDecision:
    if pool.is_building:
        return PoolDecision(pool.name, pool.current, pool.current, REASON_ENGINE_BUILDING)
    best: PoolDecision | None = None
    for metric, target, attr in _targets(spec):
        values = [None if pod is None else getattr(pod, attr) for pod in pool.pods]
        replicas, average = replicas_for_metric(pool.current, values, target)
        if average is None:
            continue
        reason = (
            REASON_SCALED_UP
            if replicas > pool.current
            else REASON_SCALED_DOWN
            if replicas < pool.current
            else REASON_WITHIN_TOLERANCE
        )
        decision = PoolDecision(pool.name, pool.current, replicas, reason, metric, average, target)
        if best is None or decision.desired > best.desired:  # the HPA takes the largest proposal
            best = decision
    if best is None:
        return PoolDecision(pool.name, pool.current, pool.current, REASON_NO_METRICS)
    return best


def _stabilize(decision: PoolDecision, history: History, window: timedelta, now: datetime) -> PoolDecision:
    """Scale down only to the highest recommendation within the window (the HPA's scale-down stabilization)."""
    kept = [(t, r) for t, r in history.recommendations.get(decision.name, []) if now - t <= window]
    kept.append((now, decision.desired))
    history.recommendations[decision.name] = kept
    highest = max(r for _, r in kept)
    if decision.desired < decision.current and highest > decision.desired:
        desired = min(highest, decision.current)
        reason = REASON_STABILIZING if desired == decision.current else decision.reason
        return PoolDecision(
            decision.name, decision.current, desired, reason, decision.metric, decision.value, decision.target
        )
    return decision


def _with(decision: PoolDecision, desired: int, reason: str) -> PoolDecision:
    return PoolDecision(
        decision.name, decision.current, desired, reason, decision.metric, decision.value, decision.target
    )


def decide(spec: AutoscalingSpec, pools: list[PoolLoad], history: History, now: datetime) -> list[PoolDecision]:
    """One decision per pool, in the order given. Each pool is clamped to its capacity; then the service's
    total is brought within [minReplicas, maxReplicas]: a shortfall goes to the pools with the most free
    room, an excess comes off the largest pools first. Building pools keep their replicas throughout."""
    window = timedelta(seconds=spec.scale_down_stabilization_seconds)
    decisions = []
    for pool in pools:
        decision = _stabilize(_pool_recommendation(spec, pool), history, window, now)
        if decision.desired > pool.capacity and not pool.is_building:
            decision = _with(decision, max(pool.capacity, 0), REASON_CAPACITY)
        decisions.append(decision)
    by_name = {p.name: p for p in pools}
    scalable = [i for i, d in enumerate(decisions) if not by_name[d.name].is_building]
    total = sum(d.desired for d in decisions)
    while total < spec.min_replicas:
        room = [i for i in scalable if decisions[i].desired < by_name[decisions[i].name].capacity]
        if not room:
            break  # no pool has room: the planner reports the replicas that fit nowhere
        i = max(room, key=lambda j: (by_name[decisions[j].name].capacity - decisions[j].desired, -j))
        decisions[i] = _with(decisions[i], decisions[i].desired + 1, REASON_MIN)
        total += 1
    while total > spec.max_replicas:
        shrinkable = [i for i in scalable if decisions[i].desired > 0]
        if not shrinkable:
            break
        i = max(shrinkable, key=lambda j: (decisions[j].desired, -j))
        decisions[i] = _with(decisions[i], decisions[i].desired - 1, REASON_MAX)
        total -= 1
    return decisions


def free_capacity(pool_gpus: int, gpus_used_by_others: int, gpus_per_replica: int, pool_capacity: int) -> int:
    """Replicas of one service that fit the GPUs of a pool that other services do not already hold: never
    more than the pool's own per-node packing allows."""
    free = max(pool_gpus - gpus_used_by_others, 0)
    return min(pool_capacity, free // max(gpus_per_replica, 1))


def gpus_held(deployment: Mapping) -> int:
    """GPUs one Deployment holds: replicas × the extended resources in its containers' limits."""
    spec = deployment.get("spec") or {}
    containers = ((spec.get("template") or {}).get("spec") or {}).get("containers") or []
    per_pod = 0
    for container in containers:
        for resource, value in ((container.get("resources") or {}).get("limits") or {}).items():
            if "/" in resource:  # extended resources (nvidia.com/gpu, amd.com/gpu, ...)
                per_pod += to_int(value)
    return per_pod * int(spec.get("replicas") or 0)


@dataclass(frozen=True)
class LoadReading:
    """What one scrape found, read before the plan: each pool's serving pods (one entry per pod, None for a
    pod that did not answer or is not ready) and the GPUs other services' Deployments hold in each pool."""

    pods: Mapping[str, tuple[PodMetrics | None, ...]] = field(default_factory=dict)
    gpus_held_by_others: Mapping[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class Scaling:
    """One autoscaling decision of a service: kept between scrapes (the last decision stands), and what
    status.autoscaling and the ScaledUp/ScaledDown Events are made of."""

    decisions: tuple[PoolDecision, ...]
    history: History
    last_scale_time: str | None = None  # RFC 3339; when a decision last changed a pool's replicas

    @property
    def replicas(self) -> dict[str, int]:
        return {d.name: d.desired for d in self.decisions}

    def status(self) -> dict:
        """status.autoscaling."""
        status: dict = {"pools": [{"name": d.name, "currentReplicas": d.current, "desiredReplicas": d.desired,
                                   "metric": d.metric, "value": _format(d.value), "target": _format(d.target),
                                   "reason": d.reason} for d in self.decisions]}  # fmt: skip
        if self.last_scale_time:
            status["lastScaleTime"] = self.last_scale_time
        return status

    def events(self) -> list[PlannedEvent]:
        events = []
        for d in self.decisions:
            if d.desired == d.current:
                continue
            why = f"{d.metric} {_format(d.value)} per replica, target {_format(d.target)}" if d.metric else d.reason
            reason = REASON_SCALED_UP if d.desired > d.current else REASON_SCALED_DOWN
            events.append(normal(reason, f"Pool {d.name}: {d.current} -> {d.desired} replicas ({why}; {d.reason})"))
        return events


def _format(value: float | None) -> str:
    return "" if value is None else f"{value:.3g}"


def scale(
    spec: AutoscalingSpec, pools: list[PoolLoad], history: History, last_scale_time: str | None, now: datetime
) -> Scaling:
    """decide over a copy of `history` (the caller keeps the returned Scaling, history included);
    last_scale_time: the previous status.autoscaling.lastScaleTime, kept unless a pool's replicas change."""
    history = History({name: list(kept) for name, kept in history.recommendations.items()})
    decisions = tuple(decide(spec, pools, history, now))
    if any(d.desired != d.current for d in decisions):
        last_scale_time = now.strftime("%Y-%m-%dT%H:%M:%SZ")
    return Scaling(decisions, history, last_scale_time)

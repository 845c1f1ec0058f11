"""The autoscaling part of a service reconcile: read the pods' /metrics at most every --autoscale-seconds, decide
per pool (autoscaling.decide), and hand the planner the replicas, the status and the Events."""

from __future__ import annotations

import dataclasses
import time
from datetime import datetime

from inferfleet_operator.api import types as api
from inferfleet_operator.api.conditions import PlannedEvent, normal
from inferfleet_operator.api.names import COMPONENT_LABEL, POOL_LABEL, SERVICE_LABEL
from inferfleet_operator.api.quantity import to_int
from inferfleet_operator.controller.cache import DEPLOYMENTS
from inferfleet_operator.controller.scrape import scrape_pods
from inferfleet_operator.plan import autoscaling
from inferfleet_operator.plan.autoscaling import PoolLoad
from inferfleet_operator.plan.manifests import deployment_name


@dataclasses.dataclass
class ScalingState:
    """Per service, kept by the Context between reconciles."""

    history: autoscaling.History = dataclasses.field(default_factory=autoscaling.History)
    decided_at: float = float("-inf")  # monotonic time of the last scrape
    replicas: dict[str, int] = dataclasses.field(default_factory=dict)
    status: dict = dataclasses.field(default_factory=dict)


@dataclasses.dataclass(frozen=True)
class Scaled:
    replicas: dict[str, int]
    status: dict
    events: list[PlannedEvent]


def _is_ready(pod: dict) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


def _gpus(deployment: dict) -> int:
    """GPUs one Deployment holds: replicas × the extended resources in its server container's limits."""
    spec = deployment.get("spec") or {}
    containers = ((spec.get("template") or {}).get("spec") or {}).get("containers") or []
    per_pod = 0
    for container in containers:
        for resource, value in ((container.get("resources") or {}).get("limits") or {}).items():
            if "/" in resource:  # extended resources (nvidia.com/gpu, amd.com/gpu, ...)
                per_pod += to_int(value)
    return per_pod * int(spec.get("replicas") or 0)


def _free_capacities(
    ctx, namespace: str, name: str, spec: api.InferenceServiceSpec, capacities: dict[str, int]
) -> dict[str, int]:
    """Each pool's capacity less the GPUs other inferfleet services' Deployments hold there."""
    pools = {p.name: p for p in ctx.cache.cluster_view().pools}
    out = {}
    for pool_name, capacity in capacities.items():
        pool = pools.get(pool_name)
        if pool is None or pool.vendor == "cpu":
            out[pool_name] = capacity
            continue
        used = sum(
            _gpus(d)
            for d in ctx.cache.all_values(DEPLOYMENTS)
            if (d["metadata"].get("labels") or {}).get(POOL_LABEL) == pool_name
            and ((d["metadata"].get("labels") or {}).get(SERVICE_LABEL), d["metadata"].get("namespace"))
            != (name, namespace)
        )
        out[pool_name] = autoscaling.free_capacity(sum(pool.node_gpus), used, spec.resources.gpus_per_replica, capacity)
    return out


def _format(value: float | None) -> str:
    return "" if value is None else f"{value:.3g}"


def _events(decisions: list[autoscaling.PoolDecision]) -> list[PlannedEvent]:
    events = []
    for d in decisions:
        if d.desired == d.current:
            continue
        why = f"{d.metric} {_format(d.value)} per replica, target {_format(d.target)}" if d.metric else d.reason
        reason = autoscaling.REASON_SCALED_UP if d.desired > d.current else autoscaling.REASON_SCALED_DOWN
        events.append(normal(reason, f"Pool {d.name}: {d.current} -> {d.desired} replicas ({why}; {d.reason})"))
    return events


async def autoscale(
    ctx, service_obj: dict, plan_status: dict, capacities: dict[str, int], now: datetime
) -> Scaled | None:
    """None when the service is not autoscaled. Between scrapes the last decision stands."""
    service = api.parse_service(service_obj)
    scaling = service.spec.autoscaling
    meta = service_obj["metadata"]
    key = (meta["namespace"], meta["name"])
    if scaling is None:
        ctx.scaling.pop(key, None)
        return None
    state = ctx.scaling.setdefault(key, ScalingState())
    if time.monotonic() - state.decided_at < ctx.config.autoscale_seconds and state.replicas:
        return Scaled(dict(state.replicas), state.status, [])
    selector = f"{SERVICE_LABEL}={meta['name']},{COMPONENT_LABEL}=server"
    pods = [
        p
        for p in await ctx.kube.list("v1", "Pod", meta["namespace"], label_selector=selector)
        if not p["metadata"].get("deletionTimestamp")
    ]
    ready = [p for p in pods if _is_ready(p)]
    metrics = await scrape_pods(
        ctx.scraper, ready, ctx.plan_settings.port, ctx.config.scrape_url_template, ctx.config.scrape_timeout_seconds
    )
    by_pool: dict[str, list] = {}
    for pod, value in zip(ready, metrics):
        by_pool.setdefault((pod["metadata"].get("labels") or {}).get(POOL_LABEL, ""), []).append(value)
    for pod in pods:  # unready pods count as missing, as the HPA counts them
        if not _is_ready(pod):
            by_pool.setdefault((pod["metadata"].get("labels") or {}).get(POOL_LABEL, ""), []).append(None)
    free = _free_capacities(ctx, meta["namespace"], meta["name"], service.spec, capacities)
    deployments = {d["metadata"]["name"]: d for d in ctx.cache.values(DEPLOYMENTS, key)}
    loads = []
    for entry in plan_status.get("pools", []):
        live = deployments.get(deployment_name(meta["name"], entry["name"]))
        current = (
            int((live or {}).get("spec", {}).get("replicas", entry.get("desiredReplicas", 0)))
            if live
            else state.replicas.get(entry["name"], entry.get("desiredReplicas", 0))
        )
        is_building = bool(entry.get("engineBuild")) and entry.get("buildState") not in ("Ready", "Failed")
        loads.append(
            PoolLoad(
                entry["name"], current, free.get(entry["name"], 0), tuple(by_pool.get(entry["name"], ())), is_building
            )
        )
    decisions = autoscaling.decide(scaling, loads, state.history, now)
    previous = (service_obj.get("status") or {}).get("autoscaling") or {}
    last_scale = (
        now.strftime("%Y-%m-%dT%H:%M:%SZ")
        if any(d.desired != d.current for d in decisions)
        else previous.get("lastScaleTime")
    )
    status = {"pools": [{"name": d.name, "currentReplicas": d.current, "desiredReplicas": d.desired, "metric": d.metric,
                         "value": _format(d.value), "target": _format(d.target), "reason": d.reason} for d in decisions]}  # fmt: skip
    if last_scale:
        status["lastScaleTime"] = last_scale
    state.decided_at, state.replicas, state.status = time.monotonic(), {d.name: d.desired for d in decisions}, status
    return Scaled(dict(state.replicas), status, _events(decisions))

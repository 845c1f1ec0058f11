"""What the autoscaler reads before a service is planned: the serving pods' /metrics, at most every
--autoscale-seconds (between scrapes the last decision stands), and the GPUs other services hold in each pool."""

from __future__ import annotations

import dataclasses
import time

from inferfleet_operator.api.names import COMPONENT_LABEL, POOL_LABEL, SERVICE_LABEL
from inferfleet_operator.controller.cache import DEPLOYMENTS
from inferfleet_operator.controller.scrape import scrape_pods
from inferfleet_operator.plan.autoscaling import LoadReading, Scaling, gpus_held


@dataclasses.dataclass(frozen=True)
class ScalingState:
    """Per autoscaled service, kept by the Context between reconciles: its last decision and when it was made."""

    decided_at: float  # monotonic time of the scrape the decision was made from
    last: Scaling


def is_due(ctx, state: ScalingState | None) -> bool:
    """Whether this reconcile reads the pods' metrics (and the autoscaler decides anew)."""
    if state is None or not state.last.replicas:
        return True
    return time.monotonic() - state.decided_at >= ctx.config.autoscale_seconds


def _is_ready(pod: dict) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


async def read_load(ctx, namespace: str, name: str) -> LoadReading:
    """Each pool's serving pods' metrics (a pod that is not ready or does not answer counts as missing, as the
    HPA counts it) and the GPUs other inferfleet services' Deployments hold in each pool."""
    selector = f"{SERVICE_LABEL}={name},{COMPONENT_LABEL}=server"
    pods = [
        p
        for p in await ctx.kube.list("v1", "Pod", namespace, label_selector=selector)
        if not p["metadata"].get("deletionTimestamp")
    ]
    ready = [p for p in pods if _is_ready(p)]
    metrics = await scrape_pods(
        ctx.scraper, ready, ctx.plan_settings.port, ctx.config.scrape_url_template, ctx.config.scrape_timeout_seconds
    )
    by_pool: dict[str, list] = {}
    for pod, value in zip(ready, metrics):
        by_pool.setdefault((pod["metadata"].get("labels") or {}).get(POOL_LABEL, ""), []).append(value)
    for pod in pods:
        if not _is_ready(pod):
            by_pool.setdefault((pod["metadata"].get("labels") or {}).get(POOL_LABEL, ""), []).append(None)
    held: dict[str, int] = {}
    for deployment in ctx.cache.all_values(DEPLOYMENTS):
        labels = deployment["metadata"].get("labels") or {}
        pool = labels.get(POOL_LABEL)
        if pool and (labels.get(SERVICE_LABEL), deployment["metadata"].get("namespace")) != (name, namespace):
            held[pool] = held.get(pool, 0) + gpus_held(deployment)
    return LoadReading({pool: tuple(values) for pool, values in by_pool.items()}, held)

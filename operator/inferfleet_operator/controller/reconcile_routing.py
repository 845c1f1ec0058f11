"""The InferencePool part of a service reconcile: whether the GAIE CRD is served (cached), apply or delete the pool."""

from __future__ import annotations

import logging
import time

from inferfleet_operator.api.names import POOL_API_VERSION, POOL_KIND, POOL_VERSION
from inferfleet_operator.kube.client import ApiError
from inferfleet_operator.plan import routing

logger = logging.getLogger("inferfleet_operator")

SERVED_TTL_SECONDS = 30.0  # discovery is re-asked at most this often; a CRD event clears it at once


def crd_serves_pool(crd: dict, is_deleted: bool = False) -> bool:
    """Whether the GAIE CRD object, as an event shows it, serves InferencePools in POOL_VERSION: established and that
    version served. Read from the event itself because API discovery lags the CRD by a moment: asked right after the
    event, it could still say "absent", and that answer would be cached for SERVED_TTL_SECONDS."""
    if is_deleted or (crd.get("metadata") or {}).get("deletionTimestamp"):
        return False
    conditions = (crd.get("status") or {}).get("conditions") or []
    is_established = any(c.get("type") == "Established" and c.get("status") == "True" for c in conditions)
    versions = (crd.get("spec") or {}).get("versions") or []
    return is_established and any(v.get("name") == POOL_VERSION and v.get("served") for v in versions)


def observe_pool_crd(ctx, crd: dict, is_deleted: bool = False) -> None:
    """Records what a CRD event says (served or not) as if discovery had just answered it."""
    ctx.pool_served = (time.monotonic(), crd_serves_pool(crd, is_deleted))


async def is_pool_served(ctx) -> bool:
    cached = ctx.pool_served
    if cached is not None and time.monotonic() - cached[0] < SERVED_TTL_SECONDS:
        return cached[1]
    try:
        served = await ctx.kube.is_served(POOL_API_VERSION, POOL_KIND)
    except ApiError as error:
        logger.warning("Failed to discover %s: %s", POOL_API_VERSION, error)
        served = False
    ctx.pool_served = (time.monotonic(), served)
    return served


async def apply(ctx, service_obj: dict, planned: routing.RoutingPlan) -> int:
    """Applies the planned InferencePool (forced: drift repair) or deletes the one a previous plan made; -> writes."""
    meta = service_obj["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    if planned.pool is not None:
        live = await ctx.kube.get(POOL_API_VERSION, POOL_KIND, namespace, name)
        return int(await ctx.apply(planned.pool, live))
    if planned.warning is not None:
        await ctx.events.post(service_obj, [planned.warning], "Route")
    if planned.stale_pool and await ctx.kube.delete(POOL_API_VERSION, POOL_KIND, namespace, planned.stale_pool):
        logger.info("Deleted InferencePool %s/%s (routing no longer planned)", namespace, planned.stale_pool)
        return 1
    return 0

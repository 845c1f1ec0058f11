"""The InferencePool part of a service reconcile: whether the GAIE CRD is served (cached), apply or delete the pool."""

from __future__ import annotations

import logging
import time

from inferfleet_operator.api import types as api
from inferfleet_operator.api.conditions import warning
from inferfleet_operator.api.names import POOL_API_VERSION, POOL_KIND
from inferfleet_operator.kube.client import ApiError
from inferfleet_operator.plan import routing

logger = logging.getLogger("inferfleet_operator")

SERVED_TTL_SECONDS = 30.0  # discovery is re-asked at most this often; a CRD event clears it at once


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


async def plan(ctx, service_obj: dict, plan_status: dict) -> routing.RoutingPlan:
    """The routing plan; records status.routing in `plan_status`."""
    service = api.parse_service(service_obj)
    is_allowed = ctx.config.inference_pools != "disabled"
    is_served = is_allowed and service.spec.routing.inference_pool != "Disabled" and await is_pool_served(ctx)
    serving = [p["name"] for p in plan_status.get("pools", []) if p.get("servingEngine") not in (None, "None")]
    result = routing.plan_routing(service, serving, is_served, is_allowed, ctx.plan_settings)
    plan_status["routing"] = result.status
    return result


async def apply(ctx, service_obj: dict, result: routing.RoutingPlan) -> int:
    """Applies the planned InferencePool (forced: drift repair) or deletes the one a previous plan made; -> writes."""
    meta = service_obj["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    if result.pool is not None:
        live = await ctx.kube.get(POOL_API_VERSION, POOL_KIND, namespace, name)
        return int(await ctx.apply(result.pool, live))
    if (
        service_obj["spec"].get("routing", {}).get("inferencePool") == "Enabled"
        and result.status["reason"] != routing.REASON_DISABLED
    ):
        await ctx.events.post(service_obj, [warning(result.status["reason"], result.status["message"])], "Route")
    previous = ((service_obj.get("status") or {}).get("routing") or {}).get("inferencePool")
    if previous and ctx.config.inference_pools != "disabled" and await is_pool_served(ctx):
        if await ctx.kube.delete(POOL_API_VERSION, POOL_KIND, namespace, previous):
            logger.info("Deleted InferencePool %s/%s (routing no longer planned)", namespace, previous)
            return 1
    return 0

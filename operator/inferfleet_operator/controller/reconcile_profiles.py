"""The pool profiles a routed service's pods measured (serve --calibrate, GET /profile), read once per pod and shown
in status.pools[].profile: the rates its router routes that pool by."""

from __future__ import annotations

import asyncio
import json
import logging

import httpx

from inferfleet_operator.api.names import POOL_LABEL
from inferfleet_operator.controller.scrape import pod_url, read_page
from inferfleet_operator.plan.endpoint_picker import PoolProfile, profile_from_json

logger = logging.getLogger("inferfleet_operator")


def describe(profile: PoolProfile, pod: str) -> str:
    """One line for status: the top decode and prefill points, the batch and KV limits, and which pod measured."""
    batch, decode = profile.decode[-1]
    length, prefill = profile.prefill[-1]
    return (
        f"decode {decode:,.4g} tokens/s at batch {batch}, prefill {prefill:,.4g} tokens/s at {length} tokens; "
        f"batch up to {profile.max_batch}, KV {profile.kv_capacity_tokens:,} tokens; measured by pod {pod}"
    )


def _is_ready(pod: dict) -> bool:
    conditions = (pod.get("status") or {}).get("conditions") or []
    return any(c.get("type") == "Ready" and c.get("status") == "True" for c in conditions)


async def _ask(ctx, pod: dict) -> str | None:
    """The pod's measured profile as status says it; None when it has none, cannot be reached or lies about it."""
    url = pod_url(pod, ctx.plan_settings.port, ctx.config.scrape_url_template)
    if url is None:
        return None
    url = url.rsplit("/", 1)[0] + "/profile"
    try:
        text = await asyncio.wait_for(read_page(ctx.scraper, url), ctx.config.scrape_timeout_seconds)
        return describe(profile_from_json(json.loads(text)), pod["metadata"]["name"])
    except (TimeoutError, httpx.HTTPError, ValueError) as error:  # JSONDecodeError is a ValueError
        logger.debug("No pool profile from %s: %s", url, error)
        return None


async def read_profiles(ctx, namespace: str, name: str, pods: list[dict]) -> dict[str, str]:
    """pool -> its profile line, from one ready pod of each pool. Each pod is asked once (ctx.profiles remembers
    the answer, or that there was none, by pod name); a pool keeps its line while the pod that measured it lives."""
    known = ctx.profiles.setdefault((namespace, name), {})
    live = {p["metadata"]["name"]: p for p in pods if not p["metadata"].get("deletionTimestamp")}
    for gone in set(known) - set(live):
        del known[gone]
    by_pool: dict[str, str] = {}
    asking: dict[str, dict] = {}
    for pod_name, pod in sorted(live.items()):
        pool = (pod["metadata"].get("labels") or {}).get(POOL_LABEL, "")
        if pool in by_pool or not pool:
            continue
        if pod_name in known:
            if known[pod_name] is not None:
                by_pool[pool] = known[pod_name]
        elif _is_ready(pod) and pool not in asking:
            asking[pool] = pod
    answers = await asyncio.gather(*(_ask(ctx, pod) for pod in asking.values()))
    for (pool, pod), answer in zip(asking.items(), answers):
        known[pod["metadata"]["name"]] = answer
        if answer is not None and pool not in by_pool:
            by_pool[pool] = answer
    return by_pool

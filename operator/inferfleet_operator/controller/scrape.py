"""Reads the serving pods' own /metrics (the autoscaler's only I/O besides the API): bounded by a timeout per pod,
and a pod that does not answer, or answers without the metrics, counts as missing (the HPA's rule)."""

from __future__ import annotations

import asyncio
import logging
import math

import httpx
from prometheus_client.parser import text_string_to_metric_families

from inferfleet_operator.api.names import POOL_LABEL
from inferfleet_operator.plan.autoscaling import KV_USAGE, WAITING, PodMetrics

DEFAULT_URL_TEMPLATE = "http://{ip}:{port}/metrics"
MAX_SCRAPE_BYTES = 1 << 20  # a serving pod's page is a few KB; a larger one is not read past this
# What a sample of each gauge may hold; a pod reporting anything else (NaN, inf, negative, absurd) counts as missing.
_BOUNDS = {WAITING: 1e9, KV_USAGE: 1.0}

logger = logging.getLogger("inferfleet_operator")


def bounded_sums(text: str, bounds: dict[str, float]) -> dict[str, float]:
    """The samples named in `bounds` from a Prometheus text page, each summed over its label sets (one per model). A
    name with any sample that is not finite or lies outside [0, its bound] is left out: the pod's word is not taken
    for it."""
    found: dict[str, float] = {}
    invalid: set[str] = set()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name in bounds:
                value = sample.value
                if not math.isfinite(value) or not 0 <= value <= bounds[sample.name]:
                    invalid.add(sample.name)
                found[sample.name] = found.get(sample.name, 0.0) + value
    for name in invalid:
        found.pop(name)
    return found


def parse_metrics(text: str) -> PodMetrics:
    """The two load gauges from a Prometheus text page (bounded_sums)."""
    found = bounded_sums(text, _BOUNDS)
    return PodMetrics(waiting=found.get(WAITING), kv_usage=found.get(KV_USAGE))


def pod_url(pod: dict, port: int, template: str = DEFAULT_URL_TEMPLATE) -> str | None:
    """Where a pod's /metrics is: the template filled with {ip}, {port}, {namespace}, {pod}, {pool}.
    The default is the pod IP; tests point it at a stand-in on loopback (--scrape-url-template)."""
    ip = (pod.get("status") or {}).get("podIP")
    if not ip and "{ip}" in template:
        return None
    meta = pod.get("metadata") or {}
    return template.format(
        ip=ip,
        port=port,
        namespace=meta.get("namespace", ""),
        pod=meta.get("name", ""),
        pool=(meta.get("labels") or {}).get(POOL_LABEL, ""),
    )


async def _scrape_one(http: httpx.AsyncClient, url: str | None, timeout: float) -> PodMetrics | None:
    if url is None:
        return None
    try:
        text = await asyncio.wait_for(read_page(http, url), timeout)
        metrics = parse_metrics(text)
    except (TimeoutError, httpx.HTTPError, ValueError) as error:
        logger.debug("Failed to scrape %s: %s", url, error)
        return None
    return None if metrics.waiting is None and metrics.kv_usage is None else metrics


async def read_page(http: httpx.AsyncClient, url: str) -> str:
    """The page as text, read as a stream: a page over MAX_SCRAPE_BYTES is a ValueError before it is read whole."""
    async with http.stream("GET", url) as response:
        response.raise_for_status()
        body = bytearray()
        async for chunk in response.aiter_bytes():
            body += chunk
            if len(body) > MAX_SCRAPE_BYTES:
                raise ValueError(f"the metrics page is over {MAX_SCRAPE_BYTES} bytes")
        return body.decode("utf-8", "replace")


async def scrape_pods(
    http: httpx.AsyncClient, pods: list[dict], port: int, template: str = DEFAULT_URL_TEMPLATE, timeout: float = 2.0
) -> list[PodMetrics | None]:
    """One entry per pod, in order, scraped concurrently; `timeout` seconds bound each pod's whole request."""
    return list(await asyncio.gather(*(_scrape_one(http, pod_url(pod, port, template), timeout) for pod in pods)))

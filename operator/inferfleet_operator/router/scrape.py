"""The router's scraper: every endpoint's /ready and /metrics, bounded in size and time (the pages are untrusted),
read with the autoscaler's reader and parser (controller.scrape) and turned into the picker's EndpointMetrics."""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Callable

import httpx

from inferfleet_operator.controller.scrape import bounded_sums, parse_metrics, read_page
from inferfleet_operator.plan.endpoint_picker import EndpointMetrics
from inferfleet_operator.router.config import ConfigError, parse_profile
from inferfleet_operator.router.endpoints import EndpointSource, EndpointState, EndpointTable

RUNNING = "inferfleet:num_requests_running"
GENERATED = "inferfleet:generation_tokens_total"
# What a sample may hold beyond the autoscaler's two gauges; anything else (NaN, inf, negative, absurd) is dropped.
_BOUNDS = {RUNNING: 1e6, GENERATED: 1e18}

log = logging.getLogger(__name__)


def parse_running_and_generated(text: str) -> tuple[float | None, float | None]:
    """Running sequences and output tokens generated so far, summed over label sets; None when absent or invalid."""
    found = bounded_sums(text, _BOUNDS)
    return found.get(RUNNING), found.get(GENERATED)


def endpoint_metrics(
    text: str, now: float, previous: tuple[float, float] | None
) -> tuple[EndpointMetrics, tuple[float, float] | None]:
    """The picker's metrics from one page, and (now, tokens generated) for the next scrape's rate. The observed
    rate is the generated-tokens counter's rise since the previous scrape; none after a counter reset."""
    load = parse_metrics(text)
    running, generated = parse_running_and_generated(text)
    rate = None
    if previous is not None and generated is not None and now > previous[0] and generated >= previous[1]:
        rate = (generated - previous[1]) / (now - previous[0])
    metrics = EndpointMetrics(
        scraped_at=now,
        num_running=running or 0.0,
        num_waiting=load.waiting or 0.0,
        kv_utilisation=load.kv_usage or 0.0,
        observed_tokens_per_s=rate,
    )
    return metrics, (now, generated) if generated is not None else None


async def _is_ready(http: httpx.AsyncClient, url: str) -> bool:
    try:
        response = await http.get(url)
    except httpx.HTTPError:
        return False
    return response.status_code == 200


async def scrape_endpoint(
    http: httpx.AsyncClient, state: EndpointState, timeout: float, clock: Callable[[], float]
) -> tuple[bool, EndpointMetrics | None, tuple[float, float] | None]:
    """(ready, metrics, generated) of one endpoint; metrics None when the page failed, stalled or was too large."""
    url = state.spec.url
    ready = asyncio.ensure_future(asyncio.wait_for(_is_ready(http, f"{url}/ready"), timeout))
    try:
        text = await asyncio.wait_for(read_page(http, f"{url}/metrics"), timeout)
        metrics, generated = endpoint_metrics(text, clock(), state.generated)
    except (TimeoutError, httpx.HTTPError, ValueError) as error:
        log.debug("Failed to scrape %s: %s", url, error)
        metrics, generated = None, None
    try:
        is_ready = await ready
    except TimeoutError:
        is_ready = False
    return is_ready, metrics, generated


async def scrape_round(
    http: httpx.AsyncClient,
    table: EndpointTable,
    source: EndpointSource,
    timeout: float,
    clock: Callable[[], float],
) -> None:
    """Every endpoint the source names, scraped at once; the table updated with what each said."""
    table.sync(await source.endpoints())
    states = table.states()
    results = await asyncio.gather(
        *(scrape_endpoint(http, state, timeout, clock) for state in states), return_exceptions=True
    )
    for state, result in zip(states, results):
        if isinstance(result, BaseException):  # an untrusted page found a parser path that raises otherwise
            log.warning("Failed to scrape %s: %r", state.spec.url, result)
            table.update(state.spec.url, False, None, None)
            continue
        was_ready = state.is_ready
        table.update(state.spec.url, *result)
        if was_ready != result[0]:
            log.info("Endpoint %s (pool %s) became %s", state.spec.url, state.spec.pool, _word(result[0]))


async def read_profile(http: httpx.AsyncClient, state: EndpointState, timeout: float):
    """The pod's measured profile (its /profile, bounded like a metrics page and checked like a profile file's
    entry), or None when it has none or answered something else."""
    url = f"{state.spec.url}/profile"
    try:
        text = await asyncio.wait_for(read_page(http, url), timeout)
        return parse_profile(state.spec.pool, json.loads(text), url)
    except (TimeoutError, httpx.HTTPError, ValueError, ConfigError) as error:  # JSONDecodeError is a ValueError
        log.info("No measured profile from %s: %s", url, error)
        return None


async def ask_profiles(http: httpx.AsyncClient, table: EndpointTable, timeout: float) -> None:
    """For each pool still without a profile, asks one ready pod not asked before for the profile it measured."""
    asking: dict[str, EndpointState] = {}
    for state in table.states():
        pool = state.spec.pool
        if state.is_ready and not state.is_profile_asked and table.profiles.needs_measured(pool):
            asking.setdefault(pool, state)
    for state in asking.values():
        state.is_profile_asked = True
    answers = await asyncio.gather(*(read_profile(http, s, timeout) for s in asking.values()))
    for (pool, state), profile in zip(asking.items(), answers):
        if profile is not None and table.profiles.needs_measured(pool):
            table.record_profile(pool, profile)
            top = profile.decode[-1] if profile.decode else (0, 0.0)
            log.info(
                "Pool %s: profile measured by %s (decode %.0f tokens/s at batch %d)",
                pool,
                state.spec.url,
                top[1],
                top[0],
            )


async def scrape_forever(
    http: httpx.AsyncClient,
    table: EndpointTable,
    source: EndpointSource,
    interval: float,
    timeout: float,
    clock: Callable[[], float],
) -> None:
    while True:
        await scrape_round(http, table, source, timeout, clock)
        await ask_profiles(http, table, timeout)
        await asyncio.sleep(interval)


def _word(is_ready: bool) -> str:
    return "ready" if is_ready else "unready"

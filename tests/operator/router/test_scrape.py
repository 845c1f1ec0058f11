"""The router's scrape: what the runtime exports becomes the picker's metrics, and an untrusted page cannot lie its
way past the bounds or stall a round."""

from __future__ import annotations

import asyncio
import json

import httpx
import pytest

from inferfleet_operator.controller.scrape import MAX_SCRAPE_BYTES
from inferfleet_operator.router.config import EndpointSpec, parse_profiles
from inferfleet_operator.router.endpoints import EndpointTable, StaticEndpointSource
from inferfleet_operator.router.profiles import PoolProfiles
from inferfleet_operator.router.scrape import ask_profiles, endpoint_metrics, scrape_round
from inferfleet_runtime.engine.metrics import ServerMetrics


def page(num_waiting: int, num_running: int, kv: float, num_generated: int) -> str:
    metrics = ServerMetrics("llama")
    metrics.observe_engine(num_waiting=num_waiting, num_running=num_running, kv_cache_usage=kv, num_preemptions=0)
    metrics.count_generated(num_generated)
    return metrics.render().decode()


def test_the_runtimes_page_gives_load_and_the_output_rate_since_the_last_scrape():
    first, generated = endpoint_metrics(page(2, 3, 0.25, 100), now=10.0, previous=None)
    assert (first.num_waiting, first.num_running, first.kv_utilisation) == (2, 3, 0.25)
    assert first.observed_tokens_per_s is None and generated == (10.0, 100)
    second, generated = endpoint_metrics(page(0, 3, 0.25, 300), now=10.5, previous=generated)
    assert second.observed_tokens_per_s == pytest.approx(400) and second.scraped_at == 10.5
    restarted, _ = endpoint_metrics(page(0, 1, 0.0, 5), now=11.0, previous=generated)
    assert restarted.observed_tokens_per_s is None  # the counter went back: the pod restarted


def test_impossible_values_are_dropped_not_believed():
    text = (
        'inferfleet:num_requests_running{model_name="a"} -4\n'
        'inferfleet:num_requests_waiting{model_name="a"} NaN\n'
        'inferfleet:kv_cache_usage_perc{model_name="a"} 7\n'
        'inferfleet:generation_tokens_total{model_name="a"} +Inf\n'
    )
    metrics, generated = endpoint_metrics(text, now=1.0, previous=(0.0, 0.0))
    assert (metrics.num_running, metrics.num_waiting, metrics.kv_utilisation) == (0, 0, 0)
    assert metrics.observed_tokens_per_s is None and generated is None


def scrape(handler) -> EndpointTable:
    specs = tuple(EndpointSpec(f"http://127.0.0.1:{port}", "p") for port in (1, 2, 3, 4))
    table = EndpointTable(PoolProfiles({}))

    async def run():
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as http:
            await scrape_round(http, table, StaticEndpointSource(specs), timeout=0.5, clock=lambda: 5.0)

    asyncio.run(run())
    return table


def test_a_round_finds_who_is_ready_and_answers_and_a_stalled_or_huge_page_counts_as_missing():
    async def handler(request: httpx.Request) -> httpx.Response:
        port, path = request.url.port, request.url.path
        if path == "/ready":
            return httpx.Response(503 if port == 2 else 200)
        if port == 3:
            await asyncio.sleep(5)  # stalls past the round's timeout
        if port == 4:
            return httpx.Response(200, content=b"# filler\n" * (MAX_SCRAPE_BYTES // 9 + 1))
        return httpx.Response(200, text=page(1, 2, 0.5, 10))

    table = scrape(handler)
    states = {state.spec.url[-1]: state for state in table.states()}
    assert [(k, s.is_ready, s.metrics is not None) for k, s in sorted(states.items())] == [
        ("1", True, True),
        ("2", False, True),
        ("3", True, False),
        ("4", True, False),
    ]
    assert [e.address for e in table.pickable()] == ["http://127.0.0.1:1"]


MEASURED = {
    "prefill": [[16, 900.0], [128, 2400.0]],
    "decode": [[1, 40.0], [4, 150.0]],
    "max_batch": 4,
    "kv_capacity_tokens": 2048,
    "block_size": 16,
    "has_prefix_cache": True,
}


def ask(handler, table: EndpointTable, pools: tuple[str, ...] = ("p", "p", "q", "r")) -> list[str]:
    """One scrape round then one round of profile questions over pods 1-4 of the given pools; the paths asked."""
    specs = tuple(EndpointSpec(f"http://127.0.0.1:{port}", pool) for port, pool in enumerate(pools, 1))
    asked = []

    async def recording(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/profile":
            asked.append(f"{request.url.port}/profile")
        return await handler(request)

    async def run():
        async with httpx.AsyncClient(transport=httpx.MockTransport(recording)) as http:
            for _ in range(2):  # a second round asks nobody again
                await scrape_round(http, table, StaticEndpointSource(specs), timeout=0.5, clock=lambda: 5.0)
                await ask_profiles(http, table, timeout=0.5)

    asyncio.run(run())
    return asked


def test_one_ready_pod_per_pool_is_asked_once_for_its_measured_profile_and_a_bad_answer_is_not_believed():
    async def handler(request: httpx.Request) -> httpx.Response:
        port, path = request.url.port, request.url.path
        if path == "/profile":
            if port == 3:
                return httpx.Response(200, text='{"decode": [[1, 1e999]]}')  # infinite, and fields missing
            if port == 4:
                return httpx.Response(404, json={"error": {"code": "no_profile"}})
            return httpx.Response(200, json=MEASURED)
        return httpx.Response(200, text=page(0, 0, 0.0, 0) if path == "/metrics" else "ok")

    table = EndpointTable(PoolProfiles({}))
    asked = ask(handler, table)
    assert sorted(asked) == ["1/profile", "3/profile", "4/profile"]  # pool p once, from its first ready pod
    profiles = table.profiles
    assert (profiles.source("p"), profiles.source("q"), profiles.source("r")) == ("measured", "default", "default")
    assert profiles.profile_for("p").decode == ((1, 40.0), (4, 150.0))
    assert {e.address: e.profile.max_batch for e in table.endpoints()}["http://127.0.0.1:2"] == 4  # the pool's


def test_a_pool_with_a_profile_file_entry_is_not_asked():
    async def handler(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, json=MEASURED) if request.url.path == "/profile" else httpx.Response(200, text="")

    table = EndpointTable(PoolProfiles(parse_profiles(json.dumps({"p": MEASURED, "q": MEASURED, "r": MEASURED}), "f")))
    assert ask(handler, table) == []

"""A routed service's pool profiles in status: read from one ready pod of each pool (GET /profile), once per pod,
kept while that pod lives; an answer that is not a valid profile is not shown."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

import httpx
from planning_data import NOW, RUNTIMES, cpu, service

from inferfleet_operator.api.types import PlanSettings
from inferfleet_operator.controller.reconcile_profiles import read_profiles
from inferfleet_operator.plan.cluster import cluster_view
from inferfleet_operator.plan.planner import ServiceInputs, plan_reconcile

PROFILE = {
    "prefill": [[16, 900.0], [128, 2400.0]],
    "decode": [[1, 40.0], [4, 126.6]],
    "max_batch": 4,
    "kv_capacity_tokens": 2048,
    "block_size": 16,
    "has_prefix_cache": True,
}


def pod(name: str, pool: str, ip: str, ready: bool = True) -> dict:
    return {
        "metadata": {"name": name, "labels": {"inferfleet.dev/pool": pool}},
        "status": {"podIP": ip, "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
    }


def context(answers: dict[str, httpx.Response]) -> tuple[SimpleNamespace, list[str]]:
    asked = []

    def handler(request: httpx.Request) -> httpx.Response:
        asked.append(f"{request.url.host}{request.url.path}")
        return answers[request.url.host]

    ctx = SimpleNamespace(
        plan_settings=PlanSettings(),
        config=SimpleNamespace(scrape_url_template="http://{ip}:{port}/metrics", scrape_timeout_seconds=1.0),
        scraper=httpx.AsyncClient(transport=httpx.MockTransport(handler)),
        profiles={},
    )
    return ctx, asked


def test_one_ready_pod_per_pool_is_asked_once_and_its_line_stays_while_it_lives():
    ctx, asked = context(
        {
            "10.0.0.1": httpx.Response(200, json=PROFILE),
            "10.0.0.2": httpx.Response(200, json=PROFILE),
            "10.0.1.1": httpx.Response(200, text='{"decode": [[1, 1e999]]}'),  # not a profile
        }
    )
    pods = [pod("a-1", "fast", "10.0.0.1"), pod("a-2", "fast", "10.0.0.2"), pod("b-1", "slow", "10.0.1.1")]
    pods.append(pod("c-1", "third", "10.0.2.1", ready=False))

    async def run():
        first = await read_profiles(ctx, "ns", "svc", pods)
        second = await read_profiles(ctx, "ns", "svc", pods)
        replaced = await read_profiles(ctx, "ns", "svc", pods[1:])  # a-1 is gone: a-2 is asked
        return first, second, replaced

    first, second, replaced = asyncio.run(run())
    assert first == second and list(first) == ["fast"]  # the slow pool's answer was no profile; third is unready
    assert first["fast"] == (
        "decode 126.6 tokens/s at batch 4, prefill 2,400 tokens/s at 128 tokens; batch up to 4, KV 2,048 tokens; "
        "measured by pod a-1"
    )
    assert replaced["fast"].endswith("measured by pod a-2")
    assert asked == ["10.0.0.1/profile", "10.0.1.1/profile", "10.0.0.2/profile"]  # none asked twice


def test_the_line_reaches_the_pools_status():
    inputs = ServiceInputs(
        service(placement={"vendors": ["cpu"]}),
        cluster_view([cpu("c1")], RUNTIMES),
        NOW,
        profiles={"cpu-amd64": "decode 1 tokens/s at batch 1"},
    )
    (entry,) = plan_reconcile(inputs).status["pools"]
    assert entry["profile"] == "decode 1 tokens/s at batch 1"

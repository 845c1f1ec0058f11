"""Routing by measured speed on kind: one service over two real pools whose pods differ in speed for a real reason,
the control-plane node's pool (cpu-amd64) and the worker node's (a node class of its own, on WORKER_CPUS of the
host's cores). Each pod measures its profile at start (serve --calibrate); the service's router reads them and sends
concurrent requests by predicted finish time. Printed: each pool's measured decode rate, its share of capacity and its
share of the requests. The release and the serving namespace are the fleet module's fixtures."""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest
from helpers import wait_for
from kind import test_kind_fleet as fleet
from prometheus_client.parser import text_string_to_metric_families

release, serve_ns = fleet.release, fleet.serve_ns  # the fleet module's fixtures, used here by name

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(1800)]

SERVICE = "speeds"
NUM_REQUESTS, CONCURRENCY, MAX_TOKENS = 36, 6, 24
RATE = "inferfleet_router_pool_decode_tokens_per_second"


def _by_pool(page: str, name: str) -> dict[str, tuple[str, float]]:
    """pool -> (source label or "", value summed over the pool's samples) of a router metric."""
    found: dict[str, tuple[str, float]] = {}
    for family in text_string_to_metric_families(page):
        for item in family.samples:
            if item.name == name:
                pool = item.labels["pool"]
                source, total = found.get(pool, ("", 0.0))
                found[pool] = (item.labels.get("source", source), total + item.value)
    return found


def test_a_faster_pool_gets_more_of_the_requests_by_its_measured_speed(kind_cluster, serve_ns):
    workers = kind_cluster.env.get("KIND_WORKERS", "").split()
    assert workers, "the test cluster has no worker node (e2e/kind/up.sh makes one for the test tier)"
    fast, slow = fleet.CPU_POOL, f"{fleet.CPU_POOL}-{kind_cluster.env['WORKER_CLASS']}"
    service = fleet._service(SERVICE, ["cpu"], 2)
    service["spec"]["pools"] = [{"name": fast, "replicas": 1}, {"name": slow, "replicas": 1}]
    service["spec"]["placement"]["tolerations"] = [
        {"key": "inferfleet.dev/node-class", "operator": "Exists", "effect": "NoSchedule"}
    ]
    kind_cluster.apply(service, namespace=serve_ns)
    try:
        for pool in (fast, slow):
            wait_for(
                lambda pool=pool: fleet._ready_replicas(kind_cluster, serve_ns, f"{SERVICE}-{pool}") >= 1,
                timeout=900,
                interval=2,
                message=f"{SERVICE}-{pool} ready (its pod loaded the model and measured its profile)",
            )
        pods = kind_cluster.items("pods", serve_ns, f"inferfleet.dev/service={SERVICE},{fleet.SERVERS}")
        nodes = {p["metadata"]["labels"]["inferfleet.dev/pool"]: p["spec"]["nodeName"] for p in pods}
        assert nodes == {fast: kind_cluster.env["KIND_NODE"], slow: workers[0]}, nodes

        with fleet.port_forward(kind_cluster, serve_ns, f"service/{SERVICE}", 8000) as base:

            def measured() -> dict:
                rates = _by_pool(httpx.get(f"{base}/metrics", timeout=10).text, RATE)
                is_both = all(rates.get(pool, ("", 0))[0] == "measured" for pool in (fast, slow))
                return rates if is_both else {}

            rates = wait_for(measured, timeout=60, interval=1, message="both pools' measured profiles in the router")
            client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=300)

            def one(i: int) -> int:
                reply = client.completions.create(
                    model=fleet.MODEL,
                    prompt=f"{i}: Beautiful is better than",
                    max_tokens=MAX_TOKENS,
                    extra_body={"ignore_eos": True},
                )
                return reply.usage.completion_tokens

            began = time.monotonic()
            with ThreadPoolExecutor(CONCURRENCY) as pool:
                tokens = list(pool.map(one, range(NUM_REQUESTS)))
            elapsed = time.monotonic() - began
            page = httpx.get(f"{base}/metrics", timeout=10).text
        assert tokens == [MAX_TOKENS] * NUM_REQUESTS
        routed = {pool: value for pool, (_, value) in _by_pool(page, "inferfleet_router_routed_requests_total").items()}
        total = sum(routed.values())
        fast_rate, slow_rate = rates[fast][1], rates[slow][1]
        capacity_share = fast_rate / (fast_rate + slow_rate)
        share = routed.get(fast, 0) / total
        print(
            f"\nmeasured decode tokens/s: {fast} {fast_rate:.0f}, {slow} {slow_rate:.0f} (capacity share of {fast}: "
            f"{capacity_share:.2f}); requests routed: {routed} (share of {fast}: {share:.2f}); "
            f"{NUM_REQUESTS} requests x {MAX_TOKENS} tokens at concurrency {CONCURRENCY} in {elapsed:.1f} s "
            f"({NUM_REQUESTS * MAX_TOKENS / elapsed:.0f} output tokens/s)"
        )
        assert fast_rate > 1.25 * slow_rate, "the worker node's fewer cores should make its pool measurably slower"
        assert total >= NUM_REQUESTS
        assert share > 0.6, "the faster pool should get most of the requests"
    finally:
        kind_cluster.kubectl("delete", "infsvc", SERVICE, "-n", serve_ns, "--wait=true", "--timeout=120s", timeout=150)

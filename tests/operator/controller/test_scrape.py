"""The scrape of serving pods' /metrics: parses what the runtime exports, and a pod that fails or stalls is missing."""

from __future__ import annotations

import asyncio

import httpx

from inferfleet_operator.controller.scrape import parse_metrics, pod_url, scrape_pods
from inferfleet_operator.plan.autoscaling import PodMetrics
from inferfleet_runtime.engine.metrics import ServerMetrics


def _pod(name: str, ip: str | None = "10.0.0.1") -> dict:
    status = {"podIP": ip} if ip else {}
    return {
        "metadata": {"name": name, "namespace": "team-a", "labels": {"inferfleet.dev/pool": "nvidia-h100"}},
        "status": status,
    }


def test_parses_the_load_gauges_the_runtime_server_exports():
    metrics = ServerMetrics("llama")
    metrics.observe_engine(num_waiting=7, num_running=3, kv_cache_usage=0.42, num_preemptions=0)
    assert parse_metrics(metrics.render().decode()) == PodMetrics(waiting=7.0, kv_usage=0.42)


def test_pod_url_fills_the_template_and_a_pod_without_an_ip_has_none():
    assert pod_url(_pod("a"), 8000) == "http://10.0.0.1:8000/metrics"
    assert (
        pod_url(_pod("a"), 8000, "http://127.0.0.1:9999/{namespace}/{pool}/{pod}")
        == "http://127.0.0.1:9999/team-a/nvidia-h100/a"
    )
    assert pod_url(_pod("a", ip=None), 8000) is None
    assert pod_url(_pod("a", ip=None), 8000, "http://127.0.0.1:9999/{pod}") == "http://127.0.0.1:9999/a", (
        "no {ip}: no IP needed"
    )


def test_a_pod_that_errors_stalls_or_lacks_the_metrics_counts_as_missing():
    async def handler(request: httpx.Request) -> httpx.Response:
        name = request.url.path.rsplit("/", 1)[-1]
        if name == "slow":
            await asyncio.sleep(5)
        if name == "broken":
            return httpx.Response(500)
        if name == "other":
            return httpx.Response(200, text="some_other_metric 1\n")
        return httpx.Response(200, text='inferfleet:num_requests_waiting{model_name="m"} 3\n')

    async def run():
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler), timeout=30) as http:
            pods = [_pod(n) for n in ("ok", "broken", "other", "slow")] + [_pod("no-ip", ip=None)]
            return await scrape_pods(http, pods, 8000, "http://{ip}/{pod}", timeout=0.2)

    ok, broken, other, slow, no_ip = asyncio.run(run())
    assert ok == PodMetrics(waiting=3.0, kv_usage=None)
    assert broken is other is no_ip is None
    assert slow is None


def test_non_finite_negative_or_absurd_gauges_are_not_taken_from_a_pod():
    page = 'inferfleet:num_requests_waiting{model_name="m"} NaN\ninferfleet:kv_cache_usage_perc{model_name="m"} 0.5\n'
    assert parse_metrics(page) == PodMetrics(waiting=None, kv_usage=0.5)
    for waiting, usage in (("+Inf", "1.7"), ("-3", "-0.1"), ("1e300", "NaN")):
        page = f"inferfleet:num_requests_waiting {waiting}\ninferfleet:kv_cache_usage_perc {usage}\n"
        assert parse_metrics(page) == PodMetrics(waiting=None, kv_usage=None), (waiting, usage)


def test_a_page_over_the_size_limit_counts_as_missing_without_being_read_whole():
    served = []

    async def handler(request: httpx.Request) -> httpx.Response:
        async def body():
            yield b"inferfleet:num_requests_waiting 1\n"
            for _ in range(2048):  # 2 GiB if read whole
                served.append(1)
                yield b"#" * (1 << 20) + b"\n"

        return httpx.Response(200, content=body())

    async def run():
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler), timeout=30) as http:
            return await scrape_pods(http, [_pod("huge")], 8000, "http://{ip}/{pod}", timeout=10)

    assert asyncio.run(run()) == [None]
    assert len(served) <= 3  # stopped just past the 1 MiB limit

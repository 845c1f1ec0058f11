"""Routing benchmark on the kind tier's cluster (not collected by the test run: a command that prints figures).

    INFERFLEET_BENCH_SECONDS=45 INFERFLEET_BENCH_OUT=results.json python -m pytest e2e/kind/bench_routing.py -s

One service serving SmolLM2-135M-Instruct (the demo's real model, fetched once into the cluster's model folder) over
two real pools of different speed: the control-plane node's (cpu-amd64) and the worker node's
(a node class of its own, on fewer of the host's cores; e2e/kind/up.sh). Its pods first run in mode Router, where
each measures its profile at start; the fleet's capacity is the sum of the pools' measured decode rates at their
largest batch. An open-loop client in a pod of the cluster (Poisson arrivals, streamed completions of MAX_TOKENS
tokens, a new connection per request) then drives the service's own endpoint at 50/80/100/120% of that capacity,
first in mode Router (the service's router picks each pod), then in mode Service (kube-proxy spreads connections,
round-robin in effect), on the same nodes. Printed per mode and load: output tokens/s, TTFT p50/p99, inter-token
latency p50/p99, failed requests and each pool's share of the requests (from each pod's own request counter).
The release and the serving namespace are the fleet module's fixtures."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys

import pytest
from helpers import wait_for
from kind import test_kind_fleet as fleet
from prometheus_client.parser import text_string_to_metric_families

release, serve_ns = fleet.release, fleet.serve_ns  # the fleet module's fixtures, used here by name

SERVICE = "bench"
MODEL = "smollm2"  # `inferfleet-runtime demo-model --real`: the demo's GGUF file, served as float32
MAX_TOKENS = 32
LOADS = (0.5, 0.8, 1.0, 1.2)
FINISHED = "inferfleet:e2e_request_latency_seconds_count"
RATE = "inferfleet_router_pool_decode_tokens_per_second"

# Runs in the client pod (the runtime image has httpx): Poisson arrivals at RATE requests/s for SECONDS, each a
# streamed completion on a connection of its own; one JSON line per request with the arrival time of every chunk.
LOAD = r"""
import asyncio, json, random, sys, time, httpx
url, rate, seconds, max_tokens, model = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
rng = random.Random(7)

async def one(client, i):
    body = {"model": model, "prompt": f"{i}: Beautiful is better than", "max_tokens": max_tokens,
            "ignore_eos": True, "stream": True}
    start, times, outcome = time.time(), [], "ok"
    try:
        async with client.stream("POST", url, json=body) as response:
            if response.status_code != 200:
                outcome = f"http {response.status_code}"
            else:
                async for line in response.aiter_lines():
                    if line.startswith("data: ") and line != "data: [DONE]":
                        choices = json.loads(line[6:]).get("choices") or [{}]
                        if choices[0].get("text"):
                            times.append(time.time() - start)
    except httpx.HTTPError as error:
        outcome = type(error).__name__
    print(json.dumps({"start": start, "times": times, "outcome": outcome}), flush=True)

async def main():
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        tasks, at, i = [], time.time(), 0
        end = at + seconds
        while True:
            at += rng.expovariate(rate)
            if at > end:
                break
            await asyncio.sleep(max(0.0, at - time.time()))
            tasks.append(asyncio.create_task(one(client, i)))
            i += 1
        await asyncio.gather(*tasks)

asyncio.run(main())
"""


@pytest.fixture
def seconds() -> float:
    return float(os.environ.get("INFERFLEET_BENCH_SECONDS") or 45)


def _service(kind_cluster, mode: str) -> dict:
    fast, slow = fleet.CPU_POOL, f"{fleet.CPU_POOL}-{kind_cluster.env['WORKER_CLASS']}"
    service = fleet._service(
        SERVICE, ["cpu"], 2, engine={"maxContextLength": 512, "maxBatchSize": 4, "dtype": "float32"}
    )
    service["spec"]["model"] = {"name": MODEL, "uri": f"pvc://models/{MODEL}"}
    service["spec"]["resources"] = {"cpu": "250m", "memory": "2560Mi"}  # the Q4_1 file dequantized: 2 GiB at its peak
    service["spec"]["pools"] = [{"name": fast, "replicas": 1}, {"name": slow, "replicas": 1}]
    service["spec"]["placement"]["tolerations"] = [
        {"key": "inferfleet.dev/node-class", "operator": "Exists", "effect": "NoSchedule"}
    ]
    service["spec"]["routing"]["mode"] = mode
    return service


def _settled(kind_cluster, namespace: str, mode: str) -> list[dict]:
    """The serving pods once every pool's Deployment runs only pods of the mode's template, all ready."""
    pods = kind_cluster.items("pods", namespace, f"inferfleet.dev/service={SERVICE},{fleet.SERVERS}")
    live = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
    calibrated = ["--calibrate" in p["spec"]["containers"][0]["args"] for p in live]
    is_ready = all(
        any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions", [])) for p in live
    )
    wanted = mode == "Router"
    return live if len(live) == 2 and is_ready and all(c == wanted for c in calibrated) else []


def _pod_metric(kind_cluster, namespace: str, pod: str, name: str) -> float:
    """A sample of a serving pod's own /metrics, read through the API server's pod proxy."""
    page = kind_cluster.kubectl("get", "--raw", f"/api/v1/namespaces/{namespace}/pods/{pod}:8000/proxy/metrics").stdout
    return sum(s.value for f in text_string_to_metric_families(page) for s in f.samples if s.name == name)


def _run_load(kind_cluster, namespace: str, rate: float, seconds: float, name: str) -> list[dict]:
    pod = fleet._client_pod(name, kind_cluster.runtime_image, int(seconds))
    container = pod["spec"]["containers"][0]
    container["command"] = ["python", "-c", LOAD]
    container["args"] = [f"http://{SERVICE}:8000/v1/completions", f"{rate:.4f}", str(seconds), str(MAX_TOKENS), MODEL]
    kind_cluster.apply(pod, namespace=namespace)
    wait_for(
        lambda: (
            (kind_cluster.get("pod", name, namespace) or {}).get("status", {}).get("phase") in ("Succeeded", "Failed")
        ),
        timeout=seconds + 600,
        interval=2,
        message=f"the load client {name} finished",
    )
    lines = kind_cluster.kubectl("logs", name, "-n", namespace).stdout.splitlines()
    kind_cluster.kubectl("delete", "pod", name, "-n", namespace, "--wait=false")
    return [json.loads(line) for line in lines if line.startswith("{")]


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _summary(records: list[dict], shares: dict[str, float]) -> dict:
    done = [r for r in records if r["outcome"] == "ok" and r["times"]]
    first = min(r["start"] for r in records)
    last = max(r["start"] + r["times"][-1] for r in done) if done else first + 1
    ttft = [r["times"][0] for r in done]
    itl = [b - a for r in done for a, b in zip(r["times"], r["times"][1:])]
    return {
        "requests": len(records),
        "failed": len(records) - len(done),
        "output_tokens_per_s": sum(len(r["times"]) for r in done) / (last - first),
        "ttft_p50_s": statistics.median(ttft) if ttft else float("nan"),
        "ttft_p99_s": _percentile(ttft, 0.99),
        "itl_p50_s": statistics.median(itl) if itl else float("nan"),
        "itl_p99_s": _percentile(itl, 0.99),
        "shares": shares,
    }


def _fetch_model(kind_cluster) -> None:
    folder = kind_cluster.models_dir / MODEL
    if not folder.exists():
        command = [sys.executable, "-m", "inferfleet_runtime.cli", "demo-model", "--real", "--out", str(folder)]
        subprocess.run(command, check=True)
    for path in [folder, *folder.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)  # the pods run as uid 1000


def test_routing_bench(kind_cluster, serve_ns, seconds):
    namespace = serve_ns
    _fetch_model(kind_cluster)
    results: dict = {"capacity_tokens_per_s": None, "pools": {}, "runs": []}
    kind_cluster.apply(_service(kind_cluster, "Router"), namespace=namespace)
    try:
        wait_for(lambda: _settled(kind_cluster, namespace, "Router"), timeout=900, interval=2, message="Router pods")
        router_pod = wait_for(
            lambda: [
                p
                for p in kind_cluster.items(
                    "pods", namespace, f"inferfleet.dev/service={SERVICE},app.kubernetes.io/component=router"
                )
                if any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions", []))
            ],
            timeout=120,
            interval=1,
            message="the router ready",
        )[0]["metadata"]["name"]

        def measured() -> dict:
            raw = f"/api/v1/namespaces/{namespace}/pods/{router_pod}:8000/proxy/metrics"
            page = kind_cluster.kubectl("get", "--raw", raw).stdout
            rates = {
                s.labels["pool"]: s.value
                for f in text_string_to_metric_families(page)
                for s in f.samples
                if s.name == RATE and s.labels["source"] == "measured"
            }
            return rates if len(rates) == 2 else {}

        rates = wait_for(measured, timeout=60, interval=1, message="both pools measured")
        capacity = sum(rates.values())
        results["capacity_tokens_per_s"], results["pools"] = capacity, rates
        print(
            f"\nmeasured decode tokens/s at the largest batch: {rates}; the fleet's capacity: {capacity:.0f} tokens/s"
        )
        for mode in ("Router", "Service"):
            if mode == "Service":
                kind_cluster.apply(_service(kind_cluster, "Service"), namespace=namespace)
                wait_for(
                    lambda: _settled(kind_cluster, namespace, "Service"),
                    timeout=900,
                    interval=2,
                    message="Service pods",
                )
            pods = _settled(kind_cluster, namespace, mode)
            pool_of = {p["metadata"]["name"]: p["metadata"]["labels"]["inferfleet.dev/pool"] for p in pods}
            for load in LOADS:
                rate = load * capacity / MAX_TOKENS
                before = {pod: _pod_metric(kind_cluster, namespace, pod, FINISHED) for pod in pool_of}
                records = _run_load(kind_cluster, namespace, rate, seconds, f"load-{mode.lower()}-{int(load * 100)}")
                after = {pod: _pod_metric(kind_cluster, namespace, pod, FINISHED) for pod in pool_of}
                served = {pool_of[pod]: after[pod] - before[pod] for pod in pool_of}
                total = sum(served.values()) or 1
                summary = _summary(records, {pool: n / total for pool, n in sorted(served.items())})
                results["runs"].append({"mode": mode, "load": load, "requests_per_s": rate, **summary})
                print(
                    f"{mode:8s} load {load:4.0%}: {summary['output_tokens_per_s']:6.1f} tok/s, TTFT p50/p99 "
                    f"{summary['ttft_p50_s']:.2f}/{summary['ttft_p99_s']:.2f} s, ITL p50/p99 "
                    f"{summary['itl_p50_s'] * 1000:.0f}/{summary['itl_p99_s'] * 1000:.0f} ms, "
                    f"{summary['requests']} requests ({summary['failed']} failed), shares "
                    + ", ".join(f"{pool} {share:.2f}" for pool, share in summary["shares"].items()),
                    flush=True,
                )
        out = os.environ.get("INFERFLEET_BENCH_OUT")
        if out:
            with open(out, "w") as file:
                json.dump(results, file, indent=2)
    finally:
        kind_cluster.kubectl("delete", "infsvc", SERVICE, "-n", namespace, "--wait=true", "--timeout=120s", timeout=150)

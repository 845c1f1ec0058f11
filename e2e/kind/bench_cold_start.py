"""Cold start on the kind tier's cluster, phase by phase (not collected by the test run: a command that prints figures).

    INFERFLEET_BENCH_OUT=results.json python -m pytest e2e/kind/bench_cold_start.py -s

SmolLM2-135M-Instruct (the demo's real model) as hf:// from the Hub stand-in on this machine, through the node model
cache (the fleet module's release turns it on). One replica is applied with the cache empty (cold: the fetch
downloads the model), then the service is scaled to two (warm: the second replica finds the model in the node's
cache). For each replica, from its pod's own timestamps (the API's, to the second): scheduling (created ->
scheduled), before its fetch (scheduled -> fetch-model started: volumes, image), the fetch (the init container's
run), before its server (fetch finished -> server started), the server until ready (load, kernels, calibration)
and the whole. Also from `kubectl apply` to the first token of a streamed completion through the service's
endpoint, for the cold replica. Figures go to INFERFLEET_BENCH_OUT when set."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from datetime import datetime

from helpers import wait_for
from kind import test_kind_fleet as fleet

release = fleet.release  # the fleet module's fixture, used here by name

SERVICE = "coldstart"
REPO = "inferfleet/smollm2"
MODEL = "smollm2"


def _time(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def _phases(pod: dict) -> dict[str, float]:
    status = pod["status"]
    conditions = {c["type"]: _time(c["lastTransitionTime"]) for c in status["conditions"]}
    [fetch] = [s for s in status["initContainerStatuses"] if s["name"] == "fetch-model"]
    [server] = status["containerStatuses"]
    created = _time(pod["metadata"]["creationTimestamp"])
    fetch_start = _time(fetch["state"]["terminated"]["startedAt"])
    fetch_end = _time(fetch["state"]["terminated"]["finishedAt"])
    server_start = _time(server["state"]["running"]["startedAt"])
    return {
        "scheduling": conditions["PodScheduled"] - created,
        "before fetch": fetch_start - conditions["PodScheduled"],
        "fetch": fetch_end - fetch_start,
        "before server": server_start - fetch_end,
        "server to ready": conditions["Ready"] - server_start,
        "total": conditions["Ready"] - created,
    }


def _first_token_seconds(kind_cluster, namespace: str, began: float) -> float:
    import httpx

    with fleet.port_forward(kind_cluster, namespace, f"service/{SERVICE}", 8000) as base:
        body = {"model": MODEL, "prompt": "Beautiful is better than", "max_tokens": 4, "stream": True}
        with httpx.stream("POST", f"{base}/v1/completions", json=body, timeout=300) as response:
            for line in response.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    return time.time() - began
    raise AssertionError("the stream ended without a token")


def _pods(kind_cluster, namespace: str) -> list[dict]:
    pods = kind_cluster.items("pods", namespace, f"inferfleet.dev/service={SERVICE},{fleet.SERVERS}")
    return sorted(pods, key=lambda p: p["metadata"]["creationTimestamp"])


def test_cold_start_bench(kind_cluster, release):
    folder = kind_cluster.models_dir / MODEL
    if not folder.exists():
        command = [sys.executable, "-m", "inferfleet_runtime.cli", "demo-model", "--real", "--out", str(folder)]
        subprocess.run(command, check=True)
    with fleet.node_cache_namespace(kind_cluster, REPO, folder) as (namespace, hub):
        service = fleet._service(SERVICE, ["cpu"], 1)
        service["spec"]["model"] = {"name": MODEL, "uri": f"hf://{REPO}", "credentialsSecret": "hub"}
        began = time.time()
        kind_cluster.apply(service, namespace=namespace)

        def ready(count: int):
            pods = _pods(kind_cluster, namespace)
            is_ready = [any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions", []))
                        for p in pods]  # fmt: skip
            return pods if len(pods) == count and all(is_ready) else None

        [cold] = wait_for(lambda: ready(1), timeout=900, interval=1, message="the cold replica ready")
        first_token = _first_token_seconds(kind_cluster, namespace, began)
        service["spec"]["replicas"] = 2
        kind_cluster.apply(service, namespace=namespace)
        pods = wait_for(lambda: ready(2), timeout=900, interval=1, message="the warm replica ready")
        warm = next(p for p in pods if p["metadata"]["name"] != cold["metadata"]["name"])
        downloads = sum(1 for r in hub.requests if r.method == "GET" and r.path.endswith(".gguf"))
        fetches = fleet.node_cache_fetches(kind_cluster)
    results = {
        "model": MODEL,
        "bytes": sum(f["bytes"] for f in fetches),
        "downloads at the Hub stand-in": downloads,
        "fetches in the node cache's record": len(fetches),
        "apply to first token (cold), s": round(first_token, 1),
        "cold": _phases(cold),
        "warm": _phases(warm),
    }
    print(json.dumps(results, indent=2))
    print(f"{'phase':<16} {'cold s':>8} {'warm s':>8}")
    for phase in results["cold"]:
        print(f"{phase:<16} {results['cold'][phase]:>8.0f} {results['warm'][phase]:>8.0f}")
    if out := os.environ.get("INFERFLEET_BENCH_OUT"):
        with open(out, "w") as f:
            json.dump(results, f, indent=2)

"""Autoscaling under real load on kind: a bounded asyncio client loop in a pod of the cluster sends completions
through an autoscaled service's Service to real paged CPU pods; their queues raise
`inferfleet:num_requests_waiting`, the operator (in-cluster, from the chart) reads each pod's /metrics, scales the
pool up, the new pods become Ready and serve requests (read from each pod's own /metrics); then the load drops
below the target and the pool goes back to minReplicas. A light client keeps sending while it shrinks, so
requests in flight while pods are removed are counted too. Every request's outcome is counted; none may fail.

Figures printed: load start -> scale-up decision -> each new replica Ready, the replicas reached against the
replicas the load needs, the requests and failures of each phase, and when the pool was back at min.

The chart release and the serving namespace are the fleet module's fixtures (imported, so both modules share
one definition); this module upgrades the release with a shorter --autoscale-seconds through `extraArgs`."""

from __future__ import annotations

import json
import math
import re
import time
from datetime import datetime

import pytest
from helpers import condition, wait_for
from kind import test_kind_fleet as fleet
from operator_process import events

CHART, CPU_POOL, ENGINE = fleet.CHART, fleet.CPU_POOL, fleet.ENGINE
release, serve_ns = fleet.release, fleet.serve_ns  # the fleet module's fixtures, used here by name

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(2400)]

SERVICE = "scaled"
DEPLOYMENT = f"{SERVICE}-{CPU_POOL}"
AUTOSCALE_SECONDS = 5
MAX_NUM_SEQS = 1  # one running sequence per pod: the rest of a pod's requests wait in its queue
TARGET_WAITING = 1
HEAVY = 4  # concurrent clients under load: 3 waiting on one pod, 4 / (MAX_NUM_SEQS + TARGET_WAITING) = 2 pods needed
LIGHT = 1  # one client during scale-down: nothing waits, the formula asks for minReplicas
MIN_REPLICAS, MAX_REPLICAS = 1, 3
# Long enough that the heavy phase ends (new pods Ready and serving) before the drop after scale-up is acted on.
STABILIZATION_SECONDS = 60
CLIENT = "load"

# Runs in the client pod (the runtime image has httpx). Phases move one way: heavy until /tmp/light exists, light
# until /tmp/stop exists, both bounded by the last argument in seconds. No keep-alive: each request opens its own
# connection, so the Service balances every request over the pods Ready at that moment. One JSON line per request.
LOAD_LOOP = r"""
import asyncio, json, os, sys, time, httpx
url, heavy, light, bound = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
body = {"model": "demo", "prompt": "Beautiful is better than", "max_tokens": 48, "ignore_eos": True, "temperature": 0}
deadline = time.time() + bound

def phase():
    if os.path.exists("/tmp/stop") or time.time() > deadline:
        return "stop"
    return "light" if os.path.exists("/tmp/light") else "heavy"

async def worker(i, client):
    while (p := phase()) != "stop" and (p == "heavy" or i < light):
        began = time.time()
        try:
            r = await client.post(url, json=body)
            ok = r.status_code == 200 and r.json()["choices"][0]["text"]
            outcome = "ok" if ok else f"http {r.status_code}: {r.text[:200]}"
        except httpx.HTTPError as error:
            outcome = f"{type(error).__name__}: {error}"
        print(json.dumps({"phase": p, "start": began, "end": time.time(), "outcome": outcome}), flush=True)

async def main():
    limits = httpx.Limits(max_connections=heavy, max_keepalive_connections=0)
    async with httpx.AsyncClient(timeout=300, limits=limits) as client:
        await asyncio.gather(*(worker(i, client) for i in range(heavy)))

asyncio.run(main())
"""


@pytest.fixture(scope="module")
def operator_release(kind_cluster, release):
    """The release upgraded so the operator decides every AUTOSCALE_SECONDS (the chart's extraArgs)."""
    kind_cluster.helm(
        "upgrade",
        release["name"],
        str(CHART),
        "--namespace",
        release["namespace"],
        "--reuse-values",
        "--set-json",
        f'extraArgs=["--autoscale-seconds={AUTOSCALE_SECONDS}"]',
        "--wait",
        "--timeout",
        "5m",
        timeout=360,
    )

    def running_with_flag() -> bool:
        pods = kind_cluster.items(
            "pods", release["namespace"], selector=f"app.kubernetes.io/instance={release['name']}"
        )
        live = [p for p in pods if not p["metadata"].get("deletionTimestamp")]
        return len(live) == 1 and all(
            f"--autoscale-seconds={AUTOSCALE_SECONDS}" in p["spec"]["containers"][0]["args"]
            and (condition(p, "Ready") or {}).get("status") == "True"
            for p in live
        )

    wait_for(running_with_flag, timeout=300, interval=2, message="the operator pod running with --autoscale-seconds")
    return release


@pytest.fixture(scope="module")
def namespace(kind_cluster, operator_release, serve_ns):
    """The serving namespace; afterwards its InferenceServices are deleted (their serving pods go with
    them), before the namespace and the release go."""
    yield serve_ns
    kind_cluster.kubectl("delete", "infsvc", "--all", "-n", serve_ns, "--wait=true", "--timeout=120s", timeout=150)


def _autoscaled_service() -> dict:
    service = fleet._service(SERVICE, ["cpu"], MIN_REPLICAS, engine={**ENGINE, "maxBatchSize": MAX_NUM_SEQS})
    service["spec"]["autoscaling"] = {
        "minReplicas": MIN_REPLICAS,
        "maxReplicas": MAX_REPLICAS,
        "targetWaitingRequests": TARGET_WAITING,
        "scaleDownStabilizationSeconds": STABILIZATION_SECONDS,
    }
    return service


def _pods(kind_cluster, namespace: str) -> list[dict]:
    return kind_cluster.items("pods", namespace, f"inferfleet.dev/service={SERVICE},{fleet.SERVERS}")


def _ready_since(pod: dict) -> float | None:
    """When the pod last became Ready (the kubelet's condition time), or None while it is not."""
    ready = condition(pod, "Ready")
    if not ready or ready["status"] != "True":
        return None
    return datetime.fromisoformat(ready["lastTransitionTime"].replace("Z", "+00:00")).timestamp()


def _served(kind_cluster, namespace: str, pod: str) -> float:
    """Requests the pod has finished, from its own /metrics (through the API server's pod proxy)."""
    text = kind_cluster.kubectl("get", "--raw", f"/api/v1/namespaces/{namespace}/pods/{pod}:8000/proxy/metrics").stdout
    return sum(
        float(m.group(1))
        for m in re.finditer(r"^inferfleet:e2e_request_latency_seconds_count\{[^}]*\} (\S+)$", text, re.MULTILINE)
    )


def _lines(kind_cluster, namespace: str) -> list[dict]:
    out = kind_cluster.kubectl("logs", CLIENT, "-n", namespace, check=False).stdout
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


class Replicas:
    """The pool Deployment's spec.replicas, sampled on every poll of the test's waits: the peak reached."""

    def __init__(self, kind_cluster, namespace: str):
        self.kind_cluster, self.namespace, self.peak, self.first_above_min = kind_cluster, namespace, 0, None

    def sample(self) -> dict:
        deployment = self.kind_cluster.get("deployment", DEPLOYMENT, self.namespace) or {}
        replicas = (deployment.get("spec") or {}).get("replicas") or 0
        self.peak = max(self.peak, replicas)
        if replicas > MIN_REPLICAS and self.first_above_min is None:
            self.first_above_min = time.time()
        return deployment


def _scaled_messages(kind_cluster, namespace: str) -> list[tuple[str, int, int, int]]:
    """(reason, from, to, what the HPA formula asked before min/max) of the operator's ScaledUp/ScaledDown Events
    for the service, oldest first. A message reads "Pool P: 1 -> 3 replicas (METRIC 3 per replica, target 1; ...)"."""
    found = []
    for event in sorted(events(kind_cluster, namespace, SERVICE), key=lambda e: e.get("lastTimestamp") or ""):
        message = event.get("message") or ""
        moved = re.search(r"(\d+) -> (\d+) replicas", message)
        if event.get("reason") not in ("ScaledUp", "ScaledDown") or not moved:
            continue
        current, desired = int(moved.group(1)), int(moved.group(2))
        load = re.search(r"\(\S+ (\S+) per replica, target (\S+);", message)
        asked = math.ceil(current * float(load.group(1)) / float(load.group(2))) if load else desired
        found.append((event["reason"], current, desired, asked))
    return found


def test_real_load_scales_the_paged_pool_up_and_back_to_min_without_a_failed_request(kind_cluster, namespace):
    kind_cluster.apply(_autoscaled_service(), namespace=namespace)
    replicas = Replicas(kind_cluster, namespace)

    def at_min_and_ready() -> bool:
        d = replicas.sample()
        return d.get("spec", {}).get("replicas") == MIN_REPLICAS and (d.get("status") or {}).get("readyReplicas") == 1

    wait_for(at_min_and_ready, timeout=900, interval=2, message=f"{DEPLOYMENT} at minReplicas with its pod Ready")
    first = {p["metadata"]["name"] for p in _pods(kind_cluster, namespace)}
    status = wait_for(
        lambda: (kind_cluster.get("infsvc", SERVICE, namespace) or {}).get("status", {}).get("autoscaling"),
        timeout=120,
        interval=2,
        message="status.autoscaling (the operator scraped the idle pod)",
    )
    assert status["pools"][0]["desiredReplicas"] == MIN_REPLICAS, f"idle pool scaled: {status}"

    client = fleet._client_pod(CLIENT, kind_cluster.runtime_image, 0, service=SERVICE)
    [container] = client["spec"]["containers"]
    container["command"] = ["python", "-c", LOAD_LOOP]
    container["args"] = [f"http://{SERVICE}:8000/v1/completions", str(HEAVY), str(LIGHT), "1800"]
    kind_cluster.apply(client, namespace=namespace)
    wait_for(lambda: _lines(kind_cluster, namespace), timeout=300, interval=1, message="the first request answered")
    load_start = min(line["start"] for line in _lines(kind_cluster, namespace))

    # Scale-up: the pool grows past min, every replica it asks for is Ready, and each new pod has served requests.
    def scaled_up_and_serving() -> list[dict] | None:
        d = replicas.sample()
        wanted = (d.get("spec") or {}).get("replicas") or 0
        pods = [p for p in _pods(kind_cluster, namespace) if not p["metadata"].get("deletionTimestamp")]
        new = [p for p in pods if p["metadata"]["name"] not in first]
        if wanted <= MIN_REPLICAS or len(pods) != wanted or not all(_ready_since(p) for p in pods):
            return None
        return new if all(_served(kind_cluster, namespace, p["metadata"]["name"]) > 0 for p in new) else None

    new_pods = wait_for(scaled_up_and_serving, timeout=900, interval=1, message="the pool scaled up, Ready, serving")
    serving_at = time.time()
    ready_at = sorted(_ready_since(p) for p in new_pods)
    served = {p["metadata"]["name"]: _served(kind_cluster, namespace, p["metadata"]["name"]) for p in new_pods}

    # Scale-down: the load drops to one client (nothing waits) and keeps going until the removed pods are gone.
    kind_cluster.kubectl("exec", CLIENT, "-n", namespace, "--", "touch", "/tmp/light")
    light_at = time.time()

    def back_at_min() -> bool:
        d = replicas.sample()
        return (
            (d.get("spec") or {}).get("replicas") == MIN_REPLICAS
            and len(_pods(kind_cluster, namespace)) == MIN_REPLICAS  # the removed pods have terminated
            and (d.get("status") or {}).get("readyReplicas") == MIN_REPLICAS
        )

    wait_for(back_at_min, timeout=STABILIZATION_SECONDS + 600, interval=1, message="back to minReplicas, pods gone")
    at_min = time.time()
    wait_for(
        lambda: sum(line["start"] > at_min for line in _lines(kind_cluster, namespace)) >= 3,
        timeout=300,
        interval=1,
        message="requests after the pool is back at min",
    )
    kind_cluster.kubectl("exec", CLIENT, "-n", namespace, "--", "touch", "/tmp/stop")
    wait_for(
        lambda: (kind_cluster.get("pod", CLIENT, namespace) or {}).get("status", {}).get("phase") == "Succeeded",
        timeout=600,
        interval=2,
        message="the client loop finished its requests in flight",
    )

    lines = _lines(kind_cluster, namespace)
    by_phase = {p: [line for line in lines if line["phase"] == p] for p in ("heavy", "light")}
    failed = {p: [line for line in group if line["outcome"] != "ok"] for p, group in by_phase.items()}
    needed = math.ceil(HEAVY / (MAX_NUM_SEQS + TARGET_WAITING))
    moves = _scaled_messages(kind_cluster, namespace)
    asked = max(a for r, _, _, a in moves if r == "ScaledUp")
    transitions = " ".join(f"{a}->{b}" for _, a, b, _ in moves)
    reached = replicas.peak
    print(
        f"\nkind autoscaling figures ({HEAVY} clients, max_num_seqs {MAX_NUM_SEQS}, target {TARGET_WAITING} waiting, "
        f"--autoscale-seconds {AUTOSCALE_SECONDS}, window {STABILIZATION_SECONDS} s):\n"
        f"  load start -> scale-up seen {replicas.first_above_min - load_start:.1f} s; -> new replicas Ready "
        + ", ".join(f"{t - load_start:.1f} s" for t in ready_at)
        + f"; -> every new pod had served requests {serving_at - load_start:.1f} s ({served})\n"
        f"  replicas reached {reached} (max {MAX_REPLICAS}, the formula asked {asked}, the load needs {needed}); "
        f"transitions {transitions}\n"
        f"  load dropped -> back at {MIN_REPLICAS} replica, removed pods gone {at_min - light_at:.1f} s\n"
        f"  requests: scale-up phase {len(by_phase['heavy'])} failed {len(failed['heavy'])}; "
        f"scale-down phase {len(by_phase['light'])} failed {len(failed['light'])}"
    )
    assert MIN_REPLICAS < reached <= MAX_REPLICAS
    assert new_pods and all(n > 0 for n in served.values())
    assert {r for r, _, _, _ in moves} == {"ScaledUp", "ScaledDown"}
    assert by_phase["heavy"] and by_phase["light"]
    assert not failed["heavy"], f"requests failed during scale-up: {failed['heavy'][:5]}"
    assert not failed["light"], f"requests failed during scale-down: {failed['light'][:5]}"

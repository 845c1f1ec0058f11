"""Operator scale benchmark: N KWOK nodes, M InferenceServices, time to Ready against a direct-apply floor.

    python e2e/bench/scale.py --nodes 1000 --services 500

On the local cluster (its own, in a fresh state folder, unless --kubeconfig names a running one):
1. registers N KWOK nodes in five pools built from the e2e node fixtures' label schemes (NVIDIA H100
   and A100, AMD MI300X, Intel Max 1550, CPU), the CRDs, the chart's default InferenceRuntimes and
   the operator's ServiceAccount bound to exactly permissions.PERMISSIONS;
2. floor: the children the pure planner renders for the M services (Deployments, Services, PDBs, NetworkPolicies)
   are server-side applied by a plain client (as many requests in flight as the operator's default
   --concurrency), timed until every Deployment has all replicas ready;
3. operator: `inferfleet-operator` runs as a child process with the ServiceAccount token and default
   flags; the M InferenceServices are created, timed until every one reports Ready=True with
   readyReplicas == replicas;
and prints the ratio operator/floor, API requests per service and the operator's peak memory.

The floor runs first: its objects carry another managed-by label, so the operator's label-selected
watches never see them, while the API server, scheduler and controllers still carry their load
(conservative for the operator). Service mix: 80% runtime.policy Paged spread over the vendors,
20% Auto placed on AMD/Intel (which resolves to Paged there); none on the CPU pool (see
fleet.PAGED_VENDORS). Compiled engines are left out: the floor has no way to express a compile
step, and builds would dominate the time.
Progress goes to stderr; the figures go to stdout, and to --json as an object.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

E2E = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(E2E))

from fleet import BENCH_LABEL, FLOOR_MANAGER, MANAGED_BY_LABEL, floor_children, make_nodes, make_services  # noqa: E402  (e2e/bench/, this script's folder)
from helpers import CLUSTER_DIR, Cluster, cluster_bin, is_true, wait_for  # noqa: E402
from operator_process import OperatorProcess, install, runtime_objects  # noqa: E402

from inferfleet_operator.kube.client import resource_path  # noqa: E402
from inferfleet_operator.kube.credentials import Credentials  # noqa: E402

USER_AGENT = "inferfleet-scale-bench"


def log(message: str) -> None:
    print(f"[scale] {time.strftime('%H:%M:%S')} {message}", file=sys.stderr, flush=True)


# ----------------------------------------------------------------------------- a plain API client


class PlainClient:
    """Async client with admin credentials; counts its own requests (to separate them from the rest)."""

    def __init__(self, kubeconfig: Path, concurrency: int):
        credentials = Credentials.load(str(kubeconfig))
        self.http = httpx.AsyncClient(
            base_url=credentials.server,
            verify=credentials.ssl_context(),
            timeout=120,
            headers={"User-Agent": USER_AGENT},
            limits=httpx.Limits(max_connections=concurrency + 2),  # + a watch and a read beside the writes
        )
        self.gate = asyncio.Semaphore(concurrency)
        self.num_requests = 0

    async def request(self, method: str, path: str, gate: bool = True, **kwargs) -> httpx.Response:
        """One request; with gate=False (reads while waiting) it does not take one of the `concurrency` slots."""
        async with self.gate if gate else contextlib.nullcontext():
            self.num_requests += 1
            response = await self.http.request(method, path, **kwargs)
        if response.status_code >= 400 and response.status_code != 409:
            raise RuntimeError(f"{method} {path}: {response.status_code} {response.text[:300]}")
        return response

    async def create(self, obj: dict) -> None:
        if obj["kind"] == "Namespace":  # not a kind the operator knows (names.KINDS)
            path = "/api/v1/namespaces"
        else:
            path = resource_path(obj["apiVersion"], obj["kind"], obj["metadata"].get("namespace"))
        await self.request("POST", path, json=obj)

    async def apply(self, obj: dict, subresource: str = "") -> None:
        meta = obj["metadata"]
        path = resource_path(obj["apiVersion"], obj["kind"], meta.get("namespace"), meta["name"], subresource)
        await self.request(
            "PATCH",
            path,
            content=json.dumps(obj),
            params={"fieldManager": FLOOR_MANAGER, "force": "true"},
            headers={"Content-Type": "application/apply-patch+yaml"},
        )

    async def list(self, path: str, selector: str) -> list[dict]:
        # resourceVersion=0: served from the API server's watch cache, the cheapest list there is.
        response = await self.request("GET", path, params={"labelSelector": selector, "resourceVersion": "0"})
        return response.json().get("items") or []

    async def apiserver_requests(self) -> dict[str, float]:
        """The API server's request count over every client (apiserver_request_total), "verb resource" -> count."""
        text = (await self.request("GET", "/metrics")).text
        counts: dict[str, float] = {}
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == "apiserver_request_total":
                    key = (
                        f"{sample.labels.get('verb')} {sample.labels.get('resource') or sample.labels.get('component')}"
                    )
                    counts[key] = counts.get(key, 0) + sample.value
        return counts

    async def close(self) -> None:
        await self.http.aclose()


async def create_all(client: PlainClient, objects: list[dict]) -> None:
    await asyncio.gather(*(client.create(o) for o in objects))


class NodesLost(RuntimeError):
    """A bench node went NotReady during a timed run: its pods lost Ready for good (KWOK does not
    make them Ready again), so the run cannot finish and its figures would mean nothing."""


# Taints the node lifecycle controller puts on a node until it has seen it Ready and reachable.
LIFECYCLE_TAINTS = {"node.kubernetes.io/not-ready", "node.kubernetes.io/unreachable"}


async def num_nodes_not_ready(client: PlainClient) -> int:
    """Bench nodes not yet usable: not Ready, or Ready but still carrying a lifecycle taint. The planner
    excludes a tainted pool, so a floor planned while the controller is still removing the not-ready taints
    (seconds after 1,000 nodes turn Ready) leaves whole pools out and does less work than the operator."""
    nodes = await client.list("/api/v1/nodes", f"{BENCH_LABEL}=true")
    return sum(
        1
        for n in nodes
        if not any(
            c.get("type") == "Ready" and c.get("status") == "True"
            for c in (n.get("status") or {}).get("conditions") or []
        )
        or any(t.get("key") in LIFECYCLE_TAINTS for t in (n.get("spec") or {}).get("taints") or [])
    )


async def wait_until(predicate, what: str, total: int, timeout: float, started: float) -> float:
    """Polls the async predicate (-> number done) every second until it reaches total (for the nodes'
    registration, before the timed runs); seconds since started, a progress line every 5 s."""
    last_report = 0.0
    while True:
        done = await predicate()
        elapsed = time.monotonic() - started
        if done >= total:
            log(f"{what}: {done}/{total} after {elapsed:.1f} s")
            return elapsed
        if elapsed - last_report >= 5:
            log(f"{what}: {done}/{total} after {elapsed:.0f} s")
            last_report = elapsed
        if elapsed > timeout:
            raise TimeoutError(f"{what}: only {done}/{total} after {elapsed:.0f} s")
        await asyncio.sleep(1.0)


async def watch_until(
    client: PlainClient, path: str, selector: str, is_done, wanted: set, what: str, timeout: float, started: float
) -> float:
    """Watches the objects at `path` until is_done(obj) holds for every (namespace, name) in `wanted`;
    seconds since started, taken when the last one turned done. A watch, not a poll: the API server
    encodes each change once, where a list every second re-encodes every object (at 500 services
    that was a large part of the bench's own load on the control plane). Every 5 s a progress line;
    every 30 s a check that every bench node is still Ready."""
    done: set = set()
    progress = {"report": 0.0, "check": 0.0}

    def seen(event_type: str, obj: dict) -> None:
        key = (obj["metadata"].get("namespace"), obj["metadata"]["name"])
        if key in wanted and event_type != "DELETED" and is_done(obj):
            done.add(key)
        else:
            done.discard(key)

    async def finished() -> float | None:
        elapsed = time.monotonic() - started
        if len(done) >= len(wanted):
            log(f"{what}: {len(done)}/{len(wanted)} after {elapsed:.1f} s")
            return elapsed
        if elapsed > timeout:
            raise TimeoutError(f"{what}: only {len(done)}/{len(wanted)} after {elapsed:.0f} s")
        if elapsed - progress["report"] >= 5:
            log(f"{what}: {len(done)}/{len(wanted)} after {elapsed:.0f} s")
            progress["report"] = elapsed
        if elapsed - progress["check"] >= 30:
            progress["check"] = elapsed
            if lost := await num_nodes_not_ready(client):
                raise NodesLost(
                    f"{lost} KWOK node(s) went NotReady during the run (their lease "
                    "renewals were starved: the machine is overloaded); rerun smaller"
                )
        return None

    while True:  # a list, then a watch from its resourceVersion; again when the watch ends or expires
        listed = (await client.request("GET", path, gate=False, params={"labelSelector": selector})).json()
        for obj in listed.get("items") or []:
            seen("ADDED", obj)
        params = {
            "labelSelector": selector,
            "watch": "1",
            "resourceVersion": listed["metadata"]["resourceVersion"],
            "timeoutSeconds": "300",
        }
        client.num_requests += 1
        # Lines go through a queue, so that waiting for one with a timeout never cancels the read.
        lines: asyncio.Queue[str | None] = asyncio.Queue()
        async with client.http.stream("GET", path, params=params, timeout=None) as response:

            async def read(response=response, lines=lines) -> None:
                async for line in response.aiter_lines():
                    lines.put_nowait(line)
                lines.put_nowait(None)

            reader = asyncio.ensure_future(read())
            try:
                while (seconds := await finished()) is None:
                    try:
                        line = await asyncio.wait_for(lines.get(), 1.0)
                    except TimeoutError:
                        continue
                    if line is None:
                        break  # the server ended the watch: list and watch again
                    event = json.loads(line) if line.strip() else {"type": "EMPTY"}
                    if event["type"] == "ERROR":  # most likely 410 Gone: list again
                        break
                    if event["type"] in ("ADDED", "MODIFIED", "DELETED"):
                        seen(event["type"], event["object"])
                else:
                    return seconds
            finally:
                reader.cancel()


# ----------------------------------------------------------------------------- the two runs


async def _num_ready_nodes(client: PlainClient, total: int) -> int:
    return total - await num_nodes_not_ready(client)


async def run_floor(client: PlainClient, children: list[list[dict]], timeout: float, pids: dict[str, int]) -> dict:
    selector = f"{MANAGED_BY_LABEL}={FLOOR_MANAGER}"
    deployments = [c for per in children for c in per if c["kind"] == "Deployment"]
    wanted = {(d["metadata"]["namespace"], d["metadata"]["name"]): d["spec"]["replicas"] for d in deployments}

    def is_ready(d: dict) -> bool:
        key = (d["metadata"]["namespace"], d["metadata"]["name"])
        return (d.get("status") or {}).get("readyReplicas", 0) == wanted[key]

    before, own_before = await client.apiserver_requests(), client.num_requests
    usage = Usage(pids)
    started = time.monotonic()
    # Per service in the planner's order (Deployments, Service, PDB), services side by side.
    await asyncio.gather(*(_apply_in_order(client, per) for per in children))
    log(f"floor: applied {sum(map(len, children))} objects in {time.monotonic() - started:.1f} s")
    seconds = await watch_until(
        client,
        "/apis/apps/v1/deployments",
        selector,
        is_ready,
        set(wanted),
        "floor: Deployments ready",
        timeout,
        started,
    )
    used = usage.done()
    own = client.num_requests - own_before + 1  # + the /metrics read below
    after = await client.apiserver_requests()
    return {
        "seconds": seconds,
        "num_objects": sum(map(len, children)),
        "num_deployments": len(wanted),
        "num_pods": sum(wanted.values()),
        "apiserver_requests_others": sum(after.values()) - sum(before.values()) - own,
        "apiserver_top": top_requests(after, before, len(children)),
        **used,
    }


async def _apply_in_order(client: PlainClient, objects: list[dict]) -> None:
    for obj in objects:
        await client.apply(obj)


class Usage:
    """CPU seconds of each control-plane component, the operator and the bench over one timed run, and
    the load average at its start and end: which process the run loaded."""

    def __init__(self, pids: dict[str, int]):
        self.pids = pids
        self.before = self._sample()
        self.load_before = os.getloadavg()[0]

    def _sample(self) -> dict[str, float]:
        out = {}
        for name, pid in self.pids.items():
            try:
                out[name] = _cpu_seconds(pid)
            except (OSError, IndexError):  # the process is gone
                pass
        return out

    def done(self) -> dict:
        after = self._sample()
        return {
            "cpu_by_process": {k: round(after[k] - self.before[k], 1) for k in after if k in self.before},
            "load_average": [round(self.load_before, 2), round(os.getloadavg()[0], 2)],
        }


def _cluster_cpu(cpu_by_process: dict[str, float]) -> float:
    return sum(v for k, v in cpu_by_process.items() if k != "bench") or float("nan")


def cluster_pids(kubeconfig: Path) -> dict[str, int]:
    """The pids up.sh recorded next to the kubeconfig (nothing for a cluster it did not start)."""
    out = {}
    for path in sorted((kubeconfig.parent / "run").glob("*.pid")):
        try:
            out[path.stem] = int(path.read_text().strip())
        except ValueError:
            pass
    return out


def top_requests(after: dict[str, float], before: dict[str, float], num: int) -> dict[str, float]:
    """Per service, the ten largest "verb resource" counts of the API server between two reads (every
    client, the bench's own polls included)."""
    delta = {k: v - before.get(k, 0) for k, v in after.items()}
    top = sorted(((k, v) for k, v in delta.items() if v > 0), key=lambda kv: -kv[1])[:10]
    return {k: round(v / num, 2) for k, v in top}


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _memory_kib(pid: int) -> dict[str, int]:
    out = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmHWM", "VmRSS"):
            out[key] = int(value.split()[0])
    return out


async def wait_idle(pids: dict[str, int], share: float = 0.05, timeout: float = 120) -> None:
    """Waits until the processes together used under `share` of a core over one second: the operator's
    start-up lists are done, or the control plane has finished what came before (after the CRDs are
    installed the API server rebuilds its OpenAPI documents for a while, and after the floor its
    controllers finish the floor's tail), so neither run pays for work that is not its own."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        cpu = sum(map(_cpu_seconds, pids.values()))
        await asyncio.sleep(1.0)
        if sum(map(_cpu_seconds, pids.values())) - cpu < share:
            return
    log(f"{', '.join(pids)} still busy after {timeout:.0f} s; starting anyway")


async def run_operator(
    client: PlainClient,
    operator: OperatorProcess,
    services: list[dict],
    timeout: float,
    pids: dict[str, int],
    profile: Path | None = None,
) -> dict:
    wanted = {(s["metadata"]["namespace"], s["metadata"]["name"]) for s in services}

    operator.start(timeout=120)
    await wait_idle({"operator": operator.process.pid})
    idle_memory = _memory_kib(operator.process.pid)
    requests_before = operator.metric("inferfleet_operator_api_requests_total")
    requests_by_kind = _requests_by_verb_kind(operator.metrics_text(), {})
    writes_before = operator.num_writes()
    before, own_before = await client.apiserver_requests(), client.num_requests
    cpu_before = _cpu_seconds(operator.process.pid)
    usage = Usage({**pids, "operator": operator.process.pid})
    profiler = _start_py_spy(operator.process.pid, profile) if profile else None
    started = time.monotonic()
    await create_all(client, services)
    log(f"operator: created {len(services)} InferenceServices in {time.monotonic() - started:.1f} s")
    seconds = await watch_until(
        client,
        "/apis/inferfleet.dev/v1alpha1/inferenceservices",
        f"{BENCH_LABEL}=true",
        _is_ready,
        wanted,
        "operator: InferenceServices Ready",
        timeout,
        started,
    )
    used = usage.done()
    if profiler is not None:
        _stop_py_spy(profiler, profile)
    own = client.num_requests - own_before + 1
    after = await client.apiserver_requests()
    memory = _memory_kib(operator.process.pid)
    result = {
        "seconds": seconds,
        "cpu_seconds": _cpu_seconds(operator.process.pid) - cpu_before,
        "operator_requests": operator.metric("inferfleet_operator_api_requests_total") - requests_before,
        "operator_writes": operator.num_writes() - writes_before,
        "apiserver_requests_others": sum(after.values()) - sum(before.values()) - own,
        "apiserver_top": top_requests(after, before, len(services)),
        **used,
        "peak_rss_mb": memory["VmHWM"] / 1024,
        "rss_mb": memory["VmRSS"] / 1024,
        "idle_rss_mb": idle_memory["VmRSS"] / 1024,
        "reconciles": operator.metric("inferfleet_operator_reconciles_total", kind="InferenceService"),
        "reconcile_errors": operator.metric("inferfleet_operator_reconcile_errors_total"),
        "requests_by_verb_kind": _requests_by_verb_kind(operator.metrics_text(), requests_by_kind),
    }
    children = 0
    for path in (
        "/apis/apps/v1/deployments",
        "/api/v1/services",
        "/apis/policy/v1/poddisruptionbudgets",
        "/apis/networking.k8s.io/v1/networkpolicies",
    ):
        live = await client.list(path, f"{MANAGED_BY_LABEL}=inferfleet-operator")
        children += sum(
            1
            for o in live
            if (o["metadata"]["namespace"], o["metadata"]["labels"].get("inferfleet.dev/service")) in wanted
        )
    result["num_objects"] = children
    return result


async def request_costs(
    client: PlainClient, services: list[dict], children: list[list[dict]], apiserver_pid: int, rounds: int = 3
) -> dict[str, float]:
    """API server CPU milliseconds per request, for each kind of write the two runs make, measured one kind at a
    time with nothing else running (the operator stopped): `rounds` rounds of one request per object, as many
    in flight as the bench's client allows, each round on new objects in namespace scale-cost; the median round.
    The InferenceServices are the operator run's, with the status the operator wrote; the children are the
    floor's, their Deployments at 0 replicas (the write's cost, not its rollout's). Each write's own cascade
    (a Service's ClusterIP and endpoints, a Deployment's ReplicaSet) is in its figure."""
    namespace = "scale-cost"
    await client.create({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    await wait_for_async(lambda: client.request("GET", f"/api/v1/namespaces/{namespace}/serviceaccounts/default"))
    live = await client.list("/apis/inferfleet.dev/v1alpha1/inferenceservices", f"{BENCH_LABEL}=true")
    status_by_name = {(s["metadata"]["namespace"], s["metadata"]["name"]): s.get("status") or {} for s in live}

    def moved(obj: dict, name: str) -> dict:
        meta = obj["metadata"]
        labels = {k: v for k, v in (meta.get("labels") or {}).items() if k != MANAGED_BY_LABEL}
        out = {**obj, "metadata": {"name": name, "namespace": namespace, "labels": labels}}
        out.pop("status", None)
        if obj["kind"] == "Deployment":
            out["spec"] = {**obj["spec"], "replicas": 0}
        return out

    def status_apply(service: dict, name: str) -> dict:
        key = (service["metadata"]["namespace"], service["metadata"]["name"])
        meta = {"name": name, "namespace": namespace}
        return {
            "apiVersion": service["apiVersion"],
            "kind": service["kind"],
            "metadata": meta,
            "status": status_by_name[key],
        }

    def event(service: dict, name: str) -> dict:
        return {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": f"{name}.cost", "namespace": namespace},
            "involvedObject": {
                "apiVersion": service["apiVersion"],
                "kind": service["kind"],
                "name": name,
                "namespace": namespace,
            },
            "type": "Normal",
            "reason": "RolledOut",
            "message": "as planned",
            "source": {"component": "inferfleet-scale-bench"},
            "firstTimestamp": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "count": 1,
        }

    # At least 100 requests a round (the CPU clock ticks every 10 ms): small runs repeat their objects.
    size = max(100, len(services))
    picked = [services[i % len(services)] for i in range(size)]
    by_kind = {
        kind: [c for per in children for c in per if c["kind"] == kind]
        for kind in ("Deployment", "Service", "PodDisruptionBudget")
    }
    kinds = {
        "create InferenceService": lambda r: [client.create(moved(s, f"s{r}-{i}")) for i, s in enumerate(picked)],
        "apply-status InferenceService": lambda r: [
            client.apply(status_apply(s, f"s{r}-{i}"), subresource="status") for i, s in enumerate(picked)
        ],
        "create Event": lambda r: [client.create(event(s, f"s{r}-{i}")) for i, s in enumerate(picked)],
        **{
            f"apply {kind}": lambda r, objs=objs: [
                client.apply(moved(objs[i % len(objs)], f"c{r}-{i}")) for i in range(max(100, len(objs)))
            ]
            for kind, objs in by_kind.items()
        },
    }
    samples: dict[str, list[float]] = {k: [] for k in kinds}
    for r in range(rounds):
        for kind, requests in kinds.items():
            pending = requests(r)
            before = _cpu_seconds(apiserver_pid)
            await asyncio.gather(*pending)
            samples[kind].append(1000 * (_cpu_seconds(apiserver_pid) - before) / len(pending))
    log("request costs (API server CPU ms, rounds): " + "; ".join(f"{k} {v}" for k, v in samples.items()))
    return {k: round(statistics.median(v), 2) for k, v in samples.items()}


def _cost_figures(costs: dict[str, float], op: dict, floor: dict, num: int) -> dict:
    """The per-request costs, and what the operator run's own writes of the InferenceServices (the bench's
    creates, the operator's status writes and Events, at the counts the run made) cost the API server per
    service, beside the API server's CPU per service over the whole floor run."""
    counts = op["requests_by_verb_kind"]
    own = costs["create InferenceService"] + sum(
        costs[kind] * counts.get(kind, 0) / num for kind in ("apply-status InferenceService", "create Event")
    )
    return {
        "apiserver_cpu_ms_per_request": costs,
        "apiserver_cpu_ms_per_service_inferenceservice_writes": round(own, 1),
        "apiserver_cpu_ms_per_service_floor_run": round(1000 * floor["cpu_by_process"]["kube-apiserver"] / num, 1),
    }


async def wait_for_async(read, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            await read()
            return
        except RuntimeError:
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.5)


def _start_py_spy(pid: int, out: Path) -> subprocess.Popen:
    """Samples the operator's Python stacks (py-spy, when installed) until _stop_py_spy."""
    py_spy = shutil.which("py-spy")
    if py_spy is None:
        raise SystemExit("--profile-operator needs py-spy on PATH (pip install py-spy)")
    command = [py_spy, "record", "--pid", str(pid), "--rate", "50", "--format", "raw", "--output", str(out)]
    return subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _stop_py_spy(profiler: subprocess.Popen, out: Path) -> None:
    profiler.send_signal(signal.SIGINT)  # py-spy writes its samples on SIGINT
    profiler.wait(timeout=60)
    log(f"operator profile (py-spy, collapsed stacks): {out}")


def _requests_by_verb_kind(metrics_text: str, before: dict[str, float]) -> dict[str, float]:
    """The operator's own count of API requests, "verb kind" -> number since `before`."""
    counts = {}
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            if sample.name == "inferfleet_operator_api_requests_total":
                key = f"{sample.labels['verb']} {sample.labels['kind']}"
                counts[key] = sample.value - before.get(key, 0)
    return {k: v for k, v in sorted(counts.items()) if v}


def _is_ready(service: dict) -> bool:
    status = service.get("status") or {}
    ready = any(c.get("type") == "Ready" and c.get("status") == "True" for c in status.get("conditions") or [])
    return ready and status.get("replicas", 0) > 0 and status.get("readyReplicas") == status.get("replicas")


# ----------------------------------------------------------------------------- the cluster


def start_cluster(state: Path) -> Cluster:
    env = {**os.environ, "INFERFLEET_CLUSTER_STATE": str(state), "INFERFLEET_CLUSTER_BIN": str(cluster_bin())}
    subprocess.run(["bash", str(CLUSTER_DIR / "up.sh")], check=True, env=env, stdout=subprocess.DEVNULL)
    return Cluster(state / "kubeconfig", Path(env["INFERFLEET_CLUSTER_BIN"]))


def stop_cluster(state: Path) -> None:
    env = {**os.environ, "INFERFLEET_CLUSTER_STATE": str(state), "INFERFLEET_CLUSTER_BIN": str(cluster_bin())}
    subprocess.run(["bash", str(CLUSTER_DIR / "down.sh")], check=False, env=env, stdout=subprocess.DEVNULL)


def _num_established_crds(cluster: Cluster) -> int:
    return sum(
        1
        for crd in cluster.items("crd")
        if crd["metadata"]["name"].endswith(".inferfleet.dev") and is_true(crd, "Established")
    )


async def bench(args: argparse.Namespace, cluster: Cluster, work: Path, is_own: bool) -> dict:
    client = PlainClient(cluster.kubeconfig, args.concurrency)
    try:
        if is_own:  # exactly N nodes: the fixture fleet of up.sh is not part of the benchmark
            cluster.kubectl("delete", "nodes", "-l", "inferfleet.dev/e2e-fleet=true", "--wait=false")
        nodes = make_nodes(args.nodes)
        log(f"Registering {len(nodes)} KWOK nodes")
        await create_all(client, nodes)
        started = time.monotonic()
        await wait_until(
            lambda: _num_ready_nodes(client, len(nodes)), "KWOK nodes Ready and untainted", len(nodes), 900, started
        )
        log("Installing CRDs, runtimes and the operator's ServiceAccount")
        # The CRDs first, waited for here: `kubectl wait` in install() fails outright when a CRD
        # has no status yet ("status.conditions accessor error"), a race right after creating it.
        cluster.kubectl("apply", "-f", str(E2E.parent / "crds"))
        wait_for(
            lambda: _num_established_crds(cluster) == 3, timeout=60, message="the three inferfleet CRDs Established"
        )
        operator_kubeconfig = install(cluster, work)
        count = max(1, min(args.namespaces, args.services))
        op_ns = [f"scale-op-{i}" for i in range(count)]
        floor_ns = {ns: ns.replace("scale-op-", "scale-floor-") for ns in op_ns}
        await create_all(
            client,
            [
                {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}}
                for ns in [*op_ns, *floor_ns.values()]
            ],
        )
        for ns in [*op_ns, *floor_ns.values()]:
            wait_for(
                lambda ns=ns: cluster.get("serviceaccount", "default", ns),
                timeout=60,
                message=f"the default ServiceAccount of {ns}",
            )
        services = make_services(args.services, op_ns)
        live_nodes = cluster.items("nodes")
        children = floor_children(services, live_nodes, runtime_objects(), floor_ns)
        pools = {
            d["metadata"]["labels"].get("inferfleet.dev/pool")
            for per in children
            for d in per
            if d["kind"] == "Deployment"
        }

        pids = {**cluster_pids(cluster.kubeconfig), "bench": os.getpid()}
        control_plane = {k: v for k, v in pids.items() if k in ("kube-apiserver", "kube-controller-manager", "etcd")}

        async def quiet() -> None:
            log("Waiting for the control plane to go quiet")
            await wait_idle(control_plane, share=0.25, timeout=180)

        await quiet()
        log(f"Floor: applying the planner's children of {len(services)} services directly")
        floor = await run_floor(client, children, args.timeout, pids)
        await quiet()
        log(f"Operator: creating {len(services)} InferenceServices with the operator running")
        operator = OperatorProcess(operator_kubeconfig, work / "operator.log", args=[])
        try:
            op = await run_operator(client, operator, services, args.timeout, pids, args.profile_operator)
        except BaseException:
            log(f"Operator log tail ({work / 'operator.log'}):\n{operator.log_tail(30)}")
            raise
        finally:
            operator.stop()
        num = len(services)
        costs = {}
        if args.request_costs:
            log("Request costs: each kind of write the runs make, one kind at a time")
            costs = await request_costs(client, services, children, pids["kube-apiserver"])
        return {
            "nodes": len(nodes),
            "services": num,
            "pools_used": len(pools),
            "deployments": floor["num_deployments"],
            "pods": floor["num_pods"],
            "floor_objects": floor["num_objects"],
            "operator_objects": op["num_objects"],
            "operator_seconds": round(op["seconds"], 2),
            "floor_seconds": round(floor["seconds"], 2),
            "ratio": round(op["seconds"] / floor["seconds"], 2),
            "operator_api_requests_per_service": round(op["operator_requests"] / num, 2),
            "operator_api_writes_per_service": round(op["operator_writes"] / num, 2),
            "operator_api_requests_by_verb_kind_per_service": {
                k: round(v / num, 2) for k, v in op["requests_by_verb_kind"].items()
            },
            "apiserver_requests_per_service_operator_run": round(op["apiserver_requests_others"] / num, 1),
            "apiserver_requests_per_service_floor_run": round(floor["apiserver_requests_others"] / num, 1),
            "operator_cpu_seconds": round(op["cpu_seconds"], 1),
            # CPU of the control plane (+ the operator) over the two runs: the work each run made,
            # which the load of other processes on the machine moves far less than the times.
            "cpu_ratio": round(_cluster_cpu(op["cpu_by_process"]) / _cluster_cpu(floor["cpu_by_process"]), 2),
            "cpu_seconds_floor_run": floor["cpu_by_process"],
            "cpu_seconds_operator_run": op["cpu_by_process"],
            "load_average_floor_run": floor["load_average"],
            "load_average_operator_run": op["load_average"],
            "apiserver_top_requests_per_service_floor_run": floor["apiserver_top"],
            "apiserver_top_requests_per_service_operator_run": op["apiserver_top"],
            "operator_peak_rss_mb": round(op["peak_rss_mb"], 1),
            "operator_rss_mb": round(op["rss_mb"], 1),
            "operator_idle_rss_mb": round(op["idle_rss_mb"], 1),
            "operator_reconciles": int(op["reconciles"]),
            "operator_reconcile_errors": int(op["reconcile_errors"]),
            **(_cost_figures(costs, op, floor, num) if costs else {}),
        }
    finally:
        await client.close()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--services", type=int, default=500)
    parser.add_argument("--namespaces", type=int, default=10, help="services are spread over this many")
    parser.add_argument(
        "--concurrency",
        type=int,
        default=8,
        help="requests in flight of the bench's own client (the operator's default)",
    )
    parser.add_argument("--timeout", type=float, default=1800, help="seconds per run before giving up")
    parser.add_argument(
        "--kubeconfig",
        type=Path,
        help="a fresh running cluster to use (default: start one); what the bench "
        "creates there (nodes, scale-* namespaces) is left in place",
    )
    parser.add_argument(
        "--request-costs",
        action="store_true",
        help="after the runs, measure the API server's CPU per request of each kind of write they made",
    )
    parser.add_argument("--keep-cluster", action="store_true", help="leave the bench's own cluster up")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument(
        "--profile-operator",
        type=Path,
        metavar="PATH",
        help="sample the operator's stacks with py-spy during its timed run, collapsed stacks to PATH",
    )
    args = parser.parse_args(argv)
    if args.nodes < 1 or args.services < 1:
        parser.error("--nodes and --services must be at least 1")

    work = Path(tempfile.mkdtemp(prefix="inferfleet-scale-"))
    state = work / "cluster"
    is_own = args.kubeconfig is None
    started = time.monotonic()
    try:
        if is_own:
            log(f"Starting a cluster in {state}")
            cluster = start_cluster(state)
        else:
            cluster = Cluster(args.kubeconfig, cluster_bin())
        result = asyncio.run(bench(args, cluster, work, is_own))
    finally:
        if is_own and not args.keep_cluster:
            log("Stopping the cluster")
            stop_cluster(state)
    if is_own and args.keep_cluster:
        log(
            f"The cluster is still up: export KUBECONFIG={state / 'kubeconfig'}; stop it with e2e/cluster/down.sh and "
            f"INFERFLEET_CLUSTER_STATE={state}"
        )
    else:
        shutil.rmtree(work, ignore_errors=True)  # kept (with the operator's log) when the run failed
    result["wall_seconds"] = round(time.monotonic() - started, 1)
    result["command"] = "python e2e/bench/scale.py " + " ".join(argv if argv is not None else sys.argv[1:])
    for key, value in result.items():
        print(f"{key}: {value}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    if result["operator_objects"] != result["floor_objects"]:
        log(
            f"The two runs did not make the same objects (floor {result['floor_objects']}, operator "
            f"{result['operator_objects']}): the ratio compares different work; not a result"
        )
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

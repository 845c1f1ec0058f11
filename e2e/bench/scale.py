"""Operator scale benchmark: N KWOK nodes, M InferenceServices, time to Ready against a direct-apply floor.

    python e2e/bench/scale.py --nodes 1000 --services 500

On the local cluster (its own, in a fresh state folder, unless --kubeconfig names a running one):
1. registers N KWOK nodes in five pools built from the e2e node fixtures' label schemes (NVIDIA H100
   and A100, AMD MI300X, Intel Max 1550, CPU), the CRDs, the chart's default InferenceRuntimes and
   the operator's ServiceAccount bound to exactly permissions.PERMISSIONS;
2. floor: the children the pure planner renders for the M services (Deployments, Services, PDBs)
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
import json
import os
import shutil
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

from inferfleet_operator.credentials import Credentials  # noqa: E402
from inferfleet_operator.kube import resource_path  # noqa: E402

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
            limits=httpx.Limits(max_connections=concurrency),
        )
        self.gate = asyncio.Semaphore(concurrency)
        self.num_requests = 0

    async def request(self, method: str, path: str, **kwargs) -> httpx.Response:
        async with self.gate:
            self.num_requests += 1
            response = await self.http.request(method, path, **kwargs)
        if response.status_code >= 400 and response.status_code != 409:
            raise RuntimeError(f"{method} {path}: {response.status_code} {response.text[:300]}")
        return response

    async def create(self, obj: dict) -> None:
        if obj["kind"] == "Namespace":  # not a kind the operator knows (kube.KINDS)
            path = "/api/v1/namespaces"
        else:
            path = resource_path(obj["apiVersion"], obj["kind"], obj["metadata"].get("namespace"))
        await self.request("POST", path, json=obj)

    async def apply(self, obj: dict) -> None:
        meta = obj["metadata"]
        path = resource_path(obj["apiVersion"], obj["kind"], meta.get("namespace"), meta["name"])
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

    async def apiserver_requests(self) -> float:
        """The API server's request count over every client (apiserver_request_total)."""
        text = (await self.request("GET", "/metrics")).text
        return sum(
            s.value
            for f in text_string_to_metric_families(text)
            for s in f.samples
            if s.name == "apiserver_request_total"
        )

    async def close(self) -> None:
        await self.http.aclose()


async def create_all(client: PlainClient, objects: list[dict]) -> None:
    await asyncio.gather(*(client.create(o) for o in objects))


class NodesLost(RuntimeError):
    """A bench node went NotReady during a timed run: its pods lost Ready for good (KWOK does not
    make them Ready again), so the run cannot finish and its figures would mean nothing."""


async def num_nodes_not_ready(client: PlainClient) -> int:
    nodes = await client.list("/api/v1/nodes", f"{BENCH_LABEL}=true")
    return sum(
        1
        for n in nodes
        if not any(
            c.get("type") == "Ready" and c.get("status") == "True"
            for c in (n.get("status") or {}).get("conditions") or []
        )
    )


async def wait_until(
    client: PlainClient, predicate, what: str, total: int, timeout: float, started: float, check_nodes: bool = True
) -> float:
    """Polls the async predicate (-> number done) every second until it reaches total; seconds since
    started. Every 5 s: a progress line, and a check that every bench node is still Ready."""
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
            lost = await num_nodes_not_ready(client) if check_nodes else 0
            if lost:
                raise NodesLost(
                    f"{lost} KWOK node(s) went NotReady during the run (their lease "
                    "renewals were starved: the machine is overloaded); rerun smaller"
                )
        if elapsed > timeout:
            raise TimeoutError(f"{what}: only {done}/{total} after {elapsed:.0f} s")
        await asyncio.sleep(1.0)


# ----------------------------------------------------------------------------- the two runs


async def _num_ready_nodes(client: PlainClient, total: int) -> int:
    return total - await num_nodes_not_ready(client)


async def run_floor(client: PlainClient, children: list[list[dict]], timeout: float) -> dict:
    selector = f"{MANAGED_BY_LABEL}={FLOOR_MANAGER}"
    deployments = [c for per in children for c in per if c["kind"] == "Deployment"]
    wanted = {(d["metadata"]["namespace"], d["metadata"]["name"]): d["spec"]["replicas"] for d in deployments}

    async def num_ready() -> int:
        live = await client.list("/apis/apps/v1/deployments", selector)
        keys = ((d["metadata"]["namespace"], d["metadata"]["name"]) for d in live)
        return sum(
            1
            for key, d in zip(keys, live)
            if key in wanted and (d.get("status") or {}).get("readyReplicas", 0) == wanted[key]
        )

    before, own_before = await client.apiserver_requests(), client.num_requests
    started = time.monotonic()
    # Per service in the planner's order (Deployments, Service, PDB), services side by side.
    await asyncio.gather(*(_apply_in_order(client, per) for per in children))
    log(f"floor: applied {sum(map(len, children))} objects in {time.monotonic() - started:.1f} s")
    seconds = await wait_until(client, num_ready, "floor: Deployments ready", len(wanted), timeout, started)
    own = client.num_requests - own_before + 1  # + the /metrics read below
    after = await client.apiserver_requests()
    return {
        "seconds": seconds,
        "num_objects": sum(map(len, children)),
        "num_deployments": len(wanted),
        "num_pods": sum(wanted.values()),
        "apiserver_requests_others": after - before - own,
    }


async def _apply_in_order(client: PlainClient, objects: list[dict]) -> None:
    for obj in objects:
        await client.apply(obj)


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


async def wait_idle(pid: int, timeout: float = 120) -> None:
    """Waits until a process used under 5% of a core over one second (its start-up lists are done)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        cpu = _cpu_seconds(pid)
        await asyncio.sleep(1.0)
        if _cpu_seconds(pid) - cpu < 0.05:
            return
    log(f"operator still busy after {timeout:.0f} s of start-up; starting anyway")


async def run_operator(client: PlainClient, operator: OperatorProcess, services: list[dict], timeout: float) -> dict:
    wanted = {(s["metadata"]["namespace"], s["metadata"]["name"]) for s in services}

    async def num_ready() -> int:
        live = await client.list("/apis/inferfleet.dev/v1alpha1/inferenceservices", f"{BENCH_LABEL}=true")
        return sum(1 for s in live if (s["metadata"]["namespace"], s["metadata"]["name"]) in wanted and _is_ready(s))

    operator.start(timeout=120)
    await wait_idle(operator.process.pid)
    idle_memory = _memory_kib(operator.process.pid)
    requests_before = operator.metric("inferfleet_operator_api_requests_total")
    requests_by_kind = _requests_by_verb_kind(operator.metrics_text(), {})
    writes_before = operator.num_writes()
    before, own_before = await client.apiserver_requests(), client.num_requests
    cpu_before = _cpu_seconds(operator.process.pid)
    started = time.monotonic()
    await create_all(client, services)
    log(f"operator: created {len(services)} InferenceServices in {time.monotonic() - started:.1f} s")
    seconds = await wait_until(client, num_ready, "operator: InferenceServices Ready", len(wanted), timeout, started)
    own = client.num_requests - own_before + 1
    after = await client.apiserver_requests()
    memory = _memory_kib(operator.process.pid)
    result = {
        "seconds": seconds,
        "cpu_seconds": _cpu_seconds(operator.process.pid) - cpu_before,
        "operator_requests": operator.metric("inferfleet_operator_api_requests_total") - requests_before,
        "operator_writes": operator.num_writes() - writes_before,
        "apiserver_requests_others": after - before - own,
        "peak_rss_mb": memory["VmHWM"] / 1024,
        "rss_mb": memory["VmRSS"] / 1024,
        "idle_rss_mb": idle_memory["VmRSS"] / 1024,
        "reconciles": operator.metric("inferfleet_operator_reconciles_total", kind="InferenceService"),
        "reconcile_errors": operator.metric("inferfleet_operator_reconcile_errors_total"),
        "requests_by_verb_kind": _requests_by_verb_kind(operator.metrics_text(), requests_by_kind),
    }
    children = 0
    for path in ("/apis/apps/v1/deployments", "/api/v1/services", "/apis/policy/v1/poddisruptionbudgets"):
        live = await client.list(path, f"{MANAGED_BY_LABEL}=inferfleet-operator")
        children += sum(
            1
            for o in live
            if (o["metadata"]["namespace"], o["metadata"]["labels"].get("inferfleet.dev/service")) in wanted
        )
    result["num_objects"] = children
    return result


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
            client,
            lambda: _num_ready_nodes(client, len(nodes)),
            "KWOK nodes Ready",
            len(nodes),
            900,
            started,
            check_nodes=False,
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

        log(f"Floor: applying the planner's children of {len(services)} services directly")
        floor = await run_floor(client, children, args.timeout)
        log(f"Operator: creating {len(services)} InferenceServices with the operator running")
        operator = OperatorProcess(operator_kubeconfig, work / "operator.log", args=[])
        try:
            op = await run_operator(client, operator, services, args.timeout)
        except BaseException:
            log(f"Operator log tail ({work / 'operator.log'}):\n{operator.log_tail(30)}")
            raise
        finally:
            operator.stop()
        num = len(services)
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
            "operator_peak_rss_mb": round(op["peak_rss_mb"], 1),
            "operator_rss_mb": round(op["rss_mb"], 1),
            "operator_idle_rss_mb": round(op["idle_rss_mb"], 1),
            "operator_reconciles": int(op["reconciles"]),
            "operator_reconcile_errors": int(op["reconcile_errors"]),
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
    parser.add_argument("--keep-cluster", action="store_true", help="leave the bench's own cluster up")
    parser.add_argument("--json", type=Path, help="also write the figures here")
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
    shutil.rmtree(work, ignore_errors=True)  # kept (with the operator's log) when the run failed
    result["wall_seconds"] = round(time.monotonic() - started, 1)
    result["command"] = "python e2e/bench/scale.py " + " ".join(argv if argv is not None else sys.argv[1:])
    for key, value in result.items():
        print(f"{key}: {value}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

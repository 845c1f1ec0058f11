"""The fleet for real on kind: the chart installs the operator image in a PSA-restricted namespace;
an InferenceService's CPU pool runs the paged runtime image in real pods that load the demo model
from a claim and answer the official openai client through the Service; simulated GPU pools (KWOK
nodes in the same cluster) get their Deployments; a serving pod deleted mid-traffic is replaced while
the Service keeps answering; two replicas fetch an hf:// model once through the node model cache; helm
uninstall removes what the operator made. Every serving assertion
goes through HTTP to a real pod."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
import uuid
from contextlib import contextmanager

import httpx
import openai
import pytest
from helpers import ROOT, condition, static_claim, wait_for
from prometheus_client.parser import text_string_to_metric_families

pytestmark = [pytest.mark.e2e, pytest.mark.slow, pytest.mark.timeout(1800)]

CHART = ROOT / "charts" / "inferfleet"
SUFFIX = uuid.uuid4().hex[:5]
RESTRICTED = {
    "pod-security.kubernetes.io/enforce": "restricted",
    "pod-security.kubernetes.io/enforce-version": "latest",
}
MANAGED = "app.kubernetes.io/managed-by=inferfleet-operator"
MODEL = "demo"
CPU_POOL = "cpu-amd64"
ENGINE = {"maxContextLength": 256, "maxBatchSize": 4, "dtype": "float32"}
SMALL = {"cpu": "250m", "memory": "1536Mi"}
ROUTER = {"cpu": "10m", "memory": "256Mi"}  # each service's router: light, and the node has 2 cores
SERVERS = "app.kubernetes.io/component=server"  # a service's serving pods (its router's pods share its label)
MODEL_CACHE_CLAIM = "inferfleet-model-cache"
MODEL_CACHE_NODE_DIR = "/var/lib/inferfleet/model-cache"
BUILD = {"resources": {"cpu": "250m", "memory": "6Gi"}}  # a compile Job fits beside the serving pods on 2 cores
# up.sh taints the simulated GPU nodes so that only pods meant for them land there.
KWOK_TOLERATION = {
    "key": "kwok.x-k8s.io/node",
    "operator": "Exists",
    "effect": "NoSchedule",
}  # two replicas fit beside kube-system on a 2-core node


def _split(image: str) -> tuple[str, str]:
    repository, _, tag = image.rpartition(":")
    return repository, tag


@pytest.fixture(scope="module")
def release(kind_cluster):
    """The chart installed with the project's images: operator, CRDs, RBAC, default runtimes."""
    # A reused cluster may hold the release of a session that was killed: the CRDs can have one owner.
    for old in json.loads(kind_cluster.helm("list", "--all-namespaces", "--output", "json").stdout or "[]"):
        kind_cluster.helm("uninstall", old["name"], "--namespace", old["namespace"], "--wait", timeout=300)
    namespace = kind_cluster.create_namespace(f"inferfleet-{SUFFIX}", labels=RESTRICTED)
    repo, tag = _split(kind_cluster.operator_image)
    rt_repo, rt_tag = _split(kind_cluster.runtime_image)
    values = [
        f"image.repository={repo}",
        f"image.tag={tag}",
        "image.pullPolicy=Never",
        f"runtimes.items.paged-cpu.image.repository={rt_repo}",
        f"runtimes.items.paged-cpu.image.tag={rt_tag}",
        "engineCache.create=false",
        "engineCache.existingClaim=engine-cache",
        "crds.keep=false",
        f"modelCache.claimName={MODEL_CACHE_CLAIM}",  # hf:// and s3:// models only: the other tests use claims
        "modelCache.budget=1Gi",
    ]
    sets = [arg for value in values for arg in ("--set", value)]
    name = f"inferfleet-{SUFFIX}"
    kind_cluster.helm(
        "install", name, str(CHART), "--namespace", namespace, *sets, "--wait", "--timeout", "5m", timeout=360
    )
    # Runtimes need their CRD served first: the chart creates them on the next upgrade (its notes say so).
    kind_cluster.helm("upgrade", name, str(CHART), "--namespace", namespace, "--reuse-values", timeout=180)
    yield {"name": name, "namespace": namespace}
    kind_cluster.helm("uninstall", name, "--namespace", namespace, check=False)
    kind_cluster.delete_namespace(namespace)


@pytest.fixture(scope="module")
def serve_ns(kind_cluster, release):
    """A restricted namespace with the demo model on a read-only claim (`models`) and an engine cache claim."""
    from inferfleet_runtime.demo.builtin_model import ensure_demo_model

    namespace = kind_cluster.create_namespace(f"serve-{SUFFIX}", labels=RESTRICTED)
    model_dir = kind_cluster.models_dir / MODEL
    if model_dir.exists():
        shutil.rmtree(model_dir)
    shutil.copytree(ensure_demo_model(), model_dir)
    for path in [model_dir, *model_dir.rglob("*")]:
        path.chmod(0o755 if path.is_dir() else 0o644)  # the pods run as uid 1000
    volume, engines = f"models-{namespace}", f"engines-{namespace}"
    # The engine cache on the node, writable by the pods' uid 1000 (a hostPath volume is not chowned to fsGroup).
    engines_path = f"/var/lib/inferfleet-engines/{namespace}"
    subprocess.run(
        ["docker", "exec", kind_cluster.env["KIND_NODE"], "mkdir", "-p", "-m", "0777", engines_path], check=True
    )
    kind_cluster.apply(
        static_claim("models", namespace, volume, kind_cluster.models_node_dir, access_mode="ReadOnlyMany", size="1Gi")
        + static_claim("engine-cache", namespace, engines, engines_path, access_mode="ReadWriteOnce", size="2Gi")
    )
    yield namespace
    kind_cluster.delete_namespace(namespace)
    kind_cluster.kubectl("delete", "pv", volume, engines, "--wait=false", "--ignore-not-found")


def _service(name: str, vendors: list[str], replicas: int, runtime: dict | None = None, engine: dict = ENGINE) -> dict:
    return {
        "apiVersion": "inferfleet.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": name},
        "spec": {
            "model": {"name": MODEL, "uri": f"pvc://models/{MODEL}"},
            "engine": engine,
            "replicas": replicas,
            "placement": {"vendors": vendors},
            "resources": SMALL,
            "build": BUILD,
            "runtime": runtime or {"policy": "Paged"},
            "routing": {"router": ROUTER},
        },
    }


def _ready_replicas(kind_cluster, namespace: str, deployment: str) -> int:
    obj = kind_cluster.get("deployment", deployment, namespace) or {}
    return (obj.get("status") or {}).get("readyReplicas") or 0


@contextmanager
def port_forward(kind_cluster, namespace: str, target: str, port: int):
    """`kubectl port-forward` to a Service, as a user reaches it from a laptop, once the service's router is ready
    (it is, once it has found a ready serving pod); yields the local base URL."""
    kind, _, name = target.partition("/")
    if kind == "service":
        wait_for(
            lambda: _ready_replicas(kind_cluster, namespace, f"{name}-router") >= 1,
            timeout=180,
            interval=1,
            message=f"{name}-router ready (it routes over the service's ready pods)",
        )
    cmd = [
        str(kind_cluster.bin / "kubectl"),
        "--kubeconfig",
        str(kind_cluster.kubeconfig),
        "-n",
        namespace,
        "port-forward",
        target,
        f":{port}",
    ]
    process = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = process.stdout.readline()
        match = re.search(r"127\.0\.0\.1:(\d+)", line)
        assert match, f"port-forward said {line!r} {process.stderr.read() if process.poll() is not None else ''}"
        yield f"http://127.0.0.1:{match.group(1)}"
    finally:
        process.terminate()
        process.wait(timeout=10)


@pytest.fixture(scope="module")
def demo(kind_cluster, serve_ns):
    """The CPU-pool InferenceService, once its real pod has passed readiness with the model loaded."""
    kind_cluster.apply(_service("demo", ["cpu"], 1), namespace=serve_ns)
    deployment = f"demo-{CPU_POOL}"
    began = time.monotonic()
    wait_for(
        lambda: _ready_replicas(kind_cluster, serve_ns, deployment) >= 1,
        timeout=600,
        interval=2,
        message=f"{deployment} ready (a real pod that loaded the model)",
    )
    print(f"first Ready serving pod {time.monotonic() - began:.1f} s after apply")
    return serve_ns


def test_operator_runs_from_its_image_as_non_root_in_a_restricted_namespace(kind_cluster, release):
    pods = kind_cluster.items("pods", release["namespace"], selector=f"app.kubernetes.io/instance={release['name']}")
    [pod] = [p for p in pods if p["status"].get("phase") == "Running"]
    [container] = pod["spec"]["containers"]
    assert container["image"] == kind_cluster.operator_image
    assert condition(pod, "Ready")["status"] == "True"
    assert pod["spec"]["securityContext"]["runAsUser"] != 0
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    runtimes = {r["metadata"]["name"]: r["spec"] for r in kind_cluster.items("inferenceruntimes")}
    assert runtimes["paged-cpu"]["image"] == kind_cluster.runtime_image


@contextmanager
def node_cache_namespace(kind_cluster, repo: str, model_dir):
    """A restricted namespace whose pods reach the node model cache and a Hub stand-in serving `model_dir` as
    hf://`repo`: the cache folder made empty on the node (what an administrator does once per node; here docker
    exec), a hostPath volume on it offered by the claim the release names, and the stand-in (on this machine, reached
    by pods through the node's gateway) as HF_ENDPOINT in a Secret the service names as its credentialsSecret `hub`.
    Yields (namespace, stand-in)."""
    sys.path.insert(0, str(ROOT / "tests" / "runtime" / "support"))
    from hub_standin import HubStandIn

    node = kind_cluster.env["KIND_NODE"]
    prepare = (
        f"rm -rf {MODEL_CACHE_NODE_DIR} && mkdir -p {MODEL_CACHE_NODE_DIR} && chown 1000:1000 {MODEL_CACHE_NODE_DIR}"
    )
    subprocess.run(["docker", "exec", node, "sh", "-c", prepare], check=True)
    route = subprocess.run(["docker", "exec", node, "ip", "-4", "route", "show", "default"], capture_output=True)
    gateway = route.stdout.decode().split()[2]  # "default via <gateway> dev eth0"
    hub = HubStandIn(repo, model_dir)
    endpoint = hub.start(host="0.0.0.0", advertised=gateway)
    namespace = kind_cluster.create_namespace(f"cache-{SUFFIX}", labels=RESTRICTED)
    volume = f"model-cache-{namespace}"
    try:
        claim = static_claim(
            MODEL_CACHE_CLAIM, namespace, volume, MODEL_CACHE_NODE_DIR, access_mode="ReadWriteMany", size="1Gi",
            path_type="Directory",
        )  # fmt: skip
        secret = {
            "apiVersion": "v1",
            "kind": "Secret",
            "metadata": {"name": "hub", "namespace": namespace},
            "stringData": {"HF_ENDPOINT": endpoint},
        }
        kind_cluster.apply([*claim, secret])
        yield namespace, hub
    finally:
        kind_cluster.delete_namespace(namespace)
        kind_cluster.kubectl("delete", "pv", volume, "--wait=false", "--ignore-not-found")
        hub.stop()


def node_cache_fetches(kind_cluster) -> list[dict]:
    """The node model cache's record of the fetches that downloaded bytes (fetches.jsonl on the node)."""
    found = subprocess.run(
        ["docker", "exec", kind_cluster.env["KIND_NODE"], "cat", f"{MODEL_CACHE_NODE_DIR}/fetches.jsonl"],
        capture_output=True,
        text=True,
    )
    return [json.loads(line) for line in found.stdout.splitlines() if line.strip()]


def test_two_replicas_on_the_node_download_their_model_once_through_the_node_model_cache(kind_cluster, release):
    """Runs before the module's other services take the node's CPU. hf:// from the Hub stand-in: two real pods on the node, one download counted at the stand-in and in the
    cache's own record, and both answer the openai client from the one entry."""
    from inferfleet_runtime.demo.builtin_model import ensure_demo_model

    with node_cache_namespace(kind_cluster, "inferfleet/cached", ensure_demo_model()) as (namespace, hub):
        cached = _service("cached", ["cpu"], 2)
        cached["spec"]["model"] = {"name": MODEL, "uri": "hf://inferfleet/cached", "credentialsSecret": "hub"}
        kind_cluster.apply(cached, namespace=namespace)
        wait_for(
            lambda: _ready_replicas(kind_cluster, namespace, f"cached-{CPU_POOL}") >= 2,
            timeout=600,
            interval=2,
            message="both replicas ready, their model from the node cache",
        )
        downloads = [r for r in hub.requests if r.method == "GET" and r.path.endswith(".safetensors")]
        assert len(downloads) == 1, [r.path for r in hub.requests]
        fetches = node_cache_fetches(kind_cluster)
        assert [f["uri"] for f in fetches] == ["hf://inferfleet/cached"], fetches
        pods = kind_cluster.items("pods", namespace, selector=f"inferfleet.dev/service=cached,{SERVERS}")
        assert len(pods) == 2 and {p["spec"]["nodeName"] for p in pods} == {kind_cluster.env["KIND_NODE"]}
        for pod in pods:
            logs = kind_cluster.kubectl("logs", pod["metadata"]["name"], "-n", namespace, "-c", "fetch-model")
            print(logs.stdout + logs.stderr)
        with port_forward(kind_cluster, namespace, "service/cached", 8000) as base:
            client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=120)
            for _ in range(4):  # the router spreads these over both pods
                reply = client.completions.create(
                    model=MODEL, prompt="Beautiful is better than", max_tokens=6, temperature=0
                )
                assert reply.choices[0].text.startswith(" ugly.")


def test_cpu_pool_answers_chat_and_streamed_chat_through_the_service(kind_cluster, demo):
    [pod] = kind_cluster.items("pods", demo, selector=f"inferfleet.dev/service=demo,{SERVERS}")
    assert pod["spec"]["containers"][0]["image"] == kind_cluster.runtime_image
    assert pod["spec"]["nodeName"] == kind_cluster.env["KIND_NODE"]  # the real node, not a KWOK one
    # The C kernels, built by the pod itself at start (g++ in the image, native.c in the wheel, cache under /tmp).
    logs = kind_cluster.kubectl("logs", pod["metadata"]["name"], "-n", demo).stdout
    assert "float32 on cpu, kernels native" in logs, logs[-2000:]
    with port_forward(kind_cluster, demo, "service/demo", 8000) as base:
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=120)
        began = time.monotonic()
        messages = [{"role": "user", "content": "Complete: Beautiful is"}]
        whole = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=16, temperature=0)
        print(f"first chat completion through the Service in {time.monotonic() - began:.2f} s")
        assert whole.choices[0].message.content.startswith("Beautiful is better than ugly.")
        chunks = list(
            client.chat.completions.create(model=MODEL, messages=messages, max_tokens=16, temperature=0, stream=True)
        )
        streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert streamed == whole.choices[0].message.content
        completion = client.completions.create(
            model=MODEL, prompt="Beautiful is better than", max_tokens=6, temperature=0
        )
        assert completion.choices[0].text.startswith(" ugly.")
    wide = kind_cluster.kubectl("get", "infsvc", "demo", "-n", demo, "-o", "wide").stdout
    print(wide)
    assert "paged" in wide.lower()


def _samples(page: str, name: str) -> dict[tuple[str, str], float]:
    """(pool, endpoint) -> value of a router metric, from its Prometheus page."""
    found = {}
    for family in text_string_to_metric_families(page):
        for item in family.samples:
            if item.name == name:
                found[(item.labels["pool"], item.labels["endpoint"])] = item.value
    return found


def test_the_service_endpoint_is_its_router_which_sends_nothing_to_pods_whose_metrics_never_answer(
    kind_cluster, serve_ns
):
    """One real CPU pod and simulated GPU pools behind one endpoint (as in the demo): the router finds every pool's
    pods through their headless Services, and only the real pod, whose /metrics answers, gets requests."""
    mixed = _service("mixed", ["nvidia", "amd", "cpu"], 3)
    mixed["spec"]["pools"] = [{"name": CPU_POOL, "replicas": 1}]
    mixed["spec"]["placement"]["tolerations"] = [KWOK_TOLERATION]
    kind_cluster.apply(mixed, namespace=serve_ns)
    try:

        def pools_ready() -> set[str]:
            found = kind_cluster.items("deployments", serve_ns, f"inferfleet.dev/service=mixed,{SERVERS}")
            is_ready = len(found) >= 2 and all((d["status"].get("readyReplicas") or 0) >= 1 for d in found)
            return {d["metadata"]["labels"]["inferfleet.dev/pool"] for d in found} if is_ready else set()

        pools = wait_for(pools_ready, timeout=600, interval=2, message="the real pod and the simulated ones ready")
        assert CPU_POOL in pools
        [router] = kind_cluster.items(
            "pods", serve_ns, "inferfleet.dev/service=mixed,app.kubernetes.io/component=router"
        )
        assert router["spec"]["nodeName"] == kind_cluster.env["KIND_NODE"]  # the real node, not a simulated one
        assert router["spec"]["containers"][0]["image"] == kind_cluster.operator_image
        with port_forward(kind_cluster, serve_ns, "service/mixed", 8000) as base:
            client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=120)
            for _ in range(6):
                reply = client.completions.create(model=MODEL, prompt="Beautiful is better than", max_tokens=4)
                assert reply.usage.completion_tokens == 4

            def simulated_endpoints_known() -> str:
                page = httpx.get(f"{base}/metrics", timeout=10).text
                known = {pool for pool, _ in _samples(page, "inferfleet_router_endpoint_ready")}
                return page if known == pools else ""  # the router lists the endpoints it knows at each /metrics

            page = wait_for(simulated_endpoints_known, timeout=60, interval=2, message="every pool's pods known")
        rates = {
            pool: (source, value)
            for family in text_string_to_metric_families(page)
            for item in family.samples
            if item.name == "inferfleet_router_pool_decode_tokens_per_second"
            for pool, source, value in [(item.labels["pool"], item.labels["source"], item.value)]
        }
        print(f"pool profiles: {rates}")
        assert rates[CPU_POOL][0] == "measured" and rates[CPU_POOL][1] > 0  # the real pod calibrated at its start
        routed = _samples(page, "inferfleet_router_routed_requests_total")
        ready = _samples(page, "inferfleet_router_endpoint_ready")
        print(f"routed: {routed}\nready: {ready}")
        assert sum(v for (pool, _), v in routed.items() if pool == CPU_POOL) == 6
        assert sum(v for (pool, _), v in routed.items() if pool != CPU_POOL) == 0
        assert [v for (pool, _), v in ready.items() if pool == CPU_POOL] == [1.0]
        assert all(v == 0 for (pool, _), v in ready.items() if pool != CPU_POOL)
        status = kind_cluster.get("infsvc", "mixed", serve_ns)["status"]["routing"]
        assert (status["mode"], status["router"]) == ("Router", "mixed-router")

        def cpu_profile() -> str:
            pools = (kind_cluster.get("infsvc", "mixed", serve_ns).get("status") or {}).get("pools") or []
            return next((p.get("profile") or "" for p in pools if p["name"] == CPU_POOL), "")

        line = wait_for(cpu_profile, timeout=60, interval=2, message="the CPU pool's measured profile in status")
        print(f"status.pools[{CPU_POOL}].profile: {line}")
        assert line.startswith("decode ") and "measured by pod mixed-cpu-amd64-" in line
    finally:
        kind_cluster.kubectl("delete", "infsvc", "mixed", "-n", serve_ns, "--wait=true", "--timeout=120s", timeout=150)


def test_a_tensor_parallel_service_answers_from_one_cpu_pod_running_two_ranks(kind_cluster, demo):
    sharded = _service("sharded", ["cpu"], 1)
    sharded["spec"]["engine"] = {**ENGINE, "tensorParallelSize": 2}
    sharded["spec"]["resources"] = {**SMALL, "gpusPerReplica": 2}  # the CRD holds the two equal
    kind_cluster.apply(sharded, namespace=demo)
    deployment = f"sharded-{CPU_POOL}"
    try:
        wait_for(
            lambda: _ready_replicas(kind_cluster, demo, deployment) >= 1,
            timeout=600,
            interval=2,
            message=f"{deployment} ready (one pod, two tensor-parallel ranks)",
        )
        [pod] = kind_cluster.items("pods", demo, selector=f"inferfleet.dev/service=sharded,{SERVERS}")
        container = pod["spec"]["containers"][0]
        assert container["args"][container["args"].index("--tensor-parallel-size") + 1] == "2"
        assert {"name": "dshm", "mountPath": "/dev/shm"} in container["volumeMounts"]
        logs = kind_cluster.kubectl("logs", pod["metadata"]["name"], "-n", demo).stdout
        assert "tensor-parallel rank 0 of 2" in logs and "tensor-parallel rank 1 of 2" in logs, logs[-3000:]
        with port_forward(kind_cluster, demo, "service/sharded", 8000) as base:
            client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=120)
            messages = [{"role": "user", "content": "Complete: Beautiful is"}]
            reply = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=16, temperature=0)
            assert reply.choices[0].message.content.startswith("Beautiful is better than ugly.")  # as one rank says
    finally:
        kind_cluster.kubectl("delete", "infsvc", "sharded", "-n", demo, "--wait=true", check=False)


def test_simulated_gpu_pools_get_their_deployments_in_the_same_cluster(kind_cluster, serve_ns):
    fleet = _service("fleet", ["nvidia", "amd", "intel"], 3, runtime={"policy": "Auto"})
    fleet["spec"]["placement"]["tolerations"] = [KWOK_TOLERATION]
    kind_cluster.apply(fleet, namespace=serve_ns)

    def gpu_deployments() -> dict[str, dict]:
        found = {
            d["metadata"]["name"]: d
            for d in kind_cluster.items("deployments", serve_ns, f"inferfleet.dev/service=fleet,{SERVERS}")
        }
        return (
            found
            if len(found) == 3 and all((d["status"].get("readyReplicas") or 0) >= 1 for d in found.values())
            else {}
        )

    deployments = wait_for(gpu_deployments, timeout=180, interval=2, message="a ready Deployment per GPU pool (KWOK)")
    assert {name.split("-", 2)[1] for name in deployments} == {"nvidia", "amd", "intel"}
    kwok_nodes = {
        n["metadata"]["name"]
        for n in kind_cluster.items("nodes")
        if (n["metadata"].get("annotations") or {}).get("kwok.x-k8s.io/node") == "fake"
    }
    pods = kind_cluster.items("pods", serve_ns, f"inferfleet.dev/service=fleet,{SERVERS}")
    assert pods and {p["spec"].get("nodeName") for p in pods} <= kwok_nodes
    # The NVIDIA pool prefers the compiled TensorRT runtime: its EngineBuild and compile Job exist.
    assert kind_cluster.items("enginebuilds", serve_ns)


CLIENT_LOOP = r"""
import json, sys, time, httpx
url, seconds = sys.argv[1], float(sys.argv[2])
body = {"model": "demo", "prompt": "Beautiful is better than", "max_tokens": 4, "temperature": 0}
end = time.time() + seconds
with httpx.Client(timeout=30) as client:
    while time.time() < end:
        for attempt in range(3):  # like the openai client: connection errors are retried
            try:
                r = client.post(url, json=body)
                outcome = "ok" if r.status_code == 200 and r.json()["choices"][0]["text"] else f"http{r.status_code}"
                break
            except httpx.TransportError as error:
                print(json.dumps({"t": time.time(), "outcome": f"retry:{type(error).__name__}"}), flush=True)
                time.sleep(0.2)
        else:
            outcome = "failed after 3 attempts"
        print(json.dumps({"t": time.time(), "outcome": outcome}), flush=True)
"""


def _client_lines(kind_cluster, namespace: str, pod: str) -> list[dict]:
    out = kind_cluster.kubectl("logs", pod, "-n", namespace, check=False).stdout
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def _client_pod(name: str, image: str, seconds: int, service: str = "demo") -> dict:
    security = {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "runAsNonRoot": True,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name},
        "spec": {
            "restartPolicy": "Never",
            "containers": [
                {
                    "name": "client",
                    "image": image,
                    "imagePullPolicy": "Never",
                    "command": ["python", "-c", CLIENT_LOOP],
                    "args": [f"http://{service}:8000/v1/completions", str(seconds)],
                    "securityContext": security,
                    "resources": {"requests": {"cpu": "50m", "memory": "128Mi"}},
                }
            ],
        },
    }


def test_deleted_serving_pod_is_replaced_while_the_service_keeps_answering(kind_cluster, demo):
    deployment = f"demo-{CPU_POOL}"
    kind_cluster.kubectl("patch", "infsvc", "demo", "-n", demo, "--type=merge", "-p", '{"spec": {"replicas": 2}}')
    wait_for(
        lambda: _ready_replicas(kind_cluster, demo, deployment) == 2,
        timeout=600,
        interval=2,
        message=f"{deployment} at 2 ready replicas",
    )
    kind_cluster.apply(_client_pod("client", kind_cluster.runtime_image, 150), namespace=demo)

    def client_lines() -> list[dict]:
        return _client_lines(kind_cluster, demo, "client")

    wait_for(lambda: sum(e["outcome"] == "ok" for e in client_lines()) >= 5, timeout=120, message="client traffic")
    [victim, *_] = sorted(
        p["metadata"]["name"] for p in kind_cluster.items("pods", demo, f"inferfleet.dev/service=demo,{SERVERS}")
    )
    deleted_at = time.time()
    kind_cluster.kubectl("delete", "pod", victim, "-n", demo, "--wait=false")

    def replaced() -> bool:
        pods = kind_cluster.items("pods", demo, f"inferfleet.dev/service=demo,{SERVERS}")
        names = {
            p["metadata"]["name"] for p in pods if condition(p, "Ready") and condition(p, "Ready")["status"] == "True"
        }
        return len(names) == 2 and victim not in names

    wait_for(replaced, timeout=600, interval=2, message="the deleted pod replaced by a ready one")
    replaced_at = time.time()
    wait_for(
        lambda: (kind_cluster.get("pod", "client", demo) or {}).get("status", {}).get("phase") == "Succeeded",
        timeout=300,
        interval=2,
        message="the client loop finished",
    )
    lines = client_lines()
    final = [e for e in lines if not e["outcome"].startswith("retry")]
    during = [e for e in final if deleted_at <= e["t"] <= replaced_at]
    failures = [e for e in final if e["outcome"] != "ok"]
    retries = [e for e in lines if e["outcome"].startswith("retry")]
    print(
        f"requests={len(final)} during-replacement={len(during)} failed={len(failures)} retried-connections={len(retries)}"
    )
    assert during and all(e["outcome"] == "ok" for e in during), (
        "the Service stopped answering while the pod was replaced"
    )
    assert not failures
    kind_cluster.kubectl("patch", "infsvc", "demo", "-n", demo, "--type=merge", "-p", '{"spec": {"replicas": 1}}')


def _compiled_runtime(kind_cluster) -> dict:
    """An InferenceRuntime giving CPU nodes an AOTInductor engine, compiled and served by the runtime image."""
    return {
        "apiVersion": "inferfleet.dev/v1alpha1",
        "kind": "InferenceRuntime",
        "metadata": {"name": "compiled-cpu-e2e"},
        "spec": {
            "engine": "Compiled",
            "vendors": ["cpu"],
            "image": kind_cluster.runtime_image,
            "compileImage": kind_cluster.runtime_image,
            "priority": 20,
        },
    }


def _build_of(kind_cluster, namespace: str, service: str) -> dict | None:
    pool = {
        p["name"]: p
        for p in ((kind_cluster.get("infsvc", service, namespace) or {}).get("status") or {}).get("pools") or []
    }
    key = (pool.get(CPU_POOL) or {}).get("engineBuild") or (pool.get(CPU_POOL) or {}).get("engineKey")
    return kind_cluster.get("enginebuild", key, namespace) if key else None


def _serving_compiled(kind_cluster, namespace: str, deployment: str, key: str) -> bool:
    obj = kind_cluster.get("deployment", deployment, namespace) or {}
    spec, status = obj.get("spec") or {}, obj.get("status") or {}
    args = spec["template"]["spec"]["containers"][0]["args"] if spec else []
    settled = status.get("observedGeneration") == obj.get("metadata", {}).get("generation")
    return (
        any(arg == f"/engines/{key}" or arg.startswith(f"/engines/{key}/") for arg in args)  # <key>/<model digest>
        and settled
        and status.get("updatedReplicas") == spec.get("replicas") == status.get("readyReplicas")
        and not status.get("unavailableReplicas")
        and status.get("replicas") == spec["replicas"]
    )


def _greedy(kind_cluster, namespace: str, service: str) -> str:
    with port_forward(kind_cluster, namespace, f"service/{service}", 8000) as base:
        client = openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=120)
        return (
            client.completions.create(model=MODEL, prompt="Beautiful is better than", max_tokens=12, temperature=0)
            .choices[0]
            .text
        )


def test_cpu_pool_serves_a_compiled_engine_built_by_a_real_job_with_the_paged_greedy_tokens(kind_cluster, demo):
    kind_cluster.apply(_compiled_runtime(kind_cluster))
    kind_cluster.apply(
        _service("compiled", ["cpu"], 1, runtime={"policy": "Compiled", "bridge": False}), namespace=demo
    )
    build = wait_for(
        lambda: (
            (b := _build_of(kind_cluster, demo, "compiled")) and (b.get("status") or {}).get("state") == "Ready" and b
        ),
        timeout=900,
        interval=3,
        message="the EngineBuild Ready (its compile Job ran in a pod)",
    )
    status = build["status"]
    print(
        f"engine {build['metadata']['name']}: {status.get('artifactSizeBytes')} bytes in {status.get('durationSeconds')} s"
    )
    assert status["artifactSizeBytes"] > 0 and status["durationSeconds"] > 0
    [job] = kind_cluster.items("jobs", demo, f"inferfleet.dev/engine-build={build['metadata']['name']}")
    assert job["status"].get("succeeded") == 1
    key = build["spec"]["engineKey"]
    wait_for(
        lambda: _serving_compiled(kind_cluster, demo, f"compiled-{CPU_POOL}", key),
        timeout=600,
        interval=2,
        message="the compiled pool's pod serving the engine and ready",
    )
    compiled, paged = _greedy(kind_cluster, demo, "compiled"), _greedy(kind_cluster, demo, "demo")
    print(f"greedy compiled={compiled!r} paged={paged!r}")
    assert compiled == paged and compiled.startswith(" ugly.")


def test_envelope_change_builds_a_new_engine_while_the_old_one_answers_every_request(kind_cluster, demo):
    old_key = _build_of(kind_cluster, demo, "compiled")["metadata"]["name"]
    kind_cluster.apply(
        _client_pod("switch-client", kind_cluster.runtime_image, 600, service="compiled"), namespace=demo
    )
    wait_for(
        lambda: sum(e["outcome"] == "ok" for e in _client_lines(kind_cluster, demo, "switch-client")) >= 3,
        timeout=120,
        message="client traffic to the compiled service",
    )
    kind_cluster.kubectl(
        "patch",
        "infsvc",
        "compiled",
        "-n",
        demo,
        "--type=merge",
        "-p",
        json.dumps({"spec": {"engine": {**ENGINE, "maxBatchSize": 2}}}),
    )
    new = wait_for(
        lambda: (b := _build_of(kind_cluster, demo, "compiled")) and b["metadata"]["name"] != old_key and b,
        timeout=120,
        interval=2,
        message="a new EngineBuild for the new envelope",
    )
    new_key = new["spec"]["engineKey"]
    wait_for(
        lambda: _serving_compiled(kind_cluster, demo, f"compiled-{CPU_POOL}", new_key),
        timeout=1200,
        interval=3,
        message="the pool rolled onto the new engine",
    )
    switched_at = time.time()
    wait_for(
        lambda: any(e["t"] > switched_at + 5 for e in _client_lines(kind_cluster, demo, "switch-client")),
        timeout=120,
        message="traffic after the switch",
    )
    kind_cluster.kubectl("delete", "pod", "switch-client", "-n", demo, "--wait=false")
    lines = _client_lines(kind_cluster, demo, "switch-client")
    final = [e for e in lines if not e["outcome"].startswith("retry")]
    failures = [e for e in final if e["outcome"] != "ok"]
    print(
        f"engine switch {old_key} -> {new_key}: requests={len(final)} failed={len(failures)} "
        f"retried-connections={sum(e['outcome'].startswith('retry') for e in lines)}"
    )
    assert len(final) >= 10 and not failures


def test_helm_uninstall_removes_what_the_operator_created(kind_cluster, release, serve_ns):
    assert kind_cluster.items("deployments", serve_ns, MANAGED)  # there is something to remove
    # InferenceServices and EngineBuilds first (their children go by ownerReferences), then the release;
    # with crds.keep=false the uninstall takes the CRDs, and with them the runtimes.
    for kind in ("infsvc", "enginebuilds"):
        kind_cluster.kubectl("delete", kind, "--all", "-n", serve_ns, "--wait=true", "--timeout=120s", timeout=150)
    kind_cluster.helm("uninstall", release["name"], "--namespace", release["namespace"], "--wait", timeout=300)

    def leftovers() -> list[str]:
        kinds = ["deployments", "services", "jobs", "poddisruptionbudgets", "networkpolicies"]
        left = [f"{k}/{o['metadata']['name']}" for k in kinds for o in kind_cluster.items(k, serve_ns, MANAGED)]
        crds = kind_cluster.kubectl("get", "crd", "-o", "name").stdout.split()
        return left + [c for c in crds if c.endswith(".inferfleet.dev")]

    wait_for(lambda: not leftovers(), timeout=180, interval=2, message="no object the operator created left")
    # `helm uninstall --wait` waits for the Deployment; its pod is deleted after it by the garbage collector and
    # may still be terminating then (a loaded kind node took longer than the check once).
    wait_for(
        lambda: not kind_cluster.items("pods", release["namespace"], f"app.kubernetes.io/instance={release['name']}"),
        timeout=120,
        interval=2,
        message="the operator's pods gone",
    )

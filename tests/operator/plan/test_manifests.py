"""Golden manifests for pool Deployments, the Service, the PodDisruptionBudget, the NetworkPolicy and the compile Job;
plus the properties every serving pod must have. Regenerate the golden files with INFERFLEET_UPDATE_GOLDEN=1."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml
from planning_data import NOW, RUNTIMES, cpu, h100, mi300x, node, service, with_state

from inferfleet_operator.api import names
from inferfleet_operator.api.types import PlanSettings
from inferfleet_operator.plan import manifests as m
from inferfleet_operator.plan.builds import plan_build
from inferfleet_operator.plan.planner import plan_service

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
UPDATE = os.environ.get("INFERFLEET_UPDATE_GOLDEN") == "1"
NODES = [h100("h1"), h100("h2"), mi300x("m1"), cpu("c1")]
MODEL_DIGEST = "00ff00ff00ff00ff"
ENGINE_DIGEST = "sha256:" + "ab" * 32
ROUTED = PlanSettings(router_image="inferfleet/operator:0.1.0", router_image_pull_policy="IfNotPresent")


def _scenario() -> dict[str, dict]:
    # 16 H100 + 8 MI300X GPUs hold 24 replicas; cpu is allowed, so the CPU pool takes the 25th.
    svc = service(
        replicas=25,
        model={
            "name": "llama-3-8b",
            "uri": "hf://meta-llama/Llama-3-8B",
            "size": "20Gi",
            "credentialsSecret": "hf-token",
        },
        placement={
            "vendors": ["nvidia", "amd", "cpu"],
            "tolerations": [{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}],
        },
        engine={"maxContextLength": 8192, "maxBatchSize": 32},
        build={"deadlineSeconds": 3600, "resources": {"cpu": "4", "memory": "24Gi"}},
    )
    first = plan_service(svc, NODES, RUNTIMES, {}, {}, NOW, ROUTED)
    key = first.engine_builds[0]["metadata"]["name"]
    built = with_state(first.engine_builds[0], "Ready")
    built["status"] |= {"modelDigest": MODEL_DIGEST, "engineDigest": ENGINE_DIGEST}  # what its compile Job reported
    p = plan_service(svc, NODES, RUNTIMES, {key: built}, {}, NOW, ROUTED)
    out = {f"{c['kind'].lower()}-{c['metadata']['name']}": c for c in p.children}
    out[f"enginebuild-{key}"] = p.engine_builds[0]
    out[f"job-{key}-1"] = plan_build(built | {"status": {}}, [], NOW).job
    pvc = service("local", model={"name": "tiny", "uri": "pvc://models/tiny/v1"}, replicas=1)
    for child in plan_service(pvc, [cpu("c1")], RUNTIMES, {}, {}, NOW).children:
        if child["kind"] == "Deployment":
            out[f"deployment-{child['metadata']['name']}"] = child
    return out


SCENARIO = _scenario()
COMPILE_JOB = next(name for name in SCENARIO if name.startswith("job-"))  # job-<engine key>-1


@pytest.mark.parametrize("name", sorted(SCENARIO))
def test_manifest_matches_golden(name):
    path = GOLDEN / f"{name}.yaml"
    text = yaml.safe_dump(SCENARIO[name], sort_keys=False, width=120)
    if UPDATE:
        GOLDEN.mkdir(exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"missing golden {path.name}: run with INFERFLEET_UPDATE_GOLDEN=1"
    assert text == path.read_text(), f"{name} changed: review, then run with INFERFLEET_UPDATE_GOLDEN=1"


def test_every_golden_file_is_produced():
    assert {p.stem for p in GOLDEN.glob("*.yaml")} == set(SCENARIO)


DEPLOYMENTS = [  # the serving pools' (the router's: tests/operator/plan/test_router.py)
    v
    for k, v in sorted(SCENARIO.items())
    if k.startswith("deployment-") and v["metadata"]["labels"][names.COMPONENT_LABEL] == "server"
]


def test_compiled_serving_pods_load_only_the_engine_whose_digest_the_build_recorded():
    compiled = SCENARIO["deployment-llama-nvidia-h100-80gb-hbm3"]
    key = compiled["metadata"]["annotations"][names.ENGINE_KEY_ANNOTATION]
    args = compiled["spec"]["template"]["spec"]["containers"][0]["args"]
    assert args[:3] == ["serve", "--engine-dir", f"/engines/{key}/{MODEL_DIGEST}"]
    assert args[args.index("--engine-digest") + 1] == ENGINE_DIGEST
    paged = SCENARIO["deployment-llama-cpu-amd64"]["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--engine-digest" not in paged


@pytest.mark.parametrize("deployment", DEPLOYMENTS, ids=lambda d: d["metadata"]["name"])
def test_serving_pods_are_restricted_probed_and_pinned(deployment):
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["seccompProfile"] == {
        "type": "RuntimeDefault"
    }
    for container in pod["containers"] + pod.get("initContainers", []):
        sc = container["securityContext"]
        assert (
            sc["allowPrivilegeEscalation"] is False
            and sc["capabilities"] == {"drop": ["ALL"]}
            and sc["readOnlyRootFilesystem"] is True
        )
    server = pod["containers"][0]
    assert server["livenessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    assert server["readinessProbe"]["httpGet"] == {"path": "/ready", "port": "http"}
    assert server["ports"] == [{"name": "http", "containerPort": 8000, "protocol": "TCP"}]
    assert server["command"] == ["inferfleet-runtime"] and server["args"][0] == "serve" and "--port" in server["args"]
    assert pod["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert labels[names.NAME_LABEL] == "inferfleet" and labels[names.MANAGED_BY_LABEL] == "inferfleet-operator"
    assert deployment["spec"]["selector"]["matchLabels"].items() <= labels.items()


@pytest.mark.parametrize("deployment", DEPLOYMENTS, ids=lambda d: d["metadata"]["name"])
def test_a_removed_serving_pod_keeps_listening_until_the_service_has_dropped_it(deployment):
    pod = deployment["spec"]["template"]["spec"]
    wait = pod["containers"][0]["lifecycle"]["preStop"]["sleep"]["seconds"]
    assert wait > 0  # the kubelet's own sleep: no shell or binary needed in the image
    assert pod["terminationGracePeriodSeconds"] > wait  # room left for the requests in flight after SIGTERM


def test_pool_with_a_common_product_label_is_pinned_by_it_else_by_node_names():
    nv = SCENARIO["deployment-llama-nvidia-h100-80gb-hbm3"]["spec"]["template"]["spec"]["affinity"]
    term = nv["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"][0]
    assert term == {
        "matchExpressions": [{"key": "nvidia.com/gpu.product", "operator": "In", "values": ["NVIDIA-H100-80GB-HBM3"]}]
    }
    bare = [node("r1", {}, {"nvidia.com/gpu": "1"}), node("r2", {}, {"nvidia.com/gpu": "1"})]
    p = plan_service(service(runtime={"policy": "Paged"}), bare, RUNTIMES, {}, {}, NOW)
    dep = next(c for c in p.children if c["kind"] == "Deployment")
    terms = dep["spec"]["template"]["spec"]["affinity"]["nodeAffinity"][
        "requiredDuringSchedulingIgnoredDuringExecution"
    ]["nodeSelectorTerms"]
    # One name per term: the API server refuses a matchFields In with more than one value.
    assert terms == [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [name]}]} for name in ("r1", "r2")
    ]


def test_model_volume_follows_the_uri_scheme():
    pvc = SCENARIO["deployment-local-cpu-amd64"]["spec"]["template"]["spec"]
    assert {"name": "model", "persistentVolumeClaim": {"claimName": "models", "readOnly": True}} in pvc["volumes"]
    assert "initContainers" not in pvc and pvc["containers"][0]["args"][:3] == ["serve", "--model", "/models/tiny/v1"]
    hf = SCENARIO["deployment-llama-amd-mi300x"]["spec"]["template"]["spec"]
    assert {"name": "model", "emptyDir": {"sizeLimit": "20Gi"}} in hf["volumes"]
    assert hf["initContainers"][0]["args"] == ["fetch", "--uri", "hf://meta-llama/Llama-3-8B", "--to", "/models/model"]
    local = plan_service(
        service(model={"name": "x", "uri": "file:///srv/models/x"}),
        [cpu("c1")],
        RUNTIMES,
        {},
        {},
        NOW,
        PlanSettings(host_path_roots=("/srv/models",)),  # an administrator's choice (test_host_paths)
    )
    dep = next(c for c in local.children if c["kind"] == "Deployment")
    assert {"name": "model", "hostPath": {"path": "/srv/models/x", "type": "Directory"}} in dep["spec"]["template"][
        "spec"
    ]["volumes"]


def test_service_selects_the_router_and_the_pdb_allows_one_serving_pod_disrupted():
    svc, pdb = SCENARIO["service-llama"], SCENARIO["poddisruptionbudget-llama"]
    assert svc["spec"]["selector"] == {names.SERVICE_LABEL: "llama", names.COMPONENT_LABEL: "router"}
    assert pdb["spec"]["maxUnavailable"] == 1
    assert pdb["spec"]["selector"]["matchLabels"] == {names.SERVICE_LABEL: "llama", names.COMPONENT_LABEL: "server"}
    # Compile Job pods never carry the service label, so the Service does not route to them.
    job = next(v for k, v in SCENARIO.items() if k.startswith("job-"))
    assert names.SERVICE_LABEL not in job["spec"]["template"]["metadata"]["labels"]


def test_long_names_are_bounded_and_distinct():
    a = m.deployment_name("s" * 60, "nvidia-h100-80gb-hbm3")
    b = m.deployment_name("s" * 60, "nvidia-h200")
    assert len(a) <= 63 and len(b) <= 63 and a != b


def test_every_container_keeps_its_caches_on_the_writable_tmp_volume():
    pods = [d["spec"]["template"]["spec"] for d in DEPLOYMENTS] + [
        v["spec"]["template"]["spec"] for k, v in SCENARIO.items() if k.startswith("job-")
    ]
    for pod in pods:
        for container in pod["containers"] + pod.get("initContainers", []):
            env = {e["name"]: e["value"] for e in container["env"]}
            assert env["HOME"] == "/tmp" and env["TRITON_CACHE_DIR"].startswith("/tmp/")
            assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]


def _containers(pod: dict) -> dict[str, dict]:
    return {c["name"]: c for c in pod["containers"] + pod.get("initContainers", [])}


def test_credentials_secret_reaches_only_the_model_download():
    job = SCENARIO[COMPILE_JOB]["spec"]["template"]["spec"]
    for pod in (SCENARIO["deployment-llama-amd-mi300x"]["spec"]["template"]["spec"], job):
        containers = _containers(pod)
        assert containers["fetch-model"]["envFrom"] == [{"secretRef": {"name": "hf-token"}}]
        assert all("envFrom" not in c for name, c in containers.items() if name != "fetch-model")
    pvc = SCENARIO["deployment-local-cpu-amd64"]["spec"]["template"]["spec"]
    assert "envFrom" not in str(pvc)  # nothing is downloaded from a claim


def test_model_size_limits_the_volume_and_is_requested_by_the_long_running_container():
    for name in ("deployment-llama-amd-mi300x", "deployment-llama-cpu-amd64"):
        pod = SCENARIO[name]["spec"]["template"]["spec"]
        assert {"name": "model", "emptyDir": {"sizeLimit": "20Gi"}} in pod["volumes"]
        assert pod["containers"][0]["resources"]["requests"]["ephemeral-storage"] == "20Gi"
    compiled = SCENARIO["deployment-llama-nvidia-h100-80gb-hbm3"]["spec"]["template"]["spec"]
    assert "ephemeral-storage" not in compiled["containers"][0]["resources"]["requests"]  # serves from the engine cache
    unsized = plan_service(service(), [mi300x("m1")], RUNTIMES, {}, {}, NOW)
    pod = next(c for c in unsized.children if c["kind"] == "Deployment")["spec"]["template"]["spec"]
    assert {"name": "model", "emptyDir": {}} in pod["volumes"] and "ephemeral-storage" not in pod["containers"][0][
        "resources"
    ]["requests"]


def test_compile_job_takes_deadline_and_resources_from_the_service():
    job = SCENARIO[COMPILE_JOB]
    assert job["spec"]["activeDeadlineSeconds"] == 3600
    resources = _containers(job["spec"]["template"]["spec"])["compile"]["resources"]
    assert resources["requests"] == {"cpu": "4", "memory": "24Gi", "ephemeral-storage": "20Gi"}
    assert resources["limits"] == {"memory": "24Gi", "nvidia.com/gpu": "1"}


def test_gpu_pods_tolerate_their_gpu_resource_taint_unless_opted_out():
    for name, resource in (
        ("deployment-llama-amd-mi300x", "amd.com/gpu"),
        ("deployment-llama-nvidia-h100-80gb-hbm3", "nvidia.com/gpu"),
    ):
        assert {"key": resource, "operator": "Exists"} in SCENARIO[name]["spec"]["template"]["spec"]["tolerations"]
    cpu_tolerations = SCENARIO["deployment-llama-cpu-amd64"]["spec"]["template"]["spec"]["tolerations"]
    assert cpu_tolerations == [{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}]
    opted_out = plan_service(service(placement={"tolerateGpuTaints": False}), [mi300x("m1")], RUNTIMES, {}, {}, NOW)
    pod = next(c for c in opted_out.children if c["kind"] == "Deployment")["spec"]["template"]["spec"]
    assert "tolerations" not in pod


def test_api_key_secret_reaches_every_serving_container_by_reference_only():
    auth = {"apiKeySecret": {"name": "llama-keys", "key": "keys"}}
    svc = service(replicas=3, placement={"vendors": ["nvidia", "amd", "cpu"]}, auth=auth)
    built = {}
    first = plan_service(svc, NODES, RUNTIMES, {}, {}, NOW)
    for build in first.engine_builds:
        built[build["metadata"]["name"]] = with_state(build, "Ready")
    deployments = [c for c in plan_service(svc, NODES, RUNTIMES, built, {}, NOW).children if c["kind"] == "Deployment"]
    engines = {d["metadata"]["labels"][m.ENGINE_LABEL] for d in deployments}
    assert engines == {"compiled", "paged"}  # both serving paths carry the key
    expected = {"name": "INFERFLEET_API_KEY", "valueFrom": {"secretKeyRef": {"name": "llama-keys", "key": "keys"}}}
    for deployment in deployments:
        containers = _containers(deployment["spec"]["template"]["spec"])
        assert expected in containers["server"]["env"]
        assert all(expected not in c.get("env", []) for name, c in containers.items() if name != "server")
        assert "llama-keys" not in " ".join(containers["server"]["args"])  # never in the arguments


def test_a_service_without_auth_serves_open_endpoints():
    deployments = [
        c for c in plan_service(service(), NODES, RUNTIMES, {}, {}, NOW).children if c["kind"] == "Deployment"
    ]
    for deployment in deployments:
        env = _containers(deployment["spec"]["template"]["spec"])["server"]["env"]
        assert all(item["name"] != "INFERFLEET_API_KEY" for item in env)


CACHED = PlanSettings(model_cache_claim="inferfleet-model-cache", model_cache_budget_bytes=200 * 2**30)


def test_a_fetched_model_goes_through_the_node_model_cache_when_the_administrator_names_its_claim():
    svc = service(model={"name": "llama-3-8b", "uri": "hf://meta-llama/Llama-3-8B", "size": "20Gi"})
    p = plan_service(svc, [mi300x("m1")], RUNTIMES, {}, {}, NOW, CACHED)
    pod = next(c for c in p.children if c["kind"] == "Deployment")["spec"]["template"]["spec"]
    containers = _containers(pod)
    # The pod's emptyDir holds only the link to the node's entry: no size limit, no ephemeral-storage request.
    assert {"name": "model", "emptyDir": {}} in pod["volumes"]
    assert {"name": "model-cache", "persistentVolumeClaim": {"claimName": "inferfleet-model-cache"}} in pod["volumes"]
    assert "ephemeral-storage" not in containers["server"]["resources"]["requests"]
    fetch = containers["fetch-model"]
    assert fetch["args"] == [
        "fetch", "--uri", "hf://meta-llama/Llama-3-8B", "--to", "/models/model",
        "--node-cache", "/model-cache", "--node-cache-budget", str(200 * 2**30),
    ]  # fmt: skip
    # Only the fetch writes the cache; the server reads it.
    assert {"name": "model-cache", "mountPath": "/model-cache"} in fetch["volumeMounts"]
    assert {"name": "model-cache", "mountPath": "/model-cache", "readOnly": True} in containers["server"][
        "volumeMounts"
    ]
    # The compile Job reads the model through the same cache.
    p = plan_service(svc, [h100("h1")], RUNTIMES, {}, {}, NOW, CACHED)
    job = plan_build(p.engine_builds[0], [], NOW, CACHED).job["spec"]["template"]["spec"]
    compile_ = _containers(job)
    assert "--node-cache" in compile_["fetch-model"]["args"]
    assert {"name": "model-cache", "mountPath": "/model-cache", "readOnly": True} in compile_["compile"]["volumeMounts"]
    assert {"name": "model-cache", "persistentVolumeClaim": {"claimName": "inferfleet-model-cache"}} in job["volumes"]


def test_models_on_a_claim_or_the_host_never_use_the_node_model_cache():
    pvc = service("local", model={"name": "tiny", "uri": "pvc://models/tiny/v1"}, replicas=1)
    for child in plan_service(pvc, [cpu("c1")], RUNTIMES, {}, {}, NOW, CACHED).children:
        if child["kind"] == "Deployment":
            assert "model-cache" not in str(child) and "initContainers" not in child["spec"]["template"]["spec"]

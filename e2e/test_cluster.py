"""The local e2e cluster behaves like a real one: authentication and RBAC, admission, controllers,
KWOK GPU nodes of every vendor, and pod lifecycles including the compile-failure switch."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest
import yaml
from helpers import (
    CLUSTER_DIR,
    FAIL_LABEL,
    FAIL_MARKER,
    NODES_DIR,
    ROOT,
    Cluster,
    condition,
    is_true,
    node_manifests,
    wait_for,
)

pytestmark = pytest.mark.e2e

IMAGE = "registry.invalid/inferfleet/e2e:never-pulled"  # KWOK never pulls images
GPU_RESOURCES = ("nvidia.com/gpu", "amd.com/gpu", "gpu.intel.com/xe", "gpu.intel.com/i915")


def fleet() -> list[dict]:
    return [node for path in sorted(NODES_DIR.glob("*.yaml")) for node in node_manifests(path.stem)]


def job(name: str, labels: dict[str, str] | None = None, args: list[str] | None = None) -> dict:
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": {"name": name},
        "spec": {
            "backoffLimit": 0,
            "template": {
                "metadata": {"labels": labels or {}},
                "spec": {
                    "restartPolicy": "Never",
                    "containers": [{"name": "compile", "image": IMAGE, "args": args or ["compile"]}],
                },
            },
        },
    }


@pytest.mark.skipif(bool(os.environ.get("INFERFLEET_KUBECONFIG")), reason="the cluster is not one up.sh started")
def test_up_again_is_a_no_op(cluster: Cluster):
    before = cluster.kubeconfig.read_text()
    uid = cluster.get("namespace", "default")["metadata"]["uid"]
    result = subprocess.run(
        ["bash", str(CLUSTER_DIR / "up.sh")],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "INFERFLEET_CLUSTER_BIN": str(cluster.bin)},
    )
    assert result.stdout == ""
    assert "already up" in result.stderr
    assert cluster.kubeconfig.read_text() == before
    assert cluster.get("namespace", "default")["metadata"]["uid"] == uid


def test_service_account_without_bindings_is_forbidden_to_list_secrets(cluster: Cluster, namespace: str, tmp_path):
    cluster.kubectl("create", "serviceaccount", "nobody", "-n", namespace)
    token_config = cluster.token_kubeconfig("nobody", namespace, tmp_path / "nobody.kubeconfig")

    whoami = cluster.kubectl("auth", "whoami", "-o", "jsonpath={.status.userInfo.username}", kubeconfig=token_config)
    assert whoami.stdout == f"system:serviceaccount:{namespace}:nobody"
    can_i = cluster.kubectl("auth", "can-i", "list", "secrets", "-n", namespace, check=False, kubeconfig=token_config)
    assert (can_i.returncode, can_i.stdout.strip()) == (1, "no")
    listing = cluster.kubectl("get", "secrets", "-n", namespace, check=False, kubeconfig=token_config)
    assert listing.returncode != 0 and "Forbidden" in listing.stderr

    # A Role binding grants exactly what it says: pods become listable, secrets stay forbidden.
    cluster.kubectl("create", "role", "pod-reader", "--verb=list", "--resource=pods", "-n", namespace)
    cluster.kubectl(
        "create",
        "rolebinding",
        "nobody-reads-pods",
        "--role=pod-reader",
        f"--serviceaccount={namespace}:nobody",
        "-n",
        namespace,
    )
    wait_for(
        lambda: cluster.kubectl("get", "pods", "-n", namespace, check=False, kubeconfig=token_config).returncode == 0,
        timeout=10,
        message="the RoleBinding to take effect",
    )
    assert (
        cluster.kubectl(
            "auth", "can-i", "list", "secrets", "-n", namespace, check=False, kubeconfig=token_config
        ).stdout.strip()
        == "no"
    )


def test_bad_credentials_are_rejected(cluster: Cluster, tmp_path):
    config = yaml.safe_load(cluster.kubeconfig.read_text())
    config["users"][0]["user"] = {"token": "not-a-real-token"}
    (tmp_path / "bad").write_text(yaml.safe_dump(config))
    result = cluster.kubectl("get", "namespaces", check=False, kubeconfig=tmp_path / "bad")
    assert result.returncode != 0 and "Unauthorized" in result.stderr


def test_kwok_nodes_are_ready_with_their_gpu_resources(cluster: Cluster):
    expected = {node["metadata"]["name"]: node for node in fleet()}
    assert len(expected) >= 6
    live = {node["metadata"]["name"]: node for node in cluster.items("nodes")}
    assert set(expected) <= set(live)
    for name, want in expected.items():
        node = live[name]
        assert is_true(node, "Ready"), f"{name} is not Ready: {condition(node, 'Ready')}"
        for resource in GPU_RESOURCES:
            assert node["status"]["allocatable"].get(resource) == want["status"]["allocatable"].get(resource), (
                f"{name}: allocatable {resource}"
            )
        assert not [t for t in node["spec"].get("taints", []) if t["effect"] in ("NoSchedule", "NoExecute")], (
            f"{name} is tainted: {node['spec']['taints']}"
        )
        for key, value in want["metadata"]["labels"].items():
            assert node["metadata"]["labels"].get(key) == value, f"{name}: label {key}"
    # kwok holds each node's Lease, so the node lifecycle controller keeps seeing it alive.
    leases = {lease["metadata"]["name"]: lease for lease in cluster.items("leases", "kube-node-lease")}
    for name in expected:
        assert leases[name]["spec"]["holderIdentity"] and leases[name]["spec"]["renewTime"], f"{name}: lease"
    vendors = {r for node in expected.values() for r in node["status"]["allocatable"] if r in GPU_RESOURCES}
    assert vendors >= {"nvidia.com/gpu", "amd.com/gpu", "gpu.intel.com/xe"}


def test_deployment_pods_become_ready_on_the_selected_gpu_nodes(cluster: Cluster, namespace: str):
    cluster.apply(
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "serve"},
            "spec": {
                "replicas": 3,
                "selector": {"matchLabels": {"app": "serve"}},
                "template": {
                    "metadata": {"labels": {"app": "serve"}},
                    "spec": {
                        "nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"},
                        "containers": [
                            {
                                "name": "serve",
                                "image": IMAGE,
                                "resources": {"limits": {"nvidia.com/gpu": "1"}},
                                "readinessProbe": {"httpGet": {"path": "/ready", "port": 8000}},
                            }
                        ],
                    },
                },
            },
        },
        namespace=namespace,
    )
    wait_for(
        lambda: (cluster.get("deployment", "serve", namespace)["status"].get("readyReplicas") or 0) == 3,
        timeout=60,
        message="3 ready replicas",
    )
    pods = cluster.items("pods", namespace, selector="app=serve")
    assert len(pods) == 3
    assert {pod["spec"]["nodeName"] for pod in pods} <= {"nvidia-h100-0", "nvidia-h100-1"}
    for pod in pods:
        assert pod["status"]["phase"] == "Running" and pod["status"].get("podIP")
        # ServiceAccount admission gave the pod a bound token and the cluster CA.
        assert any(v["name"].startswith("kube-api-access-") for v in pod["spec"]["volumes"])


def test_pods_needing_more_gpus_than_any_node_has_stay_pending(cluster: Cluster, namespace: str):
    cluster.apply(
        {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": "greedy"},
            "spec": {"containers": [{"name": "c", "image": IMAGE, "resources": {"limits": {"amd.com/gpu": "9"}}}]},
        },
        namespace=namespace,
    )
    scheduled = wait_for(
        lambda: condition(cluster.get("pod", "greedy", namespace), "PodScheduled"),
        timeout=30,
        message="the scheduler's verdict",
    )
    assert scheduled["status"] == "False" and "amd.com/gpu" in scheduled["message"]


def test_job_pods_complete_and_the_failure_switch_fails_them(cluster: Cluster, namespace: str):
    cluster.apply(
        [
            job("ok"),
            job("fail-by-label", labels={FAIL_LABEL: "true"}),
            job("fail-by-args", args=["compile", "--model", f"/models/hf/{FAIL_MARKER}/tiny"]),
        ],
        namespace=namespace,
    )

    wait_for(lambda: is_true(cluster.get("job", "ok", namespace), "Complete"), timeout=60, message="Job ok Complete")
    for name in ("fail-by-label", "fail-by-args"):
        wait_for(
            lambda name=name: is_true(cluster.get("job", name, namespace), "Failed"),
            timeout=60,
            message=f"Job {name} Failed",
        )
        (pod,) = cluster.items("pods", namespace, selector=f"job-name={name}")
        assert pod["status"]["phase"] == "Failed"
        terminated = pod["status"]["containerStatuses"][0]["state"]["terminated"]
        assert terminated["exitCode"] == 1 and "failure switch" in terminated["message"]
    (ok_pod,) = cluster.items("pods", namespace, selector="job-name=ok")
    assert ok_pod["status"]["phase"] == "Succeeded"
    assert ok_pod["status"]["containerStatuses"][0]["state"]["terminated"]["exitCode"] == 0


def test_pod_security_admission_enforces_namespace_levels(cluster: Cluster, namespace: str):
    cluster.kubectl("label", "namespace", namespace, "pod-security.kubernetes.io/enforce=restricted")
    privileged = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": "privileged"},
        "spec": {"containers": [{"name": "c", "image": IMAGE, "securityContext": {"privileged": True}}]},
    }
    result = cluster.apply(privileged, namespace=namespace, check=False)
    assert result.returncode != 0 and 'violates PodSecurity "restricted' in result.stderr


def test_garbage_collector_deletes_owned_objects(cluster: Cluster, namespace: str):
    cluster.kubectl("create", "configmap", "owner", "-n", namespace)
    owner = cluster.get("configmap", "owner", namespace)
    cluster.apply(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {
                "name": "child",
                "ownerReferences": [
                    {"apiVersion": "v1", "kind": "ConfigMap", "name": "owner", "uid": owner["metadata"]["uid"]}
                ],
            },
        },
        namespace=namespace,
    )
    assert cluster.get("configmap", "kube-root-ca.crt", namespace)  # published from --root-ca-file
    cluster.kubectl("delete", "configmap", "owner", "-n", namespace)
    wait_for(
        lambda: cluster.get("configmap", "child", namespace) is None,
        timeout=30,
        message="the garbage collector to delete the child",
    )


def inference_service(name: str, **spec) -> dict:
    return {
        "apiVersion": "inferfleet.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": name},
        "spec": {"model": {"name": "tiny", "uri": "hf://inferfleet/tiny"}, **spec},
    }


def test_crds_apply_and_the_api_server_refuses_invalid_services_naming_the_field(cluster: Cluster, namespace: str):
    cluster.kubectl("apply", "-f", str(ROOT / "crds"))
    for plural in ("inferenceservices", "inferenceruntimes", "enginebuilds"):
        cluster.kubectl("wait", "--for", "condition=Established", f"crd/{plural}.inferfleet.dev", "--timeout", "30s")

    cluster.apply(inference_service("valid"), namespace=namespace)
    valid = cluster.get("infsvc", "valid", namespace)
    assert valid["spec"]["engine"]["tensorParallelSize"] == valid["spec"]["resources"]["gpusPerReplica"] == 1

    bad_uri = inference_service("bad-uri")
    bad_uri["spec"]["model"]["uri"] = "ftp://weights/tiny"
    result = cluster.apply(bad_uri, namespace=namespace, check=False)
    assert result.returncode != 0
    assert "spec.model.uri" in result.stderr and "must be pvc://" in result.stderr

    mismatch = inference_service("mismatch", engine={"tensorParallelSize": 2}, resources={"gpusPerReplica": 1})
    result = cluster.apply(mismatch, namespace=namespace, check=False)
    assert result.returncode != 0 and "spec.engine.tensorParallelSize" in result.stderr

    assert {s["metadata"]["name"] for s in cluster.items("inferenceservices", namespace)} == {"valid"}


def _processes_naming(path) -> list[int]:
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and str(path) in (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode():
                found.append(int(proc.name))
        except OSError:
            continue
    return found


@pytest.mark.slow
def test_up_replaces_a_partial_cluster_and_down_stops_everything(cluster: Cluster, tmp_path):
    # A second cluster in its own state folder, so the session's cluster is untouched.
    state = tmp_path / "state"
    env = {**os.environ, "INFERFLEET_CLUSTER_BIN": str(cluster.bin), "INFERFLEET_CLUSTER_STATE": str(state)}

    def script(name):
        return subprocess.run(["bash", str(CLUSTER_DIR / name)], env=env, capture_output=True, text=True, check=True)

    try:
        assert script("up.sh").stdout == ""  # progress goes to stderr only
        scheduler = int((state / "run" / "kube-scheduler.pid").read_text())
        os.kill(scheduler, signal.SIGKILL)
        assert "partial cluster" in script("up.sh").stderr
        second = Cluster(state / "kubeconfig", cluster.bin)
        assert {n["metadata"]["name"] for n in second.items("nodes")} == {n["metadata"]["name"] for n in fleet()}
        assert len(_processes_naming(state)) == 5
    finally:
        script("down.sh")
    assert not state.exists()
    assert _processes_naming(state) == []

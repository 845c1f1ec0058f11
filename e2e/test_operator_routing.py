"""InferencePools on the local cluster: none until the Gateway API Inference Extension CRD (pinned, vendored in
e2e/crds-thirdparty/) is installed, then one per routed service over every pool's pods as pools join and leave,
repaired after an edit, and deleted with its service."""

from __future__ import annotations

import json
import time

import pytest
from helpers import own_node, wait_for
from operator_process import (
    FAST_FLAGS,
    ROOT,
    SERVICE_ACCOUNT,
    SYSTEM_NAMESPACE,
    OperatorProcess,
    install,
    service_manifest,
    serving,
)

pytestmark = pytest.mark.e2e

GAIE_CRD = ROOT / "e2e" / "crds-thirdparty" / "inferencepools.inference.networking.k8s.io.yaml"
CRD_NAME = "inferencepools.inference.networking.k8s.io"
ROLE = "inferfleet-operator-e2e-routing"


@pytest.fixture(scope="module")
def operator(cluster, tmp_path_factory):
    """The operator with the routing RBAC (permissions.ROUTING_PERMISSIONS) on top of the base rules."""
    from inferfleet_operator.plan.permissions import ROUTING_PERMISSIONS

    # The first test starts without the CRD (a cluster just brought up may still refuse for a moment).
    wait_for(
        lambda: (
            cluster.kubectl("delete", "-f", str(GAIE_CRD), "--ignore-not-found", "--wait=true", check=False).returncode
            == 0
        ),
        timeout=30,
        message="the InferencePool CRD absent",
    )
    work = tmp_path_factory.mktemp("routing")
    kubeconfig = install(cluster, work)
    cluster.apply([
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRole", "metadata": {"name": ROLE}, "rules": ROUTING_PERMISSIONS},
        {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": "ClusterRoleBinding", "metadata": {"name": ROLE},
         "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": ROLE},
         "subjects": [{"kind": "ServiceAccount", "name": SERVICE_ACCOUNT, "namespace": SYSTEM_NAMESPACE}]},
    ])  # fmt: skip
    process = OperatorProcess(kubeconfig, work / "operator.log", FAST_FLAGS + ["--inference-pools=auto"])
    try:
        with serving(cluster, process):
            yield process
    finally:
        # Other modules' operators run without the routing RBAC: leave the cluster without the CRD.
        cluster.kubectl("delete", "-f", str(GAIE_CRD), "--ignore-not-found", "--wait=true")
        cluster.kubectl("delete", "clusterrolebinding,clusterrole", ROLE, "--ignore-not-found")


def _routing(cluster, ns, name) -> dict:
    return ((cluster.get("inferenceservice", name, ns) or {}).get("status") or {}).get("routing") or {}


def _matches(selector: dict, labels: dict) -> bool:
    return all(labels.get(k) == v for k, v in selector["matchLabels"].items())


def test_inference_pool_appears_with_the_crd_follows_pools_is_repaired_and_goes_with_the_service(cluster, ns, operator):
    label = ns[-20:].strip("-")
    first, second = (
        own_node("extra/nvidia-l40s", f"{label}-l40s", label),
        own_node("amd-mi300x", f"{label}-mi300x", label),
    )
    try:
        cluster.apply(first)
        picker = {"name": "routed-epp", "port": 9002}
        cluster.apply(service_manifest("routed", replicas=2, placement={"nodeSelector": {"inferfleet.dev/e2e-test": label}},
                                       routing={"endpointPicker": picker}), namespace=ns)  # fmt: skip
        wait_for(
            lambda: _routing(cluster, ns, "routed").get("reason") == "InferencePoolCRDAbsent",
            timeout=30,
            message="status.routing saying the CRD is absent",
        )

        cluster.kubectl("apply", "-f", str(GAIE_CRD))
        installed = time.monotonic()
        # Within the discovery cache's 30 s only because the CRD's creation is watched.
        pool = wait_for(
            lambda: cluster.get("inferencepool", "routed", ns),
            timeout=20,
            message="the InferencePool once its CRD is served",
        )
        print(f"\nInferencePool {time.monotonic() - installed:.1f} s after the CRD was applied")
        assert pool["spec"]["targetPorts"] == [{"number": 8000}]
        assert pool["spec"]["endpointPickerRef"]["name"] == "routed-epp" and pool["spec"]["endpointPickerRef"][
            "port"
        ] == {"number": 9002}
        (owner,) = pool["metadata"]["ownerReferences"]
        assert (owner["kind"], owner["name"]) == ("InferenceService", "routed")
        wait_for(
            lambda: _routing(cluster, ns, "routed").get("pools") == ["nvidia-l40s"],
            timeout=30,
            message="status.routing naming the pool",
        )

        cluster.apply(second)  # a pool joins: its pods are selected too, the pool object does not need to change
        wait_for(
            lambda: _routing(cluster, ns, "routed").get("pools") == ["amd-mi300x", "nvidia-l40s"],
            timeout=45,
            message="status.routing naming the pool that joined",
        )
        pods = wait_for(lambda: (p := cluster.items("pods", ns, selector="inferfleet.dev/service=routed")) and
                        {x["metadata"]["labels"]["inferfleet.dev/pool"] for x in p} == {"amd-mi300x", "nvidia-l40s"} and p,
                        timeout=45, message="serving pods in both pools")  # fmt: skip
        selector = cluster.get("inferencepool", "routed", ns)["spec"]["selector"]
        assert all(_matches(selector, p["metadata"]["labels"]) for p in pods)

        cluster.kubectl("delete", "node", second["metadata"]["name"])
        wait_for(
            lambda: _routing(cluster, ns, "routed").get("pools") == ["nvidia-l40s"],
            timeout=45,
            message="status.routing without the pool that left",
        )

        cluster.kubectl(
            "patch",
            "inferencepool",
            "routed",
            "-n",
            ns,
            "--type=merge",
            "-p",
            json.dumps({"spec": {"targetPorts": [{"number": 1234}]}}),
        )
        wait_for(
            lambda: cluster.get("inferencepool", "routed", ns)["spec"]["targetPorts"] == [{"number": 8000}],
            timeout=30,
            message="the edited InferencePool repaired",
        )

        cluster.kubectl("delete", "inferenceservice", "routed", "-n", ns)
        wait_for(
            lambda: cluster.get("inferencepool", "routed", ns) is None,
            timeout=45,
            message="the InferencePool deleted with its service",
        )
    finally:
        for node in (first, second):
            cluster.kubectl("delete", "node", node["metadata"]["name"], "--ignore-not-found", "--wait=false")


def test_a_service_with_routing_disabled_gets_no_pool_and_loses_one_it_had(cluster, ns, operator):
    cluster.kubectl("apply", "-f", str(GAIE_CRD))
    cluster.kubectl("wait", "--for=condition=Established", f"crd/{CRD_NAME}", "--timeout=60s")
    cluster.apply(service_manifest("quiet", placement={"vendors": ["cpu"]}), namespace=ns)
    wait_for(lambda: cluster.get("inferencepool", "quiet", ns), timeout=45, message="the InferencePool (routing Auto)")
    wait_for(
        lambda: _routing(cluster, ns, "quiet").get("pools") == ["cpu-amd64"],
        timeout=30,
        message="status.routing settled",
    )
    applies = operator.writes_by_kind().get("apply InferencePool", 0)
    operator.wait_for_service_reconciles(3, "three more service reconciles (resyncs)")
    assert operator.writes_by_kind().get("apply InferencePool", 0) == applies, (
        "a resync re-applies an unchanged InferencePool"
    )
    cluster.kubectl(
        "patch",
        "inferenceservice",
        "quiet",
        "-n",
        ns,
        "--type=merge",
        "-p",
        json.dumps({"spec": {"routing": {"inferencePool": "Disabled"}}}),
    )
    wait_for(lambda: cluster.get("inferencepool", "quiet", ns) is None, timeout=30, message="the InferencePool deleted")
    assert _routing(cluster, ns, "quiet")["reason"] == "RoutingDisabled"

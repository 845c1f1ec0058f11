"""Each service's router on the local cluster: with --router-image the operator applies the router's Deployment, one
headless Service per serving pool and the service's Service in front of the router, accepted by a real API server;
pools joining change the router's flags; a resync writes nothing; mode Service removes the router again."""

from __future__ import annotations

import json

import pytest
from helpers import own_node, wait_for
from operator_process import FAST_FLAGS, OperatorProcess, install, service_manifest, serving

pytestmark = pytest.mark.e2e

ROUTER_IMAGE = "inferfleet/operator:e2e-router"


@pytest.fixture(scope="module")
def operator(cluster, tmp_path_factory):
    work = tmp_path_factory.mktemp("router")
    kubeconfig = install(cluster, work)
    flags = FAST_FLAGS + [f"--router-image={ROUTER_IMAGE}", "--router-image-pull-policy=Never"]
    process = OperatorProcess(kubeconfig, work / "operator.log", flags)
    with serving(cluster, process):
        yield process


def _pool_addresses(cluster, ns: str) -> list[str]:
    router = cluster.get("deployment", "routed-router", ns)
    if router is None:
        return []
    args = router["spec"]["template"]["spec"]["containers"][0]["args"]
    return [a.removeprefix("--pool-address=") for a in args if a.startswith("--pool-address=")]


def test_the_router_is_applied_follows_pools_rests_on_resyncs_and_goes_with_mode_service(cluster, ns, operator):
    label = "router-" + ns[-12:].strip("-")
    first, second = (
        own_node("extra/nvidia-l40s", f"{label}-l40s", label),
        own_node("amd-mi300x", f"{label}-mi300x", label),
    )
    try:
        cluster.apply(first)
        placement = {"nodeSelector": {"inferfleet.dev/e2e-test": label}}
        paged = {"policy": "Paged"}  # no engine build, whose progress would rightly change the pools' Deployments
        cluster.apply(service_manifest("routed", replicas=2, placement=placement, runtime=paged), namespace=ns)
        wait_for(
            lambda: _pool_addresses(cluster, ns) == ["nvidia-l40s=routed-nvidia-l40s:8000"],
            timeout=45,
            message="the router Deployment over the first pool",
        )
        headless = cluster.get("service", "routed-nvidia-l40s", ns)
        assert headless["spec"]["clusterIP"] == "None"
        assert headless["spec"]["selector"]["inferfleet.dev/pool"] == "nvidia-l40s"
        front = cluster.get("service", "routed", ns)
        assert front["spec"]["selector"] == {
            "inferfleet.dev/service": "routed",
            "app.kubernetes.io/component": "router",
        }
        router = cluster.get("deployment", "routed-router", ns)
        assert router["spec"]["template"]["spec"]["containers"][0]["image"] == ROUTER_IMAGE
        policy = cluster.get("networkpolicy", "routed", ns)
        assert policy["spec"]["podSelector"]["matchExpressions"][0]["values"] == ["router", "server"]
        routing = cluster.get("inferenceservice", "routed", ns)["status"]["routing"]
        assert (routing["mode"], routing["router"]) == ("Router", "routed-router")

        cluster.apply(second)  # a pool joins: the router is told its headless Service
        wait_for(
            lambda: (
                _pool_addresses(cluster, ns)
                == ["amd-mi300x=routed-amd-mi300x:8000", "nvidia-l40s=routed-nvidia-l40s:8000"]
            ),
            timeout=45,
            message="the router over both pools",
        )
        wait_for(
            lambda: cluster.get("service", "routed-amd-mi300x", ns), timeout=30, message="the new headless Service"
        )

        writes = operator.writes_by_kind()
        operator.wait_for_service_reconciles(3, "three more service reconciles (resyncs)")
        after = operator.writes_by_kind()
        for kind in ("apply Deployment", "apply Service", "apply NetworkPolicy"):
            assert after.get(kind, 0) == writes.get(kind, 0), f"a resync re-applied an unchanged object ({kind})"

        cluster.kubectl(
            "patch",
            "inferenceservice",
            "routed",
            "-n",
            ns,
            "--type=merge",
            "-p",
            json.dumps({"spec": {"routing": {"mode": "Service"}}}),
        )
        wait_for(
            lambda: (
                cluster.get("deployment", "routed-router", ns) is None
                and cluster.get("service", "routed-amd-mi300x", ns) is None
                and cluster.get("service", "routed-nvidia-l40s", ns) is None
            ),
            timeout=45,
            message="the router and its headless Services deleted",
        )
        front = cluster.get("service", "routed", ns)
        assert front["spec"]["selector"]["app.kubernetes.io/component"] == "server"
        assert cluster.get("inferenceservice", "routed", ns)["status"]["routing"]["mode"] == "Service"
    finally:
        for node in (first, second):
            cluster.kubectl("delete", "node", node["metadata"]["name"], "--ignore-not-found", "--wait=false")

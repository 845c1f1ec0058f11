"""The operator against the local cluster over time: pools joining and leaving, drift repair,
deletion and build garbage collection, and an operator killed mid-rollout."""

from __future__ import annotations

import copy
import json
import time

import pytest
from helpers import is_true, node_manifests, wait_for
from operator_process import (
    container_args,
    pool_status,
    serves_engine,
    service_manifest,
)

pytestmark = pytest.mark.e2e

H100 = "nvidia-h100-80gb-hbm3"
ON_H100 = {"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}}
RETENTION_SECONDS = 4  # operator_process.FAST_FLAGS


def _node(fixture: str, name: str, label: str) -> dict:
    node = copy.deepcopy(node_manifests(fixture)[0])
    node["metadata"]["name"] = name
    node["metadata"]["labels"].update({"kubernetes.io/hostname": name, "inferfleet.dev/e2e-test": label})
    node["metadata"]["labels"].pop("inferfleet.dev/e2e-fleet", None)  # not part of the shared fleet
    return node


def _ready_node(cluster, node):
    cluster.apply(node)
    name = node["metadata"]["name"]
    wait_for(
        lambda: any(
            c["type"] == "Ready" and c["status"] == "True"
            for c in cluster.get("node", name)["status"].get("conditions", [])
        ),
        timeout=30,
        message=f"node {name} Ready",
    )


def _deployments(cluster, ns, service):
    return {
        d["metadata"]["name"]: d for d in cluster.items("deployments", ns, selector=f"inferfleet.dev/service={service}")
    }


def test_a_pool_that_joins_gets_a_deployment_and_one_that_leaves_loses_it(cluster, ns, operator):
    label = ns[-20:].strip("-")
    first, second = _node("extra/nvidia-l40s", f"{label}-l40s", label), _node("amd-mi300x", f"{label}-mi300x", label)
    try:
        _ready_node(cluster, first)
        cluster.apply(
            service_manifest("elastic", replicas=2, placement={"nodeSelector": {"inferfleet.dev/e2e-test": label}}),
            namespace=ns,
        )
        wait_for(
            lambda: list(_deployments(cluster, ns, "elastic")) == ["elastic-nvidia-l40s"],
            timeout=30,
            message="one Deployment for the one pool",
        )

        _ready_node(cluster, second)
        joined = wait_for(
            lambda: (d := _deployments(cluster, ns, "elastic")) and len(d) == 2 and d,
            timeout=30,
            message="a Deployment for the pool that joined",
        )
        amd = next(d for name, d in joined.items() if "amd" in name)
        limits = amd["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
        assert "amd.com/gpu" in limits and "--model" in container_args(amd)

        cluster.kubectl("delete", "node", second["metadata"]["name"])
        wait_for(
            lambda: list(_deployments(cluster, ns, "elastic")) == ["elastic-nvidia-l40s"],
            timeout=30,
            message="the Deployment of the pool that left deleted",
        )
        assert set(pool_status(cluster, ns, "elastic")) == {"nvidia-l40s"}
    finally:
        for node in (first, second):
            cluster.kubectl("delete", "node", node["metadata"]["name"], "--ignore-not-found", "--wait=false")


def test_children_deleted_or_edited_by_hand_are_restored(cluster, ns, operator):
    cluster.apply(service_manifest("steady", placement={"vendors": ["cpu"]}), namespace=ns)
    (name,) = wait_for(lambda: list(_deployments(cluster, ns, "steady")), timeout=30, message="the Deployment")
    original = cluster.get("deployment", name, ns)

    cluster.kubectl("delete", "deployment", name, "-n", ns)
    wait_for(
        lambda: (d := cluster.get("deployment", name, ns)) and d["metadata"]["uid"] != original["metadata"]["uid"],
        timeout=30,
        message="the deleted Deployment recreated",
    )

    cluster.kubectl("scale", "deployment", name, "-n", ns, "--replicas=3")
    cluster.kubectl(
        "patch",
        "deployment",
        name,
        "-n",
        ns,
        "--type=json",
        "-p",
        json.dumps([{"op": "replace", "path": "/spec/template/spec/containers/0/args", "value": ["sleep"]}]),
    )
    wait_for(
        lambda: (
            (d := cluster.get("deployment", name, ns))["spec"]["replicas"] == 1
            and container_args(d) == container_args(original)
        ),
        timeout=30,
        message="replicas and args put back",
    )

    cluster.kubectl("delete", "service", "steady", "-n", ns)
    wait_for(lambda: cluster.get("service", "steady", ns), timeout=30, message="the deleted Service recreated")


def test_deleting_a_service_collects_its_children_but_not_builds_still_referenced(cluster, ns, operator):
    for name in ("keep", "drop"):
        cluster.apply(service_manifest(name, placement=ON_H100, pools={H100: 1}), namespace=ns)
    keys = wait_for(
        lambda: (
            {pool_status(cluster, ns, n).get(H100, {}).get("servingEngineBuild") for n in ("keep", "drop")} - {None}
        ),
        timeout=60,
        message="both services on the shared engine",
    )
    (key,) = keys

    cluster.kubectl("delete", "inferenceservice", "drop", "-n", ns)
    wait_for(
        lambda: (
            not _deployments(cluster, ns, "drop")
            and not cluster.get("service", "drop", ns)
            and not cluster.get("pdb", "drop", ns)
        ),
        timeout=60,
        message="drop's children collected",
    )
    time.sleep(RETENTION_SECONDS + 2)  # longer than the retention of an unreferenced build
    assert cluster.get("enginebuild", key, ns) is not None, "still referenced by 'keep'"
    assert serves_engine(cluster.get("deployment", f"keep-{H100}", ns), key)

    cluster.kubectl("delete", "inferenceservice", "keep", "-n", ns)
    wait_for(
        lambda: cluster.get("enginebuild", key, ns) is None,
        timeout=RETENTION_SECONDS + 30,
        message="the unreferenced build collected after its retention",
    )


def test_an_operator_killed_mid_rollout_converges_after_restart_without_duplicate_jobs(cluster, ns, operator):
    cluster.apply(service_manifest("phoenix", placement=ON_H100, pools={H100: 1}), namespace=ns)
    key = wait_for(
        lambda: [b["metadata"]["name"] for b in cluster.items("enginebuilds", ns)],
        timeout=30,
        message="the EngineBuild",
    )[0]
    operator.kill()
    time.sleep(3)  # the world moves on without the operator: the Job may finish meanwhile
    operator.start()

    def converged():
        obj = cluster.get("inferenceservice", "phoenix", ns)
        return is_true(obj, "RolledOut") and obj

    wait_for(converged, timeout=60, message="the rollout converged after the restart")
    assert [j["metadata"]["name"] for j in cluster.items("jobs", ns)] == [f"{key}-1"]
    assert list(_deployments(cluster, ns, "phoenix")) == [f"phoenix-{H100}"]
    assert serves_engine(cluster.get("deployment", f"phoenix-{H100}", ns), key)
    assert operator.metric("inferfleet_operator_reconciles_total", kind="InferenceService") > 0
    assert operator.metric("inferfleet_operator_engine_builds", state="Ready") >= 1


def test_no_finalizer_is_put_on_services_or_builds_so_they_delete_without_the_operator(cluster, ns, operator):
    # The resync is the work queue's requeue, not a kopf timer (kopf puts its finalizer on every object a
    # timer runs for): with the operator stopped, a delete completes at once.
    cluster.apply(service_manifest("loose", placement=ON_H100, pools={H100: 1}), namespace=ns)
    wait_for(
        lambda: pool_status(cluster, ns, "loose").get(H100, {}).get("engineBuild"),
        timeout=60,
        message="the service's status naming its EngineBuild",
    )
    operator.wait_for_service_reconciles(2, "two more service reconciles (resyncs at least)")
    operator.kill()
    try:
        objects = [cluster.get("inferenceservice", "loose", ns), *cluster.items("enginebuilds", ns)]
        assert len(objects) == 2
        assert [o["metadata"].get("finalizers") for o in objects] == [None, None]
        cluster.kubectl("delete", "inferenceservice", "loose", "-n", ns, "--timeout=30s", timeout=45)
        cluster.kubectl("delete", "enginebuilds", "--all", "-n", ns, "--timeout=30s", timeout=45)
        assert cluster.get("inferenceservice", "loose", ns) is None and not cluster.items("enginebuilds", ns)
    finally:
        operator.start()

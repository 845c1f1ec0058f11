"""Placement on the mixed fleet: with default placement the GPU pools take every replica they can hold and no
CPU pool serves; listing cpu lets CPU pools take what the GPU pools cannot; GPU-tainted nodes and Intel nodes on
the i915 driver take pods of the default runtimes."""

from __future__ import annotations

import copy

import pytest
from helpers import node_manifests, wait_for
from operator_process import live_pools, service_manifest

pytestmark = pytest.mark.e2e


def _deployments(cluster, ns, service: str) -> dict[str, int]:
    return {
        d["metadata"]["labels"]["inferfleet.dev/pool"]: d["spec"]["replicas"]
        for d in cluster.items("deployments", ns, selector=f"inferfleet.dev/service={service}")
    }


def _status(cluster, ns, service: str) -> dict:
    return (cluster.get("inferenceservice", service, ns) or {}).get("status") or {}


def test_default_placement_gives_cpu_pools_nothing_while_gpu_pools_can_take_replicas(cluster, ns, operator):
    pools = live_pools(cluster)
    cpu_pools = {p.name for p in pools if p.vendor == "cpu"}
    gpu_pools = {p.name for p in pools if p.vendor != "cpu"}
    assert cpu_pools and gpu_pools, "the fleet has CPU and GPU pools"
    cluster.apply(service_manifest("gpu-first", replicas=4, runtime={"policy": "Paged"}), namespace=ns)
    status = wait_for(
        lambda: (s := _status(cluster, ns, "gpu-first")).get("pools") and s, timeout=30, message="the service planned"
    )
    excluded = {x["name"]: x["reason"] for x in status["excludedPools"]}
    assert all(excluded[name].startswith("CPUNotRequested") for name in cpu_pools), excluded
    assert {e["name"] for e in status["pools"]} <= gpu_pools and status["replicas"] == 4
    assert status["unplacedReplicas"] == 0
    deployments = wait_for(
        lambda: (d := _deployments(cluster, ns, "gpu-first")) and sum(d.values()) == 4 and d,
        timeout=30,
        message="Deployments for the 4 replicas",
    )
    assert set(deployments) <= gpu_pools, deployments


def test_listing_cpu_lets_cpu_pools_take_what_gpu_pools_cannot_hold(cluster, ns, operator):
    pools = live_pools(cluster)
    gpu_capacity = sum(sum(p.node_gpus) for p in pools if p.vendor == "amd")
    assert gpu_capacity, "the fleet has AMD GPUs"
    cluster.apply(
        service_manifest(
            "overflow", replicas=gpu_capacity + 1, runtime={"policy": "Paged"}, placement={"vendors": ["amd", "cpu"]}
        ),
        namespace=ns,
    )
    status = wait_for(
        lambda: (s := _status(cluster, ns, "overflow")).get("pools") and s, timeout=30, message="the service planned"
    )
    desired = {e["name"]: e["desiredReplicas"] for e in status["pools"]}
    cpu = {name: n for name, n in desired.items() if name.startswith("cpu-")}
    assert sum(cpu.values()) == 1 and sum(desired.values()) == gpu_capacity + 1, desired


def _test_node(fixture: str, name: str, label: str) -> dict:
    node = copy.deepcopy(node_manifests(fixture)[0])
    node["metadata"]["name"] = name
    node["metadata"]["labels"].update({"kubernetes.io/hostname": name, "inferfleet.dev/e2e-test": label})
    node["metadata"]["labels"].pop("inferfleet.dev/e2e-fleet", None)  # not part of the shared fleet
    return node


def _scheduled_pods(cluster, ns, service: str) -> dict[str, str]:
    pods = cluster.items("pods", ns, selector=f"inferfleet.dev/service={service}")
    return {
        p["metadata"]["name"]: p["spec"].get("nodeName", "")
        for p in pods
        if (p.get("status") or {}).get("phase") == "Running"
    }


def test_tainted_gpu_nodes_and_i915_intel_nodes_take_pods_with_default_runtimes(cluster, ns, operator):
    # The scheduler, not the planner, is the judge here: pods land only if they tolerate the GPU taint and
    # request the GPU resource the node really advertises.
    label = ns[-20:].strip("-")
    tainted = _test_node("amd-mi300x", f"{label}-mi300x", label)
    tainted["spec"] = {"taints": [{"key": "amd.com/gpu", "value": "present", "effect": "NoSchedule"}]}
    i915 = _test_node("intel-max1550", f"{label}-i915", label)
    for status in ("allocatable", "capacity"):
        i915["status"][status] = {
            **{k: v for k, v in i915["status"][status].items() if k != "gpu.intel.com/xe"},
            "gpu.intel.com/i915": "8",
        }
    try:
        for node in (tainted, i915):
            cluster.apply(node)
        on_test_nodes = {"nodeSelector": {"inferfleet.dev/e2e-test": label}}
        cluster.apply(service_manifest("drivers", replicas=2, placement=on_test_nodes), namespace=ns)
        pods = wait_for(
            lambda: (p := _scheduled_pods(cluster, ns, "drivers")) and len(p) == 2 and p,
            timeout=60,
            message="both replicas running",
        )
        assert sorted(pods.values()) == sorted([tainted["metadata"]["name"], i915["metadata"]["name"]])
        deployments = {
            d["metadata"]["labels"]["inferfleet.dev/pool"]: d["spec"]["template"]["spec"]
            for d in cluster.items("deployments", ns, selector="inferfleet.dev/service=drivers")
        }
        intel = next(spec for pool, spec in deployments.items() if pool.startswith("intel-"))
        assert intel["containers"][0]["resources"]["limits"]["gpu.intel.com/i915"] == "1"
        amd = next(spec for pool, spec in deployments.items() if pool.startswith("amd-"))
        assert {"key": "amd.com/gpu", "operator": "Exists"} in amd["tolerations"]
    finally:
        for node in (tainted, i915):
            cluster.kubectl("delete", "node", node["metadata"]["name"], "--ignore-not-found", "--wait=false")

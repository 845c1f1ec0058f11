"""Placement on the mixed fleet: with default placement the GPU pools take every replica they can hold and no
CPU pool serves; listing cpu lets CPU pools take what the GPU pools cannot."""

from __future__ import annotations

import pytest

from helpers import wait_for
from operator_process import live_pools, service_manifest

pytestmark = pytest.mark.e2e


def _deployments(cluster, ns, service: str) -> dict[str, int]:
    return {d["metadata"]["labels"]["inferfleet.dev/pool"]: d["spec"]["replicas"]
            for d in cluster.items("deployments", ns, selector=f"inferfleet.dev/service={service}")}


def _status(cluster, ns, service: str) -> dict:
    return ((cluster.get("inferenceservice", service, ns) or {}).get("status") or {})


def test_default_placement_gives_cpu_pools_nothing_while_gpu_pools_can_take_replicas(cluster, ns, operator):
    pools = live_pools(cluster)
    cpu_pools = {p.name for p in pools if p.vendor == "cpu"}
    gpu_pools = {p.name for p in pools if p.vendor != "cpu"}
    assert cpu_pools and gpu_pools, "the fleet has CPU and GPU pools"
    cluster.apply(service_manifest("gpu-first", replicas=4, runtime={"policy": "Paged"}), namespace=ns)
    status = wait_for(lambda: (s := _status(cluster, ns, "gpu-first")).get("pools") and s, timeout=30,
                      message="the service planned")
    excluded = {x["name"]: x["reason"] for x in status["excludedPools"]}
    assert all(excluded[name].startswith("CPUNotRequested") for name in cpu_pools), excluded
    assert {e["name"] for e in status["pools"]} <= gpu_pools and status["replicas"] == 4
    assert status["unplacedReplicas"] == 0
    deployments = wait_for(lambda: (d := _deployments(cluster, ns, "gpu-first")) and sum(d.values()) == 4 and d,
                           timeout=30, message="Deployments for the 4 replicas")
    assert set(deployments) <= gpu_pools, deployments


def test_listing_cpu_lets_cpu_pools_take_what_gpu_pools_cannot_hold(cluster, ns, operator):
    pools = live_pools(cluster)
    gpu_capacity = sum(sum(p.node_gpus) for p in pools if p.vendor == "amd")
    assert gpu_capacity, "the fleet has AMD GPUs"
    cluster.apply(service_manifest("overflow", replicas=gpu_capacity + 1, runtime={"policy": "Paged"},
                                   placement={"vendors": ["amd", "cpu"]}), namespace=ns)
    status = wait_for(lambda: (s := _status(cluster, ns, "overflow")).get("pools") and s, timeout=30,
                      message="the service planned")
    desired = {e["name"]: e["desiredReplicas"] for e in status["pools"]}
    cpu = {name: n for name, n in desired.items() if name.startswith("cpu-")}
    assert sum(cpu.values()) == 1 and sum(desired.values()) == gpu_capacity + 1, desired

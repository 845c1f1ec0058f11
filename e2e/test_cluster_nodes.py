"""The KWOK node fixtures say what they claim: the operator's own classification (no cluster
needed) sees the mixed fleet as one pool per GPU product, with the NFD-only node excluded."""

from __future__ import annotations

import copy

from helpers import NODES_DIR, node_manifests

from inferfleet_operator.plan.nodes import classify_node
from inferfleet_operator.plan.pools import group_pools

# name -> (vendor, product, architecture, gpu_count, gpu_resource, is_eligible)
EXPECTED = {
    "nvidia-h100-0": ("nvidia", "h100-80gb-hbm3", "sm90", 8, "nvidia.com/gpu", True),
    "nvidia-h100-1": ("nvidia", "h100-80gb-hbm3", "sm90", 8, "nvidia.com/gpu", True),
    "nvidia-a100-0": ("nvidia", "a100-sxm4-80gb", "sm80", 8, "nvidia.com/gpu", True),
    "amd-mi300x-0": ("amd", "mi300x", "gfx942", 8, "amd.com/gpu", True),
    "intel-max1550-0": ("intel", "max-1550", "xe-hpc", 8, "gpu.intel.com/xe", True),
    "nfd-nvidia-0": ("nvidia", "unknown", "unknown", 0, "nvidia.com/gpu", False),
    "cpu-0": ("cpu", "amd64", "amd64", 0, "", True),
    "cpu-1": ("cpu", "amd64", "amd64", 0, "", True),
}


def ready(node: dict) -> dict:
    """The node as kwok's node-initialize stage leaves it: Ready."""
    node = copy.deepcopy(node)
    node["status"]["conditions"] = [{"type": "Ready", "status": "True"}]
    return node


def fleet() -> list[dict]:
    return [ready(node) for path in sorted(NODES_DIR.glob("*.yaml")) for node in node_manifests(path.stem)]


def test_every_fleet_node_classifies_as_its_fixture_says():
    infos = {info.name: info for info in map(classify_node, fleet())}
    got = {
        name: (i.vendor, i.product, i.architecture, i.gpu_count, i.gpu_resource, i.is_eligible)
        for name, i in infos.items()
    }
    assert got == EXPECTED
    assert infos["nfd-nvidia-0"].excluded_reason.startswith("NoAllocatableGPUs")


def test_the_fleet_groups_into_one_serving_pool_per_product():
    serving = {pool.name: pool.node_names for pool in group_pools(fleet()) if pool.node_names}
    assert serving == {
        "nvidia-h100-80gb-hbm3": ("nvidia-h100-0", "nvidia-h100-1"),
        "nvidia-a100-sxm4-80gb": ("nvidia-a100-0",),
        "amd-mi300x": ("amd-mi300x-0",),
        "intel-max-1550": ("intel-max1550-0",),
        "cpu-amd64": ("cpu-0", "cpu-1"),
    }


def test_the_extra_node_forms_a_new_pool_when_it_joins():
    joined = fleet() + [ready(node) for node in node_manifests("extra/nvidia-l40s")]
    names = {pool.name for pool in group_pools(joined) if pool.node_names}
    assert names - {pool.name for pool in group_pools(fleet()) if pool.node_names} == {"nvidia-l40s"}

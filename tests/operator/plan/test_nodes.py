"""classify_node over fixtures of every vendor signal scheme, including nodes that carry only one kind of signal."""

from __future__ import annotations

import pytest
from planning_data import fixture_node, node

from inferfleet_operator.plan.nodes import classify_node

# fixture -> (vendor, product, architecture, gpu_count, gpu_resource, eligible, reason prefix)
EXPECTED = {
    "nvidia-gfd": ("nvidia", "h100-80gb-hbm3", "sm90", 8, "nvidia.com/gpu", True, ""),
    "nvidia-resource-only": ("nvidia", "unknown", "unknown", 4, "nvidia.com/gpu", True, ""),
    "nvidia-gfd-labels-only": ("nvidia", "a100-sxm4-80gb", "sm80", 0, "nvidia.com/gpu", False, "NoAllocatableGPUs"),
    "nvidia-family-only": ("nvidia", "graphics-device", "sm80", 2, "nvidia.com/gpu", True, ""),
    "nvidia-nfd-device": ("nvidia", "h100-80gb-hbm3", "sm90", 8, "nvidia.com/gpu", True, ""),
    "nvidia-nfd-only": ("nvidia", "unknown", "unknown", 0, "nvidia.com/gpu", False, "NoAllocatableGPUs"),
    "amd-operator": ("amd", "mi300x", "gfx942", 8, "amd.com/gpu", True, ""),
    "amd-beta-labels": ("amd", "mi300x", "gfx942", 8, "amd.com/gpu", True, ""),
    "amd-device-id-only": ("amd", "mi250x", "gfx90a", 4, "amd.com/gpu", True, ""),
    "amd-nfd-vendor": ("amd", "unknown", "unknown", 2, "amd.com/gpu", True, ""),
    "intel-xe": ("intel", "max-1550", "xe-hpc", 4, "gpu.intel.com/xe", True, ""),
    "intel-i915-only": ("intel", "unknown", "unknown", 1, "gpu.intel.com/i915", True, ""),
    "intel-nfd-display": ("intel", "flex-170", "xe-hpg", 1, "gpu.intel.com/i915", True, ""),
    "intel-nfd-vendor-only": ("cpu", "amd64", "amd64", 0, "", True, ""),
    "habana-gaudi2": ("habana", "gaudi2", "gaudi2", 8, "habana.ai/gaudi", True, ""),
    "cpu-only": ("cpu", "amd64", "amd64", 0, "", True, ""),
    "nvidia-cordoned": ("nvidia", "h100-80gb-hbm3", "sm90", 8, "nvidia.com/gpu", False, "Unschedulable"),
    "nvidia-notready": ("nvidia", "h100-80gb-hbm3", "sm90", 8, "nvidia.com/gpu", False, "NotReady"),
}


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_fixture_node_is_classified_from_its_signals(name):
    info = classify_node(fixture_node(name))
    vendor, product, arch, count, resource, eligible, reason = EXPECTED[name]
    assert (info.vendor, info.product, info.architecture, info.gpu_count, info.gpu_resource) == (
        vendor,
        product,
        arch,
        count,
        resource,
    )
    assert info.is_eligible is eligible
    assert info.excluded_reason.startswith(reason) and bool(info.excluded_reason) is (not eligible)


def test_every_fixture_is_covered_by_the_table():
    from planning_data import FIXTURES

    assert {p.stem for p in FIXTURES.glob("*.yaml")} == set(EXPECTED)


def test_label_only_node_names_the_missing_resource_in_its_reason():
    info = classify_node(fixture_node("nvidia-gfd-labels-only"))
    assert "nvidia.com/gpu" in info.excluded_reason and "device plugin" in info.excluded_reason


def test_compute_capability_labels_win_over_the_product_table():
    info = classify_node(
        node(
            "n",
            {
                "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
                "nvidia.com/gpu.compute.major": "8",
                "nvidia.com/gpu.compute.minor": "9",
            },
            {"nvidia.com/gpu": "1"},
        )
    )
    assert info.architecture == "sm89"


@pytest.mark.parametrize(
    "product, arch",
    [
        ("AMD_Instinct_MI300X_OAM", "gfx942"),
        ("AMD Instinct MI250", "gfx90a"),
        ("Instinct-MI100", "gfx908"),
        ("AMD_Instinct_MI325X", "gfx942"),
    ],
)
def test_amd_product_names_map_to_gfx_architectures(product, arch):
    info = classify_node(node("n", {"amd.com/gpu.product-name": product}, {"amd.com/gpu": "8"}))
    assert info.architecture == arch


@pytest.mark.parametrize(
    "labels",
    [
        {"beta.amd.com/gpu.device-id.74a1": "8"},
        {"beta.amd.com/gpu.device-id": "74a1", "beta.amd.com/gpu.family": "AI"},
        {"beta.amd.com/gpu.product-name.AMD_Instinct_MI300X_OAM": "8"},
    ],
)
def test_beta_amd_labels_classify_like_amd_labels(labels):
    info = classify_node(node("n", labels, {"amd.com/gpu": "8"}))
    assert (info.vendor, info.product, info.architecture) == ("amd", "mi300x", "gfx942")
    assert info.pool_label is None  # no label of the node carries the product as its value


def test_amd_labels_win_over_beta_labels():
    info = classify_node(
        node("n", {"amd.com/gpu.device-id": "740c", "beta.amd.com/gpu.device-id.74a1": "8"}, {"amd.com/gpu": "8"})
    )
    assert info.product == "mi250x"


def test_zero_allocatable_gpus_with_no_labels_is_a_cpu_node():
    info = classify_node(node("n", {}, {"nvidia.com/gpu": "0"}))
    assert info.vendor == "cpu" and info.is_eligible


def test_nfd_pci_label_of_a_non_display_class_is_ignored():
    # 0200 is a network controller: an NVIDIA (Mellanox-era) NIC is no GPU.
    info = classify_node(node("n", {"feature.node.kubernetes.io/pci-0200_10de.present": "true"}))
    assert info.vendor == "cpu"


def test_a_node_without_a_ready_condition_is_excluded():
    n = node("n", {}, {})
    n["status"]["conditions"] = []
    assert classify_node(n).excluded_reason.startswith("NotReady")

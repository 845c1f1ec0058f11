"""group_pools: pools of one (vendor, product), DNS-safe stable names, exclusions kept for explanations."""

from __future__ import annotations

import random
import re

from planning_data import cpu, h100, mi300x, node

from inferfleet_operator.plan.pools import MAX_POOL_NAME, group_pools, pool_name


def test_nodes_group_by_vendor_and_product_sorted_by_name():
    pools = group_pools([h100("h2"), mi300x("m1"), h100("h1"), cpu("c1")])
    assert [(p.name, p.node_names) for p in pools] == [
        ("amd-mi300x", ("m1",)),
        ("cpu-amd64", ("c1",)),
        ("nvidia-h100-80gb-hbm3", ("h1", "h2")),
    ]
    nvidia = pools[-1]
    assert (nvidia.architecture, nvidia.gpus_per_node, nvidia.gpu_resource) == ("sm90", 8, "nvidia.com/gpu")
    assert nvidia.pool_label == ("nvidia.com/gpu.product", "NVIDIA-H100-80GB-HBM3")


def test_pools_do_not_depend_on_node_order():
    nodes = [h100(f"h{i}") for i in range(5)] + [mi300x(f"m{i}") for i in range(3)] + [cpu("c")]
    shuffled = nodes[:]
    random.Random(7).shuffle(shuffled)
    assert group_pools(nodes) == group_pools(shuffled)


def test_excluded_nodes_stay_with_their_pool_with_reasons():
    pools = group_pools([h100("ok"), h100("down", ready=False)])
    assert pools[0].node_names == ("ok",)
    assert pools[0].excluded_nodes[0][0] == "down" and pools[0].excluded_nodes[0][1].startswith("NotReady")


def test_a_product_whose_nodes_are_all_excluded_still_yields_an_empty_pool():
    pools = group_pools([h100("down", ready=False)])
    assert pools[0].node_names == () and len(pools[0].excluded_nodes) == 1


def test_mixed_signal_pool_has_no_common_label():
    nfd = node("x", {"feature.node.kubernetes.io/pci-0302_10de_2330.present": "true"}, {"nvidia.com/gpu": "8"})
    (pool,) = group_pools([h100("h1"), nfd])
    assert pool.node_names == ("h1", "x") and pool.pool_label is None


def test_long_product_names_are_cut_with_a_hash_and_stay_dns_safe():
    long = pool_name("nvidia", "Some Very Long Product Name With Spaces And_Underscores 80GB")
    other = pool_name("nvidia", "Some Very Long Product Name With Spaces And_Underscores 40GB")
    assert len(long) <= MAX_POOL_NAME and long != other
    assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", long)
    assert long == pool_name("nvidia", "Some Very Long Product Name With Spaces And_Underscores 80GB")


def test_identical_mi300x_labelled_by_either_amd_scheme_share_one_pool():
    beta = node(
        "beta", {"beta.amd.com/gpu.device-id.74a1": "8", "beta.amd.com/gpu.family.AI": "8"}, {"amd.com/gpu": "8"}
    )
    (pool,) = group_pools([mi300x("m1"), beta])
    assert (pool.name, pool.node_names, pool.architecture) == ("amd-mi300x", ("beta", "m1"), "gfx942")
    assert pool.pool_label is None  # pinned by node name: the beta node lacks the amd.com label


def _classed(make, name: str, node_class: str, **kw) -> dict:
    obj = make(name, **kw)
    obj["metadata"]["labels"]["inferfleet.dev/node-class"] = node_class
    return obj


def test_a_node_class_label_splits_a_product_into_pools_pinned_by_node_name():
    pools = group_pools([cpu("c1"), _classed(cpu, "c2", "small"), h100("h1"), _classed(h100, "h2", "spot")])
    assert [(p.name, p.node_names) for p in pools] == [
        ("cpu-amd64", ("c1",)),
        ("cpu-amd64-small", ("c2",)),
        ("nvidia-h100-80gb-hbm3", ("h1",)),
        ("nvidia-h100-80gb-hbm3-spot", ("h2",)),
    ]
    spot = pools[-1]
    assert spot.pool_label is None  # the product label would match the unclassed node too
    assert (spot.product, spot.architecture, spot.gpus_per_node) == ("h100-80gb-hbm3", "sm90", 8)


def test_a_malformed_node_class_excludes_the_node_saying_why():
    (pool,) = group_pools([_classed(cpu, "c1", "Not A Class")])
    assert pool.node_names == () and pool.excluded_nodes[0][1].startswith("InvalidNodeClass: label inferfleet.dev/")

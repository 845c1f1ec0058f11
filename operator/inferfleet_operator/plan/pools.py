"""group_pools: classified nodes -> pools of one (vendor, product), with DNS-safe names that are stable across calls."""

from __future__ import annotations

import hashlib
import re
from collections import Counter, defaultdict
from dataclasses import dataclass

from inferfleet_operator.plan.nodes import UNKNOWN, NodeInfo, classify_node

BLOCKING_EFFECTS = ("NoSchedule", "NoExecute")
MAX_POOL_NAME = 30  # leaves room for "<service>-" in child names (a Service name is a 63-char DNS label)


@dataclass(frozen=True)
class Pool:
    name: str
    vendor: str
    product: str
    architecture: str
    node_names: tuple[str, ...]  # eligible nodes, sorted
    gpus_per_node: int  # the smallest allocatable count over the eligible nodes (0 for cpu)
    gpu_resource: str
    node_gpus: tuple[int, ...]  # allocatable GPUs per eligible node, same order as node_names
    node_cpu_millis: tuple[int, ...]
    pool_label: tuple[str, str] | None  # a label every eligible node carries and that names the product
    excluded_nodes: tuple[tuple[str, str], ...]  # (node, reason) for nodes of this product left out
    nodes: tuple[NodeInfo, ...] = ()  # the eligible nodes' classification (for per-service filtering)
    has_blocking_taints: bool = False  # some eligible node has a NoSchedule/NoExecute taint
    gpu_resources: frozenset[str] = frozenset()  # the GPU resources the eligible nodes advertise

    @property
    def num_nodes(self) -> int:
        return len(self.node_names)


def pool_name(vendor: str, product: str) -> str:
    """ "nvidia" + "h100-80gb-hbm3" -> "nvidia-h100-80gb-hbm3"; long names are cut and suffixed with a hash."""
    name = re.sub(r"[^a-z0-9-]+", "-", f"{vendor}-{product}".lower()).strip("-")
    name = re.sub(r"-+", "-", name)
    if len(name) <= MAX_POOL_NAME:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:6]
    return f"{name[: MAX_POOL_NAME - 7].rstrip('-')}-{digest}"


def _architecture(infos: list[NodeInfo]) -> str:
    known = Counter(i.architecture for i in infos if i.architecture != UNKNOWN)
    if not known:
        return UNKNOWN
    # Most common, ties broken by name so the answer does not depend on node order.
    return min(known.items(), key=lambda item: (-item[1], item[0]))[0]


def common_resource(infos) -> str:
    """The GPU resource most of the nodes advertise (ties by name): what a runtime naming none requests."""
    resources = Counter(i.gpu_resource for i in infos)
    return min(resources.items(), key=lambda item: (-item[1], item[0]))[0]


def group_pools(nodes: list) -> list[Pool]:
    """Nodes (Node dicts or NodeInfo) -> pools sorted by name, one per vendor, product and node class (label
    inferfleet.dev/node-class). A product whose nodes are all excluded still yields a pool (with no node_names) so
    its exclusion can be explained."""
    infos = [n if isinstance(n, NodeInfo) else classify_node(n) for n in nodes]
    groups: dict[tuple[str, str, str], list[NodeInfo]] = defaultdict(list)
    for info in infos:
        groups[(info.vendor, info.product, info.node_class)].append(info)
    pools = []
    for (vendor, product, node_class), members in groups.items():
        members.sort(key=lambda i: i.name)
        eligible = [i for i in members if i.is_eligible]
        labels = {i.pool_label for i in eligible}
        # A class splits a product's nodes: its product label would match the other classes too, so pin by name.
        pool_label = next(iter(labels)) if len(labels) == 1 and not node_class else None
        pools.append(
            Pool(
                name=pool_name(vendor, f"{product}-{node_class}" if node_class else product),
                vendor=vendor,
                product=product,
                architecture=_architecture(eligible or members),
                node_names=tuple(i.name for i in eligible),
                gpus_per_node=min((i.gpu_count for i in eligible), default=0),
                gpu_resource=common_resource(eligible or members),
                node_gpus=tuple(i.gpu_count for i in eligible),
                node_cpu_millis=tuple(i.cpu_millis for i in eligible),
                pool_label=pool_label,
                excluded_nodes=tuple((i.name, i.excluded_reason) for i in members if not i.is_eligible),
                nodes=tuple(eligible),
                has_blocking_taints=any(t.get("effect") in BLOCKING_EFFECTS for i in eligible for t in i.taints),
                gpu_resources=frozenset(i.gpu_resource for i in eligible if i.gpu_resource),
            )
        )
    pools.sort(key=lambda p: p.name)
    return pools

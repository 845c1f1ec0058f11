"""What the scale benchmark creates: the KWOK node fleet, the InferenceServices, and the floor's
children rendered by the pure planner."""

from __future__ import annotations

import copy
from datetime import UTC, datetime

from helpers import node_manifests

from inferfleet_operator.plan.cluster import cluster_view
from inferfleet_operator.plan.planner import ServiceInputs, plan_reconcile

BENCH_LABEL = "inferfleet.dev/scale-bench"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
FLOOR_MANAGER = "inferfleet-scale-floor"
# (share of the nodes, e2e fixture whose first node is the template)
NODE_MIX = [(0.30, "nvidia-h100"), (0.20, "nvidia-a100"), (0.20, "amd-mi300x"), (0.15, "intel-max1550"), (0.15, "cpu")]
# No service is placed on the CPU pool: the planner pins a pool without a product label (CPU nodes)
# with one matchFields metadata.name term listing every node, which the API server refuses for
# more than one node ("must be only one value when operator is In"). The CPU nodes stay in the fleet.
PAGED_VENDORS = [["nvidia"], ["amd"], ["intel"], ["nvidia", "amd"]]
AUTO_VENDORS = [["amd"], ["intel"]]


def make_nodes(num_nodes: int) -> list[dict]:
    """num_nodes Node objects, pools in NODE_MIX proportions (largest remainder), named <fixture>-bench-<i>."""
    counts = {fixture: int(share * num_nodes) for share, fixture in NODE_MIX}
    by_remainder = sorted(NODE_MIX, key=lambda m: -(m[0] * num_nodes % 1))
    for _, fixture in by_remainder[: num_nodes - sum(counts.values())]:
        counts[fixture] += 1
    nodes = []
    for fixture, count in counts.items():
        template = node_manifests(fixture)[0]
        for i in range(count):
            node = copy.deepcopy(template)
            name = f"{fixture}-bench-{i}"
            labels = node["metadata"]["labels"]
            labels.pop("inferfleet.dev/e2e-fleet", None)
            labels.update({"kubernetes.io/hostname": name, BENCH_LABEL: "true"})
            node["metadata"]["name"] = name
            nodes.append(node)
    return nodes


def make_services(num_services: int, namespaces: list[str]) -> list[dict]:
    """The InferenceServices: 80% Paged over PAGED_VENDORS, 20% Auto over AUTO_VENDORS; every 4th has 2 replicas."""
    services = []
    for i in range(num_services):
        if i % 5 == 4:
            policy, vendors = "Auto", AUTO_VENDORS[(i // 5) % len(AUTO_VENDORS)]
        else:
            policy, vendors = "Paged", PAGED_VENDORS[i % len(PAGED_VENDORS)]
        spec = {
            "model": {"name": f"model-{i % 20}", "uri": f"hf://bench/model-{i % 20}"},
            "replicas": 2 if i % 4 == 3 else 1,
            "runtime": {"policy": policy},
        }
        spec["placement"] = {"vendors": vendors}
        services.append(
            {
                "apiVersion": "inferfleet.dev/v1alpha1",
                "kind": "InferenceService",
                "metadata": {
                    "name": f"svc-{i}",
                    "namespace": namespaces[i % len(namespaces)],
                    "labels": {BENCH_LABEL: "true"},
                },
                "spec": spec,
            }
        )
    return services


def _relabel(obj, value: str):
    """A copy with every managed-by label (metadata, selectors, pod templates) set to `value`."""
    if isinstance(obj, dict):
        return {k: (value if k == MANAGED_BY_LABEL else _relabel(v, value)) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_relabel(v, value) for v in obj]
    return obj


def floor_children(
    services: list[dict], nodes: list[dict], runtimes: list[dict], namespaces: dict[str, str]
) -> list[list[dict]]:
    """Per service, the children the pure planner renders, moved to the floor namespaces, without
    ownerReferences (no InferenceService owns them) and under the floor's managed-by label."""
    view = cluster_view(nodes, runtimes)
    now = datetime.now(UTC)
    result = []
    for i, service in enumerate(services):
        obj = copy.deepcopy(service)
        obj["metadata"].update(uid=f"floor-{i}", generation=1)
        plan = plan_reconcile(ServiceInputs(obj, view, now))
        children = []
        for child in plan.children:
            child = _relabel(child, FLOOR_MANAGER)
            child["metadata"]["namespace"] = namespaces[child["metadata"]["namespace"]]
            child["metadata"].pop("ownerReferences", None)
            children.append(child)
        result.append(children)
    return result

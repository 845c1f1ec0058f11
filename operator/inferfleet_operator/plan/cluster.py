"""The cluster as every service's plan sees it (nodes classified into pools, runtimes parsed), and the part of
it one service may use (its nodeSelector and tolerations)."""

from __future__ import annotations

from dataclasses import dataclass

from inferfleet_operator.api.types import InferenceRuntime, InferenceService, SpecError, Toleration, parse_runtime
from inferfleet_operator.plan.choice import Excluded, restrict_pool
from inferfleet_operator.plan.pools import Pool, group_pools


@dataclass(frozen=True)
class ClusterView:
    """Nodes classified into pools and runtimes parsed: computed once per change of nodes or runtimes and shared
    by every service's plan (1,000 nodes are not re-classified 500 times)."""

    pools: tuple[Pool, ...]
    runtimes: tuple[InferenceRuntime, ...]
    invalid_runtimes: tuple[tuple[str, str], ...]  # (name, why) for runtime objects that do not parse


def cluster_view(nodes: list[dict], runtimes: list[dict]) -> ClusterView:
    parsed, invalid = [], []
    for obj in runtimes:
        try:
            parsed.append(parse_runtime(obj))
        except SpecError as error:
            invalid.append(((obj.get("metadata") or {}).get("name", ""), str(error)))
    return ClusterView(tuple(group_pools(nodes)), tuple(parsed), tuple(invalid))


# ------------------------------------------------------------------ per-service node filtering


def _tolerates(tolerations: tuple[Toleration, ...], taint: dict) -> bool:
    for tol in tolerations:
        if tol.effect and tol.effect != taint.get("effect"):
            continue
        if tol.operator == "Exists" and (not tol.key or tol.key == taint.get("key")):
            return True
        if tol.key == taint.get("key") and tol.value == taint.get("value", ""):
            return True
    return False


def gpu_toleration(placement, gpu_resource: str) -> tuple[Toleration, ...]:
    """The toleration pods get for taints keyed by the GPU resource they request (what Kubernetes'
    ExtendedResourceToleration admission plugin adds), unless placement.tolerateGpuTaints is false."""
    if not placement.tolerate_gpu_taints or not gpu_resource:
        return ()
    return (Toleration(key=gpu_resource, operator="Exists"),)


def _node_blocker(info, service: InferenceService) -> str:
    placement = service.spec.placement
    for key, value in placement.node_selector.items():
        if info.labels.get(key) != value:
            return f"NodeSelectorMismatch: label {key}={value} (placement.nodeSelector) missing"
    for taint in info.taints:
        if taint.get("effect") not in ("NoSchedule", "NoExecute"):
            continue
        is_gpu_taint = placement.tolerate_gpu_taints and info.gpu_resource and taint.get("key") == info.gpu_resource
        if not is_gpu_taint and not _tolerates(placement.tolerations, taint):
            return f"TaintNotTolerated: taint {taint.get('key')}={taint.get('value', '')}:{taint.get('effect')} not in placement.tolerations"
    return ""


def service_pool(pool: Pool, service: InferenceService) -> Pool | Excluded:
    """The pool restricted to the nodes this service may use (nodeSelector, taints); the others are listed in
    the pool's excluded nodes."""
    if not service.spec.placement.node_selector and not pool.has_blocking_taints:
        return pool
    blockers = [(info, _node_blocker(info, service)) for info in pool.nodes]
    keep = [info for info, why in blockers if not why]
    if len(keep) == len(pool.nodes):
        return pool
    if not keep:
        first = blockers[0]
        return Excluded(pool, f"NodesNotUsable: {len(blockers)} node(s), e.g. {first[0].name}: {first[1]}")
    return restrict_pool(pool, keep, tuple((info.name, why) for info, why in blockers if why))

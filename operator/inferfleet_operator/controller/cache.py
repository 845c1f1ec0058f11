"""ReadCache: what the operator knows of the cluster between reads: kopf's indexes, the objects it wrote until
their watch events arrive, the writes the API server refused, and the classified cluster view."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from inferfleet_operator.kube.diff import strip_object
from inferfleet_operator.plan import cluster

# Index ids (kopf passes each index to handlers under this keyword) and what they are keyed by.
SERVICES = "service_index"  # (namespace, name) -> InferenceService
SERVICE_REFS = "service_refs_index"  # (namespace, engine build name) -> referencing service name
RUNTIMES = "runtime_index"  # name -> InferenceRuntime
NODES = "node_index"  # name -> Node (trimmed)
BUILDS = "build_index"  # namespace -> EngineBuild
DEPLOYMENTS = "deployment_index"  # (namespace, service) -> Deployment
SERVICE_OBJECTS = "k8s_service_index"  # (namespace, service) -> core Service
PDBS = "pdb_index"  # (namespace, service) -> PodDisruptionBudget
NETWORK_POLICIES = "network_policy_index"  # (namespace, service) -> NetworkPolicy
JOBS = "job_index"  # (namespace, engine build) -> Job
PODS = "pod_index"  # (namespace, engine build) -> Pod of a compile Job
SERVICE_PODS = "service_pod_index"  # (namespace, service) -> serving Pod (findings.pod_view)
CLAIMS = "claim_index"  # namespace -> PersistentVolumeClaim name

CHILD_INDEXES = {
    "Deployment": DEPLOYMENTS,
    "Service": SERVICE_OBJECTS,
    "PodDisruptionBudget": PDBS,
    "NetworkPolicy": NETWORK_POLICIES,
}

Key = tuple[str, str, str]  # (kind, namespace, name)


def _rv(obj: Mapping) -> int:
    try:
        return int(obj.get("metadata", {}).get("resourceVersion") or 0)
    except ValueError:
        return 0


class ReadCache:
    """One per operator process. `indices` are kopf's (id -> key -> objects), kept current by its watches."""

    def __init__(self, indices: Mapping[str, Mapping[Any, Iterable[dict]]]):
        self.indices = indices
        # Objects this process wrote, until the watch delivers them: a reconcile that runs before the
        # watch event arrives must not see the old object and write again.
        self.written: dict[Key, dict] = {}
        # Writes the API server refused with a non-retryable error, per owner (kind, namespace, name):
        # {(kind, name, pool): the server's message}. Reported in the owner's status until a write succeeds.
        self.refused: dict[Key, dict[Key, str]] = {}
        # Nodes and runtimes classified once per change, shared by every service's plan.
        self.cluster_version = 0
        self._view: tuple[int, cluster.ClusterView] | None = None

    # ------------------------------------------------------------------ indexes

    def values(self, index: str, key: Any) -> list[dict]:
        return list(self.indices[index].get(key, ()))

    def all_values(self, index: str) -> list[dict]:
        return [obj for store in self.indices[index].values() for obj in store]

    def claims(self, namespace: str) -> frozenset[str] | None:
        """Names of the namespace's PersistentVolumeClaims (None: not watched, nothing is known)."""
        if CLAIMS not in self.indices:
            return None
        return frozenset(self.indices[CLAIMS].get(namespace, ()))

    # ------------------------------------------------------------------ the cluster view

    def cluster_changed(self) -> None:
        self.cluster_version += 1

    def cluster_view(self) -> cluster.ClusterView:
        if self._view is None or self._view[0] != self.cluster_version:
            view = cluster.cluster_view(self.all_values(NODES), self.all_values(RUNTIMES))
            self._view = (self.cluster_version, view)
        return self._view[1]

    # ------------------------------------------------------------------ own writes

    def remember(self, obj: dict) -> None:
        meta = obj["metadata"]
        self.written[(obj["kind"], meta.get("namespace") or "", meta["name"])] = strip_object(obj)

    def observed(self, kind: str, obj: Mapping, *, is_deleted: bool = False) -> bool:
        """Called on every watch event: drops what the index now knows at least as well. True when the
        event is this process's own last write of the object coming back (the same resourceVersion): the
        reconcile that wrote it already knew everything the event carries."""
        meta = obj.get("metadata", {})
        key = (kind, meta.get("namespace") or "", meta.get("name", ""))
        cached = self.written.get(key)
        if cached is None or not (is_deleted or _rv(obj) >= _rv(cached)):
            return False
        del self.written[key]
        return not is_deleted and _rv(obj) == _rv(cached)

    def fresher(self, kind: str, indexed: dict | None, namespace: str, name: str) -> dict | None:
        """The newer of the indexed object and the one this process last wrote."""
        cached = self.written.get((kind, namespace, name))
        if cached is None or (indexed is not None and _rv(indexed) >= _rv(cached)):
            return indexed
        return cached

    def forget(self, kind: str, namespace: str, name: str) -> None:
        """The owner is gone: so are its refused writes."""
        self.refused.pop((kind, namespace, name), None)

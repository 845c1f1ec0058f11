"""PERMISSIONS: exactly the API verbs the operator uses, as RBAC rules; the chart's ClusterRole equals this list."""

from __future__ import annotations

from inferfleet_operator.api.names import GROUP, POOL_GROUP

# Server-side apply that creates an object is authorized as `create` as well as `patch`
# (kubernetes.io/docs/reference/using-api/api-concepts/#patch-and-apply), so applied kinds need both.
_APPLIED = ["get", "list", "watch", "create", "patch", "delete"]

PERMISSIONS: list[dict] = [
    # The kinds the operator reconciles: watched by kopf, status written through the subresource,
    # metadata patched by kopf for its finalizer and progress annotations.
    {"apiGroups": [GROUP], "resources": ["inferenceservices"], "verbs": ["get", "list", "watch", "patch"]},
    {"apiGroups": [GROUP], "resources": ["inferenceservices/status"], "verbs": ["get", "patch"]},
    # EngineBuilds are applied by the service reconcile, reconciled themselves, and garbage-collected.
    {"apiGroups": [GROUP], "resources": ["enginebuilds"], "verbs": _APPLIED},
    {"apiGroups": [GROUP], "resources": ["enginebuilds/status"], "verbs": ["get", "patch"]},
    # Runtimes are only read (an in-memory index); the operator never writes them.
    {"apiGroups": [GROUP], "resources": ["inferenceruntimes"], "verbs": ["get", "list", "watch"]},
    # Nodes are classified into pools; read only.
    {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get", "list", "watch"]},
    # Children of a service (drift repair watches them; stale ones are deleted).
    {"apiGroups": ["apps"], "resources": ["deployments"], "verbs": _APPLIED},
    {"apiGroups": [""], "resources": ["services"], "verbs": _APPLIED},
    {"apiGroups": ["policy"], "resources": ["poddisruptionbudgets"], "verbs": _APPLIED},
    {"apiGroups": ["networking.k8s.io"], "resources": ["networkpolicies"], "verbs": _APPLIED},
    # Compile Jobs of EngineBuilds; the operator's pods (compile and serving: termination messages,
    # scheduling failures, failed model fetches) and the claims pods mount (a missing one is reported).
    {"apiGroups": ["batch"], "resources": ["jobs"], "verbs": _APPLIED},
    {"apiGroups": [""], "resources": ["pods"], "verbs": ["get", "list", "watch"]},
    {"apiGroups": [""], "resources": ["persistentvolumeclaims"], "verbs": ["list", "watch"]},
    {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
    # kopf itself: it watches CRDs to notice resources appear and namespaces when run cluster-wide,
    # and peers through kopf.dev objects for leader election when --peering is given.
    {"apiGroups": ["apiextensions.k8s.io"], "resources": ["customresourcedefinitions"], "verbs": ["list", "watch"]},
    {"apiGroups": [""], "resources": ["namespaces"], "verbs": ["list", "watch"]},
    {
        "apiGroups": ["kopf.dev"],
        "resources": ["clusterkopfpeerings", "kopfpeerings"],
        "verbs": ["get", "list", "watch", "patch"],
    },
]

# InferencePools (Gateway API Inference Extension), granted only when the chart turns them on
# (routing.inferencePools); the operator then runs with --inference-pools=auto. Pods are listed
# for autoscaling already (the rule above), so routing needs nothing else.
ROUTING_PERMISSIONS: list[dict] = [
    {"apiGroups": [POOL_GROUP], "resources": ["inferencepools"], "verbs": _APPLIED},
]

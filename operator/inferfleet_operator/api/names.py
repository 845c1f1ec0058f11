"""Every name the operator reads or writes on the API, in one place: group/versions, kinds and their
plurals, labels, annotations, and who it is (field manager, Event reporter)."""

from __future__ import annotations

from typing import NamedTuple

# ------------------------------------------------------------------ API groups

GROUP = "inferfleet.dev"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"

# The GAIE API this operator writes: inference.networking.k8s.io/v1, as published in the CRDs of
# sigs.k8s.io/gateway-api-inference-extension v1.6.0 (vendored for tests in e2e/crds-thirdparty/).
POOL_GROUP = "inference.networking.k8s.io"
POOL_VERSION = "v1"
POOL_API_VERSION = f"{POOL_GROUP}/{POOL_VERSION}"
POOL_CRD = f"inferencepools.{POOL_GROUP}"

# ------------------------------------------------------------------ kinds

SERVICE_KIND = "InferenceService"
RUNTIME_KIND = "InferenceRuntime"
BUILD_KIND = "EngineBuild"
POOL_KIND = "InferencePool"


class Kind(NamedTuple):
    api_version: str
    plural: str
    is_namespaced: bool


# Every kind the operator reads or writes.
KINDS: dict[str, Kind] = {
    "Deployment": Kind("apps/v1", "deployments", True),
    "Service": Kind("v1", "services", True),
    "PodDisruptionBudget": Kind("policy/v1", "poddisruptionbudgets", True),
    "NetworkPolicy": Kind("networking.k8s.io/v1", "networkpolicies", True),
    "Job": Kind("batch/v1", "jobs", True),
    "Node": Kind("v1", "nodes", False),
    "Event": Kind("v1", "events", True),
    "Pod": Kind("v1", "pods", True),
    "PersistentVolumeClaim": Kind("v1", "persistentvolumeclaims", True),
    SERVICE_KIND: Kind(API_VERSION, "inferenceservices", True),
    RUNTIME_KIND: Kind(API_VERSION, "inferenceruntimes", False),
    BUILD_KIND: Kind(API_VERSION, "enginebuilds", True),
    POOL_KIND: Kind(POOL_API_VERSION, "inferencepools", True),
    # kopf's peering objects (leader election with --peering), read by leadership.py.
    "ClusterKopfPeering": Kind("kopf.dev/v1", "clusterkopfpeerings", False),
    "KopfPeering": Kind("kopf.dev/v1", "kopfpeerings", True),
}
# An InferenceService's children (labelled SERVICE_LABEL, owned by it, deleted when no longer planned).
CHILD_KINDS = ("Deployment", "Service", "PodDisruptionBudget", "NetworkPolicy")

# ------------------------------------------------------------------ who the operator is

MANAGER = "inferfleet-operator"  # field manager of every write, managed-by label value, Event source
REPORTING_CONTROLLER = f"{GROUP}/operator"  # Events' reportingComponent
KOPF_FINALIZER = f"{GROUP}/kopf-finalizer"

# ------------------------------------------------------------------ labels

NAME_LABEL = "app.kubernetes.io/name"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
COMPONENT_LABEL = "app.kubernetes.io/component"
SERVICE_LABEL = f"{GROUP}/service"
POOL_LABEL = f"{GROUP}/pool"
# On a Node: the administrator splits its vendor and product pool by class (e.g. node size or pricing): pool <product>-<class>.
NODE_CLASS_LABEL = f"{GROUP}/node-class"
ENGINE_LABEL = f"{GROUP}/engine"  # "paged" | "compiled"
ENGINE_KEY_LABEL = f"{GROUP}/engine-key"
BUILD_LABEL = f"{GROUP}/engine-build"  # on Jobs and their pods: the EngineBuild name
REF_LABEL_PREFIX = f"ref.{GROUP}/"  # on an EngineBuild: one label per referencing InferenceService
JOB_NAME_LABEL = "batch.kubernetes.io/job-name"  # set by the Job controller on its pods
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"  # set by the API server on every namespace: its name

MANAGED_SELECTOR = f"{MANAGED_BY_LABEL}={MANAGER}"  # the operator's children, Jobs and pods

# ------------------------------------------------------------------ annotations

ENGINE_KEY_ANNOTATION = f"{GROUP}/engine-key"  # on a pool Deployment: the compiled engine it serves
RUNTIME_ANNOTATION = f"{GROUP}/runtime"
ATTEMPT_ANNOTATION = f"{GROUP}/attempt"  # on Jobs: the 1-based attempt number
PROGRESS_ANNOTATION = f"{GROUP}/build-progress"  # on a Job or its pod: free-form progress ("40%", "exporting")
UNREFERENCED_ANNOTATION = f"{GROUP}/unreferenced-since"  # on an EngineBuild: when GC last saw no reference
REBUILD_ANNOTATION = f"{GROUP}/engine-lost"  # on an EngineBuild: the Job whose engine serving pods found lost
APPLIED_HASH_ANNOTATION = f"{GROUP}/applied-hash"  # on every applied object: the hash of what was applied

"""Status conditions (set with lastTransitionTime moving only on a flip), their reasons, and planned Events."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

# Condition types of an InferenceService.
READY = "Ready"
ENGINES_BUILT = "EnginesBuilt"
ROLLED_OUT = "RolledOut"
DEGRADED = "Degraded"
# True when every pod of the cluster may call the service without a key (no NetworkPolicy, no API key).
EXPOSED = "Exposed"
SERVICE_CONDITIONS = (READY, ENGINES_BUILT, ROLLED_OUT, DEGRADED, EXPOSED)
# Conditions whose True is the state to warn about: flipping to True posts a Warning, back to False a Normal Event.
WARN_WHEN_TRUE = (DEGRADED, EXPOSED)

# Condition types of an EngineBuild.
BUILT = "Built"

TRUE, FALSE, UNKNOWN = "True", "False", "Unknown"

# Reasons (CamelCase constants; status, pool entries and Events use the same words).
REASON_PENDING = "Pending"
REASON_ALL_POOLS_READY = "AllPoolsReady"
REASON_SOME_POOLS_READY = "SomePoolsReady"
REASON_NO_READY_REPLICAS = "NoReadyReplicas"
REASON_NO_ELIGIBLE_POOLS = "NoEligiblePools"
REASON_NO_ENGINES_NEEDED = "NoEnginesNeeded"
REASON_ENGINES_READY = "EnginesReady"
REASON_ENGINES_BUILDING = "EnginesBuilding"
REASON_BUILD_FAILED = "BuildFailed"
REASON_BUILD_FAILED_NO_FALLBACK = "BuildFailedNoFallback"
REASON_ROLLING_OUT = "RollingOut"
REASON_ROLLED_OUT = "RolledOut"
REASON_AS_PLANNED = "AsPlanned"
REASON_INSUFFICIENT_CAPACITY = "InsufficientCapacity"
# Failures a user must act on (findings.py): Degraded's reason and a Warning Event each.
REASON_APPLY_FAILED = "ApplyFailed"  # the API server refused a write (e.g. 422 Invalid)
REASON_CLAIM_NOT_FOUND = "ClaimNotFound"  # a mounted PersistentVolumeClaim does not exist
REASON_INSUFFICIENT_RESOURCE = "InsufficientResource"  # pods unschedulable: Insufficient <resource>
REASON_UNSCHEDULABLE = "Unschedulable"  # pods unschedulable for another reason
REASON_SECRET_NOT_FOUND = "SecretNotFound"  # a Secret (or its key) the pods take by reference does not exist
REASON_FETCH_FAILED = "FetchFailed"  # the model fetch init container exited non-zero
REASON_SERVER_FAILED = "ServerFailed"  # the serving container exited non-zero (e.g. an unsupported model)
REASON_DEADLINE_EXCEEDED = "DeadlineExceeded"  # a compile Job ran past activeDeadlineSeconds
REASON_NOT_OWNED = "NotOwned"  # an object the operator would write exists and is not owned by the resource
# A file:// model under no root the administrator allowed: no pod nor compile Job is made (plan/host_paths.py).
REASON_HOST_PATH_NOT_ALLOWED = "HostPathNotAllowed"
# Exposed's reasons: open to every pod of the cluster without a key; a key is required; a NetworkPolicy restricts.
REASON_OPEN_TO_CLUSTER = "OpenToCluster"
REASON_API_KEY_REQUIRED = "ApiKeyRequired"
REASON_RESTRICTED_BY_NETWORK_POLICY = "RestrictedByNetworkPolicy"
# Per-pool reasons.
REASON_SERVING_COMPILED = "ServingCompiled"
REASON_SERVING_PAGED = "ServingPaged"
REASON_BRIDGING = "BridgingWithPaged"
REASON_FALLBACK_PAGED = "FallbackToPaged"
REASON_SERVING_PREVIOUS_ENGINE = "ServingPreviousEngine"
REASON_WAITING_FOR_BUILD = "WaitingForEngineBuild"
REASON_NO_CAPACITY = "NoCapacity"
REASON_NO_REPLICAS = "NoReplicasAssigned"
# EngineBuild reasons.
REASON_JOB_CREATED = "JobCreated"
REASON_JOB_RUNNING = "JobRunning"
REASON_JOB_SUCCEEDED = "JobSucceeded"
REASON_JOB_FAILED = "JobFailed"
REASON_BACKOFF = "BackoffBeforeRetry"
REASON_ATTEMPTS_EXHAUSTED = "AttemptsExhausted"
REASON_ENGINE_LOST = "EngineLost"  # serving pods found a Ready build's engine gone or damaged: it is rebuilt
REASON_KEY_MISMATCH = "KeyMismatch"  # the spec does not hash to spec.engineKey: nothing is built


@dataclass(frozen=True)
class PlannedEvent:
    type: str  # "Normal" | "Warning"
    reason: str  # CamelCase
    message: str


def normal(reason: str, message: str) -> PlannedEvent:
    return PlannedEvent("Normal", reason, message)


def warning(reason: str, message: str) -> PlannedEvent:
    return PlannedEvent("Warning", reason, message)


def format_time(now: datetime) -> str:
    """RFC 3339 in UTC with second precision, as the API server stores metav1.Time."""
    if now.tzinfo is None:
        now = now.replace(tzinfo=UTC)
    return now.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(value: str | None) -> datetime | None:
    if not value:
        return None
    try:
        parsed = datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


def by_type(conditions: list[dict] | None) -> dict[str, dict]:
    return {c["type"]: c for c in conditions or [] if "type" in c}


def condition(
    previous: dict[str, dict], type_: str, status: str, reason: str, message: str, now: datetime, generation: int
) -> dict:
    """A condition whose lastTransitionTime is kept from `previous` unless the status flips."""
    old = previous.get(type_)
    if old is not None and old.get("status") == status and old.get("lastTransitionTime"):
        transition = old["lastTransitionTime"]
    else:
        transition = format_time(now)
    return {
        "type": type_,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": transition,
        "observedGeneration": generation,
    }


def flipped(previous: dict[str, dict], new: dict) -> bool:
    old = previous.get(new["type"])
    return old is None or old.get("status") != new["status"]

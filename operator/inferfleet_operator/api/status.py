"""The status the operator writes on an InferenceService and an EngineBuild, declared for the CRDs and the reference
(the planner writes it as plain dicts; the API server keeps what these declare and prunes the rest)."""

from __future__ import annotations

from pydantic import StrictInt

from inferfleet_operator.api.schema import Model, field, item
from inferfleet_operator.api.spec_common import BUILD_STATES, KEY_PATTERN

Text = str | None
Count = StrictInt | None


def time(description: str):
    return field(None, description, format="date-time")


def int64(description: str):
    return field(None, description, format="int64")


def names(description: str, item_description: str, max_items: int = 256):
    return field(None, description, items=item(item_description), max_items=max_items, list_type="set")


def keyed(description: str, max_items: int, key: str = "name"):
    """A list of objects keyed by `key` (x-kubernetes-list-type map)."""
    return field(None, description, max_items=max_items, list_type="map", map_keys=(key,))


class Condition(Model):
    """A condition (metav1.Condition)."""

    type: str = field(..., "Condition type.")
    status: str = field(..., "True, False or Unknown.", enum=("True", "False", "Unknown"))
    reason: Text = field(None, "CamelCase reason.")
    message: Text = field(None, "Human-readable detail.")
    last_transition_time: Text = time("When status last changed.")
    observed_generation: Count = int64("Generation the condition was set for.")


class ExcludedNode(Model):
    """One node left out."""

    name: str = field(..., "Node name.")
    reason: Text = field(None, "CamelCase reason.")
    message: Text = field(None, "Detail.")


class PoolStatus(Model):
    """One pool serving (or meant to serve) this service."""

    name: str = field(..., "Pool name (vendor-product).")
    vendor: Text = field(None, "GPU vendor.")
    product: Text = field(None, "GPU product.")
    architecture: Text = field(None, "GPU architecture.")
    runtime: Text = field(None, "Chosen InferenceRuntime.")
    engine: Text = field(None, "Planned engine: Compiled or Paged.")
    choice_reason: Text = field(None, "Why this runtime.")
    serving_engine: Text = field(None, "What serves now: Compiled, Paged or None.")
    serving_runtime: Text = field(None, "InferenceRuntime serving now (paged).")
    engine_build: Text = field(None, "The EngineBuild this pool is built for.")
    build_state: Text = field(None, "Its state.")
    serving_engine_build: Text = field(None, "The EngineBuild whose engine serves now.")
    reason: Text = field(None, "CamelCase reason of the pool's state.")
    message: Text = field(None, "Detail.")
    nodes: Count = field(None, "Eligible nodes in the pool.")
    desired_replicas: Count = field(None, "Replicas planned for the pool.")
    excluded_nodes: tuple[ExcludedNode, ...] | None = keyed(
        "Nodes of the pool this service cannot use, by name (at most 100 listed).", 100
    )
    excluded_node_count: Count = field(None, "Nodes of the pool left out, all counted.")
    ready_replicas: Count = field(None, "Ready replicas of the pool's Deployment.")
    profile: Text = field(None, "The rates the service's router routes this pool by, as one of its pods measured them.")


class ExcludedPool(Model):
    """A pool left out, and why."""

    name: str = field(..., "name")
    vendor: Text = field(None, "vendor")
    product: Text = field(None, "product")
    reason: Text = field(None, "reason")


class RoutingStatus(Model):
    """The router and the InferencePool, when they are planned."""

    mode: Text = field(None, "Router or Service: what the service's endpoint reaches (spec.routing.mode, as served).")
    router: Text = field(None, "Name of the router's Deployment (empty: none).")
    router_message: Text = field(None, "Why the router is or is not deployed.")
    inference_pool: Text = field(None, "Name of the InferencePool (empty: none).")
    api_version: Text = field(None, "Its API version.")
    reason: Text = field(None, "CamelCase reason.")
    message: Text = field(None, "Detail.")
    pools: tuple[str, ...] | None = names("Pools whose pods it selects.", "Pool name.")


class ScalingDecision(Model):
    """One pool's last scaling decision."""

    name: str = field(..., "Pool name.")
    current_replicas: Count = field(None, "Replicas before the decision.")
    desired_replicas: Count = field(None, "Replicas decided.")
    metric: Text = field(None, "Metric that drove the decision (empty: none).")
    value: Text = field(None, "Its average over the pool's pods.")
    target: Text = field(None, "Its target per replica.")
    reason: Text = field(None, "CamelCase reason.")
    message: Text = field(None, "Detail.")


class AutoscalingStatus(Model):
    """What the autoscaler decided last."""

    pools: tuple[ScalingDecision, ...] | None = keyed("One entry per serving pool.", 256)
    last_scale_time: Text = time("When a pool's replicas last changed.")


class InferenceServiceStatus(Model):
    """Observed state; written by the operator."""

    observed_generation: Count = int64("Generation the status was computed for.")
    conditions: tuple[Condition, ...] | None = keyed("Ready, EnginesBuilt, RolledOut, Degraded, Exposed.", 16, "type")
    endpoint: Text = field(None, "OpenAI-compatible base URL inside the cluster.")
    pool_count: Count = field(None, "Pools chosen to serve.")
    runtimes: Text = field(None, "What serves now, e.g. Compiled=1,Paged=2.")
    replicas: Count = field(None, "Replicas planned across pools.")
    ready_replicas: Count = field(None, "Ready replicas across pools.")
    unplaced_replicas: Count = field(None, "Replicas no pool has room for.")
    pools: tuple[PoolStatus, ...] | None = keyed("One entry per chosen pool.", 256)
    excluded_pools: tuple[ExcludedPool, ...] | None = keyed("Pools left out, with reasons.", 256)
    routing: RoutingStatus | None = field(None)
    autoscaling: AutoscalingStatus | None = field(None)


class InferenceRuntimeStatus(Model):
    """Unused."""


class EngineBuildStatus(Model):
    """Build progress; written by the operator."""

    state: Text = field(None, "Pending, Building, Ready or Failed.", enum=BUILD_STATES)
    attempts: Count = field(None, "Compile Jobs created so far.")
    max_attempts: Count = field(None, "Attempts allowed.")
    current_job: Text = field(None, "Job of the latest attempt.")
    progress: Text = field(None, "What the latest attempt is doing.")
    message: Text = field(None, "Detail.")
    failure_reason: Text = field(None, "Why the latest attempt failed.")
    artifact_path: Text = field(None, "Engine directory in the engine cache: <mount>/<key>/<modelDigest>.")
    model_digest: Text = field(
        None,
        "Digest of the compiled model's content manifest (file names, sizes, sha256, hub commit), reported by the "
        "compile Job; names the engine's directory under its key.",
        pattern=KEY_PATTERN,
    )
    resolved_revision: Text = field(
        None, "The hub commit an hf:// revision resolved to when the engine was compiled.", pattern=r"^[0-9a-f]{40}$"
    )
    engine_digest: Text = field(
        None,
        "Digest of the engine the compile Job built (sha256 of its manifest, which lists every file's sha256), "
        "reported by the Job; serving pods load only the engine of this digest.",
        pattern=r"^sha256:[0-9a-f]{64}$",
    )
    artifact_size_bytes: Count = int64("Engine size.")
    start_time: Text = time("When the successful attempt started.")
    completion_time: Text = time("When it finished.")
    duration_seconds: Count = field(None, "Build duration.")
    next_attempt_time: Text = time("When the next attempt may start (backoff).")
    observed_generation: Count = int64("Generation the status was computed for.")
    conditions: tuple[Condition, ...] | None = keyed("Built.", 8, "type")

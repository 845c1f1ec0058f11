"""plan_service: one InferenceService × the cluster's nodes, runtimes, builds and Deployments -> its whole desired state."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from inferfleet_operator.api.conditions import PlannedEvent
from inferfleet_operator.api.names import API_VERSION, ENGINE_KEY_ANNOTATION, REF_LABEL_PREFIX, SERVICE_KIND
from inferfleet_operator.api.types import (
    DEFAULT_SETTINGS,
    BuildPlacement,
    EngineBuildSpec,
    InferenceRuntime,
    InferenceService,
    PlanSettings,
    SpecError,
    Toleration,
    parse_runtime,
    parse_service,
)
from inferfleet_operator.plan import manifests as m
from inferfleet_operator.plan.choice import Excluded, PoolChoice, choose_runtimes, placement_tier, restrict_pool
from inferfleet_operator.plan.engine_key import engine_key, runtime_identity
from inferfleet_operator.plan.manifests import PoolServing
from inferfleet_operator.plan.pool_decision import decide_pool
from inferfleet_operator.plan.pools import Pool, group_pools
from inferfleet_operator.plan.replicas import distribute, pool_capacity
from inferfleet_operator.plan.service_status import build_status, pool_events

__all__ = ["ClusterView", "ServicePlan", "cluster_view", "plan_service", "plan_service_in"]


@dataclass
class ServicePlan:
    """Everything one reconcile of an InferenceService must make true.

    engine_builds: desired EngineBuild objects (full manifests: apiVersion, kind, metadata, spec), one per
        engine key some pool of this service needs now (the one being built and, during an envelope change,
        the one still serving). Apply them; never delete builds from here (GC is by reference, build_lifecycle.plan_gc).
    children: desired Deployments (one per serving pool), the Service and the PodDisruptionBudget, with
        ownerReferences to the InferenceService. Children labelled inferfleet.dev/service=<name> that are
        not in this list are stale and should be deleted.
    status: the whole InferenceService .status (observedGeneration, conditions, endpoint, pools,
        excludedPools, poolCount, runtimes, replicas, readyReplicas). Deterministic: equal inputs give an
        equal dict, so a no-op resync can skip the status write by comparing with the stored status.
    events: Events worth a person's attention, only for changes against the previous status.
    requeue_after: seconds until the plan should be recomputed even without a watch event (None: no timer).
    """

    engine_builds: list[dict] = field(default_factory=list)
    children: list[dict] = field(default_factory=list)
    status: dict = field(default_factory=dict)
    events: list[PlannedEvent] = field(default_factory=list)
    requeue_after: float | None = None
    capacities: dict[str, int] = field(default_factory=dict)  # pool name -> replicas of this service that fit it


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


def plan_service(
    service: dict,
    nodes: list[dict],
    runtimes: list[dict],
    builds: dict[str, dict],
    deployments: dict[str, dict],
    now: datetime,
    settings: PlanSettings = DEFAULT_SETTINGS,
) -> ServicePlan:
    """Plan one InferenceService.

    service: the InferenceService object as read (metadata.uid/generation used; .status read for previous
        conditions so lastTransitionTime only moves on a flip).
    nodes: every Node object (classified here; NotReady/unschedulable ones excluded with a reason).
    runtimes: every InferenceRuntime object.
    builds: engine key -> EngineBuild object as read (status.state Pending|Building|Ready|Failed).
    deployments: Deployment name -> Deployment as read, for this service's pools (ready replica counts,
        and the engine key annotation so the old engine keeps serving until the new build is Ready).
    now: the time used for condition transitions.
    Raises api.SpecError for a spec the CRD rules should have refused.
    """
    return plan_service_in(cluster_view(nodes, runtimes), service, builds, deployments, now, settings)


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


def _service_pool(pool: Pool, service: InferenceService) -> Pool | Excluded:
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


# ------------------------------------------------------------------ the plan


MAX_LISTED_NODES = 100  # status.pools[].excludedNodes lists at most this many (excludedNodeCount counts all)


def excluded_nodes_status(excluded: tuple[tuple[str, str], ...]) -> dict:
    """(node, "Reason: detail") pairs -> status.pools[] fields: excludedNodes [{name, reason, message}] by name,
    and excludedNodeCount."""
    listed = []
    for name, text in sorted(excluded)[:MAX_LISTED_NODES]:
        reason, _, message = text.partition(": ")
        listed.append({"name": name, "reason": reason, "message": message})
    return {"excludedNodes": listed, "excludedNodeCount": len(excluded)}


def _runtime_identity(runtime: InferenceRuntime) -> str:
    return runtime_identity(runtime.spec.compile_image, runtime.spec.image)


def _build_state(build: dict | None) -> str:
    return ((build or {}).get("status") or {}).get("state") or "Pending"


def _build_settings(spec) -> dict:
    """The EngineBuild fields that say how compile Jobs run, not what they build (mutable, outside the key)."""
    return {
        "deadlineSeconds": spec.build.deadline_seconds,
        "resources": {"cpu": spec.build.resources.cpu, "memory": spec.build.resources.memory},
        "modelSize": spec.model.size,
        "credentialsSecret": spec.model.credentials_secret,
    }


def _build_spec(
    service: InferenceService, choice: PoolChoice, key: str, view: ClusterView, existing: dict | None
) -> EngineBuildSpec | dict:
    """The spec of the build for `key`: as stored when the build exists (its spec is immutable, and re-emitting
    it keeps services that share the build from fighting over its placement), else from this service's view.
    A build no other service references takes this service's build settings (deadline, resources, model size,
    credentials), so a fix to them reaches the next attempt."""
    runtime, pool = choice.runtime, choice.pool
    if existing is not None and (existing.get("spec") or {}).get("engineKey") == key:
        stored = dict(existing["spec"])
        labels = (existing.get("metadata") or {}).get("labels") or {}
        others = [k for k in labels if k.startswith(REF_LABEL_PREFIX) and k != m.ref_label(service.meta.name)]
        return stored if others else stored | _build_settings(service.spec)
    gpu_resource = runtime.spec.gpu_resource or pool.gpu_resource
    # Every eligible node of the vendor and architecture that advertises the resource: the same answer for
    # every service sharing the key.
    node_names = sorted(
        info.name
        for p in view.pools
        if p.vendor == pool.vendor and p.architecture == pool.architecture
        for info in p.nodes
        if info.gpu_resource == gpu_resource
    )
    spec = service.spec
    return EngineBuildSpec(
        engine_key=key,
        model_uri=spec.model.uri,
        revision=spec.model.revision,
        envelope=spec.engine,
        vendor=pool.vendor,
        architecture=pool.architecture,
        image=runtime.spec.image,
        compile_image=runtime.spec.compile_image,
        gpu_resource=gpu_resource,
        gpus=spec.engine.tensor_parallel_size,
        placement=BuildPlacement(
            node_names=tuple(node_names),
            tolerations=spec.placement.tolerations + gpu_toleration(spec.placement, gpu_resource),
        ),
        deadline_seconds=spec.build.deadline_seconds,
        resources=spec.build.resources,
        model_size=spec.model.size,
        credentials_secret=spec.model.credentials_secret,
        quantization=spec.model.quantization,
    )


def _serving_key(deployment: dict | None) -> str:
    return ((deployment or {}).get("metadata") or {}).get("annotations", {}).get(ENGINE_KEY_ANNOTATION, "")


def _plan_pool(
    service, choice: PoolChoice, replicas: int, capacity: int, builds, deployments
) -> tuple[dict, PoolServing | None, tuple[str, ...]]:
    """One pool's status entry, what its Deployment serves (None: no Deployment) and the engine keys it needs built."""
    pool, spec = choice.pool, service.spec
    key = ""
    if choice.engine == "Compiled" and replicas > 0:
        key = engine_key(
            spec.model.uri,
            spec.model.revision,
            spec.engine,
            pool.architecture,
            _runtime_identity(choice.runtime),
            spec.model.quantization,
        )
    previous_key = _serving_key(deployments.get(m.deployment_name(service.meta.name, pool.name)))
    decision = decide_pool(
        engine=choice.engine,
        runtime=choice.runtime.name,
        paged_runtime=choice.paged_runtime.name if choice.paged_runtime else None,
        num_replicas=replicas,
        capacity=capacity,
        capacity_message=f"no node has {spec.resources.gpus_per_replica} allocatable {pool.gpu_resource or 'cpu'}",
        engine_key=key,
        build_state=_build_state(builds.get(key)),
        previous_key=previous_key,
        previous_state=_build_state(builds.get(previous_key)),
        fallback=spec.runtime.fallback,
        bridge=spec.runtime.bridge,
    )
    entry = {
        "name": pool.name, "vendor": pool.vendor, "product": pool.product, "architecture": pool.architecture,
        "nodes": pool.num_nodes, "runtime": choice.runtime.name, "engine": choice.engine, "choiceReason": choice.reason,
        "desiredReplicas": decision.num_replicas,
    }  # fmt: skip
    if decision.engine_build:
        entry.update(engineBuild=decision.engine_build, buildState=_build_state(builds.get(decision.engine_build)))
    entry.update(reason=decision.reason, servingEngine=decision.serving_engine)
    if decision.engine == "Paged":
        entry["servingRuntime"] = decision.runtime
    elif decision.engine == "Compiled":
        entry["servingEngineBuild"] = decision.engine_key
    name = m.deployment_name(service.meta.name, pool.name)
    entry["readyReplicas"] = int(((deployments.get(name) or {}).get("status") or {}).get("readyReplicas") or 0)
    if pool.excluded_nodes:
        entry.update(excluded_nodes_status(pool.excluded_nodes))
    if decision.message:
        entry["message"] = decision.message
    if not decision.has_deployment:
        return entry, None, decision.build_keys
    # A compiled pool served paged (bridge, fallback) runs its paged companion.
    runtime = choice.runtime if decision.engine == choice.engine else choice.paged_runtime
    gpu_resource = "" if pool.vendor == "cpu" else (runtime.spec.gpu_resource or pool.gpu_resource)
    digest = ((builds.get(decision.engine_key) or {}).get("status") or {}).get("modelDigest", "")
    serving = PoolServing(pool, runtime, decision.engine, decision.engine_key, replicas, gpu_resource, digest)
    return entry, serving, decision.build_keys


def plan_service_in(
    view: ClusterView,
    service_obj: dict,
    builds: dict[str, dict],
    deployments: dict[str, dict],
    now: datetime,
    settings: PlanSettings = DEFAULT_SETTINGS,
    replica_overrides: dict[str, int] | None = None,
) -> ServicePlan:
    """plan_service over a precomputed ClusterView. replica_overrides: pool name -> replicas, over the spec's
    (the autoscaler's decisions)."""
    service = parse_service(service_obj)
    spec = service.spec
    usable, excluded = [], []
    for pool in view.pools:
        result = _service_pool(pool, service) if pool.node_names else pool
        (excluded if isinstance(result, Excluded) else usable).append(result)
    choices, not_chosen = choose_runtimes(spec, usable, list(view.runtimes))
    excluded += not_chosen

    capacities = {
        ch.pool.name: pool_capacity(ch.pool, spec.resources.gpus_per_replica, spec.resources.cpu) for ch in choices
    }
    overrides = {o.name: o.replicas for o in spec.pools} | (replica_overrides or {})
    distribution = distribute(
        spec.replicas, capacities, overrides, {ch.pool.name: placement_tier(ch) for ch in choices}
    )

    owner = m.owner_reference(API_VERSION, SERVICE_KIND, service.meta.name, service.meta.uid)
    wanted_builds: dict[str, EngineBuildSpec | dict] = {}
    entries, children = [], []
    for choice in choices:
        replicas, capacity = distribution.replicas[choice.pool.name], capacities[choice.pool.name]
        entry, serving, build_keys = _plan_pool(service, choice, replicas, capacity, builds, deployments)
        for key in build_keys:
            wanted_builds.setdefault(key, _build_spec(service, choice, key, view, builds.get(key)))
        if serving is not None:
            children.append(m.deployment_for_pool(service, serving, settings))
        entries.append(entry)
    children += [m.service_for(service, settings), m.pdb_for(service)]
    if spec.network_policy is not None:
        children.append(m.network_policy_for(service, settings))
    for child in children:
        child["metadata"]["ownerReferences"] = [owner]

    engine_builds = []
    for key in sorted(wanted_builds):
        refs = [
            k.removeprefix(REF_LABEL_PREFIX)
            for k in ((builds.get(key) or {}).get("metadata") or {}).get("labels", {})
            if k.startswith(REF_LABEL_PREFIX)
        ]
        engine_builds.append(m.engine_build_for(service.meta.namespace, wanted_builds[key], refs + [service.meta.name]))

    previous = service.status
    status = build_status(service, entries, excluded, distribution.num_unplaced, m.endpoint_for(service, settings), now)
    events = pool_events(previous, status)
    return ServicePlan(
        engine_builds=engine_builds, children=children, status=status, events=events, capacities=capacities
    )

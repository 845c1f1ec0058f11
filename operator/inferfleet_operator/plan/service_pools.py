"""Each chosen pool of one service: its serving decision (the engine key it wants, the engine it serves now), its
status entry, its Deployment, and the EngineBuilds it needs."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from inferfleet_operator.api.names import API_VERSION, ENGINE_KEY_ANNOTATION, REF_LABEL_PREFIX, SERVICE_KIND
from inferfleet_operator.api.types import (
    BuildPlacement,
    EngineBuildSpec,
    InferenceRuntime,
    InferenceService,
    PlanSettings,
)
from inferfleet_operator.plan import manifests as m
from inferfleet_operator.plan.choice import PoolChoice
from inferfleet_operator.plan.cluster import ClusterView, gpu_toleration
from inferfleet_operator.plan.engine_key import engine_key, key_namespace, runtime_identity
from inferfleet_operator.plan.manifests import PoolServing
from inferfleet_operator.plan.network import network_policy_for
from inferfleet_operator.plan.pool_decision import PoolDecision, decide_pool
from inferfleet_operator.plan.router import plan_router

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


def build_state(build: dict | None) -> str:
    """An EngineBuild's status.state ("Pending" while there is none)."""
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


def decide(
    service, choice: PoolChoice, replicas: int, capacity: int, builds, deployments, settings: PlanSettings
) -> PoolDecision:
    """What one pool serves with `replicas` and why."""
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
            key_namespace(service.meta.namespace, settings),
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
        build_state=build_state(builds.get(key)),
        previous_key=previous_key,
        previous_state=build_state(builds.get(previous_key)),
        fallback=spec.runtime.fallback,
        bridge=spec.runtime.bridge,
    )
    return decision


def _plan_pool(
    service, choice: PoolChoice, decision: PoolDecision, replicas: int, builds, deployments
) -> tuple[dict, PoolServing | None]:
    """One pool's status entry and what its Deployment serves (None: no Deployment)."""
    pool = choice.pool
    entry = {
        "name": pool.name, "vendor": pool.vendor, "product": pool.product, "architecture": pool.architecture,
        "nodes": pool.num_nodes, "runtime": choice.runtime.name, "engine": choice.engine, "choiceReason": choice.reason,
        "desiredReplicas": decision.num_replicas,
    }  # fmt: skip
    if decision.engine_build:
        entry.update(engineBuild=decision.engine_build, buildState=build_state(builds.get(decision.engine_build)))
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
        return entry, None
    # A compiled pool served paged (bridge, fallback) runs its paged companion.
    runtime = choice.runtime if decision.engine == choice.engine else choice.paged_runtime
    gpu_resource = "" if pool.vendor == "cpu" else (runtime.spec.gpu_resource or pool.gpu_resource)
    build_status = (builds.get(decision.engine_key) or {}).get("status") or {}
    digest, served_engine_digest = build_status.get("modelDigest", ""), build_status.get("engineDigest", "")
    serving = PoolServing(
        pool, runtime, decision.engine, decision.engine_key, replicas, gpu_resource, digest, served_engine_digest
    )
    return entry, serving


@dataclass(frozen=True)
class ServicePools:
    """Every chosen pool's status entry, and what they need: builds, children, the pools that serve, and what the
    service's endpoint reaches (status.routing's router part)."""

    entries: list[dict]
    engine_builds: list[dict]
    children: list[dict]
    serving: list[str]
    router_status: dict


def plan_pools(
    service: InferenceService,
    choices: list[PoolChoice],
    capacities: dict[str, int],
    replicas: dict[str, int],
    builds: Mapping[str, dict],
    deployments: Mapping[str, dict],
    view: ClusterView,
    settings: PlanSettings,
) -> ServicePools:
    """Each pool's serving decision with its replicas, its Deployment and the engine builds it needs, and the
    service's own children (the router, Service, PDB, NetworkPolicy), all owned by the InferenceService."""
    meta = service.meta
    wanted_builds: dict[str, EngineBuildSpec | dict] = {}
    entries, children, serving_pools = [], [], []
    for choice in choices:
        name = choice.pool.name
        decision = decide(service, choice, replicas[name], capacities[name], builds, deployments, settings)
        entry, serving = _plan_pool(service, choice, decision, replicas[name], builds, deployments)
        for key in decision.build_keys:
            wanted_builds.setdefault(key, _build_spec(service, choice, key, view, builds.get(key)))
        if serving is not None:
            children.append(m.deployment_for_pool(service, serving, settings))
            serving_pools.append(name)
        entries.append(entry)
    router = plan_router(service, serving_pools, settings)
    children += router.children
    children += [m.service_for(service, settings, router.component), m.pdb_for(service)]
    policy = network_policy_for(service, settings, has_router=bool(router.children))
    if policy is not None:
        children.append(policy)
    owner = m.owner_reference(API_VERSION, SERVICE_KIND, meta.name, meta.uid)
    for child in children:
        child["metadata"]["ownerReferences"] = [owner]

    engine_builds = []
    for key in sorted(wanted_builds):
        labels = ((builds.get(key) or {}).get("metadata") or {}).get("labels", {})
        refs = [k.removeprefix(REF_LABEL_PREFIX) for k in labels if k.startswith(REF_LABEL_PREFIX)]
        engine_builds.append(m.engine_build_for(meta.namespace, wanted_builds[key], refs + [meta.name]))
    return ServicePools(entries, engine_builds, children, serving_pools, router.status)

"""plan_reconcile: everything one InferenceService reconcile read (ServiceInputs) -> its whole desired state
(ServicePlan): builds, children, routing, autoscaling, status and Events, in one pure call."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

from inferfleet_operator.api.conditions import PlannedEvent
from inferfleet_operator.api.names import POOL_LABEL
from inferfleet_operator.api.types import DEFAULT_SETTINGS, InferenceService, PlanSettings, parse_service
from inferfleet_operator.plan import build_lifecycle, findings, host_paths
from inferfleet_operator.plan import manifests as m
from inferfleet_operator.plan.autoscaling import History, LoadReading, PoolLoad, Scaling, free_capacity, scale
from inferfleet_operator.plan.choice import Excluded, PoolChoice, choose_runtimes, placement_tier
from inferfleet_operator.plan.cluster import ClusterView, cluster_view, service_pool
from inferfleet_operator.plan.replicas import distribute, pool_capacity
from inferfleet_operator.plan.routing import RoutingPlan, plan_routing
from inferfleet_operator.plan.service_pools import build_state, decide, plan_pools
from inferfleet_operator.plan.service_status import StatusReport, build_status, pool_events

__all__ = ["ServiceInputs", "ServicePlan", "plan_reconcile", "plan_service"]


@dataclass(frozen=True)
class ServiceInputs:
    """Everything one reconcile of an InferenceService reads before it plans: plan_reconcile's one argument.

    service: the InferenceService object as read (metadata.uid/generation; .status for the previous
        conditions and autoscaling, so lastTransitionTime only moves on a flip, and the InferencePool it names).
    view: the cluster's pools and runtimes (cluster.cluster_view).
    now: the time of condition transitions and of the autoscaler's decision.
    builds: engine key -> EngineBuild object as read (status.state Pending|Building|Ready|Failed).
    children: kind -> this service's children as read (labelled for it). Deployments give ready replica
        counts, the engine each serves and the replicas the autoscaler starts from; every kind gives the
        stale children and the names taken by objects the service does not own.
    settings: the operator's planning settings.
    load: what this reconcile's scrape of the serving pods found (None: no scrape was due).
    scaling: the autoscaler's last decision (None: none yet); it stands while no scrape is due.
    is_routing_allowed: the operator runs with InferencePools on; is_pool_crd_served: the cluster serves their CRD.
    refused: (kind, name, pool) -> the API server's message, for writes it refused in earlier reconciles.
    claims: the namespace's PersistentVolumeClaim names (None: not watched, nothing is known).
    pods: the service's serving pods (findings.pod_view; None: not watched).
    profiles: pool -> the profile its pods measured, as one line (controller.reconcile_profiles; routed services).
    """

    service: dict
    view: ClusterView
    now: datetime
    builds: Mapping[str, dict] = field(default_factory=dict)
    children: Mapping[str, Sequence[dict]] = field(default_factory=dict)
    settings: PlanSettings = DEFAULT_SETTINGS
    load: LoadReading | None = None
    scaling: Scaling | None = None
    is_routing_allowed: bool = True
    is_pool_crd_served: bool = False
    refused: Mapping[tuple[str, str, str], str] = field(default_factory=dict)
    claims: frozenset[str] | None = None
    pods: Sequence[dict] | None = None
    profiles: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class ServicePlan:
    """Everything one reconcile of an InferenceService must make true.

    engine_builds: desired EngineBuild objects (full manifests), one per engine key some pool of this service
        needs now (the one being built and, during an envelope change, the one still serving). Apply them;
        never delete builds from here (GC is by reference, build_lifecycle.plan_gc).
    children: desired Deployments (one per serving pool), the Service, the PodDisruptionBudget and the
        NetworkPolicy, with ownerReferences to the InferenceService.
    not_owned: (kind, name) of the children whose name an object the service does not own holds: never written.
    stale: (kind, metadata) of the children the service owns and no longer plans: to delete.
    routing: the InferencePool to apply, or the one to delete, and the Warning to post.
    scaling: the autoscaler's decision (None: the service is not autoscaled); keep it for the next reconcile.
    rebuilds: engine key -> (rebuild annotation value, the pod that found the engine lost): builds to rebuild.
    refused: the refusals of earlier reconciles that are still about planned objects.
    status: the whole InferenceService .status, findings and refusals included. Deterministic: equal inputs
        give an equal dict, so a no-op resync can skip the status write by comparing with the stored status.
    events: Events worth a person's attention, only for changes against the previous status.
    report: the status and Events again once an apply's refusal changes (report.with_refusals).
    """

    engine_builds: list[dict]
    children: list[dict]
    not_owned: frozenset[tuple[str, str]]
    stale: list[tuple[str, dict]]
    routing: RoutingPlan
    scaling: Scaling | None
    rebuilds: dict[str, tuple[str, str]]
    refused: dict[tuple[str, str, str], str]
    status: dict
    events: list[PlannedEvent]
    report: StatusReport


def plan_service(
    service: dict,
    nodes: list[dict],
    runtimes: list[dict],
    builds: dict[str, dict],
    deployments: dict[str, dict],
    now: datetime,
    settings: PlanSettings = DEFAULT_SETTINGS,
) -> ServicePlan:
    """plan_reconcile for one service read on its own (tests, tools): every Node and InferenceRuntime object,
    its builds by engine key and its Deployments by name. Raises api.SpecError for a spec the CRD rules should
    have refused."""
    children = {"Deployment": list(deployments.values())}
    return plan_reconcile(ServiceInputs(service, cluster_view(nodes, runtimes), now, builds, children, settings))


def _autoscale(
    inputs: ServiceInputs,
    service: InferenceService,
    choices: list[PoolChoice],
    capacities: dict[str, int],
    replicas: dict[str, int],
    deployments: Mapping[str, dict],
) -> tuple[Scaling, bool]:
    """The autoscaler's decision and whether it is new. Between scrapes the last decision stands. Each pool
    starts from the replicas its Deployment asks for (without one: the last decision's, else the spec's), and
    may grow into the GPUs of its pool that other services' Deployments do not hold."""
    previous = inputs.scaling
    if inputs.load is None and previous is not None:
        return previous, False
    load = inputs.load or LoadReading()
    spec = service.spec
    pools = {p.name: p for p in inputs.view.pools}
    loads = []
    for choice in choices:
        name, capacity = choice.pool.name, capacities[choice.pool.name]
        decision = decide(service, choice, replicas[name], capacity, inputs.builds, deployments, inputs.settings)
        live = deployments.get(m.deployment_name(service.meta.name, name))
        if live is not None:
            current = int(live.get("spec", {}).get("replicas", decision.num_replicas))
        else:
            current = (previous.replicas if previous else {}).get(name, decision.num_replicas)
        is_building = bool(decision.engine_build) and build_state(inputs.builds.get(decision.engine_build)) not in (
            "Ready",
            "Failed",
        )
        pool = pools.get(name)
        if pool is not None and pool.vendor != "cpu":
            held = load.gpus_held_by_others.get(name, 0)
            capacity = free_capacity(sum(pool.node_gpus), held, spec.resources.gpus_per_replica, capacity)
        loads.append(PoolLoad(name, current, capacity, tuple(load.pods.get(name, ())), is_building))
    last_scale_time = (service.status.get("autoscaling") or {}).get("lastScaleTime")
    history = previous.history if previous else History()
    return scale(spec.autoscaling, loads, history, last_scale_time, inputs.now), True


def _findings(
    inputs: ServiceInputs, entries: list[dict], children: list[dict], not_owned: dict
) -> list[findings.Finding]:
    """The failures a user must act on, besides refused writes: children not owned, what the service's builds
    report (compile pods that cannot run, a deadline exceeded), missing claims, and what its pods report
    (unschedulable, model fetch failing)."""
    namespace = inputs.service["metadata"]["namespace"]
    found = list(not_owned.values()) + findings.build_findings(entries, inputs.builds)
    if inputs.claims is not None:
        deployments = [d for d in children if d["kind"] == "Deployment"]
        found += findings.missing_claims(deployments, inputs.claims, POOL_LABEL)
        found += findings.missing_cache_claim(entries, inputs.claims, inputs.settings.engine_cache_claim, namespace)
    if inputs.pods is not None:
        fields = findings.secret_fields(inputs.service.get("spec") or {})
        found += findings.pods_findings(inputs.pods, POOL_LABEL, fields)
    return found


def _against_live(
    inputs: ServiceInputs, service: InferenceService, children: list[dict]
) -> tuple[dict[tuple[str, str], findings.Finding], list[tuple[str, dict]]]:
    """-> (the planned children whose live namesake, labelled for this service, it does not own: never written;
    (kind, metadata) of the live children it owns and no longer plans: to delete). An object that merely
    carries the service's labels is someone else's."""
    meta = service.meta
    not_owned = {}
    for desired in children:
        kind, name = desired["kind"], desired["metadata"]["name"]
        live = next((c for c in inputs.children.get(kind, ()) if c["metadata"]["name"] == name), None)
        if live is not None and not m.is_owned_by(live, meta.uid):
            pool = desired["metadata"].get("labels", {}).get(POOL_LABEL, "")
            owner = f"InferenceService {meta.namespace}/{meta.name}"
            not_owned[(kind, name)] = findings.not_owned_finding(kind, name, owner, pool)
    planned = {(d["kind"], d["metadata"]["name"]) for d in children}
    stale = [
        (kind, child["metadata"])
        for kind, live in inputs.children.items()
        for child in live
        if (kind, child["metadata"]["name"]) not in planned
        and not child["metadata"].get("deletionTimestamp")
        and m.is_owned_by(child, meta.uid)
    ]
    return not_owned, stale


def plan_reconcile(inputs: ServiceInputs) -> ServicePlan:
    """The whole desired state of one InferenceService from what its reconcile read.

    Pools the service may use get a runtime each (choice), the replicas are spread over them (the spec's, or
    the autoscaler's from the scraped load), each pool gets its serving decision, Deployment and builds, the
    InferencePool selects the serving pools, and the status says all of it with the findings.
    Raises api.SpecError for a spec the CRD rules should have refused."""
    service = parse_service(inputs.service)
    spec, previous = service.spec, service.status
    deployments = {d["metadata"]["name"]: d for d in inputs.children.get("Deployment", ())}
    # A model whose host path no administrator allowed gets no pool: nothing mounts it, earlier pods are deleted.
    not_allowed = host_paths.service_refusal(spec.model.uri, inputs.settings.host_path_roots)
    usable, excluded = [], []
    for pool in inputs.view.pools if not_allowed is None else ():
        result = service_pool(pool, service) if pool.node_names else pool
        (excluded if isinstance(result, Excluded) else usable).append(result)
    choices, not_chosen = choose_runtimes(spec, usable, list(inputs.view.runtimes))
    excluded += not_chosen

    capacities = {
        ch.pool.name: pool_capacity(ch.pool, spec.resources.gpus_per_replica, spec.resources.cpu) for ch in choices
    }
    tiers = {ch.pool.name: placement_tier(ch) for ch in choices}
    overrides = {o.name: o.replicas for o in spec.pools}
    distribution = distribute(spec.replicas, capacities, overrides, tiers)
    scaling, is_new_scaling = None, False
    if spec.autoscaling is not None:  # the autoscaler starts from the spec's replicas and overrides them
        scaling, is_new_scaling = _autoscale(inputs, service, choices, capacities, distribution.replicas, deployments)
        distribution = distribute(spec.replicas, capacities, overrides | scaling.replicas, tiers)
    pools = plan_pools(
        service,
        choices,
        capacities,
        distribution.replicas,
        inputs.builds,
        deployments,
        inputs.view,
        inputs.settings,
    )

    previous_pool = (previous.get("routing") or {}).get("inferencePool") or ""
    routing = plan_routing(
        service, pools.serving, inputs.is_pool_crd_served, inputs.is_routing_allowed, inputs.settings, previous_pool
    )
    for entry in pools.entries:
        if entry["name"] in inputs.profiles:
            entry["profile"] = inputs.profiles[entry["name"]]
    endpoint = m.endpoint_for(service, inputs.settings)
    num_unplaced = distribution.num_unplaced if not_allowed is None else 0
    status = build_status(service, pools.entries, excluded, num_unplaced, endpoint, inputs.now, not_allowed)
    if scaling is not None:
        status["autoscaling"] = scaling.status()
    status["routing"] = pools.router_status | routing.status

    not_owned, stale = _against_live(inputs, service, pools.children)
    lost = findings.engine_lost_pods(inputs.pods or (), POOL_LABEL)
    rebuilds = build_lifecycle.rebuilds_for_lost_engines(pools.entries, lost, dict(inputs.builds)) if lost else {}
    # A refusal of an object the plan no longer has (the user changed the spec) is over.
    planned = {(d["kind"], d["metadata"]["name"]) for d in pools.engine_builds + pools.children}
    refused = {k: v for k, v in inputs.refused.items() if k[:2] in planned}
    found = _findings(inputs, pools.entries, pools.children, not_owned) + ([not_allowed] if not_allowed else [])
    report = StatusReport(
        planned=status,
        pool_events=tuple(pool_events(previous, status)),
        other_events=tuple(scaling.events() if is_new_scaling else ()),
        found=tuple(found),
        previous=previous,
        now=inputs.now,
        generation=service.meta.generation,
    )
    status, events = report.with_refusals(refused)
    return ServicePlan(
        engine_builds=pools.engine_builds,
        children=pools.children,
        not_owned=frozenset(not_owned),
        stale=stale,
        routing=routing,
        scaling=scaling,
        rebuilds=rebuilds,
        refused=refused,
        status=status,
        events=events,
        report=report,
    )

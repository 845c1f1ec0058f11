"""The two reconciles (InferenceService, EngineBuild): read indexed state, call the planners, apply."""

from __future__ import annotations

import collections
import dataclasses
import datetime
import logging
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from . import api, builds, findings, planner, reconcile_autoscaling, reconcile_routing
from . import conditions as c
from .conditions import warning
from .diff import is_subset, needs_apply, strip_object, with_applied_hash
from .kube import ApiError, Kube
from .metrics import Metrics
from .names import API_VERSION, BUILD_KIND, KINDS, POOL_LABEL, SERVICE_KIND, UNREFERENCED_ANNOTATION
from .service_status import pool_events
from .settings import OperatorConfig

# Index ids (kopf passes each index to handlers under this keyword) and what they are keyed by.
SERVICES = "service_index"  # (namespace, name) -> InferenceService
SERVICE_REFS = "service_refs_index"  # (namespace, engine build name) -> referencing service name
RUNTIMES = "runtime_index"  # name -> InferenceRuntime
NODES = "node_index"  # name -> Node (trimmed)
BUILDS = "build_index"  # namespace -> EngineBuild
DEPLOYMENTS = "deployment_index"  # (namespace, service) -> Deployment
SERVICE_OBJECTS = "k8s_service_index"  # (namespace, service) -> core Service
PDBS = "pdb_index"  # (namespace, service) -> PodDisruptionBudget
JOBS = "job_index"  # (namespace, engine build) -> Job
PODS = "pod_index"  # (namespace, engine build) -> Pod of a compile Job
SERVICE_PODS = "service_pod_index"  # (namespace, service) -> serving Pod (findings.pod_view)
CLAIMS = "claim_index"  # namespace -> PersistentVolumeClaim name

CHILD_INDEXES = {"Deployment": DEPLOYMENTS, "Service": SERVICE_OBJECTS, "PodDisruptionBudget": PDBS}

logger = logging.getLogger("inferfleet_operator")


def _rv(obj: Mapping) -> int:
    try:
        return int(obj.get("metadata", {}).get("resourceVersion") or 0)
    except ValueError:
        return 0


def _ref(obj: Mapping) -> str:
    meta = obj["metadata"]
    return f"{meta['namespace']}/{meta['name']}" if meta.get("namespace") else meta["name"]


def _same(left: Any, right: Any) -> bool:
    """Equal up to what the API server normalises (empty values, quantity spelling)."""
    return is_subset(left, right) and is_subset(right, left)


@dataclasses.dataclass
class Context:
    """What every reconcile needs; one per operator process, kept in kopf's memo."""

    kube: Kube
    config: OperatorConfig
    metrics: Metrics
    indices: Mapping[str, Mapping[Any, Iterable[dict]]]
    clock: Callable[[], datetime.datetime] = lambda: datetime.datetime.now(datetime.UTC)
    # Objects this process wrote, until the watch delivers them: a reconcile that runs before the
    # watch event arrives must not see the old object and write again.
    written: dict[tuple[str, str, str], dict] = dataclasses.field(default_factory=dict)
    # Events already posted, so a replayed plan never posts the same Event twice.
    posted: collections.OrderedDict = dataclasses.field(default_factory=collections.OrderedDict)
    # Writes the API server refused with a non-retryable error, per owner (kind, namespace, name):
    # {(kind, name, pool): the server's message}. Reported in the owner's status until a write succeeds.
    refused: dict[tuple[str, str, str], dict[tuple[str, str, str], str]] = dataclasses.field(default_factory=dict)
    # Nodes and runtimes classified once per change, shared by every service's plan.
    cluster_version: int = 0
    _view: tuple[int, planner.ClusterView] | None = None
    # Autoscaling and routing: the client that reads pods' /metrics, each autoscaled service's
    # recommendation history, and whether the InferencePool CRD was served when last asked.
    scraper: Any = None
    scaling: dict = dataclasses.field(default_factory=dict)
    pool_served: tuple[float, bool] | None = None

    def cluster_changed(self) -> None:
        self.cluster_version += 1

    def cluster_view(self) -> planner.ClusterView:
        if self._view is None or self._view[0] != self.cluster_version:
            view = planner.cluster_view(self.all_values(NODES), self.all_values(RUNTIMES))
            self._view = (self.cluster_version, view)
        return self._view[1]

    @property
    def plan_settings(self) -> api.PlanSettings:
        return self.config.plan_settings()

    def claims(self, namespace: str) -> frozenset[str] | None:
        """Names of the namespace's PersistentVolumeClaims (None: not watched, nothing is known)."""
        if CLAIMS not in self.indices:
            return None
        return frozenset(self.indices[CLAIMS].get(namespace, ()))

    def forget(self, kind: str, namespace: str, name: str) -> None:
        self.refused.pop((kind, namespace, name), None)

    def values(self, index: str, key: Any) -> list[dict]:
        return list(self.indices[index].get(key, ()))

    def all_values(self, index: str) -> list[dict]:
        return [obj for store in self.indices[index].values() for obj in store]

    def observed(self, kind: str, obj: Mapping, *, is_deleted: bool = False) -> None:
        """Called on every watch event: drops what the index now knows at least as well."""
        meta = obj.get("metadata", {})
        key = (kind, meta.get("namespace") or "", meta.get("name", ""))
        cached = self.written.get(key)
        if cached is not None and (is_deleted or _rv(obj) >= _rv(cached)):
            del self.written[key]

    def fresher(self, kind: str, indexed: dict | None, namespace: str, name: str) -> dict | None:
        cached = self.written.get((kind, namespace, name))
        if cached is None or (indexed is not None and _rv(indexed) >= _rv(cached)):
            return indexed
        return cached

    def remember(self, obj: dict) -> None:
        meta = obj["metadata"]
        self.written[(obj["kind"], meta.get("namespace") or "", meta["name"])] = strip_object(obj)

    async def apply(self, desired: dict, live: dict | None, *, force: bool = True) -> bool:
        """Applies `desired` unless the live object already matches; True when it wrote."""
        if not needs_apply(desired, live):
            return False
        result = await self.kube.apply(with_applied_hash(desired), force=force)
        self.remember(result)
        logger.info("%s %s %s", "Created" if live is None else "Updated", desired["kind"], _ref(desired))
        return True

    async def post_events(self, obj: dict, events: Iterable[Any], action: str) -> None:
        for event in events:
            key = (obj["metadata"].get("uid"), event.type, event.reason, event.message)
            if key in self.posted:
                continue
            self.posted[key] = None
            while len(self.posted) > 10_000:
                self.posted.popitem(last=False)
            try:
                await self.kube.post_event(obj, type=event.type, reason=event.reason, note=event.message, action=action)
            except ApiError as error:  # Events are best effort: never worth a failed reconcile
                logger.warning("Failed to post Event %s about %s %s: %s", event.reason, obj["kind"], _ref(obj), error)


# ------------------------------------------------------------------------- InferenceService


async def reconcile_service(ctx: Context, namespace: str, name: str) -> float | None:
    """Makes one InferenceService's builds, children and status match its plan."""
    indexed = next(iter(ctx.values(SERVICES, (namespace, name))), None)
    service = ctx.fresher(SERVICE_KIND, indexed, namespace, name)
    if service is None or service["metadata"].get("deletionTimestamp"):
        ctx.scaling.pop((namespace, name), None)  # its autoscaling history goes with it
        return None  # children go with their owner (ownerReferences); builds by reference GC
    builds_by_key = {b.get("spec", {}).get("engineKey", b["metadata"]["name"]): b for b in _builds(ctx, namespace)}
    deployments = {d["metadata"]["name"]: d for d in ctx.values(DEPLOYMENTS, (namespace, name))}
    try:
        plan = planner.plan_service_in(
            ctx.cluster_view(), service, builds_by_key, deployments, ctx.clock(), ctx.plan_settings
        )
        scaled = await reconcile_autoscaling.autoscale(ctx, service, plan.status, plan.capacities, ctx.clock())
        if scaled is not None:  # re-planned with the autoscaler's replicas per pool
            plan = planner.plan_service_in(
                ctx.cluster_view(), service, builds_by_key, deployments, ctx.clock(), ctx.plan_settings, scaled.replicas
            )
            plan.status["autoscaling"] = scaled.status
            plan.events += scaled.events
            plan.requeue_after = min(plan.requeue_after or float("inf"), ctx.config.autoscale_seconds)
        routed = await reconcile_routing.plan(ctx, service, plan.status)
    except api.SpecError as error:
        logger.warning("Refused InferenceService %s/%s: %s", namespace, name, error)
        await ctx.post_events(service, [warning("InvalidSpec", str(error))], "Plan")
        return None

    owner = (SERVICE_KIND, namespace, name)
    planned = {(d["kind"], d["metadata"]["name"]) for d in plan.engine_builds + plan.children}
    # A refusal of an object the plan no longer has (the user changed the spec) is over.
    refused = {k: v for k, v in ctx.refused.get(owner, {}).items() if k[:2] in planned}
    failures: list[ApiError] = []

    async def apply_child(desired: dict, live: dict | None, pool: str = "") -> int:
        key = (desired["kind"], desired["metadata"]["name"], pool)
        try:
            # Forced: drift repair. A child edited by hand (kubectl edit/scale) has those fields owned
            # by another manager, and only a forced apply takes them back.
            written = await ctx.apply(desired, live)
        except ApiError as error:
            if is_namespace_terminating(error):
                raise  # nothing more can be created there; the service goes with its namespace
            # One refused child must not hold back the others; the reconcile fails at the end.
            logger.error("Failed to apply %s %s/%s: %s", key[0], namespace, key[1], error)
            failures.append(error)
            if not error.is_retryable:  # the user must change something: say what in status
                refused[key] = error.message
            return 0
        refused.pop(key, None)
        return written

    num_changes = 0
    live_builds = {b["metadata"]["name"]: b for b in _builds(ctx, namespace)}
    for desired in plan.engine_builds:
        build_name = desired["metadata"]["name"]
        num_changes += await apply_child(
            desired, ctx.fresher(BUILD_KIND, live_builds.get(build_name), namespace, build_name)
        )

    # Status next, before the children: it is computed from what was read, not from what the
    # applies return, and it is what records this service's references to its builds (a build
    # reconcile that runs meanwhile must not see them unreferenced). Refused writes of earlier
    # reconciles are in it, so a retry that is refused alike writes no status.
    status, events = _with_findings(ctx, service, plan, refused, builds_by_key)
    if not _same(status, service.get("status") or {}):
        ctx.remember(await ctx.kube.apply_status(service, status))
        num_changes += 1
    desired_names: dict[str, set[str]] = {kind: set() for kind in CHILD_INDEXES}
    for desired in plan.children:
        kind, child_name = desired["kind"], desired["metadata"]["name"]
        desired_names.setdefault(kind, set()).add(child_name)
        live = _find(ctx.values(CHILD_INDEXES[kind], (namespace, name)), child_name) if kind in CHILD_INDEXES else None
        pool = desired["metadata"].get("labels", {}).get(POOL_LABEL, "")
        num_changes += await apply_child(desired, ctx.fresher(kind, live, namespace, child_name), pool)

    try:
        num_changes += await reconcile_routing.apply(ctx, service, routed)
    except ApiError as error:
        logger.error("Failed to apply InferencePool %s/%s: %s", namespace, name, error)
        failures.append(error)

    for kind, index in CHILD_INDEXES.items():
        for child in ctx.values(index, (namespace, name)):
            meta = child["metadata"]
            if meta["name"] in desired_names[kind] or meta.get("deletionTimestamp"):
                continue
            if await ctx.kube.delete(KINDS[kind].api_version, kind, namespace, meta["name"], uid=meta.get("uid")):
                logger.info("Deleted %s %s/%s (no longer planned)", kind, namespace, meta["name"])
                num_changes += 1

    if refused != ctx.refused.get(owner, {}):  # a write newly refused, or one that now went through
        if refused:
            ctx.refused[owner] = refused
        else:
            ctx.refused.pop(owner, None)
        written = ctx.fresher(SERVICE_KIND, indexed, namespace, name) or service
        status, events = _with_findings(ctx, service, plan, refused, builds_by_key)
        if not _same(status, written.get("status") or {}):
            ctx.remember(await ctx.kube.apply_status(service, status))
            num_changes += 1
    # Findings are posted whether or not anything was written: a pod can start failing while every
    # object stays as planned (posted Events are remembered, so each is posted once).
    await ctx.post_events(
        service, events if num_changes else [e for e in events if e.reason in findings.ORDER], "Reconcile"
    )
    if failures:
        raise failures[0]  # retried by the work queue after its error delay (a backoff)
    return plan.requeue_after


def _with_findings(
    ctx: Context,
    service: dict,
    plan: planner.ServicePlan,
    refused: Mapping[tuple[str, str, str], str],
    builds_by_key: Mapping[str, dict],
) -> tuple[dict, list]:
    """The plan's status and Events with the failures a user must act on: refused writes, missing
    claims, what the service's pods report (unschedulable, model fetch failing) and what its
    builds report (compile pods that cannot run, a deadline exceeded)."""
    namespace, name = service["metadata"]["namespace"], service["metadata"]["name"]
    found = [
        findings.apply_finding(kind, child, message, pool) for (kind, child, pool), message in sorted(refused.items())
    ]
    found += findings.build_findings(plan.status.get("pools") or [], builds_by_key)
    claims = ctx.claims(namespace)
    if claims is not None:
        deployments = [d for d in plan.children if d["kind"] == "Deployment"]
        found += findings.missing_claims(deployments, claims, POOL_LABEL)
        found += findings.missing_cache_claim(
            plan.status.get("pools") or [], claims, ctx.plan_settings.engine_cache_claim, namespace
        )
    if SERVICE_PODS in ctx.indices:
        found += findings.pods_findings(ctx.values(SERVICE_PODS, (namespace, name)), POOL_LABEL)
    if not found:
        return plan.status, plan.events
    previous = service.get("status") or {}
    status = findings.degraded_status(
        plan.status,
        found,
        c.by_type(previous.get("conditions")),
        ctx.clock(),
        int(service["metadata"].get("generation") or 0),
    )
    # The planner's Events, against the status with the findings; the Degraded flip is said by the
    # findings' own Warnings (one per reason).
    events = [e for e in pool_events(previous, status) if not (e.type == "Warning" and e.reason in findings.ORDER)]
    events += [warning(reason, message) for reason, message in findings.grouped(found)]
    return status, events


def is_namespace_terminating(error: BaseException) -> bool:
    return getattr(error, "status", None) == 403 and "being terminated" in str(error)


def _builds(ctx: Context, namespace: str) -> list[dict]:
    return ctx.values(BUILDS, namespace)


def _find(objects: Iterable[dict], name: str) -> dict | None:
    return next((o for o in objects if o["metadata"]["name"] == name), None)


# ------------------------------------------------------------------------- EngineBuild


async def reconcile_build(ctx: Context, namespace: str, name: str) -> float | None:
    """Drives one EngineBuild: a Job per attempt, its status, and deletion once unreferenced."""
    indexed = _find(_builds(ctx, namespace), name)
    build = ctx.fresher(BUILD_KIND, indexed, namespace, name)
    if build is None or build["metadata"].get("deletionTimestamp"):
        return None
    now = ctx.clock()
    jobs = ctx.values(JOBS, (namespace, name))
    owner = (BUILD_KIND, namespace, name)
    refused = ctx.refused.get(owner, {}).get(("Job", "", ""))

    def plan_with(apply_error: str | None) -> builds.BuildPlan:
        return builds.plan_build(
            build,
            jobs,
            now,
            ctx.plan_settings,
            ctx.values(PODS, (namespace, name)),
            claims=ctx.claims(namespace),
            apply_error=apply_error,
        )

    plan = plan_with(refused)
    num_changes = 0
    failure: ApiError | None = None
    if plan.job is not None:
        job_name = plan.job["metadata"]["name"]
        live_job = ctx.fresher("Job", _find(jobs, job_name), namespace, job_name)
        if live_job is None:
            # Not forced, and never re-applied: a Job's template is immutable, and one attempt
            # must map to exactly one Job even across operator restarts.
            try:
                num_changes += await ctx.apply(plan.job, None, force=False)
                now_refused = None
            except ApiError as error:
                if is_namespace_terminating(error) or error.is_retryable:
                    raise
                logger.error("Failed to create Job %s/%s: %s", namespace, job_name, error)
                failure, now_refused = error, error.message
            if now_refused != refused:  # newly refused, or created after a refusal: say so
                if now_refused:
                    ctx.refused[owner] = {("Job", "", ""): now_refused}
                else:
                    ctx.forget(*owner)
                plan = plan_with(now_refused)

    if not _same(plan.status, build.get("status") or {}):
        ctx.remember(await ctx.kube.apply_status(build, plan.status))
        num_changes += 1
    if num_changes or failure is not None:
        await ctx.post_events(build, plan.events, "Build")
    if failure is not None:
        raise failure  # retried by the work queue after its error delay (a backoff)

    services = [s for s in ctx.all_values(SERVICES) if s["metadata"].get("namespace") == namespace]
    gc = builds.plan_gc(build, services, now, ctx.plan_settings)
    if gc.delete:
        if await ctx.kube.delete(API_VERSION, BUILD_KIND, namespace, name, uid=build["metadata"].get("uid")):
            logger.info(
                "Deleted EngineBuild %s/%s (unreferenced for longer than %ss)",
                namespace,
                name,
                ctx.config.build_retention_seconds,
            )
        return None
    annotations = build["metadata"].get("annotations") or {}
    if annotations.get(UNREFERENCED_ANNOTATION) != gc.unreferenced_since:
        result = await ctx.kube.patch_metadata(build, annotations={UNREFERENCED_ANNOTATION: gc.unreferenced_since})
        ctx.remember(result)
    delays = [d for d in (plan.requeue_after, gc.requeue_after) if d is not None]
    return min(delays) if delays else None

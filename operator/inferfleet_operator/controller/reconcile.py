"""The two reconciles (InferenceService, EngineBuild): read indexed state, call the planners, apply."""

from __future__ import annotations

import asyncio
import dataclasses
import datetime
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from inferfleet_operator.api import conditions as c
from inferfleet_operator.api import types as api
from inferfleet_operator.api.conditions import warning
from inferfleet_operator.api.names import (
    API_VERSION,
    BUILD_KIND,
    KINDS,
    POOL_LABEL,
    REBUILD_ANNOTATION,
    SERVICE_KIND,
    UNREFERENCED_ANNOTATION,
)
from inferfleet_operator.controller import reconcile_autoscaling, reconcile_profiles, reconcile_routing
from inferfleet_operator.controller.cache import (
    BUILDS,
    CHILD_INDEXES,
    JOBS,
    PODS,
    SERVICE_PODS,
    SERVICES,
    ReadCache,
)
from inferfleet_operator.controller.metrics import Metrics
from inferfleet_operator.controller.recorder import EventRecorder, object_ref
from inferfleet_operator.controller.settings import OperatorConfig
from inferfleet_operator.kube.client import ApiError, Kube
from inferfleet_operator.kube.diff import is_subset, needs_apply, with_applied_hash
from inferfleet_operator.plan import build_jobs, build_lifecycle, builds, findings, host_paths, planner
from inferfleet_operator.plan import manifests as m

logger = logging.getLogger("inferfleet_operator")


def _same(left: Any, right: Any) -> bool:
    """Equal up to what the API server normalises (empty values, quantity spelling)."""
    return is_subset(left, right) and is_subset(right, left)


@dataclasses.dataclass
class Context:
    """What every reconcile needs; one per operator process, kept in kopf's memo. Reads go through `cache`,
    Events through `events`, writes through `apply` (or `kube`, remembered in the cache)."""

    kube: Kube
    config: OperatorConfig
    metrics: Metrics
    cache: ReadCache
    clock: Callable[[], datetime.datetime] = lambda: datetime.datetime.now(datetime.UTC)
    events: EventRecorder = dataclasses.field(init=False)
    # Autoscaling and routing: the client that reads pods' /metrics, each autoscaled service's last
    # decision with its recommendation history (reconcile_autoscaling.ScalingState), and whether the
    # InferencePool CRD was served when last asked.
    scraper: Any = None
    scaling: dict = dataclasses.field(default_factory=dict)
    pool_served: tuple[float, bool] | None = None
    # Routed services' pool profiles as their pods answered /profile: (namespace, service) -> pod -> line or None.
    profiles: dict = dataclasses.field(default_factory=dict)
    # Under --peering: leadership.Leadership, asked before each reconcile (None: always active).
    leadership: Any = None

    def __post_init__(self) -> None:
        self.events = EventRecorder(self.kube)

    @property
    def plan_settings(self) -> api.PlanSettings:
        return self.config.plan_settings()

    async def apply(self, desired: dict, live: dict | None, *, force: bool = True) -> bool:
        """Applies `desired` unless the live object already matches; True when it wrote."""
        if not needs_apply(desired, live):
            return False
        result = await self.kube.apply(with_applied_hash(desired), force=force)
        self.cache.remember(result)
        logger.info("%s %s %s", "Created" if live is None else "Updated", desired["kind"], object_ref(desired))
        return True


# ------------------------------------------------------------------------- InferenceService


async def reconcile_service(ctx: Context, namespace: str, name: str) -> float | None:
    """Makes one InferenceService's builds, children and status match its plan: reads everything the plan
    needs, plans once (planner.plan_reconcile), applies the plan."""
    cache = ctx.cache
    indexed = next(iter(cache.values(SERVICES, (namespace, name))), None)
    service = cache.fresher(SERVICE_KIND, indexed, namespace, name)
    if service is None or service["metadata"].get("deletionTimestamp"):
        ctx.scaling.pop((namespace, name), None)  # its autoscaling history goes with it
        return None  # children go with their owner (ownerReferences); builds by reference GC
    try:
        inputs = await _read_service_inputs(ctx, service)
        plan = planner.plan_reconcile(inputs)
    except api.SpecError as error:
        logger.warning("Refused InferenceService %s/%s: %s", namespace, name, error)
        await ctx.events.post(service, [warning("InvalidSpec", str(error))], "Plan")
        return None
    if plan.scaling is None:
        ctx.scaling.pop((namespace, name), None)
    elif inputs.load is not None:  # decided anew from this reconcile's scrape
        ctx.scaling[(namespace, name)] = reconcile_autoscaling.ScalingState(time.monotonic(), plan.scaling)
    await _apply_service(ctx, service, indexed, inputs, plan)
    return ctx.config.autoscale_seconds if plan.scaling is not None else None


async def _read_service_inputs(ctx: Context, service: dict) -> planner.ServiceInputs:
    """Everything the plan of `service` reads: the cluster view, its builds and children, the refusals of earlier
    writes, claims and serving pods, the pods' load when a scrape is due, and whether the InferencePool CRD is
    served. Raises api.SpecError for a spec the planner refuses (before any pod is listed)."""
    cache = ctx.cache
    meta = service["metadata"]
    namespace, name = meta["namespace"], meta["name"]
    spec = api.parse_service(service).spec
    state = ctx.scaling.get((namespace, name)) if spec.autoscaling is not None else None
    load = None
    if spec.autoscaling is not None and reconcile_autoscaling.is_due(ctx, state):
        load = await reconcile_autoscaling.read_load(ctx, namespace, name)
    # Discovery is asked only where its answer matters: routing not Disabled, or a pool of an earlier plan to delete.
    is_allowed = ctx.config.inference_pools != "disabled"
    previous_pool = ((service.get("status") or {}).get("routing") or {}).get("inferencePool")
    is_served = (
        is_allowed
        and (spec.routing.inference_pool != "Disabled" or bool(previous_pool))
        and await reconcile_routing.is_pool_served(ctx)
    )
    pods = cache.values(SERVICE_PODS, (namespace, name)) if SERVICE_PODS in cache.indices else None
    profiles = {}
    if pods and spec.routing.mode == "Router" and ctx.plan_settings.router_image and ctx.scraper is not None:
        profiles = await reconcile_profiles.read_profiles(ctx, namespace, name, pods)
    return planner.ServiceInputs(
        service=service,
        view=cache.cluster_view(),
        now=ctx.clock(),
        builds={b.get("spec", {}).get("engineKey", b["metadata"]["name"]): b for b in _builds(ctx, namespace)},
        children={kind: cache.values(index, (namespace, name)) for kind, index in CHILD_INDEXES.items()},
        settings=ctx.plan_settings,
        load=load,
        scaling=state.last if state is not None else None,
        is_routing_allowed=is_allowed,
        is_pool_crd_served=is_served,
        refused=cache.refused.get((SERVICE_KIND, namespace, name), {}),
        claims=cache.claims(namespace),
        pods=pods,
        profiles=profiles,
    )


@dataclasses.dataclass
class _ServiceWrites:
    """The writes of one service's reconcile: each counts what it changed, and a refused one is recorded (in
    `refused`, for the status, and in `failures`, raised once every write has run) without holding back the others."""

    ctx: Context
    service: dict
    refused: dict
    failures: list[ApiError] = dataclasses.field(default_factory=list)

    @property
    def namespace(self) -> str:
        return self.service["metadata"]["namespace"]

    async def apply_child(self, desired: dict, live: dict | None, pool: str = "") -> int:
        key = (desired["kind"], desired["metadata"]["name"], pool)
        try:
            # Forced: drift repair. A child edited by hand (kubectl edit/scale) has those fields owned
            # by another manager, and only a forced apply takes them back.
            written = await self.ctx.apply(desired, live)
        except ApiError as error:
            if is_namespace_terminating(error):
                raise  # nothing more can be created there; the service goes with its namespace
            # One refused child must not hold back the others; the reconcile fails at the end.
            logger.error("Failed to apply %s %s/%s: %s", key[0], self.namespace, key[1], error)
            self.failures.append(error)
            if not error.is_retryable:  # the user must change something: say what in status
                self.refused[key] = error.message
            return 0
        self.refused.pop(key, None)
        return written

    async def write_status(self, status: dict, is_changed: bool) -> int:
        if not is_changed:
            return 0
        self.ctx.cache.remember(await self.ctx.kube.apply_status(self.service, status))
        return 1

    async def apply_routing(self, routing) -> int:
        try:
            return await reconcile_routing.apply(self.ctx, self.service, routing)
        except ApiError as error:
            logger.error(
                "Failed to apply InferencePool %s/%s: %s", self.namespace, self.service["metadata"]["name"], error
            )
            self.failures.append(error)
            return 0

    async def delete_child(self, kind: str, meta: dict) -> int:
        uid = meta.get("uid")
        if await self.ctx.kube.delete(KINDS[kind].api_version, kind, self.namespace, meta["name"], uid=uid):
            logger.info("Deleted %s %s/%s (no longer planned)", kind, self.namespace, meta["name"])
            return 1
        return 0


async def _apply_service(
    ctx: Context, service: dict, indexed: dict | None, inputs: planner.ServiceInputs, plan: planner.ServicePlan
) -> None:
    """Writes what the plan says: rebuild requests, builds, then status, children and the InferencePool side by
    side, then deletes stale children; a write the API server refuses goes into the status. Raises the first
    failed write's error once every write has run (the work queue retries)."""
    cache = ctx.cache
    namespace, name = service["metadata"]["namespace"], service["metadata"]["name"]
    await _request_rebuilds(ctx, service, plan.rebuilds, inputs.builds)
    owner = (SERVICE_KIND, namespace, name)
    writes = _ServiceWrites(ctx, service, refused=dict(plan.refused))

    num_changes = 0
    live_builds = {b["metadata"]["name"]: b for b in _builds(ctx, namespace)}
    for desired in plan.engine_builds:
        build_name = desired["metadata"]["name"]
        num_changes += await writes.apply_child(
            desired, cache.fresher(BUILD_KIND, live_builds.get(build_name), namespace, build_name)
        )

    # The status write, the children's applies and the InferencePool's go out side by side, after the
    # builds: the status is computed from what was read, not from what the applies return, and it is
    # what records this service's references to its builds (a build reconcile that runs meanwhile must
    # not see them unreferenced), so it may not go before them, and nothing orders it against the
    # children. One after the other, a first rollout held its work-queue slot for one round trip per
    # write (4–5 in a row). Refused writes of earlier reconciles are in the status, so a retry that is
    # refused alike writes no status.
    status, events = plan.status, plan.events
    is_changed = not _same(status, service.get("status") or {})
    # The Events go out beside the writes: they are a person's record, never an input of a write, and
    # posting them after the writes held the reconcile's slot one more round trip per Event (at 200
    # nodes × 100 services, Events were two fifths of the operator's requests). A write that fails is
    # retried with the same Events, which are not posted again.
    posting = asyncio.ensure_future(ctx.events.post(service, _to_post(events, num_changes + is_changed), "Reconcile"))
    try:
        side_by_side = [writes.write_status(status, is_changed), writes.apply_routing(plan.routing)]
        for desired in plan.children:
            kind, child_name = desired["kind"], desired["metadata"]["name"]
            if (kind, child_name) in plan.not_owned:
                continue
            live = _find(inputs.children.get(kind, ()), child_name)
            pool = desired["metadata"].get("labels", {}).get(POOL_LABEL, "")
            side_by_side.append(writes.apply_child(desired, cache.fresher(kind, live, namespace, child_name), pool))
        num_changes += await _all(side_by_side)
        # Children no longer planned are deleted once the planned ones are applied.
        num_changes += await _all([writes.delete_child(kind, meta) for kind, meta in plan.stale])

        refused = writes.refused
        if refused != cache.refused.get(owner, {}):  # a write newly refused, or one that now went through
            if refused:
                cache.refused[owner] = refused
            else:
                cache.refused.pop(owner, None)
            written = cache.fresher(SERVICE_KIND, indexed, namespace, name) or service
            status, events = plan.report.with_refusals(refused)
            if not _same(status, written.get("status") or {}):
                cache.remember(await ctx.kube.apply_status(service, status))
                num_changes += 1
    finally:
        await posting
    # What a refused write added (posted Events are remembered, so none goes out twice).
    await ctx.events.post(service, _to_post(events, num_changes), "Reconcile")
    if writes.failures:
        raise writes.failures[0]  # retried by the work queue after its error delay (a backoff)


async def _request_rebuilds(
    ctx: Context, service: dict, rebuilds: Mapping[str, tuple[str, str]], builds_by_key: Mapping[str, dict]
) -> None:
    """Marks the builds whose engine this service's pods found lost (exit code 3): the build reconcile then
    runs a new attempt, and meanwhile the pool is served as while any build runs (bridge or fallback)."""
    namespace = service["metadata"]["namespace"]
    for key, (job, pod) in sorted(rebuilds.items()):
        build = builds_by_key[key]
        ctx.cache.remember(await ctx.kube.patch_metadata(build, annotations={REBUILD_ANNOTATION: job}))
        logger.warning("Requested a rebuild of EngineBuild %s/%s: pod %s found the engine of Job %s lost",
                       namespace, key, pod, job)  # fmt: skip
        note = f"Pod {pod} found the engine of EngineBuild {key} (Job {job}) lost or damaged; rebuilding it"
        await ctx.events.post(service, [warning(c.REASON_ENGINE_LOST, note)], "Reconcile")


async def _all(writes: list) -> int:
    """Runs the writes side by side and sums what they wrote. Every write finishes before the first
    exception (if any) is raised, so none is left running when the reconcile ends."""
    results = await asyncio.gather(*writes, return_exceptions=True)
    for result in results:
        if isinstance(result, BaseException):
            raise result
    return sum(results)


def _to_post(events: list, num_changes: int) -> list:
    """Findings are posted whether or not anything was written: a pod can start failing while every
    object stays as planned. The plan's other Events tell of a change, so only when one was written."""
    return events if num_changes else [e for e in events if e.reason in findings.ORDER]


def is_namespace_terminating(error: BaseException) -> bool:
    return getattr(error, "status", None) == 403 and "being terminated" in str(error)


def _builds(ctx: Context, namespace: str) -> list[dict]:
    return ctx.cache.values(BUILDS, namespace)


def _find(objects: Iterable[dict], name: str) -> dict | None:
    return next((o for o in objects if o["metadata"]["name"] == name), None)


# ------------------------------------------------------------------------- EngineBuild


async def _prune_engine(ctx: Context, build: dict) -> None:
    """Before a garbage-collected build goes, a Job removes its engine directory (--engine-gc delete). Only a
    build that finished (Ready) has one, at <key>/<modelDigest>; a legacy build's <key> is left to an
    administrator (content-addressed engines of the same key may live inside it)."""
    status = build.get("status") or {}
    digest = status.get("modelDigest") or ""
    if ctx.config.engine_gc != "delete" or status.get("state") != "Ready" or not digest:
        return
    meta = build["metadata"]
    job = build_jobs.prune_job_for(meta["namespace"], meta["name"], digest, build["spec"]["image"], ctx.plan_settings)
    try:
        await ctx.apply(job, None, force=False)
    except ApiError as error:
        if error.status != 409:  # 409: the Job exists already (an earlier GC of this key, within its TTL)
            raise


async def reconcile_build(ctx: Context, namespace: str, name: str) -> float | None:
    """Drives one EngineBuild: a Job per attempt, its status, and deletion once unreferenced."""
    cache = ctx.cache
    indexed = _find(_builds(ctx, namespace), name)
    build = cache.fresher(BUILD_KIND, indexed, namespace, name)
    if build is None or build["metadata"].get("deletionTimestamp"):
        return None
    now = ctx.clock()
    jobs = cache.values(JOBS, (namespace, name))
    owner = (BUILD_KIND, namespace, name)
    refused = cache.refused.get(owner, {}).get(("Job", "", ""))

    def plan_with(apply_error: str | None) -> builds.BuildPlan:
        return builds.plan_build(
            build,
            jobs,
            now,
            ctx.plan_settings,
            cache.values(PODS, (namespace, name)),
            claims=cache.claims(namespace),
            apply_error=apply_error,
        )

    plan = plan_with(refused)
    # A compile Job mounts a file:// model's host folder: only under a root the administrator allowed (an
    # EngineBuild can be made by hand, without the service that would have been refused).
    why = host_paths.refusal(str((build.get("spec") or {}).get("modelUri") or ""), ctx.plan_settings.host_path_roots)
    if plan.job is not None and why is not None:
        generation = int(build["metadata"].get("generation") or 0)
        plan = host_paths.refused_build(plan, why, build.get("status") or {}, now, generation)
    num_changes = 0
    failure: ApiError | None = None
    if plan.job is not None:
        job_name = plan.job["metadata"]["name"]
        live_job = cache.fresher("Job", _find(jobs, job_name), namespace, job_name)
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
                    cache.refused[owner] = {("Job", "", ""): now_refused}
                else:
                    cache.forget(*owner)
                plan = plan_with(now_refused)

    if not _same(plan.status, build.get("status") or {}):
        cache.remember(await ctx.kube.apply_status(build, plan.status))
        num_changes += 1
    if num_changes or failure is not None:
        await ctx.events.post(build, plan.events, "Build")
    if failure is not None:
        raise failure  # retried by the work queue after its error delay (a backoff)

    services = [s for s in cache.all_values(SERVICES) if s["metadata"].get("namespace") == namespace]
    gc = build_lifecycle.plan_gc(build, services, now, ctx.plan_settings)
    if gc.delete and not m.is_managed(build):
        return None  # an EngineBuild made by hand (without the operator's label) is its maker's to delete
    if gc.delete:
        await _prune_engine(ctx, build)
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
        cache.remember(result)
    delays = [d for d in (plan.requeue_after, gc.requeue_after) if d is not None]
    return min(delays) if delays else None

"""kopf handlers: indexes of everything the planners read, triggers into one work queue, settings.

The handlers are module-level functions, and `register` attaches them to the kopf.OperatorRegistry that
main.py builds for the process. kopf's decorators used bare at module level would register into kopf's
process-wide default registry at import time: global state, and fixed before the flags are parsed, while
one registration depends on them (whether the InferencePool CRD is watched, --inference-pools). Namespaces
are kopf.run's arguments and the server-side label selectors are settings (apply_settings), so neither
depends on how the handlers are registered.
What a handler needs at run time (config, metrics, the reconcile context, the work queue) is in kopf's memo:
main.py puts config and metrics there, and startup adds the rest.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Mapping
from typing import Any

import httpx
import kopf

from inferfleet_operator.api.names import (
    BUILD_KIND,
    BUILD_LABEL,
    CHILD_KINDS,
    GROUP,
    KINDS,
    KOPF_FINALIZER,
    MANAGED_SELECTOR,
    MANAGER,
    POOL_CRD,
    RUNTIME_KIND,
    SERVICE_KIND,
    SERVICE_LABEL,
)
from inferfleet_operator.controller import reconcile, reconcile_routing
from inferfleet_operator.controller.cache import (
    BUILDS,
    CHILD_INDEXES,
    CLAIMS,
    JOBS,
    NODES,
    PODS,
    RUNTIMES,
    SERVICE_PODS,
    SERVICE_REFS,
    SERVICES,
    ReadCache,
)
from inferfleet_operator.controller.leadership import Leadership
from inferfleet_operator.controller.metrics import Metrics
from inferfleet_operator.controller.reconcile import Context
from inferfleet_operator.controller.settings import OperatorConfig
from inferfleet_operator.controller.workqueue import WorkQueue
from inferfleet_operator.kube.client import Kube
from inferfleet_operator.kube.credentials import Credentials, CredentialsError
from inferfleet_operator.kube.diff import strip_object
from inferfleet_operator.plan import findings

logger = logging.getLogger("inferfleet_operator")


def _resource(kind: str) -> tuple[str, str]:
    """(apiVersion, plural): how kopf names the resource of `kind`."""
    return KINDS[kind].api_version, KINDS[kind].plural


def node_view(body: Mapping[str, Any]) -> dict:
    """What the planner reads from a Node: labels, taints, schedulability, capacity, readiness.

    Heartbeats, images and timestamps are left out, so two views differ only when pools may."""
    meta, status = body.get("metadata", {}), body.get("status", {})
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {
            "name": meta.get("name"),
            "labels": dict(meta.get("labels") or {}),
            "annotations": dict(meta.get("annotations") or {}),
        },
        "spec": {k: v for k, v in body.get("spec", {}).items() if k in ("unschedulable", "taints")},
        "status": {
            "capacity": dict(status.get("capacity") or {}),
            "allocatable": dict(status.get("allocatable") or {}),
            "conditions": [{"type": c.get("type"), "status": c.get("status")} for c in status.get("conditions", [])],
        },
    }


class NoDiffBase(kopf.AnnotationsDiffBaseStorage):
    """kopf's diff base without the copy: kopf builds one on every watch event of every watched kind
    (a deep copy of the object) for on.create/on.update/on.field handlers, and the operator has none
    (its handlers index and enqueue). Building it was about a fifth of the operator's event-loop time
    in the scale benchmark (e2e/bench/scale.py, 200 nodes × 100 services)."""

    def build(self, *, body: kopf.Body, extra_fields: Any = None) -> Any:
        return {}


def _plain(body: kopf.Body) -> dict:
    return strip_object(dict(body))


def apply_settings(settings: kopf.OperatorSettings, config: OperatorConfig) -> None:
    """Every kopf setting of the operator, in one place (called by the startup handler)."""
    settings.posting.level = logging.WARNING  # kopf posts only its own warnings and errors
    settings.posting.reporting_component = MANAGER
    settings.posting.reporting_instance = config.instance
    settings.peering.standalone = config.peering is None
    if config.peering:
        settings.peering.name = config.peering
        settings.peering.mandatory = True
        settings.peering.clusterwide = config.is_clusterwide
        # kopf pauses every peer that ties with another for the top priority, so replicas of one
        # Deployment (same flags) draw distinct priorities unless one is given.
        settings.peering.priority = (
            config.peering_priority
            if config.peering_priority is not None
            else random.SystemRandom().randint(1, 1_000_000)
        )
    # Server-side label selectors: the operator only ever sees its own children, Jobs and Job pods.
    for kind in CHILD_KINDS:
        settings.watching.label_selectors[_resource(kind)] = MANAGED_SELECTOR
    settings.watching.label_selectors[_resource("Job")] = BUILD_LABEL
    # One pod watch for compile and serving pods: both carry the managed-by label.
    settings.watching.label_selectors[_resource("Pod")] = MANAGED_SELECTOR
    settings.watching.server_timeout = 300
    settings.watching.client_timeout = 330
    settings.watching.reconnect_backoff = 1.0
    # kopf bookkeeping lives in annotations under our own prefix; status stays ours alone.
    settings.persistence.finalizer = KOPF_FINALIZER
    settings.persistence.progress_storage = kopf.AnnotationsProgressStorage(prefix=GROUP)
    settings.persistence.diffbase_storage = NoDiffBase(prefix=GROUP, key="last-handled-configuration")
    # kopf's per-object workers only hand events to our work queue; each lingers this long after its object's last
    # event, holding that event's body. kopf's default (5 s), not longer: lingering 30 s took the operator's peak RSS
    # at 1,000 nodes x 500 services from 155 to 221 MB (e2e/bench/scale.py; 1 s: 140 MB, but more CPU respawning).
    settings.queueing.idle_timeout = 5.0
    settings.networking.error_backoffs = config.error_delays
    settings.execution.max_workers = 2  # kopf runs sync callables in threads; ours are all async


def register(registry: kopf.OperatorRegistry, config: OperatorConfig) -> None:
    """Attaches every handler below to `registry`."""
    on: dict[str, Any] = {"registry": registry}
    kopf.on.startup(**on)(startup)
    kopf.on.login(**on)(login)
    kopf.on.cleanup(**on)(cleanup)

    built, owned = {BUILD_LABEL: kopf.PRESENT}, {SERVICE_LABEL: kopf.PRESENT}
    kopf.index(*_resource(SERVICE_KIND), id=SERVICES, **on)(service_index)
    kopf.index(*_resource(SERVICE_KIND), id=SERVICE_REFS, **on)(service_refs_index)
    kopf.index(*_resource(RUNTIME_KIND), id=RUNTIMES, **on)(runtime_index)
    kopf.index(*_resource(BUILD_KIND), id=BUILDS, **on)(build_index)
    kopf.index(*_resource("Node"), id=NODES, **on)(node_index)
    for kind in CHILD_KINDS:
        kopf.index(*_resource(kind), id=CHILD_INDEXES[kind], labels=owned, **on)(child_index)
    kopf.index(*_resource("Job"), id=JOBS, labels=built, **on)(job_index)
    kopf.index(*_resource("Pod"), id=PODS, labels=built, **on)(pod_index)
    kopf.index(*_resource("Pod"), id=SERVICE_PODS, labels=owned, **on)(service_pod_index)
    kopf.index(*_resource("PersistentVolumeClaim"), id=CLAIMS, **on)(claim_index)

    kopf.on.event(*_resource(SERVICE_KIND), **on)(service_event)
    kopf.on.event(*_resource(BUILD_KIND), **on)(build_event)
    for kind in CHILD_KINDS:
        kopf.on.event(*_resource(kind), id=f"{KINDS[kind].plural}_event", labels=owned, **on)(child_event)
    kopf.on.event(*_resource("Job"), labels=built, **on)(job_event)
    kopf.on.event(*_resource("Pod"), labels=built, **on)(pod_event)
    kopf.on.event(*_resource("Pod"), labels=owned, **on)(service_pod_event)
    kopf.on.event(*_resource("PersistentVolumeClaim"), **on)(claim_event)
    kopf.on.event(*_resource("Node"), **on)(node_event)
    kopf.on.event(*_resource(RUNTIME_KIND), **on)(runtime_event)
    if config.inference_pools != "disabled":
        is_pool_crd = {"when": lambda name, **_: name == POOL_CRD}
        kopf.on.event("apiextensions.k8s.io", "v1", "customresourcedefinitions", **is_pool_crd, **on)(pool_crd_event)

    # The level-triggered safety net (a reconcile of every object at least every --resync-seconds) is
    # the work queue's own requeue (_work), not kopf.timer: kopf puts a finalizer on every object a
    # timer runs for, one more write per object on create and on delete, and deletions that wait for
    # a running operator.


# ------------------------------------------------------------------ settings and lifecycle


async def startup(settings: kopf.OperatorSettings, memo: kopf.Memo, **kwargs: Any) -> None:
    config, metrics = memo.config, memo.metrics
    apply_settings(settings, config)
    try:
        credentials = Credentials.load()
    except CredentialsError as exc:
        raise kopf.PermanentError(str(exc)) from exc
    kube = Kube.connect(credentials, instance=config.instance, on_request=metrics.count_request)
    # kopf passes every index under its id; all of ours end in "_index".
    indices = {k: v for k, v in kwargs.items() if k.endswith("_index")}
    ctx = Context(
        kube=kube,
        config=config,
        metrics=metrics,
        cache=ReadCache(indices),
        scraper=httpx.AsyncClient(timeout=config.scrape_timeout_seconds),
        leadership=Leadership(kube, config, settings.peering.priority) if config.peering else None,
    )
    queue = WorkQueue(
        lambda key: _work(ctx, key),
        concurrency=config.concurrency,
        debounce=config.debounce_seconds,
        error_delays=config.error_delays,
        on_error=lambda key, error: _failed(metrics, key, error),
    )
    metrics.watch_builds(lambda: (b.get("status", {}).get("state", "Pending") for b in ctx.cache.all_values(BUILDS)))
    metrics.watch_degraded(lambda: ctx.cache.all_values(SERVICES))
    memo.ctx, memo.queue, memo.node_signatures, memo.ready_replicas = ctx, queue, {}, {}
    memo.pod_findings, memo.child_contents = {}, {}
    queue.start()
    logger.info(
        "Started operator %s for %s",
        config.instance,
        "all namespaces" if config.is_clusterwide else ", ".join(config.namespaces),
    )


async def login(**_: Any) -> kopf.AiohttpSession:
    # The write path's credentials (credentials.py), so kopf's watches authenticate the same way.
    credentials = Credentials.load()
    logger.info("Logged in to %s for watches (credentials from %s)", credentials.server, credentials.source)
    return kopf.AiohttpSession(server=credentials.server, aiohttp_session=credentials.aiohttp_session())


async def cleanup(memo: kopf.Memo, **_: Any) -> None:
    await memo.queue.stop()
    await memo.ctx.kube.close()
    await memo.ctx.scraper.aclose()
    logger.info("Stopped operator %s", memo.config.instance)


# ------------------------------------------------------------------ indexes


async def service_index(namespace: str, name: str, body: kopf.Body, **_: Any):
    return {(namespace, name): _plain(body)}


async def service_refs_index(namespace: str, name: str, status: kopf.Status, **_: Any):
    refs = {p.get(field) for p in status.get("pools", []) or [] for field in ("engineBuild", "servingEngineBuild")}
    return {(namespace, ref): name for ref in refs if ref}


async def runtime_index(name: str, body: kopf.Body, **_: Any):
    return {name: _plain(body)}


async def build_index(namespace: str, body: kopf.Body, **_: Any):
    return {namespace: _plain(body)}


async def node_index(name: str, body: kopf.Body, **_: Any):
    return {name: node_view(body)}


async def child_index(namespace: str, labels: kopf.Labels, body: kopf.Body, **_: Any):
    return {(namespace, labels[SERVICE_LABEL]): _plain(body)}


async def job_index(namespace: str, labels: kopf.Labels, body: kopf.Body, **_: Any):
    return {(namespace, labels[BUILD_LABEL]): _plain(body)}


async def pod_index(namespace: str, labels: kopf.Labels, body: kopf.Body, **_: Any):
    pod = _plain(body)
    return {(namespace, labels[BUILD_LABEL]): {k: pod.get(k) for k in ("apiVersion", "kind", "metadata", "status")}}


async def service_pod_index(namespace: str, labels: kopf.Labels, body: kopf.Body, **_: Any):
    return {(namespace, labels[SERVICE_LABEL]): findings.pod_view(body)}


async def claim_index(namespace: str, name: str, **_: Any):
    return {namespace: name}


# ------------------------------------------------------------------ triggers


async def service_event(type: str, namespace: str, name: str, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    is_echo = memo.ctx.cache.observed(SERVICE_KIND, body, is_deleted=type == "DELETED")
    if is_echo:
        return  # the status this process just wrote, coming back: nothing new to reconcile
    if type == "DELETED":
        memo.queue.forget((SERVICE_KIND, namespace, name))
        memo.ctx.cache.forget(SERVICE_KIND, namespace, name)
        for pool in body.get("status", {}).get("pools", []) or []:
            for ref in (pool.get("engineBuild"), pool.get("servingEngineBuild")):
                if ref:  # its builds may now be unreferenced: start their GC clock
                    memo.queue.enqueue((BUILD_KIND, namespace, ref))
    else:
        memo.queue.enqueue((SERVICE_KIND, namespace, name))


async def build_event(
    type: str, namespace: str, name: str, body: kopf.Body, memo: kopf.Memo, service_refs_index: kopf.Index, **_: Any
) -> None:
    memo.ctx.cache.observed(BUILD_KIND, body, is_deleted=type == "DELETED")
    if type == "DELETED":
        memo.queue.forget((BUILD_KIND, namespace, name))
        memo.ctx.cache.forget(BUILD_KIND, namespace, name)
    else:
        memo.queue.enqueue((BUILD_KIND, namespace, name))
    for service in service_refs_index.get((namespace, name), ()):
        memo.queue.enqueue((SERVICE_KIND, namespace, service))


async def child_event(
    type: str, namespace: str, labels: kopf.Labels, body: kopf.Body, memo: kopf.Memo, **_: Any
) -> None:
    kind = body.get("kind")
    is_echo = memo.ctx.cache.observed(kind, body, is_deleted=type == "DELETED")
    is_ready_changed = kind == "Deployment" and _readiness_changed(memo, type, body)
    # A child changes far more often than its service's plan can: its controllers write its status (a
    # Deployment's several times per rollout, a PodDisruptionBudget's on every pod change). The reconcile
    # reads a child's metadata and spec (drift, stale children) and a Deployment's ready count, nothing else.
    is_changed = _content_changed(memo, type, body)
    if is_ready_changed or (is_changed and not is_echo):
        memo.queue.enqueue((SERVICE_KIND, namespace, labels[SERVICE_LABEL]), fast=is_ready_changed)


async def job_event(type: str, namespace: str, labels: kopf.Labels, body: kopf.Body, memo: kopf.Memo, **_: Any) -> None:
    memo.ctx.cache.observed("Job", body, is_deleted=type == "DELETED")
    memo.queue.enqueue((BUILD_KIND, namespace, labels[BUILD_LABEL]))


async def pod_event(namespace: str, labels: kopf.Labels, memo: kopf.Memo, **_: Any) -> None:
    memo.queue.enqueue((BUILD_KIND, namespace, labels[BUILD_LABEL]))


async def service_pod_event(
    type: str, namespace: str, name: str, labels: kopf.Labels, body: kopf.Body, memo: kopf.Memo, **_: Any
) -> None:
    # Pods change often (scheduling, probes); only a change of what they report re-plans.
    found = () if type == "DELETED" else tuple(findings.pod_findings(body))
    if memo.pod_findings.get((namespace, name), ()) == found:
        return
    if found:
        memo.pod_findings[(namespace, name)] = found
    else:
        memo.pod_findings.pop((namespace, name), None)
    memo.queue.enqueue((SERVICE_KIND, namespace, labels[SERVICE_LABEL]))


async def claim_event(
    type: str | None, namespace: str, memo: kopf.Memo, service_index: kopf.Index, build_index: kopf.Index, **_: Any
) -> None:
    if type not in ("ADDED", "DELETED"):
        return  # a claim's binding or resize changes nothing the operator reports
    for ns, name in list(service_index.keys()):
        if ns == namespace:
            memo.queue.enqueue((SERVICE_KIND, namespace, name))
    for build in build_index.get(namespace, ()):
        memo.queue.enqueue((BUILD_KIND, namespace, build["metadata"]["name"]))


async def node_event(
    type: str, name: str, body: kopf.Body, memo: kopf.Memo, service_index: kopf.Index, **_: Any
) -> None:
    # Heartbeats change nodes every few seconds; only what pools are made of re-plans services.
    signature = None if type == "DELETED" else repr(node_view(body))
    if memo.node_signatures.get(name) == signature:
        return
    if signature is None:
        memo.node_signatures.pop(name, None)
    else:
        memo.node_signatures[name] = signature
    memo.ctx.cache.cluster_changed()
    _enqueue_all_services(memo, service_index)


async def runtime_event(memo: kopf.Memo, service_index: kopf.Index, **_: Any) -> None:
    memo.ctx.cache.cluster_changed()
    _enqueue_all_services(memo, service_index)


async def pool_crd_event(
    memo: kopf.Memo, service_index: kopf.Index, type: str, body: Mapping[str, Any], **_: Any
) -> None:
    # The GAIE CRD appearing, becoming established or going: take what it says and re-plan every service's routing.
    reconcile_routing.observe_pool_crd(memo.ctx, dict(body), is_deleted=type == "DELETED")
    _enqueue_all_services(memo, service_index)


def _readiness_changed(memo: kopf.Memo, type: str, body: Mapping[str, Any]) -> bool:
    """Whether a Deployment's ready replica count moved since its last event (0 before the first):
    such a change may finish its service's rollout, so the service takes the work queue's fast lane."""
    key = (body.get("metadata", {}).get("namespace"), body.get("metadata", {}).get("name"))
    ready = 0 if type == "DELETED" else int((body.get("status") or {}).get("readyReplicas") or 0)
    before = memo.ready_replicas.pop(key, 0) if type == "DELETED" else memo.ready_replicas.get(key, 0)
    if type != "DELETED":
        memo.ready_replicas[key] = ready
    return ready != before


def _content_changed(memo: kopf.Memo, type: str, body: Mapping[str, Any]) -> bool:
    """Whether a child's metadata or spec moved since its last event (or it appeared or went). The spec is
    stood for by metadata.generation, which the API server bumps on every spec change, where the kind keeps
    one (Deployments, PDBs; a Service's spec is compared itself). The status, resourceVersion, managedFields
    and the Deployment controller's own annotations (deployment.kubernetes.io/revision) are left out: the
    reconcile reads none of them."""
    meta = body.get("metadata", {})
    key = (body.get("kind"), meta.get("namespace"), meta.get("name"))
    if type == "DELETED":
        memo.child_contents.pop(key, None)
        return True
    annotations = meta.get("annotations") or {}
    view = (
        meta.get("uid"),
        meta.get("generation") or body.get("spec"),
        meta.get("labels"),
        {k: v for k, v in annotations.items() if not k.startswith(_DEPLOYMENT_BOOKKEEPING)},
        meta.get("ownerReferences"),
        meta.get("finalizers"),
        meta.get("deletionTimestamp"),
    )
    digest = hash(repr(view))
    if memo.child_contents.get(key) == digest:
        return False
    memo.child_contents[key] = digest
    return True


_DEPLOYMENT_BOOKKEEPING = "deployment.kubernetes.io/"


def _enqueue_all_services(memo: kopf.Memo, service_index: kopf.Index) -> None:
    for namespace, name in list(service_index.keys()):
        memo.queue.enqueue((SERVICE_KIND, namespace, name))


async def _work(ctx: Context, key: tuple[str, str, str]) -> float | None:
    """Reconciles one object; seconds until its next reconcile: what the reconcile asked for, and at most
    --resync-seconds while the object exists (the level-triggered safety net)."""
    kind, namespace, name = key
    if ctx.leadership is not None and not await ctx.leadership.is_active():
        return ctx.config.resync_seconds  # paused in favour of a peer: kopf re-lists everything on resume
    ctx.metrics.reconciles.labels(kind).inc()
    with ctx.metrics.duration.labels(kind).time():
        if kind == SERVICE_KIND:
            after = await reconcile.reconcile_service(ctx, namespace, name)
        else:
            after = await reconcile.reconcile_build(ctx, namespace, name)
    if not _exists(ctx.cache, kind, namespace, name):
        return after
    return ctx.config.resync_seconds if after is None else min(after, ctx.config.resync_seconds)


def _exists(cache: ReadCache, kind: str, namespace: str, name: str) -> bool:
    if kind == SERVICE_KIND:
        return bool(cache.values(SERVICES, (namespace, name)))
    return any(b["metadata"]["name"] == name for b in cache.values(BUILDS, namespace))


def _failed(metrics: Metrics, key: tuple[str, str, str], error: BaseException) -> None:
    kind, namespace, name = key
    metrics.errors.labels(kind).inc()
    if reconcile.is_namespace_terminating(error):
        logger.info("Skipped %s %s/%s: its namespace is being deleted", kind, namespace, name)
        return
    if isinstance(error, kopf.TemporaryError):
        logger.info("Postponed %s %s/%s: %s", kind, namespace, name, error)
    else:
        logger.error(
            "Failed to reconcile %s %s/%s: %s", kind, namespace, name, error, exc_info=not hasattr(error, "status")
        )

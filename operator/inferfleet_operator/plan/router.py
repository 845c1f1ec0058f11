"""plan_router: a service's router (spec.routing.mode Router). A Deployment of `inferfleet-router` (the operator's own
image) finds each serving pool's ready pods through one headless Service per pool (its DNS name resolves to them)
and sends each request to the pod predicted to finish it first; the service's Service then selects the router."""

from __future__ import annotations

from dataclasses import dataclass, field

from inferfleet_operator.api.names import COMPONENT_LABEL, KINDS, POOL_LABEL, SERVICE_LABEL
from inferfleet_operator.api.types import InferenceService, PlanSettings
from inferfleet_operator.plan.manifests import (
    PRE_STOP_SLEEP_SECONDS,
    TERMINATION_GRACE_SECONDS,
    _api_key_env,
    _container_security,
    _pod_security,
    bounded_name,
    common_labels,
)

ROUTER = "router"  # the router pods' component label
SERVER = "server"  # the serving pods'
MODE_ROUTER = "Router"
MODE_SERVICE = "Service"


@dataclass(frozen=True)
class RouterPlan:
    component: str  # what the service's Service selects: the router pods or the serving pods
    children: list[dict] = field(default_factory=list)  # the router's Deployment and the pools' headless Services
    status: dict = field(default_factory=dict)  # status.routing's mode, router and routerMessage


def router_name(service: str) -> str:
    return bounded_name(service, ROUTER)


def pool_service_name(service: str, pool: str) -> str:
    """The headless Service over one pool's ready serving pods (named like the pool's Deployment)."""
    return bounded_name(service, pool)


def plan_router(service: InferenceService, serving_pools: list[str], settings: PlanSettings) -> RouterPlan:
    """The router's children when the service asks for one and the operator knows the router's image; otherwise the
    Service selects the serving pods (status.routing says why)."""
    if service.spec.routing.mode == MODE_SERVICE:
        why = "spec.routing.mode is Service: the Service spreads connections over every ready serving pod"
        return RouterPlan(SERVER, status={"mode": MODE_SERVICE, "router": "", "routerMessage": why})
    if not settings.router_image:
        why = (
            "the operator was started without --router-image (the chart always passes it): the Service spreads "
            "connections over every ready serving pod"
        )
        return RouterPlan(SERVER, status={"mode": MODE_SERVICE, "router": "", "routerMessage": why})
    pools = sorted(serving_pools)
    name = router_name(service.meta.name)
    if not pools:
        why = "no pool serves yet: the router is deployed with the first serving pool"
        return RouterPlan(ROUTER, status={"mode": MODE_ROUTER, "router": "", "routerMessage": why})
    children = [pool_service_for(service, pool, settings) for pool in pools]
    children.append(router_deployment_for(service, pools, settings))
    why = (
        f"{name} routes over the ready pods of {len(pools)} pool(s) ({', '.join(pools)}) by predicted time to "
        f"finish; pods whose /metrics do not answer get no traffic"
    )
    return RouterPlan(ROUTER, children, {"mode": MODE_ROUTER, "router": name, "routerMessage": why})


def pool_service_for(service: InferenceService, pool: str, settings: PlanSettings) -> dict:
    """Headless: its DNS name resolves to the pool's ready pods only (not-ready addresses are not published)."""
    return {
        "apiVersion": KINDS["Service"].api_version,
        "kind": "Service",
        "metadata": {
            "name": pool_service_name(service.meta.name, pool),
            "namespace": service.meta.namespace,
            "labels": common_labels(service.meta.name, pool),
        },
        "spec": {
            "clusterIP": "None",
            "selector": {SERVICE_LABEL: service.meta.name, POOL_LABEL: pool, COMPONENT_LABEL: SERVER},
            "ports": [{"name": "http", "port": settings.port, "targetPort": "http", "protocol": "TCP"}],
        },
    }


def router_deployment_for(service: InferenceService, pools: list[str], settings: PlanSettings) -> dict:
    spec, meta = service.spec, service.meta
    router = spec.routing.router
    labels = common_labels(meta.name) | {COMPONENT_LABEL: ROUTER}
    args = ["--host", "0.0.0.0", "--port", str(settings.port)]
    # The short name resolves in the router's own namespace (the first search domain): one query per pool.
    args += [f"--pool-address={pool}={pool_service_name(meta.name, pool)}:{settings.port}" for pool in pools]
    if spec.auth.api_key_secret is not None:  # the router asks clients for the service's key and sends it on
        args.append("--api-key-env")
    container = {
        "name": ROUTER,
        "image": settings.router_image,
        "command": ["inferfleet-router"],
        "args": args,
        "ports": [{"name": "http", "containerPort": settings.port, "protocol": "TCP"}],
        "resources": {
            "requests": {"cpu": router.cpu, "memory": router.memory},
            "limits": {"memory": router.memory},
        },
        # /ready answers 200 once some serving pod is ready and scraped: until then the Service has no endpoint.
        "readinessProbe": {"httpGet": {"path": "/ready", "port": "http"}, "periodSeconds": 2, "timeoutSeconds": 2},
        "livenessProbe": {
            "httpGet": {"path": "/health", "port": "http"},
            "periodSeconds": 10,
            "failureThreshold": 3,
            "timeoutSeconds": 5,
        },
        # As a serving pod: it listens on until the Service has dropped it, then finishes the streams in flight.
        "lifecycle": {"preStop": {"sleep": {"seconds": PRE_STOP_SLEEP_SECONDS}}},
        "securityContext": _container_security(),
    }
    if spec.auth.api_key_secret is not None:
        container["env"] = _api_key_env(spec.auth)
    if settings.router_image_pull_policy:
        container["imagePullPolicy"] = settings.router_image_pull_policy
    return {
        "apiVersion": KINDS["Deployment"].api_version,
        "kind": "Deployment",
        "metadata": {"name": router_name(meta.name), "namespace": meta.namespace, "labels": dict(labels)},
        "spec": {
            "replicas": router.replicas,
            "selector": {"matchLabels": {SERVICE_LABEL: meta.name, COMPONENT_LABEL: ROUTER}},
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            "template": {
                "metadata": {"labels": dict(labels)},
                "spec": {
                    "automountServiceAccountToken": False,
                    "enableServiceLinks": False,
                    "securityContext": _pod_security(),
                    "terminationGracePeriodSeconds": TERMINATION_GRACE_SECONDS,
                    "containers": [container],
                },
            },
        },
    }

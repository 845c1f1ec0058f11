"""Typed specs of the three kinds, parsed from plain dicts: the one place where camelCase YAML meets snake_case Python.

The spec models are declared (type, default, bounds, enum, description, CEL rules) in spec_service, spec_build and
spec_common; crdgen writes the CRDs from the same declaration. This module is what plan/ and controller/ import."""

from __future__ import annotations

import re
from dataclasses import dataclass

from inferfleet_operator.api.schema import Model, SpecError, dump, parse, to_camel
from inferfleet_operator.api.spec_build import BuildPlacement, EngineBuildSpec, InferenceRuntimeSpec
from inferfleet_operator.api.spec_common import (
    BLOCK_SIZES,
    BUILD_STATES,
    DTYPES,
    ENGINES,
    EXPOSURES,
    FAILURE_MODES,
    FALLBACKS,
    INFERENCE_POOL_MODES,
    POLICIES,
    QUANTIZATIONS,
    TENSOR_PARALLEL_SIZES,
    URI_PATTERN,
    VENDORS,
    BuildResources,
    EngineEnvelope,
    Toleration,
)
from inferfleet_operator.api.spec_service import (
    AuthSpec,
    AutoscalingSpec,
    BuildSpec,
    EndpointPicker,
    InferenceServiceSpec,
    ModelSpec,
    NetworkPeer,
    NetworkPolicySpec,
    Placement,
    PoolOverride,
    Resources,
    RoutingSpec,
    RuntimeSpec,
    SecretKeyRef,
)

__all__ = [
    "BLOCK_SIZES", "BUILD_STATES", "DTYPES", "ENGINES", "EXPOSURES", "FAILURE_MODES", "FALLBACKS",
    "INFERENCE_POOL_MODES", "POLICIES", "QUANTIZATIONS", "TENSOR_PARALLEL_SIZES", "VENDORS",
    "AuthSpec", "AutoscalingSpec", "BuildPlacement", "BuildResources", "BuildSpec", "EndpointPicker", "EngineBuild",
    "EngineBuildSpec", "EngineEnvelope", "InferenceRuntime", "InferenceRuntimeSpec", "InferenceService",
    "InferenceServiceSpec", "ModelSpec", "NetworkPeer", "NetworkPolicySpec", "ObjectRef", "Placement",
    "PlanSettings", "PoolOverride", "Resources", "RoutingSpec", "RuntimeSpec", "SecretKeyRef", "SpecError",
    "Toleration", "DEFAULT_SETTINGS", "from_dict", "parse_build", "parse_runtime", "parse_service", "to_camel",
    "to_dict", "uri_scheme",
]  # fmt: skip


# ---------------------------------------------------------------- objects


@dataclass(frozen=True)
class ObjectRef:
    name: str
    namespace: str = ""
    uid: str = ""
    generation: int = 0


@dataclass(frozen=True)
class InferenceService:
    meta: ObjectRef
    spec: InferenceServiceSpec
    status: dict  # as read; only previous conditions and pools are consulted


@dataclass(frozen=True)
class InferenceRuntime:
    name: str
    spec: InferenceRuntimeSpec


@dataclass(frozen=True)
class EngineBuild:
    meta: ObjectRef
    spec: EngineBuildSpec
    status: dict


# ---------------------------------------------------------------- generic mapping


def from_dict(cls: type[Model], data: dict | None, path: str = "spec"):
    """Model `cls` from a camelCase dict, filling defaults; unknown keys are ignored; SpecError names the field."""
    return parse(cls, data or {}, path)


def to_dict(obj: Model) -> dict:
    """Model -> camelCase dict with every field (defaults included); None values are dropped."""
    return dump(obj)


# ---------------------------------------------------------------- parsers


_URI_RE = re.compile(URI_PATTERN)


def _meta(obj: dict) -> ObjectRef:
    meta = obj.get("metadata") or {}
    return ObjectRef(
        name=meta.get("name", ""),
        namespace=meta.get("namespace", ""),
        uid=meta.get("uid", ""),
        generation=int(meta.get("generation") or 0),
    )


def parse_service(obj: dict) -> InferenceService:
    """Parse an InferenceService object; raises SpecError for what the CRD rules refuse."""
    spec = from_dict(InferenceServiceSpec, obj.get("spec"))
    if not _URI_RE.match(spec.model.uri):
        raise SpecError("spec.model.uri must be pvc://CLAIM/PATH, hf://ORG/NAME, file:///PATH or s3://BUCKET/KEY")
    if spec.engine.tensor_parallel_size != spec.resources.gpus_per_replica:
        raise SpecError("spec.engine.tensorParallelSize must equal spec.resources.gpusPerReplica")
    if sum(o.replicas for o in spec.pools) > spec.replicas:
        raise SpecError("spec.pools: the sum of pools[].replicas must be at most spec.replicas")
    _check_autoscaling(spec)
    return InferenceService(meta=_meta(obj), spec=spec, status=dict(obj.get("status") or {}))


def _check_autoscaling(spec: InferenceServiceSpec) -> None:
    scaling = spec.autoscaling
    if scaling is None:
        return
    if scaling.min_replicas > scaling.max_replicas:
        raise SpecError("spec.autoscaling.minReplicas must be at most spec.autoscaling.maxReplicas")
    if scaling.target_waiting_requests is None and scaling.target_kv_cache_usage_percent is None:
        raise SpecError("spec.autoscaling needs targetWaitingRequests or targetKvCacheUsagePercent")
    if spec.pools:
        raise SpecError("spec.pools (fixed per-pool replicas) cannot be combined with spec.autoscaling")


def parse_runtime(obj: dict) -> InferenceRuntime:
    spec = from_dict(InferenceRuntimeSpec, obj.get("spec"))
    if spec.engine == "Compiled" and not spec.compile_image:
        raise SpecError("spec.compileImage is required when spec.engine is Compiled")
    return InferenceRuntime(name=(obj.get("metadata") or {}).get("name", ""), spec=spec)


def parse_build(obj: dict) -> EngineBuild:
    return EngineBuild(
        meta=_meta(obj), spec=from_dict(EngineBuildSpec, obj.get("spec")), status=dict(obj.get("status") or {})
    )


def uri_scheme(uri: str) -> str:
    return uri.split("://", 1)[0]


# ---------------------------------------------------------------- operator settings


@dataclass(frozen=True)
class PlanSettings:
    """Operator-wide settings the planners need; read once at startup by the handlers, passed in."""

    engine_cache_claim: str = "inferfleet-engine-cache"
    engine_cache_mount: str = "/engines"
    model_mount: str = "/models"
    build_retention_seconds: int = 3600  # an unreferenced EngineBuild is deleted this long after its last reference
    max_backoff_seconds: int = 600
    port: int = 8000
    # The operator's own pods (namespace, labels), admitted by every service NetworkPolicy so the autoscaler can read
    # the pods' /metrics; "" = not known (the chart always passes them).
    scraper_namespace: str = ""
    scraper_labels: tuple[tuple[str, str], ...] = ()
    # Host folders file:// models may mount (normalised absolute paths, whole components); none by default.
    host_path_roots: tuple[str, ...] = ()
    # The administrator's choice to let services of different namespaces share one engine (its key leaves the
    # namespace out, and compile Jobs keep an engine of the key found on the cache): every namespace that can write
    # the engine cache is then trusted with every other's engines. Off: each namespace builds its own.
    share_engines_across_namespaces: bool = False
    # The image whose `inferfleet-router` serves spec.routing.mode Router (the operator's own image; the chart passes
    # it); "" = unknown: services are served through the plain Service and status.routing says why.
    router_image: str = ""
    router_image_pull_policy: str = ""  # "" = the cluster's default for the image's tag
    # The node model cache (docs/user-guide/model-cache.md): the PersistentVolumeClaim, in each service's namespace,
    # through which pods reach their node's cache folder; "" = off (each pod fetches its own copy). Models that
    # are fetched (hf://, s3://) go through it: once per node, verified by content digest.
    model_cache_claim: str = ""
    model_cache_mount: str = "/model-cache"
    model_cache_budget_bytes: int = 0  # the cache's byte budget on each node, enforced by each fetch; 0 = none


DEFAULT_SETTINGS = PlanSettings()

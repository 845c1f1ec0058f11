"""Typed specs of the three kinds, parsed from plain dicts: the one place where camelCase YAML meets snake_case Python."""

from __future__ import annotations

import dataclasses
import functools
import re
import typing
from dataclasses import dataclass, field

VENDORS = ("nvidia", "amd", "intel", "habana", "cpu")
POLICIES = ("Auto", "Paged", "Compiled")
FALLBACKS = ("Paged", "None")
ENGINES = ("Paged", "Compiled")
DTYPES = ("float16", "bfloat16", "float32")
# Auto: as the checkpoint says (float, or its own quantization_config); Int8/Int4: quantized by the runtime at load.
QUANTIZATIONS = ("Auto", "None", "Int8", "Int4")
BLOCK_SIZES = (8, 16, 32, 64)
TENSOR_PARALLEL_SIZES = (1, 2, 4, 8)
URI_SCHEMES = ("pvc", "hf", "file", "s3")
BUILD_STATES = ("Pending", "Building", "Ready", "Failed")
INFERENCE_POOL_MODES = ("Auto", "Enabled", "Disabled")
FAILURE_MODES = ("FailOpen", "FailClose")

# Inclusive bounds, shared by the CRD schema (crdgen) and the models.
BOUNDS = {
    "max_context_length": (128, 1_048_576),
    "max_batch_size": (1, 4096),
    "replicas": (0, 1000),
    "gpus_per_replica": (1, 16),
    "max_attempts": (1, 10),
    "backoff_seconds": (1, 3600),
    "priority": (-1000, 1000),
    "build_deadline_seconds": (60, 7 * 86400),
    "min_replicas": (1, 1000),  # scale to zero is not supported: a first request would have nothing to wait on
    "max_replicas": (1, 1000),
    "target_waiting_requests": (1, 10_000),
    "target_kv_cache_usage_percent": (1, 100),
    "scale_down_stabilization_seconds": (0, 3600),
    "port": (1, 65535),
}

_CAMEL_OVERRIDES: dict[str, str] = {}  # snake -> camel where the generic rule is wrong (none yet)


def to_camel(name: str) -> str:
    """snake_case -> camelCase, the single mapping rule for every field of every kind."""
    if name in _CAMEL_OVERRIDES:
        return _CAMEL_OVERRIDES[name]
    head, *rest = name.split("_")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


# ---------------------------------------------------------------- InferenceService


@dataclass(frozen=True)
class ModelSpec:
    name: str
    uri: str
    revision: str = "main"
    # Bytes the downloaded files take (a quantity, e.g. "16Gi"); "" = not stated. When stated, the model
    # emptyDir is limited to it and the pods that fill it request it as ephemeral-storage.
    size: str = ""
    # A Secret in the service's namespace whose keys are env vars of `fetch` (HF_TOKEN, AWS_*); "" = none.
    credentials_secret: str = ""
    quantization: str = "Auto"  # QUANTIZATIONS

    @property
    def runtime_quantization(self) -> str | None:
        """`serve --quantization`'s value ("int8", "int4"), or None when the runtime quantizes nothing itself."""
        return self.quantization.lower() if self.quantization in ("Int8", "Int4") else None


@dataclass(frozen=True)
class EngineEnvelope:
    """The envelope a compiled engine is built for; paged serving uses the same limits."""

    max_context_length: int = 4096
    max_batch_size: int = 16
    dtype: str = "bfloat16"
    tensor_parallel_size: int = 1
    block_size: int = 16


@dataclass(frozen=True)
class RuntimeSpec:
    policy: str = "Auto"
    fallback: str = "Paged"
    bridge: bool = True


@dataclass(frozen=True)
class PoolOverride:
    name: str
    replicas: int


@dataclass(frozen=True)
class Toleration:
    key: str = ""
    operator: str = "Equal"
    value: str = ""
    effect: str = ""
    toleration_seconds: int | None = None


@dataclass(frozen=True)
class Placement:
    vendors: tuple[str, ...] = ()  # empty: every accelerator vendor, and cpu only when no accelerator pool is eligible
    node_selector: dict[str, str] = field(default_factory=dict)
    tolerations: tuple[Toleration, ...] = ()
    # Tolerate taints keyed by the GPU resource the pods request (any effect), as the ExtendedResourceToleration
    # admission plugin does; False: only placement.tolerations count.
    tolerate_gpu_taints: bool = True


@dataclass(frozen=True)
class Resources:
    gpus_per_replica: int = 1
    cpu: str = "2"
    memory: str = "8Gi"


@dataclass(frozen=True)
class BuildResources:
    """Requests of the compile container; memory is request and limit."""

    cpu: str = "2"
    memory: str = "16Gi"


@dataclass(frozen=True)
class BuildSpec:
    """How compile Jobs run (not part of the engine key)."""

    deadline_seconds: int = 7200  # per attempt, download included
    resources: BuildResources = field(default_factory=BuildResources)


@dataclass(frozen=True)
class EndpointPicker:
    """The endpoint picker (GAIE extension) a gateway asks which pod of the InferencePool serves a request."""

    name: str
    port: int
    kind: str = "Service"
    group: str = ""
    failure_mode: str = "FailClose"


@dataclass(frozen=True)
class RoutingSpec:
    inference_pool: str = "Auto"  # Auto: emitted when the GAIE CRD is served; Enabled; Disabled
    endpoint_picker: EndpointPicker | None = None


@dataclass(frozen=True)
class AutoscalingSpec:
    """Replicas follow the pods' own load metrics; spec.replicas is then only the starting point."""

    max_replicas: int
    min_replicas: int = 1
    target_waiting_requests: int | None = None  # queued requests per replica
    target_kv_cache_usage_percent: int | None = None  # KV cache blocks in use, percent, averaged over replicas
    scale_down_stabilization_seconds: int = 300


@dataclass(frozen=True)
class SecretKeyRef:
    name: str
    key: str = "api-key"


@dataclass(frozen=True)
class AuthSpec:
    # A Secret in the service's namespace whose key holds the API keys (comma-separated): the serving containers
    # get it as INFERFLEET_API_KEY by secretKeyRef; the operator never reads it. None = endpoints open.
    api_key_secret: SecretKeyRef | None = None


@dataclass(frozen=True)
class NetworkPeer:
    """Pods allowed to reach a service's pods."""

    namespace: str = ""  # "" = the service's own namespace
    pod_labels: dict[str, str] = field(default_factory=dict)  # empty = every pod of that namespace


@dataclass(frozen=True)
class NetworkPolicySpec:
    """A NetworkPolicy on the serving pods: ingress to their port only from `allow` and the operator's scraper."""

    allow: tuple[NetworkPeer, ...] = ()


@dataclass(frozen=True)
class InferenceServiceSpec:
    model: ModelSpec
    engine: EngineEnvelope = field(default_factory=EngineEnvelope)
    runtime: RuntimeSpec = field(default_factory=RuntimeSpec)
    replicas: int = 1
    pools: tuple[PoolOverride, ...] = ()  # per-pool replica overrides
    placement: Placement = field(default_factory=Placement)
    resources: Resources = field(default_factory=Resources)
    build: BuildSpec = field(default_factory=BuildSpec)
    routing: RoutingSpec = field(default_factory=RoutingSpec)
    autoscaling: AutoscalingSpec | None = None
    auth: AuthSpec = field(default_factory=AuthSpec)
    network_policy: NetworkPolicySpec | None = None  # None: no NetworkPolicy (the pods take any traffic)


# ---------------------------------------------------------------- InferenceRuntime


@dataclass(frozen=True)
class InferenceRuntimeSpec:
    engine: str
    vendors: tuple[str, ...]
    image: str
    architectures: tuple[str, ...] = ()  # empty: every architecture of the vendors
    compile_image: str = ""  # compiled only
    gpu_resource: str = ""  # empty: the resource the pool's nodes advertise
    priority: int = 0  # higher wins


# ---------------------------------------------------------------- EngineBuild


@dataclass(frozen=True)
class BuildPlacement:
    node_names: tuple[str, ...] = ()
    tolerations: tuple[Toleration, ...] = ()


@dataclass(frozen=True)
class EngineBuildSpec:
    engine_key: str
    model_uri: str
    revision: str
    envelope: EngineEnvelope
    vendor: str
    architecture: str
    image: str
    compile_image: str
    gpu_resource: str = ""
    gpus: int = 1
    max_attempts: int = 3
    backoff_seconds: int = 10
    placement: BuildPlacement = field(default_factory=BuildPlacement)
    deadline_seconds: int = 7200
    resources: BuildResources = field(default_factory=BuildResources)
    model_size: str = ""
    credentials_secret: str = ""
    quantization: str = "Auto"  # the service's spec.model.quantization: part of the key (engine_key)


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


class SpecError(ValueError):
    """A spec the API server should have refused (the CRD's CEL rules); names the field."""


# ---------------------------------------------------------------- generic mapping


def from_dict(cls: type, data: dict | None, path: str = "spec"):
    """Build dataclass `cls` from a camelCase dict, filling defaults; unknown keys are ignored."""
    data = data or {}
    if not isinstance(data, dict):
        raise SpecError(f"{path} must be an object")
    kwargs = {}
    for name, key, hint, is_required in _fields(cls):
        if key not in data or data[key] is None:
            if is_required:
                raise SpecError(f"{path}.{key} is required")
            continue
        kwargs[name] = _convert(hint, data[key], f"{path}.{key}")
    return cls(**kwargs)


@functools.cache
def _fields(cls: type) -> tuple[tuple[str, str, object, bool], ...]:
    """(python name, yaml key, type hint, required) per field; memoized because resolving the string
    annotations is costly and planning parses every service on every pass."""
    hints = typing.get_type_hints(cls)
    return tuple(
        (
            f.name,
            to_camel(f.name),
            hints[f.name],
            f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING,
        )
        for f in dataclasses.fields(cls)
    )


def _convert(hint, value, path: str):
    origin = typing.get_origin(hint)
    args = typing.get_args(hint)
    if dataclasses.is_dataclass(hint):
        return from_dict(hint, value, path)
    if origin is tuple:
        if not isinstance(value, list):
            raise SpecError(f"{path} must be a list")
        if args[0] is str:
            return tuple(str(item) for item in value)
        return tuple(_convert(args[0], item, f"{path}[{i}]") for i, item in enumerate(value))
    if origin is dict:
        if not isinstance(value, dict):
            raise SpecError(f"{path} must be an object")
        return {str(k): str(v) for k, v in value.items()}
    if origin in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        inner = [a for a in args if a is not type(None)]
        return _convert(inner[0], value, path)
    if hint is bool:
        if not isinstance(value, bool):
            raise SpecError(f"{path} must be true or false")
        return value
    if hint is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise SpecError(f"{path} must be an integer")
        return value
    if hint is str:
        return str(value)
    return value


def to_dict(obj) -> dict:
    """Dataclass -> camelCase dict with every field (defaults included); None values are dropped."""
    out = {}
    for name, key, _, _ in _fields(type(obj)):
        value = getattr(obj, name)
        if value is None:
            continue
        out[key] = _plain(value)
    return out


def _plain(value):
    if isinstance(value, (str, int, float, bool)):
        return value
    if dataclasses.is_dataclass(value):
        return to_dict(value)
    if isinstance(value, tuple):
        return [v if isinstance(v, str) else _plain(v) for v in value]
    if isinstance(value, dict):
        return dict(sorted(value.items()))
    return value


def default_of(cls: type, name: str):
    """The default of field `name` of dataclass `cls` (crdgen writes these into the schema)."""
    for f in dataclasses.fields(cls):
        if f.name == name:
            if f.default is not dataclasses.MISSING:
                return f.default
            if f.default_factory is not dataclasses.MISSING:
                return f.default_factory()
            return dataclasses.MISSING
    raise KeyError(name)


# ---------------------------------------------------------------- parsers


_URI_RE = re.compile(r"^(pvc://[a-z0-9]([-a-z0-9.]*[a-z0-9])?/.+|hf://[^/]+/[^/]+|file:///.+|s3://[^/]+/.+)$")


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


DEFAULT_SETTINGS = PlanSettings()

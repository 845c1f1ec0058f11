"""The InferenceService spec: what to serve and where, declared once for the parser, the CRD and the reference."""

from __future__ import annotations

from pydantic import StrictBool, StrictInt

from inferfleet_operator.api.schema import Model, field, rule
from inferfleet_operator.api.spec_common import (
    DNS_LABEL_PATTERN,
    EXPOSURES,
    FAILURE_MODES,
    FALLBACKS,
    INFERENCE_POOL_MODES,
    LABEL_VALUE_PATTERN,
    MODEL_NAME_PATTERN,
    POLICIES,
    QUANTITY_PATTERN,
    QUANTIZATIONS,
    ROUTING_MODES,
    SECRET_NAME_PATTERN,
    URI_PATTERN,
    BuildResources,
    EngineEnvelope,
    Toleration,
    bytes_field,
    tolerations_field,
    vendor_list,
)


class ModelSpec(Model):
    """The model to serve."""

    name: str = field(
        ...,
        "Served model name: the OpenAI `model` id clients send.",
        pattern=MODEL_NAME_PATTERN,
        max_length=128,
        rules=[rule("self == oldSelf", "model.name is immutable: create a new InferenceService to serve under another name")],
    )  # fmt: skip
    uri: str = field(
        ...,
        "Where the weights are: pvc://CLAIM/PATH, hf://ORG/NAME, file:///PATH (a folder of the node, mounted as a "
        "hostPath: only under a root an administrator allowed, chart value modelHostPaths.allowedRoots, else the "
        "service is Degraded with reason HostPathNotAllowed and nothing mounts it) or s3://BUCKET/KEY.",
        max_length=1024,
        rules=[
            rule(
                f"self.matches('{URI_PATTERN}')",
                "model.uri must be pvc://CLAIM/PATH, hf://ORG/NAME, file:///ABSOLUTE/PATH or s3://BUCKET/KEY",
            )
        ],
    )
    revision: str = field("main", "Model revision (branch, tag or commit).", max_length=128)
    # When stated, the model emptyDir is limited to it and the pods that fill it request it as ephemeral-storage.
    size: str = bytes_field(
        "",
        "Bytes the model's files take once downloaded (hf://, s3://), e.g. 16Gi. When set, the model emptyDir gets it "
        "as sizeLimit and the serving and compile containers request it as ephemeral-storage; unset, the volume is "
        "unbounded and nothing is requested.",
        "model.size",
    )
    credentials_secret: str = field(
        "",
        "Name of a Secret in the service's namespace whose keys become environment variables of the model download "
        "(the fetch init containers of serving pods and compile Jobs, never the server): HF_TOKEN for hf://; "
        "AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, AWS_REGION, AWS_ENDPOINT_URL for s3://. The "
        "operator never reads it.",
        pattern=SECRET_NAME_PATTERN,
        max_length=253,
    )
    quantization: str = field(
        "Auto",
        "Weight quantization. Auto: as the checkpoint says (float weights, or its own quantization_config). None: "
        "float. Int8 (per output channel) or Int4 (group-wise): a float checkpoint quantized by the runtime at load, "
        "weight-only. Compiled engines serve float weights only: with Int8 or Int4 a pool a Compiled runtime fits is "
        "served paged.",
        enum=QUANTIZATIONS,
    )

    @property
    def runtime_quantization(self) -> str | None:
        """`serve --quantization`'s value ("int8", "int4"), or None when the runtime quantizes nothing itself."""
        return self.quantization.lower() if self.quantization in ("Int8", "Int4") else None


class RuntimeSpec(Model):
    """How each pool's runtime is chosen."""

    RULES = (
        rule(
            "!(has(self.policy) && has(self.fallback) && self.policy == 'Paged' && self.fallback == 'None')",
            "runtime.fallback None has no effect with runtime.policy Paged (nothing is compiled): remove "
            "runtime.fallback or use policy Auto or Compiled",
        ),
    )

    policy: str = field(
        "Auto",
        "Auto: compiled where a Compiled runtime fits the pool, else paged. Paged: paged everywhere. Compiled: only "
        "pools a Compiled runtime fits.",
        enum=POLICIES,
    )
    fallback: str = field(
        "Paged",
        "What serves a pool whose engine build failed: Paged, or None (nothing; the service is Degraded).",
        enum=FALLBACKS,
    )
    bridge: StrictBool = field(True, "Serve with paged while a compiled engine builds.")


class PoolOverride(Model):
    """One pool's replicas."""

    name: str = field(..., "Pool name as shown in status.pools[].name.", pattern=DNS_LABEL_PATTERN, max_length=63)
    replicas: StrictInt = field(..., "Replicas in this pool.", bounds=(0, 1000))


class Placement(Model):
    """Where the service may run."""

    # Empty: every accelerator vendor, and cpu only when no accelerator pool is eligible.
    vendors: tuple[str, ...] = vendor_list(
        "Allowed vendors. Accelerator pools come first: replicas fill the GPU pools (by capacity) before any CPU pool "
        "gets one, and CPU pools serve only when this list names cpu, a pools[] override gives them replicas, or no "
        "accelerator pool is eligible. Empty: every vendor under that rule; [cpu]: CPU pools only."
    )
    node_selector: dict[str, str] = field(
        factory=dict, description="Labels every node used must carry.", max_properties=32
    )
    tolerations: tuple[Toleration, ...] = tolerations_field()
    tolerate_gpu_taints: StrictBool = field(
        True,
        "Tolerate taints keyed by the GPU resource a pool's pods request (nvidia.com/gpu, amd.com/gpu, "
        "gpu.intel.com/i915, ...; any effect), as Kubernetes' ExtendedResourceToleration does: such tainted nodes are "
        "eligible. False: only tolerations count.",
    )


class Resources(Model):
    """Per replica."""

    gpus_per_replica: StrictInt = field(1, "GPUs per replica (ignored on cpu pools).", bounds=(1, 16))
    cpu: str = field("2", "CPU request, a Kubernetes quantity.", pattern=QUANTITY_PATTERN)
    memory: str = bytes_field("8Gi", "Memory request and limit, a Kubernetes quantity of bytes.", "resources.memory")


class BuildSpec(Model):
    """How compile Jobs run. Not part of the engine key; a build shared with other services keeps the settings it was
    created with."""

    deadline_seconds: StrictInt = field(
        7200,
        "Seconds one compile attempt may take, model download included (the Job's activeDeadlineSeconds).",
        bounds=(60, 7 * 86400),
    )
    resources: BuildResources = field(factory=BuildResources)


class EndpointPicker(Model):
    """The endpoint picker the gateway consults (InferencePool spec.endpointPickerRef); none when absent."""

    name: str = field(..., "Name of the picker's Service (or other kind).", max_length=253)
    port: StrictInt = field(..., "Port of the picker (the Service port).", bounds=(1, 65535))
    kind: str = field("Service", "Kind of the referent.", max_length=63)
    group: str = field("", "API group of the referent (empty: core).", max_length=253, crd_default="")
    failure_mode: str = field("FailClose", "What the gateway does when the picker does not answer.", enum=FAILURE_MODES)


class RouterSpec(Model):
    """The service's router pods (spec.routing.mode Router): the operator's image running `inferfleet-router`."""

    replicas: StrictInt = field(1, "Router pods.", bounds=(1, 16))
    cpu: str = field("100m", "CPU request of each router pod, a Kubernetes quantity.", pattern=QUANTITY_PATTERN)
    memory: str = bytes_field("512Mi", "Memory request and limit of each router pod.", "routing.router.memory")


class RoutingSpec(Model):
    """How requests reach the service's pods: through its router or straight through the Service, and for a
    gateway, through an InferencePool."""

    mode: str = field(
        "Router",
        "Router: the service's endpoint is a router that sends each request to the pod predicted to finish it first "
        "(each pool's measured speed, each pod's load); pods whose /metrics never answer get no traffic. Service: "
        "the Kubernetes Service spreads connections over every ready serving pod.",
        enum=ROUTING_MODES,
    )
    router: RouterSpec = field(factory=RouterSpec)
    inference_pool: str = field(
        "Auto",
        "Auto: an InferencePool (Gateway API Inference Extension) over every pool's pods when its CRD is served; "
        "Enabled: always (status reports it when the CRD is missing); Disabled: never.",
        enum=INFERENCE_POOL_MODES,
    )
    endpoint_picker: EndpointPicker | None = field(None)


class AutoscalingSpec(Model):
    """Replicas follow the serving pods' own /metrics (queued requests, KV cache usage) with the HPA formula; absent:
    spec.replicas is fixed. Scale to zero is not supported (minReplicas >= 1)."""

    RULES = (
        rule(
            "!has(self.minReplicas) || self.minReplicas <= self.maxReplicas",
            "autoscaling.minReplicas must be at most autoscaling.maxReplicas",
            fieldPath=".minReplicas",
        ),
        rule(
            "has(self.targetWaitingRequests) || has(self.targetKvCacheUsagePercent)",
            "autoscaling needs targetWaitingRequests or targetKvCacheUsagePercent (or both)",
        ),
    )

    # Scale to zero is not supported: a first request would have nothing to wait on.
    min_replicas: StrictInt = field(1, "Fewest replicas across pools.", bounds=(1, 1000))
    max_replicas: StrictInt = field(..., "Most replicas across pools.", bounds=(1, 1000))
    target_waiting_requests: StrictInt | None = field(
        None, "Target queued requests per replica (inferfleet:num_requests_waiting).", bounds=(1, 10_000)
    )
    target_kv_cache_usage_percent: StrictInt | None = field(
        None, "Target KV cache usage per replica in percent (inferfleet:kv_cache_usage_perc).", bounds=(1, 100)
    )  # KV cache blocks in use, averaged over replicas
    scale_down_stabilization_seconds: StrictInt = field(
        300, "A pool scales down only to the highest recommendation of this window.", bounds=(0, 3600)
    )


class SecretKeyRef(Model):
    """A Secret in the service's namespace whose key holds the API keys clients must send as 'Authorization: Bearer
    KEY' (several keys separated by commas). The serving containers get it as the environment variable
    INFERFLEET_API_KEY through a secretKeyRef; the operator never reads it. Unset, the endpoints are open to whoever
    may connect (spec.networkPolicy)."""

    name: str = field(..., "Name of the Secret.", pattern=SECRET_NAME_PATTERN, max_length=253)
    key: str = field("api-key", "Key inside the Secret.", pattern=r"^[-._a-zA-Z0-9]+$", max_length=253)


class AuthSpec(Model):
    """Who may call the service's OpenAI endpoints. /health and /ready stay open for the probes, and /metrics for the
    operator's autoscaler and routing."""

    api_key_secret: SecretKeyRef | None = field(None)  # None: the endpoints are open


class NetworkPeer(Model):
    """Pods allowed to call the service."""

    # Values are checked here (a pattern costs no CEL budget); a key that is no label key is refused by the API
    # server when the NetworkPolicy is applied, and reported in the service's status (ApplyFailed).
    namespace: str = field(
        "", "Their namespace; empty: the service's own.", pattern=r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?)?$", max_length=63
    )
    pod_labels: dict[str, str] = field(
        factory=dict,
        description="Labels the pods must carry; empty: every pod of the namespace.",
        max_properties=16,
        values={"maxLength": 63, "pattern": LABEL_VALUE_PATTERN},
    )


class NetworkPolicySpec(Model):
    """Who may connect to the serving pods' port. Unless exposure is Cluster, a NetworkPolicy admits traffic to that
    port only from the peers exposure names, the pods listed in allow and the operator's own pods (its autoscaler
    reads /metrics); every other pod of the cluster is refused. Needs a network plugin that enforces NetworkPolicies.
    Absent: as exposure Namespace with nothing listed."""

    RULES = (
        rule(
            "!has(self.exposure) || self.exposure != 'Cluster' || !has(self.allow) || size(self.allow) == 0",
            "networkPolicy.allow has no effect with exposure Cluster (every pod may connect): remove allow or use "
            "exposure Namespace or Listed",
        ),
    )

    exposure: str = field(
        "Listed",
        "Namespace: every pod of the service's namespace, plus allow. Listed (the default once networkPolicy is "
        "given): only allow, and {} admits only the operator. Cluster: no NetworkPolicy, every pod of the cluster "
        "may connect (without spec.auth.apiKeySecret the status condition Exposed is True). A service without "
        "networkPolicy is treated as Namespace.",
        enum=EXPOSURES,
    )
    allow: tuple[NetworkPeer, ...] = field(
        (), "Who else may call: namespaces, optionally narrowed to pods with given labels.", max_items=32
    )


class InferenceServiceSpec(Model):
    """What to serve and where."""

    RULES = (
        rule(
            "self.engine.tensorParallelSize == self.resources.gpusPerReplica",
            "engine.tensorParallelSize must equal resources.gpusPerReplica: a replica shards the model over exactly "
            "its own GPUs",
            fieldPath=".engine.tensorParallelSize",
        ),
        rule(
            "!has(self.pools) || self.pools.map(p, p.replicas).sum() <= self.replicas",
            "the sum of pools[].replicas must be at most replicas (the total across pools)",
            fieldPath=".pools",
        ),
        rule(
            "!has(self.autoscaling) || !has(self.pools) || size(self.pools) == 0",
            "pools (fixed per-pool replicas) cannot be combined with autoscaling",
            fieldPath=".pools",
        ),
    )

    model: ModelSpec = field(...)
    engine: EngineEnvelope = field(
        factory=EngineEnvelope,
        description="The engine envelope: compiled engines are built for it, paged serving uses the same limits.",
    )
    runtime: RuntimeSpec = field(factory=RuntimeSpec)
    replicas: StrictInt = field(1, "Serving replicas in total across pools.", bounds=(0, 1000))
    pools: tuple[PoolOverride, ...] = field(
        (),
        "Per-pool replica overrides (their sum at most replicas); the remaining replicas are spread over the other "
        "pools by capacity. An override with replicas on a CPU pool lets that pool serve even when placement.vendors "
        "does not list cpu.",
        max_items=32,
        list_type="map",
        map_keys=("name",),
    )
    placement: Placement = field(factory=Placement)
    resources: Resources = field(factory=Resources)
    build: BuildSpec = field(factory=BuildSpec)
    routing: RoutingSpec = field(factory=RoutingSpec)
    # Replicas then follow the pods' own load metrics; spec.replicas is only the starting point.
    autoscaling: AutoscalingSpec | None = field(None)
    auth: AuthSpec = field(factory=AuthSpec)
    # None: as exposure Namespace (the service's own namespace and the operator may connect).
    network_policy: NetworkPolicySpec | None = field(None)

    @property
    def exposure(self) -> str:
        """Who may connect: spec.networkPolicy.exposure, Namespace when networkPolicy is absent."""
        return "Namespace" if self.network_policy is None else self.network_policy.exposure

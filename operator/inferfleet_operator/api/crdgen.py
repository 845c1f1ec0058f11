"""crdgen: the CustomResourceDefinitions generated from the models' defaults, enums and bounds (`python -m inferfleet_operator.api.crdgen crds/`)."""

from __future__ import annotations

import sys
from pathlib import Path

import yaml

from inferfleet_operator.api import types as api
from inferfleet_operator.api.crdgen_scaling import (
    autoscaling_schema,
    autoscaling_status_schema,
    routing_schema,
    routing_status_schema,
)
from inferfleet_operator.api.crdschema import array, boolean, column, integer, obj, rule, string, string_map
from inferfleet_operator.api.names import BUILD_KIND, GROUP, KINDS, NAME_LABEL, RUNTIME_KIND, SERVICE_KIND, VERSION
from inferfleet_operator.api.types import (
    BLOCK_SIZES,
    BOUNDS,
    BUILD_STATES,
    DTYPES,
    ENGINES,
    FALLBACKS,
    POLICIES,
    QUANTIZATIONS,
    TENSOR_PARALLEL_SIZES,
    VENDORS,
    default_of,
)

URI_PATTERN = r"^(pvc://[a-z0-9]([-a-z0-9.]*[a-z0-9])?/.+|hf://[^/]+/[^/]+|file:///.+|s3://[^/]+/.+)$"
QUANTITY_PATTERN = r"^[0-9]+(\.[0-9]+)?(m|k|M|G|T|Ki|Mi|Gi|Ti)?$"
# Patterns used inside CEL strings spell a literal dot as [.] (CEL has no \. escape).
# Bytes: a whole number, or a decimal with a unit; no `m` (512m is 0.512 bytes).
BYTES_PATTERN = r"^([0-9]+|[0-9]+([.][0-9]+)?(k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei))$"
# A label key (what a taint key is): optional DNS-subdomain prefix and "/", then a name of at most 63 characters.
LABEL_KEY_PATTERN = r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?([.][a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?[A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?$"
LABEL_VALUE_PATTERN = r"^(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])?$"
SECRET_NAME_PATTERN = r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*)?$"
DNS_LABEL_PATTERN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"
RESOURCE_NAME_PATTERN = r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?/[a-zA-Z0-9]([-a-zA-Z0-9_.]*[a-zA-Z0-9])?$"
MODEL_NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:/-]*$"


# ------------------------------------------------------------------ shared pieces


def bytes_quantity(description: str, field: str, default=None) -> dict:
    """A quantity of bytes: refuses the milli suffix with a message naming the field."""
    message = f"{field} must be whole bytes, e.g. 8Gi, 500M or 1073741824 (the m suffix means thousandths: 512m is 0.512 bytes)"
    return string(
        description, default, max_length=32, rules=[rule(f"self == '' || self.matches('{BYTES_PATTERN}')", message)]
    )


def image_rule(field: str) -> dict:
    return rule(
        f"self.{field}.size() > 0 && !self.{field}.contains(' ')",
        f"{field} must name a container image (not empty, no spaces)",
        fieldPath=f".{field}",
    )


def envelope_schema(description: str, rules=None) -> dict:
    d = lambda name: default_of(api.EngineEnvelope, name)  # noqa: E731
    return obj(
        description,
        {
            "maxContextLength": integer(
                "Longest sequence (prompt + completion) in tokens.",
                d("max_context_length"),
                BOUNDS["max_context_length"],
            ),
            "maxBatchSize": integer("Most sequences decoded together.", d("max_batch_size"), BOUNDS["max_batch_size"]),
            "dtype": string("Weight and activation dtype.", d("dtype"), DTYPES),
            "tensorParallelSize": integer(
                "Ranks one replica shards the model over (tensor parallelism): its GPUs, or processes on a CPU pool. Over 1, compiled pools are served paged.",
                d("tensor_parallel_size"),
                enum=TENSOR_PARALLEL_SIZES,
            ),
            "blockSize": integer("Tokens per KV-cache block.", d("block_size"), enum=BLOCK_SIZES),
        },
        default={},
        rules=rules,
    )


def network_policy_schema() -> dict:
    # Values are checked here (a pattern costs no CEL budget); a key that is no label key is refused by the API
    # server when the NetworkPolicy is applied, and reported in the service's status (ApplyFailed).
    labels = string_map("Labels the pods must carry; empty: every pod of the namespace.", 16)
    labels["additionalProperties"] |= {"maxLength": 63, "pattern": LABEL_VALUE_PATTERN}
    peer = obj(
        "Pods allowed to call the service.",
        {
            "namespace": string(
                "Their namespace; empty: the service's own.",
                pattern=r"^([a-z0-9]([-a-z0-9]*[a-z0-9])?)?$",
                max_length=63,
            ),
            "podLabels": labels,
        },
    )
    return obj(
        "Set: a NetworkPolicy admits traffic to the serving pods' port only from the pods listed in allow and from "
        "the operator's own pods (its autoscaler reads /metrics); every other pod of the cluster is refused. Needs a "
        "network plugin that enforces NetworkPolicies. Unset: no NetworkPolicy, the pods take any traffic.",
        {"allow": array("Who may call: namespaces, optionally narrowed to pods with given labels.", peer, 32)},
    )


def tolerations_schema(max_items: int = 32) -> dict:
    item = obj(
        "A toleration copied to the pods (same meaning as a pod's).",
        {
            "key": string(
                "Taint key (a label key such as nvidia.com/gpu); empty with operator Exists tolerates every taint.",
                max_length=253,
                rules=[
                    rule(
                        f"self == '' || self.matches('{LABEL_KEY_PATTERN}')",
                        "tolerations[].key must be a label key such as nvidia.com/gpu: an optional DNS prefix and '/', then "
                        "at most 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit",
                    )
                ],
            ),
            "operator": string("Exists or Equal.", "Equal", ("Exists", "Equal")),
            "value": string(
                "Taint value (Equal only).",
                max_length=63,
                rules=[
                    rule(
                        f"self.matches('{LABEL_VALUE_PATTERN}')",
                        "tolerations[].value must be a label value: letters, digits, '-', '_' or '.', starting and ending with a letter or digit",
                    )
                ],
            ),
            "effect": string("Empty: every effect.", enum=("", "NoSchedule", "PreferNoSchedule", "NoExecute")),
            "tolerationSeconds": integer(
                "NoExecute only: how long the pod stays after the taint appears.", bounds=(0, 86400 * 365)
            ),
        },
        rules=[
            rule(
                "!has(self.operator) || self.operator != 'Exists' || !has(self.value) || self.value == ''",
                "tolerations[].value must be empty when operator is Exists",
            ),
            rule(
                "(has(self.key) && self.key != '') || (has(self.operator) && self.operator == 'Exists')",
                "tolerations[].operator must be Exists when key is empty",
            ),
            rule(
                "!has(self.tolerationSeconds) || (has(self.effect) && self.effect == 'NoExecute')",
                "tolerations[].tolerationSeconds needs effect NoExecute",
            ),
        ],
    )
    return array("Tolerations for the nodes' taints.", item, max_items)


def condition_schema() -> dict:
    return obj(
        "A condition (metav1.Condition).",
        {
            "type": string("Condition type."),
            "status": string("True, False or Unknown.", enum=("True", "False", "Unknown")),
            "reason": string("CamelCase reason."),
            "message": string("Human-readable detail."),
            "lastTransitionTime": {"type": "string", "format": "date-time", "description": "When status last changed."},
            "observedGeneration": {
                "type": "integer",
                "format": "int64",
                "description": "Generation the condition was set for.",
            },
        },
        required=("type", "status"),
    )


def crd(
    kind: str,
    short: str,
    spec: dict,
    status: dict,
    columns: list[dict],
    root_rules=None,
    name_length=253,
) -> dict:
    # metadata may only restrict name; the bound keeps CEL rules over the name within the cost budget.
    metadata = {"type": "object", "properties": {"name": {"type": "string", "maxLength": name_length}}}
    schema = obj(
        f"{kind} ({GROUP}/{VERSION}).",
        {
            "apiVersion": {"type": "string"},
            "kind": {"type": "string"},
            "metadata": metadata,
            "spec": spec,
            "status": status,
        },
        required=("spec",),
        rules=root_rules,
    )
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": f"{KINDS[kind].plural}.{GROUP}", "labels": {NAME_LABEL: "inferfleet"}},
        "spec": {
            "group": GROUP,
            "scope": "Namespaced" if KINDS[kind].is_namespaced else "Cluster",
            "names": {
                "kind": kind,
                "listKind": f"{kind}List",
                "plural": KINDS[kind].plural,
                "singular": kind.lower(),
                "shortNames": [short],
                "categories": ["inferfleet"],
            },
            "versions": [
                {
                    "name": VERSION,
                    "served": True,
                    "storage": True,
                    "subresources": {"status": {}},
                    "additionalPrinterColumns": columns,
                    "schema": {"openAPIV3Schema": schema},
                }
            ],
        },
    }


AGE = column("Age", ".metadata.creationTimestamp", "date")


# ------------------------------------------------------------------ the kinds


def build_resources_schema() -> dict:
    d = lambda name: default_of(api.BuildResources, name)  # noqa: E731
    return obj(
        "Requests of the compile container.",
        {
            "cpu": string("CPU request, a Kubernetes quantity.", d("cpu"), pattern=QUANTITY_PATTERN),
            "memory": bytes_quantity(
                "Memory request and limit, a Kubernetes quantity of bytes.", "build.resources.memory", d("memory")
            ),
        },
        default={},
    )


def build_schema() -> dict:
    return obj(
        "How compile Jobs run. Not part of the engine key; a build shared with other services keeps the settings it was created with.",
        {
            "deadlineSeconds": integer(
                "Seconds one compile attempt may take, model download included (the Job's activeDeadlineSeconds).",
                default_of(api.BuildSpec, "deadline_seconds"),
                BOUNDS["build_deadline_seconds"],
            ),
            "resources": build_resources_schema(),
        },
        default={},
    )


def inference_service() -> dict:
    d_rt = lambda name: default_of(api.RuntimeSpec, name)  # noqa: E731
    d_res = lambda name: default_of(api.Resources, name)  # noqa: E731
    spec = obj(
        "What to serve and where.",
        {
            "model": obj(
                "The model to serve.",
                {
                    "name": string(
                        "Served model name: the OpenAI `model` id clients send.",
                        pattern=MODEL_NAME_PATTERN,
                        max_length=128,
                        rules=[
                            rule(
                                "self == oldSelf",
                                "model.name is immutable: create a new InferenceService to serve under another name",
                            )
                        ],
                    ),  # fmt: skip
                    "uri": string(
                        "Where the weights are: pvc://CLAIM/PATH, hf://ORG/NAME, file:///PATH (hostPath) or s3://BUCKET/KEY.",
                        max_length=1024,
                        rules=[
                            rule(
                                f"self.matches('{URI_PATTERN}')",
                                "model.uri must be pvc://CLAIM/PATH, hf://ORG/NAME, file:///ABSOLUTE/PATH or s3://BUCKET/KEY",
                            )
                        ],
                    ),  # fmt: skip
                    "revision": string(
                        "Model revision (branch, tag or commit).", default_of(api.ModelSpec, "revision"), max_length=128
                    ),
                    "size": bytes_quantity(
                        "Bytes the model's files take once downloaded (hf://, s3://), e.g. 16Gi. When set, the model emptyDir gets it as sizeLimit and "
                        "the serving and compile containers request it as ephemeral-storage; unset, the volume is unbounded and nothing is requested.",
                        "model.size",
                    ),
                    "credentialsSecret": string(
                        "Name of a Secret in the service's namespace whose keys become environment variables of the model download (the fetch init "
                        "containers of serving pods and compile Jobs, never the server): HF_TOKEN for hf://; AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, "
                        "AWS_SESSION_TOKEN, AWS_REGION, AWS_ENDPOINT_URL for s3://. The operator never reads it.",
                        pattern=SECRET_NAME_PATTERN,
                        max_length=253,
                    ),
                    "quantization": string(
                        "Weight quantization. Auto: as the checkpoint says (float weights, or its own quantization_config). None: float. "
                        "Int8 (per output channel) or Int4 (group-wise): a float checkpoint quantized by the runtime at load, weight-only. "
                        "Compiled engines serve float weights only: with Int8 or Int4 a pool a Compiled runtime fits is served paged.",
                        default_of(api.ModelSpec, "quantization"),
                        QUANTIZATIONS,
                    ),
                },
                required=("name", "uri"),
            ),
            "engine": envelope_schema(
                "The engine envelope: compiled engines are built for it, paged serving uses the same limits."
            ),
            "runtime": obj(
                "How each pool's runtime is chosen.",
                {
                    "policy": string(
                        "Auto: compiled where a Compiled runtime fits the pool, else paged. Paged: paged everywhere. Compiled: only pools a Compiled runtime fits.",
                        d_rt("policy"),
                        POLICIES,
                    ),
                    "fallback": string(
                        "What serves a pool whose engine build failed: Paged, or None (nothing; the service is Degraded).",
                        d_rt("fallback"),
                        FALLBACKS,
                    ),
                    "bridge": boolean("Serve with paged while a compiled engine builds.", d_rt("bridge")),
                },
                default={},
                rules=[
                    rule(
                        "!(has(self.policy) && has(self.fallback) && self.policy == 'Paged' && self.fallback == 'None')",
                        "runtime.fallback None has no effect with runtime.policy Paged (nothing is compiled): remove runtime.fallback or use policy Auto or Compiled",
                    )
                ],  # fmt: skip
            ),
            "replicas": integer(
                "Serving replicas in total across pools.",
                default_of(api.InferenceServiceSpec, "replicas"),
                BOUNDS["replicas"],
            ),
            "pools": array(
                "Per-pool replica overrides (their sum at most replicas); the remaining replicas are spread over the other pools by "
                "capacity. An override with replicas on a CPU pool lets that pool serve even when placement.vendors does not list cpu.",
                obj(
                    "One pool's replicas.",
                    {
                        "name": string(
                            "Pool name as shown in status.pools[].name.", pattern=DNS_LABEL_PATTERN, max_length=63
                        ),
                        "replicas": integer("Replicas in this pool.", bounds=BOUNDS["replicas"]),
                    },
                    required=("name", "replicas"),
                ),  # fmt: skip
                32,
                "map",
                ("name",),
            ),
            "placement": obj(
                "Where the service may run.",
                {
                    "vendors": array(
                        "Allowed vendors. Accelerator pools come first: replicas fill the GPU pools (by capacity) before any CPU pool gets one, "
                        "and CPU pools serve only when this list names cpu, a pools[] override gives them replicas, or no accelerator pool is "
                        "eligible. Empty: every vendor under that rule; [cpu]: CPU pools only.",
                        string("Vendor.", enum=VENDORS),
                        len(VENDORS),
                        "set",
                    ),
                    "nodeSelector": string_map("Labels every node used must carry.", 32),
                    "tolerations": tolerations_schema(),
                    "tolerateGpuTaints": boolean(
                        "Tolerate taints keyed by the GPU resource a pool's pods request (nvidia.com/gpu, amd.com/gpu, gpu.intel.com/i915, ...; any "
                        "effect), as Kubernetes' ExtendedResourceToleration does: such tainted nodes are eligible. False: only tolerations count.",
                        default_of(api.Placement, "tolerate_gpu_taints"),
                    ),
                },
                default={},
            ),
            "resources": obj(
                "Per replica.",
                {
                    "gpusPerReplica": integer(
                        "GPUs per replica (ignored on cpu pools).",
                        d_res("gpus_per_replica"),
                        BOUNDS["gpus_per_replica"],
                    ),
                    "cpu": string("CPU request, a Kubernetes quantity.", d_res("cpu"), pattern=QUANTITY_PATTERN),
                    "memory": bytes_quantity(
                        "Memory request and limit, a Kubernetes quantity of bytes.", "resources.memory", d_res("memory")
                    ),
                },
                default={},
            ),
            "build": build_schema(),
            "routing": routing_schema(),
            "autoscaling": autoscaling_schema(),
            "auth": obj(
                "Who may call the service's OpenAI endpoints. /health and /ready stay open for the probes, and /metrics "
                "for the operator's autoscaler and routing.",
                {
                    "apiKeySecret": obj(
                        "A Secret in the service's namespace whose key holds the API keys clients must send as "
                        "'Authorization: Bearer KEY' (several keys separated by commas). The serving containers get it "
                        "as the environment variable INFERFLEET_API_KEY through a secretKeyRef; the operator never reads "
                        "it. Unset, the endpoints are open.",
                        {
                            "name": string("Name of the Secret.", pattern=SECRET_NAME_PATTERN, max_length=253),
                            "key": string(
                                "Key inside the Secret.",
                                default_of(api.SecretKeyRef, "key"),
                                pattern=r"^[-._a-zA-Z0-9]+$",
                                max_length=253,
                            ),
                        },
                        required=("name",),
                    ),
                },
                default={},
            ),
            "networkPolicy": network_policy_schema(),
        },
        required=("model",),
        rules=[
            rule(
                "self.engine.tensorParallelSize == self.resources.gpusPerReplica",
                "engine.tensorParallelSize must equal resources.gpusPerReplica: a replica shards the model over exactly its own GPUs",
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
        ],  # fmt: skip
    )
    pool_entry = obj(
        "One pool serving (or meant to serve) this service.",
        {
            **{
                k: string(v)
                for k, v in {
                    "name": "Pool name (vendor-product).",
                    "vendor": "GPU vendor.",
                    "product": "GPU product.",
                    "architecture": "GPU architecture.",
                    "runtime": "Chosen InferenceRuntime.",
                    "engine": "Planned engine: Compiled or Paged.",
                    "choiceReason": "Why this runtime.",
                    "servingEngine": "What serves now: Compiled, Paged or None.",
                    "servingRuntime": "InferenceRuntime serving now (paged).",
                    "engineBuild": "The EngineBuild this pool is built for.",
                    "buildState": "Its state.",
                    "servingEngineBuild": "The EngineBuild whose engine serves now.",
                    "reason": "CamelCase reason of the pool's state.",
                    "message": "Detail.",
                }.items()
            },  # fmt: skip
            "nodes": integer("Eligible nodes in the pool."),
            "desiredReplicas": integer("Replicas planned for the pool."),
            "excludedNodes": array(
                "Nodes of the pool this service cannot use, by name (at most 100 listed).",
                obj(
                    "One node left out.",
                    {"name": string("Node name."), "reason": string("CamelCase reason."), "message": string("Detail.")},
                    required=("name",),
                ),
                100,
                "map",
                ("name",),
            ),
            "excludedNodeCount": integer("Nodes of the pool left out, all counted."),
            "readyReplicas": integer("Ready replicas of the pool's Deployment."),
        },
        required=("name",),
    )
    excluded = obj(
        "A pool left out, and why.", {k: string(k) for k in ("name", "vendor", "product", "reason")}, required=("name",)
    )
    status = obj(
        "Observed state; written by the operator.",
        {
            "observedGeneration": {
                "type": "integer",
                "format": "int64",
                "description": "Generation the status was computed for.",
            },
            "conditions": array("Ready, EnginesBuilt, RolledOut, Degraded.", condition_schema(), 16, "map", ("type",)),
            "endpoint": string("OpenAI-compatible base URL inside the cluster."),
            "poolCount": integer("Pools chosen to serve."),
            "runtimes": string("What serves now, e.g. Compiled=1,Paged=2."),
            "replicas": integer("Replicas planned across pools."),
            "readyReplicas": integer("Ready replicas across pools."),
            "unplacedReplicas": integer("Replicas no pool has room for."),
            "pools": array("One entry per chosen pool.", pool_entry, 256, "map", ("name",)),
            "excludedPools": array("Pools left out, with reasons.", excluded, 256, "map", ("name",)),
            "routing": routing_status_schema(),
            "autoscaling": autoscaling_status_schema(),
        },
    )
    columns = [
        column("Ready", '.status.conditions[?(@.type=="Ready")].status'),
        column("Pools", ".status.poolCount", "integer"),
        column("Runtimes", ".status.runtimes"),
        column("Endpoint", ".status.endpoint", description="", type_="string") | {"priority": 1},
        AGE,
    ]
    root_rules = [rule("self.metadata.name.size() <= 63 && self.metadata.name.matches('^[a-z]([-a-z0-9]*[a-z0-9])?$')",
                       "metadata.name must be a DNS label that starts with a letter (at most 63 characters): it names the Service")]  # fmt: skip
    return crd(
        SERVICE_KIND,
        "infsvc",
        spec,
        status,
        columns,
        root_rules,
        name_length=63,
    )


def inference_runtime() -> dict:
    d = lambda name: default_of(api.InferenceRuntimeSpec, name)  # noqa: E731
    spec = obj(
        "One runtime image and where it can serve.",
        {
            "engine": string("Paged or Compiled.", enum=ENGINES),
            "vendors": array(
                "GPU vendors it serves on.", string("Vendor.", enum=VENDORS), len(VENDORS), "set", min_items=1
            ),
            "architectures": array(
                "GPU architectures it serves on (empty: every architecture of the vendors), e.g. sm90, gfx942.",
                string("Architecture.", max_length=32),
                64,
                "set",
            ),
            "image": string("Serving image (runs `inferfleet-runtime serve`); not empty.", max_length=512),
            "compileImage": string("Compiled only: image that runs `inferfleet-runtime compile`.", max_length=512),
            "gpuResource": string(
                "Extended resource pods request (empty: the one the pool's nodes advertise).",
                pattern=RESOURCE_NAME_PATTERN,
                max_length=253,
            ),
            "priority": integer("Higher wins among runtimes that fit a pool.", d("priority"), BOUNDS["priority"]),
        },
        required=("engine", "vendors", "image"),
        rules=[
            image_rule("image"),
            rule(
                "self.engine != 'Compiled' || (has(self.compileImage) && self.compileImage.size() > 0 && !self.compileImage.contains(' '))",
                "compileImage is required when engine is Compiled and must name a container image (not empty, no spaces)",
                fieldPath=".compileImage",
            ),
            rule(
                "self.engine != 'Paged' || !has(self.compileImage) || self.compileImage == ''",
                "compileImage is only used by engine Compiled: remove it or set engine Compiled",
                fieldPath=".compileImage",
            ),
        ],  # fmt: skip
    )
    columns = [
        column("Engine", ".spec.engine"),
        column("Vendors", ".spec.vendors"),
        column("Priority", ".spec.priority", "integer"),
        AGE,
    ]
    return crd(RUNTIME_KIND, "infrt", spec, obj("Unused.", {}), columns)


def engine_build() -> dict:
    d = lambda name: default_of(api.EngineBuildSpec, name)  # noqa: E731
    fixed = "is immutable: an EngineBuild records one engine; a different engine is a different EngineBuild"
    spec = obj(
        "One compiled engine, named by its key. Written by the operator.",
        {
            "engineKey": string(
                "Content hash of what determines the engine.",
                pattern=r"^[0-9a-f]{16}$",
                rules=[rule("self == oldSelf", f"engineKey {fixed}")],
            ),
            "modelUri": string(
                "Model weights URI.",
                max_length=1024,
                rules=[
                    rule("self == oldSelf", f"modelUri {fixed}"),
                    rule(
                        f"self.matches('{URI_PATTERN}')",
                        "modelUri must be pvc://CLAIM/PATH, hf://ORG/NAME, file:///ABSOLUTE/PATH or s3://BUCKET/KEY",
                    ),
                ],
            ),
            "revision": string("Model revision.", max_length=128, rules=[rule("self == oldSelf", f"revision {fixed}")]),
            "envelope": envelope_schema(
                "The envelope the engine is compiled for.", rules=[rule("self == oldSelf", f"envelope {fixed}")]
            ),
            "vendor": string("Target vendor.", enum=VENDORS, rules=[rule("self == oldSelf", f"vendor {fixed}")]),
            "architecture": string(
                "Target GPU architecture.", max_length=32, rules=[rule("self == oldSelf", f"architecture {fixed}")]
            ),
            "image": string(
                "Serving image that loads the engine.",
                max_length=512,
                rules=[rule("self == oldSelf", f"image {fixed}")],
            ),
            "compileImage": string(
                "Image that compiles it.", max_length=512, rules=[rule("self == oldSelf", f"compileImage {fixed}")]
            ),
            "gpuResource": string("Extended resource the compile Job requests.", max_length=253),
            "gpus": integer("GPUs the compile Job requests.", d("gpus"), (0, 16)),
            "maxAttempts": integer(
                "Compile Jobs tried before the build is Failed.", d("max_attempts"), BOUNDS["max_attempts"]
            ),
            "backoffSeconds": integer(
                "Delay after the first failed attempt; doubles each attempt.",
                d("backoff_seconds"),
                BOUNDS["backoff_seconds"],
            ),
            "placement": obj(
                "Where compile Jobs may run (mutable: nodes come and go).",
                {
                    "nodeNames": array(
                        "Nodes of the target architecture.", string("Node name.", max_length=253), 5000, "set"
                    ),
                    "tolerations": tolerations_schema(33),
                },  # the service's 32 and the GPU resource's
                default={},
            ),
            "deadlineSeconds": integer(
                "Seconds one attempt may take (the Job's activeDeadlineSeconds).",
                d("deadline_seconds"),
                BOUNDS["build_deadline_seconds"],
            ),
            "resources": build_resources_schema(),
            "modelSize": bytes_quantity(
                "Bytes of the downloaded model (emptyDir sizeLimit, ephemeral-storage request); empty: unbounded.",
                "modelSize",
            ),
            "credentialsSecret": string(
                "Secret whose keys become the model download's environment; empty: none.",
                pattern=SECRET_NAME_PATTERN,
                max_length=253,
            ),
            "quantization": string(
                "The service's spec.model.quantization (part of the key).",
                d("quantization"),
                QUANTIZATIONS,
                rules=[rule("self == oldSelf", f"quantization {fixed}")],
            ),
        },
        required=("engineKey", "modelUri", "revision", "envelope", "vendor", "architecture", "image", "compileImage"),
    )
    status = obj(
        "Build progress; written by the operator.",
        {
            "state": string("Pending, Building, Ready or Failed.", enum=BUILD_STATES),
            "attempts": integer("Compile Jobs created so far."),
            "maxAttempts": integer("Attempts allowed."),
            "currentJob": string("Job of the latest attempt."),
            "progress": string("What the latest attempt is doing."),
            "message": string("Detail."),
            "failureReason": string("Why the latest attempt failed."),
            "artifactPath": string("Engine directory in the engine cache: <mount>/<key>/<modelDigest>."),
            "modelDigest": string(
                "Digest of the compiled model's content manifest (file names, sizes, sha256, hub commit), reported by "
                "the compile Job; names the engine's directory under its key.",
                pattern=r"^[0-9a-f]{16}$",
            ),
            "resolvedRevision": string(
                "The hub commit an hf:// revision resolved to when the engine was compiled.", pattern=r"^[0-9a-f]{40}$"
            ),
            "artifactSizeBytes": {"type": "integer", "format": "int64", "description": "Engine size."},
            "startTime": {
                "type": "string",
                "format": "date-time",
                "description": "When the successful attempt started.",
            },
            "completionTime": {"type": "string", "format": "date-time", "description": "When it finished."},
            "durationSeconds": integer("Build duration."),
            "nextAttemptTime": {
                "type": "string",
                "format": "date-time",
                "description": "When the next attempt may start (backoff).",
            },
            "observedGeneration": {
                "type": "integer",
                "format": "int64",
                "description": "Generation the status was computed for.",
            },
            "conditions": array("Built.", condition_schema(), 8, "map", ("type",)),
        },
    )
    columns = [
        column("State", ".status.state"),
        column("Attempts", ".status.attempts", "integer"),
        column("Arch", ".spec.architecture"),
        column("Progress", ".status.progress") | {"priority": 1},
        AGE,
    ]
    root_rules = [rule("self.metadata.name == self.spec.engineKey", "metadata.name must equal spec.engineKey")]
    return crd(BUILD_KIND, "eb", spec, status, columns, root_rules, name_length=16)


FILES = {
    "inferenceservices.yaml": inference_service,
    "inferenceruntimes.yaml": inference_runtime,
    "enginebuilds.yaml": engine_build,
}
HEADER = "# Generated by `python -m inferfleet_operator.api.crdgen crds/` from operator/inferfleet_operator/api/crdgen.py; do not edit.\n"


def render(builder) -> str:
    return HEADER + yaml.safe_dump(builder(), sort_keys=False, width=120)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    out = Path(argv[0] if argv else "crds")
    out.mkdir(parents=True, exist_ok=True)
    for name, builder in FILES.items():
        (out / name).write_text(render(builder))
        print(f"Wrote {out / name}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

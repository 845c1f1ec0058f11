"""Builders of the objects the operator applies: pool Deployments, the Service, the PodDisruptionBudget, EngineBuilds,
compile Jobs (the NetworkPolicy is network.py's)."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

from inferfleet_operator.api.names import (
    API_VERSION,
    BUILD_KIND,
    COMPONENT_LABEL,
    ENGINE_KEY_ANNOTATION,
    ENGINE_KEY_LABEL,
    ENGINE_LABEL,
    KINDS,
    MANAGED_BY_LABEL,
    MANAGER,
    NAME_LABEL,
    POOL_LABEL,
    REF_LABEL_PREFIX,
    RUNTIME_ANNOTATION,
    SERVICE_LABEL,
)
from inferfleet_operator.api.types import (
    EngineBuildSpec,
    InferenceRuntime,
    InferenceService,
    PlanSettings,
    Toleration,
    to_dict,
    uri_scheme,
)
from inferfleet_operator.plan.host_paths import normalise
from inferfleet_operator.plan.pools import Pool

RUN_AS = 1000  # the runtime images' non-root user
API_KEY_ENV = "INFERFLEET_API_KEY"  # what `inferfleet-runtime serve` reads its API keys from


def common_labels(service: str | None = None, pool: str | None = None) -> dict:
    labels = {NAME_LABEL: "inferfleet", MANAGED_BY_LABEL: MANAGER}
    if service is not None:
        labels[SERVICE_LABEL] = service
    if pool is not None:
        labels[POOL_LABEL] = pool
    return labels


def bounded_name(*parts: str, limit: int = 63) -> str:
    """Join with "-"; past `limit`, cut and append a short hash so distinct inputs stay distinct."""
    name = "-".join(parts)
    if len(name) <= limit:
        return name
    digest = hashlib.sha256(name.encode()).hexdigest()[:8]
    return f"{name[: limit - 9].rstrip('-')}-{digest}"


def deployment_name(service: str, pool: str) -> str:
    return bounded_name(service, pool)


def ref_label(service: str) -> str:
    return REF_LABEL_PREFIX + bounded_name(service)


@dataclass(frozen=True)
class PoolServing:
    """What one pool's Deployment serves."""

    pool: Pool
    runtime: InferenceRuntime  # whose image serves
    engine: str  # "Paged" | "Compiled"
    engine_key: str  # the compiled engine served ("" when paged)
    replicas: int
    gpu_resource: str  # "" for cpu pools
    model_digest: str = ""  # the served build's model content digest ("" for builds made before content addressing)
    engine_digest: str = ""  # the digest of the engine its compile Job built (status.engineDigest; "" when unknown)


def engine_dir(settings: PlanSettings, key: str, model_digest: str = "") -> str:
    """Where a compiled engine lives in the engine cache: <mount>/<key>/<model digest>, or <mount>/<key> for an
    engine built before its directory was addressed by the model's content."""
    return (
        f"{settings.engine_cache_mount}/{key}/{model_digest}"
        if model_digest
        else f"{settings.engine_cache_mount}/{key}"
    )


# ------------------------------------------------------------------ pod pieces


# The root filesystem is read-only: every cache (Triton kernels, Hugging Face, Python) goes to the /tmp emptyDir.
WRITABLE_ENV = [
    {"name": "HOME", "value": "/tmp"},
    {"name": "XDG_CACHE_HOME", "value": "/tmp/cache"},
    {"name": "HF_HOME", "value": "/tmp/cache/huggingface"},
    {"name": "TRITON_CACHE_DIR", "value": "/tmp/cache/triton"},
]


def _env() -> list[dict]:
    return [dict(item) for item in WRITABLE_ENV]


def _api_key_env(auth) -> list[dict]:
    """The serving container's API keys, by reference to the user's Secret (its value never passes the operator)."""
    ref = auth.api_key_secret
    if ref is None:
        return []
    return [{"name": API_KEY_ENV, "valueFrom": {"secretKeyRef": {"name": ref.name, "key": ref.key}}}]


def _pod_security() -> dict:
    return {
        "runAsNonRoot": True,
        "runAsUser": RUN_AS,
        "runAsGroup": RUN_AS,
        "fsGroup": RUN_AS,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def _container_security() -> dict:
    return {
        "allowPrivilegeEscalation": False,
        "capabilities": {"drop": ["ALL"]},
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "seccompProfile": {"type": "RuntimeDefault"},
    }


def _tolerations(tolerations: tuple[Toleration, ...]) -> list[dict]:
    """Toleration models -> pod tolerations, leaving out empty strings (empty effect means every effect)."""
    return [{k: v for k, v in to_dict(t).items() if v != "" or k == "key"} for t in tolerations]


@dataclass(frozen=True)
class ModelSource:
    """Where a pod finds its model: the directory, the "model" volume, the args of the init containers that fill it,
    and the node model cache's volume when the model is fetched through it (then the directory is a link into it)."""

    directory: str
    volume: dict
    fetches: list[list[str]]
    cache_volume: dict | None = None

    @property
    def volumes(self) -> list[dict]:
        return [self.volume] + ([self.cache_volume] if self.cache_volume else [])

    def reader_mounts(self, settings: PlanSettings, model_read_only: bool = True) -> list[dict]:
        """The mounts of the container that reads the model (the node cache read-only: only a fetch writes it)."""
        mounts = [{"name": "model", "mountPath": settings.model_mount, "readOnly": model_read_only}]
        if self.cache_volume:
            mounts.append({"name": MODEL_CACHE_VOLUME, "mountPath": settings.model_cache_mount, "readOnly": True})
        return mounts

    @property
    def stored_in_pod(self) -> bool:
        """Whether the model's bytes live in the pod's own emptyDir (fetched without the node cache)."""
        return bool(self.fetches) and self.cache_volume is None


MODEL_CACHE_VOLUME = "model-cache"


def _model_source(uri: str, revision: str, settings: PlanSettings, size: str = "") -> ModelSource:
    """The model's directory, volumes and fetches. A downloaded model's emptyDir is limited to `size` when it is
    stated; with the node model cache the emptyDir holds only the link `fetch --node-cache` makes."""
    scheme = uri_scheme(uri)
    rest = uri.split("://", 1)[1]
    if scheme == "pvc":
        claim, _, path = rest.partition("/")
        volume = {"name": "model", "persistentVolumeClaim": {"claimName": claim, "readOnly": True}}
        return ModelSource(f"{settings.model_mount}/{path.strip('/')}", volume, [])
    if scheme == "file":
        # The path host_paths checked against the allowed roots, normalised: what is mounted is what was allowed.
        volume = {"name": "model", "hostPath": {"path": normalise(rest), "type": "Directory"}}
        return ModelSource(settings.model_mount, volume, [])
    directory = f"{settings.model_mount}/model"
    args = ["fetch", "--uri", uri, "--to", directory]
    if revision and revision != "main":
        args += ["--revision", revision]
    if settings.model_cache_claim:
        args += ["--node-cache", settings.model_cache_mount]
        if settings.model_cache_budget_bytes:
            args += ["--node-cache-budget", str(settings.model_cache_budget_bytes)]
        cache = {"name": MODEL_CACHE_VOLUME, "persistentVolumeClaim": {"claimName": settings.model_cache_claim}}
        return ModelSource(directory, {"name": "model", "emptyDir": {}}, [args], cache)
    return ModelSource(directory, {"name": "model", "emptyDir": {"sizeLimit": size} if size else {}}, [args])


def _fetch_container(image: str, args: list[str], settings: PlanSettings, credentials_secret: str) -> dict:
    """The init container that downloads the model (into the node model cache, when args name it). The credentials
    Secret's keys (HF_TOKEN, AWS_*) become its environment: only this container's, never the server's."""
    mounts = [{"name": "model", "mountPath": settings.model_mount}, {"name": "tmp", "mountPath": "/tmp"}]
    if "--node-cache" in args:
        mounts.append({"name": MODEL_CACHE_VOLUME, "mountPath": settings.model_cache_mount})
    container = {
        "name": "fetch-model",
        "image": image,
        "command": ["inferfleet-runtime"],
        "args": args,
        "env": _env(),
        "resources": {"requests": {"cpu": "500m", "memory": "1Gi"}, "limits": {"memory": "4Gi"}},
        "securityContext": _container_security(),
        # fetch writes its error line as the termination message; a crash leaves the log's tail instead.
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "volumeMounts": mounts,
    }
    if credentials_secret:
        container["envFrom"] = [{"secretRef": {"name": credentials_secret}}]
    return container


def _with_model_storage(requests: dict, size: str, has_fetch: bool) -> dict:
    """A downloaded model lives in the pod's emptyDir for the pod's life: the long-running container requests
    its size as ephemeral-storage, so the scheduler picks a node with room for it."""
    return requests | {"ephemeral-storage": size} if size and has_fetch else requests


def pod_tolerations(user: tuple[Toleration, ...], tolerate_gpu_taints: bool, gpu_resource: str) -> list[dict]:
    """placement.tolerations plus, unless opted out, one for taints keyed by the GPU resource the pod requests."""
    out = _tolerations(user)
    if tolerate_gpu_taints and gpu_resource:
        gpu = {"key": gpu_resource, "operator": "Exists"}
        if gpu not in out:
            out.append(gpu)
    return out


def _node_affinity(pool: Pool) -> dict:
    """Pin to the pool: by its product label when every node carries one (no roll when nodes join), else by
    node name (exact, but the pod template changes as nodes join or leave)."""
    if pool.pool_label is not None:
        key, value = pool.pool_label
        terms = [{"matchExpressions": [{"key": key, "operator": "In", "values": [value]}]}]
    else:
        terms = _node_name_terms(pool.node_names)
    return {"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}}


def _node_name_terms(node_names) -> list[dict]:
    """One term per node: the API server allows exactly one value in a `matchFields` In requirement, and
    terms are ORed, so this pins to any of the named nodes."""
    return [{"matchFields": [{"key": "metadata.name", "operator": "In", "values": [name]}]} for name in node_names]


def _serve_limit_args(envelope) -> list[str]:
    """The envelope as `inferfleet-runtime serve` (paged) spells it; the tensor-parallel size where it is over 1."""
    args = [
        "--max-context-length", str(envelope.max_context_length),
        "--max-num-seqs", str(envelope.max_batch_size),
        "--dtype", envelope.dtype,
        "--block-size", str(envelope.block_size),
    ]  # fmt: skip
    if envelope.tensor_parallel_size > 1:
        args += ["--tensor-parallel-size", str(envelope.tensor_parallel_size)]
    return args


# Shared memory of a tensor-parallel pod: the ranks' collectives (NCCL, RCCL, gloo) pass buffers through /dev/shm,
# which a container otherwise gets at 64 MiB. A memory-backed emptyDir counts against the pod's memory limit.
SHARED_MEMORY_LIMIT = "1Gi"


# A removed serving pod keeps accepting connections this long after it starts terminating: the Service's endpoints
# and every node's kube-proxy rules drop it within about a second, and until then new connections still reach it
# (without the wait a scale-down refused some, measured on kind). Then SIGTERM: the server stops listening and
# finishes the requests in flight, within the grace period.
PRE_STOP_SLEEP_SECONDS = 10
TERMINATION_GRACE_SECONDS = 120  # the wait above plus 110 s for the requests in flight to finish


def _probe(path: str, period: int, failures: int) -> dict:
    return {
        "httpGet": {"path": path, "port": "http"},
        "periodSeconds": period,
        "failureThreshold": failures,
        "timeoutSeconds": 5,
    }


# ------------------------------------------------------------------ builders


def deployment_for_pool(service: InferenceService, serving: PoolServing, settings: PlanSettings) -> dict:
    spec = service.spec
    name = deployment_name(service.meta.name, serving.pool.name)
    labels = common_labels(service.meta.name, serving.pool.name) | {
        ENGINE_LABEL: serving.engine.lower(),
        COMPONENT_LABEL: "server",
    }
    annotations = {ENGINE_KEY_ANNOTATION: serving.engine_key, RUNTIME_ANNOTATION: serving.runtime.name}
    image = serving.runtime.spec.image
    volumes = [{"name": "tmp", "emptyDir": {}}]
    mounts = [{"name": "tmp", "mountPath": "/tmp"}]
    init_containers = []
    model_in_pod = False
    if serving.engine == "Compiled":
        directory = engine_dir(settings, serving.engine_key, serving.model_digest)
        args = ["serve", "--engine-dir", directory, "--engine", "compiled"]
        if serving.engine_digest:  # the server loads only that engine: the folder is writable by others than its Job
            args += ["--engine-digest", serving.engine_digest]
        volumes.append(
            {"name": "engines", "persistentVolumeClaim": {"claimName": settings.engine_cache_claim, "readOnly": True}}
        )
        mounts.append({"name": "engines", "mountPath": settings.engine_cache_mount, "readOnly": True})
    else:
        source = _model_source(spec.model.uri, spec.model.revision, settings, spec.model.size)
        args = ["serve", "--model", source.directory, "--engine", "paged"] + _serve_limit_args(spec.engine)
        if spec.routing.mode == "Router":  # the pod measures its profile before it is ready; its router reads it
            args.append("--calibrate")
        if spec.model.runtime_quantization:
            args += ["--quantization", spec.model.runtime_quantization]
        volumes += source.volumes
        mounts += source.reader_mounts(settings)
        init_containers = [_fetch_container(image, a, settings, spec.model.credentials_secret) for a in source.fetches]
        model_in_pod = source.stored_in_pod
        if spec.engine.tensor_parallel_size > 1:
            volumes.append({"name": "dshm", "emptyDir": {"medium": "Memory", "sizeLimit": SHARED_MEMORY_LIMIT}})
            mounts.append({"name": "dshm", "mountPath": "/dev/shm"})
    args += ["--port", str(settings.port), "--served-model-name", spec.model.name]
    limits = {"memory": spec.resources.memory}
    if serving.gpu_resource:
        limits[serving.gpu_resource] = str(spec.resources.gpus_per_replica)
    container = {
        "name": "server",
        "image": image,
        "command": ["inferfleet-runtime"],
        "args": args,
        "env": _env() + _api_key_env(spec.auth),
        "ports": [{"name": "http", "containerPort": settings.port, "protocol": "TCP"}],
        "resources": {
            "requests": _with_model_storage(
                {"cpu": spec.resources.cpu, "memory": spec.resources.memory}, spec.model.size, model_in_pod
            ),
            "limits": limits,
        },
        # Loading weights can take minutes: the startup probe holds liveness off for up to 20 minutes.
        "startupProbe": _probe("/health", 10, 120),
        "livenessProbe": _probe("/health", 10, 3),
        "readinessProbe": _probe("/ready", 5, 2),
        "lifecycle": {"preStop": {"sleep": {"seconds": PRE_STOP_SLEEP_SECONDS}}},
        "securityContext": _container_security(),
        "volumeMounts": mounts,
    }
    pod_spec = {
        "affinity": _node_affinity(serving.pool),
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": _pod_security(),
        "terminationGracePeriodSeconds": TERMINATION_GRACE_SECONDS,
        "containers": [container],
        "volumes": volumes,
    }
    if init_containers:
        pod_spec["initContainers"] = init_containers
    if spec.placement.node_selector:
        pod_spec["nodeSelector"] = dict(sorted(spec.placement.node_selector.items()))
    tolerations = pod_tolerations(spec.placement.tolerations, spec.placement.tolerate_gpu_taints, serving.gpu_resource)
    if tolerations:
        pod_spec["tolerations"] = tolerations
    return {
        "apiVersion": KINDS["Deployment"].api_version,
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": service.meta.namespace, "labels": labels, "annotations": annotations},
        "spec": {
            "replicas": serving.replicas,
            "selector": {"matchLabels": common_labels(service.meta.name, serving.pool.name)},
            # Surge before removing: a serving replica goes away only once its replacement is ready.
            "strategy": {"type": "RollingUpdate", "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0}},
            "template": {"metadata": {"labels": dict(labels), "annotations": dict(annotations)}, "spec": pod_spec},
        },
    }


def service_for(service: InferenceService, settings: PlanSettings, component: str = "server") -> dict:
    """The service's endpoint: one Service over its router's pods (component router) or every pool's serving pods."""
    return {
        "apiVersion": KINDS["Service"].api_version,
        "kind": "Service",
        "metadata": {
            "name": service.meta.name,
            "namespace": service.meta.namespace,
            "labels": common_labels(service.meta.name),
        },
        "spec": {
            "type": "ClusterIP",
            "selector": {SERVICE_LABEL: service.meta.name, COMPONENT_LABEL: component},
            "ports": [{"name": "http", "port": settings.port, "targetPort": "http", "protocol": "TCP"}],
        },
    }


def endpoint_for(service: InferenceService, settings: PlanSettings) -> str:
    return f"http://{service.meta.name}.{service.meta.namespace}.svc:{settings.port}/v1"


def pdb_for(service: InferenceService) -> dict:
    """At most one serving pod of the service disrupted at a time (maxUnavailable, so a 1-replica service
    still drains)."""
    return {
        "apiVersion": KINDS["PodDisruptionBudget"].api_version,
        "kind": "PodDisruptionBudget",
        "metadata": {
            "name": service.meta.name,
            "namespace": service.meta.namespace,
            "labels": common_labels(service.meta.name),
        },
        "spec": {
            "maxUnavailable": 1,
            "selector": {"matchLabels": {SERVICE_LABEL: service.meta.name, COMPONENT_LABEL: "server"}},
        },
    }


def engine_build_for(namespace: str, spec: EngineBuildSpec | dict, references: list[str]) -> dict:
    """An EngineBuild named by its key; one ref label per referencing service (GC reads references from
    services' status, the labels are for people and selectors)."""
    spec_dict = spec if isinstance(spec, dict) else to_dict(spec)
    key = spec_dict["engineKey"]
    labels = common_labels() | {ENGINE_KEY_LABEL: key}
    labels.update({ref_label(name): "true" for name in sorted(set(references))})
    return {
        "apiVersion": API_VERSION,
        "kind": BUILD_KIND,
        "metadata": {"name": key, "namespace": namespace, "labels": labels},
        "spec": spec_dict,
    }


def is_owned_by(obj: dict, uid: str) -> bool:
    """True when obj names `uid` among its ownerReferences. Labels say what an object is about, anyone can set
    them; an owner reference with the owner's UID is what the operator itself wrote (or the object's creator
    meant), so only such objects are counted, overwritten or deleted."""
    refs = (obj.get("metadata") or {}).get("ownerReferences") or []
    return bool(uid) and any(ref.get("uid") == uid for ref in refs)


def is_managed(obj: dict) -> bool:
    """True when obj carries the operator's managed-by label (EngineBuilds are shared, so they have no owner)."""
    return ((obj.get("metadata") or {}).get("labels") or {}).get(MANAGED_BY_LABEL) == MANAGER


def owner_reference(api_version: str, kind: str, name: str, uid: str) -> dict:
    return {
        "apiVersion": api_version,
        "kind": kind,
        "name": name,
        "uid": uid,
        "controller": True,
        "blockOwnerDeletion": True,
    }

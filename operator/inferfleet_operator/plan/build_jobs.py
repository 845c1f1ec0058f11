"""Builders of the Jobs the operator runs for EngineBuilds: one compile Job per attempt (with its pod failure
policy and TTL), and the prune Job that removes a garbage-collected build's engine directory."""

from __future__ import annotations

from inferfleet_operator.api.names import (
    ATTEMPT_ANNOTATION,
    BUILD_LABEL,
    COMPONENT_LABEL,
    ENGINE_KEY_LABEL,
    KINDS,
)
from inferfleet_operator.api.types import EngineBuildSpec, PlanSettings
from inferfleet_operator.plan.manifests import (
    _container_security,
    _env,
    _fetch_container,
    _model_source,
    _node_name_terms,
    _pod_security,
    _tolerations,
    _with_model_storage,
    bounded_name,
    common_labels,
    engine_dir,
)


def _envelope_args(envelope) -> list[str]:
    """The envelope as `inferfleet-runtime compile` spells it."""
    return [
        "--max-context-length", str(envelope.max_context_length),
        "--max-batch-size", str(envelope.max_batch_size),
        "--dtype", envelope.dtype,
        "--tensor-parallel-size", str(envelope.tensor_parallel_size),
        "--block-size", str(envelope.block_size),
    ]  # fmt: skip


def compile_backend(vendor: str) -> str:
    return "tensorrt" if vendor == "nvidia" else "aotinductor"


# A finished compile Job (and its pods' logs) is kept a day, then deleted by the TTL controller; the EngineBuild's
# status keeps the outcome (builds.plan_build).
COMPILE_JOB_TTL_SECONDS = 86400
UNSUPPORTED_EXIT_CODE = 2  # `compile` and `fetch`: bad input (an unsupported model, a bad URI); retrying cannot help


def compile_pod_failure_policy(has_fetch: bool) -> dict:
    """A pod disrupted (node drained or lost, preempted: condition DisruptionTarget) does not count against the
    Job's backoffLimit, so the Job runs a new pod and the attempt goes on; exit code 2 from `compile` (or from the
    model fetch) fails the Job at once (reason PodFailurePolicy), and the build with it."""
    rules = [{"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}]
    for container in ["compile"] + (["fetch-model"] if has_fetch else []):
        exit_codes = {"containerName": container, "operator": "In", "values": [UNSUPPORTED_EXIT_CODE]}
        rules.append({"action": "FailJob", "onExitCodes": exit_codes})
    return {"rules": rules}


def compile_job_for(
    name: str, namespace: str, spec: EngineBuildSpec, attempt: int, settings: PlanSettings, engine_digest: str = ""
) -> dict:
    """The Job of one attempt of a build. backoffLimit 0: retries are EngineBuild attempts, each its own Job
    (a pod lost with its node is not an attempt: compile_pod_failure_policy). An engine the Job finds in its
    directory is rebuilt unless it is the engine of engine_digest (the one the build recorded, "" for none), or any
    intact one of the key when the administrator shares engines across namespaces."""
    job_name = bounded_name(name, str(attempt))
    labels = common_labels() | {BUILD_LABEL: name, ENGINE_KEY_LABEL: spec.engine_key, COMPONENT_LABEL: "compiler"}
    annotations = {ATTEMPT_ANNOTATION: str(attempt)}
    source = _model_source(spec.model_uri, spec.revision, settings, spec.model_size)
    fetches = source.fetches
    out = f"{settings.engine_cache_mount}/{spec.engine_key}"
    args = ["compile", "--model", source.directory, "--out", out, "--backend", compile_backend(spec.vendor)]
    # --content-addressed: the engine lands in <out>/<digest of the model's content manifest> (names, sizes,
    # sha256, the hub commit), which the compile container reports back; see docs/security.md.
    args += _envelope_args(spec.envelope) + [
        "--engine-key",
        spec.engine_key,
        "--target-architecture",
        spec.architecture,
        "--content-addressed",
    ]
    if settings.share_engines_across_namespaces:
        args.append("--keep-existing")
    elif engine_digest:
        args += ["--engine-digest", engine_digest]
    limits = {"memory": spec.resources.memory}
    if spec.gpu_resource:
        limits[spec.gpu_resource] = str(spec.gpus)
    requests = _with_model_storage(
        {"cpu": spec.resources.cpu, "memory": spec.resources.memory}, spec.model_size, source.stored_in_pod
    )
    container = {
        "name": "compile",
        "image": spec.compile_image,
        "command": ["inferfleet-runtime"],
        "args": args,
        "env": _env(),
        "resources": {"requests": requests, "limits": limits},
        "securityContext": _container_security(),
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "volumeMounts": [
            *source.reader_mounts(settings, model_read_only=not fetches),
            {"name": "engines", "mountPath": settings.engine_cache_mount},
            {"name": "tmp", "mountPath": "/tmp"},
        ],
    }
    pod_spec = _job_pod_spec(container, settings, *source.volumes)
    if fetches:
        pod_spec["initContainers"] = [
            _fetch_container(spec.compile_image, a, settings, spec.credentials_secret) for a in fetches
        ]
    if spec.placement.node_names:
        terms = _node_name_terms(spec.placement.node_names)
        pod_spec["affinity"] = {
            "nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": terms}}
        }
    if spec.placement.tolerations:
        pod_spec["tolerations"] = _tolerations(spec.placement.tolerations)
    return {
        "apiVersion": KINDS["Job"].api_version,
        "kind": "Job",
        "metadata": {"name": job_name, "namespace": namespace, "labels": labels, "annotations": annotations},
        "spec": {
            "backoffLimit": 0,
            "podFailurePolicy": compile_pod_failure_policy(bool(fetches)),
            "ttlSecondsAfterFinished": COMPILE_JOB_TTL_SECONDS,
            "activeDeadlineSeconds": spec.deadline_seconds,
            "template": {"metadata": {"labels": dict(labels), "annotations": dict(annotations)}, "spec": pod_spec},
        },
    }


PRUNER_COMPONENT = "engine-pruner"  # app.kubernetes.io/component of the Jobs that remove engine directories
PRUNE_JOB_TTL_SECONDS = 600


def prune_job_for(namespace: str, key: str, model_digest: str, image: str, settings: PlanSettings) -> dict:
    """The Job that removes the engine directory of a garbage-collected EngineBuild (`inferfleet-runtime
    prune-engine`, which removes only a compiled engine). Owned by nothing (its build is being deleted) and deleted
    by its TTL; labelled with the key, so a new build of the same key waits for it (builds.plan_build)."""
    labels = common_labels() | {BUILD_LABEL: key, ENGINE_KEY_LABEL: key, COMPONENT_LABEL: PRUNER_COMPONENT}
    container = {
        "name": "prune",
        "image": image,
        "command": ["inferfleet-runtime"],
        "args": ["prune-engine", "--dir", engine_dir(settings, key, model_digest)],
        "env": _env(),
        "resources": {"requests": {"cpu": "100m", "memory": "128Mi"}, "limits": {"memory": "256Mi"}},
        "securityContext": _container_security(),
        "terminationMessagePolicy": "FallbackToLogsOnError",
        "volumeMounts": [
            {"name": "engines", "mountPath": settings.engine_cache_mount},
            {"name": "tmp", "mountPath": "/tmp"},
        ],
    }
    pod_spec = _job_pod_spec(container, settings)
    return {
        "apiVersion": KINDS["Job"].api_version,
        "kind": "Job",
        "metadata": {"name": bounded_name(key, "prune", model_digest or "legacy"), "namespace": namespace,
                     "labels": labels},
        "spec": {
            "backoffLimit": 2,
            "activeDeadlineSeconds": 1800,
            "ttlSecondsAfterFinished": PRUNE_JOB_TTL_SECONDS,
            "template": {"metadata": {"labels": dict(labels)}, "spec": pod_spec},
        },
    }  # fmt: skip


def _job_pod_spec(container: dict, settings, *volumes: dict) -> dict:
    """A Job's pod: one container run once, non-root, no API token, with the engine cache and a /tmp (plus volumes)."""
    return {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "enableServiceLinks": False,
        "securityContext": _pod_security(),
        "containers": [container],
        "volumes": [
            *volumes,
            {"name": "engines", "persistentVolumeClaim": {"claimName": settings.engine_cache_claim}},
            {"name": "tmp", "emptyDir": {}},
        ],
    }

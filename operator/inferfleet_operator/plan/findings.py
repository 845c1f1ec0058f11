"""Failures a user must act on, read from pods, Jobs, claims and refused applies: pure functions -> findings."""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from inferfleet_operator.api import conditions as c

# Findings are reported in this order (the first one's reason names the Degraded condition): what
# blocks everything first, then what blocks one pod.
ORDER = (
    c.REASON_HOST_PATH_NOT_ALLOWED,
    c.REASON_APPLY_FAILED,
    c.REASON_NOT_OWNED,
    c.REASON_KEY_MISMATCH,
    c.REASON_CLAIM_NOT_FOUND,
    c.REASON_SECRET_NOT_FOUND,
    c.REASON_DEADLINE_EXCEEDED,
    c.REASON_INSUFFICIENT_RESOURCE,
    c.REASON_UNSCHEDULABLE,
    c.REASON_FETCH_FAILED,
    c.REASON_SERVER_FAILED,
)
MAX_MESSAGE = 1024  # characters of one condition message or Event note built from findings
FETCH_CONTAINER = "fetch-model"
SERVER_CONTAINER = "server"  # the serving container of every pool's pods

_INSUFFICIENT = re.compile(r"Insufficient ([A-Za-z0-9./_-]+)")
_CLAIM_NOT_FOUND = re.compile(r'persistentvolumeclaim "([^"]+)" not found')
# The kubelet's words when a container's secretKeyRef / envFrom names a Secret or key that is not there.
_SECRET_NOT_FOUND = re.compile(r'secret "([^"]+)" not found', re.IGNORECASE)
_SECRET_KEY_NOT_FOUND = re.compile(r"couldn't find key (\S+) in Secret [^/\s]+/(\S+)")


@dataclass(frozen=True, order=True)
class Finding:
    """One failure: its CamelCase reason, the object it is about ("pod team-a/x"), and what to know."""

    reason: str
    subject: str
    message: str
    pool: str = ""  # the pool whose pods or Deployment it concerns ("" for none)

    @property
    def text(self) -> str:
        return f"{self.subject}: {self.message}"


def _cut(text: str, limit: int = MAX_MESSAGE) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def last_line(text: str | None) -> str:
    """The last non-empty line of a termination message (where a CLI writes its error line)."""
    lines = [line.strip() for line in (text or "").splitlines() if line.strip()]
    return _cut(lines[-1], 300) if lines else ""


def pod_view(pod: Mapping) -> dict:
    """What findings read from a Pod (for an index: no spec, no managed fields)."""
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    keep_meta = {
        k: meta[k] for k in ("name", "namespace", "labels", "deletionTimestamp", "creationTimestamp") if k in meta
    }

    def statuses(key: str) -> list[dict]:
        return [
            {k: s[k] for k in ("name", "state", "lastState", "restartCount") if k in s} for s in status.get(key) or []
        ]

    return {
        "metadata": keep_meta,
        "status": {
            "phase": status.get("phase"),
            "podIP": status.get("podIP"),  # where the router's pool profile is read (reconcile_profiles)
            "conditions": [
                {k: cond.get(k) for k in ("type", "status", "reason", "message")}
                for cond in status.get("conditions") or []
            ],
            "initContainerStatuses": statuses("initContainerStatuses"),
            "containerStatuses": statuses("containerStatuses"),
        },
    }


def _secret_finding(status: Mapping, namespace: str, subject: str, pool: str, fields: Mapping[str, str]):
    """A container that cannot start because a Secret it takes by reference (or the key it names) is missing:
    the kubelet holds it in CreateContainerConfigError. Read from the pod's status, so the operator needs no
    right on Secrets and never sees one. fields: Secret name -> the spec field that names it."""
    state = (status.get("state") or {}).get("waiting") or {}
    if state.get("reason") != "CreateContainerConfigError":
        return None
    message = state.get("message") or ""
    missing_key = _SECRET_KEY_NOT_FOUND.search(message)
    missing = _SECRET_NOT_FOUND.search(message)
    if missing_key:
        key, secret = missing_key.group(1), missing_key.group(2)
        what = f"Secret {secret} has no key {key}"
    elif missing:
        secret = missing.group(1)
        what = f"Secret {secret} not found in namespace {namespace}"
    else:
        return None
    named_by = f" (named by {fields[secret]})" if secret in fields else ""
    text = f"{what}{named_by}: container {status.get('name', '')} waits until it exists"
    return Finding(c.REASON_SECRET_NOT_FOUND, subject, text, pool)


def pod_findings(pod: Mapping, pool_label: str = "", secret_fields: Mapping[str, str] | None = None) -> list[Finding]:
    """Why a pod cannot run: unschedulable (for a named resource, a missing claim, or otherwise), a Secret it
    takes by reference missing, an init container (the model fetch) that exited non-zero, or the serving
    container that did (e.g. `serve` refusing a model it cannot serve), each with its exit code and the last
    line of its termination message."""
    meta, status = pod.get("metadata") or {}, pod.get("status") or {}
    if meta.get("deletionTimestamp"):
        return []
    subject = f"pod {meta.get('name', '')}"
    pool = ((meta.get("labels") or {}).get(pool_label, "")) if pool_label else ""
    found = []
    for cond in status.get("conditions") or []:
        if cond.get("type") != "PodScheduled" or cond.get("status") != "False" or cond.get("reason") != "Unschedulable":
            continue
        message = (cond.get("message") or "").strip()
        claims = sorted(set(_CLAIM_NOT_FOUND.findall(message)))
        resources = sorted(set(_INSUFFICIENT.findall(message)))
        if claims:
            found.append(
                Finding(
                    c.REASON_CLAIM_NOT_FOUND,
                    subject,
                    f"claim {', '.join(claims)} not found in namespace {meta.get('namespace', '')}",
                    pool,
                )
            )
        elif resources:
            found.append(
                Finding(
                    c.REASON_INSUFFICIENT_RESOURCE,
                    subject,
                    f"unschedulable: Insufficient {', '.join(resources)} ({_cut(message, 300)})",
                    pool,
                )
            )
        else:
            found.append(Finding(c.REASON_UNSCHEDULABLE, subject, f"unschedulable: {_cut(message, 300)}", pool))
    for key, reason in (
        ("initContainerStatuses", c.REASON_FETCH_FAILED),
        ("containerStatuses", c.REASON_SERVER_FAILED),
    ):
        for cs in status.get(key) or []:
            secret = _secret_finding(cs, meta.get("namespace", ""), subject, pool, secret_fields or {})
            if secret is not None:
                found.append(secret)
                continue
            if key == "containerStatuses" and cs.get("name") != SERVER_CONTAINER:
                continue  # a compile Job's container failing is its build's failure (BuildFailed), not this
            term = _last_exit(cs)
            code = int(term.get("exitCode") or 0)
            if code == 0:
                continue
            if key == "initContainerStatuses":
                what = "model fetch" if cs.get("name") == FETCH_CONTAINER else "init container"
            else:
                what = "container"
            line = last_line(term.get("message"))
            message = f"{what} {cs.get('name', '')} exited {code} ({term.get('reason') or 'Error'})"
            found.append(Finding(reason, subject, message + (f": {line}" if line else ""), pool))
    return found


def _last_exit(status: Mapping) -> Mapping:
    """The current run's end, else (waiting to restart, e.g. CrashLoopBackOff) the previous run's; a container
    running again is not reported."""
    state = status.get("state") or {}
    waiting = "waiting" in state
    return state.get("terminated") or ((status.get("lastState") or {}).get("terminated") if waiting else None) or {}


def pods_findings(
    pods: Iterable[Mapping], pool_label: str = "", secret_fields: Mapping[str, str] | None = None
) -> list[Finding]:
    """Every pod's findings, one per (reason, message, pool) naming each pod it applies to: the
    replicas of one pool usually fail alike."""
    names: dict[tuple[str, str, str], list[str]] = {}
    for pod in pods:
        for found in pod_findings(pod, pool_label, secret_fields):
            names.setdefault((found.reason, found.message, found.pool), []).append(found.subject.removeprefix("pod "))
    return sorted(
        Finding(reason, f"pod{'s' if len(subjects) > 1 else ''} {', '.join(sorted(subjects))}", message, pool)
        for (reason, message, pool), subjects in names.items()
    )


def job_findings(job: Mapping) -> list[Finding]:
    """A Job stopped by its activeDeadlineSeconds: condition Failed, or FailureTarget (set first, while
    the Job's pods are still being terminated), with reason DeadlineExceeded."""
    for cond in (job.get("status") or {}).get("conditions") or []:
        if (
            cond.get("type") in ("Failed", "FailureTarget")
            and cond.get("status") == "True"
            and cond.get("reason") == "DeadlineExceeded"
        ):
            deadline = (job.get("spec") or {}).get("activeDeadlineSeconds")
            limit = f" of {deadline} s" if deadline else ""
            detail = cond.get("message") or "Job was active longer than specified deadline"
            return [
                Finding(
                    c.REASON_DEADLINE_EXCEEDED,
                    f"Job {(job.get('metadata') or {}).get('name', '')}",
                    f"ran past its deadline{limit}: {detail}",
                )
            ]
    return []


def claim_names(manifest: Mapping) -> list[str]:
    """PersistentVolumeClaims a Deployment's or Job's pods mount."""
    pod_spec = (((manifest.get("spec") or {}).get("template") or {}).get("spec")) or {}
    return sorted(
        {
            v["persistentVolumeClaim"]["claimName"]
            for v in pod_spec.get("volumes") or []
            if (v.get("persistentVolumeClaim") or {}).get("claimName")
        }
    )


def missing_claims(
    manifests: Iterable[Mapping], claims: set[str] | frozenset[str], pool_label: str = ""
) -> list[Finding]:
    """Claims that the given Deployments or Jobs mount and that do not exist in their namespace."""
    found = []
    for manifest in manifests:
        meta = manifest.get("metadata") or {}
        missing = [name for name in claim_names(manifest) if name not in claims]
        if missing:
            pool = (meta.get("labels") or {}).get(pool_label, "") if pool_label else ""
            found.append(
                Finding(
                    c.REASON_CLAIM_NOT_FOUND,
                    f"{manifest.get('kind')} {meta.get('name', '')}",
                    f"mounts claim {', '.join(missing)}, which does not exist in namespace {meta.get('namespace', '')}",
                    pool,
                )
            )
    return sorted(found)


def missing_cache_claim(
    pools: Iterable[Mapping], claims: set[str] | frozenset[str], claim: str, namespace: str
) -> list[Finding]:
    """Pools (status entries) whose engine is still to be built while the engine cache claim the
    compile Job writes into does not exist in the namespace."""
    if claim in claims:
        return []
    return [
        Finding(
            c.REASON_CLAIM_NOT_FOUND,
            f"EngineBuild {entry['engineBuild']}",
            f"compiles into claim {claim}, which does not exist in namespace {namespace}",
            entry.get("name", ""),
        )
        for entry in pools
        if entry.get("engineBuild") and entry.get("buildState") != "Ready"
    ]


def build_findings(pools: Iterable[Mapping], builds: Mapping[str, Mapping]) -> list[Finding]:
    """What the EngineBuilds of a service's pools report (their Built condition's reason is a finding's,
    e.g. a compile pod unschedulable or past its deadline), for the service's status. A missing engine
    cache claim is left to missing_cache_claim, which sees it before the build does."""
    found = []
    for entry in pools:
        build = builds.get(entry.get("engineBuild") or "")
        if build is None:
            continue
        built = c.by_type((build.get("status") or {}).get("conditions")).get(c.BUILT) or {}
        if built.get("reason") in ORDER and built["reason"] != c.REASON_CLAIM_NOT_FOUND:
            found.append(
                Finding(
                    built["reason"],
                    f"EngineBuild {entry['engineBuild']}",
                    built.get("message", ""),
                    entry.get("name", ""),
                )
            )
    return found


def apply_finding(kind: str, name: str, message: str, pool: str = "") -> Finding:
    """A write the API server refused (e.g. 422 Invalid): its own message says what to fix."""
    return Finding(c.REASON_APPLY_FAILED, f"{kind} {name}", f"refused by the API server: {_cut(message, 600)}", pool)


def not_owned_finding(kind: str, name: str, owner: str, pool: str = "") -> Finding:
    """An object the operator would write exists, carries its labels, and is not owned by `owner`: it is never
    overwritten nor deleted."""
    message = f"exists and is not owned by {owner}: left alone; delete or rename it to let the operator create its own"
    return Finding(c.REASON_NOT_OWNED, f"{kind} {name}", message, pool)


def _rank(finding: Finding) -> tuple:
    return (ORDER.index(finding.reason) if finding.reason in ORDER else len(ORDER), finding)


def summary(findings: Iterable[Finding]) -> tuple[str, str] | None:
    """(reason, message) for a condition: the most pressing finding's reason, every finding named."""
    ranked = sorted(set(findings), key=_rank)
    if not ranked:
        return None
    return ranked[0].reason, _cut("; ".join(f.text for f in ranked))


def grouped(findings: Iterable[Finding]) -> list[tuple[str, str]]:
    """(reason, message) per reason, for one Warning Event each (like the planner's grouped Events)."""
    by_reason: dict[str, list[str]] = {}
    for finding in sorted(set(findings), key=_rank):
        by_reason.setdefault(finding.reason, []).append(finding.text)
    return [(reason, _cut("; ".join(texts))) for reason, texts in by_reason.items()]


def degraded_status(status: dict, findings: Iterable[Finding], previous: dict[str, dict], now, generation: int) -> dict:
    """`status` with the findings in it: Degraded True with the most pressing finding's reason and every
    finding in its message (a Degraded that was True already, e.g. BuildFailed, keeps its message after
    them), and each finding about a pool in that pool's `message`. Unchanged when there are none."""
    findings = list(findings)
    found = summary(findings)
    if found is None:
        return status
    reason, message = found
    out = dict(status)
    conditions = []
    for cond in status.get("conditions") or []:
        if cond.get("type") == c.DEGRADED:
            if cond.get("status") == c.TRUE:
                message = _cut(f"{message}; {cond.get('message', '')}")
            cond = c.condition(previous, c.DEGRADED, c.TRUE, reason, message, now, generation)
        conditions.append(cond)
    out["conditions"] = conditions
    by_pool: dict[str, list[str]] = {}
    for finding in sorted(set(findings), key=_rank):
        if finding.pool:
            by_pool.setdefault(finding.pool, []).append(f"{finding.reason}: {finding.text}")
    if by_pool:
        pools = []
        for entry in status.get("pools") or []:
            texts = by_pool.get(entry.get("name"))
            if texts:
                entry = dict(
                    entry, message=_cut("; ".join(texts + [entry["message"]] if entry.get("message") else texts))
                )
            pools.append(entry)
        out["pools"] = pools
    return out


def secret_fields(spec: Mapping) -> dict[str, str]:
    """An InferenceService spec's Secret names -> the field naming each (for the findings' messages)."""
    fields = {}
    credentials = (spec.get("model") or {}).get("credentialsSecret")
    if credentials:
        fields[credentials] = "spec.model.credentialsSecret"
    api_keys = ((spec.get("auth") or {}).get("apiKeySecret") or {}).get("name")
    if api_keys:
        fields[api_keys] = "spec.auth.apiKeySecret"
    return fields


# `serve --engine-dir` exits so when the engine is missing or damaged (inferfleet_runtime.compiled.manifest).
ENGINE_LOST_EXIT_CODE = 3


def engine_lost_pods(pods: Iterable[Mapping], pool_label: str) -> list[tuple[str, str, str]]:
    """(pool, pod name, pod creationTimestamp) of every serving pod whose server container last exited with
    ENGINE_LOST_EXIT_CODE: its compiled engine directory is gone or damaged."""
    found = []
    for pod in pods:
        meta, status = pod.get("metadata") or {}, pod.get("status") or {}
        if meta.get("deletionTimestamp"):
            continue
        for cs in status.get("containerStatuses") or []:
            if cs.get("name") == SERVER_CONTAINER and int(_last_exit(cs).get("exitCode") or 0) == ENGINE_LOST_EXIT_CODE:
                pool = (meta.get("labels") or {}).get(pool_label, "")
                found.append((pool, meta.get("name", ""), meta.get("creationTimestamp") or ""))
    return sorted(found)

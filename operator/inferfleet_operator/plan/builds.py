"""plan_build: one EngineBuild × its Jobs -> the Job for the current attempt, its status and when to look again."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from inferfleet_operator.api import conditions as c
from inferfleet_operator.api.conditions import PlannedEvent, format_time, parse_time
from inferfleet_operator.api.names import (
    API_VERSION,
    ATTEMPT_ANNOTATION,
    BUILD_KIND,
    COMPONENT_LABEL,
    JOB_NAME_LABEL,
    PROGRESS_ANNOTATION,
    REBUILD_ANNOTATION,
)
from inferfleet_operator.api.types import DEFAULT_SETTINGS, PlanSettings, SpecError, parse_build
from inferfleet_operator.plan import findings as f
from inferfleet_operator.plan import manifests as m
from inferfleet_operator.plan.build_jobs import PRUNER_COMPONENT, compile_job_for
from inferfleet_operator.plan.build_lifecycle import attempt_of
from inferfleet_operator.plan.engine_key import key_namespace, spec_key


@dataclass
class BuildPlan:
    """What one reconcile of an EngineBuild must make true.

    job: the Job to create for the current attempt (named <build-name>-<attempt>), or None when nothing is
        to be created: the attempt's Job already exists (it is among `jobs`), the build is Ready or Failed,
        or the backoff before the next attempt has not passed (see requeue_after).
    status: the whole EngineBuild .status (state Pending|Building|Ready|Failed, attempts, maxAttempts,
        currentJob, progress, message, failureReason, artifactPath, artifactSizeBytes, modelDigest, engineDigest,
        resolvedRevision, startTime, completionTime, durationSeconds, nextAttemptTime, conditions,
        observedGeneration). Deterministic.
    requeue_after: seconds until the build should be looked at again without a watch event (backoff).
    events: Events for changes against the previous status.
    """

    job: dict | None = None
    status: dict = field(default_factory=dict)
    requeue_after: float | None = None
    events: list[PlannedEvent] = field(default_factory=list)


def _attempt(job: dict) -> int:
    meta = job.get("metadata") or {}
    value = (meta.get("annotations") or {}).get(ATTEMPT_ANNOTATION) or meta.get("name", "").rsplit("-", 1)[-1]
    return int(value) if str(value).isdigit() else 0


def _job_condition(job: dict, type_: str) -> dict | None:
    for cond in (job.get("status") or {}).get("conditions") or []:
        if cond.get("type") == type_ and cond.get("status") == "True":
            return cond
    return None


def _outcome(job: dict) -> str:
    """ "succeeded" | "failed" | "running" from the Job's conditions and counters."""
    status = job.get("status") or {}
    if _job_condition(job, "Complete") or int(status.get("succeeded") or 0) > 0:
        return "succeeded"
    # FailureTarget: the Job controller decided the Job failed and is terminating its pods.
    if _job_condition(job, "Failed") or _job_condition(job, "FailureTarget") or int(status.get("failed") or 0) > 0:
        return "failed"
    return "running"


def _pods_of(job: dict, pods: list[dict]) -> list[dict]:
    name = (job.get("metadata") or {}).get("name")

    def job_name(pod: dict) -> str | None:
        labels = (pod.get("metadata") or {}).get("labels") or {}
        return labels.get(JOB_NAME_LABEL) or labels.get("job-name")

    return sorted((p for p in pods if job_name(p) == name), key=lambda p: (p.get("metadata") or {}).get("name", ""))


def _terminations(pods: list[dict]):
    for pod in pods:
        status = pod.get("status") or {}
        for cs in (status.get("initContainerStatuses") or []) + (status.get("containerStatuses") or []):
            terminated = ((cs.get("state") or {}).get("terminated")) or ((cs.get("lastState") or {}).get("terminated"))
            if terminated:
                yield cs.get("name", ""), terminated


def _failure_reason(job: dict, pods: list[dict]) -> str:
    for name, term in _terminations(pods):
        if int(term.get("exitCode") or 0) != 0:
            message = (term.get("message") or "").strip().splitlines()
            tail = f": {message[-1][:300]}" if message else ""
            return f"container {name} exited {term.get('exitCode')} ({term.get('reason', 'Error')}){tail}"
    cond = _job_condition(job, "Failed")
    if cond:
        return f"Job failed: {cond.get('reason', 'Failed')}: {cond.get('message', '')}".rstrip(": ")
    return "Job failed"


def _result(pods: list[dict]) -> dict:
    """The compile container's termination message, when it is a JSON object (e.g. {"artifactSizeBytes": N})."""
    for name, term in _terminations(pods):
        if name == "compile" and int(term.get("exitCode") or 0) == 0:
            try:
                value = json.loads(term.get("message") or "")
            except ValueError:
                return {}
            return value if isinstance(value, dict) else {}
    return {}


PRUNE_RECHECK_SECONDS = 30.0  # a build waiting for a prune Job looks again this often (besides the Job's events)
_DIGEST = re.compile(r"^[0-9a-f]{16}$")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
_ENGINE_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")  # the runtime's manifest.DIGEST_PATTERN
_REPORTED = ("artifactPath", "artifactSizeBytes", "modelDigest", "resolvedRevision", "engineDigest")  # by the Job


def content_status(result: dict, key: str, settings: PlanSettings) -> dict:
    """What the compile container reported: modelDigest (of the model's content manifest; names the engine's directory
    under its key), resolvedRevision (the hub commit) and engineDigest (of the engine's manifest, which covers every
    file: what the operator holds of the engine, not the cache, and passes to its serving pods). A value not of its
    form is ignored: the message is the pod's to write, and the digests become a path and an argument."""
    digest, commit, engine = result.get("modelDigest"), result.get("modelCommit"), result.get("engineDigest")
    out = {}
    if isinstance(digest, str) and _DIGEST.match(digest):
        out.update(modelDigest=digest, artifactPath=m.engine_dir(settings, key, digest))
    if isinstance(commit, str) and _COMMIT.match(commit):
        out["resolvedRevision"] = commit
    if isinstance(engine, str) and _ENGINE_DIGEST.match(engine):
        out["engineDigest"] = engine
    return out


def _progress(job: dict, pods: list[dict]) -> str:
    for obj in [job] + pods:
        value = ((obj.get("metadata") or {}).get("annotations") or {}).get(PROGRESS_ANNOTATION)
        if value:
            return value
    phases = {(p.get("status") or {}).get("phase") for p in pods}
    if "Running" in phases:
        return "compiling"
    return "waiting for a pod" if not pods or "Pending" in phases else "finishing"


def _is_unsupported(job: dict) -> bool:
    """The Job was failed by its pod failure policy's FailJob rule: a container exited 2 (bad input)."""
    cond = _job_condition(job, "Failed") or _job_condition(job, "FailureTarget")
    return (cond or {}).get("reason") == "PodFailurePolicy"


def _failed_at(job: dict) -> datetime | None:
    cond = _job_condition(job, "Failed")
    status = job.get("status") or {}
    return parse_time((cond or {}).get("lastTransitionTime") or status.get("completionTime") or status.get("startTime"))


def backoff_seconds(base: int, attempt: int, cap: int) -> int:
    """Delay after failed attempt `attempt` (1-based): base, 2·base, 4·base, ... capped."""
    return min(base * 2 ** (attempt - 1), cap)


def plan_build(
    build: dict,
    jobs: list[dict],
    now: datetime,
    settings: PlanSettings = DEFAULT_SETTINGS,
    pods: list[dict] = (),
    claims: frozenset[str] | None = None,
    apply_error: str | None = None,
) -> BuildPlan:
    """Plan one EngineBuild.

    build: the EngineBuild as read. jobs: the Jobs labelled inferfleet.dev/engine-build=<name> (any order); only
    those whose ownerReferences name the build's UID count.
    pods: optional, the pods of those Jobs (termination messages and progress annotations are read from
    them when given). At most spec.maxAttempts Jobs are ever created; attempt n+1 starts no earlier than
    backoffSeconds * 2**(n-1) (capped at settings.max_backoff_seconds) after attempt n failed. Attempts are
    counted from the Jobs that exist (level-triggered: the Job of a running attempt deleted by hand is simply
    re-run); once the build is Ready or Failed, its outcome stands when its Jobs are deleted (their TTL), so a
    Failed build is tried again by deleting the EngineBuild.
    claims: when given, the PersistentVolumeClaims of the build's namespace: a Job that mounts a missing
    one is not created (ClaimNotFound) until the claim exists, so its deadline does not run meanwhile.
    apply_error: the API server's message for the last refused create of the Job to create (ApplyFailed).
    A running attempt whose pods cannot schedule or whose model fetch fails says so in progress and the
    Built condition's reason; an attempt stopped by its deadline (DeadlineExceeded) fails the build at
    once (another attempt of the same envelope would run into the same deadline).
    """
    meta = build.get("metadata") or {}
    name, namespace, uid = meta.get("name", ""), meta.get("namespace", ""), meta.get("uid", "")
    generation = int(meta.get("generation") or 0)
    previous = build.get("status") or {}
    prev_conditions = c.by_type(previous.get("conditions"))
    try:
        spec = parse_build(build).spec
    except SpecError as error:
        status = {"state": "Failed", "attempts": 0, "failureReason": str(error), "message": str(error)}
        return _finish(status, previous, prev_conditions, now, generation, None, None)
    scope = key_namespace(namespace, settings)
    expected = spec_key(spec, scope)
    if expected != spec.engine_key or name != spec.engine_key:
        other = spec_key(spec, "" if scope else namespace)
        if name == spec.engine_key == other and previous.get("state") == "Ready":
            # Keyed under the other sharing setting (before the namespace entered the key, or before the administrator
            # changed --share-engines-across-namespaces): its engine serves on until the services' builds of the
            # current key are Ready, then it is garbage; no Job writes into its directory again.
            kept = {k: v for k, v in previous.items() if k not in ("conditions", "observedGeneration")}
            return _finish(kept, previous, prev_conditions, now, generation, None, None)
        text = (
            f"spec does not hash to its key: engineKey {spec.engine_key!r} (name {name!r}), the spec's hash is "
            f"{expected!r}; nothing is built"
        )
        status = {"state": "Failed", "attempts": 0, "failureReason": text, "message": text}
        return _finish(status, previous, prev_conditions, now, generation, None, None, c.REASON_KEY_MISMATCH)

    pruning = [
        j for j in jobs
        if ((j.get("metadata") or {}).get("labels") or {}).get(COMPONENT_LABEL) == PRUNER_COMPONENT
        and _outcome(j) == "running"
    ]  # fmt: skip
    if pruning and previous.get("state") != "Ready":
        # An earlier EngineBuild of this key was garbage-collected and its engine is being removed: a Job started
        # now would write into the directory being removed. Its Job's events bring the build back here.
        text = f"waiting for Job {pruning[0]['metadata']['name']} to remove the previous engine of this key"
        status = {"state": "Pending", "attempts": 0, "progress": "waiting for a prune", "message": text}
        return _finish(status, previous, prev_conditions, now, generation, None, PRUNE_RECHECK_SECONDS)
    # Counted by owner UID: a Job that merely carries the build's labels (made by hand, or left by an earlier
    # EngineBuild of the same name) is neither an attempt nor ever written.
    foreign = {(j.get("metadata") or {}).get("name") for j in jobs if not m.is_owned_by(j, uid)}
    jobs = sorted((j for j in jobs if _attempt(j) > 0 and m.is_owned_by(j, uid)), key=_attempt)
    # A serving pod found the engine of attempt `lost` gone or damaged (REBUILD_ANNOTATION): that attempt and
    # those before it no longer count as the outcome, and the next attempt rebuilds; numbering goes on, and
    # maxAttempts bounds the attempts of all rounds together (an engine lost after every build ends Failed).
    lost = attempt_of(((meta.get("annotations") or {}).get(REBUILD_ANNOTATION)) or "")
    attempts = max(_attempt(jobs[-1]) if jobs else 0, lost)
    jobs = [j for j in jobs if _attempt(j) > lost]
    status = {
        "attempts": attempts,
        "maxAttempts": spec.max_attempts,
        "artifactPath": f"{settings.engine_cache_mount}/{spec.engine_key}",
    }
    owner = m.owner_reference(API_VERSION, BUILD_KIND, name, uid)

    recorded = previous.get("engineDigest")  # of the engine a serving pod found lost: kept if it is intact after all

    def new_job(attempt: int) -> dict:
        digest = recorded if isinstance(recorded, str) and _ENGINE_DIGEST.match(recorded) else ""
        job = compile_job_for(name, namespace, spec, attempt, settings, digest)
        job["metadata"]["ownerReferences"] = [owner]
        return job

    def create(attempt: int, message: str) -> BuildPlan:
        job = new_job(attempt)
        missing = f.missing_claims([job], claims) if claims is not None else []
        if missing:  # the Job would only wait (and burn its deadline): create it once the claim exists
            status.update(state="Pending", progress="waiting for a claim", message=missing[0].text)
            return _finish(status, previous, prev_conditions, now, generation, None, None, missing[0].reason)
        if job["metadata"]["name"] in foreign:
            text = (
                f"Job {namespace}/{job['metadata']['name']} exists and is not owned by this EngineBuild: it is left "
                "alone; delete it to let the build run"
            )
            status.update(state="Pending", progress="job name taken", message=text)
            return _finish(status, previous, prev_conditions, now, generation, None, None, c.REASON_NOT_OWNED)
        status.update(attempts=attempt, state="Pending", currentJob=job["metadata"]["name"], progress="job created",
                      message=message)  # fmt: skip
        if apply_error:
            found = f.apply_finding("Job", job["metadata"]["name"], apply_error)
            status.update(progress="job refused", message=found.text)
            return _finish(status, previous, prev_conditions, now, generation, job, None, found.reason)
        return _finish(status, previous, prev_conditions, now, generation, job, None)

    succeeded = next((j for j in jobs if _outcome(j) == "succeeded"), None)
    if succeeded is not None:
        job_pods = _pods_of(succeeded, list(pods))
        result = _result(job_pods)
        job_status = succeeded.get("status") or {}
        start, end = parse_time(job_status.get("startTime")), parse_time(job_status.get("completionTime"))
        status.update(state="Ready", currentJob=succeeded["metadata"]["name"], progress="done", message="engine built")
        if start:
            status["startTime"] = format_time(start)
        if end:
            status["completionTime"] = format_time(end)
        if start and end:
            status["durationSeconds"] = int((end - start).total_seconds())
        if not job_pods and previous.get("currentJob") == succeeded["metadata"]["name"]:
            # Its pods were garbage-collected before the Job: what they reported stands.
            status.update({k: previous[k] for k in _REPORTED if k in previous})
            return _finish(status, previous, prev_conditions, now, generation, None, None)
        if isinstance(result.get("artifactSizeBytes"), int):
            status["artifactSizeBytes"] = result["artifactSizeBytes"]
        status.update(content_status(result, spec.engine_key, settings))
        return _finish(status, previous, prev_conditions, now, generation, None, None)

    is_kept = int(previous.get("attempts") or 0) > lost and attempt_of(previous.get("currentJob") or "") > lost
    if not jobs and previous.get("state") in ("Ready", "Failed") and is_kept:
        # The finished Jobs were deleted (ttlSecondsAfterFinished, or by hand): the outcome stands.
        kept = {k: v for k, v in previous.items() if k not in ("conditions", "observedGeneration")}
        reason = (prev_conditions.get(c.BUILT) or {}).get("reason", "")
        return _finish(
            kept, previous, prev_conditions, now, generation, None, None, reason if reason in f.ORDER else ""
        )
    if not jobs and lost:
        if attempts >= spec.max_attempts:
            text = f"the engine of attempt {lost} was lost and all {spec.max_attempts} attempt(s) are used"
            status.update(state="Failed", progress="failed", failureReason=text, message=text)
            return _finish(status, previous, prev_conditions, now, generation, None, None)
        return create(attempts + 1, f"the engine of attempt {lost} was lost; attempt {attempts + 1} rebuilds it")
    if not jobs:
        return create(1, "attempt 1 starting")

    latest = jobs[-1]
    job_pods = _pods_of(latest, list(pods))
    status["currentJob"] = latest["metadata"]["name"]
    if _outcome(latest) == "running":
        status.update(
            state="Building",
            progress=_progress(latest, job_pods),
            message=f"attempt {attempts} of {spec.max_attempts} running",
        )
        found = f.summary(f.pods_findings(job_pods))
        if found is not None:  # e.g. unschedulable, claim missing, fetch failing: not just "waiting for a pod"
            status.update(progress=found[1], message=f"attempt {attempts} of {spec.max_attempts}: {found[1]}")
            return _finish(status, previous, prev_conditions, now, generation, None, None, found[0])
        return _finish(status, previous, prev_conditions, now, generation, None, None)

    deadline = f.job_findings(latest)
    if deadline:
        status.update(
            failureReason=deadline[0].text,
            state="Failed",
            progress="failed",
            message=f"attempt {attempts} failed: {deadline[0].text}",
        )
        return _finish(status, previous, prev_conditions, now, generation, None, None, deadline[0].reason)
    reason = _failure_reason(latest, job_pods)
    status["failureReason"] = reason
    if _is_unsupported(latest):  # exit code 2 (pod failure policy): the same input fails the same way again
        status.update(state="Failed", progress="failed", message=f"attempt {attempts} refused its input: {reason}")
        return _finish(status, previous, prev_conditions, now, generation, None, None)
    if attempts >= spec.max_attempts:
        status.update(state="Failed", progress="failed", message=f"all {attempts} attempt(s) failed; last: {reason}")
        return _finish(status, previous, prev_conditions, now, generation, None, None)
    failed_at = _failed_at(latest) or now
    next_at = failed_at + timedelta(
        seconds=backoff_seconds(spec.backoff_seconds, attempts, settings.max_backoff_seconds)
    )
    if now < next_at:
        status.update(state="Pending", progress="backoff", nextAttemptTime=format_time(next_at),
                      message=f"attempt {attempts} failed; attempt {attempts + 1} at {format_time(next_at)}")  # fmt: skip
        return _finish(status, previous, prev_conditions, now, generation, None, (next_at - now).total_seconds())
    return create(attempts + 1, f"attempt {attempts} failed; attempt {attempts + 1} starting")


_BUILT = {
    "Ready": (c.TRUE, c.REASON_JOB_SUCCEEDED),
    "Failed": (c.FALSE, c.REASON_ATTEMPTS_EXHAUSTED),
    "Building": (c.FALSE, c.REASON_JOB_RUNNING),
    "Pending": (c.FALSE, c.REASON_JOB_CREATED),
}


def _finish(status, previous, prev_conditions, now, generation, job, requeue_after, finding: str = "") -> BuildPlan:
    """finding: the reason of a failure a user must act on (findings.py): the Built condition's reason,
    and a Warning Event whenever its message changes."""
    state = status["state"]
    cond_status, reason = _BUILT[state]
    if state == "Pending" and status.get("nextAttemptTime"):
        reason = c.REASON_BACKOFF
    reason = finding or reason
    status["conditions"] = [
        c.condition(prev_conditions, c.BUILT, cond_status, reason, status.get("message", ""), now, generation)
    ]
    status["observedGeneration"] = generation
    events = []
    old_built = prev_conditions.get(c.BUILT) or {}
    if finding and (old_built.get("reason"), old_built.get("message")) != (finding, status.get("message", "")):
        events.append(c.warning(finding, status.get("message", "")))
    if job is not None and finding != c.REASON_APPLY_FAILED:
        events.append(
            c.normal(c.REASON_JOB_CREATED, f"Created Job {job['metadata']['name']} for attempt {status['attempts']}")
        )
    if not finding and (state != previous.get("state") or status.get("failureReason") != previous.get("failureReason")):
        if state == "Ready":
            events.append(c.normal(c.REASON_JOB_SUCCEEDED, f"Engine built by Job {status.get('currentJob')}"))
        elif state == "Failed":
            events.append(c.warning(c.REASON_ATTEMPTS_EXHAUSTED, status["message"]))
        elif status.get("failureReason") and status.get("failureReason") != previous.get("failureReason"):
            events.append(
                c.warning(
                    c.REASON_JOB_FAILED,
                    f"Attempt {status['attempts'] - (1 if job else 0)} failed: {status['failureReason']}",
                )
            )
    return BuildPlan(job=job, status=status, requeue_after=requeue_after, events=events)

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


@dataclass
class _Build:
    """One reconcile of an EngineBuild: what was read, and the status being written (each state's function fills it
    and ends with `finish`)."""

    name: str
    namespace: str
    uid: str
    generation: int
    previous: dict
    prev_conditions: dict
    now: datetime
    settings: PlanSettings
    status: dict = field(default_factory=dict)

    def finish(self, job: dict | None = None, requeue_after: float | None = None, finding: str = "") -> BuildPlan:
        return _finish(
            self.status, self.previous, self.prev_conditions, self.now, self.generation, job, requeue_after, finding
        )

    def keep_previous(self, finding: str = "") -> BuildPlan:
        """The outcome recorded before stands (its Jobs are gone, or it is keyed under another sharing setting)."""
        self.status = {k: v for k, v in self.previous.items() if k not in ("conditions", "observedGeneration")}
        return self.finish(finding=finding)


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
    previous = build.get("status") or {}
    b = _Build(
        name=meta.get("name", ""),
        namespace=meta.get("namespace", ""),
        uid=meta.get("uid", ""),
        generation=int(meta.get("generation") or 0),
        previous=previous,
        prev_conditions=c.by_type(previous.get("conditions")),
        now=now,
        settings=settings,
    )
    try:
        spec = parse_build(build).spec
    except SpecError as error:
        b.status = {"state": "Failed", "attempts": 0, "failureReason": str(error), "message": str(error)}
        return b.finish()
    refused = _check_key(b, spec)
    if refused is not None:
        return refused
    pruning = [
        j for j in jobs
        if ((j.get("metadata") or {}).get("labels") or {}).get(COMPONENT_LABEL) == PRUNER_COMPONENT
        and _outcome(j) == "running"
    ]  # fmt: skip
    if pruning and previous.get("state") != "Ready":
        # An earlier EngineBuild of this key was garbage-collected and its engine is being removed: a Job started
        # now would write into the directory being removed. Its Job's events bring the build back here.
        text = f"waiting for Job {pruning[0]['metadata']['name']} to remove the previous engine of this key"
        b.status = {"state": "Pending", "attempts": 0, "progress": "waiting for a prune", "message": text}
        return b.finish(requeue_after=PRUNE_RECHECK_SECONDS)
    # Counted by owner UID: a Job that merely carries the build's labels (made by hand, or left by an earlier
    # EngineBuild of the same name) is neither an attempt nor ever written.
    foreign = {(j.get("metadata") or {}).get("name") for j in jobs if not m.is_owned_by(j, b.uid)}
    jobs = sorted((j for j in jobs if _attempt(j) > 0 and m.is_owned_by(j, b.uid)), key=_attempt)
    # A serving pod found the engine of attempt `lost` gone or damaged (REBUILD_ANNOTATION): that attempt and
    # those before it no longer count as the outcome, and the next attempt rebuilds; numbering goes on, and
    # maxAttempts bounds the attempts of all rounds together (an engine lost after every build ends Failed).
    lost = attempt_of(((meta.get("annotations") or {}).get(REBUILD_ANNOTATION)) or "")
    attempts = max(_attempt(jobs[-1]) if jobs else 0, lost)
    jobs = [j for j in jobs if _attempt(j) > lost]
    b.status = {
        "attempts": attempts,
        "maxAttempts": spec.max_attempts,
        "artifactPath": f"{settings.engine_cache_mount}/{spec.engine_key}",
    }

    def create(attempt: int, message: str) -> BuildPlan:
        return _create(b, spec, attempt, message, foreign, claims, apply_error)

    succeeded = next((j for j in jobs if _outcome(j) == "succeeded"), None)
    if succeeded is not None:
        return _succeeded(b, spec, succeeded, list(pods))
    is_kept = int(previous.get("attempts") or 0) > lost and attempt_of(previous.get("currentJob") or "") > lost
    if not jobs and previous.get("state") in ("Ready", "Failed") and is_kept:
        # The finished Jobs were deleted (ttlSecondsAfterFinished, or by hand): the outcome stands.
        reason = (b.prev_conditions.get(c.BUILT) or {}).get("reason", "")
        return b.keep_previous(reason if reason in f.ORDER else "")
    if not jobs and lost:
        if attempts >= spec.max_attempts:
            text = f"the engine of attempt {lost} was lost and all {spec.max_attempts} attempt(s) are used"
            b.status.update(state="Failed", progress="failed", failureReason=text, message=text)
            return b.finish()
        return create(attempts + 1, f"the engine of attempt {lost} was lost; attempt {attempts + 1} rebuilds it")
    if not jobs:
        return create(1, "attempt 1 starting")
    latest = jobs[-1]
    b.status["currentJob"] = latest["metadata"]["name"]
    if _outcome(latest) == "running":
        return _running(b, spec, latest, list(pods))
    return _failed(b, spec, latest, list(pods), create)


def _check_key(b: _Build, spec) -> BuildPlan | None:
    """None when the build's name and engineKey are the spec's hash; else its plan (refused, or kept as it was)."""
    scope = key_namespace(b.namespace, b.settings)
    expected = spec_key(spec, scope)
    if expected == spec.engine_key and b.name == spec.engine_key:
        return None
    other = spec_key(spec, "" if scope else b.namespace)
    if b.name == spec.engine_key == other and b.previous.get("state") == "Ready":
        # Keyed under the other sharing setting (before the namespace entered the key, or before the administrator
        # changed --share-engines-across-namespaces): its engine serves on until the services' builds of the
        # current key are Ready, then it is garbage; no Job writes into its directory again.
        return b.keep_previous()
    text = (
        f"spec does not hash to its key: engineKey {spec.engine_key!r} (name {b.name!r}), the spec's hash is "
        f"{expected!r}; nothing is built"
    )
    b.status = {"state": "Failed", "attempts": 0, "failureReason": text, "message": text}
    return b.finish(finding=c.REASON_KEY_MISMATCH)


def _create(b: _Build, spec, attempt: int, message: str, foreign: set, claims, apply_error: str | None) -> BuildPlan:
    """The Job of attempt `attempt`, unless its claim is missing or its name is taken by a Job not the build's."""
    recorded = b.previous.get("engineDigest")  # of the engine a serving pod found lost: kept if it is intact after all
    digest = recorded if isinstance(recorded, str) and _ENGINE_DIGEST.match(recorded) else ""
    job = compile_job_for(b.name, b.namespace, spec, attempt, b.settings, digest)
    job["metadata"]["ownerReferences"] = [m.owner_reference(API_VERSION, BUILD_KIND, b.name, b.uid)]
    missing = f.missing_claims([job], claims) if claims is not None else []
    if missing:  # the Job would only wait (and burn its deadline): create it once the claim exists
        b.status.update(state="Pending", progress="waiting for a claim", message=missing[0].text)
        return b.finish(finding=missing[0].reason)
    if job["metadata"]["name"] in foreign:
        text = (
            f"Job {b.namespace}/{job['metadata']['name']} exists and is not owned by this EngineBuild: it is left "
            "alone; delete it to let the build run"
        )
        b.status.update(state="Pending", progress="job name taken", message=text)
        return b.finish(finding=c.REASON_NOT_OWNED)
    b.status.update(attempts=attempt, state="Pending", currentJob=job["metadata"]["name"], progress="job created",
                    message=message)  # fmt: skip
    if apply_error:
        found = f.apply_finding("Job", job["metadata"]["name"], apply_error)
        b.status.update(progress="job refused", message=found.text)
        return b.finish(job, finding=found.reason)
    return b.finish(job)


def _succeeded(b: _Build, spec, succeeded: dict, pods: list[dict]) -> BuildPlan:
    """Ready, with what the Job's pods reported (or, when they are gone, what was recorded)."""
    job_pods = _pods_of(succeeded, pods)
    result = _result(job_pods)
    job_status = succeeded.get("status") or {}
    start, end = parse_time(job_status.get("startTime")), parse_time(job_status.get("completionTime"))
    b.status.update(state="Ready", currentJob=succeeded["metadata"]["name"], progress="done", message="engine built")
    if start:
        b.status["startTime"] = format_time(start)
    if end:
        b.status["completionTime"] = format_time(end)
    if start and end:
        b.status["durationSeconds"] = int((end - start).total_seconds())
    if not job_pods and b.previous.get("currentJob") == succeeded["metadata"]["name"]:
        # Its pods were garbage-collected before the Job: what they reported stands.
        b.status.update({k: b.previous[k] for k in _REPORTED if k in b.previous})
        return b.finish()
    if isinstance(result.get("artifactSizeBytes"), int):
        b.status["artifactSizeBytes"] = result["artifactSizeBytes"]
    b.status.update(content_status(result, spec.engine_key, b.settings))
    return b.finish()


def _running(b: _Build, spec, latest: dict, pods: list[dict]) -> BuildPlan:
    """Building; a pod that cannot schedule or fetch says so in progress and the Built reason."""
    job_pods = _pods_of(latest, pods)
    attempts = b.status["attempts"]
    b.status.update(
        state="Building",
        progress=_progress(latest, job_pods),
        message=f"attempt {attempts} of {spec.max_attempts} running",
    )
    found = f.summary(f.pods_findings(job_pods))
    if found is not None:  # e.g. unschedulable, claim missing, fetch failing: not just "waiting for a pod"
        b.status.update(progress=found[1], message=f"attempt {attempts} of {spec.max_attempts}: {found[1]}")
        return b.finish(finding=found[0])
    return b.finish()


def _failed(b: _Build, spec, latest: dict, pods: list[dict], create) -> BuildPlan:
    """The latest attempt failed: Failed (deadline, refused input, attempts used), backoff, or the next attempt."""
    attempts = b.status["attempts"]
    deadline = f.job_findings(latest)
    if deadline:
        b.status.update(
            failureReason=deadline[0].text,
            state="Failed",
            progress="failed",
            message=f"attempt {attempts} failed: {deadline[0].text}",
        )
        return b.finish(finding=deadline[0].reason)
    reason = _failure_reason(latest, _pods_of(latest, pods))
    b.status["failureReason"] = reason
    if _is_unsupported(latest):  # exit code 2 (pod failure policy): the same input fails the same way again
        b.status.update(state="Failed", progress="failed", message=f"attempt {attempts} refused its input: {reason}")
        return b.finish()
    if attempts >= spec.max_attempts:
        b.status.update(state="Failed", progress="failed", message=f"all {attempts} attempt(s) failed; last: {reason}")
        return b.finish()
    failed_at = _failed_at(latest) or b.now
    next_at = failed_at + timedelta(
        seconds=backoff_seconds(spec.backoff_seconds, attempts, b.settings.max_backoff_seconds)
    )
    if b.now < next_at:
        b.status.update(state="Pending", progress="backoff", nextAttemptTime=format_time(next_at),
                        message=f"attempt {attempts} failed; attempt {attempts + 1} at {format_time(next_at)}")  # fmt: skip
        return b.finish(requeue_after=(next_at - b.now).total_seconds())
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

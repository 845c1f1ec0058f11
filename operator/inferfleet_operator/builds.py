"""plan_build: one EngineBuild × its Jobs -> the Job for the current attempt, its status and when to look again; plus GC."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from .api import DEFAULT_SETTINGS, PlanSettings
from .conditions import PlannedEvent

BUILD_LABEL = "inferfleet.dev/engine-build"  # on Jobs and their pods: the EngineBuild name
ATTEMPT_ANNOTATION = "inferfleet.dev/attempt"  # on Jobs: the 1-based attempt number
PROGRESS_ANNOTATION = "inferfleet.dev/build-progress"  # on a Job or its pod: free-form progress ("40%", "exporting")


@dataclass
class BuildPlan:
    """What one reconcile of an EngineBuild must make true.

    job: the Job to apply for the current attempt (named <build-name>-<attempt>), or None when nothing is to
        be applied now (build Ready or Failed, or waiting out the backoff before the next attempt).
    status: the whole EngineBuild .status (state Pending|Building|Ready|Failed, attempts, currentJob,
        progress, failureReason, message, artifactPath, startTime, completionTime, durationSeconds,
        nextAttemptTime, conditions, observedGeneration). Deterministic for equal inputs.
    requeue_after: seconds until the build should be looked at again without a watch event (backoff).
    events: Events for changes against the previous status.
    """

    job: dict | None = None
    status: dict = field(default_factory=dict)
    requeue_after: float | None = None
    events: list[PlannedEvent] = field(default_factory=list)


def plan_build(
    build: dict,
    jobs: list[dict],
    now: datetime,
    settings: PlanSettings = DEFAULT_SETTINGS,
    pods: list[dict] = (),
) -> BuildPlan:
    """Plan one EngineBuild.

    build: the EngineBuild as read. jobs: the Jobs labelled inferfleet.dev/engine-build=<name> (any order).
    pods: optional, the pods of those Jobs (termination messages and progress annotations are read from
    them when given). At most spec.maxAttempts Jobs are ever created; attempt n+1 starts no earlier than
    backoffSeconds * 2**(n-1) (capped at settings.max_backoff_seconds) after attempt n failed.
    """
    raise NotImplementedError("plan_build is being written")


@dataclass(frozen=True)
class GcDecision:
    """delete: the build is unreferenced for longer than the retention; requeue_after: when to look again;
    unreferenced_since: RFC 3339 time to record (annotation inferfleet.dev/unreferenced-since) or None when referenced."""

    delete: bool
    requeue_after: float | None
    unreferenced_since: str | None


def plan_gc(build: dict, services: list[dict], now: datetime, settings: PlanSettings = DEFAULT_SETTINGS) -> GcDecision:
    """Decide whether an EngineBuild is garbage: referenced means some InferenceService of its namespace lists
    it in status.pools[].engineBuild or status.pools[].servingEngineBuild."""
    raise NotImplementedError("plan_gc is being written")

"""plan_service: one InferenceService × the cluster's nodes, runtimes, builds and Deployments -> its whole desired state."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime

from .api import DEFAULT_SETTINGS, PlanSettings
from .conditions import PlannedEvent

# Labels and annotations the planner writes (manifests.py uses the same constants).
ENGINE_KEY_ANNOTATION = "inferfleet.dev/engine-key"  # on a pool Deployment: the compiled engine it serves ("" = paged)


@dataclass
class ServicePlan:
    """Everything one reconcile of an InferenceService must make true.

    engine_builds: desired EngineBuild objects (full manifests: apiVersion, kind, metadata, spec), one per
        engine key some pool of this service needs now (the one being built and, during an envelope change,
        the one still serving). Apply them; never delete builds from here (GC is by reference, builds.py).
    children: desired Deployments (one per serving pool), the Service and the PodDisruptionBudget, with
        ownerReferences to the InferenceService. Children labelled inferfleet.dev/service=<name> that are
        not in this list are stale and should be deleted.
    status: the whole InferenceService .status (observedGeneration, conditions, endpoint, pools,
        excludedPools, poolCount, runtimes). Deterministic: equal inputs give an equal dict, so a no-op
        resync can skip the status write by comparing with the stored status.
    events: Events worth a person's attention, only for changes against the previous status.
    requeue_after: seconds until the plan should be recomputed even without a watch event (None: no timer).
    """

    engine_builds: list[dict] = field(default_factory=list)
    children: list[dict] = field(default_factory=list)
    status: dict = field(default_factory=dict)
    events: list[PlannedEvent] = field(default_factory=list)
    requeue_after: float | None = None


def plan_service(
    service: dict,
    nodes: list[dict],
    runtimes: list[dict],
    builds: dict[str, dict],
    deployments: dict[str, dict],
    now: datetime,
    settings: PlanSettings = DEFAULT_SETTINGS,
) -> ServicePlan:
    """Plan one InferenceService.

    service: the InferenceService object as read (metadata.uid/generation used; .status read for previous
        conditions so lastTransitionTime only moves on a flip).
    nodes: every Node object (classified here; NotReady/unschedulable ones excluded with a reason).
    runtimes: every InferenceRuntime object.
    builds: engine key -> EngineBuild object as read (status.state Pending|Building|Ready|Failed).
    deployments: Deployment name -> Deployment as read, for this service's pools (ready replica counts,
        and the engine key annotation so the old engine keeps serving until the new build is Ready).
    now: the time used for condition transitions.
    Raises api.SpecError for a spec the CRD rules should have refused.
    """
    raise NotImplementedError("plan_service is being written")

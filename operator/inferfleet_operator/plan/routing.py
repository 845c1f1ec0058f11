"""plan_routing: the InferencePool (Gateway API Inference Extension) over every pool's serving pods of one service, and its status."""

from __future__ import annotations

from dataclasses import dataclass

from inferfleet_operator.api.conditions import PlannedEvent, warning
from inferfleet_operator.api.names import (
    API_VERSION,
    COMPONENT_LABEL,
    POOL_API_VERSION,
    POOL_KIND,
    SERVICE_KIND,
    SERVICE_LABEL,
)
from inferfleet_operator.api.types import InferenceService, PlanSettings
from inferfleet_operator.plan import manifests as m

REASON_APPLIED = "InferencePoolApplied"
REASON_DISABLED = "RoutingDisabled"
REASON_CRD_ABSENT = "InferencePoolCRDAbsent"
REASON_OPERATOR_DISABLED = "InferencePoolsOffInOperator"


@dataclass(frozen=True)
class RoutingPlan:
    pool: dict | None  # the InferencePool to apply; None: there must be none
    status: dict  # the service's status.routing
    stale_pool: str = ""  # the InferencePool an earlier plan made, to delete now ("": none, or it cannot be asked)
    warning: PlannedEvent | None = None  # routing was asked for (Enabled) and cannot be: say why


def inference_pool_for(service: InferenceService, settings: PlanSettings) -> dict:
    """One InferencePool named after the service. Its selector is the Service's: the labels every pool's
    serving pods carry (manifests.deployment_for_pool), so pools joining or leaving never change it."""
    spec: dict = {
        "selector": {"matchLabels": {SERVICE_LABEL: service.meta.name, COMPONENT_LABEL: "server"}},
        "targetPorts": [{"number": settings.port}],
    }
    picker = service.spec.routing.endpoint_picker
    if picker is not None:
        spec["endpointPickerRef"] = {
            "group": picker.group,
            "kind": picker.kind,
            "name": picker.name,
            "port": {"number": picker.port},
            "failureMode": picker.failure_mode,
        }
    owner = m.owner_reference(API_VERSION, SERVICE_KIND, service.meta.name, service.meta.uid)
    return {
        "apiVersion": POOL_API_VERSION,
        "kind": POOL_KIND,
        "metadata": {
            "name": service.meta.name,
            "namespace": service.meta.namespace,
            "labels": m.common_labels(service.meta.name),
            "ownerReferences": [owner],
        },  # fmt: skip
        "spec": spec,
    }


def plan_routing(
    service: InferenceService,
    serving_pools: list[str],
    is_served: bool,
    is_allowed: bool,
    settings: PlanSettings,
    previous: str = "",
) -> RoutingPlan:
    """serving_pools: the pools that run serving pods now. is_served: the cluster serves the GAIE CRD.
    is_allowed: the operator was started with InferencePools on (its RBAC grants them). previous: the
    InferencePool the service's status names (made by an earlier plan)."""
    mode = service.spec.routing.inference_pool
    stale = previous if is_allowed and is_served else ""
    if mode == "Disabled":
        return RoutingPlan(
            None, {"reason": REASON_DISABLED, "message": "spec.routing.inferencePool is Disabled"}, stale
        )
    if not is_allowed or not is_served:
        if not is_allowed:
            reason, why = (
                REASON_OPERATOR_DISABLED,
                "the operator runs with --inference-pools=disabled (no RBAC for inferencepools)",
            )
        else:
            reason = REASON_CRD_ABSENT
            why = f"the cluster does not serve {POOL_API_VERSION} {POOL_KIND} (install the Gateway API Inference Extension CRDs)"
        said = warning(reason, why) if mode == "Enabled" else None
        return RoutingPlan(None, {"reason": reason, "message": why}, stale, said)
    pool = inference_pool_for(service, settings)
    status = {
        "inferencePool": pool["metadata"]["name"],
        "apiVersion": POOL_API_VERSION,
        "reason": REASON_APPLIED,
        "message": f"selects the serving pods of {len(serving_pools)} pool(s) on port {settings.port}",
        "pools": sorted(serving_pools),
    }
    return RoutingPlan(pool, status)

"""Schema pieces of InferenceService routing (InferencePool) and autoscaling, spec and status, for crdgen."""

from __future__ import annotations

from inferfleet_operator.api import types as api
from inferfleet_operator.api.crdschema import array, integer, obj, rule, string
from inferfleet_operator.api.types import BOUNDS, FAILURE_MODES, INFERENCE_POOL_MODES, default_of


def routing_schema() -> dict:
    d = lambda name: default_of(api.EndpointPicker, name)  # noqa: E731
    picker = obj(
        "The endpoint picker the gateway consults (InferencePool spec.endpointPickerRef); none when absent.",
        {
            "name": string("Name of the picker's Service (or other kind).", max_length=253),
            "port": integer("Port of the picker (the Service port).", bounds=BOUNDS["port"]),
            "kind": string("Kind of the referent.", d("kind"), max_length=63),
            "group": string("API group of the referent (empty: core).", d("group"), max_length=253),
            "failureMode": string(
                "What the gateway does when the picker does not answer.", d("failure_mode"), FAILURE_MODES
            ),
        },
        required=("name", "port"),
    )
    return obj(
        "How a gateway reaches the service's pods.",
        {
            "inferencePool": string(
                "Auto: an InferencePool (Gateway API Inference Extension) over every pool's pods when its CRD is served; "
                "Enabled: always (status reports it when the CRD is missing); Disabled: never.",
                default_of(api.RoutingSpec, "inference_pool"),
                INFERENCE_POOL_MODES,
            ),
            "endpointPicker": picker,
        },
        default={},
    )


def autoscaling_schema() -> dict:
    d = lambda name: default_of(api.AutoscalingSpec, name)  # noqa: E731
    return obj(
        "Replicas follow the serving pods' own /metrics (queued requests, KV cache usage) with the HPA formula; "
        "absent: spec.replicas is fixed. Scale to zero is not supported (minReplicas >= 1).",
        {
            "minReplicas": integer("Fewest replicas across pools.", d("min_replicas"), BOUNDS["min_replicas"]),
            "maxReplicas": integer("Most replicas across pools.", bounds=BOUNDS["max_replicas"]),
            "targetWaitingRequests": integer(
                "Target queued requests per replica (inferfleet:num_requests_waiting).",
                bounds=BOUNDS["target_waiting_requests"],
            ),
            "targetKvCacheUsagePercent": integer(
                "Target KV cache usage per replica in percent (inferfleet:kv_cache_usage_perc).",
                bounds=BOUNDS["target_kv_cache_usage_percent"],
            ),
            "scaleDownStabilizationSeconds": integer(
                "A pool scales down only to the highest recommendation of this window.",
                d("scale_down_stabilization_seconds"),
                BOUNDS["scale_down_stabilization_seconds"],
            ),
        },
        required=("maxReplicas",),
        rules=[
            rule(
                "!has(self.minReplicas) || self.minReplicas <= self.maxReplicas",
                "autoscaling.minReplicas must be at most autoscaling.maxReplicas",
                fieldPath=".minReplicas",
            ),
            rule(
                "has(self.targetWaitingRequests) || has(self.targetKvCacheUsagePercent)",
                "autoscaling needs targetWaitingRequests or targetKvCacheUsagePercent (or both)",
            ),
        ],  # fmt: skip
    )


def routing_status_schema() -> dict:
    return obj(
        "The InferencePool, when one is planned.",
        {
            "inferencePool": string("Name of the InferencePool (empty: none)."),
            "apiVersion": string("Its API version."),
            "reason": string("CamelCase reason."),
            "message": string("Detail."),
            "pools": array("Pools whose pods it selects.", string("Pool name."), 256, "set"),
        },
    )


def autoscaling_status_schema() -> dict:
    pool = obj(
        "One pool's last scaling decision.",
        {
            "name": string("Pool name."),
            "currentReplicas": integer("Replicas before the decision."),
            "desiredReplicas": integer("Replicas decided."),
            "metric": string("Metric that drove the decision (empty: none)."),
            "value": string("Its average over the pool's pods."),
            "target": string("Its target per replica."),
            "reason": string("CamelCase reason."),
            "message": string("Detail."),
        },
        required=("name",),
    )
    return obj(
        "What the autoscaler decided last.",
        {
            "pools": array("One entry per serving pool.", pool, 256, "map", ("name",)),
            "lastScaleTime": {
                "type": "string",
                "format": "date-time",
                "description": "When a pool's replicas last changed.",
            },
        },
    )

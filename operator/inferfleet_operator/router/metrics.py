"""RouterMetrics: the router's Prometheus registry (requests routed per endpoint and pool, errors, decisions)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest

ENDPOINT_LABELS = ["endpoint", "pool"]


class RouterMetrics:
    """In its own registry (no process-global state)."""

    def __init__(self) -> None:
        r = self.registry = CollectorRegistry()
        self.routed = Counter(
            "inferfleet_router_routed_requests",
            "Requests sent to an endpoint (each attempt of a retried request counts)",
            ENDPOINT_LABELS,
            registry=r,
        )
        self.upstream_errors = Counter(
            "inferfleet_router_upstream_errors",
            "Attempts that failed at an endpoint: connect (no answer), status (429/503, retried), stream (broke "
            "after the first byte)",
            [*ENDPOINT_LABELS, "kind"],
            registry=r,
        )
        self.retries = Counter("inferfleet_router_retries", "Requests sent again to another endpoint", registry=r)
        self.rejected = Counter(
            "inferfleet_router_rejected_requests",
            "Requests the router answered itself, by status (400, 401, 413, 503): none reached a pod",
            ["code"],
            registry=r,
        )
        self.decisions = Counter(
            "inferfleet_router_picker_decisions",
            "Picker decisions by reason (PickerFailed: the picker raised)",
            ["reason"],
            registry=r,
        )
        self.output_tokens = Counter(
            "inferfleet_router_output_tokens",
            "Output tokens relayed back (usage, or stream chunks with text)",
            ENDPOINT_LABELS,
            registry=r,
        )
        self.in_flight = Gauge(
            "inferfleet_router_in_flight_requests", "Requests being answered", ENDPOINT_LABELS, registry=r
        )
        self.ready = Gauge(
            "inferfleet_router_endpoint_ready", "1 when the endpoint may be picked", ENDPOINT_LABELS, registry=r
        )
        self.pool_decode_rate = Gauge(
            "inferfleet_router_pool_decode_tokens_per_second",
            "Decode tokens/s of the pool's profile at its largest measured batch, by where the profile comes from "
            "(file, measured, learned, default)",
            ["pool", "source"],
            registry=r,
        )

    def render(self) -> bytes:
        return generate_latest(self.registry)

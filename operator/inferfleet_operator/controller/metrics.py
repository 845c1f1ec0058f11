"""Prometheus metrics of the operator: reconciles, errors, durations, API requests and builds by state."""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterable

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily

from inferfleet_operator.api.types import BUILD_STATES
from inferfleet_operator.kube.client import WRITE_VERBS


class _BuildStates:
    """Collector that counts EngineBuilds by status.state at scrape time (from the operator's index)."""

    def __init__(self, states: Callable[[], Iterable[str]]):
        self._states = states

    def collect(self):
        family = GaugeMetricFamily(
            "inferfleet_operator_engine_builds", "EngineBuilds known to the operator, by state", labels=["state"]
        )
        counts = collections.Counter(self._states())
        for state in sorted(set(BUILD_STATES) | set(counts)):
            family.add_metric([state], counts.get(state, 0))
        yield family


class _DegradedServices:
    """Collector that counts InferenceServices whose Degraded condition is True, by its reason (the
    failure a user must act on: ApplyFailed, ClaimNotFound, BuildFailed, ...), at scrape time."""

    def __init__(self, reasons: Callable[[], Iterable[str]]):
        self._reasons = reasons

    def collect(self):
        family = GaugeMetricFamily(
            "inferfleet_operator_degraded_services",
            "InferenceServices with Degraded=True, by reason",
            labels=["reason"],
        )
        for reason, count in sorted(collections.Counter(self._reasons()).items()):
            family.add_metric([reason], count)
        yield family


class Metrics:
    """The operator's metrics in their own registry (no process-global state)."""

    def __init__(self, registry: CollectorRegistry | None = None):
        self.registry = registry or CollectorRegistry()
        self.reconciles = Counter(
            "inferfleet_operator_reconciles", "Reconciles run, by kind", ["kind"], registry=self.registry
        )
        self.errors = Counter(
            "inferfleet_operator_reconcile_errors", "Reconciles that failed, by kind", ["kind"], registry=self.registry
        )
        self.duration = Histogram(
            "inferfleet_operator_reconcile_duration_seconds",
            "Wall time of one reconcile, by kind",
            ["kind"],
            buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10),
            registry=self.registry,
        )
        self.api_requests = Counter(
            "inferfleet_operator_api_requests",
            "Requests to the Kubernetes API, by verb and kind",
            ["verb", "kind"],
            registry=self.registry,
        )
        self.api_writes = Counter(
            "inferfleet_operator_api_writes",
            "Requests that write (apply, apply-status, create, delete)",
            ["kind"],
            registry=self.registry,
        )

    def count_request(self, verb: str, kind: str) -> None:
        self.api_requests.labels(verb, kind).inc()
        if verb in WRITE_VERBS:
            self.api_writes.labels(kind).inc()

    def watch_builds(self, states: Callable[[], Iterable[str]]) -> None:
        self.registry.register(_BuildStates(states))

    def watch_degraded(self, services: Callable[[], Iterable[dict]]) -> None:
        """Counts, at scrape time, the given InferenceServices (as read) that are Degraded, by reason."""

        def reasons():
            for service in services():
                for cond in (service.get("status") or {}).get("conditions") or []:
                    if cond.get("type") == "Degraded" and cond.get("status") == "True":
                        yield cond.get("reason") or "Unknown"

        self.registry.register(_DegradedServices(reasons))

"""Metrics: services counted by their Degraded reason at scrape time."""

from __future__ import annotations

from prometheus_client import generate_latest

from inferfleet_operator.controller.metrics import Metrics


def _service(status: str, reason: str) -> dict:
    return {
        "status": {
            "conditions": [
                {"type": "Ready", "status": "True", "reason": "AllPoolsReady"},
                {"type": "Degraded", "status": status, "reason": reason},
            ]
        }
    }


def test_degraded_services_are_counted_by_reason_when_scraped():
    services = [
        _service("True", "ApplyFailed"),
        _service("True", "ApplyFailed"),
        _service("True", "ClaimNotFound"),
        _service("False", "AsPlanned"),
        {},
    ]
    metrics = Metrics()
    metrics.watch_degraded(lambda: services)
    text = generate_latest(metrics.registry).decode()
    assert 'inferfleet_operator_degraded_services{reason="ApplyFailed"} 2.0' in text
    assert 'inferfleet_operator_degraded_services{reason="ClaimNotFound"} 1.0' in text
    assert "AsPlanned" not in text
    services.clear()  # read at scrape time, not when registered
    assert "ApplyFailed" not in generate_latest(metrics.registry).decode()

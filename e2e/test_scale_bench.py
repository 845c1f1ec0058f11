"""The operator scale benchmark (e2e/bench/scale.py) at a small size: it runs end to end on its own
cluster and reports every figure, measured from what really happened."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent / "bench" / "scale.py"

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_scale_bench_reports_time_requests_and_memory_against_the_floor(tmp_path):
    out = tmp_path / "scale.json"
    result = subprocess.run(
        [sys.executable, str(SCRIPT), "--nodes", "20", "--services", "5", "--request-costs", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert result.returncode == 0, result.stderr[-4000:]
    figures = json.loads(out.read_text())

    assert figures["nodes"] == 20 and figures["services"] == 5
    # Every service got its Deployment(s), Service and PDB, from the operator as from the floor.
    assert figures["operator_objects"] == figures["floor_objects"] >= 3 * 5
    assert figures["pods"] >= 5 and figures["pools_used"] >= 2
    assert figures["operator_seconds"] > 0 and figures["floor_seconds"] > 0
    # The ratio is taken from the unrounded seconds; the JSON holds both rounded to 0.01 s, so the ratio
    # must lie within what those roundings allow (sub-second floors make that band wide).
    op, floor, half = figures["operator_seconds"], figures["floor_seconds"], 0.005
    assert (op - half) / (floor + half) - half <= figures["ratio"] <= (op + half) / max(floor - half, 1e-9) + half
    # At least one apply per child and one status write per service went through the operator's client.
    assert figures["operator_api_writes_per_service"] >= figures["operator_objects"] / 5 + 1
    assert figures["operator_api_requests_per_service"] >= figures["operator_api_writes_per_service"]
    assert figures["apiserver_requests_per_service_operator_run"] > 0
    assert 0 < figures["operator_idle_rss_mb"] <= figures["operator_peak_rss_mb"]
    for key in ("operator_seconds", "floor_seconds", "ratio", "operator_peak_rss_mb"):
        assert f"{key}: {figures[key]}" in result.stdout
    assert "InferenceServices Ready: 5/5" in result.stderr
    # --request-costs: the API server's CPU per request of every kind of write the runs made, measured.
    costs = figures["apiserver_cpu_ms_per_request"]
    assert set(costs) == {
        "create InferenceService",
        "apply-status InferenceService",
        "create Event",
        "apply Deployment",
        "apply Service",
        "apply PodDisruptionBudget",
    }
    assert all(ms > 0 for ms in costs.values()), costs
    assert figures["apiserver_cpu_ms_per_service_inferenceservice_writes"] > costs["create InferenceService"]
    assert figures["apiserver_cpu_ms_per_service_floor_run"] > 0

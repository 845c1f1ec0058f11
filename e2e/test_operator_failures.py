"""Failures a user must act on, on the local cluster: each reaches the service's (or build's) status
as a condition reason and a Warning Event within one reconcile."""

from __future__ import annotations

import pytest
from helpers import condition, wait_for
from operator_process import add_engine_cache, events, remove_engine_cache, service_manifest

pytestmark = pytest.mark.e2e

ON_AMD = {"vendors": ["amd"]}
ON_H100 = {"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}}
H100 = "nvidia-h100-80gb-hbm3"


def _degraded_with(cluster, ns: str, name: str, reason: str) -> dict:
    def degraded():
        found = condition(cluster.get("inferenceservice", name, ns), "Degraded")
        return found if found and found["status"] == "True" and found["reason"] == reason else None

    return wait_for(degraded, timeout=60, message=f"Degraded {reason} on {name}")


def _warning(cluster, ns: str, name: str, reason: str) -> dict:
    def posted():
        return next((e for e in events(cluster, ns, name) if e["type"] == "Warning" and e["reason"] == reason), None)

    return wait_for(posted, timeout=30, message=f"a Warning Event {reason} about {name}")


def test_pods_unschedulable_for_a_named_resource_degrade_the_service(cluster, ns, operator):
    # No node has 4000Gi of memory: the scheduler says "Insufficient memory".
    cluster.apply(service_manifest("huge", placement=ON_AMD, resources={"memory": "4000Gi"}), namespace=ns)
    degraded = _degraded_with(cluster, ns, "huge", "InsufficientResource")
    assert "Insufficient memory" in degraded["message"]
    pools = cluster.get("inferenceservice", "huge", ns)["status"]["pools"]
    assert any("Insufficient memory" in p.get("message", "") for p in pools)
    assert "Insufficient memory" in _warning(cluster, ns, "huge", "InsufficientResource")["message"]
    wait_for(
        lambda: operator.metric("inferfleet_operator_degraded_services", reason="InsufficientResource") >= 1,
        timeout=10,
        message="the degraded-services metric",
    )


def test_a_crash_looping_model_fetch_is_reported_with_exit_code_and_last_line(cluster, ns, operator):
    cluster.apply(
        service_manifest("fetchfail", uri="hf://inferfleet-e2e-fetch-fail/tiny", placement=ON_AMD), namespace=ns
    )
    degraded = _degraded_with(cluster, ns, "fetchfail", "FetchFailed")
    assert "fetch-model exited 2" in degraded["message"]
    assert degraded["message"].endswith("simulated failure (inferfleet e2e failure switch)")
    assert "exited 2" in _warning(cluster, ns, "fetchfail", "FetchFailed")["message"]


def test_a_missing_engine_cache_claim_holds_the_build_and_is_named_until_it_exists(cluster, namespace, operator):
    ns = namespace  # no engine cache claim here
    cluster.apply(service_manifest("noclaim", placement=ON_H100, pools={H100: 1}), namespace=ns)
    degraded = _degraded_with(cluster, ns, "noclaim", "ClaimNotFound")
    assert "inferfleet-engine-cache" in degraded["message"] and ns in degraded["message"]
    _warning(cluster, ns, "noclaim", "ClaimNotFound")

    def build_waits():
        items = cluster.items("enginebuilds", ns)
        built = condition(items[0], "Built") if items else None
        return items[0] if built and built["reason"] == "ClaimNotFound" else None

    build = wait_for(build_waits, timeout=30, message="the EngineBuild waiting for its claim")
    assert "inferfleet-engine-cache" in build["status"]["message"]
    _warning(cluster, ns, build["metadata"]["name"], "ClaimNotFound")
    assert cluster.items("jobs", ns) == [], "no compile Job runs its deadline down without the claim"

    add_engine_cache(cluster, ns)
    try:
        wait_for(
            lambda: (
                (condition(cluster.get("inferenceservice", "noclaim", ns), "Degraded") or {}).get("status") == "False"
            ),
            timeout=90,
            message="Degraded back to False",
        )
        assert cluster.items("jobs", ns), "the build ran once the claim existed"
    finally:
        remove_engine_cache(cluster, ns)


def test_a_refused_deployment_is_reported_with_the_api_servers_message(cluster, ns, operator):
    # A namespace quota that admits no Deployment: admission of the service cannot foresee it, the
    # API server refuses the operator's write (403 exceeded quota).
    quota = {
        "apiVersion": "v1",
        "kind": "ResourceQuota",
        "metadata": {"name": "no-deployments"},
        "spec": {"hard": {"count/deployments.apps": "0"}},
    }
    cluster.apply(quota, namespace=ns)
    wait_for(
        lambda: ((cluster.get("resourcequota", "no-deployments", ns) or {}).get("status") or {}).get("hard"),
        timeout=30,
        message="the quota's usage computed by the quota controller",
    )
    cluster.apply(service_manifest("refused", placement=ON_AMD), namespace=ns)
    degraded = _degraded_with(cluster, ns, "refused", "ApplyFailed")
    assert "Deployment refused-amd-mi300x" in degraded["message"]
    assert "exceeded quota: no-deployments" in degraded["message"]
    assert "exceeded quota: no-deployments" in _warning(cluster, ns, "refused", "ApplyFailed")["message"]

    # Fixed by the user: the Deployment is created and Degraded goes back to False.
    cluster.kubectl("delete", "resourcequota", "no-deployments", "-n", ns)
    wait_for(
        lambda: (condition(cluster.get("inferenceservice", "refused", ns), "Degraded") or {}).get("status") == "False",
        timeout=90,
        message="Degraded back to False",
    )
    assert cluster.get("deployment", "refused-amd-mi300x", ns) is not None
    warnings = [e for e in events(cluster, ns, "refused") if e["reason"] == "ApplyFailed"]
    assert len(warnings) == 1 and warnings[0].get("count", 1) == 1, "retries post no second Event"


def _gpu_blocker(node: str) -> dict:
    """A pod bound to `node` holding all 8 of its GPUs (kwok runs it), so nothing else fits there."""
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": f"blocker-{node}"},
        "spec": {
            "nodeName": node,
            "containers": [
                {
                    "name": "hold",
                    "image": "registry.k8s.io/pause:3.10",
                    "resources": {"limits": {"nvidia.com/gpu": "8"}},
                }
            ],
        },
    }


def test_a_compile_job_that_cannot_schedule_then_runs_past_its_deadline(cluster, ns, operator):
    cluster.apply([_gpu_blocker("nvidia-h100-0"), _gpu_blocker("nvidia-h100-1")], namespace=ns)
    try:
        _cannot_schedule_then_past_deadline(cluster, ns)
    finally:  # the H100 GPUs are free again for the tests after this one
        cluster.kubectl(
            "delete",
            "pod",
            "blocker-nvidia-h100-0",
            "blocker-nvidia-h100-1",
            "-n",
            ns,
            "--ignore-not-found",
            "--wait=true",
        )


def _cannot_schedule_then_past_deadline(cluster, ns: str) -> None:
    cluster.apply(service_manifest("late", placement=ON_H100, pools={H100: 1}), namespace=ns)

    def build_with(reason):
        def check():
            items = cluster.items("enginebuilds", ns)
            built = condition(items[0], "Built") if items else None
            return items[0] if built and built["reason"] == reason else None

        return check

    build = wait_for(
        build_with("InsufficientResource"), timeout=60, message="the EngineBuild saying its pod cannot schedule"
    )
    assert "Insufficient nvidia.com/gpu" in build["status"]["progress"]
    name = build["metadata"]["name"]
    _warning(cluster, ns, name, "InsufficientResource")
    assert "Insufficient nvidia.com/gpu" in _degraded_with(cluster, ns, "late", "InsufficientResource")["message"]

    # The Job's deadline (mutable on a Job) cut short: the Job controller fails it DeadlineExceeded.
    (job,) = cluster.items("jobs", ns)
    cluster.kubectl(
        "patch",
        "job",
        job["metadata"]["name"],
        "-n",
        ns,
        "--type",
        "merge",
        "-p",
        '{"spec": {"activeDeadlineSeconds": 1}}',
    )
    build = wait_for(build_with("DeadlineExceeded"), timeout=60, message="the EngineBuild failed by its deadline")
    assert build["status"]["state"] == "Failed"
    assert "deadline" in build["status"]["failureReason"]
    _warning(cluster, ns, name, "DeadlineExceeded")
    assert "deadline" in _degraded_with(cluster, ns, "late", "DeadlineExceeded")["message"]
    assert len(cluster.items("jobs", ns)) == 1, "a deadline is not retried"

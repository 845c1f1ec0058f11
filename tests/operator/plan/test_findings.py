"""findings: pods, Jobs, claims and refused applies -> a reason per failure, named in status."""

from __future__ import annotations

from planning_data import NOW

from inferfleet_operator.api import conditions as c
from inferfleet_operator.api.names import POOL_LABEL
from inferfleet_operator.plan.findings import (
    apply_finding,
    degraded_status,
    grouped,
    job_findings,
    last_line,
    missing_claims,
    pod_findings,
    pod_view,
    secret_fields,
    summary,
)

SCHEDULER_XE = (
    "0/3 nodes are available: 1 Insufficient gpu.intel.com/xe, 2 node(s) didn't match Pod's node "
    "affinity/selector. preemption: 0/3 nodes are available: 3 No preemption victims found."
)


def pod(name="llama-intel-1", *, scheduled=None, init=None, pool="intel-max-1100", deleting=False) -> dict:
    meta = {"name": name, "namespace": "team-a", "labels": {POOL_LABEL: pool}}
    if deleting:
        meta["deletionTimestamp"] = "2026-01-01T00:00:00Z"
    status = {"phase": "Pending", "conditions": []}
    if scheduled is not None:
        status["conditions"].append(
            {"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": scheduled}
        )
    if init is not None:
        status["initContainerStatuses"] = [init]
    return {"metadata": meta, "spec": {"containers": [{"name": "server"}]}, "status": status}


def fetch_status(state: dict, last: dict | None = None) -> dict:
    out = {"name": "fetch-model", "state": state, "restartCount": 3}
    if last is not None:
        out["lastState"] = last
    return out


def test_unschedulable_for_a_named_resource_names_the_resource_and_the_pool():
    [found] = pod_findings(pod(scheduled=SCHEDULER_XE), POOL_LABEL)
    assert found.reason == c.REASON_INSUFFICIENT_RESOURCE == "InsufficientResource"
    assert "Insufficient gpu.intel.com/xe" in found.message
    assert (found.subject, found.pool) == ("pod llama-intel-1", "intel-max-1100")


def test_a_missing_claim_in_the_scheduler_message_is_claim_not_found():
    message = '0/4 nodes are available: persistentvolumeclaim "inferfleet-engine-cache" not found. preemption: ...'
    [found] = pod_findings(pod(scheduled=message))
    assert found.reason == "ClaimNotFound"
    assert "inferfleet-engine-cache" in found.message and "team-a" in found.message


def test_unschedulable_for_another_reason_keeps_the_scheduler_message():
    [found] = pod_findings(pod(scheduled="0/2 nodes are available: 2 node(s) had untolerated taint {a: b}."))
    assert found.reason == "Unschedulable" and "untolerated taint" in found.message


def test_a_crash_looping_fetch_reports_exit_code_and_last_message_line():
    last = {
        "terminated": {
            "exitCode": 2,
            "reason": "Error",
            "message": "Traceback ...\ninferfleet-runtime fetch: error: unsupported URI s3://b/k\n",
        }
    }
    [found] = pod_findings(pod(init=fetch_status({"waiting": {"reason": "CrashLoopBackOff"}}, last)))
    assert found.reason == "FetchFailed"
    assert found.message == (
        "model fetch fetch-model exited 2 (Error): inferfleet-runtime fetch: error: unsupported URI s3://b/k"
    )


def test_a_fetch_that_failed_in_a_job_pod_is_reported_from_its_current_state():
    term = {"terminated": {"exitCode": 1, "reason": "Error", "message": "boom"}}
    [found] = pod_findings(pod(init=fetch_status(term)))
    assert "exited 1 (Error): boom" in found.message


def test_a_fetch_that_recovered_or_succeeded_is_not_reported():
    failed_before = {"terminated": {"exitCode": 1, "reason": "Error"}}
    assert pod_findings(pod(init=fetch_status({"running": {}}, failed_before))) == []
    assert pod_findings(pod(init=fetch_status({"terminated": {"exitCode": 0}}, failed_before))) == []
    assert pod_findings(pod()) == []


def test_a_deleting_pod_is_not_reported():
    assert pod_findings(pod(scheduled=SCHEDULER_XE, deleting=True)) == []


def test_pod_view_keeps_what_findings_read_and_drops_the_spec():
    raw = pod(scheduled=SCHEDULER_XE, init=fetch_status({"waiting": {}}, {"terminated": {"exitCode": 3}}))
    view = pod_view(raw)
    assert "spec" not in view
    assert pod_findings(view, POOL_LABEL) == pod_findings(raw, POOL_LABEL)


def test_a_job_past_its_deadline_is_deadline_exceeded():
    job = {
        "metadata": {"name": "k-1"},
        "spec": {"activeDeadlineSeconds": 7200},
        "status": {
            "conditions": [
                {
                    "type": "Failed",
                    "status": "True",
                    "reason": "DeadlineExceeded",
                    "message": "Job was active longer than specified deadline",
                }
            ]
        },
    }
    [found] = job_findings(job)
    assert found.reason == "DeadlineExceeded" and "7200 s" in found.message
    job["status"]["conditions"][0]["type"] = "FailureTarget"  # before the pods are gone
    assert [f.reason for f in job_findings(job)] == ["DeadlineExceeded"]
    job["status"]["conditions"][0]["reason"] = "BackoffLimitExceeded"
    assert job_findings(job) == []


def test_missing_claims_names_the_object_and_the_claim():
    deployment = {
        "kind": "Deployment",
        "metadata": {"name": "llama-h100", "namespace": "team-a", "labels": {POOL_LABEL: "nvidia-h100"}},
        "spec": {
            "template": {
                "spec": {
                    "volumes": [
                        {"name": "engines", "persistentVolumeClaim": {"claimName": "inferfleet-engine-cache"}},
                        {"name": "tmp", "emptyDir": {}},
                    ]
                }
            }
        },
    }
    [found] = missing_claims([deployment], {"other"}, POOL_LABEL)
    assert (found.reason, found.subject, found.pool) == ("ClaimNotFound", "Deployment llama-h100", "nvidia-h100")
    assert "inferfleet-engine-cache" in found.message
    assert missing_claims([deployment], {"inferfleet-engine-cache"}) == []


def test_summary_leads_with_the_most_pressing_reason_and_names_every_finding():
    fetch = pod_findings(pod(init=fetch_status({"terminated": {"exitCode": 2}})))
    refused = apply_finding(
        "Deployment", "llama-x", "422 Unprocessable Entity: spec.template.spec.containers[0].image: Required value"
    )
    reason, message = summary(fetch + [refused])
    assert reason == "ApplyFailed"
    assert message.index("Deployment llama-x") < message.index("pod llama-intel-1")
    assert "image: Required value" in message
    assert summary([]) is None
    assert [r for r, _ in grouped(fetch + [refused])] == ["ApplyFailed", "FetchFailed"]


def test_last_line_skips_trailing_blank_lines():
    assert last_line("a\nb\n\n") == "b"
    assert last_line(None) == ""


def _status(degraded=("False", "AsPlanned", "every pool serves as planned")):
    status, reason, message = degraded
    return {
        "conditions": [
            {"type": "Ready", "status": "True", "reason": "AllPoolsReady", "message": "", "lastTransitionTime": "t0"},
            {"type": "Degraded", "status": status, "reason": reason, "message": message, "lastTransitionTime": "t0"},
        ],
        "pools": [{"name": "intel-max-1100"}, {"name": "nvidia-h100"}],
    }


def test_degraded_status_sets_the_reason_and_names_the_pool():
    base = _status()
    findings = pod_findings(pod(scheduled=SCHEDULER_XE), POOL_LABEL)
    previous = {cond["type"]: cond for cond in base["conditions"]}
    out = degraded_status(base, findings, previous, NOW, 3)
    degraded = out["conditions"][1]
    assert (degraded["status"], degraded["reason"]) == ("True", "InsufficientResource")
    assert degraded["lastTransitionTime"] != "t0" and degraded["observedGeneration"] == 3
    assert "gpu.intel.com/xe" in out["pools"][0]["message"] and "message" not in out["pools"][1]
    assert base["conditions"][1]["status"] == "False"  # the input is not modified
    assert degraded_status(base, [], previous, NOW, 3) is base


def test_degraded_status_keeps_a_build_failure_after_the_findings():
    base = _status(("True", "BuildFailed", "engine build failed for pool(s) nvidia-h100"))
    refused = apply_finding("Deployment", "x", "bad toleration key")
    out = degraded_status(base, [refused], {}, NOW, 1)
    assert out["conditions"][1]["reason"] == "ApplyFailed"
    assert out["conditions"][1]["message"].endswith("engine build failed for pool(s) nvidia-h100")


def test_replicas_failing_alike_are_one_finding_naming_each_pod():
    from inferfleet_operator.plan.findings import pods_findings

    found = pods_findings(
        [
            pod("a", scheduled=SCHEDULER_XE),
            pod("b", scheduled=SCHEDULER_XE),
            pod("c", init=fetch_status({"terminated": {"exitCode": 2}})),
        ],
        POOL_LABEL,
    )
    assert [(f.reason, f.subject) for f in found] == [("FetchFailed", "pod c"), ("InsufficientResource", "pods a, b")]


def test_a_build_still_to_run_without_the_engine_cache_claim_is_claim_not_found():
    from inferfleet_operator.plan.findings import missing_cache_claim

    pools = [
        {"name": "nvidia-h100", "engineBuild": "k1", "buildState": "Pending"},
        {"name": "nvidia-a100", "engineBuild": "k2", "buildState": "Ready"},
        {"name": "amd-mi300x"},
    ]
    [found] = missing_cache_claim(pools, {"models"}, "inferfleet-engine-cache", "team-a")
    assert (found.reason, found.subject, found.pool) == ("ClaimNotFound", "EngineBuild k1", "nvidia-h100")
    assert missing_cache_claim(pools, {"inferfleet-engine-cache"}, "inferfleet-engine-cache", "team-a") == []


def test_what_a_pools_build_reports_reaches_the_service():
    from inferfleet_operator.plan.findings import build_findings

    def build(reason):
        return {
            "status": {
                "conditions": [
                    {"type": "Built", "status": "False", "reason": reason, "message": f"attempt 1: {reason}"}
                ]
            }
        }

    pools = [
        {"name": "nvidia-h100", "engineBuild": "k1"},
        {"name": "nvidia-l4", "engineBuild": "k2"},
        {"name": "nvidia-a100", "engineBuild": "k3"},
        {"name": "cpu-amd64"},
    ]
    builds = {"k1": build("DeadlineExceeded"), "k2": build("JobRunning"), "k3": build("ClaimNotFound")}
    [found] = build_findings(pools, builds)
    assert (found.reason, found.subject, found.pool) == ("DeadlineExceeded", "EngineBuild k1", "nvidia-h100")


def test_a_serving_container_refusing_its_model_is_server_failed_with_its_line_and_view():
    line = (
        "inferfleet-runtime serve: error: cannot serve /model: model_type 'falcon' is not supported (supported: llama)"
    )
    server = {
        "name": "server",
        "state": {"waiting": {"reason": "CrashLoopBackOff"}},
        "lastState": {"terminated": {"exitCode": 2, "reason": "Error", "message": line + "\n"}},
        "restartCount": 4,
    }
    raw = pod()
    raw["status"]["containerStatuses"] = [server]
    [found] = pod_findings(raw, POOL_LABEL)
    assert found.reason == "ServerFailed" and found.pool == "intel-max-1100"
    assert found.message == f"container server exited 2 (Error): {line}"
    assert pod_findings(pod_view(raw), POOL_LABEL) == [found]  # the index keeps what this reads
    raw["status"]["containerStatuses"] = [dict(server, state={"running": {}})]  # recovered: not reported
    assert pod_findings(raw) == []


def server_waiting(message: str, reason: str = "CreateContainerConfigError") -> dict:
    out = pod()
    out["status"]["containerStatuses"] = [
        {"name": "server", "state": {"waiting": {"reason": reason, "message": message}}}
    ]
    return out


FIELDS = secret_fields({"model": {"credentialsSecret": "hub"}, "auth": {"apiKeySecret": {"name": "llama-keys"}}})


def test_a_missing_api_key_secret_is_secret_not_found_naming_the_field():
    [found] = pod_findings(server_waiting('secret "llama-keys" not found'), POOL_LABEL, FIELDS)
    assert found.reason == c.REASON_SECRET_NOT_FOUND and found.pool == "intel-max-1100"
    assert found.message == (
        "Secret llama-keys not found in namespace team-a (named by spec.auth.apiKeySecret): container server waits "
        "until it exists"
    )


def test_a_secret_without_the_named_key_says_which_key():
    message = "couldn't find key api-key in Secret team-a/llama-keys"
    [found] = pod_findings(server_waiting(message), POOL_LABEL, FIELDS)
    assert found.message.startswith("Secret llama-keys has no key api-key (named by spec.auth.apiKeySecret)")


def test_a_missing_credentials_secret_of_the_fetch_is_secret_not_found_too():
    waiting = {"name": "fetch-model", "state": {"waiting": {"reason": "CreateContainerConfigError",
                                                            "message": 'secret "hub" not found'}}}  # fmt: skip
    [found] = pod_findings(pod(init=waiting), POOL_LABEL, FIELDS)
    assert found.reason == c.REASON_SECRET_NOT_FOUND and "(named by spec.model.credentialsSecret)" in found.message


def test_other_waiting_states_are_not_secret_findings():
    assert pod_findings(server_waiting("back-off pulling image", reason="ImagePullBackOff"), POOL_LABEL, FIELDS) == []
    assert pod_findings(server_waiting('configmap "x" not found'), POOL_LABEL, FIELDS) == []

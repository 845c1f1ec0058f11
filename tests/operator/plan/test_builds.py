"""plan_build: one Job per attempt, bounded retries with exponential backoff, failure reasons; plan_gc by reference."""

from __future__ import annotations

import copy
import json
from datetime import timedelta

import pytest
from crd_eval import load_schema, schema_errors
from planning_data import NOW

from inferfleet_operator.api.names import UNREFERENCED_ANNOTATION
from inferfleet_operator.api.types import EngineBuildSpec, PlanSettings, from_dict
from inferfleet_operator.plan.build_lifecycle import plan_gc, rebuild_request, rebuilds_for_lost_engines
from inferfleet_operator.plan.builds import backoff_seconds, plan_build
from inferfleet_operator.plan.engine_key import spec_key

BASE = {
    "modelUri": "hf://org/m", "revision": "main", "envelope": {"maxContextLength": 2048},
    "vendor": "nvidia", "architecture": "sm90", "image": "r:1", "compileImage": "c:1", "gpuResource": "nvidia.com/gpu",
    "gpus": 1, "maxAttempts": 3, "backoffSeconds": 10, "placement": {"nodeNames": ["h1", "h2"]},
}  # fmt: skip
SPEC = from_dict(EngineBuildSpec, BASE | {"engineKey": ""})
KEY = spec_key(SPEC, "team-a")  # the builds below live in team-a


def build(status=None, **spec) -> dict:
    base = BASE | {"engineKey": KEY}
    return {
        "metadata": {"name": KEY, "namespace": "team-a", "uid": "uid-b", "generation": 1},
        "spec": base | spec,
        "status": status or {},
    }


def t(seconds: float) -> str:
    return (NOW + timedelta(seconds=seconds)).strftime("%Y-%m-%dT%H:%M:%SZ")


def job(attempt: int, outcome: str, at: float = 0, owner: str = "uid-b") -> dict:
    status = {"startTime": t(at - 60)}
    if outcome == "failed":
        status |= {
            "failed": 1,
            "conditions": [
                {"type": "Failed", "status": "True", "reason": "BackoffLimitExceeded", "lastTransitionTime": t(at)}
            ],
        }
    elif outcome == "succeeded":
        status |= {
            "succeeded": 1,
            "completionTime": t(at),
            "conditions": [{"type": "Complete", "status": "True", "lastTransitionTime": t(at)}],
        }
    else:
        status |= {"active": 1}
    name = f"{KEY}-{attempt}"
    meta = {"name": name, "annotations": {"inferfleet.dev/attempt": str(attempt)}, "ownerReferences": [{"uid": owner}]}
    return {"metadata": meta, "status": status}


def pod(job_name: str, exit_code: int, message: str) -> dict:
    return {
        "metadata": {"name": job_name + "-x", "labels": {"batch.kubernetes.io/job-name": job_name}},
        "status": {"phase": "Failed" if exit_code else "Succeeded", "containerStatuses": [
            {"name": "compile", "state": {"terminated": {"exitCode": exit_code, "reason": "Error" if exit_code else "Completed", "message": message}}}]},
    }  # fmt: skip


def test_first_reconcile_creates_attempt_one():
    p = plan_build(build(), [], NOW)
    assert p.job["metadata"]["name"] == f"{KEY}-1"
    assert p.job["spec"]["backoffLimit"] == 0
    assert p.job["metadata"]["ownerReferences"][0]["kind"] == "EngineBuild"
    assert (p.status["state"], p.status["attempts"], p.status["currentJob"]) == ("Pending", 1, f"{KEY}-1")
    assert [e.reason for e in p.events] == ["JobCreated"]


def test_compile_job_runs_the_compile_contract_on_the_target_nodes():
    spec = plan_build(build(), [], NOW).job["spec"]["template"]["spec"]
    container = spec["containers"][0]
    assert container["image"] == "c:1" and container["command"] == ["inferfleet-runtime"]
    assert container["args"][:7] == [
        "compile",
        "--model",
        "/models/model",
        "--out",
        f"/engines/{KEY}",
        "--backend",
        "tensorrt",
    ]
    assert "--max-context-length" in container["args"] and container["resources"]["limits"]["nvidia.com/gpu"] == "1"
    assert spec["initContainers"][0]["args"] == ["fetch", "--uri", "hf://org/m", "--to", "/models/model"]
    terms = spec["affinity"]["nodeAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
    assert terms == [
        {"matchFields": [{"key": "metadata.name", "operator": "In", "values": [name]}]} for name in ("h1", "h2")
    ]
    mounts = {m["name"]: m for m in container["volumeMounts"]}
    assert mounts["engines"].get("readOnly") is None  # the compile Job writes the cache


def test_running_job_is_building_with_progress_and_nothing_to_create():
    running = job(1, "running")
    running["metadata"]["annotations"]["inferfleet.dev/build-progress"] = "exporting 40%"
    p = plan_build(build(), [running], NOW)
    assert p.job is None and p.status["state"] == "Building" and p.status["progress"] == "exporting 40%"


def test_failed_attempt_waits_out_the_backoff_then_starts_the_next():
    failed = [job(1, "failed", at=0)]
    pods = [pod(f"{KEY}-1", 1, "TensorRT: out of memory\nbuilder failed: CUDA OOM")]
    waiting = plan_build(build(), failed, NOW + timedelta(seconds=4), pods=pods)
    assert waiting.job is None and waiting.requeue_after == 6
    assert waiting.status["state"] == "Pending" and waiting.status["nextAttemptTime"] == t(10)
    assert waiting.status["failureReason"] == "container compile exited 1 (Error): builder failed: CUDA OOM"
    assert waiting.status["conditions"][0]["reason"] == "BackoffBeforeRetry"
    retry = plan_build(build(), failed, NOW + timedelta(seconds=10), pods=pods)
    assert retry.job["metadata"]["name"] == f"{KEY}-2" and retry.status["attempts"] == 2


def test_backoff_doubles_per_attempt_up_to_the_cap():
    assert [backoff_seconds(10, n, 600) for n in (1, 2, 3, 4, 8)] == [10, 20, 40, 80, 600]
    failed = [job(1, "failed", at=-100), job(2, "failed", at=0)]
    p = plan_build(build(), failed, NOW + timedelta(seconds=5))
    assert p.requeue_after == 15 and p.job is None


def test_attempts_are_bounded_and_the_build_fails_with_the_last_reason():
    jobs = [job(1, "failed", at=-300), job(2, "failed", at=-200), job(3, "failed", at=-100)]
    p = plan_build(build(), jobs, NOW)
    assert p.job is None and p.requeue_after is None
    assert p.status["state"] == "Failed" and p.status["attempts"] == 3
    assert "BackoffLimitExceeded" in p.status["failureReason"]
    assert any(e.type == "Warning" and e.reason == "AttemptsExhausted" for e in p.events)
    assert p.status["conditions"][0]["status"] == "False"


def test_max_attempts_comes_from_the_spec():
    p = plan_build(build(maxAttempts=1), [job(1, "failed")], NOW + timedelta(hours=1))
    assert p.status["state"] == "Failed" and p.job is None


def test_succeeded_job_makes_the_build_ready_with_artifact_details():
    jobs = [job(1, "failed", at=-500), job(2, "succeeded", at=0)]
    pods = [pod(f"{KEY}-2", 0, '{"artifactSizeBytes": 123456}')]
    p = plan_build(build(), jobs, NOW, pods=pods)
    s = p.status
    assert (s["state"], s["artifactPath"], s["artifactSizeBytes"], s["durationSeconds"]) == (
        "Ready",
        f"/engines/{KEY}",
        123456,
        60,
    )
    assert s["conditions"][0]["status"] == "True" and p.job is None


def test_succeeded_job_records_the_model_digest_and_commit_and_the_directory_they_name():
    commit = "0123456789abcdef0123456789abcdef01234567"
    message = f'{{"artifactSizeBytes": 1, "modelDigest": "00ff00ff00ff00ff", "modelCommit": "{commit}"}}'
    s = plan_build(build(), [job(1, "succeeded")], NOW, pods=[pod(f"{KEY}-1", 0, message)]).status
    assert (s["modelDigest"], s["resolvedRevision"]) == ("00ff00ff00ff00ff", commit)
    assert s["artifactPath"] == f"/engines/{KEY}/00ff00ff00ff00ff"


@pytest.mark.parametrize("digest", ["../../etc", "00FF00FF00FF00FF", "00ff", 7, ""])
def test_a_reported_digest_not_of_its_form_is_ignored(digest):
    message = json.dumps({"modelDigest": digest, "modelCommit": "main"})
    s = plan_build(build(), [job(1, "succeeded")], NOW, pods=[pod(f"{KEY}-1", 0, message)]).status
    assert "modelDigest" not in s and "resolvedRevision" not in s and s["artifactPath"] == f"/engines/{KEY}"


@pytest.mark.parametrize(
    "change",
    [
        {"modelUri": "hf://org/other"},
        {"revision": "v2"},
        {"envelope": {"maxContextLength": 4096}},
        {"architecture": "sm80"},
        {"compileImage": "c:2"},
        {"image": "r:2"},
        {"quantization": "Int8"},
    ],
)
def test_a_build_whose_spec_does_not_hash_to_its_key_is_refused_and_builds_nothing(change):
    refused = build()
    refused["spec"] |= change
    p = plan_build(refused, [], NOW)
    assert p.job is None and p.status["state"] == "Failed" and p.status["attempts"] == 0
    assert p.status["conditions"][0]["reason"] == "KeyMismatch"
    assert "does not hash to its key" in p.status["message"]
    assert [(e.type, e.reason) for e in p.events] == [("Warning", "KeyMismatch")]
    # The Event goes out once, not on every resync.
    assert plan_build(refused | {"status": p.status}, [], NOW).events == []


def test_a_build_named_other_than_its_key_is_refused():
    renamed = build()
    renamed["metadata"]["name"] = "fedcba9876543210"
    p = plan_build(renamed, [], NOW)
    assert p.job is None and p.status["conditions"][0]["reason"] == "KeyMismatch"


def test_jobs_carrying_the_builds_labels_but_not_owned_by_it_are_not_attempts():
    # A succeeded Job of someone else (or of an earlier EngineBuild of the same name) does not make it Ready.
    p = plan_build(build(), [job(1, "succeeded", owner="uid-other"), job(2, "failed", owner="uid-other")], NOW)
    assert p.status["state"] != "Ready"


def test_a_job_name_taken_by_a_job_not_owned_is_left_alone_and_said():
    p = plan_build(build(), [job(1, "running", owner="uid-other")], NOW)
    assert p.job is None and p.status["state"] == "Pending" and p.status["progress"] == "job name taken"
    assert p.status["conditions"][0]["reason"] == "NotOwned"
    assert f"Job team-a/{KEY}-1 exists and is not owned by this EngineBuild" in p.status["message"]
    assert [(e.type, e.reason) for e in p.events] == [("Warning", "NotOwned")]


def test_compile_jobs_outlive_a_lost_node_fail_at_once_on_bad_input_and_are_deleted_a_day_after():
    spec = plan_build(build(), [], NOW).job["spec"]
    rules = spec["podFailurePolicy"]["rules"]
    # First rule: a disrupted pod (node lost, drained, preempted) is not a failure of the attempt.
    assert rules[0] == {"action": "Ignore", "onPodConditions": [{"type": "DisruptionTarget", "status": "True"}]}
    fail_on = {r["onExitCodes"]["containerName"]: r["onExitCodes"]["values"] for r in rules if r["action"] == "FailJob"}
    assert fail_on == {"compile": [2], "fetch-model": [2]}  # hf:// is fetched by an init container
    assert spec["backoffLimit"] == 0 and spec["ttlSecondsAfterFinished"] == 86400
    assert spec["template"]["spec"]["restartPolicy"] == "Never"  # what a pod failure policy requires


def test_an_attempt_failed_by_the_pod_failure_policy_fails_the_build_without_retrying():
    failed = job(1, "failed")
    failed["status"]["conditions"][0]["reason"] = "PodFailurePolicy"
    message = "inferfleet-runtime compile: error: unsupported architecture MambaForCausalLM"
    p = plan_build(build(), [failed], NOW + timedelta(hours=1), pods=[pod(f"{KEY}-1", 2, message)])
    assert p.job is None and p.requeue_after is None
    assert p.status["state"] == "Failed" and p.status["attempts"] == 1 < p.status["maxAttempts"]
    assert "MambaForCausalLM" in p.status["message"]


@pytest.mark.parametrize("outcome, state", [("succeeded", "Ready"), ("failed", "Failed")])
def test_a_finished_build_keeps_its_outcome_once_its_jobs_are_deleted_by_their_ttl(outcome, state):
    finished = plan_build(build(maxAttempts=1), [job(1, outcome)], NOW)
    assert finished.status["state"] == state
    later = plan_build(build(finished.status, maxAttempts=1), [], NOW + timedelta(days=1))
    assert later.job is None and later.status == finished.status and later.events == []


def _lost(status: dict, job_name: str, **spec) -> dict:
    out = build(status, **spec)
    out["metadata"]["annotations"] = {"inferfleet.dev/engine-lost": job_name}
    return out


@pytest.mark.parametrize("jobs_left", [True, False])  # the finished Job still there, or deleted by its TTL
def test_a_ready_build_whose_engine_was_lost_runs_the_next_attempt(jobs_left):
    ready = plan_build(build(), [job(1, "succeeded")], NOW, pods=[pod(f"{KEY}-1", 0, "{}")]).status
    jobs = [job(1, "succeeded")] if jobs_left else []
    p = plan_build(_lost(ready, f"{KEY}-1"), jobs, NOW)
    assert p.job["metadata"]["name"] == f"{KEY}-2" and p.status["state"] == "Pending"
    assert p.status["message"] == "the engine of attempt 1 was lost; attempt 2 rebuilds it"
    rebuilt = plan_build(_lost(p.status, f"{KEY}-1"), jobs + [job(2, "succeeded", at=60)], NOW)
    assert rebuilt.status["state"] == "Ready" and rebuilt.status["currentJob"] == f"{KEY}-2"
    # ... and stays Ready once both Jobs are gone.
    assert plan_build(_lost(rebuilt.status, f"{KEY}-1"), [], NOW).status["state"] == "Ready"


def test_an_engine_lost_after_the_last_attempt_fails_the_build():
    ready = plan_build(build(maxAttempts=1), [job(1, "succeeded")], NOW).status
    p = plan_build(_lost(ready, f"{KEY}-1", maxAttempts=1), [job(1, "succeeded")], NOW)
    assert p.job is None and p.status["state"] == "Failed"
    assert p.status["message"] == "the engine of attempt 1 was lost and all 1 attempt(s) are used"


def test_a_rebuild_is_asked_once_per_job_and_only_of_a_ready_build():
    ready = build(plan_build(build(), [job(1, "succeeded")], NOW).status)
    assert rebuild_request(ready) == f"{KEY}-1"
    assert rebuild_request(_lost(ready["status"], f"{KEY}-1")) is None
    assert rebuild_request(build(plan_build(build(), [job(1, "running")], NOW).status)) is None


def test_only_pods_created_after_the_build_finished_testify_that_its_engine_is_lost():
    ready = build(plan_build(build(), [job(1, "succeeded", at=0)], NOW).status)
    pools = [{"name": "nvidia-h100", "servingEngine": "Compiled", "servingEngineBuild": KEY}]
    old, new = ("nvidia-h100", "pod-old", t(-30)), ("nvidia-h100", "pod-new", t(30))
    assert rebuilds_for_lost_engines(pools, [old], {KEY: ready}) == {}
    assert rebuilds_for_lost_engines(pools, [old, new], {KEY: ready}) == {KEY: (f"{KEY}-1", "pod-new")}
    paged = [pools[0] | {"servingEngine": "Paged"}]
    assert rebuilds_for_lost_engines(paged, [new], {KEY: ready}) == {}


def _prune_job(outcome: str) -> dict:
    from inferfleet_operator.plan.build_jobs import prune_job_for

    pruner = prune_job_for("team-a", KEY, "00ff00ff00ff00ff", "r:1", PlanSettings())
    pruner["status"] = job(1, outcome)["status"]
    return pruner


def test_a_new_build_of_a_key_waits_while_the_previous_engine_is_pruned():
    p = plan_build(build(), [_prune_job("running")], NOW)
    assert p.job is None and p.status["state"] == "Pending" and p.requeue_after == 30
    assert (
        p.status["message"] == f"waiting for Job {KEY}-prune-00ff00ff00ff00ff to remove the previous engine of this key"
    )
    done = plan_build(build(p.status), [_prune_job("succeeded")], NOW)
    assert done.job is not None and done.job["metadata"]["name"] == f"{KEY}-1"  # the prune Job is no attempt


def test_plan_build_is_deterministic_and_quiet_on_resync():
    first = plan_build(build(), [job(1, "running")], NOW)
    again = plan_build(build(status=first.status), [job(1, "running")], NOW + timedelta(minutes=3))
    assert again.status == first.status and again.events == []


def test_build_status_fits_the_crd_schema():
    status_schema = load_schema("enginebuilds.yaml")["properties"]["status"]
    for p in (
        plan_build(build(), [], NOW),
        plan_build(build(), [job(1, "failed")], NOW),
        plan_build(build(), [job(1, "succeeded")], NOW),
    ):
        assert schema_errors(p.status, status_schema) == []


def referencing(name: str, key: str, field: str = "engineBuild") -> dict:
    return {"metadata": {"name": name, "namespace": "team-a"}, "status": {"pools": [{"name": "p", field: key}]}}


def test_referenced_build_is_kept():
    d = plan_gc(build(), [referencing("svc", KEY, "servingEngineBuild")], NOW)
    assert (d.delete, d.unreferenced_since) == (False, None)


def test_unreferenced_build_is_deleted_after_the_retention():
    settings = PlanSettings(build_retention_seconds=600)
    other_ns = copy.deepcopy(referencing("svc", KEY))
    other_ns["metadata"]["namespace"] = "team-b"
    first = plan_gc(build(), [other_ns, referencing("x", "fedcba9876543210")], NOW, settings)
    assert (first.delete, first.unreferenced_since, first.requeue_after) == (False, t(0), 600)
    marked = build()
    marked["metadata"]["annotations"] = {UNREFERENCED_ANNOTATION: first.unreferenced_since}
    assert plan_gc(marked, [], NOW + timedelta(seconds=599), settings).delete is False
    assert plan_gc(marked, [], NOW + timedelta(seconds=600), settings).delete is True


# ------------------------------------------------------------------ failures a user must act on


def test_a_missing_engine_cache_claim_holds_the_job_and_says_so():
    p = plan_build(build(), [], NOW, claims=frozenset({"something-else"}))
    assert p.job is None
    assert (p.status["state"], p.status["attempts"]) == ("Pending", 0)
    assert "inferfleet-engine-cache" in p.status["message"]
    assert p.status["conditions"][0]["reason"] == "ClaimNotFound"
    assert [(e.type, e.reason) for e in p.events] == [("Warning", "ClaimNotFound")]
    # Once the claim exists, attempt 1 is created.
    assert plan_build(build(p.status), [], NOW, claims=frozenset({"inferfleet-engine-cache"})).job is not None


def test_a_running_attempt_whose_pod_cannot_schedule_says_why_not_waiting():
    pending = {
        "metadata": {"name": f"{KEY}-1-x", "labels": {"batch.kubernetes.io/job-name": f"{KEY}-1"}},
        "status": {
            "phase": "Pending",
            "conditions": [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": "0/2 nodes are available: 2 Insufficient nvidia.com/gpu.",
                }
            ],
        },
    }
    p = plan_build(build(), [job(1, "running")], NOW, pods=[pending])
    assert p.status["state"] == "Building"
    assert "Insufficient nvidia.com/gpu" in p.status["progress"]
    assert p.status["conditions"][0]["reason"] == "InsufficientResource"
    assert [(e.type, e.reason) for e in p.events] == [("Warning", "InsufficientResource")]
    # Reported once: the same finding on the next reconcile posts nothing.
    assert plan_build(build(p.status), [job(1, "running")], NOW, pods=[pending]).events == []


def test_a_deadline_exceeded_attempt_fails_the_build_without_retrying():
    late = job(1, "failed")
    late["spec"] = {"activeDeadlineSeconds": 7200}
    late["status"]["conditions"][0]["reason"] = "DeadlineExceeded"
    p = plan_build(build(), [late], NOW + timedelta(hours=1))
    assert p.job is None
    assert p.status["state"] == "Failed"
    assert p.status["conditions"][0]["reason"] == "DeadlineExceeded"
    assert "deadline of 7200 s" in p.status["failureReason"]
    assert [(e.type, e.reason) for e in p.events] == [("Warning", "DeadlineExceeded")]


def test_a_refused_job_is_reported_with_the_api_servers_message():
    error = '422 Unprocessable Entity: spec.template.spec.tolerations[0].key: Invalid value: "bad key"'
    p = plan_build(build(), [], NOW, apply_error=error)
    assert p.job is not None  # still wanted: the reconcile retries it with backoff
    assert p.status["conditions"][0]["reason"] == "ApplyFailed"
    assert "tolerations[0].key" in p.status["message"]
    assert [(e.type, e.reason) for e in p.events] == [("Warning", "ApplyFailed")]


def test_a_failed_fetch_in_a_compile_pod_is_the_failure_reason():
    fetch = {
        "metadata": {"name": f"{KEY}-1-x", "labels": {"batch.kubernetes.io/job-name": f"{KEY}-1"}},
        "status": {
            "phase": "Failed",
            "initContainerStatuses": [
                {
                    "name": "fetch-model",
                    "state": {
                        "terminated": {
                            "exitCode": 2,
                            "reason": "Error",
                            "message": "inferfleet-runtime fetch: error: unrecognized arguments: --revision v1",
                        }
                    },
                }
            ],
        },
    }
    p = plan_build(build(), [job(1, "failed")], NOW + timedelta(seconds=1), pods=[fetch])
    assert "exited 2" in p.status["failureReason"]
    assert p.status["failureReason"].endswith("unrecognized arguments: --revision v1")


# ------------------------------------------------------------------ what the operator trusts of an engine

DIGEST = "sha256:" + "ab" * 32


def _args(plan) -> list[str]:
    return plan.job["spec"]["template"]["spec"]["containers"][0]["args"]


def test_succeeded_job_records_the_engine_digest_the_compile_job_reported():
    message = json.dumps({"engineDigest": DIGEST, "modelDigest": "00ff00ff00ff00ff"})
    s = plan_build(build(), [job(1, "succeeded")], NOW, pods=[pod(f"{KEY}-1", 0, message)]).status
    assert s["engineDigest"] == DIGEST and s["artifactPath"] == f"/engines/{KEY}/00ff00ff00ff00ff"


@pytest.mark.parametrize("digest", ["sha256:" + "AB" * 32, "sha256:abc", "md5:" + "ab" * 16, "ab" * 32, 7, "../x"])
def test_a_reported_engine_digest_not_of_its_form_is_ignored(digest):
    message = json.dumps({"engineDigest": digest})
    s = plan_build(build(), [job(1, "succeeded")], NOW, pods=[pod(f"{KEY}-1", 0, message)]).status
    assert "engineDigest" not in s


def test_the_recorded_engine_digest_outlives_the_jobs_pods_and_the_job():
    message = json.dumps({"engineDigest": DIGEST, "modelDigest": "00ff00ff00ff00ff"})
    ready = plan_build(build(), [job(1, "succeeded")], NOW, pods=[pod(f"{KEY}-1", 0, message)]).status
    # The pods are garbage-collected before the Job: what they said stands.
    later = plan_build(build(ready), [job(1, "succeeded")], NOW + timedelta(hours=1)).status
    assert (later["engineDigest"], later["artifactPath"]) == (DIGEST, f"/engines/{KEY}/00ff00ff00ff00ff")
    # The Job is deleted by its TTL: so does the outcome.
    assert plan_build(build(later), [], NOW + timedelta(days=1)).status["engineDigest"] == DIGEST


def test_a_compile_job_keeps_an_engine_it_finds_only_when_it_has_the_recorded_digest():
    first = plan_build(build(), [], NOW)
    assert "--engine-digest" not in _args(first) and "--keep-existing" not in _args(first)  # nothing recorded: rebuild
    message = json.dumps({"engineDigest": DIGEST})
    ready = plan_build(build(), [job(1, "succeeded")], NOW, pods=[pod(f"{KEY}-1", 0, message)]).status
    rebuild = plan_build(_lost(ready, f"{KEY}-1"), [], NOW)
    args = _args(rebuild)
    assert args[args.index("--engine-digest") + 1] == DIGEST and "--keep-existing" not in args


def test_a_build_keyed_for_another_namespace_is_refused():
    moved = build()
    moved["metadata"]["namespace"] = "team-b"  # team-a's key: it would build into team-a's engine directory
    p = plan_build(moved, [], NOW)
    assert p.job is None and p.status["conditions"][0]["reason"] == "KeyMismatch"


def _legacy(status=None) -> dict:
    """A build keyed before the namespace entered the key (or shared across namespaces)."""
    key = spec_key(SPEC, "")
    out = build(status)
    out["metadata"]["name"], out["spec"]["engineKey"] = key, key
    return out


def test_a_ready_build_keyed_without_its_namespace_serves_on_but_is_never_built_again():
    ready = {"state": "Ready", "attempts": 1, "currentJob": f"{spec_key(SPEC, '')}-1", "message": "engine built"}
    p = plan_build(_legacy(ready), [], NOW)
    assert p.job is None and p.status["state"] == "Ready"  # its pools keep it until their new build is Ready
    lost = _legacy(ready)
    lost["metadata"]["annotations"] = {"inferfleet.dev/engine-lost": ready["currentJob"]}
    assert plan_build(lost, [], NOW).job is None  # lost: no Job writes into a directory shared across namespaces
    p = plan_build(_legacy(), [], NOW)
    assert p.job is None and p.status["conditions"][0]["reason"] == "KeyMismatch"


def test_engines_are_shared_across_namespaces_only_by_the_administrators_choice():
    shared = PlanSettings(share_engines_across_namespaces=True)
    p = plan_build(_legacy(), [], NOW, shared)
    assert p.status["state"] == "Pending" and "--keep-existing" in _args(p)  # any namespace's engine of the key
    assert plan_build(build(), [], NOW, shared).job is None  # a namespaced key is not built while shared

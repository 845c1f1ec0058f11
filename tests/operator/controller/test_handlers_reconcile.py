"""The service reconcile against an in-memory API server: what a first rollout writes, that a no-op
resync writes nothing, drift repair, stale children, Events."""

import asyncio
import copy
import dataclasses
import datetime

from reconcile_world import NOW, World, inference_service, node, refuse

from inferfleet_operator.api import names
from inferfleet_operator.controller import cache, handlers
from inferfleet_operator.controller.settings import OperatorConfig


def test_first_rollout_applies_builds_children_and_status_once_each():
    world = World([inference_service()])
    writes = world.reconcile()
    kinds = sorted(kind for _, kind in writes if kind != "Event")
    assert kinds == sorted(
        [
            "EngineBuild",
            "Deployment",
            "Deployment",
            "Service",
            "PodDisruptionBudget",
            "NetworkPolicy",
            "InferenceService/status",
        ]
    )
    assert world.api.events, "a first rollout reports its pool decisions as Events"
    deployments = [k for k in world.api.objects if k[0] == "Deployment"]
    assert {name for _, _, name in deployments} == {"llama-nvidia-h100-80gb-hbm3", "llama-cpu-amd64"}
    owner = world.get("Deployment", "llama-cpu-amd64")["metadata"]["ownerReferences"][0]
    assert owner["uid"] == "uid-llama" and owner["kind"] == "InferenceService"
    build = next(o for k, o in world.api.objects.items() if k[0] == "EngineBuild")
    assert "ownerReferences" not in build["metadata"], "builds are shared, never owned by one service"


def test_a_no_op_resync_writes_nothing():
    world = World([inference_service()])
    world.reconcile()
    world.sync()
    world.reconcile()  # status now reflects the first reconcile; nothing else moved
    world.sync()
    assert world.reconcile() == []


def test_a_reconcile_before_the_watch_catches_up_does_not_write_twice():
    world = World([inference_service()])
    world.reconcile()
    world.reconcile()  # indices still hold the pre-rollout state
    world.sync()
    assert world.reconcile() == []


def test_a_deleted_child_is_restored():
    world = World([inference_service()])
    world.reconcile()
    world.sync()
    world.reconcile()
    del world.api.objects[("Deployment", "team-a", "llama-cpu-amd64")]
    world.sync()
    writes = world.reconcile()
    assert ("PATCH", "Deployment") in writes
    assert world.get("Deployment", "llama-cpu-amd64") is not None


def test_a_child_edited_by_hand_is_put_back_with_a_forced_apply():
    world = World([inference_service()])
    world.reconcile()
    world.sync()
    world.reconcile()
    world.api.objects[("Deployment", "team-a", "llama-cpu-amd64")]["spec"]["replicas"] = 7
    world.sync()
    requests = []
    original = world.api.handle

    def spy(request):
        requests.append(request)
        return original(request)

    world.kube._transport.handle_with(spy)
    world.reconcile()
    (patch,) = [r for r in requests if r.method == "PATCH"]
    assert patch.url.params["force"] == "true"
    assert world.get("Deployment", "llama-cpu-amd64")["spec"]["replicas"] == 1


def test_a_deployment_of_a_pool_no_longer_planned_is_deleted():
    world = World([inference_service()])
    world.reconcile()
    stale = copy.deepcopy(world.get("Deployment", "llama-cpu-amd64"))
    stale["metadata"]["name"] = "llama-amd-mi300x"
    stale["metadata"]["labels"][names.SERVICE_LABEL] = "llama"
    world.api.objects[("Deployment", "team-a", "llama-amd-mi300x")] = stale
    world.sync()
    writes = world.reconcile()
    assert ("DELETE", "Deployment") in writes
    assert world.get("Deployment", "llama-amd-mi300x") is None
    assert world.get("Deployment", "llama-cpu-amd64") is not None


def test_an_object_with_the_services_labels_that_it_does_not_own_is_never_deleted():
    world = World([inference_service()])
    world.reconcile()
    foreign = copy.deepcopy(world.get("Deployment", "llama-cpu-amd64"))
    foreign["metadata"]["name"] = "someone-elses"
    foreign["metadata"]["ownerReferences"] = [{"kind": "InferenceService", "name": "llama", "uid": "uid-other"}]
    world.api.objects[("Deployment", "team-a", "someone-elses")] = foreign
    unowned = copy.deepcopy(foreign)
    unowned["metadata"]["name"] = "made-by-hand"
    del unowned["metadata"]["ownerReferences"]
    world.api.objects[("Deployment", "team-a", "made-by-hand")] = unowned
    world.sync()
    writes = world.reconcile()
    assert ("DELETE", "Deployment") not in writes
    assert world.get("Deployment", "someone-elses") and world.get("Deployment", "made-by-hand")


def test_a_planned_child_whose_name_is_taken_by_an_object_not_owned_is_left_alone_and_reported():
    world = World([inference_service()])
    world.reconcile()
    world.sync()
    taken = world.get("Deployment", "llama-cpu-amd64")
    taken["metadata"]["ownerReferences"] = [{"kind": "InferenceService", "name": "llama", "uid": "uid-earlier"}]
    taken["spec"]["replicas"] = 7  # someone else's: the operator must not put its own back
    world.sync()
    writes = world.reconcile()
    assert ("PATCH", "Deployment") not in writes and ("DELETE", "Deployment") not in writes
    assert world.get("Deployment", "llama-cpu-amd64")["spec"]["replicas"] == 7
    conditions = {c["type"]: c for c in world.get("InferenceService", "llama")["status"]["conditions"]}
    assert conditions["Degraded"]["status"] == "True" and conditions["Degraded"]["reason"] == "NotOwned"
    assert (
        "Deployment llama-cpu-amd64: exists and is not owned by InferenceService team-a/llama"
        in (conditions["Degraded"]["message"])
    )
    assert any(e["reason"] == "NotOwned" and e["type"] == "Warning" for e in world.api.events)


def test_an_engine_build_made_by_hand_is_not_garbage_collected():
    world = World([inference_service()])
    world.reconcile()
    world.sync()
    name = world.build_name()
    world.reconcile_build(name)
    del world.get("EngineBuild", name)["metadata"]["labels"]["app.kubernetes.io/managed-by"]
    del world.api.objects[("InferenceService", "team-a", "llama")]
    world.sync()
    world.reconcile_build(name)
    world.sync()
    writes, _ = world.reconcile_build(name, at=NOW + datetime.timedelta(seconds=61))
    assert ("DELETE", "EngineBuild") not in writes and world.get("EngineBuild", name) is not None


def test_two_services_with_one_key_share_one_build():
    world = World([inference_service("llama"), inference_service("llama-copy")])
    world.reconcile("llama")
    world.sync()
    world.reconcile("llama-copy")
    builds = [k for k in world.api.objects if k[0] == "EngineBuild"]
    assert len(builds) == 1


def test_status_reports_a_bridge_while_the_engine_builds():
    world = World([inference_service()])
    world.reconcile()
    status = world.get("InferenceService", "llama")["status"]
    nvidia = next(p for p in status["pools"] if p["vendor"] == "nvidia")
    assert nvidia["engine"] == "Compiled" and nvidia["servingEngine"] == "Paged"
    deployment = world.get("Deployment", "llama-nvidia-h100-80gb-hbm3")
    assert "--model" in deployment["spec"]["template"]["spec"]["containers"][0]["args"]


def test_a_service_without_replicas_has_no_deployments():
    world = World([inference_service(replicas=0)])
    world.reconcile()
    assert not [k for k in world.api.objects if k[0] == "Deployment"]


def _finish_job(world, job_name, succeeded=True):
    job = world.get("Job", job_name)
    job["status"] = (
        {
            "succeeded": 1,
            "startTime": "2026-12-02T12:00:00Z",
            "completionTime": "2026-12-02T12:03:00Z",
            "conditions": [{"type": "Complete", "status": "True"}],
        }
        if succeeded
        else {
            "failed": 1,
            "conditions": [{"type": "Failed", "status": "True", "lastTransitionTime": "2026-12-02T12:01:00Z"}],
        }
    )


def test_a_build_runs_one_job_per_attempt_even_before_the_watch_catches_up():
    world = World([inference_service()])
    world.reconcile()
    world.sync()
    name = world.build_name()
    writes, _ = world.reconcile_build(name)
    assert ("PATCH", "Job") in writes and ("PATCH", "EngineBuild/status") in writes
    writes, _ = world.reconcile_build(name)  # the Job is not in the index yet
    assert ("PATCH", "Job") not in writes
    world.sync()
    writes, _ = world.reconcile_build(name)
    assert writes == [("PATCH", "EngineBuild/status")]  # the Job exists: Pending -> Building
    assert world.get("EngineBuild", name)["status"]["state"] == "Building"
    world.sync()
    writes, _ = world.reconcile_build(name)
    assert writes == []
    jobs = [k for k in world.api.objects if k[0] == "Job"]
    assert [k[2] for k in jobs] == [f"{name}-1"]
    owner = world.get("Job", f"{name}-1")["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"]) == ("EngineBuild", name)


def test_a_finished_build_is_ready_and_the_pool_rolls_to_the_compiled_engine():
    world = World([inference_service()])
    world.reconcile()
    world.sync()
    name = world.build_name()
    world.reconcile_build(name)
    _finish_job(world, f"{name}-1")
    world.sync()
    world.reconcile_build(name)
    assert world.get("EngineBuild", name)["status"]["state"] == "Ready"
    world.sync()
    world.reconcile()
    args = world.get("Deployment", "llama-nvidia-h100-80gb-hbm3")["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--engine-dir" in args and f"/engines/{name}" in args


def test_a_failed_attempt_waits_out_its_backoff_before_the_next_job():
    world = World([inference_service()])
    world.reconcile()
    world.sync()
    name = world.build_name()
    world.reconcile_build(name)
    _finish_job(world, f"{name}-1", succeeded=False)
    world.sync()
    failed_at = datetime.datetime(2026, 12, 2, 12, 1, tzinfo=datetime.UTC)
    writes, delay = world.reconcile_build(name, at=failed_at + datetime.timedelta(seconds=1))
    assert ("PATCH", "Job") not in writes
    assert delay is not None and delay > 0
    world.sync()
    writes, _ = world.reconcile_build(name, at=failed_at + datetime.timedelta(seconds=delay + 2))
    assert ("PATCH", "Job") in writes
    assert world.get("Job", f"{name}-2") is not None


def test_an_unreferenced_build_is_deleted_after_the_retention_and_not_before():
    world = World([inference_service()])
    world.reconcile()
    world.sync()
    name = world.build_name()
    world.reconcile_build(name)
    world.sync()
    del world.api.objects[("InferenceService", "team-a", "llama")]
    world.sync()
    writes, delay = world.reconcile_build(name)
    assert ("DELETE", "EngineBuild") not in writes
    assert delay == 60  # the retention: recorded when it was first seen unreferenced
    assert (
        world.get("EngineBuild", name)["metadata"]["annotations"][names.UNREFERENCED_ANNOTATION]
        == "2026-12-02T12:00:00Z"
    )
    world.sync()
    writes, _ = world.reconcile_build(name, at=NOW + datetime.timedelta(seconds=61))
    assert ("DELETE", "EngineBuild") in writes
    assert world.get("EngineBuild", name) is None


def test_a_node_that_joins_adds_a_pool_once_the_cluster_is_marked_changed():
    service = inference_service(replicas=4)  # overrides: 1 on the H100, 2 on CPU, 1 on the MI300X once it joins
    service["spec"]["pools"][1]["replicas"] = 2
    service["spec"]["pools"].append({"name": "amd-mi300x", "replicas": 1})
    world = World([service])
    world.reconcile()
    world.sync()
    amd = node(
        "mi300x-0",
        {"amd.com/gpu.product-name": "AMD_Instinct_MI300X_OAM", "amd.com/gpu.device-id": "74a1"},
        {"amd.com/gpu": "8"},
    )
    world.indices[cache.NODES]["mi300x-0"] = [amd]
    world.ctx.cache.cluster_changed()
    world.reconcile()
    names = {k[2] for k in world.api.objects if k[0] == "Deployment"}
    assert any("mi300x" in name for name in names), names


def test_a_spec_the_planner_refuses_writes_nothing_but_one_warning_event():
    service = inference_service()
    service["spec"]["engine"] = {"tensorParallelSize": 2}  # CRD rule: must equal gpusPerReplica
    world = World([service])
    assert world.reconcile() == [("POST", "Event")]
    assert world.api.events[0]["reason"] == "InvalidSpec"
    assert "tensorParallelSize" in world.api.events[0]["message"]
    assert world.reconcile() == [], "the same refusal is not posted twice"


# ------------------------------------------------------------------ failures a user must act on


def _degraded(world, name="llama"):
    status = world.get("InferenceService", name)["status"]
    return next(c for c in status["conditions"] if c["type"] == "Degraded")


def test_a_refused_child_is_in_status_and_a_warning_event_and_retries_write_nothing_more():
    world = World([inference_service()])
    message = 'Deployment.apps "llama-cpu-amd64" is invalid: spec.template.spec.tolerations[0].key: Invalid value'
    restore = refuse(world, "Deployment", message)
    try:
        world.reconcile()
    except Exception as error:  # the work queue retries it after its error delay
        assert getattr(error, "status", None) == 422
    else:
        raise AssertionError("a refused apply fails the reconcile, so the work queue backs off")
    degraded = _degraded(world)
    assert (degraded["status"], degraded["reason"]) == ("True", "ApplyFailed")
    assert "tolerations[0].key: Invalid value" in degraded["message"]
    pools = {p["name"]: p for p in world.get("InferenceService", "llama")["status"]["pools"]}
    assert "ApplyFailed" in pools["cpu-amd64"]["message"]
    warnings = [e for e in world.api.events if e["type"] == "Warning"]
    assert [e["reason"] for e in warnings] == ["ApplyFailed"]

    # The retry is refused alike: no status write, no second Event.
    world.sync()
    before = len(world.api.requests)
    try:
        world.reconcile()
    except Exception:
        pass
    assert [kind for _, kind in world.api.requests[before:]] == ["Deployment", "Deployment"]

    # Fixed (here: the server accepts it again): Degraded goes back to False.
    restore()
    world.sync()
    world.reconcile()
    assert _degraded(world)["status"] == "False"


def test_a_missing_engine_cache_claim_is_named_in_status():
    world = World([inference_service()])
    world.indices[cache.CLAIMS] = {"team-a": ["models"]}
    _build_ready(world)
    degraded = _degraded(world)
    assert (degraded["status"], degraded["reason"]) == ("True", "ClaimNotFound")
    assert "inferfleet-engine-cache" in degraded["message"] and "team-a" in degraded["message"]
    assert "ClaimNotFound" in {e["reason"] for e in world.api.events if e["type"] == "Warning"}


def _build_ready(world):
    """Runs the rollout until the compiled pool serves its engine (its Deployment mounts the cache)."""
    world.reconcile()
    world.sync()
    name = world.build_name()
    world.indices[cache.CLAIMS]["team-a"].append("inferfleet-engine-cache")
    world.reconcile_build(name)
    world.indices[cache.CLAIMS]["team-a"].remove("inferfleet-engine-cache")
    world.sync()
    _finish_job(world, f"{name}-1")
    world.sync()
    world.reconcile_build(name)
    world.sync()
    world.reconcile()
    world.sync()


def test_an_engine_build_waits_for_its_claim_instead_of_creating_a_job():
    world = World([inference_service()])
    world.reconcile()
    world.sync()
    world.indices[cache.CLAIMS] = {}
    name = world.build_name()
    writes, _ = world.reconcile_build(name)
    assert ("PATCH", "Job") not in writes
    status = world.get("EngineBuild", name)["status"]
    assert status["conditions"][0]["reason"] == "ClaimNotFound"
    assert "inferfleet-engine-cache" in status["message"]
    world.indices[cache.CLAIMS] = {"team-a": ["inferfleet-engine-cache"]}
    writes, _ = world.reconcile_build(name)
    assert ("PATCH", "Job") in writes


def test_a_refused_job_is_reported_on_the_engine_build():
    world = World([inference_service()])
    world.reconcile()
    world.sync()
    name = world.build_name()
    refuse(world, "Job", 'spec.template.spec.tolerations[0].key: Invalid value: "bad key"')
    try:
        world.reconcile_build(name)
    except Exception as error:
        assert getattr(error, "status", None) == 422
    else:
        raise AssertionError("a refused Job fails the reconcile, so the work queue backs off")
    status = world.get("EngineBuild", name)["status"]
    assert status["conditions"][0]["reason"] == "ApplyFailed"
    assert "bad key" in status["message"]
    assert [e["reason"] for e in world.api.events if e["type"] == "Warning"] == ["ApplyFailed"]


def test_serving_pods_that_cannot_schedule_degrade_the_service_once():
    world = World([inference_service()])
    world.reconcile()
    world.sync()
    world.reconcile()
    world.sync()
    pod = {
        "metadata": {
            "name": "llama-nvidia-h100-80gb-hbm3-abc",
            "namespace": "team-a",
            "labels": {names.SERVICE_LABEL: "llama", names.POOL_LABEL: "nvidia-h100-80gb-hbm3"},
        },
        "status": {
            "phase": "Pending",
            "conditions": [
                {
                    "type": "PodScheduled",
                    "status": "False",
                    "reason": "Unschedulable",
                    "message": "0/2 nodes are available: 1 Insufficient nvidia.com/gpu.",
                }
            ],
        },
    }
    world.indices[cache.SERVICE_PODS] = {("team-a", "llama"): [pod]}
    world.reconcile()
    degraded = _degraded(world)
    assert (degraded["status"], degraded["reason"]) == ("True", "InsufficientResource")
    assert "Insufficient nvidia.com/gpu" in degraded["message"]
    warnings = [e for e in world.api.events if e["type"] == "Warning"]
    assert [e["reason"] for e in warnings] == ["InsufficientResource"]
    world.sync()
    world.indices[cache.SERVICE_PODS] = {("team-a", "llama"): [pod]}
    assert world.reconcile() == []  # the same finding: nothing written, nothing posted
    world.indices[cache.SERVICE_PODS] = {}
    world.reconcile()
    assert _degraded(world)["status"] == "False"


def test_a_service_whose_build_lacks_the_engine_cache_claim_says_so_while_bridging():
    world = World([inference_service()])
    world.indices[cache.CLAIMS] = {}
    world.reconcile()
    degraded = _degraded(world)
    assert (degraded["status"], degraded["reason"]) == ("True", "ClaimNotFound")
    assert degraded["message"].startswith("EngineBuild ")


def test_a_refusal_of_a_child_no_longer_planned_is_forgotten():
    world = World([inference_service()])
    refuse(world, "Deployment", "spec.template.spec.tolerations[0]: Invalid value")
    try:
        world.reconcile()
    except Exception:
        pass
    assert _degraded(world)["reason"] == "ApplyFailed"
    service = world.get("InferenceService", "llama")
    service["spec"]["replicas"], service["spec"]["pools"] = 0, []  # no Deployment planned any more
    world.sync()
    world.reconcile()
    assert _degraded(world)["status"] == "False"


def test_the_work_queue_resyncs_every_object_while_it_exists_and_stops_once_it_is_gone():
    # The level-triggered safety net is the work queue's requeue, not a kopf timer (which needs a finalizer).
    world = World([inference_service()])
    world.ctx.config = OperatorConfig(build_retention_seconds=60, resync_seconds=7)
    service_key = (names.SERVICE_KIND, "team-a", "llama")
    assert 0 < asyncio.run(handlers._work(world.ctx, service_key)) <= 7
    world.sync()
    build_key = (names.BUILD_KIND, "team-a", world.build_name())
    assert 0 < asyncio.run(handlers._work(world.ctx, build_key)) <= 7
    del world.api.objects[("InferenceService", "team-a", "llama")]
    world.sync()
    assert asyncio.run(handlers._work(world.ctx, service_key)) is None, "a deleted object is not requeued"


def test_a_missing_api_key_secret_degrades_the_service_with_one_warning_and_no_secret_read():
    service = inference_service()
    service["spec"]["auth"] = {"apiKeySecret": {"name": "llama-keys"}}
    world = World([service])
    world.reconcile()
    world.sync()
    pod = {
        "metadata": {
            "name": "llama-cpu-amd64-abc",
            "namespace": "team-a",
            "labels": {names.SERVICE_LABEL: "llama", names.POOL_LABEL: "cpu-amd64"},
        },
        "status": {"phase": "Pending", "containerStatuses": [{"name": "server", "state": {"waiting": {
            "reason": "CreateContainerConfigError", "message": 'secret "llama-keys" not found'}}}]},
    }  # fmt: skip
    world.indices[cache.SERVICE_PODS] = {("team-a", "llama"): [pod]}
    world.reconcile()
    degraded = _degraded(world)
    assert (degraded["status"], degraded["reason"]) == ("True", "SecretNotFound")
    assert "Secret llama-keys not found in namespace team-a (named by spec.auth.apiKeySecret)" in degraded["message"]
    assert [e["reason"] for e in world.api.events if e["type"] == "Warning"] == ["SecretNotFound"]
    assert {kind.split("/")[0] for _, kind in world.api.requests} <= {
        "InferenceService",
        "EngineBuild",
        "Deployment",
        "Service",
        "PodDisruptionBudget",
        "NetworkPolicy",
        "Event",
    }


def test_a_network_policy_follows_the_spec_and_goes_when_the_service_opens_to_the_cluster():
    service = inference_service()
    service["spec"]["networkPolicy"] = {"allow": [{"namespace": "gateway"}]}
    world = World([service])
    world.ctx.config = dataclasses.replace(
        world.ctx.config, scraper_namespace="inferfleet-system", scraper_labels=(("app.kubernetes.io/name", "x"),)
    )
    world.reconcile()
    policy = world.get("NetworkPolicy", "llama")
    peers = policy["spec"]["ingress"][0]["from"]
    assert [p["namespaceSelector"]["matchLabels"]["kubernetes.io/metadata.name"] for p in peers] == [
        "gateway",
        "inferfleet-system",
    ]
    assert policy["metadata"]["ownerReferences"][0]["uid"] == "uid-llama"
    world.sync()
    del world.get("InferenceService", "llama")["spec"]["networkPolicy"]  # the default: its own namespace
    world.sync()
    assert ("PATCH", "NetworkPolicy") in world.reconcile()
    assert world.get("NetworkPolicy", "llama")["spec"]["ingress"][0]["from"][0] == {"podSelector": {}}
    world.sync()
    world.get("InferenceService", "llama")["spec"]["networkPolicy"] = {"exposure": "Cluster"}
    world.sync()
    assert ("DELETE", "NetworkPolicy") in world.reconcile()
    assert world.get("NetworkPolicy", "llama") is None
    exposed = next(c for c in world.get("InferenceService", "llama")["status"]["conditions"] if c["type"] == "Exposed")
    assert (exposed["status"], exposed["reason"]) == ("True", "OpenToCluster")
    assert "OpenToCluster" in [e["reason"] for e in world.api.events if e["type"] == "Warning"]


def test_serving_pods_that_find_the_engine_lost_get_it_rebuilt_and_the_pool_bridged_meanwhile():
    world = World([inference_service()])
    world.indices[cache.CLAIMS] = {"team-a": ["inferfleet-engine-cache"]}
    world.reconcile()
    world.sync()
    name = world.build_name()
    world.reconcile_build(name)
    _finish_job(world, f"{name}-1")
    world.sync()
    world.reconcile_build(name)
    world.sync()
    world.reconcile()
    world.sync()
    nvidia = "llama-nvidia-h100-80gb-hbm3"
    assert "--engine-dir" in world.get("Deployment", nvidia)["spec"]["template"]["spec"]["containers"][0]["args"]
    crashed = {
        "metadata": {"name": f"{nvidia}-abc", "namespace": "team-a", "creationTimestamp": "2026-12-02T12:10:00Z",
                     "labels": {names.SERVICE_LABEL: "llama", names.POOL_LABEL: "nvidia-h100-80gb-hbm3"}},
        "status": {"phase": "Running", "containerStatuses": [{"name": "server", "restartCount": 2,
            "state": {"waiting": {"reason": "CrashLoopBackOff"}},
            "lastState": {"terminated": {"exitCode": 3, "message": "inferfleet-runtime serve: error: engine lost"}}}]},
    }  # fmt: skip
    world.indices[cache.SERVICE_PODS] = {("team-a", "llama"): [crashed]}
    world.reconcile()
    assert world.get("EngineBuild", name)["metadata"]["annotations"][names.REBUILD_ANNOTATION] == f"{name}-1"
    assert [e["reason"] for e in world.api.events if e["reason"] == "EngineLost"] == ["EngineLost"]
    world.sync()
    writes, _ = world.reconcile_build(name)
    assert ("PATCH", "Job") in writes and world.get("Job", f"{name}-2") is not None
    world.sync()
    world.reconcile()  # asks no second rebuild of the same Job, and serves the pool paged while it runs
    assert [e["reason"] for e in world.api.events if e["reason"] == "EngineLost"] == ["EngineLost"]
    args = world.get("Deployment", nvidia)["spec"]["template"]["spec"]["containers"][0]["args"]
    assert "--engine-dir" not in args and "--model" in args


def _gc_ready_build(world, name, at):
    world.reconcile_build(name)
    _finish_job(world, f"{name}-1")
    world.api.objects[("Pod", "team-a", f"{name}-1-x")] = {
        "metadata": {"name": f"{name}-1-x", "labels": {names.BUILD_LABEL: name, "batch.kubernetes.io/job-name": f"{name}-1"}},
        "status": {"containerStatuses": [{"name": "compile", "state": {"terminated": {
            "exitCode": 0, "message": '{"modelDigest": "00ff00ff00ff00ff"}'}}}]},
    }  # fmt: skip
    world.sync()
    world.reconcile_build(name)
    assert world.get("EngineBuild", name)["status"]["modelDigest"] == "00ff00ff00ff00ff"
    del world.api.objects[("InferenceService", "team-a", "llama")]
    world.sync()
    world.reconcile_build(name)
    world.sync()
    return world.reconcile_build(name, at=at)


def test_a_garbage_collected_build_has_its_engine_directory_pruned_by_a_job_first():
    world = World([inference_service()])
    world.reconcile()
    world.sync()
    name = world.build_name()
    writes, _ = _gc_ready_build(world, name, NOW + datetime.timedelta(seconds=61))
    assert writes[-2:] == [("PATCH", "Job"), ("DELETE", "EngineBuild")]  # the Job before the build goes
    pruner = world.get("Job", f"{name}-prune-00ff00ff00ff00ff")
    [container] = pruner["spec"]["template"]["spec"]["containers"]
    assert container["args"] == ["prune-engine", "--dir", f"/engines/{name}/00ff00ff00ff00ff"]
    assert "ownerReferences" not in pruner["metadata"] and pruner["spec"]["ttlSecondsAfterFinished"] == 600
    assert world.get("EngineBuild", name) is None


def test_with_engine_gc_keep_the_engine_directory_stays():
    world = World([inference_service()])
    world.ctx.config = dataclasses.replace(world.ctx.config, engine_gc="keep")
    world.reconcile()
    world.sync()
    name = world.build_name()
    writes, _ = _gc_ready_build(world, name, NOW + datetime.timedelta(seconds=61))
    assert ("DELETE", "EngineBuild") in writes and ("PATCH", "Job") not in writes


def _file_world(uri, roots=()):
    service = inference_service()
    service["spec"]["model"]["uri"] = uri
    world = World([service])
    world.ctx.config = dataclasses.replace(world.ctx.config, model_host_path_roots=roots)
    return world


def test_a_service_whose_host_path_is_not_allowed_creates_nothing_that_mounts_it_and_warns():
    world = _file_world("file:///var/lib/kubelet", roots=("/srv/models",))
    writes = world.reconcile()
    assert not [kind for _, kind in writes if kind in ("Deployment", "EngineBuild", "Job")]
    degraded = _degraded(world)
    assert (degraded["status"], degraded["reason"]) == ("True", "HostPathNotAllowed")
    assert "modelHostPaths.allowedRoots" in degraded["message"]
    assert [e["reason"] for e in world.api.events if e["type"] == "Warning"] == ["HostPathNotAllowed"]
    world.sync()
    assert world.reconcile() == [], "the same refusal is neither written nor posted twice"


def test_an_engine_build_made_by_hand_for_a_host_path_not_allowed_runs_no_job():
    world = _file_world("file:///srv/models/llama", roots=("/srv/models",))
    world.reconcile()
    world.sync()
    name = world.build_name()
    world.ctx.config = dataclasses.replace(world.ctx.config, model_host_path_roots=())  # the root withdrawn
    writes, _ = world.reconcile_build(name)
    assert ("PATCH", "Job") not in writes
    status = world.get("EngineBuild", name)["status"]
    assert "modelHostPaths.allowedRoots" in status["message"]
    built = next(c for c in status["conditions"] if c["type"] == "Built")
    assert (built["status"], built["reason"]) == ("False", "HostPathNotAllowed")

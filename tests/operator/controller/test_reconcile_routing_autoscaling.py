"""The service reconcile with routing and autoscaling, against the in-memory API server of reconcile_world:
the InferencePool follows the CRD and the spec and is repaired, and replicas follow the pods' metrics."""

from __future__ import annotations

import dataclasses
import datetime

import httpx
import pytest
from reconcile_world import NOW, World, inference_service, refuse

from inferfleet_operator.controller import reconcile_routing
from inferfleet_operator.kube.client import ApiError
from inferfleet_operator.plan import planner


def _routed(world_services=None, **routing):
    service = inference_service()
    if routing:
        service["spec"]["routing"] = routing
    return World(world_services or [service])


def _reconcile(world):
    world.reconcile()
    world.sync()
    return world.reconcile()


def test_no_inference_pool_while_the_crd_is_not_served_and_status_says_why():
    world = _routed()
    world.reconcile()
    assert world.get("InferencePool", "llama") is None
    status = world.get("InferenceService", "llama")["status"]["routing"]
    assert status["reason"] == "InferencePoolCRDAbsent"


def test_inference_pool_appears_once_the_crd_is_served_and_is_repaired_after_an_edit():
    world = _routed()
    world.api.serves_pools = True
    _reconcile(world)
    pool = world.get("InferencePool", "llama")
    assert pool["spec"]["selector"]["matchLabels"] == {
        "inferfleet.dev/service": "llama",
        "app.kubernetes.io/component": "server",
    }
    assert world.get("InferenceService", "llama")["status"]["routing"]["pools"] == [
        "cpu-amd64",
        "nvidia-h100-80gb-hbm3",
    ]
    world.sync()
    assert world.reconcile() == [], "a no-op resync writes nothing"
    world.api.objects[("InferencePool", "team-a", "llama")]["spec"]["targetPorts"] = [{"number": 1234}]
    assert ("PATCH", "InferencePool") in world.reconcile()
    assert world.get("InferencePool", "llama")["spec"]["targetPorts"] == [{"number": 8000}]


def _pool_crd(established: bool, served: bool = True) -> dict:
    return {
        "metadata": {"name": "inferencepools.inference.networking.k8s.io"},
        "spec": {"versions": [{"name": "v1alpha2", "served": True}, {"name": "v1", "served": served}]},
        "status": {"conditions": [{"type": "Established", "status": "True" if established else "False"}]},
    }


def test_the_crd_event_decides_before_discovery_catches_up_and_its_deletion_takes_the_pool_away():
    world = _routed()
    world.reconcile()  # discovery: absent, cached
    assert world.get("InferenceService", "llama")["status"]["routing"]["reason"] == "InferencePoolCRDAbsent"
    reconcile_routing.observe_pool_crd(world.ctx, _pool_crd(established=False))  # created, not yet established
    world.reconcile()
    assert world.get("InferencePool", "llama") is None
    reconcile_routing.observe_pool_crd(world.ctx, _pool_crd(established=True))  # discovery still lags: says absent
    _reconcile(world)
    assert world.get("InferencePool", "llama") is not None, "the established CRD's event is enough"
    reconcile_routing.observe_pool_crd(world.ctx, _pool_crd(established=True, served=False))
    world.reconcile()
    assert world.get("InferenceService", "llama")["status"]["routing"]["reason"] == "InferencePoolCRDAbsent"
    reconcile_routing.observe_pool_crd(world.ctx, _pool_crd(established=True), is_deleted=True)
    assert world.ctx.pool_served[1] is False


def test_disabling_routing_deletes_the_pool_and_an_operator_without_pools_never_asks():
    world = _routed()
    world.api.serves_pools = True
    _reconcile(world)
    world.sync()
    service = world.api.objects[("InferenceService", "team-a", "llama")]
    service["spec"]["routing"] = {"inferencePool": "Disabled"}
    world.sync()
    assert ("DELETE", "InferencePool") in world.reconcile()
    assert world.get("InferencePool", "llama") is None

    off = _routed()
    off.api.serves_pools = True
    off.ctx.config = dataclasses.replace(off.ctx.config, inference_pools="disabled")
    off.reconcile()
    assert off.get("InferencePool", "llama") is None
    assert ("GET", "Discovery") not in off.api.reads
    assert off.get("InferenceService", "llama")["status"]["routing"]["reason"] == "InferencePoolsOffInOperator"


def _autoscaled(load: dict[str, float | None]):
    """A cpu-only autoscaled service whose serving pods report `load` (pod name -> waiting; None: no answer)."""
    service = inference_service()
    service["spec"].pop("pools")
    service["spec"]["autoscaling"] = {
        "minReplicas": 1,
        "maxReplicas": 6,
        "targetWaitingRequests": 2,
        "scaleDownStabilizationSeconds": 0,
    }
    service["spec"]["placement"] = {"vendors": ["cpu"]}
    world = World([service])

    def scrape(request: httpx.Request) -> httpx.Response:
        value = load.get(request.url.path.strip("/"))
        if value is None:
            return httpx.Response(503)
        return httpx.Response(200, text=f'inferfleet:num_requests_waiting{{model_name="llama"}} {value}\n')

    world.ctx.scraper = httpx.AsyncClient(transport=httpx.MockTransport(scrape))
    world.ctx.config = dataclasses.replace(
        world.ctx.config, autoscale_seconds=0.0, scrape_url_template="http://stand-in/{pod}"
    )
    return world


def _add_pods(world, num_pods: int):
    for key in [k for k in world.api.objects if k[0] == "Pod"]:
        del world.api.objects[key]
    for i in range(num_pods):
        world.api.objects[("Pod", "team-a", f"pod-{i}")] = {
            "apiVersion": "v1", "kind": "Pod",
            "metadata": {"name": f"pod-{i}", "namespace": "team-a",
                         "labels": {"inferfleet.dev/service": "llama", "app.kubernetes.io/component": "server", "inferfleet.dev/pool": "cpu-amd64"}},
            "status": {"podIP": f"10.0.0.{i}", "conditions": [{"type": "Ready", "status": "True"}]},
        }  # fmt: skip


def _replicas(world) -> int:
    return world.get("Deployment", "llama-cpu-amd64")["spec"]["replicas"]


def test_replicas_follow_the_pods_waiting_requests_up_and_back_down_with_status_and_events():
    load = {}
    world = _autoscaled(load)
    world.reconcile()
    world.sync()
    assert _replicas(world) == 2, "spec.replicas (2) is the starting point within [min, max]"
    _add_pods(world, 2)
    load.update({"pod-0": 9.0, "pod-1": 7.0})  # 8 per replica against a target of 2
    world.reconcile()
    world.sync()
    assert _replicas(world) == 6, "ceil(2 * 8 / 2) = 8, capped by maxReplicas"
    status = world.get("InferenceService", "llama")["status"]["autoscaling"]
    (entry,) = status["pools"]
    assert (entry["currentReplicas"], entry["desiredReplicas"], entry["metric"], entry["reason"]) == (
        2,
        6,
        "inferfleet:num_requests_waiting",
        "MaxReplicas",
    )
    assert "lastScaleTime" in status
    assert any(e["reason"] == "ScaledUp" and "2 -> 6" in e["message"] for e in world.api.events)
    _add_pods(world, 6)
    load.clear()
    load.update({f"pod-{i}": 0.0 for i in range(6)})
    world.ctx.clock = lambda: NOW + datetime.timedelta(seconds=1)  # past the (0 s) stabilization window
    world.reconcile()
    world.sync()
    assert _replicas(world) == 1
    assert any(e["reason"] == "ScaledDown" and "6 -> 1" in e["message"] for e in world.api.events)


def test_pods_that_do_not_answer_damp_a_scale_down():
    load = {}
    world = _autoscaled(load)
    world.reconcile()
    world.sync()
    world.api.objects[("Deployment", "team-a", "llama-cpu-amd64")]["spec"]["replicas"] = 4
    world.sync()
    _add_pods(world, 4)
    load.update({"pod-0": 0.0})  # three pods do not answer: they count as on target
    world.reconcile()
    assert _replicas(world) == 3  # ceil(4 * (0 + 3 * 2) / 4 / 2)


def test_a_service_without_autoscaling_never_lists_pods():
    world = World([inference_service()])
    world.reconcile()
    assert ("GET", "Pod") not in world.api.reads


def test_gpus_another_service_holds_in_the_pool_cap_the_scale_up():
    service = inference_service()
    service["spec"].pop("pools")
    service["spec"]["replicas"] = 1
    service["spec"]["runtime"] = {"policy": "Paged"}
    service["spec"]["placement"] = {"vendors": ["nvidia"]}
    service["spec"]["autoscaling"] = {"maxReplicas": 8, "targetWaitingRequests": 1}
    world = World([service])
    world.api.objects[("Deployment", "team-b", "other-nvidia-h100-80gb-hbm3")] = {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "other-nvidia-h100-80gb-hbm3", "namespace": "team-b",
                     "labels": {"inferfleet.dev/service": "other", "inferfleet.dev/pool": "nvidia-h100-80gb-hbm3"}},
        "spec": {"replicas": 6, "template": {"spec": {"containers": [{"name": "server", "resources": {"limits": {"memory": "8Gi", "nvidia.com/gpu": "1"}}}]}}},
    }  # fmt: skip
    world.ctx.scraper = httpx.AsyncClient(
        transport=httpx.MockTransport(lambda request: httpx.Response(200, text="inferfleet:num_requests_waiting 20\n"))
    )
    world.ctx.config = dataclasses.replace(
        world.ctx.config, autoscale_seconds=0.0, scrape_url_template="http://stand-in/{pod}"
    )
    world.sync()
    world.reconcile()
    world.sync()
    world.api.objects[("Pod", "team-a", "pod-0")] = {
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": "pod-0", "namespace": "team-a",
                     "labels": {"inferfleet.dev/service": "llama", "app.kubernetes.io/component": "server", "inferfleet.dev/pool": "nvidia-h100-80gb-hbm3"}},
        "status": {"podIP": "10.0.0.1", "conditions": [{"type": "Ready", "status": "True"}]},
    }  # fmt: skip
    world.reconcile()
    # 8 GPUs, 6 held by the other service: 2 replicas fit, though the pool's size is 8 and the formula asks 20.
    assert world.get("Deployment", "llama-nvidia-h100-80gb-hbm3")["spec"]["replicas"] == 2
    (entry,) = world.get("InferenceService", "llama")["status"]["autoscaling"]["pools"]
    assert entry["reason"] == "CapacityLimited"


def test_routing_enabled_without_the_crd_posts_one_warning_and_auto_posts_none():
    enabled = _routed(inferencePool="Enabled")
    enabled.reconcile()
    enabled.reconcile()
    warnings = [e for e in enabled.api.events if e["reason"] == "InferencePoolCRDAbsent"]
    assert len(warnings) == 1 and warnings[0]["type"] == "Warning"
    auto = _routed()
    auto.reconcile()
    assert not [e for e in auto.api.events if e["reason"] == "InferencePoolCRDAbsent"]


def test_a_deleted_service_leaves_no_autoscaling_history_behind():
    world = _autoscaled({})
    world.reconcile()
    assert ("team-a", "llama") in world.ctx.scaling
    del world.api.objects[("InferenceService", "team-a", "llama")]
    world.sync()
    world.reconcile()
    assert ("team-a", "llama") not in world.ctx.scaling


def test_a_reconcile_plans_once_even_when_it_scales_routes_and_a_write_is_refused(monkeypatch):
    """One reconcile: one planning call and one status built, whatever it reads (a scrape that scales, the CRD
    served) and whatever its writes meet (a child refused, so the status is written again with the refusal)."""
    calls = {"plan": 0, "status": 0}

    def counted(name, function):
        def count(*args, **kwargs):
            calls[name] += 1
            return function(*args, **kwargs)

        return count

    monkeypatch.setattr(planner, "plan_reconcile", counted("plan", planner.plan_reconcile))
    monkeypatch.setattr(planner, "build_status", counted("status", planner.build_status))
    load = {}
    world = _autoscaled(load)
    world.api.serves_pools = True
    world.reconcile()
    world.sync()
    assert calls == {"plan": 1, "status": 1}
    _add_pods(world, 2)
    load.update({"pod-0": 9.0, "pod-1": 7.0})
    refuse(world, "Deployment", "spec.template: Invalid value")
    before = len(world.api.requests)
    with pytest.raises(ApiError):  # the work queue retries it after its error delay
        world.reconcile()
    writes = world.api.requests[before:]
    assert _replicas(world) == 2, "the refused scale-up left the Deployment as it was"
    assert writes.count(("PATCH", "InferenceService/status")) == 2, "status written, then again with the refusal"
    assert world.get("InferencePool", "llama") is not None
    assert calls == {"plan": 2, "status": 2}, "one plan per reconcile"

"""plan_service: pools × runtimes × builds × Deployments -> desired builds, children, status and events."""

from __future__ import annotations

from datetime import timedelta

import pytest
from crd_eval import admit, load_schema, schema_errors
from planning_data import NOW, RUNTIMES, cpu, deployment_as_read, h100, mi300x, service, with_state

from inferfleet_operator.api.names import ENGINE_KEY_ANNOTATION
from inferfleet_operator.api.types import PlanSettings, SpecError
from inferfleet_operator.plan.autoscaling import LoadReading, PodMetrics
from inferfleet_operator.plan.cluster import cluster_view
from inferfleet_operator.plan.planner import ServiceInputs, plan_reconcile, plan_service

NODES = [h100("h1"), h100("h2"), mi300x("m1"), cpu("c1")]
NV = "llama-nvidia-h100-80gb-hbm3"


def plan(svc=None, builds=None, deployments=None, nodes=NODES, now=NOW, **kw):
    return plan_service(svc or service(), nodes, RUNTIMES, builds or {}, deployments or {}, now, **kw)


def kinds(p) -> dict[str, dict]:
    return {f"{c['kind']}/{c['metadata']['name']}": c for c in p.children}


def pool(p, name: str) -> dict:
    return next(e for e in p.status["pools"] if e["name"] == name)


def cond(p, type_: str) -> dict:
    return next(c for c in p.status["conditions"] if c["type"] == type_)


def args(deployment: dict) -> list[str]:
    return deployment["spec"]["template"]["spec"]["containers"][0]["args"]


def key_of(p) -> str:
    return pool(p, "nvidia-h100-80gb-hbm3")["engineBuild"]


def test_first_plan_builds_an_engine_and_bridges_the_nvidia_pool_with_paged():
    p = plan(service(replicas=4))
    children = kinds(p)
    assert set(children) == {
        f"Deployment/{NV}",
        "Deployment/llama-amd-mi300x",
        "Service/llama",
        "PodDisruptionBudget/llama",
        "NetworkPolicy/llama",
    }
    excluded = {x["name"]: x["reason"] for x in p.status["excludedPools"]}
    assert excluded["cpu-amd64"].startswith(
        "CPUNotRequested: accelerator pool(s) amd-mi300x, nvidia-h100-80gb-hbm3 serve"
    )
    nv = children[f"Deployment/{NV}"]
    assert args(nv)[:2] == ["serve", "--model"] and nv["metadata"]["annotations"][ENGINE_KEY_ANNOTATION] == ""
    entry = pool(p, "nvidia-h100-80gb-hbm3")
    assert (entry["engine"], entry["servingEngine"], entry["reason"], entry["buildState"]) == (
        "Compiled",
        "Paged",
        "BridgingWithPaged",
        "Pending",
    )
    (build,) = p.engine_builds
    assert build["kind"] == "EngineBuild" and build["metadata"]["name"] == entry["engineBuild"]
    assert build["spec"]["architecture"] == "sm90" and build["spec"]["placement"]["nodeNames"] == ["h1", "h2"]
    assert build["metadata"]["labels"]["ref.inferfleet.dev/llama"] == "true"
    assert cond(p, "EnginesBuilt")["status"] == "False" and cond(p, "RolledOut")["status"] == "False"


def test_children_are_owned_by_the_service_and_builds_are_not():
    p = plan()
    for child in p.children:
        (ref,) = child["metadata"]["ownerReferences"]
        assert (ref["kind"], ref["name"], ref["uid"], ref["controller"]) == (
            "InferenceService",
            "llama",
            "uid-llama",
            True,
        )
    assert "ownerReferences" not in p.engine_builds[0]["metadata"]


def test_ready_build_switches_the_pool_to_its_compiled_engine():
    first = plan()
    key = key_of(first)
    p = plan(builds={key: with_state(first.engine_builds[0], "Ready")})
    nv = kinds(p)[f"Deployment/{NV}"]
    assert args(nv)[:4] == ["serve", "--engine-dir", f"/engines/{key}", "--engine"]
    assert nv["metadata"]["annotations"][ENGINE_KEY_ANNOTATION] == key
    volumes = {v["name"]: v for v in nv["spec"]["template"]["spec"]["volumes"]}
    assert volumes["engines"]["persistentVolumeClaim"] == {"claimName": "inferfleet-engine-cache", "readOnly": True}
    assert pool(p, "nvidia-h100-80gb-hbm3")["reason"] == "ServingCompiled"
    assert cond(p, "EnginesBuilt")["reason"] == "EnginesReady"


def test_compiled_pool_serves_the_directory_of_the_model_content_its_build_compiled():
    first = plan()
    key = key_of(first)
    ready = with_state(first.engine_builds[0], "Ready")
    ready["status"]["modelDigest"] = "00ff00ff00ff00ff"
    nv = kinds(plan(builds={key: ready}))[f"Deployment/{NV}"]
    assert args(nv)[:3] == ["serve", "--engine-dir", f"/engines/{key}/00ff00ff00ff00ff"]


def test_engine_cache_claim_comes_from_operator_settings():
    first = plan()
    p = plan(
        builds={key_of(first): with_state(first.engine_builds[0], "Ready")},
        settings=PlanSettings(engine_cache_claim="fast-cache"),
    )
    volumes = {v["name"]: v for v in kinds(p)[f"Deployment/{NV}"]["spec"]["template"]["spec"]["volumes"]}
    assert volumes["engines"]["persistentVolumeClaim"]["claimName"] == "fast-cache"


def test_without_bridge_the_pool_waits_with_no_deployment():
    p = plan(service(runtime={"bridge": False}))
    assert f"Deployment/{NV}" not in kinds(p)
    entry = pool(p, "nvidia-h100-80gb-hbm3")
    assert (
        entry["reason"] == "WaitingForEngineBuild"
        and entry["servingEngine"] == "None"
        and entry["desiredReplicas"] == 1
    )


def test_failed_build_falls_back_to_paged_and_degrades():
    first = plan()
    p = plan(builds={key_of(first): with_state(first.engine_builds[0], "Failed")})
    assert args(kinds(p)[f"Deployment/{NV}"])[:2] == ["serve", "--model"]
    assert pool(p, "nvidia-h100-80gb-hbm3")["reason"] == "FallbackToPaged"
    degraded = cond(p, "Degraded")
    assert (degraded["status"], degraded["reason"]) == ("True", "BuildFailed") and "nvidia-h100-80gb-hbm3" in degraded[
        "message"
    ]
    assert any(e.type == "Warning" and e.reason == "FallbackToPaged" for e in p.events)


def test_failed_build_without_fallback_serves_nothing_in_that_pool():
    svc = service(runtime={"fallback": "None"})
    first = plan(svc)
    p = plan(svc, builds={key_of(first): with_state(first.engine_builds[0], "Failed")})
    assert f"Deployment/{NV}" not in kinds(p) and "Deployment/llama-amd-mi300x" in kinds(p)
    assert pool(p, "nvidia-h100-80gb-hbm3")["reason"] == "BuildFailedNoFallback"
    assert (cond(p, "Degraded")["status"], cond(p, "Degraded")["reason"]) == ("True", "BuildFailedNoFallback")


def test_envelope_change_keeps_the_old_engine_serving_until_the_new_build_is_ready():
    old_plan = plan()
    old_key = key_of(old_plan)
    builds = {old_key: with_state(old_plan.engine_builds[0], "Ready")}
    serving = plan(builds=builds)
    deployments = {NV: deployment_as_read(kinds(serving)[f"Deployment/{NV}"], ready=1)}

    changed = service(engine={"maxContextLength": 8192}, generation=2)
    during = plan(changed, builds=builds, deployments=deployments)
    new_key = key_of(during)
    assert new_key != old_key
    assert sorted(b["metadata"]["name"] for b in during.engine_builds) == sorted([old_key, new_key])
    nv = kinds(during)[f"Deployment/{NV}"]
    assert nv["metadata"]["annotations"][ENGINE_KEY_ANNOTATION] == old_key
    entry = pool(during, "nvidia-h100-80gb-hbm3")
    assert (entry["reason"], entry["servingEngineBuild"], entry["engineBuild"]) == (
        "ServingPreviousEngine",
        old_key,
        new_key,
    )

    new_build = next(b for b in during.engine_builds if b["metadata"]["name"] == new_key)
    failed = plan(changed, builds=builds | {new_key: with_state(new_build, "Failed")}, deployments=deployments)
    assert kinds(failed)[f"Deployment/{NV}"]["metadata"]["annotations"][ENGINE_KEY_ANNOTATION] == old_key
    assert cond(failed, "Degraded")["status"] == "True"

    after = plan(changed, builds=builds | {new_key: with_state(new_build, "Ready")}, deployments=deployments)
    assert kinds(after)[f"Deployment/{NV}"]["metadata"]["annotations"][ENGINE_KEY_ANNOTATION] == new_key
    assert [b["metadata"]["name"] for b in after.engine_builds] == [new_key]


def test_resync_with_unchanged_inputs_gives_the_same_status_and_no_events():
    first = plan()
    again = plan(service(status=first.status), now=NOW + timedelta(hours=1))
    assert again.status == first.status and again.events == [] and again.children == first.children


def test_last_transition_time_moves_only_for_conditions_that_flip():
    first = plan()
    later = NOW + timedelta(minutes=5)
    ready_deps = {
        c["metadata"]["name"]: deployment_as_read(c, ready=c["spec"]["replicas"])
        for c in first.children
        if c["kind"] == "Deployment"
    }
    p = plan(service(status=first.status), deployments=ready_deps, now=later)
    assert cond(p, "Ready")["status"] == "True" and cond(p, "Ready")["lastTransitionTime"] == "2026-01-01T12:05:00Z"
    assert cond(p, "Degraded")["lastTransitionTime"] == "2026-01-01T12:00:00Z"
    assert any(e.reason == "AllPoolsReady" for e in p.events)


def test_conditions_carry_the_observed_generation():
    p = plan(service(generation=7))
    assert p.status["observedGeneration"] == 7 and all(c["observedGeneration"] == 7 for c in p.status["conditions"])


def test_a_pool_whose_nodes_left_gets_no_deployment():
    p = plan(nodes=[h100("h1"), cpu("c1")])
    assert "Deployment/llama-amd-mi300x" not in kinds(p)
    assert [e["name"] for e in p.status["pools"]] == ["nvidia-h100-80gb-hbm3"]


def test_node_selector_and_untolerated_taints_exclude_pools_with_reasons():
    taint = [{"key": "dedicated", "value": "ml", "effect": "NoSchedule"}]
    nodes = [h100("h1", taints=taint), mi300x("m1"), cpu("c1")]
    p = plan(service(placement={"nodeSelector": {"kubernetes.io/arch": "amd64"}}), nodes=nodes)
    reasons = {x["name"]: x["reason"] for x in p.status["excludedPools"]}
    assert "taint dedicated=ml:NoSchedule not in placement.tolerations" in reasons["nvidia-h100-80gb-hbm3"]
    tolerated = plan(
        service(replicas=3, placement={"tolerations": [{"key": "dedicated", "operator": "Exists"}]}), nodes=nodes
    )
    assert "nvidia-h100-80gb-hbm3" in [e["name"] for e in tolerated.status["pools"]]
    nv = kinds(tolerated)[f"Deployment/{NV}"]
    assert nv["spec"]["template"]["spec"]["tolerations"] == [
        {"key": "dedicated", "operator": "Exists"},
        {"key": "nvidia.com/gpu", "operator": "Exists"},
    ]
    selected = plan(service(placement={"nodeSelector": {"zone": "b"}}))
    assert selected.status["pools"] == [] and cond(selected, "Ready")["reason"] == "NoEligiblePools"
    assert "label zone=b (placement.nodeSelector) missing" in cond(selected, "Ready")["message"]


def test_per_pool_overrides_are_honoured():
    svc = service(
        replicas=5,
        pools=[{"name": "cpu-amd64", "replicas": 0}, {"name": "amd-mi300x", "replicas": 1}],
        placement={"vendors": ["nvidia", "amd", "cpu"]},
    )
    desired = {e["name"]: e["desiredReplicas"] for e in plan(svc).status["pools"]}
    assert desired == {"amd-mi300x": 1, "cpu-amd64": 0, "nvidia-h100-80gb-hbm3": 4}
    assert "Deployment/llama-cpu-amd64" not in kinds(plan(svc))


def test_replicas_beyond_capacity_degrade_the_service():
    p = plan(
        service(replicas=30, resources={"gpusPerReplica": 8}, engine={"tensorParallelSize": 8}), nodes=[h100("h1")]
    )
    assert p.status["unplacedReplicas"] == 29 and cond(p, "Degraded")["reason"] == "InsufficientCapacity"


def test_gpu_resource_and_count_are_in_the_container_limits():
    # 16 H100 and 8 MI300X GPUs hold 12 two-GPU replicas; the 13th goes to the CPU pool, which is allowed.
    p = plan(
        service(
            replicas=13,
            resources={"gpusPerReplica": 2},
            engine={"tensorParallelSize": 2},
            placement={"vendors": ["nvidia", "amd", "cpu"]},
        )
    )
    limits = {
        n: c["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]
        for n, c in kinds(p).items()
        if n.startswith("Deployment/")
    }
    assert limits[f"Deployment/{NV}"]["nvidia.com/gpu"] == "2"
    assert limits["Deployment/llama-amd-mi300x"]["amd.com/gpu"] == "2"
    assert set(limits["Deployment/llama-cpu-amd64"]) == {"memory"}


def test_services_with_the_same_model_and_envelope_share_one_build_and_merge_references():
    a = plan(service("alpha"))
    b_first = plan(service("beta"))
    assert key_of(a) == key_of(b_first)
    existing = with_state(a.engine_builds[0], "Building")
    b = plan(service("beta"), builds={key_of(a): existing})
    labels = b.engine_builds[0]["metadata"]["labels"]
    assert labels["ref.inferfleet.dev/alpha"] == "true" and labels["ref.inferfleet.dev/beta"] == "true"


def test_status_and_builds_fit_the_crd_schemas():
    first = plan(service(replicas=3))
    p = plan(builds={key_of(first): with_state(first.engine_builds[0], "Failed")})
    status_schema = load_schema("inferenceservices.yaml")["properties"]["status"]
    assert schema_errors(p.status, status_schema) == []
    for build in p.engine_builds:
        assert admit(build, "enginebuilds.yaml")[1] == []


def test_a_spec_the_crd_would_refuse_raises_spec_error():
    with pytest.raises(SpecError, match="tensorParallelSize"):
        plan(service(engine={"tensorParallelSize": 4}))


def test_pools_given_no_replicas_are_not_counted_as_serving():
    p = plan(service(replicas=1))
    serving = [e["name"] for e in p.status["pools"] if e["servingEngine"] != "None"]
    assert len(serving) == 1 and p.status["runtimes"] == "Paged=1" and p.status["poolCount"] == 2
    idle = [e for e in p.status["pools"] if e["desiredReplicas"] == 0 and e["engine"] == "Paged"]
    assert idle and all(e["reason"] == "NoReplicasAssigned" for e in idle)
    # One Event for the rollout, named by the serving pool's reason, naming the idle pools too.
    reason = next(e["reason"] for e in p.status["pools"] if e["servingEngine"] != "None")
    assert [(e.type, e.reason) for e in p.events] == [("Normal", reason)]
    assert all(e["name"] in p.events[0].message for e in idle) and "NoReplicasAssigned" in p.events[0].message


def test_events_name_each_changed_pool_once_per_reason_and_readiness_in_one_event():
    first = plan(service(runtime={"policy": "Paged"}))
    reasons = [e.reason for e in first.events]
    assert reasons.count("ServingPaged") == 1, reasons  # three pools, one Event
    paged = next(e for e in first.events if e.reason == "ServingPaged")
    assert all(p["name"] in paged.message for p in first.status["pools"] if p["reason"] == "ServingPaged")
    ready_deps = {
        c["metadata"]["name"]: deployment_as_read(c, ready=c["spec"]["replicas"])
        for c in first.children
        if c["kind"] == "Deployment"
    }
    ready = plan(service(runtime={"policy": "Paged"}, status=first.status), deployments=ready_deps)
    assert [(e.type, e.reason) for e in ready.events] == [("Normal", "AllPoolsReady")]
    assert "Ready is True" in ready.events[0].message and "RolledOut is True" in ready.events[0].message


def test_a_first_rollout_names_the_excluded_pools_in_its_one_event():
    first = plan(service(runtime={"policy": "Paged"}, placement={"vendors": ["nvidia"]}))
    assert first.status["excludedPools"]
    assert [(e.type, e.reason) for e in first.events] == [("Normal", "ServingPaged")]
    assert all(x["name"] in first.events[0].message for x in first.status["excludedPools"])
    # Pools excluded later, with no pool changing, still get an Event of their own.
    previous = {**first.status, "excludedPools": []}
    again = plan(service(runtime={"policy": "Paged"}, placement={"vendors": ["nvidia"]}, status=previous))
    assert [e.reason for e in again.events] == ["PoolExcluded"]


@pytest.mark.parametrize(
    "quantization, flag", [("Int8", ["--quantization", "int8"]), ("Int4", ["--quantization", "int4"])]
)
def test_a_quantized_model_is_served_paged_everywhere_with_the_flag_and_no_build(quantization, flag):
    model = {"name": "llama-3-8b", "uri": "hf://meta-llama/Llama-3-8B", "quantization": quantization}
    p = plan(service(replicas=4, model=model))
    assert p.engine_builds == []  # compiled engines serve float weights only: nothing to build
    entry = pool(p, "nvidia-h100-80gb-hbm3")
    assert (entry["engine"], entry["servingEngine"], entry["reason"]) == ("Paged", "Paged", "ServingPaged")
    assert f"model.quantization {quantization} needs the paged engine" in entry["choiceReason"]
    for deployment in (d for d in p.children if d["kind"] == "Deployment"):
        served = args(deployment)
        assert served[served.index("--quantization") :][:2] == flag


@pytest.mark.parametrize("quantization", ["Auto", "None"])
def test_an_unquantized_model_passes_no_quantization_flag_and_still_compiles(quantization):
    model = {"name": "llama-3-8b", "uri": "hf://meta-llama/Llama-3-8B", "quantization": quantization}
    p = plan(service(replicas=4, model=model))
    assert len(p.engine_builds) == 1
    assert all("--quantization" not in args(d) for d in p.children if d["kind"] == "Deployment")


def test_a_tensor_parallel_service_is_served_paged_with_the_flag_shared_memory_and_its_gpus():
    tp = {"engine": {"tensorParallelSize": 4}, "resources": {"gpusPerReplica": 4}}
    p = plan(service(replicas=2, **tp))
    assert p.engine_builds == []  # compiled engines are exported for one device: nothing to build
    entry = pool(p, "nvidia-h100-80gb-hbm3")
    assert (entry["engine"], entry["servingEngine"]) == ("Paged", "Paged")
    assert "engine.tensorParallelSize 4 needs the paged engine" in entry["choiceReason"]
    deployment = kinds(p)[f"Deployment/{NV}"]
    assert args(deployment)[args(deployment).index("--tensor-parallel-size") :][:2] == ["--tensor-parallel-size", "4"]
    pod = deployment["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert container["resources"]["limits"]["nvidia.com/gpu"] == "4"
    shm = next(v for v in pod["volumes"] if v["name"] == "dshm")
    assert shm["emptyDir"]["medium"] == "Memory"
    assert {"name": "dshm", "mountPath": "/dev/shm"} in container["volumeMounts"]


def test_one_rank_passes_no_tensor_parallel_flag_nor_shared_memory():
    p = plan(service(replicas=2, runtime={"policy": "Paged"}))
    for deployment in (d for d in p.children if d["kind"] == "Deployment"):
        assert "--tensor-parallel-size" not in args(deployment)
        assert all(v["name"] != "dshm" for v in deployment["spec"]["template"]["spec"]["volumes"])


def test_a_pool_whose_nodes_hold_fewer_gpus_than_a_replica_shards_over_gets_none_and_says_why():
    tp = {"engine": {"tensorParallelSize": 4}, "resources": {"gpusPerReplica": 4}}
    small = [h100("h1", gpus=2), h100("h2", gpus=2), mi300x("m1")]
    p = plan(service(replicas=2, **tp), nodes=small)
    entry = pool(p, "nvidia-h100-80gb-hbm3")
    assert (entry["desiredReplicas"], entry["reason"]) == (0, "NoCapacity")
    assert entry["message"] == "no node has 4 allocatable nvidia.com/gpu"
    assert pool(p, "amd-mi300x")["desiredReplicas"] == 2  # 8 per node: the MI300X pool takes them


# ------------------------------------------------------------------ plan_reconcile: the whole state from one call

CPU = "llama-cpu-amd64"


def autoscaled(**spec) -> dict:
    """A cpu-only service autoscaled on waiting requests (target 2 per replica, 1..6 replicas, no stabilization)."""
    autoscaling = {"minReplicas": 1, "maxReplicas": 6, "targetWaitingRequests": 2, "scaleDownStabilizationSeconds": 0}
    return service(placement={"vendors": ["cpu"]}, autoscaling=autoscaling, **spec)


def inputs(svc: dict, **kw) -> ServiceInputs:
    return ServiceInputs(svc, cluster_view([cpu("c1"), cpu("c2")], RUNTIMES), NOW, **kw)


def waiting(*values) -> LoadReading:
    return LoadReading({"cpu-amd64": tuple(PodMetrics(waiting=v) for v in values)})


def test_one_call_scales_from_the_load_and_the_deployment_routing_and_status_agree():
    p = plan_reconcile(inputs(autoscaled(), load=waiting(9.0, 7.0), is_pool_crd_served=True))
    # 8 waiting per replica against a target of 2 from 2 replicas: ceil(2 * 4) = 8, capped by maxReplicas.
    assert p.scaling.replicas == {"cpu-amd64": 6}
    assert kinds(p)[f"Deployment/{CPU}"]["spec"]["replicas"] == 6
    assert (pool(p, "cpu-amd64")["desiredReplicas"], p.status["replicas"]) == (6, 6)
    (entry,) = p.status["autoscaling"]["pools"]
    assert (entry["currentReplicas"], entry["desiredReplicas"], entry["reason"]) == (2, 6, "MaxReplicas")
    assert p.status["autoscaling"]["lastScaleTime"] == "2026-01-01T12:00:00Z"
    assert p.routing.pool is not None and p.status["routing"]["pools"] == ["cpu-amd64"]
    assert [e.reason for e in p.events if e.reason == "ScaledUp"] == ["ScaledUp"]


def test_between_scrapes_the_last_decision_stands_and_says_nothing_new():
    first = plan_reconcile(inputs(autoscaled(), load=waiting(9.0, 7.0)))
    svc = autoscaled(status=first.status)
    again = plan_reconcile(
        inputs(svc, scaling=first.scaling, children={"Deployment": [kinds(first)[f"Deployment/{CPU}"]]})
    )
    assert again.scaling is first.scaling and kinds(again)[f"Deployment/{CPU}"]["spec"]["replicas"] == 6
    assert again.status["autoscaling"] == first.status["autoscaling"]
    assert not [e for e in again.events if e.reason in ("ScaledUp", "ScaledDown")]


def test_the_autoscaler_starts_from_the_live_deployment_and_keeps_to_the_gpus_others_leave():
    svc = service(replicas=1, runtime={"policy": "Paged"}, placement={"vendors": ["nvidia"]},
                  autoscaling={"maxReplicas": 8, "targetWaitingRequests": 1})  # fmt: skip
    view = cluster_view([h100("h1")], RUNTIMES)
    live = plan_service(svc, [h100("h1")], RUNTIMES, {}, {}, NOW).children[0]
    live["spec"]["replicas"] = 1
    load = LoadReading({"nvidia-h100-80gb-hbm3": (PodMetrics(waiting=20.0),)}, {"nvidia-h100-80gb-hbm3": 6})
    p = plan_reconcile(ServiceInputs(svc, view, NOW, children={"Deployment": [live]}, load=load))
    (entry,) = p.status["autoscaling"]["pools"]
    assert (entry["currentReplicas"], entry["desiredReplicas"], entry["reason"]) == (1, 2, "CapacityLimited")
    assert pool(p, "nvidia-h100-80gb-hbm3")["desiredReplicas"] == 2


def test_routing_asked_for_without_the_crd_warns_and_a_disabled_route_deletes_the_earlier_pool():
    enabled = plan_reconcile(inputs(service(placement={"vendors": ["cpu"]}, routing={"inferencePool": "Enabled"})))
    assert enabled.routing.pool is None and enabled.routing.warning.reason == "InferencePoolCRDAbsent"
    assert enabled.status["routing"]["reason"] == "InferencePoolCRDAbsent" and enabled.routing.stale_pool == ""
    before = {"routing": {"inferencePool": "llama"}}
    disabled = service(placement={"vendors": ["cpu"]}, routing={"inferencePool": "Disabled"}, status=before)
    p = plan_reconcile(inputs(disabled, is_pool_crd_served=True))
    assert (p.routing.pool, p.routing.stale_pool, p.routing.warning) == (None, "llama", None)
    assert p.status["routing"]["reason"] == "RoutingDisabled"
    off = plan_reconcile(inputs(disabled, is_pool_crd_served=True, is_routing_allowed=False))
    assert off.routing.stale_pool == "", "an operator without InferencePools never deletes one"


def test_a_refused_write_degrades_the_status_until_the_write_goes_through():
    refused = {("Deployment", CPU, "cpu-amd64"): "spec.replicas: Invalid value"}
    p = plan_reconcile(inputs(service(placement={"vendors": ["cpu"]}), refused=refused))
    assert p.refused == refused
    assert (cond(p, "Degraded")["status"], cond(p, "Degraded")["reason"]) == ("True", "ApplyFailed")
    assert "refused by the API server" in pool(p, "cpu-amd64")["message"]
    healed, events = p.report.with_refusals({})
    assert next(c for c in healed["conditions"] if c["type"] == "Degraded")["status"] == "False"
    assert not [e for e in events if e.reason == "ApplyFailed"]
    gone = plan_reconcile(inputs(service(placement={"vendors": ["cpu"]}), refused={("Deployment", "old", ""): "x"}))
    assert gone.refused == {}, "a refusal of an object no longer planned is over"


def test_children_not_owned_are_left_alone_and_owned_ones_no_longer_planned_are_stale():
    svc = service(placement={"vendors": ["cpu"]})
    first = plan_reconcile(inputs(svc))
    taken = dict(kinds(first)["Service/llama"], metadata={"name": "llama", "namespace": "team-a"})
    old = dict(kinds(first)[f"Deployment/{CPU}"])
    old["metadata"] = dict(old["metadata"], name="llama-gone")
    p = plan_reconcile(inputs(svc, children={"Service": [taken], "Deployment": [old]}))
    assert p.not_owned == {("Service", "llama")}
    assert [(kind, meta["name"]) for kind, meta in p.stale] == [("Deployment", "llama-gone")]
    assert cond(p, "Degraded")["reason"] == "NotOwned"

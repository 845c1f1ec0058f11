"""Placement: accelerator pools first, CPU pools only when asked for or when no accelerator pool is eligible;
GPU taints tolerated for the pool's resource; runtimes that request a resource the nodes lack are not chosen;
per-node exclusions listed in status; no engine build for a pool given no replicas."""

from __future__ import annotations

import pytest
from crd_eval import load_schema, schema_errors
from planning_data import NOW, RUNTIMES, cpu, h100, intel_max, mi300x, runtime, service, with_state

from inferfleet_operator.plan.planner import plan_service

NV = "nvidia-h100-80gb-hbm3"
ONE_H100_TEN_CPUS = [h100("h1", gpus=8)] + [cpu(f"c{i}", cores=32) for i in range(10)]
TAINTED = [{"key": "dedicated", "value": "ml", "effect": "NoSchedule"}]


def plan(svc, nodes, runtimes=RUNTIMES, builds=None):
    return plan_service(svc, nodes, runtimes, builds or {}, {}, NOW)


def split(p) -> dict[str, int]:
    return {e["name"]: e["desiredReplicas"] for e in p.status["pools"] if e["desiredReplicas"]}


def excluded(p) -> dict[str, str]:
    return {x["name"]: x["reason"].split(":")[0] for x in p.status["excludedPools"]}


# nodes, replicas, placement -> replicas per pool, unplaced, excluded pools (name -> reason)
SPLITS = {
    "default placement: 8 replicas all on the H100, none on 10 CPU nodes": (
        ONE_H100_TEN_CPUS, 8, {}, {NV: 8}, 0, {"cpu-amd64": "CPUNotRequested"}),
    "default placement: beyond the H100's 8 GPUs replicas stay unplaced, not on CPU": (
        ONE_H100_TEN_CPUS, 10, {}, {NV: 8}, 2, {"cpu-amd64": "CPUNotRequested"}),
    "cpu listed: the H100 fills first, CPU takes the rest": (
        ONE_H100_TEN_CPUS, 10, {"vendors": ["nvidia", "cpu"]}, {NV: 8, "cpu-amd64": 2}, 0, {}),
    "cpu listed, few replicas: all on the H100": (
        ONE_H100_TEN_CPUS, 3, {"vendors": ["nvidia", "cpu"]}, {NV: 3}, 0, {}),
    "vendors [cpu]: CPU only": (
        ONE_H100_TEN_CPUS, 8, {"vendors": ["cpu"]}, {"cpu-amd64": 8}, 0, {NV: "VendorNotAllowed"}),
    "only CPU nodes: CPU serves": (
        [cpu(f"c{i}", cores=32) for i in range(10)], 4, {}, {"cpu-amd64": 4}, 0, {}),
    "the only GPU node is NotReady: CPU serves": (
        [h100("h1", ready=False), cpu("c1")], 2, {}, {"cpu-amd64": 2}, 0, {NV: "NoEligibleNodes"}),
    "the only GPU node is tainted and not tolerated: CPU serves": (
        [h100("h1", taints=TAINTED), cpu("c1")], 2, {}, {"cpu-amd64": 2}, 0, {NV: "NodesNotUsable"}),
    "default placement, an override names the CPU pool: it gets its override": (
        ONE_H100_TEN_CPUS, 4, {}, {NV: 3, "cpu-amd64": 1}, 0, {}),
    "vendors [nvidia]: CPU not allowed": (
        ONE_H100_TEN_CPUS, 2, {"vendors": ["nvidia"]}, {NV: 2}, 0, {"cpu-amd64": "VendorNotAllowed"}),
    "two GPU vendors split by capacity, CPU left out": (
        [h100("h1"), mi300x("m1", gpus=4), cpu("c1")], 6, {}, {NV: 4, "amd-mi300x": 2}, 0, {"cpu-amd64": "CPUNotRequested"}),
}  # fmt: skip


@pytest.mark.parametrize("case", sorted(SPLITS))
def test_replicas_split_accelerators_first(case):
    nodes, replicas, placement, want, unplaced, want_excluded = SPLITS[case]
    overrides = [{"name": "cpu-amd64", "replicas": 1}] if "override" in case else []
    p = plan(service(replicas=replicas, placement=placement, runtime={"policy": "Paged"}, pools=overrides), nodes)
    assert split(p) == want
    assert p.status["unplacedReplicas"] == unplaced
    assert excluded(p) == want_excluded
    assert {c["metadata"]["name"] for c in p.children if c["kind"] == "Deployment"} == {
        f"llama-{name}" for name in want
    }


def test_gpu_taints_of_the_pools_resource_are_tolerated_with_any_effect():
    for effect in ("NoSchedule", "NoExecute"):
        nodes = [
            h100("h1", taints=[{"key": "nvidia.com/gpu", "value": "present", "effect": effect}]),
            mi300x("m1", taints=[{"key": "amd.com/gpu", "effect": effect}]),
        ]
        p = plan(service(replicas=2), nodes)
        assert split(p) == {NV: 1, "amd-mi300x": 1} and p.status["excludedPools"] == []
        build = p.engine_builds[0]
        assert {"key": "nvidia.com/gpu", "operator": "Exists", "value": "", "effect": ""} in build["spec"]["placement"][
            "tolerations"
        ]


def test_another_vendors_gpu_taint_is_not_tolerated():
    nodes = [h100("h1", taints=[{"key": "amd.com/gpu", "effect": "NoSchedule"}]), mi300x("m1")]
    p = plan(service(replicas=2), nodes)
    assert excluded(p) == {NV: "NodesNotUsable"} and split(p) == {"amd-mi300x": 2}


def test_opting_out_of_gpu_taint_toleration_excludes_tainted_nodes():
    nodes = [h100("h1", taints=[{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]), cpu("c1")]
    p = plan(service(replicas=1, placement={"tolerateGpuTaints": False}), nodes)
    reasons = {x["name"]: x["reason"] for x in p.status["excludedPools"]}
    assert "TaintNotTolerated: taint nvidia.com/gpu=:NoSchedule" in reasons[NV] and split(p) == {"cpu-amd64": 1}


def test_nodes_left_out_of_a_partly_eligible_pool_are_listed_in_status():
    nodes = [
        h100("h1"),
        h100("h2", ready=False),
        h100("h3", taints=TAINTED),
        h100("h4", taints=[{"key": "nvidia.com/gpu", "effect": "NoSchedule"}]),
    ]
    p = plan(service(replicas=2, runtime={"policy": "Paged"}), nodes)
    (entry,) = p.status["pools"]
    assert entry["nodes"] == 2 and entry["excludedNodeCount"] == 2
    assert [(n["name"], n["reason"]) for n in entry["excludedNodes"]] == [
        ("h2", "NotReady"),
        ("h3", "TaintNotTolerated"),
    ]
    assert "dedicated=ml:NoSchedule" in entry["excludedNodes"][1]["message"]
    assert schema_errors(p.status, load_schema("inferenceservices.yaml")["properties"]["status"]) == []


# The chart's xpu runtime asked for gpu.intel.com/xe; an i915 node must not get pods that ask for it.
XE_ONLY = runtime("paged-xe", "Paged", ["intel"], priority=100)
XE_ONLY["spec"]["gpuResource"] = "gpu.intel.com/xe"
I915 = runtime("paged-i915", "Paged", ["intel"], priority=50)
I915["spec"]["gpuResource"] = "gpu.intel.com/i915"
FROM_NODE = runtime("paged-xpu", "Paged", ["intel"], priority=100)  # no gpuResource: what the nodes advertise


def _limits(p) -> dict:
    dep = next(c for c in p.children if c["kind"] == "Deployment")
    return dep["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"]


def test_a_runtime_asking_for_a_resource_the_nodes_lack_is_not_chosen():
    p = plan(service(replicas=1), [intel_max("i1")], [XE_ONLY])
    (x,) = p.status["excludedPools"]
    assert (
        x["reason"].startswith("NoMatchingRuntime")
        and "paged-xe requests gpu.intel.com/xe" in x["reason"]
        and "gpu.intel.com/i915" in x["reason"]
    )
    assert not [c for c in p.children if c["kind"] == "Deployment"]
    chosen = plan(service(replicas=1), [intel_max("i1")], [XE_ONLY, I915])
    assert chosen.status["pools"][0]["runtime"] == "paged-i915" and _limits(chosen)["gpu.intel.com/i915"] == "1"


def test_a_runtime_without_a_gpu_resource_requests_what_the_nodes_advertise():
    for resource in ("gpu.intel.com/i915", "gpu.intel.com/xe"):
        p = plan(service(replicas=1), [intel_max("i1", resource)], [FROM_NODE])
        assert _limits(p)[resource] == "1"


def test_nodes_without_the_chosen_resource_are_left_out_of_the_pool():
    p = plan(
        service(replicas=1),
        [
            intel_max("a", "gpu.intel.com/xe"),
            intel_max("b", "gpu.intel.com/i915"),
            intel_max("c", "gpu.intel.com/i915"),
        ],
        [FROM_NODE],
    )
    (entry,) = p.status["pools"]
    assert entry["nodes"] == 2 and [(n["name"], n["reason"]) for n in entry["excludedNodes"]] == [
        ("a", "GPUResourceMissing")
    ]
    assert _limits(p)["gpu.intel.com/i915"] == "1"


def test_a_compiled_pool_given_no_replicas_gets_no_engine_build():
    svc = service(replicas=1, pools=[{"name": "amd-mi300x", "replicas": 1}])
    p = plan(svc, [h100("h1"), mi300x("m1")])
    assert p.engine_builds == []
    nv = next(e for e in p.status["pools"] if e["name"] == NV)
    assert (nv["reason"], nv["servingEngine"], nv["desiredReplicas"]) == (
        "NoReplicasAssigned",
        "None",
        0,
    ) and "engineBuild" not in nv
    given = plan(service(replicas=2, pools=[{"name": "amd-mi300x", "replicas": 1}]), [h100("h1"), mi300x("m1")])
    assert len(given.engine_builds) == 1


def test_credentials_size_and_build_settings_leave_the_engine_key_alone():
    plain = plan(service(replicas=1), [h100("h1")])
    dressed = plan(service(replicas=1, model={"name": "llama-3-8b", "uri": "hf://meta-llama/Llama-3-8B", "credentialsSecret": "hf", "size": "16Gi"},
                           build={"deadlineSeconds": 600, "resources": {"cpu": "8", "memory": "64Gi"}}), [h100("h1")])  # fmt: skip
    assert [b["metadata"]["name"] for b in plain.engine_builds] == [
        b["metadata"]["name"] for b in dressed.engine_builds
    ]
    assert (
        dressed.engine_builds[0]["spec"]["credentialsSecret"] == "hf"
        and dressed.engine_builds[0]["spec"]["deadlineSeconds"] == 600
    )


def test_an_unshared_build_takes_the_services_new_build_settings_a_shared_one_keeps_its_own():
    first = plan(service(replicas=1), [h100("h1")])
    existing = with_state(first.engine_builds[0], "Failed")
    fixed = service(
        replicas=1, model={"name": "llama-3-8b", "uri": "hf://meta-llama/Llama-3-8B", "credentialsSecret": "hf-token"}
    )
    again = plan(fixed, [h100("h1")], builds={existing["metadata"]["name"]: existing})
    assert again.engine_builds[0]["spec"]["credentialsSecret"] == "hf-token"
    existing["metadata"]["labels"]["ref.inferfleet.dev/other"] = "true"
    shared = plan(fixed, [h100("h1")], builds={existing["metadata"]["name"]: existing})
    assert shared.engine_builds[0]["spec"]["credentialsSecret"] == ""


def test_a_compiled_pool_keeps_only_a_paged_companion_that_requests_the_same_resource():
    # A pool of xe and i915 nodes: the compiled runtime requests xe, so an i915 paged runtime cannot bridge there.
    compiled = runtime("aot-xe", "Compiled", ["intel"], priority=10, architectures=["xe-hpc"])
    compiled["spec"]["gpuResource"] = "gpu.intel.com/xe"
    nodes = [intel_max("x1", "gpu.intel.com/xe"), intel_max("i1"), intel_max("i2")]
    p = plan(service(replicas=1), nodes, [compiled, I915, FROM_NODE])
    (entry,) = p.status["pools"]
    assert entry["runtime"] == "aot-xe" and "paged companion paged-xpu" in entry["choiceReason"]
    assert entry["servingRuntime"] == "paged-xpu" and _limits(p)["gpu.intel.com/xe"] == "1"
    assert [(n["name"], n["reason"]) for n in entry["excludedNodes"]] == [
        ("i1", "GPUResourceMissing"),
        ("i2", "GPUResourceMissing"),
    ]
    alone = plan(service(replicas=1), nodes, [compiled, I915])
    assert "no Paged runtime for bridge or fallback" in alone.status["pools"][0]["choiceReason"]

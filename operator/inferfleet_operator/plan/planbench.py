"""planbench: CPU time of planning 500 InferenceServices over 1,000 nodes (`python -m inferfleet_operator.plan.planbench`)."""

from __future__ import annotations

import argparse
import random
import time
from datetime import UTC, datetime

from inferfleet_operator.plan.cluster import cluster_view
from inferfleet_operator.plan.planner import ServiceInputs, plan_reconcile

PRODUCTS = [  # (weight, labels, allocatable)
    (
        40,
        {
            "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
            "nvidia.com/gpu.compute.major": "9",
            "nvidia.com/gpu.compute.minor": "0",
        },
        {"nvidia.com/gpu": "8"},
    ),
    (15, {"nvidia.com/gpu.product": "NVIDIA-L4"}, {"nvidia.com/gpu": "4"}),
    (20, {"amd.com/gpu.product-name": "AMD_Instinct_MI300X", "amd.com/gpu.device-id": "74a1"}, {"amd.com/gpu": "8"}),
    (10, {"gpu.intel.com/device-id.0380-0bd5.present": "true"}, {"gpu.intel.com/xe": "4"}),
    (5, {"feature.node.kubernetes.io/pci-0302_10de.present": "true"}, {"nvidia.com/gpu": "2"}),
    (10, {}, {}),
]


def make_nodes(num_nodes: int, rng: random.Random) -> list[dict]:
    weights = [p[0] for p in PRODUCTS]
    nodes = []
    for i in range(num_nodes):
        _, labels, alloc = rng.choices(PRODUCTS, weights)[0]
        ready = rng.random() > 0.02
        nodes.append({
            "metadata": {"name": f"node-{i:04d}", "labels": {"kubernetes.io/arch": "amd64", "zone": f"z{i % 3}"} | labels},
            "spec": {"unschedulable": rng.random() < 0.01},
            "status": {"allocatable": {"cpu": "64", "memory": "512Gi"} | alloc,
                       "conditions": [{"type": "Ready", "status": "True" if ready else "False"}]},
        })  # fmt: skip
    return nodes


def make_runtimes() -> list[dict]:
    def rt(name, engine, vendors, priority=0, archs=None):
        spec = {"engine": engine, "vendors": vendors, "image": f"inferfleet/{name}:1", "priority": priority}
        if engine == "Compiled":
            spec["compileImage"] = "inferfleet/compile:1"
        if archs:
            spec["architectures"] = archs
        return {"metadata": {"name": name}, "spec": spec}

    return [rt("paged-cuda", "Paged", ["nvidia"]), rt("paged-rocm", "Paged", ["amd"]), rt("paged-xpu", "Paged", ["intel"]),
            rt("paged-cpu", "Paged", ["cpu"]), rt("trt", "Compiled", ["nvidia"], 10, ["sm89", "sm90"])]  # fmt: skip


def make_services(num_services: int, rng: random.Random) -> list[dict]:
    services = []
    for i in range(num_services):
        spec = {
            "model": {"name": f"model-{i % 40}", "uri": f"hf://org/model-{i % 40}"},
            "engine": {"maxContextLength": rng.choice([2048, 4096, 8192]), "maxBatchSize": rng.choice([8, 16, 32])},
            "runtime": {"policy": rng.choice(["Auto", "Auto", "Paged", "Compiled"])},
            "replicas": rng.randint(1, 12),
        }
        if i % 5 == 0:
            spec["placement"] = {"nodeSelector": {"zone": f"z{i % 3}"}}
        if i % 7 == 0:
            spec["placement"] = spec.get("placement", {}) | {"vendors": ["nvidia", "amd"]}
        services.append(
            {
                "metadata": {"name": f"svc-{i}", "namespace": f"team-{i % 10}", "uid": f"u{i}", "generation": 1},
                "spec": spec,
                "status": {},
            }
        )
    return services


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--nodes", type=int, default=1000)
    parser.add_argument("--services", type=int, default=500)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    rng = random.Random(args.seed)
    nodes, runtimes, services = make_nodes(args.nodes, rng), make_runtimes(), make_services(args.services, rng)
    now = datetime(2026, 1, 1, tzinfo=UTC)

    cpu0, wall0 = time.process_time(), time.perf_counter()
    view = cluster_view(nodes, runtimes)
    cpu1 = time.process_time()
    plans = [plan_reconcile(ServiceInputs(svc, view, now)) for svc in services]
    # Second pass as a resync: builds half Ready, statuses fed back (the steady state of a running operator).
    builds = {}
    for plan in plans:
        for i, b in enumerate(plan.engine_builds):
            builds[b["metadata"]["name"]] = b | {"status": {"state": "Ready" if i % 2 == 0 else "Building"}}
    cpu2 = time.process_time()
    for svc, plan in zip(services, plans):
        plan_reconcile(ServiceInputs(svc | {"status": plan.status}, view, now, builds))
    cpu3, wall3 = time.process_time(), time.perf_counter()

    num_children = sum(len(p.children) for p in plans)
    num_builds = len({b["metadata"]["name"] for p in plans for b in p.engine_builds})
    print(
        f"nodes={args.nodes} services={args.services} pools={len(view.pools)} children={num_children} engine_builds={num_builds}"
    )
    print(f"classify+group nodes: {cpu1 - cpu0:.3f} s CPU")
    print(f"plan all services (first pass): {cpu2 - cpu1:.3f} s CPU")
    print(f"plan all services (resync, builds half ready): {cpu3 - cpu2:.3f} s CPU")
    print(f"total for one full pass (view + plans): {cpu2 - cpu0:.3f} s CPU; whole run {wall3 - wall0:.3f} s wall")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

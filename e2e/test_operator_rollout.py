"""The operator against the local cluster: runtime choice per pool on a mixed fleet, engine builds,
the paged bridge, fallback after a failed build, shared builds, envelope changes."""

from __future__ import annotations

import pytest
from helpers import condition, is_true, wait_for
from operator_process import (
    container_args,
    events,
    live_pools,
    pool_status,
    replica_set_args,
    serves_engine,
    service_manifest,
)

pytestmark = pytest.mark.e2e

FLEET = "inferfleet.dev/e2e-fleet=true"
H100 = "nvidia-h100-80gb-hbm3"
ON_H100 = {"nodeSelector": {"nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3"}}
RESYNC_SECONDS = 4  # operator_process.FAST_FLAGS


def _builds(cluster, ns):
    return {b["metadata"]["name"]: b for b in cluster.items("enginebuilds", ns)}


def _deployment(cluster, ns, service, pool):
    return cluster.get("deployment", f"{service}-{pool}", ns)


def _snapshot(cluster, ns) -> dict:
    kinds = "inferenceservices,enginebuilds,deployments,services,poddisruptionbudgets,jobs"
    items = cluster.get(kinds, namespace=ns)["items"]
    return {(o["kind"], o["metadata"]["name"]): o["metadata"]["resourceVersion"] for o in items}


def test_mixed_fleet_serves_compiled_on_nvidia_and_paged_elsewhere(cluster, ns, operator):
    pools = live_pools(cluster, FLEET)
    writes_before = operator.writes_by_kind()
    # cpu listed: without it CPU pools serve only when no accelerator pool is eligible.
    every_vendor = {"vendors": sorted({p.vendor for p in pools})}
    cluster.apply(
        service_manifest("fleet", replicas=len(pools), pools={p.name: 1 for p in pools}, placement=every_vendor),
        namespace=ns,
    )
    status = wait_for(
        lambda: (s := pool_status(cluster, ns, "fleet")) and len(s) == len(pools) and s,
        timeout=30,
        message="a status entry for every pool",
    )
    compiled = {p.name for p in pools if p.vendor == "nvidia" and p.architecture.startswith("sm")}
    assert compiled, "the fleet has NVIDIA pools with a known architecture"
    for pool in pools:
        expected = "Compiled" if pool.name in compiled else "Paged"
        assert status[pool.name]["engine"] == expected, (pool.name, status[pool.name])
    assert {p.vendor for p in pools if p.name not in compiled} >= {"amd", "intel", "cpu"}

    # One build per NVIDIA architecture; each pool's Deployment rolls to its engine once it is Ready.
    def rolled_out():
        obj = cluster.get("inferenceservice", "fleet", ns)
        return is_true(obj, "RolledOut") and is_true(obj, "Ready") and obj

    obj = wait_for(rolled_out, timeout=90, message="the fleet rolled out and ready")
    builds = _builds(cluster, ns)
    assert len(builds) == len({p.architecture for p in pools if p.name in compiled})
    assert all(b["status"]["state"] == "Ready" for b in builds.values())
    writes_rollout = {kind: n - writes_before.get(kind, 0) for kind, n in operator.writes_by_kind().items()}
    for entry in obj["status"]["pools"]:
        deployment = _deployment(cluster, ns, "fleet", entry["name"])
        if entry["desiredReplicas"] == 0:
            assert deployment is None
            continue
        args = container_args(deployment)
        if entry["name"] in compiled:
            assert serves_engine(deployment, entry["engineBuild"]), args
            # The bridge: before the engine was Ready, the pool served with the paged runtime.
            history = replica_set_args(cluster, ns, deployment["metadata"]["name"])
            assert "--model" in history[0] and "--engine-dir" in history[-1]
        else:
            assert args[:2] == ["serve", "--model"] and "paged" in args
    reasons = {e["reason"] for e in events(cluster, ns, "fleet")}
    assert "BridgingWithPaged" in reasons and "ServingCompiled" in reasons

    # A no-op resync: two more reconciles of the service (resyncs, as nothing else changes) write nothing.
    before, writes = _snapshot(cluster, ns), operator.num_writes()
    operator.wait_for_service_reconciles(2, "two more reconciles of the service", timeout=4 * RESYNC_SECONDS + 10)
    assert _snapshot(cluster, ns) == before
    assert operator.num_writes() - writes == 0
    num_pools = len([e for e in obj["status"]["pools"] if e["desiredReplicas"]])
    print(
        f"[measure] first rollout of 1 service over {num_pools} serving pools "
        f"({len(builds)} builds): {sum(writes_rollout.values()):.0f} API writes "
        f"{ {k: int(v) for k, v in sorted(writes_rollout.items()) if v} }; no-op resync: 0 writes; "
        f"operator peak RSS {operator.peak_rss_mb():.0f} MiB"
    )


def test_a_failed_build_falls_back_to_paged_and_reports_degraded(cluster, ns, operator):
    cluster.apply(
        service_manifest("broken", uri="hf://inferfleet-e2e-fail/tiny", placement=ON_H100, pools={H100: 1}),
        namespace=ns,
    )

    def degraded():
        obj = cluster.get("inferenceservice", "broken", ns)
        return is_true(obj, "Degraded") and obj

    obj = wait_for(degraded, timeout=90, message="Degraded after the build failed")
    assert condition(obj, "Degraded")["reason"] == "BuildFailed"
    entry = pool_status(cluster, ns, "broken")[H100]
    assert (entry["reason"], entry["servingEngine"]) == ("FallbackToPaged", "Paged")
    (build,) = _builds(cluster, ns).values()
    assert build["status"]["state"] == "Failed" and build["status"]["failureReason"]
    jobs = cluster.items("jobs", ns)
    assert len(jobs) == build["spec"]["maxAttempts"], "one Job per attempt, attempts bounded"
    assert "--model" in container_args(_deployment(cluster, ns, "broken", H100))


def test_two_services_with_one_key_share_one_build(cluster, ns, operator):
    for name in ("chat-a", "chat-b"):
        cluster.apply(service_manifest(name, placement=ON_H100, pools={H100: 1}), namespace=ns)
    keys = wait_for(
        lambda: (
            {pool_status(cluster, ns, n).get(H100, {}).get("servingEngineBuild") for n in ("chat-a", "chat-b")} - {None}
        ),
        timeout=60,
        message="both services serving a compiled engine",
    )
    assert len(keys) == 1
    (key,) = keys
    assert list(_builds(cluster, ns)) == [key]
    assert [j["metadata"]["name"] for j in cluster.items("jobs", ns)] == [f"{key}-1"]
    for name in ("chat-a", "chat-b"):
        wait_for(
            lambda name=name: serves_engine(_deployment(cluster, ns, name, H100), key),
            timeout=30,
            message=f"{name} serving the shared engine",
        )


def test_an_envelope_change_builds_anew_while_the_old_engine_serves(cluster, ns, operator):
    manifest = service_manifest("llama", placement=ON_H100, pools={H100: 1})
    cluster.apply(manifest, namespace=ns)
    old = wait_for(
        lambda: pool_status(cluster, ns, "llama").get(H100, {}).get("servingEngineBuild"),
        timeout=60,
        message="the first engine serving",
    )
    manifest["spec"]["engine"] = {"maxContextLength": 8192}
    cluster.apply(manifest, namespace=ns)
    new = wait_for(
        lambda: (k := pool_status(cluster, ns, "llama")[H100].get("servingEngineBuild")) != old and k,
        timeout=60,
        message="the new engine serving",
    )
    wait_for(
        lambda: serves_engine(_deployment(cluster, ns, "llama", H100), new),
        timeout=30,
        message="the Deployment on the new engine",
    )
    history = replica_set_args(cluster, ns, f"llama-{H100}")
    # The engine directory up to its key (/engines/<key>[/<model digest>]).
    engines = [
        "paged" if "--model" in args else "/".join(args[args.index("--engine-dir") + 1].split("/")[:3])
        for args in history
    ]
    # Bridge first, then the old engine, then straight to the new one: never paged in between.
    assert engines == ["paged", f"/engines/{old}", f"/engines/{new}"]
    assert new in _builds(cluster, ns)

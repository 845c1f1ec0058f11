"""Operator replicas with --peering: one is active, the other waits and takes over when the active one
stops; a replica paused for a higher peer stops reconciling, its own requeues included."""

from __future__ import annotations

import time

import pytest
import yaml
from helpers import ROOT, Cluster, wait_for
from operator_process import (
    FAST_FLAGS,
    OperatorProcess,
    drain,
    install,
    service_manifest,
)

from inferfleet_operator.controller.leadership import CHECK_SECONDS

pytestmark = pytest.mark.e2e

PEERING = "inferfleet-e2e"


def _install_peering(cluster: Cluster) -> None:
    """kopf's peering CRDs as the chart renders them, and the cluster-wide peering object."""
    rendered = cluster.helm(
        "template",
        "inferfleet",
        str(ROOT / "charts" / "inferfleet"),
        "--kube-version",
        "1.36.3",
        "--show-only",
        "templates/crds/kopf-peering.yaml",
    ).stdout
    cluster.apply([doc for doc in yaml.safe_load_all(rendered) if doc])
    cluster.kubectl(
        "wait",
        "--for",
        "condition=Established",
        "--timeout=60s",
        "crd/clusterkopfpeerings.kopf.dev",
        "crd/kopfpeerings.kopf.dev",
    )
    cluster.apply({"apiVersion": "kopf.dev/v1", "kind": "ClusterKopfPeering", "metadata": {"name": PEERING}})


@pytest.fixture(scope="module")
def replicas(cluster: Cluster, tmp_path_factory):
    work = tmp_path_factory.mktemp("operator-peering")
    kubeconfig = install(cluster, work)
    _install_peering(cluster)
    leader = OperatorProcess(
        kubeconfig, work / "leader.log", FAST_FLAGS + [f"--peering={PEERING}", "--peering-priority=200"]
    )
    standby = OperatorProcess(
        kubeconfig, work / "standby.log", FAST_FLAGS + [f"--peering={PEERING}", "--peering-priority=100"]
    )
    leader.start()
    standby.start()
    yield leader, standby
    drain(cluster)
    for process in (leader, standby):
        process.stop()


def test_only_the_leader_reconciles_and_the_standby_takes_over(cluster, namespace, replicas):
    leader, standby = replicas
    cluster.apply(service_manifest("solo", placement={"vendors": ["cpu"]}), namespace=namespace)
    wait_for(
        lambda: cluster.get("deployment", "solo-cpu-amd64", namespace),
        timeout=30,
        message="the leader created the Deployment",
    )
    assert leader.service_reconciles() > 0
    assert standby.service_reconciles() == 0, standby.log_tail()

    leader.stop()  # a graceful stop withdraws the leader from the peering object at once
    cluster.kubectl("delete", "deployment", "solo-cpu-amd64", "-n", namespace)
    wait_for(
        lambda: cluster.get("deployment", "solo-cpu-amd64", namespace),
        timeout=60,
        message="the standby restored the Deployment",
    )
    assert standby.service_reconciles() > 0


def test_a_replica_paused_for_a_higher_peer_stops_reconciling_on_its_own(cluster, namespace, replicas, tmp_path):
    # kopf's pause stops the watches; the resync is the work queue's own requeue, inside the process, so the
    # paused replica must stop it itself (leadership.py) instead of reconciling from indexes that no longer move.
    cluster.apply(service_manifest("steady", placement={"vendors": ["cpu"]}), namespace=namespace)
    running = [p for p in replicas if p.process is not None and p.process.poll() is None]
    before = {id(p): p.service_reconciles() for p in running}
    active = wait_for(
        lambda: next((p for p in running if p.service_reconciles() >= before[id(p)] + 2), None),
        timeout=30,
        message="a replica reconciling (two resyncs)",
    )
    usurper = OperatorProcess(
        replicas[0].kubeconfig,
        tmp_path / "usurper.log",
        FAST_FLAGS + [f"--peering={PEERING}", "--peering-priority=300"],
    )
    usurper.start()
    try:
        wait_for(lambda: usurper.service_reconciles() > 0, timeout=60, message="the higher peer reconciling")
        time.sleep(CHECK_SECONDS + 1)  # the paused replica's last reading of the peering object expires
        paused_at = active.service_reconciles()
        usurper.wait_for_service_reconciles(4, "four resyncs of the higher peer", timeout=60)
        assert active.service_reconciles() == paused_at, active.log_tail()
    finally:
        usurper.stop()

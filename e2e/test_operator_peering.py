"""Two operator replicas with --peering: one is active, the other waits and takes over when the
active one stops."""

from __future__ import annotations

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


def _reconciles(process: OperatorProcess) -> float:
    return process.metric("inferfleet_operator_reconciles_total", kind="InferenceService")


def test_only_the_leader_reconciles_and_the_standby_takes_over(cluster, namespace, replicas):
    leader, standby = replicas
    cluster.apply(service_manifest("solo", placement={"vendors": ["cpu"]}), namespace=namespace)
    wait_for(
        lambda: cluster.get("deployment", "solo-cpu-amd64", namespace),
        timeout=30,
        message="the leader created the Deployment",
    )
    assert _reconciles(leader) > 0
    assert _reconciles(standby) == 0, standby.log_tail()

    leader.stop()  # a graceful stop withdraws the leader from the peering object at once
    cluster.kubectl("delete", "deployment", "solo-cpu-amd64", "-n", namespace)
    wait_for(
        lambda: cluster.get("deployment", "solo-cpu-amd64", namespace),
        timeout=60,
        message="the standby restored the Deployment",
    )
    assert _reconciles(standby) > 0

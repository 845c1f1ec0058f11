"""An operator started for a set of namespaces serves those and leaves every other namespace alone."""

from __future__ import annotations

import pytest
from helpers import Cluster, wait_for
from operator_process import FAST_FLAGS, OperatorProcess, install, service_manifest

pytestmark = pytest.mark.e2e


def test_an_operator_for_one_namespace_ignores_the_others(cluster: Cluster, namespace, tmp_path):
    other = cluster.create_namespace(f"{namespace[:50]}-other")
    process = OperatorProcess(
        install(cluster, tmp_path), tmp_path / "operator.log", FAST_FLAGS + [f"--namespace={namespace}"]
    )
    try:
        process.start()
        for ns in (namespace, other):
            cluster.apply(service_manifest("scoped", placement={"vendors": ["cpu"]}), namespace=ns)
        wait_for(
            lambda: cluster.get("deployment", "scoped-cpu-amd64", namespace),
            timeout=30,
            message="the Deployment in the watched namespace",
        )
        # Two more reconciles of the watched service (a resync at least): time enough to have
        # touched the other namespace, had the operator watched it.
        process.wait_for_service_reconciles(2, "two more reconciles in the watched namespace")
        assert cluster.get("deployment", "scoped-cpu-amd64", other) is None
        assert not (cluster.get("inferenceservice", "scoped", other) or {}).get("status")
    finally:
        cluster.kubectl("delete", "inferenceservice", "scoped", "-n", namespace, "--timeout=30s")
        process.stop()
        cluster.delete_namespace(other)

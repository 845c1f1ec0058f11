"""The operator authenticated by a kubeconfig exec plugin with a relative CA path, as on EKS, GKE or AKS."""

from __future__ import annotations

import re

import pytest
from helpers import Cluster, wait_for
from operator_process import OperatorProcess, exec_plugin_kubeconfig, install, service_manifest

pytestmark = pytest.mark.e2e


def test_an_exec_plugin_kubeconfig_authenticates_watches_and_writes(cluster: Cluster, namespace, tmp_path):
    plugin_dir = tmp_path / "kube"
    kubeconfig = exec_plugin_kubeconfig(install(cluster, tmp_path), plugin_dir)
    process = OperatorProcess(kubeconfig, tmp_path / "operator.log")
    # Started from another folder: the plugin command and the CA path resolve against the kubeconfig's.
    try:
        process.start()
        cluster.apply(service_manifest("authed", placement={"vendors": ["cpu"]}), namespace=namespace)
        # The service is seen (kopf's watch) and its Deployment and status written (kube.py): both under
        # the ServiceAccount's RBAC, which grants nothing to system:anonymous.
        wait_for(
            lambda: cluster.get("deployment", "authed-cpu-amd64", namespace),
            timeout=60,
            message="the Deployment written by the operator",
        )
        wait_for(
            lambda: (cluster.get("inferenceservice", "authed", namespace) or {}).get("status"),
            timeout=30,
            message="the service's status",
        )
        num_runs = int((plugin_dir / "plugin-runs").read_text())
        assert num_runs >= 2  # once for the write path, once for kopf's login
        log = process.log_tail(400)
        # A 401 status, not the digits inside a port number (127.0.0.1:35401).
        assert not re.search(r"(?<![:\d])401\b", log) and "Unauthorized" not in log and "system:anonymous" not in log
        print(f"operator peak RSS with the official client's config loader: {process.peak_rss_mb():.1f} MiB")
    finally:
        cluster.kubectl("delete", "inferenceservice", "authed", "-n", namespace, "--timeout=30s", check=False)
        process.stop()

"""The control-plane binaries are the pinned versions, stamped: what build.sh builds is what
pins.env says (unstamped Kubernetes binaries report v0.0.0-master and break version checks)."""

from __future__ import annotations

import subprocess

import pytest

from helpers import CLUSTER_DIR, cluster_bin

pytestmark = pytest.mark.e2e


def pins() -> dict[str, str]:
    lines = (CLUSTER_DIR / "pins.env").read_text().splitlines()
    return dict(line.split("=", 1) for line in lines if line and not line.startswith("#"))


@pytest.mark.parametrize(("binary", "args", "pin"), [
    ("kube-apiserver", ["--version"], "K8S_VERSION"),
    ("kube-controller-manager", ["--version"], "K8S_VERSION"),
    ("kube-scheduler", ["--version"], "K8S_VERSION"),
    ("kubectl", ["version", "--client"], "K8S_VERSION"),
    ("etcd", ["--version"], "ETCD_VERSION"),
    ("kwok", ["--version"], "KWOK_VERSION"),
    ("kwokctl", ["--version"], "KWOK_VERSION"),
    ("helm", ["version"], "HELM_VERSION"),
])
def test_binary_reports_its_pinned_version(binary: str, args: list[str], pin: str):
    output = subprocess.run([str(cluster_bin() / binary), *args], capture_output=True, text=True,
                            check=True, timeout=30).stdout
    want = pins()[pin]
    assert (want.removeprefix("v") if binary == "etcd" else want) in output, output
    assert "v0.0.0" not in output

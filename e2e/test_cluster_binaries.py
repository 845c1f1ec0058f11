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


@pytest.mark.parametrize(
    ("binary", "args", "pin"),
    [
        ("kube-apiserver", ["--version"], "K8S_VERSION"),
        ("kube-controller-manager", ["--version"], "K8S_VERSION"),
        ("kube-scheduler", ["--version"], "K8S_VERSION"),
        ("kubectl", ["version", "--client"], "K8S_VERSION"),
        ("etcd", ["--version"], "ETCD_VERSION"),
        ("kwok", ["--version"], "KWOK_VERSION"),
        ("kwokctl", ["--version"], "KWOK_VERSION"),
        ("helm", ["version"], "HELM_VERSION"),
    ],
)
def test_binary_reports_its_pinned_version(binary: str, args: list[str], pin: str):
    output = subprocess.run(
        [str(cluster_bin() / binary), *args], capture_output=True, text=True, check=True, timeout=30
    ).stdout
    want = pins()[pin]
    assert (want.removeprefix("v") if binary == "etcd" else want) in output, output
    assert "v0.0.0" not in output


def test_helm_has_its_default_kubernetes_version_stamped(tmp_path):
    # helm renders without --kube-version against this default; unstamped it is v1.20.0, which the
    # chart's kubeVersion refuses. build.sh stamps 1.<minor of helm's client-go> and records it.
    chart = tmp_path / "probe"
    (chart / "templates").mkdir(parents=True)
    (chart / "Chart.yaml").write_text("apiVersion: v2\nname: probe\nversion: 0.1.0\n")
    (chart / "templates" / "cm.yaml").write_text(
        'apiVersion: v1\nkind: ConfigMap\nmetadata: {name: probe}\ndata: {kube: "{{ .Capabilities.KubeVersion.Version }}"}\n'
    )
    rendered = subprocess.run(
        [str(cluster_bin() / "helm"), "template", str(chart)], capture_output=True, text=True, check=True, timeout=30
    ).stdout
    stamped = (cluster_bin() / "helm.kube-version").read_text().strip()
    assert f'kube: "{stamped}"' in rendered and stamped != "v1.20.0", rendered

"""The CRDs against a real kube-apiserver (etcd + kube-apiserver from INFERFLEET_CLUSTER_BIN, no nodes): accepted
within the CEL cost budget, defaults applied, bad specs refused naming the field, status round-trips unpruned."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import time
from pathlib import Path

import pytest
import yaml
from crd_cases import CASES
from crd_eval import CRDS
from planning_data import NOW, RUNTIMES, cpu, h100, mi300x

from inferfleet_operator.plan.planner import plan_service

BIN = Path(os.environ.get("INFERFLEET_CLUSTER_BIN", ""))
HAVE_BINARIES = bool(os.environ.get("INFERFLEET_CLUSTER_BIN")) and all(
    (BIN / b).exists() for b in ("etcd", "kube-apiserver", "kubectl")
)
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not HAVE_BINARIES, reason="INFERFLEET_CLUSTER_BIN has no etcd/kube-apiserver/kubectl"),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def kubectl(tmp_path_factory):
    root = tmp_path_factory.mktemp("apiserver")
    subprocess.run(["openssl", "genrsa", "-out", root / "sa.key", "2048"], check=True, capture_output=True)
    subprocess.run(
        ["openssl", "rsa", "-in", root / "sa.key", "-pubout", "-out", root / "sa.pub"], check=True, capture_output=True
    )
    (root / "tokens.csv").write_text("crdtest-token,admin,admin,system:masters\n")
    etcd_port, peer_port, api_port = _free_port(), _free_port(), _free_port()
    logs = [open(root / "etcd.log", "w"), open(root / "apiserver.log", "w")]
    etcd = subprocess.Popen(
        [BIN / "etcd", "--data-dir", root / "etcd", "--listen-client-urls", f"http://127.0.0.1:{etcd_port}",
         "--advertise-client-urls", f"http://127.0.0.1:{etcd_port}", "--listen-peer-urls", f"http://127.0.0.1:{peer_port}"],
        stdout=logs[0], stderr=subprocess.STDOUT,
    )  # fmt: skip
    apiserver = subprocess.Popen(
        [BIN / "kube-apiserver", "--etcd-servers", f"http://127.0.0.1:{etcd_port}", "--secure-port", str(api_port),
         "--bind-address", "127.0.0.1", "--cert-dir", root / "certs", "--token-auth-file", root / "tokens.csv",
         "--authorization-mode", "AlwaysAllow", "--service-account-issuer", "https://kubernetes.default.svc",
         "--service-account-key-file", root / "sa.pub", "--service-account-signing-key-file", root / "sa.key",
         "--service-cluster-ip-range", "10.96.0.0/16"],
        stdout=logs[1], stderr=subprocess.STDOUT,
    )  # fmt: skip
    kubeconfig = root / "kubeconfig"
    kubeconfig.write_text(yaml.safe_dump({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "s", "cluster": {"server": f"https://127.0.0.1:{api_port}", "insecure-skip-tls-verify": True}}],
        "users": [{"name": "u", "user": {"token": "crdtest-token"}}],
        "contexts": [{"name": "c", "context": {"cluster": "s", "user": "u"}}],
    }))  # fmt: skip

    def run(*args, stdin: str | None = None) -> subprocess.CompletedProcess:
        return subprocess.run(
            [BIN / "kubectl", "--kubeconfig", kubeconfig, *args],
            input=stdin,
            capture_output=True,
            text=True,
            timeout=60,
        )

    try:
        deadline = time.monotonic() + 90
        while run("get", "--raw", "/readyz").returncode != 0:
            assert time.monotonic() < deadline, (root / "apiserver.log").read_text()[-2000:]
            time.sleep(1)
        applied = run("apply", "-f", str(CRDS))
        assert applied.returncode == 0, applied.stderr
        assert run("wait", "--for=condition=Established", "crd", "--all", "--timeout=60s").returncode == 0
        yield run
    finally:
        for proc in (apiserver, etcd):
            proc.terminate()
            proc.wait(timeout=30)
        for log in logs:
            log.close()


def _service(**spec) -> str:
    base = {"model": {"name": "llama-3-8b", "uri": "hf://meta-llama/Llama-3-8B"}}
    return json.dumps({"apiVersion": "inferfleet.dev/v1alpha1", "kind": "InferenceService",
                       "metadata": {"name": "llama", "namespace": "default"}, "spec": base | spec})  # fmt: skip


@pytest.mark.parametrize(
    "spec, field, message",
    [
        ({"model": {"name": "m", "uri": "http://x/y"}}, "spec.model.uri", "model.uri must be pvc://CLAIM/PATH"),
        (
            {"engine": {"tensorParallelSize": 2}},
            "spec.engine.tensorParallelSize",
            "must equal resources.gpusPerReplica",
        ),
        (
            {"runtime": {"policy": "Paged", "fallback": "None"}},
            "spec.runtime",
            "has no effect with runtime.policy Paged",
        ),
        ({"engine": {"dtype": "int3"}}, "spec.engine.dtype", "Unsupported value"),
        (
            {"autoscaling": {"minReplicas": 3, "maxReplicas": 2, "targetWaitingRequests": 1}},
            "spec.autoscaling.minReplicas",
            "autoscaling.minReplicas must be at most autoscaling.maxReplicas",
        ),
        (
            {"autoscaling": {"maxReplicas": 2}},
            "spec.autoscaling",
            "autoscaling needs targetWaitingRequests or targetKvCacheUsagePercent",
        ),
        (
            {"autoscaling": {"minReplicas": 0, "maxReplicas": 2, "targetWaitingRequests": 1}},
            "spec.autoscaling.minReplicas",
            "should be greater than or equal to 1",
        ),
        (
            {"autoscaling": {"maxReplicas": 2, "targetKvCacheUsagePercent": 101}},
            "spec.autoscaling.targetKvCacheUsagePercent",
            "less than or equal to 100",
        ),
        (
            {
                "autoscaling": {"maxReplicas": 2, "targetWaitingRequests": 1},
                "pools": [{"name": "cpu-amd64", "replicas": 1}],
            },
            "spec.pools",
            "cannot be combined with autoscaling",
        ),
        ({"routing": {"inferencePool": "Sometimes"}}, "spec.routing.inferencePool", "Unsupported value"),
    ],
)
def test_api_server_refuses_an_invalid_service_naming_the_field(kubectl, spec, field, message):
    result = kubectl("apply", "--dry-run=server", "-f", "-", stdin=_service(**spec))
    assert result.returncode != 0 and field in result.stderr and message in result.stderr, result.stderr


@pytest.mark.parametrize("case", sorted(CASES))
def test_api_server_applies_each_new_rule_to_a_valid_and_an_invalid_object(kubectl, case):
    _, obj, field, message = CASES[case]
    result = kubectl("apply", "--dry-run=server", "-f", "-", stdin=json.dumps(obj))
    if field is None:
        assert result.returncode == 0, result.stderr
    else:
        assert result.returncode != 0 and f"{field}:" in result.stderr and message in result.stderr, result.stderr


def test_api_server_fills_defaults_and_keeps_the_planner_status(kubectl):
    assert kubectl("apply", "-f", "-", stdin=_service()).returncode == 0
    stored = json.loads(kubectl("get", "infsvc", "llama", "-n", "default", "-o", "json").stdout)
    assert stored["spec"]["runtime"] == {"policy": "Auto", "fallback": "Paged", "bridge": True}
    assert stored["spec"]["engine"]["maxContextLength"] == 4096
    status = plan_service(stored, [h100("h1"), mi300x("m1"), cpu("c1")], RUNTIMES, {}, {}, NOW).status
    patched = kubectl(
        "patch",
        "infsvc",
        "llama",
        "-n",
        "default",
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps({"status": status}),
    )
    assert patched.returncode == 0, patched.stderr
    again = json.loads(kubectl("get", "infsvc", "llama", "-n", "default", "-o", "json").stdout)
    assert again["status"] == status  # nothing pruned
    table = kubectl("get", "infsvc", "-n", "default").stdout
    assert table.split()[:4] == ["NAME", "READY", "POOLS", "RUNTIMES"] and "Paged=" in table
    renamed = kubectl("apply", "-f", "-", stdin=_service(model={"name": "other", "uri": "hf://a/b"}))
    assert "model.name is immutable" in renamed.stderr


GAIE_CRD = (
    Path(__file__).resolve().parents[3] / "e2e" / "crds-thirdparty" / "inferencepools.inference.networking.k8s.io.yaml"
)


def test_the_pinned_gaie_crd_admits_the_golden_inference_pools(kubectl):
    assert kubectl("apply", "-f", str(GAIE_CRD)).returncode == 0
    assert (
        kubectl(
            "wait", "--for=condition=Established", "crd/inferencepools.inference.networking.k8s.io", "--timeout=60s"
        ).returncode
        == 0
    )
    golden = sorted((Path(__file__).resolve().parents[1] / "golden" / "routing").glob("*.yaml"))
    assert golden
    for path in golden:
        pool = yaml.safe_load(path.read_text())
        pool["metadata"].pop("ownerReferences")  # the owner does not exist here
        pool["metadata"]["namespace"] = "default"
        result = kubectl("apply", "--dry-run=server", "-f", "-", stdin=json.dumps(pool))
        assert result.returncode == 0, (path.name, result.stderr)


def test_routing_and_autoscaling_status_round_trip_unpruned(kubectl):
    spec = {
        "autoscaling": {"maxReplicas": 4, "targetWaitingRequests": 2},
        "routing": {"endpointPicker": {"name": "epp", "port": 9002}},
    }
    created = kubectl(
        "apply",
        "-f",
        "-",
        stdin=_service(**spec).replace('"name": "llama", "namespace"', '"name": "scaled", "namespace"'),
    )
    assert created.returncode == 0, created.stderr
    stored = json.loads(kubectl("get", "infsvc", "scaled", "-n", "default", "-o", "json").stdout)
    assert stored["spec"]["autoscaling"] == {
        "minReplicas": 1,
        "maxReplicas": 4,
        "targetWaitingRequests": 2,
        "scaleDownStabilizationSeconds": 300,
    }
    assert stored["spec"]["routing"] == {
        "mode": "Router",
        "router": {"replicas": 1, "cpu": "100m", "memory": "512Mi"},
        "inferencePool": "Auto",
        "endpointPicker": {"name": "epp", "port": 9002, "kind": "Service", "group": "", "failureMode": "FailClose"},
    }
    status = {
        "routing": {"mode": "Router", "router": "scaled-router", "routerMessage": "r", "inferencePool": "scaled", "apiVersion": "inference.networking.k8s.io/v1", "reason": "InferencePoolApplied", "message": "m",
                    "pools": ["cpu-amd64", "nvidia-h100"]},
        "autoscaling": {"lastScaleTime": "2026-12-03T12:00:00Z",
                        "pools": [{"name": "cpu-amd64", "currentReplicas": 1, "desiredReplicas": 3, "metric": "inferfleet:num_requests_waiting",
                                   "value": "5", "target": "2", "reason": "ScaledUp"}]},
    }  # fmt: skip
    patched = kubectl(
        "patch",
        "infsvc",
        "scaled",
        "-n",
        "default",
        "--subresource=status",
        "--type=merge",
        "-p",
        json.dumps({"status": status}),
    )
    assert patched.returncode == 0, patched.stderr
    assert json.loads(kubectl("get", "infsvc", "scaled", "-n", "default", "-o", "json").stdout)["status"] == status


def test_the_api_server_admits_the_compile_job_and_the_service_network_policy(kubectl):
    """The pod failure policy and TTL, the prune Job and the NetworkPolicy the operator renders are valid for a
    real API server."""
    from inferfleet_operator.api.types import PlanSettings, parse_service
    from inferfleet_operator.plan import build_jobs
    from inferfleet_operator.plan import network as m

    for path in sorted((Path(__file__).resolve().parents[1] / "golden").glob("job-*.yaml")):  # named by engine key
        name = path.name
        job = yaml.safe_load(path.read_text())
        job["metadata"].pop("ownerReferences")  # the owner does not exist here
        job["metadata"]["namespace"] = "default"
        result = kubectl("apply", "--dry-run=server", "-f", "-", stdin=json.dumps(job))
        assert result.returncode == 0, (name, result.stderr)
        assert job["spec"]["podFailurePolicy"]["rules"][0]["action"] == "Ignore"
    pruner = build_jobs.prune_job_for("default", "0123456789abcdef", "00ff00ff00ff00ff", "runtime:1", PlanSettings())
    result = kubectl("apply", "--dry-run=server", "-f", "-", stdin=json.dumps(pruner))
    assert result.returncode == 0, result.stderr
    settings = PlanSettings(scraper_namespace="inferfleet-system", scraper_labels=(("app.kubernetes.io/name", "x"),))
    gateway = [{"namespace": "gateway", "podLabels": {"app": "envoy"}}]
    for network_policy in ({"allow": gateway}, {"exposure": "Namespace", "allow": gateway}, None):
        service = json.loads(_service(**({"networkPolicy": network_policy} if network_policy else {})))
        policy = m.network_policy_for(parse_service(service), settings)
        result = kubectl("apply", "--dry-run=server", "-f", "-", stdin=json.dumps(policy))
        assert result.returncode == 0, (network_policy, result.stderr)
    broken = m.network_policy_for(
        parse_service(json.loads(_service(networkPolicy={"allow": [{"podLabels": {"bad key!": "v"}}]}))), settings
    )
    refused = kubectl("apply", "--dry-run=server", "-f", "-", stdin=json.dumps(broken))
    assert refused.returncode != 0 and "bad key!" in refused.stderr  # reported as ApplyFailed on the service

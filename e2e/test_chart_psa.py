"""Pod Security Admission `restricted`: a namespace enforcing it admits the chart's operator pod (KWOK runs
it) and the serving and compile pods the operator renders (planner output applied in that namespace).
Admission is checked, not readiness: no image is ever pulled here."""

from __future__ import annotations

import copy
import json
import uuid
from datetime import UTC, datetime

import pytest
import yaml
from helpers import ROOT, Cluster, wait_for

from inferfleet_operator.plan.builds import plan_build
from inferfleet_operator.plan.planner import plan_service

pytestmark = pytest.mark.e2e

CHART = ROOT / "charts" / "inferfleet"
SUFFIX = uuid.uuid4().hex[:5]
RESTRICTED = {
    "pod-security.kubernetes.io/enforce": "restricted",
    "pod-security.kubernetes.io/enforce-version": "latest",
}
NOW = datetime(2026, 1, 1, tzinfo=UTC)


@pytest.fixture(scope="module")
def restricted(cluster: Cluster):
    namespace = cluster.create_namespace(f"e2e-chart-psa-{SUFFIX}", labels=RESTRICTED)
    yield namespace
    cluster.delete_namespace(namespace)


def _rendered_runtimes(cluster: Cluster) -> list[dict]:
    """The chart's default InferenceRuntime objects, as `helm template` renders them for this cluster."""
    version = json.loads(cluster.kubectl("version", "-o", "json").stdout)["serverVersion"]["gitVersion"]
    out = cluster.helm(
        "template",
        "psa",
        str(CHART),
        "--kube-version",
        version,
        "--api-versions",
        "inferfleet.dev/v1alpha1/InferenceRuntime",
        "--show-only",
        "templates/runtimes/inferenceruntimes.yaml",
    ).stdout
    return [doc for doc in yaml.safe_load_all(out) if doc]


def _admission_errors(cluster: Cluster, namespace: str, pod_spec: dict, name: str) -> str:
    """What the API server says to a Pod with this spec (server-side dry run: admission runs, nothing is stored)."""
    pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "namespace": namespace}, "spec": pod_spec}
    result = cluster.kubectl("create", "--dry-run=server", "-f", "-", check=False, input=json.dumps(pod))
    return "" if result.returncode == 0 else result.stderr


def test_restricted_namespace_refuses_a_privileged_pod(cluster: Cluster, restricted):
    # The control: without this refusal the admissions below would prove nothing.
    spec = {"containers": [{"name": "c", "image": "registry.invalid/x", "securityContext": {"privileged": True}}]}
    assert "violates PodSecurity" in _admission_errors(cluster, restricted, spec, "privileged")


def test_operator_pod_is_admitted_and_runs(cluster: Cluster, restricted):
    release = f"psa-{SUFFIX}"
    try:
        cluster.helm(
            "install",
            release,
            str(CHART),
            "--namespace",
            restricted,
            "--set",
            "crds.enabled=false",
            "--set",
            "runtimes.create=false",
            "--set",
            "engineCache.create=false",
        )

        def running() -> list[dict]:
            pods = cluster.items("pods", restricted, selector=f"app.kubernetes.io/instance={release}")
            return [p for p in pods if p["status"].get("phase") == "Running"]

        pod = wait_for(running, timeout=60, message="the operator pod admitted and running")[0]
        assert pod["spec"]["containers"][0]["securityContext"]["capabilities"] == {"drop": ["ALL"]}
        events = cluster.items("events", restricted, selector=None)
        assert not [e for e in events if e.get("reason") == "FailedCreate"], "a pod was refused"
    finally:
        cluster.helm("uninstall", release, "--namespace", restricted, check=False)


def _plans(cluster: Cluster, namespace: str):
    """Serving Deployments for every pool of the e2e fleet (paged, and compiled once builds are Ready) and
    the compile Jobs, from the planner with the chart's default runtimes."""
    service = {
        "apiVersion": "inferfleet.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": "psa", "namespace": namespace, "uid": str(uuid.uuid4()), "generation": 1},
        "spec": {"model": {"name": "demo", "uri": "hf://inferfleet/demo"}, "replicas": 6},
    }
    nodes = cluster.items("nodes", selector="inferfleet.dev/e2e-fleet=true")
    runtimes = _rendered_runtimes(cluster)
    building = plan_service(service, nodes, runtimes, {}, {}, NOW)
    assert building.engine_builds, "the fleet has NVIDIA pools: the plan must build compiled engines"
    ready = {build["metadata"]["name"]: {**build, "status": {"state": "Ready"}} for build in building.engine_builds}
    compiled = plan_service(service, nodes, runtimes, ready, {}, NOW)
    bridging = [child for child in building.children if child["kind"] == "Deployment"]
    serving = [child for child in compiled.children if child["kind"] == "Deployment"]
    jobs = [plan_build(build, [], NOW).job for build in building.engine_builds]
    return bridging, serving, [job for job in jobs if job]


def _engine(deployment: dict) -> str:
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    return args[args.index("--engine") + 1]


@pytest.mark.slow
def test_serving_and_compile_pods_the_operator_renders_are_admitted(cluster: Cluster, restricted):
    bridging, serving, jobs = _plans(cluster, restricted)
    engines = {_engine(d) for d in serving}
    assert engines == {"paged", "compiled"}, f"expected paged and compiled serving pods, got {engines}"
    assert jobs, "expected compile Jobs"

    def pod_spec(obj: dict) -> dict:
        return copy.deepcopy(obj)["spec"]["template"]["spec"]

    refusals = {}
    for index, obj in enumerate([*bridging, *serving, *jobs]):
        errors = _admission_errors(cluster, restricted, pod_spec(obj), f"dry-run-{index}")
        if errors:
            refusals[f"{obj['kind']} {obj['metadata']['name']}"] = errors
    assert refusals == {}

    # And for real: the Deployments' ReplicaSets create their pods in the restricted namespace.
    for deployment in serving:
        applied = copy.deepcopy(deployment)
        applied["metadata"].pop("ownerReferences", None)  # the InferenceService here is not a stored object
        applied["spec"]["replicas"] = 1
        applied["spec"]["template"]["spec"] = pod_spec(deployment)
        cluster.apply(applied)
    expected = len(serving)
    wait_for(
        lambda: len(cluster.items("pods", restricted, selector="inferfleet.dev/service=psa")) == expected,
        timeout=60,
        message=f"{expected} serving pods created",
    )

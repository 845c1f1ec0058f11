"""The Helm chart in the local cluster: install, upgrade with changed values, a bad value refused by the
schema, the ServiceAccount's permissions (`kubectl auth can-i` and SubjectAccessReviews), a namespaced
install, and uninstall with the CRDs kept or deleted.

The tests of this module run in order on one release (install first, uninstall last).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import urllib.request
import uuid

import pytest
from helpers import ROOT, Cluster, KubectlError, wait_for

from inferfleet_operator.plan.permissions import PERMISSIONS

pytestmark = pytest.mark.e2e

CHART = ROOT / "charts" / "inferfleet"
CRDS = ("inferenceservices.inferfleet.dev", "inferenceruntimes.inferfleet.dev", "enginebuilds.inferfleet.dev")
RUNTIMES = {"paged-cuda", "paged-rocm", "paged-xpu", "paged-cpu", "compiled-tensorrt"}
SUFFIX = uuid.uuid4().hex[:5]
RELEASE = f"chart-{SUFFIX}"
FULLNAME = f"{RELEASE}-inferfleet"


def helm(cluster: Cluster, *args: str, values: dict | None = None, check: bool = True):
    """helm with values given as Python objects (one --set-json per top-level key)."""
    sets = [a for key, value in (values or {}).items() for a in ("--set-json", f"{key}={json.dumps(value)}")]
    return cluster.helm(*args, *sets, check=check)


def install(cluster: Cluster, release: str, namespace: str, values: dict | None = None, check: bool = True):
    # --take-ownership: the CRDs may already be in the cluster (kubectl apply -f crds/ by other tests);
    # the release adopts them rather than refusing to install.
    return helm(
        cluster,
        "install",
        release,
        str(CHART),
        "--namespace",
        namespace,
        "--take-ownership",
        values=values,
        check=check,
    )


def crds_present(cluster: Cluster) -> dict[str, bool]:
    return {name: cluster.get("customresourcedefinition", name) is not None for name in CRDS}


def running_pods(cluster: Cluster, namespace: str, release: str) -> list[dict]:
    pods = cluster.items("pods", namespace, selector=f"app.kubernetes.io/instance={release}")
    return [p for p in pods if p["status"].get("phase") == "Running" and not p["metadata"].get("deletionTimestamp")]


def own_runtimes(cluster: Cluster, release: str) -> dict[str, dict]:
    return {
        r["metadata"]["name"]: r
        for r in cluster.items("inferenceruntimes", selector=f"app.kubernetes.io/instance={release}")
    }


@pytest.fixture(scope="module")
def state(cluster: Cluster):
    """The release's namespace, and whether the CRDs were in the cluster before this module."""
    namespace = cluster.create_namespace(f"e2e-chart-{SUFFIX}")
    info = {
        "namespace": namespace,
        "crds_were_present": any(crds_present(cluster).values()),
        "runtimes_served": cluster.get("customresourcedefinition", CRDS[1]) is not None,
    }
    yield info
    helm(cluster, "uninstall", RELEASE, "--namespace", namespace, "--ignore-not-found", check=False)
    cluster.delete_namespace(namespace)


def test_install_runs_the_operator_with_crds_and_default_runtimes(cluster: Cluster, state):
    namespace = state["namespace"]
    result = install(cluster, RELEASE, namespace)
    assert f"kubectl -n {namespace} get deployment {FULLNAME}" in result.stdout  # NOTES

    pods = wait_for(lambda: running_pods(cluster, namespace, RELEASE), timeout=60, message="the operator pod running")
    pod = pods[0]["spec"]
    assert pod["serviceAccountName"] == FULLNAME
    assert pod["containers"][0]["securityContext"]["readOnlyRootFilesystem"] is True
    assert all(crds_present(cluster).values())
    for name in CRDS:
        annotations = cluster.get("customresourcedefinition", name)["metadata"]["annotations"]
        assert annotations["helm.sh/resource-policy"] == "keep"
    runtimes = own_runtimes(cluster, RELEASE)
    if state["runtimes_served"]:
        assert set(runtimes) == RUNTIMES
    else:
        # Helm cannot create objects of a CRD in the operation that creates it: the notes say what to run.
        assert runtimes == {}
        assert "NOT CREATED YET: the default InferenceRuntimes" in result.stdout
        assert f"helm upgrade {RELEASE} <this chart> --namespace {namespace} --reuse-values" in result.stdout
    claim = cluster.get("persistentvolumeclaim", f"{FULLNAME}-engine-cache", namespace)
    assert claim["spec"]["accessModes"] == ["ReadWriteMany"]


def test_install_with_a_bad_value_fails_with_the_schema_message(cluster: Cluster, state):
    namespace = state["namespace"]
    result = install(cluster, f"bad-{SUFFIX}", namespace, values={"replicaCount": "two"}, check=False)
    assert result.returncode != 0
    assert "at '/replicaCount': got string, want integer" in result.stderr
    assert cluster.get("deployment", f"bad-{SUFFIX}-inferfleet", namespace) is None
    typo = install(cluster, f"bad-{SUFFIX}", namespace, values={"engineCache": {"sise": "1Gi"}}, check=False)
    assert typo.returncode != 0 and "additional properties 'sise' not allowed" in typo.stderr
    releases = json.loads(cluster.helm("list", "--namespace", namespace, "--all", "-o", "json").stdout)
    assert [r["name"] for r in releases] == [RELEASE]


@pytest.mark.slow
def test_upgrade_with_changed_values_rolls_the_operator_and_recreates_runtimes(cluster: Cluster, state):
    namespace = state["namespace"]
    # --take-ownership: kopf's peering CRDs may be left, kept, by an earlier release.
    helm(
        cluster,
        "upgrade",
        RELEASE,
        str(CHART),
        "--namespace",
        namespace,
        "--reuse-values",
        "--take-ownership",
        values={"replicaCount": 2, "metricsPort": 9191, "runtimes": {"tag": "9.9.9"}},
    )

    deployment = cluster.get("deployment", FULLNAME, namespace)
    assert deployment["spec"]["replicas"] == 2
    args = deployment["spec"]["template"]["spec"]["containers"][0]["args"]
    assert f"--peering={FULLNAME}" in args and "--metrics-port=9191" in args
    assert cluster.get("clusterkopfpeering", FULLNAME) is not None
    service = cluster.get("service", f"{FULLNAME}-metrics", namespace)
    assert service["spec"]["ports"][0]["targetPort"] == "metrics"
    wait_for(lambda: len(running_pods(cluster, namespace, RELEASE)) == 2, timeout=60, message="two operator pods")
    runtimes = own_runtimes(cluster, RELEASE)
    assert set(runtimes) == RUNTIMES
    assert runtimes["paged-cuda"]["spec"]["image"] == "inferfleet/runtime-cuda:9.9.9"
    assert runtimes["compiled-tensorrt"]["spec"]["compileImage"] == "inferfleet/runtime-tensorrt:9.9.9"

    refused = helm(
        cluster,
        "upgrade",
        RELEASE,
        str(CHART),
        "--namespace",
        namespace,
        "--reuse-values",
        values={"image": {"pullPolicy": "Sometimes"}},
        check=False,
    )
    assert refused.returncode != 0 and "/image/pullPolicy" in refused.stderr
    status = json.loads(cluster.helm("status", RELEASE, "--namespace", namespace, "-o", "json").stdout)
    assert status["version"] == 2 and status["info"]["status"] == "deployed"


# ------------------------------------------------------------------ what the ServiceAccount may do


def _subject(namespace: str, service_account: str) -> dict:
    return {
        "user": f"system:serviceaccount:{namespace}:{service_account}",
        "groups": ["system:serviceaccounts", f"system:serviceaccounts:{namespace}", "system:authenticated"],
    }


def access_reviews(cluster: Cluster, subject: dict, attributes: list[dict]) -> list[bool]:
    """One SubjectAccessReview per attribute set (what `kubectl auth can-i --as` asks), in one kubectl call."""
    reviews = [
        {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": {**subject, "resourceAttributes": attrs},
        }
        for attrs in attributes
    ]
    listing = {"apiVersion": "v1", "kind": "List", "items": reviews}
    text = cluster.kubectl("create", "-o", "json", "-f", "-", input=json.dumps(listing)).stdout
    items, decoder, offset = [], json.JSONDecoder(), 0
    while text[offset:].strip():  # kubectl prints one JSON document per review
        item, offset = decoder.raw_decode(text, offset + len(text[offset:]) - len(text[offset:].lstrip()))
        items.append(item)
    assert len(items) == len(reviews)
    return [bool(item["status"].get("allowed")) for item in items]


def _attributes(group: str, resource: str, verb: str, namespace: str | None) -> dict:
    base, _, subresource = resource.partition("/")
    attrs = {"group": group, "resource": base, "verb": verb}
    if subresource:
        attrs["subresource"] = subresource
    if namespace:
        attrs["namespace"] = namespace
    return attrs


CLUSTER_SCOPED = {"nodes", "namespaces", "inferenceruntimes", "customresourcedefinitions", "clusterkopfpeerings"}

# Kinds the operator does not manage, and verbs it never uses on the kinds it reads.
FORBIDDEN = [
    ("", "secrets", "get"),
    ("", "secrets", "list"),
    ("", "secrets", "watch"),
    ("", "configmaps", "get"),
    ("", "serviceaccounts", "create"),
    ("", "serviceaccounts/token", "create"),
    ("", "pods", "create"),
    ("", "pods/exec", "create"),
    ("", "pods", "delete"),
    ("", "nodes", "patch"),
    ("", "nodes", "delete"),
    ("", "namespaces", "delete"),
    ("", "persistentvolumeclaims", "create"),
    ("", "persistentvolumes", "create"),
    ("inferfleet.dev", "inferenceruntimes", "create"),
    ("inferfleet.dev", "inferenceruntimes", "delete"),
    ("inferfleet.dev", "inferenceservices", "delete"),
    ("apps", "daemonsets", "create"),
    ("apps", "statefulsets", "create"),
    ("rbac.authorization.k8s.io", "clusterroles", "create"),
    ("rbac.authorization.k8s.io", "rolebindings", "create"),
    ("rbac.authorization.k8s.io", "clusterroles", "escalate"),
    ("apiextensions.k8s.io", "customresourcedefinitions", "create"),
    ("apiextensions.k8s.io", "customresourcedefinitions", "delete"),
    ("admissionregistration.k8s.io", "validatingwebhookconfigurations", "create"),
    ("", "users", "impersonate"),
    ("", "serviceaccounts", "impersonate"),
]


def test_service_account_may_do_exactly_what_permissions_lists(cluster: Cluster, state):
    namespace = state["namespace"]
    subject = _subject(namespace, FULLNAME)
    allowed = [
        (group, resource, verb)
        for rule in PERMISSIONS
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    ]
    attributes = [_attributes(g, r, v, None if r.split("/")[0] in CLUSTER_SCOPED else "default") for g, r, v in allowed]
    attributes += [
        _attributes(g, r, v, None if r.split("/")[0] in CLUSTER_SCOPED else "default") for g, r, v in FORBIDDEN
    ]
    answers = access_reviews(cluster, subject, attributes)
    granted = dict(zip([*allowed, *FORBIDDEN], answers))
    assert [k for k in allowed if not granted[k]] == [], "PERMISSIONS entries the ServiceAccount lacks"
    assert [k for k in FORBIDDEN if granted[k]] == [], "the ServiceAccount may do more than it needs"


def test_kubectl_auth_can_i_as_the_operator(cluster: Cluster, state):
    namespace = state["namespace"]
    who = f"--as=system:serviceaccount:{namespace}:{FULLNAME}"

    def can_i(*args: str) -> str:
        return cluster.kubectl("auth", "can-i", who, *args, check=False).stdout.strip()

    assert can_i("list", "inferenceservices.inferfleet.dev", "--all-namespaces") == "yes"
    assert can_i("patch", "inferenceservices.inferfleet.dev", "--subresource=status", "-n", "default") == "yes"
    assert can_i("create", "deployments.apps", "-n", "default") == "yes"
    assert can_i("watch", "nodes") == "yes"
    assert can_i("get", "secrets", "-n", namespace) == "no"
    assert can_i("list", "secrets", "--all-namespaces") == "no"
    assert can_i("create", "inferenceruntimes.inferfleet.dev") == "no"
    assert can_i("create", "pods", "-n", "default") == "no"
    assert can_i("create", "clusterrolebindings.rbac.authorization.k8s.io") == "no"


def test_namespaced_install_grants_only_the_watched_namespaces(cluster: Cluster, state):
    release = f"scoped-{SUFFIX}"
    watched = cluster.create_namespace(f"e2e-chart-watched-{SUFFIX}")
    other = cluster.create_namespace(f"e2e-chart-other-{SUFFIX}")
    try:
        install(
            cluster,
            release,
            state["namespace"],
            values={
                "watchNamespaces": [watched],
                "crds": {"enabled": False},
                "runtimes": {"create": False},
                "engineCache": {"create": False},
                "podDisruptionBudget": {"enabled": False},
                "metrics": {"service": {"enabled": False}},
            },
        )
        account = f"{release}-inferfleet"
        args = cluster.get("deployment", account, state["namespace"])["spec"]["template"]["spec"]["containers"][0][
            "args"
        ]
        assert f"--namespace={watched}" in args and "--all-namespaces" not in args

        # Every rule sits where its kind's scope puts it, by the API server's own account of scopes.
        namespaced = set(cluster.kubectl("api-resources", "--namespaced=true", "-o", "name").stdout.split())
        role = cluster.get("role", account, watched)
        for rule in role["rules"]:
            for resource in rule["resources"]:
                base = resource.split("/")[0]
                name = base if not rule["apiGroups"][0] else f"{base}.{rule['apiGroups'][0]}"
                if rule["apiGroups"][0] != "kopf.dev":  # kopf's CRDs are installed only for leader election
                    assert name in namespaced, f"{name} in a Role but not namespaced"
        cluster_role = cluster.get("clusterrole", account)
        assert all(r.split("/")[0] in CLUSTER_SCOPED for rule in cluster_role["rules"] for r in rule["resources"])

        subject = _subject(state["namespace"], account)
        checks = [
            ("apps", "deployments", "create", watched),
            ("apps", "deployments", "create", other),
            ("inferfleet.dev", "inferenceservices", "watch", watched),
            ("inferfleet.dev", "inferenceservices", "watch", other),
            ("", "nodes", "list", None),
            ("", "secrets", "get", watched),
        ]
        answers = access_reviews(cluster, subject, [_attributes(g, r, v, n) for g, r, v, n in checks])
        assert answers == [True, False, True, False, True, False]
    finally:
        helm(cluster, "uninstall", release, "--namespace", state["namespace"], check=False)
        cluster.delete_namespace(watched)
        cluster.delete_namespace(other)


# ------------------------------------------------------------------ the operator under the chart's account


def _free_ports(count: int) -> list[int]:
    sockets = [socket.socket() for _ in range(count)]
    for sock in sockets:
        sock.bind(("127.0.0.1", 0))
    ports = [sock.getsockname()[1] for sock in sockets]
    for sock in sockets:
        sock.close()
    return ports


@pytest.mark.slow
def test_operator_with_the_chart_service_account_reconciles_a_service(cluster: Cluster, state, tmp_path):
    """The real operator process, authenticated only by the chart ServiceAccount's token: RBAC is real."""
    workload = cluster.create_namespace(f"e2e-chart-workload-{SUFFIX}")
    config = cluster.token_kubeconfig(FULLNAME, state["namespace"], tmp_path / "operator.kubeconfig")
    health, metrics = _free_ports(2)
    log_path = tmp_path / "operator.log"
    with log_path.open("w") as log:
        operator = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "inferfleet_operator.controller.main",
                f"--namespace={workload}",
                f"--health-port={health}",
                f"--metrics-port={metrics}",
                f"--engine-cache-claim={FULLNAME}-engine-cache",
                "--resync-seconds=5",
            ],
            env={**os.environ, "KUBECONFIG": str(config)},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        cluster.apply(
            {
                "apiVersion": "inferfleet.dev/v1alpha1",
                "kind": "InferenceService",
                "metadata": {"name": "demo", "namespace": workload},
                "spec": {
                    "model": {"name": "demo", "uri": "hf://inferfleet/demo"},
                    "replicas": 1,
                    "placement": {"vendors": ["cpu"]},
                },
            }
        )
        deployments = wait_for(
            lambda: cluster.items("deployments", workload, selector="inferfleet.dev/service=demo"),
            timeout=90,
            message="the operator's serving Deployment",
        )
        assert deployments[0]["spec"]["template"]["spec"]["containers"][0]["image"].startswith(
            "inferfleet/runtime-cpu:"
        )
        wait_for(
            lambda: (cluster.get("inferenceservice", "demo", workload).get("status") or {}).get("conditions"),
            timeout=60,
            message="the service's status conditions",
        )
        assert operator.poll() is None, "the operator exited"
        # The endpoint the chart's probes call, on the port the chart passes with --health-port.
        with urllib.request.urlopen(f"http://127.0.0.1:{health}/healthz", timeout=5) as response:
            assert response.status == 200
        cluster.kubectl("delete", "inferenceservice", "demo", "-n", workload, "--timeout=60s")
    finally:
        operator.terminate()
        try:
            operator.wait(timeout=15)
        except subprocess.TimeoutExpired:
            operator.kill()
        cluster.delete_namespace(workload)
    text = log_path.read_text()
    assert "Forbidden" not in text and " 403" not in text, text[-3000:]


# ------------------------------------------------------------------ uninstall


def test_uninstall_removes_the_release_and_keeps_the_crds(cluster: Cluster, state):
    namespace = state["namespace"]
    helm(cluster, "uninstall", RELEASE, "--namespace", namespace, "--wait", "--timeout", "60s")
    assert cluster.get("deployment", FULLNAME, namespace) is None
    assert cluster.get("serviceaccount", FULLNAME, namespace) is None
    assert cluster.get("clusterrole", FULLNAME) is None
    assert cluster.get("clusterrolebinding", FULLNAME) is None
    assert all(crds_present(cluster).values()), "crds.keep=true must leave the CRDs"
    assert cluster.get("customresourcedefinition", "clusterkopfpeerings.kopf.dev") is not None
    # The runtimes and the peering object belong to the release: they go with it.
    wait_for(lambda: own_runtimes(cluster, RELEASE) == {}, timeout=30, message="the default runtimes deleted")
    assert cluster.get("clusterkopfpeering", FULLNAME) is None


@pytest.mark.slow
def test_uninstall_without_keep_deletes_the_crds(cluster: Cluster, state):
    if state["crds_were_present"]:
        pytest.skip("the CRDs were in the cluster before these tests; deleting them would break their other users")
    namespace = state["namespace"]
    release = f"nokeep-{SUFFIX}"
    # Installed with the CRDs kept (it adopts the ones the first release left), then switched off by an
    # upgrade, as a user would: the upgrade removes the keep annotation.
    install(cluster, release, namespace, values={"engineCache": {"create": False}})
    helm(
        cluster,
        "upgrade",
        release,
        str(CHART),
        "--namespace",
        namespace,
        "--reuse-values",
        values={"crds": {"keep": False}},
    )
    for name in CRDS:
        annotations = cluster.get("customresourcedefinition", name)["metadata"].get("annotations") or {}
        assert "helm.sh/resource-policy" not in annotations
    helm(cluster, "uninstall", release, "--namespace", namespace, "--wait", "--timeout", "60s")
    wait_for(lambda: not any(crds_present(cluster).values()), timeout=60, message="the CRDs deleted")
    with pytest.raises(KubectlError):
        cluster.kubectl("get", "inferenceruntimes")

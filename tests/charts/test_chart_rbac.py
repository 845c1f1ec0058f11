"""The chart's RBAC grants exactly inferfleet_operator.plan.permissions.PERMISSIONS, cluster-wide or per namespace."""

from __future__ import annotations

from pathlib import Path

import yaml

from inferfleet_operator.plan.permissions import PERMISSIONS, ROUTING_PERMISSIONS

CHART = Path(__file__).resolve().parents[2] / "charts" / "inferfleet"
NAMESPACE = "inferfleet-system"
SYNC = "python charts/inferfleet/hack/sync_files.py"
# Cluster-scoped kinds among those PERMISSIONS names (their rules can only live in a ClusterRole).
CLUSTER_SCOPED = {"nodes", "namespaces", "inferenceruntimes", "customresourcedefinitions", "clusterkopfpeerings"}


def _grants(rules: list[dict]) -> set[tuple[str, str, str]]:
    """(apiGroup, resource, verb) triples: the comparison ignores how rules are grouped."""
    return {
        (group, resource, verb)
        for rule in rules
        for group in rule["apiGroups"]
        for resource in rule["resources"]
        for verb in rule["verbs"]
    }


def test_chart_copy_of_permissions_is_current():
    copy = yaml.safe_load((CHART / "files" / "rbac" / "permissions.yaml").read_text())
    assert copy == PERMISSIONS, f"charts/inferfleet/files/rbac/permissions.yaml is stale: run {SYNC}"


def test_cluster_role_is_exactly_the_operator_permissions(render, one, of_kind):
    objects = render()
    assert one(objects, "ClusterRole")["rules"] == PERMISSIONS
    assert not of_kind(objects, "Role") and not of_kind(objects, "RoleBinding")
    binding = one(objects, "ClusterRoleBinding")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": one(objects, "ClusterRole")["metadata"]["name"],
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "namespace": NAMESPACE, "name": one(objects, "ServiceAccount")["metadata"]["name"]}
    ]


def test_leader_election_adds_no_permissions(render, one):
    assert one(render({"replicaCount": 3}), "ClusterRole")["rules"] == PERMISSIONS


def test_watched_namespaces_get_roles_and_only_cluster_kinds_stay_cluster_wide(render, one, of_kind):
    watched = ["team-a", "team-b"]
    objects = render({"watchNamespaces": watched})
    cluster_grants = _grants(one(objects, "ClusterRole")["rules"])
    assert {resource for _, resource, _ in cluster_grants} <= CLUSTER_SCOPED
    roles = of_kind(objects, "Role")
    assert sorted(role["metadata"]["namespace"] for role in roles) == watched
    # A namespaced operator elects its leader through KopfPeerings in the watched namespaces.
    clusterwide_only = {g for g in _grants(PERMISSIONS) if g[1] == "clusterkopfpeerings"}
    for role in roles:
        role_grants = _grants(role["rules"])
        assert not {resource.split("/")[0] for _, resource, _ in role_grants} & CLUSTER_SCOPED
        assert role_grants | cluster_grants == _grants(PERMISSIONS) - clusterwide_only
        assert not role_grants & cluster_grants
    bindings = of_kind(objects, "RoleBinding")
    assert sorted(b["metadata"]["namespace"] for b in bindings) == watched
    for binding in bindings:
        assert binding["roleRef"]["kind"] == "Role"
        assert binding["subjects"][0]["namespace"] == NAMESPACE


def test_a_namespaced_operator_may_write_nothing_outside_its_namespaces(render, one, of_kind):
    for values in ({"watchNamespaces": ["team-a"]}, {"watchNamespaces": ["team-a"], "replicaCount": 2}):
        objects = render(values)
        verbs = {verb for _, _, verb in _grants(one(objects, "ClusterRole")["rules"])}
        assert verbs <= {"get", "list", "watch"}, verbs
        writers = [
            r
            for r in of_kind(objects, "Role")
            if {"create", "patch", "delete"} & {verb for _, _, verb in _grants(r["rules"])}
        ]
        assert [r["metadata"]["namespace"] for r in writers] == ["team-a"]


def test_no_rule_reaches_secrets_or_uses_wildcards(render, of_kind):
    for values in ({}, {"watchNamespaces": ["team-a"]}, {"replicaCount": 2}):
        objects = render(values)
        for role in of_kind(objects, "ClusterRole") + of_kind(objects, "Role"):
            for group, resource, verb in _grants(role["rules"]):
                assert resource.split("/")[0] not in {"secrets", "configmaps", "serviceaccounts"}, resource
                assert "*" not in (group, resource, verb)
                assert verb not in {"escalate", "bind", "impersonate"}


def test_rbac_can_be_left_to_the_platform(render, of_kind):
    objects = render({"rbac": {"create": False}})
    for kind in ("ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"):
        assert not of_kind(objects, kind), kind


def test_inference_pools_are_absent_from_rbac_unless_routing_turns_them_on(render, one, of_kind):
    off = render({"routing": {"inferencePools": False}})
    assert "inferencepools" not in str(one(off, "ClusterRole")["rules"])
    assert "--inference-pools=disabled" in one(off, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    on = render({"routing": {"inferencePools": True}})
    assert one(on, "ClusterRole")["rules"] == PERMISSIONS + ROUTING_PERMISSIONS
    assert (
        "--inference-pools=disabled" not in one(on, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    )
    namespaced = render({"routing": {"inferencePools": True}, "watchNamespaces": ["team-a"]})
    (role,) = of_kind(namespaced, "Role")
    assert ("inference.networking.k8s.io", "inferencepools", "patch") in _grants(role["rules"])


def test_chart_copy_of_routing_permissions_is_current():
    copy = yaml.safe_load((CHART / "files" / "rbac" / "routing-permissions.yaml").read_text())
    assert copy == ROUTING_PERMISSIONS, f"charts/inferfleet/files/rbac/routing-permissions.yaml is stale: run {SYNC}"


def test_inference_pools_on_auto_follow_whether_the_cluster_serves_the_crd(render, one):
    assert "inferencepools" not in str(one(render(), "ClusterRole")["rules"]), "auto without the CRD: off"
    objects = render(also_served=("inference.networking.k8s.io/v1/InferencePool",))
    assert one(objects, "ClusterRole")["rules"] == PERMISSIONS + ROUTING_PERMISSIONS
    assert (
        "--inference-pools=disabled"
        not in one(objects, "Deployment")["spec"]["template"]["spec"]["containers"][0]["args"]
    )

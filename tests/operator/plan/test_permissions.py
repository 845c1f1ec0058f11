"""PERMISSIONS: well-formed RBAC rules that cover what the planners emit, and nothing broader than named verbs."""

from __future__ import annotations

from planning_data import NOW, RUNTIMES, h100, service

from inferfleet_operator.plan.builds import plan_build
from inferfleet_operator.plan.permissions import PERMISSIONS
from inferfleet_operator.plan.planner import plan_service

VERBS = {"get", "list", "watch", "create", "update", "patch", "delete", "deletecollection"}
PLURALS = {"Deployment": ("apps", "deployments"), "Service": ("", "services"), "PodDisruptionBudget": ("policy", "poddisruptionbudgets"),
           "EngineBuild": ("inferfleet.dev", "enginebuilds"), "Job": ("batch", "jobs"),
           "NetworkPolicy": ("networking.k8s.io", "networkpolicies")}  # fmt: skip


def verbs_for(group: str, resource: str) -> set[str]:
    return {v for r in PERMISSIONS if group in r["apiGroups"] and resource in r["resources"] for v in r["verbs"]}


def test_rules_are_well_formed_and_name_every_verb():
    for r in PERMISSIONS:
        assert set(r) == {"apiGroups", "resources", "verbs"}
        assert "*" not in r["verbs"] + r["resources"] + r["apiGroups"]
        assert set(r["verbs"]) <= VERBS and r["verbs"]


def test_every_kind_the_planners_apply_can_be_server_side_applied_and_deleted():
    p = plan_service(service(), [h100("h1")], RUNTIMES, {}, {}, NOW)
    build = p.engine_builds[0] | {"status": {}}
    build["metadata"]["uid"] = "u"
    objects = p.children + p.engine_builds + [plan_build(build, [], NOW).job]
    for obj in objects:
        group, resource = PLURALS[obj["kind"]]
        # Server-side apply that creates is authorized as create as well as patch.
        assert {"create", "patch", "delete", "list", "watch"} <= verbs_for(group, resource), obj["kind"]


def test_status_is_written_through_the_subresource_and_nodes_and_runtimes_are_read_only():
    assert "patch" in verbs_for("inferfleet.dev", "inferenceservices/status")
    assert "patch" in verbs_for("inferfleet.dev", "enginebuilds/status")
    assert verbs_for("", "nodes") == {"get", "list", "watch"}
    assert verbs_for("inferfleet.dev", "inferenceruntimes") == {"get", "list", "watch"}
    assert verbs_for("", "events") == {"create"}
    assert "update" not in {v for r in PERMISSIONS for v in r["verbs"]}


def test_pods_and_claims_are_only_read_and_secrets_never():
    # Findings read pods (scheduling, fetch failures) and claims (missing ones); nothing writes them.
    assert verbs_for("", "pods") == {"get", "list", "watch"}
    assert verbs_for("", "persistentvolumeclaims") == {"list", "watch"}
    assert not verbs_for("", "secrets")


def test_inference_pools_are_granted_only_by_the_routing_rules_and_pods_can_be_listed_for_autoscaling():
    from inferfleet_operator.api.names import POOL_GROUP
    from inferfleet_operator.api.types import DEFAULT_SETTINGS, parse_service
    from inferfleet_operator.plan.permissions import ROUTING_PERMISSIONS
    from inferfleet_operator.plan.routing import inference_pool_for

    pool = inference_pool_for(parse_service(service()), DEFAULT_SETTINGS)
    assert pool["apiVersion"].split("/")[0] == POOL_GROUP
    assert verbs_for(POOL_GROUP, "inferencepools") == set()
    routing_verbs = {
        v
        for r in ROUTING_PERMISSIONS
        if POOL_GROUP in r["apiGroups"] and "inferencepools" in r["resources"]
        for v in r["verbs"]
    }
    assert {"get", "create", "patch", "delete"} <= routing_verbs
    assert "list" in verbs_for("", "pods")

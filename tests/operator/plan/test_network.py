"""Who may connect to a service's pods: by default a NetworkPolicy admits only the service's own namespace and the
operator; spec.networkPolicy narrows it to listed peers or opens it to the cluster, and status says when a service is
open to every pod of the cluster without an API key (condition Exposed)."""

from __future__ import annotations

from planning_data import NOW, RUNTIMES, cpu, service

from inferfleet_operator.api.types import PlanSettings, parse_service
from inferfleet_operator.plan.cluster import cluster_view
from inferfleet_operator.plan.network import network_policy_for
from inferfleet_operator.plan.planner import ServiceInputs, plan_reconcile, plan_service

OPERATOR = PlanSettings(scraper_namespace="inferfleet-system", scraper_labels=(("app.kubernetes.io/name", "op"),))
OPERATOR_PEER = {
    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "inferfleet-system"}},
    "podSelector": {"matchLabels": {"app.kubernetes.io/name": "op"}},
}
SAME_NAMESPACE = {"podSelector": {}}  # a peer without namespaceSelector: every pod of the policy's namespace
GATEWAY = {"namespace": "gateway", "podLabels": {"app": "envoy"}}
GATEWAY_PEER = {
    "namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "gateway"}},
    "podSelector": {"matchLabels": {"app": "envoy"}},
}
KEYS = {"apiKeySecret": {"name": "llama-keys"}}


def _plan(settings: PlanSettings = OPERATOR, **spec):
    return plan_service(service(**spec), [cpu("c1")], RUNTIMES, {}, {}, NOW, settings)


def _policies(p) -> list[dict]:
    return [c for c in p.children if c["kind"] == "NetworkPolicy"]


def _exposed(p) -> dict:
    return next(c for c in p.status["conditions"] if c["type"] == "Exposed")


def _from(policy: dict) -> list[dict]:
    (rule,) = policy["spec"]["ingress"]
    assert rule["ports"] == [{"protocol": "TCP", "port": 8000}]
    return rule["from"]


def test_a_default_service_admits_only_its_own_namespace_and_the_operator():
    p = _plan()
    (policy,) = _policies(p)
    assert policy["spec"]["podSelector"] == {
        "matchLabels": {"inferfleet.dev/service": "llama"},
        "matchExpressions": [{"key": "app.kubernetes.io/component", "operator": "In", "values": ["router", "server"]}],
    }
    assert policy["spec"]["policyTypes"] == ["Ingress"]
    assert _from(policy) == [SAME_NAMESPACE, OPERATOR_PEER]
    assert policy["metadata"]["ownerReferences"][0]["uid"] == "uid-llama"
    exposed = _exposed(p)
    assert (exposed["status"], exposed["reason"]) == ("False", "RestrictedByNetworkPolicy")
    assert "team-a" in exposed["message"]


def test_exposure_namespace_adds_the_listed_peers_such_as_a_gateway_elsewhere():
    policy = network_policy_for(
        parse_service(service(networkPolicy={"exposure": "Namespace", "allow": [GATEWAY]})), OPERATOR
    )
    assert _from(policy) == [SAME_NAMESPACE, GATEWAY_PEER, OPERATOR_PEER]


def test_a_network_policy_without_exposure_keeps_admitting_only_what_it_lists():
    policy = network_policy_for(parse_service(service(networkPolicy={"allow": [GATEWAY, {}]})), OPERATOR)
    own = {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "team-a"}}, "podSelector": {}}
    assert _from(policy) == [GATEWAY_PEER, own, OPERATOR_PEER]
    nobody = network_policy_for(parse_service(service(networkPolicy={})), PlanSettings())
    assert nobody["spec"]["ingress"] == [] and nobody["spec"]["policyTypes"] == ["Ingress"]


def test_exposure_cluster_applies_no_policy_and_reports_the_service_exposed_with_a_warning():
    p = _plan(networkPolicy={"exposure": "Cluster"})
    assert _policies(p) == []
    exposed = _exposed(p)
    assert (exposed["status"], exposed["reason"]) == ("True", "OpenToCluster")
    assert "spec.auth.apiKeySecret" in exposed["message"]
    assert ("Warning", "OpenToCluster") in [(e.type, e.reason) for e in p.events]


def test_an_api_key_keeps_a_cluster_wide_service_from_counting_as_exposed():
    p = _plan(networkPolicy={"exposure": "Cluster"}, auth=KEYS)
    assert _policies(p) == []
    exposed = _exposed(p)
    assert (exposed["status"], exposed["reason"]) == ("False", "ApiKeyRequired")
    assert not [e for e in p.events if e.reason == "OpenToCluster"]


def test_opening_a_service_later_flips_exposed_with_one_warning():
    def replan(status: dict, **spec):
        return plan_service(service(generation=2, status=status, **spec), [cpu("c1")], RUNTIMES, {}, {}, NOW, OPERATOR)

    opened = replan(_plan().status, networkPolicy={"exposure": "Cluster"})
    assert [(e.type, e.reason) for e in opened.events if e.reason == "OpenToCluster"] == [("Warning", "OpenToCluster")]
    again = replan(opened.status, networkPolicy={"exposure": "Cluster"})
    assert not [e for e in again.events if e.reason == "OpenToCluster"], "said once, not on every resync"


def test_a_policy_from_an_earlier_plan_is_deleted_when_the_service_opens_to_the_cluster():
    (policy,) = _policies(_plan())
    inputs = ServiceInputs(
        service(networkPolicy={"exposure": "Cluster"}),
        cluster_view([cpu("c1")], RUNTIMES),
        NOW,
        children={"NetworkPolicy": [policy]},
        settings=OPERATOR,
    )
    assert [(kind, meta["name"]) for kind, meta in plan_reconcile(inputs).stale] == [("NetworkPolicy", "llama")]

"""The service's router (spec.routing.mode Router, the default): a Deployment of inferfleet-router over one headless
Service per serving pool, the service's Service in front of it, the NetworkPolicy letting it reach the pods; mode
Service (or an operator that does not know the router's image) keeps the Service over the serving pods."""

from __future__ import annotations

from planning_data import NOW, RUNTIMES, cpu, h100, service

from inferfleet_operator.api.names import COMPONENT_LABEL, POOL_LABEL, SERVICE_LABEL
from inferfleet_operator.api.types import PlanSettings
from inferfleet_operator.plan.cluster import cluster_view
from inferfleet_operator.plan.planner import ServiceInputs, plan_reconcile, plan_service

ROUTED = PlanSettings(router_image="inferfleet/operator:1", router_image_pull_policy="Never")
NODES = [h100("h1"), cpu("c1")]
BOTH_POOLS = {"placement": {"vendors": ["nvidia", "cpu"]}, "pools": [{"name": "cpu-amd64", "replicas": 1}]}


def _plan(settings: PlanSettings = ROUTED, nodes=NODES, **spec):
    return plan_service(service(**(BOTH_POOLS | spec)), nodes, RUNTIMES, {}, {}, NOW, settings)


def _child(p, kind: str, name: str) -> dict:
    return next(c for c in p.children if c["kind"] == kind and c["metadata"]["name"] == name)


def _names(p, kind: str) -> list[str]:
    return sorted(c["metadata"]["name"] for c in p.children if c["kind"] == kind)


def test_the_router_routes_over_one_headless_service_per_serving_pool_behind_the_services_endpoint():
    p = _plan()
    pools = sorted(e["name"] for e in p.status["pools"])
    assert pools == ["cpu-amd64", "nvidia-h100-80gb-hbm3"]
    assert _names(p, "Deployment") == ["llama-cpu-amd64", "llama-nvidia-h100-80gb-hbm3", "llama-router"]
    router = _child(p, "Deployment", "llama-router")
    (container,) = router["spec"]["template"]["spec"]["containers"]
    assert container["image"] == "inferfleet/operator:1" and container["imagePullPolicy"] == "Never"
    assert container["command"] == ["inferfleet-router"]
    assert [a for a in container["args"] if a.startswith("--pool-address")] == [
        "--pool-address=cpu-amd64=llama-cpu-amd64:8000",
        "--pool-address=nvidia-h100-80gb-hbm3=llama-nvidia-h100-80gb-hbm3:8000",
    ]
    assert "--api-key-env" not in container["args"] and "env" not in container
    assert router["spec"]["selector"]["matchLabels"] == {SERVICE_LABEL: "llama", COMPONENT_LABEL: "router"}
    assert router["metadata"]["ownerReferences"][0]["uid"] == "uid-llama"

    assert _child(p, "Service", "llama")["spec"]["selector"] == {SERVICE_LABEL: "llama", COMPONENT_LABEL: "router"}
    headless = _child(p, "Service", "llama-cpu-amd64")["spec"]
    assert headless["clusterIP"] == "None" and not headless.get("publishNotReadyAddresses")
    assert headless["selector"] == {SERVICE_LABEL: "llama", POOL_LABEL: "cpu-amd64", COMPONENT_LABEL: "server"}

    routing = p.status["routing"]
    assert (routing["mode"], routing["router"]) == ("Router", "llama-router")
    assert "2 pool(s)" in routing["routerMessage"]


def test_the_router_pods_are_as_restricted_as_serving_pods():
    pod = _child(_plan(), "Deployment", "llama-router")["spec"]["template"]["spec"]
    assert pod["automountServiceAccountToken"] is False  # the router reads nothing from the API server
    assert pod["securityContext"]["runAsNonRoot"] is True
    (container,) = pod["containers"]
    sc = container["securityContext"]
    assert sc["readOnlyRootFilesystem"] is True and sc["capabilities"] == {"drop": ["ALL"]}
    assert container["readinessProbe"]["httpGet"]["path"] == "/ready"
    assert container["resources"]["limits"]["memory"] == container["resources"]["requests"]["memory"] == "512Mi"


def test_with_an_api_key_the_router_asks_for_it_and_reads_it_from_the_secret():
    p = _plan(auth={"apiKeySecret": {"name": "llama-keys"}})
    (container,) = _child(p, "Deployment", "llama-router")["spec"]["template"]["spec"]["containers"]
    assert "--api-key-env" in container["args"]
    assert container["env"] == [
        {"name": "INFERFLEET_API_KEY", "valueFrom": {"secretKeyRef": {"name": "llama-keys", "key": "api-key"}}}
    ]


def test_router_size_comes_from_the_spec():
    p = _plan(routing={"router": {"replicas": 3, "cpu": "1", "memory": "1Gi"}})
    router = _child(p, "Deployment", "llama-router")
    assert router["spec"]["replicas"] == 3
    (container,) = router["spec"]["template"]["spec"]["containers"]
    assert container["resources"] == {"requests": {"cpu": "1", "memory": "1Gi"}, "limits": {"memory": "1Gi"}}


def test_mode_service_keeps_the_service_over_the_serving_pods_and_deletes_an_earlier_router():
    routed = _plan()
    inputs = ServiceInputs(
        service(**BOTH_POOLS, routing={"mode": "Service"}),
        cluster_view(NODES, RUNTIMES),
        NOW,
        children={
            "Deployment": [_child(routed, "Deployment", "llama-router")],
            "Service": [c for c in routed.children if c["kind"] == "Service"],
        },
        settings=ROUTED,
    )
    p = plan_reconcile(inputs)
    assert "llama-router" not in _names(p, "Deployment") and _names(p, "Service") == ["llama"]
    assert _child(p, "Service", "llama")["spec"]["selector"][COMPONENT_LABEL] == "server"
    assert sorted((kind, meta["name"]) for kind, meta in p.stale) == [
        ("Deployment", "llama-router"),
        ("Service", "llama-cpu-amd64"),
        ("Service", "llama-nvidia-h100-80gb-hbm3"),
    ]
    assert p.status["routing"]["mode"] == "Service" and "spec.routing.mode" in p.status["routing"]["routerMessage"]


def test_an_operator_without_the_routers_image_serves_through_the_service_and_says_why():
    p = _plan(PlanSettings())
    assert "llama-router" not in _names(p, "Deployment")
    assert _child(p, "Service", "llama")["spec"]["selector"][COMPONENT_LABEL] == "server"
    assert p.status["routing"]["mode"] == "Service" and "--router-image" in p.status["routing"]["routerMessage"]


def test_a_pool_that_stops_serving_leaves_the_routers_flags_and_its_headless_service_goes():
    p = _plan(nodes=[cpu("c1")])
    (container,) = _child(p, "Deployment", "llama-router")["spec"]["template"]["spec"]["containers"]
    assert [a for a in container["args"] if a.startswith("--pool-address")] == [
        "--pool-address=cpu-amd64=llama-cpu-amd64:8000"
    ]
    assert _names(p, "Service") == ["llama", "llama-cpu-amd64"]


def test_a_listed_network_policy_admits_the_router_to_the_serving_pods():
    p = _plan(PlanSettings(router_image="r:1", scraper_namespace="ops"), networkPolicy={})
    (policy,) = [c for c in p.children if c["kind"] == "NetworkPolicy"]
    (rule,) = policy["spec"]["ingress"]
    assert {"podSelector": {"matchLabels": {SERVICE_LABEL: "llama", COMPONENT_LABEL: "router"}}} in rule["from"]
    assert policy["spec"]["podSelector"]["matchExpressions"][0]["values"] == ["router", "server"]


def _serving_args(p, deployment: str) -> list[str]:
    return _child(p, "Deployment", deployment)["spec"]["template"]["spec"]["containers"][0]["args"]


def test_routed_paged_pods_measure_their_profile_for_the_router_and_plain_ones_do_not():
    assert "--calibrate" in _serving_args(_plan(), "llama-cpu-amd64")
    assert "--calibrate" not in _serving_args(_plan(routing={"mode": "Service"}), "llama-cpu-amd64")

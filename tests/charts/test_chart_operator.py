"""The operator's Deployment and its companions as `helm template` renders them, switch by switch."""

from __future__ import annotations

from pathlib import Path

import yaml

from inferfleet_operator.api.types import PlanSettings
from inferfleet_operator.plan.manifests import COMPONENT_LABEL, MANAGED_BY_LABEL, MANAGER

CHART = Path(__file__).resolve().parents[2] / "charts" / "inferfleet"
NAMESPACE = "inferfleet-system"  # the namespace and release name the `render` fixture uses
RELEASE = "fleet"
FULLNAME = f"{RELEASE}-inferfleet"
APP_VERSION = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]


def _container(objects, one) -> dict:
    return one(objects, "Deployment")["spec"]["template"]["spec"]["containers"][0]


def test_operator_runs_restricted_by_default(render, one):
    pod = one(render(), "Deployment")["spec"]["template"]["spec"]
    container = pod["containers"][0]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] != 0
    assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
    context = container["securityContext"]
    assert context["runAsNonRoot"] is True
    assert context["readOnlyRootFilesystem"] is True
    assert context["allowPrivilegeEscalation"] is False
    assert context["capabilities"] == {"drop": ["ALL"]}
    assert context["seccompProfile"] == {"type": "RuntimeDefault"}
    # A read-only root still leaves Python a writable /tmp.
    assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]
    assert any(v["name"] == "tmp" and "emptyDir" in v for v in pod["volumes"])


def test_null_user_leaves_uid_to_the_platform_but_stays_non_root(render, one):
    values = {"securityContext": {"runAsUser": None, "runAsGroup": None, "fsGroup": None}}
    pod = one(render(values), "Deployment")["spec"]["template"]["spec"]
    assert pod["securityContext"] == {"runAsNonRoot": True, "seccompProfile": {"type": "RuntimeDefault"}}


def test_probes_hit_the_health_endpoint_on_the_configured_port(render, one):
    container = _container(render({"healthPort": 8181, "metricsPort": 9191}), one)
    ports = {port["name"]: port["containerPort"] for port in container["ports"]}
    assert ports == {"health": 8181, "metrics": 9191}
    for probe in ("livenessProbe", "readinessProbe"):
        assert container[probe]["httpGet"] == {"path": "/healthz", "port": "health"}
    assert "--health-port=8181" in container["args"]
    assert "--metrics-port=9191" in container["args"]


def test_probe_timing_and_resources_come_from_values(render, one):
    values = {
        "probes": {"liveness": {"periodSeconds": 42}},
        "resources": {"requests": {"cpu": "250m", "memory": "300Mi"}, "limits": {"memory": "1Gi"}},
    }
    container = _container(render(values), one)
    assert container["livenessProbe"]["periodSeconds"] == 42
    assert container["resources"] == values["resources"]


def test_image_defaults_to_app_version_and_digest_pins_it(render, one):
    assert _container(render(), one)["image"] == f"inferfleet/operator:{APP_VERSION}"
    assert _container(render({"image": {"tag": "1.2.3"}}), one)["image"] == "inferfleet/operator:1.2.3"
    digest = "sha256:" + "ab" * 32
    assert _container(render({"image": {"digest": digest}}), one)["image"] == f"inferfleet/operator@{digest}"


def test_watches_every_namespace_by_default(render, one):
    args = _container(render(), one)["args"]
    assert "--all-namespaces" in args
    assert not [arg for arg in args if arg.startswith("--namespace")]


def test_watch_namespaces_become_namespace_flags(render, one):
    args = _container(render({"watchNamespaces": ["team-a", "team-b"]}), one)["args"]
    assert "--all-namespaces" not in args
    assert [arg for arg in args if arg.startswith("--namespace")] == ["--namespace=team-a", "--namespace=team-b"]


def test_no_host_path_root_is_allowed_by_default_and_listed_roots_reach_the_operator(render, one):
    assert not [a for a in _container(render(), one)["args"] if a.startswith("--model-host-path-root")]
    roots = {"modelHostPaths": {"allowedRoots": ["/srv/models", "/data/shared models"]}}
    args = _container(render(roots), one)["args"]
    assert [a for a in args if a.startswith("--model-host-path-root")] == [
        "--model-host-path-root=/srv/models",
        "--model-host-path-root=/data/shared models",
    ]


def test_the_node_model_cache_is_off_by_default_and_its_claim_and_budget_reach_the_operator(render, one):
    from inferfleet_operator.controller.settings import parse_args

    assert not [a for a in _container(render(), one)["args"] if a.startswith("--model-cache")]
    args = _container(render({"modelCache": {"claimName": "model-cache", "budget": "200Gi"}}), one)["args"]
    assert [a for a in args if a.startswith("--model-cache")] == [
        "--model-cache-claim=model-cache",
        "--model-cache-budget=200Gi",
    ]
    settings = parse_args([a for a in args if a.startswith("--model-cache")], default_instance="t").plan_settings()
    assert settings.model_cache_claim == "model-cache" and settings.model_cache_budget_bytes == 200 * 2**30


def test_engines_are_shared_across_namespaces_only_when_an_administrator_says_so(render, one):
    assert "--share-engines-across-namespaces" not in _container(render(), one)["args"]
    args = _container(render({"engineCache": {"shareAcrossNamespaces": True}}), one)["args"]
    assert "--share-engines-across-namespaces" in args


def test_single_replica_runs_without_peering(render, one, of_kind):
    objects = render()
    deployment = one(objects, "Deployment")
    assert deployment["spec"]["replicas"] == 1
    assert not [arg for arg in _container(objects, one)["args"] if arg.startswith("--peering")]
    assert not of_kind(objects, "ClusterKopfPeering") and not of_kind(objects, "KopfPeering")


def test_several_replicas_elect_a_leader_through_a_cluster_peering(render, one, of_kind):
    objects = render({"replicaCount": 3})
    assert one(objects, "Deployment")["spec"]["replicas"] == 3
    assert f"--peering={FULLNAME}" in _container(objects, one)["args"]
    peering = one(objects, "ClusterKopfPeering")
    assert peering["metadata"]["name"] == FULLNAME
    # On the install that creates kopf's CRDs the peering object waits for the next upgrade.
    assert not of_kind(render({"replicaCount": 3}, served=False), "ClusterKopfPeering")


def test_namespaced_leader_election_uses_one_peering_per_watched_namespace(render, one, of_kind):
    objects = render(
        {"replicaCount": 2, "watchNamespaces": ["team-a", "team-b"], "leaderElection": {"peeringName": "fleet-leader"}}
    )
    assert "--peering=fleet-leader" in _container(objects, one)["args"]
    peerings = of_kind(objects, "KopfPeering")
    assert sorted((p["metadata"]["namespace"], p["metadata"]["name"]) for p in peerings) == [
        ("team-a", "fleet-leader"),
        ("team-b", "fleet-leader"),
    ]
    assert not of_kind(objects, "ClusterKopfPeering")


def test_engine_cache_claim_is_created_by_default_and_passed_to_the_operator(render, one):
    objects = render({"engineCache": {"size": "20Gi", "accessModes": ["ReadWriteOnce"], "storageClassName": "fast"}})
    claim = one(objects, "PersistentVolumeClaim")
    assert claim["metadata"] == {**claim["metadata"], "name": f"{FULLNAME}-engine-cache", "namespace": NAMESPACE}
    assert claim["spec"] == {
        "accessModes": ["ReadWriteOnce"],
        "storageClassName": "fast",
        "resources": {"requests": {"storage": "20Gi"}},
    }
    assert f"--engine-cache-claim={FULLNAME}-engine-cache" in _container(objects, one)["args"]


def test_engine_cache_storage_class_null_means_default_and_empty_means_none(render, one):
    assert "storageClassName" not in one(render(), "PersistentVolumeClaim")["spec"]
    claim = one(render({"engineCache": {"storageClassName": ""}}), "PersistentVolumeClaim")
    assert claim["spec"]["storageClassName"] == ""


def test_existing_engine_cache_claim_is_used_and_none_is_created(render, one, of_kind):
    objects = render({"engineCache": {"existingClaim": "shared-engines"}})
    assert not of_kind(objects, "PersistentVolumeClaim")
    assert "--engine-cache-claim=shared-engines" in _container(objects, one)["args"]


def test_without_a_cache_the_operator_gets_no_claim(render, one, of_kind):
    objects = render({"engineCache": {"create": False}})
    assert not of_kind(objects, "PersistentVolumeClaim")
    assert not [arg for arg in _container(objects, one)["args"] if arg.startswith("--engine-cache-claim")]


def test_pod_disruption_budget_never_blocks_a_drain_by_default(render, one, of_kind):
    pdb = one(render(), "PodDisruptionBudget")
    assert pdb["spec"]["maxUnavailable"] == 1 and "minAvailable" not in pdb["spec"]
    assert pdb["spec"]["selector"]["matchLabels"] == one(render(), "Deployment")["spec"]["selector"]["matchLabels"]
    assert one(render({"podDisruptionBudget": {"minAvailable": 2}}), "PodDisruptionBudget")["spec"] == {
        "selector": pdb["spec"]["selector"],
        "minAvailable": 2,
    }
    assert not of_kind(render({"podDisruptionBudget": {"enabled": False}}), "PodDisruptionBudget")


def test_metrics_service_selects_the_operator_pods(render, one, of_kind):
    objects = render()
    service = one(objects, "Service")
    pod_labels = one(objects, "Deployment")["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= pod_labels.items()
    assert service["spec"]["ports"] == [{"name": "metrics", "port": 9090, "targetPort": "metrics", "protocol": "TCP"}]
    assert not of_kind(render({"metrics": {"service": {"enabled": False}}}), "Service")


def test_service_monitor_is_off_by_default_and_scrapes_the_metrics_service(render, one, of_kind):
    assert not of_kind(render(), "ServiceMonitor")
    objects = render(
        {"metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "prom"}, "interval": "15s"}}}
    )
    monitor = one(objects, "ServiceMonitor")
    service = one(objects, "Service")
    assert monitor["metadata"]["labels"]["release"] == "prom"
    assert monitor["spec"]["selector"]["matchLabels"].items() <= service["metadata"]["labels"].items()
    assert monitor["spec"]["endpoints"] == [
        {"port": "metrics", "path": "/metrics", "interval": "15s", "scrapeTimeout": "10s"}
    ]


def test_service_monitor_without_the_metrics_service_is_refused(refuse):
    error = refuse({"metrics": {"service": {"enabled": False}, "serviceMonitor": {"enabled": True}}})
    assert "metrics.serviceMonitor.enabled needs metrics.service.enabled" in error


def test_network_policy_is_off_by_default_and_limits_traffic_to_api_and_dns(render, one, of_kind):
    assert not of_kind(render(), "NetworkPolicy")
    scraper = {"namespaceSelector": {"matchLabels": {"name": "monitoring"}}}
    policy = one(render({"networkPolicy": {"enabled": True, "metricsFrom": [scraper]}}), "NetworkPolicy")
    spec = policy["spec"]
    assert spec["policyTypes"] == ["Ingress", "Egress"]
    assert spec["ingress"] == [
        {"ports": [{"port": "health", "protocol": "TCP"}]},
        {"ports": [{"port": "metrics", "protocol": "TCP"}], "from": [scraper]},
    ]
    egress_ports = sorted((p["port"], p["protocol"]) for rule in spec["egress"] for p in rule["ports"])
    assert egress_ports == [(53, "TCP"), (53, "UDP"), (443, "TCP"), (6443, "TCP"), (8000, "TCP")]
    # The autoscaler's scrape: the serving pods the operator made, in every namespace, on the serving port.
    [scrape] = [rule for rule in spec["egress"] if rule.get("to")]
    assert scrape["to"] == [
        {
            "namespaceSelector": {},
            "podSelector": {"matchLabels": {MANAGED_BY_LABEL: MANAGER, COMPONENT_LABEL: "server"}},
        }
    ]
    assert scrape["ports"] == [{"port": PlanSettings().port, "protocol": "TCP"}]


def test_service_account_can_be_brought_by_the_user(render, one, of_kind, refuse):
    objects = render({"serviceAccount": {"create": False, "name": "platform-operator"}})
    assert not of_kind(objects, "ServiceAccount")
    assert one(objects, "Deployment")["spec"]["template"]["spec"]["serviceAccountName"] == "platform-operator"
    binding = one(objects, "ClusterRoleBinding")
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "platform-operator", "namespace": NAMESPACE}]
    assert "serviceAccount.name is required" in refuse({"serviceAccount": {"create": False}})


def test_namespaced_objects_land_in_the_release_namespace(render):
    cluster_scoped = {
        "ClusterRole",
        "ClusterRoleBinding",
        "CustomResourceDefinition",
        "InferenceRuntime",
        "ClusterKopfPeering",
    }
    for obj in render({"networkPolicy": {"enabled": True}, "replicaCount": 2}, namespace="ops"):
        if obj["kind"] in cluster_scoped:
            assert "namespace" not in obj["metadata"], obj["metadata"]["name"]
        else:
            assert obj["metadata"]["namespace"] == "ops", f"{obj['kind']} {obj['metadata']['name']}"


def test_placement_values_reach_the_pod(render, one):
    values = {
        "nodeSelector": {"pool": "system"},
        "tolerations": [{"key": "system", "operator": "Exists"}],
        "priorityClassName": "system-cluster-critical",
        "podLabels": {"team": "ml"},
        "podAnnotations": {"note": "x"},
        "extraArgs": ["--verbose"],
        "extraEnv": [{"name": "KOPF_LOG", "value": "debug"}],
    }
    deployment = one(render(values), "Deployment")
    pod = deployment["spec"]["template"]
    assert pod["spec"]["nodeSelector"] == {"pool": "system"}
    assert pod["spec"]["tolerations"] == values["tolerations"]
    assert pod["spec"]["priorityClassName"] == "system-cluster-critical"
    assert pod["metadata"]["labels"]["team"] == "ml" and pod["metadata"]["annotations"] == {"note": "x"}
    container = pod["spec"]["containers"][0]
    assert container["args"][-1] == "--verbose"
    assert {"name": "KOPF_LOG", "value": "debug"} in container["env"]
    # The selector must not follow podLabels, or an upgrade adding a label would be refused.
    assert "team" not in deployment["spec"]["selector"]["matchLabels"]


def test_the_operator_knows_its_namespace_and_labels_for_service_network_policies(render, one):
    objects = render()
    deployment = one(objects, "Deployment")
    args = _container(objects, one)["args"]
    assert f"--scraper-namespace={NAMESPACE}" in args
    [labels_arg] = [a for a in args if a.startswith("--scraper-labels=")]
    pairs = dict(p.split("=", 1) for p in labels_arg.removeprefix("--scraper-labels=").split(","))
    pod_labels = deployment["spec"]["template"]["metadata"]["labels"]
    assert pairs and all(pod_labels.get(k) == v for k, v in pairs.items())  # they select the operator's pods
    assert pairs.get("app.kubernetes.io/component") == "operator"


def test_the_operator_gives_each_services_router_its_own_image_and_pull_policy(render, one):
    container = _container(render({"image": {"tag": "1.2.3", "pullPolicy": "Never"}}), one)
    assert container["image"] == "inferfleet/operator:1.2.3"
    assert "--router-image=inferfleet/operator:1.2.3" in container["args"]
    assert "--router-image-pull-policy=Never" in container["args"]
    pinned = _container(render({"image": {"digest": "sha256:" + "a" * 64}}), one)
    assert "--router-image=inferfleet/operator@sha256:" + "a" * 64 in pinned["args"]

"""Who may connect to a service's serving pods: its NetworkPolicy (by default its own namespace and the operator),
and the Exposed condition that says when every pod of the cluster may call it without a key."""

from __future__ import annotations

from inferfleet_operator.api import conditions as c
from inferfleet_operator.api.names import COMPONENT_LABEL, KINDS, NAMESPACE_NAME_LABEL, SERVICE_LABEL
from inferfleet_operator.api.types import InferenceService, PlanSettings
from inferfleet_operator.plan.manifests import common_labels


def network_policy_for(service: InferenceService, settings: PlanSettings, has_router: bool = False) -> dict | None:
    """Ingress to the serving and router pods' port only from the peers the service's exposure names (Namespace:
    every pod of its namespace, which holds an InferencePool's endpoint picker too), spec.networkPolicy.allow, the
    service's router pods (has_router) and the operator's own pods (the autoscaler reads /metrics there); other ports
    and every other peer are refused. None for exposure
    Cluster (no policy). Egress is not restricted. The kubelet's probes come from the node and are not subject to
    it on the common network plugins, nor is `kubectl port-forward` (it enters the pod's network namespace)."""
    exposure = service.spec.exposure
    if exposure == "Cluster":
        return None
    namespace = service.meta.namespace
    # A peer with a podSelector and no namespaceSelector: every pod of the policy's own namespace.
    peers: list[dict] = [{"podSelector": {}}] if exposure == "Namespace" else []
    listed = service.spec.network_policy.allow if service.spec.network_policy is not None else ()
    peers += [
        {
            "namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: peer.namespace or namespace}},
            "podSelector": {"matchLabels": dict(sorted(peer.pod_labels.items()))} if peer.pod_labels else {},
        }
        for peer in listed
    ]
    if has_router and exposure != "Namespace":  # Namespace admits every pod of the namespace already
        peers.append({"podSelector": {"matchLabels": {SERVICE_LABEL: service.meta.name, COMPONENT_LABEL: "router"}}})
    if settings.scraper_namespace:
        peers.append(
            {
                "namespaceSelector": {"matchLabels": {NAMESPACE_NAME_LABEL: settings.scraper_namespace}},
                "podSelector": {"matchLabels": dict(sorted(settings.scraper_labels))},
            }
        )
    ingress = [{"from": peers, "ports": [{"protocol": "TCP", "port": settings.port}]}] if peers else []
    return {
        "apiVersion": KINDS["NetworkPolicy"].api_version,
        "kind": "NetworkPolicy",
        "metadata": {"name": service.meta.name, "namespace": namespace, "labels": common_labels(service.meta.name)},
        "spec": {
            "podSelector": {
                "matchLabels": {SERVICE_LABEL: service.meta.name},
                "matchExpressions": [{"key": COMPONENT_LABEL, "operator": "In", "values": ["router", "server"]}],
            },
            "policyTypes": ["Ingress"],
            "ingress": ingress,
        },
    }


def exposed(service: InferenceService) -> tuple[str, str, str]:
    """(status, reason, message) of the Exposed condition: True only when every pod of the cluster may call the
    OpenAI endpoints without a key."""
    spec, namespace = service.spec, service.meta.namespace
    secret = spec.auth.api_key_secret
    if secret is not None:
        return c.FALSE, c.REASON_API_KEY_REQUIRED, f"clients must send a key from Secret {secret.name}"
    if spec.exposure == "Cluster":
        return (
            c.TRUE,
            c.REASON_OPEN_TO_CLUSTER,
            "every pod of the cluster may call the service without a key (spec.networkPolicy.exposure is Cluster and "
            "spec.auth.apiKeySecret is unset): set an API key, or exposure Namespace or Listed",
        )
    listed = "the peers spec.networkPolicy.allow lists"
    who = f"pods of namespace {namespace}" if spec.exposure == "Namespace" else listed
    if spec.exposure == "Namespace" and spec.network_policy is not None and spec.network_policy.allow:
        who += f", {listed}"
    return (
        c.FALSE,
        c.REASON_RESTRICTED_BY_NETWORK_POLICY,
        f"a NetworkPolicy admits only {who} and the operator, where the network plugin enforces NetworkPolicies",
    )

"""kube.py against a fake API server (an httpx.MockTransport handler): the requests it sends; diff.py: no-op detection."""

import asyncio
import json

import httpx
import pytest
from fake_transport import HttpxTransport

from inferfleet_operator.kube import client as kube
from inferfleet_operator.kube import diff


def _client(handler):
    return kube.Kube(HttpxTransport(handler), instance="op-0")


def _deployment(replicas=2, cpu="2", extra_label=None):
    labels = {"app.kubernetes.io/name": "inferfleet"}
    if extra_label:
        labels.update(extra_label)
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "llama-nvidia-h100", "namespace": "team-a", "labels": labels},
        "spec": {
            "replicas": replicas,
            "template": {
                "spec": {
                    "containers": [{"name": "runtime", "image": "runtime:1", "resources": {"limits": {"cpu": cpu}}}]
                }
            },
        },
    }


def test_apply_sends_server_side_apply_under_the_operator_field_manager():
    seen = []

    def handler(request):
        seen.append(request)
        return httpx.Response(200, json=json.loads(request.content))

    client = _client(handler)
    asyncio.run(client.apply(_deployment()))
    asyncio.run(client.apply(_deployment(), force=True))
    first, second = seen
    assert first.method == "PATCH"
    assert first.url.path == "/apis/apps/v1/namespaces/team-a/deployments/llama-nvidia-h100"
    assert first.headers["content-type"] == "application/apply-patch+yaml"
    assert first.url.params["fieldManager"] == "inferfleet-operator"
    assert "force" not in first.url.params
    assert second.url.params["force"] == "true"
    assert json.loads(first.content)["spec"]["replicas"] == 2


def test_status_is_applied_to_the_status_subresource_with_only_identity_and_status():
    seen = []

    def handler(request):
        seen.append(request)
        return httpx.Response(200, json={"metadata": {"name": "llama"}})

    service = {
        "apiVersion": "inferfleet.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": "llama", "namespace": "team-a", "uid": "u1", "labels": {"x": "y"}},
        "spec": {"replicas": 3},
    }
    asyncio.run(_client(handler).apply_status(service, {"observedGeneration": 1}))
    (request,) = seen
    assert request.url.path == "/apis/inferfleet.dev/v1alpha1/namespaces/team-a/inferenceservices/llama/status"
    assert json.loads(request.content) == {
        "apiVersion": "inferfleet.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": "llama", "namespace": "team-a"},
        "status": {"observedGeneration": 1},
    }


def test_cluster_scoped_and_core_paths():
    assert kube.resource_path("v1", "Node", None, "n1") == "/api/v1/nodes/n1"
    assert kube.resource_path("v1", "Service", "ns", "s") == "/api/v1/namespaces/ns/services/s"
    assert (
        kube.resource_path("inferfleet.dev/v1alpha1", "InferenceRuntime", "ignored", "paged")
        == "/apis/inferfleet.dev/v1alpha1/inferenceruntimes/paged"
    )


def test_delete_sends_uid_precondition_and_reports_a_missing_object_as_false():
    seen = []

    def handler(request):
        seen.append(json.loads(request.content))
        if request.url.path.endswith("/gone"):
            return httpx.Response(404, json={"reason": "NotFound", "message": "not found"})
        return httpx.Response(200, json={"kind": "Status"})

    client = _client(handler)
    assert asyncio.run(client.delete("apps/v1", "Deployment", "ns", "here", uid="u1")) is True
    assert asyncio.run(client.delete("apps/v1", "Deployment", "ns", "gone")) is False
    assert seen[0]["preconditions"] == {"uid": "u1"}
    assert seen[0]["propagationPolicy"] == "Background"
    assert "preconditions" not in seen[1]


def test_refusals_raise_with_the_servers_message():
    def handler(request):
        return httpx.Response(422, json={"reason": "Invalid", "message": "spec.replicas: must be >= 0"})

    with pytest.raises(kube.ApiError) as raised:
        asyncio.run(_client(handler).apply(_deployment()))
    assert raised.value.status == 422
    assert "spec.replicas" in str(raised.value)
    assert not raised.value.is_retryable


def test_events_are_core_events_that_name_the_object():
    seen = []

    def handler(request):
        seen.append(request)
        return httpx.Response(201, json=json.loads(request.content))

    service = {
        "apiVersion": "inferfleet.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": "llama", "namespace": "team-a", "uid": "u1"},
    }
    asyncio.run(
        _client(handler).post_event(service, type="Warning", reason="BuildFailed", note="x" * 2000, action="Reconcile")
    )
    (request,) = seen
    body = json.loads(request.content)
    assert request.url.path == "/api/v1/namespaces/team-a/events"
    assert body["involvedObject"] == {
        "apiVersion": "inferfleet.dev/v1alpha1",
        "kind": "InferenceService",
        "name": "llama",
        "namespace": "team-a",
        "uid": "u1",
    }
    assert (body["type"], body["reason"], body["reportingInstance"]) == ("Warning", "BuildFailed", "op-0")
    assert len(body["message"]) == 1000
    assert body["firstTimestamp"].endswith("Z")


def test_requests_are_counted_and_reads_are_not_writes():
    counted = []

    def handler(request):
        if request.method == "GET":
            return httpx.Response(200, json={"items": [{"metadata": {"name": "a"}}]})
        return httpx.Response(200, json={"metadata": {"name": "x"}})

    client = kube.Kube(HttpxTransport(handler), on_request=lambda verb, kind: counted.append((verb, kind)))

    async def go():
        await client.list("apps/v1", "Deployment", "ns", label_selector="a=b")
        await client.apply(_deployment())
        await client.delete("apps/v1", "Deployment", "ns", "x")

    asyncio.run(go())
    assert counted == [("list", "Deployment"), ("apply", "Deployment"), ("delete", "Deployment")]
    assert client.num_writes == 2


def _live(desired):
    """What the API server returns: the applied object plus defaults and server fields."""
    live = json.loads(json.dumps(diff.with_applied_hash(desired)))
    live["metadata"].update(uid="u", resourceVersion="7", generation=1)
    live["spec"]["strategy"] = {"type": "RollingUpdate"}
    container = live["spec"]["template"]["spec"]["containers"][0]
    container["imagePullPolicy"] = "IfNotPresent"
    container["resources"]["limits"]["cpu"] = (
        "2000m" if container["resources"]["limits"]["cpu"] == "2" else container["resources"]["limits"]["cpu"]
    )
    live["status"] = {"readyReplicas": 2}
    return live


def test_an_unchanged_object_needs_no_apply_despite_server_defaults_and_quantity_spelling():
    desired = _deployment()
    assert diff.needs_apply(desired, _live(desired)) is False


def test_a_missing_object_needs_apply():
    assert diff.needs_apply(_deployment(), None) is True


def test_a_field_edited_by_hand_needs_apply():
    desired = _deployment()
    live = _live(desired)
    live["spec"]["replicas"] = 5  # kubectl scale
    assert diff.needs_apply(desired, live) is True


def test_a_field_the_operator_stopped_setting_needs_apply():
    old = _deployment(extra_label={"inferfleet.dev/engine-key": "abc"})
    live = _live(old)
    assert diff.needs_apply(_deployment(), live) is True


def test_a_changed_manifest_needs_apply():
    live = _live(_deployment())
    assert diff.needs_apply(_deployment(replicas=3), live) is True


def test_quantities_compare_by_value():
    assert diff.is_subset({"memory": "8Gi"}, {"memory": "8192Mi"})
    assert diff.is_subset({"cpu": "0.5"}, {"cpu": "500m"})
    assert not diff.is_subset({"cpu": "1"}, {"cpu": "500m"})
    assert not diff.is_subset({"image": "a"}, {"image": "b"})

"""An in-memory API server and the reconcile context over it, with the services, nodes and runtimes it starts from."""

import asyncio
import copy
import datetime
import json
import re

import httpx
from fake_transport import HttpxTransport

from inferfleet_operator.api import names
from inferfleet_operator.controller import cache, reconcile
from inferfleet_operator.controller.metrics import Metrics
from inferfleet_operator.controller.settings import OperatorConfig
from inferfleet_operator.kube.client import Kube

NOW = datetime.datetime(2026, 12, 2, 12, 0, tzinfo=datetime.UTC)
PLURAL_KINDS = {
    "deployments": "Deployment",
    "services": "Service",
    "poddisruptionbudgets": "PodDisruptionBudget",
    "networkpolicies": "NetworkPolicy",
    "jobs": "Job",
    "enginebuilds": "EngineBuild",
    "inferenceservices": "InferenceService",
    "events": "Event",
    "inferencepools": "InferencePool",
    "pods": "Pod",
}
PATH = re.compile(
    r"^/apis?/(?:[^/]+/)?[^/]+/namespaces/(?P<ns>[^/]+)/(?P<plural>[^/]+)"
    r"(?:/(?P<name>[^/]+))?(?:/(?P<sub>status))?$"
)


class FakeApi:
    """A tiny API server: server-side apply as replace-by-the-one-manager, status, deletes, events."""

    def __init__(self):
        self.objects: dict[tuple[str, str, str], dict] = {}
        self.requests: list[tuple[str, str]] = []
        self.events: list[dict] = []
        self.revision = 100
        self.serves_pools = False  # whether discovery lists the GAIE InferencePool
        self.reads: list[tuple[str, str]] = []  # GETs, kept apart from the writes the tests count

    def _read(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/apis/inference.networking.k8s.io/v1":
            self.reads.append(("GET", "Discovery"))
            if not self.serves_pools:
                return httpx.Response(404, json={"reason": "NotFound", "message": "not served"})
            return httpx.Response(200, json={"resources": [{"name": "inferencepools", "kind": "InferencePool"}]})
        match = PATH.match(request.url.path)
        kind = PLURAL_KINDS[match["plural"]]
        self.reads.append(("GET", kind))
        if match["name"] is None:
            items = [o for (k, ns, _), o in self.objects.items() if k == kind and ns == match["ns"]]
            return httpx.Response(200, json={"items": copy.deepcopy(items)})
        obj = self.objects.get((kind, match["ns"], match["name"]))
        return (
            httpx.Response(200, json=obj)
            if obj
            else httpx.Response(404, json={"reason": "NotFound", "message": "gone"})
        )

    def handle(self, request: httpx.Request) -> httpx.Response:
        if request.method == "GET":
            return self._read(request)
        match = PATH.match(request.url.path)
        assert match, request.url.path
        kind = PLURAL_KINDS[match["plural"]]
        key = (kind, match["ns"], match["name"] or "")
        body = json.loads(request.content) if request.content else None
        self.requests.append((request.method, kind + ("/status" if match["sub"] else "")))
        self.revision += 1
        if request.method == "POST":
            self.events.append(body)
            return httpx.Response(201, json=body)
        if request.method == "DELETE":
            if key not in self.objects:
                return httpx.Response(404, json={"reason": "NotFound", "message": "gone"})
            del self.objects[key]
            return httpx.Response(200, json={"kind": "Status"})
        assert request.method == "PATCH"
        old = self.objects.get(key)
        if match["sub"]:
            obj = copy.deepcopy(old)
            obj["status"] = body["status"]
        elif request.headers["content-type"] == "application/merge-patch+json":
            obj = copy.deepcopy(old)
            annotations = obj["metadata"].setdefault("annotations", {})
            for k, v in body["metadata"]["annotations"].items():
                annotations.pop(k, None) if v is None else annotations.__setitem__(k, v)
        else:
            assert request.headers["content-type"] == "application/apply-patch+yaml"
            assert request.url.params["fieldManager"] == "inferfleet-operator"
            obj = copy.deepcopy(body)
            meta = obj["metadata"]
            meta["uid"] = (old or {}).get("metadata", {}).get("uid", f"uid-{self.revision}")
            if old and "status" in old:
                obj["status"] = old["status"]
        obj["metadata"]["resourceVersion"] = str(self.revision)
        self.objects[key] = obj
        return httpx.Response(200, json=obj)

    def writes(self) -> list[tuple[str, str]]:
        return list(self.requests)


def node(name, labels, allocatable):
    return {
        "apiVersion": "v1",
        "kind": "Node",
        "metadata": {"name": name, "labels": {"kubernetes.io/arch": "amd64", **labels}},
        "spec": {},
        "status": {
            "allocatable": {"cpu": "96", "memory": "1024Gi", **allocatable},
            "capacity": {"cpu": "96", "memory": "1024Gi", **allocatable},
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


NODES = [
    node(
        "h100-0",
        {
            "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
            "nvidia.com/gpu.compute.major": "9",
            "nvidia.com/gpu.compute.minor": "0",
            "nvidia.com/gpu.count": "8",
        },
        {"nvidia.com/gpu": "8"},
    ),
    node("cpu-0", {}, {}),
]


def _runtime(name, engine, vendors, resource, priority, compile_image=None):
    spec = {
        "engine": engine,
        "vendors": vendors,
        "image": f"inferfleet/{name}:1",
        "gpuResource": resource,
        "priority": priority,
    }
    if compile_image:
        spec["compileImage"] = compile_image
    return {
        "apiVersion": "inferfleet.dev/v1alpha1",
        "kind": "InferenceRuntime",
        "metadata": {"name": name},
        "spec": spec,
    }


RUNTIMES = [
    _runtime("paged-cuda", "Paged", ["nvidia"], "nvidia.com/gpu", 100),
    _runtime("paged-cpu", "Paged", ["cpu"], "", 10),
    _runtime("paged-rocm", "Paged", ["amd"], "amd.com/gpu", 100),
    _runtime(
        "compiled-tensorrt",
        "Compiled",
        ["nvidia"],
        "nvidia.com/gpu",
        200,
        compile_image="inferfleet/compile-tensorrt:1",
    ),
]


def inference_service(name="llama", replicas=2):
    return {
        "apiVersion": "inferfleet.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {
            "name": name,
            "namespace": "team-a",
            "uid": f"uid-{name}",
            "generation": 1,
            "resourceVersion": "1",
        },
        "spec": {
            "model": {"name": "llama", "uri": "hf://org/llama"},
            "replicas": replicas,
            # cpu listed: by default CPU pools serve only when no accelerator pool is eligible.
            "placement": {"vendors": ["nvidia", "amd", "cpu"]},
            "pools": [
                {"name": "nvidia-h100-80gb-hbm3", "replicas": min(replicas, 1)},
                {"name": "cpu-amd64", "replicas": max(replicas - 1, 0)},
            ],
        },
    }


class World:
    """The fake API plus indices rebuilt from it, as kopf's watches would keep them."""

    def __init__(self, services):
        self.api = FakeApi()
        for service in services:
            meta = service["metadata"]
            self.api.objects[("InferenceService", meta["namespace"], meta["name"])] = service
        self.kube = Kube(HttpxTransport(self.api.handle))
        self.indices = {}
        self.sync()
        config = OperatorConfig(build_retention_seconds=60)
        self.ctx = reconcile.Context(
            kube=self.kube, config=config, metrics=Metrics(), cache=cache.ReadCache(self.indices), clock=lambda: NOW
        )

    def sync(self):
        """Every index as the watches would have it after all events arrived."""
        index = {
            name: {}
            for name in (
                cache.SERVICES,
                cache.BUILDS,
                cache.DEPLOYMENTS,
                cache.SERVICE_OBJECTS,
                cache.PDBS,
                cache.NETWORK_POLICIES,
                cache.JOBS,
                cache.PODS,
            )
        }
        index[cache.NODES] = {n["metadata"]["name"]: [n] for n in NODES}
        index[cache.RUNTIMES] = {r["metadata"]["name"]: [r] for r in RUNTIMES}
        for (kind, ns, name), obj in self.api.objects.items():
            obj = copy.deepcopy(obj)
            service = obj["metadata"].get("labels", {}).get(names.SERVICE_LABEL)
            if kind == "InferenceService":
                index[cache.SERVICES].setdefault((ns, name), []).append(obj)
            elif kind == "EngineBuild":
                index[cache.BUILDS].setdefault(ns, []).append(obj)
            elif kind == "Job":
                build = obj["metadata"]["labels"][names.BUILD_LABEL]
                index[cache.JOBS].setdefault((ns, build), []).append(obj)
            elif kind == "Pod" and names.BUILD_LABEL in obj["metadata"].get("labels", {}):  # a compile pod
                build = obj["metadata"]["labels"][names.BUILD_LABEL]
                index[cache.PODS].setdefault((ns, build), []).append(obj)
            elif kind in cache.CHILD_INDEXES:
                index[cache.CHILD_INDEXES[kind]].setdefault((ns, service), []).append(obj)
        # Claims and serving pods are set by the tests that use them, and kept across syncs.
        index.update({k: self.indices[k] for k in (cache.CLAIMS, cache.SERVICE_PODS) if k in self.indices})
        self.indices.clear()
        self.indices.update(index)
        self.ctx_written_clear()

    def ctx_written_clear(self):
        ctx = getattr(self, "ctx", None)
        if ctx is not None:
            ctx.cache.written.clear()  # the watch delivered everything written

    def reconcile(self, name="llama"):
        before = len(self.api.requests)
        asyncio.run(reconcile.reconcile_service(self.ctx, "team-a", name))
        return self.api.requests[before:]

    def reconcile_build(self, name, at=NOW):
        self.ctx.clock = lambda: at
        before = len(self.api.requests)
        delay = asyncio.run(reconcile.reconcile_build(self.ctx, "team-a", name))
        return self.api.requests[before:], delay

    def build_name(self):
        (name,) = [k[2] for k in self.api.objects if k[0] == "EngineBuild"]
        return name

    def get(self, kind, name):
        return self.api.objects.get((kind, "team-a", name))


def refuse(world, kind, message):
    """The fake API server answers every apply of `kind` with 422 and `message`."""
    original = world.api.handle

    def handle(request):
        match = PATH.match(request.url.path)
        if request.method == "PATCH" and not match["sub"] and PLURAL_KINDS[match["plural"]] == kind:
            world.api.requests.append((request.method, kind))
            return httpx.Response(422, json={"reason": "Invalid", "message": message})
        return original(request)

    world.kube._transport.handle_with(handle)
    return lambda: world.kube._transport.handle_with(original)

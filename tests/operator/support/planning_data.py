"""Plain-dict builders shared by the planning tests: nodes, runtimes, services, builds, Deployments."""

from __future__ import annotations

import copy
from datetime import UTC, datetime
from pathlib import Path

import yaml

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "nodes"
NOW = datetime(2026, 1, 1, 12, 0, 0, tzinfo=UTC)


def fixture_node(name: str) -> dict:
    return yaml.safe_load((FIXTURES / f"{name}.yaml").read_text())


def node(
    name: str, labels: dict | None = None, allocatable: dict | None = None, ready: bool = True, taints=None
) -> dict:
    spec = {"taints": taints} if taints else {}
    return {
        "metadata": {"name": name, "labels": {"kubernetes.io/arch": "amd64"} | (labels or {})},
        "spec": spec,
        "status": {
            "allocatable": {"cpu": "32"} | (allocatable or {}),
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        },
    }


def h100(name: str, gpus: int = 8, **kw) -> dict:
    return node(
        name,
        {
            "nvidia.com/gpu.product": "NVIDIA-H100-80GB-HBM3",
            "nvidia.com/gpu.compute.major": "9",
            "nvidia.com/gpu.compute.minor": "0",
        },
        {"nvidia.com/gpu": str(gpus)},
        **kw,
    )


def mi300x(name: str, gpus: int = 8, **kw) -> dict:
    return node(
        name,
        {"amd.com/gpu.product-name": "AMD_Instinct_MI300X", "amd.com/gpu.device-id": "74a1"},
        {"amd.com/gpu": str(gpus)},
        **kw,
    )


def intel_max(name: str, resource: str = "gpu.intel.com/i915", gpus: int = 4, **kw) -> dict:
    return node(
        name, {"gpu.intel.com/product": "Max_1550", "gpu.intel.com/family": "Max_Series"}, {resource: str(gpus)}, **kw
    )


def cpu(name: str, cores: int = 16, **kw) -> dict:
    return node(name, {}, {"cpu": str(cores)}, **kw)


def runtime(
    name: str,
    engine: str,
    vendors: list[str],
    priority: int = 0,
    architectures=None,
    image: str = "inferfleet/runtime:1",
) -> dict:
    spec = {"engine": engine, "vendors": vendors, "image": image, "priority": priority}
    if engine == "Compiled":
        spec["compileImage"] = "inferfleet/compile:1"
    if architectures:
        spec["architectures"] = architectures
    return {
        "apiVersion": "inferfleet.dev/v1alpha1",
        "kind": "InferenceRuntime",
        "metadata": {"name": name},
        "spec": spec,
    }


RUNTIMES = [
    runtime("paged-cuda", "Paged", ["nvidia"]),
    runtime("paged-rocm", "Paged", ["amd"]),
    runtime("paged-cpu", "Paged", ["cpu"]),
    runtime("compiled-tensorrt", "Compiled", ["nvidia"], priority=10, architectures=["sm80", "sm89", "sm90"]),
]


def service(name: str = "llama", generation: int = 1, status: dict | None = None, **spec) -> dict:
    base = {"model": {"name": "llama-3-8b", "uri": "hf://meta-llama/Llama-3-8B"}, "replicas": 2}
    return {
        "apiVersion": "inferfleet.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": name, "namespace": "team-a", "uid": "uid-" + name, "generation": generation},
        "spec": copy.deepcopy(base | spec),
        "status": status or {},
    }


def with_state(build: dict, state: str) -> dict:
    out = copy.deepcopy(build)
    out["metadata"]["uid"] = "uid-" + out["metadata"]["name"]
    out["status"] = {"state": state}
    return out


def deployment_as_read(manifest: dict, ready: int) -> dict:
    out = copy.deepcopy(manifest)
    out["status"] = {"readyReplicas": ready, "replicas": manifest["spec"]["replicas"]}
    return out

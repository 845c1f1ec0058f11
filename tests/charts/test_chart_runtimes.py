"""The default InferenceRuntime objects: paged for CUDA, ROCm, XPU and CPU, compiled TensorRT for NVIDIA."""

from __future__ import annotations

from datetime import UTC
from pathlib import Path

import jsonschema
import yaml

from inferfleet_operator.api.types import parse_runtime

ROOT = Path(__file__).resolve().parents[2]
APP_VERSION = yaml.safe_load((ROOT / "charts" / "inferfleet" / "Chart.yaml").read_text())["appVersion"]


def _runtimes(objects: list[dict]) -> dict[str, dict]:
    return {obj["metadata"]["name"]: obj for obj in objects if obj["kind"] == "InferenceRuntime"}


def _crd_schema() -> dict:
    crd = yaml.safe_load((ROOT / "crds" / "inferenceruntimes.yaml").read_text())
    return crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]


def test_defaults_cover_every_vendor_with_paged_and_nvidia_with_tensorrt(render):
    runtimes = _runtimes(render())
    by_engine = {}
    for runtime in runtimes.values():
        spec = runtime["spec"]
        by_engine.setdefault(spec["engine"], set()).update(spec["vendors"])
    assert by_engine == {"Paged": {"nvidia", "amd", "intel", "cpu"}, "Compiled": {"nvidia"}}
    tensorrt = runtimes["compiled-tensorrt"]["spec"]
    assert tensorrt["compileImage"] == f"inferfleet/runtime-tensorrt:{APP_VERSION}"
    assert "sm90" in tensorrt["architectures"]
    # Compiled outranks paged where both fit (NVIDIA pools under policy Auto).
    assert tensorrt["priority"] > runtimes["paged-cuda"]["spec"]["priority"]
    assert runtimes["paged-cuda"]["spec"]["gpuResource"] == "nvidia.com/gpu"
    assert "gpuResource" not in runtimes["paged-cpu"]["spec"]
    assert all("compileImage" not in r["spec"] for r in runtimes.values() if r["spec"]["engine"] == "Paged")


def test_every_default_runtime_passes_the_crd_schema_and_the_operator_parser(render):
    schema = _crd_schema()
    for name, runtime in _runtimes(render()).items():
        jsonschema.validate(runtime["spec"], schema)
        assert parse_runtime(runtime).name == name
        assert runtime["apiVersion"] == "inferfleet.dev/v1alpha1" and "namespace" not in runtime["metadata"]


def test_runtimes_wait_until_the_api_serves_their_kind(render):
    # Helm builds every object of a release before creating any: on the install that creates the CRD
    # an InferenceRuntime cannot be built, so the runtimes come with the next upgrade.
    assert _runtimes(render(served=False)) == {}
    for runtime in _runtimes(render()).values():
        assert "helm.sh/hook" not in (runtime["metadata"].get("annotations") or {})  # release objects, not hooks


def test_images_follow_the_default_tag_unless_a_runtime_sets_its_own(render):
    values = {
        "runtimes": {"tag": "2.0.0", "items": {"paged-rocm": {"image": {"repository": "mirror/rocm", "tag": "6.3"}}}}
    }
    runtimes = _runtimes(render(values))
    assert runtimes["paged-cuda"]["spec"]["image"] == "inferfleet/runtime-cuda:2.0.0"
    assert runtimes["compiled-tensorrt"]["spec"]["compileImage"] == "inferfleet/runtime-tensorrt:2.0.0"
    assert runtimes["paged-rocm"]["spec"]["image"] == "mirror/rocm:6.3"
    assert _runtimes(render())["paged-cuda"]["spec"]["image"] == f"inferfleet/runtime-cuda:{APP_VERSION}"


def test_runtimes_can_be_disabled_one_by_one_or_all(render):
    runtimes = _runtimes(render({"runtimes": {"items": {"compiled-tensorrt": {"enabled": False}}}}))
    assert set(runtimes) == {"paged-cuda", "paged-rocm", "paged-xpu", "paged-cpu"}
    assert _runtimes(render({"runtimes": {"create": False}})) == {}


def test_new_silicon_is_one_more_entry(render):
    gaudi = {
        "enabled": True,
        "engine": "Paged",
        "vendors": ["habana"],
        "gpuResource": "habana.ai/gaudi",
        "priority": 50,
        "image": {"repository": "acme/runtime-gaudi", "tag": "1.0"},
    }
    runtime = _runtimes(render({"runtimes": {"items": {"paged-gaudi": gaudi}}}))["paged-gaudi"]
    assert runtime["spec"] == {
        "engine": "Paged",
        "vendors": ["habana"],
        "image": "acme/runtime-gaudi:1.0",
        "gpuResource": "habana.ai/gaudi",
        "priority": 50,
    }
    jsonschema.validate(runtime["spec"], _crd_schema())


def test_default_runtimes_serve_intel_nodes_of_either_driver_with_the_resource_they_advertise(render):
    from datetime import datetime

    from inferfleet_operator.plan.planner import plan_service

    runtimes = list(_runtimes(render()).values())
    service = {
        "metadata": {"name": "llama", "namespace": "default", "uid": "u"},
        "spec": {"model": {"name": "m", "uri": "hf://org/m"}, "replicas": 1},
    }
    for resource in ("gpu.intel.com/i915", "gpu.intel.com/xe"):
        node = {
            "metadata": {"name": "intel-0", "labels": {"gpu.intel.com/product": "Max_1550"}},
            "status": {
                "allocatable": {"cpu": "32", resource: "4"},
                "conditions": [{"type": "Ready", "status": "True"}],
            },
        }
        plan = plan_service(service, [node], runtimes, {}, {}, datetime(2026, 1, 1, tzinfo=UTC))
        (entry,) = plan.status["pools"]
        assert entry["runtime"] == "paged-xpu" and entry["desiredReplicas"] == 1
        (deployment,) = [c for c in plan.children if c["kind"] == "Deployment"]
        assert deployment["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"][resource] == "1"

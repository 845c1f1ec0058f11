"""The InferencePool: golden manifests, a selector that covers every pool's serving pods, and when none is planned."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import yaml
from planning_data import NOW, RUNTIMES, cpu, h100, mi300x, service

from inferfleet_operator.api import names
from inferfleet_operator.api.types import DEFAULT_SETTINGS, PlanSettings, parse_service
from inferfleet_operator.plan import routing
from inferfleet_operator.plan.planner import plan_service

GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "routing"
UPDATE = os.environ.get("INFERFLEET_UPDATE_GOLDEN") == "1"
PICKER = {"name": "llama-epp", "port": 9002}

SCENARIOS = {
    "inferencepool-llama": service(),
    "inferencepool-llama-with-picker": service(routing={"endpointPicker": PICKER | {"failureMode": "FailOpen"}}),
}


def _services(obj: dict):
    obj["metadata"].setdefault("uid", "uid-llama")
    return parse_service(obj)


@pytest.mark.parametrize("name", sorted(SCENARIOS))
def test_inference_pool_matches_golden(name):
    text = yaml.safe_dump(routing.inference_pool_for(_services(SCENARIOS[name]), DEFAULT_SETTINGS), sort_keys=False)
    path = GOLDEN / f"{name}.yaml"
    if UPDATE:
        GOLDEN.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    assert path.exists(), f"missing golden {path.name}: run with INFERFLEET_UPDATE_GOLDEN=1"
    assert text == path.read_text(), f"{name} changed: review, then run with INFERFLEET_UPDATE_GOLDEN=1"


def test_every_routing_golden_file_is_produced():
    assert {p.stem for p in GOLDEN.glob("*.yaml")} == set(SCENARIOS)


def _labels_match(selector: dict, labels: dict) -> bool:
    return all(labels.get(k) == v for k, v in selector["matchLabels"].items())


def test_selector_covers_the_serving_pods_of_every_pool_and_no_other_service():
    obj = service(replicas=3)
    obj["metadata"]["uid"] = "uid-llama"
    obj["spec"]["pools"] = [{"name": "cpu-amd64", "replicas": 1}]  # a CPU pool serves only when asked
    plan = plan_service(obj, [h100("h1"), mi300x("m1"), cpu("c1")], RUNTIMES, {}, {}, NOW)
    pool = routing.inference_pool_for(parse_service(obj), DEFAULT_SETTINGS)
    deployments = [c for c in plan.children if c["kind"] == "Deployment"]
    assert len(deployments) == 3
    for deployment in deployments:
        assert _labels_match(pool["spec"]["selector"], deployment["spec"]["template"]["metadata"]["labels"])
    other = plan_service(service("other"), [h100("h1")], RUNTIMES, {}, {}, NOW)
    other_pods = [c["spec"]["template"]["metadata"]["labels"] for c in other.children if c["kind"] == "Deployment"]
    assert other_pods and not any(_labels_match(pool["spec"]["selector"], labels) for labels in other_pods)


def test_target_port_is_the_serving_port_and_the_pool_is_owned_by_the_service():
    pool = routing.inference_pool_for(_services(service()), PlanSettings(port=8123))
    assert pool["spec"]["targetPorts"] == [{"number": 8123}]
    (owner,) = pool["metadata"]["ownerReferences"]
    assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == (
        "InferenceService",
        "llama",
        "uid-llama",
        True,
    )
    assert pool["apiVersion"] == "inference.networking.k8s.io/v1"


def test_endpoint_picker_reference_is_filled_with_the_gaie_defaults():
    pool = routing.inference_pool_for(_services(service(routing={"endpointPicker": PICKER})), DEFAULT_SETTINGS)
    assert pool["spec"]["endpointPickerRef"] == {
        "group": "",
        "kind": "Service",
        "name": "llama-epp",
        "port": {"number": 9002},
        "failureMode": "FailClose",
    }


@pytest.mark.parametrize(
    "mode, is_served, is_allowed, has_pool, reason",
    [
        ("Auto", True, True, True, routing.REASON_APPLIED),
        ("Enabled", True, True, True, routing.REASON_APPLIED),
        ("Auto", False, True, False, routing.REASON_CRD_ABSENT),
        ("Enabled", False, True, False, routing.REASON_CRD_ABSENT),
        ("Auto", True, False, False, routing.REASON_OPERATOR_DISABLED),
        ("Disabled", True, True, False, routing.REASON_DISABLED),
    ],
)
def test_pool_is_planned_only_when_asked_allowed_and_served(mode, is_served, is_allowed, has_pool, reason):
    plan = routing.plan_routing(
        _services(service(routing={"inferencePool": mode})), ["nvidia-h100"], is_served, is_allowed, DEFAULT_SETTINGS
    )
    assert (plan.pool is not None) == has_pool
    assert plan.status["reason"] == reason
    if has_pool:
        assert plan.status["inferencePool"] == "llama" and plan.status["pools"] == ["nvidia-h100"]


VENDORED = (
    Path(__file__).resolve().parents[3] / "e2e" / "crds-thirdparty" / "inferencepools.inference.networking.k8s.io.yaml"
)


def test_the_vendored_gaie_crd_serves_the_api_version_the_operator_writes():
    crd = yaml.safe_load(VENDORED.read_text())
    assert crd["metadata"]["name"] == names.POOL_CRD
    served = [v["name"] for v in crd["spec"]["versions"] if v["served"]]
    assert names.POOL_VERSION in served and crd["spec"]["group"] == names.POOL_GROUP
    schema = next(v for v in crd["spec"]["versions"] if v["name"] == names.POOL_VERSION)["schema"]["openAPIV3Schema"]
    for name in SCENARIOS:  # every field the operator writes exists in the pinned schema
        spec = yaml.safe_load((GOLDEN / f"{name}.yaml").read_text())["spec"]
        assert set(spec) <= set(schema["properties"]["spec"]["properties"]), name


def test_the_vendored_crd_is_the_release_vendor_sh_pins():
    import re

    pinned = re.search(r'VERSION="\$\{1:-(v[0-9.]+)\}"', (VENDORED.parent / "vendor.sh").read_text()).group(1)
    crd = yaml.safe_load(VENDORED.read_text())
    assert crd["metadata"]["annotations"]["inference.networking.k8s.io/bundle-version"] == pinned
    assert f"@{pinned}" in VENDORED.read_text().splitlines()[0]

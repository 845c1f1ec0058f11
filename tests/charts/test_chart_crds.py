"""The chart's CRDs are the repository's crds/, with install and keep switches."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART_COPY = ROOT / "charts" / "inferfleet" / "files" / "crds"
SYNC = "python charts/inferfleet/hack/sync_files.py"
KINDS = {"InferenceService", "InferenceRuntime", "EngineBuild"}


def _repository_crds() -> dict[str, dict]:
    return {
        crd["metadata"]["name"]: crd
        for path in sorted((ROOT / "crds").glob("*.yaml"))
        for crd in yaml.safe_load_all(path.read_text())
        if crd
    }


def _inferfleet_crds(objects: list[dict]) -> dict[str, dict]:
    return {
        obj["metadata"]["name"]: obj
        for obj in objects
        if obj["kind"] == "CustomResourceDefinition" and obj["spec"]["group"] == "inferfleet.dev"
    }


def test_chart_copy_of_crds_is_byte_for_byte_current():
    repository = {path.name: path.read_bytes() for path in (ROOT / "crds").glob("*.yaml")}
    copy = {path.name: path.read_bytes() for path in CHART_COPY.glob("*.yaml")}
    assert copy.keys() == repository.keys(), f"charts/inferfleet/files/crds/ lists other files than crds/: run {SYNC}"
    stale = [name for name in repository if copy[name] != repository[name]]
    assert stale == [], f"stale chart copies {stale}: run {SYNC}"


def test_rendered_crds_equal_the_repository_crds(render):
    expected = _repository_crds()
    assert {crd["spec"]["names"]["kind"] for crd in expected.values()} == KINDS
    rendered = _inferfleet_crds(render())
    assert rendered.keys() == expected.keys()
    for name, crd in rendered.items():
        want = expected[name]
        assert crd["spec"] == want["spec"], f"{name}: spec differs from crds/"
        assert {k: v for k, v in crd.items() if k != "metadata"} == {k: v for k, v in want.items() if k != "metadata"}
        # The chart only adds its labels and the keep annotation.
        assert crd["metadata"]["labels"].items() >= (want["metadata"].get("labels") or {}).items()
        assert crd["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"
        for key, value in (want["metadata"].get("annotations") or {}).items():
            assert crd["metadata"]["annotations"][key] == value


@pytest.mark.parametrize(("keep", "policy"), [(True, "keep"), (False, None)])
def test_keep_switch_sets_the_resource_policy(render, keep, policy):
    objects = render({"crds": {"keep": keep}}, served=False)
    crds = _inferfleet_crds(objects)
    peering = [
        obj for obj in objects if obj["kind"] == "CustomResourceDefinition" and obj["spec"]["group"] == "kopf.dev"
    ]
    assert len(crds) == 3 and len(peering) == 2
    for crd in [*crds.values(), *peering]:
        assert (crd["metadata"].get("annotations") or {}).get("helm.sh/resource-policy") == policy


def test_crds_can_be_left_out_of_the_release(render, of_kind):
    objects = render({"crds": {"enabled": False}, "replicaCount": 2}, served=False)
    assert not of_kind(objects, "CustomResourceDefinition")
    # Everything else still renders: the operator needs the CRDs, not the chart's copy of them.
    assert of_kind(objects, "Deployment")
    assert of_kind(render({"crds": {"enabled": False}}), "InferenceRuntime")


def test_kopf_peering_crds_come_with_the_others_whatever_the_replica_count(render):
    names = {obj["metadata"]["name"] for obj in render(served=False) if obj["kind"] == "CustomResourceDefinition"}
    assert {"clusterkopfpeerings.kopf.dev", "kopfpeerings.kopf.dev"} <= names

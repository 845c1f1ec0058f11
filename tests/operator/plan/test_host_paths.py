"""file:// model URIs mount a host folder only under a root the administrator allowed (chart value
modelHostPaths.allowedRoots, operator flag --model-host-path-root); any other is refused before anything mounts it."""

from __future__ import annotations

import pytest
from planning_data import NOW, RUNTIMES, cpu, h100, service, with_state

from inferfleet_operator.api.types import PlanSettings
from inferfleet_operator.plan.builds import plan_build
from inferfleet_operator.plan.host_paths import allowed_host_path, normalise
from inferfleet_operator.plan.planner import plan_service

ROOTS = ("/srv/models", "/data/shared/")
ALLOWED = PlanSettings(host_path_roots=ROOTS)
NODES = [h100("h1"), cpu("c1")]


def _file_service(path: str) -> dict:
    # 9 replicas: 8 fill the H100 pool (compiled, bridged with paged meanwhile), the 9th goes to the CPU pool.
    return service(model={"name": "x", "uri": f"file://{path}"}, placement={"vendors": ["nvidia", "cpu"]}, replicas=9)


def _host_paths(p, settings: PlanSettings = ALLOWED) -> list[str]:
    """Every hostPath the plan's Deployments and its builds' compile Jobs would mount."""
    jobs = [plan_build(with_state(b, "Pending") | {"status": {}}, [], NOW, settings).job for b in p.engine_builds]
    return [
        volume["hostPath"]["path"]
        for manifest in p.children + jobs
        for volume in ((manifest.get("spec") or {}).get("template") or {}).get("spec", {}).get("volumes", [])
        if "hostPath" in volume
    ]


def _condition(p, type_: str) -> dict:
    return next(c for c in p.status["conditions"] if c["type"] == type_)


@pytest.mark.parametrize(
    "path, expected",
    [
        ("/srv/models/x", "/srv/models/x"),
        ("/srv/models/x/", "/srv/models/x"),
        ("//srv//models///x", "/srv/models/x"),
        ("/srv/models/./x/../y", "/srv/models/y"),
        ("/srv/models/../../../etc", "/etc"),
        ("/", "/"),
        ("/..", "/"),
    ],
)
def test_paths_are_normalised_before_any_comparison(path, expected):
    assert normalise(path) == expected


@pytest.mark.parametrize(
    "path, normalised",
    [
        ("/srv/models/llama", "/srv/models/llama"),
        ("/srv/models", "/srv/models"),
        ("/srv/models/", "/srv/models"),
        ("//srv//models/a/../llama/", "/srv/models/llama"),
        ("/data/shared/x", "/data/shared/x"),
    ],
)
def test_a_path_under_an_allowed_root_is_allowed_as_its_normalised_form(path, normalised):
    assert allowed_host_path(path, ROOTS) == normalised


@pytest.mark.parametrize(
    "path",
    [
        "/srv/models-other/x",  # a sibling sharing the root's prefix, not under it
        "/srv/model",
        "/srv/models/../secrets",
        "/srv/models/x/../../../var/lib/kubelet",
        "//",
        "/var/lib/kubelet/pods",
        "/data/sharedx",
    ],
)
def test_a_path_outside_every_allowed_root_is_refused(path):
    assert allowed_host_path(path, ROOTS) is None


def test_no_path_is_allowed_without_roots_and_every_one_under_root_slash():
    assert allowed_host_path("/srv/models/x", ()) is None
    assert allowed_host_path("/var/lib/kubelet", ("/",)) == "/var/lib/kubelet"


@pytest.mark.parametrize(
    "path", ["//", "/var/lib/kubelet", "/srv/models/../../etc", "/srv/models-other/x"]
)  # file:////: the root
def test_a_service_whose_file_uri_is_not_allowed_mounts_nothing_and_says_which_setting_allows_it(path):
    p = plan_service(_file_service(path), NODES, RUNTIMES, {}, {}, NOW, ALLOWED)
    assert _host_paths(p) == []
    assert not [c for c in p.children if c["kind"] == "Deployment"] and p.engine_builds == []
    degraded, ready = _condition(p, "Degraded"), _condition(p, "Ready")
    assert (degraded["status"], degraded["reason"]) == ("True", "HostPathNotAllowed")
    assert (ready["status"], ready["reason"]) == ("False", "HostPathNotAllowed")
    for message in (degraded["message"], ready["message"]):
        assert "modelHostPaths.allowedRoots" in message and "--model-host-path-root" in message
    assert [e.reason for e in p.events if e.type == "Warning"] == ["HostPathNotAllowed"]


def test_by_default_no_host_path_is_allowed():
    p = plan_service(_file_service("/srv/models/x"), NODES, RUNTIMES, {}, {}, NOW)
    assert _host_paths(p) == []
    assert _condition(p, "Degraded")["reason"] == "HostPathNotAllowed"


def test_a_service_under_an_allowed_root_mounts_the_normalised_path():
    p = plan_service(_file_service("//srv/models/./llama/"), NODES, RUNTIMES, {}, {}, NOW, ALLOWED)
    paths = _host_paths(p)
    assert paths == ["/srv/models/llama"] * 3  # the two pools' Deployments and the compile Job
    assert _condition(p, "Degraded")["reason"] != "HostPathNotAllowed"


def test_deployments_of_a_service_whose_root_was_withdrawn_are_deleted():
    svc = _file_service("/srv/models/llama")
    first = plan_service(svc, [cpu("c1")], RUNTIMES, {}, {}, NOW, ALLOWED)
    (deployment,) = [c for c in first.children if c["kind"] == "Deployment"]
    later = plan_service(svc, [cpu("c1")], RUNTIMES, {}, {deployment["metadata"]["name"]: deployment}, NOW)
    assert ("Deployment", deployment["metadata"]["name"]) in [(k, meta["name"]) for k, meta in later.stale]

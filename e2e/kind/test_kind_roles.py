"""The kind tier runs in a cluster of its own, never the demo's: the demo's cluster (e2e/kind/demo.sh, left up
on purpose) keeps its release, CRDs and InferenceService whatever the tier installs and uninstalls. This module
runs after the fleet and autoscaling modules (pytest takes a folder's files in name order), so its last check
sees what the tier left behind."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest
from helpers import Cluster, condition

KIND_DIR = Path(__file__).resolve().parent
DEMO_RELEASE, DEMO_NAMESPACE, DEMO_WORKLOADS = "inferfleet", "inferfleet-system", "inferfleet-demo"


def _lib(role: str | None) -> subprocess.CompletedProcess:
    """The cluster name and state folder lib.sh gives a role (None: the default, the demo's)."""
    env = {k: v for k, v in os.environ.items() if k not in ("INFERFLEET_KIND_CLUSTER", "INFERFLEET_KIND_STATE")}
    env.pop("INFERFLEET_KIND_ROLE", None)
    if role is not None:
        env["INFERFLEET_KIND_ROLE"] = role
    script = 'source "$1"; echo "$cluster"; echo "$state"'
    return subprocess.run(
        ["bash", "-c", script, "_", str(KIND_DIR / "lib.sh")], capture_output=True, text=True, env=env
    )


def _names(role: str | None) -> tuple[str, str]:
    result = _lib(role)
    assert result.returncode == 0, result.stderr
    cluster, state = result.stdout.split()
    return cluster, state


def test_the_tier_and_the_demo_get_different_clusters_and_state_folders():
    demo, tests = _names(None), _names("tests")
    assert _names("demo") == demo
    assert demo[0] != tests[0] and demo[1] != tests[1]
    assert tests[0] == f"{demo[0]}-tests"


def test_an_unknown_role_is_refused_naming_the_roles():
    result = _lib("prod")
    assert result.returncode == 2
    assert "INFERFLEET_KIND_ROLE must be demo or tests, not 'prod'" in result.stderr


@pytest.mark.e2e
@pytest.mark.slow
def test_the_demo_cluster_keeps_its_release_and_service_after_the_tier(kind_cluster):
    demo_cluster, _ = _names(None)
    assert kind_cluster.env["KIND_CLUSTER"] != demo_cluster
    running = subprocess.run(
        ["docker", "inspect", "-f", "{{.State.Running}}", f"{demo_cluster}-control-plane"],
        capture_output=True,
        text=True,
    )
    kubeconfig = Path(_names(None)[1]) / "kubeconfig"  # the demo's own, written by its up.sh
    if running.stdout.strip() != "true" or not kubeconfig.is_file():
        pytest.skip(f"the demo's cluster {demo_cluster} is not running here (bash e2e/kind/demo.sh brings it up)")
    demo = Cluster(kubeconfig, kind_cluster.bin)
    releases = json.loads(demo.helm("list", "--namespace", DEMO_NAMESPACE, "--output", "json").stdout or "[]")
    assert [(r["name"], r["status"]) for r in releases] == [(DEMO_RELEASE, "deployed")]
    crd = demo.get("crd", "inferenceservices.inferfleet.dev")
    assert crd, "the demo's CRDs are gone"
    annotations = crd["metadata"].get("annotations") or {}
    assert annotations.get("meta.helm.sh/release-name") == DEMO_RELEASE
    service = demo.get("infsvc", "demo", DEMO_WORKLOADS)
    assert service, "the demo's InferenceService is gone"
    assert (condition(service, "Ready") or {}).get("status") == "True", service.get("status")


def test_stopped_inferfleet_clusters_are_deleted_and_running_or_foreign_ones_kept(tmp_path):
    # A fake kind and docker: four clusters, two of them running; deletions are recorded.
    kind = tmp_path / "kind"
    kind.write_text(
        "#!/bin/sh\n"
        'if [ "$1" = get ]; then printf "inferfleet-aaaaaa\\ninferfleet-bbbbbb\\ninferfleet-cccccc\\nother\\n"; fi\n'
        f'if [ "$1" = delete ]; then echo "$4" >> {tmp_path}/deleted; fi\n'
    )
    docker = tmp_path / "docker"
    docker.write_text('#!/bin/sh\ncase "$4" in inferfleet-aaaaaa-*) echo true ;; *) echo false ;; esac\n')
    for tool in (kind, docker):
        tool.chmod(0o755)
    script = 'source "$1"; delete_stopped_clusters "$2" inferfleet-cccccc'
    result = subprocess.run(
        ["bash", "-c", script, "_", str(KIND_DIR / "lib.sh"), str(kind)],
        capture_output=True,
        text=True,
        env={**os.environ, "PATH": f"{tmp_path}:{os.environ['PATH']}"},
    )
    assert result.returncode == 0, result.stderr
    # aaaaaa runs, cccccc is the cluster being brought up, "other" is not ours: only bbbbbb goes.
    assert (tmp_path / "deleted").read_text().split() == ["inferfleet-bbbbbb"]
    assert "Deleted kind cluster inferfleet-bbbbbb (its node was not running)" in result.stderr

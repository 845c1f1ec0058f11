"""Fixtures for the kind tier: this work tree's test cluster (e2e/kind/up.sh with INFERFLEET_KIND_ROLE=tests)
with real CPU capacity and simulated GPU pools, brought up once per session and deleted afterwards when the
session made it. It is not the demo's cluster (e2e/kind/demo.sh), which stays as the demo left it: the tier
installs, upgrades and uninstalls its own release of the chart, CRDs included, where no demo can own them.

Environment:
- INFERFLEET_KEEP_CLUSTER=1: leave the test cluster up after the session (the next one reuses it).
- INFERFLEET_CLUSTER_BIN: the control-plane binaries (kubectl, helm) as for the other e2e tiers.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from helpers import ROOT, Cluster, cluster_bin

KIND_DIR = ROOT / "e2e" / "kind"


class KindCluster(Cluster):
    """The e2e Cluster handle plus what up.sh reports: images, node container, model folder."""

    def __init__(self, env: dict[str, str], bin_dir: Path):
        super().__init__(Path(env["KUBECONFIG"]), bin_dir)
        self.env = env
        self.runtime_image = env["RUNTIME_IMAGE"]
        self.operator_image = env["OPERATOR_IMAGE"]
        self.models_dir = Path(env["MODELS_DIR"])
        self.models_node_dir = env["MODELS_NODE_DIR"]


def _script(name: str, env: dict, log: Path) -> subprocess.CompletedProcess:
    with log.open("a") as stderr:
        return subprocess.run(["bash", str(KIND_DIR / name)], stdout=subprocess.PIPE, stderr=stderr, text=True, env=env)


@pytest.fixture(scope="session")
def kind_cluster(tmp_path_factory) -> KindCluster:
    bin_dir = cluster_bin()
    env = {**os.environ, "INFERFLEET_CLUSTER_BIN": str(bin_dir), "INFERFLEET_KIND_ROLE": "tests"}
    log = tmp_path_factory.mktemp("kind") / "up.log"
    docker = subprocess.run(["bash", str(KIND_DIR / "docker.sh")], capture_output=True, text=True, env=env)
    if docker.returncode != 0:
        # The only skip in the tier: no Docker engine can run here (the message says why).
        pytest.skip(
            f"no Docker engine: {docker.stderr.strip().splitlines()[-1] if docker.stderr.strip() else 'docker.sh failed'}"
        )
    listing = subprocess.run(
        ["bash", "-c", f'"$(bash {KIND_DIR}/node-bins.sh)/kind" get clusters'], capture_output=True, text=True, env=env
    )
    up = _script("up.sh", env, log)
    if up.returncode != 0:
        pytest.fail(f"e2e/kind/up.sh failed:\n{log.read_text()[-4000:]}")
    state = dict(line.split("=", 1) for line in Path(up.stdout.strip()).read_text().splitlines() if "=" in line)
    was_up = state["KIND_CLUSTER"] in listing.stdout.split()
    print(log.read_text())
    yield KindCluster(state, bin_dir)
    if not was_up and os.environ.get("INFERFLEET_KEEP_CLUSTER") != "1":
        _script("down.sh", env, log)

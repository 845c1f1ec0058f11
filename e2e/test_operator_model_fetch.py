"""A gated model fetched with the token from the service's credentials Secret, as the operator renders it.

KWOK runs no containers, so the pod's `fetch-model` init container is read back from the Deployment the
operator wrote and run here as a process: its command and args as rendered (paths under /models and /tmp
remapped to a temporary folder), the Secret's keys (read from the API as admin) as its environment, as the
kubelet would give them, against the stand-in Hub on loopback that refuses requests without the token.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from helpers import Cluster, run_init_container, wait_for
from operator_process import service_manifest

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "runtime" / "support"))
from hub_standin import COMMIT, HubStandIn  # noqa: E402  (the Hub stand-in shared with the runtime tests)

pytestmark = pytest.mark.e2e

REPO = "inferfleet/gated"
TOKEN = "hf_e2e_gated_token"


def _pod_folders(root: Path) -> dict[str, Path]:
    return {"/models": root / "models", "/tmp": root / "tmp"}


def test_gated_model_is_fetched_with_the_token_from_the_credentials_secret(cluster: Cluster, ns, tmp_path):
    from inferfleet_runtime.demo.builtin_model import ensure_demo_model
    from inferfleet_runtime.fetch.content_digest import SOURCE_NAME, read_commit

    hub = HubStandIn(REPO, ensure_demo_model(), required_token=TOKEN)
    endpoint = hub.start()
    try:
        cluster.apply(
            {
                "apiVersion": "v1",
                "kind": "Secret",
                "metadata": {"name": "hub-token"},
                "stringData": {"HF_TOKEN": TOKEN},
            },
            namespace=ns,
        )
        applied = cluster.apply(
            service_manifest(
                "gated",
                placement={"vendors": ["cpu"]},
                model={"name": "gated", "uri": f"hf://{REPO}", "credentialsSecret": "hub-token"},
            ),
            namespace=ns,
            check=False,
        )
        assert applied.returncode == 0, applied.stderr
        deployment = wait_for(
            lambda: cluster.get("deployment", "gated-cpu-amd64", ns), timeout=60, message="the operator's Deployment"
        )
        [init] = deployment["spec"]["template"]["spec"]["initContainers"]
        assert init["envFrom"] == [{"secretRef": {"name": "hub-token"}}]

        done = run_init_container(cluster, ns, init, _pod_folders(tmp_path / "pod"), endpoint)
        assert done.returncode == 0, done.stderr[-3000:]
        assert TOKEN not in done.stdout + done.stderr
        to = tmp_path / "pod" / "models" / Path(init["args"][init["args"].index("--to") + 1]).relative_to("/models")
        fetched = {p.name: p.read_bytes() for p in to.iterdir() if p.is_file() and p.name != SOURCE_NAME}
        assert fetched == hub.files()
        assert read_commit(to) == COMMIT  # what a compile of these files is addressed by

        init_without = {**init, "envFrom": []}  # the same container without the Secret is refused
        refused = run_init_container(cluster, ns, init_without, _pod_folders(tmp_path / "refused"), endpoint)
        assert refused.returncode == 1 and "HF_TOKEN is not set" in refused.stderr
    finally:
        cluster.kubectl("delete", "inferenceservice", "gated", "-n", ns, "--timeout=30s", check=False)
        hub.stop()

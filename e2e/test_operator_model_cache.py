"""The node model cache as the operator renders it (--model-cache-claim): the pods' `fetch-model` init containers,
read back from the Deployments a real API server accepted and run here as processes (KWOK runs no containers), all
on one "node": their /model-cache mount is one shared folder, each pod's /models and /tmp its own. Fetches are
counted at the stand-in Hub (GETs of the weights), not assumed: two replicas and a second service of the same model
cause one download; a tampered entry is refused and downloaded again."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
from helpers import Cluster, run_init_container, wait_for
from operator_process import (
    FAST_FLAGS,
    OperatorProcess,
    install,
    service_manifest,
    serving,
)

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests" / "runtime" / "support"))
from hub_standin import HubStandIn  # noqa: E402  (the Hub stand-in shared with the runtime tests)

pytestmark = pytest.mark.e2e

REPO = "inferfleet/cached"
CLAIM = "inferfleet-model-cache"
BUDGET = 1 << 30


@pytest.fixture(scope="module")
def operator(cluster, tmp_path_factory):
    work = tmp_path_factory.mktemp("model-cache")
    flags = FAST_FLAGS + [f"--model-cache-claim={CLAIM}", f"--model-cache-budget={BUDGET}"]
    process = OperatorProcess(install(cluster, work), work / "operator.log", flags)
    with serving(cluster, process):
        yield process


def _weight_downloads(hub: HubStandIn) -> int:
    return sum(1 for r in hub.requests if r.method == "GET" and r.path.endswith(".safetensors"))


def _pod(node_cache: Path, root: Path) -> dict[str, Path]:
    return {"/models": root / "models", "/tmp": root / "tmp", "/model-cache": node_cache}


def _init_and_server(cluster: Cluster, ns: str, name: str) -> tuple[dict, dict]:
    deployment = wait_for(lambda: cluster.get("deployment", name, ns), timeout=60, message=f"the Deployment {name}")
    pod = deployment["spec"]["template"]["spec"]
    [init] = pod["initContainers"]
    [server] = pod["containers"]
    assert {"name": "model-cache", "persistentVolumeClaim": {"claimName": CLAIM}} in pod["volumes"]
    return init, server


def test_replicas_and_services_of_one_model_on_a_node_download_it_once(cluster: Cluster, ns, tmp_path):
    from inferfleet_runtime.demo.builtin_model import ensure_demo_model

    hub = HubStandIn(REPO, ensure_demo_model())
    endpoint = hub.start()
    node_cache = tmp_path / "node-cache"
    model = {"name": "cached", "uri": f"hf://{REPO}"}
    try:
        for name in ("first", "second"):
            cluster.apply(service_manifest(name, replicas=2, placement={"vendors": ["cpu"]}, model=model), namespace=ns)
        init, server = _init_and_server(cluster, ns, "first-cpu-amd64")
        assert init["args"][-4:] == ["--node-cache", "/model-cache", "--node-cache-budget", str(BUDGET)]
        # The server reads the cache, only the fetch writes it.
        assert {"name": "model-cache", "mountPath": "/model-cache", "readOnly": True} in server["volumeMounts"]
        assert {"name": "model-cache", "mountPath": "/model-cache"} in init["volumeMounts"]

        # Two replicas of the first service and one of the second, on one node.
        other_init, _ = _init_and_server(cluster, ns, "second-cpu-amd64")
        runs = [
            run_init_container(cluster, ns, container, _pod(node_cache, tmp_path / pod), endpoint)
            for container, pod in ((init, "a"), (init, "b"), (other_init, "c"))
        ]
        assert [r.returncode for r in runs] == [0, 0, 0], [r.stderr[-2000:] for r in runs]
        assert _weight_downloads(hub) == 1
        assert "fetched into the node cache" in runs[0].stderr
        assert all("found in the node cache" in r.stderr for r in runs[1:])
        fetches = [json.loads(line) for line in (node_cache / "fetches.jsonl").read_text().splitlines()]
        assert len(fetches) == 1 and fetches[0]["uri"] == f"hf://{REPO}"
        # Each pod's model folder is a link to the one entry, holding the Hub's bytes.
        entry = node_cache / "entries" / fetches[0]["digest"]
        for pod in ("a", "b", "c"):
            link = tmp_path / pod / "models" / "model"
            assert link.is_symlink() and link.resolve() == entry.resolve()
        held = {p.name: p.read_bytes() for p in entry.iterdir() if p.is_file() and not p.name.startswith(".")}
        assert held == hub.files()

        # A byte of the weights changed on the node: the next pod refuses the entry and downloads it again.
        weights = next(entry.glob("*.safetensors"))
        data = bytearray(weights.read_bytes())
        data[-1] ^= 0xFF
        weights.write_bytes(bytes(data))
        again = run_init_container(cluster, ns, init, _pod(node_cache, tmp_path / "d"), endpoint)
        assert again.returncode == 0, again.stderr[-2000:]
        assert "Refused a node-cache entry" in again.stderr and "not its name" in again.stderr
        assert _weight_downloads(hub) == 2
        assert next(entry.glob("*.safetensors")).read_bytes() == hub.files()[weights.name]
    finally:
        for name in ("first", "second"):
            cluster.kubectl("delete", "inferenceservice", name, "-n", ns, "--timeout=30s", check=False)
        hub.stop()

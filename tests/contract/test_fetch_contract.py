"""Fetch contract: every model source the operator renders, run as rendered against the runtime CLI.

For each `spec.model` variant the planner renders the serving Deployment (the paged bridge on an H100 pool
while its engine builds) and the compile Job; each rendered `fetch-model` init container's command and args
are run as a local process, hf:// against the stand-in Hub and s3:// against a local S3 server (moto). What
differs from a pod, and why:
- paths under the pod's mounts (/models, /tmp) are remapped to temporary folders;
- the container's `envFrom` Secrets are given as a dict of Secret data (the operator never reads Secrets);
- HF_ENDPOINT points the Hub client at the stand-in (a pod reaches huggingface.co); an S3-compatible store's
  AWS_ENDPOINT_URL comes from the Secret, as a user would set it.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from planning_data import NOW, RUNTIMES, h100, service

from inferfleet_operator.api.types import PlanSettings
from inferfleet_operator.plan.builds import plan_build
from inferfleet_operator.plan.planner import plan_service
from inferfleet_runtime.fetch.content_digest import SOURCE_NAME, read_commit

from ..runtime.support.hub_standin import COMMIT, HubStandIn
from ..runtime.support.s3_standin import REGION, S3StandIn

REPO = "inferfleet/demo"
TAG = "v1.0"
HUB_TOKEN = "hf_contract_test_token"
MOUNT = "/models"

# variant -> spec.model (uri and revision as a user writes them).
VARIANTS: dict[str, dict] = {
    "hf": {"uri": f"hf://{REPO}"},
    "hf-tag": {"uri": f"hf://{REPO}", "revision": TAG},
    "hf-commit": {"uri": f"hf://{REPO}@{COMMIT}", "revision": COMMIT},
    "hf-gated": {"uri": f"hf://{REPO}", "credentialsSecret": "hub-token"},
    "s3": {"uri": "s3://models/inferfleet/demo", "credentialsSecret": "s3-reader"},
    "file": {"uri": "file:///srv/models/demo"},
    "pvc": {"uri": "pvc://model-store/inferfleet/demo"},
}


# file:// mounts a host folder only under a root the administrator allowed (plan/host_paths.py).
SETTINGS = PlanSettings(host_path_roots=("/srv/models",))


def _render(model: dict) -> dict[str, dict]:
    """-> {"deployment": pod spec of the H100 pool's paged bridge, "job": pod spec of the compile Job}."""
    svc = service(
        "demo",
        model={"name": "inferfleet-demo"} | model,
        replicas=1,
        engine={"maxContextLength": 64, "maxBatchSize": 1, "dtype": "float32"},
    )
    plan = plan_service(svc, [h100("h1")], RUNTIMES, {}, {}, NOW, SETTINGS)
    [deployment] = [c for c in plan.children if c["kind"] == "Deployment"]
    [build] = plan.engine_builds
    job = plan_build(build | {"status": {}}, [], NOW).job
    return {"deployment": deployment["spec"]["template"]["spec"], "job": job["spec"]["template"]["spec"]}


RENDERED = {name: _render(model) for name, model in VARIANTS.items()}
POD_KINDS = ("deployment", "job")


def _main_container(pod: dict) -> dict:
    [container] = pod["containers"]
    return container


def _model_arg(pod: dict) -> str:
    args = _main_container(pod)["args"]
    return args[args.index("--model") + 1]


def _fetch_args(pod: dict) -> list[str]:
    [init] = pod["initContainers"]
    assert init["name"] == "fetch-model" and init["command"] == ["inferfleet-runtime"]
    return init["args"]


def _remap(value: str, root: Path) -> str:
    for mount in (MOUNT, "/tmp"):
        if value == mount or value.startswith(mount + "/"):
            return str(root / mount.strip("/")) + value[len(mount) :]
    return value


def _run_fetch(pod: dict, root: Path, secrets: dict[str, dict[str, str]], extra_env: dict[str, str]):
    [init] = pod["initContainers"]
    for mount in (MOUNT, "/tmp"):
        (root / mount.strip("/")).mkdir(parents=True, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "HF_"))}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"  # the image's entry point
    env.update(
        {
            "HF_HOME": str(root / "tmp" / "hf"),
            "AWS_CONFIG_FILE": "/nonexistent",
            "AWS_SHARED_CREDENTIALS_FILE": "/nonexistent",
            "AWS_EC2_METADATA_DISABLED": "true",
        }
    )
    env.update({item["name"]: _remap(item["value"], root) for item in init.get("env", [])})
    for source in init.get("envFrom", []):
        env.update(secrets[source["secretRef"]["name"]])
    env.update(extra_env)
    argv = init["command"] + [_remap(a, root) for a in init["args"]] + ["--no-progress"]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300, cwd=root / "tmp")


def _files(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): p.read_bytes()
        for p in sorted(root.rglob("*"))
        if p.is_file() and ".cache" not in p.relative_to(root).parts and p.name != SOURCE_NAME
    }


@pytest.fixture(scope="module")
def hub(demo_model_dir):
    stand_in = HubStandIn(REPO, demo_model_dir, revisions=("main", TAG, COMMIT))
    endpoint = stand_in.start()
    yield stand_in, endpoint
    stand_in.stop()


@pytest.fixture(scope="module")
def s3(demo_model_dir):
    server = S3StandIn()
    server.start()
    files = server.upload_dir("models", "inferfleet/demo", demo_model_dir)
    assert files == _files(demo_model_dir)
    yield server
    server.stop()


@pytest.mark.parametrize("kind", POD_KINDS)
@pytest.mark.parametrize("variant, revision", [("hf", None), ("hf-tag", TAG), ("hf-commit", COMMIT)])
def test_rendered_hf_fetch_fills_the_directory_the_container_reads(
    variant, revision, kind, hub, demo_model_dir, tmp_path
):
    stand_in, endpoint = hub
    pod = RENDERED[variant][kind]
    args = _fetch_args(pod)
    assert ("--revision" in args) == (revision is not None)
    if revision:
        assert args[args.index("--revision") + 1] == revision
    stand_in.requests.clear()
    done = _run_fetch(pod, tmp_path, {}, {"HF_ENDPOINT": endpoint})
    assert done.returncode == 0, done.stderr[-3000:]
    to = args[args.index("--to") + 1]
    assert _model_arg(pod) == to  # the server / compiler reads where fetch wrote
    assert _files(Path(_remap(to, tmp_path))) == _files(demo_model_dir)
    asked = {r.path.split("/revision/")[1] for r in stand_in.requests if "/revision/" in r.path}
    assert asked == {revision or "main"}
    # What the compiler keys the engine's directory on: the commit the revision resolved to.
    assert read_commit(Path(_remap(to, tmp_path))) == COMMIT


@pytest.mark.parametrize("kind", POD_KINDS)
def test_rendered_gated_hf_fetch_uses_the_token_from_the_credentials_secret(kind, hub, demo_model_dir, tmp_path):
    stand_in, endpoint = hub
    pod = RENDERED["hf-gated"][kind]
    [init] = pod["initContainers"]
    assert init["envFrom"] == [{"secretRef": {"name": "hub-token"}}]
    assert "envFrom" not in _main_container(pod)  # the token reaches the download only
    stand_in.required_token = HUB_TOKEN
    try:
        refused = _run_fetch(pod, tmp_path / "without", {"hub-token": {}}, {"HF_ENDPOINT": endpoint})
        assert refused.returncode == 1 and "HF_TOKEN is not set" in refused.stderr
        done = _run_fetch(pod, tmp_path / "with", {"hub-token": {"HF_TOKEN": HUB_TOKEN}}, {"HF_ENDPOINT": endpoint})
    finally:
        stand_in.required_token = None
    assert done.returncode == 0, done.stderr[-3000:]
    assert HUB_TOKEN not in done.stderr + done.stdout
    to = _fetch_args(pod)[_fetch_args(pod).index("--to") + 1]
    assert _files(Path(_remap(to, tmp_path / "with"))) == _files(demo_model_dir)


@pytest.mark.parametrize("kind", POD_KINDS)
def test_rendered_s3_fetch_reads_credentials_and_endpoint_from_the_secret(kind, s3, demo_model_dir, tmp_path):
    pod = RENDERED["s3"][kind]
    args = _fetch_args(pod)
    assert "--revision" not in args
    secret = {
        "AWS_ACCESS_KEY_ID": "contract",
        "AWS_SECRET_ACCESS_KEY": "contract-secret",
        "AWS_REGION": REGION,
        "AWS_ENDPOINT_URL": s3.endpoint,
    }
    # Before the Secret is rendered as envFrom, the same variables reach the process from outside.
    extra = {} if "envFrom" in pod["initContainers"][0] else secret
    done = _run_fetch(pod, tmp_path, {"s3-reader": secret}, extra)
    assert done.returncode == 0, done.stderr[-3000:]
    to = args[args.index("--to") + 1]
    assert _model_arg(pod) == to
    assert _files(Path(_remap(to, tmp_path))) == _files(demo_model_dir)


@pytest.mark.parametrize("kind", POD_KINDS)
@pytest.mark.parametrize(
    "variant, volume, model_dir",
    [
        ("file", {"name": "model", "hostPath": {"path": "/srv/models/demo", "type": "Directory"}}, MOUNT),
        (
            "pvc",
            {"name": "model", "persistentVolumeClaim": {"claimName": "model-store", "readOnly": True}},
            f"{MOUNT}/inferfleet/demo",
        ),
    ],
)
def test_mounted_sources_render_no_fetch_and_point_the_container_at_the_volume(variant, volume, model_dir, kind):
    pod = RENDERED[variant][kind]
    assert "initContainers" not in pod
    assert volume in pod["volumes"]
    assert _model_arg(pod) == model_dir
    mounts = {m["name"]: m for m in _main_container(pod)["volumeMounts"]}
    assert mounts["model"]["mountPath"] == MOUNT and mounts["model"]["readOnly"] is True

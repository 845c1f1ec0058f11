"""Pod-spec contract: the containers the operator renders run, as rendered, against the runtime CLI.

A serving Deployment and a compile Job are rendered by the planner (a CPU pool served paged, an NVIDIA
H100 pool served compiled once its EngineBuild is Ready); their container command, args and env are run
here as local processes with the built-in model. What differs from a pod, and why:
- paths under the pod's mounts (/models, /engines, /tmp) are remapped to temporary folders, the model
  volume holding the built-in model;
- the container port (8000) is remapped to a free local port, so parallel runs on one machine cannot clash;
- the compile Job targets TensorRT on sm90, which needs an NVIDIA GPU: here `--backend tensorrt` is replaced
  by `--backend aotinductor` and `--target-architecture sm90` by this machine's architecture. Every other
  flag is the rendered one. The engine is compiled afresh (the envelope is tiny: two graphs) rather than taken
  from the compiled-engine tests' cache, whose fixture lives with those tests and uses another key.
- the pod's user, read-only root filesystem and resource limits are not enforced.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from planning_data import NOW, RUNTIMES, cpu, h100, service, with_state

from inferfleet_operator.plan.builds import plan_build
from inferfleet_operator.plan.planner import plan_service

SERVED_NAME = "inferfleet-demo"
READY_SECONDS = 120


def _render() -> dict:
    """-> {"paged": cpu-pool server container, "compiled": h100-pool server container of a build whose status
    records no model digest, "compiled_after": (compile container's termination message -> the h100-pool server
    container once the build's Job succeeded with it), "compile": Job container, "key": engine key}."""
    svc = service(
        "demo",
        model={"name": SERVED_NAME, "uri": "pvc://models/demo"},
        replicas=9,
        placement={"vendors": ["nvidia", "cpu"]},  # the H100 takes 8, the CPU pool the ninth
        engine={"maxContextLength": 64, "maxBatchSize": 1, "dtype": "float32"},
    )
    nodes = [h100("h1"), cpu("c1")]
    first = plan_service(svc, nodes, RUNTIMES, {}, {}, NOW)
    [build] = first.engine_builds
    key = build["metadata"]["name"]
    built = with_state(build, "Ready")
    job = plan_build(built | {"status": {}}, [], NOW).job
    ready = plan_service(svc, nodes, RUNTIMES, {key: built}, {}, NOW)

    def server(name: str, plan=ready) -> dict:
        found = {c["metadata"]["name"]: c for c in plan.children if c["kind"] == "Deployment"}
        [container] = found[name]["spec"]["template"]["spec"]["containers"]
        return container

    def compiled_after(message: str) -> dict:
        """The build reconciled with its Job succeeded and the compile container's termination message."""
        job_name = job["metadata"]["name"]
        done = job | {"status": {"succeeded": 1, "conditions": [{"type": "Complete", "status": "True"}]}}
        job_pod = {
            "metadata": {"name": f"{job_name}-x", "labels": {"batch.kubernetes.io/job-name": job_name}},
            "status": {"containerStatuses": [
                {"name": "compile", "state": {"terminated": {"exitCode": 0, "message": message}}}]},
        }  # fmt: skip
        status = plan_build(built | {"status": {}}, [done], NOW, pods=[job_pod]).status
        assert status["state"] == "Ready"
        after = plan_service(svc, nodes, RUNTIMES, {key: built | {"status": status}}, {}, NOW)
        return server("demo-nvidia-h100-80gb-hbm3", after)

    [compile_container] = job["spec"]["template"]["spec"]["containers"]
    return {
        "paged": server("demo-cpu-amd64"),
        "compiled": server("demo-nvidia-h100-80gb-hbm3"),
        "compiled_after": compiled_after,
        "compile": compile_container,
        "key": key,
    }


RENDERED = _render()


class Pod:
    """Runs one rendered container locally with its mounts remapped under root."""

    def __init__(self, root: Path, model_dir: Path):
        self.mounts = {"/models": root / "models", "/engines": root / "engines", "/tmp": root / "tmp"}
        for path in self.mounts.values():
            path.mkdir(parents=True, exist_ok=True)
        (self.mounts["/models"] / "demo").symlink_to(model_dir)  # the PVC's "demo" subpath
        self.port = _free_port()
        self.log = root / "log.txt"

    def remap(self, value: str) -> str:
        for mount, local in self.mounts.items():
            if value == mount or value.startswith(mount + "/"):
                return str(local) + value[len(mount) :]
        return value

    def argv(self, container: dict, substitutions: dict[str, tuple[str, str]] | None = None) -> list[str]:
        args = [self.remap(a) for a in container["args"]]
        for flag, (rendered, local) in (substitutions or {}).items():
            i = args.index(flag)
            assert args[i + 1] == rendered, f"{flag} rendered as {args[i + 1]!r}, expected {rendered!r}"
            args[i + 1] = local
        if "--port" in args:
            i = args.index("--port")
            assert int(args[i + 1]) == _container_port(container)
            args[i + 1] = str(self.port)
        return container["command"] + args

    def env(self, container: dict) -> dict[str, str]:
        env = dict(os.environ)
        env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"  # the image's entry point
        env.update({item["name"]: self.remap(item["value"]) for item in container.get("env", [])})
        return env

    def start(self, container: dict, substitutions: dict[str, tuple[str, str]] | None = None) -> subprocess.Popen:
        with open(self.log, "ab") as log:
            return subprocess.Popen(
                self.argv(container, substitutions),
                env=self.env(container),
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.mounts["/tmp"],
            )

    def log_tail(self) -> str:
        return self.log.read_text(errors="replace")[-3000:] if self.log.exists() else ""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _container_port(container: dict, name: str = "http") -> int:
    return next(p["containerPort"] for p in container["ports"] if p["name"] == name)


def _probe_url(pod: Pod, container: dict, probe: str) -> str:
    get = container[probe]["httpGet"]
    port = get["port"]
    assert port == "http" or int(port) == _container_port(container)  # the named port is the served one
    return f"http://127.0.0.1:{pod.port}{get['path']}"


def _wait_ready(pod: Pod, container: dict, process: subprocess.Popen) -> None:
    url = _probe_url(pod, container, "readinessProbe")
    deadline = time.monotonic() + READY_SECONDS
    while True:
        assert process.poll() is None, f"the server exited with {process.returncode}:\n{pod.log_tail()}"
        try:
            if httpx.get(url, timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        assert time.monotonic() < deadline, (
            f"readiness probe {url} not passing after {READY_SECONDS}s:\n{pod.log_tail()}"
        )
        time.sleep(0.5)


def _stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def _served_name(container: dict) -> str:
    args = container["args"]
    return args[args.index("--served-model-name") + 1]


def _check_serves(pod: Pod, container: dict, process: subprocess.Popen) -> None:
    _wait_ready(pod, container, process)
    assert httpx.get(_probe_url(pod, container, "livenessProbe"), timeout=5).status_code == 200
    name = _served_name(container)
    assert name == SERVED_NAME
    models = httpx.get(f"http://127.0.0.1:{pod.port}/v1/models", timeout=10).json()
    assert [m["id"] for m in models["data"]] == [name]
    response = httpx.post(
        f"http://127.0.0.1:{pod.port}/v1/completions",
        timeout=60,
        json={
            "model": name,
            "prompt": "Beautiful is better than",
            "max_tokens": 4,
            "temperature": 0,
            "ignore_eos": True,
        },
    )
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["usage"]["completion_tokens"] == 4 and body["choices"][0]["text"].strip()


@pytest.mark.slow
def test_paged_serving_pod_passes_its_readiness_probe_and_answers_a_completion(demo_model_dir, tmp_path):
    container = RENDERED["paged"]
    assert container["args"][:2] == ["serve", "--model"]
    pod = Pod(tmp_path, demo_model_dir)
    process = pod.start(container)
    try:
        _check_serves(pod, container, process)
    finally:
        _stop(process)


@pytest.mark.slow
def test_compile_job_builds_an_engine_that_the_compiled_serving_pod_serves(demo_model_dir, tmp_path):
    import torch

    from inferfleet_runtime.compiled.manifest import (
        ENGINE_LOST_EXIT_CODE,
        device_architecture,
        engine_digest,
        read_manifest,
        verify_checksums,
        write_manifest,
    )
    from inferfleet_runtime.fetch.content_digest import content_digest, content_manifest

    key, job = RENDERED["key"], RENDERED["compile"]
    pod = Pod(tmp_path, demo_model_dir)
    here = device_architecture(torch.device("cpu"))
    argv = pod.argv(job, {"--backend": ("tensorrt", "aotinductor"), "--target-architecture": ("sm90", here)})
    log = tmp_path / "termination-log"
    log.write_text("")
    env = pod.env(job) | {"INFERFLEET_TERMINATION_LOG": str(log)}
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=600, cwd=pod.mounts["/tmp"])
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1].startswith(f"built engine={key} ")
    # The engine lands under its key, in the directory named by the model's content digest.
    digest = content_digest(content_manifest(demo_model_dir))
    engine_dir = pod.mounts["/engines"] / key / digest
    manifest = read_manifest(engine_dir)
    assert manifest.engine_key == key and manifest.backend == "aotinductor" and manifest.model_digest == digest
    assert manifest.envelope.max_context_length == 64 and manifest.envelope.max_batch_size == 1

    # The compiled pool's Deployment serves the engine the Job wrote: the build's status carries the digest
    # from the compile container's termination message, and the serving pod reads that directory.
    assert RENDERED["compiled"]["args"][:3] == ["serve", "--engine-dir", f"/engines/{key}"]  # before the digest
    server = RENDERED["compiled_after"](log.read_text())
    assert server["args"][:3] == ["serve", "--engine-dir", f"/engines/{key}/{digest}"]
    # ... and the engine's digest, which the Job reported and the serving pod checks before loading anything.
    args = server["args"]
    assert args[args.index("--engine-digest") + 1] == engine_digest(manifest)
    process = pod.start(server)
    try:
        _check_serves(pod, server, process)
    finally:
        _stop(process)

    # An engine put in its place by anyone who can write the cache (its checksums match its files) is refused, and
    # with the exit code on which the operator rebuilds.
    manifest.build_seconds += 1
    write_manifest(engine_dir, manifest)
    verify_checksums(engine_dir, read_manifest(engine_dir))
    refused = subprocess.run(pod.argv(server), env=pod.env(server), capture_output=True, text=True, timeout=120)
    assert refused.returncode == ENGINE_LOST_EXIT_CODE, refused.stderr[-3000:]
    assert "is not the engine of digest" in refused.stderr

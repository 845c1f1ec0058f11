"""Runs `inferfleet-operator` as a child process with a given kubeconfig; captures its log, reads
its health endpoint and Prometheus metrics, and kills or restarts it."""

from __future__ import annotations

import base64
import contextlib
import os
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path

import yaml
from helpers import static_claim, wait_for
from prometheus_client.parser import text_string_to_metric_families

# Short timers so the e2e tier converges in seconds rather than minutes.
FAST_FLAGS = [
    "--resync-seconds=4",
    "--debounce-seconds=0.1",
    "--error-delays=0.5,1,2",
    "--build-retention-seconds=4",
    "--max-backoff-seconds=1",
]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class OperatorProcess:
    """One operator process. `start()` waits until its health endpoint answers."""

    def __init__(self, kubeconfig: Path, log_path: Path, args: list[str] | None = None):
        self.kubeconfig = Path(kubeconfig)
        self.log_path = Path(log_path)
        self.args = list(FAST_FLAGS if args is None else args)
        self.health_port = free_port()
        self.metrics_port = free_port()
        self.process: subprocess.Popen | None = None
        self.num_starts = 0

    def start(self, timeout: float = 60) -> None:
        env = {**os.environ, "KUBECONFIG": str(self.kubeconfig)}
        env.pop("KUBERNETES_SERVICE_HOST", None)  # never mistake the test runner for a pod
        scope = [] if any(a.startswith("--namespace") for a in self.args) else ["--all-namespaces"]
        command = [
            sys.executable,
            "-m",
            "inferfleet_operator.controller.main",
            *scope,
            f"--health-port={self.health_port}",
            f"--metrics-port={self.metrics_port}",
            "--instance=e2e-operator",
            *self.args,
        ]
        self.num_starts += 1
        log = self.log_path.open("a")
        log.write(f"----- start {self.num_starts}: {' '.join(command)}\n")
        log.flush()
        self.process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        log.close()
        wait_for(self._healthy, timeout=timeout, message="the operator's /healthz")

    def _healthy(self) -> bool:
        if self.process is None or self.process.poll() is not None:
            raise AssertionError(f"operator exited early:\n{self.log_tail()}")
        with urllib.request.urlopen(f"http://127.0.0.1:{self.health_port}/healthz", timeout=2) as r:
            return r.status == 200

    def kill(self) -> None:
        """SIGKILL: no cleanup runs, as when a node dies under the operator."""
        if self.process and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(timeout=30)

    def stop(self) -> None:
        if self.process and self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                self.kill()

    def restart(self) -> None:
        self.kill()
        self.start()

    def metrics_text(self) -> str:
        url = f"http://127.0.0.1:{self.metrics_port}/metrics"
        with urllib.request.urlopen(url, timeout=5) as response:
            return response.read().decode()

    def metric(self, name: str, **labels: str) -> float:
        """Sum of the samples of `name` whose labels include `labels` (0 when there are none)."""
        total = 0.0
        for family in text_string_to_metric_families(self.metrics_text()):
            for sample in family.samples:
                if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                    total += sample.value
        return total

    def num_writes(self) -> float:
        return self.metric("inferfleet_operator_api_writes_total")

    def service_reconciles(self) -> float:
        return self.metric("inferfleet_operator_reconciles_total", kind="InferenceService")

    def wait_for_service_reconciles(self, more: int, message: str, timeout: float = 30) -> None:
        """Waits until `more` InferenceService reconciles beyond those run so far have run (resyncs, when
        nothing else changes)."""
        start = self.service_reconciles()
        wait_for(lambda: self.service_reconciles() >= start + more, timeout=timeout, message=message)

    def writes_by_kind(self) -> dict[str, float]:
        """API writes so far by verb and kind, e.g. {"apply Deployment": 5.0}."""
        counts: dict[str, float] = {}
        for family in text_string_to_metric_families(self.metrics_text()):
            for sample in family.samples:
                if sample.name == "inferfleet_operator_api_requests_total" and sample.labels["verb"] not in (
                    "get",
                    "list",
                ):
                    key = f"{sample.labels['verb']} {sample.labels['kind']}"
                    counts[key] = counts.get(key, 0) + sample.value
        return counts

    def peak_rss_mb(self) -> float:
        """The process's peak resident memory (VmHWM), in MiB."""
        for line in Path(f"/proc/{self.process.pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
        raise AssertionError("no VmHWM in /proc status")

    def log_tail(self, num_lines: int = 60) -> str:
        if not self.log_path.exists():
            return ""
        return "\n".join(self.log_path.read_text().splitlines()[-num_lines:])


# ----------------------------------------------------------------------------- cluster set-up

ROOT = Path(__file__).resolve().parent.parent
SYSTEM_NAMESPACE = "inferfleet-system"
SERVICE_ACCOUNT = "inferfleet-operator"
ENGINE_CACHE_CLAIM = "inferfleet-engine-cache"

# The chart's default runtimes (charts/inferfleet/values.yaml), as plain objects.
RUNTIMES = [
    ("paged-cuda", "Paged", ["nvidia"], [], "nvidia.com/gpu", 100),
    ("paged-rocm", "Paged", ["amd"], [], "amd.com/gpu", 100),
    ("paged-xpu", "Paged", ["intel"], [], "", 100),
    ("paged-cpu", "Paged", ["cpu"], [], "", 10),
    (
        "compiled-tensorrt",
        "Compiled",
        ["nvidia"],
        ["sm75", "sm80", "sm86", "sm87", "sm89", "sm90", "sm100", "sm120"],
        "nvidia.com/gpu",
        200,
    ),
]


def runtime_objects() -> list[dict]:
    objects = []
    for name, engine, vendors, architectures, resource, priority in RUNTIMES:
        spec = {"engine": engine, "vendors": vendors, "image": f"inferfleet/{name}:e2e", "priority": priority}
        if architectures:
            spec["architectures"] = architectures
        if resource:
            spec["gpuResource"] = resource
        if engine == "Compiled":
            spec["compileImage"] = f"inferfleet/{name}-compile:e2e"
        objects.append(
            {
                "apiVersion": "inferfleet.dev/v1alpha1",
                "kind": "InferenceRuntime",
                "metadata": {"name": name},
                "spec": spec,
            }
        )
    return objects


def install(cluster, work_dir: Path) -> Path:
    """CRDs from crds/, the operator's ServiceAccount bound to a ClusterRole of exactly
    permissions.PERMISSIONS, the default runtimes; returns a kubeconfig with the account's token."""
    from inferfleet_operator.plan.permissions import PERMISSIONS

    cluster.kubectl("apply", "-f", str(ROOT / "crds"))
    cluster.kubectl(
        "wait",
        "--for",
        "condition=Established",
        "--timeout=60s",
        "crd/inferenceservices.inferfleet.dev",
        "crd/enginebuilds.inferfleet.dev",
        "crd/inferenceruntimes.inferfleet.dev",
    )
    cluster.apply(
        [
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": SYSTEM_NAMESPACE}},
            {
                "apiVersion": "v1",
                "kind": "ServiceAccount",
                "metadata": {"name": SERVICE_ACCOUNT, "namespace": SYSTEM_NAMESPACE},
            },
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRole",
                "metadata": {"name": "inferfleet-operator-e2e"},
                "rules": PERMISSIONS,
            },
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRoleBinding",
                "metadata": {"name": "inferfleet-operator-e2e"},
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": "inferfleet-operator-e2e",
                },
                "subjects": [{"kind": "ServiceAccount", "name": SERVICE_ACCOUNT, "namespace": SYSTEM_NAMESPACE}],
            },
        ]
    )
    cluster.apply(runtime_objects())
    return cluster.token_kubeconfig(SERVICE_ACCOUNT, SYSTEM_NAMESPACE, Path(work_dir) / "operator.kubeconfig")


def exec_plugin_kubeconfig(token_kubeconfig: Path, folder: Path) -> Path:
    """A kubeconfig as cloud clusters hand out: the user is an exec plugin (a small script printing an
    ExecCredential with the ServiceAccount token from `token_kubeconfig`, counting its runs in
    folder/plugin-runs) and the CA is a file named relative to the kubeconfig's folder."""
    source = yaml.safe_load(Path(token_kubeconfig).read_text())
    cluster = dict(source["clusters"][0]["cluster"])
    token = source["users"][0]["user"]["token"]
    folder = Path(folder)
    (folder / "certs").mkdir(parents=True, exist_ok=True)
    (folder / "certs" / "ca.crt").write_bytes(base64.b64decode(cluster.pop("certificate-authority-data")))
    cluster["certificate-authority"] = "certs/ca.crt"
    (folder / "sa-token").write_text(token)
    (folder / "sa-token").chmod(0o600)
    plugin = folder / "credential-plugin"
    plugin.write_text(f"""#!{sys.executable}
import json, pathlib
folder = pathlib.Path(__file__).parent
runs = folder / "plugin-runs"
runs.write_text(str(int(runs.read_text()) + 1 if runs.exists() else 1))
print(json.dumps({{"apiVersion": "client.authentication.k8s.io/v1", "kind": "ExecCredential",
                  "status": {{"token": (folder / "sa-token").read_text().strip()}}}}))
""")
    plugin.chmod(0o700)
    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "e2e-exec",
        "clusters": [{"name": "e2e", "cluster": cluster}],
        "users": [
            {
                "name": "e2e-exec",
                "user": {
                    "exec": {
                        "apiVersion": "client.authentication.k8s.io/v1",
                        "command": "./credential-plugin",
                        "interactiveMode": "Never",
                    }
                },
            }
        ],
        "contexts": [{"name": "e2e-exec", "context": {"cluster": "e2e", "user": "e2e-exec"}}],
    }
    path = folder / "kubeconfig"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    path.chmod(0o600)
    return path


def add_engine_cache(cluster, namespace: str) -> None:
    """The engine cache claim in a test namespace, bound to a static hostPath volume (the e2e
    cluster has no provisioner); compile Jobs and compiled serving pods mount it."""
    volume = f"engines-{namespace}"
    path = f"/tmp/inferfleet-e2e/{namespace}"
    cluster.apply(
        static_claim(
            ENGINE_CACHE_CLAIM, namespace, volume, path, access_mode="ReadWriteMany", size="1Gi", reclaim="Delete"
        )
    )
    wait_for(
        lambda: (cluster.get("pvc", ENGINE_CACHE_CLAIM, namespace) or {}).get("status", {}).get("phase") == "Bound",
        timeout=30,
        message="the engine cache claim bound",
    )


def remove_engine_cache(cluster, namespace: str) -> None:
    cluster.kubectl("delete", "pv", f"engines-{namespace}", "--wait=false", "--ignore-not-found")


# ----------------------------------------------------------------------------- reading state


def service_manifest(
    name: str, *, uri: str = "hf://inferfleet/tiny", replicas: int = 1, pools: dict[str, int] | None = None, **spec
) -> dict:
    body = {"model": {"name": name, "uri": uri}, "replicas": replicas, **spec}
    if pools is not None:
        body["pools"] = [{"name": pool, "replicas": n} for pool, n in sorted(pools.items())]
    return {
        "apiVersion": "inferfleet.dev/v1alpha1",
        "kind": "InferenceService",
        "metadata": {"name": name},
        "spec": body,
    }


def live_pools(cluster, selector: str | None = None) -> list:
    """The pools the operator will see, from the live Node objects (the planner's own grouping)."""
    from inferfleet_operator.plan.pools import group_pools

    return [p for p in group_pools(cluster.items("nodes", selector=selector)) if p.node_names]


def pool_status(cluster, namespace: str, service: str) -> dict[str, dict]:
    obj = cluster.get("inferenceservice", service, namespace) or {}
    return {p["name"]: p for p in (obj.get("status") or {}).get("pools") or []}


def container_args(deployment: dict) -> list[str]:
    return deployment["spec"]["template"]["spec"]["containers"][0]["args"]


def is_engine_dir(arg: str, key: str) -> bool:
    """`--engine-dir`'s value for the engine of `key`: /engines/<key>/<model digest> (or /engines/<key> for a build
    whose status records no digest, as where no compile container reports one)."""
    return arg == f"/engines/{key}" or arg.startswith(f"/engines/{key}/")


def serves_engine(deployment: dict | None, key: str) -> bool:
    return deployment is not None and any(is_engine_dir(arg, key) for arg in container_args(deployment))


def replica_set_args(cluster, namespace: str, deployment: str) -> list[list[str]]:
    """Container args of each ReplicaSet of a Deployment, oldest revision first."""
    sets = [
        rs
        for rs in cluster.items("replicasets", namespace)
        if any(ref.get("name") == deployment for ref in rs["metadata"].get("ownerReferences", []))
    ]
    sets.sort(key=lambda rs: int(rs["metadata"]["annotations"]["deployment.kubernetes.io/revision"]))
    return [rs["spec"]["template"]["spec"]["containers"][0]["args"] for rs in sets]


def events(cluster, namespace: str, name: str) -> list[dict]:
    return [e for e in cluster.items("events", namespace) if (e.get("involvedObject") or {}).get("name") == name]


def drain(cluster, timeout: float = 180) -> None:
    """Waits until no InferenceService or EngineBuild is left in a terminating namespace (the objects
    carry no finalizer of the operator's; this waits out the namespace controller)."""

    def terminating() -> list[str]:
        names = cluster.kubectl(
            "get",
            "namespaces",
            "-o",
            "jsonpath={range .items[?(@.status.phase=='Terminating')]}{.metadata.name}{'\\n'}{end}",
        ).stdout.split()
        left = []
        for ns in names:
            left += cluster.kubectl(
                "get", "inferenceservices,enginebuilds", "-n", ns, "-o", "name", check=False
            ).stdout.split()
        return left

    wait_for(
        lambda: not terminating(),
        timeout=timeout,
        message="no InferenceService or EngineBuild left in a terminating namespace (last result: those left)",
    )


@contextlib.contextmanager
def serving(cluster, process: OperatorProcess):
    """Runs `process` for a test module: started, then, once the module's namespaces are deleted,
    kept until they drained and stopped even when draining timed out, so that no operator of this
    module outlives it and acts on the next module's namespaces."""
    process.start()
    try:
        yield process
        drain(cluster)
    finally:
        process.stop()

"""Helpers for e2e tests: the one wait helper, and a handle on the local cluster that runs the
matching kubectl and helm against it."""

from __future__ import annotations

import base64
import copy
import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TypeVar

import yaml

ROOT = Path(__file__).resolve().parent.parent
CLUSTER_DIR = ROOT / "e2e" / "cluster"
NODES_DIR = ROOT / "e2e" / "nodes"

# The e2e failure switch of the KWOK stages (e2e/cluster/stages/job-pod-fail.yaml): a pod owned
# by a Job fails with exit code 1 when it carries this label with value "true", or when any of its
# (init) containers' command or args contains FAIL_MARKER (e.g. in a model URI).
FAIL_LABEL = "inferfleet.dev/e2e-fail"
FAIL_MARKER = "inferfleet-e2e-fail"

T = TypeVar("T")


class WaitTimeout(AssertionError):
    """A wait_for predicate stayed falsy until its timeout."""


def wait_for(
    predicate: Callable[[], T],
    timeout: float = 60.0,
    interval: float = 0.5,
    message: str = "condition",
) -> T:
    """Calls predicate until it returns a truthy value and returns that value.

    Exceptions from the predicate count as "not yet" (the cluster may still be converging) and
    the last one is reported if the wait times out, along with the last falsy value.
    """
    deadline = time.monotonic() + timeout
    last: object = None
    while True:
        try:
            value = predicate()
            if value:
                return value
            last = value
        except Exception as error:  # noqa: BLE001 - reported below if the wait fails
            last = error
        if time.monotonic() >= deadline:
            raise WaitTimeout(f"Timed out after {timeout:.0f} s waiting for {message}; last result: {last!r}")
        time.sleep(interval)


class KubectlError(AssertionError):
    """kubectl (or helm) exited non-zero; carries its stderr."""

    def __init__(self, args: list[str], result: subprocess.CompletedProcess):
        self.result = result
        super().__init__(f"{' '.join(args)} exited {result.returncode}: {result.stderr.strip()}")


def cluster_bin() -> Path:
    """The folder of the pinned control-plane binaries (built on first use)."""
    if os.environ.get("INFERFLEET_CLUSTER_BIN"):
        return Path(os.environ["INFERFLEET_CLUSTER_BIN"])
    result = subprocess.run(["bash", str(CLUSTER_DIR / "build.sh")], stdout=subprocess.PIPE, text=True, check=True)
    return Path(result.stdout.strip().splitlines()[-1])


def node_manifests(fixture: str) -> list[dict]:
    """The Node objects of one fixture file, e.g. node_manifests("extra/nvidia-l40s")."""
    path = NODES_DIR / f"{fixture}.yaml"
    return [doc for doc in yaml.safe_load_all(path.read_text()) if doc]


def own_node(fixture: str, name: str, label: str) -> dict:
    """A fixture's first Node renamed, labelled inferfleet.dev/e2e-test=label (for a service's nodeSelector) and out of
    the shared fleet: a node of one test's own."""
    node = copy.deepcopy(node_manifests(fixture)[0])
    node["metadata"]["name"] = name
    node["metadata"]["labels"].update({"kubernetes.io/hostname": name, "inferfleet.dev/e2e-test": label})
    node["metadata"]["labels"].pop("inferfleet.dev/e2e-fleet", None)
    return node


def _manifest_text(manifest: str | Path | dict | Iterable[dict]) -> tuple[list[str], str | None]:
    """kubectl -f arguments and stdin for a path, a YAML string, an object or a list of objects."""
    if isinstance(manifest, Path) or (isinstance(manifest, str) and "\n" not in manifest and Path(manifest).exists()):
        return ["-f", str(manifest)], None
    if isinstance(manifest, str):
        return ["-f", "-"], manifest
    docs = [manifest] if isinstance(manifest, dict) else list(manifest)
    return ["-f", "-"], yaml.safe_dump_all(docs, sort_keys=False)


class Cluster:
    """The e2e cluster: its kubeconfig and the kubectl/helm binaries that match its version."""

    def __init__(self, kubeconfig: Path, bin_dir: Path):
        self.kubeconfig = Path(kubeconfig)
        self.bin = Path(bin_dir)

    def _run(
        self, tool: str, args: Iterable[str], check: bool, input: str | None, kubeconfig: Path | None, timeout: float
    ) -> subprocess.CompletedProcess:
        cmd = [str(self.bin / tool), *map(str, args)]
        env = {**os.environ, "KUBECONFIG": str(kubeconfig or self.kubeconfig)}
        result = subprocess.run(cmd, input=input, capture_output=True, text=True, env=env, timeout=timeout)
        if check and result.returncode != 0:
            raise KubectlError(cmd, result)
        return result

    def kubectl(
        self,
        *args: str,
        check: bool = True,
        input: str | None = None,
        kubeconfig: Path | None = None,
        timeout: float = 60,
    ) -> subprocess.CompletedProcess:
        """Runs kubectl against the cluster (as admin unless another kubeconfig is given)."""
        return self._run("kubectl", args, check, input, kubeconfig, timeout)

    def helm(
        self, *args: str, check: bool = True, kubeconfig: Path | None = None, timeout: float = 180
    ) -> subprocess.CompletedProcess:
        """Runs the pinned helm against the cluster."""
        return self._run("helm", args, check, None, kubeconfig, timeout)

    def apply(
        self,
        manifest: str | Path | dict | Iterable[dict],
        namespace: str | None = None,
        check: bool = True,
        kubeconfig: Path | None = None,
    ) -> subprocess.CompletedProcess:
        """kubectl apply of a file or folder path, a YAML string, an object or a list of objects."""
        file_args, stdin = _manifest_text(manifest)
        ns_args = ["-n", namespace] if namespace else []
        return self.kubectl("apply", *ns_args, *file_args, check=check, input=stdin, kubeconfig=kubeconfig)

    def get(
        self, kind: str, name: str | None = None, namespace: str | None = None, selector: str | None = None
    ) -> dict | None:
        """The object (or, without a name, the list) as JSON; None when it does not exist."""
        args = ["get", kind, *([name] if name else []), "-o", "json"]
        if namespace:
            args += ["-n", namespace]
        if selector:
            args += ["-l", selector]
        result = self.kubectl(*args, check=False)
        if result.returncode != 0:
            if "NotFound" in result.stderr:
                return None
            raise KubectlError(args, result)
        return json.loads(result.stdout)

    def items(self, kind: str, namespace: str | None = None, selector: str | None = None) -> list[dict]:
        """The objects of a kind (in a namespace, matching a label selector)."""
        listing = self.get(kind, namespace=namespace, selector=selector)
        return listing["items"] if listing else []

    def create_namespace(self, name: str, labels: dict[str, str] | None = None) -> str:
        """Creates a namespace and waits for its default ServiceAccount, without which pods are refused."""
        manifest = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name, "labels": labels or {}}}
        self.apply(manifest)
        wait_for(
            lambda: self.get("serviceaccount", "default", name),
            timeout=30,
            message=f"the default ServiceAccount in namespace {name}",
        )
        return name

    def delete_namespace(self, name: str) -> None:
        """Starts deleting a namespace; the namespace controller finishes it in the background."""
        self.kubectl("delete", "namespace", name, "--wait=false", "--ignore-not-found")

    def token_kubeconfig(self, service_account: str, namespace: str, path: Path, duration: str = "2h") -> Path:
        """Writes a kubeconfig that authenticates as a ServiceAccount with a bound token
        (`kubectl create token`), so what it may do is exactly what RBAC grants that account."""
        token = self.kubectl(
            "create", "token", service_account, "-n", namespace, f"--duration={duration}"
        ).stdout.strip()
        admin = yaml.safe_load(self.kubeconfig.read_text())
        cluster = admin["clusters"][0]["cluster"]
        config = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "inferfleet-e2e", "cluster": cluster}],
            "users": [{"name": f"{namespace}-{service_account}", "user": {"token": token}}],
            "contexts": [
                {
                    "name": "inferfleet-e2e",
                    "context": {
                        "cluster": "inferfleet-e2e",
                        "user": f"{namespace}-{service_account}",
                        "namespace": namespace,
                    },
                }
            ],
            "current-context": "inferfleet-e2e",
        }
        path = Path(path)
        path.write_text(yaml.safe_dump(config, sort_keys=False))
        path.chmod(0o600)
        return path

    @property
    def server(self) -> str:
        """The API server URL."""
        return yaml.safe_load(self.kubeconfig.read_text())["clusters"][0]["cluster"]["server"]

    @property
    def ca_pem(self) -> bytes:
        """The cluster CA certificate (PEM)."""
        data = yaml.safe_load(self.kubeconfig.read_text())["clusters"][0]["cluster"]["certificate-authority-data"]
        return base64.b64decode(data)


def condition(obj: dict | None, type_: str) -> dict | None:
    """The status condition of a type, or None."""
    for cond in ((obj or {}).get("status") or {}).get("conditions") or []:
        if cond.get("type") == type_:
            return cond
    return None


def is_true(obj: dict | None, type_: str) -> bool:
    """Whether the object's condition of this type has status "True"."""
    cond = condition(obj, type_)
    return bool(cond and cond.get("status") == "True")


def cluster_is_up(kubeconfig: Path, bin_dir: Path) -> bool:
    """Whether the API server behind a kubeconfig answers /readyz."""
    if not Path(kubeconfig).is_file():
        return False
    result = subprocess.run(
        [str(Path(bin_dir) / "kubectl"), "--kubeconfig", str(kubeconfig), "get", "--raw", "/readyz"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    return result.returncode == 0


def state_dir() -> Path:
    """Where up.sh keeps the cluster's state (INFERFLEET_CLUSTER_STATE overrides e2e/.state)."""
    return Path(os.environ.get("INFERFLEET_CLUSTER_STATE") or ROOT / "e2e" / ".state")


def run_init_container(
    cluster: Cluster, namespace: str, container: dict, mounts: dict[str, Path], endpoint: str
) -> subprocess.CompletedProcess:
    """Runs an init container the operator rendered (KWOK runs none) as a local process, as the kubelet would: its
    command and args, its env and the keys of the Secrets its envFrom names (read from the API as admin), each of
    its volume mounts' paths remapped to the folder `mounts` gives for it, HF_ENDPOINT set to `endpoint` (a pod
    would reach huggingface.co)."""

    def remap(value: str) -> str:
        for mount, folder in mounts.items():
            if value == mount or value.startswith(mount + "/"):
                return str(folder) + value[len(mount) :]
        return value

    env = {k: v for k, v in os.environ.items() if not k.startswith(("HF_", "AWS_"))}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env.update({item["name"]: remap(item["value"]) for item in container.get("env", [])})
    for source in container.get("envFrom", []):
        secret = cluster.get("secret", source["secretRef"]["name"], namespace) or {}
        env.update({k: base64.b64decode(v).decode() for k, v in (secret.get("data") or {}).items()})
    env["HF_ENDPOINT"] = endpoint
    for mount in container.get("volumeMounts", []):
        assert mount["mountPath"] in mounts, f"no folder given for the mount {mount['mountPath']}"
        Path(mounts[mount["mountPath"]]).mkdir(parents=True, exist_ok=True)
    argv = container["command"] + [remap(a) for a in container["args"]] + ["--no-progress"]
    return subprocess.run(argv, env=env, capture_output=True, text=True, timeout=300, cwd=mounts["/tmp"])


def static_claim(
    claim: str,
    namespace: str,
    volume: str,
    path: str,
    *,
    access_mode: str,
    size: str,
    reclaim: str = "Retain",
    path_type: str | None = None,
) -> list[dict]:
    """A hostPath PersistentVolume bound ahead of time to a claim of `claim` in `namespace` (no provisioner: the
    volume names the claim, the claim the volume), and that claim."""
    host_path = {"path": path} | ({"type": path_type} if path_type else {})
    return [
        {
            "apiVersion": "v1",
            "kind": "PersistentVolume",
            "metadata": {"name": volume},
            "spec": {
                "capacity": {"storage": size},
                "accessModes": [access_mode],
                "persistentVolumeReclaimPolicy": reclaim,
                "storageClassName": "",
                "hostPath": host_path,
                "claimRef": {"namespace": namespace, "name": claim},
            },
        },
        {
            "apiVersion": "v1",
            "kind": "PersistentVolumeClaim",
            "metadata": {"name": claim, "namespace": namespace},
            "spec": {
                "accessModes": [access_mode],
                "storageClassName": "",
                "volumeName": volume,
                "resources": {"requests": {"storage": size}},
            },
        },
    ]

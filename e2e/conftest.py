"""Fixtures for the cluster e2e tier: one local cluster per test session, one namespace per test.

Environment:
- INFERFLEET_KUBECONFIG: use this existing cluster; nothing is started or stopped.
- INFERFLEET_KEEP_CLUSTER=1: leave the cluster (and test namespaces) up after the session.
- INFERFLEET_CLUSTER_BIN: the control-plane binaries (otherwise e2e/cluster/build.sh finds or builds them).

Several sessions may share the cluster of one work tree: each registers itself in the state
folder, and the cluster is stopped by the last session to leave, and only if a test session
started it (a cluster brought up by hand with up.sh stays up).
"""

from __future__ import annotations

import os
import re
import subprocess
import uuid
from pathlib import Path

import pytest
from helpers import CLUSTER_DIR, Cluster, cluster_bin, cluster_is_up, state_dir
from operator_process import OperatorProcess, add_engine_cache, install, remove_engine_cache, serving


def _keep() -> bool:
    return os.environ.get("INFERFLEET_KEEP_CLUSTER") == "1"


def _run_cluster_script(name: str, bin_dir: Path) -> None:
    env = {**os.environ, "INFERFLEET_CLUSTER_BIN": str(bin_dir)}
    subprocess.run(["bash", str(CLUSTER_DIR / name)], check=True, stdout=subprocess.DEVNULL, env=env)


def _is_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


@pytest.fixture(scope="session")
def cluster():
    """The local cluster, brought up once per session (see the module docstring)."""
    bin_dir = cluster_bin()
    external = os.environ.get("INFERFLEET_KUBECONFIG")
    if external:
        yield Cluster(Path(external), bin_dir)
        return

    state = state_dir()
    kubeconfig = state / "kubeconfig"
    was_up = cluster_is_up(kubeconfig, bin_dir)
    _run_cluster_script("up.sh", bin_dir)
    started_marker = state / "started-by-tests"
    if not was_up:
        started_marker.touch()
    sessions = state / "sessions"
    sessions.mkdir(exist_ok=True)
    me = sessions / str(os.getpid())
    me.touch()
    try:
        yield Cluster(kubeconfig, bin_dir)
    finally:
        me.unlink(missing_ok=True)
        others = [p for p in sessions.iterdir() if p.name.isdigit() and _is_alive(int(p.name))]
        if not others and started_marker.exists() and not _keep():
            _run_cluster_script("down.sh", bin_dir)


@pytest.fixture
def namespace(cluster: Cluster, request) -> str:
    """A fresh namespace named after the test, deleted afterwards (kept with INFERFLEET_KEEP_CLUSTER=1)."""
    base = re.sub(r"[^a-z0-9]+", "-", request.node.name.lower()).strip("-")[:40].strip("-")
    name = cluster.create_namespace(f"e2e-{base}-{uuid.uuid4().hex[:5]}")
    yield name
    if not _keep():
        cluster.delete_namespace(name)


@pytest.fixture(scope="module")
def operator(cluster: Cluster, tmp_path_factory, request) -> OperatorProcess:
    """The operator as a process with the installed ServiceAccount's token, one per test module."""
    work = tmp_path_factory.mktemp(request.module.__name__.rsplit(".", 1)[-1].replace("test_", "").replace("_", "-"))
    with serving(cluster, OperatorProcess(install(cluster, work), work / "operator.log")) as process:
        yield process


@pytest.fixture
def ns(cluster: Cluster, namespace: str, operator: OperatorProcess) -> str:
    """A test namespace with the engine cache claim, served by the module's operator."""
    add_engine_cache(cluster, namespace)
    yield namespace
    print(operator.log_tail())  # shown when the test failed
    remove_engine_cache(cluster, namespace)

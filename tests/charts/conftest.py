"""Fixtures for the chart's template tests: the pinned helm, and `helm template` as parsed objects."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "inferfleet"
PINS = ROOT / "e2e" / "cluster" / "pins.env"
NAMESPACE = "inferfleet-system"
RELEASE = "fleet"


def _pins() -> dict[str, str]:
    pairs = (line.split("=", 1) for line in PINS.read_text().splitlines() if "=" in line and not line.startswith("#"))
    return {key.strip(): value.strip() for key, value in pairs}


def _helm_path() -> Path:
    """The helm that e2e/cluster/build.sh builds (same folder rule: a hash of pins.env)."""
    if os.environ.get("INFERFLEET_CLUSTER_BIN"):
        return Path(os.environ["INFERFLEET_CLUSTER_BIN"]) / "helm"
    cache = Path(os.environ.get("INFERFLEET_CACHE") or Path.home() / ".cache" / "inferfleet")
    pin_hash = hashlib.sha256(PINS.read_bytes()).hexdigest()[:12]
    return cache / "cluster-bin" / pin_hash / "helm"


@pytest.fixture(scope="session")
def helm() -> Callable[..., subprocess.CompletedProcess]:
    """Runs the pinned helm; skips when it has not been built (tests/run.sh always builds it)."""
    path = _helm_path()
    if not path.is_file():
        pytest.skip(f"helm is not built at {path}: run `bash e2e/cluster/build.sh`")

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(path), *args], capture_output=True, text=True, timeout=60)

    return run


def _set_args(values: dict | None) -> list[str]:
    """--set-json flags, one per top-level key, so tests pass values as Python objects."""
    return [arg for key, value in (values or {}).items() for arg in ("--set-json", f"{key}={json.dumps(value)}")]


# The kinds of the chart's own CRDs, as the API server lists them once the CRDs are served (on an
# upgrade, or an install into a cluster that has them). Without them the chart renders as on the
# install that creates the CRDs.
SERVED = ["inferfleet.dev/v1alpha1/InferenceRuntime", "kopf.dev/v1/ClusterKopfPeering", "kopf.dev/v1/KopfPeering"]


@pytest.fixture(scope="session")
def template(helm) -> Callable[..., subprocess.CompletedProcess]:
    """`helm template` of the chart with the given values (unparsed result)."""
    kube_version = _pins()["K8S_VERSION"]

    def run(
        values: dict | None = None, namespace: str = NAMESPACE, served: bool = True, also_served: tuple[str, ...] = ()
    ) -> subprocess.CompletedProcess:
        api_versions = [
            arg for kind in (SERVED if served else []) + list(also_served) for arg in ("--api-versions", kind)
        ]
        return helm(
            "template",
            RELEASE,
            str(CHART),
            "--namespace",
            namespace,
            "--kube-version",
            kube_version,
            *api_versions,
            *_set_args(values),
        )

    return run


@pytest.fixture(scope="session")
def render(template) -> Callable[..., list[dict]]:
    """The chart's objects for the given values; fails the test if helm refuses. served=False renders
    as on the install that creates the CRDs."""

    def run(
        values: dict | None = None, namespace: str = NAMESPACE, served: bool = True, also_served: tuple[str, ...] = ()
    ) -> list[dict]:
        result = template(values, namespace, served, also_served)
        assert result.returncode == 0, result.stderr
        return [doc for doc in yaml.safe_load_all(result.stdout) if doc]

    return run


@pytest.fixture(scope="session")
def refuse(template) -> Callable[..., str]:
    """helm's error for values the chart must refuse; fails the test if helm renders them."""

    def run(values: dict) -> str:
        result = template(values)
        assert result.returncode != 0, f"helm rendered values it should refuse: {values}"
        return result.stderr

    return run


@pytest.fixture(scope="session")
def of_kind() -> Callable[[list[dict], str], list[dict]]:
    """The objects of one kind, in rendering order."""
    return lambda objects, kind: [obj for obj in objects if obj["kind"] == kind]


@pytest.fixture(scope="session")
def one(of_kind) -> Callable[[list[dict], str], dict]:
    """The single object of a kind (fails the test when there are none or several)."""

    def find(objects: list[dict], kind: str) -> dict:
        found = of_kind(objects, kind)
        assert len(found) == 1, f"expected one {kind}, found {len(found)}"
        return found[0]

    return find

"""values.yaml and values.schema.json: lint is clean, every value is documented, bad values are refused by name."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "charts" / "inferfleet"

# (values, text that helm's refusal must contain: the value's path or the chart's own message)
BAD_VALUES = [
    ({"replicaCount": "two"}, "/replicaCount"),
    ({"replicaCount": 0}, "/replicaCount"),
    ({"replicaCont": 2}, "replicaCont"),
    ({"image": {"pullPolicy": "Sometimes"}}, "/image/pullPolicy"),
    ({"image": {"digest": "latest"}}, "/image/digest"),
    ({"watchNamespaces": ["Team_A"]}, "/watchNamespaces/0"),
    ({"modelHostPaths": {"allowedRoots": ["srv/models"]}}, "/modelHostPaths/allowedRoots/0"),
    ({"healthPort": 70000}, "/healthPort"),
    ({"securityContext": {"runAsUser": 0}}, "/securityContext/runAsUser"),
    ({"crds": {"keep": "yes"}}, "/crds/keep"),
    ({"engineCache": {"size": "lots"}}, "/engineCache/size"),
    ({"engineCache": {"accessModes": ["ReadWriteSometimes"]}}, "/engineCache/accessModes/0"),
    ({"engineCache": {"accessModes": []}}, "/engineCache/accessModes"),
    ({"runtimes": {"items": {"paged-cuda": {"engine": "Magic"}}}}, "/runtimes/items/paged-cuda/engine"),
    ({"runtimes": {"items": {"paged-cuda": {"vendors": ["nvidia", "3dfx"]}}}}, "/runtimes/items/paged-cuda/vendors/1"),
    ({"runtimes": {"items": {"paged-cuda": {"priority": 5000}}}}, "/runtimes/items/paged-cuda/priority"),
    (
        {
            "runtimes": {
                "items": {
                    "Paged_Gaudi": {
                        "enabled": True,
                        "engine": "Paged",
                        "vendors": ["habana"],
                        "image": {"repository": "x"},
                    }
                }
            }
        },
        "Paged_Gaudi",
    ),
    (
        {
            "runtimes": {
                "items": {
                    "compiled-x": {
                        "enabled": True,
                        "engine": "Compiled",
                        "vendors": ["nvidia"],
                        "image": {"repository": "x"},
                    }
                }
            }
        },
        "compileImage",
    ),
    ({"metrics": {"serviceMonitor": {"interval": "often"}}}, "/metrics/serviceMonitor/interval"),
    ({"podDisruptionBudget": {"maxUnavailable": "half"}}, "/podDisruptionBudget/maxUnavailable"),
    ({"podDisruptionBudget": {"minAvailable": 1, "maxUnavailable": 1}}, "set minAvailable or maxUnavailable, not both"),
    ({"healthPort": 9090}, "healthPort and metricsPort must differ"),
    ({"routing": {"inferencePools": "yes"}}, "/routing/inferencePools"),
    ({"modelCache": {"budget": "lots"}}, "/modelCache/budget"),
    ({"modelCache": {"claimName": "Model Cache"}}, "/modelCache/claimName"),
]


def test_lint_is_clean(helm):
    result = helm("lint", "--strict", str(CHART))
    assert result.returncode == 0, result.stdout + result.stderr
    assert "[WARNING]" not in result.stdout and "[ERROR]" not in result.stdout, result.stdout


@pytest.mark.parametrize(("values", "named"), BAD_VALUES, ids=[text for _, text in BAD_VALUES])
def test_bad_value_is_refused_with_a_message_naming_it(refuse, values, named):
    assert named in refuse(values)


def test_defaults_and_documented_examples_pass_the_schema(render):
    assert render()
    assert render(
        {
            "podDisruptionBudget": {"minAvailable": "50%"},
            "securityContext": {"runAsUser": None},
            "engineCache": {"storageClassName": None},
        }
    )


def _documented_paths() -> tuple[list[str], list[str]]:
    """The dotted paths of values.yaml, and those with no comment right above them (or a parent's)."""
    lines = (CHART / "values.yaml").read_text().splitlines()
    keys = _gen_reference().values_keys(lines)
    commented = {path for index, path, _ in keys if index > 0 and lines[index - 1].strip().startswith("#")}
    undocumented = []
    for _, path, _ in keys:
        if path.startswith("runtimes.items."):
            continue  # entries are data; runtimes.items documents their fields in prose
        if any(other.startswith(path + ".") for _, other, _ in keys):
            continue  # a group: its leaves carry the documentation
        ancestors = [".".join(path.split(".")[:n]) for n in range(1, path.count(".") + 2)]
        if not any(a in commented for a in ancestors):
            undocumented.append(path)
    return [path for _, path, _ in keys], undocumented


def test_every_value_is_documented_in_prose():
    _, undocumented = _documented_paths()
    assert undocumented == [], f"values.yaml keys with no comment above them: {undocumented}"


def test_every_value_is_in_the_helm_values_reference():
    paths, _ = _documented_paths()
    leaves = [p for p in paths if not any(o.startswith(p + ".") for o in paths) and not p.startswith("runtimes.items.")]
    page = ROOT / "docs" / "user-guide" / "reference" / "helm-values.md"
    section = page.read_text().split("\n## ", 1)[0]  # the values table, before the runtimes.items entry fields
    rows = set(re.findall(r"^\| `([^`]+)` \|", section, re.MULTILINE))

    def is_listed(leaf: str) -> bool:  # a map-valued value (resources) may be one row
        return any(".".join(leaf.split(".")[:n]) in rows for n in range(1, leaf.count(".") + 2))

    missing = [leaf for leaf in leaves + ["runtimes.items"] if not is_listed(leaf)]
    assert missing == [], f"values missing from {page.name} (run python docs/gen_reference.py): {missing}"
    defaults = yaml.safe_load((CHART / "values.yaml").read_text())
    unknown = [row for row in rows if not _exists(defaults, row)]
    assert unknown == [], f"{page.name} rows naming values the chart does not have: {unknown}"


def _exists(values: dict, path: str) -> bool:
    node = values
    for part in path.split("."):
        if not isinstance(node, dict) or part not in node:
            return False
        node = node[part]
    return True


def test_chart_renders_without_kube_version_against_helms_stamped_default(helm):
    # e2e/cluster/build.sh stamps helm's default Kubernetes version; unstamped, helm assumes v1.20 and the
    # chart's kubeVersion (>=1.30) refuses to render.
    result = helm("template", "fleet", str(CHART), "--namespace", "inferfleet-system")
    assert result.returncode == 0, result.stderr
    assert "kind: Deployment" in result.stdout


def _gen_reference():
    """docs/gen_reference.py, whose values.yaml key reader these checks share."""
    spec = importlib.util.spec_from_file_location("gen_reference", ROOT / "docs" / "gen_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module

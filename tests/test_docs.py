"""The docs site: generated reference pages match their sources, and the README's links lead somewhere."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"


def _generator():
    spec = importlib.util.spec_from_file_location("gen_reference", DOCS / "gen_reference.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_committed_reference_pages_equal_what_the_generator_writes(tmp_path):
    gen = _generator()
    assert gen.main(["--out", str(tmp_path)]) == 0
    written = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*.md"))
    assert written, "the generator wrote no page"
    stale = [str(p) for p in written if (tmp_path / p).read_text() != (DOCS / p).read_text()]
    assert stale == [], f"run `python docs/gen_reference.py` and commit: {stale} differ from the CRDs or the chart"
    committed = sorted(p.relative_to(DOCS) for p in (DOCS / gen.REFERENCE_DIR).glob("*.md"))
    assert committed == written, "docs/user-guide/reference/ holds pages the generator no longer writes"


def test_crd_reference_lists_every_field_default_and_rule():
    import yaml

    page = (DOCS / "user-guide" / "reference" / "inferenceservice.md").read_text()
    crd = yaml.safe_load((ROOT / "crds" / "inferenceservices.yaml").read_text())
    spec = crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    missing = [name for name in spec["properties"] if f"| `spec.{name}`" not in page]
    assert missing == [], f"spec fields missing from the InferenceService reference: {missing}"
    assert "| `spec.engine.maxContextLength` | integer | `4096` | ≥ 128; ≤ 1048576 |" in page
    assert "`self.engine.tensorParallelSize == self.resources.gpusPerReplica`" in page
    assert "engine.tensorParallelSize must equal resources.gpusPerReplica" in page


def _relative_links(markdown: str) -> list[str]:
    links = re.findall(r"\]\(([^)\s]+)\)", markdown)
    return [link for link in links if not re.match(r"^[a-z][a-z0-9+.-]*:", link) and not link.startswith("#")]


def test_every_relative_link_in_the_readme_points_to_an_existing_file():
    links = _relative_links((ROOT / "README.md").read_text())
    assert len(links) > 10
    missing = [link for link in links if not (ROOT / link.split("#", 1)[0]).exists()]
    assert missing == [], f"README links to files that do not exist: {missing}"


def test_readme_is_a_front_door_of_one_screen():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.encode()) <= 6 * 1024
    assert len(readme.splitlines()) <= 80

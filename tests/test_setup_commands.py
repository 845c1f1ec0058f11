"""The README's set-up commands and CI's entry point (.ci/run) are the same commands in the same order."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def readme_setup_commands(text: str) -> list[str]:
    """The command lines of the first fenced block in the README's `## Set up` section."""
    section = text.split("\n## Set up\n", 1)[1].split("\n## ", 1)[0]
    block = re.search(r"^```[^\n]*\n(.*?)^```", section, re.MULTILINE | re.DOTALL)
    assert block, "the Set up section has no fenced block of commands"
    return [line.strip() for line in block.group(1).splitlines() if line.strip()]


def ci_commands(text: str) -> list[str]:
    """What .ci/run runs: every line that is not the shebang, a comment, shell options or the cd to the root."""
    lines = [line.strip() for line in text.splitlines()]
    return [
        line
        for line in lines
        if line and not line.startswith("#") and not line.startswith("set ") and not line.startswith("cd ")
    ]


def test_ci_runs_the_readme_setup_commands_in_the_readme_order():
    readme = readme_setup_commands((ROOT / "README.md").read_text())
    assert readme == ["bash e2e/kind/demo.sh", "bash tests/run.sh"]  # the demo first, then the tests
    assert ci_commands((ROOT / ".ci" / "run").read_text()) == readme


def test_setup_command_parsing_sees_a_changed_or_reordered_command():
    readme = "# x\n\n## Set up\n\ntext\n\n```\nbash tests/run.sh\nbash e2e/kind/demo.sh\n```\n\n## Next\n"
    assert readme_setup_commands(readme) == ["bash tests/run.sh", "bash e2e/kind/demo.sh"]
    ci = "#!/usr/bin/env bash\n# comment\nset -euo pipefail\ncd x\nbash e2e/kind/demo.sh\nbash tests/run.sh --quick\n"
    assert ci_commands(ci) == ["bash e2e/kind/demo.sh", "bash tests/run.sh --quick"]
    assert ci_commands(ci) != readme_setup_commands(readme)


def test_every_setup_command_names_a_script_in_the_repository():
    for command in readme_setup_commands((ROOT / "README.md").read_text()):
        program, script = command.split()[:2]
        assert program == "bash" and (ROOT / script).is_file(), command

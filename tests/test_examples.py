"""The examples users copy (docs/examples/) run: the demo's InferenceService is admitted and is what the demo applies,
the offline-engine script generates, and the openai-client script talks to a real server."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from crd_eval import admit

from inferfleet_operator.api.types import parse_service

from .runtime.support.server_harness import serve_process

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = ROOT / "docs" / "examples"


def test_demo_service_is_admitted_by_the_crd_and_parsed_by_the_operator():
    obj = yaml.safe_load((EXAMPLES / "demo-inferenceservice.yaml").read_text())
    obj["metadata"]["namespace"] = "inferfleet-demo"
    admitted, errors = admit(obj, "inferenceservices.yaml")
    assert errors == []
    service = parse_service(admitted)
    assert service.spec.model.name == "smollm2-135m-instruct"


def test_the_kind_demo_applies_the_example_file():
    demo = (ROOT / "e2e" / "kind" / "demo.sh").read_text()
    assert '-f "$root/docs/examples/demo-inferenceservice.yaml"' in demo
    assert "kind: InferenceService" not in demo  # no second copy to drift from the example


@pytest.mark.slow
def test_offline_engine_example_continues_zen_lines(demo_model_dir):
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / "offline_engine.py"), "--model", str(demo_model_dir)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert "'Beautiful is better than' -> ' ugly." in result.stdout


@pytest.mark.slow
def test_openai_client_example_gets_an_answer_from_a_real_server(demo_model_dir):
    with serve_process("--model", str(demo_model_dir), "--served-model-name", "zen") as server:
        result = subprocess.run(
            [
                sys.executable,
                str(EXAMPLES / "openai_client.py"),
                "--base-url",
                f"{server.base_url}/v1",
                "--question",
                "Beautiful is better than",
                "--wait",
                "60",
            ],
            capture_output=True,
            text=True,
            timeout=300,
        )
    assert result.returncode == 0, result.stderr
    lines = dict(line.split(":", 1) for line in result.stdout.splitlines() if ":" in line)
    assert lines["model"].strip() == "zen"
    assert lines["assistant"].strip()


@pytest.mark.slow
def test_the_one_minute_demo_answers_the_capital_question(tmp_path):
    """The README's try without Docker: e2e/demo.sh serves SmolLM2 on loopback and asks through openai_client.py."""
    from .runtime.support.server_harness import free_port

    env = {**os.environ, "INFERFLEET_DEMO_PORT": str(free_port()), "TMPDIR": str(tmp_path)}
    result = subprocess.run(
        ["bash", str(ROOT / "e2e" / "demo.sh")], capture_output=True, text=True, timeout=900, env=env
    )
    assert result.returncode == 0, result.stderr[-2000:]
    lines = dict(line.split(":", 1) for line in result.stdout.splitlines() if ":" in line)
    assert lines["model"].strip() == "smollm2-135m-instruct"
    assert "Paris" in lines["assistant"]

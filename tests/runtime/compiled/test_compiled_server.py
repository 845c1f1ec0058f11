"""`serve --engine-dir`: the real server over a compiled engine, its envelope refusals, and manifest refusals."""

from __future__ import annotations

import json
import shutil
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest

from inferfleet_runtime import compiled
from inferfleet_runtime.cli import main
from inferfleet_runtime.engine.config import EngineConfig
from inferfleet_runtime.engine.llm_engine import LLMEngine
from inferfleet_runtime.engine.sampling_params import SamplingParams

from ..support.server_harness import running_server

pytestmark = pytest.mark.slow

MODEL = "inferfleet-demo"
PROMPTS = ["Beautiful is better than", "Explicit is", "Readability", "Errors should never pass silently. Unless"]


@pytest.fixture(scope="module")
def server(compiled_demo_engine):
    config = EngineConfig()  # the serve defaults (64 sequences, prefix caching): fitted to the envelope
    with running_server(compiled.runner_factory(compiled_demo_engine, config), config, MODEL) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0)


@pytest.fixture(scope="module")
def paged_texts(demo_model_dir):
    engine = LLMEngine.from_model_dir(demo_model_dir, EngineConfig())
    outs = engine.generate(PROMPTS, SamplingParams(temperature=0, max_tokens=10))
    return [out.outputs[0].text for out in outs]


def test_concurrent_completions_equal_the_paged_engine(client, paged_texts):
    def complete(prompt):
        return client.completions.create(model=MODEL, prompt=prompt, max_tokens=10, temperature=0).choices[0].text

    with ThreadPoolExecutor(len(PROMPTS)) as pool:
        texts = list(pool.map(complete, PROMPTS))
    assert texts == paged_texts
    assert complete(PROMPTS[0]) == paged_texts[0]  # alone: the smallest decode bucket


def test_streamed_completion_equals_the_paged_engine(client, paged_texts):
    stream = client.completions.create(model=MODEL, prompt=PROMPTS[1], max_tokens=10, temperature=0, stream=True)
    assert "".join(chunk.choices[0].text for chunk in stream if chunk.choices) == paged_texts[1]


def test_request_beyond_the_context_envelope_gets_400(server):
    r = httpx.post(
        f"{server.base_url}/v1/completions", json={"model": MODEL, "prompt": PROMPTS[0], "max_tokens": 60}, timeout=30
    )
    assert r.status_code == 400
    error = r.json()["error"]
    assert error["code"] == "context_length_exceeded" and "maximum context length is 64 tokens" in error["message"]


def test_prompt_that_fills_the_envelope_gets_400(server):
    long_prompt = " ".join(["Beautiful is better than ugly."] * 20)
    r = httpx.post(f"{server.base_url}/v1/completions", json={"model": MODEL, "prompt": long_prompt}, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded"


def test_metrics_report_the_envelope_as_kv_capacity(server, client):
    client.completions.create(model=MODEL, prompt=PROMPTS[2], max_tokens=2, temperature=0)
    assert server.engine.block_manager.num_blocks == 16  # 4 slots x 64 tokens in blocks of 16
    assert server.engine.scheduler.max_num_seqs == 4
    assert httpx.get(f"{server.base_url}/metrics").status_code == 200


def _copy_with_manifest(engine_dir, dest, **changes):
    dest.mkdir()
    manifest = json.loads((engine_dir / "manifest.json").read_text())
    for key, value in changes.items():
        manifest[key] = value
    (dest / "manifest.json").write_text(json.dumps(manifest))
    shutil.copytree(engine_dir / "model", dest / "model")
    return dest


@pytest.mark.parametrize(
    "changes, message",
    [
        ({"target_architecture": "sm90"}, "was built for sm90, this machine has no GPU"),
        ({"target_architecture": "cpu-riscv64"}, "was built for cpu-riscv64, this machine is cpu-"),
        ({"versions": {"torch": "2.0.0", "inferfleet": "0.1.0"}}, "was built with torch 2.0.0, this runtime has torch"),
    ],
)
def test_serve_refuses_a_mismatched_engine_with_one_line(compiled_demo_engine, tmp_path, capsys, changes, message):
    engine_dir = _copy_with_manifest(compiled_demo_engine, tmp_path / "engine", **changes)
    code = main(["serve", "--engine-dir", str(engine_dir), "--port", "0"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and message in err and len(err.splitlines()) == 1


def test_serve_command_of_the_operators_pods_serves_the_engine(compiled_demo_engine, paged_texts):
    from inferfleet_runtime.compiled.manifest import engine_digest, read_manifest

    from ..support.server_harness import serve_process

    # The compiled serving pod's command (operator manifests: serve --engine-dir DIR --engine compiled
    # --engine-digest D ..., D the digest the compile Job reported and the EngineBuild's status holds).
    digest = engine_digest(read_manifest(compiled_demo_engine))
    args = ("--engine-dir", str(compiled_demo_engine), "--engine", "compiled", "--engine-digest", digest)
    args += ("--served-model-name", MODEL)
    with serve_process(*args, "--log-level", "warning", ready_timeout_s=90) as served:
        r = httpx.post(
            f"{served.base_url}/v1/completions",
            json={"model": MODEL, "prompt": PROMPTS[0], "max_tokens": 10, "temperature": 0},
            timeout=30,
        )
        assert r.status_code == 200 and r.json()["choices"][0]["text"] == paged_texts[0]


def test_serve_of_a_lost_engine_exits_3_with_one_line_as_its_termination_message(tmp_path, capsys, monkeypatch):
    from inferfleet_runtime.compiled.manifest import ENGINE_LOST_EXIT_CODE

    log = tmp_path / "termination-log"
    log.write_text("")
    monkeypatch.setenv("INFERFLEET_TERMINATION_LOG", str(log))
    code = main(["serve", "--engine-dir", str(tmp_path / "gone"), "--port", "0"])
    err = capsys.readouterr().err.strip()
    assert code == ENGINE_LOST_EXIT_CODE == 3 and len(err.splitlines()) == 1
    assert "engine lost; rebuild it" in err and log.read_text() == err


def test_serve_of_an_engine_with_a_damaged_artifact_exits_3(compiled_demo_engine, tmp_path, capsys):
    damaged = tmp_path / "engine"
    shutil.copytree(compiled_demo_engine, damaged)
    graph = next((damaged / "graphs").iterdir())
    graph.write_bytes(graph.read_bytes()[:-1])
    code = main(["serve", "--engine-dir", str(damaged), "--port", "0"])
    assert code == 3 and "does not match its checksum" in capsys.readouterr().err


def test_serve_refuses_an_engine_other_than_the_one_whose_digest_it_was_given(compiled_demo_engine, tmp_path, capsys):
    from inferfleet_runtime.compiled.manifest import ENGINE_LOST_EXIT_CODE, engine_digest, read_manifest, write_manifest

    expected = engine_digest(read_manifest(compiled_demo_engine))
    planted = tmp_path / "engine"
    shutil.copytree(compiled_demo_engine, planted)
    manifest = read_manifest(planted)
    decode = [g for g in manifest.graphs if g.kind == "decode"]
    decode[0].file, decode[1].file = decode[1].file, decode[0].file  # every checksum still matches its file
    write_manifest(planted, manifest)
    code = main(["serve", "--engine-dir", str(planted), "--engine-digest", expected, "--port", "0"])
    err = capsys.readouterr().err.strip()
    assert code == ENGINE_LOST_EXIT_CODE and len(err.splitlines()) == 1
    assert f"is not the engine of digest {expected}" in err

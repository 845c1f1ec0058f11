"""API keys: where serve takes them from, the constant-time check, and the real server refusing requests without one
(OpenAI's 401 shape, through the official openai client) while the probes stay open."""

import subprocess
import sys
import threading

import httpx
import openai
import pytest
from fastapi.testclient import TestClient

from inferfleet_runtime.engine.config import EngineConfig
from inferfleet_runtime.engine.metrics import ServerMetrics
from inferfleet_runtime.server.app import ServerState, create_app
from inferfleet_runtime.server.auth import ApiKeyError, ApiKeys
from inferfleet_runtime.worker.model_runner import ModelRunner

from ..support.server_harness import running_server

MODEL = "inferfleet-demo"
KEYS = ("team-a-key", "team-b-key")


def test_keys_come_from_flags_environment_and_files(tmp_path):
    key_file = tmp_path / "keys"
    key_file.write_text("# rotated monthly\nfile-key\n\n")
    keys = ApiKeys.from_sources(["flag-key"], "env-one, env-two", [key_file])
    assert keys.keys == (b"flag-key", b"env-one", b"env-two", b"file-key")


def test_no_source_leaves_the_endpoints_open():
    assert ApiKeys.from_sources([], None, []) is None
    assert ApiKeys.from_sources([], " , ", []) is None


@pytest.mark.parametrize("bad", ["two words", "tab\tkey", "x" * 5000])
def test_unusable_keys_are_refused_naming_their_source(bad):
    with pytest.raises(ApiKeyError, match="from --api-key"):
        ApiKeys.from_sources([bad])


def test_an_unreadable_or_empty_key_file_is_refused(tmp_path):
    with pytest.raises(ApiKeyError, match="cannot read API key file"):
        ApiKeys.from_sources(key_files=[tmp_path / "missing"])
    (tmp_path / "empty").write_text("# nothing\n")
    with pytest.raises(ApiKeyError, match="holds no key"):
        ApiKeys.from_sources(key_files=[tmp_path / "empty"])


@pytest.mark.parametrize(
    "header, allowed",
    [
        ("Bearer team-a-key", True),
        ("bearer team-b-key", True),
        ("Bearer team-a-ke", False),
        ("Bearer team-a-key-and-more", False),
        ("Basic team-a-key", False),
        ("team-a-key", False),
        ("Bearer ", False),
        ("", False),
        (None, False),
        ("Bearer t\udceam-a-key", False),
    ],
)
def test_only_a_bearer_header_with_a_whole_key_is_allowed(header, allowed):
    assert ApiKeys.from_sources(KEYS).allows(header) is allowed


@pytest.fixture(scope="module")
def server(demo_model_dir):
    config = EngineConfig(kernels="reference", num_kv_blocks=128)
    keys = ApiKeys.from_sources(KEYS)
    make = lambda: ModelRunner.from_model_dir(demo_model_dir, config)  # noqa: E731
    with running_server(make, config, MODEL, api_keys=keys, protect_metrics=True) as srv:
        yield srv


def test_a_listed_key_is_served_and_a_wrong_one_gets_openai_401(server):
    good = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key=KEYS[1], max_retries=0)
    reply = good.completions.create(model=MODEL, prompt="Beautiful is", max_tokens=4, temperature=0)
    assert reply.usage.completion_tokens == 4
    bad = openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="guessed", max_retries=0)
    with pytest.raises(openai.AuthenticationError) as caught:
        bad.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": "hi"}], max_tokens=2)
    assert caught.value.status_code == 401
    assert caught.value.body["code"] == "invalid_api_key"
    assert caught.value.response.headers["www-authenticate"] == "Bearer"


def test_probes_stay_open_and_protected_metrics_need_a_key(server):
    assert httpx.get(f"{server.base_url}/health").status_code == 200
    assert httpx.get(f"{server.base_url}/ready").status_code == 200
    assert httpx.get(f"{server.base_url}/v1/models").status_code == 401
    refused = httpx.get(f"{server.base_url}/metrics")
    assert refused.status_code == 401 and refused.json()["error"]["type"] == "invalid_request_error"
    allowed = httpx.get(f"{server.base_url}/metrics", headers={"Authorization": f"Bearer {KEYS[0]}"})
    assert allowed.status_code == 200 and "inferfleet:num_requests_running" in allowed.text


def _serve(*args, env=None):
    command = [sys.executable, "-m", "inferfleet_runtime.cli", "serve", *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=120, env=env)


def test_serve_refuses_protected_metrics_without_a_key_and_a_bad_key_file(tmp_path, demo_model_dir):
    result = _serve("--model", str(demo_model_dir), "--protect-metrics", env={"PATH": "/usr/bin:/bin"})
    assert result.returncode == 2
    assert "--protect-metrics needs an API key" in result.stderr
    result = _serve("--model", str(demo_model_dir), "--api-key-file", str(tmp_path / "absent"))
    assert result.returncode == 2 and "cannot read API key file" in result.stderr


def _app_client(api_keys=None, **state_fields) -> TestClient:
    state = ServerState(served_model_name=MODEL, metrics=ServerMetrics(MODEL), api_keys=api_keys, **state_fields)
    return TestClient(create_app(state))


@pytest.mark.parametrize("path", ["/openapi.json", "/docs", "/redoc"])
def test_the_api_schema_and_its_pages_need_a_key_when_keys_are_set(path):
    guarded = _app_client(ApiKeys.from_sources(KEYS))
    refused = guarded.get(path)
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"
    assert guarded.get(path, headers={"Authorization": f"Bearer {KEYS[0]}"}).status_code == 200
    assert _app_client().get(path).status_code == 200  # no keys: open, as before


class _StoppedEngine:
    is_healthy = False
    error = RuntimeError("CUDA error: an illegal memory access at /srv/models/secret-llama/kernels.cu:77")


def test_health_says_the_engine_stopped_without_its_internal_error():
    response = _app_client(engine=_StoppedEngine()).get("/health")
    assert response.status_code == 503 and response.json() == {
        "status": "error",
        "error": "the engine stopped; the server's log says why",
    }


def test_health_says_loading_failed_without_the_loaders_error(caplog):
    def load():
        raise OSError("No such file: /srv/models/secret-llama/model.safetensors")

    state = ServerState(served_model_name=MODEL, metrics=ServerMetrics(MODEL))
    with caplog.at_level("ERROR"), TestClient(create_app(state, load)) as client:
        for thread in threading.enumerate():  # the load runs in its own thread from startup
            if thread.name == "inferfleet-load":
                thread.join(timeout=30)
        response = client.get("/health")
    assert response.status_code == 503 and "secret-llama" not in response.text
    assert response.json()["error"] == "the model failed to load; the server's log says why"
    assert "secret-llama" in caplog.text  # the operator of the server still sees why

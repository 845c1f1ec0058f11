"""The output budget of one request (sequences x tokens, a token with logprobs=k counting k + 2): a request over it
gets a JSON 400 naming the limit and its flag before anything reaches the engine, streamed or not."""

import httpx
import pytest

from inferfleet_runtime.cli import main
from inferfleet_runtime.engine.config import EngineConfig
from inferfleet_runtime.server import cli as serve_cli
from inferfleet_runtime.worker.model_runner import ModelRunner

from ..support.server_harness import running_server

MODEL = "inferfleet-demo"
MAX_MODEL_LEN = 64
BUDGET = 200
COMPLETIONS = "/v1/completions"
CHAT = "/v1/chat/completions"
FLAG = "--max-request-output-tokens"


@pytest.fixture(scope="module")
def server(demo_model_dir):
    config = EngineConfig(kernels="reference", max_context_length=MAX_MODEL_LEN, num_kv_blocks=256)
    make = lambda: ModelRunner.from_model_dir(demo_model_dir, config)  # noqa: E731
    with running_server(make, config, MODEL) as srv:  # the default budget
        yield srv


@pytest.fixture
def submitted(server, monkeypatch):
    """The request ids the server hands the engine during the test."""
    ids = []
    submit = server.state.engine.submit

    def recording(request_id, *args, **kwargs):
        ids.append(request_id)
        return submit(request_id, *args, **kwargs)

    monkeypatch.setattr(server.state.engine, "submit", recording)
    return ids


@pytest.fixture
def small_budget(server, monkeypatch):
    monkeypatch.setattr(server.state, "max_request_output_tokens", BUDGET, raising=False)


def post(server, path, **body):
    return httpx.post(f"{server.base_url}{path}", json={"model": MODEL, "temperature": 0, **body}, timeout=120)


def assert_refused_naming_the_limit(response, limit: int) -> str:
    assert response.status_code == 400, response.text
    assert response.headers["content-type"] == "application/json"
    error = response.json()["error"]
    assert (error["type"], error["code"]) == ("invalid_request_error", "request_too_large")
    assert FLAG in error["message"] and f"{limit:,}" in error["message"]
    return error["message"]


def test_the_default_budget_refuses_many_prompts_times_n_with_logprobs_unsent(server, submitted):
    # The request at this context: 64 prompts x n=16 up to the context left, each token with 20 logprobs.
    response = post(server, COMPLETIONS, prompt=["Beautiful is"] * 64, n=16, max_tokens=None, logprobs=20)
    message = assert_refused_naming_the_limit(response, 1_048_576)
    assert "64 prompt(s) x n=16" in message and "logprobs=20" in message
    assert submitted == []


@pytest.mark.parametrize(
    "path, body",
    [
        (COMPLETIONS, {"prompt": ["Beautiful is"] * 4, "n": 2, "max_tokens": 26}),  # 4 x 2 x 26 = 208
        (CHAT, {"messages": [{"role": "user", "content": "hi"}], "n": 2, "max_tokens": 10, "logprobs": True,
                "top_logprobs": 9}),  # 2 x 10 x (9 + 2) = 220
        (CHAT, {"messages": [{"role": "user", "content": "hi"}], "n": 8}),  # 8 x the context left, over 25 each
        (COMPLETIONS, {"prompt": "Beautiful is", "n": 3, "max_tokens": 34, "logprobs": 0, "stream": True}),  # 204
    ],
)  # fmt: skip
def test_a_request_over_the_budget_gets_a_json_400_and_never_reaches_the_engine(
    server, small_budget, submitted, path, body
):
    assert_refused_naming_the_limit(post(server, path, **body), BUDGET)
    assert submitted == []


def test_a_request_at_the_budget_is_served(server, small_budget, submitted):
    response = post(server, COMPLETIONS, prompt=["Beautiful is"] * 4, n=2, max_tokens=25, ignore_eos=True)
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["completion_tokens"] == 200
    assert len(submitted) == 4


def test_serve_takes_the_budget_from_its_flag_and_refuses_a_bad_one(demo_model_dir, monkeypatch, capsys):
    served = []
    monkeypatch.setattr(serve_cli, "serve", lambda *args, **state_fields: served.append(state_fields))
    assert main(["serve", "--model", str(demo_model_dir), FLAG, "5000"]) == 0
    assert served[0]["max_request_output_tokens"] == 5000
    with pytest.raises(SystemExit) as exited:
        main(["serve", "--model", str(demo_model_dir), FLAG, "0"])
    assert exited.value.code == 2 and "must be at least 1" in capsys.readouterr().err

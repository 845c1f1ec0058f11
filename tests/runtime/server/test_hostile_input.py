"""Hostile bodies sent as raw bytes to the real server: each gets a JSON 4xx in OpenAI's shape (never a 5xx, a
hang or a dead engine), and the server answers normally afterwards. Ends with a property-based fuzz of both
endpoints."""

import json
import threading

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from inferfleet_runtime.engine.config import EngineConfig
from inferfleet_runtime.worker.model_runner import ModelRunner

from ..support.server_harness import running_server

MODEL = "inferfleet-demo"
MAX_MODEL_LEN = 64
BODY_LIMIT = 64 << 10
CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"


@pytest.fixture(scope="module")
def server(demo_model_dir):
    config = EngineConfig(kernels="reference", max_context_length=MAX_MODEL_LEN, num_kv_blocks=256)
    make = lambda: ModelRunner.from_model_dir(demo_model_dir, config)  # noqa: E731
    with running_server(make, config, MODEL, max_body_bytes=BODY_LIMIT) as srv:
        yield srv


def send(server, path: str, raw: bytes, headers: dict | None = None) -> httpx.Response:
    headers = {"content-type": "application/json", **(headers or {})}
    return httpx.post(f"{server.base_url}{path}", content=raw, headers=headers, timeout=60)


def assert_openai_error(response: httpx.Response, status: int, param: str | None = None) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    if param is not None:
        assert error["param"] == param, error
    return error


def assert_still_serving(server):
    body = {"model": MODEL, "prompt": "Beautiful is", "max_tokens": 3, "temperature": 0}
    response = httpx.post(f"{server.base_url}{COMPLETIONS}", json=body, timeout=60)
    assert response.status_code == 200, response.text
    assert response.json()["usage"]["completion_tokens"] == 3


@pytest.mark.parametrize(
    "path, raw, param, words",
    [
        (COMPLETIONS, b'{"model": "inferfleet-demo", "prompt": "ab\xff\xfe"}', None, "parsing the body"),
        (COMPLETIONS, b'{"model": "inferfleet-demo", "prompt": "a\\ud800b"}', "prompt", "lone surrogate (U+D800)"),
        (CHAT, b'{"model": "inferfleet-demo", "messages": [{"role": "user", "content": "\\udfff"}]}', None, "surrogate"),
        (COMPLETIONS, b'{"model": "inferfleet-demo", "prompt": "x", "stop": ["\\ud83d"]}', "stop.0", "surrogate"),
        (COMPLETIONS, b'{"model": "inferfleet-demo", "prompt": [true, false]}', "prompt", ""),
        (COMPLETIONS, b'{"model": "inferfleet-demo", "prompt": [[[1]]]}', "prompt", ""),
        (COMPLETIONS, b'{"model": "inferfleet-demo", "prompt": "x", "n": "2"}', "n", ""),
        (COMPLETIONS, b'{"model": "inferfleet-demo", "prompt": "x", "temperature": NaN}', "temperature", "finite"),
        (COMPLETIONS, b'{"model": "inferfleet-demo", "prompt": "x", "top_p": Infinity}', "top_p", ""),
        (COMPLETIONS, b'{"model": "inferfleet-demo", "prompt": "x", "repetition_penalty": 1e308}', "repetition_penalty", ""),
        (COMPLETIONS, b'{"model": "inferfleet-demo", "prompt": "x", "seed": 1' + b"0" * 40 + b"}", "seed", ""),
        (COMPLETIONS, b'{"model": "inferfleet-demo", "prompt": "x", "stop": ' + json.dumps(["s"] * 17).encode() + b"}", "stop", "at most 16"),
        (COMPLETIONS, b'{"model": "inferfleet-demo", "prompt": ' + json.dumps(["p"] * 65).encode() + b"}", "prompt", "at most 64"),
        (COMPLETIONS, b'{"model": "inferfleet-demo", "prompt": "x", "logit_bias": {"5": 100}}', "logit_bias", "not supported"),
        (CHAT, b'{"model": "inferfleet-demo", "messages": [{"role": "user", "content": "x"}], "tools": [{}]}', "tools", "not supported"),
        (CHAT, b'{"model": "inferfleet-demo", "messages": [{"role": "user", "content": "x"}], "response_format": {"type": "json_object"}}', "response_format", "not supported"),
        (COMPLETIONS, b'{"model": "inferfleet-demo", "prompt": "x", "frobnicate": 1}', "frobnicate", "Unrecognized request argument supplied: frobnicate"),
        (COMPLETIONS, b"[1, 2, 3]", None, ""),
        (COMPLETIONS, b'"just a string"', None, ""),
        (COMPLETIONS, b"", None, ""),
    ],
)  # fmt: skip
def test_hostile_body_gets_a_json_400_and_the_server_keeps_serving(server, path, raw, param, words):
    error = assert_openai_error(send(server, path, raw), 400, param)
    assert words in error["message"]
    assert_still_serving(server)


def test_no_op_values_of_unsupported_parameters_are_accepted(server):
    body = {"model": MODEL, "prompt": "Beautiful is", "max_tokens": 2, "logit_bias": {}, "best_of": 1, "user": "u1"}
    assert httpx.post(f"{server.base_url}{COMPLETIONS}", json=body, timeout=60).status_code == 200
    chat = {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
    chat |= {"response_format": {"type": "text"}, "store": False, "metadata": {"team": "a"}, "tool_choice": "none"}
    assert httpx.post(f"{server.base_url}{CHAT}", json=chat, timeout=60).status_code == 200


def test_a_tiny_positive_temperature_samples_greedily(server):
    def text(temperature):
        body = {"model": MODEL, "prompt": "Beautiful is better than", "max_tokens": 8, "temperature": temperature}
        response = httpx.post(f"{server.base_url}{COMPLETIONS}", json=body, timeout=60)
        assert response.status_code == 200, response.text
        return response.json()["choices"][0]["text"]

    greedy = text(0)
    assert greedy.strip()
    assert text(1e-40) == greedy
    assert text(1e-6) == greedy


def test_a_body_over_the_limit_is_413_by_its_length_or_as_it_streams(server):
    big = json.dumps({"model": MODEL, "prompt": "x" * (BODY_LIMIT + 10)}).encode()
    error = assert_openai_error(send(server, COMPLETIONS, big), 413)
    assert str(BODY_LIMIT) in error["message"]

    def chunks():  # no Content-Length: the limit applies to the bytes as they arrive
        for start in range(0, len(big), 8192):
            yield big[start : start + 8192]

    streamed = httpx.post(
        f"{server.base_url}{COMPLETIONS}", content=chunks(), headers={"content-type": "application/json"}, timeout=60
    )
    assert_openai_error(streamed, 413)
    assert_still_serving(server)


def test_unknown_paths_and_methods_answer_in_the_openai_shape(server):
    assert_openai_error(httpx.get(f"{server.base_url}/v1/nothing-here"), 404)
    assert_openai_error(httpx.get(f"{server.base_url}{COMPLETIONS}"), 405)


def test_tokenizing_a_prompt_does_not_block_the_event_loop(server, monkeypatch):
    # The tokenizer is held inside encode until /health has answered: were encode run on the event loop, /health
    # could not answer and its request would time out.
    tokenizer = server.engine.tokenizer
    encode, encoding, health_answered = tokenizer.encode, threading.Event(), threading.Event()

    def held_encode(*args, **kwargs):
        encoding.set()
        health_answered.wait(timeout=30)
        return encode(*args, **kwargs)

    monkeypatch.setattr(tokenizer, "encode", held_encode)
    answered = []
    body = json.dumps({"model": MODEL, "prompt": "Beautiful is", "max_tokens": 2}).encode()
    worker = threading.Thread(target=lambda: answered.append(send(server, COMPLETIONS, body)))
    worker.start()
    try:
        assert encoding.wait(timeout=30)
        assert httpx.get(f"{server.base_url}/health", timeout=10).status_code == 200
    finally:
        health_answered.set()
        worker.join(timeout=60)
    assert answered[0].status_code == 200


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)
FIELDS = ["model", "prompt", "messages", "max_tokens", "temperature", "top_p", "n", "stop", "seed", "logprobs",
          "top_logprobs", "stream", "stream_options", "top_k", "min_p", "repetition_penalty", "stop_token_ids",
          "presence_penalty", "frequency_penalty", "logit_bias", "echo", "ignore_eos", "max_completion_tokens"]  # fmt: skip
BASES = {
    COMPLETIONS: {"model": MODEL, "prompt": "Beautiful is", "max_tokens": 4},
    CHAT: {"model": MODEL, "messages": [{"role": "user", "content": "Beautiful is"}], "max_tokens": 4},
}


@st.composite
def bodies(draw):
    path = draw(st.sampled_from(sorted(BASES)))
    body = dict(BASES[path])
    for field in draw(st.lists(st.sampled_from(FIELDS), max_size=3, unique=True)):
        body[field] = draw(json_values)
    if draw(st.booleans()):
        body = draw(json_values) if draw(st.booleans()) else body
    return path, body


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(case=bodies())
def test_fuzzed_bodies_never_get_a_5xx(server, case):
    path, body = case
    raw = json.dumps(body, allow_nan=True).encode("utf-8", "surrogatepass")
    response = send(server, path, raw)
    assert response.status_code < 500, (body, response.text)
    if response.status_code >= 400:
        assert set(response.json()["error"]) == {"message", "type", "param", "code"}


def test_the_server_still_serves_after_the_fuzz(server):
    assert_still_serving(server)

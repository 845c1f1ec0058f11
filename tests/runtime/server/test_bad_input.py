"""Bad input gets a clear 4xx in OpenAI's error shape, and none of it disturbs requests already running."""

import concurrent.futures
import threading

import httpx
import openai
import pytest

from inferfleet_runtime.engine.config import EngineConfig
from inferfleet_runtime.worker.model_runner import ModelRunner

from ..support.server_harness import running_server

MODEL = "inferfleet-demo"
MAX_MODEL_LEN = 64
PROMPT = "Beautiful is better than"


@pytest.fixture(scope="module")
def server(demo_model_dir):
    config = EngineConfig(kernels="reference", max_context_length=MAX_MODEL_LEN, max_num_seqs=1, max_queue_len=2)
    with running_server(lambda: ModelRunner.from_model_dir(demo_model_dir, config), config, MODEL) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0)


def post(server, path, body, **kwargs):
    return httpx.post(f"{server.base_url}{path}", timeout=60, **({"json": body} if body is not None else {}), **kwargs)


def assert_error(response, status, param):
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert error["param"] == param
    return error


def test_unknown_model_is_404(client, server):
    with pytest.raises(openai.NotFoundError, match="does not exist"):
        client.completions.create(model="gpt-4", prompt=PROMPT)
    error = assert_error(
        post(server, "/v1/chat/completions", {"model": "gpt-4", "messages": [{"role": "user", "content": "hi"}]}),
        404,
        "model",
    )
    assert "gpt-4" in error["message"]


def test_prompt_plus_max_tokens_over_the_context_is_400_with_the_numbers(server, client):
    num_prompt = len(server.engine.tokenizer.encode(PROMPT))
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=60)
    message = caught.value.body["message"]
    assert f"maximum context length is {MAX_MODEL_LEN} tokens" in message
    assert f"requested {num_prompt + 60} tokens ({num_prompt} in the prompt, 60 in the completion)" in message
    error = assert_error(
        post(server, "/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "x " * 80}]}),
        400,
        "prompt",
    )
    assert f"{MAX_MODEL_LEN} tokens" in error["message"]


@pytest.mark.parametrize(
    "path, body, param",
    [
        ("/v1/completions", {"model": MODEL, "prompt": PROMPT, "temperature": "hot"}, "temperature"),
        ("/v1/completions", {"model": MODEL}, "prompt"),
        ("/v1/completions", {"model": MODEL, "prompt": PROMPT, "n": 0}, "n"),
        ("/v1/completions", {"model": MODEL, "prompt": PROMPT, "max_tokens": -3}, "max_tokens"),
        ("/v1/completions", {"model": MODEL, "prompt": PROMPT, "top_p": 1.5}, "top_p"),
        ("/v1/completions", {"model": MODEL, "prompt": PROMPT, "logprobs": 50}, "logprobs"),
        ("/v1/completions", {"model": MODEL, "prompt": [5, 10**9]}, "prompt"),
        ("/v1/completions", {"model": MODEL, "prompt": []}, "prompt"),
        ("/v1/completions", {"prompt": PROMPT}, "model"),
        ("/v1/chat/completions", {"model": MODEL, "messages": []}, "messages"),
        ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "robot", "content": "hi"}]}, "messages.0.role"),
        ("/v1/chat/completions", {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "stop": 5}, "stop"),
    ],
)
def test_malformed_body_is_400_naming_the_field(server, path, body, param):
    assert_error(post(server, path, body), 400, param)


def test_body_that_is_not_json_is_400(server):
    response = httpx.post(
        f"{server.base_url}/v1/completions", content=b"{not json", headers={"content-type": "application/json"}
    )
    assert response.status_code == 400 and "error" in response.json()


def test_past_the_queue_limit_is_429_with_retry_after_and_the_rest_complete(server, client):
    want = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=30, temperature=0).choices[0].text
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 30, "temperature": 0}
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        responses = list(pool.map(lambda _: post(server, "/v1/completions", body), range(8)))
    refused = [r for r in responses if r.status_code == 429]
    served = [r for r in responses if r.status_code == 200]
    assert refused and served and len(refused) + len(served) == 8
    assert all(int(r.headers["retry-after"]) >= 1 and r.json()["error"]["type"] == "RateLimitError" for r in refused)
    assert all(r.json()["choices"][0]["text"] == want for r in served)


def test_bad_requests_do_not_disturb_a_running_stream(server, client):
    want = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=40, temperature=0).choices[0].text
    got = []
    started = threading.Event()

    def stream():
        for chunk in client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=40, temperature=0, stream=True):
            got.append(chunk.choices[0].text)
            started.set()

    thread = threading.Thread(target=stream)
    thread.start()
    assert started.wait(30)
    statuses = [
        post(server, "/v1/completions", {"model": "nope", "prompt": "x"}).status_code,
        post(server, "/v1/completions", {"model": MODEL, "prompt": PROMPT, "max_tokens": 100}).status_code,
        post(server, "/v1/completions", {"model": MODEL, "prompt": PROMPT, "n": "many"}).status_code,
    ]
    thread.join(60)
    assert statuses == [404, 400, 400]
    assert "".join(got) == want
    assert httpx.get(f"{server.base_url}/health").status_code == 200


def test_not_ready_until_the_model_has_loaded(demo_model_dir):
    release = threading.Event()
    config = EngineConfig(kernels="reference", num_kv_blocks=64)

    def slow_load():
        assert release.wait(60)
        return ModelRunner.from_model_dir(demo_model_dir, config)

    with running_server(slow_load, config, MODEL, wait_ready=False) as srv:
        assert httpx.get(f"{srv.base_url}/ready").status_code == 503
        assert httpx.get(f"{srv.base_url}/health").status_code == 200
        r = httpx.post(f"{srv.base_url}/v1/completions", json={"model": MODEL, "prompt": PROMPT})
        assert r.status_code == 503 and r.headers["retry-after"]
        release.set()
        client = openai.OpenAI(base_url=f"{srv.base_url}/v1", api_key="unused", max_retries=0)
        for _ in range(600):
            if httpx.get(f"{srv.base_url}/ready").status_code == 200:
                break
            threading.Event().wait(0.1)
        assert client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=3, temperature=0).choices[0].text

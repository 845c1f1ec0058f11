"""The router as a real process in front of real `serve` processes (the demo model), driven by the openai client:
answers streamed and not, traffic spread by what each pool can do, failures retried or reported, keys, 503s."""

from __future__ import annotations

import json
import signal
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack

import httpx
import openai
import pytest
from helpers import wait_for

from inferfleet_operator.plan.endpoint_picker import EndpointPicker
from inferfleet_operator.router.app import build_app
from inferfleet_operator.router.config import FAIL_CLOSE, FAIL_OPEN, EndpointSpec, RouterConfig

from ...runtime.support.server_harness import free_port, serve_process
from .harness import FIRST_EVENT, pod_that_breaks_mid_stream, router_process, running_app, sample

pytestmark = pytest.mark.slow

MODEL = "inferfleet-demo"
POD_KEY = "pod-key"  # the pods accept only this key: a request through the router succeeds only if it sent this
CLIENT_KEY = "client-key"
FINISHED = "inferfleet:e2e_request_latency_seconds_count"  # a pod's requests answered
PROMPT_TOKENS = "inferfleet:prompt_tokens_total"
GENERATED = "inferfleet:generation_tokens_total"
RUNNING = "inferfleet:num_requests_running"
ROUTED = "inferfleet_router_routed_requests_total"


def start_pod(demo_model_dir):
    args = ("--model", str(demo_model_dir), "--num-kv-blocks", "256", "--log-level", "warning")
    return serve_process(*args, "--api-key", POD_KEY)


@pytest.fixture(scope="module")
def pods(demo_model_dir):
    with ExitStack() as stack:
        yield [stack.enter_context(start_pod(demo_model_dir)) for _ in range(2)]


@pytest.fixture(scope="module")
def router(pods):
    endpoints = [f"--endpoint={pod.base_url},pool=demo" for pod in pods]
    with router_process(*endpoints, "--upstream-api-key", POD_KEY, "--max-request-bytes", "4096") as router:
        yield router


def client(base_url: str, key: str = "unused") -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base_url}/v1", api_key=key, max_retries=0)


def pod_sample(pod, name: str) -> float:
    return sample(httpx.get(f"{pod.base_url}/metrics").text, name)


def complete(base_url: str, num_requests: int, concurrency: int, max_tokens: int = 16) -> None:
    def one(i: int) -> None:
        reply = client(base_url).completions.create(model=MODEL, prompt=f"Beautiful is {i}", max_tokens=max_tokens)
        assert reply.usage.completion_tokens >= 1

    with ThreadPoolExecutor(concurrency) as pool:
        list(pool.map(one, range(num_requests)))


def assert_openai_error(response: httpx.Response, status: int, code: str | None = None) -> dict:
    assert response.status_code == status, response.text
    error = response.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    if code is not None:
        assert error["code"] == code
    return error


def test_completions_and_chat_streamed_and_not_are_answered_through_the_router(router):
    api = client(router.base_url)
    assert [m.id for m in api.models.list().data] == [MODEL]
    reply = api.completions.create(model=MODEL, prompt="Beautiful is", max_tokens=8, temperature=0)
    assert reply.choices[0].text and reply.usage.completion_tokens == 8
    chat = api.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Complete: Beautiful is"}], max_tokens=8, temperature=0
    )
    assert chat.choices[0].message.content and chat.usage.completion_tokens <= 8
    stream = api.completions.create(model=MODEL, prompt="Beautiful is", max_tokens=8, temperature=0, stream=True)
    assert "".join(chunk.choices[0].text for chunk in stream) == reply.choices[0].text
    chunks = list(
        api.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Complete: Beautiful is"}],
            max_tokens=8,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == chat.choices[0].message.content and chunks[-1].usage.completion_tokens <= 8


def test_equal_pods_each_get_a_share_of_concurrent_requests(router, pods):
    before = [pod_sample(pod, FINISHED) for pod in pods]
    routed_before = [sample(router.metrics(), ROUTED, endpoint=pod.base_url) for pod in pods]
    complete(router.base_url, num_requests=8, concurrency=4)
    served = [pod_sample(pod, FINISHED) - b for pod, b in zip(pods, before)]
    assert sum(served) == 8 and min(served) >= 2, served
    routed = [sample(router.metrics(), ROUTED, endpoint=pod.base_url) - b for pod, b in zip(pods, routed_before)]
    assert routed == served


def test_a_client_leaving_a_stream_ends_the_pods_work_on_it(router, pods):
    generated = [pod_sample(pod, GENERATED) for pod in pods]
    body = {"model": MODEL, "prompt": "Beautiful", "max_tokens": 1000, "ignore_eos": True, "stream": True}
    with httpx.stream("POST", f"{router.base_url}/v1/completions", json=body, timeout=30) as response:
        assert next(line for line in response.iter_lines() if line.startswith("data: {"))
    wait_for(lambda: sum(pod_sample(pod, RUNNING) for pod in pods) == 0, timeout=30, interval=0.1, message="idle")
    num_generated = sum(pod_sample(pod, GENERATED) for pod in pods) - sum(generated)
    assert 1 <= num_generated < 1000  # the whole answer is 1000 tokens (ignore_eos): the pod stopped early


def test_a_bad_body_is_refused_with_openai_errors_and_reaches_no_pod(router, pods):
    before = [pod_sample(pod, PROMPT_TOKENS) for pod in pods]
    routed_before = sample(router.metrics(), ROUTED)
    url = f"{router.base_url}/v1/completions"
    assert_openai_error(httpx.post(url, content=b'{"model": "inferfleet-demo", "prompt": '), 400)
    error = assert_openai_error(httpx.post(url, json={"model": MODEL, "prompt": "hi", "max_tokens": "16"}), 400)
    assert error["param"] == "max_tokens"
    error = assert_openai_error(httpx.post(url, json={"model": MODEL, "prompt": []}), 400)
    assert error["param"] == "prompt"
    chat = f"{router.base_url}/v1/chat/completions"
    error = assert_openai_error(httpx.post(chat, json={"model": MODEL, "messages": [{"content": "no role"}]}), 400)
    assert error["param"] == "messages.0"
    # Over the router's 4096 bytes, well within what a pod accepts (it would have answered).
    assert_openai_error(httpx.post(url, json={"model": MODEL, "prompt": "x" * 5000, "max_tokens": 1}), 413)
    assert sample(router.metrics(), ROUTED) == routed_before
    assert [pod_sample(pod, PROMPT_TOKENS) for pod in pods] == before


def test_the_router_asks_for_its_own_key_and_sends_the_pods_theirs(pods):
    endpoints = [f"--endpoint={pod.base_url}" for pod in pods]
    with router_process(*endpoints, "--api-key", CLIENT_KEY, "--upstream-api-key", POD_KEY) as router:
        url = f"{router.base_url}/v1/completions"
        body = {"model": MODEL, "prompt": "Beautiful is", "max_tokens": 4}
        for headers in ({}, {"Authorization": f"Bearer {POD_KEY}"}, {"Authorization": f"Bearer {CLIENT_KEY}x"}):
            assert_openai_error(httpx.post(url, json=body, headers=headers), 401, "invalid_api_key")
        assert sample(router.metrics(), ROUTED) == 0
        reply = client(router.base_url, CLIENT_KEY).completions.create(**body)
        assert reply.usage.completion_tokens == 4
        assert httpx.get(f"{router.base_url}/ready").status_code == 200  # probes and /metrics need no key


def test_pods_found_by_a_pool_address_are_served_with_the_key_from_the_environment(pods):
    """As the operator runs it: the pool's pods are what a name resolves to (a headless Service in a cluster,
    localhost here), and the service's key comes from INFERFLEET_API_KEY: clients must send it, the pods get it."""
    port = pods[0].base_url.rsplit(":", 1)[1]
    args = (f"--pool-address=demo=localhost:{port}", "--api-key-env", "--resolve-interval", "0.5")
    with router_process(*args, env={"INFERFLEET_API_KEY": f"{POD_KEY},second-key"}) as router:
        body = {"model": MODEL, "prompt": "Beautiful is", "max_tokens": 4}
        url = f"{router.base_url}/v1/completions"
        assert_openai_error(httpx.post(url, json=body), 401, "invalid_api_key")
        before = pod_sample(pods[0], FINISHED)
        for key in (POD_KEY, "second-key"):  # the pods know only the first: the router sent it for both
            assert client(router.base_url, key).completions.create(**body).usage.completion_tokens == 4
        assert pod_sample(pods[0], FINISHED) == before + 2
        assert "the pods of demo=localhost" in router.output()


def test_a_pool_takes_the_profile_its_calibrated_pod_measured(demo_model_dir):
    args = ("--model", str(demo_model_dir), "--num-kv-blocks", "256", "--max-num-seqs", "4", "--log-level", "warning")
    with serve_process(*args, "--calibrate") as pod, router_process(f"--endpoint={pod.base_url},pool=cpu") as router:
        measured = httpx.get(f"{pod.base_url}/profile").json()
        rate = "inferfleet_router_pool_decode_tokens_per_second"
        wait_for(lambda: sample(router.metrics(), rate, pool="cpu", source="measured") > 0, timeout=30, interval=0.2)
        assert sample(router.metrics(), rate, pool="cpu", source="measured") == measured["decode"][-1][1]
        assert "Pool cpu: profile measured by" in router.output()


def test_without_an_answering_endpoint_the_router_answers_503(pods):
    with router_process(f"--endpoint=http://127.0.0.1:{free_port()}", wait_ready=False) as router:
        assert httpx.get(f"{router.base_url}/ready").status_code == 503
        body = {"model": MODEL, "prompt": "Beautiful is", "max_tokens": 4}
        error = assert_openai_error(httpx.post(f"{router.base_url}/v1/completions", json=body), 503, "no_endpoint")
        assert error["type"] == "ServiceUnavailable"
        with pytest.raises(openai.InternalServerError):
            client(router.base_url).completions.create(**body)


@pytest.mark.parametrize("mode", [FAIL_CLOSE, FAIL_OPEN])
def test_when_the_picker_raises_fail_close_answers_503_and_fail_open_serves(pods, mode):
    class BrokenPicker(EndpointPicker):
        def pick(self, request, endpoints, now):
            raise RuntimeError("a bug in the picker")

    config = RouterConfig((EndpointSpec(pods[0].base_url, "demo"),), upstream_api_key=POD_KEY, failure_mode=mode)
    with running_app(build_app(config, BrokenPicker())) as base_url:
        wait_ready(base_url)
        before = pod_sample(pods[0], FINISHED)
        response = httpx.post(f"{base_url}/v1/completions", json={"model": MODEL, "prompt": "Hi", "max_tokens": 4})
        if mode == FAIL_CLOSE:
            assert_openai_error(response, 503, "picker_failed")
            assert pod_sample(pods[0], FINISHED) == before
        else:
            assert response.status_code == 200 and response.json()["usage"]["completion_tokens"] == 4
            assert pod_sample(pods[0], FINISHED) == before + 1


def wait_ready(base_url: str) -> None:
    wait_for(lambda: httpx.get(f"{base_url}/ready").status_code == 200, timeout=30, interval=0.1, message="ready")


def test_a_killed_pod_is_retried_before_the_first_byte_and_then_left_out(pods, demo_model_dir):
    with start_pod(demo_model_dir) as victim:
        # Scrapes 30 s apart: the router learns of the death only from the failed request itself.
        flags = [f"--endpoint={victim.base_url},pool=demo", f"--endpoint={pods[0].base_url},pool=demo"]
        with router_process(*flags, "--upstream-api-key", POD_KEY, "--scrape-interval", "30") as router:
            victim.proc.send_signal(signal.SIGKILL)
            victim.proc.wait()
            api = client(router.base_url)
            messages = [{"role": "user", "content": "Complete: Beautiful is"}]
            # Both idle and equal: the picker takes the first, the victim; the client sees a whole stream anyway.
            stream = api.chat.completions.create(model=MODEL, messages=messages, max_tokens=8, stream=True)
            assert "".join(c.choices[0].delta.content or "" for c in stream)
            complete(router.base_url, num_requests=4, concurrency=1)
            page = router.metrics()
    assert sample(page, ROUTED, endpoint=victim.base_url) == 1
    assert sample(page, ROUTED, endpoint=pods[0].base_url) == 5
    assert sample(page, "inferfleet_router_upstream_errors_total", endpoint=victim.base_url, kind="connect") == 1
    assert sample(page, "inferfleet_router_retries_total") == 1


def test_a_stream_broken_after_its_first_byte_ends_with_an_error_event_and_done():
    with running_app(pod_that_breaks_mid_stream()) as pod, router_process(f"--endpoint={pod}") as router:
        body = {"model": "stub", "prompt": "Hi", "max_tokens": 8, "stream": True}
        with httpx.stream("POST", f"{router.base_url}/v1/completions", json=body, timeout=30) as response:
            raw = response.read()
        events = [e for e in raw.split(b"\n\n") if e]
        assert events[0] + b"\n\n" == FIRST_EVENT and events[-1] == b"data: [DONE]"
        error = json.loads(events[-2].removeprefix(b"data: "))["error"]
        assert error["type"] == "server_error" and "mid-stream" in error["message"]
        stream = client(router.base_url).completions.create(model="stub", prompt="Hi", max_tokens=8, stream=True)
        texts = []
        with pytest.raises(openai.APIError, match="mid-stream"):
            for chunk in stream:
                texts.append(chunk.choices[0].text)
        assert texts == ["Hello"]
        assert sample(router.metrics(), "inferfleet_router_upstream_errors_total", kind="stream") == 2


def test_a_pool_profiled_four_times_faster_gets_most_of_the_traffic(pods, tmp_path):
    slow = {
        "prefill": [[128, 2000], [2048, 4000]],
        "decode": [[1, 100], [8, 400], [32, 800]],
        "max_batch": 32,
        "kv_capacity_tokens": 100_000,
        "block_size": 16,
        "has_prefix_cache": False,
    }
    fast = {
        **slow,
        "prefill": [[x, 4 * y] for x, y in slow["prefill"]],
        "decode": [[x, 4 * y] for x, y in slow["decode"]],
    }
    profiles = tmp_path / "profiles.json"
    profiles.write_text(json.dumps({"slow": slow, "fast": fast}))
    flags = [f"--endpoint={pods[1].base_url},pool=slow", f"--endpoint={pods[0].base_url},pool=fast"]
    with router_process(*flags, "--profile-file", str(profiles), "--upstream-api-key", POD_KEY) as router:
        complete(router.base_url, num_requests=24, concurrency=4, max_tokens=32)
        page = router.metrics()
    num_fast, num_slow = sample(page, ROUTED, pool="fast"), sample(page, ROUTED, pool="slow")
    assert num_fast + num_slow == 24 and num_fast >= 18, (num_fast, num_slow)

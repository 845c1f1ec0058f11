"""The OpenAI-compatible server on loopback, driven by the official openai client, on the built-in model."""

import json
import time

import httpx
import openai
import pytest

from inferfleet_runtime.engine.config import EngineConfig
from inferfleet_runtime.worker.model_runner import ModelRunner

from ..support.server_harness import running_server

MODEL = "inferfleet-demo"
PROMPT = "Beautiful is better than"


@pytest.fixture(scope="module")
def server(demo_model_dir):
    config = EngineConfig(kernels="reference", num_kv_blocks=512)
    with running_server(lambda: ModelRunner.from_model_dir(demo_model_dir, config), config, MODEL) as srv:
        yield srv


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="unused", max_retries=0)


def test_completion_continues_the_zen_line_with_usage(client, server):
    r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=6, temperature=0)
    [choice] = r.choices
    assert choice.text.startswith(" ugly.") and choice.finish_reason == "length"
    num_prompt = len(server.engine.tokenizer.encode(PROMPT))
    assert (r.usage.prompt_tokens, r.usage.completion_tokens, r.usage.total_tokens) == (num_prompt, 6, num_prompt + 6)
    assert r.object == "text_completion" and r.model == MODEL


def test_streamed_completion_equals_the_whole_one_and_reports_usage(client):
    whole = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=12, temperature=0)
    chunks = list(
        client.completions.create(
            model=MODEL,
            prompt=PROMPT,
            max_tokens=12,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    text = "".join(c.choices[0].text for c in chunks if c.choices)
    assert text == whole.choices[0].text
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == 12
    assert chunks[-1].usage.prompt_tokens == whole.usage.prompt_tokens


def test_stream_ends_with_done(server):
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 3, "stream": True}
    with httpx.stream("POST", f"{server.base_url}/v1/completions", json=body) as r:
        events = [line for line in r.iter_lines() if line]
    assert r.headers["content-type"].startswith("text/event-stream")
    assert events[-1] == "data: [DONE]" and all(e.startswith("data: ") for e in events)
    assert json.loads(events[0][6:])["object"] == "text_completion"


def test_chat_completion_streamed_and_whole_agree(client):
    messages = [{"role": "user", "content": "Complete the line: Beautiful is"}]
    whole = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=16, temperature=0)
    assert whole.choices[0].message.role == "assistant" and whole.choices[0].message.content
    assert whole.object == "chat.completion" and whole.usage.completion_tokens <= 16
    chunks = list(
        client.chat.completions.create(
            model=MODEL,
            messages=messages,
            max_tokens=16,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == whole.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == whole.choices[0].finish_reason


def test_stop_string_ends_the_completion_before_it(client):
    free = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=20, temperature=0).choices[0].text
    assert "\n" in free
    stopped = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=20, temperature=0, stop=["\n"])
    assert stopped.choices[0].text == free.split("\n")[0] and stopped.choices[0].finish_reason == "stop"
    streamed = client.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=20, temperature=0, stop="\n", stream=True
    )
    assert "".join(c.choices[0].text for c in streamed) == free.split("\n")[0]


def test_n_choices_are_indexed_and_counted(client):
    # A prompt off the training text, so the model is unsure and choices can differ.
    r = client.completions.create(model=MODEL, prompt="xyz q", max_tokens=8, temperature=1.0, n=3, seed=1)
    assert sorted(c.index for c in r.choices) == [0, 1, 2]
    assert len({c.text for c in r.choices}) > 1  # seeded, but each choice draws its own tokens
    again = client.completions.create(model=MODEL, prompt="xyz q", max_tokens=8, temperature=1.0, n=3, seed=1)
    assert [c.text for c in again.choices] == [c.text for c in r.choices]
    assert r.usage.completion_tokens <= 24 and r.usage.completion_tokens >= 3
    chat = client.chat.completions.create(
        model=MODEL, messages=[{"role": "user", "content": "Simple is"}], n=2, max_tokens=4
    )
    assert sorted(c.index for c in chat.choices) == [0, 1]
    streamed: dict[int, str] = {}
    for chunk in client.completions.create(
        model=MODEL, prompt="xyz q", max_tokens=8, temperature=1.0, n=3, seed=1, stream=True
    ):
        for c in chunk.choices:
            streamed[c.index] = streamed.get(c.index, "") + c.text
    assert streamed == {c.index: c.text for c in r.choices}


def test_completion_logprobs_list_each_token_with_alternatives(client):
    r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=5, temperature=0, logprobs=2)
    lp = r.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 5
    assert "".join(lp.tokens) == r.choices[0].text
    assert all(v <= 0 for v in lp.token_logprobs)
    for chosen, top in zip(lp.token_logprobs, lp.top_logprobs):
        assert len(top) <= 2 and max(top.values()) >= chosen - 1e-6  # greedy: the chosen token is the best


def test_chat_logprobs_carry_top_alternatives(client):
    r = client.chat.completions.create(
        model=MODEL,
        messages=[{"role": "user", "content": "Flat is"}],
        max_tokens=4,
        temperature=0,
        logprobs=True,
        top_logprobs=3,
    )
    content = r.choices[0].logprobs.content
    assert len(content) == r.usage.completion_tokens
    assert all(
        len(entry.top_logprobs) == 3 and entry.top_logprobs[0].logprob >= entry.logprob - 1e-6 for entry in content
    )


def test_models_health_and_ready(server, client):
    assert [m.id for m in client.models.list().data] == [MODEL]
    assert httpx.get(f"{server.base_url}/health").status_code == 200
    assert httpx.get(f"{server.base_url}/ready").json() == {"status": "ready"}


def test_metrics_expose_gateway_gauges_latencies_and_token_counts(server, client):
    def sample(text, name):
        line = next(line for line in text.splitlines() if line.startswith(name + "{"))
        return float(line.rsplit(" ", 1)[1])

    before = httpx.get(f"{server.base_url}/metrics").text
    r = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=4, temperature=0)
    after = httpx.get(f"{server.base_url}/metrics").text
    for gauge in ("num_requests_waiting", "num_requests_running", "kv_cache_usage_perc"):
        assert f"# TYPE inferfleet:{gauge} gauge" in after
    assert 0 <= sample(after, "inferfleet:kv_cache_usage_perc") <= 1
    for name in ("time_to_first_token_seconds", "inter_token_latency_seconds", "e2e_request_latency_seconds"):
        assert f"# TYPE inferfleet:{name} histogram" in after
    assert (
        sample(after, "inferfleet:e2e_request_latency_seconds_count")
        == sample(before, "inferfleet:e2e_request_latency_seconds_count") + 1
    )
    assert (
        sample(after, "inferfleet:inter_token_latency_seconds_count")
        == sample(before, "inferfleet:inter_token_latency_seconds_count") + 3
    )
    assert (
        sample(after, "inferfleet:generation_tokens_total") - sample(before, "inferfleet:generation_tokens_total")
        == r.usage.completion_tokens
    )
    assert (
        sample(after, "inferfleet:prompt_tokens_total") - sample(before, "inferfleet:prompt_tokens_total")
        == r.usage.prompt_tokens
    )
    assert "# TYPE inferfleet:num_preemptions_total counter" in after


def test_a_list_of_prompts_gets_n_choices_each(client, server):
    prompts = [PROMPT, "Simple is better than"]
    r = client.completions.create(model=MODEL, prompt=prompts, max_tokens=4, temperature=0, n=2)
    assert [c.index for c in sorted(r.choices, key=lambda c: c.index)] == [0, 1, 2, 3]
    by_index = {c.index: c.text for c in r.choices}
    for i, prompt in enumerate(prompts):
        alone = client.completions.create(model=MODEL, prompt=prompt, max_tokens=4, temperature=0).choices[0].text
        assert by_index[2 * i] == by_index[2 * i + 1] == alone
    token_prompt = server.engine.tokenizer.encode(PROMPT)
    by_ids = client.completions.create(model=MODEL, prompt=token_prompt, max_tokens=4, temperature=0)
    assert by_ids.choices[0].text == by_index[0]
    assert r.usage.prompt_tokens == sum(len(server.engine.tokenizer.encode(p)) for p in prompts)


def test_extra_sampling_fields_are_honoured(client, server):
    greedy = client.completions.create(model=MODEL, prompt="xyz q", max_tokens=6, temperature=0).choices[0].text
    top1 = (
        client.completions.create(
            model=MODEL, prompt="xyz q", max_tokens=6, temperature=1.5, seed=3, extra_body={"top_k": 1}
        )
        .choices[0]
        .text
    )
    assert top1 == greedy
    penalised = (
        client.completions.create(
            model=MODEL, prompt=PROMPT, max_tokens=12, temperature=0, extra_body={"repetition_penalty": 5.0}
        )
        .choices[0]
        .text
    )
    plain = client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=12, temperature=0).choices[0].text
    assert penalised != plain
    first_token = (
        client.completions.create(model=MODEL, prompt=PROMPT, max_tokens=2, temperature=0, logprobs=0)
        .choices[0]
        .logprobs.tokens[1]
    )
    stop_id = server.engine.tokenizer.encode(first_token, add_special_tokens=False)
    stopped = client.completions.create(
        model=MODEL, prompt=PROMPT, max_tokens=12, temperature=0, extra_body={"stop_token_ids": stop_id[:1]}
    )
    assert stopped.choices[0].finish_reason == "stop" and len(stopped.choices[0].text) < len(plain)


def test_a_client_leaving_a_whole_response_aborts_it(server):
    engine = server.engine
    before = engine.num_aborted_requests
    body = {"model": MODEL, "prompt": PROMPT, "max_tokens": 900, "temperature": 0, "ignore_eos": True}
    with pytest.raises(httpx.ReadTimeout):
        httpx.post(f"{server.base_url}/v1/completions", json=body, timeout=httpx.Timeout(5, read=0.5))
    deadline = time.monotonic() + 20
    while engine.num_aborted_requests == before and time.monotonic() < deadline:
        time.sleep(0.05)
    assert engine.num_aborted_requests == before + 1

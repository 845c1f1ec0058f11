"""Request bodies → SamplingParams: every OpenAI and extra field reaches the sampler."""

from inferfleet_runtime.server.protocol import ChatCompletionRequest, CompletionRequest


def test_completion_fields_map_onto_sampling_params():
    body = CompletionRequest(
        model="m",
        prompt="p",
        max_tokens=7,
        temperature=0.5,
        top_p=0.8,
        n=2,
        seed=9,
        stop="x",
        presence_penalty=0.1,
        frequency_penalty=0.2,
        logprobs=3,
        top_k=5,
        min_p=0.05,
        repetition_penalty=1.3,
        stop_token_ids=[4],
        ignore_eos=True,
        skip_special_tokens=False,
    )
    p = body.sampling_params(body.max_tokens, body.logprobs)
    assert (p.max_tokens, p.temperature, p.top_p, p.n, p.seed, p.stop) == (7, 0.5, 0.8, 2, 9, ["x"])
    assert (p.presence_penalty, p.frequency_penalty, p.logprobs, p.top_k, p.min_p) == (0.1, 0.2, 3, 5, 0.05)
    assert (p.repetition_penalty, p.stop_token_ids, p.ignore_eos, p.skip_special_tokens) == (1.3, [4], True, False)


def test_openai_defaults_and_no_top_k_spellings():
    body = CompletionRequest(model="m", prompt=[1, 2, 3], top_k=-1)
    p = body.sampling_params(body.max_tokens, body.logprobs)
    assert (p.max_tokens, p.temperature, p.top_p, p.top_k, p.logprobs, p.n) == (16, 1.0, 1.0, None, None, 1)
    assert body.prompts() == [[1, 2, 3]]
    assert CompletionRequest(model="m", prompt=["a", "b"]).prompts() == ["a", "b"]
    assert CompletionRequest(model="m", prompt=[[1], [2, 3]]).prompts() == [[1], [2, 3]]


def test_chat_max_completion_tokens_wins_and_logprobs_need_the_flag():
    msgs = [{"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]}]
    body = ChatCompletionRequest(model="m", messages=msgs, max_tokens=5, max_completion_tokens=9, top_logprobs=2)
    assert body.resolved_max_tokens == 9 and body.num_logprobs is None
    assert body.messages[0].text() == "ab"
    with_flag = ChatCompletionRequest(model="m", messages=msgs, logprobs=True, top_logprobs=2)
    assert with_flag.num_logprobs == 2 and with_flag.resolved_max_tokens is None
    assert ChatCompletionRequest(model="m", messages=msgs, logprobs=True).num_logprobs == 0
    assert ChatCompletionRequest(
        model="m", messages=msgs, stream=True, stream_options={"include_usage": True}
    ).include_usage

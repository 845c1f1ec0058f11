"""What the router reads of a body before it picks: the picker's estimate, and a 400 naming the field otherwise."""

from __future__ import annotations

import json

import pytest

from inferfleet_operator.router.bodies import (
    CHAT,
    COMPLETIONS,
    DEFAULT_CHAT_TOKENS,
    DEFAULT_COMPLETION_TOKENS,
    parse_body,
)
from inferfleet_operator.router.errors import RouterError


def parse(path: str, **body):
    return parse_body(path, json.dumps(body).encode())


def test_a_text_prompt_counts_four_characters_a_token_and_max_tokens_times_n_outputs():
    routed = parse(COMPLETIONS, model="m", prompt="x" * 41, max_tokens=10, n=3, stream=True)
    assert (routed.pick.num_prompt_tokens, routed.pick.num_output_tokens) == (11, 30)
    assert routed.is_stream and routed.model == "m" and routed.pick.prefix_token_ids == ()


def test_token_id_prompts_count_their_ids_and_give_the_picker_a_prefix():
    routed = parse(COMPLETIONS, model="m", prompt=list(range(300)))
    assert routed.pick.num_prompt_tokens == 300 and routed.pick.prefix_token_ids == tuple(range(256))
    assert routed.pick.num_output_tokens == DEFAULT_COMPLETION_TOKENS
    several = parse(COMPLETIONS, model="m", prompt=[[1, 2], [3, 4, 5]], max_tokens=4)
    assert (several.pick.num_prompt_tokens, several.pick.num_output_tokens) == (5, 8)
    assert parse(COMPLETIONS, model="m", prompt=["ab", "cdefg"]).pick.num_prompt_tokens == 3


def test_chat_counts_its_messages_text_and_prefers_max_completion_tokens():
    messages = [{"role": "system", "content": "x" * 8}, {"role": "user", "content": [{"type": "text", "text": "abcd"}]}]
    routed = parse(CHAT, model="m", messages=messages, max_tokens=50, max_completion_tokens=20)
    assert (routed.pick.num_prompt_tokens, routed.pick.num_output_tokens) == (4 + 2 + 4 + 1, 20)
    assert parse(CHAT, model="m", messages=messages).pick.num_output_tokens == DEFAULT_CHAT_TOKENS


@pytest.mark.parametrize(
    ("path", "body", "param"),
    [
        (COMPLETIONS, b"{", None),
        (COMPLETIONS, b"[1]", None),
        (COMPLETIONS, b'{"prompt": "x"}', "model"),
        (COMPLETIONS, b'{"model": "m"}', "prompt"),
        (COMPLETIONS, b'{"model": "m", "prompt": [1, "a"]}', "prompt"),
        (COMPLETIONS, b'{"model": "m", "prompt": [[]]}', "prompt"),
        (COMPLETIONS, b'{"model": "m", "prompt": "x", "max_tokens": 0}', "max_tokens"),
        (COMPLETIONS, b'{"model": "m", "prompt": "x", "max_tokens": true}', "max_tokens"),
        (COMPLETIONS, b'{"model": "m", "prompt": "x", "n": 1.5}', "n"),
        (COMPLETIONS, b'{"model": "m", "prompt": "x", "stream": "yes"}', "stream"),
        (CHAT, b'{"model": "m", "messages": []}', "messages"),
        (CHAT, b'{"model": "m", "messages": [{"role": "user", "content": 3}]}', "messages.0"),
        (CHAT, b'{"model": "m", "messages": [{"role": "user", "content": [{"type": "image"}]}]}', "messages.0"),
    ],
)
def test_a_body_the_router_cannot_estimate_is_a_400_naming_the_field(path, body, param):
    with pytest.raises(RouterError) as caught:
        parse_body(path, body)
    assert caught.value.status == 400 and caught.value.param == param and caught.value.message

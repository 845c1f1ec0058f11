"""Relaying a pod's answer: whole SSE events only, their output tokens counted, and the usage of a JSON answer."""

from __future__ import annotations

import json

import pytest

from inferfleet_operator.router.sse import MAX_EVENT_BYTES, EventSplitter, completion_tokens


def event(data) -> bytes:
    return f"data: {json.dumps(data)}\n\n".encode()


def test_events_split_across_chunks_are_released_whole_and_counted():
    chat = [
        event({"choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]}),
        event({"choices": [{"index": 0, "delta": {"content": "Beau"}}]}),
        event({"choices": [{"index": 0, "delta": {"content": "tiful"}}]}),
        event({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}]}),
        b"data: [DONE]\n\n",
    ]
    stream = b"".join(chat)
    splitter = EventSplitter()
    released = []
    for i in range(0, len(stream), 7):
        out = splitter.feed(stream[i : i + 7])
        assert out == b"" or out.endswith(b"\n\n")
        released.append(out)
    assert b"".join(released) == stream
    assert splitter.num_generated == 2 and splitter.is_done


def test_a_usage_chunk_gives_the_exact_count():
    splitter = EventSplitter()
    splitter.feed(
        event({"choices": [{"index": 0, "text": "a"}]}) + event({"choices": [], "usage": {"completion_tokens": 7}})
    )
    assert splitter.num_generated == 7 and not splitter.is_done


def test_an_event_that_never_ends_is_refused_past_the_bound():
    splitter = EventSplitter()
    with pytest.raises(ValueError, match="over"):
        for _ in range(MAX_EVENT_BYTES // 65536 + 2):
            splitter.feed(b"x" * 65536)


def test_the_usage_is_read_from_the_end_of_a_json_answer():
    answer = {"choices": [{"text": '"completion_tokens": 99'}], "usage": {"prompt_tokens": 3, "completion_tokens": 12}}
    assert completion_tokens(json.dumps(answer).encode()[-4096:]) == 12
    assert completion_tokens(b'{"error": {}}') == 0

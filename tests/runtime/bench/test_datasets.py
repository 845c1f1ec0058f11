"""Benchmark datasets: length ranges, token counting with a tokenizer, ShareGPT parsing and filtering."""

from __future__ import annotations

import json

import pytest

from inferfleet_runtime.bench.datasets import (
    DatasetError,
    parse_range,
    random_requests,
    sharegpt_requests,
    token_counter,
    word_count,
)


@pytest.mark.parametrize("text, expected", [("32", (32, 32)), ("8:64", (8, 64)), ("1:1", (1, 1))])
def test_parse_range_reads_a_length_or_a_range(text, expected):
    assert parse_range(text) == expected


@pytest.mark.parametrize("text", ["0", "9:3", "a:b", "4:", "-1:5"])
def test_parse_range_refuses_empty_or_reversed_ranges(text):
    with pytest.raises(ValueError):
        parse_range(text)


def test_random_requests_draw_lengths_within_the_ranges_and_repeat_with_a_seed():
    samples = random_requests(200, (8, 64), (4, 16), seed=3)
    assert len(samples) == 200
    assert all(8 <= s.prompt_len <= 64 and s.prompt_len == word_count(s.prompt) for s in samples)
    assert all(4 <= s.expected_output_len <= 16 for s in samples)
    assert len({s.prompt_len for s in samples}) > 20  # spread over the range, not one length
    assert samples == random_requests(200, (8, 64), (4, 16), seed=3)
    assert samples != random_requests(200, (8, 64), (4, 16), seed=4)


def test_random_requests_with_a_tokenizer_count_real_tokens(demo_model_dir):
    from inferfleet_runtime.checkpoints.tokenizer import Tokenizer

    tokenizer = Tokenizer.from_dir(demo_model_dir)
    count = token_counter(tokenizer)
    samples = random_requests(30, (16, 48), (8, 8), seed=0, count=count)
    for s in samples:
        assert s.prompt_len == len(tokenizer.encode(s.prompt, add_special_tokens=False))
        # words are added or removed one at a time: within one word's tokens of the drawn target
        assert 12 <= s.prompt_len <= 52


def _sharegpt(tmp_path, conversations) -> str:
    path = tmp_path / "sharegpt.json"
    path.write_text(json.dumps(conversations))
    return str(path)


def _conv(human: str, gpt: str, **extra) -> dict:
    return {"id": "x", "conversations": [{"from": "human", "value": human}, {"from": "gpt", "value": gpt}], **extra}


def test_sharegpt_takes_the_first_turns_and_the_reply_length(tmp_path):
    path = _sharegpt(tmp_path, [_conv("one two three four five", "a b c d e f g")])
    [sample] = sharegpt_requests(path, 10)
    assert sample.prompt == "one two three four five"
    assert (sample.prompt_len, sample.expected_output_len) == (5, 7)


def test_sharegpt_skips_short_and_malformed_conversations(tmp_path):
    good = _conv("w " * 10, "r " * 12)
    path = _sharegpt(
        tmp_path,
        [
            good,
            _conv("too short", "r " * 12),  # prompt under 4 tokens
            _conv("w " * 10, "no"),  # reply under 4 tokens
            {"id": "one-turn", "conversations": [{"from": "human", "value": "w " * 10}]},
            {"id": "no-turns"},
            "not a conversation",
        ],
    )
    samples = sharegpt_requests(path, 10)
    assert [(s.prompt_len, s.expected_output_len) for s in samples] == [(10, 12)]


def test_sharegpt_output_len_overrides_reply_lengths_and_num_requests_caps(tmp_path):
    path = _sharegpt(tmp_path, [_conv(f"prompt number {i} with words", "r " * (5 + i)) for i in range(20)])
    samples = sharegpt_requests(path, 7, seed=1, output_len=9)
    assert len(samples) == 7 and {s.expected_output_len for s in samples} == {9}
    assert [s.prompt for s in samples] == [s.prompt for s in sharegpt_requests(path, 7, seed=1, output_len=9)]


@pytest.mark.parametrize("content", ["{not json", json.dumps({"a": 1}), json.dumps([_conv("a", "b")])])
def test_sharegpt_refuses_files_with_no_usable_conversation(tmp_path, content):
    path = tmp_path / "bad.json"
    path.write_text(content)
    with pytest.raises(DatasetError):
        sharegpt_requests(path, 5)

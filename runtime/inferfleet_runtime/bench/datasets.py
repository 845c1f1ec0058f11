"""Benchmark requests: the `random` dataset (length ranges) and ShareGPT-format JSON conversations.

Token counts come from a tokenizer when one is given (the server's, via --tokenizer DIR); otherwise
they are approximated by whitespace-separated words.
"""

from __future__ import annotations

import json
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

# A fixed word list so random prompts are reproducible and readable (words from the Zen of Python).
WORDS = (
    "beautiful is better than ugly explicit implicit simple complex complicated flat nested sparse dense "
    "readability counts special cases are not enough to break the rules although practicality beats purity "
    "errors should never pass silently unless explicitly silenced in face of ambiguity refuse temptation "
    "guess there one and preferably only obvious way do it now never often right idea namespaces honking "
    "great let us more those"
).split()


class DatasetError(ValueError):
    """The dataset file or its options cannot give the requested benchmark."""


@dataclass(frozen=True)
class SampleRequest:
    prompt: str
    prompt_len: int  # tokens (or words without a tokenizer)
    expected_output_len: int  # max_tokens sent with the request


Counter = Callable[[str], int]


def word_count(text: str) -> int:
    return len(text.split())


def token_counter(tokenizer) -> Counter:
    return lambda text: len(tokenizer.encode(text, add_special_tokens=False))


def parse_range(text: str) -> tuple[int, int]:
    """ "32" -> (32, 32); "16:64" -> (16, 64); argparse type for the length options."""
    lo, sep, hi = text.partition(":")
    try:
        low, high = int(lo), int(hi) if sep else int(lo)
    except ValueError:
        raise ValueError(f"{text!r} is not a length or a LOW:HIGH range") from None
    if low < 1 or high < low:
        raise ValueError(f"{text!r} is not a range of positive lengths with LOW <= HIGH")
    return low, high


def random_requests(
    num_requests: int,
    input_len: tuple[int, int],
    output_len: tuple[int, int],
    seed: int = 0,
    count: Counter = word_count,
) -> list[SampleRequest]:
    """num_requests prompts of random words, each with an input length and max_tokens drawn uniformly from the
    ranges; with a tokenizer counter, words are added until the prompt reaches its token length."""
    rng = random.Random(seed)
    out = []
    for _ in range(num_requests):
        target = rng.randint(*input_len)
        words = [rng.choice(WORDS) for _ in range(target)]
        prompt = " ".join(words)
        num_tokens = count(prompt)
        while num_tokens < target:  # a tokenizer may merge words: top up
            words.append(rng.choice(WORDS))
            prompt = " ".join(words)
            num_tokens = count(prompt)
        while num_tokens > target and len(words) > 1:
            words.pop()
            prompt = " ".join(words)
            num_tokens = count(prompt)
        out.append(SampleRequest(prompt, num_tokens, rng.randint(*output_len)))
    return out


def sharegpt_requests(
    path: str | Path,
    num_requests: int,
    seed: int = 0,
    count: Counter = word_count,
    output_len: int | None = None,
    min_len: int = 4,
    max_prompt_len: int | None = None,
) -> list[SampleRequest]:
    """The first human turn of each conversation as the prompt and the reply's length as max_tokens (or
    output_len for all), shuffled with seed; conversations shorter than min_len on either side are skipped."""
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise DatasetError(f"cannot read ShareGPT file {path}: {exc}") from None
    if not isinstance(data, list):
        raise DatasetError(f"{path} is not a ShareGPT file (a JSON list of conversations)")
    pairs = []
    for item in data:
        turns = item.get("conversations") if isinstance(item, dict) else None
        if not isinstance(turns, list) or len(turns) < 2:
            continue
        first, second = turns[0], turns[1]
        if not all(isinstance(t, dict) and isinstance(t.get("value"), str) for t in (first, second)):
            continue
        pairs.append((first["value"], second["value"]))
    random.Random(seed).shuffle(pairs)
    out = []
    for prompt, reply in pairs:
        if len(out) == num_requests:
            break
        prompt_len = count(prompt)
        reply_len = output_len if output_len is not None else count(reply)
        if prompt_len < min_len or reply_len < min_len:
            continue
        if max_prompt_len is not None and prompt_len > max_prompt_len:
            continue
        out.append(SampleRequest(prompt, prompt_len, reply_len))
    if not out:
        raise DatasetError(f"{path} has no conversation with a prompt and a reply of at least {min_len} tokens")
    return out
